"""The time axis, the lines across every lane and the legend of the timeline.

* :func:`axis_svg`: ticks labelled in UTC and in experiment time, and marks on the axis for
  the start (the barrier), the last configured VM and every RESUME issued (a RESUME is drawn
  in the lanes of the VMs that received it, by :mod:`vmr_handler.host.report.svg`, never
  across every lane).
* :func:`overlay_svg`: the grid and the lines across every lane (the start, the last
  configured instant), under ``pointer-events: none``.
* :func:`legend_html`: every mark the chart draws.

Ticks are laid out here for the nominal width; ``static/timeline.js`` lays them out again
(same rules) to the window and to the zoomed time window. Pure; times are UTC epoch seconds.
"""

from __future__ import annotations

import math
import time
from typing import List, Optional, Tuple

from vmr_handler.core.fsutil import utc_text
from vmr_handler.host.report.experiment import Facts
from vmr_handler.host.report.svg import Scale, marker, title
from vmr_handler.host.report.text import _rel

#: RESUMEs marked on the axis (all of them are in the facts table).
MAX_RESUME_LINES = 50
#: Height of the axis, px.
AXIS_H = 40
#: About one tick per this many px.
TICK_PX = 110
#: A tick label is written only when its middle is this far (px) from the plot's edges.
LABEL_MARGIN = 36

_NICE = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600,
    900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
]  # fmt: skip


def ticks(t0: float, t1: float, start: Optional[float], plot_width: float) -> Tuple[float, List[float]]:
    """A readable tick step (s) and the tick instants (UTC) within ``[t0, t1]``: about one per
    :data:`TICK_PX` px, aligned on experiment time when ``start`` is known, else on UTC."""
    span = t1 - t0
    step = next(
        (s for s in _NICE if span / s <= plot_width / TICK_PX), _NICE[-1] * math.ceil(span / _NICE[-1] / 10)
    )
    base = start if start is not None else 0.0
    k = math.ceil((t0 - base) / step)
    out: List[float] = []
    while base + k * step <= t1 and len(out) < 1000:
        out.append(base + k * step)
        k += 1
    return step, out


def utc_tick(t: float, step: float, span: float) -> str:
    """A tick's UTC label, as precise as the step needs."""
    ms = round((t % 1) * 1000) % 1000
    if span > 2 * 86400:
        return time.strftime("%m-%d %H:%M", time.gmtime(t))
    if step < 1:
        return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{ms:03d}"[: 2 if step >= 0.1 else 4]
    return time.strftime("%H:%M:%S", time.gmtime(t))


