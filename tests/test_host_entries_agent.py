"""on_host entries end to end: a real ``vmr-host serve --host-entries``
and a real agent, over unix sockets and over mosquitto. A negative on_host entry runs on the
host inside the VM's stage (the next stage starts only after it ended), a positive one at its
time with its lateness; the host writes their start, output and end in the VM's log, the agent
nothing of its own; an agent killed while the host runs one asks again and the host does not
run it twice; without ``--host-entries`` they are refused with a clear event and the VM goes
on. The host side alone: tests/test_host_entries.py."""

from __future__ import annotations

import signal
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from tests.hostenv import HostEnv


def _schedule(marker: str) -> List[Dict[str, Any]]:
    return [
        {"start_time": -10, "executable": "/bin/sh", "on_host": True,
         "arguments": f"-c 'sleep 1; echo ran on the host for $FIREWHEEL_VM_NAME; "
                      f"echo negative >> {marker}'"},
        {"start_time": -5, "executable": "/bin/sh", "arguments": f"-c 'test -f {marker}'"},
        {"start_time": 1, "executable": "/bin/sh", "on_host": True,
         "arguments": f"-c 'echo positive >> {marker}'"},
    ]  # fmt: skip


@pytest.fixture(params=["unix", "mqtt"])
def env(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[HostEnv]:
    e = HostEnv({"a": _schedule(str(tmp_path / "marker"))}, start_buffer=1.0, transport=request.param)
    e.marker = tmp_path / "marker"  # type: ignore[attr-defined]
    yield e
    e.close()


def _of(env: HostEnv, vm: str, type_: str, index: int) -> List[Dict[str, Any]]:
    return [r["event"]["data"] for r in env.events(vm, type_) if r["event"]["data"].get("index") == index]


def test_on_host_entries_run_on_the_host_in_the_stage_and_at_their_time(env: HostEnv) -> None:
    env.start_host("--host-entries")
    env.start_agent("a")
    env.wait_event("a", "schedule_complete")
    assert env.marker.read_text().split() == ["negative", "positive"]  # type: ignore[attr-defined]
    assert _of(env, "a", "entry_exited", 1)[0]["exit_code"] == 0  # the host's entry ended before stage -5
    for index in (0, 2):
        started, exited = _of(env, "a", "entry_started", index), _of(env, "a", "entry_exited", index)
        assert len(started) == 1 and started[0]["on_host"] is True
        assert len(exited) == 1 and exited[0]["status"] == "success" and exited[0]["on_host"] is True
    # at its time: lateness is the host's spawn against the instant the agent computed on its
    # host-synchronised clock, so a sync error of a few ms either way shows (never seconds)
    assert abs(_of(env, "a", "entry_started", 2)[0]["lateness"]) < 5.0
    assert any("ran on the host for a" in str(o) for o in _of(env, "a", "output", 0))  # FIREWHEEL's env
    assert env.events("a", "entry_skipped") == []
    stages = [r["event"]["data"]["stage"] for r in env.events("a", "stage_started")]
    assert stages == [0, 1]
    # an on_host entry appended later (schedule add) runs on the host too, from the host's copy
    marker = env.marker  # type: ignore[attr-defined]
    batch = env.root / "more.yaml"
    batch.write_text(yaml.safe_dump([{"start_time": 1, "executable": "/bin/sh", "on_host": True,
                                      "arguments": f"-c 'echo appended >> {marker}'"}]))  # fmt: skip
    assert env.cli("schedule", "add", "a", str(batch)).returncode == 0
    assert env.wait_event("a", "entry_exited", index=3)["event"]["data"]["on_host"] is True
    assert marker.read_text().split() == ["negative", "positive", "appended"]


def test_without_host_entries_they_are_refused_and_the_vm_goes_on() -> None:
    env = HostEnv({"a": _schedule("/nonexistent/marker")[:1]}, start_buffer=1.0)
    try:
        env.start_host()
        env.start_agent("a")
        env.wait_event("a", "schedule_complete")
        skipped = _of(env, "a", "entry_skipped", 0)
        assert len(skipped) == 1 and skipped[0]["status"] == "error"
        assert "--host-entries" in skipped[0]["details"]
        assert _of(env, "a", "entry_started", 0) == []
    finally:
        env.close()


def test_an_agent_killed_while_the_host_runs_its_entry_asks_again_and_it_runs_once(tmp_path: Any) -> None:
    marker = tmp_path / "marker"
    sched = [{"start_time": -10, "executable": "/bin/sh", "on_host": True,
              "arguments": f"-c 'echo run >> {marker}; sleep 3'"}]  # fmt: skip
    env = HostEnv({"a": sched}, start_buffer=1.0)
    try:
        env.start_host("--host-entries")
        env.start_agent("a")
        env.wait_event("a", "entry_started", index=0)
        env.agents["a"].send_signal(signal.SIGKILL)
        env.agents["a"].wait(10)
        env.start_agent("a")
        env.wait_event("a", "schedule_complete")
        assert marker.read_text().split() == ["run"]
        assert len(_of(env, "a", "entry_started", 0)) == 1 and len(_of(env, "a", "entry_exited", 0)) == 1
        assert _of(env, "a", "entry_interrupted", 0) == []
    finally:
        env.close()
