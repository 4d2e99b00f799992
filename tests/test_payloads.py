"""Typed event payloads (``vmr_handler/core/payloads.py``): every class on good data, on each
field missing or of the wrong type, NaN/inf, huge strings and numbers, extra fields; and a
malformed report from a VM counted and dropped by the host's session (stored, not applied)."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

import pytest

from tests.hostfakes import FakeExperiment, make_session
from vmr_handler.core import payloads as P
from vmr_handler.core.errors import PayloadError, VmrError
from vmr_handler.core.events import Event, EventType
from vmr_handler.core.wire.protocol import (
    ACK,
    CLOCK_REQ,
    HEARTBEAT,
    HELLO,
    HOST_ENTRY,
    RESULT,
    encode_message,
    encode_raw_message,
)
from vmr_handler.host.model.vmstate import VmState
from vmr_handler.host.serve.config import Limits

T0 = 1_800_000_000.0
HUGE_INT = 10**400  # valid JSON, but no float can hold it
HUGE_TEXT = "\x1b[31m" + "A" * 2_000_000
WRONG = ["x", "", True, False, [], [1, "a"], {}, {"a": {"b": None}}, None, -7, 2.5]

#: One well-formed ``data`` per payload class, as the agent sends it (docs/events.md).
GOOD: Dict[Type[P.Payload], Dict[str, Any]] = {
    P.AgentStarted: {"version": "0.1.0", "pid": 12, "resumed_from_journal": True},
    P.VmFailed: {"index": 3, "status": "error", "details": "entry 3 could not start"},
    P.ControlRefused: {"type": "resume", "id": "r-1", "status": "error", "details": "unsigned"},
    P.ScheduleComplete: {"status": "success"},
    P.StageStarted: {"stage": 1, "start_time": -20.0, "entries": [0, 1]},
    P.StageFinished: {"stage": 1, "start_time": -20, "duration": 2.5},
    P.RebootRequested: {"stage": 0, "requesters": [0, 2], "command": "reboot"},
    P.Configured: {"at": T0 + 3.5, "stages": 2},
    P.StartTimeSet: {"start_time": T0 + 60, "source": "host", "details": "from the barrier"},
    P.ExperimentStarted: {"start_time": T0 + 60, "late": 0.001},
    P.EntryStarted: {
        "index": 4,
        "executable": "/bin/echo",
        "pid": 99,
        "start_time": 1.5,
        "scheduled": T0 + 61.5,
        "spawned_at": T0 + 61.502,
        "lateness": 0.002,
        "command": "/bin/echo hi",
    },
    P.EntryExited: {
        "index": 4,
        "executable": "/bin/echo",
        "exit_code": 1,
        "signal": None,
        "duration": 0.25,
        "status": "error",
        "details": "exit code 1",
    },
    P.EntryFailed: {"index": 5, "executable": "nosuch", "status": "error", "details": "not found"},
    P.EntryInterrupted: {"index": 6, "executable": "sleep", "details": "agent stopped", "exit_code": -15},
    P.Output: {"index": 4, "stream": "stdout", "seq": 1, "line": "hi", "eol": True},
    P.PauseStarted: {"index": 7, "at": 5, "duration": 2.5, "until": 7.5},
    P.PauseEnded: {"index": 7, "at": 7.5, "duration": 2.5},
    P.BreakStarted: {"index": 8, "at": 12.0, "details": "held"},
    P.ResumeReceived: {"at": 19.5, "ended_break": 8, "ignored": False, "status": "success", "details": "ok"},
    P.Result: {"answers": "sched-1", "status": "success", "details": "schedule accepted"},
    P.Hello: {
        "protocol": 1,
        "vm": "vm1",
        "agent_version": "0.1.0",
        "boot_id": "b-1",
        "unacked": 3,
        "journal": {"digest": "d" * 64, "configured_at": T0 + 3.5},
    },
    P.Ack: {"ids": ["host-1", "host-2"]},
    P.ClockReq: {"t1": T0 + 1.25},
    P.HostEntryRequest: {"index": 4, "scheduled": T0 + 30.5},
    P.Kpi: {
        "cpu_percent": 12.5,
        "load": [0.5, 0.25, 0.1],
        "mem_used": 2**30,
        "mem_total": 2**32,
        "net": {"eth0": {"bytes_sent": 10.0, "bytes_recv": 20.0}},
        "interval": 10,
    },
}

#: The fields without which the event is malformed (everything else is optional).
REQUIRED = {P.Result: {"answers"}, P.Ack: {"ids"}}
#: The fields read as numbers (a number no float can hold there is malformed).
NUMERIC = {
    P.StageStarted: {"start_time"},
    P.StageFinished: {"start_time", "duration"},
    P.Configured: {"at"},
    P.StartTimeSet: {"start_time"},
    P.EntryStarted: {"spawned_at", "scheduled", "start_time", "lateness"},
    P.EntryExited: {"duration"},
    P.EntryFailed: {"duration"},
    P.EntryInterrupted: {"duration"},
    P.PauseStarted: {"at", "duration"},
    P.BreakStarted: {"at"},
    P.ResumeReceived: {"at"},
    P.ClockReq: {"t1"},
    P.HostEntryRequest: {"scheduled"},
    P.Kpi: {"cpu_percent", "mem_used", "mem_total", "interval"},
}
CLASSES = list(GOOD)


def shown(text: str) -> P.Shown:
    """What a guest sent as a string."""
    return P.Shown(text, True)


def js(text: str) -> P.Shown:
    """What a guest sent as another JSON value (its JSON text)."""
    return P.Shown(text, False)


def _check_types(payload: P.Payload) -> None:
    """Every attribute has its declared type: no raw guest value leaks through."""
    hints = typing.get_type_hints(type(payload))
    for f in dataclasses.fields(payload):
        value, hint = getattr(payload, f.name), hints[f.name]
        if hint == Optional[int]:
            assert value is None or (type(value) is int), (f.name, value)
        elif hint == Optional[float]:
            assert value is None or (type(value) is float and math.isfinite(value)), (f.name, value)
        elif hint == Optional[str]:
            assert value is None or type(value) is str, (f.name, value)
        elif hint is bool or hint is str:
            assert type(value) is hint, (f.name, value)
        elif hint is P.Shown:
            assert type(value.text) is str and type(value.is_string) is bool, (f.name, value)
            assert value.is_string or len(value.text) <= P.MAX_JSON_TEXT
        elif hint is P.Number:
            assert value.value is None or (type(value.value) is float and math.isfinite(value.value))
            assert isinstance(value.shown, P.Shown)
        elif hint == Tuple[str, ...]:
            assert all(type(i) is str for i in value), (f.name, value)
        elif hint == Mapping[str, Any]:
            assert isinstance(value, Mapping)
        else:
            raise AssertionError(f"{type(payload).__name__}.{f.name}: no check for {hint}")


def _fields_read(cls: Type[P.Payload]) -> List[str]:
    """The data fields of GOOD[cls] (plus every field a class could read) to vary one at a time."""
    return sorted(set(GOOD[cls]) | {"index", "details", "executable", "stage", "status", "at"})


# ------------------------------------------------------------------------------ the table
def test_the_table_maps_every_type_read_to_its_class_and_every_class_is_tested() -> None:
    assert set(P.PAYLOADS.values()) == set(CLASSES)
    for type_, cls in P.PAYLOADS.items():
        assert type_ == cls.TYPE
        assert type_ in {e.value for e in EventType} | {RESULT, HELLO, ACK, CLOCK_REQ, HOST_ENTRY}
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.mark.parametrize("type_", [EventType.DATA_PLACED.value, HEARTBEAT, "transfer_chunk", "nosuch"])
def test_a_type_nobody_reads_parses_to_none(type_: str) -> None:
    assert P.parse_payload(Event(type_, T0, "e", {"index": HUGE_INT, "x": float("nan")})) is None


def test_parse_payload_uses_the_class_of_the_type() -> None:
    for cls, data in GOOD.items():
        payload = P.parse_payload(Event(cls.TYPE, T0, "e", data))
        assert type(payload) is cls
        with pytest.raises(dataclasses.FrozenInstanceError):
            payload.x = 1  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ every class
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_good_data(cls: Type[P.Payload]) -> None:
    payload = cls.parse(GOOD[cls])
    _check_types(payload)
    extra = cls.parse(dict(GOOD[cls], extra=[1, 2], more={"x": "y"}))  # extra fields are ignored
    if isinstance(extra, P.Result):  # (but handed on with the rest of a result's data)
        extra = dataclasses.replace(extra, data=GOOD[cls])
    assert extra == payload


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_field_missing_or_of_the_wrong_type(cls: Type[P.Payload]) -> None:
    for name in _fields_read(cls):
        for value in ["<missing>", *WRONG]:
            data = dict(GOOD[cls])
            if value == "<missing>":
                data.pop(name, None)
            else:
                data[name] = value
            sent = data.get(name)
            bad_required = name in REQUIRED.get(cls, ()) and not (
                (name == "answers" and isinstance(sent, str)) or (name == "ids" and isinstance(sent, list))
            )
            if bad_required:
                with pytest.raises(PayloadError) as err:
                    cls.parse(data)
                assert (err.value.event_type, err.value.field) == (cls.TYPE, name)
                assert cls.TYPE in str(err.value) and repr(name) in str(err.value)
            else:
                _check_types(cls.parse(data))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_nan_and_infinities_are_not_numbers(cls: Type[P.Payload]) -> None:
    for name in _fields_read(cls):
        for value in (float("nan"), float("inf"), float("-inf"), "inf", "-inf"):
            if name in REQUIRED.get(cls, ()):
                continue
            payload = cls.parse(dict(GOOD[cls], **{name: value}))
            _check_types(payload)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_huge_strings_are_kept_whole_and_huge_values_shown_cut(cls: Type[P.Payload]) -> None:
    for name in _fields_read(cls):
        if name in REQUIRED.get(cls, ()):
            continue
        for value in (HUGE_TEXT, [HUGE_TEXT], list(range(20_000))):
            _check_types(cls.parse(dict(GOOD[cls], **{name: value})))  # JSON texts cut to MAX_JSON_TEXT
    # consumers cut strings where they show them (the "(N chars)" they write counts them all)
    assert P.VmFailed.parse({"details": HUGE_TEXT}).details.string is HUGE_TEXT
    assert P.EntryExited.parse({"executable": HUGE_TEXT}).executable.string is HUGE_TEXT
    assert P.Result.parse({"answers": "a", "details": HUGE_TEXT}).details is HUGE_TEXT


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_number_no_float_can_hold_is_malformed_where_a_number_is_read(cls: Type[P.Payload]) -> None:
    for name in _fields_read(cls):
        data = dict(GOOD[cls], **{name: HUGE_INT})
        if name in NUMERIC.get(cls, ()):
            with pytest.raises(PayloadError) as err:
                cls.parse(data)
            assert (err.value.event_type, err.value.field) == (cls.TYPE, name)
            assert "no float can hold" in err.value.problem
        elif name not in REQUIRED.get(cls, ()):
            _check_types(cls.parse(data))  # an index, a shown value: kept (or its JSON text)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("data", [[], "x", None, 3], ids=repr)
def test_data_that_is_not_an_object_is_malformed(cls: Type[P.Payload], data: Any) -> None:
    with pytest.raises(PayloadError) as err:
        cls.parse(data)
    assert (err.value.event_type, err.value.field) == (cls.TYPE, "data")
    assert isinstance(err.value, VmrError)


# ------------------------------------------------------------------------------ values
def test_good_values_of_each_class() -> None:
    g = {cls: cls.parse(data) for cls, data in GOOD.items()}
    assert g[P.AgentStarted] == P.AgentStarted(True)
    assert g[P.VmFailed] == P.VmFailed(3, shown("entry 3 could not start"))
    assert g[P.ControlRefused] == P.ControlRefused(shown("resume"), shown("unsigned"))
    assert g[P.StageStarted] == P.StageStarted(1, js("1"), P.Number(-20.0, js("-20.0")))
    assert g[P.StageFinished] == P.StageFinished(js("1"), P.Number(-20.0, js("-20")), 2.5)
    assert g[P.RebootRequested] == P.RebootRequested(js("[0, 2]"))
    assert g[P.Configured] == P.Configured(T0 + 3.5)
    assert g[P.StartTimeSet] == P.StartTimeSet(T0 + 60)
    assert g[P.EntryStarted] == P.EntryStarted(4, shown("/bin/echo"), T0 + 61.502, T0 + 61.5, 1.5, 0.002)
    ended = (shown("/bin/echo"), 0.25, 1, shown("exit code 1"))
    assert g[P.EntryExited] == P.EntryExited(4, *ended, "error", None)
    killed = {**GOOD[P.EntryExited], "status": "killed", "ended_by": "operator"}
    assert P.EntryExited.parse(killed) == P.EntryExited(4, *ended, "killed", "operator")
    assert g[P.EntryFailed] == P.EntryFailed(5, shown("nosuch"), None, None, shown("not found"))
    assert g[P.EntryInterrupted] == P.EntryInterrupted(6, shown("sleep"), None, -15, shown("agent stopped"))
    assert g[P.Output] == P.Output(4)
    assert g[P.PauseStarted].at.value == 5.0 and g[P.PauseStarted].duration.value == 2.5
    assert g[P.PauseEnded] == P.PauseEnded(7)
    assert g[P.BreakStarted].at.value == 12.0 and g[P.BreakStarted].index == 8
    assert g[P.ResumeReceived] == P.ResumeReceived(8, P.Number(19.5, js("19.5")), False, shown("ok"))
    res = g[P.Result]
    assert (res.answers, res.ok, res.details) == ("sched-1", True, "schedule accepted")
    assert res.data == GOOD[P.Result]
    hello = g[P.Hello]
    assert (hello.supported, hello.protocol, hello.vm, hello.vm_given, hello.agent_version) == (
        True,
        "",
        "vm1",
        True,
        "0.1.0",
    )
    assert (hello.boot_id, hello.unacked, hello.journal_digest) == ("b-1", 3, "d" * 64)
    assert hello.journal_configured_at == T0 + 3.5
    assert g[P.Ack] == P.Ack(("host-1", "host-2"))
    assert g[P.ClockReq] == P.ClockReq(T0 + 1.25)
    assert g[P.HostEntryRequest] == P.HostEntryRequest(4, T0 + 30.5)


def test_integers_floats_and_bools_follow_the_consumers_rules() -> None:
    assert P.Output.parse({"index": True}).index is None  # a bool is not an index
    assert P.Output.parse({"index": 2.0}).index is None  # nor is a float
    assert P.Output.parse({"index": HUGE_INT}).index == HUGE_INT  # an integer, however large
    assert P.Configured.parse({"at": True}).at is None
    assert P.Configured.parse({"at": 3}).at == 3.0 and type(P.Configured.parse({"at": 3}).at) is float
    assert P.AgentStarted.parse({"resumed_from_journal": "yes"}).resumed_from_journal  # any true value
    assert P.ResumeReceived.parse({"ignored": 1}).ignored is False  # only JSON true
    assert P.EntryExited.parse({"status": ["error"]}).status is None


def test_shown_values_keep_what_the_guest_sent() -> None:
    details = P.VmFailed.parse({"details": {"nested": ["x" * 5000]}}).details
    assert not details.is_string and details.string is None and not details.missing
    assert details.text == json.dumps({"nested": ["x" * 5000]})[: P.MAX_JSON_TEXT]
    assert P.VmFailed.parse({}).details == P.Shown("null", False) and P.VmFailed.parse({}).details.missing
    assert P.VmFailed.parse({"details": None}).details.missing
    assert not P.VmFailed.parse({"details": "null"}).details.missing  # the string "null" was sent
    nan = P.BreakStarted.parse({"at": float("nan")}).at
    assert nan.value is None and nan.shown == P.Shown("NaN", False)
    assert P.BreakStarted.parse({"at": "-inf"}).at == P.Number(None, shown("-inf"))


def test_hello_rules() -> None:
    assert P.Hello.parse({"protocol": 1.0}).supported
    odd = P.Hello.parse({"protocol": "2", "vm": 5, "journal": [1], "unacked": False})
    assert not odd.supported and odd.protocol == "'2'"
    assert odd.vm is None and odd.vm_given  # a vm that is not a string was still claimed
    assert odd.journal_digest is None and odd.journal_configured_at is None and odd.unacked is None
    assert not P.Hello.parse({"protocol": 1, "vm": None}).vm_given
    assert P.Hello.parse({}).protocol == "None"
    with pytest.raises(PayloadError) as err:
        P.Hello.parse({"protocol": 1, "journal": {"configured_at": HUGE_INT}})
    assert err.value.field == "journal.configured_at"
    inf = P.Hello.parse({"protocol": 1, "journal": {"configured_at": float("inf")}})
    assert inf.journal_configured_at is None


def test_ack_and_result_rules() -> None:
    assert P.Ack.parse({"ids": ["a", 1, None, "b", ["c"]]}).ids == ("a", "b")
    res = P.Result.parse({"answers": "r-1", "status": "error", "details": ["no"], "ended_break": 3})
    assert not res.ok and res.details is None and res.data["ended_break"] == 3
    assert not P.Result.parse({"answers": "r-1"}).ok
    with pytest.raises(PayloadError, match="malformed result event: 'answers' must be a string, got int"):
        P.Result.parse({"answers": 5})
    with pytest.raises(PayloadError, match="malformed ack event: 'ids' must be a list, got str"):
        P.Ack.parse({"ids": "a"})


# ------------------------------------------------------------------------------ the host
def test_vmstate_raises_on_a_malformed_report_after_noting_it_was_seen() -> None:
    state = VmState("vm1", "d", "sched-1", FakeExperiment())  # type: ignore[arg-type]
    with pytest.raises(PayloadError):
        state.apply(Event("entry_started", T0, "e1", {"lateness": HUGE_INT}), T0 + 1)
    assert state.last_seen == T0 + 1 and state.max_lateness is None
    state.apply(Event("entry_started", T0, "e2", {"lateness": "late"}), T0 + 2)  # a field ignored
    state.apply(Event("output", T0, "e3", {"index": HUGE_INT, "seq": float("nan")}), T0 + 3)  # not read
    state.apply(Event("entry_started", T0, "e4", {"lateness": 0.5}), T0 + 4)
    assert (state.last_seen, state.max_lateness) == (T0 + 4, 0.5)


class _Link:
    closed = False

    def __init__(self) -> None:
        self.sent: List[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


ONE_ENTRY = b"- {start_time: 1, executable: /bin/true}\n"


def test_a_malformed_report_from_a_vm_is_stored_counted_and_not_applied(tmp_path: Path) -> None:
    session = make_session(tmp_path, ONE_ENTRY, Limits())
    link = _Link()
    assert session.attach(link, T0)  # type: ignore[arg-type]
    reports = [
        Event("entry_started", T0, "a-1", {"index": 0, "lateness": HUGE_INT}),
        Event("entry_exited", T0 + 1, "a-2", {"index": 0, "status": "error", "duration": HUGE_INT}),
        Event("result", T0 + 2, "a-3", {"answers": 7, "status": "success"}),
        Event("entry_started", T0 + 3, "a-4", {"index": 1, "lateness": 0.25, "spawned_at": "x"}),
    ]
    session.feed(encode_message(reports, T0 + 3), T0 + 4)
    status = session.status(None, T0 + 5)
    assert status["refused"]["malformed_payloads"] == 3
    assert status["events"]["stored"] == 4  # kept in the log as received
    assert status["max_lateness"] == 0.25 and status["failures"] == 0  # only the good one applied
    assert status["last_seen"] == T0 + 4
    acked = [e for frame in link.sent for e in _events(frame) if e["type"] == "ack"]
    assert sorted(i for e in acked for i in e["data"]["ids"]) == ["a-1", "a-2", "a-3", "a-4"]
    log = (tmp_path / "vm1.log").read_text()
    assert "malformed entry_started event: 'lateness' is a number no float can hold: dropped" in log
    assert "'answers' must be a string, got int" in log
    session.log.close()

    # a restarted host replays the log: no crash, the same state
    again = make_session(tmp_path, ONE_ENTRY, Limits())
    replayed = again.status(None, T0 + 5)
    assert replayed["refused"]["malformed_payloads"] == 3
    assert replayed["max_lateness"] == 0.25 and replayed["failures"] == 0
    again.log.close()


def test_a_report_nested_too_deep_to_store_is_kept_as_a_placeholder_and_acked(tmp_path: Path) -> None:
    # it passed the decoder but could not be written, so it was never acknowledged and an honest
    # agent would resend it forever
    deep: Any = "bottom"
    for _ in range(600):
        deep = [deep]
    session = make_session(tmp_path, ONE_ENTRY, Limits())
    link = _Link()
    assert session.attach(link, T0)  # type: ignore[arg-type]
    reports = [
        Event("entry_started", T0, "d-1", {"index": 0, "executable": deep, "lateness": 0.5}),
        Event("output", T0, "d-2", {"index": 0, "line": deep}),
    ]
    # a hostile agent writes the bytes itself (our own encoder would refuse such nesting)
    frame = encode_raw_message([(T0, json.dumps(e.to_dict()).encode()) for e in reports], T0)
    for attempt in range(2):  # the agent's resend is a duplicate: acked again, stored once
        session.feed(frame, T0 + 1 + attempt)
    acked = [i for frame in link.sent for e in _events(frame) if e["type"] == "ack" for i in e["data"]["ids"]]
    assert acked == ["d-1", "d-2", "d-1", "d-2"]
    status = session.status(None, T0 + 5)
    assert status["refused"]["unstorable"] == 2
    assert status["events"]["stored"] == 2 and status["events"]["duplicates"] == 2
    lines = [json.loads(x) for x in (tmp_path / "vm1.jsonl").read_text().splitlines()]
    assert [r["event"]["id"] for r in lines] == ["d-1", "d-2"]
    assert "nested too deep" in lines[0]["event"]["data"]["unstorable"]
    session.log.close()
    again = make_session(tmp_path, ONE_ENTRY, Limits())  # the placeholders replay without a crash
    assert again.log.seen("d-1") and again.log.seen("d-2")
    again.log.close()


def test_malformed_control_events_are_counted_like_reports(tmp_path: Path) -> None:
    session = make_session(tmp_path, ONE_ENTRY, Limits())
    assert session.attach(_Link(), T0)  # type: ignore[arg-type]
    events = [
        Event("ack", T0, "c-1", {"ids": "start"}),
        Event("clock_req", T0, "c-2", {"t1": HUGE_INT}),
        Event("clock_req", T0, "c-3", {"t1": "soon"}),  # counted as before: a protocol error
        Event("hello", T0, "c-4", {"protocol": 1, "journal": {"configured_at": HUGE_INT}}),
    ]
    session.feed(encode_message(events, T0), T0 + 1)
    refused = session.status(None, T0 + 2)["refused"]
    assert (refused["malformed_payloads"], refused["protocol_errors"]) == (3, 1)
    assert session.handshakes == 0
    session.log.close()


def _events(frame: bytes) -> List[Dict[str, Any]]:
    return [e for line in frame.splitlines() if line.strip() for e in json.loads(line)["events"]]
