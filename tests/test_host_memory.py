"""Host memory per VM is bounded whatever the VM sends, and a restart replays only the tail of
a VM's ``.jsonl`` after its checkpoint.

Pure logic (:class:`SeenIds`, :class:`VmLog` on a temp dir) and the real ``vmr-host serve``
driven by fake agents over unix sockets (``tests/fakeagent.py``). Nothing asserts on speed:
the restart is checked by the counters of what it replayed; RSS figures are printed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, List

import psutil
import pytest

from tests.fakeagent import SIMPLE, FakeAgent, Host
from vmr_handler.core.errors import SavedStateError
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import encode_message
from vmr_handler.host.logs.seenids import SeenIds, SeenLimits, split_id
from vmr_handler.host.logs.store import VmLog


# ------------------------------------------------------------------------------ SeenIds
def test_split_id_takes_only_the_agents_canonical_form():
    assert split_id("0a1b2c3d4e5f-00000042") == ("0a1b2c3d4e5f", 42)
    assert split_id("a-b-123456789") == ("a-b", 123456789)
    for odd in (
        "x-42",
        "x-000000042",
        "-00000001",
        "x00000001",
        "x-0000000a",
        "x-\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18",
        "p" * 65 + "-00000001",
    ):
        assert split_id(odd) is None, odd


def test_seen_ids_exact_inside_the_window_and_honest_resends():
    seen = SeenIds(SeenLimits(window=64, runs=2, prefixes=3, others=2))
    stored = [f"run1-{n:08d}" for n in range(1, 200) if n % 7]  # gaps: control events
    for i in stored:
        seen.add(i)
    assert all(i in seen for i in stored[-50:])
    assert "run1-00000195" in seen and "run1-00000195" in stored
    assert "run1-00000203" not in seen  # above the top: new
    assert "run1-00000189" not in seen  # a gap inside the window: new
    assert "run1-00000007" in seen  # older than the window: treated as received
    # an out-of-order id inside the window is exact too
    seen.add("run1-00000189")
    assert "run1-00000189" in seen and "run1-00000182" not in seen
    # a jump farther than the window clears it all
    seen.add("run1-00001000")
    assert "run1-00000999" not in seen and "run1-00000950" not in seen and "run1-00000936" in seen
    assert seen.stats()["bytes"] == 8 and seen.stats()["windows"] == 1


def test_seen_ids_bounded_for_a_hostile_guest():
    limits = SeenLimits(window=1024, runs=4, prefixes=50, others=30)
    seen = SeenIds(limits)
    for n in range(5000):
        seen.add(f"p{n}-{n + 1:08d}")  # a new run per id
        seen.add(f"odd id {n}")  # not an agent's id
        seen.add(f"p0-{10**9 + n:010d}")  # far jumps
    st = seen.stats()
    assert st["runs"] <= 50 and st["windows"] <= 4 and st["other_ids"] <= 30
    assert st["bytes"] <= 4 * 1024 // 8
    assert st["forgotten"] >= 5000 - 50 + 5000 - 30
    # what is remembered is exact; what was forgotten counts as new (stored again)
    assert "p4999-00005000" in seen and "odd id 4999" in seen
    assert "odd id 0" not in seen
    # a retired run keeps its top: everything up to it counts as received
    seen2 = SeenIds(SeenLimits(window=8, runs=1, prefixes=10, others=1))
    seen2.add("a-00000005")
    seen2.add("b-00000001")  # retires a's window
    assert "a-00000003" in seen2 and "a-00000006" not in seen2 and seen2.stats()["windows"] == 1


def test_seen_ids_dump_and_load_round_trip():
    limits = SeenLimits(window=128, runs=3, prefixes=5, others=5)
    seen = SeenIds(limits)
    ids = [f"r{k}-{n:08d}" for k in range(6) for n in range(1, 300, 3)] + ["odd1", "odd2"]
    for i in ids:
        seen.add(i)
    copy = SeenIds(limits)
    copy.load(json.loads(json.dumps(seen.dump())))
    probes = ids + [f"r{k}-{n:08d}" for k in range(6) for n in range(1, 310)]
    assert [p in copy for p in probes] == [p in seen for p in probes]
    assert copy.stats() == seen.stats()
    smaller = SeenIds(SeenLimits(window=128, runs=1, prefixes=2, others=5))
    smaller.load(seen.dump())
    assert smaller.stats()["runs"] == 2 and smaller.stats()["windows"] == 1
    for bad in (
        {},
        {"window": 64, "runs": [], "others": [], "forgotten": 0},
        {"window": 128, "runs": [["x", 1, "!!"]]},
    ):
        with pytest.raises(SavedStateError):
            SeenIds(limits).load(bad)


# ------------------------------------------------------------------------------ VmLog checkpoint
def _event(prefix: str, n: int, type_: str = "output", **data: Any) -> Event:
    return Event(
        type_, 1.7e9 + n, f"{prefix}-{n:08d}", data or {"index": 1, "stream": "stdout", "line": f"l{n}"}
    )


def test_vmlog_checkpoint_replays_only_the_tail_and_falls_back_when_stale(tmp_path):
    vmlog = VmLog(str(tmp_path), "vm", quota=1 << 30, checkpoint_every=1000)
    vmlog.open()
    vmlog.write([(_event("a", n), 1.7e9) for n in range(1, 101)])
    assert vmlog.due()
    vmlog.save_checkpoint({"mine": 1})
    assert not vmlog.due()
    vmlog.write([(_event("a", n), 1.7e9) for n in range(101, 111)])
    vmlog.close()
    size = os.path.getsize(tmp_path / "vm.jsonl")

    again = VmLog(str(tmp_path), "vm", quota=1 << 30)
    got: List[Any] = []
    replayed: List[str] = []
    again.open(replay=lambda e, t: replayed.append(e.id), restore=got.append)
    assert got == [{"mine": 1}] and again.checkpoint.note.startswith("used")
    assert replayed == [f"a-{n:08d}" for n in range(101, 111)]
    assert again.replayed_lines == 10 and again.stored == 110 and again.bytes == size
    assert again.replayed_bytes < size / 5
    assert again.write([(_event("a", 50), 1.7e9), (_event("a", 105), 1.7e9)]) == []  # duplicates
    assert again.duplicates == 2
    again.close()

    # the .jsonl changed before the offset (cut, rewritten): the whole file is replayed
    data = (tmp_path / "vm.jsonl").read_bytes()
    (tmp_path / "vm.jsonl").write_bytes(data[: len(data) // 3].rsplit(b"\n", 1)[0] + b"\n")
    cut = VmLog(str(tmp_path), "vm", quota=1 << 30)
    got.clear()
    cut.open(replay=lambda e, t: None, restore=got.append)
    assert got == [] and "shorter" in cut.checkpoint.note and cut.replayed_bytes == cut.bytes
    cut.close()
    for old, new in ((b'"l3"', b'"x3"'), (b'"l97"', b'"x97"')):  # the head, the tail before the offset
        (tmp_path / "vm.jsonl").write_bytes(data.replace(old, new))
        changed = VmLog(str(tmp_path), "vm", quota=1 << 30)
        changed.open(replay=lambda e, t: None, restore=got.append)
        assert "differs" in changed.checkpoint.note and changed.replayed_lines == 110 and got == []
        changed.close()
    (tmp_path / "vm.ckpt").write_text("{not json")
    broken = VmLog(str(tmp_path), "vm", quota=1 << 30)
    broken.open(replay=lambda e, t: None, restore=got.append)
    assert "unreadable" in broken.checkpoint.note and broken.replayed_lines == 110 and got == []
    broken.close()


def test_vmlog_refused_state_means_full_replay(tmp_path):
    vmlog = VmLog(str(tmp_path), "vm", quota=1 << 30)
    vmlog.open()
    vmlog.write([(_event("a", n), 1.7e9) for n in range(1, 21)])
    vmlog.save_checkpoint({"bad": True})
    vmlog.close()

    def refuse(state: Any) -> None:
        raise ValueError("not mine")

    again = VmLog(str(tmp_path), "vm", quota=1 << 30)
    again.open(replay=lambda e, t: None, restore=refuse)
    assert "unusable" in again.checkpoint.note and again.replayed_lines == 20 and again.stored == 20
    again.close()


@pytest.mark.faults
def test_over_quota_ids_are_bounded_and_resends_are_still_duplicates(tmp_path):
    vmlog = VmLog(str(tmp_path), "vm", quota=5000, seen=SeenLimits(window=256, runs=2, prefixes=4, others=4))
    vmlog.open()
    for k in range(50):
        vmlog.write([(_event("a", n), 1.7e9) for n in range(k * 200 + 1, k * 200 + 201)])
    assert vmlog.dropped_events > 9000 and vmlog.ids.stats()["bytes"] == 32
    resend = [(_event("a", n), 1.7e9) for n in range(9990, 10001)]
    assert vmlog.write(resend) == [] and vmlog.duplicates == 11
    vmlog.close()


# ------------------------------------------------------------------------------ real host
def _rss(h: Host) -> int:
    assert h.proc is not None
    return int(psutil.Process(h.proc.pid).memory_info().rss)


def _flood(a: FakeAgent, prefix: str, first: int, messages: int, per: int, line: str) -> int:
    """Send ``messages`` messages of ``per`` output reports numbered from ``first``; drain acks."""
    n = first
    for _ in range(messages):
        events = []
        for _ in range(per):
            events.append(
                Event(
                    "output", time.time(), f"{prefix}-{n:08d}", {"index": 1, "stream": "stdout", "line": line}
                )
            )
            n += 1
        a.send_raw(encode_message(events, time.time()))
        a.pump(0.001)
        a.inbox.clear()
    return n


@pytest.mark.faults
def test_a_flooding_vm_past_its_quota_keeps_host_memory_bounded(hosts_dir):
    quota = 2_000_000
    h = hosts_dir(Host({"vm1": SIMPLE, "vm2": SIMPLE}, ["--log-quota", str(quota), "--dedup-window", "4096"]))
    good = h.agent("vm2")
    good.handshake()
    a = h.agent("vm1")
    a.handshake()
    rss0 = _rss(h)
    # 1. one agent run far past its quota: 200,000 distinct reports of ~120 bytes (~24 MB)
    last = _flood(a, "flood0000000", 1, 200, 1000, "x" * 40)
    h.wait_until(
        lambda: (lambda e: e["stored"] + e["over_quota"] >= 200_000)(h.vm_status("vm1")["events"]),
        "the flood received",
        timeout=120,
    )
    # an honest resend is still refused exactly: the newest ids of the flood run, past the quota
    a.inbox.clear()
    ids = [f"flood0000000-{n:08d}" for n in range(last - 5, last)]
    before = h.vm_status("vm1")["events"]
    a.send(*[Event("output", time.time(), i, {"line": "again"}) for i in ids])
    a.wait_ack(ids)
    after = h.vm_status("vm1")["events"]
    assert after["duplicates"] == before["duplicates"] + 5
    assert after["over_quota"] == before["over_quota"] and after["stored"] == before["stored"]

    # 2. many runs and ids of no agent form: 6,000 each
    for k in range(6):
        events = [
            Event("output", time.time(), f"run{k}x{j:05d}-00000001", {"line": "y"}) for j in range(1000)
        ]
        events += [Event("output", time.time(), f"odd id {k} {j}", {"line": "z"}) for j in range(1000)]
        for half in (events[:1000], events[1000:]):
            a.send_raw(encode_message(half, time.time()))
            a.pump(0.01)
            a.inbox.clear()
    h.wait_until(
        lambda: (lambda e: e["stored"] + e["over_quota"] >= 212_000)(h.vm_status("vm1")["events"]),
        "the runs received",
        timeout=120,
    )
    st = h.vm_status("vm1")
    rss1 = _rss(h)
    print(f"\nhost RSS {rss0 / 2**20:.1f} MiB before, {rss1 / 2**20:.1f} MiB after 212,000 reports "
          f"past a {quota / 1e6:g} MB quota; de-dup memory {st['memory']}")  # fmt: skip
    mem = st["memory"]
    assert st["events"]["log_bytes"] <= quota and st["events"]["over_quota"] > 190_000
    assert mem["runs"] <= 4096 and mem["windows"] <= 16 and mem["other_ids"] <= 4096
    assert mem["bytes"] <= 16 * 4096 // 8 and mem["forgotten"] >= 12_000 - 2 * 4096

    # the good VM next to it: stored exactly once, its resend a duplicate
    rid = good.report("output", index=1, stream="stdout", line="good")
    good.wait_ack([rid])
    good.send(Event("output", time.time(), rid, {"line": "again"}))
    good.wait_ack([rid])
    gs = h.vm_status("vm2")["events"]
    assert gs["stored"] == 1 and gs["duplicates"] == 1
    assert [r["event"]["id"] for r in h.jsonl("vm2")] == [rid]


@pytest.fixture
def hosts_dir():
    made: List[Host] = []

    def make(h: Host) -> Host:
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def _generated_log(path: Path, vm: str, lines: int) -> int:
    """Write a ``.jsonl`` of an agent run: configured, ``lines`` output lines of entries that
    start and end, failures; returns the count of lines written."""
    t = 1.7e9
    n = 0
    out: List[str] = []

    def rec(type_: str, **data: Any) -> None:
        nonlocal n
        n += 1
        ev = {"timestamp": t + n / 1000, "type": type_, "id": f"gen000000000-{n:08d}", "data": data}
        out.append(json.dumps({"host_received": t + n / 1000, "vm": vm, "event": ev}, separators=(",", ":")))

    rec("agent_started", resumed_from_journal=False)
    rec("stage_started", stage=-10, start_time=-10)
    rec("stage_finished", stage=-10, start_time=-10, duration=0.5)
    rec("configured", at=t)
    with open(path, "w", encoding="utf-8") as fh:
        index = 0
        while n < lines:
            index += 1
            rec(
                "entry_started", index=index, executable="/bin/x", start_time=index, lateness=index % 7 / 1000
            )
            for k in range(200):
                rec("output", index=index, stream="stdout", line=f"line {k} of entry {index} " + "z" * 60)
            rec(
                "entry_exited", index=index, status="error" if index % 10 == 0 else "ok", exit_code=index % 10
            )
            fh.write("\n".join(out) + "\n")
            out.clear()
        rec("entry_started", index=index + 1, executable="/bin/y", start_time=index + 1)
        fh.write("\n".join(out) + "\n")
    return n


_SAME = ("state", "schedule", "stage", "stages_done", "configured_at", "failed", "complete", "phase",
         "last_seen", "max_lateness", "failures")  # fmt: skip


def test_restart_replays_only_the_tail_after_the_checkpoint(hosts_dir):
    h = hosts_dir(Host({"vm1": SIMPLE}, ["--checkpoint-every", "1000000"], start=False))
    h.logs.mkdir()
    lines = _generated_log(h.logs / "vm1.jsonl", "vm1", 150_000)  # ~20 MB
    size = os.path.getsize(h.logs / "vm1.jsonl")
    t0 = time.monotonic()
    h.start()
    full = h.vm_status("vm1")
    print(
        f"\nfirst start on a {size / 1e6:.1f} MB log ({lines} lines): {time.monotonic() - t0:.2f} s to status"
    )
    assert full["memory"]["replayed_lines"] == lines and full["memory"]["replayed_bytes"] == size
    assert full["memory"]["checkpoint"] == "none" and full["events"]["stored"] == lines
    assert (h.logs / "vm1.ckpt").exists()  # saved after the long replay
    assert h.stop() == 0

    # a tail written after the checkpoint (as a host killed before its next one leaves it)
    tail = [
        {"host_received": 1.8e9, "vm": "vm1",
         "event": {"timestamp": 1.8e9, "type": "entry_exited", "id": "gen000000000-99999990",
                   "data": {"index": 9999, "status": "ok", "exit_code": 0}}},
        {"host_received": 1.8e9 + 1, "vm": "vm1",
         "event": {"timestamp": 1.8e9 + 1, "type": "schedule_complete", "id": "gen000000000-99999991",
                   "data": {}}},
    ]  # fmt: skip
    tail_bytes = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in tail).encode()
    with open(h.logs / "vm1.jsonl", "ab") as fh:
        fh.write(tail_bytes)
    t0 = time.monotonic()
    h.start()
    quick = h.vm_status("vm1")
    print(f"restart from the checkpoint: {time.monotonic() - t0:.2f} s to status, "
          f"{quick['memory']['replayed_lines']} lines replayed")  # fmt: skip
    assert quick["memory"]["checkpoint"].startswith("used")
    assert quick["memory"]["replayed_lines"] == 2 and quick["memory"]["replayed_bytes"] == len(tail_bytes)
    assert quick["complete"] and quick["events"]["stored"] == lines + 2
    assert h.stop() == 0
    # `vmr-host status` with no host running reads the same checkpoint and the tail
    offline = json.loads(h.cli("status", "--json").stdout)
    vm = next(v for v in offline["vms"] if v["vm"] == "vm1")
    assert offline["offline"] and vm["read"]["checkpoint"].startswith("used")
    assert vm["read"]["replayed_lines"] == 2 and vm["complete"] and vm["state"] == "complete"
    same = [k for k in _SAME if k != "schedule"]  # the offline status does not know the digest
    assert {k: vm[k] for k in same} == {k: quick[k] for k in same}

    # the same status as a full replay of the same log
    (h.logs / "vm1.ckpt").unlink()
    h.start()
    ref = h.vm_status("vm1")
    assert ref["memory"]["replayed_lines"] == lines + 2
    assert {k: quick[k] for k in _SAME} == {k: ref[k] for k in _SAME}
    assert quick["events"] == ref["events"]
    # a duplicate of a report the checkpoint covers is still refused exactly
    a = h.agent("vm1")
    a.handshake()
    old = "gen000000000-00000010"
    a.send(Event("output", time.time(), old, {"line": "again"}))
    a.wait_ack([old])
    assert h.vm_status("vm1")["events"]["duplicates"] == 1


def test_seen_ids_agree_with_a_set_for_an_honest_agent():
    """Random runs as an honest agent makes them (gaps, resends and reorders within its
    window of 2000 in flight): membership is exactly a set's for every id not older than
    the window."""
    import random

    rnd = random.Random(16)
    window = 4096
    seen = SeenIds(SeenLimits(window=window, runs=4, prefixes=8, others=8))
    ref: set = set()
    tops: dict = {}
    for run in ("r1", "r2", "r3"):
        n = 0
        for _ in range(20_000):
            n += rnd.choice((1, 1, 1, 2, 5))
            counter = max(1, n - rnd.randrange(2000)) if rnd.random() < 0.2 else n
            i = f"{run}-{counter:08d}"
            seen.add(i)
            ref.add(i)
            tops[run] = max(tops.get(run, 0), counter)
        for c in range(tops[run] - window + 1, tops[run] + 50):
            i = f"{run}-{c:08d}"
            assert (i in seen) == (i in ref), i
