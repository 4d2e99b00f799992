"""The agent says, now and then, what it waits for.

A guest agent waiting at the experiment barrier or held at a break looked dead: nothing was
printed between ``configured`` and the start (60 s by default) nor during a break. Now it
says so at the default log level after 10 s, then after 20, 40, 80... at most every 5 min,
with what moves it on. :class:`Reminder` decides (pure: it is given the engine's status and
a monotonic time); :func:`remind` runs it on the engine's clock.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Dict, Optional, Tuple

from vmr_handler.core.clock import Clock
from vmr_handler.core.fsutil import utc_text
from vmr_handler.core.readable import duration

log = logging.getLogger(__name__)

#: Seconds of waiting before the first reminder; each next one waits twice as long, up to MAX.
FIRST = 10.0
MAX = 300.0
#: Seconds between two looks at the engine's status.
TICK = 1.0
#: The engine phase of a VM configured and waiting for the experiment's start time.
AT_BARRIER = "configured, waiting at the barrier"


class Reminder:
    """When to say what the agent waits for (monotonic seconds in, a text or None out)."""

    def __init__(self) -> None:
        self.key: Tuple[Optional[str], Any] = (None, None)
        self.since = 0.0
        self.step = FIRST
        self.next_at = 0.0

    @staticmethod
    def situation(status: Dict[str, Any]) -> Tuple[Optional[str], Any]:
        """``("barrier", configured_at)``, ``("break", index)`` or ``(None, None)``."""
        if status.get("blocked_by_break") is not None:
            return "break", status["blocked_by_break"]
        if status.get("phase") == AT_BARRIER:
            return "barrier", status.get("configured_at")
        return None, None

    def check(self, status: Dict[str, Any], now: float) -> Optional[str]:
        """The reminder due at monotonic ``now`` for engine ``status``, if any."""
        key = self.situation(status)
        if key != self.key:
            self.key, self.since, self.step, self.next_at = key, now, FIRST, now + FIRST
            return None
        if key[0] is None or now < self.next_at:
            return None
        waited = duration(now - self.since)
        self.step = min(self.step * 2, MAX)
        self.next_at = now + self.step
        if key[0] == "break":
            return (f"held at break #{key[1]} for {waited}: waiting for a RESUME "
                    "(vmr-host resume VM on the host, or vmr-handler resume in this guest)")  # fmt: skip
        return (f"still waiting at the experiment barrier after {waited} (configured {utc_text(key[1])}): "
                "the host sets the start time when every VM is configured; `vmr-host status` "
                "on the host says whom it waits for")  # fmt: skip


async def remind(status: Callable[[], Dict[str, Any]], clock: Clock, stop: asyncio.Event) -> None:
    """Log :class:`Reminder`'s texts (WARNING: the default level) until ``stop`` is set."""
    reminder = Reminder()
    while not stop.is_set():
        text = reminder.check(status(), clock.monotonic())
        if text is not None:
            log.warning("%s", text)
        await clock.wait(stop, clock.time() + TICK)
