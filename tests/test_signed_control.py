"""Signed control messages end to end (SPEC §7): a real ``vmr-host serve
--signing-key`` and real agents with ``--public-key``.

Over both transports a signed experiment runs normally (schedule, start time, break,
``vmr-host resume``). Over MQTT a rogue publisher (the test's broker is anonymous, so anyone
may write the VM's ``down`` topic: exactly what signatures are for) injects RESUMEs that are
unsigned, signed with another key, stale, or reuse an earlier RESUME's id with new content:
each is refused, reported as ``control_refused`` in the host's log, and the break holds until
the real host's RESUME ends it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.enums import CallbackAPIVersion

from tests.hostenv import HostEnv
from vmr_handler.core.errors import SignatureError
from vmr_handler.core.events import Event
from vmr_handler.core.wire.clockanswers import ClockAnswers
from vmr_handler.core.wire.protocol import (
    CLOCK_REQ,
    CLOCK_RESP,
    RESUME,
    SCHEDULE_APPEND,
    FrameDecoder,
    encode_message,
)
from vmr_handler.core.wire.signing import Verifier, generate_keypair, load_private_key, sign
from vmr_handler.host.serve.session.clocklead import StampLead

BREAK = [
    {"start_time": -1, "executable": "/bin/true"},
    {"start_time": 0.5, "pause": True, "pause_duration": ".inf"},
    {"start_time": 1, "executable": "/bin/echo", "arguments": "after the break"},
]


def _keygen(out: Path) -> Path:
    res = subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "keygen", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(params=["unix", "mqtt"])
def signed_env(request) -> Iterator[HostEnv]:
    env = HostEnv({"a": BREAK}, start_buffer=0.5, transport=request.param)
    keys = _keygen(env.root / "keys")
    env.start_host("--signing-key", str(keys / "host.key"))
    env.start_agent("a", "--public-key", str(keys / "host.pub"))
    yield env
    env.close()


def test_signed_experiment_runs_and_resume_ends_the_break(signed_env: HostEnv) -> None:
    env = signed_env
    loaded = env.wait_event("a", "schedule_loaded")["event"]["data"]
    assert loaded["digest"]
    env.wait_event("a", "break_started")
    res = env.cli("resume", "a")
    assert res.returncode == 0, res.stderr
    env.wait_event("a", "output", index=2, line="after the break")
    assert not env.events("a", "control_refused")  # every resend of a signed event was accepted


def test_agent_with_a_key_refuses_an_unsigned_host(tmp_path: Path) -> None:
    env = HostEnv({"a": BREAK}, start_buffer=0.5)
    try:
        keys = _keygen(env.root / "keys")
        env.start_host()  # no --signing-key
        env.start_agent("a", "--public-key", str(keys / "host.pub"))
        # its unsigned clock answers are refused first: the agent never syncs, so it
        # neither applies the (held) schedule nor sends a report; it says why in its own log
        env.wait_for(
            lambda: "refused clock_resp" in env.agent_log("a") and "unsigned" in env.agent_log("a"),
            "the agent refusing the host's unsigned clock_resp",
        )
        time.sleep(1.0)
        assert not env.events("a", "schedule_loaded")  # nothing unsigned was applied
        assert not env.events("a", "configured")
        # the operator learns why on the host: the agent's hello says it expects signatures
        assert "this host has no --signing-key" in env.host_log()
        assert "this host has no --signing-key" in (env.logs / "a.log").read_text()
    finally:
        env.close()


class Rogue:
    """A client of the experiment's broker that writes onto a VM's ``down`` topic."""

    def __init__(self, env: HostEnv) -> None:
        assert env.broker is not None
        self.topic = f"vmr/{env.experiment}/a/down"
        self.seen: list = []
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="rogue-" + uuid.uuid4().hex[:6])
        self.client.on_message = lambda _c, _u, m: self.seen.append(bytes(m.payload))
        self.client.connect("127.0.0.1", env.broker.port)
        self.client.loop_start()
        self.client.subscribe(self.topic, qos=1)  # watch what the host sends

    def send(self, event: Event) -> None:
        info = self.client.publish(self.topic, encode_message([event], time.time()), qos=1)
        info.wait_for_publish(10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _resume(ident: str, at: float = 5.0) -> Event:
    return Event(RESUME, time.time(), ident, {"at": at})


def _signed_mqtt_host(env: HostEnv) -> tuple:
    """Keys in ``env`` and its host started with the host key: (keys dir, host key, another key)."""
    keys = _keygen(env.root / "keys")
    host_key = load_private_key(str(keys / "host.key"))
    other_key = load_private_key(str(_write_other_key(env.root / "other")))
    env.start_host("--signing-key", str(keys / "host.key"))
    return keys, host_key, other_key


def test_forged_unsigned_stale_and_reused_resumes_are_refused(tmp_path: Path) -> None:
    env = HostEnv({"a": BREAK}, start_buffer=0.5, transport="mqtt")
    rogue = None
    try:
        keys, host_key, other_key = _signed_mqtt_host(env)
        env.start_agent("a", "--public-key", str(keys / "host.pub"))
        env.wait_event("a", "break_started")
        rogue = Rogue(env)
        now = time.time()
        attempts = {
            "unsigned": _resume("rogue-1"),
            "another key": sign(other_key, _resume("rogue-2"), "a", now),
            "signed for VM b": sign(host_key, _resume("rogue-3"), "b", now),
            "stale": sign(host_key, _resume("rogue-4"), "a", now - 3600),
        }
        for event in attempts.values():
            rogue.send(event)
        expected = {
            "rogue-1": "unsigned",
            "rogue-2": "signed by another key",
            "rogue-3": "signed for VM 'b', this is 'a'",
            "rogue-4": "stale: signed 36",
        }
        for ident, why in expected.items():
            details = env.wait_event("a", "control_refused", id=ident)["event"]["data"]["details"]
            assert why in details, (ident, details)
        # the schedule's id, validly signed by the real key but with other content: a reused id
        schedule_id = env.wait_event("a", "schedule_loaded") and _schedule_event_id(env)
        rogue.send(sign(host_key, _resume(schedule_id), "a", time.time()))
        reused = env.wait_event("a", "control_refused", id=schedule_id)["event"]["data"]["details"]
        assert "reused id" in reused
        time.sleep(1.0)
        assert not env.events("a", "resume_received")  # the break holds
        assert not [r for r in env.events("a", "entry_started") if r["event"]["data"]["index"] == 2]
        res = env.cli("resume", "a")  # the real host's RESUME, signed
        assert res.returncode == 0, res.stderr
        env.wait_event("a", "output", index=2, line="after the break")
        # the genuine RESUME the rogue saw on the topic, published again: an idempotent
        # redelivery of the same id and content (accepted, changes nothing), not a second RESUME
        genuine = [p for p in rogue.seen if b'"type":"resume"' in p]
        assert genuine, "the host's signed RESUME was seen on the down topic"
        before = len(env.events("a", "resume_received"))
        rogue.client.publish(rogue.topic, genuine[-1], qos=1).wait_for_publish(10)
        time.sleep(1.5)
        received = env.events("a", "resume_received")
        assert len(received) <= before + 1
        assert all(r["event"]["data"].get("ended_break") in (None, 1) for r in received)
    finally:
        if rogue is not None:
            rogue.close()
        env.close()


def _append_event(ident: str) -> Event:
    """A ``schedule_append`` whose batch would run ``/bin/echo appended`` at once."""
    raw = json.dumps([{"start_time": -100000, "executable": "/bin/echo", "arguments": "rogue"}]).encode()
    data = {"format": "json", "sha256": hashlib.sha256(raw).hexdigest(), "entries": 1,
            "data_b64": base64.b64encode(raw).decode()}  # fmt: skip
    return Event(SCHEDULE_APPEND, time.time(), ident, data)


def test_appended_batches_are_signed_and_forged_ones_refused(tmp_path: Path) -> None:
    """Issue 12: ``schedule add`` through a signing host is applied; a batch injected on the
    VM's topic unsigned or signed by another key is refused, and nothing of it runs."""
    env = HostEnv({"a": BREAK}, start_buffer=0.5, transport="mqtt")
    rogue = None
    try:
        keys, _host_key, other_key = _signed_mqtt_host(env)
        env.start_agent("a", "--public-key", str(keys / "host.pub"))
        env.wait_event("a", "break_started")
        rogue = Rogue(env)
        rogue.send(_append_event("append-rogue-1"))
        rogue.send(sign(other_key, _append_event("append-rogue-2"), "a", time.time()))
        unsigned = env.wait_event("a", "control_refused", id="append-rogue-1")["event"]["data"]["details"]
        assert "unsigned" in unsigned
        other = env.wait_event("a", "control_refused", id="append-rogue-2")["event"]["data"]["details"]
        assert "signed by another key" in other
        batch = tmp_path / "batch.yaml"
        batch.write_text('- {start_time: -100000, executable: /bin/echo, arguments: "host batch"}\n')
        res = env.cli("schedule", "add", "a", str(batch))
        assert res.returncode == 0, res.stderr
        env.wait_event("a", "output", index=3, line="host batch")
        appended = env.events("a", "schedule_appended")
        assert [r["event"]["data"]["first_index"] for r in appended] == [3]  # the host's only
        assert not [r for r in env.events("a", "output") if r["event"]["data"].get("line") == "rogue"]
    finally:
        if rogue is not None:
            rogue.close()
        env.close()


