"""The start over MQTT as one retained message per host, real mosquitto.

A host publishes its start once, retained, on ``vmr/E/_hosts/<host>/start`` (signed for every
VM of its run with a key); every agent reads every host's, and takes only its own host's run's
(:class:`vmr_handler.core.wire.runs.StartGate`). VMs whose agent has not shown that the broker lets
it read that topic (older agents, an ACL from before it, VMs never seen) still get it on their
own topics. Late joiners and agents back while the host is away take the retained one. Real ``vmr-host
serve`` and ``vmr-handler run`` processes (:class:`tests.hostenv.HostEnv`); the pure rules
(:func:`signed_for`, the gate holding one start per run) at the end. Several hosts sharing
the broker, each VM taking its own host's run's start: ``tests/test_mqtt_runs.py``. Who may
read and write those topics under ``vmr-host mqtt-config``'s ACL: ``tests/test_mqtt_acl.py``.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from tests.broker import Broker, free_port
from tests.hostenv import WAIT, HostEnv
from tests.test_mqtt_secure import _agent as secure_agent
from tests.test_signed_control import _keygen
from vmr_handler.core.errors import SignatureError
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import RESUME, START_TIME
from vmr_handler.core.wire.runs import EVERY_VM_OF_RUN, MAX_HELD, StartGate, signed_for
from vmr_handler.core.wire.signing import Verifier, generate_keypair, sign

#: ``mqtt_env``: makes an experiment over its own broker
MakeEnv = Callable[..., HostEnv]

FAST = [
    {"start_time": -1, "executable": "sleep", "arguments": "0.2"},
    {"start_time": 1, "executable": "/bin/echo", "arguments": "fires"},
]


class Watch:
    """Every message on ``vmr/<experiment>/#`` from now on (a paho client of its own)."""

    def __init__(self, port: int, experiment: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.got: List[Tuple[str, bytes]] = []
        self.lock = threading.Lock()
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"watch-{uuid.uuid4().hex[:8]}")
        self.client.on_connect = lambda c, *_: c.subscribe(f"vmr/{experiment}/#", qos=1)
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert subscribed.wait(10), "the watcher never subscribed"

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        with self.lock:
            self.got.append((msg.topic, bytes(msg.payload)))

    def starts(self) -> List[Tuple[str, Dict[str, Any]]]:
        """``(topic, start_time event)`` of every start the host sent, on any topic, in order."""
        with self.lock:
            got = [(t, p) for t, p in self.got if t.endswith(("/down", "/start"))]
        return [(topic, ev) for topic, payload in got for ev in _events(payload) if ev["type"] == START_TIME]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _events(payload: bytes) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for line in payload.splitlines():
        if line.strip():
            out += json.loads(line)["events"]
    return out


def _peek(port: int, topic: str) -> Optional[bytes]:
    """The retained message on ``topic`` (None when there is none within 1 s)."""
    from tests.test_mqtt_runs import _peek as peek

    return peek(port, topic)


def _retained_start(env: HostEnv, topic: str) -> Optional[Dict[str, Any]]:
    assert env.broker is not None
    payload = _peek(env.broker.port, topic)
    return _events(payload)[0] if payload else None


