"""Clocks: where "now" comes from (SPEC section 4, "Clock").

The engine reads UTC on the experiment's *reference* clock (the host's, once a transport
estimates the offset) and turns absolute instants into deadlines on the monotonic clock
that asyncio timers use. Tests of timing *semantics* use the pure timeline with plain
numbers; this seam exists so the real clock can carry an offset.
"""

from __future__ import annotations

import time


class SystemClock:
    """The machine's clock plus an offset to the reference clock.

    Args:
        offset: seconds to add to the local UTC clock to get reference UTC (0 in local mode).
    """

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def time(self) -> float:
        """Reference UTC, epoch seconds."""
        return time.time() + self.offset

    def monotonic(self) -> float:
        """Monotonic seconds (the clock of ``loop.call_at``)."""
        return time.monotonic()

    def deadline(self, utc: float) -> float:
        """Monotonic time at which reference UTC instant ``utc`` is reached."""
        return time.monotonic() + (utc - self.time())
