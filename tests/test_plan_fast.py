"""``plan --json`` without an object per entry (:mod:`vmr_handler.agent.cli._planout`): the
schedule validated as columns, planned as columns and written from columns of strings must give,
byte for byte, what the object path gives: ``json.dumps(plan_json(build_plan(entries, resumes),
command_lines(entries, launch_dir)))`` of ``load_schedule``'s entries. Compared on varied
schedules (pauses, breaks, RESUMEs incl. -inf, stored RESUME entries, negative stages, data
entries with drops named by the executable, on_host entries, shared working dirs), on invalid
ones (the same error), and through the real CLI (parsed by the command table's parser)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vmr_handler.agent.cli import commandline as cli
from vmr_handler.agent.cli._planout import PlanRequest, number_texts, plan_json_output
from vmr_handler.core.commandtable import command_word, join_negative_values
from vmr_handler.core.errors import ScheduleError
from vmr_handler.core.schedule import load_schedule
from vmr_handler.core.schedule.commands import command_lines, working_dirs, working_dirs_of
from vmr_handler.core.schedule.limits import MAX_ARGUMENTS_LENGTH
from vmr_handler.core.schedule.model import ScheduleEntry
from vmr_handler.core.schedule.validate import _plain_entries, validate_columns, validate_records
from vmr_handler.core.timeline import build_plan, plan_columns

REPO = Path(__file__).resolve().parent.parent
LAUNCH = "/var/launch"

# ---------------------------------------------------------------------------- schedules
_TIMES = [1, 2, 2.5, 7, 10, 10.25, 30, 1e-7, 123456.75, 2**53, 1e16]  # shared: working dirs collide
_NEG_TIMES = [-1, -2, -3.5, -10, -(2**53), -1e16]
_EXES = ["/bin/true", "run.sh", "./tool", "sub/run.sh", "echo", "/usr/bin/env python3"]
_ARGS = [None, "", "a b", "'q' \"x\"", "ünï ✓", "tab\there", "ctl\x01"]

_plain = st.fixed_dictionaries(
    {
        "start_time": st.sampled_from(_TIMES + _NEG_TIMES),
        "executable": st.sampled_from([*_EXES, None]),
    },
    optional={
        "arguments": st.sampled_from(_ARGS),
        "on_host": st.sampled_from([True, False, None]),
        "ignore_failure": st.sampled_from([True, False]),
        "pause": st.sampled_from([False, None]),
        "data": st.sampled_from([[], None]),
    },
)
_duration = st.sampled_from([0, 3, 2.5, 60, "inf", "inf"])
_pause = st.one_of(
    st.builds(
        lambda t, d: {"start_time": t, "pause": True, "data": [{"pause_duration": d}]},
        st.sampled_from(["-inf", 0, *_TIMES]),
        _duration,
    ),
    st.builds(lambda t, d: {"start_time": t, "pause_duration": d}, st.sampled_from(_TIMES), _duration),
)
_stored_resume = st.just({"start_time": "-inf", "data": [{"resume": True}]})
_drop = st.sampled_from(
    [
        {"location": "run.sh", "content": "echo hi", "executable": True},
        {"location": "sub/run.sh", "filename": "run.sh", "executable": True},
        {"location": "/abs/run.sh", "content": "x"},
        {"location": "out.log", "interval": 5, "destination": None},
        {"location": "tool", "content": "#!/bin/sh"},
    ]
)
_data_entry = st.builds(
    lambda t, exe, items, host: {"start_time": t, "executable": exe, "data": items, "on_host": host},
    st.sampled_from([2, 7, -1]),  # few: the working dirs of drops get numbered (_1, _2)
    st.sampled_from(["run.sh", "sub/run.sh", "tool", "/bin/true", None]),
    st.lists(_drop, min_size=1, max_size=2),
    st.booleans(),
)
records_lists = st.lists(st.one_of(_plain, _plain, _plain, _pause, _stored_resume, _data_entry), max_size=25)
resume_lists = st.lists(st.sampled_from([-math.inf, 0.0, 2.0, 5.5, 40.0, 100.0, 1e6, math.inf]), max_size=4)


def object_path(path: str, resumes: Sequence[float], launch_dir: str = LAUNCH) -> str:
    """What ``plan --json`` printed before the columns: the object path."""
    schedule = load_schedule(path)
    stored = [-math.inf for e in schedule.entries if e.data and e.is_resume]
    plan = build_plan(schedule.entries, [*stored, *resumes])
    return json.dumps(cli.plan_json(plan, command_lines(schedule.entries, launch_dir)))


def write_json(tmp_path: Path, records: List[Dict[str, Any]]) -> str:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    return str(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=records_lists, resumes=resume_lists)
def test_columns_print_what_the_objects_print(
    tmp_path: Path, records: List[Dict[str, Any]], resumes: List[float]
) -> None:
    path = write_json(tmp_path, records)
    try:
        expected: Optional[str] = object_path(path, resumes)
    except ScheduleError as exc:  # e.g. a RESUME entry somewhere odd: both must refuse alike
        with pytest.raises(type(exc)) as err:
            plan_json_output(PlanRequest(path, resumes, LAUNCH, []))
        assert str(err.value) == str(exc)
        return
    assert plan_json_output(PlanRequest(path, resumes, LAUNCH, [])) == expected


@settings(max_examples=200, deadline=None)
@given(records=records_lists, resumes=resume_lists)
def test_plan_columns_is_build_plan(records: List[Dict[str, Any]], resumes: List[float]) -> None:
    try:
        entries, _ = validate_records(records, strict_fields=True)
    except ScheduleError:
        return
    columns = validate_columns(records, strict_fields=True)
    assert columns.starts == [e.start_time for e in entries]
    assert columns.executables == [e.executable for e in entries]
    assert columns.arguments == [e.arguments for e in entries]
    plan = plan_columns(columns.starts, columns.others, columns.hosts, resumes).plan()
    assert plan == build_plan(entries, resumes)


# odd records among plain ones: every kind of problem the full checks find
_bad = st.sampled_from(
    [
        {"start_time": 0, "executable": "x"},
        {"start_time": "nan", "executable": "x"},
        {"executable": "x"},
        {"start_time": 1, "executable": ""},
        {"start_time": 1, "executable": "x", "on_host": 1},
        {"start_time": 1, "executable": "x", "extra": 1},
        {"start_time": 5, "resume": True},
        {"start_time": 5, "data": [{"resume": True}]},
        {"start_time": 5, "pause": True},
    ]
)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(st.one_of(_plain, _pause, _bad, _data_entry), max_size=12))
def test_columns_refuse_what_the_entries_refuse(records: List[Any]) -> None:
    try:
        entries, warnings = validate_records(records, strict_fields=True)
    except ScheduleError as exc:
        with pytest.raises(type(exc)) as err:
            validate_columns(records, strict_fields=True)
        assert str(err.value) == str(exc)
        return
    columns = validate_columns(records, strict_fields=True)
    assert columns.warnings == warnings
    assert all(entries[i] == e for i, e in columns.others.items())  # and the rest are plain:
    assert all(entries[i].data == data for i, data in columns.drops.items())  # (plain drop entries)
    assert {e.index for e in entries if e.data or e.pause} <= {*columns.others, *columns.drops}
    assert not set(columns.others) & set(columns.drops)
    assert columns.hosts == [e.index for e in entries if e.on_host and e.index not in columns.others]
    plain = [e for e in entries if e.index not in columns.others]
    assert [e.start_time for e in plain] == [columns.starts[e.index] for e in plain]
    assert [(e.executable, e.arguments) for e in plain] == [
        (columns.executables[e.index], columns.arguments[e.index]) for e in plain
    ]


def test_expanded_size_limit_is_the_same_error() -> None:
    """Plain entries alone over the expanded-size limit: the same entry is named."""
    big = "a" * MAX_ARGUMENTS_LENGTH  # 17 of them: over the 16 MiB floor of a small file
    records: List[Dict[str, Any]] = [{"start_time": 5, "pause_duration": 1}]
    records += [{"start_time": 1, "executable": "x", "arguments": big} for _ in range(17)]
    with pytest.raises(ScheduleError) as ref:
        validate_records(records, strict_fields=True, source_size=100)
    with pytest.raises(ScheduleError) as err:
        validate_columns(records, strict_fields=True, source_size=100)
    assert str(err.value) == str(ref.value) and "entry 16 ('x')" in str(ref.value)


def test_a_pickle_schedule_prints_the_same(tmp_path: Path) -> None:
    refpickle = pytest.importorskip("tests.refpickle")
    records = [
        {"start_time": -2, "executable": "/bin/true", "arguments": "s"},
        {"start_time": 3, "executable": "run.sh", "data": [{"location": "run.sh", "content": "x"}]},
        {"start_time": 4, "pause": True, "data": [{"pause_duration": math.inf}]},
        {"start_time": 9, "executable": "/bin/true", "on_host": True},
        {"start_time": -math.inf, "data": [{"resume": True}]},
    ]
    path = tmp_path / "s.pkl"
    path.write_bytes(refpickle.reference_pickle(records, protocol=2))
    assert plan_json_output(PlanRequest(str(path), [7.0], LAUNCH, [])) == object_path(str(path), [7.0])


def test_the_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScheduleError, match=r"nope\.json"):
        plan_json_output(PlanRequest(str(tmp_path / "nope.json"), [], LAUNCH, []))


# ---------------------------------------------------------------------------- pieces
#: Every float a plan can carry.
FLOATS = [0.0, -0.0, 1.0, -1.0, 2.5, -7.25, 1e-7, 8.3, 123456789012345.0, float(2**53 - 1), float(2**53),
          -float(2**53), 1e16, 1e22, -1e300, math.inf, -math.inf, math.nan]  # fmt: skip


def test_number_texts_are_json_of_number_text() -> None:
    from vmr_handler.agent.cli.control_client import number_text

    assert number_texts(FLOATS) == [json.dumps(number_text(v)) for v in FLOATS]
    assert number_texts([]) == []


def test_working_dirs_of_a_few_entries_are_those_of_all() -> None:
    starts = [1.0, 2.0, 1.0, -3.0, 1.0, 2.0, 1.0]
    exes = ["a/x", "x", "x", None, None, "./x", "/p/x"]
    entries = [ScheduleEntry(i, t, e) for i, (t, e) in enumerate(zip(starts, exes))]
    every = working_dirs(entries, LAUNCH)
    for wanted in ([6], [2, 5], [0, 1, 2, 3, 4, 5, 6], [4], []):
        assert working_dirs_of(starts, exes, wanted, LAUNCH) == {i: every[i] for i in wanted}


# ---------------------------------------------------------------------------- the command line
def parsed(words: List[str]) -> PlanRequest:
    """What ``vmr-handler WORDS`` hands to ``plan --json``: ``main``'s parse, by the parser the
    command table makes for ``plan``."""
    parser = cli._parser(command_word(words, cli.COMMANDS))
    args = parser.parse_args(join_negative_values(words, parser, cli._seconds))
    return PlanRequest(args.schedule, args.resume, args.launch_dir, args.allow_class)


INF = math.inf


@pytest.mark.parametrize(
    "words, expected",
    [
        (["plan", "s.json", "--json"], PlanRequest("s.json", [], LAUNCH, [])),
        (["plan", "--json", "s.json", "--resume", "5", "--resume=-inf", "--resume", "-inf"],
         PlanRequest("s.json", [5.0, -INF, -INF], LAUNCH, [])),
        (["plan", "s.json", "--json", "--resume", "-3", "--resume", "-.5", "--resume", "1e3", "--resume=-1e3",
          "--resume", "-1e3", "--resume", "-2E-1"],
         PlanRequest("s.json", [-3.0, -0.5, 1000.0, -1000.0, -1000.0, -0.2], LAUNCH, [])),
        (["plan", "s.json", "--json", "--launch-dir", "/l", "--launch-dir=/m", "--allow-class", "a.B"],
         PlanRequest("s.json", [], "/m", ["a.B"])),
        (["plan", "s.json", "--json", "--json", "--resume", "inf", "--resume", "-Infinity"],
         PlanRequest("s.json", [INF, -INF], LAUNCH, [])),
        (["-v", "plan", "s.json", "--js", "--res", "7"], PlanRequest("s.json", [7.0], LAUNCH, [])),
        (["plan", "s.json", "--json", "--res", "-inf", "--re", "-1e3"],
         PlanRequest("s.json", [-INF, -1e3], LAUNCH, [])),
        (["plan", "--json", "--", "-inf.json"], PlanRequest("-inf.json", [], LAUNCH, [])),
    ],
)  # fmt: skip
def test_the_plan_command_line_is_read_by_the_tables_parser(words: List[str], expected: PlanRequest) -> None:
    assert parsed(words) == expected


@pytest.mark.parametrize(
    "words, why",
    [
        (["plan", "s.json", "--json", "--resume", "nan"], "NaN is not a time"),
        (["plan", "s.json", "--json", "--resume", "-nan"], "NaN is not a time"),
        (["plan", "s.json", "--json", "--resume", "-x"], "expected one argument"),
        (["plan", "s.json", "--json", "--resume"], "expected one argument"),
        (["plan", "s.json", "t.json", "--json"], "unrecognized arguments: t.json"),
        (["plan", "--json"], "the following arguments are required: schedule"),
        (["plan", "s.json", "--json", "--launch-dir", "--json"], "expected one argument"),
        (["plan", "s.json", "--json", "--launch-dir", "-inf"], "expected one argument"),  # not a time
    ],
)
def test_bad_plan_command_lines_are_refused_naming_why(
    words: List[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parsed(words)
    assert exc.value.code == 2 and why in capsys.readouterr().err


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "vmr_handler", *args],
        capture_output=True, text=True, timeout=60, cwd=str(REPO), env=env,
    )  # fmt: skip


MIXED: List[Dict[str, Any]] = [
    {"start_time": -20, "executable": "/bin/true"},
    {"start_time": "-inf", "pause": True, "data": [{"pause_duration": 30}]},
    {"start_time": "-inf", "data": [{"resume": True}]},
    {
        "start_time": 5,
        "executable": "run.sh",
        "data": [{"location": "run.sh", "content": "x", "executable": True}],
    },
    {"start_time": 5, "executable": "run.sh", "arguments": "again"},
    {"start_time": 5, "executable": "run.sh", "data": [{"location": "run.sh", "content": "y"}]},  # run.sh_2
    {"start_time": 7, "executable": "/usr/bin/host-tool", "on_host": True},
    {"start_time": 8, "pause": True, "data": [{"pause_duration": "inf"}]},
    {"start_time": 9.5, "executable": "/bin/echo", "arguments": "a, b"},
    {"start_time": 12, "pause_duration": "inf"},
    {"start_time": 13, "executable": "/bin/true"},
]


def test_the_cli_prints_the_object_path_output_both_ways(tmp_path: Path) -> None:
    """``plan --json`` sets up no logging (nothing to log: a quick start), with or without
    ``-v``, abbreviated or not; both print the object path's text."""
    path = write_json(tmp_path, MIXED)
    plain = run_cli("plan", path, "--json", "--resume", "-inf", "--resume=100")
    other = run_cli("-v", "plan", path, "--js", "--res", "-inf", "--resume", "1e2")
    assert plain.returncode == other.returncode == 0, plain.stderr + other.stderr
    assert plain.stdout == other.stdout == object_path(path, [-math.inf, 100.0]) + "\n"
    for proc in (plain, other):
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
        assert "argparse" in imported and "logging" not in imported


