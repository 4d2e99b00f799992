"""Unit and property tests of :func:`vmr_handler.core.timeline.build_plan` (SPEC section 4).

Every time here is an integer number of seconds so the float arithmetic is exact and the
expected values can be compared with ``==``.
"""

from __future__ import annotations

import math
import random
from typing import Dict, List, Optional, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmr_handler.core.schedule.model import EntryKind, PauseSpec, ScheduleEntry
from vmr_handler.core.timeline import Plan, PlannedEntry, ResumeOutcome, build_plan

INF = math.inf


# ---------------------------------------------------------------------------- helpers
def pos(index: int, t: float, exe: str = "/bin/true") -> ScheduleEntry:
    """A normal entry (negative or positive depending on ``t``)."""
    return ScheduleEntry(index, t, exe)


def pause(index: int, t: float, duration: float) -> ScheduleEntry:
    return ScheduleEntry(index, t, None, data=(PauseSpec(duration),), pause=True)


def brk(index: int, t: float) -> ScheduleEntry:
    return pause(index, t, INF)


def host(index: int, t: float) -> ScheduleEntry:
    return ScheduleEntry(index, t, "/usr/bin/host-tool", on_host=True)


def fire(plan: Plan) -> Dict[int, Optional[float]]:
    return {p.index: p.fire_at for p in plan.entries}


def outcomes(plan: Plan) -> List[tuple]:
    return [(r.at, r.ended_break) for r in plan.resumes]


def by_index(plan: Plan) -> Dict[int, PlannedEntry]:
    return {p.index: p for p in plan.entries}


# ---------------------------------------------------------------------------- SPEC 4 worked examples
def test_example_1_pause_shifts_later_entry() -> None:
    # E1@10, pause@5 for 60 -> E1 fires at 70.
    plan = build_plan([pos(0, 10), pause(1, 5, 60)])
    assert fire(plan) == {0: 70, 1: 5}
    assert plan.resumes == ()
    assert plan.blocked_by is None
    assert plan.initial_delay == 0


def test_example_2_break_and_resume() -> None:
    # E1@10, break@15, E2@30, E3@50, RESUME at 1000 -> E1@10, E2@1015, E3@1035.
    plan = build_plan([pos(0, 10), brk(1, 15), pos(2, 30), pos(3, 50)], [1000])
    assert fire(plan) == {0: 10, 1: 15, 2: 1015, 3: 1035}
    assert outcomes(plan) == [(1000, 1)]
    assert plan.resumes == (ResumeOutcome(1000.0, 1),)
    assert plan.blocked_by is None


def test_example_3_pauses_and_break_combined() -> None:
    # E1@10, E2@30, E3@50, pause@5 for 60, break@15, pause@40 for 100, RESUME at 1000
    # -> E1@70, E2@1015, E3@1135.
    entries = [pos(0, 10), pos(1, 30), pos(2, 50), pause(3, 5, 60), brk(4, 15), pause(5, 40, 100)]
    plan = build_plan(entries, [1000])
    assert fire(plan) == {0: 70, 1: 1015, 2: 1135, 3: 5, 4: 75, 5: 1025}
    assert outcomes(plan) == [(1000, 4)]
    assert plan.blocked_by is None


def test_example_4_two_breaks_two_resumes() -> None:
    # E1@10, E2@30, E3@50, break@15, break@40, RESUMEs at 100 and 300 -> E1@10, E2@115, E3@310.
    entries = [pos(0, 10), pos(1, 30), pos(2, 50), brk(3, 15), brk(4, 40)]
    plan = build_plan(entries, [100, 300])
    assert fire(plan) == {0: 10, 1: 115, 2: 310, 3: 15, 4: 125}
    assert outcomes(plan) == [(100, 3), (300, 4)]
    assert plan.blocked_by is None


