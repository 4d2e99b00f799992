"""The schedule loader's allocation limits.

Memory bombs, built here: pickles whose opcodes declare huge lengths, memo indexes or tuple
nesting; YAML and pickles whose shared values (aliases, memo references) expand far beyond the
file; more entries than allowed. Each runs ``vmr-handler check`` in a subprocess under an
address-space limit (:data:`AS_LIMIT`) and a timeout, so a regression fails fast (MemoryError,
exit 1, or a crash) instead of swapping: it must exit 2 with an error naming the entry and
field, or the opcode. Per-field limits too large to write in a test file are checked in
process with the limit lowered.
"""

from __future__ import annotations

import json
import pickle
import pickletools
import re
import resource
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Union

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.refpickle import reference_pickle, reference_record, standin_class
from vmr_handler.core.errors import ScheduleFormatError, ScheduleValidationError
from vmr_handler.core.schedule import items as items_module
from vmr_handler.core.schedule import limits, load_schedule_bytes, pickle_scan
from vmr_handler.core.schedule import loader as loader_module

ROOT = Path(__file__).resolve().parent.parent
#: Address space of each ``check`` process: the interpreter and imports need about 100 MiB;
#: every bomb below would need GiBs.
AS_LIMIT = 512 * 1024 * 1024
MIB = 1024 * 1024


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def check(path: Path) -> subprocess.CompletedProcess[str]:
    """``vmr-handler check path`` under :data:`AS_LIMIT`, at most 60 s."""
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
        cwd=ROOT,
    )


def entry_pickle(state: Dict[str, Any], copies: int = 1) -> bytes:
    """A reference pickle of ``copies`` references to one entry object with ``state``
    (the pickler writes the object once and a 2-byte memo reference for each other copy)."""
    with standin_class() as cls:
        entry = cls()
        entry.__dict__.update(state)
        return pickle.dumps([entry] * copies, protocol=4)


ONE_MIB = "x" * MIB


def shared_state_pickle(entries: int, extras: int) -> bytes:
    """``entries`` entry objects sharing one state dict with ``extras`` extra attributes (the
    pickle writes it once, then a memo reference per entry; it was copied per entry: 825 KB
    of pickle made 3 GB)."""
    state: Dict[str, Any] = {"start_time": 1, "executable": "/bin/true"}
    state.update({f"extra_attribute_{k}": k for k in range(extras)})
    with standin_class() as cls:
        objects = []
        for _ in range(entries):
            entry = cls.__new__(cls)
            entry.__dict__ = state
            objects.append(entry)
        return pickle.dumps(objects, protocol=4)


def inst_then(opcodes: bytes) -> bytes:
    """A pickle whose containers are counted (a 200 000-byte string of ``]`` makes the quick count
    over), holding an INST of the allowed class, then ``opcodes``."""
    filler = b"]" * 200_000
    inst = b"(ifirewheel.vm_resource_manager.schedule_entry\nScheduleEntry\n"
    return b"\x80\x02]X" + struct.pack("<I", len(filler)) + filler + b"0" + inst + b"a" + opcodes + b"."


