"""Cost of the agent's KPI samples (``vmr_handler/agent/machine/kpi.py``).

    .venv/bin/python benchmarks/bench_kpi.py [--seconds 60] [--rounds 1] [--samples 2000]

[1] CPU of an idle agent, side by side: three real ``vmr-handler run --local`` processes on
    the same idle schedule (one entry a day away), started together, with ``--kpi-interval``
    0 (off: the baseline), 10 (the host's default) and 1. After a warm-up, each process's
    user + system CPU seconds (psutil ``cpu_times``) over ``--seconds`` are printed as % of one
    core, with the difference to the baseline, the ratio, and the extra CPU per sample (the
    psutil counters tick every 10 ms: measure over tens of seconds). Every agent writes its report
    file and its readable log (to /dev/null), as in production. Target: the 1 s agent costs
    < 0.5 % of a core.
[2] One sample (``KpiSampler.sample()`` with psutil on this machine): median and p99 in µs over
    ``--samples`` samples, each reading's median, the JSON size of a ``kpi`` event and what it
    adds to a VM's log per day.

Never fails on slowness: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

import psutil
from _procs import stop_child  # benchmarks/ is sys.path[0] when run as a script

from vmr_handler.agent.machine.kpi import READINGS, KpiSampler, PsutilProbe
from vmr_handler.core.clock import SystemClock
from vmr_handler.core.events import EventFactory, EventType

IDLE = "- {start_time: 86400, executable: /bin/true}\n"  # nothing happens for a day
INTERVALS = (0.0, 10.0, 1.0)


def _agent(root: str, interval: float) -> Tuple[subprocess.Popen[Any], str]:
    """An agent on the idle schedule in ``root``/kpi-``interval``; (process, report path)."""
    here = os.path.join(root, f"kpi-{interval:g}")
    os.makedirs(here)
    schedule = os.path.join(here, "idle.yaml")
    with open(schedule, "w", encoding="utf-8") as fh:
        fh.write(IDLE)
    report = os.path.join(here, "report.jsonl")
    args = ["run", "--local", schedule, "--start-buffer", "0", "--kpi-interval", f"{interval:g}",
            "--state-dir", os.path.join(here, "state"), "--launch-dir", os.path.join(here, "launch"),
            "--report", report]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, report


def _started(report: str) -> bool:
    try:
        with open(report, encoding="utf-8") as fh:
            return any('"experiment_started"' in line for line in fh)
    except OSError:
        return False


def _cpu(proc: subprocess.Popen[Any]) -> float:
    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


def section_cpu(seconds: float, rounds: int) -> None:
    print(f"\n[1] CPU of an idle `vmr-handler run --local` agent over {seconds:g} s, side by side "
          f"(% of one core; {psutil.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at start)")  # fmt: skip
    print(f"{'round':>5}  {'--kpi-interval':>14}  {'CPU s':>8}  {'% of a core':>11}  "
          f"{'minus off':>9}  {'ratio to off':>12}  {'kpi events':>10}  {'CPU ms/sample':>13}")  # fmt: skip
    for r in range(1, rounds + 1):
        with tempfile.TemporaryDirectory(prefix="bench-kpi-") as root:
            agents = [(i, *_agent(root, i)) for i in INTERVALS]
            try:
                deadline = time.monotonic() + 30
                while not all(_started(rep) for _, _, rep in agents) and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(2.0)  # past the start: imports done, loop idle
                before = {i: _cpu(p) for i, p, _ in agents}
                t0 = time.monotonic()
                time.sleep(seconds)
                elapsed = time.monotonic() - t0
                used = {i: _cpu(p) - before[i] for i, p, _ in agents}
                counts: Dict[float, int] = {}
                for i, _, rep in agents:
                    with open(rep, encoding="utf-8") as fh:
                        counts[i] = sum('"type": "kpi"' in line for line in fh)
            finally:
                for _, p, _ in agents:
                    stop_child(p)
        off = used[0.0] / elapsed * 100
        for i in INTERVALS:
            pct = used[i] / elapsed * 100
            ratio = f"{pct / off:.2f}x" if off > 0 else "- (off: 0)"
            each = f"{(used[i] - used[0.0]) / counts[i] * 1000:.2f}" if counts[i] else "-"
            print(f"{r:>5}  {i:>14g}  {used[i]:>8.3f}  {pct:>10.3f}%  {pct - off:>+8.3f}%  "
                  f"{ratio:>12}  {counts[i]:>10}  {each:>13}")  # fmt: skip


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def section_sample(samples: int) -> None:
    print(f"\n[2] one sample on this machine (psutil {psutil.__version__}), {samples} samples")
    with tempfile.TemporaryDirectory(prefix="bench-kpi-") as root:
        sampler = KpiSampler(lambda *a, **k: None, SystemClock(), 1.0, path=root)
        sampler.sample()
        times: List[float] = []
        for _ in range(samples):
            t0 = time.perf_counter()
            data = sampler.sample()
            times.append(time.perf_counter() - t0)
        probe = PsutilProbe(root)
        parts = {}
        for name in READINGS:
            read = getattr(probe, name)
            one: List[float] = []
            for _ in range(max(100, samples // 4)):
                t0 = time.perf_counter()
                read()
                one.append(time.perf_counter() - t0)
            parts[name] = statistics.median(one) * 1e6
    print(f"  KpiSampler.sample(): median {statistics.median(times) * 1e6:.0f} µs, "
          f"p99 {_percentile(times, 0.99) * 1e6:.0f} µs, max {max(times) * 1e6:.0f} µs")  # fmt: skip
    print("  readings, median µs: " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items()))
    event = EventFactory(time.time).make(EventType.KPI, **data)
    size = len(json.dumps(event.to_dict(), allow_nan=False)) + 1
    nets = len(data.get("net") or {})
    print(f"  one kpi event: {size} bytes of JSON ({nets} interface(s)); a VM's log grows by "
          f"{size * 8640 / 1e6:.1f} MB/day at 10 s, {size * 86400 / 1e6:.1f} MB/day at 1 s")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measured time per round (default 60)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of [1] (default 1)")
    ap.add_argument("--samples", type=int, default=2000, help="samples timed in [2] (default 2000)")
    ap.add_argument("--only", type=int, choices=(1, 2), help="run only this section")
    args = ap.parse_args()
    if args.only in (None, 2):
        section_sample(args.samples)
    if args.only in (None, 1):
        section_cpu(args.seconds, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
