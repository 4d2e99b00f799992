"""Signed control messages: Ed25519 signatures on ``schedule``, ``start_time``, ``resume``,
``schedule_append`` and ``kill``.

Pure logic plus key files; no transport, no clock of its own (SPEC section 7).
With a host key configured, the host signs every control event of :data:`SIGNED_TYPES` just
before sending it, and the agent verifies it with the host's public key (baked into the
image / named in its config) before acting on it::

    # host, once:    vmr-host keygen --out /etc/vmr-host   -> host.key (0600), host.pub
    key = load_private_key("/etc/vmr-host/host.key")
    wire_event = sign(key, event, vm="vm1", now=time.time())      # at every (re)send

    # agent, once at start-up:
    verifier = Verifier(load_public_key("/etc/vmr-handler/host.pub"),
                        state_path="/var/lib/vmr-handler/signed-ids.json")
    # for every received event whose type is in SIGNED_TYPES:
    verifier.check(event, vm=config.vm_name, now=clock.now())     # raises SignatureError

What is signed. :func:`sign` adds ``data["signature"] = {"alg": "ed25519", "key_id",
"signed_at", "vm", "sig"}``. ``sig`` is the base64 Ed25519 signature of
:data:`SIGNING_CONTEXT` followed by the canonical JSON (``sort_keys``, no spaces, ASCII only,
no NaN/infinity) of ``{"type", "id", "vm", "signed_at", "data"}`` where ``data`` is the
event's data without its ``signature`` member. ``vm`` binds the message to one VM: a message
signed for VM ``a`` is refused by VM ``b``. The event's own ``timestamp`` is **not** covered:
the host stamps events when it sends them, after signing; ``signed_at`` is the signed time.

What :meth:`Verifier.check` refuses, in this order (each a :class:`SignatureError` whose
``reason`` says which): ``unsigned``; ``malformed signature (...)``; an ``alg`` other than
``ed25519``; ``signed by another key (key_id ...)``; ``bad signature`` (any change to type,
id, vm, signed_at or data after signing); ``signed for VM x, this is y``; ``stale: signed N s
ago`` / ``signed N s in the future`` (more than ``max_age`` seconds either way, by the agent's
host-synchronised clock); ``reused id: id X was signed before with different content``.

Replay rule. The host re-sends the same control event (same id, type and data) after every
reconnect, re-signed with a fresh ``signed_at``: that redelivery is **accepted**, and the
agent's handlers stay idempotent by id (a RESUME id is applied once). An id already accepted
with a different type or data is refused. The verifier remembers, per accepted id, a digest
of ``(type, data without signature)``, in accepted order, at most ``max_ids`` (the oldest are
dropped), persisted atomically as JSON in ``state_path`` so that the memory survives an agent
restart or a reboot. A captured message replayed later than ``max_age`` is stale; one
replayed sooner is a redelivery (harmless, by the idempotence above).

``clock_resp``. With a key the host also signs every ``clock_resp`` (same format);
the agent checks it with :meth:`Verifier.authenticate` (the refusals above up to ``signed for
VM``) and takes it only when it answers a ``clock_req`` still waiting, with that request's exact
``t1`` (:class:`vmr_handler.core.wire.clockanswers.ClockAnswers`): no age check (the clock is what is
being synchronised) and no replay memory on disk (the request ids are single-use).

Units: every time is UTC epoch seconds (float); ages are seconds.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import math
import os
import stat
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from vmr_handler.core.errors import InvalidArgument, SignatureError, SigningError
from vmr_handler.core.events import Event, json_safe
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.wire import protocol as P

__all__ = [
    "ALG",
    "SIGNATURE_FIELD",
    "SIGNED_TYPES",
    "SIGNING_CONTEXT",
    "SignatureError",
    "SigningError",
    "Verifier",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "sign",
    "strip_signature",
]

#: Event types that must be signed when a host key is configured (SPEC section 7).
SIGNED_TYPES = frozenset({P.SCHEDULE, P.START_TIME, P.RESUME, P.SCHEDULE_APPEND, P.KILL})
#: The member of ``data`` that carries the signature.
SIGNATURE_FIELD = "signature"
ALG = "ed25519"
#: Prefixed to the canonical JSON before signing (domain separation: a signature made for a
#: control message cannot be mistaken for anything else signed with the same key).
SIGNING_CONTEXT = b"vmr-handler signed control message v1\n"
STATE_VERSION = 1


# ------------------------------------------------------------------------------------ keys
def generate_keypair() -> Tuple[bytes, bytes]:
    """A fresh Ed25519 key pair as ``(private PEM PKCS8 unencrypted, public PEM SubjectPublicKeyInfo)``."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def key_id(public_key: Ed25519PublicKey) -> str:
    """The key's short id: the first 16 hex digits of the sha256 of its 32 raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _read_key_file(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise SigningError(f"cannot read key file {path}: {exc.strerror}") from exc


def _require_pem(data: bytes, where: str, kind: str) -> None:
    """Refuse ``data`` (from ``where``) unless it is the PEM text of a ``kind`` key
    (``"private"`` or ``"public"``): not PEM, or the other kind of key."""
    if not data.lstrip().startswith(b"-----BEGIN "):
        raise SigningError(f"{where} is not a PEM key (no '-----BEGIN' line)")
    if kind == "private" and b"PUBLIC KEY-----" in data:
        raise SigningError(f"{where} holds a public key, not a private key")
    if kind == "public" and b"PRIVATE KEY-----" in data:
        raise SigningError(f"{where} holds a private key; give the public key (host.pub) instead")


def load_private_key(path: str) -> Ed25519PrivateKey:
    """The host's Ed25519 private key from a PEM (PKCS8, unencrypted) file.

    Raises:
        SigningError: naming ``path``: unreadable; group/world accessible (mode & 0o077, like
            ssh: ``chmod 600`` it); not a PEM; encrypted; not a private key; not Ed25519.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SigningError(f"cannot read key file {path}: {exc.strerror}") from exc
    if stat.S_IMODE(mode) & 0o077:
        raise SigningError(
            f"private key file {path} is accessible by group/others (mode {stat.S_IMODE(mode):04o}); "
            f"refusing to use it: chmod 600 {path}"
        )
    data = _read_key_file(path)
    where = f"private key file {path}"
    _require_pem(data, where, "private")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # encrypted PEM without a password
        raise SigningError(f"{where} is encrypted; use an unencrypted PKCS8 key (vmr-host keygen)") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SigningError(f"{where} is not a usable PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{where} is {_kind(key)}, not an Ed25519 key")
    return key


