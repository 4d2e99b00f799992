"""Typed payloads of the events that consumers read, parsed in one place (``docs/events.md``).

An :class:`~vmr_handler.core.events.Event`'s ``data`` comes from a guest, which may be hostile:
any field may be missing, of the wrong type, NaN/inf or huge. Each class below holds the part of
one event type's ``data`` that a consumer reads (the host's ``VmState`` and session, the
report's fold), and its ``parse(data)`` applies the rules every consumer needs:

* a number is an int or a float, not a bool, and finite: NaN, inf or a non-number is None
  (the field is ignored, the event is not);
* an integer is an int, not a bool (else None); a flag is any true value (``ignored``: only
  JSON true);
* a string is kept whole (the frame limit bounds it): a consumer cuts it where it shows it;
* a value a consumer only shows (``details``, ``executable``...) may be any JSON value: a
  :class:`Shown` (a :class:`Number` when it is shown as a number);
* fields nobody reads and extra fields are ignored.

An event is malformed (:class:`~vmr_handler.core.errors.PayloadError`, naming the event type,
the field and what is wrong) when its ``data`` is not an object, a number field holds a number
no float can hold (an integer beyond 1.8e308), a value has no JSON text, a ``result``
has no string ``answers`` or an ``ack`` no ``ids`` list. The consumer counts it and drops it.

:func:`parse_payload` parses an event; :data:`PAYLOADS` maps an event type to its class.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Tuple, Type, TypeVar, get_type_hints

from vmr_handler.core.errors import PayloadError
from vmr_handler.core.events import Event
from vmr_handler.core.events import EventType as T
from vmr_handler.core.wire.protocol import ACK, CLOCK_REQ, HELLO, HOST_ENTRY, PROTOCOL_VERSION, RESULT

#: The JSON text of a value that is not a string is cut to this many characters (consumers
#: show at most 80 characters of it).
MAX_JSON_TEXT = 1000

_P = TypeVar("_P", bound="Payload")


@dataclass(frozen=True)
class Shown:
    """A guest value that consumers only show: any JSON value (guests are hostile).

    Attributes:
        text: the string itself when the guest sent a string (whole), else the value's JSON
            text (``json.dumps(value, default=str)``, ``null`` when absent) cut to
            :data:`MAX_JSON_TEXT` characters.
        is_string: whether the guest sent a string.
    """

    text: str
    is_string: bool

    @property
    def string(self) -> Optional[str]:
        """The string the guest sent, or None when it sent anything else."""
        return self.text if self.is_string else None

    @property
    def missing(self) -> bool:
        """True when the field was absent or null."""
        return not self.is_string and self.text == "null"


_NULL = Shown("null", False)


@dataclass(frozen=True)
class Number:
    """A guest value shown as a number (``at``, ``duration``, a stage's ``start_time``).

    Attributes:
        value: the value when it is a finite number (float), else None.
        shown: what the guest sent (for showing a value that is not a finite number).
    """

    value: Optional[float]
    shown: Shown


class _Fields:
    """Reads one event's ``data`` by the rules of this module; errors name the type and field."""

    __slots__ = ("data", "prefix", "type")

    def __init__(self, event_type: str, data: Any, prefix: str = "") -> None:
        if type(data) is not dict and not isinstance(data, Mapping):
            raise PayloadError(
                event_type, prefix.rstrip(".") or "data", f"must be an object, got {type(data).__name__}"
            )
        self.type = event_type
        self.data: Mapping[str, Any] = data
        self.prefix = prefix

    def fail(self, name: str, problem: str) -> PayloadError:
        return PayloadError(self.type, self.prefix + name, problem)

    def integer(self, name: str) -> Optional[int]:
        value = self.data.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def finite(self, name: str) -> Optional[float]:
        value = self.data.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        try:
            number = float(value)
        except OverflowError:
            raise self.fail(name, "is a number no float can hold") from None
        return number if math.isfinite(number) else None

    def shown(self, name: str) -> Shown:
        value = self.data.get(name)
        if isinstance(value, str):
            return Shown(value, True)
        if value is None:
            return _NULL
        try:
            text = json.dumps(value, default=str)
        except (ValueError, TypeError, RecursionError) as exc:
            raise self.fail(name, f"has no JSON text ({type(exc).__name__})") from None
        return Shown(text[:MAX_JSON_TEXT], False)

    def number(self, name: str) -> Number:
        return Number(self.finite(name), self.shown(name))

    def string(self, name: str) -> Optional[str]:
        value = self.data.get(name)
        return value if isinstance(value, str) else None

    def given(self, name: str) -> bool:
        return self.data.get(name) is not None

    def truthy(self, name: str) -> bool:
        return bool(self.data.get(name))

    def is_true(self, name: str) -> bool:
        return self.data.get(name) is True

    def nested(self, name: str) -> _Fields:
        """The object ``name`` (an empty one when it is not an object)."""
        value = self.data.get(name)
        return _Fields(self.type, value if isinstance(value, Mapping) else {}, f"{self.prefix}{name}.")


_Rule = Callable[[_Fields, str], Any]

#: A payload field's type -> the rule that reads it (a field's ``metadata`` may name another
#: ``rule`` and the data member it is read from, ``key``; by default the field's name).
_RULES: Dict[Any, _Rule] = {
    Optional[int]: _Fields.integer,
    Optional[float]: _Fields.finite,
    Optional[str]: _Fields.string,
    Shown: _Fields.shown,
    Number: _Fields.number,
    bool: _Fields.truthy,
}


@dataclass(frozen=True)
class Payload:
    """Base of every typed payload; ``TYPE`` is the event type it is parsed from. Each field
    is read from ``data`` by the rule of its type (:data:`_RULES`)."""

    TYPE: ClassVar[str] = ""
    _PLAN: ClassVar[Optional[Tuple[Tuple[_Rule, str], ...]]] = None

    @classmethod
    def parse(cls: Type[_P], data: Mapping[str, Any]) -> _P:
        """``data`` of a ``TYPE`` event as this class (rules: the module's docstring).

        Raises:
            PayloadError: the data is malformed (naming the event type, field and problem).
        """
        f = _Fields(cls.TYPE, data)
        plan = cls.__dict__.get("_PLAN")
        if plan is None:
            return cls._read(f)
        return cls(*[rule(f, key) for rule, key in plan])

    @classmethod
    def _read(cls: Type[_P], f: _Fields) -> _P:
        """The first parse of a class without a reader of its own: make its plan (each field's
        rule and data member, from its type and metadata), then read by it."""
        hints = get_type_hints(cls)
        cls._PLAN = plan = tuple(
            (d.metadata.get("rule") or _RULES[hints[d.name]], d.metadata.get("key", d.name))
            for d in fields(cls)
        )
        return cls(*[rule(f, key) for rule, key in plan])


# ---------------------------------------------------------------------------- agent lifecycle
@dataclass(frozen=True)
class AgentStarted(Payload):
    """``agent_started``: ``resumed_from_journal`` (any true value counts)."""

    TYPE = T.AGENT_STARTED.value
    resumed_from_journal: bool


@dataclass(frozen=True)
class VmFailed(Payload):
    """``vm_failed``: the entry ``index`` (None when not an integer) and its ``details``."""

    TYPE = T.VM_FAILED.value
    index: Optional[int]
    details: Shown


@dataclass(frozen=True)
class ControlRefused(Payload):
    """``control_refused``: the refused message's type (``type``) and ``details``."""

    TYPE = T.CONTROL_REFUSED.value
    refused_type: Shown = field(metadata={"key": "type"})
    details: Shown


@dataclass(frozen=True)
class ScheduleComplete(Payload):
    """``schedule_complete``: ``status`` and the entry counts (None when an agent sends none)."""

    TYPE = T.SCHEDULE_COMPLETE.value
    status: Optional[str]
    ran: Optional[int]
    exited_nonzero: Optional[int]
    not_started: Optional[int]


# ---------------------------------------------------------------------------- stages and barrier
@dataclass(frozen=True)
class StageStarted(Payload):
    """``stage_started``: ``stage`` as an integer (None when not one) and as sent
    (``stage_shown``), its ``start_time`` (schedule seconds)."""

    TYPE = T.STAGE_STARTED.value
    stage: Optional[int]
    stage_shown: Shown = field(metadata={"key": "stage"})
    start_time: Number


@dataclass(frozen=True)
class StageFinished(Payload):
    """``stage_finished``: ``stage`` as sent, its ``start_time``, ``duration`` (s, finite or None)."""

    TYPE = T.STAGE_FINISHED.value
    stage_shown: Shown = field(metadata={"key": "stage"})
    start_time: Number
    duration: Optional[float]


@dataclass(frozen=True)
class RebootRequested(Payload):
    """``reboot_requested``: the ``requesters`` (shown only)."""

    TYPE = T.REBOOT_REQUESTED.value
    requesters: Shown


@dataclass(frozen=True)
class Configured(Payload):
    """``configured``: ``at`` (UTC, finite or None)."""

    TYPE = T.CONFIGURED.value
    at: Optional[float]


@dataclass(frozen=True)
class StartTimeSet(Payload):
    """``start_time_set``: ``start_time`` (UTC, finite or None)."""

    TYPE = T.START_TIME_SET.value
    start_time: Optional[float]


@dataclass(frozen=True)
class ExperimentStarted(Payload):
    """``experiment_started`` (no field is read)."""

    TYPE = T.EXPERIMENT_STARTED.value


# ---------------------------------------------------------------------------- entries
@dataclass(frozen=True)
class EntryStarted(Payload):
    """``entry_started``: ``index`` (None when not an integer), ``executable`` (shown), and as
    finite numbers or None: ``spawned_at``, ``scheduled`` (UTC), ``start_time`` (schedule
    seconds), ``lateness`` (s)."""

    TYPE = T.ENTRY_STARTED.value
    index: Optional[int]
    executable: Shown
    spawned_at: Optional[float]
    scheduled: Optional[float]
    start_time: Optional[float]
    lateness: Optional[float]


@dataclass(frozen=True)
class EntryEnded(Payload):
    """What ``entry_exited``, ``entry_failed`` and ``entry_interrupted`` share: ``index``,
    ``executable`` and ``details`` (shown), ``duration`` (s, finite or None), ``exit_code``
    (an integer or None)."""

    index: Optional[int]
    executable: Shown
    duration: Optional[float]
    exit_code: Optional[int]
    details: Shown


@dataclass(frozen=True)
class EntryExited(EntryEnded):
    """``entry_exited``: :class:`EntryEnded`, ``status``, ``ended_by`` (strings or None)."""

    TYPE = T.ENTRY_EXITED.value
    status: Optional[str]
    ended_by: Optional[str]


@dataclass(frozen=True)
class EntryFailed(EntryEnded):
    """``entry_failed``: :class:`EntryEnded`."""

    TYPE = T.ENTRY_FAILED.value


@dataclass(frozen=True)
class EntryInterrupted(EntryEnded):
    """``entry_interrupted``: :class:`EntryEnded`."""

    TYPE = T.ENTRY_INTERRUPTED.value


@dataclass(frozen=True)
class Output(Payload):
    """``output``: the entry ``index`` (None when not an integer); the line is not read."""

    TYPE = T.OUTPUT.value
    index: Optional[int]


# ---------------------------------------------------------------------------- pause, break, RESUME
@dataclass(frozen=True)
class PauseStarted(Payload):
    """``pause_started``: ``index``, ``at`` (experiment seconds) and ``duration`` (s)."""

    TYPE = T.PAUSE_STARTED.value
    index: Optional[int]
    at: Number
    duration: Number


@dataclass(frozen=True)
class PauseEnded(Payload):
    """``pause_ended``: ``index`` (None when not an integer)."""

    TYPE = T.PAUSE_ENDED.value
    index: Optional[int]


@dataclass(frozen=True)
class BreakStarted(Payload):
    """``break_started``: ``index`` and ``at`` (experiment seconds)."""

    TYPE = T.BREAK_STARTED.value
    index: Optional[int]
    at: Number


@dataclass(frozen=True)
class ResumeReceived(Payload):
    """``resume_received``: ``ended_break`` (an integer or None), ``at`` (the RESUME's
    experiment seconds), ``ignored`` (True only for JSON true), ``details`` (shown)."""

    TYPE = T.RESUME_RECEIVED.value
    ended_break: Optional[int]
    at: Number
    ignored: bool = field(metadata={"rule": _Fields.is_true})
    details: Shown


# ---------------------------------------------------------------------------- measurements
#: Shortest KPI interval, seconds (a shorter one would flood the outbox); 0 means off.
MIN_KPI_INTERVAL = 0.1
#: Network interfaces a ``kpi`` sample carries (the agent sends at most these; a consumer
#: keeps at most these of what a guest sends).
MAX_KPI_INTERFACES = 32
#: Each interface's rates in a ``kpi`` sample (per second since the previous sample).
KPI_NET_FIELDS = ("bytes_sent", "bytes_recv", "packets_sent", "packets_recv")
#: The ``kpi`` fields read as plain numbers (besides ``cpu_percent`` and ``load``).
KPI_NUMBERS = (
    "mem_used", "mem_available", "mem_total", "disk_used", "disk_total",
    "disk_read_rate", "disk_write_rate", "interval", "duration",
)  # fmt: skip


@dataclass(frozen=True)
class Kpi(Payload):
    """``kpi``: one sample of the VM's key performance indicators.

    Every number is finite or None: ``cpu_percent`` (of all cores, 0-100), ``load_1``,
    ``load_5``, ``load_15`` (the members of ``load``), ``mem_*`` and ``disk_used``/``disk_total``
    (bytes), ``disk_read_rate``/``disk_write_rate`` (bytes/s), ``interval`` and ``duration`` (s).
    ``net``: interface name (whole) -> ``{field: finite or None}`` for :data:`KPI_NET_FIELDS`
    (per second), the first :data:`MAX_KPI_INTERFACES` interfaces that are objects.
    """

    TYPE = T.KPI.value
    cpu_percent: Optional[float]
    load_1: Optional[float]
    load_5: Optional[float]
    load_15: Optional[float]
    mem_used: Optional[float]
    mem_available: Optional[float]
    mem_total: Optional[float]
    disk_used: Optional[float]
    disk_total: Optional[float]
    disk_read_rate: Optional[float]
    disk_write_rate: Optional[float]
    interval: Optional[float]
    duration: Optional[float]
    net: Mapping[str, Any]

    @classmethod
    def _read(cls, f: _Fields) -> Kpi:
        load = f.data.get("load")
        loads = _Fields(
            cls.TYPE, {str(i): v for i, v in enumerate(load[:3])} if isinstance(load, list) else {}, "load."
        )
        net = f.data.get("net")
        interfaces: Dict[str, Dict[str, Optional[float]]] = {}
        for name, rates in net.items() if isinstance(net, Mapping) else ():
            if len(interfaces) == MAX_KPI_INTERFACES:
                break
            if isinstance(name, str) and isinstance(rates, Mapping):
                one = _Fields(cls.TYPE, rates, f"net.{name[:64]}.")
                interfaces[name] = {k: one.finite(k) for k in KPI_NET_FIELDS}
        numbers = {k: f.finite(k) for k in KPI_NUMBERS}
        return cls(cpu_percent=f.finite("cpu_percent"), load_1=loads.finite("0"), load_5=loads.finite("1"),
                   load_15=loads.finite("2"), net=interfaces, **numbers)  # fmt: skip


# ---------------------------------------------------------------------------- protocol (docs/protocol.md)
@dataclass(frozen=True)
class Result(Payload):
    """``result`` (agent -> host): ``answers`` (the id of the request answered: required),
    ``ok`` (``status`` is ``success``), ``details`` (the string sent, else None), and ``data``:
    the whole data, handed unchanged to the host's ``on_resume_answer`` (which records what the
    VM answered a RESUME as sent)."""

    TYPE = RESULT
    answers: str
    ok: bool
    details: Optional[str]
    data: Mapping[str, Any]

    @classmethod
    def _read(cls, f: _Fields) -> Result:
        answers = f.data.get("answers")
        if not isinstance(answers, str):
            raise f.fail("answers", f"must be a string, got {type(answers).__name__}")
        return cls(answers, f.data.get("status") == "success", f.string("details"), f.data)


@dataclass(frozen=True)
class Hello(Payload):
    """``hello`` (agent -> host), what the agent says of itself.

    Attributes:
        supported: ``protocol`` equals :data:`~vmr_handler.core.wire.protocol.PROTOCOL_VERSION`.
        protocol: the ``repr`` of the ``protocol`` sent when not supported (for the refusal).
        vm: the VM name it claims (whole), None when not a string; vm_given: ``vm`` not null.
        agent_version, boot_id: strings or None. unacked: an integer or None.
        journal_digest, journal_configured_at, journal_start_time: ``journal.digest`` (a string
            or None), ``journal.configured_at`` and ``journal.start_time`` (finite or None).
        expects_signed: ``signed`` is true: the agent has a host public key and takes only
            signed control messages (an older agent sends no ``signed``).
        connection: the agent's id of its connection, in each hello on it (None: older agent).
        heartbeats: False when ``heartbeats`` is false (its transport tells liveness), else True.
    """

    TYPE = HELLO
    supported: bool
    protocol: str
    vm: Optional[str]
    vm_given: bool
    agent_version: Optional[str]
    boot_id: Optional[str]
    unacked: Optional[int]
    journal_digest: Optional[str]
    journal_configured_at: Optional[float]
    expects_signed: bool
    journal_start_time: Optional[float]
    connection: Optional[str]
    heartbeats: bool

    @classmethod
    def _read(cls, f: _Fields) -> Hello:
        sent = f.data.get("protocol")
        supported = sent == PROTOCOL_VERSION
        try:
            protocol = "" if supported else repr(sent)
        except RecursionError:
            raise f.fail("protocol", "is nested too deep") from None
        journal = f.nested("journal")
        return cls(
            supported,
            protocol,
            f.string("vm"),
            f.given("vm"),
            f.string("agent_version"),
            f.string("boot_id"),
            f.integer("unacked"),
            journal.string("digest"),
            journal.finite("configured_at"),
            f.data.get("signed") is True,
            journal.finite("start_time"), f.string("connection"), f.data.get("heartbeats") is not False,
        )  # fmt: skip


@dataclass(frozen=True)
class Ack(Payload):
    """``ack``: the string ``ids`` acknowledged (required: a list; other members are skipped)."""

    TYPE = ACK
    ids: Tuple[str, ...]

    @classmethod
    def _read(cls, f: _Fields) -> Ack:
        ids = f.data.get("ids")
        if not isinstance(ids, list):
            raise f.fail("ids", f"must be a list, got {type(ids).__name__}")
        return cls(tuple(i for i in ids if isinstance(i, str)))


@dataclass(frozen=True)
class ClockReq(Payload):
    """``clock_req``: ``t1`` (the agent's send time, UTC; None when not a finite number)."""

    TYPE = CLOCK_REQ
    t1: Optional[float]


@dataclass(frozen=True)
class HostEntryRequest(Payload):
    """``host_entry``: the on_host entry ``index`` to run (an integer or None) and
    ``scheduled``, the host UTC it was due (finite or None: in a negative stage)."""

    TYPE = HOST_ENTRY
    index: Optional[int]
    scheduled: Optional[float]


#: Event type -> its payload class (every type a consumer reads).
PAYLOADS: Dict[str, Type[Payload]] = {
    cls.TYPE: cls
    for cls in (
        AgentStarted,
        VmFailed,
        ControlRefused,
        ScheduleComplete,
        StageStarted,
        StageFinished,
        RebootRequested,
        Configured,
        StartTimeSet,
        ExperimentStarted,
        EntryStarted,
        EntryExited,
        EntryFailed,
        EntryInterrupted,
        Output,
        PauseStarted,
        PauseEnded,
        BreakStarted,
        ResumeReceived,
        Kpi,
        Result,
        Hello,
        Ack,
        ClockReq,
        HostEntryRequest,
    )
}


def parse_payload(event: Event) -> Optional[Payload]:
    """``event``'s typed payload (of class ``PAYLOADS[event.type]``), None for a type none reads.

    Raises:
        PayloadError: its ``data`` is malformed (naming the event type, field and problem).
    """
    cls = PAYLOADS.get(event.type)
    return cls.parse(event.data) if cls is not None else None
