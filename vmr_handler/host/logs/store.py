"""What the host keeps on disk (SPEC section 8): per-VM logs, experiment state, transfers.

Layout under the logs directory::

    <logs>/<vm>.log              readable: one ``events.describe`` line per event, host notes
    <logs>/<vm>.jsonl            one line per event, each id exactly once:
                                 {"host_received": <UTC>, "vm": "<vm>", "event": {timestamp,type,id,data}}
    <logs>/<vm>.ckpt             restart checkpoint: what replaying the .jsonl up to an offset gave
    <logs>/experiment.json       start time, configured times, exclusions, RESUMEs (atomic)
    <logs>/transfers/<vm>/<loc>  files transferred out of the VM (confined to that directory)
    <logs>/uploads/<vm>/<sha256> files uploaded over HTTP(S), staged until their
                                 ``transfer_uploaded`` report puts them in place (``.part``: under way)

Each event is written *and fsynced* before the host acknowledges it (:class:`DurableAcks`:
one fsync at a time per VM in a worker thread, the acks of everything written before it sent
when it returns), and the ids already received (in bounded memory:
:mod:`vmr_handler.host.logs.seenids`) are rebuilt at start from ``<vm>.ckpt`` (:class:`Checkpoint`)
and the ``<vm>.jsonl`` lines after it, so an agent that resends (after a channel drop, a
``kill -9`` of the host or a power cut) never gets an event logged twice nor one lost. An id
counts as written only once its line is on disk: a write the disk refuses leaves no trace and
no acknowledgement, so the agent's resend is stored when space returns. The readable
``<vm>.log`` is flushed, not fsynced.

The transfer directories are :mod:`vmr_handler.host.serve.files.transfers` (:class:`TransferStore`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from vmr_handler.core.errors import SavedStateError
from vmr_handler.core.events import Event, ReadableLines, describe, json_safe
from vmr_handler.core.fsutil import append_whole, atomic_write, utc_text
from vmr_handler.host.logs.appendfiles import AppendFiles
from vmr_handler.host.logs.seenids import SeenIds, SeenLimits
from vmr_handler.host.logs.text import printable

log = logging.getLogger("vmr_handler.host")

JSONL_SUFFIX = ".jsonl"
LOG_SUFFIX = ".log"
CHECKPOINT_SUFFIX = ".ckpt"
#: ``.jsonl`` bytes between two restart checkpoints (``Limits.checkpoint_every``)
CHECKPOINT_EVERY = 64 * 1024 * 1024
#: ``.jsonl`` bytes not covered by a checkpoint worth one when the host stops (less replays fast)
CHECKPOINT_AT_STOP = 1024 * 1024
#: bytes at the start and before the checkpoint's offset whose sha256 it holds (to know the
#: ``.jsonl`` is the one it was made of)
CHECKPOINT_TAIL = 4096
EXPERIMENT_FILE = "experiment.json"


def describe_safe(event: Event, lines: Optional[ReadableLines] = None) -> str:
    """:func:`vmr_handler.core.events.describe` (through ``lines``, with the experiment time
    once known) that never raises on hostile data, made printable."""
    try:
        text = lines.line(event) if lines is not None else describe(event)
    except Exception as exc:  # hostile data (bad base64, odd types): never crash
        text = f"{event.type} (undescribable data: {type(exc).__name__})"
    return printable(text)


def atomic_write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (:func:`vmr_handler.core.fsutil.atomic_write`:
    temp file, fsync, rename, fsync dir).

    Raises:
        OSError: the file cannot be written.
    """
    text = json.dumps(json_safe(data), indent=1, sort_keys=True, allow_nan=False) + "\n"
    atomic_write(path, text.encode("utf-8"), 0o600)


class ExperimentStore:
    """``<logs>/experiment.json``: the experiment state that must survive a host restart.

    Args:
        logs: the logs directory.
    """

    def __init__(self, logs: str) -> None:
        self.path = os.path.join(logs, EXPERIMENT_FILE)

    def load(self) -> Dict[str, Any]:
        """The saved state, or ``{}`` when there is none.

        Raises:
            SavedStateError: the file exists but is not a JSON object (never silently replaced:
                the start time it may hold must not change).
        """
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise SavedStateError(f"cannot read {self.path}: {exc}") from exc
        if not isinstance(data, dict):
            raise SavedStateError(f"{self.path} does not hold a JSON object")
        return data

    def save(self, data: Dict[str, Any]) -> None:
        """Replace the saved state atomically.

        Raises:
            OSError: it cannot be written.
        """
        atomic_write_json(self.path, data)


