"""The timeline: pure pause/break/RESUME arithmetic (SPEC section 4, seed 000).

:func:`build_plan` maps a schedule and the RESUME times received so far to the experiment
time (seconds after the experiment start) at which every positive or host entry fires and
every pause/break takes effect. No clock, no I/O: the engine calls it again after every
RESUME, and ``vmr-handler plan`` prints it.

Rules (the reference's ``sys.float_info.min`` trick replaced by explicit ordering):

* Items at or after time 0 are processed in ``(start_time, is_pause, index)`` order, so
  entries at exactly P come before a pause/break at P (tie-break), and pauses at the same
  time keep schedule order.
* A running offset ``off`` maps schedule time to experiment time: ``fire_at = t + off``.
* Pause at P for D: takes effect at ``P + off``; then ``off += D`` (pauses accumulate).
* Break at P: takes effect at ``P_eff = P + off``; it is ended by the first unused RESUME
  at ``R >= P_eff``; then ``off = R - P``, i.e. later entries fire at ``t - P_eff + R``
  (in shifted coordinates). RESUMEs before ``P_eff`` found no active break: ignored.
  Without such a RESUME, the break and everything after it stay unscheduled (None).
* Pause/break at ``-inf``: before everything. A pause delays the first stage by D (the
  engine waits) and every positive entry by D (``off += D``); a break holds everything
  until a RESUME, which the engine records at experiment time ``-inf`` (the experiment
  has not started), and shifts nothing. Negative entries stay negative.
* Each RESUME ends at most one break; RESUMEs left over are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from vmr_handler.core.schedule.model import EntryKind, ScheduleEntry


@dataclass(frozen=True)
class PlannedEntry:
    """Where one schedule entry sits on the timeline.

    Attributes:
        index: the entry's index in the schedule.
        start_time: its start_time (seconds; may be ``-inf`` for a pause/break).
        kind: :class:`EntryKind`.
        stage: 0-based stage number for negative entries, else None.
        fire_at: experiment seconds at which it fires / takes effect; ``-inf`` for a
            pause/break at ``-inf``; None for negative entries and anything held by a break
            that no RESUME ended.
    """

    index: int
    start_time: float
    kind: EntryKind
    stage: Optional[int]
    fire_at: Optional[float]


@dataclass(frozen=True)
class ResumeOutcome:
    """What one RESUME did: ended the break ``ended_break`` (an entry index) or nothing (None)."""

    at: float
    ended_break: Optional[int]


@dataclass(frozen=True)
class Plan:
    """The result of :func:`build_plan`.

    Attributes:
        entries: one :class:`PlannedEntry` per schedule entry, in index order.
        resumes: one :class:`ResumeOutcome` per RESUME, in the order given.
        stages: the distinct negative start times, ascending (stage ``k`` is ``stages[k]``).
        initial_delay: seconds of ``-inf`` pauses (the engine waits this long before stage 0).
        blocked_by: index of the break that holds the rest of the schedule (no RESUME yet), or None.
    """

    entries: Tuple[PlannedEntry, ...]
    resumes: Tuple[ResumeOutcome, ...]
    stages: Tuple[float, ...]
    initial_delay: float
    blocked_by: Optional[int]

    def positive_firings(self) -> List[PlannedEntry]:
        """Scheduled positive entries, ordered by ``(fire_at, index)``."""
        items = [p for p in self.entries if p.kind is EntryKind.POSITIVE and p.fire_at is not None]
        items.sort(key=lambda p: (p.fire_at, p.index))
        return items


def _order_key(entry: ScheduleEntry) -> Tuple[float, int, int]:
    return (entry.start_time, 1 if entry.pause else 0, entry.index)


def build_plan(entries: Sequence[ScheduleEntry], resumes: Sequence[float] = ()) -> Plan:
    """Compute the plan of a schedule given the RESUME times received so far.

    Args:
        entries: validated schedule entries (``entries[i].index == i`` not required).
        resumes: experiment times (seconds) at which RESUMEs arrived; ``-inf`` for a RESUME
            received before the experiment start. Processed in ascending order.

    Returns:
        The :class:`Plan`. Pure: the same inputs always give the same plan.
    """
    stages = tuple(sorted({e.start_time for e in entries if e.kind is EntryKind.NEGATIVE}))
    stage_of = {t: k for k, t in enumerate(stages)}
    fire: Dict[int, Optional[float]] = {}
    resume_list = sorted((float(r), i) for i, r in enumerate(resumes))
    ended: Dict[int, Optional[int]] = {i: None for i in range(len(resume_list))}
    next_resume = 0
    off = 0.0
    initial_delay = 0.0
    blocked: Optional[int] = None

    def take_resume(p_eff: float) -> Optional[float]:
        """The first unused RESUME at or after ``p_eff``; earlier ones are ignored."""
        nonlocal next_resume
        while next_resume < len(resume_list) and resume_list[next_resume][0] < p_eff:
            next_resume += 1  # no active break when it arrived: ignored
        if next_resume == len(resume_list):
            return None
        return resume_list[next_resume][0]

    timed = sorted(
        (e for e in entries if (e.kind is not EntryKind.NEGATIVE and e.start_time >= 0) or e.pause),
        key=_order_key,
    )
    for entry in timed:
        if blocked is not None:
            fire[entry.index] = None
            continue
        if not entry.pause:
            fire[entry.index] = entry.start_time + off
            continue
        duration = entry.pause_duration or 0.0
        if entry.start_time == -math.inf:
            fire[entry.index] = -math.inf
            if math.isinf(duration):
                r = take_resume(-math.inf)
                if r is None:
                    blocked = entry.index
                else:
                    ended[next_resume] = entry.index
                    next_resume += 1
            else:
                off += duration
                initial_delay += duration
            continue
        p_eff = entry.start_time + off
        fire[entry.index] = p_eff
        if math.isinf(duration):
            r = take_resume(p_eff)
            if r is None:
                blocked = entry.index
            else:
                ended[next_resume] = entry.index
                next_resume += 1
                off = r - entry.start_time
        else:
            off += duration

    planned = tuple(
        PlannedEntry(
            index=e.index,
            start_time=e.start_time,
            kind=e.kind,
            stage=stage_of.get(e.start_time) if e.kind is EntryKind.NEGATIVE else None,
            fire_at=fire.get(e.index),
        )
        for e in sorted(entries, key=lambda e: e.index)
    )
    outcomes = tuple(ResumeOutcome(float(r), ended[pos]) for pos, (r, _i) in enumerate(resume_list))
    # report in the order given
    order = sorted(range(len(resume_list)), key=lambda pos: resume_list[pos][1])
    outcomes = tuple(outcomes[pos] for pos in order)
    return Plan(planned, outcomes, stages, initial_delay, blocked)
