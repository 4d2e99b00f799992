#!/usr/bin/env python3
"""Issue 16, item 2: how late a good VM's reports are while another VM abuses chunk hashing.

One real ``vmr-host serve``; two protocol clients (``tests/fakeagent.py``): ``evil`` sends one
message of 100 one-byte ``last: true`` chunks of a 250 MiB sparse file with a wrong sha256,
``good`` sends a report every 20 ms and times its ack. Two attacks:

* ``same``: every chunk carries the same byte (the issue's attack);
* ``alternate``: the byte alternates, so every chunk changes hashed bytes and the file must be
  hashed again each time (the worst a guest can make of it now: in a worker thread, within the
  VM's hashing budget);
* ``flood``: ``evil`` sends messages of 1000 ``output`` reports of 100 bytes each as fast as its
  socket takes them for :data:`FLOOD_S` seconds (the host's per-VM message rate and log quota
  apply).

Printed per attack: the good VM's ack latency (median, max) while the attack lasts, how long
``vmr-host status`` took meanwhile, how long the evil VM waited for its acks, and the CPU the
host process (all its threads: the hashing runs in workers) spent meanwhile, in seconds and as
a share of one core (the per-VM hashing budget, ``host/intake.REHASH_RATE``, bounds it). Never
fails because something is slow.

Run from the repository root (``--src DIR``: run the host from another checkout, e.g. the
commit before, made with ``git archive HEAD | tar -x -C DIR``)::

    .venv/bin/python benchmarks/bench_hash_abuse.py [--src DIR] [--attacks same,alternate,flood]
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Dict, List

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.fakeagent import SIMPLE, FakeAgent, Host

SIZE = 250 * 1024 * 1024
CHUNKS = 100


#: Seconds the ``flood`` attack lasts.
FLOOD_S = 10.0


def flood(evil: FakeAgent) -> int:
    """Send 1000-report messages for :data:`FLOOD_S` seconds; the number of reports sent."""
    sent, seq, end = 0, 0, time.monotonic() + FLOOD_S
    while time.monotonic() < end:
        batch = []
        for _ in range(1000):
            seq += 1
            data = {"index": 0, "stream": "stdout", "seq": seq, "line": "x" * 100}
            batch.append(evil.event("output", data))
        evil.send(*batch)
        sent += len(batch)
    return sent


def attack(h: Host, kind: str) -> Dict[str, float]:
    good, evil = h.agent("good"), h.agent("evil")
    for a in (good, evil):
        a.handshake()
        a.accept_schedule()
    events = []
    for i in range(CHUNKS):
        byte = b"x" if kind == "same" or i % 2 == 0 else b"y"
        events.append(
            evil.event(
                "transfer_chunk",
                {
                    "location": f"sparse-{kind}.bin",
                    "offset": SIZE - 1,
                    "data_b64": base64.b64encode(byte).decode(),
                    "size": SIZE,
                    "sha256": "0" * 64,
                    "last": True,
                },
            )
        )
    done = threading.Event()
    evil_wait: List[float] = []
    host = psutil.Process(h.proc.pid)
    cpu0, wall0 = sum(host.cpu_times()[:2]), time.monotonic()

    def evil_side() -> None:
        t0 = time.monotonic()
        if kind == "flood":
            flood(evil)
        else:
            evil.wait_ack(evil.send(*events), timeout=900)
        evil_wait.append(time.monotonic() - t0)
        done.set()

    status_times: List[float] = []

    def status_side() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "vmr_handler.host", "status", "--json", "--logs", str(h.logs)],
                capture_output=True,
                timeout=120,
                check=False,
            )
            status_times.append(time.monotonic() - t0)

    threads = [threading.Thread(target=evil_side), threading.Thread(target=status_side)]
    for t in threads:
        t.start()
    lat: List[float] = []
    n = 0
    while not done.is_set() or n < 5:
        n += 1
        t0 = time.monotonic()
        ident = good.report("output", index=0, stream="stdout", seq=n, line=f"good {n}")
        good.wait_ack([ident], timeout=120)
        lat.append(time.monotonic() - t0)
        time.sleep(0.02)
    for t in threads:
        t.join()
    cpu, wall = sum(host.cpu_times()[:2]) - cpu0, time.monotonic() - wall0
    good.close()
    evil.close()
    return {
        "good_median_ms": statistics.median(lat) * 1e3,
        "good_max_ms": max(lat) * 1e3,
        "reports": len(lat),
        "status_max_s": max(status_times) if status_times else float("nan"),
        "evil_wait_s": evil_wait[0],
        "host_cpu_s": cpu,
        "host_cpu_share": cpu / wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", help="run vmr-host from this checkout (default: this one)")
    ap.add_argument(
        "--attacks", default="same,alternate,flood", help="which attacks, comma-separated (default: all)"
    )
    args = ap.parse_args()
    if args.src:
        os.chdir(args.src)  # `python -m vmr_handler.host` takes the package from the cwd first
    print(f"host from {os.getcwd()}, {CHUNKS} x 1-byte last chunks of a {SIZE >> 20} MiB sparse file")
    for kind in args.attacks.split(","):
        h = Host({"good": SIMPLE, "evil": SIMPLE})
        try:
            r = attack(h, kind)
        finally:
            h.close()
        print(
            f"{kind:>9}: good VM ack latency median {r['good_median_ms']:.1f} ms, "
            f"max {r['good_max_ms']:.1f} ms "
            f"({r['reports']:.0f} reports); `vmr-host status` max {r['status_max_s']:.2f} s; "
            f"evil acked after {r['evil_wait_s']:.2f} s; host CPU {r['host_cpu_s']:.1f} s "
            f"({100 * r['host_cpu_share']:.0f} % of a core)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
