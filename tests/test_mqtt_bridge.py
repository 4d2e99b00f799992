"""Two brokers, bridged: a coordinator host on broker A, a member host on broker B.

Both brokers are real mosquitto processes started by the test from what ``vmr-host
mqtt-config`` wrote: A with ``--bridge-member h2`` (a bridge user confined to the
coordination topics), B with ``--bridge-to A --bridge-credentials A/bridges/h2.yaml``
(mosquitto's own bridge). First what the bridge carries and what it must not (real paho
clients, the ordering rule of ``test_mqtt_acl.py``: a client that receives a marker sent
after a message it must not see would already have had that message), then one experiment
across both brokers with real hosts and agents: one start for every VM, RESUME and
``schedule add`` to the member's VMs, and a restart of A, then of B, losing and
duplicating nothing.
"""

from __future__ import annotations

import os
import stat
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import yaml

from tests.broker import Broker, free_port
from tests.hostenv import HostEnv
from tests.test_mqtt_acl import FAILURE, NOT_AUTHORIZED, Client, creds, generate, mqtt_config
from tests.test_mqtt_secure import _agent as secure_agent

E = "e1"
START = f"vmr/{E}/_hosts/_start"
STATE_H2 = f"vmr/{E}/_hosts/h2/state"


def t(vm: str, leaf: str) -> str:
    return f"vmr/{E}/{vm}/{leaf}"


class Pair:
    """Broker A (coordinator h1; VMs a1, a2) and broker B (member h2; VMs b1, b2), bridged,
    both configured by ``mqtt-config`` and run by mosquitto as written."""

    def __init__(self, root: Path, vms_a: str = "a1,a2", vms_b: str = "b1,b2") -> None:
        self.port_a, self.port_b = free_port(), free_port()
        self.a = generate(root / "A", "--experiment", E, "--vms", vms_a, "--host-user", "h1",
                          "--port", str(self.port_a), "--bridge-member", "h2")  # fmt: skip
        self.b = generate(root / "B", "--experiment", E, "--vms", vms_b, "--host-user", "h2",
                          "--port", str(self.port_b), "--bridge-to", f"127.0.0.1:{self.port_a}",
                          "--bridge-credentials", str(self.a / "bridges" / "h2.yaml"))  # fmt: skip
        self.broker_a = Broker(root=self.a, config=self.a / "mosquitto.conf", port=self.port_a).start()
        self.broker_b = Broker(root=self.b, config=self.b / "mosquitto.conf", port=self.port_b).start()
        self.clients: List[Client] = []
        self.wait_bridged()

    def wait_bridged(self, timeout: float = 60.0) -> None:
        """Return once the bridge has subscribed on A (B's broker connects it a moment after it
        starts): a non-retained ping that h1 publishes on A reaches h2 on B."""
        h1, h2 = self.client("A", "host", "h1"), self.client("B", "host", "h2")
        h2.subscribe(START)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                assert h1.publish(START, b"ping") < FAILURE
                if (START, b"ping") in h2.drain(0.3):
                    return
            raise AssertionError(f"the bridge never carried a message: {self.broker_b.errors()}")
        finally:
            h1.close()
            h2.close()
            self.clients.clear()

    def client(self, side: str, kind: str, name: str) -> Client:
        out, port = (self.a, self.port_a) if side == "A" else (self.b, self.port_b)
        doc = creds(out, kind, name)
        c = Client(port, doc["username"], doc["password"])
        self.clients.append(c)
        assert c.connect() == 0, (self.broker_a.errors(), self.broker_b.errors())
        return c

    def close(self) -> None:
        for c in self.clients:
            try:
                c.close()
            except Exception:
                pass
        self.broker_b.close()
        self.broker_a.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    made = Pair(tmp_path)
    try:
        yield made
    finally:
        made.close()


