"""How far ahead the host stamps a ``clock_resp``'s ``t3``: :class:`StampLead`.

Signing a ``clock_resp`` must happen after ``t3`` is known (the signature covers it) and so
between the ``t3`` stamp and the moment the answer leaves, where it would bias the agent's offset
by half its cost (``offset = ((t2 - t1) + (t3 - t4)) / 2``, docs/protocol.md). The host stamps
``t3`` ahead by the recently measured stamp-to-send time instead. Host code: the agent's side of
the clock exchange is :mod:`vmr_handler.core.wire.clockanswers`.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Deque

__all__ = ["StampLead"]


class StampLead:
    """How far ahead (seconds) the host stamps a ``clock_resp``'s ``t3``: the median of the last
    ``window`` measured times from the ``t3`` stamp to the answer handed to the transport
    (signing and encoding), 0 before the first measurement.

    Args:
        window: measurements kept (default 31).
        cap: a measurement above this many seconds (a stalled loop) is clipped to it (0.01).
    """

    def __init__(self, window: int = 31, cap: float = 0.01) -> None:
        self.cap = cap
        self._times: Deque[float] = deque(maxlen=window)
        self.value = 0.0

    def note(self, seconds: float) -> None:
        """One measured stamp-to-send time, seconds (negative ones, a clock step, are dropped)."""
        if seconds < 0:
            return
        self._times.append(min(seconds, self.cap))
        self.value = statistics.median(self._times)
