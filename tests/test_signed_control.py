"""Signed control messages end to end (issue 6 §2, SPEC §7): a real ``vmr-host serve
--signing-key`` and real agents with ``--public-key``.

Over both transports a signed experiment runs normally (schedule, start time, break,
``vmr-host resume``). Over MQTT a rogue publisher (the test's broker is anonymous, so anyone
may write the VM's ``down`` topic: exactly what signatures are for) injects RESUMEs that are
unsigned, signed with another key, stale, or reuse an earlier RESUME's id with new content:
each is refused, reported as ``control_refused`` in the host's log, and the break holds until
the real host's RESUME ends it.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.hostenv import HostEnv
from vmr_handler.core.events import Event
from vmr_handler.core.protocol import RESUME, encode_message
from vmr_handler.core.signing import generate_keypair, load_private_key, sign

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
        refused = env.wait_event("a", "control_refused", type="schedule")["event"]["data"]
        assert "unsigned" in refused["details"]
        time.sleep(1.0)
        assert not env.events("a", "schedule_loaded")  # nothing unsigned was applied
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


def test_forged_unsigned_stale_and_reused_resumes_are_refused(tmp_path: Path) -> None:
    env = HostEnv({"a": BREAK}, start_buffer=0.5, transport="mqtt")
    rogue = None
    try:
        keys = _keygen(env.root / "keys")
        host_key = load_private_key(str(keys / "host.key"))
        other_key = load_private_key(str(_write_other_key(env.root / "other")))
        env.start_host("--signing-key", str(keys / "host.key"))
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
