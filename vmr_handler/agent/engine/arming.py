"""Positive time: timers for every unfired entry, pause and break (SPEC section 4).

:class:`PositiveTimers` turns a :class:`~vmr_handler.core.timeline.Plan` into timers on the
engine's clock at ``start + fire_at``: one timer per group of entries due at the same instant
(fired in one callback), one per pause/break taking effect and one per pause ending. A RESUME
or a clock change re-arms them all from a new plan; what the journal says has passed is never
armed again.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.core.clock import Timer
from vmr_handler.core.errors import JournalError
from vmr_handler.core.events import EventType
from vmr_handler.core.schedule.model import EntryKind, ScheduleEntry
from vmr_handler.core.timeline import Plan, PlannedEntry

#: ``fire(fire_at, entries)``: start the entries due at experiment second ``fire_at``.
FireFn = Callable[[float, List[ScheduleEntry]], None]


@dataclass
class PositiveTimers:
    """The armed timers of positive time.

    Args:
        state: what the engine's parts share: the schedule (entries by index, pause
            durations), the journal (entry states, start time, passed milestones, saved when one
            passes), the clock the timers are armed on; pause/break events go to its reports; it
            wakes the engine when its main loop should look again; on_host entries are armed
            too when its config has a ``host_ask`` (a host runs them: the connected agent).
        fire: called at each group's instant.

    Attributes:
        plan: the plan armed last (None before positive time).
        pending: ``("entry"|"hold"|"hold_end", index)`` of every armed, not yet run, timer.
    """

    state: EngineState
    fire: FireFn
    plan: Optional[Plan] = field(default=None, init=False)
    pending: Set[Tuple[str, int]] = field(default_factory=set, init=False)
    _timers: List[Timer] = field(default_factory=list, init=False)

    def cancel(self) -> None:
        """Disarm every timer."""
        for timer in self._timers:
            timer.cancel()
        self._timers = []

    def arm(self, plan: Plan) -> None:
        """(Re)arm the timers of every unfired positive entry and pause/break from ``plan``."""
        self.cancel()
        self.pending = set()
        self.plan = plan
        start = self.state.journal.start_time
        assert start is not None
        run_host = self.state.config.host_ask is not None
        groups: Dict[float, List[ScheduleEntry]] = {}
        for p in plan.entries:
            if p.fire_at is None or math.isinf(p.fire_at):
                continue
            entry = self.state.schedule.entries[p.index]
            fires = p.kind is EntryKind.POSITIVE or (run_host and p.kind is EntryKind.HOST)
            if fires and self.state.journal.entry_state(p.index) is None:
                groups.setdefault(p.fire_at, []).append(entry)
            elif p.kind in (EntryKind.PAUSE, EntryKind.BREAK):
                milestones = [("hold", p.fire_at)]
                if p.kind is EntryKind.PAUSE:
                    milestones.append(("hold_end", p.fire_at + (entry.pause_duration or 0.0)))
                for what, at in milestones:
                    if not self.state.journal.hold_passed(what, p.index):
                        self.pending.add((what, p.index))
                        self._timers.append(self.state.clock.call_at(start + at, self._milestone, what, p))
        for fire_at, entries in groups.items():
            self.pending.update(("entry", e.index) for e in entries)
            self._timers.append(self.state.clock.call_at(start + fire_at, self._fire_group, fire_at, entries))
        self.state.wake()

    def _fire_group(self, fire_at: float, entries: List[ScheduleEntry]) -> None:
        for entry in entries:
            self.pending.discard(("entry", entry.index))
        self.fire(fire_at, entries)

    def _milestone(self, what: str, p: PlannedEntry) -> None:
        """Timer callback: a pause/break takes effect (``hold``) or a pause ends (``hold_end``)."""
        self.pending.discard((what, p.index))
        self.state.journal.mark_hold(what, p.index)
        with contextlib.suppress(JournalError):
            self.state.journal.save()
        duration = self.state.schedule.entries[p.index].pause_duration or 0.0
        assert p.fire_at is not None
        if what == "hold_end":
            self.state.emit(EventType.PAUSE_ENDED, index=p.index, at=p.fire_at + duration, duration=duration)
        elif p.kind is EntryKind.BREAK:
            self._break_started(p.index, p.fire_at)
        else:
            until = p.fire_at + duration
            self.state.emit(
                EventType.PAUSE_STARTED, index=p.index, at=p.fire_at, duration=duration, until=until
            )
        self.state.wake()

    def break_reached(self, index: int, at: float) -> None:
        """The positive-time break ``index`` (in effect at experiment second ``at``) is ended by a
        RESUME stamped at or after ``at`` before its timer fired (the host's clock runs ahead of
        this one): report it started now, before the RESUME's report, and never again."""
        if not self.state.journal.hold_passed("hold", index):
            self.pending.discard(("hold", index))
            self.state.journal.mark_hold("hold", index)
            self._break_started(index, at)

    def _break_started(self, index: int, at: float) -> None:
        self.state.emit(EventType.BREAK_STARTED, index=index, at=at, details="schedule held until RESUME")

    def upcoming(self, plan: Plan, start: float, now: float, limit: int = 5) -> List[Dict[str, float]]:
        """The next ``limit`` unfired positive entries of ``plan``: index, ``fire_at`` (experiment
        seconds) and ``in`` (seconds from reference UTC ``now``, start time ``start``)."""
        upcoming: List[Dict[str, float]] = []
        for p in plan.positive_firings():
            if self.state.journal.entry_state(p.index) is None and p.fire_at is not None:
                upcoming.append({"index": p.index, "fire_at": p.fire_at, "in": start + p.fire_at - now})
            if len(upcoming) == limit:
                break
        return upcoming

    def active_hold(self, plan: Plan, now: Optional[float]) -> Optional[Dict[str, object]]:
        """The positive-time pause or break in effect at experiment second ``now``, if any."""
        if now is None:
            return None
        for p in plan.entries:
            if p.kind not in (EntryKind.PAUSE, EntryKind.BREAK) or p.fire_at is None:
                continue
            if math.isinf(p.fire_at) or p.fire_at > now:
                continue
            if p.kind is EntryKind.BREAK and plan.blocked_by == p.index:
                return {"index": p.index, "kind": "break", "at": p.fire_at}
            duration = self.state.schedule.entries[p.index].pause_duration or 0.0
            if p.kind is EntryKind.PAUSE and now < p.fire_at + duration:
                return {"index": p.index, "kind": "pause", "at": p.fire_at, "until": p.fire_at + duration}
        return None
