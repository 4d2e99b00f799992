"""Hostile pickles never run code (SPEC section 7).

Every payload here would run ``touch <marker>`` (or import/reach something that can) under
the stock :func:`pickle.loads`; the restricted loader must refuse it with an error that
names the ``module.name`` it asked for, and the marker file must never appear. Payloads
are built by hand: raw opcode bytes (protocol 0 text opcodes, readable below) and objects
whose ``__reduce__`` returns the dangerous callable.
"""

from __future__ import annotations

import codecs
import copyreg
import os
import pickle
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Tuple

import pytest

from tests.agent import cli
from tests.refpickle import REFERENCE_CLASS, reference_pickle, reference_record, standin_class
from vmr_handler.core.errors import (
    ScheduleError,
    ScheduleFormatError,
    ScheduleValidationError,
    UnsafePickleError,
)
from vmr_handler.core.schedule import load_schedule, load_schedule_bytes
from vmr_handler.core.schedule import unpickler as unpickler_module

ENTRY_MODULE, _, ENTRY_NAME = REFERENCE_CLASS.rpartition(".")
ENTRY_GLOBAL = f"c{ENTRY_MODULE}\n{ENTRY_NAME}\n".encode()  # GLOBAL opcode naming the allowed class


class Reduce:
    """Pickles as ``func(*args)``: the classic ``__reduce__`` payload."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return self.func, self.args

    def __call__(self, *args: Any) -> Any:  # pickle insists the reduce callable be callable
        raise NotImplementedError


def dumps(obj: Any, protocol: int, *, fix_imports: bool = False) -> bytes:
    """Pickle ``[obj]``; ``fix_imports=False`` keeps Python 3 names (``builtins.eval``) in protocols 0-2."""
    return pickle.dumps([obj], protocol=protocol, fix_imports=fix_imports)


def v(text: str) -> bytes:
    """Protocol 0 ``UNICODE`` opcode pushing ``text``."""
    return b"V" + text.encode("raw_unicode_escape") + b"\n"


def in_list(*items: bytes) -> bytes:
    """Protocol 0: MARK, items, LIST, STOP -> ``[items...]``."""
    return b"(" + b"".join(items) + b"l."


def call(module: str, name: str, *args: bytes) -> bytes:
    """Protocol 0: ``module.name(*args)`` via GLOBAL + MARK args TUPLE + REDUCE."""
    return f"c{module}\n{name}\n".encode() + b"(" + b"".join(args) + b"tR"


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "pwned"


def _cmd(marker: Path) -> str:
    return f"touch {shlex.quote(str(marker))}"


# ----------------------------------------------------------------------------- payloads
# Each builder: marker -> pickle bytes. The expected name is what find_class is asked for first.
Builder = Callable[[Path], bytes]

CALL_PAYLOADS = {
    # name: (builder, module.name the loader must name)
    "posix.system-p0": (lambda m: dumps(Reduce(os.system, _cmd(m)), 0), "posix.system"),
    "posix.system-p2": (lambda m: dumps(Reduce(os.system, _cmd(m)), 2), "posix.system"),
    "posix.system-p4": (lambda m: dumps(Reduce(os.system, _cmd(m)), 4), "posix.system"),
    "posix.system-p5": (lambda m: dumps(Reduce(os.system, _cmd(m)), 5), "posix.system"),
    "os.system-raw": (lambda m: in_list(call("os", "system", v(_cmd(m)))), "os.system"),
    "builtins.eval": (
        lambda m: dumps(Reduce(eval, f"__import__('os').system({_cmd(m)!r})"), 3),
        "builtins.eval",
    ),
    "__builtin__.eval": (
        lambda m: dumps(Reduce(eval, f"__import__('os').system({_cmd(m)!r})"), 2, fix_imports=True),
        "__builtin__.eval",
    ),
    "builtins.exec": (
        lambda m: dumps(Reduce(exec, f"import os; os.system({_cmd(m)!r})"), 4),
        "builtins.exec",
    ),
    "subprocess.Popen": (lambda m: dumps(Reduce(subprocess.Popen, ["touch", str(m)]), 4), "subprocess.Popen"),
    "subprocess.Popen-raw": (
        lambda m: in_list(call("subprocess", "Popen", b"(l" + v("touch") + b"a" + v(str(m)) + b"a")),
        "subprocess.Popen",
    ),
    "getattr-chain": (
        lambda m: dumps(Reduce(Reduce(getattr, Reduce(__import__, "os"), "system"), _cmd(m)), 2),
        "builtins.getattr",
    ),
    "getattr-chain-raw": (
        lambda m: in_list(
            b"cbuiltins\ngetattr\n("
            + call("builtins", "__import__", v("os"))
            + v("system")
            + b"tR("
            + v(_cmd(m))
            + b"tR"
        ),
        "builtins.getattr",
    ),
}

REFUSED = {
    **CALL_PAYLOADS,
    "builtins.__import__": (lambda m: dumps(Reduce(__import__, "os"), 4), "builtins.__import__"),
    "builtins.__import__-raw": (
        lambda m: in_list(call("builtins", "__import__", v("os"))),
        "builtins.__import__",
    ),
    "builtins.open": (lambda m: dumps(Reduce(open, str(m), "w"), 3), "io.open"),
    "_codecs.encode-rot13": (
        lambda m: in_list(call("_codecs", "encode", v("payload"), v("rot13"))),
        "_codecs.encode",
    ),
    "_codecs.encode-bytes": (
        lambda m: dumps(Reduce(codecs.encode, b"abc", "zlib_codec"), 3),
        "_codecs.encode",
    ),
    "_codecs.encode-int": (lambda m: in_list(call("_codecs", "encode", b"I5\n")), "_codecs.encode"),
    "_codecs.decode": (lambda m: dumps(Reduce(codecs.decode, b"x", "hex_codec"), 3), "_codecs.decode"),
    # the real copyreg._reconstructor(cls, base, state) calls base.__new__(cls, state) and
    # base.__init__(obj, state)
    "reconstructor-allowed-cls-Popen-base": (
        lambda m: in_list(
            call(
                "copyreg",
                "_reconstructor",
                ENTRY_GLOBAL,
                b"csubprocess\nPopen\n",
                b"(l" + v("touch") + b"a" + v(str(m)) + b"a",
            )
        ),
        "subprocess.Popen",
    ),
    "reconstructor-Popen-cls": (
        lambda m: in_list(
            call("copyreg", "_reconstructor", b"csubprocess\nPopen\n", b"cbuiltins\nobject\n", b"N")
        ),
        "subprocess.Popen",
    ),
    "reconstructor-system-base": (
        lambda m: in_list(call("copyreg", "_reconstructor", ENTRY_GLOBAL, b"cposix\nsystem\n", v(_cmd(m)))),
        "posix.system",
    ),
    "copy_reg-reconstructor-py2-Popen-base": (
        lambda m: in_list(
            call(
                "copy_reg",
                "_reconstructor",
                ENTRY_GLOBAL,
                b"csubprocess\nPopen\n",
                b"(l" + v("touch") + b"a" + v(str(m)) + b"a",
            )
        ),
        "subprocess.Popen",
    ),
    "copy_reg-reconstructor-py2-system": (
        lambda m: in_list(
            call("copy_reg", "_reconstructor", b"cposix\nsystem\n", b"c__builtin__\nobject\n", b"N")
        ),
        "posix.system",
    ),
    "INST-posix.system": (lambda m: in_list(b"(" + v(_cmd(m)) + b"iposix\nsystem\n"), "posix.system"),
    "INST-subprocess.Popen": (
        lambda m: in_list(b"((l" + v("touch") + b"a" + v(str(m)) + b"aisubprocess\nPopen\n"),
        "subprocess.Popen",
    ),
    "OBJ-posix.system": (lambda m: in_list(b"(cposix\nsystem\n" + v(_cmd(m)) + b"o"), "posix.system"),
    "OBJ-subprocess.Popen": (
        lambda m: in_list(b"(csubprocess\nPopen\n(l" + v("touch") + b"a" + v(str(m)) + b"ao"),
        "subprocess.Popen",
    ),
    "NEWOBJ-subprocess.Popen": (
        lambda m: b"\x80\x02(csubprocess\nPopen\n)\x81l.",
        "subprocess.Popen",
    ),
    "STACK_GLOBAL-posix.system": (
        lambda m: b"\x80\x04(" + v("posix") + v("system") + b"\x93(" + v(_cmd(m)) + b"tRl.",
        "posix.system",
    ),
    "disallowed-entry-subclass": (
        lambda m: in_list(
            call("copyreg", "_reconstructor", b"cevil_mc\nScheduleEntry\n", b"cbuiltins\nobject\n", b"N")
        ),
        "evil_mc.ScheduleEntry",
    ),
}

# copyreg._reconstructor misuse where every *name* is allowed; the safe replacement refuses the call.
RECONSTRUCTOR_MISUSE = {
    "allowed-cls-bytes-base": in_list(
        call("copyreg", "_reconstructor", ENTRY_GLOBAL, b"cbuiltins\nbytes\n", b"N")
    ),
    "allowed-cls-entry-base": in_list(call("copyreg", "_reconstructor", ENTRY_GLOBAL, ENTRY_GLOBAL, b"N")),
    "allowed-cls-object-base-with-state": in_list(
        call("copyreg", "_reconstructor", ENTRY_GLOBAL, b"cbuiltins\nobject\n", v("touch x"))
    ),
    "py2-allowed-cls-bytes-base": in_list(
        call("copy_reg", "_reconstructor", ENTRY_GLOBAL, b"c__builtin__\nbytes\n", b"N")
    ),
    "object-cls": in_list(
        call("copyreg", "_reconstructor", b"cbuiltins\nobject\n", b"cbuiltins\nobject\n", b"N")
    ),
    "function-cls": in_list(
        call("copyreg", "_reconstructor", b"c_codecs\nencode\n", b"cbuiltins\nobject\n", b"N")
    ),
}


def _refused(data: bytes, name: str) -> UnsafePickleError:
    with pytest.raises(UnsafePickleError) as excinfo:
        load_schedule_bytes(data)
    assert name in str(excinfo.value)
    return excinfo.value


# ----------------------------------------------------------------------------- the payloads are live
def _wait_for(path: Path, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return path.exists()


@pytest.mark.parametrize("payload", sorted(CALL_PAYLOADS))
def test_control_the_payload_runs_code_under_the_stock_unpickler(payload, tmp_path, marker):
    """Proves the payloads are real: stock ``pickle.loads`` (in a child process) creates the marker."""
    builder, _name = CALL_PAYLOADS[payload]
    path = tmp_path / "evil.pkl"
    path.write_bytes(builder(marker))
    code = (
        "import pickle, sys\n"
        "obj = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "for item in obj if isinstance(obj, list) else [obj]:\n"
        "    if hasattr(item, 'wait'):\n"
        "        item.wait(30)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=60, check=True)
    assert _wait_for(marker)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("payload", sorted(REFUSED))
def test_hostile_pickle_is_refused_naming_the_global_and_runs_nothing(payload, marker):
    builder, name = REFUSED[payload]
    data = builder(marker)
    error = _refused(data, name)
    assert error.global_name == name or error.global_name.startswith(f"{name}("), error.global_name
    time.sleep(0.05)  # a spawned child would have had time to touch the marker
    assert not marker.exists()


@pytest.mark.parametrize("payload", sorted(REFUSED))
def test_hostile_pickle_in_a_file_is_refused_whatever_its_name(payload, marker, tmp_path):
    builder, name = REFUSED[payload]
    for filename in ("schedule.pkl", "schedule.yaml", "schedule.json"):
        path = tmp_path / filename
        path.write_bytes(builder(marker))
        with pytest.raises(UnsafePickleError) as excinfo:
            load_schedule(str(path))
        assert name in str(excinfo.value)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_payload_after_valid_entries_is_still_refused(protocol, marker):
    with standin_class() as cls:
        good = cls.__new__(cls)
        good.__dict__.update(reference_record(-5, executable="/bin/true"))
        data = pickle.dumps(
            [good, good, Reduce(os.system, _cmd(marker))], protocol=protocol, fix_imports=False
        )
    _refused(data, "posix.system")
    assert not marker.exists()


def test_payload_inside_an_entry_field_is_refused(marker):
    with standin_class() as cls:
        entry = cls.__new__(cls)
        entry.__dict__.update(
            reference_record(5, executable="/bin/true", arguments=Reduce(os.system, _cmd(marker)))
        )
        data = pickle.dumps([entry], protocol=2)
    _refused(data, "posix.system")
    assert not marker.exists()


@pytest.mark.parametrize("payload", sorted(RECONSTRUCTOR_MISUSE))
def test_reconstructor_misuse_with_allowed_names_is_refused(payload):
    error = _refused(RECONSTRUCTOR_MISUSE[payload], "_reconstructor")
    assert "_reconstructor" in error.global_name


def test_extension_registry_codes_go_through_the_allow_list(marker):
    code = 0xF00D
    copyreg.add_extension("posix", "system", code)
    try:
        data = b"\x80\x02](\x83" + code.to_bytes(2, "little") + b"(" + v(_cmd(marker)) + b"tRe."
        _refused(data, "posix.system")
    finally:
        copyreg.remove_extension("posix", "system", code)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("data", "what"),
    [
        pytest.param(b"(Pevil-id\nl.", "persistent id", id="PERSID"),
        pytest.param(b"\x80\x02]X\x07\x00\x00\x00evil-idQa.", "persistent id", id="BINPERSID"),
    ],
)
def test_persistent_ids_are_refused(data, what):
    with pytest.raises(UnsafePickleError) as excinfo:
        load_schedule_bytes(data)
    assert what in str(excinfo.value)
    assert "evil-id" in str(excinfo.value)


# ----------------------------------------------------------------------------- shape problems
@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(b"(dVstart_time\nI5\ns.", ["dict", "list"], id="top-level-dict"),
        pytest.param(pickle.dumps({"entries": []}, 4), ["dict", "list"], id="top-level-dict-p4"),
        pytest.param(pickle.dumps(("a",), 2), ["tuple", "list"], id="top-level-tuple"),
        pytest.param(b"(I1\nl.", ["item 0", "int"], id="list-with-int"),
        pytest.param(pickle.dumps([None], 2), ["item 0", "NoneType"], id="list-with-None"),
        pytest.param(pickle.dumps([{"start_time": 1}], 4), ["item 0", "dict"], id="list-with-plain-dict"),
        pytest.param(
            in_list(ENTRY_GLOBAL + b"(tR" + v("not a dict") + b"b"), ["instance state is str"], id="state-str"
        ),
        pytest.param(
            in_list(b"(" + v("x") + b"i" + ENTRY_GLOBAL[1:]), ["not a readable pickle"], id="INST-with-args"
        ),
        pytest.param(b"\x80\x05\x97.", ["not a readable pickle"], id="NEXT_BUFFER"),
        pytest.param(b"\x80\x04(I1\nI2\n\x93l.", ["not a readable pickle"], id="STACK_GLOBAL-non-str"),
        pytest.param(b"\x80\x02]q\x00(K\x01", ["not a readable pickle"], id="truncated"),
    ],
)
def test_pickle_shape_problems_are_format_errors(data, words):
    with pytest.raises(ScheduleFormatError) as excinfo:
        load_schedule_bytes(data)
    for word in words:
        assert word in str(excinfo.value)


@pytest.mark.parametrize("odd", [5, None, {"start_time": 1}, ("a",), "text"])
def test_a_non_entry_among_entries_is_named_by_its_index(odd):
    """The item types are screened all at once; the error still names the first item
    that is no schedule entry, wherever it stands."""
    with standin_class() as cls:
        good = cls.__new__(cls)
        good.__dict__.update(reference_record(1, executable="/bin/true"))
        data = pickle.dumps([good] * 3 + [odd, good, odd], protocol=4)
    with pytest.raises(ScheduleFormatError, match=f"pickle item 3 is a {type(odd).__name__}, expected"):
        load_schedule_bytes(data)


def test_instance_state_tuple_with_dicts_is_merged():
    data = in_list(ENTRY_GLOBAL + b"(tR" + b"((dVstart_time\nI5\ns(dVexecutable\nV/bin/true\nstb")
    (entry,) = load_schedule_bytes(data).entries
    assert (entry.start_time, entry.executable) == (5.0, "/bin/true")


def test_oversized_pickle_is_refused_before_unpickling(monkeypatch):
    monkeypatch.setattr(unpickler_module, "MAX_PICKLE_BYTES", 64)
    with pytest.raises(ScheduleFormatError, match="limit"):
        load_schedule_bytes(pickle.dumps([0] * 100, 2))


# ----------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize(
    ("payload", "filename"),
    [
        ("posix.system-p0", "hostile.pkl"),
        ("posix.system-p4", "hostile.yaml"),
        ("subprocess.Popen", "hostile.pkl"),
        ("reconstructor-allowed-cls-Popen-base", "hostile.pkl"),
        ("builtins.eval", "schedule.json"),
    ],
)
def test_cli_check_refuses_hostile_pickles_with_exit_2(payload, filename, tmp_path, marker):
    builder, name = REFUSED[payload]
    path = tmp_path / filename
    path.write_bytes(builder(marker))
    result = cli("check", str(path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert name in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    time.sleep(0.05)
    assert not marker.exists()


def test_cli_run_local_refuses_a_hostile_pickle_before_anything_runs(tmp_path, marker):
    path = tmp_path / "hostile.pkl"
    path.write_bytes(REFUSED["posix.system-p2"][0](marker))
    result = cli(
        "run",
        "--local",
        str(path),
        "--launch-dir",
        str(tmp_path / "launch"),
        "--state-dir",
        str(tmp_path / "state"),
        "--start-buffer",
        "0",
        "--quiet",
    )
    assert result.returncode == 2, result.stderr
    assert "posix.system" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "launch").exists()


def test_cli_allow_class_admits_a_subclass_name(tmp_path):
    path = tmp_path / "mc.pkl"
    path.write_bytes(reference_pickle([reference_record(3, executable="/bin/true")], 2, "my_mc.RunEntry"))
    refused = cli("check", str(path))
    assert refused.returncode == 2
    assert "my_mc.RunEntry" in refused.stderr
    allowed = cli("check", "--allow-class", "my_mc.RunEntry", str(path))
    assert allowed.returncode == 0, allowed.stderr
    assert "OK (pickle, 1 entries" in allowed.stdout


# ------------------------------------------------------------------ loader state is not hostile-writable
def test_build_on_an_allowed_global_is_refused_and_changes_nothing():
    """BUILD (opcode ``b``) with ``(None, {attr: value})`` state does ``setattr`` on whatever is on the
    stack. Aimed at the loader's own shared objects it would persist into every later load."""
    marker_cls = unpickler_module._object_marker
    encode = unpickler_module._safe_codecs_encode
    before = (dict(vars(marker_cls)), encode.__defaults__, dict(vars(encode)))
    on_object = b"cbuiltins\nobject\n(N(dVvmr_test_pwned\nI1\nstb0(l."
    on_encode = b"c_codecs\nencode\n(N(dV__defaults__\n(Vrot13\ntstb0(l."
    try:
        for data in (on_object, on_encode):
            with pytest.raises(UnsafePickleError):
                load_schedule_bytes(data)
        assert (dict(vars(marker_cls)), encode.__defaults__, dict(vars(encode))) == before
    finally:  # undo any damage so later tests see a clean loader
        for key in set(vars(marker_cls)) - set(before[0]):
            delattr(marker_cls, key)
        encode.__defaults__ = before[1]
        for key in set(vars(encode)) - set(before[2]):
            delattr(encode, key)