def test_example_5_entries_at_pause_time_fire_before_it() -> None:
    # A,B,C,D@10, E@20, pause@10 for 60 -> A,B,C,D@10, E@80.
    entries = [pos(0, 10), pos(1, 10), pos(2, 10), pos(3, 10), pos(4, 20), pause(5, 10, 60)]
    plan = build_plan(entries)
    assert fire(plan) == {0: 10, 1: 10, 2: 10, 3: 10, 4: 80, 5: 10}


def test_example_6_resume_without_break_is_ignored() -> None:
    # E1@10, pause@5 for 60, RESUME at 500 -> E1@70 (RESUME ignored).
    plan = build_plan([pos(0, 10), pause(1, 5, 60)], [500])
    assert fire(plan) == {0: 70, 1: 5}
    assert outcomes(plan) == [(500, None)]
    assert plan.blocked_by is None


# ---------------------------------------------------------------------------- pauses
def test_tie_break_entry_at_pause_time_fires_at_p() -> None:
    plan = build_plan([pause(0, 5, 10), pos(1, 5), pos(2, 6)])
    assert fire(plan) == {0: 5, 1: 5, 2: 16}


def test_tie_break_entry_at_break_time_is_not_held() -> None:
    plan = build_plan([brk(0, 5), pos(1, 5), pos(2, 6)])
    assert fire(plan) == {0: 5, 1: 5, 2: None}
    assert plan.blocked_by == 0


def test_pauses_at_same_time_accumulate_in_schedule_order() -> None:
    plan = build_plan([pos(0, 6), pause(1, 5, 10), pause(2, 5, 20)])
    # pause 1 takes effect at 5, pause 2 right after it (5 + 10), the entry after both.
    assert fire(plan) == {0: 36, 1: 5, 2: 15}
    swapped = build_plan([pos(0, 6), pause(1, 5, 20), pause(2, 5, 10)])
    assert fire(swapped) == {0: 36, 1: 5, 2: 25}


def test_several_pauses_accumulate() -> None:
    entries = [pause(0, 5, 10), pos(1, 10), pause(2, 20, 30), pos(3, 25), pos(4, 20), pause(5, 100, 1)]
    plan = build_plan(entries)
    assert fire(plan) == {0: 5, 1: 20, 2: 30, 3: 65, 4: 30, 5: 140}


def test_zero_length_pause_changes_nothing() -> None:
    base = [pos(0, 3), pause(1, 5, 10), pos(2, 7), brk(3, 20), pos(4, 30)]
    plan = build_plan(base, [100])
    for t in (-INF, 0, 5, 7, 25, 1000):
        with_zero = build_plan([*base, pause(5, t, 0)], [100])
        assert {k: v for k, v in fire(with_zero).items() if k != 5} == fire(plan)
        assert with_zero.resumes == plan.resumes
        assert with_zero.initial_delay == plan.initial_delay
        assert with_zero.blocked_by == plan.blocked_by


def test_pause_at_zero_shifts_every_positive_entry() -> None:
    entries = [pos(0, -3), pos(1, 0.5), pos(2, 1), pause(3, 0, 7), pos(4, 100), host(5, 2)]
    plan = build_plan(entries)
    assert fire(plan) == {0: None, 1: 7.5, 2: 8, 3: 0, 4: 107, 5: 9}
    assert by_index(plan)[0].stage == 0
    assert plan.initial_delay == 0


def test_pause_at_minus_inf() -> None:
    entries = [pos(0, -10), pos(1, -5), pause(2, -INF, 30), pos(3, 10), host(4, -3), host(5, 4)]
    plan = build_plan(entries)
    without = build_plan([e for e in entries if not e.pause])
    assert fire(plan) == {0: None, 1: None, 2: -INF, 3: 40, 4: None, 5: 34}
    assert plan.initial_delay == 30
    assert plan.stages == without.stages == (-10, -5, -3)  # an on_host entry at -3 makes a stage
    assert [p.stage for p in plan.entries] == [0, 1, None, None, None, None]
    assert [p.kind for p in plan.entries] == [
        EntryKind.NEGATIVE, EntryKind.NEGATIVE, EntryKind.PAUSE, EntryKind.POSITIVE, EntryKind.HOST,
        EntryKind.HOST,
    ]
    assert plan.blocked_by is None