# ------------------------------------------------------------------------------- the files
def test_the_generated_bridge_files(pair: Pair) -> None:
    acl = (pair.a / "acl").read_text()
    assert f"user bridge-h2\ntopic read {START}\ntopic write {STATE_H2}\n" in acl
    bridge = creds(pair.a, "bridges", "h2")
    assert {k: bridge[k] for k in ("experiment", "member", "username")} == {
        "experiment": E, "member": "h2", "username": "bridge-h2"}  # fmt: skip
    assert stat.S_IMODE(os.stat(pair.a / "bridges" / "h2.yaml").st_mode) == 0o600
    conf = (pair.b / "mosquitto.conf").read_text()
    section = conf[conf.index("connection ") :].splitlines()
    assert section[0] == f"connection vmr-{E}-h2"
    assert f"remote_password {bridge['password']}" in section
    assert [line for line in section if line.startswith("topic ")] == [
        f"topic {START} in 1",
        f"topic {STATE_H2} out 1",
    ]
    # the bridge's password is in it: readable by the broker user only
    assert stat.S_IMODE(os.stat(pair.b / "mosquitto.conf").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pair.a / "mosquitto.conf").st_mode) == 0o644
    assert "bridge" not in (pair.b / "acl").read_text()


def test_force_drops_the_bridges_of_an_earlier_configuration(tmp_path: Path) -> None:
    port = str(free_port())
    a = generate(tmp_path / "A", "--experiment", E, "--vms", "a1", "--tls", "--tls-port", port,
                 "--client-certs", "--bridge-member", "h2")  # fmt: skip
    b = generate(tmp_path / "B", "--experiment", E, "--vms", "b1", "--bridge-to", f"127.0.0.1:{port}",
                 "--bridge-credentials", str(a / "bridges" / "h2.yaml"))  # fmt: skip
    assert sorted(p.name for p in (b / "bridge").iterdir()) == ["ca.crt", "client.crt", "client.key"]
    generate(a, "--experiment", E, "--vms", "a1", "--force")
    generate(b, "--experiment", E, "--vms", "b1", "--force")
    assert list((a / "bridges").iterdir()) == [] and "bridge-h2" not in (a / "acl").read_text()
    assert list((b / "bridge").iterdir()) == [] and "connection" not in (b / "mosquitto.conf").read_text()


# --------------------------------------------------------------- what crosses, what does not
def test_the_bridge_carries_the_coordination_topics_both_ways_retained(pair: Pair) -> None:
    h1, h2 = pair.client("A", "host", "h1"), pair.client("B", "host", "h2")
    h2.subscribe(START)
    h1.subscribe(STATE_H2)
    assert h1.publish(START, b"run-1", retain=True) < FAILURE
    assert h2.until(START, b"run-1") == [(START, b"run-1")]
    assert h2.publish(STATE_H2, b"vms", retain=True) < FAILURE
    assert h1.until(STATE_H2, b"vms") == [(STATE_H2, b"vms")]
    # retained on both sides: a host that subscribes later gets them from its own broker
    late_b, late_a = pair.client("B", "host", "h2"), pair.client("A", "host", "h1")
    late_b.subscribe(START)
    late_a.subscribe(STATE_H2)
    assert late_b.until(START, b"run-1") and late_a.until(STATE_H2, b"vms")


def test_no_vm_topic_and_no_other_host_topic_crosses(pair: Pair) -> None:
    h1, h2 = pair.client("A", "host", "h1"), pair.client("B", "host", "h2")
    h1.subscribe(f"vmr/{E}/#")
    h2.subscribe(f"vmr/{E}/#")
    a1, b1 = pair.client("A", "vms", "a1"), pair.client("B", "vms", "b1")
    sent: Dict[str, List[Tuple[str, bytes]]] = {"A": [], "B": []}

    def publish(side: str, client: Client, name: str, payload: bytes, retain: bool = False) -> None:
        assert client.publish(name, payload, retain=retain) < FAILURE, name
        sent[side].append((name, payload))

    # each side writes everything it may on its own broker; only the coordination topics cross
    publish("A", a1, t("a1", "up"), b"a1-report")
    publish("A", a1, t("a1", "presence"), b"a1 online", retain=True)
    publish("B", b1, t("b1", "up"), b"b1-report")
    publish("B", b1, t("b1", "presence"), b"b1 online", retain=True)
    for side, host, vm, host_id in (("A", h1, "a1", "h1"), ("B", h2, "b1", "h2")):
        publish(side, host, t(vm, "down"), b"down " + vm.encode())
        publish(side, host, t(vm, "start"), b"start " + vm.encode(), retain=True)
        publish(side, host, f"vmr/{E}/_hosts/{host_id}/start", b"own start " + side.encode(), True)
        publish(side, host, f"vmr/{E}/_hosts/h3/state", b"h3 on " + side.encode(), True)
    publish("B", h2, START, b"a member's start", retain=True)  # START comes in only: stays on B
    publish("A", h1, STATE_H2, b"h2's state on A", retain=True)  # STATE_H2 goes out only: stays on A
    # markers after all of it, on the two bridged topics
    publish("A", h1, START, b"marker-A")
    publish("B", h2, STATE_H2, b"marker-B")
    got_b = h2.until(START, b"marker-A")
    got_a = h1.until(STATE_H2, b"marker-B")
    got_b += h2.drain()
    got_a += h1.drain()
    assert [item for item in got_b if item not in sent["B"]] == [(START, b"marker-A")], got_b
    assert [item for item in got_a if item not in sent["A"]] == [(STATE_H2, b"marker-B")], got_a


