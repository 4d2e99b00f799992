"""The report page and the timeline fragment it shares with the live console.

* :func:`timeline_fragment`: the timeline as an HTML fragment (counts and filter bar, legend,
  time axis, one lane per VM), what ``GET /api/v1/timeline`` of the console answers and what
  the report embeds; ``static/timeline.js`` (``VmrTimeline.attach``) drives it.
* :func:`render_html`: the whole report, one self-contained HTML document: the experiment's
  name, the fragment, the experiment's facts and the VM table, with ``static/timeline.css``
  and ``static/timeline.js`` inlined (nothing is fetched; it works offline).
* :func:`render_report`: fold records and render them.

Pure: the same arguments give the same text.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any, Iterable, Mapping, Optional, Sequence

from vmr_handler.core.errors import InternalError
from vmr_handler.core.fsutil import utc_text
from vmr_handler.host.report.chart import COLLAPSE_OVER, fragment, lane_words, order
from vmr_handler.host.report.experiment import Facts
from vmr_handler.host.report.fold import ExperimentTimeline, VmTimeline
from vmr_handler.host.report.table import facts_html, vm_table
from vmr_handler.host.report.text import _esc

#: The report's title when experiment.json names no experiment.
DEFAULT_TITLE = "vmr-handler experiment"
#: Id of the report's VM table (the timeline's filter applies to its rows).
TABLE_ID = "vmr-vms"

_CSS_PAGE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 16px 16px;color:#222;background:#fff}
h1{font-size:20px;margin:12px 0 2px}h2{font-size:16px;margin:20px 0 6px}
.sub{color:#555;margin-bottom:6px}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:2px 8px;text-align:left}
th{background:#f0f2f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.problem td{background:#fde8e8}tr[hidden]{display:none}.notes{color:#8a5a00}
td.kpi{white-space:nowrap;font-variant-numeric:tabular-nums}
svg.spark{vertical-align:middle}svg.spark .spark-bg{fill:#f3f5f8}
svg.spark polyline{fill:none;stroke:#3b6fd1;stroke-width:1.2}
"""


@functools.cache
def static_text(name: str) -> str:
    """The text of ``static/<name>`` of this package (``timeline.js``, ``timeline.css``).

    Raises:
        OSError: the file is missing (a broken install: ``package-data`` in pyproject).
    """
    return (importlib.resources.files("vmr_handler.host.report") / "static" / name).read_text(
        encoding="utf-8"
    )


def timeline_fragment(
    timeline: ExperimentTimeline,
    experiment: Mapping[str, Any],
    now: Optional[float] = None,
    table_id: Optional[str] = None,
    ends: Optional[Mapping[str, float]] = None,
    live: Optional[Mapping[str, str]] = None,
) -> str:
    """The timeline as an HTML fragment, no ``<html>``/``<head>``, no script, no style (the page
    loads ``static/timeline.css`` and ``static/timeline.js`` and calls
    ``VmrTimeline.attach(element)`` on it).

    Args:
        timeline: the folded logs (not changed).
        experiment: the content of ``experiment.json`` (``{}`` when none): start time,
            expected VMs, configured times, RESUMEs.
        now: UTC epoch seconds up to which open spans are drawn (a live experiment); None:
            up to the last event of the logs.
        table_id: the id of a table whose ``tr[data-vm]`` rows the filter also applies to.
        ends: VM -> UTC epoch seconds up to which that VM's open spans are drawn when earlier
            than ``now`` (a ``lost`` VM's: when its agent was last heard from).
        live: VM -> its state word as the running host says it (the console: liveness
            included); a VM not in it gets the word its logs tell.

    Returns:
        ``<div class="vmr-tl" data-t0 data-t1 data-x0 data-x1 data-origin [data-start]
        data-vms [data-table]>``: the counts per state (buttons that filter), the filter box,
        the zoom buttons, the legend and the time axis (a sticky head), then one lane per VM
        (``<div class="tl-lane" data-vm data-cat>``), problems first; over
        :data:`~vmr_handler.host.report.chart.COLLAPSE_OVER` VMs, those that need no one are
        collapsed behind one aggregate lane. Well-formed XML.
    """
    text = fragment(timeline, Facts.read(experiment, timeline), now, ends, live)
    if table_id:
        text = text.replace('<div class="vmr-tl', f'<div data-table="{_esc(table_id)}" class="vmr-tl', 1)
    return text


def render_html(
    timeline: ExperimentTimeline,
    experiment: Mapping[str, Any],
    notes: Sequence[str] = (),
    generated_at: Optional[float] = None,
    title: Optional[str] = None,
    source: str = "",
) -> str:
    """The report: one self-contained HTML document (inline CSS and script, nothing fetched).

    Args:
        timeline: the folded logs.
        experiment: the content of ``experiment.json`` (``{}`` when there is none).
        notes: remarks about the logs (unreadable lines, a cut last line), shown at the end.
        generated_at: UTC epoch seconds printed as the time of the report (None: not printed).
        title: the heading when ``experiment`` has no ``name`` (default
            :data:`DEFAULT_TITLE`).
        source: where the logs were read (printed under the title; "" for none).

    Returns:
        The HTML text: the title (the experiment's name), :func:`timeline_fragment`, the
        experiment's facts and the VM table (rows in the lanes' order).
    """
    facts = Facts.read(experiment, timeline)
    heading = facts.name or title or DEFAULT_TITLE
    vms = list(timeline.vms.values()) + [VmTimeline(n) for n in facts.expected if n not in timeline.vms]
    last_times = [v.last for v in vms if v.last is not None]
    words = lane_words(vms, facts.start, max(last_times) if last_times else None)
    rows, _ = order(vms, words, False)
    gen = f"report made {utc_text(generated_at)}; " if generated_at is not None else ""
    src = f"logs: {_esc(source, 300)}; " if source else ""
    hint = "click a count to show only those VMs, hover or click a bar for details, wheel on the axis to zoom"
    collapsed = (
        f"; the {COLLAPSE_OVER}+ VMs that need no one are collapsed" if len(vms) > COLLAPSE_OVER else ""
    )
    script = static_text("timeline.js")
    if "</script" in script.lower():  # inlined: it must not end its own element
        raise InternalError("static/timeline.js holds '</script'")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_esc(heading, 200)}</title>",
            f"<style>{_CSS_PAGE}{static_text('timeline.css')}</style></head><body>",
            f"<h1>{_esc(heading, 200)}</h1>",
            f'<div class="sub">{gen}{src}{len(vms)} VM(s); times in UTC and experiment time; '
            f"{hint}{collapsed}</div>",
            timeline_fragment(timeline, experiment, None, TABLE_ID),
            "<h2>Experiment</h2>",
            facts_html(facts, vms, notes),
            "<h2>VMs</h2>",
            vm_table(rows, facts, words, TABLE_ID),
            f"<script>{script}</script>",
            '<script>VmrTimeline.attach(document.querySelector(".vmr-tl"));</script>',
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