def test_several_pauses_at_minus_inf_add_up() -> None:
    plan = build_plan([pause(0, -INF, 30), pos(1, 10), pause(2, -INF, 5), pause(3, 20, 1), pos(4, 25)])
    assert plan.initial_delay == 35
    assert fire(plan) == {0: -INF, 1: 45, 2: -INF, 3: 55, 4: 61}


# ---------------------------------------------------------------------------- breaks and RESUME
def test_break_at_minus_inf_blocks_until_resume_at_minus_inf() -> None:
    entries = [pos(0, -10), brk(1, -INF), pos(2, 10), pause(3, 20, 5), pos(4, 30)]
    held = build_plan(entries)
    assert held.blocked_by == 1
    assert fire(held) == {0: None, 1: -INF, 2: None, 3: None, 4: None}
    assert by_index(held)[0].stage == 0
    assert held.initial_delay == 0

    resumed = build_plan(entries, [-INF])
    assert resumed.blocked_by is None
    assert fire(resumed) == {0: None, 1: -INF, 2: 10, 3: 20, 4: 35}
    assert outcomes(resumed) == [(-INF, 1)]
    assert resumed.initial_delay == 0


def test_resume_before_break_effective_time_is_ignored_later_one_ends_it() -> None:
    entries = [pause(0, 5, 60), brk(1, 15), pos(2, 20)]  # break takes effect at 75
    plan = build_plan(entries, [50, 80])
    assert outcomes(plan) == [(50, None), (80, 1)]
    assert fire(plan) == {0: 5, 1: 75, 2: 85}

    only_early = build_plan(entries, [50, -INF])
    assert outcomes(only_early) == [(50, None), (-INF, None)]
    assert only_early.blocked_by == 1
    assert fire(only_early)[2] is None


def test_resume_exactly_at_effective_break_time_ends_it() -> None:
    plan = build_plan([pause(0, 5, 60), brk(1, 15), pos(2, 20)], [75])
    assert outcomes(plan) == [(75, 1)]
    assert fire(plan) == {0: 5, 1: 75, 2: 80}
    assert plan.blocked_by is None


def test_each_resume_ends_at_most_one_break_leftovers_ignored() -> None:
    plan = build_plan([brk(0, 10), pos(1, 20)], [30, 40, 50])
    assert outcomes(plan) == [(30, 0), (40, None), (50, None)]
    assert fire(plan) == {0: 10, 1: 40}


def test_resumes_out_of_order_are_reported_in_given_order() -> None:
    entries = [pos(0, 10), pos(1, 30), pos(2, 50), brk(3, 15), brk(4, 40)]
    plan = build_plan(entries, [300, 100])
    assert fire(plan) == {0: 10, 1: 115, 2: 310, 3: 15, 4: 125}
    # RESUME 100 ended break 3 (the first), RESUME 300 ended break 4.
    assert outcomes(plan) == [(300, 4), (100, 3)]


def test_out_of_order_resumes_one_ignored_reported_correctly() -> None:
    plan = build_plan([pos(0, 10), brk(1, 15), pos(2, 30)], [500, 100])
    assert fire(plan) == {0: 10, 1: 15, 2: 115}
    # 100 ends the break; 500 finds no active break.
    assert outcomes(plan) == [(500, None), (100, 1)]


