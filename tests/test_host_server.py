"""Integration tests of the real ``vmr-host serve`` (a subprocess) driven by fake agents over
real unix sockets (``tests/fakeagent.py``).

Every wait is bounded; nothing asserts on speed. Start times are checked against the host's
own recorded configured times (``experiment.json``), exactly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.fakeagent import SIMPLE, WAIT, FakeAgent, Host, short_dir
from vmr_handler.core.wire.protocol import encode_message


@pytest.fixture
def hosts() -> Iterator[List[Host]]:
    made: List[Host] = []
    yield made
    for h in made:
        h.close()


def _host(hosts: List[Host], schedules, *args: str, start: bool = True) -> Host:
    h = Host(schedules, args, start=start)
    hosts.append(h)
    return h


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------ handshake
def test_hello_welcome_schedule_delivery_clock_and_clean_stop(hosts):
    h = _host(hosts, {"vm1": SIMPLE})
    sched_bytes = (h.sched_dir / "vm1.yaml").read_bytes()
    a = h.agent("vm1")
    host_hello = a.take("hello")
    assert host_hello.data["protocol"] == 1 and host_hello.data["host_version"]
    a.hello(digest=None)
    welcome = a.take("welcome")
    assert welcome.data["vm"] == "vm1"
    assert welcome.data["schedule_digest"] == _sha(sched_bytes)
    assert welcome.data["start_time"] is None and welcome.data["resumes"] == []
    sched = a.take("schedule")
    assert base64.b64decode(sched.data["data_b64"]) == sched_bytes
    assert sched.data["sha256"] == _sha(sched_bytes) and sched.data["format_hint"] == "yaml"
    assert h.vm_status("vm1")["schedule"]["state"] == "sent"
    a.send(a.event("result", {"answers": sched.id, "status": "success", "details": "ok"}))
    h.wait_until(lambda: h.vm_status("vm1")["schedule"]["state"] == "accepted", "schedule accepted")

    # clock sync: t2 (receive) and t3 (send) are host UTC and answer the request's id
    t1 = time.time()
    req = a.send(a.event("clock_req", {"t1": t1}))[0]
    resp = a.take("clock_resp")
    t4 = time.time()
    assert resp.data["answers"] == req and resp.data["t1"] == t1
    assert t1 <= resp.data["t2"] <= resp.data["t3"] <= t4  # same machine, same clock

    # a reconnecting agent that already has the schedule does not get it again
    a.close()
    b = h.agent("vm1")
    welcome = b.handshake(digest=_sha(sched_bytes))
    assert welcome.data["schedule_digest"] == _sha(sched_bytes)
    b.none_of("schedule", within=0.5)
    assert h.vm_status("vm1")["connections"] == 2

    assert (h.logs / "vmr-host.sock").stat().st_mode & 0o777 == 0o600  # owner-only control socket
    # a second vmr-host on the same logs dir is refused (runtime error, exit 1)
    second = subprocess.run(h.serve_argv(), capture_output=True, text=True, timeout=WAIT)
    assert second.returncode == 1, second.stderr
    assert "another vmr-host is running" in second.stderr
    assert h.vm_status("vm1")["connected"]  # the first one is untouched

    assert h.stop() == 0  # SIGTERM stops cleanly
    assert not (h.channels / "vm1.sock").exists()
    assert not (h.logs / "vmr-host.sock").exists()
    b.wait_closed()


def test_rejected_schedule_is_shown(hosts):
    h = _host(hosts, {"vm1": SIMPLE})
    a = h.agent("vm1")
    a.handshake()
    sched = a.take("schedule")
    a.send(a.event("result", {"answers": sched.id, "status": "error", "details": "refused: bad class"}))
    h.wait_until(lambda: h.vm_status("vm1")["state"] == "schedule_rejected", "rejected state")
    assert h.vm_status("vm1")["schedule"]["details"] == "refused: bad class"
    out = h.cli("status").stdout
    assert "schedule rejected: refused: bad class" in out


# ------------------------------------------------------------------------------ barrier
def test_barrier_holds_until_slowest_of_three_then_same_start_time(hosts):
    vms = ["vm1", "vm2", "vm3"]
    h = _host(hosts, {vm: SIMPLE for vm in vms}, "--start-buffer", "2.5")
    agents = {vm: h.agent(vm) for vm in vms}
    for a in agents.values():
        a.handshake()
        a.accept_schedule()
    st = h.status()
    assert st["experiment"]["waiting_for"] == vms
    for vm in ("vm2", "vm1"):
        a = agents[vm]
        a.report("stage_started", stage=0, start_time=-10, entries=[0])
        a.report("stage_finished", stage=0, start_time=-10, duration=0.1)
        a.wait_ack([a.report("configured", at=time.time(), stages=[-10])])
    st = h.status()
    assert st["experiment"]["waiting_for"] == ["vm3"]
    assert st["experiment"]["start_time"] is None
    by_vm = {v["vm"]: v for v in st["vms"]}
    assert by_vm["vm1"]["state"] == "configured" and by_vm["vm3"]["state"] == "schedule_accepted"
    human = h.cli("status")
    assert human.returncode == 0
    assert "barrier waiting for 1 VM(s): vm3" in human.stdout
    for a in agents.values():
        a.none_of("start_time", within=0.3)
    agents["vm3"].report("stage_started", stage=0, start_time=-10, entries=[0])
    h.wait_until(lambda: h.vm_status("vm3")["state"] == "configuring", "vm3 configuring")
    assert h.vm_status("vm3")["stage"] == "0 (-10) running"
    agents["vm3"].report("configured", at=time.time(), stages=[-10])
    starts = {vm: a.take("start_time") for vm, a in agents.items()}
    values = {e.data["start_time"] for e in starts.values()}
    ids = {e.id for e in starts.values()}
    assert len(values) == 1 and len(ids) == 1
    exp = h.experiment()
    configured = exp["barrier"]["configured"]
    assert values == {max(configured.values()) + 2.5}
    assert configured["vm3"] == max(configured.values())
    st = h.status()
    assert st["experiment"]["start_time"] == values.pop() and st["experiment"]["waiting_for"] == []
    # the agent acks the start time
    agents["vm1"].send(agents["vm1"].event("ack", {"ids": [starts["vm1"].id]}))
    h.wait_until(lambda: h.vm_status("vm1")["start_acked"], "start ack recorded")


def test_release_exclude_and_late_joiner(hosts):
    vms = ["vm1", "vm2", "vm3"]
    h = _host(hosts, {vm: SIMPLE for vm in vms}, "--start-buffer", "30")
    a1 = h.agent("vm1")
    a1.handshake()
    a1.wait_ack([a1.report("configured", at=time.time(), stages=[])])
    bad = h.cli("release", "--exclude", "nosuch")
    assert bad.returncode == 2 and "nosuch" in bad.stderr
    r = h.cli("release", "--exclude", "vm3")
    assert r.returncode == 0, r.stderr
    assert "still waiting for vm2" in r.stdout
    st = h.status()["experiment"]
    assert st["waiting_for"] == ["vm2"] and st["excluded"] == ["vm3"] and st["start_time"] is None
    r = h.cli("release", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["released"] == ["vm2"] and res["start_time"] is not None
    start = a1.take("start_time").data["start_time"]
    assert start == res["start_time"]
    assert h.cli("release").returncode == 2  # already set
    # a late joiner (excluded, never configured) gets the start already set, at its handshake
    a3 = h.agent("vm3")
    welcome = a3.handshake()
    assert welcome.data["start_time"] == start
    assert a3.take("start_time").data["start_time"] == start
    a3.wait_ack([a3.report("configured", at=time.time(), stages=[])])
    assert h.experiment()["barrier"]["start_time"] == start


# ------------------------------------------------------------------------------ RESUME
def test_resume_one_and_all_resent_until_answered(hosts):
    h = _host(hosts, {"vm1": SIMPLE, "vm2": SIMPLE}, "--start-buffer", "0")
    a1 = h.agent("vm1")
    a1.handshake()
    assert h.cli("resume").returncode == 2
    assert h.cli("resume", "nosuch").returncode == 2
    assert h.cli("resume", "vm1").returncode == 2  # not at a break (fake agents report none)
    r = h.cli("resume", "vm1", "--json", "--force")
    assert r.returncode == 0, r.stderr
    one = json.loads(r.stdout)
    assert one["sent_now"] == ["vm1"] and one["at"] == "-inf"  # before the start is set
    ev1 = a1.take("resume")
    assert ev1.id == one["id"] and ev1.data == {"at": "-inf"}
    # the start is set (buffer 0): RESUMEs are then stamped with host experiment time
    a1.report("configured", at=time.time(), stages=[])
    a2 = h.agent("vm2")
    a2.handshake()
    a2.report("configured", at=time.time(), stages=[])
    start = a1.take("start_time").data["start_time"]
    before = time.time()
    r = h.cli("resume", "--all", "--json", "--yes")
    after = time.time()
    assert r.returncode == 0, r.stderr
    every = json.loads(r.stdout)
    assert sorted(every["targets"]) == ["vm1", "vm2"]
    assert before - start <= every["at"] <= after - start
    ev2 = a1.take("resume", lambda e: e.id == every["id"])
    assert ev2.data["at"] == every["at"]
    assert a2.take("resume").id == every["id"]
    # vm1 answers only the first; vm2 answers nothing
    a1.send(a1.event("result", {"answers": ev1.id, "status": "success", "details": "x", "ended_break": 0,
                                "ignored": False}))  # fmt: skip
    h.wait_until(lambda: "vm1" in h.experiment()["resumes"][0]["answered"], "answer recorded")
    a1.close()
    a2.close()
    a1 = h.agent("vm1")
    welcome = a1.handshake(digest=_sha((h.sched_dir / "vm1.yaml").read_bytes()))
    assert welcome.data["resumes"] == [every["id"]]
    again = a1.take("resume")
    assert again.id == every["id"] and again.data["at"] == every["at"]
    a1.none_of("resume", within=0.3)  # the answered one is not re-sent
    a2 = h.agent("vm2")
    assert a2.handshake().data["resumes"] == [every["id"]]
    a2.take("resume")
    a2.send(a2.event("result", {"answers": every["id"], "status": "success", "details": "ignored",
                                "ended_break": None, "ignored": True}))  # fmt: skip
    h.wait_until(lambda: "vm2" in h.experiment()["resumes"][1]["answered"], "vm2 answer recorded")
    a2.close()
    a2 = h.agent("vm2")
    assert a2.handshake().data["resumes"] == []
    a2.none_of("resume", within=0.3)
    out = h.cli("status").stdout
    assert f"RESUME {every['id']}" in out and "not yet answered by: vm1" in out


# ------------------------------------------------------------------------------ de-dup + crash
def test_dedup_across_resend_and_kill9_restart_start_time_kept(hosts):
    h = _host(hosts, {"vm1": SIMPLE}, "--start-buffer", "300")
    a = h.agent("vm1")
    a.handshake()
    a.accept_schedule()
    cid = a.report("configured", at=time.time(), stages=[])
    st_event = a.take("start_time")
    start = st_event.data["start_time"]
    x = a.event(
        "output", {"index": 1, "stream": "stdout", "seq": 1, "line": "hello \x1b[31mred", "eol": True}
    )
    a.send(x)
    a.wait_ack([x.id])
    a.send(x)  # a resend: acknowledged again, logged once
    a.wait_ack([x.id])
    assert [r["event"]["id"] for r in h.jsonl("vm1")].count(x.id) == 1
    row = next(r for r in h.jsonl("vm1") if r["event"]["id"] == x.id)
    assert row["vm"] == "vm1" and row["event"]["data"]["line"] == "hello \x1b[31mred"
    assert "host_received" in row and row["event"]["timestamp"] == x.timestamp
    readable = (h.logs / "vm1.log").read_text()
    assert "hello \\x1b[31mred" in readable and "\x1b" not in readable  # no escapes reach a terminal

    h.kill9()
    # a crash mid-write leaves a partial line: the restarted host cuts it
    with open(h.logs / "vm1.jsonl", "ab") as fh:
        fh.write(b'{"host_received": 1, "vm": "vm1", "ev')
    a.close()
    h.start()
    exp = h.experiment()
    assert exp["barrier"]["start_time"] == start
    assert h.status()["experiment"]["start_time"] == start
    assert h.vm_status("vm1")["state"] == "configured"  # rebuilt from the log
    a = h.agent("vm1")
    welcome = a.handshake(digest=_sha((h.sched_dir / "vm1.yaml").read_bytes()))
    assert welcome.data["start_time"] == start
    again = a.take("start_time")
    assert again.id == st_event.id and again.data["start_time"] == start
    # the agent resends everything unacknowledged (here: all of it, twice)
    y = a.event("entry_started", {"index": 1, "lateness": 0.25, "scheduled": start + 5})
    a.send(x, y, a.event("configured", {"at": 1.0}, id=cid))
    a.wait_ack([x.id, y.id, cid])
    a.send(x, y)
    a.wait_ack([x.id, y.id])
    ids = [r["event"]["id"] for r in h.jsonl("vm1")]  # every line parses
    assert ids.count(x.id) == 1 and ids.count(y.id) == 1 and ids.count(cid) == 1
    assert h.experiment()["barrier"]["start_time"] == start
    vm = h.vm_status("vm1")
    assert vm["max_lateness"] == 0.25 and vm["events"]["duplicates"] >= 3


# ------------------------------------------------------------------------------ resources
def test_resource_chunks_and_refusals(hosts):
    data = os.urandom(600 * 1024 + 123)
    sched = [
        {"start_time": -10, "executable": None, "data": [
            {"location": "t", "filename": "tool.bin"},
            {"location": "s", "filename": "../secret"},
            {"location": "l", "filename": "link.bin"},
            {"location": "m", "filename": "missing.bin"},
            {"location": "e", "filename": "empty.bin"},
        ]},
    ]  # fmt: skip
    h = _host(hosts, {"vm1": sched}, "--allow-missing-resources", start=False)  # refusals on purpose
    (h.resources / "tool.bin").write_bytes(data)
    (h.resources / "empty.bin").write_bytes(b"")
    (h.base / "secret").write_bytes(b"top secret")
    os.symlink(h.base / "secret", h.resources / "link.bin")
    h.start()
    a = h.agent("vm1")
    a.handshake()
    sched_ev = a.take("schedule")
    assert sched_ev.data["resources"] == {
        "tool.bin": {"size": len(data), "sha256": _sha(data)},
        "empty.bin": {"size": 0, "sha256": _sha(b"")},
    }

    def fetch(name: str, offset: int = 0) -> bytes:
        rid = a.send(a.event("resource_request", {"name": name, "offset": offset}))[0]
        out = b""
        pos = offset
        while True:
            c = a.take("resource_chunk", lambda e: e.data["answers"] == rid).data
            piece = base64.b64decode(c["data_b64"])
            assert c["offset"] == pos and len(piece) <= 256 * 1024 and c["name"] == name
            assert c["size"] == len(data if name == "tool.bin" else b"")
            out += piece
            pos += len(piece)
            if c["last"]:
                assert c["sha256"] == _sha(data if name == "tool.bin" else b"")
                return out

    assert fetch("tool.bin") == data
    assert fetch("tool.bin", 300_000) == data[300_000:]
    assert fetch("empty.bin") == b""
    for name in ("../secret", "link.bin", "missing.bin", "not-in-schedule.bin", "/etc/passwd"):
        rid = a.send(a.event("resource_request", {"name": name, "offset": 0}))[0]
        res = a.take("result", lambda e, rid=rid: e.data["answers"] == rid)
        assert res.data["status"] == "error", (name, res.data)
        assert "top secret" not in json.dumps(res.data)
    a.none_of("resource_chunk", within=0.2)
    vm = h.vm_status("vm1")
    assert vm["resources"] == {"served": 3, "refused": 5}


# ------------------------------------------------------------------------------ transfers
def _chunks(a: FakeAgent, location: str, content: bytes, size: int = 100_000, sha=None) -> List[str]:
    ids = []
    pieces = [content[i : i + size] for i in range(0, len(content), size)] or [b""]
    off = 0
    for i, p in enumerate(pieces):
        ev = a.event("transfer_chunk", {
            "location": location, "offset": off, "data_b64": base64.b64encode(p).decode(),
            "size": len(content), "sha256": sha or _sha(content), "last": i == len(pieces) - 1,
            "mtime": 1700000000.0,
        })  # fmt: skip
        off += len(p)
        ids += a.send(ev)
    return ids


def test_transfers_land_confined(hosts):
    h = _host(hosts, {"vm1": SIMPLE})
    root = h.logs / "transfers" / "vm1"
    outside = Path(short_dir())
    try:
        a = h.agent("vm1")
        a.handshake()
        content = os.urandom(250_000)
        a.wait_ack(_chunks(a, "/var/log/app.log", content))
        assert (root / "var/log/app.log").read_bytes() == content
        assert (root / "var/log/app.log").stat().st_mtime == 1700000000.0
        # hostile locations: all confined or refused, and still acknowledged (no resend loop)
        a.wait_ack(_chunks(a, "../../etc/x", b"escape"))
        a.wait_ack(_chunks(a, "/abs", b"absolute"))
        assert (root / "abs").read_bytes() == b"absolute"  # an absolute path is made relative
        os.symlink(outside, root / "evil")
        a.wait_ack(_chunks(a, "evil/x", b"through a symlink"))
        os.symlink(outside / "f", root / "f")
        a.wait_ack(_chunks(a, "f", b"onto a symlink"))
        os.symlink(root / "var", root / "inner")  # even a symlink that stays inside is not followed
        a.wait_ack(_chunks(a, "inner/log/y", b"inner"))
        a.wait_ack(_chunks(a, "bad-sha", b"data", sha="0" * 64))
        assert list(outside.iterdir()) == []
        assert not (h.logs / "etc").exists() and not Path("/etc/x").exists()
        assert not (root / "var/log/y").exists() and not (root / "bad-sha").exists()
        vm = h.vm_status("vm1")
        assert vm["transfers"]["refused"] == 4 and vm["transfers"]["bad_sha256"] == 1
        assert vm["transfers"]["files"] == 2
        rows = [r["event"] for r in h.jsonl("vm1") if r["event"]["type"] == "transfer_chunk"]
        assert all("data_b64" not in r["data"] for r in rows)  # file data is not logged
        refused = [r["data"] for r in rows if r["data"]["status"] == "error"]
        assert len(refused) == 5
    finally:
        import shutil

        shutil.rmtree(outside, ignore_errors=True)


# ------------------------------------------------------------------------------ hostile guest
def test_hostile_guest_counted_and_good_vms_untouched(hosts):
    h = _host(hosts, {"good1": SIMPLE, "good2": SIMPLE, "evil": SIMPLE},
              "--expect", "good1,good2", "--start-buffer", "1")  # fmt: skip
    g1, g2 = h.agent("good1"), h.agent("good2")
    for g in (g1, g2):
        g.handshake()
        g.accept_schedule()
    sent = {"good1": [], "good2": []}
    for name, g in (("good1", g1), ("good2", g2)):
        for i in range(5):
            sent[name].append(g.report("output", index=0, stream="stdout", seq=i + 1, line=f"{name} {i}"))
        g.wait_ack(sent[name])

    evil = h.agent("evil", claimed="good1")
    evil.handshake(claimed="good1")  # a forged name: the channel decides who it is
    # forged reports claiming to be another VM's, and a host-only event type
    evil.send(evil.event("configured", {"at": time.time(), "vm": "good1"}))
    evil.send(evil.event("start_time", {"start_time": 1.0}))
    # a second connection to a good VM's channel is refused and counted
    intruder = FakeAgent.connect(h.sock("good1"), "good1")
    intruder.wait_closed()
    # random bytes, invalid JSON, too many events in one message
    rnd = os.urandom(256 * 1024)
    evil.send_raw(rnd + b"\n{not json}\n[1,2]\n\xff\xfe\n")
    many = [evil.event("output", {"line": "x"}) for _ in range(1001)]
    evil.send_raw(encode_message(many, time.time()))
    # a hello flood (each hello would make the host resend the schedule)
    evil.send(*[evil.event("hello", {"protocol": 1, "vm": "good1", "journal": {}}) for _ in range(50)])
    # 10k messages as fast as possible
    frame = encode_message([evil.event("heartbeat")], time.time())
    evil.send_raw(frame * 10_000)
    # a 100 MB frame, streamed (never built in memory)
    piece = b"A" * (1 << 20)
    evil.send_raw(b'{"now": 1, "events": [{"x": "')
    for _ in range(100):
        evil.send_raw(piece)
    evil.send_raw(b'"}]}\n')
    # the host is alive, and still serves evil normally after all that
    time.sleep(0.2)
    rid = evil.report("output", index=0, stream="stdout", seq=1, line="still here")
    evil.wait_ack([rid], timeout=WAIT)

    st = h.status()
    assert st["experiment"]["waiting_for"] == ["good1", "good2"]  # evil's forged configured: no effect
    vms = {v["vm"]: v for v in st["vms"]}
    e = vms["evil"]
    assert e["frames"]["malformed"] >= 3 and e["frames"]["oversize"] >= 1
    assert e["refused"]["rate_limited"] > 0
    assert e["refused"]["too_many_events"] == 1
    assert e["refused"]["hello_flood"] > 0
    assert e["refused"]["vm_mismatch"] >= 1 and e["refused"]["protocol_errors"] >= 1
    assert e["agent"]["claimed_vm"] == "good1"
    assert vms["good1"]["refused"]["second_connections"] == 1
    for name in ("good1", "good2"):
        v = vms[name]
        assert v["frames"]["malformed"] == 0 and v["frames"]["oversize"] == 0
        assert sum(v["refused"].values()) == (1 if name == "good1" else 0)
        assert v["configured_at"] is None and v["connected"]

    # the good VMs pass the barrier untouched
    for g in (g1, g2):
        g.report("configured", at=time.time(), stages=[])
    s1, s2 = g1.take("start_time"), g2.take("start_time")
    assert s1.data == s2.data
    for name in ("good1", "good2"):
        rows = h.jsonl(name)
        assert all(r["vm"] == name for r in rows)
        outputs = [r["event"]["id"] for r in rows if r["event"]["type"] == "output"]
        assert outputs == sent[name]
        assert {r["event"]["type"] for r in rows} == {"output", "result", "configured"}
    assert all(r["vm"] == "evil" for r in h.jsonl("evil"))
    assert "evil" in (h.logs / "evil.log").read_text() or (h.logs / "evil.log").stat().st_size > 0


# ------------------------------------------------------------------------------ connect mode
def _listen(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    return s


def test_connect_mode_with_server_restarts(hosts):
    h = _host(hosts, {"vm1": SIMPLE}, "--connect", "--start-buffer", "0.5", start=False)
    h.channels.mkdir()
    path = h.sock("vm1")
    h.start()  # nothing listens yet: the host retries with backoff
    time.sleep(0.3)
    lst = _listen(path)
    a = FakeAgent.accept(lst, "vm1")
    a.handshake()
    a.accept_schedule()
    a.wait_ack([a.report("configured", at=time.time(), stages=[])])
    start = a.take("start_time").data["start_time"]
    assert h.vm_status("vm1")["connected"]
    # QEMU goes away (the socket with it) and comes back: the host reconnects
    a.close()
    lst.close()
    os.unlink(path)
    h.wait_until(lambda: not h.vm_status("vm1")["connected"], "disconnect noticed")
    time.sleep(0.5)
    lst = _listen(path)
    a = FakeAgent.accept(lst, "vm1")
    welcome = a.handshake(digest=_sha((h.sched_dir / "vm1.yaml").read_bytes()))
    assert welcome.data["start_time"] == start
    assert a.take("start_time").data["start_time"] == start
    a.none_of("schedule", within=0.2)
    # a server that accepts and closes at once does not make the host spin or give up
    a.close()
    conn, _ = lst.accept()
    conn.close()
    a = FakeAgent.accept(lst, "vm1")
    a.handshake(digest=_sha((h.sched_dir / "vm1.yaml").read_bytes()))
    assert h.vm_status("vm1")["connections"] >= 3
    lst.close()
    assert h.stop() == 0
    assert os.path.exists(path)  # the host does not remove QEMU's socket


# ------------------------------------------------------------------------------ start-up errors
def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "serve", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


def test_startup_errors_are_clear(tmp_path):
    base = Path(short_dir())
    try:
        sched = base / "s"
        sched.mkdir()
        empty = _serve("--schedules", str(sched), "--logs", str(base / "l"))
        assert empty.returncode == 2 and "no schedules" in empty.stderr
        (sched / "vm1.yaml").write_text("- {start_time: -1, executable: /bin/true}\n")
        long_channels = str(base / ("c" * 100))
        r = _serve("--schedules", str(sched), "--logs", str(base / "l"), "--channels", long_channels)
        assert r.returncode == 2 and long_channels in r.stderr and "limit of 107" in r.stderr
        r = _serve("--schedules", str(sched), "--logs", str(base / "l"), "--expect", "vm1,ghost")
        assert r.returncode == 2 and "ghost" in r.stderr
        (sched / "bad.yaml").write_text("- {start_time: 0, executable: /bin/true}\n")
        r = _serve("--schedules", str(sched), "--logs", str(base / "l"))
        assert r.returncode == 2 and "bad.yaml" in r.stderr
        (sched / "bad.yaml").unlink()
        # (a schedule bigger than one frame is delivered in chunks: test_connected.py)
        (sched / "evil.pkl").write_bytes(pickle.dumps([os.system]))
        r = _serve("--schedules", str(sched), "--logs", str(base / "l"))
        assert r.returncode == 2 and "evil.pkl" in r.stderr and "system" in r.stderr
        (sched / "evil.pkl").unlink()
        r = _serve("--schedules", str(sched), "--logs", str(base / "l"), "--start-buffer", "-3")
        assert r.returncode == 2
        (base / "l").mkdir(exist_ok=True)
        (base / "l" / "experiment.json").write_text("[not an object")
        r = _serve("--schedules", str(sched), "--logs", str(base / "l"))
        assert r.returncode == 1 and "experiment.json" in r.stderr
        st = subprocess.run(
            [sys.executable, "-m", "vmr_handler.host", "status", "--logs", str(base / "nowhere")],
            capture_output=True, text=True, timeout=WAIT,
        )  # fmt: skip
        assert st.returncode == 1 and "no running vmr-host" in st.stderr
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------ heartbeats
def test_heartbeats_and_silent_peer(hosts):
    h = _host(hosts, {"vm1": SIMPLE}, "--heartbeat", "0.3", "--silent-after", "1")
    a = h.agent("vm1")
    a.handshake()
    a.take("heartbeat")  # the host talks after send silence
    h.wait_until(lambda: h.vm_status("vm1")["silent"] is True, "peer marked silent")
    assert "silent" in h.cli("status").stdout
    a.send(a.event("heartbeat"))
    h.wait_until(lambda: h.vm_status("vm1")["silent"] is False, "peer talks again")
    assert h.vm_status("vm1")["connected"]


def test_agent_configured_per_its_journal_counts_when_the_report_never_arrived(hosts):
    h = _host(hosts, {"vm1": SIMPLE, "vm2": SIMPLE}, "--start-buffer", "5")
    digest = _sha((h.sched_dir / "vm1.yaml").read_bytes())
    a = h.agent("vm1")
    a.handshake(digest=digest, configured_at=time.time() - 100)  # configured before the host's logs existed
    h.wait_until(lambda: h.status()["experiment"]["waiting_for"] == ["vm2"], "vm1 counted as configured")
    b = h.agent("vm2")
    b.handshake(digest="another schedule", configured_at=time.time())  # not our schedule: does not count
    b.take("schedule")
    assert h.status()["experiment"]["waiting_for"] == ["vm2"]
    b.report("configured", at=time.time(), stages=[])
    assert a.take("start_time").data == b.take("start_time").data
