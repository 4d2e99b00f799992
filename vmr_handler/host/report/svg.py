"""The lanes of the timeline (SPEC sections 4 and 8): one small inline SVG per VM with
its stages, entry runs (and their lateness), pauses, breaks and markers, and the aggregate lane
that stands for a collapsed group of VMs. Pure: functions return text.

Coordinates: x in pixels of the plot (0 at its left edge) for the nominal width
:data:`PLOT_W`; every drawn element also carries its times as ``data-s`` / ``data-e``
(seconds after the chart's origin, :class:`Scale`), from which ``static/timeline.js`` lays it
out again to the window's width and to the zoomed time window: a ``rect`` spans ``s``..``e``,
a ``path`` (a marker) is moved to ``s`` by its ``transform``, a ``line`` is drawn at ``s``, a
``text`` starts at ``s`` and is hidden when ``s``..``e`` is narrower than its ``data-w``.
Times are UTC epoch seconds.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from vmr_handler.core.fsutil import utc_text
from vmr_handler.host.model.stateword import spoken
from vmr_handler.host.report.facts import EntryRun, Marker, Span
from vmr_handler.host.report.fold import VmTimeline
from vmr_handler.host.report.text import _esc, _rel, _secs

#: Up to this many VMs, entries carry a text label (``#index``) where they are wide enough.
LABELS_UP_TO = 200
#: The plot's nominal width, px (the page's script lays the chart out to the window).
PLOT_W = 1000.0
#: Lateness (s) from which it is drawn (a red stub from when the entry was due to its spawn).
LATE_MARK = 0.010
#: Buckets of the aggregate lane of a collapsed group.
AGG_BUCKETS = 200


class Scale:
    """UTC epoch seconds -> x pixels of the plot, linear over ``[t0, t1]`` -> ``[0, width]``;
    :meth:`rel` writes a time as seconds after ``origin`` (the ``data-s`` form)."""

    def __init__(self, t0: float, t1: float, width: float, origin: float) -> None:
        self.t0, self.t1, self.width, self.origin = t0, t1, width, origin
        self.k = width / (t1 - t0)

    def __call__(self, t: float) -> float:
        return round((t - self.t0) * self.k, 1)

    def rel(self, t: float) -> str:
        """``t`` (UTC) as seconds after the origin, to 0.1 ms, without trailing zeros."""
        text = f"{t - self.origin:.4f}".rstrip("0").rstrip(".")
        return "0" if text in ("", "-0") else text


@dataclass
class Lanes:
    """Geometry shared by every lane: the time scale, lane height, where open spans stop.

    Attributes:
        x: the scale. lane_h: lane height, px. end_t: UTC up to which open spans are drawn
        (the last event of the logs, or now). start: experiment start (UTC) or None.
        labels: per-entry text labels.
    """

    x: Scale
    lane_h: float
    end_t: float
    start: Optional[float]
    labels: bool


def title(lines: Iterable[str]) -> str:
    """An SVG ``<title>`` (hover tooltip) of already-cleaned lines."""
    body = "&#10;".join(html.escape(line, quote=False) for line in lines if line)
    return f"<title>{body}</title>"


def _pack(bars: Sequence[Tuple[float, float]], rows: int) -> List[int]:
    """A row (0..rows-1) per bar ``(t_start, t_end)``, sorted by start, so that bars that
    overlap sit on different rows where possible (greedy; the last row takes the overflow).
    On times, not pixels: the rows stay right at any zoom."""
    free = [-math.inf] * rows
    out = []
    for s, e in bars:
        row = next((i for i in range(rows) if free[i] <= s), rows - 1)
        free[row] = max(free[row], e)
        out.append(row)
    return out


def marker(kind: str, x: float, cy: float, s: float, tip: str, rel: str = "", lane_h: float = 0) -> str:
    """A marker centred at (x, cy), half-size ``s`` px, with its tooltip ``tip`` (a
    ``<title>``); ``rel``: its ``data-s``. Drawn around 0 and moved by ``transform``."""
    data = f' data-s="{rel}"' if rel else ""
    at = f'transform="translate({x},0)"{data}'
    if kind == "ignored":
        return f'<circle cx="0" cy="{cy}" r="{max(s * 0.7, 1.5):.1f}" class="m-ignored" {at}>{tip}</circle>'
    if kind == "configured":
        d = f"M0,{cy - s} L{s},{cy} L0,{cy + s} L{-s},{cy}Z"
    elif kind in ("reboot", "refused", "rejected"):
        d = f"M{-s},{cy + s} L0,{cy - s} L{s},{cy + s}Z"
    elif kind == "failed":
        d = f"M{-s},{cy - s} L{s},{cy + s} M{s},{cy - s} L{-s},{cy + s}"
    elif kind == "resume":  # the whole lane: the RESUME this VM received
        half = max(lane_h / 2 - 1, s * 1.6)
        d = f"M0,{cy - half:.1f} L0,{cy + half:.1f}"
    else:  # restart
        d = f"M0,{cy - s * 1.6:.1f} L0,{cy + s * 1.6:.1f}"
    return f'<path d="{d}" class="m-{kind}" {at}>{tip}</path>'


def run_tip(vm: str, r: EntryRun, start: Optional[float]) -> List[str]:
    """Tooltip lines of one entry run: its command line (else its executable), status and exit
    code, start, duration, lateness, the agent's sentence, output count and its last lines."""
    lines = [f"{vm} entry #{r.index}: {r.command or r.executable}"]
    lines.append(f"status: {r.status}" + (f", exit code {r.exit_code}" if r.exit_code is not None else ""))
    lines.append(f"started {utc_text(r.start)} {_rel(r.start, start)}")
    if r.end is not None:
        lines.append(f"ran {_secs(r.end - r.start)}")
    if r.lateness is not None:
        due = ""
        if r.scheduled is not None and r.lateness >= LATE_MARK:
            due = f" (due {utc_text(r.scheduled)} {_rel(r.scheduled, start)})"
        lines.append(f"lateness {_secs(r.lateness)}{due}")
    if r.details and r.status not in ("success", "running") and not r.details.startswith("exit code"):
        lines.append(r.details)
    if r.output:
        lines.append(f"{r.output} output line(s)" + (f", the last {len(r.tail)}:" if r.tail else ""))
        lines += [f"| {line}" for line in r.tail]
    return lines


