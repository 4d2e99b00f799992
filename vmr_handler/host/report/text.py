"""Values taken from guest logs, made safe, and numbers made readable, for the report package.

Every guest is hostile (SPEC section 7): :func:`_clean` makes a string printable and cuts it to
:data:`MAX_LABEL` characters, :func:`_esc` also escapes it for HTML, :func:`_num` keeps only
finite numbers. :func:`_secs` and :func:`_rel` write durations and experiment times. The
underscore names are private to :mod:`vmr_handler.host.report`.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any, Mapping, Optional

from vmr_handler.host.logs.text import printable

#: Longest label or tooltip field taken from a guest, characters.
MAX_LABEL = 80

_MAPS = (dict, Mapping)  # isinstance() tries the plain dict of json.loads first: much faster
_SURROGATE = re.compile("[\ud800-\udfff\ufffe\uffff]")


def _num(value: Any) -> Optional[float]:
    """``value`` as a finite float (``bool``, non-numbers and integers no float can hold: None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        v = float(value)
    except OverflowError:  # a hostile guest's 400-digit integer
        return None
    return v if math.isfinite(v) else None


def _clean(value: Any, cap: int = MAX_LABEL) -> str:
    """``value`` as printable text of at most ``cap`` characters (not yet escaped)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)[: cap + 1]
    if len(text) <= cap and text.isprintable():  # nothing to escape or cut (most output lines)
        return text
    text = printable(text[: cap * 4], cap)  # control characters shown as \\xNN
    return _SURROGATE.sub("\ufffd", text)  # not encodable / not allowed in XML


def _esc(value: Any, cap: int = MAX_LABEL) -> str:
    """``value`` cleaned (:func:`_clean`) and escaped for HTML text and attributes."""
    return html.escape(_clean(value, cap), quote=True)


def _secs(value: float) -> str:
    """A duration in compact units: ``850 ms``, ``12.3 s``, ``5m 02s``, ``5m``, ``2h 05m``."""
    a = abs(value)
    sign = "-" if value < 0 else ""
    if a < 1:
        return f"{sign}{a * 1000:.3g} ms"
    if a < 120:
        text = f"{a:.3g}" if a < 10 else f"{a:.1f}".removesuffix(".0")
        return f"{sign}{text} s"
    if a < 7200:
        m, sec = int(a // 60), int(a % 60)
        return f"{sign}{m}m {sec:02d}s" if sec else f"{sign}{m}m"
    h, m = int(a // 3600), int(a % 3600 // 60)
    return f"{sign}{h}h {m:02d}m" if m else f"{sign}{h}h"


def _rel(t: float, start: Optional[float]) -> str:
    """Experiment time of UTC ``t``: ``t=+1.5 s`` (empty when there is no start time)."""
    if start is None:
        return ""
    d = t - start
    if abs(d) < 1e-9:
        return "t=0"
    return "t=" + ("+" if d > 0 else "") + _secs(d)


def _num_text(value: Any) -> str:
    """A stage or entry start time as written in a schedule (``-20``, ``1.5``, ``?``)."""
    v = _num(value)
    if v is None:
        return "?" if value is None else _clean(value, 20)
    return f"{v:g}"