def test_break_never_resumed_holds_everything_after_it() -> None:
    entries = [pos(0, 10), brk(1, 15), pos(2, 30), pause(3, 40, 5), pos(4, 50), host(5, 60), brk(6, 70),
               pos(7, -1), pos(8, 15)]
    plan = build_plan(entries)
    assert plan.blocked_by == 1
    assert fire(plan) == {0: 10, 1: 15, 2: None, 3: None, 4: None, 5: None, 6: None, 7: None, 8: 15}
    # one RESUME ends the first break only; the second one then holds the rest
    one = build_plan(entries, [100])
    assert one.blocked_by == 6
    assert fire(one) == {0: 10, 1: 15, 2: 115, 3: 125, 4: 140, 5: 150, 6: 160, 7: None, 8: 15}


def test_adding_an_earlier_resume_can_make_entries_fire_earlier() -> None:
    """Documents why "adding a RESUME never makes anything fire earlier" is NOT a property."""
    entries = [brk(0, 15), pos(1, 30)]
    assert fire(build_plan(entries, [1000]))[1] == 1015
    assert fire(build_plan(entries, [1000, 100]))[1] == 115


# ---------------------------------------------------------------------------- kinds, stages, order
def test_host_entries() -> None:
    entries = [host(0, 10), host(1, -5), pause(2, 5, 60), pos(3, -5), host(4, 5)]
    plan = build_plan(entries)
    assert [p.kind for p in plan.entries] == [
        EntryKind.HOST, EntryKind.HOST, EntryKind.PAUSE, EntryKind.NEGATIVE, EntryKind.HOST,
    ]
    assert fire(plan) == {0: 70, 1: None, 2: 5, 3: None, 4: 5}
    assert [p.stage for p in plan.entries] == [None, None, None, 0, None]
    assert plan.stages == (-5,)


def test_stage_numbering_several_negative_times() -> None:
    entries = [pos(0, -5), pos(1, -100), pos(2, 3), pos(3, -99), pos(4, -5.5), pos(5, -100), host(6, -1000),
               pos(7, -5)]
    plan = build_plan(entries)
    assert plan.stages == (-1000, -100, -99, -5.5, -5)  # the on_host entry's time is a stage
    assert [p.stage for p in plan.entries] == [4, 1, None, 2, 3, 1, None, 4]
    assert [p.fire_at for p in plan.entries] == [None, None, 3, None, None, None, None, None]


def test_plan_entries_in_schedule_index_order() -> None:
    entries = [pos(0, 50), brk(1, 15), pos(2, -3), pause(3, 5, 1), host(4, 1), pos(5, 2)]
    plan = build_plan(entries, [20])
    assert [p.index for p in plan.entries] == [0, 1, 2, 3, 4, 5]
    assert [p.start_time for p in plan.entries] == [e.start_time for e in entries]


def test_plan_entries_in_index_order_even_if_given_shuffled() -> None:
    """Plan.entries is documented as "one PlannedEntry per schedule entry, in index order"."""
    entries = [pos(0, 50), brk(1, 15), pos(2, -3), pause(3, 5, 1), host(4, 1), pos(5, 2)]
    plan = build_plan(list(reversed(entries)), [20])
    assert [p.index for p in plan.entries] == [0, 1, 2, 3, 4, 5]
    assert plan == build_plan(entries, [20])


def test_positive_firings_sorted_by_fire_at_then_index() -> None:
    plan = build_plan([pos(0, 20), pos(1, 10), pos(2, 10), pause(3, 15, 1), host(4, 12), brk(5, 30),
                       pos(6, 40)])
    assert [p.index for p in plan.positive_firings()] == [1, 2, 0]


def test_empty_schedule() -> None:
    plan = build_plan([], [5])
    assert plan.entries == ()
    assert plan.stages == ()
    assert plan.initial_delay == 0
    assert plan.blocked_by is None
    assert outcomes(plan) == [(5, None)]


# ---------------------------------------------------------------------------- property tests
_TIME = st.integers(min_value=1, max_value=60)
_PAUSE_TIME = st.one_of(st.just(-INF), st.just(0), _TIME)
_DURATION = st.one_of(st.integers(min_value=0, max_value=40), st.just(INF))


