"""The human form of ``vmr-host status`` (the ``status`` result of the control socket).

What an operator needs first: who the experiment waits for and why, and what to
do about it. So: the start (UTC and how far), counts per state, one row per VM with where it
is in experiment time (``where``: :mod:`vmr_handler.host.model.where`, the host's text), then one hint
line per VM that needs someone (failed, lost, held at a break, not connected while the barrier
waits for it), each with the command that moves it on. The state words and their order are
the model's (:mod:`vmr_handler.host.model.stateword`).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

from vmr_handler.core.fsutil import utc_text
from vmr_handler.core.readable import duration, kpi_brief
from vmr_handler.host.cli.options import host_command
from vmr_handler.host.model.stateword import FAILED_STATES, STATES, WAITING_STATES
from vmr_handler.host.model.where import exp_time

#: ``--state`` filter words and the VMs they keep.
FILTERS = ("failed", "lost", "at-break", "late", "paused", "running", "complete", "waiting")
#: Lateness from which a VM counts as ``late`` (seconds).
LATE = 0.1


def when(at: Optional[float], start: Optional[float]) -> str:
    """UTC ``at`` as ISO time with its experiment time: ``2026-11-24T08:00:01.200Z (t=+1.2s)``."""
    if at is None:
        return "-"
    t = exp_time(start, at)
    return f"{utc_text(at)}" + (f" ({t})" if t else "")


def _ago(now: float, ts: Optional[float]) -> str:
    return "-" if ts is None else f"{duration(now - ts)} ago"


def kpi_cell(vm: Dict[str, Any], now: float) -> str:
    """The VM's latest KPI sample in short (``cpu 12.5%, mem 1.21 GiB/3.85 GiB, load 0.52``),
    with its age when it is older than 3 intervals; ``-`` when it reported none."""
    kpi = vm.get("kpi")
    if not kpi:
        return "-"
    text = kpi_brief(kpi)
    at, interval = kpi.get("at"), kpi.get("interval")
    if isinstance(at, (int, float)) and isinstance(interval, (int, float)) and now - at > 3 * interval:
        text += f" ({duration(now - at)} old)"
    return text


def keep(vm: Dict[str, Any], states: Sequence[str], names: Sequence[str]) -> bool:
    """Whether ``--state`` words ``states`` and VM names ``names`` (both: any of) keep ``vm``."""
    if names and vm["vm"] not in names:
        return False
    if not states:
        return True
    late = vm.get("max_lateness")
    word = vm["state"]
    tests = {
        "failed": word in FAILED_STATES,
        "lost": word == "lost",
        "at-break": word == "at_break",
        "paused": word == "paused",
        "late": late is not None and late > LATE,
        "running": word == "running",
        "complete": word == "complete",
        "waiting": word in WAITING_STATES,
    }
    return any(tests.get(s, False) for s in states)


def hints(result: Dict[str, Any]) -> List[str]:
    """One line per VM that needs someone, with the command that moves it on: one that runs as
    printed from any directory (:func:`~vmr_handler.host.cli.options.host_command`: with the
    host's ``--logs``, the ``logs`` of ``result``)."""
    exp = result["experiment"]
    logs = result.get("logs")
    start = exp["start_time"]
    waiting = set(exp.get("waiting_for") or [])
    out: List[str] = []
    held = []
    for vm in result["vms"]:
        name = vm["vm"]
        if vm["state"] in ("failed", "schedule_rejected"):
            if vm["state"] == "schedule_rejected":
                line = f"{name}: schedule rejected: {vm['schedule'].get('details') or 'no reason given'}"
            else:
                stage_time = (vm.get("phase") or {}).get("stage_time")
                where = f" in stage {stage_time:g}" if isinstance(stage_time, (int, float)) else ""
                entry = vm.get("failed_entry")
                what = f" (entry {entry})" if entry is not None else ""
                line = f"{name} failed{where}{what}: {vm['failed']}"
            if name in waiting:
                line += f"; start without it: {host_command(logs, 'release', '--exclude', name)}"
            out.append(line)
        elif vm["state"] == "lost":
            out.append(lost_hint(vm, start, float(result.get("now") or time.time()), logs))
        elif vm["state"] == "complete" and (vm.get("completion") or {}).get("not_started"):
            n = vm["completion"]["not_started"]
            out.append(f"{name} completed, but {n} entr{'y' if n == 1 else 'ies'} could not start; "
                       f"see why: {host_command(logs, 'logs', name)}")  # fmt: skip
        elif name in waiting and not vm["connected"]:
            out.append(f"{name} is not connected and the barrier waits for it; "
                       f"start without it: {host_command(logs, 'release', '--exclude', name)}")  # fmt: skip
        b = (vm.get("phase") or {}).get("at_break")
        if b and vm["state"] == "at_break":
            held.append(f"{name} (break #{b['index']} since {when(b['since'], start)})")
    if held:
        names = [h.split(" ", 1)[0] for h in held]
        every = len(held) == len(result["vms"]) or len(held) > 8  # --all resumes those at a break
        cmd = host_command(logs, "resume", "--all") if every else host_command(logs, "resume", *names)
        out.append(f"waiting for RESUME: {', '.join(held)}; go on: {cmd}")
    return out


def lost_hint(vm: Dict[str, Any], start: Optional[float], now: float, logs: Optional[str]) -> str:
    """The hint of a ``lost`` VM: when its agent was last heard from (UTC, experiment time, how
    long ago), what to check and the command that shows its log."""
    name = vm["vm"]
    gone = f", gone for {duration(vm['gone_for'])}" if isinstance(vm.get("gone_for"), (int, float)) else ""
    return (f"{name} is lost: its agent was last heard from {when(vm.get('last_seen'), start)} "
            f"({_ago(now, vm.get('last_seen'))}{gone}); check the VM's console and the agent's "
            f"service (vmr-handler) in it; its log: {host_command(logs, 'logs', name)}")  # fmt: skip


def counts(vms: List[Dict[str, Any]]) -> str:
    """``3 VMs: 1 failed, 1 at_break, 1 running`` (problems first)."""
    by: Dict[str, int] = {}
    for vm in vms:
        by[vm["state"]] = by.get(vm["state"], 0) + 1
    order = [s for s in STATES if s in by] + sorted(set(by) - set(STATES))
    return f"{len(vms)} VM(s): " + (", ".join(f"{by[s]} {s}" for s in order) or "none")


def format_status(
    result: Dict[str, Any], states: Sequence[str] = (), names: Sequence[str] = ()
) -> str:
    """The human form of a ``status`` result; ``states``/``names`` keep only some VM rows."""
    now = float(result.get("now") or time.time())
    exp = result["experiment"]
    start = exp["start_time"]
    lines: List[str] = []
    if result.get("offline"):
        lines.append(f"read from the logs in {result.get('logs')}: no vmr-host running, nothing is connected")
    if start is None:
        waiting = exp["waiting_for"]
        lines.append(
            f"experiment start: not set; barrier waiting for {len(waiting)} VM(s): "
            + (", ".join(waiting) if waiting else "nobody")
        )
    else:
        ago = f"{duration(now - start)} ago, now {exp_time(start, now)}"
        rel = f"in {duration(start - now)}" if start > now else ago
        lines.append(f"experiment start: {utc_text(start)} ({rel})")
    cfg = exp["configured"]
    lines.append(
        f"expected: {len(exp['expected'])} VM(s), configured {sum(1 for v in exp['expected'] if v in cfg)}"
        + (f"; excluded: {', '.join(exp['excluded'])}" if exp["excluded"] else "")
        + (f"; released: {', '.join(exp['released'])}" if exp["released"] else "")
    )
    lines.append(counts(result["vms"]))
    kpis = any(vm.get("kpi") for vm in result["vms"])  # the column only when some VM reports KPIs
    header = ("VM", "CONN", "STATE", "WHERE", "LAST SEEN", "LATENESS", "FAILURES", *(["KPI"] if kpis else []))
    header += ("NOTES",)
    rows: List[Sequence[str]] = [header]
    for vm in result["vms"]:
        if not keep(vm, states, names):
            continue
        conn = "yes" if vm["connected"] else "no"
        if vm["connected"] and vm.get("silent"):
            conn = "silent"
        late = vm["max_lateness"]
        notes: List[str] = []
        if not vm["expected"]:
            notes.append("not expected")
        if vm.get("failure_history"):
            notes.append(f"recovered from {len(vm['failure_history'])} failure(s)")
        bad = vm["frames"]["malformed"] + vm["frames"]["oversize"] + sum(vm["refused"].values())
        if bad:
            notes.append(f"{bad} refused/malformed")
        killed = list(((vm.get("phase") or {}).get("killed") or {}).items())  # vmr-host kill, timeouts
        notes += [f"entry {i} {how}" for i, how in killed[-2:]]
        if len(killed) > 2:
            notes.append(f"{len(killed)} entries killed (operator or timeout)")
        rows.append(
            (
                vm["vm"],
                conn,
                vm["state"],
                str(vm.get("where") or "-"),
                _ago(now, vm["last_seen"]),
                "-" if late is None else duration(late),
                str(vm["failures"]),
                *([kpi_cell(vm, now)] if kpis else []),
                "; ".join(notes),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    pending = [r for r in result.get("resumes", []) if set(r["targets"]) - set(r["answered"])]
    for r in pending:
        missing = sorted(set(r["targets"]) - set(r["answered"]))
        lines.append(f"RESUME {r['id']} (issued {when(r.get('issued'), start)}) not yet answered by: "
                     + ", ".join(missing))  # fmt: skip
    lines.extend(hints(result))
    return "\n".join(lines)


def known_vms(result: Dict[str, Any]) -> List[str]:
    """The VMs a ``status`` result knows: every VM served and every one the barrier expects."""
    return sorted({vm["vm"] for vm in result["vms"]} | set(result["experiment"].get("expected") or []))


def any_failed(result: Dict[str, Any]) -> bool:
    """Whether some VM failed, had its schedule rejected or is ``lost`` (``vmr-host status``
    then exits 1: someone is needed)."""
    return any(vm["state"] in FAILED_STATES or vm["state"] == "lost" for vm in result["vms"])
