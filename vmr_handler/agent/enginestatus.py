"""What the engine says of itself: its first events (:func:`announce`) and its status
(:func:`engine_status` for ``vmr-handler status``, :func:`waiting_status` for the reminders).

Split from :mod:`vmr_handler.agent.engine`; pure reads of an engine's state (``engine`` is an
:class:`~vmr_handler.agent.engine.Engine`, typed ``Any`` here so that this module, which the
engine imports, does not import it back).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable

from vmr_handler import __version__
from vmr_handler.agent.journal import Journal
from vmr_handler.core.events import Event, EventType
from vmr_handler.core.schedule.model import Schedule, ScheduleEntry


def announce(emit: Callable[..., Event], schedule: Schedule, journal: Journal, no_host: bool = True) -> None:
    """The engine's first events: agent started, schedule loaded, its warnings, a journal reset,
    the on_host entries nobody runs (``no_host``: local mode; else the host runs them)."""
    emit(
        EventType.AGENT_STARTED,
        version=__version__,
        pid=os.getpid(),
        resumed_from_journal=journal.resumed,
    )
    emit(
        EventType.SCHEDULE_LOADED,
        digest=schedule.digest,
        format=schedule.source_format,
        entries=len(schedule.entries),
        stages=list(schedule.stage_times()),
    )
    for warning in schedule.warnings:
        emit(EventType.SCHEDULE_WARNING, details=warning)
    if journal.reset_from:
        emit(
            EventType.JOURNAL_RESET,
            moved_to=journal.reset_from,
            details="journal belonged to another schedule; starting fresh",
        )
    if no_host:
        skip_host_entries(emit, schedule.entries)


def skip_host_entries(emit: Callable[..., Event], entries: Iterable[ScheduleEntry]) -> None:
    """Report the on_host entries of ``entries``: this agent never runs them."""
    for entry in entries:
        if entry.on_host:
            emit(
                EventType.ENTRY_SKIPPED,
                index=entry.index,
                executable=entry.executable,
                start_time=entry.start_time,
                details="on_host entry: run by the host controller",
            )


def append_answer(record: Dict[str, Any]) -> Dict[str, Any]:
    """What the agent answers (and reports) for an appended batch's journal record
    (:mod:`vmr_handler.agent.appends`): where its entries went."""
    return {
        "first_index": record["first_index"],
        "count": record["count"],
        "stages": record["stages"],
        "moved": record["moved"],
    }


def waiting_status(engine: Any) -> Dict[str, Any]:
    """What the reminders (:mod:`vmr_handler.agent.reminders`) look at once a second: the phase,
    when it was configured, the break holding it. Cheap: never builds a plan (a schedule of
    100 000 entries would cost ~0.1 s a second at the barrier)."""
    start = engine.journal.start_time
    plan = engine.timers.plan
    hold = engine.holds.current
    if hold is None and plan is not None and plan.blocked_by is not None and start is not None:
        hold = engine.timers.active_hold(plan, engine.clock.time() - start)  # only with a break ahead
    held = hold["index"] if hold is not None and hold.get("kind") == "break" else None
    return {"phase": engine.phase, "configured_at": engine.journal.configured_at, "blocked_by_break": held}


def engine_status(engine: Any) -> Dict[str, Any]:
    """What :meth:`Engine.status` shows: phase, stages, start time, holds, what runs next and
    now, a failure, reports held because they cannot be written (issue 16)."""
    now = engine.clock.time()
    journal, timers = engine.journal, engine.timers
    start = journal.start_time
    plan = timers.plan or engine.plan()
    hold = engine.holds.current or timers.active_hold(plan, None if start is None else now - start)
    # a break holds the VM only once its time has come; before, it is the next break (issue 13)
    held = hold["index"] if hold is not None and hold.get("kind") == "break" else None
    return {
        "version": __version__,
        "phase": engine.phase,
        "stage": engine.current_stage,
        "stages": len(engine.stages),
        "stages_done": journal.stages_done,
        "configured_at": journal.configured_at,
        "start_time": start,
        "experiment_time": None if start is None else now - start,
        "active_pause": hold,
        "blocked_by_break": held,
        "next_break": plan.blocked_by if held is None else None,
        "resumes": journal.resumes,
        "next_entries": [] if start is None else timers.upcoming(plan, start, now),
        "running": engine.entries.status(),
        "failure": engine.entries.failure,
        "held_reports": len(engine.reports),
    }
