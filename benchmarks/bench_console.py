"""What the console costs the host at N VMs: a real ``vmr-host serve --console`` on
the generated logs of N VMs (``tests/reportgen.py``: stages, entries with output, KPIs,
pauses, breaks, failures), no agents, measured from outside:

* the console's first fold of the logs (the host's log line) and its start-up;
* the latency of each read endpoint (median of a few requests): ``/api/v1/experiment``,
  ``/api/v1/vms``, one VM's detail, a page of events, ``/metrics`` and the timeline fragment
  (its first render, then the cached one);
* the baseline: ``status`` over the control socket with the host otherwise idle, against the
  same request sent every 10 ms while the timeline is rendered for the first time (its
  render runs in a worker thread while reports are held: the loop must keep answering).

Prints figures and ratios; never fails on slowness (exit 0 unless the benchmark breaks).
Run: ``.venv/bin/python benchmarks/bench_console.py --vms 200 1000``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Tuple

import requests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.reportgen import generate  # noqa: E402
from vmr_handler.core.control import request_at  # noqa: E402

WAIT = 120.0


def _ms(values: List[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} / {max(values) * 1000:.1f}"


def _wait(pred: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _timed(fn: Callable[[], object], n: int) -> List[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def one(n: int, root: str) -> Dict[str, str]:
    """Start a host on N generated VMs, measure, stop it."""
    logs, sch = os.path.join(root, "logs"), os.path.join(root, "sch")
    gen = generate(logs, n, kpi_interval=10.0)
    os.makedirs(sch)
    for vm in gen.vms:
        with open(os.path.join(sch, f"{vm}.yaml"), "w") as fh:
            fh.write("- {start_time: 1, executable: /bin/true}\n")
    out = open(os.path.join(root, "host.out"), "wb")  # noqa: SIM115
    started = time.perf_counter()
    host = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler.host", "serve", "--schedules", sch, "--logs", logs,
         "--channels", os.path.join(root, "ch"), "--console", "127.0.0.1:0"],
        stdout=out, stderr=out,
    )  # fmt: skip
    try:
        url_file = os.path.join(logs, "console.url")
        _wait(lambda: os.path.exists(url_file), "the console")
        up = time.perf_counter() - started
        with open(url_file) as fh:
            url = fh.read().strip().rstrip("/")
        with open(os.path.join(root, "host.out"), errors="replace") as fh:
            text = fh.read()
        m = re.search(r"console: (\d+) report\(s\) of (\d+) VM\(s\) folded in ([\d.]+) s", text)
        sock = os.path.join(logs, "vmr-host.sock")

        def status() -> object:
            return request_at(sock, {"cmd": "status"}, timeout=60)

        def get(path: str) -> Callable[[], object]:
            return lambda: requests.get(url + path, timeout=120).raise_for_status()

        base = _timed(status, 10)
        during: List[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                during.append(_timed(status, 1)[0])
                time.sleep(0.01)

        poller = threading.Thread(target=poll)
        poller.start()
        first = _timed(get("/api/v1/timeline"), 1)
        done.set()
        poller.join()
        vm = gen.vms[len(gen.vms) // 2]
        fig = {
            "records folded": m.group(1) if m else "?",
            "fold": f"{float(m.group(3)):.2f} s" if m else "?",
            "host start -> console answers": f"{up:.2f} s",
            "status, idle (ms, median / max)": _ms(base),
            "timeline, first render (ms)": f"{first[0] * 1000:.0f}",
            "status during that render (ms, median / max)": f"{_ms(during)} (n={len(during)})",
            "ratio: max status during render / idle median": f"{max(during) / statistics.median(base):.1f}x",
            "timeline, cached (ms)": _ms(_timed(get("/api/v1/timeline"), 5)),
            "/api/v1/experiment (ms)": _ms(_timed(get("/api/v1/experiment"), 5)),
            "/api/v1/vms (ms)": _ms(_timed(get("/api/v1/vms"), 5)),
            "/api/v1/vms/VM, one VM (ms)": _ms(_timed(get(f"/api/v1/vms/{vm}"), 5)),
            "events page, 100 (ms)": _ms(_timed(get(f"/api/v1/vms/{vm}/events?limit=100"), 5)),
            "/metrics, first (ms)": _ms(_timed(get("/metrics"), 1)),
        }
        return fig
    finally:
        host.terminate()
        host.wait(timeout=60)
        out.close()


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vms", type=int, nargs="+", default=[200, 1000])
    args = ap.parse_args(argv)
    results: List[Tuple[int, Dict[str, str]]] = []
    for n in args.vms:
        root = tempfile.mkdtemp(prefix="vbc", dir="/tmp")
        try:
            results.append((n, one(n, root)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    keys = list(results[0][1])
    print("| figure | " + " | ".join(f"{n} VMs" for n, _ in results) + " |")
    print("|---|" + "---|" * len(results))
    for k in keys:
        print(f"| {k} | " + " | ".join(r.get(k, "-") for _, r in results) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
