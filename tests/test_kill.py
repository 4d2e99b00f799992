"""``vmr-host kill`` with a real ``vmr-host serve`` and real agents, over unix sockets and over a
real mosquitto: an entry of a negative stage killed (the stage ends, the next begins), a
process tree killed whole (checked with psutil), a tree that ignores SIGTERM ended by SIGKILL
after the grace, the refusals, and a forged kill on the MQTT topic refused when the host signs.
The engine's rules on a fake clock: tests/test_kill_engine.py."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, Iterator, List

import psutil
import pytest

from tests.hostenv import HostEnv
from tests.test_signed_control import Rogue, _signed_mqtt_host
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import KILL

TREE = "-c 'sleep 1000 & sleep 1000 & wait'"
DEAF_TREE = "-c \"trap '' TERM; sleep 1000 & sleep 1000 & wait\""  # the sleeps ignore SIGTERM too
SCHEDULE: List[Dict[str, Any]] = [
    {"start_time": -5, "executable": "/bin/sleep", "arguments": "1000"},  # stage -5 waits on it
    {"start_time": -1, "executable": "/bin/echo", "arguments": "next stage"},
    {"start_time": 1, "executable": "/bin/sh", "arguments": DEAF_TREE},
    {"start_time": 1, "executable": "/bin/sh", "arguments": TREE},
]


@pytest.fixture(params=["unix", "mqtt"])
def env(request: pytest.FixtureRequest) -> Iterator[HostEnv]:
    e = HostEnv({"a": SCHEDULE, "b": SCHEDULE[1:2]}, start_buffer=0.5, transport=request.param)
    yield e
    e.close()


def _tree(env: HostEnv, vm: str, index: int) -> List[psutil.Process]:
    """The process tree of ``vm``'s running entry ``index`` (its shell and the sleeps)."""
    pid = env.wait_event(vm, "entry_started", index=index)["event"]["data"]["pid"]
    root = psutil.Process(pid)
    kids = env.wait_for(lambda: root.children(recursive=True), f"entry {index}'s children")
    env.wait_for(lambda: len(root.children(recursive=True)) == 2, "both sleeps started")
    return [root, *kids]


def _gone(procs: List[psutil.Process]) -> bool:
    return not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_kill_a_stage_entry_then_trees_and_the_refusals(env: HostEnv) -> None:
    env.start_host()
    env.start_agent("a")
    env.start_agent("b")
    env.wait_event("a", "entry_started", index=0)
    env.wait_for(lambda: 0 in env.status()["vms"][0]["phase"]["running_entries"], "the host sees entry 0 run")
    time.sleep(0.5)
    assert [r["event"]["data"]["index"] for r in env.events("a", "entry_started")] == [0]

    res = env.cli("kill", "a", "--entry", "0")  # a negative-time entry its stage waits on
    assert res.returncode == 0, res.stderr
    assert "entry 0 sent SIGTERM, SIGKILL after 10 s on a" in res.stdout
    assert "a: entry 0 belongs to stage 0 (start_time -5), which waits on it: the stage ends when the " \
           "entry ends, then the next stage begins" in res.stdout  # fmt: skip
    ended = env.wait_event("a", "entry_exited", index=0)["event"]["data"]
    assert ended["ended_by"] == "operator" and ended["status"] == "killed" and ended["signal"] == 15
    assert ended["details"] == "killed by operator (SIGTERM)" and "@" in ended["requested_by"]
    env.wait_event("a", "entry_exited", index=1, status="success")  # the next stage ran
    answers = env.wait_for(lambda: [r for r in env.events("a", "result") if r["event"]["data"]["answers"]
                                    .startswith("kill-")], "the agent's answer to the kill")  # fmt: skip
    assert answers[0]["event"]["data"]["details"].startswith("SIGTERM sent to entry 0's process tree (pid ")

    # positive time: a tree that ends on SIGTERM, and one that ignores it (SIGKILL after 1 s)
    obeys, ignores = _tree(env, "a", 3), _tree(env, "a", 2)
    res = env.cli("kill", "--all", "--entry", "3")
    assert res.returncode == 0, res.stderr
    assert "b: entry 3 is not running on b: it has not started" in res.stdout  # b has no entry 3
    end3 = env.wait_event("a", "entry_exited", index=3)["event"]["data"]
    assert end3["details"] == "killed by operator (SIGTERM)", end3
    assert env.wait_for(lambda: _gone(obeys), "entry 3's tree gone")
    res = env.cli("kill", "a", "--entry", "2", "--grace", "1", "--json")
    assert res.returncode == 0, res.stderr
    end2 = env.wait_event("a", "entry_exited", index=2)["event"]["data"]
    assert end2["signal"] == 9 and end2["kill_signal"] == "SIGTERM" and end2["grace"] == 1.0, end2
    assert end2["details"] == (
        "killed by operator (SIGTERM): still running after the 1 s grace period, ended by SIGKILL"
    )
    assert env.wait_for(lambda: _gone(ignores), "entry 2's tree gone, sleeps that ignored SIGTERM too")

    # killed is not failed: status and logs say so
    env.wait_for(lambda: env.status()["vms"][0]["state"] == "complete", "a completes")
    assert env.status()["vms"][0]["failures"] == 0
    table = env.cli("status").stdout
    notes = ("entry 3 killed by operator (SIGTERM); entry 2 killed by operator (SIGTERM): still running "
             "after the 1 s grace period, ended by SIGKILL; 3 entries killed (operator or timeout)")
    assert notes in table, table
    rows = json.loads(env.cli("schedule", "show", "a", "--json").stdout)["entries"]
    assert [r["runs"][-1]["status"] for r in rows] == ["killed", "success", "killed", "killed"]
    logs = env.cli("logs", "a").stdout
    assert "details=killed by operator (SIGTERM)" in logs and "ended_by=operator" in logs

    # refusals: nothing is sent
    for words, why in (
        (("a", "--entry", "0"), "entry 0 is not running on a: it ended (killed by operator (SIGTERM))"),
        (("a", "--entry", "99"), "entry 99 is not running on a: it has not started (or is no entry"),
        (("--all", "--entry", "3"), "entry 3 runs on no VM"),
        (("a", "--entry", "1", "--signal", "STOP"), "invalid choice: 'STOP'"),
    ):
        res = env.cli("kill", *words)
        assert res.returncode == 2 and why in res.stderr, (words, res.stderr)
    assert len(env.events("a", "result")) == 3 + 1  # the schedule's and one answer per kill sent


