"""``plan --json`` at parse speed: :func:`~vmr_handler.agent.cli._planout.plan_text` writes
the JSON itself, from columns, and must give, byte for byte, ``json.dumps(plan_json(...))`` of the
object path, the output every consumer reads (whole schedules: tests/test_plan_fast.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import List, Sequence

import pytest

from vmr_handler.agent.cli._planout import number_texts, plan_text
from vmr_handler.agent.cli.commandline import plan_json
from vmr_handler.agent.cli.control_client import number_text
from vmr_handler.core.schedule.commands import command_lines
from vmr_handler.core.schedule.model import ContentDrop, EntryKind, PauseSpec, ResumeMark, ScheduleEntry
from vmr_handler.core.schedule.validate import ScheduleColumns
from vmr_handler.core.timeline import PlannedEntry, build_plan, plan_columns

#: Every kind of float a plan can carry (start times, fire_at, RESUME times).
NUMBERS: List[float] = [
    0.0, -0.0, 1.0, -1.0, 2.5, -7.25, 1e-7, 8.3, 123456789012345.0, float(2**53 - 1), float(2**53),
    -float(2**53), 1e16, 1e22, -1e300, math.inf, -math.inf, math.nan,
]  # fmt: skip
COMMANDS = ["/bin/true", "a 'b' \"c\"", "back\\slash", "tab\there", "ünïcödé ✓", "ctl\x01\x1f", "a, b"]
LAUNCH = "/var/launch"


def columns_of(entries: Sequence[ScheduleEntry]) -> ScheduleColumns:
    """The columns validate_columns gives for these entries (index = position)."""
    others = {e.index: e for e in entries if e.data or e.pause}
    hosts = [e.index for e in entries if e.on_host and e.index not in others]
    return ScheduleColumns(
        [e.start_time for e in entries], [e.executable for e in entries], [e.arguments for e in entries],
        hosts, others, {}, (),
    )  # fmt: skip


def both_ways(entries: Sequence[ScheduleEntry], resumes: Sequence[float]) -> None:
    columns = columns_of(entries)
    fast = plan_text(columns, plan_columns(columns.starts, columns.others, columns.hosts, resumes), LAUNCH)
    assert fast == json.dumps(plan_json(build_plan(entries, resumes), command_lines(entries, LAUNCH)))


def test_number_texts_are_json_of_number_text() -> None:
    assert number_texts(NUMBERS) == [json.dumps(number_text(v)) for v in NUMBERS]
    assert number_texts([]) == []


@pytest.mark.parametrize("seed", range(5))
def test_text_equals_json_dumps_of_plan_json(seed: int) -> None:
    """Entries of every kind at every finite time a schedule allows, commands of every kind of
    text, RESUMEs at every time."""
    rng = random.Random(seed)
    times = [t for t in NUMBERS if math.isfinite(t) and t != 0]
    entries: List[ScheduleEntry] = []
    for i in range(300):
        shape = rng.choice(["program", "program", "host", "pause", "resume", "data"])
        t = rng.choice(times)
        if shape == "pause":
            duration = rng.choice([1.5, 3.0, 1e16, math.inf])
            entries.append(
                ScheduleEntry(
                    i, rng.choice([abs(t), -math.inf, 0.0]), data=(PauseSpec(duration),), pause=True
                )
            )
        elif shape == "resume":
            entries.append(ScheduleEntry(i, -math.inf, data=(ResumeMark(),)))
        else:
            exe = rng.choice([None, *COMMANDS])
            data = (ContentDrop("out", b"x"),) if shape == "data" else ()
            entries.append(ScheduleEntry(i, t, exe, rng.choice(COMMANDS), data=data, on_host=shape == "host"))
    for resumes in ([], [-math.inf, 50.5, 7.0], [1e300, math.inf, 3.0]):
        both_ways(entries, resumes)


def test_empty_schedule() -> None:
    both_ways([], [])
    both_ways([], [-math.inf, 2.0])
    columns = columns_of([])
    assert plan_text(columns, plan_columns([], {}), LAUNCH) == '{"entries": [], "resumes": []}'


def test_a_built_plan_prints_the_same_both_ways() -> None:
    """A real plan (pauses, a break ended by a RESUME, negative stages, held entries)."""
    entries = [ScheduleEntry(i, t, "/bin/true", f"run {i}") for i, t in enumerate([-3, -1.5, 1, 2.25, 9, 40])]
    entries.append(ScheduleEntry(6, 5, None, data=(PauseSpec(10.5),), pause=True))
    entries.append(ScheduleEntry(7, 20, None, data=(PauseSpec(math.inf),), pause=True))
    for resumes in ([], [100.0], [-math.inf, 3.0, 100.0]):
        both_ways(entries, resumes)


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
