"""Numbers and bytes as people read them (issue 13: "readable everywhere").

The readable logs (the agent's stderr, the host's ``<vm>.log``), ``vmr-host status`` and the
error texts print times as ISO UTC, durations with a unit and sensible precision, other
numbers with at most 3 decimals, structures as compact JSON (never a Python repr) and bytes
that are not UTF-8 with ``\\xNN`` escapes (never hidden). The ``.jsonl`` logs keep every value
exactly; these are for eyes only.
"""

from __future__ import annotations

import json
import math
from typing import Any

from vmr_handler.core.fsutil import utc_text

#: A float at least this large in an event is a UTC time, seconds since the epoch (2001-09-09 on);
#: experiment and schedule times are far smaller.
EPOCH_MIN = 1e9
#: Event fields that are durations, seconds.
DURATION_KEYS = frozenset({"duration", "lateness", "late", "buffer", "waited", "elapsed", "delay", "timeout"})


def duration(seconds: float) -> str:
    """A duration with a unit and sensible precision: ``2.1 ms``, ``1.01 s``, ``16.5 s``,
    ``3.2 min``, ``1.5 h`` (negative durations keep their sign)."""
    s = abs(seconds)
    if not math.isfinite(s):
        return "inf" if seconds > 0 else "-inf"
    if s < 1:
        return f"{seconds * 1000:.1f} ms"
    if s < 10:
        return f"{seconds:.2f} s"
    if s < 120:
        return f"{seconds:.1f} s"
    if s < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def number(value: float) -> str:
    """A plain number with at most 3 decimals and no trailing zeros (``-5``, ``12.5``, ``0.123``)."""
    if not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def field_text(key: str, value: Any) -> str:
    """One event field's value for a readable log line (see the module docstring)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if key in DURATION_KEYS:
            return duration(value)
        if abs(value) >= EPOCH_MIN and math.isfinite(value):
            return utc_text(value)
        return number(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return str(value)


def escaped(data: bytes) -> str:
    """``data`` as text: UTF-8 where it is, ``\\xNN`` for every byte that is not."""
    return data.decode("utf-8", "backslashreplace")
