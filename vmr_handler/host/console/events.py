"""A VM's stored reports, paged for ``GET /api/v1/vms/{vm}/events``: read from its
``<vm>.jsonl`` (the host's log; ``docs/host.md``) by byte offset, so a page is found without
reading what came before it and a cursor stays valid while the host appends.

Blocking file I/O: the console runs it in a worker thread, never on the host's loop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, FrozenSet, List, Optional

from vmr_handler.core.errors import RequestRefused
from vmr_handler.host.logs.jsonlread import records_from

#: Most records one page holds (``limit`` above it is cut to it).
MAX_PAGE = 1000


@dataclass(frozen=True)
class EventQuery:
    """Which records a page holds.

    Attributes:
        after: byte offset to read from (0: the start; a ``next`` of an earlier page).
        limit: records per page, 1..:data:`MAX_PAGE`.
        types: event types kept (empty: all).
        entry: keep only records of this entry index (``data.index``), or None.
        tail: with ``tail``, the LAST ``limit`` matching records after ``after`` (an output
            tail), instead of the first ones.
    """

    after: int = 0
    limit: int = 100
    types: FrozenSet[str] = frozenset()
    entry: Optional[int] = None
    tail: bool = False

    @classmethod
    def parse(cls, query: Dict[str, str]) -> EventQuery:
        """From the URL query ``after``, ``limit``, ``type`` (comma separated), ``entry``, ``tail``.

        Raises:
            RequestRefused: a value that is not a count, or an unknown parameter (the message names it).
        """
        unknown = sorted(set(query) - {"after", "limit", "type", "entry", "tail", "token"})
        if unknown:
            raise RequestRefused(
                f"unknown query parameter(s): {', '.join(unknown)} (use after, limit, type, entry, tail)"
            )

        def count(name: str, default: int) -> int:
            text = query.get(name)
            if text is None:
                return default
            if not text.isdigit():
                raise RequestRefused(f"{name}={text!r}: expected a whole number >= 0")
            return int(text)

        tail = query.get("tail")
        limit = count("tail", 0) if tail is not None else count("limit", 100)
        types = frozenset(t for t in query.get("type", "").split(",") if t)
        entry = query.get("entry")
        return cls(
            after=count("after", 0),
            limit=max(1, min(limit or 1, MAX_PAGE)),
            types=types,
            entry=None if entry is None else count("entry", 0),
            tail=tail is not None,
        )

    def keeps(self, record: Dict[str, Any]) -> bool:
        """True when ``record`` (a host log record) matches the type and entry filters."""
        ev = record.get("event")
        if not isinstance(ev, dict):
            return False
        if self.types and ev.get("type") not in self.types:
            return False
        if self.entry is None:
            return True
        data = ev.get("data")
        return isinstance(data, dict) and data.get("index") == self.entry


def page(path: str, query: EventQuery) -> Dict[str, Any]:
    """One page of ``path``'s records: ``{"events": [{"cursor", "host_received", "event"}],
    "next": offset to ask from next, "more": bool}`` (``cursor`` is each record's byte offset).

    A ``tail`` page reads to the end of the file (``more`` is false; ``next`` is the end).

    Raises:
        OSError: the log cannot be read.
    """
    out: Deque[Dict[str, Any]] = deque(maxlen=query.limit if query.tail else None)
    next_at, more = query.after, False
    for offset, end, record in records_from(path, query.after):
        if not query.tail and len(out) >= query.limit:
            more = True
            break
        next_at = end
        if query.keeps(record):
            out.append(
                {"cursor": offset, "host_received": record.get("host_received"), "event": record["event"]}
            )
    events: List[Dict[str, Any]] = list(out)
    return {"events": events, "next": next_at, "more": more}