def span_tip(name: str, s: Span, start: Optional[float]) -> List[str]:
    """Tooltip lines of a stage, pause or break."""
    when = f"{utc_text(s.start)} {_rel(s.start, start)}"
    if s.end is None:
        return [f"{name}: {s.tip[0]}", when, "not ended in the logs", *s.tip[1:]]
    return [f"{name}: {s.tip[0]}", when, f"lasted {_secs(s.end - s.start)}", *s.tip[1:]]


def _bar(g: Lanes, s: float, e: Optional[float], y: float, h: float, cls: str, tip: str = "") -> str:
    """A rect from UTC ``s`` to ``e`` (None: open, drawn to ``g.end_t``), at least 1 px wide."""
    x = g.x
    end = e if e is not None else g.end_t
    sx, ex = x(s), x(end)
    return (
        f'<rect x="{sx}" y="{y:.1f}" width="{max(ex - sx, 1.0):.1f}" height="{h:.1f}" class="{cls}" '
        f'data-s="{x.rel(s)}" data-e="{x.rel(end)}">{tip}</rect>'
    )


def _spans(out: List[str], g: Lanes, name: str, v: VmTimeline) -> float:
    """Pauses and breaks (behind), then stages (upper part); returns the stages' height."""
    top, h = 1.0, g.lane_h - 2
    for s in v.pauses + v.breaks:
        out.append(
            _bar(
                g,
                s.start,
                s.end,
                top,
                h,
                "pa" if s.kind == "pause" else "br",
                title(span_tip(name, s, g.start)),
            )
        )
    stage_h = h * 0.42
    for s in v.stages:
        cls = "stf" if s.kind == "failed stage" else "st"
        out.append(_bar(g, s.start, s.end, top, stage_h, cls, title(span_tip(name, s, g.start))))
        if s.end is None:
            out.append(_bar(g, s.start, None, top, stage_h, "open"))
        if stage_h >= 8:
            need = 6.2 * len(s.label) + 4
            end = s.end if s.end is not None else g.end_t
            shown = "" if g.x(end) - g.x(s.start) >= need else ' visibility="hidden"'
            at = f'data-s="{g.x.rel(s.start)}" data-e="{g.x.rel(end)}" data-w="{need:.0f}"{shown}'
            y = top + stage_h - 2
            out.append(f'<text x="{g.x(s.start) + 2}" y="{y:.1f}" class="stl" {at}>{_esc(s.label)}</text>')
    return stage_h


