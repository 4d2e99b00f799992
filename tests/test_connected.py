"""End to end: ``vmr-host serve`` + several ``vmr-handler run`` agents, real processes.

The contract tests (``env_factory``) run twice: over real unix sockets (``--port unix:...``,
the virtio-serial code path) and over MQTT through a real mosquitto started by the test
(``--transport mqtt``): the same behaviour from both transports.
Checks the barrier, firing on the host's clock, RESUME, resources, transfers, and faults
(host kill -9, agent SIGKILL). ``unix_env_factory`` tests are about the channel itself
(a pty stand-in for virtio-serial, a hostile raw channel, a config file naming the port).
"""

from __future__ import annotations

import hashlib
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.hostenv import HostEnv
from tests.vserial import VirtioSerialStandIn


def _factory(transport: str) -> Iterator:
    made = []

    def make(schedules, **kw) -> HostEnv:
        env = HostEnv(schedules, transport=transport, **kw)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


@pytest.fixture(params=["unix", "mqtt"])
def env_factory(request) -> Iterator:
    """An experiment over each transport in turn (contract tests)."""
    yield from _factory(request.param)


@pytest.fixture
def unix_env_factory() -> Iterator:
    """An experiment over unix sockets only (tests of the byte channel itself)."""
    yield from _factory("unix")


def _stdout_lines(env: HostEnv, vm: str, index: int):
    """An entry's stdout lines as logged by the host, in the agent's order (``seq``): a resent
    event may arrive after later ones, but every line must be there exactly once."""
    recs = [r["event"]["data"] for r in env.events(vm, "output")]
    recs = [d for d in recs if d["index"] == index and d["stream"] == "stdout"]
    assert len({d["seq"] for d in recs}) == len(recs), "a line was logged twice"
    return [d["line"] for d in sorted(recs, key=lambda d: d["seq"])]


def _ids(env: HostEnv, vm: str):
    return [r["event"]["id"] for r in env.events(vm)]


def test_barrier_waits_for_the_slowest_then_all_fire_together(env_factory):
    scheds = {
        f"vm{i}": [
            {"start_time": -10, "executable": "sleep", "arguments": str(0.2 + 1.2 * i)},
            {"start_time": 1, "executable": "/bin/echo", "arguments": f"hello from vm{i}"},
        ]
        for i in range(3)
    }
    env = env_factory(scheds, start_buffer=1.0)
    env.start_host()
    for vm in scheds:
        env.start_agent(vm)
    env.wait_event("vm0", "configured")
    status = env.status()
    assert status["experiment"]["start_time"] is None
    assert "vm2" in status["experiment"]["waiting_for"]
    configured = {vm: env.wait_event(vm, "configured")["host_received"] for vm in scheds}
    started = {vm: env.wait_event(vm, "entry_started", index=1)["event"]["data"] for vm in scheds}
    # one start time, after the last VM configured, the same scheduled instant everywhere
    scheduled = {d["scheduled"] for d in started.values()}
    assert len(scheduled) == 1
    start = scheduled.pop() - 1
    assert start == pytest.approx(max(configured.values()) + 1.0, abs=0.05)
    for vm in scheds:
        assert started[vm]["spawned_at"] >= started[vm]["scheduled"] - 0.005
        out = env.wait_event(vm, "output", index=1)
        assert out["event"]["data"]["line"] == f"hello from {vm}"
    spread = max(d["spawned_at"] for d in started.values()) - min(d["spawned_at"] for d in started.values())
    print(f"cross-VM spread of one positive entry: {spread * 1000:.1f} ms")
    for vm in scheds:
        ids = _ids(env, vm)
        assert len(ids) == len(set(ids))


def test_skewed_guest_clock_still_fires_on_host_time(env_factory):
    scheds = {
        "good": [{"start_time": 1, "executable": "/bin/true"}],
        "skewed": [{"start_time": 1, "executable": "/bin/true"}],
    }
    env = env_factory(scheds, start_buffer=2.0)
    env.start_host()
    env.start_agent("good")
    env.start_agent("skewed", "--debug-clock-skew", "5")
    recs = {vm: env.wait_event(vm, "entry_started", index=0) for vm in scheds}
    for vm, rec in recs.items():
        data = rec["event"]["data"]
        # the host received the start report within a second of the scheduled instant (host clock):
        # without the offset correction the skewed VM would fire 5 s early
        assert abs(rec["host_received"] - data["scheduled"]) < 1.0, (vm, rec)


