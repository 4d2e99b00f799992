"""``vmr-host schedule show VM [--json]``: a VM's schedule as the host delivered it and what
became of every entry, from the logs directory alone, with or without a
running host.

``vmr-host serve`` writes ``<logs>/schedules.json`` when it starts
(:func:`~vmr_handler.host.logs.logsdir.write_index`: each VM's schedule file, format and
sha256); ``schedule show`` loads that file with the same restricted loader, refuses it when it
changed since (the digest differs: it would show another schedule), plans it with the RESUMEs
the VM received (``core/timeline.build_plan``) and folds the VM's ``<vm>.jsonl``
(``report/fold.py``) for each entry's runs, pauses and breaks.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

from vmr_handler.core.errors import UsageError
from vmr_handler.core.fsutil import utc_text
from vmr_handler.core.readable import duration, number
from vmr_handler.host.cli.logs import log_path, start_time
from vmr_handler.host.cli.statustext import when
from vmr_handler.host.logs.logsdir import INDEX_FILE
from vmr_handler.host.report.facts import EntryRun, Span
from vmr_handler.host.report.files import read_jsonl
from vmr_handler.host.report.fold import VmTimeline

#: Where an entry's command line is shown to run (the agent's default ``--launch-dir``).
LAUNCH_DIR = "/var/launch"


def add_arguments(schedule: argparse.ArgumentParser) -> None:
    """The ``schedule`` command's ``show`` and ``add`` subcommands."""
    from vmr_handler.host.cli.options import add_logs
    from vmr_handler.host.cli.schedule.add import add_parser

    actions = schedule.add_subparsers(dest="schedule_cmd", metavar="{show,add}", required=True)
    show = actions.add_parser("show", help="the VM's schedule as delivered, each entry's outcome")
    show.add_argument("vm", metavar="VM")
    add_logs(show)
    show.add_argument("--json", action="store_true", help="print one JSON object")
    add_parser(actions, add_logs)


def run(args: argparse.Namespace) -> int:
    """``schedule show`` or ``schedule add``; the exit code."""
    if args.schedule_cmd == "add":
        from vmr_handler.host.cli.schedule.add import cmd_schedule_add

        return cmd_schedule_add(args)
    return cmd_schedule_show(args)


