#!/usr/bin/env python3
"""Benchmarks of the vmr-handler guest agent (firing lateness, spread, plan time, idle cost).

Run from the repository root::

    .venv/bin/python benchmarks/bench_agent.py            # full run (~1.5-3 min)
    .venv/bin/python benchmarks/bench_agent.py --quick    # smoke run (~45 s)

Every figure is printed next to its target with an ``ok`` / ``MISSED`` label; the script
never fails because something is slow (exit 0 unless the benchmark itself breaks, e.g.
the agent cannot be started). See ``benchmarks/README.md`` for what each figure means.

Sections:
  1  200 entries at one instant through the real CLI: lateness p50/p99/max, spread of the
     entries' ``spawned_at`` (fork times) and, for reference, of the event timestamps.
  1b the same with ``/bin/date +%s.%N``: when the processes really ran (exec times).
  1c the same burst with timing probes inside the agent: where the lateness goes.
  2  1000 entries 10 ms apart over 10 s: lateness p50/p99/max.
  2b the same with timing probes: journal appends/fsyncs/snapshots, what entries waited for.
  3  bare asyncio baseline: 200 processes at one instant, no vmr_handler; synchronous
     spawn-loop floors (posix_spawn, Popen vfork/fork); agent / baseline ratios.
  4  ``build_plan`` / ``vmr-handler plan --json`` for a 100 000-entry schedule; loading it
     as YAML through the real loader (CSafeLoader + depth guard) vs the old yaml.safe_load;
     ``check``/``plan`` against the raw parse (JSON and pickle, in process (this
     one and a fresh one) and as whole processes, from source and with the bytecode cache an
     installed package has).
  4d ``check``, ``plan --json`` and ``load_schedule`` against a bare parse of the same file
     (pickle, JSON, YAML) with data drops on 1 entry in 10 and on every entry: in a fresh
     process and as whole processes, wall and CPU, interleaved rounds (``--only 4d``).
  5  idle CPU% and RSS while waiting for an entry 20 s away; bare-Python RSS baseline.
  6  same-instant groups of 1, 10 and 60 entries with and without a 200-byte drop each:
     first and last fork after the instant, side by side.
"""

from __future__ import annotations

import argparse
import atexit
import datetime as _dt
import gc
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import psutil
from _procs import stop_child  # benchmarks/ is sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# --------------------------------------------------------------------------- targets
TARGET_LATENESS_P99_MS = 10.0
TARGET_SPREAD_MS = 100.0
TARGET_BUILD_PLAN_S = 1.0
TARGET_IDLE_CPU_PCT = 0.5
TARGET_IDLE_RSS_MB = 50.0

# --------------------------------------------------------------------------- child processes
_CHILDREN: List[subprocess.Popen[bytes]] = []


def _spawn(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start a child in its own session and remember it for cleanup."""
    proc = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
    _CHILDREN.append(proc)
    return proc


def _stop_child(proc: subprocess.Popen[bytes], term_timeout: float = 10.0) -> None:
    """SIGTERM ``proc``, then kill what is left of its tree (:func:`_procs.stop_child`)."""
    stop_child(proc, term_timeout)


def _cleanup_children() -> None:
    for proc in list(_CHILDREN):
        try:
            _stop_child(proc, term_timeout=5.0)
        except Exception:
            pass
    _CHILDREN.clear()


def _on_signal(signum: int, _frame: Any) -> None:
    _cleanup_children()
    sys.exit(128 + signum)


def _run(argv: Sequence[str], timeout: float, **kwargs: Any) -> Tuple[int, float]:
    """Run a child to completion (killed on timeout). Returns ``(returncode, wall seconds)``.

    The wait blocks in ``waitpid`` and a timer thread stops the child on timeout:
    ``Popen.wait(timeout)`` polls with sleeps growing to 50 ms, which rounded a 118 ms child up
    to 164 ms.
    """
    t0 = time.perf_counter()
    proc = _spawn(argv, **kwargs)
    timer = threading.Timer(timeout, _stop_child, (proc,))
    timer.daemon = True
    timer.start()
    try:
        rc = proc.wait()
        wall = time.perf_counter() - t0
    finally:
        timer.cancel()
        if proc in _CHILDREN and proc.poll() is not None:
            _CHILDREN.remove(proc)
    if time.perf_counter() - t0 >= timeout:
        raise RuntimeError(f"timed out after {timeout:.0f} s: {' '.join(argv[:6])} ...")
    return rc, wall


# --------------------------------------------------------------------------- helpers
def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def fmt_ms(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.1f} ms" if abs(value) < 10000 else f"{value / 1000:.2f} s"


def label(ok: Optional[bool]) -> str:
    return "-" if ok is None else ("ok" if ok else "MISSED")


def agent_argv() -> List[str]:
    """The real CLI: the venv's ``vmr-handler`` console script, else ``python -m vmr_handler``."""
    script = os.path.join(os.path.dirname(sys.executable), "vmr-handler")
    if os.path.exists(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "vmr_handler"]


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


def read_events(path: str) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = []
    if not os.path.exists(path):
        return events
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                pass  # torn last line of a killed agent
    return events


def fs_type(path: str) -> str:
    path = os.path.realpath(path)
    best = ("", "?")
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best[0]):
            best = (mp, part.fstype)
    return f"{best[1]} ({best[0] or '?'})"