def test_break_resume_one_vm_then_all_at_a_break(env_factory):
    sched = [
        {"start_time": 0.5, "pause": True, "pause_duration": ".inf"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "resumed"},
    ]
    env = env_factory({"a": sched, "b": sched}, start_buffer=0.5)
    env.start_host()
    env.start_agent("a")
    env.start_agent("b")
    env.wait_event("a", "break_started")
    env.wait_event("b", "break_started")
    res = env.cli("resume", "a")
    assert res.returncode == 0, res.stderr
    env.wait_event("a", "entry_started", index=1)
    time.sleep(0.5)
    assert not env.events("b", "entry_started")
    # a runs on, b is at its break (SPEC section 8: resume --all resumes the VMs at a break)
    preview = env.cli("resume", "--all", "--dry-run")
    assert preview.returncode == 0 and "would RESUME: b (break #0)" in preview.stdout, preview.stdout
    assert "not at a break, left out: a" in preview.stdout and "nothing sent" in preview.stdout
    refused = env.cli("resume", "a")  # named at no break: its agent would ignore it
    assert refused.returncode == 2 and "not at a break: a" in refused.stderr, refused.stderr
    assert "--force" in refused.stderr and "--all" in refused.stderr
    res = env.cli("resume", "--all")
    assert res.returncode == 0, res.stderr
    assert "sent to b (break #0)" in res.stdout and "not at a break, left out: a" in res.stdout, res.stdout
    env.wait_event("b", "entry_started", index=1)
    # no VM at a break: --all is refused; --force sends it and the agent ignores it
    none = env.cli("resume", "--all")
    assert none.returncode == 2 and "no VM is at a break (a, b)" in none.stderr, none.stderr
    forced = env.cli("resume", "a", "--force")
    assert forced.returncode == 0 and "sent with --force" in forced.stdout, forced.stdout
    env.wait_for(lambda: len(env.events("a", "resume_received")) == 2, "a answered the forced RESUME")
    resumes_a = env.events("a", "resume_received")
    assert [r["event"]["data"]["ignored"] for r in resumes_a] == [False, True]  # 2nd found no break
    assert len(env.events("b", "resume_received")) == 1  # --all left a out, and b got one


def test_resource_drop_and_transfer_out(env_factory):
    env = env_factory({}, start_buffer=0.2)
    results = env.root / "vm" / "a" / "results"
    sched = [
        {
            "start_time": -5,
            "executable": "tool.sh",
            "arguments": f"{results}",
            "data": [{"location": "tool.sh", "filename": "tool.sh", "executable": True}],
        },
        # a directory, and an absolute path outside anything of ours: both land under transfers/a/
        {"start_time": -4, "data": [{"location": str(results), "interval": None}]},
        {"start_time": -3, "data": [{"location": "/etc/os-release", "interval": None}]},
    ]
    import yaml

    (env.schedules / "a.yaml").write_text(yaml.safe_dump(sched))
    (env.resources / "tool.sh").write_text(
        "#!/bin/sh\nmkdir -p $1/sub && echo made by tool > $1/sub/out.txt\n"
    )
    env.start_host()
    env.start_agent("a")
    placed = env.wait_event("a", "data_placed", index=0)["event"]["data"]
    assert placed["sha256"] == hashlib.sha256((env.resources / "tool.sh").read_bytes()).hexdigest()
    root = env.logs / "transfers" / "a"
    got = env.wait_for(lambda: list(root.rglob("out.txt")), "transfer of the results dir")
    assert got[0] == root / str(results).lstrip("/") / "sub" / "out.txt"
    assert got[0].read_text() == "made by tool\n"
    copy = env.wait_for(lambda: list(root.rglob("os-release")), "transfer of /etc/os-release")
    assert copy[0] == root / "etc" / "os-release"
    assert copy[0].read_bytes() == Path("/etc/os-release").read_bytes()


def test_host_kill9_and_restart_loses_and_duplicates_nothing(env_factory):
    sched = [
        {
            "start_time": -2,
            "executable": "/bin/sh",
            "arguments": "-c 'for i in $(seq 1 400); do echo line $i; sleep 0.01; done'",
        },
        {"start_time": 1, "executable": "/bin/echo", "arguments": "after"},
    ]
    env = env_factory({"a": sched}, start_buffer=1.0)
    env.start_host()
    env.start_agent("a")
    env.wait_event("a", "output", index=0, line="line 50")
    env.kill_host()
    time.sleep(1.0)
    env.start_host()
    env.wait_event("a", "entry_started", index=1)
    env.wait_event("a", "schedule_complete")
    assert _stdout_lines(env, "a", 0) == [f"line {i}" for i in range(1, 401)]
    ids = _ids(env, "a")
    assert len(ids) == len(set(ids))