@st.composite
def _entry_spec(draw):  # type: ignore[no-untyped-def]
    kind = draw(st.sampled_from(["pos", "pos", "pos", "neg", "host", "pause", "pause"]))
    if kind == "pos":
        return ("pos", draw(_TIME), None)
    if kind == "neg":
        return ("pos", -draw(st.integers(min_value=1, max_value=5)), None)
    if kind == "host":
        return ("host", draw(st.one_of(_TIME, st.integers(min_value=-5, max_value=-1))), None)
    return ("pause", draw(_PAUSE_TIME), draw(_DURATION))


def _build(specs: Sequence[tuple]) -> List[ScheduleEntry]:
    out = []
    for i, (kind, t, d) in enumerate(specs):
        if kind == "pos":
            out.append(pos(i, t))
        elif kind == "host":
            out.append(host(i, t))
        else:
            out.append(pause(i, t, d))
    return out


schedules = st.lists(_entry_spec(), max_size=12).map(_build)
resume_lists = st.lists(st.one_of(st.integers(min_value=0, max_value=400), st.just(-INF)), max_size=4)
PROPS = settings(max_examples=100, deadline=None)


def _later_or_equal(new: Optional[float], old: Optional[float]) -> bool:
    """``new`` is not earlier than ``old`` (None = never = +inf)."""
    if old is None:
        return new is None
    return new is None or new >= old


@PROPS
@given(schedules, resume_lists, _PAUSE_TIME, st.integers(min_value=0, max_value=40))
def test_prop_adding_a_pause_never_makes_anything_earlier(entries, resumes, t, d) -> None:  # type: ignore[no-untyped-def]
    old = fire(build_plan(entries, resumes))
    new = fire(build_plan([*entries, pause(len(entries), t, d)], resumes))
    for index, fire_at in old.items():
        assert _later_or_equal(new[index], fire_at), (index, fire_at, new[index])


@PROPS
@given(schedules, resume_lists, _PAUSE_TIME)
def test_prop_adding_a_break_never_makes_anything_earlier(entries, resumes, t) -> None:  # type: ignore[no-untyped-def]
    old = fire(build_plan(entries, resumes))
    new = fire(build_plan([*entries, brk(len(entries), t)], resumes))
    for index, fire_at in old.items():
        assert _later_or_equal(new[index], fire_at), (index, fire_at, new[index])


@PROPS
@given(schedules, resume_lists)
def test_prop_order_by_start_time_preserved(entries, resumes) -> None:  # type: ignore[no-untyped-def]
    plan = build_plan(entries, resumes)
    timed = [p for p in plan.entries if p.kind in (EntryKind.POSITIVE, EntryKind.HOST) and p.start_time > 0]
    for a in timed:
        for b in timed:
            if a.start_time < b.start_time:
                if a.fire_at is None:
                    assert b.fire_at is None
                elif b.fire_at is not None:
                    assert a.fire_at <= b.fire_at
            if a.start_time == b.start_time:
                assert a.fire_at == b.fire_at


@PROPS
@given(schedules, resume_lists, _PAUSE_TIME)
def test_prop_zero_length_pause_changes_nothing(entries, resumes, t) -> None:  # type: ignore[no-untyped-def]
    plan = build_plan(entries, resumes)
    with_zero = build_plan([*entries, pause(len(entries), t, 0)], resumes)
    assert with_zero.entries[:-1] == plan.entries
    assert with_zero.resumes == plan.resumes
    assert with_zero.stages == plan.stages
    assert with_zero.initial_delay == plan.initial_delay
    assert with_zero.blocked_by == plan.blocked_by


