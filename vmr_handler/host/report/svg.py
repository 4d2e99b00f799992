"""The timeline picture of the report: one inline SVG with a lane per VM (stages, entry runs,
pauses, breaks, markers) under a legend and a time axis (UTC and experiment time), and lines
across every lane for the start (the barrier), the last configured VM and the RESUMEs issued
(SPEC sections 4 and 8). Pure: :func:`timeline_svg` returns text. x positions are pixels,
times UTC epoch seconds."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from vmr_handler.core.fsutil import utc_text
from vmr_handler.host.report.experiment import Facts
from vmr_handler.host.report.facts import EntryRun, Span
from vmr_handler.host.report.fold import ExperimentTimeline, VmTimeline
from vmr_handler.host.report.text import _esc, _rel, _secs

#: Above this many VMs, entries carry no text label (tooltips only).
LABELS_UP_TO = 200
#: RESUME lines drawn across the lanes (all of them are in the facts table).
MAX_RESUME_LINES = 50

WIDTH = 1400  # px, whole SVG
LEFT = 170  # px, VM name column
RIGHT = 24  # px
AXIS = 82  # px, legend (two rows) + time axis above the lanes
BOTTOM = 8  # px

_NICE = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600,
    900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
]  # fmt: skip

_CSS_SVG = """
text{font:11px sans-serif;fill:#222}
.ax{stroke:#bbb;stroke-width:1}.grid{stroke:#e4e4e4;stroke-width:1}
.tk{font-size:10px;fill:#444}.tk2{font-size:10px;fill:#1f4e9c}
.l0{fill:#fafafa}.l1{fill:#f0f2f5}
.st{fill:#9ec5ea;stroke:#5b8fc7;stroke-width:.5}.stf{fill:#f4b6b0;stroke:#c62828;stroke-width:.8}.stl{font-size:10px;fill:#12355b}
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
        ('<rect x="0" y="-8" width="22" height="9" class="stf"/>', "stage ended by a failure"),
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
        cls = "stf" if s.kind == "failed stage" else "st"
        out.append(f'<rect {box} class="{cls}">{_title(_span_tip(name, s, g.start))}</rect>')
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


def timeline_svg(tl: ExperimentTimeline, names: List[str], facts: Facts, end: Optional[float]) -> str:
    """The timeline SVG: a lane per VM of ``names`` (in that order; a VM with no timeline in
    ``tl`` gets an empty lane), the axis over the time range of everything drawn, the start,
    last-configured and RESUME lines from ``facts``. ``end``: the last event time (UTC), where
    spans still open are drawn up to. Pure: returns the ``<svg>...</svg>`` text."""
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
