"""Files a VM sends out through its session: a ``transfer_chunk`` report is written to the
VM's :class:`~vmr_handler.host.serve.files.transfers.TransferStore`; a ``transfer_uploaded`` report puts
in place the file it names, uploaded over HTTP(S). Either is logged as a summary (no file
data) with the outcome; refusals are counted and remarked, never raised. A last chunk whose
file still has bytes to hash comes back as a :class:`PendingTransfer`: the session hashes it
in a worker thread and finishes it on the loop (no guest's file is hashed on the
loop every VM shares).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from vmr_handler.core.clock import Clock
from vmr_handler.core.errors import TransferRefused
from vmr_handler.core.events import Event
from vmr_handler.core.ratelimit import TokenBucket
from vmr_handler.core.wire.protocol import TRANSFER_CHUNK, TRANSFER_UPLOADED
from vmr_handler.host.logs.text import printable
from vmr_handler.host.model.vmstate import Counters
from vmr_handler.host.serve.files.chunkhash import PendingHash
from vmr_handler.host.serve.files.destinations import TransferDestinations
from vmr_handler.host.serve.files.transfers import TransferOutcome, TransferStore

log = logging.getLogger("vmr_handler.host")

#: ``warn(kind, text, now)``: a rate-limited remark on hostile input (the session's).
WarnFn = Callable[[str, str, float], None]

#: The report types this module takes.
TRANSFER_TYPES = frozenset({TRANSFER_CHUNK, TRANSFER_UPLOADED})


@dataclass
class PendingTransfer:
    """A ``transfer_chunk`` written whose file must be hashed further before its outcome is
    known (:class:`~vmr_handler.host.serve.files.chunkhash.PendingHash`): :meth:`run` it in a worker thread,
    then :func:`finish_transfer` it on the loop."""

    ev: Event
    summary: Dict[str, Any]
    hashing: PendingHash

    def run(self) -> None:
        """Hash what is missing (blocking)."""
        self.hashing.run()


def take_transfer(
    ev: Event, transfers: TransferStore, counters: Counters, warn: WarnFn, now: float
) -> Union[Event, PendingTransfer]:
    """Store a ``transfer_chunk``, or put in place a file uploaded over HTTP(S) that a
    ``transfer_uploaded`` report names (:meth:`TransferStore.commit_upload`); return the
    event to log in its place (no file data; ``status``/``details`` say what happened), or a
    :class:`PendingTransfer` when the file must be hashed before that is known."""
    d = ev.data
    summary: Dict[str, Any] = {
        k: d.get(k) for k in ("location", "offset", "size", "sha256", "last", "mtime") if k in d
    }
    if isinstance(summary.get("location"), str):
        summary["location"] = printable(summary["location"], 4096)
    with _outcome(ev, counters, warn, now, summary):
        if ev.type == TRANSFER_UPLOADED:
            args = (d.get("location"), d.get("sha256"), d.get("size"), d.get("mtime"))
            outcome = transfers.commit_upload(*args)
            summary.update(stored_as=outcome.path, status="success", details="complete (uploaded over HTTP)")
        else:
            step = transfers.begin_chunk(*_chunk_args(d, summary))
            if isinstance(step, PendingHash):
                return PendingTransfer(ev, summary, step)
            _chunk_outcome(step, counters, warn, now, summary)
    return Event(ev.type, ev.timestamp, ev.id, summary)


def finish_transfer(
    pending: PendingTransfer,
    transfers: TransferStore,
    counters: Counters,
    warn: WarnFn,
    now: float,
    error: Optional[BaseException] = None,
) -> Event:
    """The event to log for a :class:`PendingTransfer` once :meth:`PendingTransfer.run` ran
    (``error``: what it raised; an ``OSError`` is a refusal like any other)."""
    ev, summary = pending.ev, pending.summary
    with _outcome(ev, counters, warn, now, summary):
        if error is not None:
            pending.hashing.close()
            raise error
        _chunk_outcome(transfers.finish_chunk(pending.hashing), counters, warn, now, summary)
    return Event(ev.type, ev.timestamp, ev.id, summary)


@contextlib.contextmanager
def _outcome(
    ev: Event, counters: Counters, warn: WarnFn, now: float, summary: Dict[str, Any]
) -> Iterator[None]:
    """Refusals and disk errors of a transfer into ``summary`` (counted, remarked), never raised."""
    what = "transfer chunk" if ev.type == TRANSFER_CHUNK else "uploaded transfer"
    try:
        yield
    except TransferRefused as exc:
        counters.transfer_refused += 1
        summary.update(status="error", details=f"refused: {exc}")
        warn("transfer", f"{what} refused: {exc}", now)
    except OSError as exc:
        counters.transfer_refused += 1
        summary.update(status="error", details=f"host could not store it: {exc.strerror or exc}")
        warn("transfer-io", f"{what} not stored: {exc}", now)


def _chunk_args(d: Mapping[str, Any], summary: Dict[str, Any]) -> Tuple[Any, ...]:
    """The :meth:`TransferStore.begin_chunk` arguments of a ``transfer_chunk``'s data.

    Raises:
        TransferRefused: ``data_b64`` is not a base64 string.
    """
    raw = d.get("data_b64", "")
    if not isinstance(raw, str):
        raise TransferRefused("data_b64 must be a string")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TransferRefused(f"data_b64 is not base64: {exc}") from exc
    summary["data_len"] = len(data)
    return (
        d.get("location"),
        d.get("offset"),
        data,
        d.get("size"),
        d.get("sha256"),
        bool(d.get("last")),
        d.get("mtime"),
    )


def _chunk_outcome(
    outcome: TransferOutcome, counters: Counters, warn: WarnFn, now: float, summary: Dict[str, Any]
) -> None:
    """A chunk's :class:`TransferOutcome` into ``summary`` (a sha256 mismatch counted)."""
    summary["stored_as"] = outcome.path
    if outcome.sha256_ok is False:
        counters.transfer_bad_sha256 += 1
        summary.update(status="error", details="sha256 of the assembled file does not match")
        warn("transfer-sha", f"transfer {outcome.path!r}: sha256 mismatch, not put in place", now)
    else:
        summary.update(status="success", details="complete" if outcome.complete else "chunk stored")


