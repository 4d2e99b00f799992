"""Schedule loading: pickle (reference-compatible), YAML and JSON give the same validated entries.

SPEC sections 3 and 7. Reference pickles are built by :mod:`tests.refpickle` with a stand-in
class registered under the reference's module name; firewheel is never imported.
"""

from __future__ import annotations

import json
import math
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from tests import fwhelpers as fw
from tests.agent import cli
from tests.refpickle import REFERENCE_CLASS, reference_pause, reference_pickle, reference_record
from vmr_handler.core.errors import (
    ScheduleError,
    ScheduleFormatError,
    ScheduleValidationError,
    UnsafePickleError,
    WindowsScheduleError,
)
from vmr_handler.core.schedule import (
    ContentDrop,
    EntryKind,
    FileDrop,
    PauseSpec,
    ScheduleEntry,
    TransferOut,
    detect_format,
    load_schedule,
    load_schedule_bytes,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROTOCOLS = list(range(pickle.HIGHEST_PROTOCOL + 1))


def _yaml(records: List[Dict[str, Any]]) -> bytes:
    return yaml.safe_dump(records, sort_keys=False).encode()


def _json(records: List[Dict[str, Any]]) -> bytes:
    """JSON with infinities spelled as the strings ``"inf"`` / ``"-inf"`` (plain JSON has none)."""

    def fix(value: Any) -> Any:
        if isinstance(value, float) and math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    return json.dumps(fix(records), allow_nan=False).encode()


# ----------------------------------------------------------------------------- equivalence
# The same schedule written by hand (YAML/JSON) and by the reference (pickle).
HAND_WRITTEN: List[Dict[str, Any]] = [
    {"start_time": -math.inf, "pause": True, "data": [{"pause_duration": 5}]},
    {
        "start_time": -20,
        "executable": "install.sh",
        "arguments": "--prefix ./opt",
        "data": [{"location": "install.sh", "content": "#!/bin/sh\necho hi\n", "executable": True}],
    },
    {
        "start_time": -20,
        "executable": None,
        "ignore_failure": True,
        "data": [{"location": "/etc/tool.conf", "filename": "tool.conf", "executable": False}],
    },
    {"start_time": 0, "pause": True, "data": [{"pause_duration": 2.5}]},
    {"start_time": 10, "executable": "/bin/echo", "arguments": "hello world"},
    {"start_time": 15, "pause": True, "data": [{"pause_duration": math.inf}]},
    {
        "start_time": 30.5,
        "executable": "/bin/sh",
        "arguments": "-c 'ls > out.txt'",
        "data": [
            {"location": "out.txt", "interval": 10, "destination": "/results"},
            {"location": "/var/log/syslog", "interval": None, "destination": None},
        ],
    },
    {"start_time": 40, "executable": "/usr/bin/host-tool", "on_host": True},
]


def _reference_records() -> List[Dict[str, Any]]:
    """HAND_WRITTEN as the reference pickles it (pause entries shifted by sys.float_info.min)."""
    out = []
    for rec in HAND_WRITTEN:
        fields = {k: v for k, v in rec.items() if k not in ("start_time", "pause", "data")}
        data = [d for d in rec.get("data", []) if "pause_duration" not in d]
        pauses = [d["pause_duration"] for d in rec.get("data", []) if "pause_duration" in d]
        if pauses:
            out.append(reference_pause(rec["start_time"], pauses[0], data=data, **fields))
        else:
            out.append(reference_record(rec["start_time"], data=data, **fields))
    return out


EXPECTED = (
    ScheduleEntry(0, -math.inf, data=(PauseSpec(5.0),), pause=True),
    ScheduleEntry(
        1,
        -20.0,
        "install.sh",
        "--prefix ./opt",
        data=(ContentDrop("install.sh", b"#!/bin/sh\necho hi\n", True),),
    ),
    ScheduleEntry(
        2, -20.0, None, "", ignore_failure=True, data=(FileDrop("/etc/tool.conf", "tool.conf", False),)
    ),
    ScheduleEntry(3, 0.0, data=(PauseSpec(2.5),), pause=True),
    ScheduleEntry(4, 10.0, "/bin/echo", "hello world"),
    ScheduleEntry(5, 15.0, data=(PauseSpec(math.inf),), pause=True),
    ScheduleEntry(
        6,
        30.5,
        "/bin/sh",
        "-c 'ls > out.txt'",
        data=(TransferOut("out.txt", 10.0, "/results"), TransferOut("/var/log/syslog", None, None)),
    ),
    ScheduleEntry(7, 40.0, "/usr/bin/host-tool", on_host=True),
)


def test_yaml_json_and_pickle_of_the_same_schedule_give_equal_entries():
    from_yaml = load_schedule_bytes(_yaml(HAND_WRITTEN))
    from_json = load_schedule_bytes(_json(HAND_WRITTEN))
    from_pickle = load_schedule_bytes(reference_pickle(_reference_records(), protocol=2))
    assert (from_yaml.source_format, from_json.source_format, from_pickle.source_format) == (
        "yaml",
        "json",
        "pickle",
    )
    assert from_yaml.entries == EXPECTED
    assert from_json.entries == EXPECTED
    assert from_pickle.entries == EXPECTED
    assert [e.kind for e in EXPECTED] == [
        EntryKind.PAUSE,
        EntryKind.NEGATIVE,
        EntryKind.NEGATIVE,
        EntryKind.PAUSE,
        EntryKind.POSITIVE,
        EntryKind.BREAK,
        EntryKind.POSITIVE,
        EntryKind.HOST,
    ]
    assert from_yaml.warnings == from_json.warnings == from_pickle.warnings == ()
    assert len({from_yaml.digest, from_json.digest, from_pickle.digest}) == 3


def test_schedule_yaml_wrapped_in_a_schedule_key_is_accepted():
    doc = yaml.safe_dump({"schedule": [{"start_time": 1, "executable": "/bin/true"}]}).encode()
    assert load_schedule_bytes(doc).entries == (ScheduleEntry(0, 1.0, "/bin/true"),)


# ----------------------------------------------------------------------------- detection by content
def test_pickle_is_detected_by_content_not_by_file_name(tmp_path):
    records = [reference_record(5, executable="/bin/true")]
    as_yaml_name = tmp_path / "x.yaml"
    as_yaml_name.write_bytes(reference_pickle(records, protocol=4))
    yaml_in_pkl = tmp_path / "x.pkl"
    yaml_in_pkl.write_bytes(b"- start_time: 5\n  executable: /bin/true\n")
    json_in_pkl = tmp_path / "y.pkl"
    json_in_pkl.write_bytes(b'[{"start_time": 5, "executable": "/bin/true"}]')

    loaded = {p.name: load_schedule(str(p)) for p in (as_yaml_name, yaml_in_pkl, json_in_pkl)}
    assert {name: s.source_format for name, s in loaded.items()} == {
        "x.yaml": "pickle",
        "x.pkl": "yaml",
        "y.pkl": "json",
    }
    for s in loaded.values():
        assert s.entries == (ScheduleEntry(0, 5.0, "/bin/true"),)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_protocol_is_detected_as_pickle(protocol):
    assert detect_format(reference_pickle([reference_record(1)], protocol)) == "pickle"


# ----------------------------------------------------------------------------- reference pickles
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reference_pickle_loads_with_every_protocol(protocol):
    blob = b"\x00\x01binary\xff\xfe" + bytes(range(256))
    records = [
        reference_pause(-math.inf, math.inf),  # break at -inf
        reference_record(
            -10,
            executable="drop.bin",
            ignore_failure=True,
            data=[
                {"location": "drop.bin", "content": blob, "executable": True},
                {"location": "empty", "content": b"", "executable": False},
                {"location": "text.txt", "content": "grüße\n", "executable": False},
            ],
        ),
        reference_pause(0, 30),  # pause at 0
        reference_record(7, executable="/bin/echo", arguments="a b", pause=None),
        reference_pause(-math.inf, 4),
    ]
    schedule = load_schedule_bytes(reference_pickle(records, protocol))
    assert schedule.source_format == "pickle"
    assert schedule.entries == (
        ScheduleEntry(0, -math.inf, data=(PauseSpec(math.inf),), pause=True),
        ScheduleEntry(
            1,
            -10.0,
            "drop.bin",
            ignore_failure=True,
            data=(
                ContentDrop("drop.bin", blob, True),
                ContentDrop("empty", b"", False),
                ContentDrop("text.txt", "grüße\n".encode(), False),
            ),
        ),
        ScheduleEntry(2, 0.0, data=(PauseSpec(30.0),), pause=True),
        ScheduleEntry(3, 7.0, "/bin/echo", "a b", pause=False),
        ScheduleEntry(4, -math.inf, data=(PauseSpec(4.0),), pause=True),
    )
    assert [e.kind for e in schedule.entries] == [
        EntryKind.BREAK,
        EntryKind.NEGATIVE,
        EntryKind.PAUSE,
        EntryKind.POSITIVE,
        EntryKind.PAUSE,
    ]
    assert schedule.warnings == ()


@pytest.mark.parametrize("start", [sys.float_info.min, 2 * sys.float_info.min], ids=["min", "2min"])
def test_pause_at_zero_arrives_as_float_min_and_is_normalised_to_zero(start):
    record = reference_record(start, pause=True, data=[{"pause_duration": 60}])
    (entry,) = load_schedule_bytes(reference_pickle([record], 2)).entries
    assert entry.start_time == 0.0
    assert entry.kind is EntryKind.PAUSE
    assert entry.pause_duration == 60.0


def test_pause_at_positive_time_keeps_its_time():
    (entry,) = load_schedule_bytes(reference_pickle([reference_pause(5, 60)], 2)).entries
    assert entry.start_time == 5.0


def test_normal_entry_with_pause_none_is_not_a_pause():
    (entry,) = load_schedule_bytes(
        reference_pickle([reference_record(3, executable="x", pause=None)], 2)
    ).entries
    assert entry.pause is False
    assert entry.kind is EntryKind.POSITIVE


def test_extra_pickle_attributes_are_ignored_with_a_warning_naming_them():
    record = reference_record(3, executable="/bin/true", vm_name="host-7", _private_cache={"a": 1})
    schedule = load_schedule_bytes(reference_pickle([reference_record(-1), record], 3))
    assert schedule.entries[1] == ScheduleEntry(1, 3.0, "/bin/true")
    assert len(schedule.warnings) == 1
    (warning,) = schedule.warnings
    assert "entry 1" in warning
    assert "'/bin/true'" in warning
    assert "vm_name" in warning
    assert "_private_cache" in warning


def test_base_objects_schedule_entry_is_allowed_by_default():
    blob = reference_pickle(
        [reference_record(2, executable="/bin/true")], 2, class_path="base_objects.ScheduleEntry"
    )
    assert load_schedule_bytes(blob).entries == (ScheduleEntry(0, 2.0, "/bin/true"),)


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_other_subclass_names_are_refused_unless_allow_listed(protocol):
    name = "base_objects.RunExecutableScheduleEntry"
    blob = reference_pickle([reference_record(2, executable="/bin/true")], protocol, class_path=name)
    with pytest.raises(UnsafePickleError) as excinfo:
        load_schedule_bytes(blob)
    assert excinfo.value.global_name == name
    assert name in str(excinfo.value)
    schedule = load_schedule_bytes(blob, allowed_classes=[name])
    assert schedule.entries == (ScheduleEntry(0, 2.0, "/bin/true"),)


def test_allow_listing_a_subclass_keeps_the_reference_class_allowed():
    a = reference_pickle([reference_record(1)], 4, class_path="my_mc.DropEntry")
    b = reference_pickle([reference_record(1)], 4)
    assert (
        load_schedule_bytes(a, ["my_mc.DropEntry"]).entries
        == load_schedule_bytes(b, ["my_mc.DropEntry"]).entries
    )


def test_refpickle_leaves_no_modules_behind():
    reference_pickle([reference_record(1)], 2)
    reference_pickle([reference_record(1)], 2, class_path="base_objects.ScheduleEntry")
    assert not any(name == "firewheel" or name.startswith("firewheel.") for name in sys.modules)
    assert "base_objects" not in sys.modules
    assert REFERENCE_CLASS.startswith("firewheel.")


# ----------------------------------------------------------------------------- YAML / JSON specifics
def test_minus_inf_spelled_the_yaml_and_the_json_way():
    from_yaml = load_schedule_bytes(b"- start_time: -.inf\n  pause: true\n  data: [{pause_duration: 10}]\n")
    from_json = load_schedule_bytes(
        b'[{"start_time": "-inf", "pause": true, "data": [{"pause_duration": 10}]}]'
    )
    expected = (ScheduleEntry(0, -math.inf, data=(PauseSpec(10.0),), pause=True),)
    assert from_yaml.entries == from_json.entries == expected


@pytest.mark.parametrize(
    "text",
    [
        b"- {start_time: 15, pause_duration: .inf}\n",
        b"- {start_time: 15, pause: true, data: [{pause_duration: .inf}]}\n",
        b'[{"start_time": 15, "pause_duration": "inf"}]',
        b'[{"start_time": 15, "pause": true, "data": [{"pause_duration": "inf"}]}]',
    ],
    ids=["yaml-shorthand", "yaml-data", "json-shorthand", "json-data"],
)
def test_infinite_pause_duration_is_a_break(text):
    (entry,) = load_schedule_bytes(text).entries
    assert entry.kind is EntryKind.BREAK
    assert entry.pause is True
    assert entry.pause_duration == math.inf
    assert entry.start_time == 15.0


def test_pause_duration_shorthand_makes_a_pause_entry():
    (entry,) = load_schedule_bytes(b"- {start_time: 5, pause_duration: 60}\n").entries
    assert entry == ScheduleEntry(0, 5.0, data=(PauseSpec(60.0),), pause=True)
    assert entry.kind is EntryKind.PAUSE


@pytest.mark.parametrize("fmt", ["yaml", "json", "pickle"])
def test_argument_lists_are_joined_with_spaces(fmt):
    records = [{"start_time": 1, "executable": "/bin/echo", "arguments": ["-n", "hello", "wide world"]}]
    data = {"yaml": _yaml, "json": _json}.get(fmt, lambda r: reference_pickle(r, 2))(records)
    (entry,) = load_schedule_bytes(data).entries
    assert entry.arguments == "-n hello wide world"


# ----------------------------------------------------------------------------- validation errors
GOOD = {"start_time": -1, "executable": "/bin/true"}

BAD_ENTRIES = [
    pytest.param({"start_time": 0, "executable": "/bin/echo"}, "start_time", id="start-zero"),
    pytest.param({"start_time": math.nan, "executable": "/bin/echo"}, "start_time", id="start-nan"),
    pytest.param({"executable": "/bin/echo"}, "start_time", id="start-missing"),
    pytest.param({"start_time": "soon", "executable": "/bin/echo"}, "start_time", id="start-string"),
    pytest.param({"start_time": math.inf, "executable": "/bin/echo"}, "start_time", id="start-inf-normal"),
    pytest.param(
        {"start_time": -math.inf, "executable": "/bin/echo"}, "start_time", id="start-minus-inf-normal"
    ),
    pytest.param(
        {"start_time": 1, "executable": "/bin/echo", "arguments": [1, 2]}, "arguments", id="args-ints"
    ),
    pytest.param(
        {"start_time": 1, "executable": "/bin/echo", "data": [{"location": "x"}]},
        "data[0]",
        id="data-no-shape",
    ),
    pytest.param(
        {
            "start_time": 1,
            "executable": "/bin/echo",
            "data": [{"location": "x", "content": "a", "filename": "b"}],
        },
        "data[0]",
        id="data-two-shapes",
    ),
    pytest.param(
        {
            "start_time": 1,
            "executable": "/bin/echo",
            "data": [{"location": "x", "content": "a", "mode": 493}],
        },
        "data[0]",
        id="data-extra-key",
    ),
    pytest.param(
        {"start_time": 1, "executable": "/bin/echo", "data": [{"location": "x", "interval": -3}]},
        "data[0].interval",
        id="data-negative-interval",
    ),
    pytest.param(
        {"start_time": 1, "executable": "/bin/echo", "ignore_failure": "yes please"},
        "ignore_failure",
        id="ignore-failure-string",
    ),
]


def _problem_text(exc: ScheduleValidationError) -> str:
    assert len(exc.problems) == 1, exc.problems
    return exc.problems[0]


@pytest.mark.parametrize(("bad", "field"), BAD_ENTRIES)
@pytest.mark.parametrize("fmt", ["yaml", "pickle"])
def test_validation_error_names_index_executable_and_field(bad, field, fmt):
    records = [dict(GOOD), bad]
    data = _yaml(records) if fmt == "yaml" else reference_pickle(records, 4)
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(data)
    problem = _problem_text(excinfo.value)
    assert problem.startswith("entry 1 ('/bin/echo'): ")
    assert f"field '{field}'" in problem
    assert problem in str(excinfo.value)


BAD_PAUSES = [
    pytest.param(
        {"start_time": -5, "pause": True, "data": [{"pause_duration": 3}]},
        "start_time",
        id="pause-at-minus-5",
    ),
    pytest.param(
        {"start_time": math.inf, "pause": True, "data": [{"pause_duration": 3}]},
        "start_time",
        id="pause-at-inf",
    ),
    pytest.param(
        {"start_time": 5, "pause": True, "data": [{"pause_duration": -1}]},
        "data[0].pause_duration",
        id="duration-minus-1",
    ),
    pytest.param({"start_time": 5, "pause_duration": -1}, "pause_duration", id="shorthand-duration-minus-1"),
    pytest.param(
        {"start_time": 5, "pause": True, "data": [{"pause_duration": "long"}]},
        "data[0].pause_duration",
        id="duration-string",
    ),
    pytest.param({"start_time": 5, "pause": True}, "data", id="pause-without-duration"),
    pytest.param(
        {"start_time": 5, "pause": True, "executable": "/bin/echo", "data": [{"pause_duration": 3}]},
        "executable",
        id="pause-with-executable",
    ),
]


@pytest.mark.parametrize(("bad", "field"), BAD_PAUSES)
def test_pause_validation_errors_name_index_and_field(bad, field):
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(_yaml([dict(GOOD), bad]))
    problems = excinfo.value.problems
    assert all(p.startswith("entry 1") for p in problems), problems
    assert any(f"field '{field}': " in p for p in problems), problems


def test_json_nan_start_time_is_refused():
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(b'[{"start_time": NaN, "executable": "/bin/echo"}]')
    assert "entry 0 ('/bin/echo'): field 'start_time'" in _problem_text(excinfo.value)


def test_unknown_top_level_field_is_an_error_in_yaml_and_a_warning_in_pickles():
    records = [{"start_time": 4, "executable": "/bin/echo", "retries": 3}]
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(_yaml(records))
    problem = _problem_text(excinfo.value)
    assert problem.startswith("entry 0 ('/bin/echo'): field 'retries'")
    with pytest.raises(ScheduleValidationError):
        load_schedule_bytes(_json(records))

    schedule = load_schedule_bytes(reference_pickle(records, 2))
    assert schedule.entries == (ScheduleEntry(0, 4.0, "/bin/echo"),)
    assert len(schedule.warnings) == 1
    assert "retries" in schedule.warnings[0]


@pytest.mark.parametrize(
    "text",
    [b"start_time: 1\nexecutable: /bin/true\n", b"just a string\n", b"42\n", b'{"start_time": 1}', b'"x"'],
    ids=["yaml-mapping", "yaml-string", "yaml-int", "json-object", "json-string"],
)
def test_top_level_document_must_be_a_list(text):
    with pytest.raises(ScheduleFormatError) as excinfo:
        load_schedule_bytes(text)
    assert "list" in str(excinfo.value)


def test_list_items_must_be_mappings():
    with pytest.raises(ScheduleFormatError) as excinfo:
        load_schedule_bytes(b"- {start_time: 1, executable: /bin/true}\n- just text\n")
    assert "entry 1" in str(excinfo.value)


def test_empty_documents_are_empty_schedules():
    assert load_schedule_bytes(b"").entries == ()
    assert load_schedule_bytes(b"# nothing yet\n").entries == ()
    assert load_schedule_bytes(b"[]").entries == ()
    assert load_schedule_bytes(reference_pickle([], 2)).entries == ()


def test_invalid_yaml_and_json_are_format_errors():
    with pytest.raises(ScheduleFormatError, match="YAML"):
        load_schedule_bytes(b"- start_time: [1\n")
    with pytest.raises(ScheduleFormatError, match="JSON"):
        load_schedule_bytes(b'[{"start_time": 1,]')
    with pytest.raises(ScheduleFormatError, match="UTF-8"):
        load_schedule_bytes(b"- start_time: 1\n  arguments: \xff\xfe\n")


def test_all_problems_are_reported_at_once():
    records = [
        {"start_time": 0, "executable": "/bin/first"},
        dict(GOOD),
        {"start_time": 5, "executable": "/bin/third", "arguments": [1]},
        {"start_time": -3, "pause": True, "data": [{"pause_duration": 1}]},
    ]
    for data in (_yaml(records), reference_pickle(records, 2)):
        with pytest.raises(ScheduleValidationError) as excinfo:
            load_schedule_bytes(data)
        problems = excinfo.value.problems
        assert len(problems) == 3, problems
        assert problems[0].startswith("entry 0 ('/bin/first'): field 'start_time'")
        assert problems[1].startswith("entry 2 ('/bin/third'): field 'arguments'")
        assert problems[2].startswith("entry 3: field 'start_time'")
        message = str(excinfo.value)
        assert message.startswith("3 problem(s) in schedule:")
        assert all(p in message for p in problems)


def test_one_entry_with_several_problems_lists_them_all():
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(
            _yaml([{"start_time": "x", "executable": "/bin/e", "arguments": [1], "on_host": 3}])
        )
    fields = sorted(p.split("field ")[1].split(":")[0] for p in excinfo.value.problems)
    assert fields == ["'arguments'", "'on_host'", "'start_time'"]


def test_load_schedule_names_the_path_on_format_errors(tmp_path):
    path = tmp_path / "sched.yaml"
    path.write_bytes(b"a: mapping\n")
    with pytest.raises(ScheduleFormatError) as excinfo:
        load_schedule(str(path))
    assert str(path) in str(excinfo.value)
    with pytest.raises(ScheduleFormatError) as excinfo:
        load_schedule(str(tmp_path / "missing.pkl"))
    assert "missing.pkl" in str(excinfo.value)


# ------------------------------------------------------------------ malformed input stays a ScheduleError
# Whatever the bytes, the loader raises a ScheduleError (CLI exit 2), never another exception.
DEPTH = 100_000


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"[" * DEPTH + b"]" * DEPTH, id="json-deep-lists"),
        pytest.param(b'[{"start_time": ' + b"[" * DEPTH + b"]" * DEPTH + b"}]", id="json-deep-value"),
        pytest.param(b"- start_time: " + b"[" * DEPTH + b"]" * DEPTH + b"\n", id="yaml-deep-value"),
    ],
)
def test_deeply_nested_text_is_a_schedule_error(text):
    with pytest.raises(ScheduleError):
        load_schedule_bytes(text)


