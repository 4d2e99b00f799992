"""What the host knows of one VM apart from its connection: what its agent said in its
``hello``, what its stored reports tell (schedule accepted, stages, configured, failures;
rebuilt from the ``.jsonl`` at host start, then live) and the :class:`Counters` of what was
refused. :meth:`VmState.apply` parses a report (:mod:`vmr_handler.core.payloads`) and
dispatches its typed payload through a table.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Protocol, Tuple, Type, TypeVar

from vmr_handler.core.errors import SavedStateError
from vmr_handler.core.events import Event
from vmr_handler.core.payloads import (
    AgentStarted,
    BreakStarted,
    Configured,
    EntryExited,
    EntryFailed,
    EntryInterrupted,
    EntryStarted,
    Hello,
    Kpi,
    PauseEnded,
    PauseStarted,
    Payload,
    Result,
    ResumeReceived,
    ScheduleComplete,
    StageFinished,
    StageStarted,
    VmFailed,
)
from vmr_handler.core.wire.protocol import DecoderStats
from vmr_handler.host.logs.text import printable
from vmr_handler.host.model.stateword import FAILED_RUNS, Presence, state_word

_P = TypeVar("_P", bound=Payload)
_Apply = Tuple[Type[Payload], Callable[[Any, float], None]]

#: How the id of every ``schedule`` event begins (``host/serve/session/_delivery.py``): a
#: ``result`` answering such an id is the VM's answer to its schedule.
SCHEDULE_ANSWER = "schedule-"


class ReportHost(Protocol):
    """What a VM's stored reports tell the experiment (the barrier and the RESUMEs): the
    :class:`VmState` of every VM tells it (the host's experiment implements it)."""

    def on_configured(self, vm: str, at: float) -> None:
        """``vm`` configured at host UTC ``at`` (idempotent)."""

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        """``vm`` answered RESUME ``resume_id`` with ``data`` (idempotent)."""

    def on_outcome(self, vm: str, outcome: str, details: Optional[str], at: float) -> None:
        """``vm`` reported ``outcome`` (``failed`` or ``complete``) at host UTC ``at``, with
        ``details`` (the cause of a failure); told live and when the logs are replayed."""


class Untold:
    """A :class:`ReportHost` told nothing: a VM's reports folded for a view of the logs (the
    report, ``schedule show``) rather than for the serving experiment."""

    def on_configured(self, vm: str, at: float) -> None:
        """Nothing (:meth:`ReportHost.on_configured`)."""

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        """Nothing (:meth:`ReportHost.on_resume_answer`)."""

    def on_outcome(self, vm: str, outcome: str, details: Optional[str], at: float) -> None:
        """Nothing (:meth:`ReportHost.on_outcome`)."""


#: Entries kept as running per VM (a guest reporting more starts than ends cannot grow the
#: host without bound; beyond it the oldest is no longer shown as running).
MAX_RUNNING = 4096
#: Earlier failures kept per VM (the oldest are dropped; ``failures`` still counts them all).
MAX_FAILURE_HISTORY = 100
#: What the stored reports set (:meth:`VmState.snapshot`, the restart checkpoint).
REPLAYED = (
    "schedule_state", "schedule_details", "stage", "stage_time", "stage_running", "stages_done",
    "configured_at", "failed", "failed_at", "failed_entry", "failure_history", "complete",
    "at_break", "paused", "last_entry", "last_seen", "max_lateness", "failures",
)  # fmt: skip


#: KPI samples kept per VM for series (sparklines): the last N, whatever a guest sends.
KPI_HISTORY = 60
#: What each kept KPI sample holds, in order (:meth:`VmState.kpi_series`): host UTC received,
#: CPU %, memory used (bytes), 1 min load, network in/out of every interface and disk
#: read/write (bytes/s).
KPI_SERIES = (
    "at", "cpu_percent", "mem_used", "load_1", "net_recv", "net_sent", "disk_read_rate", "disk_write_rate",
)  # fmt: skip
#: Characters of an interface name kept (a guest's).
KPI_NAME = 64

_Sample = Tuple[Optional[float], ...]


def kpi_record(p: Kpi, received: float) -> Dict[str, Any]:
    """The latest-sample form of a ``kpi`` payload (``vmr-host status``'s ``kpi``, JSON safe):
    ``at`` (host UTC received), ``interval``, ``cpu_percent``, ``load`` ``[1, 5, 15 min]``,
    ``mem_*``/``disk_*`` (bytes, bytes/s) and ``net`` (interface, made printable and cut to
    :data:`KPI_NAME` characters -> its rates); a value the guest did not send well is None."""
    return {
        "at": received,
        "interval": p.interval,
        "cpu_percent": p.cpu_percent,
        "load": [p.load_1, p.load_5, p.load_15],
        "mem_used": p.mem_used,
        "mem_available": p.mem_available,
        "mem_total": p.mem_total,
        "disk_used": p.disk_used,
        "disk_total": p.disk_total,
        "disk_read_rate": p.disk_read_rate,
        "disk_write_rate": p.disk_write_rate,
        "net": {short(name, KPI_NAME): dict(rates) for name, rates in p.net.items()},
    }


def _net_total(p: Kpi, key: str) -> Optional[float]:
    """The sum of ``key`` over the interfaces that sent it (None when none did)."""
    values = [v for rates in p.net.values() if (v := rates.get(key)) is not None]
    return math.fsum(values) if values else None


def _kpi_snapshot(data: Any) -> Tuple[Optional[Dict[str, Any]], List[_Sample]]:
    """The KPI members of a :meth:`VmState.snapshot` (none in a checkpoint of an older host).

    Raises:
        SavedStateError: they are not what a snapshot holds.
    """
    kpi, history = data.get("kpi"), data.get("kpi_history", [])
    good = isinstance(history, list) and all(
        isinstance(s, list)
        and len(s) == len(KPI_SERIES)
        and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in s)
        for s in history
    )
    if (kpi is not None and not isinstance(kpi, dict)) or not good:
        raise SavedStateError("not a VM state snapshot: bad kpi or kpi_history")
    return kpi, [tuple(s) for s in history[-KPI_HISTORY:]]


