"""The timeline as an HTML fragment: counts and filter bar, legend and time axis (a
sticky head), then one lane per VM, problems first. Shared by the report page and the live
console; driven by ``static/timeline.js`` (zoom, pan, filter, layout to the window).

The fragment is well-formed XML (every element closed, only XML's entities), so a test can
parse it; its root is ``<div class="vmr-tl">`` whose attributes give the scale the server laid
it out with: ``data-t0``/``data-t1`` (UTC of the plot's left and right edges),
``data-x0``/``data-x1`` (0 and the nominal plot width, px), ``data-origin`` (UTC that the
elements' ``data-s``/``data-e`` count from: the start time when known) and ``data-start``.
Pure; times are UTC epoch seconds.
"""

from __future__ import annotations

import dataclasses
import html
import math
import time
from collections import Counter
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from vmr_handler.host.model.stateword import STATES, is_problem, spoken
from vmr_handler.host.report.axis import AXIS_H, MAX_RESUME_LINES, axis_svg, legend_html, overlay_svg
from vmr_handler.host.report.experiment import Facts
from vmr_handler.host.report.fold import ExperimentTimeline, VmTimeline
from vmr_handler.host.report.svg import LABELS_UP_TO, PLOT_W, Lanes, Scale, aggregate_svg, lane_svg

#: Over this many VMs, the VMs that need no one (not a problem, not at a break) start
#: collapsed into one aggregate lane (a click shows them; a filter shows what it matches).
COLLAPSE_OVER = 300
#: State words kept out of the collapsed group, with every problem.
ATTENTION = ("at_break",)
#: Each word's rank: the order of the counts and of the problem lanes.
_RANK = {w: i for i, w in enumerate(STATES)}


#: The hatchings of pauses and breaks (``url(#vmr-hp)``, ``url(#vmr-hb)`` in timeline.css).
_DEFS = (
    '<svg xmlns="http://www.w3.org/2000/svg" class="tl-defs" width="0" height="0" aria-hidden="true">'
    '<defs><pattern id="vmr-hp" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff3c4" fill-opacity=".75"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#e0b000" stroke-width="2"/></pattern>'
    '<pattern id="vmr-hb" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(-45)"><rect width="6" height="6" fill="#ece3f5" fill-opacity=".8"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#9b7bc0" stroke-width="2.5"/></pattern></defs></svg>'
)


def lane_height(n: int) -> float:
    """Lane height (px) for ``n`` lanes: 40 for a few, down to 14 from 61 lanes."""
    return 40.0 if n <= 8 else 28.0 if n <= 20 else 20.0 if n <= 60 else 14.0


def lane_words(
    vms: Sequence[VmTimeline],
    start: Optional[float],
    now: Optional[float],
    live: Optional[Mapping[str, str]] = None,
) -> Dict[str, str]:
    """Each lane's state word (:data:`~vmr_handler.host.model.stateword.STATES`): the running
    host's (``live``, liveness included: the console) when it has one for the VM, else what
    the VM's logs tell at UTC ``now`` (None: its last event), the experiment starting at UTC
    ``start`` (:meth:`~vmr_handler.host.report.fold.VmTimeline.word`)."""
    live = live or {}
    return {v.name: live.get(v.name) or v.word(start, now) for v in vms}


def problem(v: VmTimeline, words: Mapping[str, str]) -> bool:
    """Whether lane ``v`` is a problem, by the rule of every view
    (:func:`~vmr_handler.host.model.stateword.is_problem`)."""
    return is_problem(words[v.name], v.failures)


def order(
    vms: Sequence[VmTimeline], words: Mapping[str, str], collapse: bool
) -> Tuple[List[VmTimeline], List[VmTimeline]]:
    """The lanes in order: the problems first (by their words' order in
    :data:`~vmr_handler.host.model.stateword.STATES`, then by name), then the others by name;
    and the VMs of the collapsed group (the others that are not at a break) when ``collapse``,
    else []."""
    lead = sorted((v for v in vms if problem(v, words)), key=lambda v: (_RANK.get(words[v.name], 99), v.name))
    rest = sorted((v for v in vms if not problem(v, words)), key=lambda v: v.name)
    if not collapse:
        return lead + rest, []
    shown = [v for v in rest if words[v.name] in ATTENTION]
    return lead + shown, [v for v in rest if words[v.name] not in ATTENTION]