BIG = b"1" + b"0" * 400  # too large for a float
HUGE = b"1" + b"0" * 5000  # more digits than Python's int <-> str conversion limit (4300)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"- {start_time: " + BIG + b", executable: /bin/true}\n", id="yaml-start"),
        pytest.param(b'[{"start_time": ' + BIG + b', "executable": "/bin/true"}]', id="json-start"),
        pytest.param(b"- {start_time: 5, pause_duration: " + BIG + b"}\n", id="yaml-pause-duration"),
        pytest.param(
            b"- {start_time: 5, executable: x, data: [{location: a, interval: " + BIG + b"}]}\n",
            id="yaml-interval",
        ),
    ],
)
def test_huge_integers_are_validation_errors(text):
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(text)
    assert "entry 0" in str(excinfo.value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"- {start_time: " + HUGE + b", executable: /bin/true}\n", id="yaml-start"),
        pytest.param(
            b'[{"start_time": 1, "executable": "x", "arguments": ' + HUGE + b"}]", id="json-arguments"
        ),
    ],
)
def test_integers_beyond_the_str_conversion_limit_are_schedule_errors(text):
    with pytest.raises(ScheduleError):
        load_schedule_bytes(text)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"- {1: x, extra: y, start_time: 1, executable: /bin/true}\n", id="entry-keys"),
        pytest.param(b"- {start_time: 1, executable: /bin/true, data: [{1: x, other: y}]}\n", id="data-keys"),
    ],
)
def test_non_string_keys_are_validation_errors(text):
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(text)
    assert "entry 0 ('/bin/true')" in str(excinfo.value)


