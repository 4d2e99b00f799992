"""The agent trusts the disk, not only its journal (SPEC section 5, last bullet), connected to a
real ``vmr-host serve`` over a unix socket: a negative entry deletes the launch dir, then a batch
appended with ``vmr-host schedule add`` deletes it again; every later entry (the schedule's and
the batch's, negative and positive) runs with its data, and the host's log shows the
re-placements. The local-mode cases: tests/test_launch_dir_vanished.py."""

from __future__ import annotations

import time
from typing import Any, Dict, List

import yaml

from tests.hostenv import HostEnv


def _data(rec: Dict[str, Any]) -> Dict[str, Any]:
    data: Dict[str, Any] = rec["event"]["data"]
    return data


def _stdout(env: HostEnv, vm: str, index: int) -> str:
    return "".join(
        _data(r).get("line", "") + "\n"
        for r in env.events(vm, "output")
        if _data(r)["index"] == index and _data(r)["stream"] == "stdout"
    )


def test_deleted_launch_dir_with_a_host_and_an_appended_batch() -> None:
    env = HostEnv({"a": []}, start_buffer=1.0)
    try:
        launch = env.root / "vm" / "a" / "launch"
        wipe = {"executable": "/bin/sh", "arguments": f"-c 'rm -rf {launch}'"}
        schedule: List[Dict[str, Any]] = [
            {"start_time": -10, **wipe},
            {"start_time": -5, "executable": "cat", "arguments": "neg.txt",
             "data": [{"location": "neg.txt", "content": "negative data\n"}]},
            {"start_time": 7, "executable": "cat", "arguments": "late.txt",
             "data": [{"location": "late.txt", "content": "late data\n"}]},
        ]  # fmt: skip
        (env.schedules / "a.yaml").write_text(yaml.safe_dump(schedule))
        env.start_host()
        env.start_agent("a")
        env.wait_event("a", "experiment_started")
        assert _stdout(env, "a", 1) == "negative data\n"
        start = env.status()["experiment"]["start_time"]
        soon = round(time.time() - start + 2.0, 3)
        batch = env.root / "batch.yaml"
        batch.write_text(yaml.safe_dump([
            {"start_time": -200, **wipe},
            {"start_time": -100, "executable": "cat", "arguments": "app.txt",
             "data": [{"location": "app.txt", "content": "appended stage data\n"}]},
            {"start_time": soon, "executable": "cat", "arguments": "soon.txt",
             "data": [{"location": "soon.txt", "content": "appended positive data\n"}]},
        ]))  # fmt: skip
        res = env.cli("schedule", "add", "a", str(batch))
        assert res.returncode == 0, res.stderr
        for index in (3, 4, 5, 2):
            exited = _data(env.wait_event("a", "entry_exited", index=index))
            assert exited["status"] == "success", (index, exited, env.agent_log("a")[-2000:])
        assert not env.events("a", "entry_failed"), env.events("a", "entry_failed")
        assert _stdout(env, "a", 4) == "appended stage data\n"
        assert _stdout(env, "a", 5) == "appended positive data\n"
        assert _stdout(env, "a", 2) == "late data\n"
        restored = [_data(r) for r in env.events("a", "data_placed") if _data(r)["outcome"] == "restored"]
        assert sorted(p["index"] for p in restored) == [1, 2]  # the batch's data was placed at its time
        assert all("gone since" in p["details"] for p in restored)
    finally:
        env.close()