def _write_other_key(out: Path) -> Path:
    out.mkdir(mode=0o700)
    private_pem, _public = generate_keypair()
    path = out / "other.key"
    path.write_bytes(private_pem)
    path.chmod(0o600)
    return path


def _schedule_event_id(env: HostEnv) -> str:
    for rec in env.events("a", "result"):
        answers = rec["event"]["data"].get("answers", "")
        if answers.startswith("schedule-"):
            return str(answers)
    raise AssertionError("no answer to the schedule event in the host's log")


# ------------------------------------------------------------------------ clock_resp
def _clock_resp(ident: str, answers: str, t1: float, skew: float = 0.0) -> Event:
    now = time.time() + skew
    return Event(CLOCK_RESP, time.time(), ident, {"answers": answers, "t1": t1, "t2": now, "t3": now})


def _verifying() -> tuple:
    """A host key, another key, and ClockAnswers checking signatures for VM a."""
    host_key = Ed25519PrivateKey.generate()
    verifier = Verifier(host_key.public_key(), None)
    answers = ClockAnswers(verifier, "a")
    return host_key, Ed25519PrivateKey.generate(), answers


def test_clock_answers_take_only_a_signed_answer_to_a_pending_request() -> None:
    host_key, other_key, answers = _verifying()
    t1 = 1795405290.123456
    answers.asked("req-1", t1)
    now = time.time()
    refused = {
        "unsigned": _clock_resp("r1", "req-1", t1, 1000),
        "signed by another key": sign(other_key, _clock_resp("r2", "req-1", t1, 1000), "a", now),
        "signed for VM 'b', this is 'a'": sign(host_key, _clock_resp("r3", "req-1", t1, 1000), "b", now),
        "but its t1": sign(host_key, _clock_resp("r4", "req-1", t1 + 1e-6), "a", now),
        "bad signature": _tampered(sign(host_key, _clock_resp("r5", "req-1", t1), "a", now)),
        "never sent by this agent": sign(host_key, _clock_resp("r6", "req-0", t1), "a", now),
    }
    for why, event in refused.items():
        with pytest.raises(SignatureError, match=why):
            answers.take(event)
        assert answers.waiting  # a refused answer leaves the request pending
    genuine = sign(host_key, _clock_resp("r7", "req-1", t1), "a", now - 3600)  # no age check
    assert answers.take(genuine) == t1
    assert not answers.waiting
    with pytest.raises(SignatureError, match="replayed: clock_req 'req-1' was answered already"):
        answers.take(genuine)
    # a late answer (the burst gave up waiting) is ignored once; a second copy is a replay
    answers.asked("req-2", t1)
    answers.expire()
    late = sign(host_key, _clock_resp("r8", "req-2", t1), "a", now)
    assert answers.take(late) is None
    with pytest.raises(SignatureError, match="replayed"):
        answers.take(late)