def time_range(tl: ExperimentTimeline, facts: Facts, end: Optional[float]) -> Optional[Tuple[float, float]]:
    """``(t0, t1)`` UTC: everything drawn (events, start, last configured, RESUMEs, ``end``)
    with 2 % on each side; None when there is nothing to place."""
    times: List[float] = []
    for v in tl.vms.values():
        times += [t for t in (v.first, v.last, v.configured_at) if t is not None]
    last_conf = facts.last_configured()
    times += [t for t in (facts.start, last_conf[1] if last_conf else None, end) if t is not None]
    times += [r.issued for r in facts.resumes[:MAX_RESUME_LINES] if r.issued is not None]
    if not times:
        return None
    t0, t1 = min(times), max(times)
    if t1 - t0 < 0.01:
        t0, t1 = t0 - 0.5, t1 + 0.5
    pad = (t1 - t0) * 0.02
    return t0 - pad, t1 + pad


def _bar(vms: Sequence[VmTimeline], words: Mapping[str, str]) -> str:
    """Counts per state word, in their order (buttons: a click filters), the problems, the
    filter box, zoom buttons."""
    counts = Counter(words[v.name] for v in vms)
    buttons = ' <span class="tl-sep">·</span> '.join(
        f'<button type="button" class="tl-count" data-cat="{c}" aria-pressed="false" '
        f'title="show only these {counts[c]} VMs (click again: all)">{counts[c]} {spoken(c)}</button>'
        for c in sorted(counts, key=lambda w: _RANK.get(w, 99))  # the model's words: nothing to escape
    )
    problems = sum(1 for v in vms if problem(v, words))
    if problems:
        buttons += f' <span class="tl-sep">·</span> <span class="tl-problems">{problems} problem(s)</span>'
    zoom = "".join(
        f'<button type="button" data-zoom="{z}" title="{tip}">{label}</button>'
        for z, label, tip in (
            ("out", "\u2212", "zoom out (or mouse wheel on the time axis)"),
            ("in", "+", "zoom in (or mouse wheel on the time axis; Ctrl+wheel on the lanes)"),
            ("left", "\u25c0", "move earlier (or drag the axis, Shift+wheel)"),
            ("right", "\u25b6", "move later"),
            ("fit", "fit", "the whole experiment"),
        )
    )
    return (
        '<div class="tl-bar">'
        f'<span class="tl-counts"><b class="tl-total">{len(vms)} VMs:</b> {buttons}</span>'
        '<label class="tl-flt">filter <input type="search" class="tl-filter" placeholder="VM name" '
        'autocomplete="off" spellcheck="false" /></label>'
        f'<span class="tl-shown" aria-live="polite">{len(vms)} shown</span>'
        f'<span class="tl-zoom" role="group" aria-label="time zoom">{zoom}</span></div>'
    )


def _until(g: Lanes, ends: Optional[Mapping[str, float]], vm: str) -> Lanes:
    """``g`` with open spans stopping at ``ends[vm]`` when that is earlier than ``g.end_t``."""
    end = ends.get(vm) if ends else None
    return dataclasses.replace(g, end_t=end) if end is not None and end < g.end_t else g


def _lane_row(g: Lanes, v: VmTimeline, words: Mapping[str, str], grouped: bool) -> str:
    word = html.escape(words[v.name])
    name = html.escape(v.name)
    grp = ' data-grp="1"' if grouped else ""
    bad = ' data-problem="1"' if problem(v, words) else ""
    return (
        f'<div class="tl-lane" data-vm="{name}" data-cat="{word}"{bad}{grp}>'
        f'<div class="tl-name" title="{name}: {spoken(word)}"><i class="tl-dot"></i>{name}</div>'
        f"{lane_svg(g, v, words[v.name])}</div>"
    )