def load_public_key(source: Union[str, bytes]) -> Ed25519PublicKey:
    """The host's Ed25519 public key from PEM text (``str``/``bytes`` starting with
    ``-----BEGIN``) or from the path of a PEM (SubjectPublicKeyInfo) file.

    Raises:
        SigningError: naming the file (or "public key text"): unreadable; not a PEM; a
            private key given instead of the public one; not Ed25519.
    """
    if isinstance(source, bytes) or source.lstrip().startswith("-----BEGIN "):
        data = source if isinstance(source, bytes) else source.encode("ascii", "replace")
        where = "public key text"
    else:
        data = _read_key_file(source)
        where = f"public key file {source}"
    _require_pem(data, where, "public")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SigningError(f"{where} is not a usable PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningError(f"{where} is {_kind(key)}, not an Ed25519 key")
    return key


def _kind(key: Any) -> str:
    """What kind of key ``key`` is, for error messages: "an RSA key", "an EC (secp256r1) key"..."""
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return f"an RSA ({key.key_size}-bit) key"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return f"an EC ({key.curve.name}) key"
    return f"a {type(key).__name__} key"


# ----------------------------------------------------------------------------- the format
def _plain_data(data: Mapping[str, Any]) -> Dict[str, Any]:
    """``data`` without its signature member."""
    return {k: v for k, v in data.items() if k != SIGNATURE_FIELD}


def _canonical(value: Any) -> bytes:
    return json.dumps(
        json_safe(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _signed_bytes(event: Event, vm: str, signed_at: float) -> bytes:
    body = {
        "type": event.type,
        "id": event.id,
        "vm": vm,
        "signed_at": signed_at,
        "data": _plain_data(event.data),
    }
    return SIGNING_CONTEXT + _canonical(body)


def _content_digest(event: Event) -> str:
    """sha256 hex of ``(type, data without signature)``: what a redelivery must repeat."""
    return hashlib.sha256(_canonical([event.type, _plain_data(event.data)])).hexdigest()


def strip_signature(event: Event) -> Event:
    """``event`` without ``data["signature"]`` (the same object when it has none)."""
    if SIGNATURE_FIELD not in event.data:
        return event
    return Event(event.type, event.timestamp, event.id, _plain_data(event.data))


def sign(key: Ed25519PrivateKey, event: Event, vm: str, now: float) -> Event:
    """A copy of ``event`` signed for VM ``vm`` at ``now`` (UTC epoch seconds, host clock).

    ``data`` is made JSON safe (:func:`vmr_handler.core.events.json_safe`, as on the wire) and gets
    ``"signature": {"alg": "ed25519", "key_id", "signed_at": now, "vm", "sig": base64}``.
    An existing signature is replaced, so re-signing a stored event for a resend is just
    ``sign(key, stored, vm, time.time())``. The event's ``timestamp`` is not covered.

    Raises:
        InvalidArgument: ``now`` is not finite (the JSON encoder refuses NaN/infinity).
    """
    signed_at = float(now)
    if not math.isfinite(signed_at):
        raise InvalidArgument(f"now must be a finite UTC epoch time, got {now!r}")
    plain = Event(event.type, event.timestamp, event.id, json_safe(_plain_data(event.data)))
    sig = key.sign(_signed_bytes(plain, vm, signed_at))
    signature = {
        "alg": ALG,
        "key_id": key_id(key.public_key()),
        "signed_at": signed_at,
        "vm": vm,
        "sig": base64.b64encode(sig).decode("ascii"),
    }
    return Event(plain.type, plain.timestamp, plain.id, {**plain.data, SIGNATURE_FIELD: signature})


# ------------------------------------------------------------------------------- verifier
class Verifier:
    """Checks signed control events on the agent and remembers the ids it accepted.

    Args:
        public_key: the host's key (:func:`load_public_key`).
        state_path: JSON file of the replay memory (e.g. ``<state-dir>/signed-ids.json``),
            written atomically on every newly accepted id; None keeps it in memory only.
        max_age: largest ``|now - signed_at|`` accepted, seconds (default 300).
        max_ids: ids remembered; beyond that the oldest accepted are forgotten (default 10000).

    Raises:
        SigningError: ``state_path`` exists but cannot be read or is not a replay memory
            (the message names the file; move it aside to start afresh).
        InvalidArgument: ``max_age`` not > 0 or ``max_ids`` not >= 1.
    """

    def __init__(
        self,
        public_key: Ed25519PublicKey,
        state_path: Optional[str],
        max_age: float = 300.0,
        max_ids: int = 10000,
    ) -> None:
        if not max_age > 0:
            raise InvalidArgument(f"max_age must be > 0 seconds, got {max_age!r}")
        if max_ids < 1:
            raise InvalidArgument(f"max_ids must be >= 1, got {max_ids!r}")
        self.public_key = public_key
        self.key_id = key_id(public_key)
        self.state_path = state_path
        self.max_age = float(max_age)
        self.max_ids = max_ids
        self._seen: Dict[str, str] = self._load()  # id -> content digest, oldest first
        self._trim()

    @property
    def remembered(self) -> int:
        """How many accepted ids are remembered now."""
        return len(self._seen)

    def check(self, event: Event, vm: str, now: float) -> None:
        """Accept ``event`` for VM ``vm`` at ``now`` (UTC epoch seconds, the agent's
        host-synchronised clock), or raise.

        A first acceptance of an id is recorded (and saved to ``state_path``) before this
        returns; a redelivery (same id, type and data, any ``signed_at`` within ``max_age``)
        is accepted without writing.

        Raises:
            SignatureError: the event is refused; ``reason`` is one of the reasons in the
                module docstring, and the message names the event type and id.
            SigningError: the replay memory cannot be saved (the event is not accepted; a
                redelivery is checked again).
        """
        signed_at = self.authenticate(event, vm)

        def refuse(reason: str) -> SignatureError:
            return SignatureError(event.type, event.id, reason)

        age = now - signed_at
        if age > self.max_age:
            raise refuse(f"stale: signed {age:.1f} s ago (limit {self.max_age:g} s)")
        if -age > self.max_age:
            raise refuse(f"signed {-age:.1f} s in the future (limit {self.max_age:g} s)")
        digest = _content_digest(event)
        known = self._seen.get(event.id)
        if known == digest:
            return  # a legitimate redelivery, re-signed by the host after a reconnect
        if known is not None:
            raise refuse(f"reused id: id {event.id!r} was signed before with different content")
        self._seen[event.id] = digest
        self._trim()
        try:
            self._save()
        except OSError as exc:
            del self._seen[event.id]
            raise SigningError(f"cannot save replay memory {self.state_path}: {exc.strerror}") from exc

    def authenticate(self, event: Event, vm: str) -> float:
        """Check that ``event`` is signed by the host key for VM ``vm``, nothing more (no age,
        no replay memory: the caller judges freshness, e.g. a ``clock_resp`` by the request
        it answers, :mod:`vmr_handler.core.wire.clockanswers`). Returns the signed ``signed_at``
        (UTC epoch seconds, host clock).

        Raises:
            SignatureError: unsigned, malformed signature, unsupported alg, signed by another
                key, bad signature, or signed for another VM (the module docstring's reasons).
        """
        sig = event.data.get(SIGNATURE_FIELD)

        def refuse(reason: str) -> SignatureError:
            return SignatureError(event.type, event.id, reason)

        if sig is None:
            raise refuse("unsigned (a host key is configured, so this event must be signed)")
        if not isinstance(sig, Mapping):
            raise refuse("malformed signature (not an object)")
        if sig.get("alg") != ALG:
            raise refuse(f"unsupported signature alg {sig.get('alg')!r} (expected {ALG!r})")
        signed_at = P._finite(sig.get("signed_at"))
        signed_vm, raw_sig = sig.get("vm"), sig.get("sig")
        if signed_at is None or not isinstance(signed_vm, str) or not isinstance(raw_sig, str):
            raise refuse("malformed signature (needs a numeric signed_at and string vm and sig)")
        if sig.get("key_id") != self.key_id:
            raise refuse(
                f"signed by another key (key_id {sig.get('key_id')!r}, this agent trusts {self.key_id})"
            )
        try:
            self.public_key.verify(
                base64.b64decode(raw_sig, validate=True), _signed_bytes(event, signed_vm, signed_at)
            )
        except (binascii.Error, InvalidSignature, ValueError):
            raise refuse("bad signature (the message was altered or not signed by the host)") from None
        if signed_vm != vm:
            raise refuse(f"signed for VM {signed_vm!r}, this is {vm!r}")
        return signed_at

    # ------------------------------------------------------------------ persistence
    def _trim(self) -> None:
        while len(self._seen) > self.max_ids:
            del self._seen[next(iter(self._seen))]

    def _load(self) -> Dict[str, str]:
        if self.state_path is None:
            return {}
        try:
            with open(self.state_path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return {}
            raise SigningError(f"cannot read replay memory {self.state_path}: {exc.strerror}") from exc
        try:
            doc = json.loads(raw)
            if doc.get("version") != STATE_VERSION:
                raise SigningError(
                    f"replay memory {self.state_path} is not usable (version {doc.get('version')!r}, "
                    f"expected {STATE_VERSION}); move it aside to start with an empty memory"
                )
            pairs = doc["ids"]
            seen = {str(i): str(d) for i, d in pairs}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SigningError(
                f"replay memory {self.state_path} is not usable ({type(exc).__name__}: {exc}); "
                "move it aside to start with an empty memory"
            ) from exc
        return seen

    def _save(self) -> None:
        if self.state_path is None:
            return
        doc = {"version": STATE_VERSION, "ids": [[i, d] for i, d in self._seen.items()]}
        atomic_write(self.state_path, json.dumps(doc, separators=(",", ":")).encode("ascii"), 0o600)
