#!/usr/bin/env python3
"""Issue 16, item 3: how long ``vmr-host serve`` takes to come back on a large log, and its memory.

Writes one VM's ``<vm>.jsonl`` of ``--size-mb`` MB (an agent run: configured, entries starting
and ending, 200 output lines each, ~250 bytes a line) straight to a logs directory, then starts
the real host on it and times start -> first ``vmr-host status --json`` answer, with the host's
RSS then:

* ``full replay``: no ``<vm>.ckpt`` (a start that replays the whole log; the host saves a
  checkpoint at the end of it);
* ``checkpoint``: the same log after that first start, plus a tail of 1000 lines written after
  the checkpoint (as a host killed between two checkpoints leaves it);
* with ``--before DIR`` (a checkout of the commit before, ``git archive HEAD | tar -x -C DIR``):
  that host on the same log first.

With ``--flood N``: instead, the host's RSS before and after one VM sends ``N`` distinct
reports (~120 bytes of ``.jsonl`` each, 1000 a message) with the default 1 GiB quota, and (this
tree only: the commit before has no ``--log-quota``) with a quota of ``--quota`` bytes, so that
nearly all of them come past it.

Prints the figures and the ratio; never fails because something is slow. Run from the
repository root::

    .venv/bin/python benchmarks/bench_host_restart.py [--size-mb 1024] [--before DIR]
    .venv/bin/python benchmarks/bench_host_restart.py --flood 1000000 [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.fakeagent import SIMPLE, Host
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import encode_message

PREFIX = "bench0000000"
LINE = (
    '{"host_received":%.3f,"vm":"vm1","event":{"timestamp":%.3f,"type":"output","id":"'
    + PREFIX
    + '-%08d","data":{"index":%d,"stream":"stdout","line":"line %d of entry %d %s"}}}\n'
)


def _rec(n: int, type_: str, data: Dict[str, object]) -> str:
    t = 1.7e9 + n / 1000
    ev = {"timestamp": t, "type": type_, "id": f"{PREFIX}-{n:08d}", "data": data}
    return json.dumps({"host_received": t, "vm": "vm1", "event": ev}, separators=(",", ":")) + "\n"


def generate(path: Path, size: int, first: int = 1) -> Tuple[int, int]:
    """Append an agent run's lines to ``path`` until it holds ``size`` bytes; (lines, next id)."""
    n = first
    lines = 0
    pad = "z" * 120
    with open(path, "a", encoding="utf-8") as fh:
        if first == 1:
            for type_, data in (
                ("agent_started", {"resumed_from_journal": False}),
                ("configured", {"at": 1.7e9}),
            ):
                fh.write(_rec(n, type_, data))
                n += 1
                lines += 1
        index = 0 if first == 1 else first  # (a tail's entries get numbers of their own)
        while fh.tell() < size:
            index += 1
            chunk = [_rec(n, "entry_started", {"index": index, "executable": "/bin/x", "start_time": index})]
            n += 1
            for k in range(200):
                t = 1.7e9 + n / 1000
                chunk.append(LINE % (t, t, n, index, k, index, pad))
                n += 1
            chunk.append(_rec(n, "entry_exited", {"index": index, "status": "ok", "exit_code": 0}))
            n += 1
            fh.write("".join(chunk))
            lines += len(chunk)
    return lines, n