def run_status(p: Optional[Payload]) -> Optional[str]:
    """The status of an entry run an entry report's payload tells, None for another report:
    ``started``; ``entry_exited`` is ``success`` or ``error`` as the agent said (a data-only
    entry has no exit code and succeeded; a requested reboot is a success), else by its exit
    code (0 = success), ``killed`` when the operator ended it (``ended_by: operator``,
    ``vmr-host kill``) and ``timeout`` when its ``timeout`` did; ``entry_failed`` is ``failed``
    (it could not run); ``entry_interrupted`` is ``interrupted``. ``error`` and ``failed`` make
    a failed entry (:data:`FAILED_RUNS`)."""
    if isinstance(p, EntryStarted):
        return "started"
    if isinstance(p, EntryExited):
        if p.ended_by in ("operator", "timeout"):
            return "killed" if p.ended_by == "operator" else "timeout"
        if p.status in ("success", "error"):
            return p.status
        return "success" if p.exit_code == 0 else "error"
    if isinstance(p, EntryFailed):
        return "failed"
    if isinstance(p, EntryInterrupted):
        return "interrupted"
    return None


def short(text: Optional[str], limit: int = 128) -> Optional[str]:
    """A guest string made printable and cut to ``limit`` characters; None stays None."""
    return printable(text, limit) if text is not None else None


def _on(kind: Type[_P], apply: Callable[[_P, float], None]) -> Tuple[str, _Apply]:
    """A row of :class:`VmState`'s table: ``kind``'s event type, its payload class and what
    applies it."""
    return kind.TYPE, (kind, apply)


def add_stats(base: DecoderStats, more: DecoderStats) -> DecoderStats:
    """Frame counts of ``base`` plus ``more``; the last error is ``more``'s, else ``base``'s."""
    return DecoderStats(
        base.frames + more.frames,
        base.malformed + more.malformed,
        base.oversize + more.oversize,
        base.bytes + more.bytes,
        more.last_error or base.last_error,
    )


