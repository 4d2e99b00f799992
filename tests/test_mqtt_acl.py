"""``vmr-host mqtt-config`` against a real mosquitto and real paho-mqtt 2.x clients.

Every config comes from the real CLI (``python -m vmr_handler.host mqtt-config``) and runs
in a real mosquitto (``tests/broker.py``). What is proven is what a legitimate subscriber
actually receives: mosquitto 2.0 grants every SUBSCRIBE (SUBACK success) and applies the
ACL when it delivers, and answers a refused QoS 1 PUBLISH with PUBACK 0x87. Waits are
bounded and use MQTT ordering: a client that receives a marker published after a message
it must not see would already have received that message.
"""

from __future__ import annotations

import base64
import getpass
import os
import queue
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from tests.broker import Broker, free_port
from vmr_handler.core.errors import InvalidArgument
from vmr_handler.host.cli.mqtt_config import _files as mqttfiles
from vmr_handler.host.cli.mqtt_config import _tls as mqtttls
from vmr_handler.transports.mqtt import topics

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd")
NOT_AUTHORIZED = 0x87
FAILURE = 0x80  # MQTT v5 reason codes below it are successes (0x10: no subscribers)
WAIT = 5.0  # every wait in this file ends after this many seconds at most


def mqtt_config(*args: str) -> subprocess.CompletedProcess:
    """Run the real CLI."""
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "mqtt-config", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def generate(out: Path, *args: str) -> Path:
    done = mqtt_config("--out", str(out), "--user", getpass.getuser(), *args)
    assert done.returncode == 0, done.stderr
    return out