#: Transfer reports of one VM kept waiting while a file it sent is hashed in a worker thread;
#: more are dropped unacknowledged (counted in ``refused.rate_limited``; the agent resends them).
MAX_WAITING = 1000
#: Per-VM budget of bytes hashed again in worker threads (bytes per second, and the burst):
#: a whole 256 MiB file sent out of order is hashed at once, but a guest that keeps making the
#: host hash its files again (chunks out of order, rewritten bytes) gets about 4 % of one core
#: (sha256 runs at ~1.5 GB/s here); its next hash waits until the budget allows it.
REHASH_RATE = 64 * 1024 * 1024
REHASH_BURST = 512 * 1024 * 1024


class TransferIntake:
    """One VM's transfer reports, taken in order and one at a time.

    A last chunk whose file still has bytes to hash (:class:`PendingTransfer`) is hashed in a
    worker thread, never on the loop every VM shares; the VM's later transfer reports wait for
    it (at most :data:`MAX_WAITING`), its other reports and every other VM go on meanwhile. Its
    summary is logged (and acknowledged) when the hash is done, so it may come after reports
    the VM sent later.

    Args:
        transfers: the VM's transfer store.
        counters: the VM's counters (refusals, sha256 mismatches, dropped reports).
        warn: the session's rate-limited remark.
        store: ``store(events, host UTC received)`` logs and acknowledges (the session's).
        budget: bytes per second and burst hashed again for this VM (:data:`REHASH_RATE`,
            :data:`REHASH_BURST`): a hash that finds the budget in debt from earlier hashes
            starts once the debt is paid, ``debt / rate`` seconds later (``hash_waits``,
            ``hash_waited_s``); its own bytes are charged when it is taken.
        clock: the host's clock: the budget is charged on its monotonic seconds and a
            deferred hash starts on a timer of it.
        destinations: ``(location, destination)`` of the VM's transfers that name a destination
            directory (:attr:`~vmr_handler.host.serve.config.VmSpec.destinations`): a file
            complete in the store is also copied there (:class:`DestinationCopies`).
    """

    def __init__(
        self,
        transfers: TransferStore,
        counters: Counters,
        warn: WarnFn,
        store: Callable[[List[Event], float], None],
        budget: Tuple[float, float] = (REHASH_RATE, REHASH_BURST),
        *,
        clock: Clock,
        destinations: Sequence[Tuple[str, str]] = (),
    ) -> None:
        self.transfers = transfers
        wanted = TransferDestinations(transfers.vm, destinations)
        self.copies = DestinationCopies(transfers.root, wanted, warn)
        self.counters = counters
        self.warn = warn
        self._store = store
        self._clock = clock
        self._budget = TokenBucket(budget[0], budget[1], clock.monotonic())
        self.hash_waits = 0
        self.hash_waited = 0.0
        self._busy = False
        self._waiting: Deque[Tuple[Event, float]] = deque()
        self._ids: Set[str] = set()  # waiting or being hashed: a resend of one is not taken twice

    def take(self, ev: Event, now: float) -> Optional[Event]:
        """The event to log for transfer report ``ev`` (received at host UTC ``now``), or None
        when it is logged later (or dropped: see :data:`MAX_WAITING`)."""
        if ev.id in self._ids:
            return None
        if self._busy:
            if len(self._waiting) >= MAX_WAITING:
                self.counters.rate_limited += 1
                self.warn("transfer-wait", f"transfer report dropped: {MAX_WAITING} wait for a hash", now)
            else:
                self._waiting.append((ev, now))
                self._ids.add(ev.id)
            return None
        taken = take_transfer(ev, self.transfers, self.counters, self.warn, now)
        if not isinstance(taken, PendingTransfer):
            return self.copies.after(taken, now)
        self._ids.add(ev.id)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a session driven by hand): here and now
            error: Optional[BaseException] = None
            try:
                taken.run()
            except OSError as exc:
                error = exc
            self._hashed(taken, now, error)
            return None
        self._busy = True
        mono = self._clock.monotonic()
        delay = self._budget.spend(mono, 0)  # in debt from earlier hashes: wait
        self._budget.spend(mono, taken.hashing.missing)
        if delay > 0:
            self.hash_waits += 1
            self.hash_waited += delay
            self.warn("transfer-budget", f"hashing budget spent: a file's hash waits {delay:.1f} s", now)
            self._clock.call_at(self._clock.time() + delay, self._hash, loop, taken, now)
        else:
            self._hash(loop, taken, now)
        return None

    def _hash(self, loop: asyncio.AbstractEventLoop, taken: PendingTransfer, now: float) -> None:
        future = loop.run_in_executor(None, taken.run)
        future.add_done_callback(functools.partial(self._done, taken, now))

    def _done(self, pending: PendingTransfer, now: float, future: asyncio.Future[None]) -> None:
        if future.cancelled():  # the loop is closing
            self._busy = False
            pending.hashing.close()
        else:
            self._hashed(pending, now, future.exception())

    def _hashed(self, pending: PendingTransfer, now: float, error: Optional[BaseException]) -> None:
        """``pending``'s hash ran (``error``: what it raised): log its outcome, then take what
        waited behind it."""
        self._busy = False
        self._ids.discard(pending.ev.id)
        if error is not None and not isinstance(error, OSError):
            log.error("hashing a transferred file failed: %r", error)
            error = OSError(f"hashing failed: {error!r}")
        finished = finish_transfer(pending, self.transfers, self.counters, self.warn, now, error)
        self._store([self.copies.after(finished, now)], now)
        while self._waiting and not self._busy:
            ev, received = self._waiting.popleft()
            self._ids.discard(ev.id)
            taken = self.take(ev, received)
            if taken is not None:
                self._store([taken], received)

    def status(self) -> Dict[str, Any]:
        """The ``transfers`` part of ``vmr-host status`` for this VM."""
        t, c = self.transfers, self.counters
        return {
            "files": t.files,
            "bytes": t.total,
            "refused": c.transfer_refused,
            "bad_sha256": c.transfer_bad_sha256,
            "repeats_refused": t.hashes.repeats,
            "rehashed_bytes": t.rehashed_bytes,
            "hash_restarts": t.hashes.restarts,
            "hash_waits": self.hash_waits,
            "hash_waited_s": round(self.hash_waited, 3),
            "waiting": len(self._waiting) + self._busy,
            "destination_copies": self.copies.copied,
            "destination_failures": self.copies.failed,
        }