def test_a_vms_credentials_reach_nothing_on_the_other_broker(pair: Pair) -> None:
    for side, kind, name in (
        ("B", "vms", "a1"),
        ("A", "vms", "b1"),
        ("B", "host", "h1"),
        ("A", "host", "h2"),
    ):
        out, port = (pair.a, pair.port_b) if side == "B" else (pair.b, pair.port_a)
        doc = creds(out, kind, name)
        stranger = Client(port, doc["username"], doc["password"])
        pair.clients.append(stranger)
        assert stranger.connect() == NOT_AUTHORIZED, (side, name)
    # nor through its own broker: a1 on A sees nothing of b1's, and cannot write it
    h2, b1 = pair.client("B", "host", "h2"), pair.client("B", "vms", "b1")
    b1.subscribe(t("b1", "down"))
    h2.subscribe(f"vmr/{E}/#")
    a1 = pair.client("A", "vms", "a1")
    a1.subscribe("#", t("b1", "down"), t("b1", "up"), f"vmr/{E}/_hosts/#")
    assert a1.publish(t("b1", "down"), b"forged") == NOT_AUTHORIZED
    assert a1.publish(STATE_H2, b"forged") == NOT_AUTHORIZED
    assert a1.publish(START, b"forged") == NOT_AUTHORIZED
    assert b1.publish(t("b1", "up"), b"b1-report") < FAILURE
    assert h2.publish(t("b1", "down"), b"for b1") < FAILURE
    assert b1.until(t("b1", "down"), b"for b1") == [(t("b1", "down"), b"for b1")]
    h1 = pair.client("A", "host", "h1")
    assert h1.publish(t("a1", "down"), b"marker") < FAILURE
    assert a1.until(t("a1", "down"), b"marker") == [(t("a1", "down"), b"marker")]
    assert [n for n, _ in h2.drain() if "forged" in n] == []


def test_the_bridge_user_reaches_only_the_coordination_topics(tmp_path: Path) -> None:
    """The bridge's credentials (what a compromised member broker holds) on the
    coordinator's broker: its member's announcement and the coordinator's start, nothing else."""
    port = free_port()
    a = generate(tmp_path / "A", "--experiment", E, "--vms", "a1", "--host-user", "h1",
                 "--port", str(port), "--bridge-member", "h2,h3")  # fmt: skip
    broker = Broker(root=a, config=a / "mosquitto.conf", port=port).start()
    clients: List[Client] = []
    try:
        h1_doc, a1_doc, br_doc = creds(a, "host", "h1"), creds(a, "vms", "a1"), creds(a, "bridges", "h2")
        h1, a1, br = (Client(port, d["username"], d["password"]) for d in (h1_doc, a1_doc, br_doc))
        clients += [h1, a1, br]
        for c in clients:
            assert c.connect() == 0, broker.errors()
        h1.subscribe(f"vmr/{E}/#")
        a1.subscribe(t("a1", "down"), t("a1", "start"))
        br.subscribe("#", f"vmr/{E}/+/up", f"vmr/{E}/+/presence", START)
        for name in (t("a1", "down"), t("a1", "start"), t("a1", "up"), START, f"vmr/{E}/_hosts/h3/state",
                     f"vmr/{E}/_hosts/h1/start", f"vmr/{E}/_hosts/h2/start", "vmr/other/x/up"):  # fmt: skip
            assert br.publish(name, b"forged") == NOT_AUTHORIZED, name
        assert br.publish(STATE_H2, b"h2's own") < FAILURE
        assert a1.publish(t("a1", "up"), b"report") < FAILURE
        assert a1.publish(t("a1", "presence"), b"online") < FAILURE
        assert h1.publish(START, b"the start") < FAILURE
        assert br.until(START, b"the start") == [(START, b"the start")]  # and not a1's
        assert h1.until(STATE_H2, b"h2's own")[-1] == (STATE_H2, b"h2's own")
        assert a1.drain() == []
    finally:
        for c in clients:
            c.close()
        broker.close()