#: name -> (file bytes, words the error must contain)
BOMBS: Dict[str, Callable[[], tuple[bytes, List[str]]]] = {
    # 9 bytes: LONG_BINPUT 2**26 makes the C unpickler's memo table 1 GiB (was: accepted, empty)
    "memo-index-9-bytes": lambda: (b"\x80\x04]r\x00\x00\x00\x04.", ["LONG_BINPUT", "memo index 67,108,864"]),
    "memo-index-protocol-0": lambda: (b"(lp1073741824\n.", ["PUT", "memo index 1,073,741,824"]),
    "BINBYTES8-1-GiB": lambda: (
        b"\x80\x04\x8e" + struct.pack("<Q", 1 << 30) + b".",
        ["BINBYTES8", "declares"],
    ),
    "BYTEARRAY8-1-GiB": lambda: (b"\x80\x05\x96" + struct.pack("<Q", 1 << 30) + b".", ["BYTEARRAY8"]),
    "BINUNICODE8-1-GiB": lambda: (b"\x80\x04\x8d" + struct.pack("<Q", 1 << 30) + b".", ["BINUNICODE8"]),
    "BINBYTES-1-GiB": lambda: (b"\x80\x03B" + struct.pack("<I", 1 << 30) + b".", ["BINBYTES at byte 2"]),
    "LONG4-1-GiB": lambda: (b"\x80\x02\x8b" + struct.pack("<i", 1 << 30) + b".", ["LONG4"]),
    "FRAME-1-GiB": lambda: (b"\x80\x04\x95" + struct.pack("<Q", 1 << 30) + b"].", ["FRAME"]),
    # counting containers, the scan read INST's names as opcodes and stopped at the ``f`` of
    # ``firewheel``: the memo bomb after the allowed class went through (was: 1 GiB of memo)
    "inst-hides-memo-bomb": lambda: (
        inst_then(b"r\x00\x00\x00\x04"),
        ["LONG_BINPUT at byte 200071", "memo index 67,108,864"],
    ),
    # one byte a container: 1 MB of EMPTY_LIST was 80 MB; a 10 MB one 814 MB
    "pickle-million-empty-lists": lambda: (
        b"\x80\x04(" + b"]" * 1_000_000 + b"l.",
        ["EMPTY_LIST at byte", "containers, more than one per 2 bytes"],
    ),
    # a tuple nested a million deep (1 byte a level), hashed as a dict key: was a segfault
    "deep-tuple-key": lambda: (
        b"\x80\x02]q\x00}q\x01(" + b")" + b"\x85" * 1_000_000 + b"K\x01u.",
        ["TUPLE1 at byte", "tuples, more than one per 2 bytes"],
    ),
    # 300 000 deep, padded so the count lets it through: the exact pass refuses it
    "deep-tuple-key-padded": lambda: (
        b"\x80\x04]\x94}\x94("
        + b")"
        + b"\x85" * 300_000
        + b"K\x01"
        + b"X"
        + struct.pack("<I", 400_000)
        + b"p" * 400_000
        + b"0u.",
        ["TUPLE1 at byte", "nests tuples more than 100 deep"],
    ),
    # 1 MiB of pickle: 20 000 memo references to one 1 MiB string join to 20 GiB
    "pickle-arguments-join-20-GiB": lambda: (
        entry_pickle({"start_time": 1, "executable": "/bin/echo", "arguments": [ONE_MIB] * 20000}),
        ["entry 0 ('/bin/echo'): field 'arguments'", "over the limit of 1,048,576"],
    ),
    # 1 MiB of pickle: 1000 entries sharing one 1 MiB arguments string (was: 1 GiB, accepted)
    "pickle-shared-arguments-1-GiB": lambda: (
        entry_pickle({"start_time": 1, "executable": "/bin/true", "arguments": ONE_MIB}, copies=1000),
        ["entry 16 ('/bin/true'): field 'arguments'", "over the limit of 16,"],
    ),
    "pickle-shared-state-1000-extras": lambda: (
        shared_state_pickle(2000, 1000),
        ["entry 998 ('/bin/true'): field 'fields'", "over the limit of 1,000,000"],
    ),
    "pickle-too-many-entries": lambda: (
        entry_pickle({"start_time": 1, "executable": "/bin/true"}, copies=limits.MAX_ENTRIES + 1),
        ["entry 1,000,000 and later", "1,000,001 entries", "limit of 1,000,000"],
    ),
    # YAML aliases: one 1 MiB string, an arguments list of 20 000 aliases of it (the 1.1 MB file)
    "yaml-arguments-join-20-GiB": lambda: (
        (
            f"- {{start_time: -1, executable: /bin/true, arguments: &s {ONE_MIB}}}\n"
            "- {start_time: 1, executable: /bin/echo, arguments: [" + ", ".join(["*s"] * 20000) + "]}\n"
        ).encode(),
        ["entry 1 ('/bin/echo'): field 'arguments'", "joined, 20,971,539,999 characters"],
    ),
    "yaml-shared-entries": lambda: (
        (f"- &e {{start_time: 1, executable: /bin/true, arguments: {ONE_MIB}}}\n" + "- *e\n" * 400).encode(),
        ["entry 16 ('/bin/true'): field 'arguments'", "at every use"],
    ),
    "yaml-shared-content": lambda: (
        (
            f"- {{start_time: 1, data: [{{location: a, content: &c {'y' * 65536}}}]}}\n"
            "- {start_time: 1, data: [" + ", ".join(["{location: b, content: *c}"] * 5000) + "]}\n"
        ).encode(),
        ["entry 1: field 'data[255].content'", "at every use"],
    ),
    # billion laughs on data items: 3 000 entries alias one list of 1 000 aliases of one drop
    "yaml-data-items-3-million": lambda: (
        (
            "- {start_time: 1, data: [&m {location: a, content: lol}]}\n"
            "- {start_time: 1, data: &d ["
            + ", ".join(["*m"] * 1000)
            + "]}\n"
            + "- {start_time: 1, data: *d}\n" * 3000
        ).encode(),
        ["entry 1000: field 'data'", "list elements", "over the limit of 1,000,000"],
    ),
    "json-arguments-over-1-MiB": lambda: (
        json.dumps([{"start_time": 1, "executable": "/bin/echo", "arguments": "a" * (MIB + 1)}]).encode(),
        ["entry 0 ('/bin/echo'): field 'arguments'", "1,048,577 characters, over the limit of 1,048,576"],
    ),
}