def test_the_cli_refuses_a_bad_schedule_both_ways(tmp_path: Path) -> None:
    path = write_json(tmp_path, [{"start_time": 0, "executable": "/bin/true"}])
    for args in (["plan", path, "--json"], ["-v", "plan", path, "--json"]):
        proc = run_cli(*args)
        assert proc.returncode == 2 and proc.stdout == ""
        assert "vmr-handler: error:" in proc.stderr and "entry 0" in proc.stderr and "barrier" in proc.stderr


def test_the_cli_says_why_a_resume_time_is_refused(tmp_path: Path) -> None:
    proc = run_cli("plan", write_json(tmp_path, MIXED), "--json", "--resume", "nan")
    assert proc.returncode == 2 and "NaN is not a time" in proc.stderr


# ---------------------------------------------------------------------------- the plain screen
def loop_plain_entry(index: int, record: Any) -> Optional[ScheduleEntry]:
    """The record-by-record check the column screen replaced (one record at a time), as the
    oracle."""
    if not (type(record) is dict and set(record) <= PLAIN_FIELDS):
        return None
    start, exe, args = record.get("start_time"), record.get("executable"), record.get("arguments")
    ignore, on_host = record.get("ignore_failure"), record.get("on_host")
    data, pause = record.get("data"), record.get("pause")
    kind, longest = type(start), MAX_ARGUMENTS_LENGTH
    if (
        ((kind is float and start - start == 0.0) or (kind is int and -(2**53) < start < 2**53))
        and start != 0
        and (exe is None or (type(exe) is str and exe and len(exe) <= longest and "\x00" not in exe))
        and (args is None or (type(args) is str and len(args) <= longest and "\x00" not in args))
        and (ignore is None or type(ignore) is bool)
        and (on_host is None or type(on_host) is bool)
        and (data is None or (type(data) is list and not data))
        and (pause is None or pause is False)
    ):
        return ScheduleEntry(index, float(start), exe, args or "", ignore is True, (), False, on_host is True)
    return None


