"""Folding host log records into per-VM facts (pure, no I/O).

:class:`ExperimentTimeline` takes host log records (``{"vm", "host_received", "event":
{"timestamp", "type", "id", "data"}}``, ``docs/host.md``) one at a time and keeps per VM a
:class:`VmTimeline`: spans, markers and counters, each entry run's command line and last
output lines (:data:`~vmr_handler.host.report.facts.TAIL_LINES`), and KPI series of bounded
length; and, through the host's one model of a VM
(:class:`~vmr_handler.host.model.vmstate.VmState`), its state word. Each event type the report
shows has one small handler method, found through the table :data:`_FOLD`, which takes the
event's typed payload (:mod:`vmr_handler.core.payloads`; the raw data of the event is at hand
for the two fields no payload reads: an entry's ``command``, an output ``line``).

Every guest is hostile (SPEC section 7): an event time further than :data:`MAX_SKEW` seconds
from the host's receive time is replaced by the receive time, at most :data:`MAX_ITEMS` spans and
markers of each kind are kept per VM (the rest are counted), odd shapes and malformed payloads
are counted as unreadable, never fatal.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

from vmr_handler.core.errors import PayloadError
from vmr_handler.core.payloads import (
    AgentStarted,
    BreakStarted,
    Configured,
    ControlRefused,
    EntryEnded,
    EntryExited,
    EntryFailed,
    EntryInterrupted,
    EntryStarted,
    Kpi,
    Number,
    Output,
    PauseEnded,
    PauseStarted,
    Payload,
    RebootRequested,
    Result,
    ResumeReceived,
    ScheduleComplete,
    Shown,
    StageFinished,
    StageStarted,
    StartTimeSet,
    VmFailed,
)
from vmr_handler.host.model.stateword import Presence, reported_word
from vmr_handler.host.model.vmstate import SCHEDULE_ANSWER, Untold, VmState, run_status
from vmr_handler.host.report.facts import COMMAND_CHARS, TAIL_CHARS, EntryRun, KpiSeries, Marker, Span
from vmr_handler.host.report.text import _MAPS, MAX_LABEL, _clean, _num, _num_text

#: Spans and markers of each kind kept per VM; beyond it they are only counted.
MAX_ITEMS = 5000
#: An event time further than this from its host receive time (s) is replaced by the latter.
MAX_SKEW = 86400.0
_P = TypeVar("_P", bound=Payload)


def _show(value: Shown, cap: int = MAX_LABEL) -> str:
    """What the guest sent as printable text of at most ``cap`` characters (as
    :func:`~vmr_handler.host.report.text._clean` makes it of the value itself)."""
    return _clean(value.text if value.is_string else value.text[: cap + 1], cap)


def _show_number(value: Number) -> str:
    """A stage or entry start time as written in a schedule (``-20``, ``1.5``, ``?``), as
    :func:`~vmr_handler.host.report.text._num_text` makes it of the value itself."""
    if value.value is None and not value.shown.missing:
        return _show(value.shown, 20)
    return _num_text(value.value)


def _index(index: Optional[int]) -> int:
    """An entry index; -1 when the event has none."""
    return index if index is not None else -1


@dataclass
class VmTimeline:
    """Everything the report shows of one VM, folded from its log records.

    Attributes:
        name: the VM name (its log file's name).
        events: records folded. unreadable: records without a usable event.
        first, last: earliest and latest event time (UTC), None with no events.
        last_seen: latest host receive time (UTC).
        configured_at: when the VM reported ``configured`` (its ``at``, UTC).
        vm_start: the start time this VM reported (``start_time_set``), UTC.
        output_lines: output lines of all entries (counted; each run keeps its last few).
        refused: control messages the VM refused. restarts: agent restarts.
        rejection: why the VM refused its schedule ("" when it did not).
        model: the same reports folded by the host's one model of a VM
            (:class:`~vmr_handler.host.model.vmstate.VmState`): :meth:`word`, :attr:`failures`
            and :attr:`rejected` read it, so the report says what ``vmr-host status`` says.
        cpu, mem: the VM's ``kpi`` samples, CPU % (of all cores) and memory used % (of
            ``mem_total``), for sparklines.
        dropped: spans/markers over :data:`MAX_ITEMS`, counted only.
    """

    name: str
    events: int = 0
    unreadable: int = 0
    first: Optional[float] = None
    last: Optional[float] = None
    last_seen: Optional[float] = None
    configured_at: Optional[float] = None
    vm_start: Optional[float] = None
    stages: List[Span] = field(default_factory=list)
    pauses: List[Span] = field(default_factory=list)
    breaks: List[Span] = field(default_factory=list)
    runs: List[EntryRun] = field(default_factory=list)
    markers: List[Marker] = field(default_factory=list)
    output_lines: int = 0
    refused: int = 0
    restarts: int = 0
    rejection: str = ""
    cpu: KpiSeries = field(default_factory=KpiSeries)
    mem: KpiSeries = field(default_factory=KpiSeries)
    dropped: int = 0
    model: VmState = field(init=False, repr=False)
    _open_stage: Dict[Any, Span] = field(default_factory=dict, repr=False)
    _open_pause: Dict[Any, Span] = field(default_factory=dict, repr=False)
    _open_break: Dict[Any, Span] = field(default_factory=dict, repr=False)
    #: break index -> UTC of the RESUME that ended it before its ``break_started`` came (an
    #: agent older than the order "break, then its RESUME"): that break is drawn ended
    _resumed_first: Dict[Any, float] = field(default_factory=dict, repr=False)
    #: stored RESUME entry index -> (UTC it was applied, the break it ended or None: ignored)
    stored_resumes: Dict[int, Tuple[float, Optional[int]]] = field(default_factory=dict, repr=False)
    _open_run: Dict[int, EntryRun] = field(default_factory=dict, repr=False)
    _last_run: Dict[int, EntryRun] = field(default_factory=dict, repr=False)
    _agent_seen: bool = field(default=False, repr=False)
    #: the raw ``data`` of the event being folded, for the fields no payload reads (an
    #: entry's ``command``, an output ``line``)
    _data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.model = VmState(self.name, "", None, Untold())

    @property
    def failures(self) -> int:
        """Failed entries (docs/host.md, "Terms"): runs that exited non-zero or could not run."""
        return self.model.failures

    @property
    def rejected(self) -> bool:
        """The VM's last answer to its schedule was a refusal (:attr:`rejection`: why)."""
        return self.model.schedule_state == "rejected"

    def word(self, start_time: Optional[float], now: Optional[float] = None) -> str:
        """The VM's state word (:data:`~vmr_handler.host.model.stateword.STATES`) as its logs
        tell it at UTC ``now`` (default: its last event), the experiment starting at UTC
        ``start_time``: the rule of ``vmr-host status``
        (:func:`~vmr_handler.host.model.stateword.reported_word`) without liveness, which only
        the running host knows (its live words are passed to the views instead)."""
        at = now if now is not None else self.last
        presence = Presence(connected=False, ever=self.events > 0)
        return reported_word(self.model, start_time, at if at is not None else 0.0, presence)

    def latenesses(self) -> List[float]:
        """Lateness (s) of every run of a positive entry that reported one."""
        return [r.lateness for r in self.runs if r.positive and r.lateness is not None]

    def _keep(self, items: List[Any], item: Any) -> bool:
        if len(items) >= MAX_ITEMS:
            self.dropped += 1
            return False
        items.append(item)
        return True

    def _mark(self, kind: str, at: float, *tip: str) -> None:
        self._keep(self.markers, Marker(kind, at, list(tip)))

    def add(self, record: Mapping[str, Any]) -> None:
        """Fold one log record (``{"host_received", "event": {...}}``); never raises on odd data."""
        event = record.get("event")
        received = _num(record.get("host_received"))
        if not isinstance(event, _MAPS):
            self.unreadable += 1
            return
        kind = event.get("type")
        data = event.get("data")
        data = data if isinstance(data, _MAPS) else {}
        t = _num(event.get("timestamp"))
        if received is not None and (t is None or abs(t - received) > MAX_SKEW):
            t = received
        if t is None:
            self.unreadable += 1
            return
        self.events += 1
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)
        if received is not None:
            self.last_seen = received if self.last_seen is None else max(self.last_seen, received)
        if not isinstance(kind, str):
            return
        row = _FOLD.get(kind)
        if row is None:  # an event the report does not show: counted in ``events`` only
            return
        parser, handler = row
        try:
            payload = parser.parse(data)  # as parse_payload does, without making an Event
        except PayloadError:  # hostile shapes: counted, never fatal
            self.unreadable += 1
            return
        self._data = data
        if handler is not None:
            handler(self, t, payload)
        self.model.take(payload, received if received is not None else t)

    def _near(self, value: Optional[float], t: float) -> float:
        """``value`` (UTC) if it is within :data:`MAX_SKEW` of ``t``, else ``t``."""
        return value if value is not None and abs(value - t) <= MAX_SKEW else t

    # The handlers of :data:`_FOLD`: ``(t, payload)``, the event at UTC ``t``.
    def _on_agent_started(self, t: float, p: AgentStarted) -> None:
        if self._agent_seen:
            self.restarts += 1
            self._mark(
                "restart",
                t,
                "agent (re)started",
                "resumed from journal" if p.resumed_from_journal else "",
            )
        for span in self._open_stage.values():
            span.end = t
            span.tip.append("cut short: the agent restarted")
        self._open_stage.clear()
        self._agent_seen = True

    def _on_stage_started(self, t: float, p: StageStarted) -> None:
        key = _show(p.stage_shown, 20)
        st = _show_number(p.start_time)
        span = Span("stage", t, None, f"stage {st}", [f"stage {st} (#{key})"])
        if self._keep(self.stages, span):
            self._open_stage[key] = span

    def _on_stage_finished(self, t: float, p: StageFinished) -> None:
        key = _show(p.stage_shown, 20)
        span = self._open_stage.pop(key, None)
        if span is None:
            duration = p.duration or 0.0
            st = _show_number(p.start_time)
            span = Span("stage", t - min(max(duration, 0.0), MAX_SKEW), None, f"stage {st}", [f"stage {st}"])
            if not self._keep(self.stages, span):
                return
        span.end = t

    def _on_entry_started(self, t: float, p: EntryStarted) -> None:
        index = _index(p.index)
        old = self._open_run.pop(index, None)
        if old is not None:
            old.end, old.status = t, "interrupted"
        run = EntryRun(
            index,
            _show(p.executable),
            self._near(p.spawned_at, t),
            positive=p.scheduled is not None or (p.start_time or 0) > 0,
            lateness=p.lateness,
            command=_raw_text(self._data.get("command"), COMMAND_CHARS),
            scheduled=p.scheduled if p.scheduled is not None and abs(p.scheduled - t) <= MAX_SKEW else None,
        )
        if self._keep(self.runs, run):
            self._open_run[index] = run
            self._last_run[index] = run

    def _ended_run(self, t: float, p: EntryEnded) -> Optional[EntryRun]:
        """The run of entry ``p.index`` that ended at ``t`` (exited, failed or interrupted), with
        its end, exit code and details set; a run is made up when its start was not seen. None:
        over :data:`MAX_ITEMS`, not kept."""
        index = _index(p.index)
        run = self._open_run.pop(index, None)
        if run is None:
            duration = min(max(p.duration or 0.0, 0.0), MAX_SKEW)
            run = EntryRun(index, _show(p.executable), t - duration)
            if not self._keep(self.runs, run):
                return None
            self._last_run[index] = run
        run.end = max(t, run.start)
        run.exit_code = p.exit_code
        run.details = _show(p.details)
        return run

    def _on_entry_exited(self, t: float, p: EntryExited) -> None:
        status = run_status(p) or "error"
        run = self._ended_run(t, p)
        if run is not None:
            run.status = status

    def _on_entry_failed(self, t: float, p: EntryFailed) -> None:
        run = self._ended_run(t, p)
        if run is not None:
            run.status = "failed"

    def _on_entry_interrupted(self, t: float, p: EntryInterrupted) -> None:
        run = self._ended_run(t, p)
        if run is not None:
            run.status = "interrupted"

    def _on_output(self, t: float, p: Output) -> None:
        self.output_lines += 1
        last = self._last_run.get(_index(p.index))
        if last is not None:
            last.add_output(_output_line(self._data))

    def _on_reboot_requested(self, t: float, p: RebootRequested) -> None:
        self._mark("reboot", t, "reboot requested", f"requesters {_show(p.requesters)}")

    def _on_configured(self, t: float, p: Configured) -> None:
        self.configured_at = self._near(p.at, t)
        self._mark("configured", self.configured_at, "configured (time 0 reached on this VM)")

    def _on_start_time_set(self, t: float, p: StartTimeSet) -> None:
        start = p.start_time
        if start is not None and abs(start - t) <= MAX_SKEW:
            self.vm_start = start

    def _on_pause_started(self, t: float, p: PauseStarted) -> None:
        index = _index(p.index)
        if index in self._open_pause:
            return  # reported again after an agent restart: the first one stands
        at, dur = _show_number(p.at), _show_number(p.duration)
        tip = [f"pause at t={at} for {dur} s (entry #{index})"]
        span = Span("pause", t, None, f"pause {dur} s", tip, p.index)
        if self._keep(self.pauses, span):
            self._open_pause[index] = span

    def _on_break_started(self, t: float, p: BreakStarted) -> None:
        index = _index(p.index)
        if index in self._open_break:
            return  # reported again after an agent restart: the first one stands
        at = _show_number(p.at)
        tip = [f"break at t={at} (entry #{index})", "held until a RESUME"]
        span = Span("break", t, None, "break", tip, p.index)
        if index in self._resumed_first:  # its RESUME was reported first: over at once
            span.end = max(t, self._resumed_first.pop(index))
            span.tip.append("ended by a RESUME reported before it")
            self._keep(self.breaks, span)
        elif self._keep(self.breaks, span):
            self._open_break[index] = span

    def _on_pause_ended(self, t: float, p: PauseEnded) -> None:
        span = self._open_pause.pop(_index(p.index), None)
        if span is not None:
            span.end = t

    def _on_resume_received(self, t: float, p: ResumeReceived) -> None:
        brk = p.ended_break
        entry = self._data.get("index")
        if self._data.get("origin") == "schedule entry" and type(entry) is int:
            self.stored_resumes[entry] = (t, None if p.ignored else brk)
        span = self._open_break.pop(brk, None) if brk is not None else None
        if span is not None:
            span.end = t
            span.tip.append(f"ended by a RESUME stamped t={_show_number(p.at)}")
        elif brk is not None and not p.ignored:
            self._resumed_first[brk] = t
        if p.ignored or brk is None:
            self._mark("ignored", t, "RESUME ignored (no active break)", _show(p.details))
        else:
            self._mark("resume", t, f"RESUME received: ended break #{brk}", f"stamped t={_show_number(p.at)}")

    def _on_vm_failed(self, t: float, p: VmFailed) -> None:
        for span in self._open_stage.values():  # the stage ends where the VM failed
            span.end, span.kind = t, "failed stage"
            span.tip.append("ended here: the VM failed")
        self._open_stage.clear()
        self._mark("failed", t, f"VM failed (entry #{_index(p.index)})", _show(p.details))

    def _on_control_refused(self, t: float, p: ControlRefused) -> None:
        self.refused += 1
        self._mark(
            "refused",
            t,
            f"control message refused: {_show(p.refused_type, 30)}",
            _show(p.details),
        )

    def _on_result(self, t: float, p: Result) -> None:
        if p.answers.startswith(SCHEDULE_ANSWER):  # the VM's answer to its schedule
            self.rejection = _clean(p.details or "", MAX_LABEL) if not p.ok else ""
            if not p.ok:
                self._mark("rejected", t, "schedule rejected", self.rejection)

    def _on_kpi(self, t: float, p: KpiShown) -> None:
        if p.cpu_percent is not None:
            self.cpu.add(t, min(max(p.cpu_percent, 0.0), 100.0))
        if p.mem_used is not None and p.mem_total:
            self.mem.add(t, min(max(100.0 * p.mem_used / p.mem_total, 0.0), 100.0))


