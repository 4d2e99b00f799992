"""``vmr-host schedule show VM``: a VM's schedule as the host delivered it
and what became of every entry, from the logs directory, with a real ``vmr-host serve`` and a
real agent: a stage, a break ended by a RESUME, an entry after it, one that fails, one the
break still holds; the JSON form; a VM never seen; a schedule file changed since it was
delivered; an unknown VM."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from tests.hostenv import HostEnv

SCHEDULE: List[Dict[str, Any]] = [
    {"start_time": -5, "executable": "/bin/echo", "arguments": "configured"},
    {"start_time": 1, "executable": "/bin/sh", "arguments": "-c 'exit 4'"},
    {"start_time": 2, "pause_duration": "inf"},
    {"start_time": 3, "executable": "/bin/echo", "arguments": "after the break"},
]


@pytest.fixture
def env() -> Iterator[HostEnv]:
    e = HostEnv({"vm1": SCHEDULE, "vm2": SCHEDULE[:1]}, start_buffer=1.0)
    yield e
    e.close()


def _show(env: HostEnv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "schedule", "show", *args, "--logs", str(env.logs)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _rows(env: HostEnv, vm: str) -> List[Dict[str, Any]]:
    res = _show(env, vm, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["entries"]


def test_schedule_show_follows_a_real_vm(env: HostEnv) -> None:
    env.start_host("--expect", "vm1")
    # before the agent: the schedule as delivered, nothing run yet
    res = _show(env, "vm1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("vm1: ") and "(yaml, 4 entries, sha256 " in lines[0]
    assert "not set yet" in lines[0]
    assert lines[1].split()[:3] == ["#", "time", "kind"]
    assert "not run yet" in lines[2] and "stage 0" in lines[2] and lines[2].endswith("/bin/echo configured")
    assert "not reached yet" in lines[4] and "break" in lines[4]

    env.start_agent("vm1")
    env.wait_event("vm1", "break_started")
    held = _rows(env, "vm1")
    assert [r["kind"] for r in held] == ["negative", "positive", "break", "positive"]
    assert held[0]["runs"][0]["status"] == "success" and held[0]["runs"][0]["exit_code"] == 0
    assert held[1]["runs"][0]["status"] == "error" and held[1]["runs"][0]["exit_code"] == 4
    assert held[1]["runs"][0]["lateness"] is not None and held[1]["fire_at"] == 1
    assert held[2]["holds"][0]["kind"] == "break" and held[2]["holds"][0]["end"] is None
    assert held[3]["runs"] == [] and held[3]["fire_at"] is None  # held by the break
    text = _show(env, "vm1").stdout
    assert "break since 20" in text and "after a break" in text and "error (exit 4) at 20" in text

    assert env.cli("resume", "vm1").returncode == 0
    env.wait_event("vm1", "entry_exited", index=3)
    done = _rows(env, "vm1")
    assert done[2]["holds"][0]["end"] is not None and done[3]["runs"][0]["status"] == "success"
    assert isinstance(done[3]["fire_at"], float) and done[3]["fire_at"] > 3  # shifted by the break
    text = _show(env, "vm1").stdout
    assert "break 20" in text and " to 20" in text and "success (exit 0) at 20" in text

    # a VM never seen: its schedule, nothing run
    assert [r["runs"] for r in _rows(env, "vm2")] == [[]]


def test_schedule_show_refuses_what_it_cannot_show(env: HostEnv) -> None:
    env.start_host("--expect", "vm1")
    res = _show(env, "vm9")
    assert res.returncode == 2 and "unknown VM vm9 (this host's VMs: vm1, vm2)" in res.stderr, res.stderr
    (env.schedules / "vm1.yaml").write_text(yaml.safe_dump(SCHEDULE[:2]))
    res = _show(env, "vm1")
    assert res.returncode == 2 and "changed since the host delivered it to vm1" in res.stderr, res.stderr
    (env.logs / "schedules.json").unlink()
    res = _show(env, "vm1")
    assert res.returncode == 2 and "start vmr-host serve on these logs once" in res.stderr


def test_the_stages_keep_the_agents_numbers_after_exec() -> None:
    stages = [
        {"start_time": -20, "executable": "/bin/echo", "arguments": "first stage"},
        {"start_time": -10, "executable": "/bin/echo", "arguments": "second stage"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "positive"},
    ]
    env = HostEnv({"vm1": stages}, start_buffer=0.5)
    try:
        env.start_host()
        env.start_agent("vm1")
        env.wait_event("vm1", "schedule_complete")
        res = subprocess.run(
            [sys.executable, "-m", "vmr_handler.host", "exec", "vm1", "--logs", str(env.logs),
             "--", "/bin/echo", "hi"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        rows = _rows(env, "vm1")
        # the agent's own numbers: stage 0 at -20 and 1 at -10 (the exec entry, at -100000, is
        # appended: it never renumbers them), then the exec entry's stage as the agent gave it
        assert [(r["start_time"], r["stage"]) for r in rows[:3]] == [(-20, 0), (-10, 1), (1, None)]
        assert len(rows) == 4 and rows[3]["stage"] not in (None, 0, 1)
        assert rows[3]["runs"][0]["status"] == "success"
        stage_started = [e["event"]["data"] for e in env.events("vm1", "stage_started")]
        assert [(d["stage"], d["start_time"]) for d in stage_started][:2] == [(0, -20), (1, -10)]
        assert rows[3]["stage"] == stage_started[-1]["stage"]
    finally:
        env.close()


def test_a_stored_resume_says_which_break_it_ended() -> None:
    # as FIREWHEEL's `vm resume` stores it: a break at -inf, then a RESUME entry at -inf
    stored = [
        {"start_time": float("-inf"), "pause_duration": "inf"},
        {"start_time": float("-inf"), "data": [{"resume": True}]},
        {"start_time": -5, "executable": "/bin/echo", "arguments": "configured"},
    ]
    env = HostEnv({"vm1": stored}, start_buffer=0.5)
    try:
        env.start_host()
        env.start_agent("vm1")
        env.wait_event("vm1", "schedule_complete")
        rows = _rows(env, "vm1")
        assert rows[0]["holds"][0]["end"] is not None  # the break is over, never "since"
        assert rows[1]["kind"] == "resume" and rows[1]["resumed"]["ended_break"] == 0
        text = _show(env, "vm1").stdout.splitlines()
        assert "ended break #0 at " in text[3] and "break since" not in "\n".join(text)
        assert env.status()["vms"][0]["state"] == "complete"
    finally:
        env.close()
