"""The ``-inf`` pauses and breaks: held before anything starts (SPEC section 4).

A ``-inf`` break holds the whole schedule, stages included, until a RESUME; a ``-inf`` pause
holds it for its duration from when the agent first met it (journaled, so a restart does not
start the pause again). Each is passed once, in schedule order.

A break is reported (``break_started``) before the RESUME that ends it: a RESUME stamped
``-inf`` that arrives before the agent reached the break (a stored ``firewheel vm resume``
entry, applied when the schedule is loaded) has the engine report the break first
(:meth:`InitialHolds.report`), and the break, once reached, is not reported again
(SPEC section 4: a RESUME ends the active break; a ``-inf`` break holds from the start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Set

from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.core.events import EventType
from vmr_handler.core.schedule.model import ScheduleEntry
from vmr_handler.core.timeline import build_plan


@dataclass
class InitialHolds:
    """Waits out the ``-inf`` holds for the engine.

    Args:
        state: what the engine's parts share: the schedule, the journal (which holds were
            passed, when a pause began, the RESUMEs received), the clock (a pause's end); the
            phase it sets (``break`` / ``pause``); its waits raise when the engine stops.

    Attributes:
        current: the hold being waited out, for status (``{"index", "kind", "at", "until"}``).
        reported: the ``-inf`` breaks reported started in this run of the agent.
    """

    state: EngineState
    current: Optional[Dict[str, Any]] = field(default=None, init=False)
    reported: Set[int] = field(default_factory=set, init=False)

    async def run(self) -> None:
        """Wait out every ``-inf`` pause and break the journal has not seen passed, in order."""
        holds = [e for e in self.state.schedule.entries if e.pause and e.start_time == -math.inf]
        for entry in holds:
            if self.state.journal.initial_done(entry.index):
                continue
            if math.isinf(entry.pause_duration or 0.0):
                await self._break(entry)
            else:
                await self._pause(entry)
            self.current = None
            self.state.journal.mark_initial_done(entry.index)
            await self.state.persist()

    def report(self, entry: ScheduleEntry) -> None:
        """Report the ``-inf`` break ``entry`` started (``break_started``), once per agent run."""
        if entry.index in self.reported:
            return
        self.reported.add(entry.index)
        self.state.emit(
            EventType.BREAK_STARTED,
            index=entry.index,
            at=-math.inf,
            details="break at -inf: holding everything until RESUME",
        )

    async def _break(self, entry: ScheduleEntry) -> None:
        state = self.state
        journal = state.journal

        def holding() -> bool:
            # earlier -inf breaks are already resumed, so only this one can block here
            plan = build_plan(state.schedule.entries, journal.resumes, journal.resume_visibility)
            return plan.blocked_by == entry.index

        if not holding():
            return  # a RESUME received before (a stored one, or before a restart) ended it and said so
        state.phase = "break"
        self.current = {"index": entry.index, "kind": "break", "at": "-inf"}
        self.report(entry)
        while holding():
            await state.wait_woken()

    async def _pause(self, entry: ScheduleEntry) -> None:
        duration = entry.pause_duration or 0.0
        began = self.state.journal.pause_began(entry.index, self.state.clock.time())
        await self.state.persist()
        self.state.phase = "pause"
        self.current = {"index": entry.index, "kind": "pause", "at": "-inf", "until": began + duration}
        self.state.emit(
            EventType.PAUSE_STARTED,
            index=entry.index,
            at=-math.inf,
            duration=duration,
            until=began + duration,
        )
        await self.state.sleep_until(began + duration)
        self.state.emit(EventType.PAUSE_ENDED, index=entry.index, at=-math.inf, duration=duration)
