"""What the engine says of itself, built from what it holds: its first events
(:func:`announce`, :func:`skip_host_entries`), how its entries ended (:func:`entry_counts`, in
``schedule_complete`` and in :meth:`~vmr_handler.agent.engine.engine.Engine.status`;
:func:`completion`, the data of ``schedule_complete``) and where an appended batch's entries
went (:func:`append_answer`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, Sequence

from vmr_handler import __version__
from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.agent.machine.executor import REBOOT_EXIT_CODE
from vmr_handler.agent.state.journal import DONE, FAILED, Journal
from vmr_handler.core.events import Event, EventType
from vmr_handler.core.schedule.model import ScheduleEntry


def announce(state: EngineState) -> None:
    """The engine's first events: agent started, schedule loaded, its warnings, a journal reset,
    the on_host entries nobody runs (local mode, no ``host_ask``; else the host runs them)."""
    emit, schedule, journal = state.emit, state.schedule, state.journal
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
    if state.config.host_ask is None:
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