def test_cli_check_exits_2_on_deeply_nested_json(tmp_path):
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * DEPTH + b"]" * DEPTH)
    result = cli("check", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- the shipped examples
def _fields(schedule):
    """Everything of a schedule except where it came from (digest, format)."""
    return schedule.entries, schedule.warnings


def test_demo_yaml_and_demo_pkl_give_the_same_entries():
    from_yaml = load_schedule(str(EXAMPLES / "demo.yaml"))
    from_pickle = load_schedule(str(EXAMPLES / "demo.pkl"))
    assert from_yaml.source_format == "yaml"
    assert from_pickle.source_format == "pickle"
    assert _fields(from_pickle) == _fields(from_yaml)
    assert len(from_yaml.entries) == 10
    assert from_yaml.stage_times() == (-20.0, -10.0)
    assert [e.kind for e in from_yaml.entries].count(EntryKind.PAUSE) == 1


def _globals_named(blob: bytes) -> List[str]:
    """``module.name`` of every GLOBAL / STACK_GLOBAL in a pickle (STACK_GLOBAL via the preceding strings)."""
    names, strings = [], []
    for op, arg, _pos in pickletools.genops(blob):
        if op.name == "GLOBAL":
            names.append(arg.replace(" ", "."))
        elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            names.append(f"{strings[-2]}.{strings[-1]}")
    return names


def test_demo_pkl_is_a_reference_pickle():
    blob = (EXAMPLES / "demo.pkl").read_bytes()
    assert blob[:2] == b"\x80\x02"  # protocol 2 by default
    assert set(_globals_named(blob)) == {REFERENCE_CLASS}


@pytest.mark.parametrize("protocol", [None, 0, 5])
def test_make_demo_pickle_reproduces_the_demo(tmp_path, protocol):
    out = tmp_path / "again.pkl"
    cmd = [sys.executable, str(EXAMPLES / "make_demo_pickle.py"), "--output", str(out)]
    if protocol is not None:
        cmd += ["--protocol", str(protocol)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    blob = out.read_bytes()
    if protocol is None:
        assert blob == (EXAMPLES / "demo.pkl").read_bytes()
    assert b"firewheel.vm_resource_manager.schedule_entry" in blob
    assert _fields(load_schedule(str(out))) == _fields(load_schedule(str(EXAMPLES / "demo.yaml")))


def test_make_demo_pickle_never_imports_firewheel(tmp_path):
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['make_demo_pickle.py', '--output', {str(tmp_path / 'x.pkl')!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(EXAMPLES / 'make_demo_pickle.py')!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "mod = sys.modules['firewheel.vm_resource_manager.schedule_entry']\n"
        "assert getattr(mod, '__file__', None) is None, mod\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_timeout_is_seconds_on_a_program_entry_of_yaml_and_json_only():
    records = [
        {"start_time": -5, "executable": "/bin/sleep", "arguments": "100", "timeout": 30},
        {"start_time": 5, "executable": "/bin/true", "timeout": 0.5},
        {"start_time": 6, "executable": "/bin/true", "timeout": None},
    ]
    for raw in (_yaml(records), _json(records)):
        assert [e.timeout for e in load_schedule_bytes(raw).entries] == [30.0, 0.5, None]
    bad = [
        {"start_time": 1, "executable": "/bin/true", "timeout": 0},
        {"start_time": 2, "executable": "/bin/true", "timeout": "soon"},
        {"start_time": 3, "executable": "/bin/true", "timeout": ".inf"},
        {"start_time": 4, "pause_duration": 5, "timeout": 3},
        {"start_time": -4, "data": [{"location": "f", "content": "x"}], "timeout": 3},
        {"start_time": 5, "executable": "/bin/true", "on_host": True, "timeout": 3},
    ]
    with pytest.raises(ScheduleValidationError) as err:
        load_schedule_bytes(_yaml(bad))
    text = str(err.value)
    assert text.count("must be seconds > 0 (or null)") == 3 and "got 'soon'" in text
    assert text.count("bounds how long a program runs: only on an entry with an executable") == 3
    # a pickle's object has no such field: an attribute of that name is ignored, with a warning
    record = reference_record(3, executable="/bin/true", timeout=5)
    schedule = load_schedule_bytes(reference_pickle([reference_record(-1), record], 3))
    assert schedule.entries[1] == ScheduleEntry(1, 3.0, "/bin/true") and schedule.entries[1].timeout is None
    assert "timeout" in schedule.warnings[0]


# ------------------------------------------------------------------ Windows schedules
def test_a_windows_schedule_is_refused_at_load_naming_each_windows_entry(tmp_path):
    """FIREWHEEL's Windows entries, pickled as its schedule plugin does: PowerShell (plain and
    through the batch wrapper), a drop preloaded with ``move``, a ``.ps1``/``.bat`` run directly
    and a drive-letter path; the Linux entries around them are not named."""
    records = [
        fw.run_executable(-300, "/bin/true"),
        fw.run_powershell(-250, "set_hostname.ps1", "win-1"),
        fw.run_powershell(-200, "configure_ips.ps1", batch=True),
        fw.windows_drop_file(-100, "C:\\tools\\x.txt", "x.txt"),
        fw.run_executable(-50, "add_remote_desktop_user.bat", "alice", vm_resource=True),
        fw.run_executable(-40, "C:\\Windows\\system32\\ipconfig", "/all"),
        fw.run_executable(-30, "cleanup.ps1"),
        fw.drop_file(-20, "/opt/tool.sh", "tool.sh"),
    ]
    with pytest.raises(WindowsScheduleError) as info:
        load_schedule_bytes(fw.firewheel_pickle(records))
    assert [(i, exe) for i, exe, _why in info.value.entries] == [
        (1, "powershell"),
        (2, "powershell_wrapper.exe"),
        (3, "move"),
        (4, "add_remote_desktop_user.bat"),
        (5, "C:\\Windows\\system32\\ipconfig"),
        (6, "cleanup.ps1"),
    ]
    text = str(info.value)
    assert text.startswith("a Windows schedule (6 of 8 entries are for a Windows guest: ")
    assert "entry 1 ('powershell') runs Windows PowerShell" in text
    assert "entry 3 ('move') runs move, the Windows shell's mv" in text
    assert "entry 6 ('cleanup.ps1') runs a PowerShell script (.ps1)" in text
    assert "entry 0 " not in text and "entry 7 " not in text
    assert "vmr-handler has no Windows agent" in text
    assert isinstance(info.value, ScheduleError)
    path = tmp_path / "win.yaml"  # the same refusal for YAML, and for the columns of plan --json
    path.write_text(yaml.safe_dump([{"start_time": -1, "executable": "powershell.exe", "arguments": "-c x"}]))
    with pytest.raises(WindowsScheduleError, match=r"entry 0 \('powershell.exe'\) runs Windows PowerShell"):
        load_schedule(str(path))
    from vmr_handler.core.schedule.loader import load_schedule_columns

    with pytest.raises(WindowsScheduleError):
        load_schedule_columns(str(path))
    linux = [
        fw.run_executable(-3, "pwsh", "-c 'Get-Date'"),  # PowerShell on Linux
        fw.run_executable(-2, "/usr/local/bin/move-logs", "now"),
        fw.run_executable(-1, "/bin/sh", "run.ps1"),  # a script argument, run by a Linux shell
        fw.drop_file(1, "/srv/files/setup.exe", "setup.exe"),  # a file served, not run
    ]
    assert len(load_schedule_bytes(fw.firewheel_pickle(linux)).entries) == 4  # Linux look-alikes load


def test_check_names_a_windows_schedule_and_the_agent_refuses_it(tmp_path):
    records = [fw.run_powershell(-10, "enable_rdp.ps1"), fw.run_executable(-5, "/bin/true")]
    path = tmp_path / "win1.pkl"
    path.write_bytes(fw.firewheel_pickle(records))
    check = cli("check", str(path))
    assert check.returncode == 2, check.stderr
    named = "a Windows schedule (1 of 2 entries are for a Windows guest: entry 0 ('powershell')"
    assert named in check.stderr
    assert "OK" not in check.stdout
    run = cli("run", "--local", str(path), "--state-dir", str(tmp_path / "state"))
    assert run.returncode == 2, run.stderr
    assert "a Windows schedule" in run.stderr and not (tmp_path / "state" / "journal.json").exists()
