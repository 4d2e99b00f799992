"""Transfers out: files and directories the schedule sends to ``vmr-host`` (``transfer_registered``).

:class:`Transfers` sends each registered location once, or every ``interval`` seconds when it
changed: files of :data:`HTTP_TRANSFER_MIN` bytes or more are uploaded over HTTP(S) when the
host offers it, the others travel as ``transfer_chunk`` reports of :data:`TRANSFER_CHUNK`
bytes. The transfers under way are kept in ``<state>/transfers.json`` and restarted with the
agent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from vmr_handler.agent.connected.link import HostLink
from vmr_handler.agent.connected.resources import HttpJobs
from vmr_handler.agent.state.outbox import Outbox
from vmr_handler.core.errors import JournalError
from vmr_handler.core.events import Event, EventType
from vmr_handler.core.fsutil import atomic_write, sha256_file, walk_files
from vmr_handler.core.wire import protocol as P

log = logging.getLogger(__name__)

TRANSFER_CHUNK = 256 * 1024
#: Files transferred out at least this large (bytes) are uploaded over HTTP(S) when the host
#: offers it (``vmr-host serve --http``); smaller ones travel as ``transfer_chunk`` events.
HTTP_TRANSFER_MIN = 64 * 1024
#: The transfers out under way (``{key: {"data", "seen"}}``), restarted with the agent.
TRANSFERS_FILE = "transfers.json"


class Transfers:
    """The agent's transfers out, one task per entry and location.

    Args:
        state_dir: the agent's state directory (``transfers.json``).
        outbox: where the ``transfer_chunk`` and ``transfer_uploaded`` reports go.
        link: the channel to the host (event ids and times; told of new reports).
        report: ``report(EventType, **data)`` sends a report (the agent's sink).
        jobs: runs the HTTP(S) uploads.

    Attributes:
        http: the ``schedule`` event's ``http`` (``base``, ``token``, ``upload``); set by the agent.
    """

    def __init__(
        self, state_dir: str, outbox: Outbox, link: HostLink, report: Callable[..., None], jobs: HttpJobs
    ) -> None:
        self._state_dir = state_dir
        self._outbox = outbox
        self._link = link
        self._report = report
        self._jobs = jobs
        self.http: Dict[str, Any] = {}
        self._tasks: Dict[str, asyncio.Task[None]] = {}
        self._state: Dict[str, Dict[str, Any]] = {}

    def cancel(self) -> List[asyncio.Task[None]]:
        """Cancel every transfer under way; returns their tasks (to await)."""
        for task in self._tasks.values():
            task.cancel()
        return list(self._tasks.values())

    def start(self, data: Dict[str, Any], seen: Optional[Dict[str, str]] = None) -> None:
        """Run a transfer out (a ``transfer_registered`` report's data), once per entry and
        location; ``seen``: ``{relative name: sha256}`` already sent (a restarted agent)."""
        key = f"{data.get('index')}:{data.get('location')}"
        if key not in self._tasks:
            self._state[key] = {"data": data, "seen": dict(seen or {})}
            self._save()
            self._tasks[key] = asyncio.ensure_future(self._run(key))

    def _save(self) -> None:
        """Keep the transfers under way in ``<state>/transfers.json`` (for a restart)."""
        with contextlib.suppress(OSError):
            path = os.path.join(self._state_dir, TRANSFERS_FILE)
            atomic_write(path, json.dumps(self._state).encode())

    def restart(self) -> None:
        """Restart the transfers a previous run of the agent left under way."""
        try:
            with open(os.path.join(self._state_dir, TRANSFERS_FILE), "rb") as fh:
                saved = json.loads(fh.read())
        except (OSError, ValueError):
            return
        for rec in saved.values() if isinstance(saved, dict) else []:
            if (
                isinstance(rec, dict)
                and isinstance(rec.get("data"), dict)
                and isinstance(rec.get("seen"), dict)
            ):
                self.start(rec["data"], rec["seen"])

    async def _run(self, key: str) -> None:
        """Send a transfer-out location to the host once, or every ``interval`` s when it changed:
        files of :data:`HTTP_TRANSFER_MIN` bytes or more over HTTP(S) when the host offers it
        (:meth:`_upload`), the others (and those HTTP refused) as ``transfer_chunk`` events."""
        state = self._state[key]
        data, seen = state["data"], state["seen"]
        path = str(data.get("path") or data.get("location"))
        location = str(data.get("location"))
        interval = data.get("interval")
        changed = False
        while True:
            for rel, full in _walk(path):
                name = location if not rel else location.rstrip("/") + "/" + rel
                try:
                    big = os.stat(full).st_size >= HTTP_TRANSFER_MIN
                except OSError:
                    continue
                digest = (
                    await self._upload(name, full, seen.get(rel)) if big and self.http.get("upload") else None
                )
                if digest is None:
                    digest = await self._send_chunks(name, full, seen.get(rel))
                if digest is not None and seen.get(rel) != digest:
                    seen[rel] = digest
                    changed = True
            if changed:  # once per pass, not per file (a large directory was quadratic)
                self._save()
                changed = False
            if not isinstance(interval, (int, float)) or interval <= 0:
                self._state.pop(key, None)
                self._save()
                return
            await asyncio.sleep(float(interval))

    async def _send_chunks(self, name: str, full: str, sent: Optional[str]) -> Optional[str]:
        """Queue ``full`` as ``transfer_chunk`` events (unless its sha256 is ``sent``); its
        sha256, or None when it cannot be read. The file is hashed in a worker thread and
        read one chunk at a time (never whole into memory), yielding between chunks."""
        try:
            st = os.stat(full)
            digest = await asyncio.to_thread(sha256_file, full)
        except OSError:
            return None
        if sent == digest:
            return digest
        size = st.st_size
        try:
            with open(full, "rb") as fh:
                for offset in range(0, max(1, size), TRANSFER_CHUNK):
                    piece = fh.read(TRANSFER_CHUNK)
                    await self._queue(
                        self._link.events.make_raw(
                            P.TRANSFER_CHUNK,
                            location=name,
                            offset=offset,
                            size=size,
                            sha256=digest,
                            mtime=st.st_mtime,
                            last=offset + TRANSFER_CHUNK >= size,
                            data_b64=base64.b64encode(piece).decode("ascii"),
                        )
                    )
                    await asyncio.sleep(0)
        except (OSError, JournalError):  # unreadable, or the agent stops with the disk still full
            return None
        return digest

    async def _queue(self, event: Event) -> None:
        """Append ``event`` to the outbox; on a full disk hold it (one chunk, in this task) and
        retry with backoff (tenacity) until it is written, so a transfer is never cut short.
        Said once when it starts waiting and once when it goes on.

        Raises:
            JournalError: the agent stops while the disk is still full (the transfer is sent
                again from its start at the next pass or restart: it was not marked sent).
        """
        from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

        waited = False

        def note(_state: Any) -> None:
            nonlocal waited
            if not waited:
                where = event.data.get("location")
                log.warning("outbox full: transfer-out %s waits for space in the state dir", where)
                waited = True

        async for attempt in AsyncRetrying(
            wait=wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.05),
            retry=retry_if_exception_type(JournalError),
            stop=lambda _state: self._jobs.stopped.is_set(),
            before_sleep=note,
            reraise=True,
        ):
            with attempt:
                self._outbox.add(event)
        if waited:
            log.warning("outbox writable again: transfer-out %s goes on", event.data.get("location"))
        self._link.notify()

    async def _upload(self, name: str, full: str, sent: Optional[str]) -> Optional[str]:
        """Upload ``full`` over HTTP(S) (:func:`vmr_handler.agent.connected.httpfetch.upload`, resumable, in a
        worker thread) unless its sha256 is ``sent``, then queue a ``transfer_uploaded`` report
        (the host puts the file in place when it arrives, in order with the other reports).

        Returns:
            The sha256 the host now has; None when the file must go over the channel (it cannot
            be read, or HTTP failed for good: a ``schedule_warning`` says why). A file that
            changes while it is uploaded is hashed and sent again (3 tries).

        Raises:
            asyncio.CancelledError: the agent is stopping.
        """
        from urllib.parse import quote

        from vmr_handler.agent.connected.httpfetch import upload

        url, token = str(self.http.get("upload")) + quote(name, safe=""), str(self.http.get("token"))
        error: Optional[str] = None
        for _try in range(3):
            try:
                digest = await asyncio.to_thread(sha256_file, full)
                st = os.stat(full)
            except OSError:
                return None
            if digest == sent:
                return digest
            error = await self._jobs.run(upload, url, token, full, digest, st.st_size, self._jobs.verify())
            if error is None:
                uploaded = P.TRANSFER_UPLOADED
                data = {"location": name, "size": st.st_size, "sha256": digest, "mtime": st.st_mtime}
                await self._queue(self._link.events.make_raw(uploaded, **data))
                return digest
            if self._jobs.stopped.is_set():
                raise asyncio.CancelledError()
            if error.startswith("HTTP 413"):  # over the host's limits: the channel has the same ones
                self._report(
                    EventType.SCHEDULE_WARNING,
                    status="error",
                    details=f"transfer {name!r} refused by the host ({error}); not sent",
                )
                return digest
            with contextlib.suppress(OSError):
                if await asyncio.to_thread(sha256_file, full) == digest:
                    break  # not a change under way: HTTP refused it
        self._report(
            EventType.SCHEDULE_WARNING,
            status="error",
            details=f"transfer {name!r} over HTTP failed ({error}); sending it over the channel",
        )
        return None


def _walk(path: str) -> List[Tuple[str, str]]:
    """``(relative name, full path)`` of a file, or of every file under a directory."""
    if os.path.isdir(path):
        out = []
        for root, files in walk_files(path):
            for name in sorted(files):
                full = os.path.join(root, name)
                if os.path.isfile(full) and not os.path.islink(full):
                    out.append((os.path.relpath(full, path), full))
        return out
    return [("", path)] if os.path.isfile(path) else []