def test_a_broker_restart_on_either_side_loses_nothing_that_crosses(pair: Pair) -> None:
    """What is published while the other broker is down crosses once it is back (the bridge's
    sessions are persistent on both sides, and both brokers persist them)."""
    h1, h2 = pair.client("A", "host", "h1"), pair.client("B", "host", "h2")
    h2.subscribe(START)
    h1.subscribe(STATE_H2)
    assert h1.publish(START, b"before") < FAILURE
    h2.until(START, b"before")
    h2.close()  # one session per username: the clients below take these hosts' places
    pair.broker_b.stop()  # the member's broker is down: A keeps the bridge's session
    assert h1.publish(START, b"while B was down", retain=True) < FAILURE
    pair.broker_b.start()
    late = pair.client("B", "host", "h2")
    late.subscribe(START)
    assert _until(late, START, b"while B was down"), pair.broker_b.errors()
    h1.close()
    pair.broker_a.stop()  # the coordinator's broker is down: B queues for the bridge
    assert late.publish(STATE_H2, b"while A was down", retain=True) < FAILURE
    pair.broker_a.start()
    h1_again = pair.client("A", "host", "h1")
    h1_again.subscribe(STATE_H2)
    assert _until(h1_again, STATE_H2, b"while A was down"), pair.broker_b.errors()


