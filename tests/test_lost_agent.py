"""A VM whose agent is gone is ``lost`` in every view, and recovers when it comes back.

A real ``vmr-host serve --console --lost-after 2`` and real agents over unix sockets, then over
a real mosquitto (the killed agent's last will): vm1's
agent is killed with SIGKILL in positive time while its entry runs. ``status --json`` says
``lost`` with its last-seen time, the text status shows it as a problem with the hint (and
exits 1), the REST API lists it under ``?problems=1``, ``/metrics`` (parsed with
prometheus-client's parser) counts it lost; vm2, whose agent lives on, is never lost. vm1's
agent started again: no longer lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.hostenv import HostEnv
from tests.test_console_api import Api

CONFIGURED = {"start_time": -5, "executable": "/bin/echo", "arguments": "configured"}
LONG = {"start_time": 1, "executable": "/bin/sleep", "arguments": "20"}


@pytest.fixture(params=["unix", "mqtt"])
def env(request: pytest.FixtureRequest) -> Iterator[HostEnv]:
    """Unix sockets (the host sees the socket close), or a real mosquitto (the killed agent's
    last will says ``offline``)."""
    e = HostEnv(
        {"vm1": [CONFIGURED, LONG], "vm2": [CONFIGURED, LONG]}, start_buffer=1.0, transport=request.param
    )
    yield e
    e.close()


def _cli(env: HostEnv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", *args, "--logs", str(env.logs)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _vm(env: HostEnv, name: str) -> Dict[str, Any]:
    res = _cli(env, "status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return next(v for v in json.loads(res.stdout)["vms"] if v["vm"] == name)


def _metrics(api: Api) -> Dict[str, Any]:
    res = requests.get(api.url + "/metrics", timeout=30)
    assert res.status_code == 200, res.text
    return {f.name: f for f in text_string_to_metric_families(res.text)}


def test_a_killed_agent_is_lost_everywhere_and_recovers_when_it_comes_back(env: HostEnv) -> None:
    env.start_host("--console", "127.0.0.1:0", "--lost-after", "2")
    api = Api(env)
    for vm in ("vm1", "vm2"):
        env.start_agent(vm)
    for vm in ("vm1", "vm2"):
        env.wait_event(vm, "entry_started", index=1)  # positive time, the long entry running
    agent = env.agents["vm1"]
    agent.kill()  # SIGKILL: no goodbye
    agent.wait(timeout=30)

    lost = env.wait_for(lambda: v if (v := _vm(env, "vm1"))["state"] == "lost" else None, "vm1 lost")
    assert lost["problem"] and not lost["connected"] and lost["last_seen"] is not None
    assert lost["gone_for"] >= 2.0 and lost["lost_after"] == 2.0
    assert _vm(env, "vm2")["state"] == "running"  # alive: never lost between two heartbeats

    text = _cli(env, "status")
    assert text.returncode == 1, text.stdout + text.stderr  # someone is needed
    lines = text.stdout.splitlines()
    assert any("1 lost" in line for line in lines), text.stdout
    hint = [line for line in lines if line.startswith("vm1 is lost: its agent was last heard from ")]
    assert len(hint) == 1 and "(t=+" in hint[0] and "vmr-host logs vm1" in hint[0], text.stdout
    assert "vm1" in _cli(env, "status", "--state", "lost").stdout

    problems = api.json("/api/v1/vms", problems="1")["vms"]
    assert [(r["vm"], r["state"]) for r in problems] == [("vm1", "lost")]
    x = api.json("/api/v1/experiment")
    assert x["counts"].get("lost") == 1 and x["problems"] == 1, x

    m = _metrics(api)
    counts = {s.labels["state"]: s.value for s in m["vmr_vms"].samples}
    assert counts["lost"] == 1.0 and counts["running"] == 1.0
    states = {s.labels["vm"]: s.labels["state"] for s in m["vmr_vm_state"].samples if s.value == 1.0}
    assert states == {"vm1": "lost", "vm2": "running"}

    env.start_agent("vm1")  # the agent is back
    back = env.wait_for(lambda: v if (v := _vm(env, "vm1"))["state"] != "lost" else None, "vm1 back")
    assert back["connected"] and not (back["problem"] and back["state"] == "lost")
    assert "vm1 is lost" not in _cli(env, "status").stdout
    assert not [r for r in api.json("/api/v1/vms", problems="1")["vms"] if r["state"] == "lost"]