@PROPS
@given(schedules, resume_lists, st.one_of(st.integers(min_value=0, max_value=400), st.just(-INF)))
def test_prop_adding_a_resume_never_makes_anything_later(entries, resumes, r) -> None:  # type: ignore[no-untyped-def]
    # The converse ("never earlier") is false:
    # see test_adding_an_earlier_resume_can_make_entries_fire_earlier.
    old = fire(build_plan(entries, resumes))
    new = fire(build_plan(entries, [*resumes, r]))
    for index, fire_at in old.items():
        assert _later_or_equal(fire_at, new[index]), (index, fire_at, new[index])


@PROPS
@given(schedules, resume_lists, st.integers(min_value=0, max_value=400))
def test_prop_a_resume_after_all_others_only_releases_held_entries(entries, resumes, extra) -> None:  # type: ignore[no-untyped-def]
    finite = [r for r in resumes if r != -INF]
    r = max([extra, *finite])
    old = build_plan(entries, resumes)
    new = build_plan(entries, [*resumes, r])
    for index, fire_at in fire(old).items():
        if fire_at is not None:
            assert fire(new)[index] == fire_at
    assert new.resumes[:-1] == old.resumes


@PROPS
@given(schedules, resume_lists)
def test_prop_entries_before_first_pause_are_unshifted(entries, resumes) -> None:  # type: ignore[no-untyped-def]
    plan = build_plan(entries, resumes)
    first = min((e.start_time for e in entries if e.pause), default=INF)
    for p in plan.entries:
        if p.kind in (EntryKind.POSITIVE, EntryKind.HOST) and 0 < p.start_time <= first:
            assert p.fire_at == p.start_time


@PROPS
@given(schedules, resume_lists)
def test_prop_negative_entries_never_fire_and_keep_their_stage(entries, resumes) -> None:  # type: ignore[no-untyped-def]
    plan = build_plan(entries, resumes)
    staged = (EntryKind.NEGATIVE, EntryKind.HOST)  # on_host entries run inside their stage
    stages = sorted({e.start_time for e in entries if e.kind in staged and e.start_time < 0})
    assert list(plan.stages) == stages
    for p in plan.entries:
        if p.kind is EntryKind.NEGATIVE:
            assert p.fire_at is None
            assert plan.stages[p.stage] == p.start_time
        else:
            assert p.stage is None


@PROPS
@given(schedules, resume_lists, st.randoms(use_true_random=False))
def test_prop_deterministic_and_insensitive_to_entry_list_order(entries, resumes, rnd: random.Random) -> None:  # type: ignore[no-untyped-def]
    plan = build_plan(entries, resumes)
    assert build_plan(entries, resumes) == plan
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    other = build_plan(shuffled, resumes)
    assert by_index(other) == by_index(plan)
    assert other.resumes == plan.resumes
    assert other.stages == plan.stages
    assert other.initial_delay == plan.initial_delay
    assert other.blocked_by == plan.blocked_by


@PROPS
@given(schedules, resume_lists)
def test_prop_resume_outcomes_consistent(entries, resumes) -> None:  # type: ignore[no-untyped-def]
    plan = build_plan(entries, resumes)
    assert [r.at for r in plan.resumes] == [float(r) for r in resumes]
    ended = [r.ended_break for r in plan.resumes if r.ended_break is not None]
    assert len(ended) == len(set(ended))
    kinds = by_index(plan)
    for r in plan.resumes:
        if r.ended_break is not None:
            brk_entry = kinds[r.ended_break]
            assert brk_entry.kind is EntryKind.BREAK
            # a RESUME only ends a break that was already in effect when it arrived
            assert brk_entry.fire_at is not None and r.at >= brk_entry.fire_at
    if plan.blocked_by is not None:
        assert kinds[plan.blocked_by].kind is EntryKind.BREAK
        assert plan.blocked_by not in ended


@pytest.mark.parametrize("d", [0, 1, 60])
def test_pause_entry_fire_at_is_its_shifted_time(d: int) -> None:
    plan = build_plan([pause(0, 5, 10), pause(1, 8, d), pos(2, 9)])
    assert fire(plan) == {0: 5, 1: 18, 2: 19 + d}
