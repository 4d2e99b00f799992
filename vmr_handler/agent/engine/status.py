"""What the engine says of itself: its first events (:func:`announce`) and its status
(:func:`engine_status` for ``vmr-handler status``, :func:`waiting_status` for the reminders).

Split from :mod:`vmr_handler.agent.engine.engine`; pure reads of an engine's state (``engine`` is an
:class:`~vmr_handler.agent.engine.engine.Engine`, typed ``Any`` here so that this module, which the
engine imports, does not import it back).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, Sequence

from vmr_handler import __version__
from vmr_handler.agent.machine.executor import REBOOT_EXIT_CODE
from vmr_handler.agent.state.journal import DONE, FAILED, Journal
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


def entry_counts(journal: Journal, entries: Sequence[ScheduleEntry]) -> Dict[str, int]:
    """How the entries this agent ran ended, from its journal (so a restart counts the same).

    Args:
        journal: the engine's journal.
        entries: the schedule's entries, appended ones included (indexed by ``entry.index``).

    Returns:
        ``{"ran": n, "exited_nonzero": n, "not_started": n}``: ``ran`` counts the entries that
        ended (a process ran to its end, a data-only entry placed its data, the host ran an
        ``on_host`` one); ``exited_nonzero`` those of them whose program exited non-zero or was
        killed by a signal (a reboot request in negative time, exit 10, is not); ``not_started``
        those whose data could not be placed (``ignore_failure``) or whose process could not be
        started. Entries still running are in none.
    """
    ran = nonzero = not_started = 0
    for index, (state, code) in journal.entry_outcomes().items():
        if state == FAILED:
            not_started += 1
        elif state == DONE:
            ran += 1
            entry = entries[index] if 0 <= index < len(entries) else None
            program = entry is None or entry.executable is not None
            reboot = code == REBOOT_EXIT_CODE and entry is not None and entry.start_time < 0
            nonzero += program and code != 0 and not reboot
    return {"ran": ran, "exited_nonzero": nonzero, "not_started": not_started}


def completion(counts: Dict[str, int]) -> Dict[str, Any]:
    """The data of ``schedule_complete`` for :func:`entry_counts` ``counts``: its ``status``
    (``error`` when some entry could not start, else ``success``: a non-zero exit is the
    entry's own, SPEC section 5), the counts and ``details`` that say them in words."""
    ran, nonzero, not_started = counts["ran"], counts["exited_nonzero"], counts["not_started"]
    words = f"{ran} entr{'y' if ran == 1 else 'ies'} ran"
    if nonzero:
        words += f" ({nonzero} exited non-zero)"
    if not_started:
        words += f", {not_started} could not start (see their entry_failed reports)"
    return {"status": "error" if not_started else "success", **counts, "details": words}


def append_answer(record: Dict[str, Any]) -> Dict[str, Any]:
    """What the agent answers (and reports) for an appended batch's journal record
    (:mod:`vmr_handler.agent.engine.appends`): where its entries went."""
    return {
        "first_index": record["first_index"],
        "count": record["count"],
        "stages": record["stages"],
        "moved": record["moved"],
    }


def waiting_status(engine: Any) -> Dict[str, Any]:
    """What the reminders (:mod:`vmr_handler.agent.engine._reminders`) look at once a second: the phase,
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
    now, a failure, reports held because they cannot be written."""
    now = engine.clock.time()
    journal, timers = engine.journal, engine.timers
    start = journal.start_time
    plan = timers.plan or engine.plan()
    hold = engine.holds.current or timers.active_hold(plan, None if start is None else now - start)
    # a break holds the VM only once its time has come; before, it is the next break
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
        "entries": entry_counts(engine.journal, engine.schedule.entries),
        "held_reports": len(engine.reports),
    }
