"""The report's I/O: :func:`read_jsonl` streams one ``<vm>.jsonl`` host log, :func:`write_report`
folds ``<logs>/*.jsonl`` line by line, reads ``<logs>/experiment.json`` and writes the HTML
atomically, :func:`cmd_report` is the ``vmr-host report`` front end."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, Iterator, List, Optional

from vmr_handler.core.errors import NoLogs
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.host.logs.jsonlread import ReadStats, records_from
from vmr_handler.host.logs.store import EXPERIMENT_FILE, JSONL_SUFFIX, ExperimentStore
from vmr_handler.host.report.fold import ExperimentTimeline
from vmr_handler.host.report.render import render_html


def read_jsonl(path: str, notes: List[str]) -> Iterator[Dict[str, Any]]:
    """The records of one ``<vm>.jsonl``, streamed line by line (read-only: unlike
    :meth:`vmr_handler.host.logs.store.VmLog.open`, which also cuts a partial line and opens the
    files for appending). An unreadable line is skipped and a cut last line (the host is
    writing it, or died writing it) ignored; both are noted in ``notes``."""
    name = os.path.basename(path)
    stats = ReadStats()
    try:
        for _offset, _end, record in records_from(path, 0, stats):
            yield record
    except OSError as exc:
        notes.append(f"{name}: cannot read: {exc.strerror}")
    if stats.partial:
        notes.append(f"{name}: a partial last line was ignored")
    if stats.bad:
        notes.append(f"{name}: {stats.bad} unreadable line(s) skipped")


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
        source=os.path.abspath(logs),
    )
    atomic_write(out, text.encode("utf-8"), 0o644)
    return out


def cmd_report(args: argparse.Namespace) -> int:
    """``vmr-host report [--logs DIR] [--out FILE]``: write the report, print its path.

    Returns:
        0; 2 (a message on stderr) when the logs directory holds no ``.jsonl``; 1 when the
        report cannot be written there (the message says why and what to give instead).
    """
    out = args.out or os.path.join(args.logs, "report.html")
    try:
        write_report(args.logs, out)
    except NoLogs as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vmr-host: error: {unwritable(out, exc)}", file=sys.stderr)
        return 1
    print(out)
    return 0


def unwritable(out: str, exc: OSError) -> str:
    """Why the report cannot be written to ``out``, in the operator's terms (the file they
    named, never the temp file it is written through) and what to do instead."""
    where = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out):
        return f"--out {out} is a directory: name a file (e.g. --out {os.path.join(out, 'report.html')})"
    cannot = f"cannot write the report to {out}"
    if not os.path.isdir(where):
        return f"{cannot}: there is no directory {where} (create it, or give another --out)"
    why = exc.strerror or type(exc).__name__
    return f"{cannot}: {why} (give --out a file in a directory you can write)"
