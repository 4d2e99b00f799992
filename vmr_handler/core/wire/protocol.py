"""The agent <-> host protocol, version 1 (``docs/protocol.md``): pure, no I/O.

One message model for every transport (SPEC section 6, seeds 001 and 004): a message is
``{"now": <sender UTC>, "events": [{"timestamp", "type", "id", "data"}, ...]}`` with
ascending timestamps; every event has a unique ``id``; answers carry ``answers`` (the id
they answer), ``status`` (``success``/``error``) and ``details``.

Framing for byte streams (virtio-serial, unix sockets): one message per line, UTF-8 JSON
(which never contains a raw newline) terminated by ``\\n``. Every connection begins with a
bare ``\\n`` so that a partial frame left by a dropped connection ends there and is
discarded as one malformed frame. :class:`FrameDecoder` survives partial reads, resyncs at
the next newline after garbage, and drops frames longer than its limit without buffering
them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vmr_handler.core.errors import ProtocolError
from vmr_handler.core.events import Event, json_safe

PROTOCOL_VERSION = 1
#: Default largest frame, bytes (a 64 KiB output piece base64-encoded fits many times over).
MAX_FRAME = 1024 * 1024
#: Sent first on every connection (ends any partial frame left in the stream).
CONNECT_PREFIX = b"\n"
MAX_ID = 128
MAX_TYPE = 64

# --- control event types (reports use the agent event types of vmr_handler.core.events) ----------
HELLO = "hello"  # agent -> host, first on every connection
WELCOME = "welcome"  # host -> agent, answers hello
SCHEDULE = "schedule"  # host -> agent: the schedule bytes
RESULT = "result"  # either way: answers a request (schedule, resource, resume...)
ACK = "ack"  # either way: ids received and stored
CLOCK_REQ = "clock_req"  # agent -> host: t1
CLOCK_RESP = "clock_resp"  # host -> agent: t1, t2, t3
RESOURCE_REQUEST = "resource_request"  # agent -> host: name, offset
RESOURCE_CHUNK = "resource_chunk"  # host -> agent
START_TIME = "start_time"  # host -> agent: experiment start, UTC
RESUME = "resume"  # host -> agent: at (host experiment seconds)
SCHEDULE_APPEND = "schedule_append"  # host -> agent: a batch of entries to append
KILL = "kill"  # host -> agent: end entry `index`'s process tree (signal, grace, by)
HEARTBEAT = "heartbeat"  # either way
TRANSFER_CHUNK = "transfer_chunk"  # agent -> host: a piece of a file transferred out
TRANSFER_UPLOADED = "transfer_uploaded"  # agent -> host: a file transferred out was uploaded over HTTP(S)
HOST_ENTRY = "host_entry"  # agent -> host: run on_host entry `index` now; answered by a result

#: The signals a ``kill`` may send first (``SIG`` + name); SIGKILL follows after the grace.
KILL_SIGNALS = ("TERM", "KILL", "INT", "HUP")
#: Longest grace period of a ``kill``, seconds.
MAX_GRACE = 3600.0


@dataclass(frozen=True)
class Message:
    """A decoded message: sender clock ``now`` (UTC seconds) and its events in order."""

    now: float
    events: Tuple[Event, ...]


def encode_message(events: Sequence[Event], now: float) -> bytes:
    """One frame: the seed-001 message of ``events`` (sorted by timestamp) + ``\\n``."""
    items = sorted((e.to_dict() for e in events), key=lambda d: d["timestamp"])
    latest = max([now, *(d["timestamp"] for d in items)])
    body = json.dumps(json_safe({"now": latest, "events": items}), separators=(",", ":"), allow_nan=False)
    return body.encode("utf-8") + b"\n"


def encode_raw_message(events: Sequence[Tuple[float, bytes]], now: float) -> bytes:
    """One frame from events already serialised as strict JSON: ``(timestamp, json bytes)``
    pairs (e.g. as stored in the outbox), sorted by timestamp; nothing is parsed again."""
    items = sorted(events, key=lambda item: item[0])
    latest = max([now, *(ts for ts, _raw in items)])
    return (
        b'{"now":' + json.dumps(latest).encode() + b',"events":[' + b",".join(r for _ts, r in items) + b"]}\n"
    )


def _finite(value: Any) -> Optional[float]:
    """``value`` as a float when it is a finite JSON number, else None (an integer too large
    for a float included: JSON allows it, and ``math.isfinite`` would raise OverflowError)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def parse_message(obj: Any) -> Message:
    """Validate a decoded JSON value as a message.

    Raises:
        ProtocolError: naming what is wrong (not an object, missing ``now``, an event without
            a string ``id``, timestamps not ascending, ...).
    """
    if not isinstance(obj, dict):
        raise ProtocolError(f"message must be a JSON object, got {type(obj).__name__}")
    now = _finite(obj.get("now"))
    if now is None:
        raise ProtocolError("message field 'now' must be a finite number")
    raw_events = obj.get("events")
    if not isinstance(raw_events, list):
        raise ProtocolError("message field 'events' must be a list")
    events: List[Event] = []
    last = -math.inf
    for i, raw in enumerate(raw_events):
        if not isinstance(raw, dict):
            raise ProtocolError(f"event {i} must be an object")
        ts, type_, id_, data = (
            _finite(raw.get("timestamp")),
            raw.get("type"),
            raw.get("id"),
            raw.get("data", {}),
        )
        if ts is None:
            raise ProtocolError(f"event {i}: 'timestamp' must be a finite number")
        if ts < last:
            raise ProtocolError(f"event {i}: timestamps must be ascending")
        last = ts
        if not isinstance(type_, str) or not type_ or len(type_) > MAX_TYPE:
            raise ProtocolError(f"event {i}: 'type' must be a short string")
        if not isinstance(id_, str) or not id_ or len(id_) > MAX_ID:
            raise ProtocolError(f"event {i}: 'id' must be a string of 1..{MAX_ID} characters")
        if not isinstance(data, dict):
            raise ProtocolError(f"event {i} ({type_}): 'data' must be an object")
        events.append(Event(type_, ts, id_, data))
    return Message(now, tuple(events))