def frames_status(st: DecoderStats) -> Dict[str, Any]:
    """The ``frames`` member of a VM's status."""
    return {
        "ok": st.frames,
        "malformed": st.malformed,
        "oversize": st.oversize,
        "bytes": st.bytes,
        "last_error": st.last_error,
    }


@dataclass
class Counters:
    """Per-VM counts of everything refused or odd (shown by ``vmr-host status``)."""

    rate_limited: int = 0
    too_many_events: int = 0
    protocol_errors: int = 0
    vm_mismatch: int = 0
    refused_connections: int = 0
    write_overflow: int = 0
    transfer_refused: int = 0
    transfer_bad_sha256: int = 0
    resources_served: int = 0
    resources_refused: int = 0
    unstorable: int = 0
    hello_flood: int = 0
    malformed_payloads: int = 0

    def refused(self) -> Dict[str, int]:
        """The ``refused`` member of the VM's status."""
        return {
            "rate_limited": self.rate_limited,
            "too_many_events": self.too_many_events,
            "protocol_errors": self.protocol_errors,
            "vm_mismatch": self.vm_mismatch,
            "second_connections": self.refused_connections,
            "write_overflow": self.write_overflow,
            "unstorable": self.unstorable,
            "hello_flood": self.hello_flood,
            "malformed_payloads": self.malformed_payloads,
        }


