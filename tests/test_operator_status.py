"""What an operator sees: ``vmr-host status`` says who the experiment waits for and
why, ``vmr-host wait --for`` waits for a phase, a recovered VM shows what it does now.

A real ``vmr-host serve`` and real agents over unix sockets: vm1 and vm2 reach a break at +1,
vm3 fails in its negative stage (a VM resource the host does not have), is fixed and
restarted, then plays its schedule to the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List

import pytest

from tests.hostenv import HostEnv

BREAK = {"start_time": 1, "pause_duration": "inf"}
TOOL = {"location": "tool", "filename": "tool.bin"}  # a VM resource the host lacks at first
#: the host serves though vm3's tool.bin is missing (without it, serve refuses to start)
ALLOW = "--allow-missing-resources"


def _sched(extra: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{"start_time": -5, "executable": "/bin/echo", "arguments": "configured"}, *extra]


@pytest.fixture
def env() -> Iterator[HostEnv]:
    e = HostEnv(
        {
            "vm1": _sched([BREAK, {"start_time": 2, "executable": "/bin/echo", "arguments": "after"}]),
            "vm2": _sched([BREAK]),
            "vm3": _sched([{"start_time": -3, "executable": None, "data": [TOOL]}]),
        },
        start_buffer=1.0,
    )
    yield e
    e.close()


def _cli(env: HostEnv, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", *args, "--logs", str(env.logs)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _vm(status: Dict[str, Any], name: str) -> Dict[str, Any]:
    return next(v for v in status["vms"] if v["vm"] == name)


def _status_json(env: HostEnv) -> Dict[str, Any]:
    res = _cli(env, "status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def test_status_wait_and_a_recovered_vm(env: HostEnv) -> None:
    env.start_host(ALLOW)
    for vm in ("vm1", "vm2", "vm3"):
        env.start_agent(vm)
    env.wait_event("vm3", "vm_failed")

    # the barrier waits for vm3: status names the failure, the way on, and exits 1
    res = _cli(env, "status")
    assert res.returncode == 1, res.stdout + res.stderr
    text = res.stdout
    assert "3 VM(s): 1 failed" in text
    # the cause the host knows, not only a missing file in the guest
    assert ("vm3 failed in stage -3 (entry 1): VM resource 'tool.bin' was not received from the host: "
            "resource 'tool.bin' is not in the host's --resources directory") in text, text
    assert text.count("entry 1") == 1, text  # the cause said once
    assert "tool.bin" in text, text  # the cause, named once
    assert "start without it: vmr-host release --exclude vm3" in text
    only_failed = _cli(env, "status", "--state", "failed").stdout
    rows = [ln.split()[0] for ln in only_failed.splitlines() if re.match(r"vm\d+\s+(yes|no|silent)\s", ln)]
    assert rows == ["vm3"], only_failed

    # wait for configured: vm3 failed, so exit 1 at once, naming it
    waited = _cli(env, "wait", "--for", "configured", "--timeout", "30")
    assert waited.returncode == 1 and "vm3 failed" in waited.stdout, waited.stdout + waited.stderr
    # a phase nobody reaches in time: exit 2, saying whom it waits for
    timed_out = _cli(env, "wait", "--for", "complete", "vm1", "--timeout", "0.5")
    assert timed_out.returncode == 2 and "vm1" in timed_out.stdout, timed_out.stdout

    # fix vm3 and restart its agent: it configures, the barrier opens, vm1 and vm2 reach the break
    (env.resources / "tool.bin").write_bytes(b"#!/bin/sh\n")
    env.agents["vm3"].terminate()
    env.agents["vm3"].wait(timeout=30)
    env.start_agent("vm3")
    waited = _cli(env, "wait", "--for", "at-break", "vm1", "vm2", "--timeout", "60", "--json")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert sorted(json.loads(waited.stdout)["reached"]) == ["vm1", "vm2"]

    status = _status_json(env)
    for name in ("vm1", "vm2"):
        vm = _vm(status, name)
        assert vm["state"] == "at_break" and vm["phase"]["at_break"]["index"] == 1, vm
    text = _cli(env, "status").stdout
    assert re.search(r"vm1 .*at_break\s+at break #1 since t=\+\d", text), text
    assert "waiting for RESUME: vm1 (break #1" in text and "vm2 (break #1" in text

    env.wait_event("vm3", "schedule_complete")
    vm3 = _vm(_status_json(env), "vm3")
    assert vm3["state"] == "complete" and vm3["failed"] is None, vm3  # what it does now
    assert len(vm3["failure_history"]) == 1 and "tool.bin" in vm3["failure_history"][0]["details"]
    assert "recovered from 1 failure(s)" in _cli(env, "status", "vm3").stdout

    # RESUME vm1: its break ends, status shows it running again then complete; vm2 still held.
    # In the guest, `vmr-handler status --wait` returns then (like cloud-init status --wait)
    waiter = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler", "status", "--wait", "--state-dir", str(env.state("vm1"))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)
    assert waiter.poll() is None, "status --wait returned while vm1 was held at a break"
    assert _cli(env, "resume", "vm1").returncode == 0
    env.wait_event("vm1", "schedule_complete")
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0 and "phase: complete" in out, out + err
    status = _status_json(env)
    assert _vm(status, "vm1")["state"] == "complete" and _vm(status, "vm2")["state"] == "at_break"
    res = _cli(env, "status")
    assert res.returncode == 0, res.stdout  # nobody failed any more
    assert "waiting for RESUME: vm2 (break #1" in res.stdout and "vmr-host resume vm2" in res.stdout

    # the host logged each VM's progress at INFO with running counts
    host_log = env.host_log()
    assert re.search(r"INFO vm\d configured \(\d/3\); barrier waits for", host_log), host_log[-3000:]
    assert re.search(r"WARNING vm3 failed: .*tool\.bin.*\(failed 1/3\)", host_log), host_log[-3000:]
    assert re.search(r"INFO vm1 complete \(complete 2/3\)", host_log), host_log[-3000:]

    # no host running: the same picture from the logs, read-only, and it says so
    env.kill_host()
    res = _cli(env, "status")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "status read from the logs" in res.stderr and "read-only" in res.stderr
    assert "no vmr-host running" in res.stdout
    offline = json.loads(_cli(env, "status", "--json").stdout)
    assert offline["offline"] is True
    states = {v["vm"]: v["state"] for v in offline["vms"]}
    assert states == {"vm1": "complete", "vm2": "at_break", "vm3": "complete"}, states
    assert len(_vm(offline, "vm3")["failure_history"]) == 1


def test_readable_numbers_in_status(env: HostEnv) -> None:
    """No epoch float and no number with more than 3 decimals in the human status."""
    env.start_host(ALLOW)
    for vm in ("vm1", "vm2"):
        env.start_agent(vm)
    env.wait_for(lambda: _vm(_status_json(env), "vm1")["configured_at"] is not None, "vm1 configured")
    time.sleep(0.2)
    text = _cli(env, "status").stdout
    assert not re.search(r"\d\.\d{4,}", text), text
    assert not re.search(r"\b1[6-9]\d{8}\b", text), text  # a UTC epoch in seconds


def test_logs_show_follow_and_filter(env: HostEnv) -> None:
    """``vmr-host logs``: events and whole output lines in UTC + experiment time, non-UTF-8
    escaped, ``--entry``/``--stream``/``--json``, and ``-f`` follows what the host appends."""
    env.start_host(ALLOW)
    env.start_agent("vm2")
    env.wait_event("vm2", "configured")
    assert _cli(env, "release", "--exclude", "vm1", "vm3").returncode == 0
    env.wait_event("vm2", "break_started")
    follow = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler.host", "logs", "vm2", "-f", "--logs", str(env.logs)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        text = _cli(env, "logs", "vm2").stdout
        assert re.search(r"^\S+Z t=-\d+\.\ds entry 0 stdout: configured$", text, re.M), text
        assert re.search(r"^\S+Z t=\+1\.\ds break_started entry 1", text, re.M), text
        only = _cli(env, "logs", "vm2", "--entry", "0", "--stream", "stdout").stdout.splitlines()
        assert len(only) == 1 and only[0].endswith("entry 0 stdout: configured"), only
        recs = [json.loads(ln) for ln in _cli(env, "logs", "vm2", "--json").stdout.splitlines()]
        assert any(r["event"]["type"] == "break_started" for r in recs)
        missing = _cli(env, "logs", "nope")
        assert missing.returncode == 2, missing.stderr
        assert "unknown VM nope (this host's VMs: vm1, vm2, vm3)" in missing.stderr, missing.stderr
        # -f: the RESUME's answer shows up in the follower after it was started
        assert _cli(env, "resume", "vm2").returncode == 0
        env.wait_event("vm2", "schedule_complete")
        seen: List[str] = []
        assert follow.stdout is not None
        deadline = time.monotonic() + 30
        while not any("schedule_complete" in ln for ln in seen):
            assert time.monotonic() < deadline, seen[-5:]
            seen.append(follow.stdout.readline())
        assert any("resume_received" in ln for ln in seen)
    finally:
        follow.terminate()
        follow.wait(timeout=10)


def test_status_watch_redraws(env: HostEnv) -> None:
    """``status --watch`` redraws until stopped (a pipe gets one block per round)."""
    env.start_host(ALLOW)
    watch = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler.host", "status", "--watch", "--interval", "0.3",
         "--logs", str(env.logs)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watch.stdout is not None
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 3:
            assert time.monotonic() < deadline and watch.poll() is None
            if watch.stdout.readline().startswith("experiment start: not set; barrier waiting for 3 VM(s)"):
                seen += 1
    finally:
        watch.terminate()
        watch.wait(timeout=10)