DEEP = 200_000


def _entry_with_state(state_opcodes: bytes) -> bytes:
    """``[ScheduleEntry()]`` (NEWOBJ) whose BUILD state is made by ``state_opcodes`` (protocol 0 text)."""
    return b"\x80\x02" + in_list(ENTRY_GLOBAL + b")\x81" + state_opcodes + b"b")


@pytest.mark.parametrize(
    "data",
    [
        # start_time = [[[...]]] nested DEEP levels, built iteratively by the unpickler (no recursion)
        pytest.param(
            _entry_with_state(b"(dVstart_time\n" + b"]" * DEEP + b"a" * (DEEP - 1) + b"s"),
            id="deeply-nested-start-time",
        ),
        pytest.param(
            _entry_with_state(b"(d(Vstart_time\nI1\nVarguments\n" + b"]" * DEEP + b"a" * (DEEP - 1) + b"u"),
            id="deeply-nested-arguments",
        ),
        pytest.param(
            _entry_with_state(b"(dVstart_time\nL1" + b"0" * 400 + b"L\ns"), id="huge-int-start-time"
        ),
        # a binary LONG pickles without any str conversion; repr() of it raises ValueError (> 4300 digits)
        pytest.param(
            reference_pickle([reference_record(1, executable="x", arguments=10**5000)], 2),
            id="5000-digit-arguments",
        ),
        pytest.param(
            reference_pickle([reference_record(10**5000, executable="x")], 4), id="5000-digit-start-time"
        ),
    ],
)
def test_odd_entry_values_are_validation_errors(data):
    """Whatever an entry's ``__dict__`` holds, a bad value is a ScheduleValidationError (CLI exit 2)."""
    with pytest.raises(ScheduleValidationError) as excinfo:
        load_schedule_bytes(data)
    assert "entry 0" in str(excinfo.value)


def test_non_string_attribute_names_are_at_most_a_warning():
    data = _entry_with_state(b"(d(Vstart_time\nI5\nVexecutable\nV/bin/true\nI1\nI2\nVextra\nI3\nu")
    try:
        schedule = load_schedule_bytes(data)
    except ScheduleError:
        return  # refusing the entry is fine too; any other exception is the bug
    (warning,) = schedule.warnings
    assert "extra" in warning
    assert "1" in warning


def test_cli_check_exits_2_on_a_deeply_nested_entry_value(tmp_path):
    path = tmp_path / "deep.pkl"
    path.write_bytes(_entry_with_state(b"(dVstart_time\n" + b"]" * DEEP + b"a" * (DEEP - 1) + b"s"))
    result = cli("check", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
