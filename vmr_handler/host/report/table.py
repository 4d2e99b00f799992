"""The report's tables: the experiment's facts (start, buffer, who configured last, lateness,
RESUMEs, notes on the logs) and one row per VM with its counters and KPI sparklines (CPU % and
memory used %). Pure: functions return HTML text; times are UTC epoch seconds."""

from __future__ import annotations

import html
import statistics
from typing import List, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.fsutil import utc_text
from vmr_handler.host.model.stateword import is_problem, spoken
from vmr_handler.host.report.experiment import Facts
from vmr_handler.host.report.facts import KpiSeries
from vmr_handler.host.report.fold import MAX_ITEMS, VmTimeline
from vmr_handler.host.report.text import _esc, _rel, _secs

#: Sparkline size, px.
SPARK_W, SPARK_H = 90, 18


def spark(series: KpiSeries, span: Optional[Tuple[float, float]], what: str) -> str:
    """A sparkline (inline SVG polyline, 0-100 % high) of ``series`` over the time ``span``
    (UTC; the same for every VM, so they line up) and its last value; "-" without samples."""
    points = series.values()
    if not points or span is None or series.last is None:
        return "-"
    t0, t1 = span
    k = (SPARK_W - 2) / (t1 - t0) if t1 > t0 else 0.0
    xy = " ".join(f"{1 + (t - t0) * k:.0f},{SPARK_H - 1 - v * (SPARK_H - 2) / 100:.0f}" for t, v in points)
    tip = (
        f"{what}: last {series.last:.0f} %, min {series.low or 0:.0f} %, max {series.high or 0:.0f} % "
        f"({series.samples} samples)"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" width="{SPARK_W}" height="{SPARK_H}">'
        f"<title>{html.escape(tip)}</title>"
        f'<rect width="{SPARK_W}" height="{SPARK_H}" class="spark-bg"/><polyline points="{xy}"/></svg>'
        f" {series.last:.0f}&#160;%"
    )


def kpi_span(vms: Sequence[VmTimeline]) -> Optional[Tuple[float, float]]:
    """The time span (UTC) of every VM's KPI samples, or None when there are none."""
    firsts = [s.values()[0][0] for v in vms for s in (v.cpu, v.mem) if s.samples]
    lasts = [s.values()[-1][0] for v in vms for s in (v.cpu, v.mem) if s.samples]
    return (min(firsts), max(lasts)) if firsts else None


def _notes(v: VmTimeline, facts: Facts) -> List[str]:
    notes = []
    if facts.expected and v.name not in facts.expected:
        notes.append("not expected")
    if v.name in facts.excluded:
        notes.append("excluded")
    if v.name in facts.released:
        notes.append("released")
    if v.rejection:
        notes.append(f"schedule rejected: {v.rejection}")
    if v.restarts:
        notes.append(f"{v.restarts} agent restart(s)")
    if v.refused:
        notes.append(f"{v.refused} control message(s) refused")
    if v.unreadable:
        notes.append(f"{v.unreadable} unusable record(s)")
    if v.dropped:
        notes.append(f"{v.dropped} item(s) not drawn (over {MAX_ITEMS})")
    return notes