@dataclass
class DecoderStats:
    """Counters of a :class:`FrameDecoder` (the host reports them per VM)."""

    frames: int = 0
    malformed: int = 0
    oversize: int = 0
    bytes: int = 0
    last_error: Optional[str] = None


@dataclass
class FrameDecoder:
    """Incremental newline-framed JSON decoder with a frame size limit.

    ``feed(bytes)`` returns the valid :class:`Message` objects completed by these bytes;
    malformed frames (bad UTF-8/JSON/shape) and oversize frames are counted in ``stats``
    and dropped. A frame longer than ``max_frame`` is discarded up to its newline without
    being buffered, so memory stays bounded by ``max_frame``.
    """

    max_frame: int = MAX_FRAME
    stats: DecoderStats = field(default_factory=DecoderStats)
    _buf: bytearray = field(default_factory=bytearray)
    _skipping: bool = False

    def feed(self, data: bytes) -> List[Message]:
        self.stats.bytes += len(data)
        out: List[Message] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                if not self._skipping:
                    self._buf += data[start:]
                    if len(self._buf) > self.max_frame:
                        self._oversize()
                return out
            if self._skipping:
                self._skipping = False  # the oversize frame ends here
            else:
                self._buf += data[start:nl]
                if len(self._buf) > self.max_frame:
                    self._oversize()
                    self._skipping = False
                else:
                    frame = bytes(self._buf)
                    self._buf.clear()
                    msg = self._decode(frame)
                    if msg is not None:
                        out.append(msg)
            start = nl + 1

    def _oversize(self) -> None:
        self._buf.clear()
        self._skipping = True
        self.stats.oversize += 1
        self.stats.last_error = f"frame longer than {self.max_frame} bytes dropped"

    def _decode(self, frame: bytes) -> Optional[Message]:
        if not frame.strip():
            return None  # keep-alive / connection prefix
        try:
            msg = parse_message(json.loads(frame.decode("utf-8")))
        except (UnicodeDecodeError, ValueError, RecursionError, ProtocolError) as exc:
            self.stats.malformed += 1
            self.stats.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            return None
        self.stats.frames += 1
        return msg


# --- clock synchronisation (NTP-style, SPEC section 4 "Clock") ------------------------------
@dataclass(frozen=True)
class ClockSample:
    """One request/response exchange, all UTC seconds: t1 agent send, t2 host receive,
    t3 host send, t4 agent receive."""

    t1: float
    t2: float
    t3: float
    t4: float

    @property
    def offset(self) -> float:
        """Host clock minus agent clock, seconds (NTP ``((t2 - t1) + (t3 - t4)) / 2``)."""
        return ((self.t2 - self.t1) + (self.t3 - self.t4)) / 2

    @property
    def delay(self) -> float:
        """Round-trip time excluding the host's processing, seconds."""
        return (self.t4 - self.t1) - (self.t3 - self.t2)


def best_offset(samples: Sequence[ClockSample]) -> Optional[ClockSample]:
    """The sample with the smallest delay (its offset has the smallest error bound), or None."""
    valid = [s for s in samples if s.delay >= 0]
    return min(valid, key=lambda s: s.delay) if valid else None


def result_data(answers: str, ok: bool, details: str, **extra: Any) -> Dict[str, Any]:
    """``data`` of a :data:`RESULT` event (seed 004: ``status`` success|error + ``details``)."""
    return {"answers": answers, "status": "success" if ok else "error", "details": details, **extra}
