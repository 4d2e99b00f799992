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