def _until(pred: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """``pred()`` once true (no host needed, unlike ``HostEnv.wait_for``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _journal(env: HostEnv, vm: str) -> Dict[str, Any]:
    try:
        return json.loads((env.state(vm) / "journal.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def _start_sets(env: HostEnv, vm: str) -> List[float]:
    return [r["event"]["data"]["start_time"] for r in env.events(vm, "start_time_set")]


@pytest.fixture
def mqtt_env() -> Iterator[MakeEnv]:
    """Makes an experiment over its own mosquitto (``HostEnv(schedules, start_buffer)``);
    every one made is closed at the end of the test."""
    made: List[HostEnv] = []

    def make(schedules: Dict[str, Any], start_buffer: float) -> HostEnv:
        made.append(HostEnv(schedules, start_buffer, transport="mqtt"))
        return made[-1]

    yield make
    for env in made:
        env.close()


# --------------------------------------------------------------------------- one message
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_one_retained_message_brings_the_start_to_every_vm(mqtt_env: MakeEnv, signed: bool) -> None:
    env = mqtt_env({"a": FAST, "b": FAST}, 1.0)
    assert env.broker is not None
    watch = Watch(env.broker.port, env.experiment)
    try:
        keys = _keygen(env.root / "keys") if signed else None
        env.start_host("--host-id", "h1", *(["--signing-key", str(keys / "host.key")] if keys else []))
        for vm in "ab":
            env.start_agent(vm, *(["--public-key", str(keys / "host.pub")] if keys else []))
        for vm in "ab":
            env.wait_event(vm, "entry_started", index=1)
        status = env.status()
        start, run = status["experiment"]["start_time"], status["experiment"]["run_id"]
        starts = watch.starts()
    finally:
        watch.close()
    # one message for both VMs, on the host's start topic; nothing on the VMs' own topics
    topic = f"vmr/{env.experiment}/_hosts/h1/start"
    assert [t for t, _ev in starts] == [topic]
    event = starts[0][1]
    assert event["data"]["start_time"] == start and event["data"]["run"] == run
    if signed:
        assert event["data"]["signature"]["vm"] == EVERY_VM_OF_RUN
    for vm in "ab":
        assert _start_sets(env, vm) == [start]  # each took (and verified) that one message
        assert not env.events(vm, "control_refused")
    assert all(vm["handshakes"] == 1 for vm in status["vms"]), status["vms"]  # (no start at a 2nd one)
    retained = _retained_start(env, topic)
    assert retained is not None and retained["id"] == event["id"]
    assert _peek(env.broker.port, f"vmr/{env.experiment}/a/start") is None
    assert "for 2 VM(s), and on the own start topic of 0 VM(s)" in env.host_log()


def test_vms_not_known_to_read_it_get_the_start_on_their_own_topics(mqtt_env: MakeEnv) -> None:
    """An older agent (its presence without ``host_start``) and a VM never seen: their own
    retained ``start`` topic, as before (the host's start topic is new to them)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    env = mqtt_env({"a": FAST, "old": FAST, "never": FAST}, 0.5)
    assert env.broker is not None
    old = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="old-agent")
    old.connect("127.0.0.1", env.broker.port)
    old.loop_start()
    try:
        presence = json.dumps({"state": "online", "vm": "old", "boot_id": "b1"}).encode()
        old.publish(f"vmr/{env.experiment}/old/presence", presence, qos=1, retain=True).wait_for_publish(10)
        env.start_host("--host-id", "h1", "--expect", "a")
        env.start_agent("a")
        env.wait_event("a", "entry_started", index=1)
        experiment = env.status()["experiment"]
    finally:
        old.loop_stop()
        old.disconnect()
    for vm in ("old", "never"):
        own = _retained_start(env, f"vmr/{env.experiment}/{vm}/start")
        assert own is not None and own["data"]["start_time"] == experiment["start_time"], vm
        assert own["data"]["run"] == experiment["run_id"]
    assert _peek(env.broker.port, f"vmr/{env.experiment}/a/start") is None
    assert "for 1 VM(s), and on the own start topic of 2 VM(s)" in env.host_log()


# --------------------------------------------------------------------------- mqtt-config's ACL
@pytest.mark.parametrize("acl", ["current", "before-issue-16"])
def test_the_start_takes_the_way_the_brokers_acl_allows(mqtt_env: MakeEnv, acl: str) -> None:
    """Agents count on the host's start topic only once the broker delivered something from
    it: with an ACL of ``mqtt-config`` from before that topic (no VM may read it, and
    mosquitto says nothing about it), the host sends them the start on their own topics."""
    env = mqtt_env({"a": FAST, "b": FAST}, 1.0)
    out, port = env.root / "mq", free_port()
    res = subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "mqtt-config", "--experiment", "e16", "--vms", "a,b",
         "--out", str(out), "--port", str(port), "--user", getpass.getuser()],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    if acl == "before-issue-16":  # without the VMs' user blocks (a read of vmr/e16/_hosts/+/start)
        lines = (out / "acl").read_text().splitlines()
        kept = [
            line for line in lines if line not in ("user a", "user b", "topic read vmr/e16/_hosts/+/start")
        ]
        assert len(kept) == len(lines) - 4
        (out / "acl").write_text("\n".join(kept) + "\n")
    assert env.broker is not None
    env.broker.close()  # the env's anonymous broker: this one runs mqtt-config's files instead
    # (the env stops it at the end, as its own)
    env.broker, env.experiment = Broker(root=out, config=out / "mosquitto.conf", port=port).start(), "e16"
    env.start_host("--credentials", str(out / "host" / "vmr-host.yaml"), "--host-id", "h1")
    for vm in "ab":
        secure_agent(env, vm, out / "vms" / f"{vm}.yaml")
    for vm in "ab":
        env.wait_event(vm, "entry_started", index=1)
    start = env.status()["experiment"]["start_time"]
    assert all(_start_sets(env, vm) == [start] for vm in "ab")
    counted = 2 if acl == "current" else 0
    assert f"for {counted} VM(s), and on the own start topic of {2 - counted} VM(s)" in env.host_log()


