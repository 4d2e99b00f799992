"""The readable ``<vm>.log`` files of every VM, appended through a bounded set of open files.

A host serving 10 000 VMs kept two files open per VM for the whole run (the ``.jsonl`` and the
readable ``.log``): 20 000 descriptors plus the channels, over the hard limit of many machines
(``vmr-host serve`` refused 10 000 VMs over MQTT here, hard limit 20 000). The
``.jsonl`` stays open (every report is written and fsynced there); the readable copy is
written in whole lines through :class:`AppendFiles`, which keeps at most ``limit`` of them
open and closes the one used least recently when it needs another (an ``open`` of a file
that was closed costs ~10 us: only VMs that talk in turn pay it).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import IO, Any

#: Readable logs kept open at once, per host (counted in ``fdlimit.BASE``).
READABLE_OPEN = 256


class AppendFiles:
    """Text files opened for appending (UTF-8, unencodable characters replaced), at most
    ``limit`` open at a time, least recently used closed first.

    Args:
        limit: files kept open (>= 1).
    """

    def __init__(self, limit: int = READABLE_OPEN) -> None:
        self.limit = max(1, limit)
        self._open: OrderedDict[str, IO[Any]] = OrderedDict()
        #: files opened so far (re-opened after being closed included)
        self.opens = 0

    def write(self, path: str, text: str) -> None:
        """Append ``text`` to ``path`` and flush it (the file is created when missing).

        Raises:
            OSError: the file cannot be opened or written (the caller decides: best effort).
        """
        fh = self._open.get(path)
        if fh is None:
            while len(self._open) >= self.limit:
                self._close(next(iter(self._open)))
            fh = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 - kept in the pool
            self.opens += 1
            self._open[path] = fh
        else:
            self._open.move_to_end(path)
        try:
            fh.write(text)
            fh.flush()
        except OSError:
            self._close(path)  # a file in an unknown state is not reused
            raise

    def close(self, path: str) -> None:
        """Close ``path`` if it is open (the next write opens it again)."""
        if path in self._open:
            self._close(path)

    def close_all(self) -> None:
        """Close every open file."""
        for path in list(self._open):
            self._close(path)

    def _close(self, path: str) -> None:
        fh = self._open.pop(path)
        try:
            fh.close()
        except OSError:
            pass