def write_json(path: str, doc: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


class Results:
    """Rows of the final summary table."""

    def __init__(self) -> None:
        self.rows: List[Tuple[str, str, str, str, str]] = []
        self.data: Dict[str, Any] = {}

    def add(
        self, section: str, metric: str, measured: str, target: str = "", ok: Optional[bool] = None
    ) -> None:
        self.rows.append((section, metric, target or "-", measured, label(ok)))
        print(f"    {metric:<44} {measured:>14}   target {target or '-':<10} {label(ok)}")

    def table(self) -> str:
        head = ("section", "metric", "target", "measured", "")
        rows = [head, *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = []
        for n, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)


# --------------------------------------------------------------------------- agent runs
def run_agent(
    workdir: str,
    records: List[Dict[str, Any]],
    *,
    start_buffer: float = 0.0,
    timeout: float = 120.0,
    with_log: bool = False,
    trace: Optional[str] = None,
) -> Dict[str, Any]:
    """Run ``vmr-handler run --local`` on ``records`` to completion. Returns rc, events, wall."""
    os.makedirs(workdir, exist_ok=True)
    sched = os.path.join(workdir, "schedule.json")
    write_json(sched, records)
    report = os.path.join(workdir, "report.jsonl")
    args = [
        "run",
        "--local",
        sched,
        "--start-buffer",
        repr(start_buffer),
        "--launch-dir",
        os.path.join(workdir, "launch"),
        "--state-dir",
        os.path.join(workdir, "state"),
        "--report",
        report,
    ]
    if not with_log:
        args.append("--quiet")
    if trace:
        argv = [sys.executable, os.path.join(HERE, "_agent_trace.py"), trace, *args]
    else:
        argv = [*agent_argv(), *args]
    stderr_path = os.path.join(workdir, "agent.stderr")
    with open(stderr_path, "wb") as err:
        rc, wall = _run(
            argv,
            timeout,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=workdir,
            env=child_env(),
        )
    events = read_events(report)
    if rc != 0:
        with open(stderr_path, encoding="utf-8", errors="replace") as fh:
            tail = fh.read()[-2000:]
        print(f"    WARNING: agent exited {rc}; stderr tail:\n{textwrap.indent(tail, '      ')}")
    return {"rc": rc, "events": events, "wall": wall}


def started_events(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [e for e in events if e.get("type") == "entry_started"]


def burst_figures(events: List[Dict[str, Any]]) -> Dict[str, float]:
    """Lateness and spread of a burst from the ``entry_started`` events.

    ``spread`` is max - min of ``data.spawned_at`` (the reference UTC the agent takes just
    before that entry's own fork; NaN if the agent does not report it). ``event_spread`` is
    max - min of the event timestamps, which are taken after ``create_subprocess_exec``
    returned, i.e. after the whole group forked: it measures only the bookkeeping tail.
    """
    started = started_events(events)
    lat = [float(e["data"]["lateness"]) * 1000.0 for e in started if "lateness" in e["data"]]
    ts = [float(e["timestamp"]) for e in started]
    spawned = [float(e["data"]["spawned_at"]) for e in started if "spawned_at" in e["data"]]
    return {
        "n": len(started),
        "n_spawned_at": len(spawned),
        "exited": sum(1 for e in events if e.get("type") == "entry_exited"),
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "max": max(lat) if lat else math.nan,
        "min": min(lat) if lat else math.nan,
        "spread": (max(spawned) - min(spawned)) * 1000.0 if spawned else math.nan,
        "event_spread": (max(ts) - min(ts)) * 1000.0 if ts else math.nan,
    }


# --------------------------------------------------------------------------- section 1
def section_burst(root: str, res: Results, n: int, repeats: int, with_log: bool) -> Dict[str, Any]:
    print(f"\n[1] {n} entries at one instant (start_time 1, /bin/true) via the real CLI, {repeats} run(s)")
    records = [{"start_time": 1, "executable": "/bin/true"} for _ in range(n)]
    runs = []
    for k in range(repeats):
        out = run_agent(os.path.join(root, f"burst{k}"), records, with_log=with_log)
        fig = burst_figures(out["events"])
        runs.append(fig)
        print(
            f"    run {k + 1}: rc={out['rc']} started={fig['n']} exited={fig['exited']} "
            f"lateness min/p50/p99/max = {fig['min']:.1f}/{fig['p50']:.1f}/"
            f"{fig['p99']:.1f}/{fig['max']:.1f} ms, "
            f"spread of spawned_at {fig['spread']:.1f} ms "
            f"(of event timestamps {fig['event_spread']:.1f} ms), wall {out['wall']:.2f} s"
        )
        if fig["n"] != n:
            print(f"    WARNING: expected {n} entry_started events, got {fig['n']}")
        if fig["n_spawned_at"] != fig["n"]:
            print(
                f"    WARNING: only {fig['n_spawned_at']} of {fig['n']} entry_started events carry "
                "spawned_at (older agent?); the spawned_at spread is n/a"
            )
    keys = ("p50", "p99", "max", "min", "spread", "event_spread")
    med = {key: statistics.median(r[key] for r in runs) for key in keys}
    tag = f" (median of {repeats})" if repeats > 1 else ""
    res.add("1 burst", f"lateness p50{tag}", fmt_ms(med["p50"]))
    res.add(
        "1 burst",
        f"lateness p99{tag}",
        fmt_ms(med["p99"]),
        f"< {TARGET_LATENESS_P99_MS:g} ms",
        med["p99"] < TARGET_LATENESS_P99_MS,
    )
    res.add("1 burst", f"lateness max{tag}", fmt_ms(med["max"]))
    res.add(
        "1 burst",
        f"spread of spawned_at (fork times){tag}",
        fmt_ms(med["spread"]),
        f"< {TARGET_SPREAD_MS:g} ms",
        None if math.isnan(med["spread"]) else med["spread"] < TARGET_SPREAD_MS,
    )
    # Not a start-time spread: every event is emitted after the whole group forked.
    res.add("1 burst", f"spread of event timestamps (after all forks){tag}", fmt_ms(med["event_spread"]))
    res.data["burst"] = {"runs": runs, "median": med}
    return med


def section_exec_times(root: str, res: Results, n: int, with_log: bool) -> Dict[str, float]:
    print(f"\n[1b] {n} entries at one instant running `/bin/date +%s.%N`: when the processes really ran")
    records = [{"start_time": 1, "executable": "/bin/date", "arguments": "+%s.%N"} for _ in range(n)]
    out = run_agent(os.path.join(root, "burst_date"), records, with_log=with_log)
    started = started_events(out["events"])
    scheduled = float(started[0]["data"]["scheduled"]) if started else math.nan
    execs = []
    for e in out["events"]:
        if e.get("type") == "output" and e["data"].get("stream") == "stdout":
            try:
                execs.append(float(e["data"]["line"]))
            except (KeyError, ValueError):
                pass
    lat = [(t - scheduled) * 1000.0 for t in execs]
    fig = {
        "n": len(execs),
        "first": min(lat) if lat else math.nan,
        "p50": pct(lat, 50),
        "max": max(lat) if lat else math.nan,
        "spread": (max(execs) - min(execs)) * 1000.0 if execs else math.nan,
        "reported_spread": burst_figures(out["events"])["spread"],
        "reported_event_spread": burst_figures(out["events"])["event_spread"],
    }
    print(f"    rc={out['rc']} exec times seen: {fig['n']}/{n}")
    res.add("1b exec", "first process ran after", fmt_ms(fig["first"]))
    res.add("1b exec", "exec lateness p50", fmt_ms(fig["p50"]))
    res.add("1b exec", "last process ran after", fmt_ms(fig["max"]))
    res.add(
        "1b exec",
        "real exec spread (last - first)",
        fmt_ms(fig["spread"]),
        f"< {TARGET_SPREAD_MS:g} ms",
        fig["spread"] < TARGET_SPREAD_MS,
    )
    res.data["exec_times"] = fig
    return fig


def _traced_run(
    workdir: str, records: List[Dict[str, Any]], **kwargs: Any
) -> Optional[Tuple[Dict[str, Any], List[Dict[str, Any]], Dict[str, List[List[float]]], Set[str]]]:
    """Run the agent with timing probes: ``(run_agent output, entry_started events, probe spans,
    traced probe names)``, or None (printed) when nothing was traced."""
    os.makedirs(workdir, exist_ok=True)
    trace = os.path.join(workdir, "trace.json")
    out = run_agent(workdir, records, trace=trace, **kwargs)
    started = started_events(out["events"])
    if not started or not os.path.exists(trace):
        print("    (no trace)")
        return None
    with open(trace, encoding="utf-8") as fh:
        doc = json.load(fh)
    return out, started, doc["spans"], set(doc.get("traced", []))


def section_breakdown(root: str, res: Results, n: int) -> Dict[str, Any]:
    print(f"\n[1c] where the lateness of the {n}-entry burst goes (in-process probes, diagnostic)")
    records = [{"start_time": 1, "executable": "/bin/true"} for _ in range(n)]
    workdir = os.path.join(root, "burst_trace")
    traced_run = _traced_run(workdir, records)
    if traced_run is None:
        return {}
    _out, started, spans, traced = traced_run
    sched = float(started[0]["data"]["scheduled"])
    last_started = max(float(e["timestamp"]) for e in started)

    def rel(t: float) -> float:
        return (t - sched) * 1000.0

    def within(name: str) -> List[List[float]]:  # spans during the burst only
        return [s for s in spans.get(name, []) if sched - 0.5 <= s[0] <= last_started + 0.001]

    info: Dict[str, Any] = {}
    rows: List[Tuple[str, str]] = []
    fire = within("fire_group")
    if fire:
        info["timer_late_ms"] = rel(fire[0][0])
        info["fire_group_ms"] = (fire[0][1] - fire[0][0]) * 1000.0
        rows.append(("timer callback ran after", fmt_ms(info["timer_late_ms"])))
        rows.append((f"_fire_group ({n} x _prepare: dir, data, exec)", fmt_ms(info["fire_group_ms"])))
    prep = within("prepare")
    if prep:
        info["prepare_mean_us"] = statistics.mean((b - a) * 1e6 for a, b in prep)
        rows.append(("  mean _prepare per entry", f"{info['prepare_mean_us']:.0f} us"))
    for probe, what in (
        ("journal_append", "journal appends"),
        ("journal_sync", "journal.log fsyncs"),
        ("journal_save", "journal snapshots"),
    ):
        got = within(probe)
        info[f"{probe}_n"] = len(got)
        info[f"{probe}_ms"] = sum((b - a) for a, b in got) * 1000.0
        if probe in traced:
            rows.append((f"{what} until last start ({len(got)})", fmt_ms(info[f"{probe}_ms"])))
    mkd = spans.get("make_dirs", [])
    if mkd:
        a, b = mkd[0]
        info["make_dirs_ms"] = (b - a) * 1000.0
        info["make_dirs_done_ms"] = rel(b)
        rows.append(("working dirs made ahead (worker thread)", fmt_ms(info["make_dirs_ms"])))
        rows.append(("  ... done at (rel. to the scheduled instant)", fmt_ms(info["make_dirs_done_ms"])))
    spawn = [s for s in spans.get("spawn", []) if s[0] >= sched - 0.5]
    spawn = spawn[:n]
    if spawn:
        calls = sorted(s[0] for s in spawn)
        rets = sorted(s[1] for s in spawn)
        info["first_spawn_call_ms"] = rel(calls[0])
        info["last_spawn_call_ms"] = rel(calls[-1])
        info["per_spawn_ms"] = (calls[-1] - calls[0]) * 1000.0 / max(1, len(calls) - 1)
        info["first_spawn_return_ms"] = rel(rets[0])
        info["last_spawn_return_ms"] = rel(rets[-1])
        rows.append(("first spawn call (fork) at", fmt_ms(info["first_spawn_call_ms"])))
        rows.append(("last spawn call (fork) at", fmt_ms(info["last_spawn_call_ms"])))
        rows.append(("  -> parent cost per spawn", f"{info['per_spawn_ms']:.2f} ms"))
        at_fork = [rel(c) for c in calls]
        info["fork_lateness"] = {"p50": pct(at_fork, 50), "p99": pct(at_fork, 99), "max": max(at_fork)}
        rows.append(
            (
                "probed fork-call lateness p50/p99",
                f"{fmt_ms(info['fork_lateness']['p50'])} / {fmt_ms(info['fork_lateness']['p99'])}",
            )
        )
        # Cross-check: the agent's own lateness (spawned_at - scheduled) should match the probe.
        own = sorted(float(e["data"]["lateness"]) * 1000.0 for e in started if "spawned_at" in e["data"])
        if len(own) == len(at_fork):
            info["spawned_at_vs_probe_max_ms"] = max(abs(x - y) for x, y in zip(own, sorted(at_fork)))
            rows.append(
                (
                    "  agent's lateness vs probe, max |diff|",
                    f"{info['spawned_at_vs_probe_max_ms']:.2f} ms",
                )
            )
        rows.append(("first create_subprocess_exec returned at", fmt_ms(info["first_spawn_return_ms"])))
        rows.append(("last create_subprocess_exec returned at", fmt_ms(info["last_spawn_return_ms"])))
    rows.append(
        (
            "first / last entry_started at",
            f"{fmt_ms(rel(min(float(e['timestamp']) for e in started)))} / {fmt_ms(rel(last_started))}",
        )
    )
    writes = within("report_write")
    if writes:
        info["report_writes"] = len(writes)
        info["report_write_ms"] = sum((b - a) for a, b in writes) * 1000.0
        rows.append((f"report writes in the burst ({len(writes)})", fmt_ms(info["report_write_ms"])))
    popen = within("popen")
    if popen:
        info["popen_mean_ms"] = statistics.mean((b - a) * 1000.0 for a, b in popen)
        rows.append(("mean subprocess.Popen (fork/exec) per spawn", f"{info['popen_mean_ms']:.2f} ms"))
    ct = within("psutil_create_time")
    if ct:
        info["create_time_ms"] = sum((b - a) for a, b in ct) * 1000.0
        rows.append((f"psutil create_time() calls ({len(ct)})", fmt_ms(info["create_time_ms"])))
    for name, value in rows:
        print(f"    {name:<44} {value:>14}")
    if "first_spawn_call_ms" in info:
        res.add(
            "1c probes",
            "before the first fork (prepare, journal appends)",
            fmt_ms(info["first_spawn_call_ms"]),
        )
        res.add("1c probes", "parent cost per spawn", f"{info['per_spawn_ms']:.2f} ms")
        res.add("1c probes", "probed fork-call lateness, p99", fmt_ms(info["fork_lateness"]["p99"]))
    res.data["breakdown"] = info
    return info


# --------------------------------------------------------------------------- section 2
def section_spread(root: str, res: Results, n: int, step: float, with_log: bool) -> Dict[str, float]:
    span = n * step
    print(f"\n[2] {n} entries spread uniformly over {span:g} s (start_time = 1 + i*{step:g}, /bin/true)")
    records = [{"start_time": round(1 + i * step, 6), "executable": "/bin/true"} for i in range(n)]
    out = run_agent(os.path.join(root, "spread"), records, timeout=span + 90, with_log=with_log)
    started = sorted(started_events(out["events"]), key=lambda e: e["data"]["scheduled"])
    lat = [float(e["data"]["lateness"]) * 1000.0 for e in started]
    tenth = max(1, len(lat) // 10)
    fig = {
        "n": len(lat),
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "max": max(lat) if lat else math.nan,
        "over_10ms": sum(1 for x in lat if x > 10.0),
        "p50_first_10pct": pct(lat[:tenth], 50),
        "p50_last_10pct": pct(lat[-tenth:], 50),
    }
    print(
        f"    rc={out['rc']} started={fig['n']}/{n} wall {out['wall']:.1f} s; "
        f"{fig['over_10ms']} entries later than 10 ms; p50 first 10% {fig['p50_first_10pct']:.2f} ms, "
        f"last 10% {fig['p50_last_10pct']:.2f} ms"
    )
    res.add("2 spread", "lateness p50", fmt_ms(fig["p50"]))
    res.add(
        "2 spread",
        "lateness p99",
        fmt_ms(fig["p99"]),
        f"< {TARGET_LATENESS_P99_MS:g} ms",
        fig["p99"] < TARGET_LATENESS_P99_MS,
    )
    res.add("2 spread", "lateness max", fmt_ms(fig["max"]))
    res.data["spread"] = fig
    return fig


def attribute(
    spans: Dict[str, List[List[float]]], windows: List[Tuple[float, float]], names: Sequence[str]
) -> Dict[str, List[float]]:
    """For every window ``(scheduled, started)``: ms of it spent inside spans of each name."""
    import bisect

    out: Dict[str, List[float]] = {}
    for name in names:
        items = sorted(spans.get(name, []))
        starts = [a for a, _b in items]
        longest = max((b - a for a, b in items), default=0.0)
        per: List[float] = []
        for w0, w1 in windows:
            lo = bisect.bisect_left(starts, w0 - longest)
            hi = bisect.bisect_right(starts, w1)
            total = 0.0
            for a, b in items[lo:hi]:
                total += max(0.0, min(b, w1) - max(a, w0))
            per.append(total * 1000.0)
        out[name] = per
    return out


def section_spread_breakdown(root: str, res: Results, n: int, step: float) -> Dict[str, Any]:
    print(f"\n[2b] where the lateness of the {n} spread entries goes (in-process probes, diagnostic)")
    records = [{"start_time": round(1 + i * step, 6), "executable": "/bin/true"} for i in range(n)]
    workdir = os.path.join(root, "spread_trace")
    traced_run = _traced_run(workdir, records, timeout=n * step + 90)
    if traced_run is None:
        return {}
    out, started, spans, traced = traced_run
    # The lateness window of an entry: scheduled -> spawned_at (taken just before its fork),
    # or -> the event timestamp for an agent that does not report spawned_at.
    windows = [
        (float(e["data"]["scheduled"]), float(e["data"].get("spawned_at", e["timestamp"]))) for e in started
    ]
    lat = [(b - a) * 1000.0 for a, b in windows]
    # Only synchronous spans on the event-loop thread: they block it, so they never overlap.
    # (make_dirs runs in a worker thread and is left out.)
    journal_names = ("journal_append", "journal_sync", "journal_save")
    names = (*journal_names, "popen", "prepare", "report_write", "psutil_create_time")
    missing = [name for name in names if name not in traced]
    if missing:
        print(f"    (no probe for: {', '.join(missing)} -- internal renamed or gone)")
    parts = attribute(spans, windows, names)
    late = [i for i, x in enumerate(lat) if x > TARGET_LATENESS_P99_MS]
    per_entry = max(1, len(started))

    def durations(name: str) -> List[float]:
        return [(b - a) * 1000.0 for a, b in spans.get(name, [])]

    appends, syncs, snaps = durations("journal_append"), durations("journal_sync"), durations("journal_save")
    info: Dict[str, Any] = {
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "late": len(late),
        "wall_s": out["wall"],
        "journal_appends": len(appends),
        "journal_append_p50_ms": pct(appends, 50),
        "journal_append_total_ms": sum(appends),
        "journal_syncs": len(syncs),
        "journal_sync_p50_ms": pct(syncs, 50),
        "journal_sync_max_ms": max(syncs, default=math.nan),
        "journal_sync_total_ms": sum(syncs),
        "journal_snapshots": len(snaps),
        "journal_snapshot_total_ms": sum(snaps),
    }
    journal_total = sum(appends) + sum(syncs) + sum(snaps)
    info["journal_total_ms"] = journal_total
    print(
        f"    (this traced run: lateness p50 {info['p50']:.2f} ms, p99 {info['p99']:.2f} ms, "
        f"{len(late)} entries > 10 ms, wall {out['wall']:.1f} s)"
    )
    print(
        f"    journal appends: {len(appends)} ({len(appends) / per_entry:.1f} per entry), "
        f"p50 {info['journal_append_p50_ms'] * 1000:.0f} us, total {sum(appends):.0f} ms"
    )
    print(
        f"    journal.log fsyncs (Journal.sync calls): {len(syncs)} "
        f"({len(syncs) / per_entry:.2f} per entry), p50 {info['journal_sync_p50_ms']:.2f} ms, "
        f"max {info['journal_sync_max_ms']:.1f} ms, total {sum(syncs):.0f} ms"
    )
    print(
        f"    journal snapshots (full rewrites, Engine._save): {len(snaps)}, total {sum(snaps):.0f} ms; "
        f"all journal work on the loop: {journal_total / 1000:.2f} s"
    )
    print(
        f"    {'mean ms of the lateness window the loop spent in':<44} "
        f"{'all entries':>12} {'late (>10 ms)':>14}"
    )
    for name in names:
        vals = parts[name]
        all_mean = statistics.mean(vals) if vals else math.nan
        late_mean = statistics.mean(vals[i] for i in late) if late else math.nan
        info[f"in_{name}_ms"] = all_mean
        info[f"late_in_{name}_ms"] = late_mean
        print(f"      {name:<42} {all_mean:>12.3f} {late_mean:>14.3f}")
    rest_all = [lat[i] - sum(parts[name][i] for name in names) for i in range(len(lat))]
    print(
        f"      {'other (asyncio, timer, waiting)':<42} {statistics.mean(rest_all):>12.3f} "
        f"{statistics.mean(rest_all[i] for i in late) if late else math.nan:>14.3f}"
    )
    print(
        f"      {'(whole window = lateness)':<42} {statistics.mean(lat):>12.3f} "
        f"{statistics.mean(lat[i] for i in late) if late else math.nan:>14.3f}"
    )
    state = os.path.join(workdir, "state")
    for fname in ("journal.json", "journal.log"):
        fpath = os.path.join(state, fname)
        info[f"{fname}_bytes"] = os.path.getsize(fpath) if os.path.exists(fpath) else None
    print(
        f"    at exit: journal.json {info['journal.json_bytes']} bytes, "
        f"journal.log {info['journal.log_bytes']} bytes (the final snapshot empties the log)"
    )
    in_journal = sum(info[f"in_{name}_ms"] for name in journal_names)
    info["journal_share_pct"] = 100.0 * in_journal / max(1e-9, statistics.mean(lat))
    res.add("2b probes", "journal appends per entry", f"{len(appends) / per_entry:.1f}")
    res.add("2b probes", "journal append p50", f"{info['journal_append_p50_ms'] * 1000:.0f} us")
    res.add("2b probes", "journal.log fsyncs per entry", f"{len(syncs) / per_entry:.2f}")
    res.add("2b probes", "journal.log fsync p50", f"{info['journal_sync_p50_ms']:.2f} ms")
    res.add("2b probes", "journal snapshots (full rewrites)", f"{len(snaps)}")
    res.add("2b probes", f"loop time in the journal (of {n * step:g} s)", f"{journal_total / 1000:.2f} s")
    res.add("2b probes", "share of lateness in the journal", f"{info['journal_share_pct']:.0f} %")
    res.data["spread_breakdown"] = info
    return info


# --------------------------------------------------------------------------- section 3
BASELINE_SCRIPT = r"""
import asyncio, json, os, shlex, sys, time
n, mode, argv, cwd = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
PIPE, DEVNULL = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL

async def main():
    loop = asyncio.get_running_loop()
    if mode == "shaped" and sys.version_info < (3, 12) and hasattr(asyncio, "PidfdChildWatcher") \
            and hasattr(os, "pidfd_open"):
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(loop)
        asyncio.get_event_loop_policy().set_child_watcher(watcher)
    instant = time.time() + 1.0
    fired = loop.create_future()
    loop.call_at(loop.time() + (instant - time.time()), fired.set_result, None)
    await fired
    called, returned = [], []

    async def one():
        if mode == "plain":
            called.append(time.time())  # just before the fork (same as the agent's spawned_at)
            proc = await asyncio.create_subprocess_exec(*argv)
        else:  # the agent's spawn shape: sh -c "cd DIR && prog", pipes, new session
            script = "cd %s && %s" % (shlex.quote(cwd), " ".join(shlex.quote(a) for a in argv))
            called.append(time.time())
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", script, cwd=cwd, stdin=DEVNULL, stdout=PIPE, stderr=PIPE,
                start_new_session=True)
        returned.append(time.time())
        return proc

    procs = await asyncio.gather(*(one() for _ in range(n)))
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    execs = []
    for out, _err in outs:
        for line in (out or b"").split():
            try:
                execs.append(float(line))
            except ValueError:
                pass
    print(json.dumps({"instant": instant, "called": called, "returned": returned, "exec": execs}))

asyncio.run(main())
"""

# The floor: n spawns of `/bin/sh -c true` in a plain synchronous loop, no asyncio at all.
SPAWN_FLOOR_SCRIPT = r"""
import json, os, subprocess, sys, time
n, how = int(sys.argv[1]), sys.argv[2]
argv = ["/bin/sh", "-c", "true"]
if how == "popen_fork":
    subprocess._USE_VFORK = False  # CPython >= 3.11: fork() instead of vfork()
pids, procs = [], []
t0 = time.perf_counter()
for _ in range(n):
    if how == "posix_spawn":
        pids.append(os.posix_spawn(argv[0], argv, os.environ))
    else:  # the agent's Popen shape: stdin /dev/null, two pipes, new session
        procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True))
loop_s = time.perf_counter() - t0
for pid in pids:
    os.waitpid(pid, 0)
for p in procs:
    p.communicate()
print(json.dumps({"loop_s": loop_s}))
"""
SPAWN_FLOORS = (
    ("posix_spawn", "os.posix_spawn loop"),
    ("popen_vfork", "subprocess.Popen loop (vfork)"),
    ("popen_fork", "subprocess.Popen loop (fork)"),
)


def _write_script(root: str, name: str, text: str) -> str:
    path = os.path.join(root, name)
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    return path


def run_baseline(root: str, n: int, mode: str, argv: List[str]) -> Dict[str, float]:
    script = _write_script(root, "baseline_spawn.py", BASELINE_SCRIPT)
    out_path = os.path.join(root, f"baseline_{mode}.json")
    with open(out_path, "wb") as out:
        rc, _wall = _run(
            [sys.executable, script, str(n), mode, json.dumps(argv), root],
            60,
            stdin=subprocess.DEVNULL,
            stdout=out,
            cwd=root,
        )
    with open(out_path, encoding="utf-8") as fh:
        doc = json.loads(fh.read() or "{}")
    instant = doc.get("instant", math.nan)
    called = doc.get("called", [])
    ret = doc.get("returned", [])
    lat = [(t - instant) * 1000.0 for t in called]
    execs = doc.get("exec", [])
    return {
        "rc": rc,
        "n": len(called),
        # at the fork (the agent's lateness / spawned_at definition)
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "max": max(lat) if lat else math.nan,
        "spread": (max(called) - min(called)) * 1000.0 if called else math.nan,
        # after create_subprocess_exec returned (the agent's event timestamps)
        "ret_max": (max(ret) - instant) * 1000.0 if ret else math.nan,
        "ret_spread": (max(ret) - min(ret)) * 1000.0 if ret else math.nan,
        "exec_spread": (max(execs) - min(execs)) * 1000.0 if execs else math.nan,
        "exec_last": (max(execs) - instant) * 1000.0 if execs else math.nan,
    }


def run_spawn_floor(root: str, n: int, how: str) -> float:
    """Seconds for ``n`` back-to-back spawns of ``/bin/sh -c true`` (the loop only, not the waits)."""
    script = _write_script(root, "spawn_floor.py", SPAWN_FLOOR_SCRIPT)
    out_path = os.path.join(root, f"floor_{how}.json")
    with open(out_path, "wb") as out:
        _run([sys.executable, script, str(n), how], 60, stdin=subprocess.DEVNULL, stdout=out, cwd=root)
    with open(out_path, encoding="utf-8") as fh:
        return float(json.loads(fh.read() or "{}").get("loop_s", math.nan))


def section_baseline(
    root: str,
    res: Results,
    n: int,
    repeats: int,
    agent: Dict[str, float],
    agent_exec: Optional[Dict[str, float]],
) -> Dict[str, Any]:
    print(f"\n[3] baseline: {n} processes at one instant from a minimal asyncio script (no vmr_handler)")
    variants = [
        ("plain", ["/bin/true"], "plain: create_subprocess_exec('/bin/true'), default watcher"),
        ("shaped", ["/bin/true"], "agent-shaped: sh -c 'cd D && /bin/true', pipes, setsid, pidfd"),
        ("shaped", ["/bin/date", "+%s.%N"], "agent-shaped, /bin/date +%s.%N (real exec times)"),
    ]
    figs: Dict[str, Dict[str, float]] = {}
    for mode, argv, desc in variants:
        key = f"{mode}:{os.path.basename(argv[0])}"
        runs = [run_baseline(root, n, mode, argv) for _ in range(repeats)]
        fig = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("rc", "n")}
        fig["n"] = runs[0]["n"]
        figs[key] = fig
        print(f"    {desc}")
        print(
            f"      started {fig['n']}, lateness at fork p50/p99/max = "
            f"{fig['p50']:.1f}/{fig['p99']:.1f}/{fig['max']:.1f} ms, "
            f"spread of fork times {fig['spread']:.1f} ms; "
            f"create_subprocess_exec returns: spread {fig['ret_spread']:.1f} ms, last {fig['ret_max']:.1f} ms"
            + (
                f"; real exec spread {fig['exec_spread']:.1f} ms, last exec {fig['exec_last']:.1f} ms"
                if not math.isnan(fig["exec_spread"])
                else ""
            )
        )
    floors: Dict[str, float] = {}
    for how, desc in SPAWN_FLOORS:
        loops = [run_spawn_floor(root, n, how) * 1000.0 for _ in range(repeats)]
        floors[how] = statistics.median(loops)
        print(
            f"    floor: {n} x {desc} of /bin/sh -c true: "
            + ", ".join(f"{x:.0f}" for x in loops)
            + f" ms ({floors[how] / n:.2f} ms per spawn)"
        )
    plain, shaped = figs["plain:true"], figs["shaped:true"]
    tag = f" (median of {repeats})" if repeats > 1 else ""
    res.add("3 baseline", f"plain: spread of fork times{tag}", fmt_ms(plain["spread"]))
    res.add("3 baseline", f"plain: lateness max at fork{tag}", fmt_ms(plain["max"]))
    res.add("3 baseline", f"shaped: spread of fork times{tag}", fmt_ms(shaped["spread"]))
    res.add("3 baseline", f"shaped: lateness p99 at fork{tag}", fmt_ms(shaped["p99"]))
    res.add("3 baseline", f"shaped: lateness max at fork{tag}", fmt_ms(shaped["max"]))
    for how, desc in SPAWN_FLOORS:
        res.add("3 baseline", f"floor: {n} x {desc}{tag}", fmt_ms(floors[how]))

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b and not math.isnan(a) and not math.isnan(b) else "n/a"

    res.add("3 baseline", "agent / plain spread of fork times", ratio(agent["spread"], plain["spread"]))
    res.add("3 baseline", "agent / shaped spread of fork times", ratio(agent["spread"], shaped["spread"]))
    res.add("3 baseline", "agent / posix_spawn loop", ratio(agent["spread"], floors["posix_spawn"]))
    res.add("3 baseline", "agent / shaped lateness p99", ratio(agent["p99"], shaped["p99"]))
    res.add("3 baseline", "agent / shaped lateness max", ratio(agent["max"], shaped["max"]))
    if agent_exec:
        dshaped = figs["shaped:date"]
        res.add("3 baseline", "shaped: real exec spread (date)", fmt_ms(dshaped["exec_spread"]))
        res.add(
            "3 baseline",
            "agent / shaped real exec spread",
            ratio(agent_exec["spread"], dshaped["exec_spread"]),
        )
        res.add("3 baseline", "agent / shaped last exec", ratio(agent_exec["max"], dshaped["exec_last"]))
    res.data["baseline"] = {**figs, "floors_ms": floors}
    return figs


# --------------------------------------------------------------------------- section 4
BREAK_AT = 50000.0
PAUSES = ((1000.0, 5.0), (20000.0, 10.0), (40000.0, 20.0), (80000.0, 30.0))


def big_records(n: int) -> Tuple[List[Dict[str, Any]], float, int]:
    """``n`` entries: 20 % negative (10 stages), positive over 0..100 000 s, 4 pauses, 1 break.

    Returns ``(records, resume_at, break_index)``; a RESUME at ``resume_at`` ends the break.
    """
    specials: List[Dict[str, Any]] = [
        {"start_time": t, "pause": True, "data": [{"pause_duration": d}]} for t, d in PAUSES
    ]
    specials.append({"start_time": BREAK_AT, "pause": True, "data": [{"pause_duration": "inf"}]})
    normal = n - len(specials)
    records: List[Dict[str, Any]] = []
    for i in range(normal):
        if i % 5 == 0:
            records.append(
                {"start_time": -(1 + (i % 50)), "executable": "/bin/true", "arguments": f"stage {i}"}
            )
        else:
            records.append(
                {"start_time": 1 + (i * 7.3) % 99990, "executable": "/bin/true", "arguments": f"run {i}"}
            )
    step = max(1, len(records) // (len(specials) + 1))
    break_index = -1
    for k, special in enumerate(specials):
        pos = step * (k + 1) + k
        records.insert(pos, special)
        if special["data"][0]["pause_duration"] == "inf":
            break_index = pos
    delay_before_break = sum(d for t, d in PAUSES if t < BREAK_AT)
    resume_at = BREAK_AT + delay_before_break + 100.0
    return records, resume_at, break_index


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid YAML double-quoted scalar


def yaml_block(records: List[Dict[str, Any]]) -> str:
    """Block-style YAML for ``big_records`` (what a person writes), much faster than yaml.dump.

    Handles what those records hold: scalars and lists of flat mappings.
    """
    out: List[str] = []
    for rec in records:
        lead = "- "
        for key, value in rec.items():
            if isinstance(value, list):
                out.append(f"{lead}{key}:")
                for item in value:
                    inner = "  - "
                    for k2, v2 in item.items():
                        out.append(f"{inner}{k2}: {_yaml_scalar(v2)}")
                        inner = "    "
            else:
                out.append(f"{lead}{key}: {_yaml_scalar(value)}")
            lead = "  "
    return "\n".join(out) + "\n"


def best_of(k: int, fn: Callable[[], Any]) -> Tuple[float, Any]:
    best, value = math.inf, None
    for _ in range(k):
        # the previous result is freed here, not inside the next timed call (its 100 000 entries
        # were freed there; and kept alive while the next load ran, they made each repeat slower)
        value = None
        gc.collect()
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def section_plan(
    root: str, res: Results, n: int, yaml_n: int, cli_repeats: int, yaml_full_n: int
) -> Dict[str, Any]:
    import yaml

    from vmr_handler.agent.cli import commandline as vcli
    from vmr_handler.core.schedule import load_schedule
    from vmr_handler.core.timeline import build_plan

    print(
        f"\n[4] plan for a {n:,}-entry schedule "
        "(20% negative in 10 stages, positive, 4 pauses, 1 break + RESUME)"
    )
    records, resume_at, break_index = big_records(n)
    path = os.path.join(root, "big.json")
    write_json(path, records)
    size_mb = os.path.getsize(path) / 1e6
    t_parse, _ = best_of(1, lambda: json.loads(open(path, "rb").read()))  # noqa: SIM115
    t_load, schedule = best_of(1, lambda: load_schedule(path))
    t_plan, plan = best_of(3, lambda: build_plan(schedule.entries, [resume_at]))
    t_dump, _text = best_of(1, lambda: json.dumps(vcli.plan_json(plan)))
    t_cols = t_pcols = t_text = math.nan
    try:  # `plan --json` without an object per entry (absent from older trees)
        from vmr_handler.agent.cli._planout import plan_text
        from vmr_handler.core.schedule.loader import load_schedule_columns
        from vmr_handler.core.timeline import plan_columns
    except ImportError:
        pass
    else:
        t_cols, cols = best_of(3, lambda: load_schedule_columns(path))
        t_pcols, pcols = best_of(3, lambda: plan_columns(cols.starts, cols.others, cols.hosts, [resume_at]))
        t_text = best_of(3, lambda: plan_text(cols, pcols, "/var/launch"))[0]
        del cols, pcols
    ok_plan = (
        plan.blocked_by is None and len(plan.resumes) == 1 and plan.resumes[0].ended_break == break_index
    )
    print(
        f"    JSON file {size_mb:.1f} MB; plan sane "
        f"(break {break_index} ended by RESUME at {resume_at:g}): {ok_plan}"
    )
    res.add("4 plan", "load JSON schedule (parse + validate)", fmt_ms(t_load * 1000))
    res.add("4 plan", "  of which json.loads", fmt_ms(t_parse * 1000))
    res.add(
        "4 plan",
        "build_plan (best of 3)",
        fmt_ms(t_plan * 1000),
        f"< {TARGET_BUILD_PLAN_S:g} s",
        t_plan < TARGET_BUILD_PLAN_S,
    )
    res.add("4 plan", "plan_json + json.dumps", fmt_ms(t_dump * 1000))
    res.add("4 plan", "plan --json: load as columns (parse + validate, best of 3)", fmt_ms(t_cols * 1000))
    res.add("4 plan", "  plan_columns (best of 3)", fmt_ms(t_pcols * 1000))
    res.add("4 plan", "  plan_text, what it prints (best of 3)", fmt_ms(t_text * 1000))

    # The whole CLI in a subprocess (JSON schedule), and the interpreter+import floor.
    out_path = os.path.join(root, "plan_out.json")
    walls = []
    for _ in range(cli_repeats):
        with open(out_path, "wb") as out:
            rc, wall = _run(
                [*agent_argv(), "plan", path, "--resume", repr(resume_at), "--json"],
                300,
                stdin=subprocess.DEVNULL,
                stdout=out,
                cwd=root,
                env=child_env(),
            )
        walls.append(wall)
        if rc != 0:
            print(f"    WARNING: plan CLI exited {rc}")
    with open(out_path, encoding="utf-8") as fh:
        cli_doc = json.load(fh)
    cli_ok = len(cli_doc.get("entries", [])) == n
    _rc, floor = _run(
        [*agent_argv(), "--version"],
        60,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        cwd=root,
        env=child_env(),
    )
    tag = f" (best of {cli_repeats})" if cli_repeats > 1 else ""
    print(f"    CLI output has {len(cli_doc.get('entries', []))} entries: {cli_ok}")
    res.add("4 plan", f"`vmr-handler plan --json` wall{tag}", fmt_ms(min(walls) * 1000))
    res.add("4 plan", "  `vmr-handler --version` wall (floor)", fmt_ms(floor * 1000))
    raw = section_raw_parse(root, res, path, records, cli_repeats, min(walls), resume_at)

    # YAML: the real loader (load_schedule: libyaml's CSafeLoader unless the depth guard
    # sends the text to the pure-Python loader) on the whole schedule, and for comparison
    # the pure-Python yaml.safe_load (the loader before commit a160422) on a slice.
    from vmr_handler.core.schedule import loader as vloader

    guard = getattr(vloader, "_yaml_loader_for", None)
    full_path = os.path.join(root, f"big{yaml_full_n}.yaml")
    full_text = yaml_block(records[:yaml_full_n])
    with open(full_path, "w", encoding="utf-8") as fh:
        fh.write(full_text)
    probe = records[:200]
    emitter_ok = yaml.load(yaml_block(probe), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) == probe
    chosen = "?"
    t_guard = math.nan
    if guard is not None:
        t_guard, chosen_loader = best_of(1, lambda: guard(full_text))
        chosen = getattr(chosen_loader, "__name__", str(chosen_loader))
    full_text = ""  # free it before loading
    t_yfull, yfull = best_of(1, lambda: load_schedule(full_path))
    yfull_ok = len(yfull.entries) == yaml_full_n
    del yfull
    ypath = os.path.join(root, f"slice{yaml_n}.yaml")
    ytext = yaml_block(records[:yaml_n])
    with open(ypath, "w", encoding="utf-8") as fh:
        fh.write(ytext)
    t_yload, _ = best_of(1, lambda: load_schedule(ypath))
    t_ysafe, _ = best_of(1, lambda: yaml.safe_load(ytext))
    print(
        f"    YAML: {yaml_full_n:,} entries, {os.path.getsize(full_path) / 1e6:.1f} MB, block style "
        f"(emitter round-trips: {emitter_ok}); loader chosen by the depth guard: {chosen}; "
        f"loaded {yaml_full_n:,} entries: {yfull_ok}"
    )
    fig: Dict[str, Any] = {
        "n": n,
        "json_mb": size_mb,
        "load_s": t_load,
        "json_parse_s": t_parse,
        "build_plan_s": t_plan,
        "dump_s": t_dump,
        "columns_load_s": t_cols,
        "plan_columns_s": t_pcols,
        "json_text_s": t_text,
        "cli_s": min(walls),
        "cli_floor_s": floor,
        "plan_ok": ok_plan,
        "cli_ok": cli_ok,
        "yaml_full_n": yaml_full_n,
        "yaml_loader": chosen,
        "yaml_full_load_s": t_yfull,
        "yaml_guard_s": t_guard,
        "yaml_n": yaml_n,
        "yaml_load_s": t_yload,
        "yaml_safe_load_s": t_ysafe,
    }
    res.add("4 plan", f"load YAML, {yaml_full_n:,} entries (loader: {chosen})", fmt_ms(t_yfull * 1000))
    res.add("4 plan", f"  of which depth-guard scan, {yaml_full_n:,}", fmt_ms(t_guard * 1000))
    res.add("4 plan", f"load YAML, {yaml_n:,} entries (loader)", fmt_ms(t_yload * 1000))
    if hasattr(yaml, "CSafeLoader"):
        t_yc, _ = best_of(1, lambda: yaml.load(ytext, Loader=yaml.CSafeLoader))
        fig["yaml_csafe_s"] = t_yc
        res.add("4 plan", f"  yaml CSafeLoader parse only, {yaml_n:,}", fmt_ms(t_yc * 1000))
    res.add("4 plan", f"  yaml.safe_load (pure Python, old), {yaml_n:,}", fmt_ms(t_ysafe * 1000))
    res.add(
        "4 plan",
        f"  old loader extrapolated to {yaml_full_n:,} (linear)",
        fmt_ms(t_ysafe * yaml_full_n / yaml_n * 1000),
    )
    if "yaml_csafe_s" in fig:
        ratio = t_yload / fig["yaml_csafe_s"]
        res.add(
            "4 plan", f"  load YAML / CSafeLoader parse, {yaml_n:,}", f"{ratio:.2f}x", "<= 1.5x", ratio <= 1.5
        )
    fig["raw"] = raw
    res.data["plan"] = fig
    return fig


#: A process that parses a JSON file and nothing else: the floor of `check`/`plan` walls.
RAW_JSON = "import json, sys\njson.loads(open(sys.argv[1], 'rb').read())\n"
#: The same for the reference pickle: ``pickle.loads`` with an empty stand-in for its class.
RAW_PICKLE = """import pickle, sys, types
for name in ("firewheel", "firewheel.vm_resource_manager", "firewheel.vm_resource_manager.schedule_entry"):
    sys.modules[name] = types.ModuleType(name)
sys.modules[name].ScheduleEntry = type("ScheduleEntry", (), {"__module__": name})
pickle.loads(open(sys.argv[1], "rb").read())
"""


#: In a fresh process: best of 3 of the raw parse and of ``load_schedule`` of a JSON file and of
#: a pickle (argv 1, 2), as JSON ``{"json": s, "load_json": s, "pickle": s, "load_pickle": s}``.
#: In the benchmark's own process, after the sections before it, the same pickle load took
#: 226-371 ms from one run of the benchmark to the next and grew with each repeat in a run (cause
#: not pinned down: the heap those sections left), which swamps differences of 80 ms; a fresh
#: process is what a ``check`` has. (The raw parse runs with the collector on, as in the raw
#: process; ``load_schedule`` pauses it.)
FRESH_LOAD = """import gc, json, pickle, sys, time
from tests.refpickle import standin_class
from vmr_handler.core.schedule import load_schedule
def best(fn):
    times = []
    for _ in range(3):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
out = {"json": best(lambda: json.loads(open(sys.argv[1], "rb").read()))}
out["load_json"] = best(lambda: load_schedule(sys.argv[1]))
with standin_class("firewheel.vm_resource_manager.schedule_entry.ScheduleEntry"):
    out["pickle"] = best(lambda: pickle.loads(open(sys.argv[2], "rb").read()))
out["load_pickle"] = best(lambda: load_schedule(sys.argv[2]))
print(json.dumps(out))
"""


def _wall(argv: List[str], repeats: int, root: str, env: Optional[Dict[str, str]] = None) -> float:
    """Best wall time (s) of ``argv`` over ``repeats`` runs, output discarded."""
    walls = []
    for _ in range(repeats):
        _rc, wall = _run(
            argv, 300, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=root, env=env or child_env()
        )
        walls.append(wall)
    return min(walls)


def bytecode_env(root: str) -> Dict[str, str]:
    """:func:`child_env` with Python's bytecode cache on, kept under ``root`` (never in the
    tree): what an installed package runs. Without it every run compiles vmr_handler's
    modules from source (~25 ms per CLI run), a cost the raw-parse baseline (stdlib only,
    precompiled) never pays."""
    env = child_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(root, "pycache")
    return env


def section_raw_parse(
    root: str,
    res: Results,
    path: str,
    records: List[Dict[str, Any]],
    repeats: int,
    plan_wall: float,
    resume_at: float,
) -> Dict[str, float]:
    """`check`/`plan` of the big schedule against the raw parse (within 3x), in
    process (load_schedule vs json.loads / pickle.loads) and as whole processes."""
    import pickle

    from vmr_handler.core.schedule import load_schedule

    fig: Dict[str, float] = {}
    t_json, _ = best_of(3, lambda: json.loads(open(path, "rb").read()))  # noqa: SIM115
    t_load, _ = best_of(3, lambda: load_schedule(path))
    fig["json_s"], fig["load_json_s"] = t_json, t_load
    res.add("4 plan", "in process: load_schedule / json.loads (best of 3)", _ratio(t_load, t_json), "<= 3x",
            t_load <= 3 * t_json)  # fmt: skip
    try:
        from tests.refpickle import reference_pickle, standin_class
    except ImportError:
        reference_pickle = None
    pkl = ""
    if reference_pickle is not None:
        pkl = os.path.join(root, "big.pkl")
        with open(pkl, "wb") as fh:
            fh.write(reference_pickle([dict(r) for r in records], protocol=2))
        with standin_class("firewheel.vm_resource_manager.schedule_entry.ScheduleEntry"):
            t_pickle, _ = best_of(3, lambda: pickle.loads(open(pkl, "rb").read()))  # noqa: SIM115
        t_load_pkl, _ = best_of(3, lambda: load_schedule(pkl))
        fig["pickle_s"], fig["load_pickle_s"] = t_pickle, t_load_pkl
        res.add("4 plan", "in process: load_schedule / pickle.loads (pickle)", _ratio(t_load_pkl, t_pickle),
                "<= 3x", t_load_pkl <= 3 * t_pickle)  # fmt: skip
        fresh = json.loads(
            subprocess.run([sys.executable, "-c", FRESH_LOAD, path, pkl], capture_output=True, text=True,
                           cwd=root, env=child_env(), timeout=300, check=True).stdout
        )  # fmt: skip
        fig.update({f"fresh_{key}_s": value for key, value in fresh.items()})
        res.add("4 plan", "  in a fresh process: load_schedule / json.loads (best of 3)",
                _ratio(fresh["load_json"], fresh["json"]), "<= 3x",
                fresh["load_json"] <= 3 * fresh["json"])  # fmt: skip
        res.add("4 plan", "  in a fresh process: load_schedule / pickle.loads (pickle)",
                _ratio(fresh["load_pickle"], fresh["pickle"]), "<= 3x",
                fresh["load_pickle"] <= 3 * fresh["pickle"])  # fmt: skip

    t_raw = _wall([sys.executable, "-c", RAW_JSON, path], repeats, root)
    t_check = _wall([*agent_argv(), "check", path], repeats, root)
    compiled = bytecode_env(root)
    plan_options = ["--resume", repr(resume_at), "--json"]
    plan_argv = [*agent_argv(), "plan", path, *plan_options]
    _wall([*agent_argv(), "--version"], 1, root, compiled)  # writes the bytecode cache
    t_check_c = _wall([*agent_argv(), "check", path], repeats, root, compiled)
    t_plan_c = _wall(plan_argv, repeats, root, compiled)
    fig["raw_wall_s"], fig["check_wall_s"], fig["plan_wall_s"] = t_raw, t_check, plan_wall
    fig["check_wall_bytecode_s"], fig["plan_wall_bytecode_s"] = t_check_c, t_plan_c
    res.add("4 plan", "process: python json.loads of the file, wall", fmt_ms(t_raw * 1000))
    res.add("4 plan", "process: `vmr-handler check` wall, from source", fmt_ms(t_check * 1000))
    res.add("4 plan", "  check / raw parse, from source (no bytecode cache)", _ratio(t_check, t_raw))
    res.add("4 plan", "  plan --json / raw parse, from source", _ratio(plan_wall, t_raw))
    res.add("4 plan", "  check / raw parse, bytecode cached (as installed)", _ratio(t_check_c, t_raw),
            "<= 3x", t_check_c <= 3 * t_raw)  # fmt: skip
    res.add("4 plan", "  plan --json / raw parse, bytecode cached", _ratio(t_plan_c, t_raw), "<= 3x",
            t_plan_c <= 3 * t_raw)  # fmt: skip
    if pkl:
        t_raw_pkl = _wall([sys.executable, "-c", RAW_PICKLE, pkl], repeats, root)
        t_check_pkl = _wall([*agent_argv(), "check", pkl], repeats, root, compiled)
        t_plan_pkl = _wall([*agent_argv(), "plan", pkl, *plan_options], repeats, root, compiled)
        fig["raw_pickle_wall_s"], fig["check_pickle_wall_bytecode_s"] = t_raw_pkl, t_check_pkl
        fig["plan_pickle_wall_bytecode_s"] = t_plan_pkl
        res.add("4 plan", "  check big.pkl / python pickle.loads, bytecode cached",
                _ratio(t_check_pkl, t_raw_pkl), "<= 3x", t_check_pkl <= 3 * t_raw_pkl)  # fmt: skip
        res.add("4 plan", "  plan big.pkl --json / python pickle.loads, bytecode cached",
                _ratio(t_plan_pkl, t_raw_pkl), "<= 3x", t_plan_pkl <= 3 * t_raw_pkl)  # fmt: skip
    return fig


def _ratio(a: float, b: float) -> str:
    return f"{a * 1000:.0f} / {b * 1000:.0f} ms = {a / b:.2f}x"


# --------------------------------------------------------------------------- section 4d
#: The target of `check`, `plan --json` and the loader: within this many times a bare parse.
TARGET_PARSE_RATIO = 3.0
#: A 10-byte config file and a VM-resource script, the data of the entries that drop one.
DROP_CONTENT = "key=value\n"


def with_drops(records: List[Dict[str, Any]], every: int) -> List[Dict[str, Any]]:
    """``records`` where one program entry in ``every`` drops a file: alternately a VM-resource
    script it runs (``setup.sh``, executable: its command line is the dropped file's path in its
    working dir) and a 10-byte config file beside ``/bin/true`` (``conf/appN.cfg``)."""
    out: List[Dict[str, Any]] = []
    for i, record in enumerate(records):
        record = dict(record)
        if "data" not in record and i % every == 0:
            if (i // every) % 2 == 0:
                record["executable"] = "setup.sh"
                record["data"] = [{"location": "setup.sh", "filename": "setup.sh", "executable": True}]
            else:
                record["data"] = [{"location": f"conf/app{i % 7}.cfg", "content": DROP_CONTENT}]
        out.append(record)
    return out


#: A fresh process that times, interleaved over rounds (best of each), for one schedule file:
#: its bare parse (``json.loads``, ``pickle.loads`` of a stand-in class, ``yaml.load`` with
#: ``CSafeLoader``; also with the collector paused), ``load_schedule``, ``vmr-handler check``
#: and ``plan --json`` in process (the CLI's ``main``, output to /dev/null). Wall and CPU
#: seconds. argv: file, format, resume time, rounds, entries expected.
PARSE_RATIOS = r"""import contextlib, gc, json, os, pickle, sys, time
from tests.refpickle import standin_class
from vmr_handler.agent.cli.commandline import main
from vmr_handler.core.schedule import load_schedule
path, fmt, resume, rounds, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def bare():
    data = open(path, "rb").read()
    if fmt == "json":
        return json.loads(data)
    if fmt == "pickle":
        with standin_class("firewheel.vm_resource_manager.schedule_entry.ScheduleEntry"):
            return pickle.loads(data)
    import yaml
    return yaml.load(data.decode("utf-8"), Loader=yaml.CSafeLoader)
def bare_paused():
    gc.disable()
    try:
        return bare()
    finally:
        gc.enable()
def cli(*words):
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        rc = main(list(words))
    assert rc == 0, (words, rc)
out_path = path + ".plan.json"
with open(out_path, "w") as fh, contextlib.redirect_stdout(fh):
    assert main(["plan", path, "--resume", resume, "--json"]) == 0
plan_doc = json.load(open(out_path))
ok = len(plan_doc["entries"]) == n and len(load_schedule(path).entries) == n
work = {
    "bare": bare,
    "bare_paused": bare_paused,
    "load": lambda: load_schedule(path),
    "check": lambda: cli("check", path),
    "plan": lambda: cli("plan", path, "--resume", resume, "--json"),
    # the floor of any plan --json: the C encoder writing the same document (no planning at all)
    "dumps": lambda: json.dumps(plan_doc),
}
best = {name: [float("inf"), float("inf")] for name in work}
for _ in range(rounds):
    for name, fn in work.items():
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - w0, time.process_time() - c0
        best[name] = [min(best[name][0], w), min(best[name][1], c)]
print(json.dumps({"ok": ok, "best": best}))
"""
#: The raw-parse process of each format (argv 1: the file): the floor of a `check` process.
RAW_PARSE = {
    "json": RAW_JSON,
    "pickle": RAW_PICKLE,
    "yaml": "import sys, yaml\nyaml.load(open(sys.argv[1], 'rb').read().decode(), Loader=yaml.CSafeLoader)\n",
}


def _run_rusage(
    argv: List[str], root: str, env: Dict[str, str], timeout: float = 600
) -> Tuple[int, float, float]:
    """``(returncode, wall s, CPU s)`` of ``argv``: waited for with ``os.wait4`` (exact, and the
    child's user+system CPU time, which a machine shared with other work changes less than
    the wall)."""
    t0 = time.perf_counter()
    proc = _spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=root, env=env)
    timer = threading.Timer(timeout, _stop_child, (proc,))
    timer.daemon = True
    timer.start()
    try:
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime


def _process_walls(root: str, path: str, fmt: str, resume_at: float, rounds: int) -> Dict[str, List[float]]:
    """Best ``[wall, CPU]`` seconds of the raw-parse process, ``vmr-handler check`` and ``plan
    --json`` of ``path``, interleaved over ``rounds`` (bytecode cached, as installed)."""
    env = bytecode_env(root)
    argvs = {
        "raw": [sys.executable, "-c", RAW_PARSE[fmt], path],
        "check": [*agent_argv(), "check", path],
        "plan": [*agent_argv(), "plan", path, "--resume", repr(resume_at), "--json"],
    }
    _run_rusage([*agent_argv(), "--version"], root, env)  # writes the bytecode cache
    best = {name: [math.inf, math.inf] for name in argvs}
    for _ in range(rounds):
        for name, argv in argvs.items():
            rc, wall, cpu = _run_rusage(argv, root, env)
            if rc != 0:
                raise RuntimeError(f"{name} of {os.path.basename(path)} exited {rc}")
            best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
    return best


def _ratio_row(
    res: Results, what: str, value: List[float], base: List[float], paused: float = math.nan
) -> None:
    """One row: ``value`` against the bare parse ``base`` (wall and CPU, best of the rounds),
    met/missed on the CPU ratio (``paused``: the CPU of a parse with the collector paused)."""
    wall, cpu = value[0] / base[0], value[1] / base[1]
    extra = f"; {value[1] / paused:.2f}x gc-paused parse" if paused == paused else ""
    res.add(
        "4d parse",
        what,
        f"{value[0] * 1000:.0f} / {base[0] * 1000:.0f} ms = {wall:.2f}x wall, {cpu:.2f}x CPU{extra}",
        f"<= {TARGET_PARSE_RATIO:g}x",
        cpu <= TARGET_PARSE_RATIO,
    )


def _floor_row(res: Results, best: Dict[str, List[float]]) -> None:
    """What no ``plan --json`` can go below: ``json.dumps`` (C) of the very document it printed,
    against the bare parse of the schedule; and ``plan --json`` against that parse plus that
    write (a figure, no target: the 3x target counts the parse alone)."""
    dumps, bare, plan = best["dumps"][1], best["bare"][1], best["plan"][1]
    res.add(
        "4d parse",
        "  floor: json.dumps of plan's own output / bare parse",
        f"{dumps * 1000:.0f} / {bare * 1000:.0f} ms = {dumps / bare:.2f}x CPU; plan --json / (parse + that "
        f"write) = {plan / (bare + dumps):.2f}x",
    )


def section_parse_ratios(root: str, res: Results, n: int, yaml_n: int, rounds: int) -> Dict[str, Any]:
    """`check`, `plan --json` and the loader against a bare parse of the same file, for pickle,
    JSON and YAML, with data drops on one entry in ten and on every entry: in a fresh process
    (in process) and as whole processes. Ratios of the best of ``rounds`` interleaved runs."""
    from tests.refpickle import reference_pickle

    print(
        f"\n[4d] check / plan --json / load_schedule against a bare parse: {n:,} entries (YAML "
        f"{yaml_n:,}), drops on 1 in 10 and on every entry, best of {rounds} interleaved rounds"
    )
    base, resume_at, _break = big_records(n)
    figures: Dict[str, Any] = {}
    for every, label in ((10, "1/10"), (1, "all")):
        records = with_drops(base, every)
        files = {
            "json": (os.path.join(root, f"drops{every}.json"), n),
            "pickle": (os.path.join(root, f"drops{every}.pkl"), n),
            "yaml": (os.path.join(root, f"drops{every}.yaml"), yaml_n),
        }
        write_json(files["json"][0], records)
        with open(files["pickle"][0], "wb") as fh:
            fh.write(reference_pickle(records, protocol=2))
        with open(files["yaml"][0], "w", encoding="utf-8") as fh:
            fh.write(yaml_block(records[:yaml_n]))
        for fmt, (path, count) in files.items():
            key = f"{fmt} drops {label}"
            child = subprocess.run(
                [sys.executable, "-c", PARSE_RATIOS, path, fmt, repr(resume_at), str(rounds), str(count)],
                capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=1800, check=False,
            )  # fmt: skip
            if child.returncode != 0:
                raise RuntimeError(f"{key}: {child.stderr.strip().splitlines()[-1:]}")
            inproc = json.loads(child.stdout)
            walls = _process_walls(root, path, fmt, resume_at, rounds)
            best = inproc["best"]
            size = os.path.getsize(path) / 1e6
            print(f"    {key}: {count:,} entries, {size:.1f} MB, outputs complete: {inproc['ok']}")
            what = f"{fmt}, drops {label}, {count:,} entries"
            paused = best["bare_paused"][1]
            _ratio_row(res, f"{what}: load_schedule / bare parse", best["load"], best["bare"], paused)
            _ratio_row(res, "  check / bare parse, in process", best["check"], best["bare"], paused)
            _ratio_row(res, "  plan --json / bare parse, in process", best["plan"], best["bare"], paused)
            _ratio_row(res, "  process: check / raw-parse process", walls["check"], walls["raw"])
            _ratio_row(res, "  process: plan --json / raw-parse process", walls["plan"], walls["raw"])
            _floor_row(res, best)
            figures[key] = {
                "entries": count,
                "mb": size,
                "in_process": best,
                "process": walls,
                "ok": inproc["ok"],
            }
    res.data["parse_ratios"] = figures
    return figures


# --------------------------------------------------------------------------- section 5
def sample_process(pid: int, seconds: float) -> Dict[str, float]:
    proc = psutil.Process(pid)
    c0 = proc.cpu_times()
    x0 = proc.num_ctx_switches()
    proc.cpu_percent(None)
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    pct_psutil = proc.cpu_percent(None)
    c1 = proc.cpu_times()
    x1 = proc.num_ctx_switches()
    mem = proc.memory_info()
    try:
        uss: float = proc.memory_full_info().uss
    except psutil.Error:
        uss = math.nan
    cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
    return {
        "cpu_pct": 100.0 * cpu_s / wall,
        "cpu_pct_psutil": pct_psutil,
        "cpu_s": cpu_s,
        "wall": wall,
        "rss_mb": mem.rss / 2**20,
        "uss_mb": uss / 2**20,
        "wakeups_per_s": ((x1.voluntary - x0.voluntary) + (x1.involuntary - x0.involuntary)) / wall,
        "threads": proc.num_threads(),
        "fds": proc.num_fds(),
    }


def wait_for_event(report: str, types: Sequence[str], timeout: float, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if any(e.get("type") in types for e in read_events(report)):
            return True
        time.sleep(0.05)
    return False


def section_idle(root: str, res: Results, wait_s: float, sample_s: float) -> Dict[str, Any]:
    print(
        f"\n[5] idle agent: one positive entry {wait_s:g} s away; "
        f"sample CPU over {sample_s:g} s, then SIGTERM"
    )
    workdir = os.path.join(root, "idle")
    os.makedirs(workdir, exist_ok=True)
    sched = os.path.join(workdir, "schedule.json")
    write_json(sched, [{"start_time": wait_s, "executable": "/bin/true"}])
    report = os.path.join(workdir, "report.jsonl")
    argv = [
        *agent_argv(),
        "run",
        "--local",
        sched,
        "--start-buffer",
        "0",
        "--launch-dir",
        os.path.join(workdir, "launch"),
        "--state-dir",
        os.path.join(workdir, "state"),
        "--report",
        report,
        "--quiet",
    ]
    t_start = time.monotonic()
    with open(os.path.join(workdir, "agent.stderr"), "wb") as err:
        proc = _spawn(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=workdir,
            env=child_env(),
        )
    try:
        if not wait_for_event(report, ("experiment_started", "start_time_set"), 15.0, proc):
            raise RuntimeError("the agent did not reach the positive phase")
        ready = time.monotonic() - t_start
        time.sleep(1.0)  # let startup work settle
        fig = sample_process(proc.pid, sample_s)
        fig["ready_s"] = ready
        if time.monotonic() - t_start > wait_s:
            print("    WARNING: the sample ran into the entry's firing time")
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(15)
        fig["stop_s"] = time.monotonic() - t_term
        fig["rc"] = rc
    finally:
        _stop_child(proc)
        if proc in _CHILDREN:
            _CHILDREN.remove(proc)
    types = [e.get("type") for e in read_events(report)]
    fig["fired"] = types.count("entry_started")
    fig["stopped_event"] = "agent_stopped" in types
    print(
        f"    agent ready (positive phase) after {fig['ready_s']:.2f} s; SIGTERM -> exit {fig['rc']} in "
        f"{fig['stop_s'] * 1000:.0f} ms, agent_stopped reported: {fig['stopped_event']}, "
        f"entries fired: {fig['fired']}"
    )
    print(
        f"    cpu {fig['cpu_s']:.3f} s in {fig['wall']:.2f} s "
        f"(psutil.cpu_percent {fig['cpu_pct_psutil']:.2f} %), "
        f"{fig['wakeups_per_s']:.1f} context switches/s, {fig['threads']} threads, {fig['fds']} fds, "
        f"USS {fig['uss_mb']:.1f} MB"
    )

    # Baseline: a bare interpreter with the same third-party imports.
    base = _spawn(
        [sys.executable, "-c", "import asyncio, psutil, yaml; import time; time.sleep(30)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        cwd=workdir,
    )
    try:
        time.sleep(1.5)
        bfig = sample_process(base.pid, 1.0)
    finally:
        _stop_child(base)
        if base in _CHILDREN:
            _CHILDREN.remove(base)
    fig["baseline_rss_mb"] = bfig["rss_mb"]
    fig["baseline_uss_mb"] = bfig["uss_mb"]
    res.add(
        "5 idle",
        f"agent CPU while waiting ({fig['wall']:.0f} s)",
        f"{fig['cpu_pct']:.2f} %",
        f"< {TARGET_IDLE_CPU_PCT:g} %",
        fig["cpu_pct"] < TARGET_IDLE_CPU_PCT,
    )
    res.add(
        "5 idle",
        "agent RSS",
        f"{fig['rss_mb']:.1f} MB",
        f"< {TARGET_IDLE_RSS_MB:g} MB",
        fig["rss_mb"] < TARGET_IDLE_RSS_MB,
    )
    res.add("5 idle", "bare python+asyncio+psutil+yaml RSS", f"{bfig['rss_mb']:.1f} MB")
    res.add("5 idle", "agent RSS / bare RSS", f"{fig['rss_mb'] / bfig['rss_mb']:.2f}x")
    res.data["idle"] = fig
    return fig


# --------------------------------------------------------------------------- main
# --------------------------------------------------------------------------- section 6
#: A 200-byte shell script, the data each entry of a "with drops" group puts in place.
DROP_SCRIPT = "#!/bin/sh\n# dropped by the benchmark: 200 bytes of script\n" + "echo x >/dev/null\n" * 7
DROP_SCRIPT += "#" * (199 - len(DROP_SCRIPT)) + "\n"


def drop_records(n: int, drops: bool) -> List[Dict[str, Any]]:
    """``n`` entries at experiment second 1 running ``/bin/true``; with ``drops`` each also
    drops :data:`DROP_SCRIPT` (executable) into its working dir."""
    records: List[Dict[str, Any]] = []
    for _ in range(n):
        record: Dict[str, Any] = {"start_time": 1, "executable": "/bin/true"}
        if drops:
            record["data"] = [{"location": "run.sh", "content": DROP_SCRIPT, "executable": True}]
        records.append(record)
    return records


def group_figures(events: List[Dict[str, Any]]) -> Tuple[float, float]:
    """(first fork, last fork) after the instant, ms: min and max ``lateness`` of the group."""
    lat = [float(e["data"]["lateness"]) * 1000.0 for e in started_events(events) if "lateness" in e["data"]]
    return (min(lat), max(lat)) if lat else (math.nan, math.nan)


def section_drops(
    root: str, res: Results, sizes: Sequence[int], repeats: int, with_log: bool
) -> Dict[str, Any]:
    print(
        f"\n[6] same-instant groups with and without a 200-byte drop per entry (local), "
        f"{repeats} run(s) each, runs interleaved"
    )
    out: Dict[str, Any] = {}
    for n in sizes:
        figs: Dict[bool, List[Tuple[float, float]]] = {False: [], True: []}
        for k in range(repeats):
            for drops in (False, True):
                tag = "drops" if drops else "nodrops"
                where = os.path.join(root, f"g{n}-{tag}-{k}")
                run = run_agent(where, drop_records(n, drops), with_log=with_log)
                figs[drops].append(group_figures(run["events"]))
        med = {
            d: (statistics.median(f[0] for f in figs[d]), statistics.median(f[1] for f in figs[d]))
            for d in (False, True)
        }
        first_ok = med[True][0] <= 1.5 * med[False][0] + 2.0
        last_ok = med[True][1] <= med[False][1] + 10.0
        print(
            f"    {n:>3} entries: first fork {med[True][0]:.1f} ms with drops vs {med[False][0]:.1f} ms "
            f"without (x{med[True][0] / max(med[False][0], 1e-9):.2f}); last fork {med[True][1]:.1f} vs "
            f"{med[False][1]:.1f} ms (+{med[True][1] - med[False][1]:.1f} ms); runs (first, last): "
            f"drops {[(round(a, 1), round(b, 1)) for a, b in figs[True]]}, "
            f"none {[(round(a, 1), round(b, 1)) for a, b in figs[False]]}"
        )
        res.add(
            "6 drops",
            f"{n} entries: first fork, drops / none",
            f"{fmt_ms(med[True][0])} / {fmt_ms(med[False][0])}",
            "<= 1.5x+2ms",
            first_ok,
        )
        res.add(
            "6 drops",
            f"{n} entries: last fork, drops / none",
            f"{fmt_ms(med[True][1])} / {fmt_ms(med[False][1])}",
            "<= +10 ms",
            last_ok,
        )
        out[str(n)] = {
            "drops": figs[True],
            "none": figs[False],
            "median": {"drops": med[True], "none": med[False]},
        }
    res.data["drops"] = out
    return out


def environment(tmp_root: str) -> Dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--", "vmr_handler"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        commit += " (+ uncommitted vmr_handler changes)" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    try:
        from vmr_handler import __version__ as version
    except ImportError:
        version = "?"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "vmr_handler": version,
        "commit": commit,
        "tmp": f"{tmp_root} on {fs_type(tmp_root)}",
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller/shorter runs (smoke test)")
    parser.add_argument("--only", default="1,2,3,4,5,6", help="comma list of sections to run (default all)")
    parser.add_argument(
        "--tmp-root",
        default=tempfile.gettempdir(),
        help="where the agent's launch/state dirs go (the file system matters: fsync)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--with-log",
        action="store_true",
        help="let the agent write its readable log (stderr, to a file) instead of --quiet",
    )
    parser.add_argument("--json", metavar="FILE", help="also write all figures as JSON to FILE")
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}

    atexit.register(_cleanup_children)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    root = tempfile.mkdtemp(prefix="vmr-bench-", dir=args.tmp_root)
    env = environment(root)
    res = Results()
    res.data["environment"] = env
    res.data["mode"] = "quick" if args.quick else "full"
    print(f"vmr-handler agent benchmarks ({res.data['mode']}) -- {env['date']}")
    for key in ("python", "platform", "cpus", "load", "vmr_handler", "commit", "tmp"):
        print(f"  {key:<12} {env[key]}")

    burst_n = 200
    repeats = 1 if args.quick else 3
    t0 = time.monotonic()
    failures = 0

    def guarded(name: str, fn: Callable[[], Any]) -> Any:
        nonlocal failures
        psutil.cpu_percent(None)
        t_section = time.monotonic()
        try:
            return fn()
        except Exception as exc:
            failures += 1
            print(f"    ERROR in section {name}: {exc!r}")
            res.rows.append((name, "ERROR", "-", repr(exc)[:60], "ERROR"))
            return None
        finally:
            busy = psutil.cpu_percent(None)
            res.data.setdefault("machine", {})[name] = {"cpu_busy_pct": busy, "load1": os.getloadavg()[0]}
            print(
                f"    (section {name}: {time.monotonic() - t_section:.1f} s; "
                f"whole machine CPU busy {busy:.0f} % "
                f"during it, load1 {os.getloadavg()[0]:.2f} -- includes this benchmark's own work)"
            )

    agent_burst: Optional[Dict[str, float]] = None
    agent_exec: Optional[Dict[str, float]] = None
    try:
        if "1" in only:
            agent_burst = guarded("1", lambda: section_burst(root, res, burst_n, repeats, args.with_log))
            agent_exec = guarded("1b", lambda: section_exec_times(root, res, burst_n, args.with_log))
            guarded("1c", lambda: section_breakdown(root, res, burst_n))
        if "2" in only:
            n2 = 300 if args.quick else 1000
            guarded("2", lambda: section_spread(root, res, n2, 0.01, args.with_log))
            guarded("2b", lambda: section_spread_breakdown(root, res, n2, 0.01))
        if "3" in only:
            if agent_burst is None:
                agent_burst = {"spread": math.nan, "p99": math.nan, "max": math.nan}
            guarded("3", lambda: section_baseline(root, res, burst_n, repeats, agent_burst, agent_exec))
        if "4" in only:
            guarded(
                "4",
                lambda: section_plan(
                    root,
                    res,
                    100_000,
                    2_000 if args.quick else 10_000,
                    1 if args.quick else 2,
                    10_000 if args.quick else 100_000,
                ),
            )
        if only & {"4", "4d"}:
            guarded("4d", lambda: section_parse_ratios(root, res, 100_000, 2_000 if args.quick else 10_000,
                                                      1 if args.quick else 3))  # fmt: skip
        if "5" in only:
            guarded("5", lambda: section_idle(root, res, 8.0 if args.quick else 20.0, 5.0))
        if "6" in only:
            guarded("6", lambda: section_drops(root, res, (1, 10, 60), 1 if args.quick else 3, args.with_log))
    finally:
        _cleanup_children()
        if args.keep:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    total = time.monotonic() - t0
    res.data["total_s"] = total
    print(
        f"\nSummary ({res.data['mode']}, {env['date']}, {env['cpus']} CPUs, load {env['load']}, "
        f"total {total:.0f} s)\n"
    )
    print(res.table())
    missed = sum(1 for r in res.rows if r[4] == "MISSED")
    print(f"\n{missed} target(s) MISSED, {failures} section error(s). Exit 0: figures only, no pass/fail.")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": res.rows, **res.data}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
