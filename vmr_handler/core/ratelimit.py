"""Rate limits shared by both sides: a token bucket, and which repeats of a remark are logged.

Pure logic on numbers the caller passes in (monotonic seconds), so a hostile guest's flood is
bounded the same way wherever it arrives (host sessions, MQTT downloads, HTTP transfers).
"""

from __future__ import annotations

import time
from typing import Optional


class TokenBucket:
    """A token bucket: ``rate`` tokens per second up to ``burst``; times are monotonic seconds.

    Used for messages per second per VM (hellos, events) and bytes per second (downloads).
    """

    def __init__(self, rate: float, burst: float, now: Optional[float] = None) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic() if now is None else now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, now: float) -> bool:
        """Take one token at monotonic ``now``; False when the bucket is empty."""
        self._refill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def spend(self, now: float, amount: float) -> float:
        """Spend ``amount`` tokens (going into debt); return seconds until the bucket is
        out of debt again (0 when it is not in debt)."""
        self._refill(now)
        self.tokens -= amount
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def wait(self, now: float) -> float:
        """Seconds until one token is available (0 when one is)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate


def worth_logging(n: int) -> bool:
    """Whether the ``n``-th (1-based) occurrence of a remark is logged: the 1st-5th, then every
    power of 10 (so a hostile guest cannot flood the host's logs)."""
    digits = str(n)
    return n <= 5 or (digits[0] == "1" and set(digits[1:]) <= {"0"})
