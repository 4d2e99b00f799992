"""``plan --json`` at parse speed (issue 15): :func:`plan_json_text` writes the JSON itself and
must give, byte for byte, ``json.dumps(plan_json(...))``, the output every consumer reads."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import Any, Dict, List, Optional

import pytest

from vmr_handler.agent.cli import plan_json, plan_json_text
from vmr_handler.core.schedule.model import EntryKind, PauseSpec, ScheduleEntry
from vmr_handler.core.timeline import Plan, PlannedEntry, ResumeOutcome, build_plan

#: Every kind of number a plan can carry, and some it cannot (ints, bools) that must still match.
NUMBERS: List[Any] = [
    None, 0.0, -0.0, 1.0, -1.0, 2.5, -7.25, 1e-7, 8.3, 123456789012345.0, float(2**53 - 1),
    float(2**53), -float(2**53), 1e16, 1e22, -1e300, math.inf, -math.inf, 3, -4, 2**60,
]  # fmt: skip
COMMANDS = ["/bin/true", "a 'b' \"c\"", "back\\slash", "tab\there", "ünïcödé ✓", "ctl\x01\x1f", ""]


def planned(index: int, start: Any, fire_at: Any, kind: EntryKind, stage: Optional[int]) -> PlannedEntry:
    return PlannedEntry(index=index, start_time=start, kind=kind, stage=stage, fire_at=fire_at)


@pytest.mark.parametrize("seed", range(5))
def test_text_equals_json_dumps_of_plan_json(seed: int) -> None:
    rng = random.Random(seed)
    entries = tuple(
        planned(
            i, rng.choice(NUMBERS), rng.choice(NUMBERS), rng.choice(list(EntryKind)), rng.choice([None, 7])
        )
        for i in range(300)
    )
    commands: Dict[int, str] = {i: rng.choice(COMMANDS) for i in range(300) if rng.random() < 0.7}
    resumes = (ResumeOutcome(-math.inf, 3), ResumeOutcome(50.5, None), ResumeOutcome(7.0, 12))
    plan = Plan(entries, resumes, (-5.0, -1.0), 0.0, None)
    assert plan_json_text(plan, commands) == json.dumps(plan_json(plan, commands))
    assert plan_json_text(plan) == json.dumps(plan_json(plan))


def test_empty_plan_and_nan() -> None:
    empty = Plan((), (), (), 0.0, None)
    assert plan_json_text(empty) == json.dumps(plan_json(empty)) == '{"entries": [], "resumes": []}'
    odd = Plan((planned(0, math.nan, None, EntryKind.POSITIVE, None),), (), (), 0.0, None)
    assert plan_json_text(odd) == json.dumps(plan_json(odd))


def test_a_built_plan_prints_the_same_both_ways() -> None:
    """A real plan (pauses, a break ended by a RESUME, negative stages, held entries)."""
    entries = [ScheduleEntry(i, t, "/bin/true", f"run {i}") for i, t in enumerate([-3, -1.5, 1, 2.25, 9, 40])]
    entries.append(ScheduleEntry(6, 5, None, data=(PauseSpec(10.5),), pause=True))
    entries.append(ScheduleEntry(7, 20, None, data=(PauseSpec(math.inf),), pause=True))
    commands = {e.index: f"{e.executable} {e.arguments}" for e in entries if e.executable}
    for resumes in ([], [100.0], [-math.inf, 3.0, 100.0]):
        plan = build_plan(entries, resumes)
        assert plan_json_text(plan, commands) == json.dumps(plan_json(plan, commands))


def test_planned_entries_are_ordinary_dataclass_instances() -> None:
    """build_plan fills PlannedEntry without its __init__: the result must be the same object
    in every way the dataclass offers (equality, hash, repr, replace, frozen)."""
    entries = [ScheduleEntry(2, 7.5, "x"), ScheduleEntry(0, -1, "y"), ScheduleEntry(1, 3, "z", on_host=True)]
    plan = build_plan(entries)
    for p in plan.entries:
        twin = PlannedEntry(p.index, p.start_time, p.kind, p.stage, p.fire_at)
        assert p == twin and hash(p) == hash(twin) and repr(p) == repr(twin)
        assert dataclasses.replace(p, stage=None) == dataclasses.replace(twin, stage=None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.fire_at = 1.0  # type: ignore[misc]
    assert [(p.index, p.kind, p.stage, p.fire_at) for p in plan.entries] == [
        (0, EntryKind.NEGATIVE, 0, None),
        (1, EntryKind.HOST, None, 3.0),
        (2, EntryKind.POSITIVE, None, 7.5),
    ]
