"""Signed control messages (vmr_handler/core/wire/signing.py, SPEC section 7) and `vmr-host
keygen`."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vmr_handler.core.errors import InvalidArgument
from vmr_handler.core.events import Event
from vmr_handler.core.wire import protocol as P
from vmr_handler.core.wire.signing import (
    SIGNED_TYPES,
    SignatureError,
    SigningError,
    Verifier,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    sign,
    strip_signature,
)

NOW = 1_800_000_000.0
KEY = Ed25519PrivateKey.generate()
PUB = KEY.public_key()
RESUME = Event(P.RESUME, NOW, "resume-0001", {"at": 12.5})


def verifier(state: Any = None, **kw: Any) -> Verifier:
    return Verifier(PUB, None if state is None else str(state), **kw)


def wire(event: Event) -> Event:
    """``event`` as the agent receives it: framed, sent, decoded."""
    decoder = P.FrameDecoder()
    (msg,) = decoder.feed(P.encode_message([event], NOW))
    (received,) = msg.events
    return received


def refusal(v: Verifier, event: Event, vm: str = "vm1", now: float = NOW) -> str:
    with pytest.raises(SignatureError) as info:
        v.check(event, vm, now)
    assert info.value.event_type == event.type and info.value.event_id == event.id
    assert event.type in str(info.value) and event.id in str(info.value)
    return info.value.reason


def resign(event: Event, **signature: Any) -> Event:
    """``event`` with members of its signature replaced (not re-signed)."""
    sig: Dict[str, Any] = {**event.data["signature"], **signature}
    return Event(event.type, event.timestamp, event.id, {**event.data, "signature": sig})


def flip_bit(b64: str) -> str:
    raw = bytearray(base64.b64decode(b64))
    raw[17] ^= 0x08
    return base64.b64encode(bytes(raw)).decode()


def test_signed_types_are_the_control_messages() -> None:
    assert frozenset({"schedule", "start_time", "resume", "schedule_append", "kill"}) == SIGNED_TYPES


def test_round_trip_over_the_wire() -> None:
    signed = sign(KEY, RESUME, "vm1", NOW)
    sig = signed.data["signature"]
    assert sig["alg"] == "ed25519" and sig["vm"] == "vm1" and sig["signed_at"] == NOW
    assert sig["key_id"] == key_id(PUB) and len(sig["key_id"]) == 16
    assert strip_signature(signed) == RESUME
    verifier().check(wire(signed), "vm1", NOW + 1)


def test_the_timestamp_is_not_covered() -> None:
    """The host stamps events when it sends them, after signing."""
    signed = sign(KEY, RESUME, "vm1", NOW)
    verifier().check(Event(signed.type, NOW + 42, signed.id, signed.data), "vm1", NOW)


JSON_LEAF = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    type_=st.sampled_from(sorted(SIGNED_TYPES)),
    id_=st.text(min_size=1, max_size=P.MAX_ID),
    vm=st.text(),
    data=st.dictionaries(st.text(), JSON, max_size=5),
)
def test_any_data_survives_the_wire(type_: str, id_: str, vm: str, data: Dict[str, Any]) -> None:
    """Unicode, infinities (sent as strings), nesting: what is signed is what arrives."""
    verifier().check(wire(sign(KEY, Event(type_, NOW, id_, data), vm, NOW)), vm, NOW)


def test_unsigned_is_refused() -> None:
    assert refusal(verifier(), RESUME).startswith("unsigned")


@pytest.mark.parametrize(
    "signature, reason",
    [
        ("text", "malformed signature"),
        ({"alg": "rsa"}, "unsupported signature alg 'rsa'"),
        ({"alg": "ed25519", "vm": "vm1", "sig": "AA=="}, "malformed signature"),
        ({"alg": "ed25519", "signed_at": "inf", "vm": "vm1", "sig": "AA=="}, "malformed signature"),
    ],
)
def test_malformed_signatures_are_refused(signature: Any, reason: str) -> None:
    event = Event(RESUME.type, NOW, RESUME.id, {**RESUME.data, "signature": signature})
    assert refusal(verifier(), event).startswith(reason)


def test_another_key_is_refused_by_key_id() -> None:
    other = Ed25519PrivateKey.generate()
    reason = refusal(verifier(), sign(other, RESUME, "vm1", NOW))
    assert reason.startswith(f"signed by another key (key_id '{key_id(other.public_key())}'")


def test_another_key_claiming_our_key_id_is_a_bad_signature() -> None:
    forged = resign(sign(Ed25519PrivateKey.generate(), RESUME, "vm1", NOW), key_id=key_id(PUB))
    assert refusal(verifier(), forged).startswith("bad signature")


def test_signed_for_another_vm_is_refused() -> None:
    assert (
        refusal(verifier(), sign(KEY, RESUME, "vm2", NOW), vm="vm1") == "signed for VM 'vm2', this is 'vm1'"
    )


@pytest.mark.parametrize(
    "tamper",
    [
        lambda e: Event(P.START_TIME, e.timestamp, e.id, e.data),
        lambda e: Event(e.type, e.timestamp, "resume-0002", e.data),
        lambda e: Event(e.type, e.timestamp, e.id, {**e.data, "at": 13.5}),
        lambda e: Event(e.type, e.timestamp, e.id, {**e.data, "extra": None}),
        lambda e: resign(e, vm="vm2"),
        lambda e: resign(e, signed_at=NOW + 1),
        lambda e: resign(e, sig="not base64!"),
        lambda e: resign(e, sig=flip_bit(e.data["signature"]["sig"])),
    ],
    ids=["type", "id", "data", "data-added", "vm", "signed_at", "sig-garbage", "sig-bits"],
)
def test_tampering_breaks_the_signature(tamper: Any) -> None:
    tampered = tamper(sign(KEY, RESUME, "vm1", NOW))
    assert refusal(verifier(), tampered, vm=tampered.data["signature"]["vm"]).startswith("bad signature")


@settings(max_examples=60)
@given(data=st.dictionaries(st.text(), JSON, min_size=1, max_size=4), new=JSON)
def test_changing_any_data_value_breaks_the_signature(data: Dict[str, Any], new: Any) -> None:
    key = sorted(data)[0]
    signed = sign(KEY, Event(P.SCHEDULE, NOW, "s", data), "vm1", NOW)
    changed = wire(Event(signed.type, NOW, signed.id, {**signed.data, key: new}))
    if json.dumps(changed.data, sort_keys=True) == json.dumps(wire(signed).data, sort_keys=True):
        return  # the new value is the old one (0 and 0.0 or False still differ here, as signed)
    with pytest.raises(SignatureError, match="bad signature"):
        verifier().check(changed, "vm1", NOW)


def test_stale_and_future_are_refused() -> None:
    v = verifier(max_age=300)
    assert refusal(v, sign(KEY, RESUME, "vm1", NOW - 412)) == "stale: signed 412.0 s ago (limit 300 s)"
    assert refusal(v, sign(KEY, RESUME, "vm1", NOW + 301)) == "signed 301.0 s in the future (limit 300 s)"
    v.check(sign(KEY, RESUME, "vm1", NOW - 299), "vm1", NOW)
    v.check(sign(KEY, RESUME, "vm1", NOW + 299), "vm1", NOW)


def test_a_resend_re_signed_after_a_reconnect_is_accepted() -> None:
    """The host re-sends the same event with a fresh signed_at at every handshake."""
    v = verifier()
    for k in range(5):
        t = NOW + 1000 * k
        v.check(wire(sign(KEY, RESUME, "vm1", t)), "vm1", t + 0.5)
    assert v.remembered == 1


def test_a_reused_id_with_other_content_is_refused() -> None:
    v = verifier()
    v.check(sign(KEY, RESUME, "vm1", NOW), "vm1", NOW)
    other_data = Event(P.RESUME, NOW, RESUME.id, {"at": 99.0})
    other_type = Event(P.START_TIME, NOW, RESUME.id, dict(RESUME.data))
    for event in (other_data, other_type):
        reason = refusal(v, sign(KEY, event, "vm1", NOW + 1), now=NOW + 1)
        assert reason == f"reused id: id {RESUME.id!r} was signed before with different content"


def test_a_stale_resend_is_refused_even_when_known() -> None:
    v = verifier()
    v.check(sign(KEY, RESUME, "vm1", NOW), "vm1", NOW)
    assert refusal(v, sign(KEY, RESUME, "vm1", NOW), now=NOW + 301).startswith("stale")


def test_the_memory_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "signed-ids.json"
    verifier(state).check(sign(KEY, RESUME, "vm1", NOW), "vm1", NOW)
    assert state.stat().st_mode & 0o777 == 0o600
    again = verifier(state)
    assert again.remembered == 1
    again.check(sign(KEY, RESUME, "vm1", NOW + 60), "vm1", NOW + 60)
    changed = Event(P.RESUME, NOW, RESUME.id, {"at": 1.0})
    assert refusal(again, sign(KEY, changed, "vm1", NOW + 60), now=NOW + 60).startswith("reused id")


def test_the_memory_is_bounded_oldest_first(tmp_path: Path) -> None:
    state = tmp_path / "ids.json"
    v = verifier(state, max_ids=3)
    for i in range(5):
        v.check(sign(KEY, Event(P.RESUME, NOW, f"r{i}", {"at": i}), "vm1", NOW), "vm1", NOW)
    assert v.remembered == 3
    assert [i for i, _d in json.loads(state.read_text())["ids"]] == ["r2", "r3", "r4"]
    # r0 is forgotten: the same id with other content is new again; r4 is still known
    v2 = verifier(state, max_ids=2)  # a smaller bound trims what was saved
    assert v2.remembered == 2
    v2.check(sign(KEY, Event(P.RESUME, NOW, "r0", {"at": 7}), "vm1", NOW), "vm1", NOW)
    assert refusal(v2, sign(KEY, Event(P.RESUME, NOW, "r4", {"at": 7}), "vm1", NOW)).startswith("reused id")


def test_a_failed_save_does_not_accept(tmp_path: Path) -> None:
    state = tmp_path / "gone" / "ids.json"  # its directory does not exist
    v = verifier(state)
    with pytest.raises(SigningError, match=f"cannot save replay memory {re.escape(str(state))}") as info:
        v.check(sign(KEY, RESUME, "vm1", NOW), "vm1", NOW)
    assert not isinstance(info.value, SignatureError)
    assert v.remembered == 0


@pytest.mark.parametrize(
    "content", [b"{", b"[]", b'{"version": 9, "ids": []}', b'{"version": 1, "ids": [1]}']
)
def test_an_unusable_memory_file_is_named(tmp_path: Path, content: bytes) -> None:
    state = tmp_path / "ids.json"
    state.write_bytes(content)
    with pytest.raises(SigningError, match=f"replay memory {re.escape(str(state))} is not usable"):
        verifier(state)


def test_bad_limits() -> None:
    with pytest.raises(InvalidArgument):
        verifier(max_age=0)
    with pytest.raises(InvalidArgument):
        verifier(max_ids=0)


# ----------------------------------------------------------------------------------- keys
def test_generated_pems_load() -> None:
    private_pem, public_pem = generate_keypair()
    assert private_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    pub = load_public_key(public_pem)
    assert load_public_key(public_pem.decode()) is not None
    private = serialization.load_pem_private_key(private_pem, None)
    assert isinstance(private, Ed25519PrivateKey)
    Verifier(pub, None).check(sign(private, RESUME, "vm1", NOW), "vm1", NOW)


def keygen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "keygen", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_keygen_cli(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    res = keygen("--out", str(out))
    assert res.returncode == 0, res.stderr
    key_path, pub_path = out / "host.key", out / "host.pub"
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert out.stat().st_mode & 0o777 == 0o700
    private, public = load_private_key(str(key_path)), load_public_key(str(pub_path))
    assert f"key id: {key_id(public)}" in res.stdout and str(pub_path) in res.stdout
    Verifier(public, None).check(sign(private, RESUME, "vm1", NOW), "vm1", NOW)

    before = key_path.read_bytes(), pub_path.read_bytes()
    refused = keygen("--out", str(out))
    assert refused.returncode == 2
    assert "already exist" in refused.stderr and "--force" in refused.stderr
    assert (key_path.read_bytes(), pub_path.read_bytes()) == before

    forced = keygen("--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert key_path.read_bytes() != before[0] and key_path.stat().st_mode & 0o777 == 0o600
    assert load_public_key(str(pub_path)) is not None


def test_keygen_refuses_when_only_one_file_exists(tmp_path: Path) -> None:
    (tmp_path / "host.pub").write_text("old")
    res = keygen("--out", str(tmp_path))
    assert res.returncode == 2 and "host.pub already exists" in res.stderr
    assert not (tmp_path / "host.key").exists()


def write(path: Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    os.chmod(path, mode)
    return str(path)


@pytest.fixture
def pems() -> Dict[str, bytes]:
    private_pem, public_pem = generate_keypair()
    ec_key = ec.generate_private_key(ec.SECP256R1())
    return {
        "private": private_pem,
        "public": public_pem,
        "ec_private": ec_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        "ec_public": ec_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        "rsa_public": rsa.generate_private_key(65537, 2048)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        "encrypted": Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        ),
    }


@pytest.mark.parametrize(
    "content, mode, message",
    [
        ("private", 0o640, "is accessible by group/others (mode 0640); refusing to use it: chmod 600"),
        ("private", 0o604, "(mode 0604)"),
        (b"hello", 0o600, "is not a PEM key"),
        ("public", 0o600, "holds a public key, not a private key"),
        ("ec_private", 0o600, "is an EC (secp256r1) key, not an Ed25519 key"),
        ("encrypted", 0o600, "is encrypted"),
        (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", 0o600, "not a usable PEM"),
    ],
)
def test_bad_private_key_files(
    tmp_path: Path, pems: Dict[str, bytes], content: Any, mode: int, message: str
) -> None:
    path = write(tmp_path / "host.key", pems[content] if isinstance(content, str) else content, mode)
    with pytest.raises(SigningError, match=f"^private key file {re.escape(path)} ") as info:
        load_private_key(path)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not a PEM key"),
        ("private", "holds a private key; give the public key (host.pub) instead"),
        ("ec_public", "is an EC (secp256r1) key, not an Ed25519 key"),
        ("rsa_public", "is an RSA (2048-bit) key, not an Ed25519 key"),
        (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "not a usable PEM"),
    ],
)
def test_bad_public_key_files(tmp_path: Path, pems: Dict[str, bytes], content: Any, message: str) -> None:
    path = write(tmp_path / "host.pub", pems[content] if isinstance(content, str) else content, 0o644)
    with pytest.raises(SigningError, match=f"^public key file {re.escape(path)} ") as info:
        load_public_key(path)
    assert message in str(info.value)


def test_missing_key_files_are_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    for load in (load_private_key, load_public_key):
        with pytest.raises(SigningError, match=f"cannot read key file {re.escape(missing)}: No such file"):
            load(missing)


def test_public_key_text_errors_say_text() -> None:
    with pytest.raises(SigningError, match=r"^public key text holds a private key"):
        load_public_key(generate_keypair()[0].decode())