def test_channel_drop_through_virtio_serial_stand_in(unix_env_factory):
    sched = [
        {
            "start_time": -2,
            "executable": "/bin/sh",
            "arguments": "-c 'for i in $(seq 1 300); do echo line $i; sleep 0.02; done'",
        },
        {"start_time": 1, "executable": "/bin/echo", "arguments": "after"},
    ]
    env = unix_env_factory({"a": sched}, start_buffer=0.5)
    env.start_host()
    port = VirtioSerialStandIn(env.sock("a"), chunk=97).start()
    try:
        env.start_agent("a", port=port.guest_path)
        env.wait_event("a", "output", index=0, line="line 20")
        port.drop_host()
        time.sleep(5.0)
        port.restore_host()
        env.wait_event("a", "schedule_complete")
        assert _stdout_lines(env, "a", 0) == [f"line {i}" for i in range(1, 301)]
        ids = _ids(env, "a")
        assert len(ids) == len(set(ids))
    finally:
        port.close()


def test_agent_sigkill_and_restart_carries_on(env_factory):
    sched = [
        {"start_time": -3, "executable": "/bin/echo", "arguments": "once"},
        {"start_time": -2, "executable": "sleep", "arguments": "30"},
        {"start_time": 0.5, "executable": "/bin/echo", "arguments": "positive"},
    ]
    env = env_factory({"a": sched}, start_buffer=0.5)
    env.start_host()
    proc = env.start_agent("a")
    env.wait_event("a", "entry_started", index=1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # a new agent on the same state dir: the schedule it stored is reused, the sleep re-runs
    env.start_agent("a")
    env.wait_event("a", "entry_interrupted", index=1)
    started0 = [r for r in env.events("a", "entry_started") if r["event"]["data"]["index"] == 0]
    assert len(started0) == 1


def test_hostile_guest_does_not_touch_good_vms(unix_env_factory):
    import json as _json
    import os
    import random
    import socket as _socket

    good = {
        f"vm{i}": [
            {"start_time": -1, "executable": "sleep", "arguments": str(0.3 * i)},
            {"start_time": 1, "executable": "/bin/echo", "arguments": f"ok {i}"},
        ]
        for i in range(3)
    }
    env = unix_env_factory({**good, "evil": [{"start_time": 1, "executable": "/bin/true"}]}, start_buffer=1.0)
    env.start_host("--expect", "vm0,vm1,vm2")
    for vm in good:
        env.start_agent(vm)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    env.wait_for(lambda: os.path.exists(env.sock("evil")), "evil socket")
    s.connect(env.sock("evil"))
    s.settimeout(30)
    rnd = random.Random(7)
    s.sendall(rnd.randbytes(200_000))  # random bytes
    s.sendall(b"\n{not json}\n[1,2,3]\n")
    forged = {
        "now": 1.0,
        "events": [
            {"timestamp": 1.0, "type": "configured", "id": "x1", "data": {"at": 1.0}},
            {"timestamp": 1.0, "type": "hello", "id": "x2", "data": {"vm": "vm0", "protocol": 1}},
        ],
    }
    s.sendall(_json.dumps(forged).encode() + b"\n")
    chunk = b"A" * (1 << 20)
    for _ in range(100):  # a 100 MB frame, streamed
        s.sendall(chunk)
    s.sendall(b"\n")
    flood = (
        _json.dumps({"now": 1.0, "events": [{"timestamp": 1.0, "type": "heartbeat", "id": "h", "data": {}}]})
        + "\n"
    ).encode()
    s.sendall(flood * 10_000)
    s.close()
    for vm in good:
        out = env.wait_event(vm, "output", index=1)
        assert out["event"]["data"]["line"] == f"ok {vm[-1]}"
    starts = {env.wait_event(vm, "entry_started", index=1)["event"]["data"]["scheduled"] for vm in good}
    assert len(starts) == 1
    status = env.status()
    evil = next(v for v in status["vms"] if v["vm"] == "evil")
    assert evil["frames"]["malformed"] >= 2 and evil["frames"]["oversize"] >= 1
    assert evil["refused"]["vm_mismatch"] >= 1  # claimed to be vm0: identity is the channel
    assert "evil" not in status["experiment"]["expected"]
    for vm in good:  # nothing of the hostile channel in good VMs' logs
        assert all(r["vm"] == vm for r in env.events(vm))
    assert env.host is not None and env.host.poll() is None


def test_release_then_late_joiner_fires_overdue_entries_at_once(env_factory):
    sched = [{"start_time": -1, "executable": "/bin/true"}, {"start_time": 1, "executable": "/bin/true"}]
    env = env_factory({"early": sched, "late": sched}, start_buffer=0.5)
    env.start_host()
    env.start_agent("early")
    env.wait_event("early", "configured")
    assert env.status()["experiment"]["waiting_for"] == ["late"]
    res = env.cli("release")
    assert res.returncode == 0, res.stderr
    env.wait_event("early", "entry_started", index=1)
    time.sleep(1.0)
    env.start_agent("late")
    late = env.wait_event("late", "entry_started", index=1)["event"]["data"]
    early = env.wait_event("early", "entry_started", index=1)["event"]["data"]
    assert late["scheduled"] == early["scheduled"]  # the one start time
    assert late["lateness"] > 0.5  # fired at once, lateness reported


def test_large_schedule_is_fetched_in_chunks(env_factory):
    blob = "".join(f"{i:08d} payload line of a big content drop\n" for i in range(40_000))  # ~1.7 MB
    sched = [
        {"start_time": -1, "data": [{"location": "big.txt", "content": blob}]},
        {"start_time": 0.2, "executable": "/bin/true"},
    ]
    env = env_factory({"a": sched}, start_buffer=0.2)
    assert (env.schedules / "a.yaml").stat().st_size > 1024 * 1024  # more than one frame
    env.start_host()
    env.start_agent("a")
    placed = env.wait_event("a", "data_placed", index=0)["event"]["data"]
    assert placed["sha256"] == hashlib.sha256(blob.encode()).hexdigest()
    env.wait_event("a", "schedule_complete")
    assert next(v for v in env.status()["vms"] if v["vm"] == "a")["schedule"]["state"] == "accepted"


def test_config_file_and_periodic_transfer_of_a_changing_file(unix_env_factory):
    env = unix_env_factory({}, start_buffer=0.2)
    watched = env.root / "vm" / "a" / "watched.txt"
    watched.parent.mkdir(parents=True)
    watched.write_text("one\n")
    import yaml

    sched = [
        {"start_time": -1, "data": [{"location": str(watched), "interval": 0.5, "destination": None}]},
        {"start_time": 1.5, "executable": "/bin/sh", "arguments": f"-c 'echo two >> {watched}'"},
    ]
    (env.schedules / "a.yaml").write_text(yaml.safe_dump(sched))
    config = env.root / "agent.yaml"  # the port and the name come from the config file, not flags
    config.write_text(yaml.safe_dump({"port": f"unix:{env.sock('a')}", "vm_name": "from-config"}))
    env.start_host()
    base = env.root / "vm" / "a"
    import subprocess
    import sys

    log = open(base / "agent.out", "ab")  # noqa: SIM115
    env.agents["a"] = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vmr_handler",
            "run",
            "--config",
            str(config),
            "--state-dir",
            str(base / "state"),
            "--launch-dir",
            str(base / "launch"),
        ],
        stdout=log,
        stderr=log,
    )
    log.close()
    copy = env.logs / "transfers" / "a" / str(watched).lstrip("/")
    env.wait_for(lambda: copy.exists() and copy.read_text() == "one\n", "first transfer")
    env.wait_for(lambda: copy.exists() and copy.read_text() == "one\ntwo\n", "the changed file sent again")
    vm = next(v for v in env.status()["vms"] if v["vm"] == "a")
    assert vm["agent"]["claimed_vm"] == "from-config"


def test_bad_config_file_is_refused_with_the_key_named(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "c.yaml"
    bad.write_text("port: unix:/x\nprot: 3\n")
    res = subprocess.run(
        [sys.executable, "-m", "vmr_handler", "run", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "'prot'" in res.stderr
    bad.write_text("heartbeat: fast\n")
    res = subprocess.run(
        [sys.executable, "-m", "vmr_handler", "run", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "'heartbeat'" in res.stderr
