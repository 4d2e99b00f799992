"""Clocks: where "now" comes from and how long to wait (SPEC section 4, "Clock").

The engine reads UTC on the experiment's *reference* clock (the host's, once a transport
estimates the offset) and arms timers at reference-UTC instants. Everything it needs of time
is the :class:`Clock` protocol, so the same engine runs on

* :class:`SystemClock` -- the machine's clock plus the offset to the host's, timers on the
  running asyncio loop's monotonic clock (``loop.call_at``; no polling);
* :class:`FakeClock` -- virtual time that a test moves forward (:meth:`FakeClock.advance`):
  every SPEC section 4 rule (stages, barrier, pause, break + RESUME) is checked in
  milliseconds of wall time, with exact instants.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from typing import Any, Callable, List, Optional, Protocol, Tuple


class Timer(Protocol):
    """A timer armed by :meth:`Clock.call_at`; ``cancel()`` makes sure it never runs."""

    def cancel(self) -> None:
        """Disarm the timer (no effect once it ran)."""


class Clock(Protocol):
    """What the engine needs of time: reference UTC, monotonic durations, timers, waits.

    All instants are reference UTC epoch seconds; durations are seconds. Timers and waits
    belong to the running asyncio loop.
    """

    def time(self) -> float:
        """Reference UTC now, epoch seconds."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (for durations only)."""

    def call_at(self, utc: float, callback: Callable[..., None], *args: Any) -> Timer:
        """Run ``callback(*args)`` on the loop when the reference clock reaches ``utc``
        (at once, on the next loop turn, when ``utc`` is past)."""

    async def wait(self, event: asyncio.Event, until: Optional[float] = None) -> None:
        """Return when ``event`` is set or the reference clock reaches ``until`` (never for
        None), whichever comes first; the caller checks which."""


class SystemClock:
    """The machine's clock plus an offset to the reference clock.

    Args:
        offset: seconds to add to the local UTC clock to get reference UTC (0 in local mode;
            set from NTP-style sync with the host in connected mode).
        skew: debug only (``--debug-clock-skew``): seconds added to the machine's clock
            reading, to prove that firing follows the host's clock whatever the guest's says.
    """

    def __init__(self, offset: float = 0.0, skew: float = 0.0) -> None:
        self.offset = offset
        self.skew = skew

    def local_time(self) -> float:
        """This machine's own UTC reading (epoch seconds, including any debug skew)."""
        return time.time() + self.skew

    def time(self) -> float:
        """Reference UTC, epoch seconds."""
        return time.time() + self.skew + self.offset

    def monotonic(self) -> float:
        """Monotonic seconds (the clock of ``loop.call_at``)."""
        return time.monotonic()

    def deadline(self, utc: float) -> float:
        """Monotonic time at which reference UTC instant ``utc`` is reached."""
        return time.monotonic() + (utc - self.time())

    def call_at(self, utc: float, callback: Callable[..., None], *args: Any) -> Timer:
        """A ``loop.call_at`` timer at reference UTC ``utc`` (converted once, now: re-arm
        timers when the offset changes)."""
        loop = asyncio.get_running_loop()
        return loop.call_at(loop.time() + (utc - self.time()), callback, *args)

    async def wait(self, event: asyncio.Event, until: Optional[float] = None) -> None:
        """Wait for ``event`` or for reference UTC ``until``, whichever is first."""
        timeout = None if until is None else max(0.0, until - self.time())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


class _FakeTimer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """Virtual reference time for tests: nothing happens until :meth:`advance` moves it.

    Timers run in instant order (ties in arming order) as time passes them; between two
    instants the loop is given turns to react (:meth:`settle`), so a coroutine that arms
    a new timer while time moves is served within the same :meth:`advance`.

    Args:
        start: the initial reference UTC, epoch seconds.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._timers: List[Tuple[float, int, _FakeTimer, Callable[..., None], Tuple[Any, ...]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        """Reference UTC now (virtual), epoch seconds."""
        return self._now

    def monotonic(self) -> float:
        """Virtual monotonic seconds (moves with :meth:`advance`)."""
        return self._mono

    def call_at(self, utc: float, callback: Callable[..., None], *args: Any) -> Timer:
        """Arm a virtual timer at ``utc``; a past instant runs at the next :meth:`advance`
        (``advance(0)`` included)."""
        timer = _FakeTimer()
        heapq.heappush(self._timers, (utc, next(self._order), timer, callback, args))
        return timer

    async def wait(self, event: asyncio.Event, until: Optional[float] = None) -> None:
        """Wait for ``event`` or for virtual time ``until``."""
        if until is not None and until <= self._now:
            return
        reached = asyncio.Event()
        timer = self.call_at(until, reached.set) if until is not None else None
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(reached.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            if timer is not None:
                timer.cancel()

    def next_timer(self) -> Optional[float]:
        """The instant of the earliest armed timer, or None."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    async def settle(self, turns: int = 20) -> None:
        """Give the loop ``turns`` turns (plus a little real time for worker threads) so that
        everything ready at this instant runs."""
        for _ in range(turns):
            await asyncio.sleep(0)
        await asyncio.sleep(0.001)
        for _ in range(turns):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` (>= 0), running every timer due on the way
        at its own instant and letting the loop react after each."""
        target = self._now + seconds
        await self.settle()
        while True:
            due = self.next_timer()
            if due is None or due > target:
                break
            _, _, _timer, callback, args = heapq.heappop(self._timers)
            self._set(max(self._now, due))
            callback(*args)
            await self.settle()
        self._set(target)
        await self.settle()

    async def advance_to(self, utc: float) -> None:
        """Move virtual time forward to ``utc`` (no effect when it is past)."""
        await self.advance(max(0.0, utc - self._now))

    def _set(self, now: float) -> None:
        self._mono += now - self._now
        self._now = now