def _delivered(logs: str, vm: str) -> Dict[str, Any]:
    """The VM's entry of ``schedules.json``.

    Raises:
        UsageError: no index (no host that keeps one ran on these logs) or no such VM.
    """
    path = os.path.join(logs, INDEX_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            index = json.load(fh)
    except FileNotFoundError:
        raise UsageError(
            f"{path} is missing: start vmr-host serve on these logs once (it writes it)"
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    item = index.get(vm) if isinstance(index, dict) else None
    if not isinstance(item, dict):
        from vmr_handler.core.readable import unknown_text

        known = sorted(index) if isinstance(index, dict) else []
        raise UsageError(f"no schedule in {path}: {unknown_text([vm], known)}")
    return item


def load_delivered(logs: str, vm: str) -> Any:
    """The VM's schedule (:class:`~vmr_handler.core.schedule.model.Schedule`) as delivered.

    Raises:
        UsageError: no index or no such VM, the file is gone or changed since the host
            delivered it, or it does not load (the loader's message).
    """
    from vmr_handler.core.errors import ScheduleError
    from vmr_handler.core.schedule.loader import load_schedule_bytes

    item = _delivered(logs, vm)
    path = str(item.get("path"))
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read the schedule of {vm}, {path}: {exc.strerror}") from exc
    if hashlib.sha256(raw).hexdigest() != item.get("sha256"):
        raise UsageError(
            f"{path} changed since the host delivered it to {vm} (sha256 {str(item.get('sha256'))[:12]}...); "
            "it would show another schedule"
        )
    try:
        return load_schedule_bytes(raw)
    except ScheduleError as exc:
        raise UsageError(f"{path}: {exc}") from exc


def _received_resumes(records: List[Dict[str, Any]], entries: int) -> List[Tuple[float, int]]:
    """The experiment times (``at``; ``-inf`` before the start) of the RESUMEs the VM received,
    each with how many entries its schedule had then (``entries`` at first, more after each
    ``schedule_appended``: a RESUME never ends a break appended after it)."""
    out: List[Tuple[float, int]] = []
    for rec in records:
        ev = rec.get("event")
        if not isinstance(ev, dict) or not isinstance(ev.get("data"), dict):
            continue
        data: Dict[str, Any] = ev["data"]
        if ev.get("type") == "schedule_appended":
            with contextlib.suppress(TypeError, ValueError):
                entries = max(entries, int(data["first_index"]) + int(data["count"]))
        elif ev.get("type") == "resume_received":
            at = data.get("at")
            try:
                value = float(at)  # type: ignore[arg-type]  # TypeError caught
            except (TypeError, ValueError):
                continue
            if not math.isnan(value):
                out.append((value, entries))
    return out


def with_appended(logs: str, vm: str, schedule: Any, stages: Dict[int, int]) -> Any:
    """``schedule`` with the batches ``vm`` appended (``vmr-host schedule add``), numbered as
    the agent numbered them; a batch that no longer loads is left out with a note on stderr.
    ``stages`` is filled with the stage the agent gave each appended negative entry (its own,
    after every stage of the schedule: not the one the plan of the whole list would say)."""
    from vmr_handler.core.errors import ScheduleError
    from vmr_handler.core.schedule.appended import batch_entries, extended
    from vmr_handler.host.serve.experiment.appendbook import AppendBook

    try:
        book = AppendBook(logs)
    except ValueError as exc:
        sys.stderr.write(f"note: appended batches not shown: {exc}\n")
        return schedule
    for record in book.accepted(vm):
        answer = record.answered[vm]
        try:
            entries = batch_entries(book.raw(record), answer["first_index"], answer.get("moved"))
            schedule = extended(schedule, entries)
            stages.update({int(i): int(n) for n, _t, ix in answer.get("stages") or [] for i in ix})
        except (OSError, ScheduleError, ValueError, TypeError) as exc:
            sys.stderr.write(f"note: batch {record.id} not shown: {exc}\n")
    return schedule


def _run_dict(run: EntryRun) -> Dict[str, Any]:
    return {
        "status": run.status,
        "start": run.start,
        "end": run.end,
        "exit_code": run.exit_code,
        "lateness": run.lateness,
        "details": run.details or None,
    }


def _hold_dict(span: Span) -> Dict[str, Any]:
    return {"kind": span.kind, "start": span.start, "end": span.end}


def _resumed(timeline: VmTimeline, index: int) -> Optional[Dict[str, Any]]:
    """What a stored RESUME entry did when the agent applied it: ``{"at": UTC, "ended_break":
    index or None (ignored: no active break)}``; None for another entry, or not applied yet."""
    done = timeline.stored_resumes.get(index)
    return None if done is None else {"at": done[0], "ended_break": done[1]}


def entry_rows(
    schedule: Any, timeline: VmTimeline, resumes: List[Tuple[float, int]], base: Optional[int] = None
) -> List[Dict[str, Any]]:
    """One row per entry: ``index``, ``start_time``, ``kind``, ``stage``, ``fire_at`` (planned
    experiment seconds with the RESUMEs received; None: after a break no RESUME ended),
    ``command``, ``runs`` (each run's status, start/end UTC, exit code, lateness), ``holds``
    (the pause/break spans it caused) and ``resumed`` (a stored RESUME: :func:`_resumed`). Pure.

    ``base``: how many entries the delivered schedule has (the others were appended: ``schedule
    add``, ``exec``, ``push``, ``pull``). The stages of those are numbered as the agent numbered
    them, from the delivered schedule alone: an appended negative entry (``exec`` runs at
    ``-100000``) never renumbers them; an appended entry's stage is None here (the agent's
    answer gives it, :func:`with_appended`).
    """
    from vmr_handler.core.schedule.commands import command_lines
    from vmr_handler.core.timeline import build_plan

    ordered = sorted(resumes)
    plan = build_plan(schedule.entries, [at for at, _n in ordered], [n for _at, n in ordered])
    delivered = schedule.entries if base is None else schedule.entries[:base]
    stages = {p.index: p.stage for p in build_plan(delivered).entries}
    commands = command_lines(schedule.entries, LAUNCH_DIR)
    runs: Dict[int, List[EntryRun]] = {}
    for run in timeline.runs:
        runs.setdefault(run.index, []).append(run)
    holds: Dict[int, List[Span]] = {}
    for span in [*timeline.pauses, *timeline.breaks]:
        if span.index is not None:
            holds.setdefault(span.index, []).append(span)
    return [
        {
            "index": p.index,
            "start_time": p.start_time if math.isfinite(p.start_time) else str(p.start_time),
            "kind": p.kind.value,
            "stage": stages.get(p.index),
            "fire_at": p.fire_at if p.fire_at is None or math.isfinite(p.fire_at) else str(p.fire_at),
            "command": commands.get(p.index),
            "runs": [_run_dict(r) for r in runs.get(p.index, [])],
            "holds": [_hold_dict(s) for s in holds.get(p.index, [])],
            "resumed": _resumed(timeline, p.index),
        }
        for p in plan.entries
    ]


def outcome_text(row: Mapping[str, Any], start: Optional[float]) -> str:
    """What became of one entry, in words: ``success (exit 0) at ... late 1.2 ms``,
    ``held (break) since ...``, ``not run yet``; the latest run first, the count of runs."""
    if row["runs"]:
        last = row["runs"][-1]
        code = f" (exit {last['exit_code']})" if last["exit_code"] is not None else ""
        late = f", late {duration(last['lateness'])}" if last["lateness"] is not None else ""
        took = f", took {duration(last['end'] - last['start'])}" if last["end"] is not None else ""
        again = f" [{len(row['runs'])} runs]" if len(row["runs"]) > 1 else ""
        return f"{last['status']}{code} at {when(last['start'], start)}{took}{late}{again}"
    if row["holds"]:
        h = row["holds"][-1]
        if h["end"] is None:
            return f"{h['kind']} since {when(h['start'], start)}"
        return f"{h['kind']} {when(h['start'], start)} to {when(h['end'], start)}"
    if row.get("resumed"):
        r = row["resumed"]
        if r["ended_break"] is None:
            return f"ignored (no active break) at {when(r['at'], start)}"
        return f"ended break #{r['ended_break']} at {when(r['at'], start)}"
    if row["kind"] == "resume":
        return "not applied yet"
    if row["kind"] in ("pause", "break", "negative", "positive"):
        return "not run yet" if row["kind"] in ("negative", "positive") else "not reached yet"
    return "-"


def _when_planned(row: Mapping[str, Any]) -> str:
    if row["stage"] is not None:
        return f"stage {row['stage']}"
    at = row["fire_at"]
    if at is None:
        return "after a break"
    return f"t={at}" if isinstance(at, str) else f"t=+{number(at)}s" if at >= 0 else f"t={number(at)}s"


def show_text(vm: str, item: Mapping[str, Any], rows: List[Dict[str, Any]], start: Optional[float]) -> str:
    """The table of ``schedule show``."""
    head = (
        f"{vm}: {item.get('path')} ({item.get('format')}, {len(rows)} entries, sha256 "
        f"{str(item.get('sha256'))[:12]}); start {utc_text(start) if start else 'not set yet'}"
    )
    table = [("#", "time", "kind", "planned", "what became of it", "command")]
    for r in rows:
        t = r["start_time"]
        table.append(
            (str(r["index"]), t if isinstance(t, str) else number(t), r["kind"], _when_planned(r),
             outcome_text(r, start), r["command"] or "")
        )  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line[:5], widths)) + "  " + line[5] for line in table]
    return "\n".join([head, *(x.rstrip() for x in lines)])


