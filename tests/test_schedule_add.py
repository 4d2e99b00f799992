"""``vmr-host schedule add`` with a real ``vmr-host serve`` and real agents,
over unix sockets and over a real mosquitto: a batch appended to every VM after their schedule
completed (a negative entry as a stage of its own, a positive one whose time passed fired at
once with its lateness), then a break appended to one VM and ended by a RESUME; an agent killed
between the append and the entry's time (the batch is kept, nothing runs twice); bad batches
refused with nothing appended. The rules at exact instants: tests/test_appends_engine.py."""

from __future__ import annotations

import json
import signal
import time
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from tests.hostenv import HostEnv

SCHEDULE: List[Dict[str, Any]] = [
    {"start_time": -1, "executable": "/bin/echo", "arguments": "configured"},
    {"start_time": 1, "executable": "/bin/echo", "arguments": "first"},
]


@pytest.fixture(params=["unix", "mqtt"])
def env(request: pytest.FixtureRequest) -> Iterator[HostEnv]:
    e = HostEnv({"a": SCHEDULE, "b": SCHEDULE}, start_buffer=1.0, transport=request.param)
    yield e
    e.close()


def _batch(env: HostEnv, name: str, entries: List[Dict[str, Any]]) -> str:
    path = env.root / name
    path.write_text(yaml.safe_dump(entries))
    return str(path)


def _started(env: HostEnv, vm: str, index: int) -> List[Dict[str, Any]]:
    return [r for r in env.events(vm, "entry_started") if r["event"]["data"]["index"] == index]


def test_append_to_all_then_a_break_to_one_ended_by_resume(env: HostEnv) -> None:
    env.start_host()
    for vm in ("a", "b"):
        env.start_agent(vm)
    for vm in ("a", "b"):
        env.wait_event(vm, "schedule_complete")
    time.sleep(1.5)  # the appended positive entry's time (1) is then over 1 s in the past
    batch = _batch(env, "more.yaml", [
        {"start_time": -100000, "executable": "/bin/echo", "arguments": "appended stage"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "appended late"},
    ])  # fmt: skip
    res = env.cli("schedule", "add", "--all", batch)
    assert res.returncode == 0, res.stderr
    assert "2 entries from" in res.stdout and "appended to a, b" in res.stdout
    assert "sent now to 2" in res.stdout
    for vm in ("a", "b"):
        env.wait_event(vm, "entry_exited", index=3, status="success")
        env.wait_event(vm, "entry_exited", index=2, status="success")
        appended = env.wait_event(vm, "schedule_appended")["event"]["data"]
        assert appended["first_index"] == 2 and appended["count"] == 2
        assert appended["stages"][0][:2] == [1, -100000]
        assert env.wait_event(vm, "stage_started", stage=1)["event"]["data"]["entries"] == [2]
        late = _started(env, vm, 3)[0]["event"]["data"]
        assert 1.0 < late["lateness"] < 30  # due at experiment time 1, long passed: fired at once
        env.wait_for(lambda v=vm: len(env.events(v, "schedule_complete")) == 2, f"{vm} completes again")
    def answered() -> List[List[str]]:
        return [sorted(r["answered"]) for r in json.loads((env.logs / "appends.json").read_text())]

    env.wait_for(lambda: answered() == [["a", "b"]], "both answers kept in appends.json")
    rows = json.loads(env.cli("schedule", "show", "a", "--json").stdout)["entries"]
    assert [r["runs"][0]["status"] for r in rows] == ["success"] * 4
    assert "appended late" in rows[3]["command"]
    assert rows[2]["stage"] == 1  # the stage the agent ran it as (after the schedule's own)

    # a break appended to a alone holds what follows it until a RESUME
    brk = _batch(env, "break.yaml", [
        {"start_time": 1, "pause_duration": "inf"},
        {"start_time": 2, "executable": "/bin/echo", "arguments": "after the break"},
    ])  # fmt: skip
    assert env.cli("schedule", "add", "a", brk).returncode == 0
    env.wait_event("a", "break_started", index=4)
    time.sleep(1.0)
    assert _started(env, "a", 5) == []
    assert env.status()["vms"][0]["phase"]["at_break"]["index"] == 4
    assert env.cli("resume", "a").returncode == 0
    env.wait_event("a", "entry_exited", index=5, status="success")
    assert len(env.events("b", "schedule_appended")) == 1  # b got only the first batch


def test_a_killed_agent_keeps_its_batch_and_runs_nothing_twice() -> None:
    env = HostEnv({"a": SCHEDULE}, start_buffer=1.0)
    try:
        env.start_host()
        env.start_agent("a")
        env.wait_event("a", "schedule_complete")
        start = env.status()["experiment"]["start_time"]
        later = round(time.time() - start + 6.0, 3)
        batch = _batch(env, "b.yaml", [
            {"start_time": 0.5, "executable": "/bin/echo", "arguments": "now"},
            {"start_time": later, "executable": "/bin/echo", "arguments": "later"},
        ])  # fmt: skip
        assert env.cli("schedule", "add", "a", batch).returncode == 0
        env.wait_event("a", "entry_exited", index=2)
        env.agents["a"].send_signal(signal.SIGKILL)
        env.agents["a"].wait(10)
        env.start_agent("a")
        env.wait_event("a", "entry_exited", index=3, status="success")
        assert len(_started(env, "a", 2)) == 1 and len(_started(env, "a", 3)) == 1
        assert len(env.events("a", "schedule_appended")) == 1
        fired = _started(env, "a", 3)[0]["event"]["data"]
        assert abs(fired["spawned_at"] - (start + later)) < 1.0  # at its time, not at once
    finally:
        env.close()


def test_bad_batches_are_refused_and_nothing_is_appended() -> None:
    env = HostEnv({"a": SCHEDULE}, start_buffer=1.0)
    try:
        env.start_host()
        bad = _batch(env, "bad.yaml", [{"start_time": 5, "executable": "/bin/true"}, {"start_time": "soon"}])
        res = env.cli("schedule", "add", "a", bad)
        assert res.returncode == 2 and "entry 1" in res.stderr and "start_time" in res.stderr, res.stderr
        assert "nothing appended" in res.stderr
        drop = {"filename": "nope.bin", "location": "/tmp/x"}
        missing = _batch(env, "res.yaml", [{"start_time": -5, "data": [drop]}])
        res = env.cli("schedule", "add", "a", missing)
        assert res.returncode == 2 and "nope.bin" in res.stderr, res.stderr
        res = env.cli("schedule", "add", "--all", "a", bad)
        assert res.returncode == 2 and "not both" in res.stderr
        ok = _batch(env, "ok.yaml", [{"start_time": 5, "executable": "/bin/true"}])
        res = env.cli("schedule", "add", "zz", ok)
        assert res.returncode == 2 and "unknown VM" in res.stderr
        assert not (env.logs / "appends.json").exists()
    finally:
        env.close()