def _answers(path: str) -> bool:
    """True when the host's control socket accepts a connection (the host has started)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def start(h: Host, src: Optional[str]) -> Tuple[float, float, Dict[str, object]]:
    """Start ``h`` (from checkout ``src``); (seconds to status, RSS MiB, vm1's status)."""
    here = os.getcwd()
    if src:
        os.chdir(src)  # `python -m vmr_handler.host` takes the package from the cwd first
    try:
        t0 = time.monotonic()
        h.start(wait=False)  # the test harness's wait is bounded at 20 s: too short for before
        assert h.proc is not None
        while not _answers(str(h.logs / "vmr-host.sock")):  # (`status` would read the logs itself)
            if h.proc.poll() is not None or time.monotonic() - t0 > 600:
                raise SystemExit(f"vmr-host did not come up: {h.stderr()[-2000:]}")
            time.sleep(0.05)
        took = time.monotonic() - t0
        rss = psutil.Process(h.proc.pid).memory_info().rss / 2**20
        status = h.vm_status("vm1")
    finally:
        os.chdir(here)
    h.stop()
    return took, rss, status


def _rss(h: Host) -> float:
    assert h.proc is not None
    return psutil.Process(h.proc.pid).memory_info().rss / 2**20


def flood(n: int, src: Optional[str], args: Tuple[str, ...] = ()) -> Tuple[float, float, float]:
    """(RSS MiB after the handshake, after ``n`` reports, seconds) of a host from ``src``."""
    here = os.getcwd()
    if src:
        os.chdir(src)
    h = Host({"vm1": SIMPLE}, args)
    try:
        a = h.agent("vm1")
        a.handshake()
        rss0 = _rss(h)
        t0 = time.monotonic()
        for first in range(1, n + 1, 1000):
            events = [
                Event(
                    "output",
                    time.time(),
                    f"{PREFIX}-{i:08d}",
                    {"index": 1, "stream": "stdout", "line": "x" * 40},
                )
                for i in range(first, min(first + 1000, n + 1))
            ]
            a.send_raw(encode_message(events, time.time()))
            a.pump(0.001)
            a.inbox.clear()
        last = f"{PREFIX}-{n:08d}"
        while True:  # acks come in order of the messages: the last one acked means all are
            a.pump(1.0)
            if any(e.type == "ack" and last in e.data.get("ids", ()) for e in a.inbox):
                break
            a.inbox.clear()
        return rss0, _rss(h), time.monotonic() - t0
    finally:
        os.chdir(here)
        h.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="size of the generated log (MB, default 1024)")
    ap.add_argument("--before", metavar="DIR", help="also time the host of this checkout (the commit before)")
    ap.add_argument("--flood", type=int, metavar="N", help="measure RSS under a flood of N reports instead")
    ap.add_argument("--quota", type=int, default=2_000_000, help="--log-quota of the flood past it (bytes)")
    args = ap.parse_args()
    if args.flood:
        runs = [("before", args.before, ())] if args.before else []
        runs += [
            ("this tree", None, ()),
            ("this tree, past the quota", None, ("--log-quota", str(args.quota))),
        ]
        for what, src, extra in runs:
            rss0, rss1, took = flood(args.flood, src, extra)
            print(
                f"{what:>26}: RSS {rss0:6.1f} MiB -> {rss1:6.1f} MiB "
                f"after {args.flood:,} reports ({took:.1f} s)"
            )
        return 0
    h = Host({"vm1": SIMPLE}, start=False)
    try:
        h.logs.mkdir()
        t0 = time.monotonic()
        lines, nxt = generate(h.logs / "vm1.jsonl", args.size_mb * 10**6)
        size = os.path.getsize(h.logs / "vm1.jsonl")
        print(f"generated {size / 1e6:.0f} MB, {lines:,} lines in {time.monotonic() - t0:.1f} s")
        results = []
        if args.before:
            took, rss, _ = start(h, args.before)
            results.append(("before (commit before, full replay)", took, rss, lines))
        took, rss, st = start(h, None)
        results.append(("full replay (no checkpoint)", took, rss, st["memory"]["replayed_lines"]))
        more, _ = generate(h.logs / "vm1.jsonl", size + 250_000, first=nxt)
        print(f"then {more:,} lines appended after the checkpoint")
        took, rss, st = start(h, None)
        results.append(("from the checkpoint", took, rss, st["memory"]["replayed_lines"]))
        base = results[0][1]
        for what, took, rss, replayed in results:
            print(
                f"{what:>38}: {took:6.2f} s to status ({base / took:5.1f}x faster than the first), "
                f"RSS {rss:6.1f} MiB, {replayed:,} lines replayed"
            )
    finally:
        h.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