def _until(client: Client, topic: str, payload: bytes, timeout: float = 60.0) -> bool:
    """Whether ``(topic, payload)`` arrives within ``timeout`` s (a bridge reconnects after a
    jittered 1-10 s, longer than :meth:`Client.until` waits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (topic, payload) in client.drain(0.5):
            return True
    return False


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bridge-to", "127.0.0.1:1"], "--bridge-to and --bridge-credentials go together"),
        (["--bridge-credentials", "x.yaml"], "--bridge-to and --bridge-credentials go together"),
        (
            ["--bridge-to", "nohost", "--bridge-credentials", "CREDS"],
            "give the coordinator's broker as HOST:PORT",
        ),
        (["--bridge-to", "h:70000", "--bridge-credentials", "CREDS"], "port must be 1-65535"),
        (
            ["--bridge-to", "a#b:1883", "--bridge-credentials", "CREDS"],
            "'a#b' is not a host name or IP address",
        ),
        (["--bridge-to", "h:1", "--bridge-credentials", "MISSING"], "No such file"),
        (["--bridge-to", "h:1", "--bridge-credentials", "VMFILE"], "not a bridge credentials file"),
        (["--bridge-to", "h:1", "--bridge-credentials", "CREDS", "--bridge-member", "h3"], "not both"),
        (["--bridge-member", "b1"], "bridge user(s) bridge-b1 are also VM or host user names"),
        (["--bridge-member", "_x"], "starts with '_'"),
    ],
)
def test_bad_bridging_input_refused(tmp_path: Path, args: List[str], message: str) -> None:
    a = generate(tmp_path / "A", "--experiment", E, "--vms", "a1", "--bridge-member", "h2")
    files = {"CREDS": str(a / "bridges" / "h2.yaml"), "MISSING": str(tmp_path / "none.yaml"),
             "VMFILE": str(a / "vms" / "a1.yaml")}  # fmt: skip
    vms = "b1,bridge-b1" if "b1" in args else "b1"
    done = mqtt_config("--out", str(tmp_path / "B"), "--experiment", E, "--vms", vms,
                       *(files.get(arg, arg) for arg in args))  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_credentials_of_another_experiment_refused(tmp_path: Path) -> None:
    a = generate(tmp_path / "A", "--experiment", "other", "--vms", "a1", "--bridge-member", "h2")
    credentials = str(a / "bridges" / "h2.yaml")
    done = mqtt_config("--out", str(tmp_path / "B"), "--experiment", E, "--vms", "b1",
                       "--bridge-to", "127.0.0.1:1883", "--bridge-credentials", credentials)  # fmt: skip
    assert done.returncode == 2 and "is for experiment 'other', not 'e1'" in done.stderr, done.stderr


def test_a_bridge_over_tls_with_client_certificates(tmp_path: Path) -> None:
    """A with ``--tls --client-certs``: the bridge verifies A's certificate against A's CA
    and presents a client certificate of its own; the start crosses."""
    port_a, port_b = free_port(), free_port()
    a = generate(tmp_path / "A", "--experiment", E, "--vms", "a1", "--host-user", "h1", "--tls",
                 "--tls-port", str(port_a), "--client-certs", "--bridge-member", "h2")  # fmt: skip
    credentials = str(a / "bridges" / "h2.yaml")
    b = generate(tmp_path / "B", "--experiment", E, "--vms", "b1", "--host-user", "h2", "--port", str(port_b),
                 "--bridge-to", f"127.0.0.1:{port_a}", "--bridge-credentials", credentials)  # fmt: skip
    conf = (b / "mosquitto.conf").read_text()
    for key, name in (
        ("bridge_cafile", "ca.crt"),
        ("bridge_certfile", "client.crt"),
        ("bridge_keyfile", "client.key"),
    ):
        assert f"{key} {b / 'bridge' / name}" in conf
    assert stat.S_IMODE(os.stat(b / "bridge" / "client.key").st_mode) == 0o600
    broker_a = Broker(root=a, config=a / "mosquitto.conf", port=port_a).start()
    broker_b = Broker(root=b, config=b / "mosquitto.conf", port=port_b).start()
    try:
        doc = creds(b, "host", "h2")
        h2 = Client(port_b, doc["username"], doc["password"])
        assert h2.connect() == 0
        h2.subscribe(START)
        # h1 over TLS with its client certificate publishes the start on A
        from tests.test_mqtt_acl import context

        h1_doc = creds(a, "host", "h1")
        certs = tmp_path / "h1.crt", tmp_path / "h1.key"
        certs[0].write_text(h1_doc["cert_pem"])
        certs[1].write_text(h1_doc["key_pem"])
        h1 = Client(port_a, h1_doc["username"], h1_doc["password"], context=context(h1_doc["ca_pem"], certs))
        assert h1.connect() == 0, broker_a.errors()
        assert h1.publish(START, b"over tls", retain=True) < FAILURE
        assert h2.until(START, b"over tls") == [(START, b"over tls")], broker_b.errors()
        h1.close()
        h2.close()
    finally:
        broker_b.close()
        broker_a.close()


# ------------------------------------------------------------------------------- end to end
def _loop(lines: int) -> Dict[str, Any]:
    return {"start_time": 2, "executable": "/bin/sh",
            "arguments": f"-c 'for i in $(seq 1 {lines}); do echo line $i; sleep 0.02; done'"}  # fmt: skip


CONFIG = {"start_time": -1, "executable": "sleep", "arguments": "0.2"}
FIRES = {"start_time": 1, "executable": "/bin/echo", "arguments": "fires"}
LINES = 300
SCHEDULES_A = {"a1": [CONFIG, FIRES, _loop(LINES)], "a2": [CONFIG, FIRES, _loop(LINES)]}
SCHEDULES_B = {
    "b1": [CONFIG, FIRES, {"start_time": 2, "pause": True, "pause_duration": ".inf"},
           {"start_time": 3, "executable": "/bin/echo", "arguments": "resumed"}],
    "b2": [CONFIG, FIRES, _loop(LINES)],
}  # fmt: skip


def _lines(env: HostEnv, vm: str, index: int) -> List[str]:
    recs = [r["event"]["data"] for r in env.events(vm, "output")]
    recs = [d for d in recs if d["index"] == index and d["stream"] == "stdout"]
    assert len({d["seq"] for d in recs}) == len(recs), "a line was logged twice"
    return [d["line"] for d in sorted(recs, key=lambda d: d["seq"])]


@pytest.fixture
def bridged(tmp_path: Path) -> Iterator[Tuple[Pair, HostEnv, HostEnv]]:
    made = Pair(tmp_path)
    env_a = HostEnv(SCHEDULES_A, start_buffer=1.0)
    env_b = HostEnv(SCHEDULES_B, start_buffer=1.0)
    env_a.broker, env_a.experiment = made.broker_a, E
    env_b.broker, env_b.experiment = made.broker_b, E
    try:
        yield made, env_a, env_b
    finally:
        env_b.close()
        env_a.close()
        made.close()


def test_one_experiment_across_two_bridged_brokers(bridged: Tuple[Pair, HostEnv, HostEnv]) -> None:
    pair, env_a, env_b = bridged
    env_a.start_host("--credentials", str(pair.a / "host" / "h1.yaml"),
                     "--host-id", "h1", "--coordinator", "--peers", "h2")  # fmt: skip
    env_b.start_host("--credentials", str(pair.b / "host" / "h2.yaml"), "--host-id", "h2", "--member")
    for env, out in ((env_a, pair.a), (env_b, pair.b)):
        for vm in sorted(p.stem for p in env.schedules.glob("*.yaml")):
            secure_agent(env, vm, out / "vms" / f"{vm}.yaml")
    where = {"a1": env_a, "a2": env_a, "b1": env_b, "b2": env_b}
    # one start for all: the coordinator's, taken by the member across the bridge
    fired = {vm: env.wait_event(vm, "entry_started", index=1)["event"]["data"] for vm, env in where.items()}
    start = env_a.status()["experiment"]["start_time"]
    assert env_b.status()["experiment"]["start_time"] == start
    assert env_a.status()["peers"] == {"h2": ["b1", "b2"]}
    for vm, env in where.items():
        assert [r["event"]["data"]["start_time"] for r in env.events(vm, "start_time_set")] == [start], vm
        assert fired[vm]["scheduled"] == pytest.approx(start + 1.0)
    # restart A, then B, while a1, a2 and b2 print and b1 holds at its break
    env_a.wait_event("a1", "output", index=2, line="line 20")
    pair.broker_a.restart(down_for=1.0)
    env_b.wait_event("b2", "output", index=2, line="line 40")
    pair.broker_b.restart(down_for=1.0)
    env_b.wait_event("b1", "break_started")
    resumed = env_b.cli("resume", "b1")
    assert resumed.returncode == 0, resumed.stderr
    env_b.wait_event("b1", "output", index=3, line="resumed")
    batch = env_b.root / "more.yaml"
    batch.write_text(yaml.safe_dump([{"start_time": 1, "executable": "/bin/echo", "arguments": "added"}]))
    added = env_b.cli("schedule", "add", "b2", str(batch))
    assert added.returncode == 0, added.stderr
    env_b.wait_event("b2", "output", index=3, line="added")
    for vm, env in where.items():
        env.wait_event(vm, "schedule_complete")
    # nothing lost, nothing twice: every entry's reports once, every line once and in order
    for vm in ("a1", "a2", "b2"):
        assert _lines(where[vm], vm, 2) == [f"line {i}" for i in range(1, LINES + 1)], vm
    for vm, env in where.items():
        ids = [r["event"]["id"] for r in env.events(vm)]
        assert len(ids) == len(set(ids)), vm
        entries = {"a1": [0, 1, 2], "a2": [0, 1, 2], "b1": [0, 1, 3], "b2": [0, 1, 2, 3]}[
            vm
        ]  # b1's 2: a break
        for kind in ("entry_started", "entry_exited"):
            counted = Counter(r["event"]["data"]["index"] for r in env.events(vm, kind))
            want = {i: 1 for i in entries}
            assert dict(counted) == want, (vm, kind, counted)
    assert len(env_b.events("b1", "resume_received")) == 1
    # each host logs its own VMs only
    assert not env_a.events("b1") and not env_b.events("a1")
