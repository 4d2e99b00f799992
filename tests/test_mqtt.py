"""MQTT-only behaviour end to end, real mosquitto, real hosts and agents.

The behaviour both transports share is tested over both in ``test_connected.py``; here is
what only the broker brings: a broker restart mid-experiment, several ``vmr-host`` processes
sharing one broker with one coordinator, a VM that comes after the start, and a hostile
client of the broker (isolation between VMs by ACL is `test_mqtt_acl.py`).
"""

from __future__ import annotations

import time
from typing import Iterator, List

import pytest

from tests.hostenv import HostEnv


@pytest.fixture
def envs() -> Iterator[List[HostEnv]]:
    made: List[HostEnv] = []
    yield made
    for env in reversed(made):  # the env that owns the broker stops it last
        env.close()


def _lines(env: HostEnv, vm: str, index: int) -> List[str]:
    recs = [r["event"]["data"] for r in env.events(vm, "output")]
    recs = [d for d in recs if d["index"] == index and d["stream"] == "stdout"]
    assert len({d["seq"] for d in recs}) == len(recs), "a line was logged twice"
    return [d["line"] for d in sorted(recs, key=lambda d: d["seq"])]


def test_two_hosts_share_one_broker_and_one_start(envs: List[HostEnv]) -> None:
    fast = [
        {"start_time": -1, "executable": "sleep", "arguments": "0.2"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "a fires"},
    ]
    slow = [
        {"start_time": -1, "executable": "sleep", "arguments": "3"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "b fires"},
    ]
    h1 = HostEnv({"a": fast}, start_buffer=1.0, transport="mqtt")
    envs.append(h1)
    h2 = HostEnv({"b": slow}, start_buffer=1.0, transport="mqtt", broker=h1.broker, experiment=h1.experiment)
    envs.append(h2)
    h1.start_host("--coordinator", "--peers", "h2", "--host-id", "h1")
    h2.start_host("--member", "--host-id", "h2")
    h1.start_agent("a")
    h2.start_agent("b")
    h1.wait_event("a", "configured")
    # the coordinator waits for b, a VM it does not serve, once h2 announced it
    h1.wait_for(lambda: h1.status()["experiment"]["waiting_for"] == ["b"], "coordinator waiting for b")
    refused = h2.cli("release")
    assert refused.returncode != 0 and "coordinator" in refused.stderr + refused.stdout
    b_conf = h2.wait_event("b", "configured")
    a_fire = h1.wait_event("a", "entry_started", index=1)["event"]["data"]
    b_fire = h2.wait_event("b", "entry_started", index=1)["event"]["data"]
    assert a_fire["scheduled"] == b_fire["scheduled"]  # one experiment start for both hosts
    status1, status2 = h1.status(), h2.status()
    start = status1["experiment"]["start_time"]
    assert start == status2["experiment"]["start_time"]
    assert a_fire["scheduled"] == pytest.approx(start + 1.0)
    # the start is the slowest VM's configured time (b, on the other host) + the buffer
    assert start == pytest.approx(status2["experiment"]["configured"]["b"] + 1.0, abs=1e-6)
    assert b_conf["host_received"] <= start
    assert status1["peers"] == {"h2": ["b"]}
    assert [v["vm"] for v in status1["vms"]] == ["a"]  # each host logs only its own VMs
    assert not h1.events("b") and not h2.events("a")


def test_broker_restart_mid_experiment_loses_and_duplicates_nothing(envs: List[HostEnv]) -> None:
    sched = [
        {
            "start_time": -2,
            "executable": "/bin/sh",
            "arguments": "-c 'for i in $(seq 1 400); do echo line $i; sleep 0.01; done'",
        },
        {"start_time": 1, "executable": "/bin/echo", "arguments": "after"},
    ]
    env = HostEnv({"a": sched, "b": sched}, start_buffer=1.0, transport="mqtt")
    envs.append(env)
    env.start_host()
    env.start_agent("a")
    env.start_agent("b")
    env.wait_event("a", "output", index=0, line="line 50")
    assert env.broker is not None
    env.broker.restart(down_for=2.0)  # with persistence: sessions and retained messages survive
    for vm in ("a", "b"):
        env.wait_event(vm, "output", index=1, line="after")
        env.wait_event(vm, "schedule_complete")
        assert _lines(env, vm, 0) == [f"line {i}" for i in range(1, 401)]
        ids = [r["event"]["id"] for r in env.events(vm)]
        assert len(ids) == len(set(ids))
    starts = {env.wait_event(vm, "entry_started", index=1)["event"]["data"]["scheduled"] for vm in "ab"}
    assert len(starts) == 1