def creds(out: Path, kind: str, name: str) -> Dict[str, Any]:
    with open(out / kind / f"{name}.yaml", encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    assert isinstance(doc, dict)
    return doc


class Client:
    """A paho-mqtt 2.x client (MQTT v5) that records what it gets, with bounded waits."""

    def __init__(
        self,
        port: int,
        username: Optional[str],
        password: Optional[str] = None,
        client_id: str = "",
        context: Optional[ssl.SSLContext] = None,
        will: Optional[Tuple[str, bytes]] = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.port, self.host = port, host
        self.mqtt = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if username is not None:
            self.mqtt.username_pw_set(username, password)
        if context is not None:
            self.mqtt.tls_set_context(context)
        if will is not None:
            self.mqtt.will_set(will[0], will[1], qos=1, retain=True)
        self.messages: queue.Queue = queue.Queue()
        self.connack: Optional[int] = None
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.pubacks: Dict[int, int] = {}
        self.acked = threading.Condition()
        self.subscribed: Dict[int, threading.Event] = {}
        self.mqtt.on_connect = self._on_connect
        self.mqtt.on_disconnect = lambda c, u, f, rc, p: self.disconnected.set()
        self.mqtt.on_message = lambda c, u, m: self.messages.put((m.topic, m.payload, m.retain))
        self.mqtt.on_publish = self._on_publish
        self.mqtt.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.setdefault(
            mid, threading.Event()
        ).set()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.connack = rc.value
        self.connected.set()

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        with self.acked:
            self.pubacks[mid] = rc.value
            self.acked.notify_all()

    def connect(self) -> int:
        """Connect and return the CONNACK reason code (0 = accepted; -1: the broker closed
        the connection without a CONNACK). A TLS failure in the handshake raises ssl.SSLError.
        """
        self.mqtt.connect(self.host, self.port, keepalive=30)
        self.mqtt.loop_start()
        deadline = time.monotonic() + WAIT
        while not self.connected.is_set() and not self.disconnected.is_set():
            assert time.monotonic() < deadline, "neither CONNACK nor disconnect"
            time.sleep(0.01)
        code = -1 if self.connack is None else self.connack
        if code:
            self.mqtt.loop_stop()
        return code

    def subscribe(self, *topics: str) -> None:
        for name in topics:
            rc, mid = self.mqtt.subscribe(name, qos=1)
            assert rc == mqtt.MQTT_ERR_SUCCESS
            assert self.subscribed.setdefault(mid, threading.Event()).wait(WAIT), f"no SUBACK for {name}"

    def publish(self, name: str, payload: bytes, retain: bool = False) -> int:
        """Publish at QoS 1 and return the PUBACK reason code."""
        mid = self.mqtt.publish(name, payload, qos=1, retain=retain).mid
        with self.acked:
            assert self.acked.wait_for(lambda: mid in self.pubacks, WAIT), f"no PUBACK for {name}"
            return self.pubacks[mid]

    def until(self, topic: str, payload: bytes) -> List[Tuple[str, bytes]]:
        """Everything received up to and including ``(topic, payload)`` (which must come)."""
        got: List[Tuple[str, bytes]] = []
        deadline = time.monotonic() + WAIT
        while True:
            try:
                name, data, _ = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"never received {topic} {payload!r}; got {got}") from None
            got.append((name, data))
            if (name, data) == (topic, payload):
                return got

    def drain(self, seconds: float = 0.3) -> List[Tuple[str, bytes]]:
        """What arrives within ``seconds``."""
        got: List[Tuple[str, bytes]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                name, data, _ = self.messages.get(timeout=left)
            except queue.Empty:
                break
            got.append((name, data))
        return got

    def drop(self) -> None:
        """Vanish without DISCONNECT (the broker publishes the will)."""
        self.mqtt.loop_stop()
        sock = self.mqtt.socket()
        if isinstance(sock, (socket.socket, ssl.SSLSocket)):
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.mqtt.disconnect()
        self.mqtt.loop_stop()


class Exp:
    """One broker serving two experiments: e1 (VMs a, b; hosts vmr-host, h2) and other (VM c)."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.e1 = generate(
            root / "e1",
            "--experiment",
            "e1",
            "--vms",
            "a,b",
            "--host-user",
            "vmr-host,h2",
            "--port",
            str(self.port),
        )
        other = generate(root / "other", "--experiment", "other", "--vms", "c", "--host-user", "other-host")
        # one broker for both: concatenated password files and ACLs (docs/mqtt.md, sharing a broker)
        for name in ("passwd", "acl"):
            with open(self.e1 / name, "a", encoding="utf-8") as fh:
                fh.write((other / name).read_text())
        self.dirs = {"e1": self.e1, "other": other}
        self.broker = Broker(root=self.e1, config=self.e1 / "mosquitto.conf", port=self.port).start()
        self.clients: List[Client] = []

    def client(self, experiment: str, kind: str, name: str, **kw: Any) -> Client:
        doc = creds(self.dirs[experiment], kind, name)
        c = Client(self.port, doc["username"], doc["password"], **kw)
        self.clients.append(c)
        assert c.connect() == 0, self.broker.errors()
        return c

    def vm(self, name: str, experiment: str = "e1", **kw: Any) -> Client:
        return self.client(experiment, "vms", name, **kw)

    def host(self, name: str = "vmr-host", experiment: str = "e1", **kw: Any) -> Client:
        return self.client(experiment, "host", name, **kw)

    def close(self) -> None:
        for c in self.clients:
            try:
                c.close()
            except Exception:
                pass
        self.broker.close()


@pytest.fixture
def exp(tmp_path: Path) -> Iterator[Exp]:
    e = Exp(tmp_path)
    try:
        yield e
    finally:
        e.close()


def t(vm: str, leaf: str, experiment: str = "e1") -> str:
    return topics.topic(experiment, vm, leaf)


# ------------------------------------------------------------------------------- the files
def test_generated_files_modes_and_contents(tmp_path: Path) -> None:
    out = generate(tmp_path / "cfg", "--experiment", "e1", "--vms", "a,b", "--vms", "c", "--port", "18830")
    for secret in ("passwd", "acl", "vms/a.yaml", "vms/c.yaml", "host/vmr-host.yaml"):
        assert stat.S_IMODE(os.stat(out / secret).st_mode) == 0o600, secret
    for private in ("vms", "host", "data"):
        assert stat.S_IMODE(os.stat(out / private).st_mode) == 0o700, private
    assert not (out / "tls").exists()
    a = creds(out, "vms", "a")
    assert set(a) == {"transport", "broker", "experiment", "vm_name", "username", "password"}
    assert (a["transport"], a["broker"], a["experiment"], a["vm_name"], a["username"]) == (
        "mqtt",
        "mqtt://127.0.0.1:18830",
        "e1",
        "a",
        "a",
    )
    host = creds(out, "host", "vmr-host")
    assert host["username"] == "vmr-host" and "vm_name" not in host
    passwords = {creds(out, "vms", v)["password"] for v in "abc"} | {host["password"]}
    assert len(passwords) == 4 and all(len(p) >= 32 for p in passwords)
    passwd = (out / "passwd").read_text()
    assert [line.split(":")[0] for line in passwd.splitlines()] == ["a", "b", "c", "vmr-host"]
    assert not any(p in passwd for p in passwords) and passwd.count(":$7$101$") == 4
    acl = (out / "acl").read_text()
    assert "pattern write vmr/e1/%u/up\npattern read vmr/e1/%u/down\n" in acl
    assert "user vmr-host\ntopic readwrite vmr/e1/#" in acl
    for vm in "abc":  # each VM of the experiment may read the hosts' start topics
        assert f"\nuser {vm}\ntopic read vmr/e1/_hosts/+/start\n" in acl
    assert "pattern read vmr/e1/_hosts" not in acl  # a user grant: not for other experiments' VMs
    conf = (out / "mosquitto.conf").read_text().splitlines()
    assert "allow_anonymous false" in conf and f"acl_file {out / 'acl'}" in conf
    assert "listener 18830 127.0.0.1" in conf and "per_listener_settings true" not in conf


# ---------------------------------------------------------------------------- plain broker
def test_vm_reaches_its_own_topics(exp: Exp) -> None:
    host = exp.host()
    host.subscribe("vmr/e1/#")
    assert host.publish(t("a", "start"), b"start-a", retain=True) < FAILURE
    a = exp.vm("a")
    a.subscribe(t("a", "down"), t("a", "start"))
    assert a.until(t("a", "start"), b"start-a") == [(t("a", "start"), b"start-a")]  # retained
    assert a.publish(t("a", "up"), b"report") < FAILURE
    assert a.publish(t("a", "presence"), b'{"state": "online"}', retain=True) < FAILURE
    host.until(t("a", "presence"), b'{"state": "online"}')
    assert host.publish(t("a", "down"), b"command") < FAILURE
    assert a.until(t("a", "down"), b"command") == [(t("a", "down"), b"command")]


def test_vm_cannot_read_another_vms_topics(exp: Exp) -> None:
    host, b = exp.host(), exp.vm("b")
    b.subscribe(t("b", "down"), t("b", "start"))
    assert host.publish(t("b", "start"), b"start-b", retain=True) < FAILURE
    b.until(t("b", "start"), b"start-b")
    a = exp.vm("a")
    # mosquitto 2.0 grants these subscriptions and filters on delivery
    a.subscribe(
        t("b", "down"),
        t("b", "start"),
        t("b", "up"),
        t("b", "presence"),
        "vmr/e1/+/down",
        "#",
        "vmr/e1/_hosts/#",
        t("a", "down"),
    )
    assert b.publish(t("b", "up"), b"b-report") < FAILURE
    assert b.publish(t("b", "presence"), b"online", retain=True) < FAILURE
    assert host.publish(t("b", "down"), b"for-b") < FAILURE
    assert host.publish("vmr/e1/_hosts/coordinator", b"host-only") < FAILURE
    assert host.publish(t("a", "down"), b"marker") < FAILURE
    assert a.until(t("a", "down"), b"marker") == [(t("a", "down"), b"marker")]
    assert b.until(t("b", "down"), b"for-b")  # the legitimate subscriber did get it


def test_vm_cannot_publish_onto_another_vms_topics(exp: Exp) -> None:
    host, b = exp.host(), exp.vm("b")
    host.subscribe("vmr/e1/#")
    b.subscribe(t("b", "down"), t("b", "start"))
    a = exp.vm("a")
    for name in (
        t("b", "down"),
        t("b", "start"),
        t("b", "up"),
        t("a", "down"),
        t("a", "start"),
        "vmr/e1/_hosts/coordinator",
        "vmr/other/c/down",
        "vmr/e1/b",
    ):
        assert a.publish(name, b"forged", retain=name.endswith("start")) == NOT_AUTHORIZED, name
    assert a.publish(t("a", "up"), b"marker") < FAILURE
    assert host.until(t("a", "up"), b"marker") == [(t("a", "up"), b"marker")]
    assert b.drain() == []
    b.close()
    late = exp.vm("b")  # no forged retained start-time either
    late.subscribe(t("b", "start"), t("a", "start"))
    assert late.drain() == []


def test_vm_reads_the_hosts_start_topics_and_cannot_write_them(exp: Exp) -> None:
    """Every host's start for all its VMs: every VM of the experiment reads it, no
    VM writes it, and it opens nothing else of ``_hosts`` nor to another experiment's VMs."""
    host, h2 = exp.host(), exp.host("h2")
    starts = {"vmr/e1/_hosts/vmr-host/start": b"start-h1", "vmr/e1/_hosts/h2/start": b"start-h2"}
    for client, (name, payload) in zip((host, h2), starts.items()):
        assert client.publish(name, payload, retain=True) < FAILURE  # hosts write them
    assert h2.publish("vmr/e1/_hosts/h2/state", b"host-only", retain=True) < FAILURE
    a = exp.vm("a")
    a.subscribe("vmr/e1/_hosts/+/start", "vmr/e1/_hosts/h2/state", "vmr/e1/_hosts/#", t("a", "down"))
    for name, payload in starts.items():
        forged = b"forged-" + payload
        assert a.publish(name, forged, retain=True) == NOT_AUTHORIZED, name
    for name in ("vmr/e1/_hosts/a/start", "vmr/e1/_hosts/_start", "vmr/e1/_hosts/h3/start"):
        assert a.publish(name, b"forged", retain=True) == NOT_AUTHORIZED, name
    assert host.publish(t("a", "down"), b"marker") < FAILURE
    got = a.until(t("a", "down"), b"marker")
    # the retained starts (each once per subscription that matches), never the state
    assert sorted(set(got)) == sorted([*starts.items(), (t("a", "down"), b"marker")]), got
    b = exp.vm("b")  # another VM of e1: the starts as the hosts left them, not forged
    b.subscribe("vmr/e1/_hosts/+/start", t("b", "down"))
    assert host.publish(t("b", "down"), b"marker") < FAILURE
    assert sorted(b.until(t("b", "down"), b"marker")) == sorted(
        [*starts.items(), (t("b", "down"), b"marker")]
    )
    other = exp.host("other-host", experiment="other")  # a VM of another experiment: nothing
    c = exp.vm("c", experiment="other")
    c.subscribe("vmr/e1/_hosts/+/start", "vmr/e1/#", t("c", "down", "other"))
    assert other.publish(t("c", "down", "other"), b"marker") < FAILURE
    assert c.until(t("c", "down", "other"), b"marker") == [(t("c", "down", "other"), b"marker")]


def test_vm_cannot_forge_another_vms_presence(exp: Exp) -> None:
    host = exp.host()
    host.subscribe("vmr/e1/+/presence")
    a = exp.vm("a", will=(t("b", "presence"), b'{"state": "offline"}'))
    assert a.publish(t("b", "presence"), b'{"state": "offline"}', retain=True) == NOT_AUTHORIZED
    a.drop()  # its will names b's presence: refused too
    mine = exp.vm("a", client_id="again", will=(t("a", "presence"), b'{"state": "offline"}'))
    mine.drop()  # control: a's own will does arrive
    assert host.until(t("a", "presence"), b'{"state": "offline"}') == [
        (t("a", "presence"), b'{"state": "offline"}')
    ]
    fresh = exp.host("h2")
    fresh.subscribe(t("b", "presence"))
    assert fresh.drain() == []  # nothing retained on b's presence


def test_vm_cannot_read_another_experiments_start_time(exp: Exp) -> None:
    other = exp.host("other-host", experiment="other")
    assert other.publish(t("c", "start", "other"), b"start-c", retain=True) < FAILURE
    c = exp.vm("c", experiment="other")
    c.subscribe(t("c", "start", "other"))
    c.until(t("c", "start", "other"), b"start-c")  # control: its own experiment's VM reads it
    a = exp.vm("a")
    a.subscribe(t("c", "start", "other"), "vmr/other/#", t("a", "down"))
    host = exp.host()  # e1's host cannot read the other experiment either
    host.subscribe("vmr/other/#", t("a", "down"))
    assert host.publish(t("a", "down"), b"marker") < FAILURE
    assert a.until(t("a", "down"), b"marker") == [(t("a", "down"), b"marker")]
    assert host.until(t("a", "down"), b"marker") == [(t("a", "down"), b"marker")]
    assert host.publish(t("c", "down", "other"), b"x") == NOT_AUTHORIZED
    assert a.publish(t("c", "up", "other"), b"x") == NOT_AUTHORIZED


def test_one_experiments_broker_grants_nothing_of_another_experiment(tmp_path: Path) -> None:
    port = free_port()
    out = generate(tmp_path / "cfg", "--experiment", "e1", "--vms", "a", "--port", str(port))
    with open(out / "passwd", "ab") as fh:  # a test-only superuser that writes anywhere
        fh.write(mqttfiles.render_passwd({"admin": "admin-pw"}, tool=None))
    with open(out / "acl", "a", encoding="utf-8") as fh:
        fh.write("\nuser admin\ntopic readwrite #\n")
    broker = Broker(root=out, config=out / "mosquitto.conf", port=port).start()
    clients: List[Client] = []
    try:
        admin = Client(port, "admin", "admin-pw")
        a = Client(port, "a", creds(out, "vms", "a")["password"])
        host = Client(port, "vmr-host", creds(out, "host", "vmr-host")["password"])
        clients += [admin, a, host]
        assert admin.connect() == a.connect() == host.connect() == 0, broker.errors()
        assert admin.publish(t("a", "start", "OTHER"), b"other-start", retain=True) < FAILURE
        a.subscribe(t("a", "start", "OTHER"), t("a", "down"))
        host.subscribe("vmr/OTHER/#", t("a", "down"))
        assert admin.publish(t("a", "down"), b"marker") < FAILURE
        assert a.until(t("a", "down"), b"marker") == [(t("a", "down"), b"marker")]
        assert host.until(t("a", "down"), b"marker") == [(t("a", "down"), b"marker")]
    finally:
        for c in clients:
            c.close()
        broker.close()


def test_shared_broker_patterns_span_experiments(exp: Exp) -> None:
    """mosquitto applies every ``pattern`` line to every user: on a broker shared by two
    experiments, VM a of e1 reaches ``vmr/other/a/...``. No VM of ``other`` can be named a
    (one username per broker), so that is nobody's topic; ``other``'s host must ignore
    VMs it does not serve (docs/mqtt.md, "Several experiments on one broker").
    """
    other = exp.host("other-host", experiment="other")
    assert other.publish(t("a", "start", "other"), b"not-for-e1", retain=True) < FAILURE
    a = exp.vm("a")
    a.subscribe(t("a", "start", "other"))
    assert a.until(t("a", "start", "other"), b"not-for-e1")


@pytest.mark.parametrize(
    "username, password",
    [("a", "wrong"), ("a", "B"), ("nobody", "x"), ("a", None), (None, None), ("vmr-host", "A")],
    ids=[
        "wrong-password",
        "other-vms-password",
        "unknown-user",
        "no-password",
        "anonymous",
        "host-with-vm-pw",
    ],
)
def test_bad_credentials_refused(exp: Exp, username: Optional[str], password: Optional[str]) -> None:
    known = {"A": creds(exp.e1, "vms", "a")["password"], "B": creds(exp.e1, "vms", "b")["password"]}
    c = Client(exp.port, username, known.get(password or "", password))
    assert c.connect() == NOT_AUTHORIZED


def test_host_reads_and_writes_everything_of_its_experiment(exp: Exp) -> None:
    host, h2 = exp.host(), exp.host("h2")
    host.subscribe("vmr/e1/#")
    a, b = exp.vm("a"), exp.vm("b")
    a.subscribe(t("a", "down"))
    b.subscribe(t("b", "down"))
    assert a.publish(t("a", "up"), b"from-a") < FAILURE
    assert b.publish(t("b", "up"), b"from-b") < FAILURE
    assert b.publish(t("b", "presence"), b"online-b", retain=True) < FAILURE
    assert h2.publish("vmr/e1/_hosts/h2/state", b"coordination") < FAILURE
    got = host.until("vmr/e1/_hosts/h2/state", b"coordination")
    assert {(t("a", "up"), b"from-a"), (t("b", "up"), b"from-b"), (t("b", "presence"), b"online-b")} <= set(
        got
    )
    for vm, client in (("a", a), ("b", b)):
        assert host.publish(t(vm, "down"), b"to-" + vm.encode()) < FAILURE
        client.until(t(vm, "down"), b"to-" + vm.encode())


def test_a_vm_cannot_take_over_another_clients_session(exp: Exp) -> None:
    host, b = exp.host(), exp.vm("b", client_id="b")
    b.subscribe(t("b", "down"))
    exp.vm("a", client_id="b").close()  # use_username_as_clientid: this is client "a", not "b"
    exp.vm("a", client_id="vmr-host")
    assert host.publish(t("b", "down"), b"still-there") < FAILURE
    b.until(t("b", "down"), b"still-there")
    assert not b.disconnected.is_set() and not host.disconnected.is_set()


def test_mosquitto_accepts_hashlib_hashes(tmp_path: Path) -> None:
    port = free_port()
    out = generate(tmp_path / "cfg", "--experiment", "e1", "--vms", "a", "--port", str(port))
    password = creds(out, "vms", "a")["password"]
    (out / "passwd").write_bytes(mqttfiles.render_passwd({"a": password}, tool=None))
    broker = Broker(root=out, config=out / "mosquitto.conf", port=port).start()
    try:
        assert Client(port, "a", password).connect() == 0, broker.errors()
        assert Client(port, "a", password + "x").connect() == NOT_AUTHORIZED
    finally:
        broker.close()


@pytest.mark.skipif(MOSQUITTO_PASSWD is None, reason="mosquitto_passwd not installed")
def test_hashlib_hash_equals_mosquitto_passwd(tmp_path: Path) -> None:
    made = mqttfiles.render_passwd({"u": "pa ss!w0rd"}, tool=MOSQUITTO_PASSWD).decode().strip()
    _, iterations, salt, _ = made.split(":", 1)[1].split("$")[1:]
    assert made == "u:" + mqttfiles.hash_password("pa ss!w0rd", base64.b64decode(salt), int(iterations))
    for bad in ({"u": "pass:word"}, {"u": "two\nlines"}, {"u:x": "pw"}):
        with pytest.raises(InvalidArgument, match="line break in a password-file entry"):
            mqttfiles.render_passwd(bad, tool=MOSQUITTO_PASSWD)


# ------------------------------------------------------------------------------------- TLS
def context(ca_pem: str, cert: Optional[Tuple[Path, Path]] = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem)
    if cert is not None:
        ctx.load_cert_chain(*map(str, cert))
    return ctx


def test_tls_server_verified_with_the_generated_ca(tmp_path: Path) -> None:
    plain, tls = free_port(), free_port()
    out = generate(
        tmp_path / "cfg",
        "--experiment",
        "e1",
        "--vms",
        "a,b",
        "--tls",
        "--tls-port",
        str(tls),
        "--port",
        str(plain),
        "--hostname",
        "broker.test",
    )
    conf = (out / "mosquitto.conf").read_text()
    assert "per_listener_settings true" in conf and conf.count("password_file") == 2
    a = creds(out, "vms", "a")
    assert a["broker"] == f"mqtts://127.0.0.1:{tls}" and "BEGIN CERTIFICATE" in a["ca_pem"]
    assert "cert_pem" not in a and "key_pem" not in a
    broker = Broker(root=out, config=out / "mosquitto.conf", port=tls).start()
    try:
        for name in ("127.0.0.1", "localhost"):
            c = Client(tls, "a", a["password"], context=context(a["ca_pem"]), host=name)
            assert c.connect() == 0, broker.errors()
            c.subscribe(t("a", "down"))
            host = creds(out, "host", "vmr-host")
            h = Client(tls, "vmr-host", host["password"], context=context(host["ca_pem"]), host=name)
            assert h.connect() == 0
            assert h.publish(t("a", "down"), b"over-tls") < FAILURE
            c.until(t("a", "down"), b"over-tls")
            c.close()
            h.close()
        foreign = mqtttls.make_pki("someone-else", ["127.0.0.1"], 1)
        with pytest.raises(ssl.SSLCertVerificationError):
            Client(tls, "a", a["password"], context=context(foreign.ca_cert.decode())).connect()
        # the plain listener has its own (same) auth settings: no anonymous access there either
        assert Client(plain, None).connect() == NOT_AUTHORIZED
        assert Client(plain, "a", a["password"]).connect() == 0
        assert Client(tls, None, context=context(a["ca_pem"])).connect() == NOT_AUTHORIZED
    finally:
        broker.close()


def refused(client: Client) -> bool:
    """The broker refuses ``client``: in the TLS handshake or by closing without CONNACK."""
    try:
        return client.connect() == -1
    except (ssl.SSLError, ConnectionError):
        return True


def test_tls_client_certificates_required(tmp_path: Path) -> None:
    tls = free_port()
    out = generate(
        tmp_path / "cfg",
        "--experiment",
        "e1",
        "--vms",
        "a",
        "--tls",
        "--tls-port",
        str(tls),
        "--client-certs",
    )
    conf = (out / "mosquitto.conf").read_text()
    assert "require_certificate true" in conf and "per_listener_settings" not in conf
    assert "listener 1883" not in conf  # --tls without --port: no plain listener
    a = creds(out, "vms", "a")
    cert, key = tmp_path / "a.crt", tmp_path / "a.key"
    cert.write_text(a["cert_pem"])
    key.write_text(a["key_pem"])
    broker = Broker(root=out, config=out / "mosquitto.conf", port=tls).start()
    try:
        assert Client(tls, "a", a["password"], context=context(a["ca_pem"], (cert, key))).connect() == 0
        assert creds(out, "host", "vmr-host")["cert_pem"] != a["cert_pem"]
        assert refused(Client(tls, "a", a["password"], context=context(a["ca_pem"])))  # no certificate
        foreign = mqtttls.make_pki("someone-else", ["127.0.0.1"], 1)
        fkey, fcert = mqtttls.issue(foreign.ca_key, foreign.ca_cert, "a", 1)
        (tmp_path / "f.crt").write_bytes(fcert)
        (tmp_path / "f.key").write_bytes(fkey)
        ctx = context(a["ca_pem"], (tmp_path / "f.crt", tmp_path / "f.key"))
        assert refused(Client(tls, "a", a["password"], context=ctx))  # a certificate of another CA
    finally:
        broker.close()


# ------------------------------------------------------------------ root-started mosquitto
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mosquitto drops privileges)")
def test_root_started_broker_drops_to_the_mosquitto_user(tmp_path: Path) -> None:
    import pwd

    try:
        user = pwd.getpwnam("mosquitto")
    except KeyError:
        pytest.skip("no OS user mosquitto")
    port = free_port()
    root = Path(tempfile_dir())
    try:
        out = root / "cfg"
        done = mqtt_config("--out", str(out), "--experiment", "e1", "--vms", "a", "--port", str(port))
        assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
        assert {os.stat(out / n).st_uid for n in ("passwd", "acl", "data")} == {user.pw_uid}
        assert os.stat(out / "vms" / "a.yaml").st_uid == 0
        broker = Broker(root=out, config=out / "mosquitto.conf", port=port).start()
        try:
            a = creds(out, "vms", "a")
            assert Client(port, "a", a["password"]).connect() == 0, broker.errors()
            assert subprocess.run(
                ["ps", "-o", "user=", "-p", str(broker.proc.pid)], capture_output=True, text=True
            ).stdout.strip() in ("mosquitto", "mosquit+")
        finally:
            broker.stop()
        assert os.stat(out / "data" / "mosquitto.db").st_uid == user.pw_uid
    finally:
        shutil.rmtree(root, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile

    path = tempfile.mkdtemp(dir="/tmp", prefix="vhmqroot")
    os.chmod(path, 0o755)  # the broker user must be able to enter it
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_warns_when_the_broker_user_cannot_enter_out() -> None:
    root = tempfile_dir()
    try:
        os.chmod(root, 0o700)
        done = mqtt_config("--out", f"{root}/cfg", "--experiment", "e1", "--vms", "a", "--user", "mosquitto")
        assert done.returncode == 0
        assert f"cannot enter {root}: " in done.stderr
    finally:
        shutil.rmtree(root)


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "args, message",
    [
        (["--vms", ""], "VM name '' is empty"),
        (["--vms", "a,,b"], "VM name '' is empty"),
        (["--vms", "a/b"], "VM name 'a/b' contains '/'"),
        (["--vms", "a+"], "VM name 'a+' contains '+'"),
        (["--vms", "#"], "VM name '#' contains '#'"),
        (["--vms", "a b"], "VM name 'a b' contains whitespace"),
        (["--vms", "_hosts"], "VM name '_hosts' starts with '_'"),
        (["--vms", "a,b", "--vms", "a"], "VM name 'a' is given 2 times"),
        (["--vms", "a", "--host-user", "a"], "host user(s) a are also VM names"),
        (["--vms", "a", "--host-user", "h,h"], "host user name 'h' is given 2 times"),
        (["--vms", "a", "--experiment", "x/y"], "experiment name 'x/y' contains '/'"),
        (["--vms", "a", "--client-certs"], "--client-certs needs --tls"),
        (["--vms", "a", "--tls", "--port", "8883"], "--port and --tls-port are both 8883"),
        (["--vms", "a", "--bind", "0.0.0.0"], "say which address VMs use with --broker-host"),
        (["--vms", "a", "--tls", "--hostname", "bad name"], "'bad name' is not a host name"),
        (["--vms", "a", "--user", "no-such-user-here"], "--user no-such-user-here: no such OS user"),
    ],
)
def test_bad_input_refused(tmp_path: Path, args: List[str], message: str) -> None:
    if "--user" in args and os.geteuid() != 0:
        pytest.skip("the OS user is only checked as root")
    if "--experiment" not in args:
        args = [*args, "--experiment", "e1"]
    done = mqtt_config("--out", str(tmp_path / "cfg"), *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "cfg").exists()


def test_out_dir_problems(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    done = mqtt_config("--out", str(tmp_path / "file"), "--experiment", "e1", "--vms", "a")
    assert done.returncode == 2 and "exists and is not a directory" in done.stderr
    done = mqtt_config("--out", str(tmp_path / "file" / "sub"), "--experiment", "e1", "--vms", "a")
    assert done.returncode == 2 and "cannot create --out" in done.stderr
    out = generate(tmp_path / "cfg", "--experiment", "e1", "--vms", "a,b")
    first = creds(out, "vms", "a")["password"]
    done = mqtt_config("--out", str(out), "--experiment", "e1", "--vms", "a")
    assert done.returncode == 2 and "already holds a configuration" in done.stderr
    assert creds(out, "vms", "a")["password"] == first
    generate(out, "--experiment", "e1", "--vms", "a", "--force")
    assert creds(out, "vms", "a")["password"] != first
    assert not (out / "vms" / "b.yaml").exists()  # credentials of a VM no longer listed are gone


def test_vms_from_a_schedules_directory(tmp_path: Path) -> None:
    sched = tmp_path / "sched"
    sched.mkdir()
    entry = "- {start_time: 1, executable: /bin/true}\n"
    for name in ("web.yaml", "db-1.json", "notes.txt"):
        (sched / name).write_text(
            entry if name.endswith("yaml") else "[" + '{"start_time": 1, "executable": "/bin/true"}]'
        )
    out = generate(tmp_path / "cfg", "--experiment", "e1", "--vms-from", str(sched))
    assert sorted(p.name for p in (out / "vms").iterdir()) == ["db-1.yaml", "web.yaml"]
    (sched / "_x.yaml").write_text(entry)
    done = mqtt_config("--out", str(tmp_path / "cfg2"), "--experiment", "e1", "--vms-from", str(sched))
    assert done.returncode == 2 and "'_x' is not a usable VM name" in done.stderr
    done = mqtt_config(
        "--out", str(tmp_path / "cfg3"), "--experiment", "e1", "--vms-from", str(sched), "--vms", "a"
    )
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_generated_files_are_valid_transport_settings(tmp_path: Path) -> None:
    """The agent reads ``vms/<vm>.yaml`` as its fw_cfg blob and the host reads
    ``host/<user>.yaml`` as ``--credentials`` (without client certificates: see docs/mqtt.md).
    """
    from vmr_handler.agent.cli.commandline import load_config
    from vmr_handler.transports.mqtt.options import options_from

    out = generate(
        tmp_path / "cfg", "--experiment", "e1", "--vms", "vm1", "--tls", "--broker-host", "10.0.2.2"
    )
    blob = load_config(str(out / "vms" / "vm1.yaml"), None)
    vm = options_from(blob, "fw_cfg")
    assert (vm.broker, vm.experiment, vm.username) == ("mqtts://10.0.2.2:8883", "e1", "vm1")
    assert blob["vm_name"] == "vm1" and vm.ca_pem == blob["ca_pem"]
    host = options_from(creds(out, "host", "vmr-host"), "credentials")
    assert (host.broker, host.username) == ("mqtts://127.0.0.1:8883", "vmr-host")