@dataclass(frozen=True)
class KpiShown(Payload):
    """The part of a ``kpi`` sample the report draws (CPU %, memory used and total), read by
    the rules of :mod:`vmr_handler.core.payloads` (whose :class:`~vmr_handler.core.payloads.Kpi`
    also reads load, disk and every network interface: three times the cost, for nothing
    shown here)."""

    TYPE = Kpi.TYPE
    cpu_percent: Optional[float]
    mem_used: Optional[float]
    mem_total: Optional[float]


def _raw_text(value: Any, cap: int) -> str:
    """A string field no payload reads, cleaned and cut to ``cap`` ("" when not a string)."""
    return _clean(value, cap) if isinstance(value, str) else ""


def _output_line(data: Mapping[str, Any]) -> str:
    """The line of an ``output`` event (``line``, or ``line_b64`` decoded with ``\\xNN`` for
    bytes that are not UTF-8), without its line end, cleaned and cut to :data:`TAIL_CHARS`."""
    line = data.get("line")
    if not isinstance(line, str):
        b64 = data.get("line_b64")
        try:
            raw = base64.b64decode(b64[: TAIL_CHARS * 8], validate=False) if isinstance(b64, str) else b""
        except (binascii.Error, ValueError):
            raw = b""
        line = raw.decode("utf-8", "backslashreplace")
    return _clean(line[: TAIL_CHARS * 4].rstrip("\r\n"), TAIL_CHARS)


