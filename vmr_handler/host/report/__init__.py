"""``vmr-host report``: the experiment timeline as one self-contained HTML file (SPEC section 8).

SPEC section 8 asks for "an experiment timeline report (HTML with SVG or a PNG: every VM, its
stages, the barrier, positive entries, pauses and breaks) that a person would rather look at
than read". The picture follows the time semantics of SPEC section 4: negative stages, the
``configured`` instant, the one experiment start time (the barrier), positive entries with
their lateness, pauses and breaks ended by a RESUME.

Two layers:

* pure: :class:`ExperimentTimeline` folds host log records (``{"vm", "host_received",
  "event": {"timestamp", "type", "id", "data"}}``, ``docs/host.md``) one at a time into a
  small per-VM summary (spans, markers, counters, each entry run's command line and last
  output lines, KPI series of bounded length), :func:`timeline_fragment` turns it and the
  contents of ``experiment.json`` into the timeline as an HTML fragment (shared with the live
  console, ``GET /api/v1/timeline``) and :func:`render_html` into the whole page
  (the fragment, the facts and the VM table, with ``static/timeline.css`` and
  ``static/timeline.js`` inlined: one self-contained file, nothing fetched).
  :func:`render_report` folds and renders.
* I/O: :func:`write_report` streams ``<logs>/*.jsonl`` line by line through the fold, reads
  ``<logs>/experiment.json`` and writes the HTML atomically; :func:`cmd_report` is the
  command-line front end.

Modules: :mod:`~vmr_handler.host.report.text` (cleaning guest strings, formatting numbers),
:mod:`~vmr_handler.host.report.facts` (spans, entry runs, markers, KPI series),
:mod:`~vmr_handler.host.report.fold` (the fold: one handler per event type, and the host's
one model of each VM, which gives its lane's state word),
:mod:`~vmr_handler.host.report.experiment` (what ``experiment.json`` says),
:mod:`~vmr_handler.host.report.svg` (one lane's picture), :mod:`~vmr_handler.host.report.axis`
(time axis, lines across the lanes, legend), :mod:`~vmr_handler.host.report.chart` (the
fragment: counts, lanes in order, the collapsed group), :mod:`~vmr_handler.host.report.table`
(facts and VM table with sparklines), :mod:`~vmr_handler.host.report.render` (the fragment
and the page), :mod:`~vmr_handler.host.report.files` (the I/O and the command). The browser
side is ``static/timeline.js`` (``VmrTimeline.attach``: layout to the window, zoom, pan,
filter) and ``static/timeline.css``. This package re-exports the public names; a limit is
read in the module that defines it (patch it there, e.g. ``fold.MAX_ITEMS``).

Every guest is hostile (SPEC section 7): every string taken from a log is made printable,
cut to :data:`MAX_LABEL` characters and HTML-escaped; numbers that are not finite are
ignored; an event time further than :data:`MAX_SKEW` seconds from the host's receive time
is replaced by the receive time (a guest can only misplace its own marks, by at most that
much); at most :data:`MAX_ITEMS` spans and markers of each kind are kept per VM (the rest
are counted). All times are UTC epoch seconds unless said otherwise; "experiment time" is
seconds after the experiment start time (negative before it).

May import: ``host.model``, ``host.logs``, ``core``.
"""

from __future__ import annotations

from vmr_handler.host.report.axis import MAX_RESUME_LINES
from vmr_handler.host.report.chart import COLLAPSE_OVER, lane_words
from vmr_handler.host.report.experiment import Facts
from vmr_handler.host.report.facts import EntryRun, KpiSeries, Marker, Span
from vmr_handler.host.report.files import cmd_report, read_jsonl, write_report
from vmr_handler.host.report.fold import (
    MAX_ITEMS,
    MAX_SKEW,
    ExperimentTimeline,
    VmTimeline,
)
from vmr_handler.host.report.render import render_html, render_report, timeline_fragment
from vmr_handler.host.report.svg import LABELS_UP_TO
from vmr_handler.host.report.text import MAX_LABEL

__all__ = [
    "COLLAPSE_OVER",
    "LABELS_UP_TO",
    "MAX_ITEMS",
    "MAX_LABEL",
    "MAX_RESUME_LINES",
    "MAX_SKEW",
    "EntryRun",
    "ExperimentTimeline",
    "Facts",
    "KpiSeries",
    "Marker",
    "Span",
    "VmTimeline",
    "cmd_report",
    "lane_words",
    "read_jsonl",
    "render_html",
    "render_report",
    "timeline_fragment",
    "write_report",
]