def _runs(out: List[str], g: Lanes, name: str, v: VmTimeline, stage_h: float) -> None:
    """Entry runs as thin bars in the lower part (overlapping runs on up to three rows), each
    after its lateness stub when it was late by :data:`LATE_MARK` or more."""
    top, h = 1.0, g.lane_h - 2
    ey, eh = top + stage_h + 1, h - stage_h - 1
    runs = sorted(v.runs, key=lambda r: r.start)
    spans = [(r.start, max(r.end if r.end is not None else g.end_t, r.start)) for r in runs]
    packed = _pack(spans, max(1, min(3, int(eh // 3))))
    row_h = eh / (max(packed) + 1 if packed else 1)
    for r, (s, e), row in zip(runs, spans, packed):
        ry, rh = ey + row * row_h, max(row_h - 0.6, 1.0)
        if r.scheduled is not None and r.lateness is not None and r.lateness >= LATE_MARK:
            tip = [
                f"{name} entry #{r.index} late by {_secs(r.lateness)}",
                f"due {utc_text(r.scheduled)} {_rel(r.scheduled, g.start)}",
            ]
            out.append(_bar(g, r.scheduled, r.start, ry, rh, "late", title(tip)))
        out.append(_bar(g, s, e, ry, rh, f"e-{r.status}", title(run_tip(name, r, g.start))))
        if g.labels and row_h >= 9:
            shown = "" if g.x(e) - g.x(s) >= 20 else ' visibility="hidden"'
            out.append(
                f'<text x="{g.x(s) + 2}" y="{ry + row_h - 2:.1f}" class="el" data-s="{g.x.rel(s)}" '
                f'data-e="{g.x.rel(e)}" data-w="20"{shown}>#{r.index}</text>'
            )


def _markers(out: List[str], g: Lanes, name: str, markers: List[Marker]) -> None:
    size = max(2.0, min(6.0, g.lane_h / 4))
    cy = g.lane_h / 2
    for m in markers:
        tip = title([f"{name}: {m.tip[0]}", f"{utc_text(m.at)} {_rel(m.at, g.start)}", *m.tip[1:]])
        out.append(marker(m.kind, g.x(m.at), cy, size, tip, g.x.rel(m.at), g.lane_h))


def lane_tip(v: VmTimeline, word: str) -> List[str]:
    """The lane's own tooltip: name, state word (``word``), counters."""
    lines = [v.name, f"state: {spoken(word)}"]
    if v.rejection:
        lines.append(f"schedule rejected: {v.rejection}")
    done = sum(1 for r in v.runs if r.end is not None)
    lines.append(f"entries: {done} ended of {len(v.runs)} started, {v.failures} failure(s)")
    if v.restarts:
        lines.append(f"agent restarts: {v.restarts}")
    return lines


def lane_svg(g: Lanes, v: VmTimeline, word: str) -> str:
    """One VM's lane: ``<svg class="tl-plot">`` holding ``<g class="lane" data-vm>`` with a
    background rect (the lane's tooltip), pauses, breaks, stages, entry runs, lateness stubs
    and markers, in that order (later ones on top)."""
    name = v.name
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tl-plot" height="{g.lane_h:g}">',
        f'<g class="lane" data-vm="{html.escape(name)}">',
        f'<rect class="bg" x="0" y="0" width="100%" height="{g.lane_h:g}">{title(lane_tip(v, word))}</rect>',
    ]
    stage_h = _spans(out, g, name, v)
    _runs(out, g, name, v, stage_h)
    _markers(out, g, name, v.markers)
    out.append("</g></svg>")
    return "".join(out)


def aggregate_svg(g: Lanes, vms: Sequence[VmTimeline], height: float) -> str:
    """The lane standing for a collapsed group of VMs: per time bucket (of
    :data:`AGG_BUCKETS` over the chart), how many of them were in a stage (upper half, blue)
    and how many entries ran (lower half, green), as bars scaled to the busiest bucket."""
    x = g.x
    t0, t1 = x.t0, x.t1
    step = (t1 - t0) / AGG_BUCKETS
    stages = [0] * (AGG_BUCKETS + 1)
    runs = [0] * (AGG_BUCKETS + 1)

    def add(counts: List[int], s: float, e: Optional[float]) -> None:  # +1 over the buckets s..e
        end = e if e is not None else g.end_t
        i = min(max(int((s - t0) / step), 0), AGG_BUCKETS - 1)
        j = min(max(int((end - t0) / step), i), AGG_BUCKETS - 1)
        counts[i] += 1
        counts[j + 1] -= 1

    for v in vms:
        for sp in v.stages:
            add(stages, sp.start, sp.end)
        for r in v.runs:
            add(runs, r.start, r.end)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tl-plot" height="{height:g}"><g class="agg">']
    half = (height - 2) / 2
    for counts, cls, y0, what in (
        (stages, "agg-st", 1.0, "in a stage"),
        (runs, "agg-e", 1 + half, "entries running"),
    ):
        level, peak = 0, 0
        levels = []
        for c in counts[:AGG_BUCKETS]:
            level += c
            levels.append(level)
            peak = max(peak, level)
        for i, n in enumerate(levels):
            if n:
                bh = max(half * n / peak, 1.0)
                s, e = t0 + i * step, t0 + (i + 1) * step
                tip = title([f"{utc_text(s)} {_rel(s, g.start)}: {n} {what}"])
                out.append(_bar(g, s, e, y0 + half - bh, bh, cls, tip))
    out.append("</g></svg>")
    return "".join(out)