_Fold = Callable[[VmTimeline, float, Any], None]


def _on(
    kind: Type[_P], fold: Optional[Callable[[VmTimeline, float, _P], None]]
) -> Tuple[str, Tuple[Type[Payload], Optional[_Fold]]]:
    """A row of :data:`_FOLD`: ``kind``'s event type, and its payload class with the method
    that folds it (None: only :attr:`VmTimeline.model` folds it)."""
    return kind.TYPE, (kind, fold)


#: Event type -> the payload class its data is parsed as, and the :class:`VmTimeline` method
#: that folds it ``(timeline, t, payload)``; the report ignores (and does not parse) every other
#: type.
_FOLD: Dict[str, Tuple[Type[Payload], Optional[_Fold]]] = dict(
    [
        _on(AgentStarted, VmTimeline._on_agent_started),
        _on(StageStarted, VmTimeline._on_stage_started),
        _on(StageFinished, VmTimeline._on_stage_finished),
        _on(EntryStarted, VmTimeline._on_entry_started),
        _on(EntryExited, VmTimeline._on_entry_exited),
        _on(EntryFailed, VmTimeline._on_entry_failed),
        _on(EntryInterrupted, VmTimeline._on_entry_interrupted),
        _on(Output, VmTimeline._on_output),
        _on(RebootRequested, VmTimeline._on_reboot_requested),
        _on(Configured, VmTimeline._on_configured),
        _on(StartTimeSet, VmTimeline._on_start_time_set),
        _on(PauseStarted, VmTimeline._on_pause_started),
        _on(BreakStarted, VmTimeline._on_break_started),
        _on(PauseEnded, VmTimeline._on_pause_ended),
        _on(ResumeReceived, VmTimeline._on_resume_received),
        _on(VmFailed, VmTimeline._on_vm_failed),
        _on(ControlRefused, VmTimeline._on_control_refused),
        _on(ScheduleComplete, None),
        _on(Result, VmTimeline._on_result),
        _on(KpiShown, VmTimeline._on_kpi),
    ]
)


class ExperimentTimeline:
    """Per-VM timelines folded from log records of any number of VMs (pure, no I/O).

    Records are folded one at a time (:meth:`add`), so a caller can stream logs of any size:
    only spans, markers and counters are kept.
    """

    def __init__(self) -> None:
        self.vms: Dict[str, VmTimeline] = {}

    def vm(self, name: str) -> VmTimeline:
        """The timeline of VM ``name`` (created empty: a VM with no events still gets a lane)."""
        name = _clean(name, 64)
        tl = self.vms.get(name)
        if tl is None:
            tl = self.vms[name] = VmTimeline(name)
        return tl

    def add(self, record: Mapping[str, Any]) -> None:
        """Fold one host log record; its ``vm`` names the lane (records without one are skipped)."""
        if isinstance(record, _MAPS) and isinstance(record.get("vm"), str):
            self.vm(record["vm"]).add(record)