class VmState:
    """One VM's state from its hello and its reports.

    The one fold of a VM's reports into its state: the serving host keeps one per VM (live,
    and rebuilt from the checkpoint and the log's tail at restart), and the views of the logs
    (the report's and the console's timeline, ``schedule show``) fold the same reports through
    one each (:class:`~vmr_handler.host.report.fold.VmTimeline`), so every view applies the
    same rules (docs/host.md, "One truth").

    Args:
        name: the VM (its channel's name).
        digest: sha256 of its schedule ("" when unknown).
        schedule_id: id of the ``schedule`` event (a ``result`` answering it accepts or rejects
            it); None: any ``schedule`` event's (:data:`SCHEDULE_ANSWER`), for a view of the logs.
        host: told when the VM is configured and when it answers a RESUME (:class:`Untold`).
    """

    def __init__(self, name: str, digest: str, schedule_id: Optional[str], host: ReportHost) -> None:
        self.name = name
        self.digest = digest
        self.schedule_id = schedule_id
        self.host = host
        # what the agent told
        self.agent_version: Optional[str] = None
        self.boot_id: Optional[str] = None
        self.claimed_vm: Optional[str] = None
        self.unacked: Optional[int] = None
        # what the VM did (rebuilt from the .jsonl at start, then live)
        self.schedule_state = "pending"  # pending|sent|accepted|rejected
        self.schedule_details: Optional[str] = None
        self.stage: Optional[int] = None
        self.stage_time: Optional[float] = None
        self.stage_running = False
        self.stages_done = 0
        self.configured_at: Optional[float] = None
        self.failed: Optional[str] = None
        self.failed_at: Optional[float] = None  # host UTC the failure was received
        self.failed_entry: Optional[int] = None  # the schedule entry that failed the VM
        #: earlier failures the VM recovered from (a new agent run followed): {at, details}
        self.failure_history: List[Dict[str, Any]] = []
        self.complete = False
        #: what the last ``schedule_complete`` said: {status, ran, exited_nonzero, not_started}
        self.completion: Optional[Dict[str, Any]] = None
        # where the VM is now: entries running (index -> host UTC seen started),
        # the break it is held at, the pause it is in, the last entry started
        self.running: Dict[int, float] = {}
        #: entries that ended, index -> (how: ``exit code 0``, ``killed by operator (SIGTERM)``...;
        #: its run status, :func:`run_status`)
        self.ended: Dict[int, Tuple[str, str]] = {}
        self.at_break: Optional[Dict[str, Any]] = None
        #: break index -> host UTC of the RESUME that ended it, as the agent reported (its
        #: journal keeps them across its restarts): a ``break_started`` of one that comes after
        #: (an agent older than the order "break, then its RESUME") holds nothing
        self.ended_breaks: Dict[int, float] = {}
        self.paused: Optional[Dict[str, Any]] = None
        self.last_entry: Optional[Dict[str, Any]] = None
        self.last_seen: Optional[float] = None
        self.max_lateness: Optional[float] = None
        #: failed entries (docs/host.md, "Terms"): runs that exited non-zero or could not run
        self.failures = 0
        self.start_acked = False
        #: the latest KPI sample (:func:`kpi_record`) and the last :data:`KPI_HISTORY` ones
        self.kpi: Optional[Dict[str, Any]] = None
        self.kpi_history: Deque[_Sample] = deque(maxlen=KPI_HISTORY)
        #: report type -> its payload class and what the payload changes (payload, host UTC received)
        self._appliers: Dict[str, _Apply] = dict(
            [
                _on(AgentStarted, self._agent_started),
                _on(StageStarted, self._stage_started),
                _on(StageFinished, self._stage_finished),
                _on(Configured, self._configured_report),
                _on(VmFailed, self._vm_failed),
                _on(ScheduleComplete, self._schedule_complete),
                _on(EntryStarted, self._entry_started),
                _on(EntryFailed, self._entry_failed),
                _on(EntryExited, self._entry_exited),
                _on(EntryInterrupted, self._entry_interrupted),
                _on(BreakStarted, self._break_started),
                _on(PauseStarted, self._pause_started),
                _on(PauseEnded, self._pause_ended),
                _on(ResumeReceived, self._resume_received),
                _on(Result, self._result),
                _on(Kpi, self._kpi),
            ]
        )

    # ------------------------------------------------------------------ from the agent
    def hello(self, hello: Hello) -> None:
        """Take what the agent says of itself in its ``hello`` (``vm``, ``agent_version``,
        ``boot_id``, ``unacked``; odd values are kept as None, strings cut to 128)."""
        self.claimed_vm = short(hello.vm)
        self.agent_version = short(hello.agent_version)
        self.boot_id = short(hello.boot_id)
        self.unacked = hello.unacked

    def configured(self, at: float) -> None:
        """The VM is configured (seen at host UTC ``at``, the first time kept); the host is told."""
        if self.configured_at is None:
            self.configured_at = at
        self.host.on_configured(self.name, at)

    def apply(self, ev: Event, received: float) -> None:
        """Update this VM's state from a stored report received at host UTC ``received``.

        Used live and when the ``.jsonl`` is replayed at host start (so a restarted host
        shows the same state). Only the types of the table are parsed.

        Raises:
            PayloadError: the report is malformed (:mod:`vmr_handler.core.payloads`); only
                ``last_seen`` was updated.
        """
        if self.last_seen is None or received > self.last_seen:
            self.last_seen = received
        row = self._appliers.get(ev.type)
        if row is not None:
            kind, apply = row
            apply(kind.parse(ev.data), received)

    def take(self, payload: Payload, received: float) -> None:
        """Update this VM's state from a report's typed payload (already parsed, e.g. by the
        report's fold), received at host UTC ``received``; a payload of a type the table does
        not hold changes nothing."""
        row = self._appliers.get(payload.TYPE)
        if row is not None and isinstance(payload, row[0]):  # not the report's own KPI reading
            row[1](payload, received)

    def _agent_started(self, p: AgentStarted, received: float) -> None:
        """A new agent run: what ran in the last one is over; a failure becomes history (the
        VM shows what it does now)."""
        self.running.clear()
        self.paused = None
        if not p.resumed_from_journal:
            self.ended_breaks.clear()  # a new journal: every break holds again
        if self.failed is not None:
            self.failure_history.append({"at": self.failed_at, "details": self.failed})
            del self.failure_history[:-MAX_FAILURE_HISTORY]
            self.failed = None
            self.failed_at = None

    def _stage_started(self, p: StageStarted, received: float) -> None:
        self.complete = False  # a stage appended after it completed
        if p.stage is not None:
            self.stage = p.stage
        self.stage_time = p.start_time.value
        self.stage_running = True

    def _stage_finished(self, p: StageFinished, received: float) -> None:
        self.stage_running = False
        self.stages_done += 1

    def _configured_report(self, p: Configured, received: float) -> None:
        self.configured(received)

    def _vm_failed(self, p: VmFailed, received: float) -> None:
        self.failed = short(p.details.string, 500) or "vm_failed"
        self.failed_at = received
        self.failed_entry = p.index  # the entry's own report counted it (a failed entry)
        self.host.on_outcome(self.name, "failed", self.failed, received)

    def _schedule_complete(self, p: ScheduleComplete, received: float) -> None:
        self.complete = True
        self.completion = {
            "status": short(p.status, 16),
            "ran": p.ran,
            "exited_nonzero": p.exited_nonzero,
            "not_started": p.not_started,
        }
        self.host.on_outcome(self.name, "complete", None, received)

    def _entry_started(self, p: EntryStarted, received: float) -> None:
        self.complete = False  # an entry appended after it completed
        if p.lateness is not None and (self.max_lateness is None or p.lateness > self.max_lateness):
            self.max_lateness = p.lateness
        if p.index is not None:
            self.running.pop(p.index, None)
            self.ended.pop(p.index, None)
            self.running[p.index] = received
            if len(self.running) > MAX_RUNNING:
                del self.running[next(iter(self.running))]
            self.last_entry = {"index": p.index, "start_time": p.start_time, "at": received}

    def _entry_failed(self, p: EntryFailed, received: float) -> None:
        self.failures += 1
        self._ended(p.index, ("it could not run", "failed"))

    def _entry_exited(self, p: EntryExited, received: float) -> None:
        status = run_status(p) or "error"
        if status in FAILED_RUNS:
            self.failures += 1
        self._ended(p.index, (short(p.details.string) or status, status))

    def _entry_interrupted(self, p: EntryInterrupted, received: float) -> None:
        self._ended(p.index, None)  # it runs again when the agent restarts

    def _ended(self, index: Optional[int], how: Optional[Tuple[str, str]]) -> None:
        if index is not None:
            self.running.pop(index, None)
            if how is not None:
                self.ended.pop(index, None)
                self.ended[index] = how
                if len(self.ended) > MAX_RUNNING:
                    del self.ended[next(iter(self.ended))]

    def _break_started(self, p: BreakStarted, received: float) -> None:
        if p.index in self.ended_breaks:
            return  # its RESUME was reported first: the break is over
        self.at_break = {"index": p.index, "at": p.at.value, "since": received}

    def _pause_started(self, p: PauseStarted, received: float) -> None:
        self.paused = {"index": p.index, "at": p.at.value, "duration": p.duration.value, "since": received}

    def _pause_ended(self, p: PauseEnded, received: float) -> None:
        self.paused = None

    def _resume_received(self, p: ResumeReceived, received: float) -> None:
        if not p.ignored and p.ended_break is not None:
            self.ended_breaks[p.ended_break] = received
        if not p.ignored and self.at_break is not None and p.ended_break == self.at_break["index"]:
            self.at_break = None

    def _result(self, p: Result, received: float) -> None:
        mine = self.schedule_id
        if p.answers == mine or (mine is None and p.answers.startswith(SCHEDULE_ANSWER)):
            self.schedule_state = "accepted" if p.ok else "rejected"
            self.schedule_details = short(p.details, 2000)
        else:
            self.host.on_resume_answer(self.name, p.answers, p.data, received)

    def _kpi(self, p: Kpi, received: float) -> None:
        self.kpi = kpi_record(p, received)
        net = (_net_total(p, "bytes_recv"), _net_total(p, "bytes_sent"))
        self.kpi_history.append(
            (received, p.cpu_percent, p.mem_used, p.load_1, *net, p.disk_read_rate, p.disk_write_rate)
        )

    def kpi_series(self) -> Dict[str, List[Optional[float]]]:
        """The kept KPI samples as series, oldest first: :data:`KPI_SERIES` name -> values."""
        return {name: [s[i] for s in self.kpi_history] for i, name in enumerate(KPI_SERIES)}

    # ------------------------------------------------------------------ checkpoint
    def snapshot(self) -> Dict[str, Any]:
        """What the stored reports set, JSON safe (the restart checkpoint): the
        members of :data:`REPLAYED`, ``running`` as ``[[index, host UTC], ...]``, ``ended`` as
        ``[[index, how, status], ...]``, the latest
        ``kpi`` and ``kpi_history`` (lists of :data:`KPI_SERIES` values). A schedule only *sent*
        is saved as ``pending`` (it is sent again at the next handshake)."""
        data = {k: getattr(self, k) for k in REPLAYED}
        if data["schedule_state"] == "sent":
            data["schedule_state"] = "pending"
        data["running"] = [[i, t] for i, t in self.running.items()]
        data["ended"] = [[i, how, status] for i, (how, status) in self.ended.items()]
        data["completion"] = self.completion
        data["kpi"] = self.kpi
        data["kpi_history"] = [list(sample) for sample in self.kpi_history]
        return data

    def restore(self, data: Any) -> None:
        """Take a :meth:`snapshot` back (nothing changes when it is bad); the host is not told.

        Raises:
            SavedStateError: ``data`` is not a snapshot.
        """
        try:
            values = {k: data[k] for k in REPLAYED}
            running = {int(i): float(t) for i, t in data["running"]}
            ended = {int(i): (str(how), str(st)) for i, how, st in data.get("ended", [])}  # absent: older
        except (KeyError, TypeError, ValueError) as exc:
            raise SavedStateError(f"not a VM state snapshot: {exc!r}") from exc
        if values["schedule_state"] not in ("pending", "accepted", "rejected") or not isinstance(
            values["failure_history"], list
        ):
            raise SavedStateError("not a VM state snapshot: bad schedule_state or failure_history")
        kpi, history = _kpi_snapshot(data)
        completion = data.get("completion")  # absent from an older host's checkpoint
        if completion is not None and not isinstance(completion, dict):
            raise SavedStateError("not a VM state snapshot: bad completion")
        self.completion = completion
        for k, v in values.items():
            setattr(self, k, v)
        self.running = running
        self.ended = ended
        self.kpi = kpi
        self.kpi_history = deque(history, maxlen=KPI_HISTORY)

    # ------------------------------------------------------------------ status
    def word(self, start_time: Optional[float], now: float, presence: Presence) -> str:
        """The VM's one state word (:func:`~vmr_handler.host.model.stateword.state_word`)."""
        return state_word(self, start_time, now, presence)

    def stage_text(self) -> Optional[str]:
        """The current or last stage as ``vmr-host status`` shows it: ``1 (-20) running``, or None."""
        if self.stage is None:
            return None
        where = f" ({self.stage_time:g})" if self.stage_time is not None else ""
        return f"{self.stage}{where} {'running' if self.stage_running else 'done'}"

    def fields(self) -> Dict[str, Any]:
        """The status members from ``schedule`` to ``kpi`` (JSON safe, in their order)."""
        stage = self.stage_text()
        return {
            "schedule": {
                "state": self.schedule_state,
                "digest": self.digest,
                "details": self.schedule_details,
            },
            "stage": stage,
            "stages_done": self.stages_done,
            "configured_at": self.configured_at,
            "failed": self.failed,
            "failed_at": self.failed_at,
            "failed_entry": self.failed_entry,
            "failure_history": list(self.failure_history),
            "complete": self.complete,
            "completion": dict(self.completion) if self.completion else None,
            "phase": {
                "stage_time": self.stage_time,
                "running_entries": sorted(self.running),
                "killed": {str(i): how for i, (how, st) in self.ended.items() if st in ("killed", "timeout")},
                "at_break": dict(self.at_break) if self.at_break else None,
                "paused": dict(self.paused) if self.paused else None,
                "last_entry": dict(self.last_entry) if self.last_entry else None,
            },
            "last_seen": self.last_seen,
            "max_lateness": self.max_lateness,
            "failures": self.failures,
            "start_acked": self.start_acked,
            "agent": {
                "version": self.agent_version,
                "boot_id": self.boot_id,
                "claimed_vm": self.claimed_vm,
                "unacked": self.unacked,
            },
            "kpi": dict(self.kpi) if self.kpi is not None else None,
        }
