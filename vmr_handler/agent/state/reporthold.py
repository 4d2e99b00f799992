"""Reports whose write failed, held in bounded memory and retried in order.

Every report the agent makes goes to a sink: the outbox (:mod:`vmr_handler.agent.state.outbox`) in
connected mode, the report file in local mode. A sink on a full disk (ENOSPC), or one that
fails for another OS reason (EIO), must not lose the report. :class:`ReportHold` sits in front
of the sink:

* while the sink works, a report goes straight through (nothing is copied or held);
* when a write fails with :class:`OSError` or :class:`~vmr_handler.core.errors.JournalError`,
  that report and every later one are held in memory, in order, and written by a retry task
  (tenacity, exponential back-off from 50-100 ms to 2 s, on the engine's clock) oldest first,
  before any newer report;
* when the hold reaches its limit (:class:`HoldLimits`: 10,000 reports or 16 MiB by default),
  producers that can wait do: an entry's output is no longer read (the entry blocks on its
  full pipe) and no new entry or stage is started, until the hold has room again. Reports
  that cannot wait (an entry's end, the engine's own lifecycle) are still held, never dropped:
  the memory is bounded by the limit plus a few reports per running entry;
* one error is logged when the sink starts failing, one when the hold fills up, one when the
  held reports have been written (never one per report);
* :meth:`ReportHold.reported` tells when every report made so far is written (the engine
  journals an entry done only then: a crash before re-runs the entry instead of dropping its
  reports). While nothing is held it is None at once: no cost while the sink works.

A report the sink refuses for another reason (a bug, a value JSON cannot hold) is logged and
dropped, as before: retrying it could never succeed and would hold back every later report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Deque, List, Optional, Tuple

from vmr_handler.core.clock import Clock
from vmr_handler.core.errors import JournalError
from vmr_handler.core.events import Event

log = logging.getLogger(__name__)

#: What a failing sink raises that is worth retrying (a full or failing disk).
RETRYABLE = (OSError, JournalError)
#: Back-off of the retries, seconds (tenacity ``wait_exponential`` plus up to RETRY_FIRST of jitter).
RETRY_FIRST = 0.05
RETRY_MAX = 2.0


@dataclass(frozen=True)
class HoldLimits:
    """How much the hold keeps before producers wait: memory stays bounded.

    Attributes:
        events: reports held (default 10,000).
        bytes: JSON bytes of the held reports (default 16 MiB).
    """

    events: int = 10_000
    bytes: int = 16 * 1024 * 1024


def _size(event: Event) -> int:
    """About how many bytes ``event`` holds (its JSON length)."""
    try:
        return len(json.dumps(event.to_dict(), default=str))
    except (TypeError, ValueError, RecursionError):
        return len(repr(event.data))


class ReportHold:
    """The way from report producers to a sink that may fail; call it with each event.

    Args:
        deliver: the sink (``deliver(event)``): writes one report, raises on failure and then
            leaves nothing of it behind (the outbox and the report file cut a short write off).
        clock: the clock the retries wait on (a FakeClock in tests).
        limits: :class:`HoldLimits`.
        note: called with every report as it is made, before it is held or delivered (the
            connected agent notes the clock offset it was stamped with).
    """

    def __init__(
        self,
        deliver: Callable[[Event], None],
        clock: Clock,
        limits: HoldLimits = HoldLimits(),
        note: Optional[Callable[[Event], None]] = None,
    ) -> None:
        self._deliver = deliver
        self._clock = clock
        self.limits = limits
        self._note = note
        self._held: Deque[Tuple[Event, int]] = deque()
        self._bytes = 0
        self._task: Optional[asyncio.Task[None]] = None
        self._waiters: List[asyncio.Future[None]] = []
        self._failing_since: Optional[float] = None
        self._full_logged = False
        self._unbounded = False
        self._drained = asyncio.Event()
        self._drained.set()
        self._made = 0  # reports made so far: the held ones are the last len(self._held) of them
        self._marks: Deque[Tuple[int, asyncio.Event]] = deque()  # (report count, set once written)
        self._stopping = asyncio.Event()
        self._give_up_at: Optional[float] = None  # reference UTC when waits for writes end (a stop)
        #: reports written after being held, over the process's life
        self.delivered_late = 0

    # ------------------------------------------------------------------ producers
    def __call__(self, event: Event) -> None:
        """Write ``event`` now, or hold it (behind the held ones) when writing fails."""
        if self._note is not None:
            self._note(event)
        self._made += 1
        if not self._held:
            try:
                self._deliver(event)
                return
            except RETRYABLE as exc:
                self._start_failing(exc)
            except Exception:  # not a disk problem: retrying cannot help
                log.exception("event sink failed for %s: report dropped", event.type)
                return
        size = _size(event)
        self._held.append((event, size))
        self._bytes += size
        self._drained.clear()
        if self.full and not self._full_logged:
            self._full_logged = True
            log.error(
                "report hold full (%d reports, %d bytes): entries' output and new entries wait "
                "until the held reports are written",
                len(self._held),
                self._bytes,
            )
        self._ensure_retrying()

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        """JSON bytes of the held reports (an estimate)."""
        return self._bytes

    @property
    def full(self) -> bool:
        """True when producers that can wait should (see :meth:`room`)."""
        if self._unbounded:
            return False
        return len(self._held) >= self.limits.events or self._bytes >= self.limits.bytes

    def room(self) -> Optional[asyncio.Future[None]]:
        """None when there is room, else a future that is done when there is (or when
        :meth:`stop_waiting` was called). A future, not a coroutine: a caller may drop it."""
        if not self.full:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def stop_waiting(self, grace: float = 0.0) -> None:
        """The engine stops: no producer waits any more (reports are still held, never dropped),
        and waits for reports to be written (:meth:`written`, :meth:`reported`) end ``grace``
        seconds (on the hold's clock) from now at the latest: a disk that stays full must not
        keep a stopping agent up."""
        self._unbounded = True
        if not self._stopping.is_set():
            self._give_up_at = self._clock.time() + grace
            self._stopping.set()
        self._wake_waiters()

    async def wait_room(self) -> None:
        """Return when there is room (at once, mostly), or when :meth:`stop_waiting` was called."""
        waiter = self.room()
        if waiter is not None:
            await waiter

    async def when_room(self, stopped: asyncio.Event, work: Coroutine[Any, Any, Any]) -> None:
        """Await ``work`` once there is room, unless ``stopped`` is set by then (then it is
        closed, never run)."""
        await self.wait_room()
        if stopped.is_set():
            work.close()
        else:
            await work

    async def written(self) -> bool:
        """Wait until nothing is held; after :meth:`stop_waiting`, until its grace ends at the
        latest (a stopping agent on a disk that stays full must still end). True when nothing
        is held."""
        return await self._until(self._drained)

    def reported(self) -> Optional[asyncio.Future[bool]]:
        """Whether every report made so far is written (the sink took it, or refused it for
        good: a report that can never be written is logged and dropped).

        Returns:
            None when it is already (nothing is held: the fast path, nothing to await); else a
            future that is True once it is, False when :meth:`stop_waiting`'s grace ended
            first (then those reports may never be written). A future: a caller may drop it.
        """
        if not self._held:
            return None
        written = asyncio.Event()
        self._marks.append((self._made, written))  # made counts only grow: the deque stays sorted
        return asyncio.ensure_future(self._until(written))

    async def _until(self, done: asyncio.Event) -> bool:
        """Wait for ``done``; once stopping, at most until the grace ends. True when it is set."""
        if not self._stopping.is_set():
            waits = [asyncio.ensure_future(done.wait()), asyncio.ensure_future(self._stopping.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        if not done.is_set() and self._give_up_at is not None:
            await self._clock.wait(done, self._give_up_at)
        return done.is_set()

    async def drained(self, timeout: Optional[float] = None) -> bool:
        """Wait until nothing is held (at most ``timeout`` seconds on the hold's clock, None:
        forever). True when nothing is held."""
        if self._drained.is_set():
            return True
        until = None if timeout is None else self._clock.time() + timeout
        await self._clock.wait(self._drained, until)
        return self._drained.is_set()

    def cancel(self) -> None:
        """Stop retrying (the agent exits); what is still held is logged as lost."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._held:
            log.error("%d held reports could not be written before the agent stopped", len(self._held))

    # ------------------------------------------------------------------ retries
    def _start_failing(self, exc: BaseException) -> None:
        if self._failing_since is None:
            self._failing_since = self._clock.monotonic()
            log.error(
                "cannot write reports (%s): holding them in memory (up to %d reports / %d MiB) "
                "and retrying until the write succeeds",
                exc,
                self.limits.events,
                self.limits.bytes // (1024 * 1024),
            )

    def _ensure_retrying(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._retry())

    async def _sleep(self, seconds: float) -> None:
        await self._clock.wait(asyncio.Event(), self._clock.time() + seconds)

    async def _retry(self) -> None:
        """Write the held reports oldest first, retrying with back-off until all are written."""
        from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential, wait_random

        async for attempt in AsyncRetrying(
            wait=wait_exponential(multiplier=RETRY_FIRST, max=RETRY_MAX) + wait_random(0, RETRY_FIRST),
            retry=retry_if_exception_type(RETRYABLE),
            sleep=self._sleep,
            reraise=True,
        ):
            with attempt:
                self._write_held()
        self._recovered()

    def _write_held(self) -> None:
        """Write held reports in order until none is left; raises at the first failure."""
        while self._held:
            event, size = self._held[0]
            try:
                self._deliver(event)
            except RETRYABLE:
                raise
            except Exception:
                log.exception("event sink failed for %s: report dropped", event.type)
            self._held.popleft()
            self._bytes -= size
            self.delivered_late += 1
            self._release_marks()
            if not self.full:
                self._wake_waiters()

    def _release_marks(self) -> None:
        """Set the :meth:`reported` waits whose reports are all written (or dropped) now."""
        written = self._made - len(self._held)
        while self._marks and self._marks[0][0] <= written:
            self._marks.popleft()[1].set()

    def _recovered(self) -> None:
        if self._failing_since is not None:
            log.warning(
                "reports are written again after %.1f s: every held report was written, in order (%d so far)",
                self._clock.monotonic() - self._failing_since,
                self.delivered_late,
            )
        self._failing_since = None
        self._full_logged = False
        self._drained.set()
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            with contextlib.suppress(asyncio.InvalidStateError):
                waiter.set_result(None)


def hold_of(sink: Any, clock: Clock, limits: HoldLimits) -> ReportHold:
    """``sink`` when it is a :class:`ReportHold` already (the connected agent's), else a new
    hold in front of it (local mode: the report file)."""
    return sink if isinstance(sink, ReportHold) else ReportHold(sink, clock, limits)
