"""The report page: :func:`render_html` turns folded logs (:class:`ExperimentTimeline`) and the
contents of ``experiment.json`` into one HTML document (the timeline SVG of
:mod:`vmr_handler.host.report.svg`, the experiment facts, the RESUMEs, a table of the VMs; inline
CSS, no script, no external asset); :func:`render_report` folds records and renders them. Pure:
the same arguments give the same text."""

from __future__ import annotations

import html
import statistics
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.fsutil import utc_text
from vmr_handler.host.report.experiment import Facts
from vmr_handler.host.report.fold import MAX_ITEMS, ExperimentTimeline, VmTimeline
from vmr_handler.host.report.svg import timeline_svg
from vmr_handler.host.report.text import _esc, _rel, _secs

_CSS_PAGE = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:20px 0 6px}
.sub{color:#555;margin-bottom:10px}.chart{overflow-x:auto;border:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:2px 8px;text-align:left}
th{background:#f0f2f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.failed td{background:#fde8e8}.notes{color:#8a5a00}
"""


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
    svg = timeline_svg(timeline, names, facts, max(last_times) if last_times else None)
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