PLAIN_FIELDS = {"start_time", "executable", "arguments", "ignore_failure", "on_host", "data", "pause"}
_odd = st.sampled_from(
    [
        {"start_time": 0.0, "executable": "x"},
        {"start_time": -0.0, "executable": "x"},
        {"start_time": math.inf, "executable": "x"},
        {"start_time": -math.inf, "executable": "x"},
        {"start_time": math.nan, "executable": "x"},
        {"start_time": 2**53, "executable": "x"},
        {"start_time": 2**53 - 1, "executable": "x"},
        {"start_time": 1e300, "executable": "x"},
        {"start_time": 10**400, "executable": "x"},
        {"start_time": True, "executable": "x"},
        {"start_time": "5", "executable": "x"},
        {"start_time": 5, "executable": ""},
        {"start_time": 5, "executable": "a\x00"},
        {"start_time": 5, "executable": 7},
        {"start_time": 5, "executable": "x" * (MAX_ARGUMENTS_LENGTH + 1)},
        {"start_time": 5, "executable": "x", "arguments": "b\x00"},
        {"start_time": 5, "executable": "x", "arguments": ["a"]},
        {"start_time": 5, "executable": "x", "arguments": "y" * MAX_ARGUMENTS_LENGTH},
        {"start_time": 5, "executable": "x", "ignore_failure": 0},
        {"start_time": 5, "executable": "x", "on_host": "yes"},
        {"start_time": 5, "executable": "x", "data": {}},
        {"start_time": 5, "executable": "x", "data": ""},
        {"start_time": 5, "executable": "x", "pause": 0},
        {"start_time": 5, "executable": "x", "pause": True},
        {"start_time": 5, "executable": "x", "other": 1},
        {"start_time": 5, 3: "x"},
        {},
        ["start_time", 5],
        None,
    ]
)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(st.one_of(_plain, _plain, _odd, _pause), max_size=15), first=st.sampled_from([0, 7]))
def test_the_column_screen_is_the_record_loop(records: List[Any], first: int) -> None:
    entries, doubtful, size = _plain_entries(records, first)
    expected = [loop_plain_entry(first + i, r) for i, r in enumerate(records)]
    assert entries == expected
    assert [repr(e) for e in entries] == [repr(e) for e in expected]  # float, not int, start times
    assert doubtful == [first + i for i, e in enumerate(expected) if e is None]
    assert size == sum(len(e.executable or "") + len(e.arguments) for e in expected if e is not None)