@pytest.mark.faults
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_memory_bomb_is_refused_with_exit_2_naming_where(name: str, tmp_path: Path) -> None:
    data, words = BOMBS[name]()
    path = tmp_path / f"{name}.sched"
    path.write_bytes(data)
    result = check(path)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("example", ["demo.yaml", "demo.pkl"])
def test_the_examples_pass_check_under_the_same_memory_limit(example: str) -> None:
    result = check(ROOT / "examples" / example)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_big_reference_pickle_with_shared_values_loads(tmp_path: Path) -> None:
    """Memo references below the limits are fine: one content shared by 10 drops, 10 000 entries
    sharing their strings (every protocol)."""
    drop = {"location": "run.sh", "content": "#!/bin/sh\necho hi\n" * 1000, "executable": True}
    records = [reference_record(1, executable="run.sh", data=[dict(drop) for _ in range(10)])]
    records += [reference_record(t + 2, executable="/bin/echo", arguments="a b c") for t in range(10_000)]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        schedule = load_schedule_bytes(reference_pickle(records, protocol=protocol))
        assert len(schedule.entries) == 10_001
        assert len(schedule.entries[0].data) == 10


def test_many_tuples_take_the_exact_nesting_pass_and_shallow_ones_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More tuple opcodes than the quick scan trusts (protocol 0 spells each entry's reduce
    arguments as one): the exact pass follows the stack and lets shallow tuples through."""
    passes: List[int] = []
    exact = pickle_scan.check_tuple_nesting
    monkeypatch.setattr(
        pickle_scan, "check_tuple_nesting", lambda data: passes.append(len(data)) or exact(data)
    )
    few = [reference_record(t + 1, executable="/bin/true") for t in range(100)]
    assert len(load_schedule_bytes(reference_pickle(few, protocol=0)).entries) == 100
    assert passes == []
    records = [
        reference_record(t + 1, executable="/bin/true") for t in range(pickle_scan.TUPLE_OPS_UNCHECKED + 1)
    ]
    data = reference_pickle(records, protocol=0)
    assert len(load_schedule_bytes(data).entries) == len(records)
    assert passes == [len(data)]


def test_a_deep_tuple_built_through_the_memo_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PUT``/``GET`` between the levels hides nothing: the exact pass tracks the memo."""
    monkeypatch.setattr(pickle_scan, "TUPLE_OPS_UNCHECKED", 0)
    level = b"g0\n\x85p0\n0"  # GET 0, wrap it in a 1-tuple, PUT it back as 0, POP
    data = b"(lp0\n)p0\n0" + level * (limits.MAX_NESTING + 1) + b"g0\na."
    with pytest.raises(ScheduleFormatError, match=r"TUPLE1 at byte \d+ nests tuples more than 100 deep"):
        load_schedule_bytes(data)
    shallow = b"(lp0\n)p0\n0" + level * limits.MAX_NESTING + b"."
    assert load_schedule_bytes(shallow).entries == ()