def test_clock_answers_without_a_key_take_any_answer_to_a_pending_request() -> None:
    answers = ClockAnswers()
    answers.asked("req-1", 5.0)
    assert answers.take(_clock_resp("r1", "req-0", 5.0)) is None
    assert answers.take(_clock_resp("r2", "req-1", 5.0)) == 5.0
    assert answers.take(_clock_resp("r3", "req-1", 5.0)) is None  # ignored


def test_stamp_lead_is_the_median_of_recent_stamp_to_send_times() -> None:
    lead = StampLead(window=3, cap=0.01)
    assert lead.value == 0.0
    for seconds in (0.0001, 0.0003, 5.0, -1.0):  # 5 s clipped to the cap, a negative one dropped
        lead.note(seconds)
    assert lead.value == pytest.approx(0.0003)


def _tampered(event: Event) -> Event:
    return Event(event.type, event.timestamp, event.id, {**event.data, "t3": event.data["t3"] + 1000})


class ClockRogue(Rogue):
    """Answers every ``clock_req`` agent a sends with forged ``clock_resp``s that would move its
    clock 1000 s ahead, and records the host's genuine ``clock_resp``s."""

    def __init__(self, env: HostEnv, host_key: Ed25519PrivateKey, other_key: Ed25519PrivateKey) -> None:
        super().__init__(env)
        self.keys = (host_key, other_key)
        self.forged: dict = {}  # id -> kind
        self.client.on_message = self._on_message
        self.client.subscribe(f"vmr/{env.experiment}/a/up", qos=1)

    def _on_message(self, _client: object, _userdata: object, msg: mqtt.MQTTMessage) -> None:
        payload = bytes(msg.payload)
        if msg.topic.endswith("/down"):
            self.seen.append(payload)
            return
        for message in FrameDecoder().feed(payload + b"\n"):
            for ev in message.events:
                if ev.type == CLOCK_REQ:
                    self._forge(ev.id, float(ev.data["t1"]))

    def _forge(self, answers: str, t1: float) -> None:
        host_key, other_key = self.keys
        n = len(self.forged)
        now = time.time()
        forged = {
            "unsigned": _clock_resp(f"rogue-u{n}", answers, t1, 1000),
            "signed by another key": sign(other_key, _clock_resp(f"rogue-k{n}", answers, t1, 1000), "a", now),
            "signed for VM 'b'": sign(host_key, _clock_resp(f"rogue-b{n}", answers, t1, 1000), "b", now),
        }
        for kind, event in forged.items():
            self.forged[event.id] = kind
            self.client.publish(self.topic, encode_message([event], now), qos=1)

    def genuine_clock_resps(self) -> list:
        return [p for p in self.seen if b'"type":"clock_resp"' in p and b'"id":"host-' in p]


