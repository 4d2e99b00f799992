"""Guest-supplied text made safe for the host's readable logs and terminals.

Guests are hostile and operators ``cat`` logs: :func:`printable` escapes control characters
and cuts long text. Used by the VM logs (:mod:`vmr_handler.host.logs.store`), the transfer store
(:mod:`vmr_handler.host.serve.files.transfers`) and the report.
"""

from __future__ import annotations

import re

#: Longest readable log line kept (the .jsonl has everything).
MAX_LOG_LINE = 4096

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, limit: int = MAX_LOG_LINE) -> str:
    """``text`` safe for a terminal: control characters (ANSI escapes, CR, newlines) shown as
    ``\\xNN`` escapes, cut at ``limit`` characters. Guests are hostile; operators ``cat`` logs."""
    text = text.replace("\n", "\\n")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text)} chars)"
    return text
