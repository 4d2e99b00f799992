"""A RESUME applied to the journal (SPEC section 4), for :mod:`vmr_handler.agent.engine.engine`,
which re-arms positive time from the plan this returns."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.core.events import EventType
from vmr_handler.core.timeline import Plan, build_plan


def record_resume(
    state: EngineState, at: Optional[float], resume_id: Optional[str], entry: Optional[int]
) -> Tuple[Dict[str, Any], Optional[Plan]]:
    """Record one RESUME (``Engine.resume`` documents the arguments) and report it
    (``resume_received``). Returns its outcome ``{"at", "ended_break", "ignored"}`` and the new
    plan, or the first outcome with ``"repeated": True`` and None when ``resume_id`` was applied
    before. The RESUME remembers how many entries the schedule had: it never ends a break
    appended after it (:func:`~vmr_handler.core.timeline.build_plan`)."""
    journal, schedule = state.journal, state.schedule
    if resume_id is not None:
        first = journal.applied_resume(resume_id)
        if first is not None:
            return {**first, "repeated": True}, None
    start = journal.start_time
    if at is None:
        at = -math.inf if start is None else state.clock.time() - start
    journal.add_resume(at, len(schedule.entries))
    plan = build_plan(schedule.entries, journal.resumes, journal.resume_visibility)
    ended = plan.resumes[-1].ended_break
    outcome = {"at": at, "ended_break": ended, "ignored": ended is None}
    if resume_id is not None:
        journal.record_resume_id(resume_id, dict(outcome))
    state.syncer.save_soon()  # the RESUME and its id in one atomic write (or kept, retried)
    origin = {} if entry is None else {"index": entry, "origin": "schedule entry"}
    state.emit(
        EventType.RESUME_RECEIVED,
        **origin,
        **outcome,
        status="success",
        details=f"ended break at entry {ended}" if ended is not None else "no active break: ignored",
    )
    return outcome, plan