@pytest.mark.parametrize(
    ("content", "size"), [("x" * 101, 101), ("\u00e9" * 51, 102)], ids=["characters", "utf-8-bytes"]
)
def test_content_over_its_limit_names_the_item(
    content: str, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(items_module, "MAX_CONTENT_BYTES", 100)
    ok = {"start_time": 1, "data": [{"location": "a", "content": "\u00e9" * 50}]}  # 100 bytes as UTF-8
    assert load_schedule_bytes(json.dumps([ok]).encode()).entries[0].data[0].content == "\u00e9".encode() * 50
    doc = [ok, {"start_time": 2, "data": [ok["data"][0], {"location": "b", "content": content}]}]
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(json.dumps(doc).encode())
    assert excinfo.value.problems == [
        f"entry 1: field 'data[1].content': {size} bytes, over the limit of 100"
    ]


def test_executable_over_its_limit_is_refused_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    from vmr_handler.core.schedule import validate

    monkeypatch.setattr(validate, "MAX_ARGUMENTS_LENGTH", 10)
    plain = [{"start_time": 1, "executable": "/bin/" + "x" * 6}]
    with pytest.raises(
        ScheduleValidationError, match="field 'executable': 11 characters, over the limit of 10"
    ):
        load_schedule_bytes(json.dumps(plain).encode())


def test_validation_stops_after_max_problems() -> None:
    doc = [{"start_time": "soon"}] * (limits.MAX_PROBLEMS + 500)
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(json.dumps(doc).encode())
    problems = excinfo.value.problems
    assert len(problems) == limits.MAX_PROBLEMS + 1
    assert problems[-1] == f"(validation stopped after {limits.MAX_PROBLEMS} problems)"


def test_yaml_over_its_size_limit_says_to_use_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_module, "MAX_YAML_BYTES", 100)
    text = "".join(f"- {{start_time: {t + 1}, executable: /bin/true}}\n" for t in range(10))
    with pytest.raises(
        ScheduleFormatError, match=r"more than the limit of 100 \(write a bigger schedule as JSON\)"
    ):
        load_schedule_bytes(text.encode())
    doc = [{"start_time": t + 1, "executable": "/bin/true"} for t in range(10)]
    assert len(load_schedule_bytes(json.dumps(doc).encode()).entries) == 10


def test_deep_yaml_over_the_slow_parser_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_module, "MAX_DEEP_YAML_BYTES", 1000)
    deep = "- {start_time: 1, executable: /bin/true, arguments: " + "[" * 300 + "]" * 300 + "}\n"
    with pytest.raises(ScheduleFormatError, match="nested more than 200 levels"):
        load_schedule_bytes((deep + "#" * 1000).encode())
    with pytest.raises(ScheduleValidationError, match="field 'arguments'"):  # small: parsed, then refused
        load_schedule_bytes(deep.encode())


# ------------------------------------------------------------------ the scan's skipping pattern
def _walk_outcome(data: bytes, counting: bool, allowed: int, how: str) -> Union[int, str]:
    """What :func:`pickle_scan._walk` says of ``data`` (the tuple count, or its refusal), walked
    by the ``loop`` alone, opcode by opcode, or with the ``pattern`` as it is, or with the
    pattern tried again after every opcode the loop checks (``pattern-always``)."""
    with pytest.MonkeyPatch.context() as mp:
        if how == "loop":
            mp.setattr(pickle_scan, "_run_pattern", lambda counting: re.compile(b""))
        elif how == "pattern-always":
            mp.setattr(pickle_scan, "PLAIN_BYTES", 0)
        try:
            return pickle_scan._walk(data, counting, allowed)
        except ScheduleFormatError as exc:
            return str(exc)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**300), max_value=2**300)
    | st.floats(allow_nan=False)
    | st.text(max_size=80)
    | st.binary(max_size=300)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.tuples(inner, inner)
        | st.tuples(inner)
        | st.dictionaries(st.text(max_size=12), inner, max_size=5)
        | st.frozensets(st.integers(), max_size=4)
    ),
    max_leaves=30,
)
#: Bytes a hostile pickle would splice in: memo bombs (2**20 is the first index checked),
#: counts beyond the end, a frame, tuples, containers, an INST, a protocol above the highest.
_SPLICES = [
    b"r\x00\x00\x00\x04",
    b"r\x00\x00\x10\x00",
    b"r\xff\xff\x0f\x00",
    b"p1048576\n",
    b"p1048575\n",
    b"p99\n",
    b"\x8e" + struct.pack("<Q", 1 << 30),
    b"\x95" + struct.pack("<Q", 3),
    b"X" + struct.pack("<I", 1 << 30),
    b"X" + struct.pack("<I", 70) + b"x" * 70,
    b"\x8c\x41" + b"y" * 65,
    b"T\xff\xff\xff\xff",
    b"\x85\x85\x86t",
    b"]]})(",
    b"ifirewheel.vm_resource_manager.schedule_entry\nScheduleEntry\n",
    b"\x80" + bytes([pickle.HIGHEST_PROTOCOL + 1]),
    b"X\xff\xff\xff\x7f",
    b"I12\n",
    b"crm\nrf\n",
]


