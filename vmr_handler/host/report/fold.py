"""Folding host log records into per-VM facts (pure, no I/O).

:class:`ExperimentTimeline` takes host log records (``{"vm", "host_received", "event":
{"timestamp", "type", "id", "data"}}``, ``docs/host.md``) one at a time and keeps per VM a
:class:`VmTimeline`: spans, markers and counters, never the output lines themselves. Each event
type the report shows has one small handler method, found through the table :data:`_FOLD`.

Every guest is hostile (SPEC section 7): an event time further than :data:`MAX_SKEW` seconds
from the host's receive time is replaced by the receive time, at most :data:`MAX_ITEMS` spans and
markers of each kind are kept per VM (the rest are counted), odd shapes are counted as
unreadable, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

from vmr_handler.core.events import EventType as T
from vmr_handler.host.report.facts import EntryRun, Marker, Span
from vmr_handler.host.report.text import _MAPS, _clean, _num, _num_text

#: Spans and markers of each kind kept per VM; beyond it they are only counted.
MAX_ITEMS = 5000
#: An event time further than this from its host receive time (s) is replaced by the latter.
MAX_SKEW = 86400.0


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
        output_lines: output lines of all entries (counted, never kept).
        failures: entry runs that exited non-zero or could not start (``vm_failed`` shows in
            ``state``). refused: control messages the VM refused. restarts: agent restarts.
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
    failures: int = 0
    refused: int = 0
    restarts: int = 0
    complete: bool = False
    failed: bool = False
    started: bool = False
    configuring: bool = False
    dropped: int = 0
    _open_stage: Dict[Any, Span] = field(default_factory=dict, repr=False)
    _open_pause: Dict[Any, Span] = field(default_factory=dict, repr=False)
    _open_break: Dict[Any, Span] = field(default_factory=dict, repr=False)
    _open_run: Dict[int, EntryRun] = field(default_factory=dict, repr=False)
    _last_run: Dict[int, EntryRun] = field(default_factory=dict, repr=False)
    _agent_seen: bool = field(default=False, repr=False)

    @property
    def state(self) -> str:
        """``failed``, ``complete``, ``running``, ``configured``, ``configuring``, ``seen`` or
        ``no events`` (the furthest the logs show; compare ``vmr-host status`` for live state)."""
        if self.failed:
            return "failed"
        if self.complete:
            return "complete"
        if self.started:
            return "running"
        if self.configured_at is not None:
            return "configured"
        if self.configuring:
            return "configuring"
        return "seen" if self.events else "no events"

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
        try:
            self._fold(kind, t, data)
        except (TypeError, ValueError, OverflowError):  # hostile shapes: counted, never fatal
            self.unreadable += 1

    def _near(self, value: Any, t: float) -> float:
        """``value`` (UTC) if it is a number within :data:`MAX_SKEW` of ``t``, else ``t``."""
        v = _num(value)
        return v if v is not None and abs(v - t) <= MAX_SKEW else t

    def _fold(self, kind: str, t: float, d: Mapping[str, Any]) -> None:
        """Fold one event of type ``kind`` at UTC ``t`` with data ``d`` (see :data:`_FOLD`)."""
        handler = _FOLD.get(kind)
        if handler is None:  # an event the report does not show: counted in ``events`` only
            return
        idx = d.get("index")
        handler(self, t, d, idx if isinstance(idx, int) and not isinstance(idx, bool) else -1)

    # The handlers of :data:`_FOLD`: ``(t, data, index)``, index -1 when the event has none.
    def _on_agent_started(self, t: float, d: Mapping[str, Any], index: int) -> None:
        if self._agent_seen:
            self.restarts += 1
            self._mark(
                "restart",
                t,
                "agent (re)started",
                "resumed from journal" if d.get("resumed_from_journal") else "",
            )
        for span in self._open_stage.values():
            span.end = t
            span.tip.append("cut short: the agent restarted")
        self._open_stage.clear()
        self._agent_seen = True

    def _on_stage_started(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self.configuring = True
        key = _clean(d.get("stage"), 20)
        st = _num_text(d.get("start_time"))
        span = Span("stage", t, None, f"stage {st}", [f"stage {st} (#{key})"])
        if self._keep(self.stages, span):
            self._open_stage[key] = span

    def _on_stage_finished(self, t: float, d: Mapping[str, Any], index: int) -> None:
        key = _clean(d.get("stage"), 20)
        span = self._open_stage.pop(key, None)
        if span is None:
            duration = _num(d.get("duration")) or 0.0
            st = _num_text(d.get("start_time"))
            span = Span("stage", t - min(max(duration, 0.0), MAX_SKEW), None, f"stage {st}", [f"stage {st}"])
            if not self._keep(self.stages, span):
                return
        span.end = t

    def _on_entry_started(self, t: float, d: Mapping[str, Any], index: int) -> None:
        old = self._open_run.pop(index, None)
        if old is not None:
            old.end, old.status = t, "interrupted"
        scheduled = _num(d.get("scheduled"))
        run = EntryRun(
            index,
            _clean(d.get("executable")),
            self._near(d.get("spawned_at"), t),
            positive=scheduled is not None or (_num(d.get("start_time")) or 0) > 0,
            lateness=_num(d.get("lateness")),
        )
        if self._keep(self.runs, run):
            self._open_run[index] = run
            self._last_run[index] = run

    def _ended_run(self, t: float, d: Mapping[str, Any], index: int) -> Optional[EntryRun]:
        """The run of entry ``index`` that ended at ``t`` (exited, failed or interrupted), with
        its end, exit code and details set; a run is made up when its start was not seen. None:
        over :data:`MAX_ITEMS`, not kept."""
        run = self._open_run.pop(index, None)
        if run is None:
            duration = min(max(_num(d.get("duration")) or 0.0, 0.0), MAX_SKEW)
            run = EntryRun(index, _clean(d.get("executable")), t - duration)
            if not self._keep(self.runs, run):
                return None
            self._last_run[index] = run
        run.end = max(t, run.start)
        code = d.get("exit_code")
        run.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        run.details = _clean(d.get("details"))
        return run

    def _on_entry_exited(self, t: float, d: Mapping[str, Any], index: int) -> None:
        run = self._ended_run(t, d, index)
        if run is not None:
            run.status = "success" if d.get("status") == "success" else "error"
            if run.status == "error":
                self.failures += 1

    def _on_entry_failed(self, t: float, d: Mapping[str, Any], index: int) -> None:
        run = self._ended_run(t, d, index)
        if run is not None:
            run.status = "failed"
            self.failures += 1

    def _on_entry_interrupted(self, t: float, d: Mapping[str, Any], index: int) -> None:
        run = self._ended_run(t, d, index)
        if run is not None:
            run.status = "interrupted"

    def _on_output(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self.output_lines += 1
        last = self._last_run.get(index)
        if last is not None:
            last.output += 1

    def _on_reboot_requested(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self._mark("reboot", t, "reboot requested", f"requesters {_clean(d.get('requesters'))}")

    def _on_configured(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self.configured_at = self._near(d.get("at"), t)
        self._mark("configured", self.configured_at, "configured (time 0 reached on this VM)")

    def _on_start_time_set(self, t: float, d: Mapping[str, Any], index: int) -> None:
        start = _num(d.get("start_time"))
        if start is not None and abs(start - t) <= MAX_SKEW:
            self.vm_start = start

    def _on_experiment_started(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self.started = True

    def _on_pause_started(self, t: float, d: Mapping[str, Any], index: int) -> None:
        if index in self._open_pause:
            return  # reported again after an agent restart: the first one stands
        at, dur = _num_text(d.get("at")), _num_text(d.get("duration"))
        span = Span("pause", t, None, f"pause {dur} s", [f"pause at t={at} for {dur} s (entry #{index})"])
        if self._keep(self.pauses, span):
            self._open_pause[index] = span

    def _on_break_started(self, t: float, d: Mapping[str, Any], index: int) -> None:
        if index in self._open_break:
            return  # reported again after an agent restart: the first one stands
        at = _num_text(d.get("at"))
        span = Span("break", t, None, "break", [f"break at t={at} (entry #{index})", "held until a RESUME"])
        if self._keep(self.breaks, span):
            self._open_break[index] = span

    def _on_pause_ended(self, t: float, d: Mapping[str, Any], index: int) -> None:
        span = self._open_pause.pop(index, None)
        if span is not None:
            span.end = t

    def _on_resume_received(self, t: float, d: Mapping[str, Any], index: int) -> None:
        ended = d.get("ended_break")
        brk = ended if isinstance(ended, int) and not isinstance(ended, bool) else None
        span = self._open_break.pop(brk, None) if brk is not None else None
        if span is not None:
            span.end = t
            span.tip.append(f"ended by a RESUME stamped t={_num_text(d.get('at'))}")
        elif d.get("ignored") is True or brk is None:
            self._mark("ignored", t, "RESUME ignored (no active break)", _clean(d.get("details")))

    def _on_vm_failed(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self.failed = True
        self._mark("failed", t, f"VM failed (entry #{index})", _clean(d.get("details")))

    def _on_control_refused(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self.refused += 1
        self._mark(
            "refused",
            t,
            f"control message refused: {_clean(d.get('type'), 30)}",
            _clean(d.get("details")),
        )

    def _on_schedule_complete(self, t: float, d: Mapping[str, Any], index: int) -> None:
        self.complete = True


#: Event type -> the :class:`VmTimeline` method that folds it ``(timeline, t, data, index)``;
#: the report ignores every other type.
_FOLD: Dict[str, Callable[[VmTimeline, float, Mapping[str, Any], int], None]] = {
    T.AGENT_STARTED.value: VmTimeline._on_agent_started,
    T.STAGE_STARTED.value: VmTimeline._on_stage_started,
    T.STAGE_FINISHED.value: VmTimeline._on_stage_finished,
    T.ENTRY_STARTED.value: VmTimeline._on_entry_started,
    T.ENTRY_EXITED.value: VmTimeline._on_entry_exited,
    T.ENTRY_FAILED.value: VmTimeline._on_entry_failed,
    T.ENTRY_INTERRUPTED.value: VmTimeline._on_entry_interrupted,
    T.OUTPUT.value: VmTimeline._on_output,
    T.REBOOT_REQUESTED.value: VmTimeline._on_reboot_requested,
    T.CONFIGURED.value: VmTimeline._on_configured,
    T.START_TIME_SET.value: VmTimeline._on_start_time_set,
    T.EXPERIMENT_STARTED.value: VmTimeline._on_experiment_started,
    T.PAUSE_STARTED.value: VmTimeline._on_pause_started,
    T.BREAK_STARTED.value: VmTimeline._on_break_started,
    T.PAUSE_ENDED.value: VmTimeline._on_pause_ended,
    T.RESUME_RECEIVED.value: VmTimeline._on_resume_received,
    T.VM_FAILED.value: VmTimeline._on_vm_failed,
    T.CONTROL_REFUSED.value: VmTimeline._on_control_refused,
    T.SCHEDULE_COMPLETE.value: VmTimeline._on_schedule_complete,
}


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
