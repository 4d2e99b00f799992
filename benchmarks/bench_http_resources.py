"""Throughput of a VM-resource download: over HTTP (``vmr-host serve --http``) vs in
``resource_chunk`` events over the channel (unix socket, or MQTT through a local mosquitto).

    .venv/bin/python benchmarks/bench_http_resources.py [--mib 20] [--transports unix,mqtt]

Real ``vmr-host`` and ``vmr-handler run`` processes on this machine (tests/hostenv.py). For
each path it runs the schedule once with a ``--mib`` MiB random file and once with a 1-byte
file and times, on the agent's clock, from the agent's ``result`` accepting the schedule to
its ``data_placed`` event; the 1-byte run's time (start-up of the fetch, the drop itself) is
subtracted, so MB/s = size / (t_big - t_small). One run each: a figure, not a statistic.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.broker import free_port
from tests.hostenv import HostEnv


def delivery_seconds(transport: str, http: bool, size: int) -> float:
    """Seconds from schedule accepted to the file dropped, for one ``size``-byte resource."""
    sched = [{"start_time": -5, "data": [{"location": "f.bin", "filename": "f.bin"}]}]
    env = HostEnv({"a": sched}, start_buffer=0.5, transport=transport)
    try:
        (env.resources / "f.bin").write_bytes(os.urandom(size))
        env.start_host(*(["--http", f"127.0.0.1:{free_port()}"] if http else []))
        env.start_agent("a")
        placed = env.wait_event("a", "data_placed", index=0)["event"]
        accepted = env.wait_event("a", "result", status="success")["event"]
        return float(placed["timestamp"]) - float(accepted["timestamp"])
    finally:
        env.close()


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=20)
    ap.add_argument("--transports", default="unix,mqtt")
    args = ap.parse_args(argv)
    size = args.mib * 1024 * 1024
    print(f"{'path':<24}{'t(' + str(args.mib) + ' MiB) s':>14}{'t(1 B) s':>10}{'MB/s':>9}")
    for transport in args.transports.split(","):
        for http in (False, True):
            big = delivery_seconds(transport, http, size)
            small = delivery_seconds(transport, http, 1)
            name = f"{'http' if http else 'channel'} ({transport})"
            rate = size / 1e6 / max(big - small, 1e-6)
            print(f"{name:<24}{big:>14.3f}{small:>10.3f}{rate:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