@pytest.mark.skipif(not pickle_scan._POSSESSIVE, reason="no pattern before Python 3.11")
@settings(max_examples=400, deadline=None)
@given(
    value=_VALUES,
    protocol=st.integers(0, pickle.HIGHEST_PROTOCOL),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(["byte", "splice", "cut"]), st.integers(0, 255)),
        max_size=4,
    ),
    counting=st.booleans(),
)
def test_the_pattern_changes_nothing_the_walk_says(
    value: Any, protocol: int, edits: List[Any], counting: bool
) -> None:
    """The skipping pattern only makes the walk faster: on real pickles of every protocol and on
    the same bytes with a byte changed, hostile opcodes spliced in between two opcodes, or cut
    short, the walk with it accepts and refuses exactly what the loop alone does, with the same
    message (counting the containers too, against a limit the small inputs can reach)."""
    original = pickle.dumps([value, value], protocol=protocol)
    starts = [pos for _op, _arg, pos in pickletools.genops(original)]
    data = bytearray(original)
    places = {"byte": lambda k: k % len(original), "splice": lambda k: starts[k % len(starts)]}
    places["cut"] = lambda k: k % (len(original) + 1)
    for at, how, byte in sorted(((places[how](k), how, byte) for k, how, byte in edits), reverse=True):
        if how == "byte":  # (from the end backwards: each place is still where it was, if not cut)
            data[at : at + 1] = bytes([byte])
        elif how == "splice":
            data[at:at] = _SPLICES[byte % len(_SPLICES)]
        else:
            del data[at:]
    raw = bytes(data)
    allowed = len(raw) // 8 + 2
    loop = _walk_outcome(raw, counting, allowed, "loop")
    assert _walk_outcome(raw, counting, allowed, "pattern") == loop
    assert _walk_outcome(raw, counting, allowed, "pattern-always") == loop


@pytest.mark.skipif(not pickle_scan._POSSESSIVE, reason="no pattern before Python 3.11")
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_hostile_splice_between_any_two_opcodes_is_judged_as_by_the_loop(protocol: int) -> None:
    """Each of the hostile splices, between every two opcodes of a small reference schedule: the
    walk with the pattern says what the loop alone says."""
    records = [reference_record(t - 1.5, executable="/bin/true", arguments="x" * 70 * t) for t in range(3)]
    data = reference_pickle(records, protocol=protocol)
    for _op, _arg, at in pickletools.genops(data):
        for splice in _SPLICES:
            raw = data[:at] + splice + data[at:]
            for counting in (False, True):
                loop = _walk_outcome(raw, counting, 40, "loop")
                assert _walk_outcome(raw, counting, 40, "pattern-always") == loop, (at, splice)


