"""The ``-inf`` pauses and breaks: held before anything starts (SPEC section 4).

A ``-inf`` break holds the whole schedule, stages included, until a RESUME; a ``-inf`` pause
holds it for its duration from when the agent first met it (journaled, so a restart does not
start the pause again). Each is passed once, in schedule order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Optional

from vmr_handler.agent.state.journal import Journal
from vmr_handler.core.clock import Clock
from vmr_handler.core.events import EventType
from vmr_handler.core.schedule.model import Schedule, ScheduleEntry
from vmr_handler.core.timeline import build_plan


@dataclass
class InitialHolds:
    """Waits out the ``-inf`` holds for the engine.

    Args:
        schedule: the schedule.
        journal: which holds were passed, when a pause began, the RESUMEs received.
        clock: the reference clock (a pause's end).
        emit: ``emit(EventType, **data)``.
        set_phase: sets the engine's phase (``break`` / ``pause``).
        wait_woken: waits until the engine is woken (a RESUME); raises when it stops.
        sleep_until: sleeps until a reference UTC instant; raises when the engine stops.
        persist: saves the journal durably (waits out a full disk; raises when the engine stops).

    Attributes:
        current: the hold being waited out, for status (``{"index", "kind", "at", "until"}``).
    """

    schedule: Schedule
    journal: Journal
    clock: Clock
    emit: Callable[..., object]
    set_phase: Callable[[str], None]
    wait_woken: Callable[[], Awaitable[None]]
    sleep_until: Callable[[float], Awaitable[None]]
    persist: Callable[[], Awaitable[None]]
    current: Optional[Dict[str, Any]] = field(default=None, init=False)

    async def run(self) -> None:
        """Wait out every ``-inf`` pause and break the journal has not seen passed, in order."""
        holds = [e for e in self.schedule.entries if e.pause and e.start_time == -math.inf]
        for entry in holds:
            if self.journal.initial_done(entry.index):
                continue
            if math.isinf(entry.pause_duration or 0.0):
                await self._break(entry)
            else:
                await self._pause(entry)
            self.current = None
            self.journal.mark_initial_done(entry.index)
            await self.persist()

    async def _break(self, entry: ScheduleEntry) -> None:
        self.set_phase("break")
        self.current = {"index": entry.index, "kind": "break", "at": "-inf"}
        self.emit(
            EventType.BREAK_STARTED,
            index=entry.index,
            at=-math.inf,
            details="break at -inf: holding everything until RESUME",
        )
        # earlier -inf breaks are already resumed, so only this one can block here
        journal = self.journal
        while build_plan(self.schedule.entries, journal.resumes, journal.resume_visibility).blocked_by == (
            entry.index
        ):
            await self.wait_woken()

    async def _pause(self, entry: ScheduleEntry) -> None:
        duration = entry.pause_duration or 0.0
        began = self.journal.pause_began(entry.index, self.clock.time())
        await self.persist()
        self.set_phase("pause")
        self.current = {"index": entry.index, "kind": "pause", "at": "-inf", "until": began + duration}
        self.emit(
            EventType.PAUSE_STARTED,
            index=entry.index,
            at=-math.inf,
            duration=duration,
            until=began + duration,
        )
        await self.sleep_until(began + duration)
        self.emit(EventType.PAUSE_ENDED, index=entry.index, at=-math.inf, duration=duration)