def _aggregate_row(g: Lanes, group: List[VmTimeline], words: Mapping[str, str]) -> str:
    counts = Counter(words[v.name] for v in group)
    what = ", ".join(f"{counts[c]} {spoken(c)}" for c in sorted(counts, key=lambda w: _RANK.get(w, 99)))
    return (
        '<div class="tl-lane tl-agg" data-agg="1">'
        f'<div class="tl-name"><button type="button" class="tl-expand" aria-expanded="false" '
        f'title="{len(group)} VMs that need no one ({html.escape(what)}): click to show or hide their lanes">'
        f"\u25b8 {len(group)} more VMs</button></div>{aggregate_svg(g, group, g.lane_h * 2)}</div>"
    )


def fragment(
    tl: ExperimentTimeline,
    facts: Facts,
    now: Optional[float] = None,
    ends: Optional[Mapping[str, float]] = None,
    live: Optional[Mapping[str, str]] = None,
) -> str:
    """The timeline fragment (module docstring) of every VM of ``tl`` and every expected VM.

    Args:
        tl: the folded logs (not changed). facts: what experiment.json says (:class:`Facts`).
        now: UTC epoch seconds up to which open spans (a running entry, a break not yet
            resumed) are drawn; None: up to the last event of the logs (a finished report).
        ends: VM -> UTC epoch seconds up to which that VM's open spans are drawn instead, when
            earlier (a ``lost`` VM's: when its agent was last heard from).
        live: VM -> its state word as the running host says it (the console); the others'
            words are what their logs tell (:func:`lane_words`).

    Returns:
        HTML text, ``<div class="vmr-tl" ...>...</div>``.
    """
    vms = list(tl.vms.values())
    vms += [VmTimeline(n) for n in facts.expected if n not in tl.vms]  # a lane even without a log
    collapse = len(vms) > COLLAPSE_OVER
    last_times = [v.last for v in vms if v.last is not None]
    end = now if now is not None else (max(last_times) if last_times else None)
    words = lane_words(vms, facts.start, end, live)
    lanes, group = order(vms, words, collapse)
    span = time_range(tl, facts, end)
    t0, t1 = span if span is not None else (0.0, 1.0)
    origin = facts.start if facts.start is not None else float(math.floor(t0))
    x = Scale(t0, t1, PLOT_W, origin)
    lane_h = lane_height(len(vms))
    g = Lanes(x, lane_h, end if end is not None else t1, facts.start, len(vms) <= LABELS_UP_TO)
    start = f' data-start="{facts.start!r}"' if facts.start is not None else ""
    out = [
        f'<div class="vmr-tl{" tl-collapsed" if group else ""}" data-t0="{t0!r}" data-t1="{t1!r}" '
        f'data-x0="0" data-x1="{PLOT_W:g}" data-origin="{origin!r}"{start} data-vms="{len(vms)}">',
        _DEFS,
        '<div class="tl-head">',
        _bar(vms, words),
        legend_html(bool(group)),
        f'<div class="tl-axisrow" style="height:{AXIS_H}px"><div class="tl-name tl-axlabel">',
    ]
    if span is None:
        out.append('<div>no events in the logs yet</div></div><div class="tl-axcell"></div></div></div>')
    else:
        out.append(f'<div class="tk">UTC {time.strftime("%Y-%m-%d", time.gmtime(t0))}</div>')
        if facts.start is not None:
            out.append('<div class="tk2">experiment time</div>')
        out.append(f'</div><div class="tl-axcell">{axis_svg(x, facts)}</div></div></div>')
    out.append(f'<div class="tl-lanes" style="--lh:{lane_h:g}px">')
    out.append(overlay_svg(x, facts))
    out += [_lane_row(_until(g, ends, v.name), v, words, False) for v in lanes]
    if group:
        out.append(_aggregate_row(g, group, words))
        out += [_lane_row(_until(g, ends, v.name), v, words, True) for v in group]
    out.append("</div></div>")
    return "\n".join(out)