# ---------------------------------------------------------------------------------- VM logs
class Checkpoint:
    """``<logs>/<vm>.ckpt``: what replaying ``<vm>.jsonl`` up to a byte offset gave (the ids,
    counts and the VM's state), so a restart replays only what follows.

    Written atomically (:func:`atomic_write_json`) every ``Limits.checkpoint_every`` bytes of
    ``.jsonl`` and when the host stops. Never trusted blindly: it is used only when it names this
    VM, the ``.jsonl`` is at least ``offset`` bytes long, ends a line there and its last
    :data:`CHECKPOINT_TAIL` bytes before ``offset`` have the saved sha256; otherwise the whole
    ``.jsonl`` is replayed (and :attr:`note` says why). The first :data:`CHECKPOINT_TAIL`
    bytes are compared too; the middle of the file is not read (a ``.jsonl`` edited there by
    hand in place, same size, is not noticed: delete ``<vm>.ckpt`` after editing a log).

    Args:
        path: the checkpoint file.
        vm: the VM name.
        jsonl_path: the VM's ``.jsonl``.
    """

    VERSION = 1

    def __init__(self, path: str, vm: str, jsonl_path: str) -> None:
        self.path = path
        self.vm = vm
        self.jsonl_path = jsonl_path
        #: the ``.jsonl`` offset of the checkpoint last saved or used
        self.saved_at = 0
        #: what the start did with it: ``none``, ``used: ...``, ``stale (...): full replay``...
        self.note = "none"

    def load(self) -> Optional[Dict[str, Any]]:
        """The saved checkpoint when it matches the ``.jsonl`` (see the class), else None."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            return self._refuse(f"unreadable ({exc})")
        problem = self._mismatch(data)
        if problem is not None:
            return self._refuse(problem)
        self.note = f"used: {data['offset']} bytes not replayed"
        return dict(data)

    def _refuse(self, why: str) -> Optional[Dict[str, Any]]:
        """None, noting and logging ``why`` the checkpoint is not used."""
        self.note = f"{why}: full replay"
        log.warning("%s: %s", self.path, self.note)
        return None

    def _mismatch(self, data: Any) -> Optional[str]:
        """Why ``data`` does not fit the ``.jsonl`` now, or None."""
        if not isinstance(data, dict) or data.get("version") != self.VERSION or data.get("vm") != self.vm:
            return "another version or VM"
        offset = data.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            return "a bad offset"
        try:
            tail, size = self._tail(offset)
        except OSError as exc:
            return f"cannot read the .jsonl ({exc})"
        if size < offset:
            return f"the .jsonl is {size} bytes, shorter than its offset {offset}"
        if hashlib.sha256(tail).hexdigest() != data.get("sample_sha256") or (offset and tail[-1:] != b"\n"):
            return "the .jsonl differs before its offset"
        return None

    def _tail(self, offset: int) -> Tuple[bytes, int]:
        """The first and the last :data:`CHECKPOINT_TAIL` bytes before ``offset`` (the whole
        of a shorter file) and the ``.jsonl``'s size."""
        try:
            with open(self.jsonl_path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                end = min(offset, size)
                start = max(0, end - CHECKPOINT_TAIL)
                head = os.pread(fh.fileno(), min(start, CHECKPOINT_TAIL), 0)
                return head + os.pread(fh.fileno(), end - start, start), size
        except FileNotFoundError:
            return b"", 0

    def save(self, offset: int, payload: Dict[str, Any]) -> None:
        """Save ``payload`` as the checkpoint at ``.jsonl`` byte ``offset`` (a line end).
        Best effort: a failure is logged, the next start replays more."""
        try:
            tail, _ = self._tail(offset)
            doc = {"version": self.VERSION, "vm": self.vm, "offset": offset}
            doc["sample_sha256"] = hashlib.sha256(tail).hexdigest()
            atomic_write_json(self.path, {**payload, **doc})
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot save the restart checkpoint: %s", self.path, exc)
            return
        self.saved_at = offset


class VmLog:
    """A VM's ``.jsonl`` (every event once) and readable ``.log``.

    Args:
        logs: the logs directory.
        vm: the VM name.
        quota: bytes of ``.jsonl`` this VM may write (counting what is already there);
                beyond it events are counted in ``dropped_events``/``dropped_bytes``, not stored.
        seen: the bounds of the de-duplication memory (:mod:`vmr_handler.host.logs.seenids`;
            None: the defaults).
        checkpoint_every: ``.jsonl`` bytes between two restart checkpoints (:meth:`due`).
    """

    def __init__(
        self,
        logs: str,
        vm: str,
        quota: int,
        seen: Optional[SeenLimits] = None,
        checkpoint_every: int = CHECKPOINT_EVERY,
        readable_files: Optional[AppendFiles] = None,
    ) -> None:
        self.vm = vm
        #: where the readable ``.log`` is appended (shared by every VM of a host: bounded fds)
        self.readable_files = readable_files or AppendFiles(1)
        #: the readable ``.log``'s lines, with the experiment time once the start is known
        self.readable = ReadableLines()
        self.jsonl_path = os.path.join(logs, vm + JSONL_SUFFIX)
        self.log_path = os.path.join(logs, vm + LOG_SUFFIX)
        self.quota = quota
        #: the ids received (stored or over quota), in bounded memory
        self.ids = SeenIds(seen)
        self.checkpoint = Checkpoint(os.path.join(logs, vm + CHECKPOINT_SUFFIX), vm, self.jsonl_path)
        self.checkpoint_every = checkpoint_every
        #: ``.jsonl`` lines and bytes read at start (after the checkpoint, when one was used)
        self.replayed_lines = 0
        self.replayed_bytes = 0
        self.bytes = 0
        self.stored = 0
        self.duplicates = 0
        self.dropped_events = 0
        self.dropped_bytes = 0
        self.corrupt_lines = 0
        #: events stored as a placeholder because their data cannot be encoded
        self.placeholders = 0
        self._jsonl: Any = None

    def open(
        self,
        replay: Optional[Callable[[Event, float], None]] = None,
        restore: Optional[Callable[[Any], None]] = None,
    ) -> None:
        """Rebuild the ids and the VM's state: from the restart checkpoint when there is a
        sound one (``restore(state)`` is given what :meth:`save_checkpoint` saved), then from
        the ``.jsonl`` after it (calling ``replay(event, host_received)`` for each stored
        event, in order); cut a partial last line left by a crash, and open both files for
        appending. Without ``restore`` (or a checkpoint) the whole ``.jsonl`` is replayed.

        Raises:
            OSError: the files cannot be read or opened.
        """
        start = self._restore(restore) if restore is not None else 0
        try:
            with open(self.jsonl_path, "r+b") as fh:
                fh.seek(start)
                good = start
                for line in fh:
                    if not line.endswith(b"\n"):
                        break  # a line cut by a crash: it was never acknowledged
                    good += len(line)
                    self.replayed_lines += 1
                    self._replay_line(line, replay)
                if fh.tell() != good or os.fstat(fh.fileno()).st_size != good:
                    log.warning("%s: cutting a partial last line (written before a crash)", self.jsonl_path)
                    fh.truncate(good)
                self.bytes = good
                self.replayed_bytes = good - start
        except FileNotFoundError:
            pass
        # unbuffered: a write that fails leaves nothing behind in a buffer to come out later
        self._jsonl = open(self.jsonl_path, "ab", buffering=0)  # noqa: SIM115 - kept open for the run
        self.readable_files.write(self.log_path, "")  # made now, written through the shared files

    def _restore(self, restore: Callable[[Any], None]) -> int:
        """Take the checkpoint (ids, counts, ``restore(state)``); the ``.jsonl`` offset it
        covers, or 0 (nothing taken) when there is none or it does not match the ``.jsonl``."""
        saved = self.checkpoint.load()
        if saved is None:
            return 0
        ids = SeenIds(self.ids.limits)
        try:
            ids.load(saved["seen"])
            counts = [int(saved[k]) for k in ("stored", "corrupt_lines", "placeholders")]
            restore(saved["state"])
        except (KeyError, TypeError, ValueError) as exc:
            self.checkpoint.note = f"unusable ({exc}): full replay"
            log.warning("%s: %s", self.checkpoint.path, self.checkpoint.note)
            return 0
        self.ids = ids
        self.stored, self.corrupt_lines, self.placeholders = counts
        offset = int(saved["offset"])
        self.checkpoint.saved_at = offset
        return offset

    def due(self, stopping: bool = False) -> bool:
        """True when ``checkpoint_every`` bytes were written since the last checkpoint (when
        the host is ``stopping``: :data:`CHECKPOINT_AT_STOP` bytes, or that much less)."""
        every = min(self.checkpoint_every, CHECKPOINT_AT_STOP) if stopping else self.checkpoint_every
        return self.bytes - self.checkpoint.saved_at >= every

    def save_checkpoint(self, state: Any) -> None:
        """Save the restart checkpoint: the ids, counts and ``state`` (JSON safe: what the
        ``restore`` of :meth:`open` takes back) as of the ``.jsonl``'s current end. Best
        effort: a failure is logged (the next start replays more)."""
        self.checkpoint.save(
            self.bytes,
            {
                "stored": self.stored,
                "corrupt_lines": self.corrupt_lines,
                "placeholders": self.placeholders,
                "seen": self.ids.dump(),
                "state": state,
            },
        )

    def memory(self) -> Dict[str, Any]:
        """The de-duplication memory and the start's replay (``vmr-host status --json``)."""
        return {
            **self.ids.stats(),
            "replayed_lines": self.replayed_lines,
            "replayed_bytes": self.replayed_bytes,
            "checkpoint": self.checkpoint.note,
        }

    def _replay_line(self, line: bytes, replay: Optional[Callable[[Event, float], None]]) -> None:
        try:
            rec = json.loads(line)
            ev = rec["event"]
            event = Event(str(ev["type"]), float(ev["timestamp"]), str(ev["id"]), dict(ev.get("data") or {}))
            received = float(rec["host_received"])
        except (ValueError, KeyError, TypeError) as exc:
            self.corrupt_lines += 1
            log.warning("%s: unreadable line skipped (%s)", self.jsonl_path, exc)
            return
        self.ids.add(event.id)
        self.stored += 1
        if replay is not None:
            replay(event, received)

    def seen(self, event_id: str) -> bool:
        """True when an event with this id was already received (stored or over quota)."""
        return event_id in self.ids

    def write(self, items: List[Tuple[Event, float]]) -> List[Event]:
        """Write ``(event, host_received)`` pairs not seen before, then the readable lines.

        All or nothing: an id counts as received only once its line is on disk, so when the
        disk refuses the write (full, I/O error) nothing is recorded, the ``.jsonl`` is cut back
        to its last whole line and the agent's resend is stored when space returns.

        Returns:
            The events that were new (stored or counted over quota); duplicates are skipped
            and counted in ``duplicates``.

        Raises:
            OSError: the disk refused the write (the caller must not acknowledge).
        """
        batch: Set[str] = set()
        new_ids: List[str] = []
        new: List[Event] = []
        lines: List[bytes] = []
        readable: List[str] = []
        over_quota = over_bytes = 0
        size = self.bytes
        for event, received in items:
            if event.id in self.ids or event.id in batch:
                self.duplicates += 1
                continue
            line = self._line(event, received)
            if line is None:  # data JSON cannot hold (absurd nesting): its id is kept, acked
                line = self._placeholder(event, received)
                self.placeholders += 1
            batch.add(event.id)
            new_ids.append(event.id)
            new.append(event)
            if size + len(line) > self.quota:
                over_quota += 1
                over_bytes += len(line)
                continue
            size += len(line)
            lines.append(line)
            readable.append(describe_safe(event, self.readable))
        if lines:
            self._append(b"".join(lines))
        self.ids.update(new_ids)
        self.bytes = size
        self.stored += len(lines)
        self.dropped_events += over_quota
        self.dropped_bytes += over_bytes
        if readable:
            try:
                self.readable_files.write(self.log_path, "".join(r + "\n" for r in readable))
            except OSError as exc:  # the .jsonl holds the events: the readable copy is best effort
                log.warning("%s: cannot write the readable log: %s", self.log_path, exc)
        return new

    def _line(self, event: Event, received: float) -> Optional[bytes]:
        """The ``.jsonl`` line of ``event``, or None when it cannot be encoded."""
        try:
            return (
                json.dumps(
                    {"host_received": received, "vm": self.vm, "event": json_safe(event.to_dict())},
                    separators=(",", ":"),
                    allow_nan=False,
                    ensure_ascii=False,
                ).encode("utf-8", errors="backslashreplace")
                + b"\n"
            )
        except (ValueError, RecursionError, TypeError):
            return None

    def _placeholder(self, event: Event, received: float) -> bytes:
        """The line of an event whose ``data`` cannot be encoded: its type and id with
        ``data = {"unstorable": why}``, so it is stored once and acknowledged (an honest agent
        would otherwise resend it forever)."""
        doc = {
            "host_received": received,
            "vm": self.vm,
            "event": {
                "timestamp": json_safe(event.timestamp),
                "type": event.type,
                "id": event.id,
                "data": {"unstorable": "data nested too deep or not encodable as JSON; not stored"},
            },
        }
        return (
            json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")
            + b"\n"
        )

    def _append(self, data: bytes) -> None:
        """Append ``data`` to the ``.jsonl`` whole, or cut the file back to :attr:`bytes`.

        Raises:
            OSError: the disk refused it (a short write is ENOSPC).
        """
        append_whole(self._jsonl.fileno(), data, self.bytes)

    def note(self, text: str, now: float) -> None:
        """A host remark in the readable log (connections, refusals, hostile input)."""
        if self._jsonl is not None:
            self.readable_files.write(self.log_path, f"{utc_text(now)} [host] {printable(text)}\n")

    def dup_jsonl(self) -> Optional[int]:
        """A new descriptor of the open ``.jsonl`` (for an fsync in a worker thread, which
        closes it: a :meth:`close` meanwhile cannot pull it away); None once closed."""
        if self._jsonl is None:
            return None
        try:
            return os.dup(self._jsonl.fileno())
        except OSError:
            return None

    def close(self) -> None:
        """Close the ``.jsonl`` and the readable log."""
        if self._jsonl is not None:
            try:
                self._jsonl.close()
            except OSError:
                pass
        self._jsonl = None
        self.readable_files.close(self.log_path)


# ---------------------------------------------------------------------------------- acks
class DurableAcks:
    """Acknowledgements sent only once the reports they name are on disk: the host's fsync
    policy (docs/host.md, "Limits and guarantees").

    Group commit, per VM: the ids of reports written (or seen again) are collected; one fsync
    of the VM's ``.jsonl`` at a time runs in a worker thread (the event loop never waits for
    the disk); when it returns, every id collected before it started is acknowledged in one
    ``ack``, and the next fsync starts if more ids came meanwhile. So a report is acknowledged
    one to two fsyncs after it was written, with no timer, and a VM that sends fast gets fewer,
    larger fsyncs. An fsync that fails (EIO) acknowledges nothing and is logged once per
    failing spell: the agent sends those reports again, and they are acknowledged (as
    duplicates, stored once) after an fsync that succeeds.

    Args:
        vmlog: the VM's log.
        send: ``send(ids)`` sends one ``ack``.
    """

    def __init__(self, vmlog: VmLog, send: Callable[[List[str]], None]) -> None:
        self._log = vmlog
        self._send = send
        self._ids: List[str] = []
        self._inflight: List[str] = []  # the ids the fsync under way acknowledges
        self._syncing = False
        self._failing = False
        #: fsyncs that succeeded
        self.syncs = 0

    def add(self, ids: List[str]) -> None:
        """Acknowledge ``ids`` (written to the ``.jsonl`` already) after the next fsync."""
        self._ids.extend(ids)
        if not self._syncing:
            self._sync()

    def flush(self) -> None:
        """Before the VM's link goes: fsync here and now (blocking, once; only when something
        is unacknowledged) and acknowledge everything written, the fsync under way's ids too."""
        ids, self._ids, self._inflight = [*self._inflight, *self._ids], [], []
        fd = self._log.dup_jsonl() if ids else None
        if fd is not None:
            self._synced(list(dict.fromkeys(ids)), _fsync(fd))

    def _sync(self) -> None:
        self._inflight, self._ids = list(dict.fromkeys(self._ids)), []
        fd = self._log.dup_jsonl()
        if fd is None:  # closed: nothing acknowledged, the agent sends them again
            self._inflight = []
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a log driven by hand): here and now
            self._done_sync(_fsync(fd))
            return
        self._syncing = True
        future = loop.run_in_executor(None, _fsync, fd)
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[Optional[OSError]]) -> None:
        self._done_sync(OSError("the loop is closing") if future.cancelled() else future.result())

    def _done_sync(self, error: Optional[OSError]) -> None:
        ids, self._inflight = self._inflight, []
        self._syncing = False
        self._synced(ids, error)
        if self._ids and not self._syncing:
            self._sync()

    def _synced(self, ids: List[str], error: Optional[OSError]) -> None:
        if error is None:
            self.syncs += 1
            if self._failing:
                self._failing = False
                log.warning("%s: fsync works again: reports are acknowledged again", self._log.jsonl_path)
            if ids:
                self._send(ids)
        elif not self._failing:
            self._failing = True
            log.error(
                "%s: cannot fsync (%s): reports are not acknowledged until it works",
                self._log.jsonl_path,
                error,
            )


def _fsync(fd: int) -> Optional[OSError]:
    """fsync and close ``fd``; the error, or None (blocking: a worker thread)."""
    try:
        os.fsync(fd)
        return None
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
