"""The timeline: pure pause/break/RESUME arithmetic (SPEC section 4, seed 000).

:func:`build_plan` maps a schedule and the RESUME times received so far to the experiment
time (seconds after the experiment start) at which every positive or host entry fires and
every pause/break takes effect. No clock, no I/O: the engine calls it again after every
RESUME, and ``vmr-handler plan`` prints it (``plan --json`` through :func:`plan_columns`, the
same plan without an object per entry).

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
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import add, attrgetter, ge, lt, not_, or_
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.gcpause import paused_gc
from vmr_handler.core.schedule.model import EntryKind, ResumeMark, ScheduleEntry


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


def build_plan(
    entries: Sequence[ScheduleEntry], resumes: Sequence[float] = (), visible: Optional[Sequence[int]] = None
) -> Plan:
    """Compute the plan of a schedule given the RESUME times received so far.

    Args:
        entries: validated schedule entries (``entries[i].index == i`` not required).
        resumes: experiment times (seconds) at which RESUMEs arrived; ``-inf`` for a RESUME
            received before the experiment start. Processed in ascending order.
        visible: per RESUME (same order as ``resumes``), how many entries the schedule had
            when it arrived: it can end only a break whose index is below that, so a break
            appended later (``vmr-host schedule add``) is never ended by a RESUME
            that came before it. None: every RESUME sees every entry.

    Returns:
        The :class:`Plan`. Pure: the same inputs always give the same plan.
        100 000 entries take about 120 ms (``plan`` at parse speed): each entry's
        kind is computed once, plain entries skip the per-entry method calls, and the cyclic
        garbage collector is paused (:func:`~vmr_handler.core.gcpause.paused_gc`).
    """
    with paused_gc():
        return _build_plan(entries, resumes, visible)


def _build_plan(
    entries: Sequence[ScheduleEntry], resumes: Sequence[float], visible: Optional[Sequence[int]]
) -> Plan:
    # each entry's kind once; without data, pause or host flag it is the start time's sign
    kinds = [
        e.kind if e.data or e.pause or e.on_host else _NEGATIVE if e.start_time < 0 else _POSITIVE
        for e in entries
    ]
    # a stage: every negative entry at one time, the host's (on_host) included
    staged = (e.start_time for e, k in zip(entries, kinds) if k is _NEGATIVE or _host_stage(e, k))
    stages = tuple(sorted(set(staged)))
    # (time, position given), ascending: the order in which RESUMEs can end breaks
    resume_list = sorted((float(r), i) for i, r in enumerate(resumes))
    walk = _Walk(resume_list, None if visible is None else [visible[i] for _r, i in resume_list])
    fire = walk.fire
    # timed entries in (start_time, is_pause, index) order; the position breaks ties (never the entry)
    timed = sorted(
        (e.start_time, e.pause, e.index, pos)
        for pos, (e, k) in enumerate(zip(entries, kinds))
        if (k is not _NEGATIVE and e.start_time >= 0) or e.pause
    )
    off, blocked = walk.off, walk.blocked
    for start, pause, index, pos in timed:
        if pause or blocked is not None:
            walk.visit(entries[pos])
            off, blocked = walk.off, walk.blocked
        else:  # what visit() does for an entry that is not a pause, inline
            fire[index] = start + off
    return Plan(
        _planned(entries, kinds, stages, fire),
        _outcomes(resume_list, walk.ended),
        stages,
        walk.initial_delay,
        walk.blocked,
    )


_NEGATIVE, _POSITIVE = EntryKind.NEGATIVE, EntryKind.POSITIVE


def _host_stage(entry: ScheduleEntry, kind: EntryKind) -> bool:
    """An on_host entry at a negative time: the host runs it inside the VM's stage of that time
    (reference ``run_vm_resource_host``), so the time is a stage even with no other entry."""
    return kind is EntryKind.HOST and entry.start_time < 0


@dataclass
class _Walk:
    """The state of one :func:`build_plan` pass over the timed entries (local to that call).

    Attributes:
        resume_list: ``(time, position given)`` of every RESUME, ascending.
        visible: per item of ``resume_list``, how many entries the schedule had when that
            RESUME arrived (None: all).
        ended: position in ``resume_list`` -> index of the break that RESUME ended (or None).
        fire: entry index -> experiment time it fires / takes effect (None: held by a break).
        next_resume: position in ``resume_list`` of the first unused RESUME.
        off: running offset, schedule time -> experiment time (seconds).
        initial_delay: seconds of ``-inf`` pauses so far.
        blocked: index of the break no RESUME ended, or None.
    """

    resume_list: List[Tuple[float, int]]
    visible: Optional[List[int]] = None
    ended: Dict[int, Optional[int]] = field(init=False)
    fire: Dict[int, Optional[float]] = field(default_factory=dict)
    next_resume: int = 0
    off: float = 0.0
    initial_delay: float = 0.0
    blocked: Optional[int] = None

    def __post_init__(self) -> None:
        self.ended = {i: None for i in range(len(self.resume_list))}

    def visit(self, entry: ScheduleEntry) -> None:
        """Place one timed entry; entries must come in :func:`_order_key` order."""
        if self.blocked is not None:
            self.fire[entry.index] = None
        elif not entry.pause:
            self.fire[entry.index] = entry.start_time + self.off
        elif entry.start_time == -math.inf:
            self._pause_at_minus_inf(entry, entry.pause_duration or 0.0)
        else:
            self._pause(entry, entry.pause_duration or 0.0)

    def _pause_at_minus_inf(self, entry: ScheduleEntry, duration: float) -> None:
        """A pause delays stage 0 and every positive entry; a break waits for any RESUME."""
        self.fire[entry.index] = -math.inf
        if math.isinf(duration):
            self._end_break(entry, -math.inf)
        else:
            self.off += duration
            self.initial_delay += duration

    def _pause(self, entry: ScheduleEntry, duration: float) -> None:
        """A pause at P >= 0 adds its duration; a break shifts later entries to its RESUME."""
        p_eff = entry.start_time + self.off
        self.fire[entry.index] = p_eff
        if not math.isinf(duration):
            self.off += duration
            return
        r = self._end_break(entry, p_eff)
        if r is not None:
            self.off = r - entry.start_time

    def _end_break(self, entry: ScheduleEntry, p_eff: float) -> Optional[float]:
        """The time of the RESUME that ends the break ``entry``, or None (it blocks the rest)."""
        r = self._take_resume(p_eff, entry.index)
        if r is None:
            self.blocked = entry.index
        else:
            self.ended[self.next_resume] = entry.index
            self.next_resume += 1
        return r

    def _take_resume(self, p_eff: float, index: int) -> Optional[float]:
        """The first unused RESUME at or after ``p_eff`` that saw break ``index``; earlier ones
        are ignored (no active break when they arrived), as are those that arrived before the
        break was appended (RESUMEs come in time order, so they are all earlier ones)."""
        seen, items = self.visible, self.resume_list
        while self.next_resume < len(items) and (
            items[self.next_resume][0] < p_eff or (seen is not None and seen[self.next_resume] <= index)
        ):
            self.next_resume += 1
        if self.next_resume == len(self.resume_list):
            return None
        return self.resume_list[self.next_resume][0]


def _planned(
    entries: Sequence[ScheduleEntry],
    kinds: List[EntryKind],
    stages: Tuple[float, ...],
    fire: Dict[int, Optional[float]],
) -> Tuple[PlannedEntry, ...]:
    """One :class:`PlannedEntry` per entry (``kinds[i]`` is ``entries[i].kind``), in index order."""
    stage_of = {t: k for k, t in enumerate(stages)}
    indices = [e.index for e in entries]
    order = sorted(range(len(entries)), key=indices.__getitem__)  # stable, like sorting entries
    planned: List[PlannedEntry] = []
    add = planned.append
    for e, kind in zip(map(entries.__getitem__, order), map(kinds.__getitem__, order)):
        # the frozen dataclass's __init__ is most of this loop's time (as in
        # validate._plain_entries): the fields are set as that __init__ sets them
        item: PlannedEntry = _new(PlannedEntry)
        fields = item.__dict__
        fields["index"] = e.index
        fields["start_time"] = e.start_time
        fields["kind"] = kind
        fields["stage"] = stage_of.get(e.start_time) if kind is _NEGATIVE else None
        fields["fire_at"] = fire.get(e.index)
        add(item)
    return tuple(planned)


_new = object.__new__


def _outcomes(
    resume_list: List[Tuple[float, int]], ended: Dict[int, Optional[int]]
) -> Tuple[ResumeOutcome, ...]:
    """One :class:`ResumeOutcome` per RESUME, reported in the order given."""
    outcomes = tuple(ResumeOutcome(float(r), ended[pos]) for pos, (r, _i) in enumerate(resume_list))
    order = sorted(range(len(resume_list)), key=lambda pos: resume_list[pos][1])
    return tuple(outcomes[pos] for pos in order)


@dataclass(frozen=True)
class PlanColumns:
    """The plan of a schedule given as columns (:func:`plan_columns`): :func:`build_plan`'s plan
    without an object per entry (``plan --json`` of 100 000 entries at parse speed).

    Attributes:
        starts: every entry's ``start_time`` (seconds), in index order (the column given).
        kinds: the :class:`EntryKind` of every entry that is neither NEGATIVE nor POSITIVE (host,
            pause, break, RESUME), by index; any other entry ``i`` is NEGATIVE when
            ``starts[i] < 0``, else POSITIVE.
        negative: indices of the NEGATIVE entries, ascending; entry ``i``'s stage is the
            position of ``starts[i]`` in ``stages``.
        fired: indices of the entries whose ``fire_at`` is not None, in no particular order.
        fire_at: their ``fire_at`` (experiment seconds), aligned with ``fired``; every other
            entry's is None.
        resumes, stages, initial_delay, blocked_by: as in :class:`Plan`.
    """

    starts: Sequence[float]
    kinds: Dict[int, EntryKind]
    negative: List[int]
    fired: List[int]
    fire_at: List[float]
    resumes: Tuple[ResumeOutcome, ...]
    stages: Tuple[float, ...]
    initial_delay: float
    blocked_by: Optional[int]

    def plan(self) -> Plan:
        """The same plan as a :class:`Plan` (what :func:`build_plan` returns)."""
        fire: List[Optional[float]] = [None] * len(self.starts)
        for index, at in zip(self.fired, self.fire_at):
            fire[index] = at
        stage_of = {t: k for k, t in enumerate(self.stages)}
        negative = set(self.negative)
        entries = tuple(
            PlannedEntry(
                i,
                t,
                self.kinds.get(i) or (_NEGATIVE if t < 0 else _POSITIVE),
                stage_of[t] if i in negative else None,
                fire[i],
            )
            for i, t in enumerate(self.starts)
        )
        return Plan(entries, self.resumes, self.stages, self.initial_delay, self.blocked_by)


def plan_columns(
    starts: Sequence[float],
    others: Mapping[int, ScheduleEntry],
    hosts: Iterable[int] = (),
    resumes: Sequence[float] = (),
    kinds: Optional[Dict[int, EntryKind]] = None,
) -> PlanColumns:
    """:func:`build_plan` of a schedule given as columns: entry ``i`` is ``others[i]`` when
    present (its ``index`` is ``i``), else a plain program entry at ``starts[i]`` (no data, no
    pause; on the host when ``i`` is in ``hosts``). ``starts`` holds every entry's start time.

    The same rules and the same numbers as :func:`build_plan` (tests/test_plan_fast.py compares
    them), found without sorting the entries: the pauses and breaks are walked in order, and
    every other timed entry at ``t`` takes the offset left by the pauses before ``t`` (found by
    bisection) or is held when ``t`` is after a break no RESUME ended. 100 000 entries: a few
    passes over the columns.

    Args:
        kinds: :func:`special_kinds` of ``others`` and ``hosts`` when the caller has it (not
            copied); None: found here.

    Returns:
        The :class:`PlanColumns`. Pure.
    """
    if kinds is None:
        kinds = special_kinds(others, hosts)
    # every pause entry has a kind of its own (pause, break, or RESUME): only those are read
    specials = [others[i] for i in kinds if i in others]
    pauses = sorted(compress(specials, map(_PAUSE, specials)), key=lambda e: (e.start_time, e.index))
    is_negative = list(map(lt, starts, repeat(0.0)))
    is_timed = list(map(ge, starts, repeat(0.0)))  # every entry at t >= 0 but the pauses
    for index in kinds:
        is_negative[index] = False
    for pause in pauses:
        is_timed[pause.index] = False
    negative = list(compress(range(len(starts)), is_negative))
    timed = list(compress(range(len(starts)), is_timed))
    walk = _Walk(sorted((float(r), i) for i, r in enumerate(resumes)))
    bounds: List[float] = []  # start times of the pauses walked before any hold, ascending
    offsets: List[float] = []  # offsets[j]: the offset before pause j (the last: after them all)
    for pause in pauses:
        if walk.blocked is None:
            bounds.append(pause.start_time)
            offsets.append(walk.off)
        walk.visit(pause)
    offsets.append(walk.off)
    if walk.blocked is not None:  # entries at the break's time come before it; later ones are held
        held_after = others[walk.blocked].start_time
        timed = [i for i in timed if starts[i] <= held_after]
    times = list(map(starts.__getitem__, timed))
    if any(offsets):
        fire_at = list(map(add, times, map(offsets.__getitem__, map(bisect_left, repeat(bounds), times))))
    else:
        fire_at = times  # t + 0.0 is t
    for pause in pauses:
        at = walk.fire[pause.index]
        if at is not None:
            timed.append(pause.index)
            fire_at.append(at)
    host_stages = [starts[i] for i, k in kinds.items() if k is EntryKind.HOST and starts[i] < 0]
    return PlanColumns(
        starts,
        kinds,
        negative,
        timed,
        fire_at,
        _outcomes(walk.resume_list, walk.ended),
        tuple(sorted({*map(starts.__getitem__, negative), *host_stages})),
        walk.initial_delay,
        walk.blocked,
    )


_PAUSE, _ON_HOST = attrgetter("pause"), attrgetter("on_host")
_EXECUTABLE, _DATA = attrgetter("executable"), attrgetter("data")


def special_kinds(
    others: Mapping[int, ScheduleEntry],
    hosts: Iterable[int] = (),
    executables: Optional[Sequence[Optional[str]]] = None,
) -> Dict[int, EntryKind]:
    """The :class:`EntryKind` of every entry of a validated schedule given as columns (as
    :func:`plan_columns` takes it) that is neither NEGATIVE nor POSITIVE: host, pause, break,
    RESUME, by index (``others`` first, then ``hosts``). Only the entries that pause, run on
    the host or are a stored RESUME have such a kind, so the kind is read of those alone; the
    others are picked out as columns (no Python call per entry). A stored RESUME runs no
    program (validation's rule, as ``firewheel vm resume`` writes it): only the data of the
    entries without an executable is looked at for a :class:`ResumeMark`. ``executables``:
    the schedule's executables column (entry ``i``: ``executables[i]``) when the caller has it.
    """
    indices, entries = list(others), list(others.values())
    special = list(map(or_, map(_PAUSE, entries), map(_ON_HOST, entries)))
    runs = map(_EXECUTABLE, entries) if executables is None else map(executables.__getitem__, indices)
    runless = list(compress(range(len(entries)), map(not_, runs)))
    datas = list(map(_DATA, map(entries.__getitem__, runless)))
    if any(issubclass(kind, ResumeMark) for kind in set(map(type, chain.from_iterable(datas)))):
        for position, data in zip(runless, datas):
            special[position] = special[position] or any(isinstance(item, ResumeMark) for item in data)
    kinds = {i: others[i].kind for i in compress(indices, special)}
    kinds.update(dict.fromkeys(hosts, EntryKind.HOST))
    return kinds
