"""The outbox: reports waiting for the host's acknowledgement (SPEC section 6, at least once).

Every event the agent reports is appended to ``<state-dir>/outbox.log`` (one ``write`` per
line: an agent killed by SIGKILL loses nothing it reported) and stays there until the host
acks its id. Only ids and file offsets are kept in memory, so a long host absence spills to
disk instead of filling memory; the file is compacted (rewritten atomically with only the
unacknowledged events) when most of it is acknowledged.

File format, one JSON object per line: ``{"e": <event dict>}`` for a report,
``{"a": [ids]}`` for acknowledgements. A torn last line is ignored on load.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional, Tuple

from vmr_handler.core.errors import JournalError
from vmr_handler.core.events import Event
from vmr_handler.core.fsutil import append_whole, atomic_write

log = logging.getLogger(__name__)

OUTBOX_NAME = "outbox.log"
#: Compact when over half of the file is acknowledged and the file is larger than this, or
#: larger than the free space left on its file system (a small state dir never fills up with
#: acknowledged reports).
COMPACT_BYTES = 8 * 1024 * 1024


class Outbox:
    """Persistent queue of unacknowledged reports, in emission order.

    Args:
        state_dir: directory holding ``outbox.log`` (created if missing).

    Raises:
        JournalError: the file cannot be opened or written.
    """

    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(state_dir, OUTBOX_NAME)
        # id -> (offset of the event JSON in the file, length, timestamp); insertion order = send order
        self._pending: OrderedDict[str, Tuple[int, int, float]] = OrderedDict()
        self._size = 0
        self._acked_bytes = 0
        self._compact_failed_at = -1  # file size at the last failed compaction (not retried as is)
        self._load()
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise JournalError(f"cannot open outbox {self.path}: {exc.strerror or exc}") from exc
        self._size = os.fstat(self._fd).st_size
        if self._size and os.pread(self._fd, 1, self._size - 1) != b"\n":
            os.write(self._fd, b"\n")  # end a line torn by a crash, or the next one joins it
            self._size += 1

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise JournalError(f"cannot read outbox {self.path}: {exc.strerror or exc}") from exc
        offset = 0
        for line in data.split(b"\n"):
            length = len(line) + 1
            try:
                rec = json.loads(line) if line else None
            except ValueError:
                rec = None  # a torn last line
            if (
                isinstance(rec, dict)
                and isinstance(rec.get("e"), dict)
                and isinstance(rec["e"].get("id"), str)
            ):
                # the event JSON starts after '{"e":' and ends before the final '}'
                ts = rec["e"].get("timestamp")
                ts = float(ts) if isinstance(ts, (int, float)) else 0.0
                self._pending[rec["e"]["id"]] = (offset + 5, len(line) - 6, ts)
            elif isinstance(rec, dict) and isinstance(rec.get("a"), list):
                for ident in rec["a"]:
                    if isinstance(ident, str):
                        self._pending.pop(ident, None)
            offset += length
        self._size = len(data)
        self._acked_bytes = self._size - sum(length + 7 for _o, length, _t in self._pending.values())

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, event: Event) -> None:
        """Append ``event`` (it is sent, and resent, until acked).

        Raises:
            JournalError: the append failed (e.g. disk full); the event is not queued and the file
                is as before (a short write is cut off again, so no torn record is ever sent).
        """
        body = json.dumps(event.to_dict(), separators=(",", ":"), allow_nan=False)
        line = ('{"e":' + body + "}\n").encode("utf-8")
        try:
            append_whole(self._fd, line, self._size)  # a short write is cut off again
        except OSError as exc:
            raise JournalError(f"cannot append to outbox {self.path}: {exc.strerror or exc}") from exc
        self._pending[event.id] = (self._size + 5, len(line) - 7, event.timestamp)
        self._size += len(line)

    def ack(self, ids: Iterable[str]) -> int:
        """Forget acknowledged ids (unknown ids are ignored). Returns how many were pending."""
        done = [i for i in ids if isinstance(i, str) and i in self._pending]
        if not done:
            return 0
        for ident in done:
            _off, length, _ts = self._pending.pop(ident)
            self._acked_bytes += length
        try:
            os.write(self._fd, (json.dumps({"a": done}, separators=(",", ":")) + "\n").encode())
        except OSError:
            pass  # worst case the events are sent again and the host de-duplicates them
        self._size = os.fstat(self._fd).st_size
        if self._worth_compacting():
            try:
                self.compact()
            except OSError as exc:  # a full disk: the file stays as it is, compacted later
                self._compact_failed_at = self._size
                log.warning("cannot compact outbox %s: %s", self.path, exc.strerror or exc)
        return len(done)

    def _worth_compacting(self) -> bool:
        """Over half acknowledged, and large, or larger than the space left (COMPACT_BYTES)."""
        if self._acked_bytes * 2 <= self._size or self._size == self._compact_failed_at:
            return False
        if self._size > COMPACT_BYTES:
            return True
        try:
            fs = os.statvfs(self.path)
        except OSError:
            return False
        return self._size > fs.f_bavail * fs.f_frsize

    def ids(self, limit: Optional[int] = None) -> List[str]:
        """Pending ids in send order (the first ``limit`` of them when given)."""
        return list(self._pending) if limit is None else list(itertools.islice(self._pending, limit))

    def read_raw(self, ident: str) -> Optional[Tuple[float, bytes]]:
        """``(timestamp, event JSON bytes as stored)`` of pending ``ident``, or None if acked."""
        where = self._pending.get(ident)
        if where is None:
            return None
        offset, length, ts = where
        return ts, os.pread(self._fd, length, offset)

    def read(self, ident: str) -> Optional[Dict[str, Any]]:
        """The pending event ``ident`` as a dict, or None if it was acked meanwhile."""
        raw = self.read_raw(ident)
        if raw is None:
            return None
        doc = json.loads(raw[1])
        return doc if isinstance(doc, dict) else None

    def compact(self) -> None:
        """Rewrite the file with only the pending events (atomic; stored bytes copied as they are)."""
        lines = []
        for ident in list(self._pending):
            raw = self.read_raw(ident)
            if raw is not None:
                lines.append(b'{"e":' + raw[1] + b"}\n")
        atomic_write(self.path, b"".join(lines))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._pending.clear()
        self._size = 0
        self._acked_bytes = 0
        self._load()

    def sync(self) -> None:
        """fsync the outbox file."""
        os.fsync(self._fd)

    def close(self) -> None:
        """Close the file (pending events stay on disk for the next start)."""
        os.close(self._fd)
