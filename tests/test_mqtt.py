"""MQTT-only behaviour end to end, real mosquitto, real hosts and agents.

The behaviour both transports share is tested over both in ``test_connected.py``; here is
what only the broker brings: a broker restart mid-experiment, several ``vmr-host`` processes
sharing one broker with one coordinator, a VM that comes after the start, and a hostile
client of the broker (isolation between VMs by ACL is `test_mqtt_acl.py`).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, List, Tuple

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


class Sniffer:
    """A paho client reading every topic of an experiment: the event types it saw, per topic."""

    def __init__(self, env: HostEnv) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        from vmr_handler.core.wire.protocol import FrameDecoder

        assert env.broker is not None
        self.seen: List[Tuple[str, str]] = []  # (topic, event type)
        self.payloads: List[bytes] = []  # every message, as it crossed
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sniffer-{time.monotonic_ns()}")

        def note(_c: Any, _u: Any, msg: Any) -> None:
            self.payloads.append(bytes(msg.payload))
            frames = FrameDecoder().feed(bytes(msg.payload).rstrip(b"\n") + b"\n")
            self.seen.extend((msg.topic, ev.type) for m in frames for ev in m.events)

        self.client.on_message = note
        self.client.connect("127.0.0.1", env.broker.port)
        self.client.subscribe(f"vmr/{env.experiment}/#", 1)
        self.client.loop_start()

    def types(self) -> List[str]:
        return [t for _topic, t in self.seen]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_a_restarted_host_sends_no_start_and_no_schedule_a_vm_already_has(envs: List[HostEnv]) -> None:
    """The agent's journal holds the schedule and the start, the broker the retained start:
    after the host's restart only the handshake (hello, welcome) crosses the broker, without
    the connect prefix a byte stream needs."""
    sched = [{"start_time": -1, "executable": "/bin/true"}, {"start_time": 60, "executable": "/bin/true"}]
    env = HostEnv({"a": sched}, start_buffer=0.5, transport="mqtt")
    envs.append(env)
    env.start_host()
    env.start_agent("a")
    env.wait_event("a", "experiment_started")
    sniffer = Sniffer(env)
    try:
        env.wait_for(lambda: "start_time" in sniffer.types() or None, "the retained starts read")
        env.kill_host()
        del sniffer.seen[:], sniffer.payloads[:]
        env.start_host()
        env.wait_for(lambda: "welcome" in sniffer.types() or None, "the handshake after the restart")
        env.wait_for(lambda: env.status()["vms"][0]["connected"] or None, "a connected")
        time.sleep(1.0)  # whatever the restart publishes has reached the broker by now
        types = sniffer.types()
        assert "start_time" not in types and "schedule" not in types, sniffer.seen
        assert types.count("welcome") == 1, sniffer.seen
        # each message is whole over MQTT: no connect prefix (a lone newline) crosses either way
        assert b"\n" not in sniffer.payloads and b"" not in sniffer.payloads, sniffer.payloads
    finally:
        sniffer.close()


def test_an_idle_agent_over_mqtt_trades_no_heartbeats_is_never_silent_and_is_lost_by_its_will(
    envs: List[HostEnv],
) -> None:
    """Liveness over MQTT is the broker's (keep-alive, the retained last will on presence):
    with heartbeats due every 0.5 s on both sides, none crosses the broker, and the host never
    calls the idle VM silent; killed (SIGKILL), its will says offline after 1.5 keep-alives
    and the VM is lost after ``--lost-after``."""
    import paho.mqtt.client as mqtt
    import yaml
    from paho.mqtt.enums import CallbackAPIVersion

    from vmr_handler.core.wire.protocol import FrameDecoder

    sched = [
        {"start_time": -1, "executable": "/bin/true"},
        {"start_time": 1, "executable": "sleep", "arguments": "60"},
    ]
    env = HostEnv({"a": sched}, start_buffer=0.5, transport="mqtt")
    envs.append(env)
    config = env.root / "agent.yaml"
    config.write_text(yaml.safe_dump({"heartbeat": 0.5, "peer_timeout": 1, "keepalive": 2}))
    env.start_host("--heartbeat", "0.5", "--silent-after", "1", "--lost-after", "2")
    env.start_agent("a", "--config", str(config))
    env.wait_event("a", "entry_started", index=1)
    assert env.broker is not None
    seen: List[str] = []
    sniffer = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="sniffer")
    sniffer.on_message = lambda _c, _u, msg: seen.extend(
        ev.type for m in FrameDecoder().feed(msg.payload + b"\n") for ev in m.events
    )
    sniffer.connect("127.0.0.1", env.broker.port)
    sniffer.subscribe([(f"vmr/{env.experiment}/a/up", 1), (f"vmr/{env.experiment}/a/down", 1)])
    sniffer.loop_start()
    try:
        time.sleep(5.0)  # ten heartbeat periods of either side
        vm = env.status()["vms"][0]
        assert vm["connected"] and vm["silent"] is False and vm["state"] == "running", vm
        assert "heartbeat" not in seen, seen
        assert "host silent" not in env.agent_log("a")
        assert "peer silent" not in (env.logs / "a.log").read_text()
        env.agents["a"].kill()  # no goodbye: the broker's will says offline
        env.agents["a"].wait(timeout=30)
        lost = env.wait_for(lambda: v if (v := env.status()["vms"][0])["state"] == "lost" else None, "a lost")
        assert not lost["connected"] and lost["gone_for"] >= 2.0, lost
    finally:
        sniffer.loop_stop()
        sniffer.disconnect()