@pytest.mark.skipif(not pickle_scan._POSSESSIVE, reason="no pattern before Python 3.11")
@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_the_pattern_steps_over_a_reference_pickle_in_one_match(protocol: int) -> None:
    """What makes the scan fast: a reference schedule (floats, ints, strings of every length up
    to RUN_MAX_COUNT, memo puts past 256) is one match of the pattern up to its STOP, or to each
    FRAME (protocols 4 and 5, one per 64 KiB)."""
    records = [
        reference_record(
            -(t % 7) if t % 5 == 0 else 1.5 * t, executable="/bin/true", arguments="a" * (t % 70)
        )
        for t in range(2000)
    ]
    data = reference_pickle(records, protocol=protocol)
    long_ones = {"BINUNICODE", "SHORT_BINUNICODE"}
    expected = [
        op.name
        for op, arg, _pos in pickletools.genops(data)
        if op.name == "FRAME" or (op.name in long_ones and len(str(arg)) > pickle_scan.RUN_MAX_COUNT)
    ]
    match, names = pickle_scan._run_pattern(False).match, pickle_scan._NAMES
    stops: List[str] = []
    i = 2  # (after PROTO)
    while i < len(data) - 1:
        found = match(data, i)
        assert found is not None  # (it always matches, if only nothing)
        i = found.end()
        stops.append(names[data[i]])
        if stops[-1] in long_ones:  # the loop's step over it
            i += (
                5 + struct.unpack_from("<I", data, i + 1)[0] if stops[-1] == "BINUNICODE" else 2 + data[i + 1]
            )
        else:
            i += 9 if stops[-1] == "FRAME" else 1
    assert stops == [*expected, "STOP"]
    long_arguments = sum(len(r["arguments"]) > pickle_scan.RUN_MAX_COUNT for r in records)
    assert stops.count("BINUNICODE") + stops.count("SHORT_BINUNICODE") == long_arguments == 140


def test_a_memo_bomb_after_a_long_harmless_run_is_refused_where_it_stands() -> None:
    """The pattern hands the loop the one opcode it cannot pass, wherever it stands."""
    data = reference_pickle(
        [reference_record(t + 1, executable="/bin/true") for t in range(1000)], protocol=2
    )
    at = len(data) - 1
    bomb = data[:at] + b"r\x00\x00\x00\x04" + data[at:]
    with pytest.raises(ScheduleFormatError, match=f"LONG_BINPUT at byte {at} puts memo index 67,108,864"):
        load_schedule_bytes(bomb)
    put = data[:at] + b"p1048576\n" + data[at:]
    with pytest.raises(ScheduleFormatError, match=f"PUT at byte {at} puts memo index 1,048,576"):
        load_schedule_bytes(put)


def test_memo_indexes_below_2_to_the_20_are_not_refused() -> None:
    """A put index below 2**20 (at most a 16 MiB memo table) passes the scan wherever it stands,
    in both spellings; 2**20 past the offset is refused."""
    pickle_scan.scan_pickle(b"(lp1048575\n.")
    pickle_scan.scan_pickle(b"\x80\x02]r\xff\xff\x0f\x00.")
    with pytest.raises(ScheduleFormatError, match="PUT at byte 2 puts memo index 1,048,576"):
        pickle_scan.scan_pickle(b"(lp1048576\n.")
    with pytest.raises(ScheduleFormatError, match="LONG_BINPUT at byte 3 puts memo index 1,048,576"):
        pickle_scan.scan_pickle(b"\x80\x02]r\x00\x00\x10\x00.")


def test_counting_containers_steps_over_an_inst_s_names() -> None:
    """Counting containers, the walk steps over INST's two name lines as the unpickler does. It
    read them as opcodes: ``f`` (no opcode) ended the scan there, and a memo bomb after it went
    through (BOMBS["inst-hides-memo-bomb"] is the same in a process)."""
    data = inst_then(b"")
    assert len(data) - len(data.translate(None, pickle_scan._CONTAINERS)) > len(data) // 2 + 65536
    pickle_scan.scan_pickle(data)
    with pytest.raises(ScheduleValidationError, match="entry 0"):
        load_schedule_bytes(data)  # unpickled: an entry without fields
    with pytest.raises(ScheduleFormatError, match="LONG_BINPUT at byte 200071 puts memo index 67,108,864"):
        pickle_scan.scan_pickle(inst_then(b"r\x00\x00\x00\x04"))