def vm_table(
    vms: Sequence[VmTimeline], facts: Facts, words: Mapping[str, str], table_id: str = "vmr-vms"
) -> str:
    """One row per VM, in the order given (the lanes' order): state (``words``: VM -> its
    state word, :func:`~vmr_handler.host.report.chart.lane_words`),
    configured at, stages, entries ended/started, lateness max and p50, failures, output lines,
    CPU % and memory % sparklines, last seen, notes. A problem row has class ``problem``; every
    row ``data-vm`` and ``data-cat`` (the timeline's filter applies to them)."""
    rows = [
        f'<table id="{table_id}" class="vms"><thead><tr><th>VM</th><th>state</th><th>configured at</th>'
        "<th>stages</th><th>entries</th><th>lateness max</th><th>lateness p50</th><th>failures</th>"
        "<th>output lines</th><th>CPU</th><th>memory</th><th>last seen</th><th>notes</th></tr></thead><tbody>"
    ]
    span = kpi_span(vms)
    for v in vms:
        late = v.latenesses()
        conf = "-"
        if v.configured_at is not None:
            conf = f"{utc_text(v.configured_at)} {_rel(v.configured_at, facts.start)}"
        done = sum(1 for r in v.runs if r.end is not None)
        cls = ' class="problem"' if is_problem(words[v.name], v.failures) else ""
        name, cat = html.escape(v.name), html.escape(words[v.name])
        rows.append(
            f'<tr{cls} data-vm="{name}" data-cat="{cat}"><td>{name}</td><td>{spoken(cat)}</td><td>{conf}</td>'
            f'<td class="n">{len(v.stages)}</td><td class="n">{done}/{len(v.runs)}</td>'
            f'<td class="n">{_secs(max(late)) if late else "-"}</td>'
            f'<td class="n">{_secs(statistics.median(late)) if late else "-"}</td>'
            f'<td class="n">{v.failures}</td><td class="n">{v.output_lines}</td>'
            f'<td class="kpi">{spark(v.cpu, span, "CPU")}</td>'
            f'<td class="kpi">{spark(v.mem, span, "memory used")}</td><td>{utc_text(v.last_seen)}</td>'
            f'<td class="notes">{html.escape("; ".join(_notes(v, facts)))}</td></tr>'
        )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _start_items(facts: Facts, names: List[str]) -> List[Tuple[str, str]]:
    items: List[Tuple[str, str]] = []
    if facts.start is not None:
        src = "" if facts.start_source == "experiment.json" else f" (from {facts.start_source})"
        items.append(("start time (t=0)", f"{utc_text(facts.start)}{src}"))
    else:
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
    return items


def facts_html(facts: Facts, vms: Sequence[VmTimeline], notes: Sequence[str]) -> str:
    """The experiment: start time, buffer, who configured last, VMs, lateness of positive
    entries, RESUMEs issued (and a table of them), then the notes on the logs."""
    names = [v.name for v in vms]
    items = _start_items(facts, names)
    items.append(
        (
            "VMs",
            f"{len(names)} ({len(facts.expected) or len(names)} expected"
            + (f", excluded: {', '.join(facts.excluded)}" if facts.excluded else "")
            + (f", released: {', '.join(facts.released)}" if facts.released else "")
            + ")",
        )
    )
    lates = [x for v in vms for x in v.latenesses()]
    if lates:
        items.append(
            (
                "lateness of positive entries",
                f"max {_secs(max(lates))}, p50 {_secs(statistics.median(lates))} over {len(lates)} run(s)",
            )
        )
    items.append(("RESUMEs issued", str(len(facts.resumes))))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    out = [f'<table class="facts">{body}</table>']
    if facts.resumes:
        head = ("id", "issued", "stamped at (experiment s)", "VMs", "answered")
        out.append("<h2>RESUMEs</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
        for r in facts.resumes:
            when = f"{utc_text(r.issued)} {_rel(r.issued, facts.start)}" if r.issued is not None else "-"
            who = ", ".join(r.targets[:6]) + (f" and {len(r.targets) - 6} more" if len(r.targets) > 6 else "")
            out.append(
                f'<tr><td>{html.escape(r.id)}</td><td>{when}</td><td class="n">{html.escape(r.at)}</td>'
                f'<td title="{html.escape(who)}" class="n">{len(r.targets)}</td>'
                f'<td class="n">{r.answered}</td></tr>'
            )
        out.append("</table>")
    if notes:
        out.append(
            '<h2>Log notes</h2><ul class="notes">'
            + "".join(f"<li>{_esc(n, 300)}</li>" for n in notes)
            + "</ul>"
        )
    return "\n".join(out)
