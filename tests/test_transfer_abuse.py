"""A guest cannot freeze the host with its transfers, real ``vmr-host``.

One hostile VM sends, in one message, 100 one-byte ``last: true`` chunks of a 250 MiB sparse
file with a wrong sha256 (before: the whole file was hashed for each, on the loop every VM
shares: 16.8 s frozen). A good VM reports all the while. Asserted: semantics (every report of
the good VM acknowledged, the hostile chunks acknowledged and counted, the file hashed once);
the good VM's ack latency is printed, never asserted (``benchmarks/bench_hash_abuse.py``
measures it before/after).
"""

from __future__ import annotations

import base64
import statistics
import time

import pytest

from tests.fakeagent import SIMPLE, FakeAgent, Host

SIZE = 250 * 1024 * 1024


def _abuse(evil: FakeAgent, n: int, size: int = SIZE) -> list:
    chunk = {
        "location": "sparse.bin",
        "offset": size - 1,
        "data_b64": base64.b64encode(b"x").decode(),
        "size": size,
        "sha256": "0" * 64,
        "last": True,
    }
    return evil.send(*(evil.event("transfer_chunk", dict(chunk)) for _ in range(n)))


def _good_reports(good: FakeAgent, seconds: float) -> list:
    """Report every 20 ms for ``seconds``; the ack latency of each, seconds."""
    lat = []
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        t0 = time.monotonic()
        ident = good.report("output", index=0, stream="stdout", seq=n, line=f"good {n}")
        good.wait_ack([ident])
        lat.append(time.monotonic() - t0)
        time.sleep(0.02)
    return lat


@pytest.mark.faults
def test_chunk_rehash_abuse_leaves_good_vms_alone():
    h = Host({"good": SIMPLE, "evil": SIMPLE})
    try:
        good, evil = h.agent("good"), h.agent("evil")
        for a in (good, evil):
            a.handshake()
            a.accept_schedule()
        ids = _abuse(evil, 100)
        lat = _good_reports(good, 2.0)
        evil.wait_ack(ids, timeout=60)
        print(
            f"\ngood VM ack latency during the attack: median {statistics.median(lat) * 1e3:.1f} ms, "
            f"max {max(lat) * 1e3:.1f} ms over {len(lat)} reports"
        )
        vm = h.vm_status("evil")["transfers"]
        assert vm["bad_sha256"] == 100  # each counted, none put in place
        assert vm["rehashed_bytes"] == SIZE  # the missing bytes hashed once, off the loop
        assert vm["files"] == 0
        good_rows = [r for r in h.jsonl("good") if r["event"]["type"] == "output"]
        assert len(good_rows) == len(lat)  # every report of the good VM stored once
        assert h.status()["vms"]  # the host still answers
    finally:
        h.close()
