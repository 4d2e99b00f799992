"""Reading a host log ``<vm>.jsonl`` (``docs/host.md``, "Logs") without writing it: the one
reader of ``vmr-host logs``, ``status`` from the logs, ``report``, ``schedule show`` and the
console's event pages (unlike :meth:`vmr_handler.host.logs.store.VmLog.open`, which also cuts a
partial line and opens the files for appending).

Records are read by byte offset, so a caller can come back for what was appended since
(``logs -f``, the console's cursors); a line not yet whole (the host is writing it, or died
writing it) is left for later, a line that is not a JSON object is skipped and counted, and a
line longer than :data:`MAX_LINE` is skipped without being held in memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

from vmr_handler.core.events import Event

#: Longest line read as a record (the host's own lines are far shorter; a longer one is skipped).
MAX_LINE = 4 << 20


@dataclass
class ReadStats:
    """What a read skipped: ``bad`` lines (not JSON, not an object, too long) and whether the
    last line was not whole (``partial``)."""

    bad: int = 0
    partial: bool = False


def records_from(
    path: str, start: int = 0, stats: Optional[ReadStats] = None
) -> Iterator[Tuple[int, int, Dict[str, Any]]]:
    """``(offset, next offset, record)`` of every whole record line of ``path`` from byte
    ``start`` (a line start), streamed (a 1 GB log is never held in memory).

    Raises:
        OSError: the file cannot be opened or read.
    """
    stats = stats if stats is not None else ReadStats()
    with open(path, "rb") as fh:
        fh.seek(start)
        offset = start
        while True:
            line = fh.readline(MAX_LINE + 1)
            if not line.endswith(b"\n"):
                if len(line) <= MAX_LINE:  # the end, or a last line still being written
                    stats.partial = bool(line)
                    return
                rest = fh.readline()  # a monster line: skip to its end, in pieces
                while rest and not rest.endswith(b"\n"):
                    rest = fh.readline(MAX_LINE)
                if not rest:
                    stats.partial = True
                    return
                offset += len(line) + len(rest)
                stats.bad += 1
                continue
            end = offset + len(line)
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = None
            if isinstance(record, dict):
                yield offset, end, record
            else:
                stats.bad += 1
            offset = end


def end_offset(path: str) -> int:
    """The byte offset just after the last whole line of ``path`` now (0: no such file): where a
    reader starts to get only the records appended from now on (a last line still being
    written is read with them, once whole).

    Raises:
        OSError: the file exists but cannot be read.
    """
    try:
        with open(path, "rb") as fh:
            pos = fh.seek(0, os.SEEK_END)
            while pos > 0:
                step = min(64 * 1024, pos)
                fh.seek(pos - step)
                newline = fh.read(step).rfind(b"\n")
                if newline >= 0:
                    return pos - step + newline + 1
                pos -= step
    except FileNotFoundError:
        pass
    return 0


def event_of(record: Dict[str, Any]) -> Optional[Event]:
    """The :class:`Event` of a host log record, or None when it has no usable one."""
    ev: Any = record.get("event")
    try:
        return Event(str(ev["type"]), float(ev["timestamp"]), str(ev["id"]), dict(ev.get("data") or {}))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