def test_a_vm_not_connected_is_refused(tmp_path: Any) -> None:
    env = HostEnv({"a": SCHEDULE[:1]}, start_buffer=0.5)
    try:
        env.start_host()
        agent = env.start_agent("a")
        pid = env.wait_event("a", "entry_started", index=0)["event"]["data"]["pid"]
        agent.kill()  # the agent dies; its entry's process lives on
        agent.wait()
        env.wait_for(lambda: not env.status()["vms"][0]["connected"], "the host sees a gone")
        res = env.cli("kill", "a", "--entry", "0")
        assert res.returncode == 2
        assert "a is not connected for " in res.stderr and "nothing is sent" in res.stderr
    finally:
        psutil.Process(pid).kill()
        env.close()


def test_a_forged_kill_on_the_topic_is_refused_when_the_host_signs() -> None:
    env = HostEnv({"a": SCHEDULE[:2]}, start_buffer=0.5, transport="mqtt")
    rogue = None
    try:
        keys, _host_key, _other = _signed_mqtt_host(env)
        env.start_agent("a", "--public-key", str(keys / "host.pub"))
        pid = env.wait_event("a", "entry_started", index=0)["event"]["data"]["pid"]
        rogue = Rogue(env)
        forged = {"index": 0, "signal": "KILL", "grace": 0, "by": "rogue"}
        rogue.send(Event(KILL, time.time(), "rogue-kill", forged))
        refused = env.wait_event("a", "control_refused", id="rogue-kill")["event"]["data"]
        assert "refused kill event 'rogue-kill': unsigned" in refused["details"]
        time.sleep(1.0)
        assert psutil.Process(pid).is_running() and not env.events("a", "entry_exited")
        res = env.cli("kill", "a", "--entry", "0", "--signal", "HUP")  # the host's own, signed
        assert res.returncode == 0, res.stderr
        ended = env.wait_event("a", "entry_exited", index=0)["event"]["data"]
        assert ended["details"] == "killed by operator (SIGHUP)" and ended["ended_by"] == "operator"
        env.wait_event("a", "entry_exited", index=1, status="success")
    finally:
        if rogue is not None:
            rogue.close()
        env.close()


@pytest.mark.parametrize("transport", ["unix", "mqtt"])
def test_timeouts_end_a_stage_entry_and_a_positive_one(transport: str) -> None:
    schedule = [
        {"start_time": -5, "executable": "/bin/sh", "arguments": TREE, "timeout": 1},
        {"start_time": -1, "executable": "/bin/echo", "arguments": "next stage"},
        {"start_time": 1, "executable": "/bin/sleep", "arguments": "1000"},  # the host's default bounds it
    ]
    env = HostEnv({"a": schedule}, start_buffer=0.5, transport=transport)
    try:
        env.start_host("--default-timeout", "1.5")
        env.start_agent("a")
        tree = _tree(env, "a", 0)
        first = env.wait_event("a", "entry_exited", index=0)["event"]["data"]
        assert first["ended_by"] == "timeout" and first["status"] == "timeout" and first["timeout"] == 1
        assert first["details"] == "timed out after 1 s (SIGTERM)" and first["signal"] == 15
        assert env.wait_for(lambda: _gone(tree), "the timed-out entry's tree gone")
        env.wait_event("a", "entry_exited", index=1, status="success")  # the next stage ran
        last = env.wait_event("a", "entry_exited", index=2)["event"]["data"]
        assert last["ended_by"] == "timeout" and last["timeout"] == 1.5
        assert last["duration"] >= 1.5
        env.wait_for(lambda: env.status()["vms"][0]["state"] == "complete", "a completes")
        assert env.status()["vms"][0]["failures"] == 0
    finally:
        env.close()
