"""The one event model every report uses (SPEC section 6, seeds 001 and 004).

An :class:`Event` is a frozen, past-tense fact: ``{"timestamp", "type", "id", "data"}``.
``timestamp`` is UTC epoch seconds on the experiment's reference clock; ``id`` is unique
(a per-boot uuid prefix + a counter, so ids also sort in emission order). Results carry
``status: success|error`` and ``details`` inside ``data``. A batch on the wire is a
message ``{"now": ..., "events": [...]}`` with ascending timestamps (seed 001), built by
:func:`vmr_handler.core.wire.protocol.encode_message`.
The event types are listed in :class:`EventType` and documented in ``docs/events.md``.
"""

from __future__ import annotations

import base64
import itertools
import math
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, Mapping, Optional

from vmr_handler.core.fsutil import utc_text
from vmr_handler.core.readable import escaped, field_text, kpi_text

PROTOCOL_VERSION = 1


class EventType(str, Enum):
    """Every event type the agent emits (see ``docs/events.md``)."""

    AGENT_STARTED = "agent_started"
    AGENT_STOPPED = "agent_stopped"
    SCHEDULE_LOADED = "schedule_loaded"
    SCHEDULE_WARNING = "schedule_warning"
    JOURNAL_RESET = "journal_reset"
    STAGE_STARTED = "stage_started"
    STAGE_FINISHED = "stage_finished"
    DATA_PLACED = "data_placed"
    TRANSFER_REGISTERED = "transfer_registered"
    ENTRY_STARTED = "entry_started"
    ENTRY_FAILED = "entry_failed"
    ENTRY_EXITED = "entry_exited"
    ENTRY_INTERRUPTED = "entry_interrupted"
    ENTRY_SKIPPED = "entry_skipped"
    OUTPUT = "output"
    REBOOT_REQUESTED = "reboot_requested"
    CONFIGURED = "configured"
    START_TIME_SET = "start_time_set"
    EXPERIMENT_STARTED = "experiment_started"
    PAUSE_STARTED = "pause_started"
    PAUSE_ENDED = "pause_ended"
    BREAK_STARTED = "break_started"
    RESUME_RECEIVED = "resume_received"
    VM_FAILED = "vm_failed"
    SCHEDULE_COMPLETE = "schedule_complete"
    SCHEDULE_APPENDED = "schedule_appended"
    CONTROL_REFUSED = "control_refused"
    KPI = "kpi"


@dataclass(frozen=True)
class Event:
    """One reported fact.

    Attributes:
        type: an :class:`EventType` value.
        timestamp: UTC epoch seconds (reference clock) when it happened.
        id: unique event id.
        data: JSON-safe payload (see :func:`json_safe`).
    """

    type: str
    timestamp: float
    id: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """The wire form ``{"timestamp", "type", "id", "data"}``."""
        return {"timestamp": self.timestamp, "type": self.type, "id": self.id, "data": dict(self.data)}


def json_safe(value: Any) -> Any:
    """Make ``value`` strict-JSON safe: ``inf``/``-inf``/NaN become strings, bytes become
    ``{"b64": ...}``, tuples become lists. Strings are kept (``json`` escapes NUL etc.)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # the common cases, fast
        return value
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


class EventFactory:
    """Makes events with unique ids and a given clock.

    Args:
        clock: callable returning UTC epoch seconds on the reference clock.
        prefix: id prefix; default a fresh random 12-hex string per agent process.
    """

    def __init__(self, clock: Callable[[], float], prefix: Optional[str] = None) -> None:
        self._clock = clock
        self._prefix = prefix or uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)
        self._last = 0.0

    def clock_changed(self) -> None:
        """The clock was corrected: stop holding timestamps at values read before (they may
        have been seconds ahead); the next event takes the corrected time."""
        self._last = 0.0

    def make(self, type_: EventType, **data: Any) -> Event:
        """A new :class:`Event` of ``type_`` with ``data`` made JSON safe; timestamps never go backwards."""
        return self.make_raw(type_.value, **data)

    def make_raw(self, type_: str, **data: Any) -> Event:
        """Like :meth:`make` for any type string (protocol control events)."""
        now = max(self._clock(), self._last)
        self._last = now
        return Event(type_, now, f"{self._prefix}-{next(self._counter):08d}", json_safe(data))


def encode_output(chunk: bytes) -> Dict[str, Any]:
    """Payload for one output line: ``{"line": str}`` when UTF-8, else ``{"line_b64": str}``.

    Lossless for any bytes (NUL, invalid UTF-8); the JSON encoder escapes control characters.
    """
    try:
        return {"line": chunk.decode("utf-8")}
    except UnicodeDecodeError:
        return {"line_b64": base64.b64encode(chunk).decode("ascii")}


def describe(event: Event, start: Optional[float] = None) -> str:
    """One readable log line for ``event`` (the human log on stderr / the host's ``.log``).

    Times in ISO UTC, followed by the experiment time (``t=+12.3s``) when ``start`` (the
    experiment start, UTC epoch seconds) is known; durations with a unit, numbers with at most
    3 decimals, structures as JSON, output that is not UTF-8 with ``\\xNN`` escapes
    (:mod:`vmr_handler.core.readable`).
    """
    line = _describe(event)
    if start is None or not math.isfinite(start):
        return line
    stamp, rest = line.split(" ", 1)
    return f"{stamp} t={event.timestamp - start:+.1f}s {rest}"


class ReadableLines:
    """A readable log's lines (:func:`describe`), with the experiment time once the start is
    known: learned from the ``start_time_set``/``experiment_started`` events the log carries."""

    def __init__(self) -> None:
        self.start: Optional[float] = None

    def line(self, event: Event) -> str:
        """``event``'s readable line (see :func:`describe`)."""
        if event.type in (EventType.START_TIME_SET.value, EventType.EXPERIMENT_STARTED.value):
            start = event.data.get("start_time")
            if isinstance(start, (int, float)) and not isinstance(start, bool) and math.isfinite(start):
                self.start = float(start)
        return describe(event, self.start)


def _describe(event: Event) -> str:
    d = event.data
    what = f"entry {d['index']}" if "index" in d else ""
    if d.get("executable"):
        what += f" ({d['executable']})"
    if event.type == EventType.OUTPUT.value:
        text = d.get("line")
        if text is None:
            raw = base64.b64decode(d.get("line_b64", ""))
            text = escaped(raw) + f" [{len(raw)} bytes, not UTF-8]"
        if len(text) > 200:
            text = text[:200] + f"... ({len(text)} chars)"
        more = " [continued]" if d.get("continued") else ""
        return f"{utc_text(event.timestamp)} {what} {d.get('stream')}: {text!s}{more}"
    if event.type == EventType.KPI.value:
        return f"{utc_text(event.timestamp)} kpi {kpi_text(d)}"
    skip = {"index", "executable", "line", "line_b64"}
    extras = " ".join(
        f"{k}={field_text(k, v)}" for k, v in d.items() if k not in skip and v not in (None, [], {})
    )
    return f"{utc_text(event.timestamp)} {event.type} {what} {extras}".rstrip()