def test_forged_and_replayed_clock_resps_are_refused_and_leave_the_clock_alone(tmp_path: Path) -> None:
    env = HostEnv({"a": BREAK}, start_buffer=0.5, transport="mqtt")
    rogue = None
    try:
        keys, host_key, other_key = _signed_mqtt_host(env)
        rogue = ClockRogue(env, host_key, other_key)
        time.sleep(0.5)  # subscribed before the agent's first clock_req
        env.start_agent("a", "--public-key", str(keys / "host.pub"))
        env.wait_event("a", "break_started")
        for kind in ("unsigned", "signed by another key", "signed for VM 'b'"):
            ident = next(i for i, k in rogue.forged.items() if k == kind)
            details = env.wait_event("a", "control_refused", id=ident)["event"]["data"]
            assert details["type"] == "clock_resp" and kind in details["details"], details
        # a genuine, signed clock_resp the rogue recorded, published again: a replay
        genuine = rogue.genuine_clock_resps()
        assert genuine, "the host's signed clock_resp was seen on the down topic"
        assert b'"signature"' in genuine[0]
        replayed_id = _first_id(genuine[0])
        rogue.client.publish(rogue.topic, genuine[0], qos=1).wait_for_publish(10)
        details = env.wait_event("a", "control_refused", id=replayed_id)["event"]["data"]["details"]
        assert "replayed: clock_req" in details and "answered already" in details
        # the agent's clock is still the host's (same machine: true offset 0), not 1000 s off
        status = _agent_status(env, "a")
        assert abs(status["host"]["clock_offset"]) < 1.0, status["host"]
        assert "clock offset to host 1000" not in env.agent_log("a")
        for rec in env.events("a"):
            assert abs(rec["event"]["timestamp"] - time.time()) < 300, rec
    finally:
        if rogue is not None:
            rogue.close()
        env.close()


def _first_id(payload: bytes) -> str:
    for message in FrameDecoder().feed(payload + b"\n"):
        for ev in message.events:
            return ev.id
    raise AssertionError(f"no event in {payload[:200]!r}")


def _agent_status(env: HostEnv, vm: str) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "vmr_handler", "status", "--state-dir", str(env.state(vm)), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    return dict(doc.get("result", doc))