def cmd_schedule_show(args: argparse.Namespace) -> int:
    """``schedule show VM``: exit 0, or 2 with a clear error (no index, unknown VM, changed file).

    Raises:
        UsageError: (exit 2) see :func:`load_delivered` and :func:`~vmr_handler.host.cli.logs.log_path`.
    """
    item = _delivered(args.logs, args.vm)
    schedule = load_delivered(args.logs, args.vm)
    base = len(schedule.entries)
    appended_stages: Dict[int, int] = {}
    schedule = with_appended(args.logs, args.vm, schedule, appended_stages)
    notes: List[str] = []
    try:
        records = list(read_jsonl(log_path(args.logs, args.vm), notes))
    except UsageError:
        records = []  # not seen yet: no log
    timeline = VmTimeline(args.vm)
    for rec in records:
        timeline.add(rec)
    start = start_time(args.logs)
    rows = entry_rows(schedule, timeline, _received_resumes(records, base), base)
    for row in rows:
        row["stage"] = appended_stages.get(row["index"], row["stage"])
    if args.json:
        doc = {"vm": args.vm, **item, "start_time": start, "entries": rows, "notes": notes}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        sys.stdout.write(show_text(args.vm, item, rows, start) + "\n")
        for note in notes:
            sys.stdout.write(f"note: {note}\n")
    return 0