#: ``(path, None)`` or ``(path, why not)`` per destination of one copy.
_Results = List[Tuple[str, Optional[str]]]


class DestinationCopies:
    """Copies of one VM's complete transfers to the destination directories its schedule names
    (:class:`~vmr_handler.host.serve.files.destinations.TransferDestinations`), one at a time
    in a worker thread (in order: a later version is never overwritten by an earlier one).

    The stored file's event says where it goes (``destinations``); a copy that fails is a
    remark in the VM's log (``warn``) naming the directory, why, and that the file is still in
    ``<logs>/transfers/<vm>/``; it is counted in ``status`` (``destination_failures``).

    Args:
        root: the VM's transfer root (``<logs>/transfers/<vm>``).
        destinations: the VM's destination directories (None or empty: nothing is copied).
        warn: the session's rate-limited remark.
    """

    def __init__(self, root: str, destinations: Optional[TransferDestinations], warn: WarnFn) -> None:
        self.root = root
        self.destinations = destinations
        self.warn = warn
        self.copied = 0
        self.failed = 0
        self._queue: Deque[Tuple[str, List[str], float]] = deque()
        self._copying = False

    def after(self, event: Event, now: float) -> Event:
        """``event`` (a transfer report's summary), with ``destinations`` added and the copies
        queued when it put a file in place that a destination wants."""
        data = event.data
        rel = data.get("stored_as")
        complete = data.get("status") == "success" and str(data.get("details", "")).startswith("complete")
        if not self.destinations or not complete or not isinstance(rel, str):
            return event
        targets = self.destinations.targets(rel)
        if targets:
            paths = [self.destinations.path(t, rel) for t in targets]
            event = Event(event.type, event.timestamp, event.id, {**data, "destinations": paths})
            self._queue.append((rel, targets, now))
            if not self._copying:
                self._next()
        return event

    def _next(self) -> None:
        """Run the next queued copy (in a worker thread; here and now without a loop)."""
        assert self.destinations is not None
        while self._queue:
            rel, targets, now = self._queue.popleft()
            job = functools.partial(self.destinations.deliver, self.root, rel, targets)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a session driven by hand)
                self._done(rel, now, job())
                continue
            self._copying = True
            future = loop.run_in_executor(None, job)
            future.add_done_callback(functools.partial(self._finished, rel, targets, now))
            return
        self._copying = False

    def _finished(
        self,
        rel: str,
        targets: List[str],
        now: float,
        future: asyncio.Future[List[Tuple[str, Optional[str]]]],
    ) -> None:
        self._copying = False
        if future.cancelled():  # the loop is closing
            return
        error = future.exception()
        assert self.destinations is not None
        paths = [self.destinations.path(t, rel) for t in targets]
        self._done(rel, now, future.result() if error is None else [(p, repr(error)) for p in paths])
        self._next()

    def _done(self, rel: str, now: float, results: List[Tuple[str, Optional[str]]]) -> None:
        for path, why in results:
            if why is None:
                self.copied += 1
                continue
            self.failed += 1
            kept = os.path.join(self.root, *rel.split("/"))
            self.warn(
                "transfer-destination", f"transfer {rel!r} not copied to {path}: {why}; it is in {kept}", now
            )
