"""Local transport: events as JSON lines to a report file, a readable log on stderr.

Used by ``vmr-handler run --local``. Each line of the report file is one event
``{"timestamp", "type", "id", "data"}`` (the seed-001 event shape; see ``docs/events.md``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Optional

from vmr_handler.core.events import Event, ReadableLines
from vmr_handler.core.fsutil import append_whole


class LocalReporter:
    """Event sink for local mode.

    Args:
        report_path: JSON-lines file to append events to, or None for no file.
        log_stream: where readable lines go (default stderr); None for silence.

    Raises:
        OSError: the report file cannot be opened.
    """

    def __init__(self, report_path: Optional[str], log_stream: Optional[IO[str]] = sys.stderr) -> None:
        self._fd: Optional[int] = None
        if report_path:
            os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
            self._fd = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._log = log_stream
        self._readable = ReadableLines()

    def __call__(self, event: Event) -> None:
        """Write one event: one unbuffered append, so a crash loses nothing already reported.

        Raises:
            OSError: the report file cannot be written (a full disk); nothing of the line is
                left in it, so the engine's retry writes it whole.
        """
        if self._fd is not None:
            line = json.dumps(event.to_dict(), ensure_ascii=False, allow_nan=False) + "\n"
            append_whole(self._fd, line.encode("utf-8"), os.fstat(self._fd).st_size)
        if self._log is not None:
            try:
                self._log.write(self._readable.line(event) + "\n")
                self._log.flush()
            except (OSError, ValueError):
                self._log = None  # stderr gone: keep the report file going

    def close(self) -> None:
        """Close the report file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