def axis_svg(x: Scale, facts: Facts) -> str:
    """The axis: ``<svg class="tl-axis">`` with ``<g class="tl-ticks">`` (a tick and its two
    labels, ``tk`` UTC and ``tk2`` experiment time, per step) and the marks of the start
    (``data-mark="start"``), the last configured VM and each RESUME issued (``ax-rs``)."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tl-axis" height="{AXIS_H}">',
        f'<line x1="0" y1="{AXIS_H - 0.5}" x2="100%" y2="{AXIS_H - 0.5}" class="ax"/>',
        '<g class="tl-ticks">',
    ]
    step, instants = ticks(x.t0, x.t1, facts.start, x.width)
    for tick in instants:
        tx = x(tick)
        out.append(f'<line x1="{tx}" y1="{AXIS_H - 7}" x2="{tx}" y2="{AXIS_H}" class="tick"/>')
        if LABEL_MARGIN <= tx <= x.width - LABEL_MARGIN:
            out.append(f'<text x="{tx}" y="13" class="tk">{utc_tick(tick, step, x.t1 - x.t0)}</text>')
            if facts.start is not None:
                out.append(f'<text x="{tx}" y="26" class="tk2">{_rel(tick, facts.start)}</text>')
    out.append("</g>")
    cy, s = AXIS_H - 5.0, 5.0
    for res in facts.resumes[:MAX_RESUME_LINES]:
        if res.issued is not None:
            names = ", ".join(res.targets[:8]) + (
                f" and {len(res.targets) - 8} more" if len(res.targets) > 8 else ""
            )
            tip = title(
                [
                    f"RESUME {res.id} issued {utc_text(res.issued)} {_rel(res.issued, facts.start)}",
                    f"stamped t={res.at}, to {len(res.targets)} VM(s): {names}",
                    f"{res.answered} answered (drawn in their lanes)",
                ]
            )
            d = f"M0,{cy + s} L{-s},{cy - s} L{s},{cy - s}Z"
            at = f'transform="translate({x(res.issued)},0)" data-s="{x.rel(res.issued)}"'
            out.append(f'<path d="{d}" class="ax-rs" {at}>{tip}</path>')
    last = facts.last_configured()
    if last is not None:
        tip = title([f"last configured: {last[0]} at {utc_text(last[1])} {_rel(last[1], facts.start)}"])
        out.append(
            marker("configured", x(last[1]), cy, s, tip, x.rel(last[1])).replace(
                "m-configured", "ax-lastc", 1
            )
        )
    if facts.start is not None:
        tip = title([f"experiment start (t=0): {utc_text(facts.start)}"])
        d = f"M0,{AXIS_H} L0,{AXIS_H - 12} M-5,{AXIS_H - 12} L5,{AXIS_H - 12}"
        at = f'transform="translate({x(facts.start)},0)" data-s="{x.rel(facts.start)}"'
        out.append(f'<path d="{d}" class="ax-start" data-mark="start" {at}>{tip}</path>')
    out.append("</svg>")
    return "\n".join(out)


def overlay_svg(x: Scale, facts: Facts) -> str:
    """Lines across every lane: ``<svg class="tl-over">`` with the grid (``tl-grid``), the
    last configured instant (``data-mark="last-configured"``) and the start
    (``data-mark="start"``); ``data-t`` on these two is their UTC time."""
    out = ['<svg xmlns="http://www.w3.org/2000/svg" class="tl-over">', '<g class="tl-grid">']
    _, instants = ticks(x.t0, x.t1, facts.start, x.width)
    for tick in instants:
        tx = x(tick)
        out.append(f'<line x1="{tx}" y1="0" x2="{tx}" y2="100%" class="grid" data-s="{x.rel(tick)}"/>')
    out.append("</g>")
    last = facts.last_configured()
    if last is not None:
        tip = title([f"last configured: {last[0]} at {utc_text(last[1])}"])
        lx = x(last[1])
        out.append(
            f'<line x1="{lx}" y1="0" x2="{lx}" y2="100%" class="lastc" data-mark="last-configured" '
            f'data-t="{last[1]!r}" data-s="{x.rel(last[1])}">{tip}</line>'
        )
    if facts.start is not None:
        tip = title([f"experiment start (t=0): {utc_text(facts.start)}"])
        sx = x(facts.start)
        out.append(
            f'<line x1="{sx}" y1="0" x2="{sx}" y2="100%" class="start" data-mark="start" '
            f'data-t="{facts.start!r}" data-s="{x.rel(facts.start)}">{tip}</line>'
        )
    out.append("</svg>")
    return "\n".join(out)


_LEGEND = (
    ('<rect x="1" y="2" width="20" height="8" class="st"/>', "stage (negative time)"),
    ('<rect x="1" y="2" width="20" height="8" class="stf"/>', "stage ended by a failure"),
    ('<rect x="1" y="3" width="20" height="6" class="e-success"/>', "entry ok"),
    ('<rect x="1" y="3" width="20" height="6" class="e-error"/>', "exit code not 0"),
    ('<rect x="1" y="3" width="20" height="6" class="e-failed"/>', "failed to start"),
    ('<rect x="1" y="3" width="20" height="6" class="e-interrupted"/>', "interrupted (agent stopped)"),
    ('<rect x="1" y="3" width="20" height="6" class="e-killed"/>', "stopped by an operator (vmr-host kill)"),
    ('<rect x="1" y="3" width="20" height="6" class="e-timeout"/>', "stopped at its timeout"),
    ('<rect x="1" y="3" width="20" height="6" class="e-running"/>', "running / not ended"),
    (
        '<rect x="1" y="3" width="8" height="6" class="late"/>'
        '<rect x="9" y="3" width="12" height="6" class="e-success"/>',
        "late start (due to spawned)",
    ),
    ('<rect x="1" y="0" width="20" height="12" class="pa"/>', "pause"),
    ('<rect x="1" y="0" width="20" height="12" class="br"/>', "break (until its RESUME)"),
    ('<path d="M11,0 L11,12" class="m-resume"/>', "RESUME received"),
    ('<circle cx="11" cy="6" r="3.5" class="m-ignored"/>', "RESUME ignored (no break)"),
    ('<path d="M11,1 L16,6 L11,11 L6,6Z" class="m-configured"/>', "configured"),
    ('<path d="M11,12 L11,2 M6,2 L16,2" class="ax-start"/>', "start t=0 (barrier)"),
    ('<path d="M11,2 L16,7 L11,12 L6,7Z" class="ax-lastc"/>', "last configured"),
    ('<path d="M11,11 L6,2 L16,2Z" class="ax-rs"/>', "RESUME issued"),
    ('<path d="M6,11 L11,1 L16,11Z" class="m-reboot"/>', "reboot requested"),
    ('<path d="M11,0 L11,12" class="m-restart"/>', "agent restart"),
    ('<path d="M7,2 L15,10 M15,2 L7,10" class="m-failed"/>', "VM failed"),
    ('<path d="M6,11 L11,1 L16,11Z" class="m-refused"/>', "control refused"),
    ('<path d="M6,11 L11,1 L16,11Z" class="m-rejected"/>', "schedule rejected"),
)


def legend_html(aggregate: bool) -> str:
    """The legend: one ``<span class="tl-li">`` (a small SVG and its words) per mark the chart
    draws, and the aggregate lane's when a group is collapsed."""
    items = list(_LEGEND)
    if aggregate:
        items.append(
            (
                '<rect x="1" y="0" width="20" height="5" class="agg-st"/>'
                '<rect x="1" y="6" width="20" height="6" class="agg-e"/>',
                "collapsed VMs: in a stage / entries running",
            )
        )
    icon = '<svg xmlns="http://www.w3.org/2000/svg" width="22" height="12">'
    spans = "".join(f'<span class="tl-li">{icon}{shape}</svg>{text}</span>' for shape, text in items)
    return f'<div class="tl-legend">{spans}</div>'
