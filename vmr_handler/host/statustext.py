"""The human form of ``vmr-host status`` (the ``status`` result of the control socket)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from vmr_handler.core.fsutil import utc_text


def _ago(now: float, ts: Optional[float]) -> str:
    if ts is None:
        return "-"
    d = now - ts
    return f"{d:.1f}s ago" if d < 120 else f"{d / 60:.0f}m ago"


def format_status(result: Dict[str, Any]) -> str:
    """The human form of a ``status`` result."""
    now = float(result.get("now") or time.time())
    exp = result["experiment"]
    lines: List[str] = []
    if exp["start_time"] is None:
        waiting = exp["waiting_for"]
        lines.append(
            f"experiment start: not set; barrier waiting for {len(waiting)} VM(s): "
            + (", ".join(waiting) if waiting else "nobody")
        )
    else:
        delta = exp["start_time"] - now
        when = f"in {delta:.1f}s" if delta > 0 else f"{-delta:.1f}s ago"
        lines.append(f"experiment start: {utc_text(exp['start_time'])} ({when})")
    cfg = exp["configured"]
    lines.append(
        f"expected: {len(exp['expected'])} VM(s), configured {sum(1 for v in exp['expected'] if v in cfg)}"
        + (f"; excluded: {', '.join(exp['excluded'])}" if exp["excluded"] else "")
        + (f"; released: {', '.join(exp['released'])}" if exp["released"] else "")
    )
    header = ("VM", "CONN", "STATE", "STAGE", "LAST SEEN", "LATENESS", "FAILURES", "NOTES")
    rows = [header]
    for vm in result["vms"]:
        conn = "yes" if vm["connected"] else "no"
        if vm["connected"] and vm.get("silent"):
            conn = "silent"
        late = vm["max_lateness"]
        notes: List[str] = []
        if not vm["expected"]:
            notes.append("not expected")
        if vm["failed"]:
            notes.append(f"failed: {vm['failed'][:60]}")
        if vm["schedule"]["state"] == "rejected":
            notes.append(f"schedule rejected: {(vm['schedule']['details'] or '')[:60]}")
        bad = vm["frames"]["malformed"] + vm["frames"]["oversize"] + sum(vm["refused"].values())
        if bad:
            notes.append(f"{bad} refused/malformed")
        rows.append(
            (
                vm["vm"],
                conn,
                vm["state"],
                vm["stage"] or "-",
                _ago(now, vm["last_seen"]),
                "-" if late is None else f"{late * 1000:.1f}ms",
                str(vm["failures"]),
                "; ".join(notes),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    pending = [r for r in result.get("resumes", []) if set(r["targets"]) - set(r["answered"])]
    for r in pending:
        missing = sorted(set(r["targets"]) - set(r["answered"]))
        lines.append(f"RESUME {r['id']} (at {r['at']}) not yet answered by: {', '.join(missing)}")
    return "\n".join(lines)
