"""Cost of the console's ``GET /metrics`` (vmr_handler/host/console/metrics.py).

    .venv/bin/python benchmarks/bench_metrics.py [--vms 100,1000,5000] [--rounds 20] [--interfaces 2]

For each VM count, a real :class:`Experiment` of real :class:`VmSession`\\ s (logs in a temporary
directory, never opened: no file is read or written per scrape) whose state is that of a running
experiment: every VM configured (the start set), 20 entry runs applied (one in ten an error), a
KPI sample with ``--interfaces`` network interfaces, the reports also counted by
:meth:`ConsoleMetrics.observe`. It prints the median and the slowest of ``--rounds`` scrapes, ms:

- ``snapshot``: :meth:`ConsoleMetrics.snapshot`, the live state read (the part that must run on
  the host's event loop);
- ``text``: :meth:`ConsoleMetrics.render` of that snapshot (metric families + prometheus-client's
  text exposition; reads nothing else, so it may run in a worker thread);
- ``render``: :meth:`ConsoleMetrics.render` (both: what ``GET /metrics`` costs when all of it
  runs on the loop);

side by side with the baseline, ``rows``: what ``GET /api/v1/vms`` builds from the same state
(``views.all_rows`` + ``json.dumps``), and the ratio render / rows; then the exposition's size,
lines and µs per VM. Then, on a running asyncio loop at the largest VM count, the loop's longest
stall (a 1 ms ticker's worst gap) during a scrape, side by side: ``render()`` called on the loop
(the baseline) and ``await exposition()`` (snapshot on the loop, text in a worker thread), with
each scrape's wall time. And ``observe``: µs per stored report counted (an ``entry_started``; an
``output`` the metrics skip). Never fails on slowness: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Tuple

from vmr_handler.core.events import Event
from vmr_handler.host.console.metrics import ConsoleMetrics
from vmr_handler.host.console.views import all_rows
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.serve.config import HostConfig, Limits, VmSpec
from vmr_handler.host.serve.experiment.experiment import Experiment
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.session.api import HostEvents
from vmr_handler.host.serve.session.session import VmSession

SCHEDULE = b"- {start_time: 1, executable: /bin/true}\n"
T0 = 1_700_000_000.0
ENTRIES = 20


def kpi(interfaces: int, i: int) -> Dict[str, object]:
    """A KPI sample's data as an agent sends it."""
    net = {
        f"eth{n}": {"bytes_sent": 300.0 + i, "bytes_recv": 1536.0, "packets_sent": 3.0, "packets_recv": 4.0}
        for n in range(interfaces)
    }
    return {
        "interval": 10, "cpu_percent": 12.5, "load": [0.52, 0.3, 0.1], "mem_used": 1.5e9,
        "mem_available": 2e9, "mem_total": 4e9, "disk_used": 5e9, "disk_total": 2e10,
        "disk_read_rate": 0.0, "disk_write_rate": 12_800.0, "net": net,
    }  # fmt: skip


def reports(vm: str, interfaces: int, i: int) -> List[Event]:
    """What one VM of a running experiment reported: configured, entry runs, a KPI sample."""
    evs = [Event("configured", T0, f"{vm}-c", {})]
    for e in range(ENTRIES):
        start = {"index": e, "start_time": 1 + e, "scheduled": T0 + 1 + e, "lateness": 0.0005 * (e + 1)}
        evs.append(Event("entry_started", T0 + e, f"{vm}-s{e}", start))
        status = "error" if e % 10 == 9 else "success"
        evs.append(
            Event("entry_exited", T0 + e, f"{vm}-x{e}", {"index": e, "status": status, "exit_code": 0})
        )
    evs.append(Event("kpi", T0 + ENTRIES, f"{vm}-k", kpi(interfaces, i)))
    return evs


def experiment(logs: str, vms: int, interfaces: int) -> Tuple[Experiment, ConsoleMetrics]:
    """``vms`` VMs of a running experiment, their reports applied and counted."""
    limits = Limits()
    digest = hashlib.sha256(SCHEDULE).hexdigest()
    names = [f"vm{i:05d}" for i in range(vms)]
    specs = {n: VmSpec(n, f"{logs}/{n}.yaml", SCHEDULE, digest, "yaml") for n in names}
    config = HostConfig(vms=specs, expected=frozenset(names), logs=logs, channels=logs, start_buffer=1.0)
    sessions: Dict[str, VmSession] = {}
    exp = Experiment(config, sessions)
    exp.loading = True  # as at host start: nothing is sent or announced
    for n, spec in specs.items():
        vmlog = VmLog(logs, n, limits.log_quota)
        transfers = TransferStore(logs, n, limits.transfer_file, limits.transfer_total)
        sessions[n] = VmSession(
            spec, True, limits, vmlog, transfers, ResourceStore(None), exp, HostEvents(), {}
        )
    metrics = ConsoleMetrics(exp, clock=lambda: T0 + 3600)
    for i, (n, session) in enumerate(sessions.items()):
        for ev in reports(n, interfaces, i):
            session.apply(ev, ev.timestamp)
            metrics.observe(n, ev, ev.timestamp)
    exp.loading = False
    return exp, metrics