def test_late_vm_learns_the_retained_start_from_the_broker(envs: List[HostEnv]) -> None:
    sched = [{"start_time": -1, "executable": "/bin/true"}, {"start_time": 1, "executable": "/bin/true"}]
    env = HostEnv({"early": sched, "late": sched}, start_buffer=0.5, transport="mqtt")
    envs.append(env)
    env.start_host("--expect", "early")
    env.start_agent("early")
    env.wait_event("early", "entry_started", index=1)
    time.sleep(0.5)
    env.start_agent("late")  # after the start time: learns it at once, fires overdue with lateness
    late = env.wait_event("late", "entry_started", index=1)["event"]["data"]
    early = env.wait_event("early", "entry_started", index=1)["event"]["data"]
    assert late["scheduled"] == early["scheduled"]
    assert late["lateness"] > 0.5
    sources = [r["event"]["data"]["source"] for r in env.events("late", "start_time_set")]
    assert sources == ["host"]


def test_hostile_broker_client_does_not_disturb_the_host(envs: List[HostEnv]) -> None:
    import random

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    sched = [
        {"start_time": -1, "executable": "sleep", "arguments": "1"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "still fine"},
    ]
    env = HostEnv({"a": sched}, start_buffer=0.5, transport="mqtt")
    envs.append(env)
    env.start_host()
    assert env.broker is not None
    rogue = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="rogue")
    rogue.connect("127.0.0.1", env.broker.port)
    rogue.loop_start()
    base = f"vmr/{env.experiment}"
    rnd = random.Random(3)
    try:
        env.start_agent("a")
        env.wait_event("a", "stage_started")
        for topic, payload in [
            (f"{base}/nobody/up", rnd.randbytes(5000)),  # a VM this experiment does not have
            (f"{base}/a/presence", b"{not json"),
            (f"{base}/a/presence", b'{"state": "offline"}' + b" " * 10_000),  # oversize presence
            (f"{base}/a/up", rnd.randbytes(300_000) + b"\n"),  # garbage in a's own stream
            (f"{base}/_hosts/x/state", b'{"expected": ["a"], "configured": {"a": 1}}'),  # not a peer
            (f"{base}/_hosts/_start", b'{"start_time": 1}'),  # this host is no member
        ]:
            rogue.publish(topic, payload, qos=1).wait_for_publish(10)
        out = env.wait_event("a", "output", index=1)
        assert out["event"]["data"]["line"] == "still fine"
        status = env.status()
        vm = status["vms"][0]
        assert vm["frames"]["malformed"] >= 1
        assert status["experiment"]["start_time"] is not None and status["experiment"]["start_time"] > 1e9
        assert env.host is not None and env.host.poll() is None
    finally:
        rogue.loop_stop()
        rogue.disconnect()


def test_bridge_works_with_a_socket_above_fd_1024(tmp_path) -> None:
    """A host with ~500 VMs holds > 1024 descriptors (two logs per VM) before it connects:
    its broker socket must still work (paho's own thread waits in select(), which cannot)."""
    import asyncio
    import os
    import resource

    from tests.broker import Broker
    from vmr_handler.transports.mqtt.bridge import PahoBridge
    from vmr_handler.transports.mqtt.options import MqttOptions

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1400
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"open-files hard limit {hard} < {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    broker = Broker(tmp_path / "b").start()
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:

        async def round_trip() -> bytes:
            opts = MqttOptions(broker=broker.url, experiment="fd")
            bridge = PahoBridge(opts, "fd-test", [("vmr/fd/x/down", 1)])
            await bridge.connect()
            assert bridge.client.socket().fileno() > 1024
            await bridge.publish("vmr/fd/x/down", b"over 1024\n")
            item = await asyncio.wait_for(bridge.messages.get(), 10)
            bridge.close()
            assert item is not None
            return item[1]

        assert asyncio.run(round_trip()) == b"over 1024\n"
    finally:
        for fd in held:
            os.close(fd)
        broker.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_hellos_of_an_outage_are_not_replayed_to_a_restarted_host(envs: List[HostEnv]) -> None:
    """While the host is away the agent says hello every heartbeat; the broker keeps the
    host's session, so without an expiry a restarted host would get every one of them and
    run as many handshakes. They expire (MQTT v5 message expiry = 2 heartbeats)."""
    import yaml

    sched = [{"start_time": -1, "executable": "/bin/true"}, {"start_time": 60, "executable": "/bin/true"}]
    env = HostEnv({"a": sched}, start_buffer=0.5, transport="mqtt")
    envs.append(env)
    config = env.root / "agent.yaml"
    config.write_text(yaml.safe_dump({"heartbeat": 1, "peer_timeout": 2}))
    env.start_host("--heartbeat", "1", "--silent-after", "3")
    env.start_agent("a", "--config", str(config))
    env.wait_event("a", "experiment_started")
    env.kill_host()
    time.sleep(12.0)  # ~10 hellos and heartbeats from the agent meanwhile
    env.start_host("--heartbeat", "1", "--silent-after", "3")
    time.sleep(4.0)
    vm = env.status()["vms"][0]
    assert vm["connected"], vm
    assert vm["handshakes"] <= 3, vm  # the reconnect's own, not one per queued hello
    assert vm["refused"]["hello_flood"] == 0, vm
