"""Fault injection, disk full, real processes.

A real ``vmr-host serve`` and real ``vmr-handler run`` agents; a disk is made full by mounting
a small tmpfs (root, as in CI and in guests) and filling it, then freed. At-least-once must
hold on both sides: nothing lost, nothing stored twice, nobody wedged, the cause said once.

* The host's logs dir is full while two agents stream numbered lines: the host stores and
  acknowledges only what it wrote, says so, and once space returns every line is there
  exactly once, in order, and both schedules complete.
* The agent's state dir is full when a stage ends: the agent waits (its journal must say
  the stage is done before the next one starts), then goes on by itself; nothing runs twice.

The rest of the fault-injection suite: ``pytest -m faults`` (docs/host.md, "Limits and
guarantees", lists each test).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.hostenv import HostEnv, fill

pytestmark = pytest.mark.faults

LINES = 400


def _mount_tmpfs(where: Path, size: str) -> None:
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    res = subprocess.run(cmd, capture_output=True)
    if res.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the disk-full test (needs root): {res.stderr!r}")



class KeepFull:
    """Keeps a file system full from a thread (what others free, it takes) until :meth:`free`."""

    def __init__(self, directory: Path) -> None:
        self.filler = fill(directory)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with open(self.filler, "ab", buffering=0) as fh:
            while not self._stop.is_set():
                try:
                    fh.write(b"\0" * 4096)
                except OSError:
                    self._stop.wait(0.005)

    def free(self) -> None:
        """Stop filling and delete the filler: space returns."""
        self._stop.set()
        self._thread.join()
        self.filler.unlink()


@pytest.fixture
def env_small_logs() -> Iterator[HostEnv]:
    """Two VMs whose entry waits for ``FULL``, prints :data:`LINES` lines, waits for ``GO``;
    the host's logs dir is a 4 MiB tmpfs."""
    env = HostEnv({}, start_buffer=0.5)
    flags = env.root
    script = (
        f"while [ ! -e {flags}/FULL ]; do sleep 0.05; done; "
        f"i=0; while [ $i -lt {LINES} ]; do echo $VM-line-$i; i=$((i+1)); done; "
        f"while [ ! -e {flags}/GO ]; do sleep 0.05; done"
    )
    for vm in ("a", "b"):
        sched = [{"start_time": 0.5, "executable": "/bin/sh", "arguments": f"-c 'VM={vm}; {script}'"}]
        (env.schedules / f"{vm}.yaml").write_text(yaml.safe_dump(sched))
    _mount_tmpfs(env.logs, "4m")
    try:
        yield env
    finally:
        env.close()
        if os.environ.get("VMR_KEEP_TEST_DIRS") is None:
            subprocess.run(["umount", "-l", str(env.logs)], check=False)


def test_a_full_host_disk_loses_and_duplicates_nothing(env_small_logs: HostEnv) -> None:
    env = env_small_logs
    env.start_host()
    for vm in ("a", "b"):
        env.start_agent(vm)
    for vm in ("a", "b"):
        env.wait_event(vm, "entry_started", index=0)
    filler = fill(env.logs)
    (env.root / "FULL").touch()
    env.wait_for(lambda: "cannot write the log" in env.host_log(), "the host saying its disk is full")
    time.sleep(1.5)  # the agents go on sending; the host must not acknowledge what it did not write
    assert env.host is not None and env.host.poll() is None
    filler.unlink()  # space returns: the agents' resends are stored, once
    (env.root / "GO").touch()
    for vm in ("a", "b"):
        env.wait_event(vm, "schedule_complete")
        # what the host could not write is resent by the agent (every 10 s), after later reports
        env.wait_for(lambda vm=vm: len(env.events(vm, "output")) >= LINES, f"{vm}: every line")
        time.sleep(0.5)  # a duplicate would be stored now
        outputs = sorted((r["event"]["data"] for r in env.events(vm, "output")), key=lambda d: d["seq"])
        assert [d["line"] for d in outputs] == [f"{vm}-line-{i}" for i in range(LINES)]  # once each
        ids = [r["event"]["id"] for r in env.events(vm)]
        assert len(ids) == len(set(ids))
        raw = (env.logs / f"{vm}.jsonl").read_bytes()
        assert raw.endswith(b"\n")  # no torn line
    said = env.host_log().count("cannot write the log")
    assert 1 <= said <= 2, env.host_log()[-3000:]  # once per VM, not per message
    assert "written again" in env.host_log()


def test_a_full_guest_disk_at_a_stage_end_waits_then_goes_on(full_disk: Path) -> None:
    flags = full_disk.parent
    stage0 = f"echo first >> {flags}/ran; while [ ! -e {flags}/FULL ]; do sleep 0.05; done"
    sched = [
        {"start_time": -20, "executable": "/bin/sh", "arguments": f"-c '{stage0}'"},
        {"start_time": -10, "executable": "/bin/sh", "arguments": f"-c 'echo second >> {flags}/ran'"},
        {"start_time": 0.5, "executable": "/bin/true"},
    ]
    env = HostEnv({"a": sched}, start_buffer=0.5)
    try:
        env.start_host()
        agent = env.start_agent("a", "--state-dir", str(full_disk / "state"))
        env.wait_event("a", "entry_started", index=0)
        full = KeepFull(full_disk)  # the outbox's compaction frees pages: take them too
        (flags / "FULL").touch()  # stage 0 ends now, with no room for the journal
        env.wait_for(lambda: "cannot write journal" in env.agent_log("a"), "the agent saying so")
        time.sleep(1.5)
        assert agent.poll() is None, env.agent_log("a")  # before: exit 1
        assert (flags / "ran").read_text() == "first\n"  # stage 1 waits for the journal
        full.free()
        env.wait_event("a", "schedule_complete")
        assert (flags / "ran").read_text() == "first\nsecond\n"
        assert env.agent_log("a").count("cannot write journal") == 1
        assert not env.events("a", "vm_failed")
    finally:
        env.close()