# --------------------------------------------------------------------------- host away
def test_an_agent_back_while_its_host_is_away_takes_the_retained_start(mqtt_env: MakeEnv) -> None:
    """b was welcomed (it knows its host's run), went away before the start, and comes back
    after its host was killed: the host's retained start is the only place to learn it."""
    late = [{"start_time": -1, "executable": "/bin/true"}, {"start_time": 60, "executable": "/bin/true"}]
    env = mqtt_env({"a": FAST, "b": late}, 0.5)
    env.start_host("--host-id", "h1", "--expect", "a")
    b = env.start_agent("b")
    run_file = env.state("b") / "host-run.json"
    env.wait_event("b", "configured")  # welcomed (it knows the run), its schedule stored and run
    b.kill()  # its last will says offline (and that its agent reads the host's start)
    b.wait(timeout=WAIT)
    assert _journal(env, "b").get("start_time") is None
    env.start_agent("a")
    start = env.wait_for(lambda: env.status()["experiment"]["start_time"], "the start set")
    run = env.status()["experiment"]["run_id"]
    env.wait_event("a", "start_time_set")
    env.kill_host()
    assert env.broker is not None
    assert _peek(env.broker.port, f"vmr/{env.experiment}/b/start") is None  # b reads the host's
    env.start_agent("b")
    _until(lambda: _journal(env, "b").get("start_time") == start, "b taking the start while the host is away")
    assert json.loads(run_file.read_text()) == {"run": run}


# --------------------------------------------------------------------------- the pure rules
def _start(run: Optional[str], ident: str = "start-1") -> Event:
    data: Dict[str, Any] = {"start_time": 1000.0}
    if run is not None:
        data["run"] = run
    return Event(START_TIME, 1.0, ident, data)


def test_a_start_signed_for_every_vm_of_its_run_is_verified_by_each_vm() -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    private_pem, _public = generate_keypair()
    key = load_pem_private_key(private_pem, None)
    now = time.time()
    verifier = Verifier(key.public_key(), None)  # type: ignore[union-attr, arg-type]
    everyone = sign(key, _start("run-1"), EVERY_VM_OF_RUN, now)  # type: ignore[arg-type]
    for vm in ("a", "b"):
        assert signed_for(everyone, vm) == EVERY_VM_OF_RUN
        verifier.check(everyone, signed_for(everyone, vm), now)
    # per VM as before: a start signed for a is a's only
    for_a = sign(key, _start("run-1"), "a", now)  # type: ignore[arg-type]
    assert signed_for(for_a, "b") == "b"
    with pytest.raises(SignatureError, match="signed for VM 'a', this is 'b'"):
        verifier.check(for_a, signed_for(for_a, "b"), now)
    # only a start that names its run, and never another type, may be signed for every VM
    for event in (_start(None, "start-2"), Event(RESUME, 1.0, "resume-1", {"at": 5.0})):
        forged = sign(key, event, EVERY_VM_OF_RUN, now)  # type: ignore[arg-type]
        assert signed_for(forged, "a") == "a"
        with pytest.raises(SignatureError, match="signed for VM '\\*', this is 'a'"):
            verifier.check(forged, signed_for(forged, "a"), now)
    # the run is signed: the same signature on another run's start is refused
    moved = Event(START_TIME, 1.0, "start-3", {**everyone.data, "run": "run-2"})
    with pytest.raises(SignatureError, match="bad signature"):
        verifier.check(moved, signed_for(moved, "a"), now)


def test_the_gate_holds_the_newest_start_of_each_run_until_the_host_is_known() -> None:
    gate = StartGate(None)
    runs = [f"run-{i}" for i in range(MAX_HELD + 5)]  # more hosts sharing a broker than held
    for run in runs:
        assert not gate.offer(_start(run, f"{run}-old"))
        assert not gate.offer(_start(run, f"{run}-new"))
    mine = runs[-3]
    assert [e.id for e in gate.welcomed(mine)] == [f"{mine}-new"]
    again = StartGate(None)
    assert not again.offer(_start(runs[0]))
    for run in runs[1 : MAX_HELD + 1]:
        again.offer(_start(run))
    assert again.welcomed(runs[0]) == []  # the oldest run held was dropped for the newest
