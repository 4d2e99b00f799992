"""``vmr-host report``: the experiment timeline as one self-contained HTML file (SPEC section 8).

SPEC section 8 asks for "an experiment timeline report (HTML with SVG or a PNG: every VM, its
stages, the barrier, positive entries, pauses and breaks) that a person would rather look at
than read". The picture follows the time semantics of SPEC section 4: negative stages, the
``configured`` instant, the one experiment start time (the barrier), positive entries with
their lateness, pauses and breaks ended by a RESUME.

Two layers:

* pure: :class:`ExperimentTimeline` folds host log records (``{"vm", "host_received",
  "event": {"timestamp", "type", "id", "data"}}``, ``docs/host.md``) one at a time into a
  small per-VM summary (spans, markers, counters: never the output lines themselves), and
  :func:`render_html` turns that summary and the contents of ``experiment.json`` into an
  HTML string (inline SVG and CSS, no script, no external asset). :func:`render_report`
  does both.
* I/O: :func:`write_report` streams ``<logs>/*.jsonl`` line by line through the fold, reads
  ``<logs>/experiment.json`` and writes the HTML atomically; :func:`cmd_report` is the
  command-line front end.

Every guest is hostile (SPEC section 7): every string taken from a log is made printable,
cut to :data:`MAX_LABEL` characters and HTML-escaped; numbers that are not finite are
ignored; an event time further than :data:`MAX_SKEW` seconds from the host's receive time
is replaced by the receive time (a guest can only misplace its own marks, by at most that
much); at most :data:`MAX_ITEMS` spans and markers of each kind are kept per VM (the rest
are counted). All times are UTC epoch seconds unless said otherwise; "experiment time" is
seconds after the experiment start time (negative before it).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.errors import NoLogs
from vmr_handler.core.events import EventType as T
from vmr_handler.core.fsutil import atomic_write, utc_text
from vmr_handler.host.store import EXPERIMENT_FILE, JSONL_SUFFIX, ExperimentStore, printable

#: Longest label or tooltip field taken from a guest, characters.
MAX_LABEL = 80
#: Spans and markers of each kind kept per VM; beyond it they are only counted.
MAX_ITEMS = 5000
#: An event time further than this from its host receive time (s) is replaced by the latter.
MAX_SKEW = 86400.0
#: Above this many VMs, entries carry no text label (tooltips only).
LABELS_UP_TO = 200
#: RESUME lines drawn across the lanes (all of them are in the facts table).
MAX_RESUME_LINES = 50

WIDTH = 1400  # px, whole SVG
LEFT = 170  # px, VM name column
RIGHT = 24  # px
AXIS = 82  # px, legend (two rows) + time axis above the lanes
BOTTOM = 8  # px

_MAPS = (dict, Mapping)  # isinstance() tries the plain dict of json.loads first: much faster
_SURROGATE = re.compile("[\ud800-\udfff\ufffe\uffff]")


# ------------------------------------------------------------------------------- helpers
def _num(value: Any) -> Optional[float]:
    """``value`` as a finite float (``bool`` and non-numbers: None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _clean(value: Any, cap: int = MAX_LABEL) -> str:
    """``value`` as printable text of at most ``cap`` characters (not yet escaped)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)[: cap + 1]
    text = printable(text[: cap * 4], cap)  # control characters shown as \\xNN
    return _SURROGATE.sub("\ufffd", text)  # not encodable / not allowed in XML


def _esc(value: Any, cap: int = MAX_LABEL) -> str:
    """``value`` cleaned (:func:`_clean`) and escaped for HTML text and attributes."""
    return html.escape(_clean(value, cap), quote=True)


def _secs(value: float) -> str:
    """A duration in compact units: ``850 ms``, ``12.3 s``, ``5m 02s``, ``5m``, ``2h 05m``."""
    a = abs(value)
    sign = "-" if value < 0 else ""
    if a < 1:
        return f"{sign}{a * 1000:.3g} ms"
    if a < 120:
        text = f"{a:.3g}" if a < 10 else f"{a:.1f}".removesuffix(".0")
        return f"{sign}{text} s"
    if a < 7200:
        m, sec = int(a // 60), int(a % 60)
        return f"{sign}{m}m {sec:02d}s" if sec else f"{sign}{m}m"
    h, m = int(a // 3600), int(a % 3600 // 60)
    return f"{sign}{h}h {m:02d}m" if m else f"{sign}{h}h"


def _rel(t: float, start: Optional[float]) -> str:
    """Experiment time of UTC ``t``: ``t=+1.5 s`` (empty when there is no start time)."""
    if start is None:
        return ""
    d = t - start
    if abs(d) < 1e-9:
        return "t=0"
    return "t=" + ("+" if d > 0 else "") + _secs(d)


def _num_text(value: Any) -> str:
    """A stage or entry start time as written in a schedule (``-20``, ``1.5``, ``?``)."""
    v = _num(value)
    if v is None:
        return "?" if value is None else _clean(value, 20)
    return f"{v:g}"


# ------------------------------------------------------------------------------ the fold
@dataclass
class Span:
    """A stage, pause or break of one VM.

    Attributes:
        kind: ``stage``, ``pause`` or ``break``.
        start: UTC epoch seconds.
        end: UTC epoch seconds, or None when it had not ended at the end of the logs.
        label: short text (unescaped, already cleaned).
        tip: tooltip lines (unescaped, already cleaned).
    """

    kind: str
    start: float
    end: Optional[float]
    label: str
    tip: List[str]


@dataclass
class EntryRun:
    """One run of a schedule entry (an entry runs again after a reboot or an interruption).

    Attributes:
        index: 0-based entry index in the schedule (-1 when the guest sent none).
        executable: as reported (cleaned).
        start: UTC epoch seconds (``spawned_at`` when given, else the event time).
        end: UTC epoch seconds, or None: still running at the end of the logs.
        status: ``success``, ``error`` (non-zero exit), ``failed`` (could not start),
            ``interrupted`` or ``running``.
        positive: an entry of positive experiment time (it has ``scheduled``).
        lateness: ``spawned_at - scheduled``, seconds (positive entries).
        exit_code: as reported (None: killed, data-only, or not ended).
        details: the agent's sentence (cleaned).
        output: output lines reported for this run (counted, never kept).
    """

    index: int
    executable: str
    start: float
    end: Optional[float] = None
    status: str = "running"
    positive: bool = False
    lateness: Optional[float] = None
    exit_code: Optional[int] = None
    details: str = ""
    output: int = 0


@dataclass
class Marker:
    """An instant on a VM's lane.

    Attributes:
        kind: ``configured``, ``reboot``, ``failed``, ``refused``, ``restart`` or ``ignored``
            (a RESUME that found no break).
        at: UTC epoch seconds.
        tip: tooltip lines (unescaped, cleaned).
    """

    kind: str
    at: float
    tip: List[str]


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
        span: Optional[Span]
        run: Optional[EntryRun]
        idx = d.get("index")
        index = idx if isinstance(idx, int) and not isinstance(idx, bool) else -1
        if kind == T.AGENT_STARTED:
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
        elif kind == T.STAGE_STARTED:
            self.configuring = True
            key = _clean(d.get("stage"), 20)
            st = _num_text(d.get("start_time"))
            span = Span("stage", t, None, f"stage {st}", [f"stage {st} (#{key})"])
            if self._keep(self.stages, span):
                self._open_stage[key] = span
        elif kind == T.STAGE_FINISHED:
            key = _clean(d.get("stage"), 20)
            span = self._open_stage.pop(key, None)
            if span is None:
                duration = _num(d.get("duration")) or 0.0
                st = _num_text(d.get("start_time"))
                span = Span(
                    "stage", t - min(max(duration, 0.0), MAX_SKEW), None, f"stage {st}", [f"stage {st}"]
                )
                if not self._keep(self.stages, span):
                    return
            span.end = t
        elif kind == T.ENTRY_STARTED:
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
        elif kind in (T.ENTRY_EXITED, T.ENTRY_FAILED, T.ENTRY_INTERRUPTED):
            run = self._open_run.pop(index, None)
            if run is None:
                duration = min(max(_num(d.get("duration")) or 0.0, 0.0), MAX_SKEW)
                run = EntryRun(index, _clean(d.get("executable")), t - duration)
                if not self._keep(self.runs, run):
                    return
                self._last_run[index] = run
            run.end = max(t, run.start)
            code = d.get("exit_code")
            run.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
            run.details = _clean(d.get("details"))
            if kind == T.ENTRY_EXITED:
                run.status = "success" if d.get("status") == "success" else "error"
            elif kind == T.ENTRY_FAILED:
                run.status = "failed"
                self.failures += 1
            else:
                run.status = "interrupted"
            if run.status == "error":
                self.failures += 1
        elif kind == T.OUTPUT:
            self.output_lines += 1
            last = self._last_run.get(index)
            if last is not None:
                last.output += 1
        elif kind == T.REBOOT_REQUESTED:
            self._mark("reboot", t, "reboot requested", f"requesters {_clean(d.get('requesters'))}")
        elif kind == T.CONFIGURED:
            self.configured_at = self._near(d.get("at"), t)
            self._mark("configured", self.configured_at, "configured (time 0 reached on this VM)")
        elif kind == T.START_TIME_SET:
            start = _num(d.get("start_time"))
            if start is not None and abs(start - t) <= MAX_SKEW:
                self.vm_start = start
        elif kind == T.EXPERIMENT_STARTED:
            self.started = True
        elif kind in (T.PAUSE_STARTED, T.BREAK_STARTED):
            is_pause = kind == T.PAUSE_STARTED
            opened = self._open_pause if is_pause else self._open_break
            if index in opened:
                return  # reported again after an agent restart: the first one stands
            at = _num_text(d.get("at"))
            if is_pause:
                dur = _num_text(d.get("duration"))
                span = Span(
                    "pause", t, None, f"pause {dur} s", [f"pause at t={at} for {dur} s (entry #{index})"]
                )
            else:
                span = Span(
                    "break", t, None, "break", [f"break at t={at} (entry #{index})", "held until a RESUME"]
                )
            if self._keep(self.pauses if is_pause else self.breaks, span):
                opened[index] = span
        elif kind == T.PAUSE_ENDED:
            span = self._open_pause.pop(index, None)
            if span is not None:
                span.end = t
        elif kind == T.RESUME_RECEIVED:
            ended = d.get("ended_break")
            brk = ended if isinstance(ended, int) and not isinstance(ended, bool) else None
            span = self._open_break.pop(brk, None) if brk is not None else None
            if span is not None:
                span.end = t
                span.tip.append(f"ended by a RESUME stamped t={_num_text(d.get('at'))}")
            elif d.get("ignored") is True or brk is None:
                self._mark("ignored", t, "RESUME ignored (no active break)", _clean(d.get("details")))
        elif kind == T.VM_FAILED:
            self.failed = True
            self._mark("failed", t, f"VM failed (entry #{index})", _clean(d.get("details")))
        elif kind == T.CONTROL_REFUSED:
            self.refused += 1
            self._mark(
                "refused",
                t,
                f"control message refused: {_clean(d.get('type'), 30)}",
                _clean(d.get("details")),
            )
        elif kind == T.SCHEDULE_COMPLETE:
            self.complete = True


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


# ------------------------------------------------------------------------ experiment facts
@dataclass
class Facts:
    """What ``experiment.json`` says (SPEC section 4, the barrier), read defensively.

    Attributes:
        start: experiment start time (UTC); ``start_source`` says where it came from.
        buffer: start buffer, seconds. set_at: when the host set the start (UTC).
        configured: VM -> host receive time of its ``configured`` report (UTC).
        resumes: ``(id, at, issued, targets, answered)``: ``at`` in experiment seconds
            (``-inf`` text before the start), ``issued`` UTC.
    """

    start: Optional[float] = None
    start_source: str = ""
    buffer: Optional[float] = None
    set_at: Optional[float] = None
    expected: List[str] = field(default_factory=list)
    excluded: List[str] = field(default_factory=list)
    released: List[str] = field(default_factory=list)
    configured: Dict[str, float] = field(default_factory=dict)
    resumes: List[Tuple[str, str, Optional[float], int, int]] = field(default_factory=list)

    @classmethod
    def read(cls, experiment: Mapping[str, Any], timeline: ExperimentTimeline) -> Facts:
        """Facts from ``experiment.json``'s content, else from what the VMs reported."""
        f = cls()
        barrier = experiment.get("barrier") if isinstance(experiment, Mapping) else None
        barrier = barrier if isinstance(barrier, Mapping) else {}

        def names(value: Any) -> List[str]:
            return (
                sorted(_clean(v, 64) for v in value if isinstance(v, str)) if isinstance(value, list) else []
            )

        f.start = _num(barrier.get("start_time"))
        f.start_source = "experiment.json" if f.start is not None else ""
        f.buffer = _num(barrier.get("buffer"))
        f.set_at = _num(experiment.get("start_set_at")) if isinstance(experiment, Mapping) else None
        f.expected, f.excluded, f.released = (
            names(barrier.get(k)) for k in ("expected", "excluded", "released")
        )
        configured = barrier.get("configured")
        if isinstance(configured, Mapping):
            for vm, when in configured.items():
                w = _num(when)
                if isinstance(vm, str) and w is not None:
                    f.configured[_clean(vm, 64)] = w
        if f.start is None:  # no experiment.json (or no start yet): what the VMs were told
            starts = sorted(v.vm_start for v in timeline.vms.values() if v.vm_start is not None)
            if starts:
                f.start, f.start_source = starts[len(starts) // 2], "VM reports"
        if not f.configured:
            f.configured = {
                n: v.configured_at for n, v in timeline.vms.items() if v.configured_at is not None
            }
        resumes = experiment.get("resumes") if isinstance(experiment, Mapping) else None
        for r in resumes if isinstance(resumes, list) else []:
            if isinstance(r, Mapping):
                targets = r.get("targets") if isinstance(r.get("targets"), list) else []
                answered = r.get("answered") if isinstance(r.get("answered"), Mapping) else {}
                at = _num(r.get("at"))
                f.resumes.append(
                    (
                        _clean(r.get("id"), 40),
                        f"{at:.3f}" if at is not None else _clean(r.get("at"), 10),
                        _num(r.get("issued")),
                        len(targets or []),
                        len(answered or {}),
                    )
                )
        return f

    def last_configured(self) -> Optional[Tuple[str, float]]:
        """The VM that configured last and when (UTC), among the expected ones when known."""
        pool = {k: v for k, v in self.configured.items() if not self.expected or k in self.expected}
        if not pool:
            return None
        vm = max(pool, key=lambda k: pool[k])
        return vm, pool[vm]


# ------------------------------------------------------------------------------- drawing
_NICE = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600,
    900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
]  # fmt: skip

_CSS_SVG = """
text{font:11px sans-serif;fill:#222}
.ax{stroke:#bbb;stroke-width:1}.grid{stroke:#e4e4e4;stroke-width:1}
.tk{font-size:10px;fill:#444}.tk2{font-size:10px;fill:#1f4e9c}
.l0{fill:#fafafa}.l1{fill:#f0f2f5}
.st{fill:#9ec5ea;stroke:#5b8fc7;stroke-width:.5}.stl{font-size:10px;fill:#12355b}
.e-success{fill:#2e9d4f}.e-error{fill:#e08a00}.e-failed{fill:#d62728}
.e-interrupted{fill:#8c8c8c}.e-running{fill:#3b6fd1}
.pa{fill:url(#hp);stroke:#d9a400;stroke-width:.6}.br{fill:url(#hb);stroke:#7b4fa6;stroke-width:.6}
.rs{stroke:#7b4fa6;stroke-width:2}
.start{stroke:#1f4e9c;stroke-width:2}.lastc{stroke:#2e9d4f;stroke-width:1.5;stroke-dasharray:5 3}
.rl{stroke:#7b4fa6;stroke-width:1;stroke-dasharray:2 3}
.m-configured{fill:#2e9d4f;stroke:#fff;stroke-width:.6}.m-reboot{fill:#ff7f0e;stroke:#fff;stroke-width:.6}
.m-failed{stroke:#d62728;stroke-width:2.2}.m-refused{fill:#ffd11a;stroke:#a07800;stroke-width:.8}
.m-restart{stroke:#555;stroke-width:1.5}.m-ignored{fill:#fff;stroke:#7b4fa6;stroke-width:1}
.vm{font-size:11px}.el{font-size:9px;fill:#fff}
.open{fill:none;stroke:#333;stroke-width:1;stroke-dasharray:2 2}
"""

_CSS_PAGE = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:20px 0 6px}
.sub{color:#555;margin-bottom:10px}.chart{overflow-x:auto;border:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:2px 8px;text-align:left}
th{background:#f0f2f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.failed td{background:#fde8e8}.notes{color:#8a5a00}
"""


class _Scale:
    """UTC epoch seconds -> x pixels, linear over ``[t0, t1]``."""

    def __init__(self, t0: float, t1: float, x0: float, x1: float) -> None:
        self.t0, self.t1, self.x0, self.x1 = t0, t1, x0, x1
        self.k = (x1 - x0) / (t1 - t0)

    def __call__(self, t: float) -> float:
        return round(self.x0 + (t - self.t0) * self.k, 1)


def _ticks(t0: float, t1: float, start: Optional[float], plot_width: float) -> Tuple[float, List[float]]:
    """A readable tick step (s) and the tick instants (UTC) within ``[t0, t1]``: about one per
    110 px, aligned on experiment time when ``start`` is known, else on UTC."""
    span = t1 - t0
    step = next(
        (s for s in _NICE if span / s <= plot_width / 110), _NICE[-1] * math.ceil(span / _NICE[-1] / 10)
    )
    base = start if start is not None else 0.0
    k = math.ceil((t0 - base) / step)
    out: List[float] = []
    while base + k * step <= t1 and len(out) < 1000:
        out.append(base + k * step)
        k += 1
    return step, out


def _utc_tick(t: float, step: float, span: float) -> str:
    """A tick's UTC label, as precise as the step needs."""
    ms = round((t % 1) * 1000) % 1000
    if span > 2 * 86400:
        return time.strftime("%m-%d %H:%M", time.gmtime(t))
    if step < 1:
        return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{ms:03d}"[: 2 if step >= 0.1 else 4]
    return time.strftime("%H:%M:%S", time.gmtime(t))


def _title(lines: Iterable[str]) -> str:
    """An SVG ``<title>`` (hover tooltip) of already-cleaned lines."""
    body = "&#10;".join(html.escape(line, quote=False) for line in lines if line)
    return f"<title>{body}</title>"


def _pack(bars: Sequence[Tuple[float, float]], rows: int) -> List[int]:
    """A row (0..rows-1) per bar ``(x_start, x_end)`` px, sorted by start, so that bars that
    overlap sit on different rows where possible (greedy; the last row takes the overflow)."""
    free = [-math.inf] * rows
    out = []
    for sx, ex in bars:
        row = next((i for i in range(rows) if free[i] <= sx), rows - 1)
        free[row] = max(free[row], ex + 1.0)
        out.append(row)
    return out


def _legend(y: float) -> List[str]:
    items = [
        ('<rect x="0" y="-8" width="22" height="9" class="st"/>', "stage (negative time)"),
        ('<rect x="0" y="-7" width="22" height="5" class="e-success"/>', "entry ok"),
        ('<rect x="0" y="-7" width="22" height="5" class="e-error"/>', "exit code not 0"),
        ('<rect x="0" y="-7" width="22" height="5" class="e-failed"/>', "failed to start"),
        ('<rect x="0" y="-7" width="22" height="5" class="e-running"/>', "running / open"),
        ('<rect x="0" y="-9" width="22" height="11" class="pa"/>', "pause"),
        ('<rect x="0" y="-9" width="22" height="11" class="br"/>', "break (to its RESUME)"),
        ('<path d="M11,-9 L16,-4 L11,1 L6,-4Z" class="m-configured"/>', "configured"),
        ('<line x1="11" y1="-10" x2="11" y2="2" class="start"/>', "start (t=0)"),
        ('<line x1="11" y1="-10" x2="11" y2="2" class="lastc"/>', "last configured"),
        ('<line x1="11" y1="-10" x2="11" y2="2" class="rl"/>', "RESUME issued"),
        ('<path d="M6,1 L11,-9 L16,1Z" class="m-reboot"/>', "reboot"),
        ('<path d="M7,-8 L15,0 M15,-8 L7,0" class="m-failed"/>', "VM failed"),
        ('<path d="M6,1 L11,-9 L16,1Z" class="m-refused"/>', "refused control"),
    ]
    out: List[str] = []
    x = 8.0
    for shape, text in items:
        width = 32 + 6.1 * len(text)
        if x + width > WIDTH:  # wrap to a second row
            x, y = 8.0, y + 17
        out.append(f'<g transform="translate({x:.0f},{y:.0f})">{shape}<text x="26" y="0">{text}</text></g>')
        x += width
    return out


def _marker(kind: str, x: float, cy: float, s: float, title: str) -> str:
    """A lane marker centred at (x, cy), half-size ``s`` px, with its tooltip."""
    if kind == "ignored":
        return f'<circle cx="{x}" cy="{cy}" r="{max(s * 0.6, 1):.1f}" class="m-ignored">{title}</circle>'
    if kind == "configured":
        d = f"M{x},{cy - s} L{x + s},{cy} L{x},{cy + s} L{x - s},{cy}Z"
    elif kind in ("reboot", "refused"):
        d = f"M{x - s},{cy + s} L{x},{cy - s} L{x + s},{cy + s}Z"
    elif kind == "failed":
        d = f"M{x - s},{cy - s} L{x + s},{cy + s} M{x + s},{cy - s} L{x - s},{cy + s}"
    else:  # restart
        d = f"M{x},{cy - s * 1.6} L{x},{cy + s * 1.6}"
    return f'<path d="{d}" class="m-{kind}">{title}</path>'


def _run_tip(vm: str, r: EntryRun, start: Optional[float]) -> List[str]:
    lines = [f"{vm} entry #{r.index}: {r.executable}", f"status: {r.status}"]
    if r.exit_code is not None:
        lines[-1] += f", exit code {r.exit_code}"
    lines.append(f"started {utc_text(r.start)} {_rel(r.start, start)}")
    if r.end is not None:
        lines.append(f"ran {_secs(r.end - r.start)}")
    if r.lateness is not None:
        lines.append(f"lateness {_secs(r.lateness)}")
    if r.output:
        lines.append(f"{r.output} output line(s)")
    if r.details and r.status not in ("success", "running") and not r.details.startswith("exit code"):
        lines.append(r.details)
    return lines


def _span_tip(name: str, s: Span, start: Optional[float]) -> List[str]:
    when = f"{utc_text(s.start)} {_rel(s.start, start)}"
    if s.end is None:
        return [f"{name}: {s.tip[0]}", when, "not ended in the logs", *s.tip[1:]]
    return [f"{name}: {s.tip[0]}", when, f"lasted {_secs(s.end - s.start)}", *s.tip[1:]]


@dataclass
class _Lanes:
    """Geometry shared by every lane: the time scale, lane height, where open spans stop."""

    x: _Scale
    lane_h: float
    end_t: float  # UTC: open spans are drawn up to here (the last event of the logs)
    start: Optional[float]  # experiment start (UTC)
    labels: bool  # per-entry text labels


def _lane(out: List[str], g: _Lanes, i: int, name: str, v: VmTimeline, name_every: int) -> None:
    """Append the SVG of lane ``i`` (VM ``name``) to ``out``."""
    x, lane_h = g.x, g.lane_h
    y = AXIS + i * lane_h
    font = max(min(11.0, lane_h - 2), 6.0)
    out.append(f'<g class="lane" data-vm="{html.escape(name)}">')
    out.append(
        f'<rect x="0" y="{y}" width="{WIDTH}" height="{lane_h}" class="l{i % 2}">'
        f"{_title([name, f'state: {v.state}'])}</rect>"
    )
    if i % name_every == 0:
        out.append(
            f'<text x="6" y="{y + lane_h / 2 + font * 0.35:.1f}" class="vm" '
            f'style="font-size:{font:.0f}px">{_esc(name, 24)}</text>'
        )
    top, h = y + 1, lane_h - 2
    for s in v.pauses + v.breaks:  # shaded spans behind everything else of the lane
        sx, ex = x(s.start), x(s.end if s.end is not None else g.end_t)
        ends = f' data-end="{s.end!r}"' if s.end is not None else ""
        out.append(
            f'<rect x="{sx}" y="{top}" width="{max(ex - sx, 1.0):.1f}" height="{h}" '
            f'class="{"pa" if s.kind == "pause" else "br"}" data-start="{s.start!r}"{ends}>'
            f"{_title(_span_tip(name, s, g.start))}</rect>"
        )
        if s.kind == "break" and s.end is not None:  # the RESUME that ended it
            out.append(f'<line x1="{ex}" y1="{top}" x2="{ex}" y2="{top + h}" class="rs"/>')
    stage_h = h * 0.42
    for s in v.stages:  # upper part of the lane
        sx, ex = x(s.start), x(s.end if s.end is not None else g.end_t)
        w = max(ex - sx, 1.0)
        box = f'x="{sx}" y="{top}" width="{w:.1f}" height="{stage_h:.1f}"'
        out.append(f'<rect {box} class="st">{_title(_span_tip(name, s, g.start))}</rect>')
        if s.end is None:
            out.append(f'<rect {box} class="open"/>')
        if stage_h >= 8 and w >= 6.2 * len(s.label) + 4:
            out.append(f'<text x="{sx + 2}" y="{top + stage_h - 2:.1f}" class="stl">{_esc(s.label)}</text>')
    # entries: thin bars in the lower part, overlapping runs on up to three rows
    ey, eh = top + stage_h + 1, h - stage_h - 1
    runs = sorted(v.runs, key=lambda r: r.start)
    bars = [(x(r.start), max(x(r.end if r.end is not None else g.end_t), x(r.start) + 2.0)) for r in runs]
    packed = _pack(bars, max(1, min(3, int(eh // 3))))
    row_h = eh / (max(packed) + 1 if packed else 1)
    for r, (sx, ex), row in zip(runs, bars, packed):
        ry = ey + row * row_h
        out.append(
            f'<rect x="{sx}" y="{ry:.1f}" width="{ex - sx:.1f}" height="{max(row_h - 0.6, 1):.1f}" '
            f'class="e-{r.status}">{_title(_run_tip(name, r, g.start))}</rect>'
        )
        if g.labels and row_h >= 9 and ex - sx >= 20:
            out.append(f'<text x="{sx + 2}" y="{ry + row_h - 2:.1f}" class="el">#{r.index}</text>')
    size = max(2.0, min(6.0, lane_h / 4))
    for m in v.markers:
        tip = _title([f"{name}: {m.tip[0]}", f"{utc_text(m.at)} {_rel(m.at, g.start)}", *m.tip[1:]])
        out.append(_marker(m.kind, x(m.at), y + lane_h / 2, size, tip))
    out.append("</g>")


def _vline(x: float, bottom: float, cls: str, t: float, tip: Sequence[str], ident: str = "") -> str:
    """A vertical line across every lane at x (instant ``t``, UTC) with its tooltip."""
    idattr = f' id="{ident}"' if ident else ""
    return (
        f'<line x1="{x}" y1="{AXIS - 4}" x2="{x}" y2="{bottom}" class="{cls}"{idattr} data-t="{t!r}">'
        f"{_title(tip)}</line>"
    )


_DEFS = (
    '<defs><pattern id="hp" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff3c4" fill-opacity=".75"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#e0b000" stroke-width="2"/></pattern>'
    '<pattern id="hb" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)">'
    '<rect width="6" height="6" fill="#ece3f5" fill-opacity=".8"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#9b7bc0" stroke-width="2.5"/></pattern></defs>'
)


def _svg(tl: ExperimentTimeline, names: List[str], facts: Facts, end: Optional[float]) -> str:
    """The timeline SVG (see :func:`render_html`); ``end``: the last event time (UTC)."""
    n = len(names)
    lane_h = 40.0 if n <= 8 else 28.0 if n <= 20 else max(4.0, min(28.0, math.floor(3000 / n)))
    height = round(AXIS + lane_h * max(n, 1) + BOTTOM)
    plot_w = WIDTH - LEFT - RIGHT
    lanes_bottom = AXIS + lane_h * n
    # time range: everything drawn, plus the start, the last configured instant and RESUMEs
    times: List[float] = []
    for v in tl.vms.values():
        times += [t for t in (v.first, v.last, v.configured_at) if t is not None]
    last_conf = facts.last_configured()
    times += [t for t in (facts.start, last_conf[1] if last_conf else None, end) if t is not None]
    times += [r[2] for r in facts.resumes[:MAX_RESUME_LINES] if r[2] is not None]
    if not times:
        times = [0.0]  # nothing to place: empty lanes under a note
    t0, t1 = min(times), max(times)
    end_t = t1
    if t1 - t0 < 0.01:
        t0, t1 = t0 - 0.5, t1 + 0.5
    pad = (t1 - t0) * 0.02
    t0, t1 = t0 - pad, t1 + pad
    x = _Scale(t0, t1, LEFT, LEFT + plot_w)
    out: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" data-t0="{t0!r}" data-t1="{t1!r}" data-x0="{LEFT}" '
        f'data-x1="{LEFT + plot_w}">',
        f"<style>{_CSS_SVG}</style>",
        _DEFS,
        *_legend(16),
        f'<line x1="{LEFT}" y1="{AXIS - 2}" x2="{LEFT + plot_w}" y2="{AXIS - 2}" class="ax"/>',
    ]
    if times == [0.0]:
        out.append(f'<text x="{LEFT}" y="{AXIS - 20}">no events in the logs yet</text>')
    else:  # axis: UTC on the first line, experiment time under it
        step, ticks = _ticks(t0, t1, facts.start, plot_w)
        out.append(
            f'<text x="6" y="{AXIS - 26}" class="tk">UTC {time.strftime("%Y-%m-%d", time.gmtime(t0))}</text>'
        )
        if facts.start is not None:
            out.append(f'<text x="6" y="{AXIS - 13}" class="tk2">experiment time</text>')
        for tick in ticks:
            tx = x(tick)
            out.append(f'<line x1="{tx}" y1="{AXIS - 6}" x2="{tx}" y2="{lanes_bottom}" class="grid"/>')
            label = _utc_tick(tick, step, t1 - t0)
            out.append(f'<text x="{tx}" y="{AXIS - 26}" text-anchor="middle" class="tk">{label}</text>')
            if facts.start is not None:
                rel = _rel(tick, facts.start)
                out.append(f'<text x="{tx}" y="{AXIS - 13}" text-anchor="middle" class="tk2">{rel}</text>')
    g = _Lanes(x, lane_h, end_t, facts.start, n <= LABELS_UP_TO)
    name_every = 1 if lane_h >= 8 else math.ceil(10 / lane_h)
    for i, name in enumerate(names):
        _lane(out, g, i, name, tl.vms.get(name) or VmTimeline(name), name_every)
    # lines across every lane: RESUMEs issued, the last configured instant, the start (barrier)
    for rid, at, issued, targets, _answered in facts.resumes[:MAX_RESUME_LINES]:
        if issued is not None:
            tip = [f"RESUME {rid} issued {utc_text(issued)}", f"stamped t={at}, to {targets} VM(s)"]
            out.append(_vline(x(issued), lanes_bottom, "rl", issued, tip))
    if last_conf is not None:
        tip = [f"last configured: {last_conf[0]} at {utc_text(last_conf[1])}"]
        out.append(_vline(x(last_conf[1]), lanes_bottom, "lastc", last_conf[1], tip, "last-configured"))
    if facts.start is not None:
        tip = [f"experiment start (t=0): {utc_text(facts.start)}"]
        out.append(_vline(x(facts.start), lanes_bottom, "start", facts.start, tip, "start-line"))
    out.append("</svg>")
    return "\n".join(out)


def _table(tl: ExperimentTimeline, names: List[str], facts: Facts) -> str:
    rows = [
        "<table><thead><tr><th>VM</th><th>state</th><th>configured at</th><th>stages</th><th>entries</th>"
        "<th>lateness max</th><th>lateness p50</th><th>failures</th><th>output lines</th>"
        "<th>last seen</th><th>notes</th></tr></thead><tbody>"
    ]
    expected = set(facts.expected)
    for name in names:
        v = tl.vms.get(name) or VmTimeline(name)
        late = v.latenesses()
        conf = "-"
        if v.configured_at is not None:
            conf = f"{utc_text(v.configured_at)} {_rel(v.configured_at, facts.start)}"
        notes = []
        if expected and name not in expected:
            notes.append("not expected")
        if name in facts.excluded:
            notes.append("excluded")
        if name in facts.released:
            notes.append("released")
        if v.restarts:
            notes.append(f"{v.restarts} agent restart(s)")
        if v.refused:
            notes.append(f"{v.refused} control message(s) refused")
        if v.unreadable:
            notes.append(f"{v.unreadable} unusable record(s)")
        if v.dropped:
            notes.append(f"{v.dropped} item(s) not drawn (over {MAX_ITEMS})")
        done = sum(1 for r in v.runs if r.end is not None)
        cls = ' class="failed"' if v.failures else ""
        rows.append(
            f"<tr{cls}><td>{html.escape(name)}</td><td>{v.state}</td><td>{conf}</td>"
            f'<td class="n">{len(v.stages)}</td><td class="n">{done}/{len(v.runs)}</td>'
            f'<td class="n">{_secs(max(late)) if late else "-"}</td>'
            f'<td class="n">{_secs(statistics.median(late)) if late else "-"}</td>'
            f'<td class="n">{v.failures}</td><td class="n">{v.output_lines}</td>'
            f'<td>{utc_text(v.last_seen)}</td><td class="notes">{html.escape("; ".join(notes))}</td></tr>'
        )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _facts_html(facts: Facts, tl: ExperimentTimeline, names: List[str], notes: Sequence[str]) -> str:
    items: List[Tuple[str, str]] = []
    if facts.start is not None:
        src = "" if facts.start_source == "experiment.json" else f" (from {facts.start_source})"
        items.append(("start time (t=0)", f"{utc_text(facts.start)}{src}"))
    else:
        last = facts.last_configured()
        waiting = [
            n for n in (facts.expected or names) if n not in facts.configured and n not in facts.excluded
        ]
        items.append(
            ("start time", "not set yet" + (f"; waiting for {len(waiting)} VM(s)" if waiting else ""))
        )
    if facts.buffer is not None:
        items.append(("start buffer", _secs(facts.buffer)))
    last = facts.last_configured()
    if last is not None:
        items.append(("configured last", f"{last[0]} at {utc_text(last[1])} {_rel(last[1], facts.start)}"))
    if facts.set_at is not None:
        items.append(("start set by the host at", utc_text(facts.set_at)))
    items.append(
        (
            "VMs",
            f"{len(names)} ({len(facts.expected) or len(names)} expected"
            + (f", excluded: {', '.join(facts.excluded)}" if facts.excluded else "")
            + (f", released: {', '.join(facts.released)}" if facts.released else "")
            + ")",
        )
    )
    lates = [x for v in tl.vms.values() for x in v.latenesses()]
    if lates:
        items.append(
            (
                "lateness of positive entries",
                f"max {_secs(max(lates))}, p50 {_secs(statistics.median(lates))} over {len(lates)} run(s)",
            )
        )
    items.append(("RESUMEs issued", str(len(facts.resumes))))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    out = [f"<table>{body}</table>"]
    if facts.resumes:
        head = ("id", "issued", "stamped at (experiment s)", "VMs", "answered")
        out.append("<h2>RESUMEs</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
        for rid, at, issued, targets, answered in facts.resumes:
            when = f"{utc_text(issued)} {_rel(issued, facts.start)}" if issued is not None else "-"
            out.append(
                f'<tr><td>{html.escape(rid)}</td><td>{when}</td><td class="n">{html.escape(at)}</td>'
                f'<td class="n">{targets}</td><td class="n">{answered}</td></tr>'
            )
        out.append("</table>")
    if notes:
        out.append(
            '<h2>Log notes</h2><ul class="notes">'
            + "".join(f"<li>{_esc(n, 300)}</li>" for n in notes)
            + "</ul>"
        )
    return "\n".join(out)


def render_html(
    timeline: ExperimentTimeline,
    experiment: Mapping[str, Any],
    notes: Sequence[str] = (),
    generated_at: Optional[float] = None,
    title: str = "vmr-handler experiment",
) -> str:
    """The report: one HTML document (inline SVG and CSS, no script, no external asset).

    Pure: the same arguments give the same text.

    Args:
        timeline: the folded logs.
        experiment: the content of ``experiment.json`` (``{}`` when there is none): the start
            time (UTC epoch s), buffer (s), configured times, RESUMEs.
        notes: remarks about the logs (unreadable lines, a cut last line), shown at the end.
        generated_at: UTC epoch seconds printed as the time of the report (None: not printed).
        title: the page heading.

    Returns:
        The HTML text. Lanes: every VM of the logs and every expected VM, sorted by name.
    """
    facts = Facts.read(experiment, timeline)
    names = sorted(set(timeline.vms) | set(facts.expected))
    last_times = [v.last for v in timeline.vms.values() if v.last is not None]
    svg = _svg(timeline, names, facts, max(last_times) if last_times else None)
    gen = f"report made {utc_text(generated_at)}; " if generated_at is not None else ""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_esc(title, 200)}</title>",
            f"<style>{_CSS_PAGE}</style></head><body>",
            f"<h1>{_esc(title, 200)}</h1>",
            f'<div class="sub">{gen}{len(names)} VM(s); times in UTC; hover a bar or a mark for details'
            "</div>",
            f'<div class="chart">{svg}</div>',
            "<h2>Experiment</h2>",
            _facts_html(facts, timeline, names, notes),
            "<h2>VMs</h2>",
            _table(timeline, names, facts),
            "</body></html>",
            "",
        ]
    )


def render_report(
    records: Iterable[Mapping[str, Any]],
    experiment: Mapping[str, Any],
    vms: Iterable[str] = (),
    notes: Sequence[str] = (),
    generated_at: Optional[float] = None,
) -> str:
    """Fold ``records`` (host log records, any order of VMs) and render them
    (:func:`render_html`); ``vms`` get a lane even with no record. Pure."""
    timeline = ExperimentTimeline()
    for name in vms:
        timeline.vm(name)
    for rec in records:
        timeline.add(rec)
    return render_html(timeline, experiment, notes, generated_at)


# ----------------------------------------------------------------------------------- I/O
def read_jsonl(path: str, notes: List[str]) -> Iterator[Dict[str, Any]]:
    """The records of one ``<vm>.jsonl``, streamed line by line (read-only: unlike
    :meth:`vmr_handler.host.store.VmLog.open`, which also cuts a partial line and opens the
    files for appending). An unreadable line is skipped and a cut last line (the host is
    writing it, or died writing it) ignored; both are noted in ``notes``."""
    bad = 0
    name = os.path.basename(path)
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    notes.append(f"{name}: a partial last line was ignored")
                    break
                try:
                    rec = json.loads(line)
                except (ValueError, RecursionError):
                    bad += 1
                    continue
                if isinstance(rec, dict):
                    yield rec
                else:
                    bad += 1
    except OSError as exc:
        notes.append(f"{name}: cannot read: {exc.strerror}")
    if bad:
        notes.append(f"{name}: {bad} unreadable line(s) skipped")


def write_report(logs: str, out: str, now: Optional[float] = None) -> str:
    """Read ``<logs>/*.jsonl`` and ``<logs>/experiment.json`` and write the report to ``out``
    atomically (temp file + rename).

    Args:
        logs: the host's logs directory (``docs/host.md``, "Logs").
        out: the HTML file to write.
        now: UTC epoch seconds printed as the report's time (default: the clock).

    Returns:
        ``out``.

    Raises:
        NoLogs: no ``.jsonl`` in ``logs`` (or no such directory).
        OSError: ``out`` cannot be written.
    """
    try:
        files = sorted(f for f in os.listdir(logs) if f.endswith(JSONL_SUFFIX))
    except OSError as exc:
        raise NoLogs(f"cannot read the logs directory {logs}: {exc.strerror}") from exc
    if not files:
        raise NoLogs(f"no <vm>{JSONL_SUFFIX} logs in {logs}")
    notes: List[str] = []
    try:
        experiment = ExperimentStore(logs).load()
    except ValueError as exc:
        notes.append(f"{EXPERIMENT_FILE}: {exc} (the start time shown is what the VMs reported)")
        experiment = {}
    timeline = ExperimentTimeline()
    for f in files:
        vm = f[: -len(JSONL_SUFFIX)]
        lane = timeline.vm(vm)
        for rec in read_jsonl(os.path.join(logs, f), notes):
            lane.add(rec)  # the VM is its log file, whatever a record claims
    text = render_html(
        timeline,
        experiment,
        notes,
        time.time() if now is None else now,
        title=f"vmr-handler experiment: {os.path.basename(os.path.abspath(logs))}",
    )
    atomic_write(out, text.encode("utf-8"), 0o644)
    return out


def cmd_report(args: argparse.Namespace) -> int:
    """``vmr-host report [--logs DIR] [--out FILE]``: write the report, print its path.

    Returns:
        0; 2 (a message on stderr) when the logs directory holds no ``.jsonl``.

    Raises:
        OSError: the output cannot be written (the CLI exits 1).
    """
    out = args.out or os.path.join(args.logs, "report.html")
    try:
        write_report(args.logs, out)
    except NoLogs as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