def timed(fn: Callable[[], object], rounds: int) -> Tuple[float, float]:
    """(median, slowest) wall time of ``fn()`` in ms over ``rounds`` calls, after one warm-up."""
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times)


def row(vms: int, rounds: int, interfaces: int) -> str:
    """One line of figures for ``vms`` VMs."""
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as logs:
        exp, metrics = experiment(logs, vms, interfaces)
        assert exp.barrier.start_time is not None  # every VM configured: running
        snap = timed(metrics.snapshot, rounds)
        frozen = metrics.snapshot()
        text = timed(lambda: metrics.render(frozen), rounds)
        render = timed(metrics.render, rounds)
        rows = timed(lambda: json.dumps(all_rows(exp, T0 + 3600)), rounds)
        body, _kind = metrics.render()
    lines = body.count(b"\n")
    return (
        f"{vms:>6}{snap[0]:>10.1f}{snap[1]:>8.1f}{text[0]:>8.1f}{text[1]:>8.1f}{render[0]:>8.1f}{render[1]:>8.1f}"
        f"{rows[0]:>10.1f}{rows[1]:>8.1f}{render[0] / rows[0]:>8.2f}"
        f"{len(body) / 1024:>10.0f}{lines:>9}{render[0] * 1000 / vms:>9.0f}"
    )


async def stalls(metrics: ConsoleMetrics, rounds: int) -> Dict[str, Tuple[float, float]]:
    """Per way of scraping: (median worst loop gap, median scrape wall time), ms."""

    async def scrape_inline() -> object:
        return metrics.render()

    async def scrape_off_loop() -> object:
        metrics._last = None  # never the cached render: measure a whole one each time
        return await metrics.exposition()

    figures: Dict[str, Tuple[float, float]] = {}
    for name, scrape in (("render() on the loop", scrape_inline), ("await exposition()", scrape_off_loop)):
        gaps, walls = [], []
        for _ in range(rounds):
            worst = [0.0]
            running = [True]

            async def ticker(worst: List[float] = worst, running: List[bool] = running) -> None:
                last = time.perf_counter()
                while running[0]:
                    await asyncio.sleep(0.001)
                    now = time.perf_counter()
                    worst[0] = max(worst[0], now - last)
                    last = now

            tick = asyncio.ensure_future(ticker())
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            await scrape()
            walls.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.01)
            running[0] = False
            await tick
            gaps.append(worst[0] * 1000)
        figures[name] = (statistics.median(gaps), statistics.median(walls))
    return figures


def stall_rows(vms: int, rounds: int, interfaces: int) -> List[str]:
    """The loop stall lines at ``vms`` VMs."""
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as logs:
        _exp, metrics = experiment(logs, vms, interfaces)
        figures = asyncio.run(stalls(metrics, rounds))
    base = figures["render() on the loop"][0]
    return [
        f"  {name:<22} longest loop stall {gap:>7.1f} ms ({gap / base:.2f} x)   scrape {wall:>7.1f} ms"
        for name, (gap, wall) in figures.items()
    ]


def observe_us(rounds: int) -> str:
    """µs per :meth:`ConsoleMetrics.observe` of an ``entry_started`` and of a skipped ``output``."""
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as logs:
        _exp, metrics = experiment(logs, 10, 1)
        started = Event(
            "entry_started", T0, "s", {"index": 1, "start_time": 1, "scheduled": T0, "lateness": 0.002}
        )
        output = Event("output", T0, "o", {"index": 1, "stream": "stdout", "seq": 1, "line": "x"})
        n = rounds * 1000
        figures = []
        for ev in (started, output):
            t0 = time.perf_counter()
            for _ in range(n):
                metrics.observe("vm00001", ev, T0)
            figures.append((time.perf_counter() - t0) * 1e6 / n)
    return f"observe: entry_started {figures[0]:.2f} µs, output (skipped) {figures[1]:.2f} µs per report"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--vms", default="100,1000,5000", help="VM counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=20, help="scrapes timed per VM count")
    parser.add_argument("--interfaces", type=int, default=2, help="network interfaces per VM's KPI sample")
    args = parser.parse_args()
    print(f"{ENTRIES} entry runs and one KPI sample ({args.interfaces} interfaces) per VM; ms median / max")
    print(
        f"{'VMs':>6}{'snapshot':>10}{'max':>8}{'text':>8}{'max':>8}{'render':>8}{'max':>8}{'rows':>10}{'max':>8}"
        f"{'ratio':>8}{'KiB':>10}{'lines':>9}{'µs/VM':>9}"
    )
    for vms in (int(v) for v in args.vms.split(",")):
        print(row(vms, args.rounds, args.interfaces), flush=True)
    print("(render = snapshot + text = GET /metrics; rows = GET /api/v1/vms's all_rows + json.dumps;")
    print(" ratio = render / rows; µs/VM = render / VMs)")
    largest = max(int(v) for v in args.vms.split(","))
    print(f"\nthe event loop during a scrape at {largest} VMs (median of {min(args.rounds, 10)}):")
    for line in stall_rows(largest, min(args.rounds, 10), args.interfaces):
        print(line)
    print(observe_us(args.rounds))


if __name__ == "__main__":
    main()
