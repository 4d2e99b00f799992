"""VM-resource files a schedule needs, fetched from ``vmr-host`` before the schedule runs.

:class:`Resources` fetches every file the schedule's entries drop (``FileDrop``) into
``<state>/resources``: over HTTP(S) when the ``schedule`` event announced a ``url``
(``vmr-host serve --http``), else (or when HTTP fails) in ``resource_chunk`` events over the
channel; the schedule's sha256 decides in both cases. :class:`HttpJobs` runs the blocking
HTTP(S) downloads and uploads (:mod:`vmr_handler.agent.connected.httpfetch`) in worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional

from vmr_handler.agent.connected.link import HostLink
from vmr_handler.agent.machine.executor import FETCH_ERRORS, resource_path
from vmr_handler.core.errors import ChannelClosed, EntryError
from vmr_handler.core.events import EventType
from vmr_handler.core.fsutil import atomic_write, sha256_file
from vmr_handler.core.schedule import FileDrop, Schedule
from vmr_handler.core.wire import protocol as P

if TYPE_CHECKING:
    from vmr_handler.transports.mqtt.options import MqttOptions

RESOURCES_DIR = "resources"


class HttpJobs:
    """Blocking HTTP(S) jobs (downloads, uploads) in the agent's own worker threads.

    Args:
        stopped: set when the agent stops; running jobs then end at their next block.
        state_dir: the agent's state directory (``http-ca.pem`` is written there).
        ca_file: the ``http_ca_file`` setting (CA of ``vmr-host``'s HTTPS certificate).
        mqtt: the broker settings, whose CA is trusted when ``ca_file`` is not set.
    """

    def __init__(
        self, stopped: asyncio.Event, state_dir: str, ca_file: Optional[str], mqtt: Optional[MqttOptions]
    ) -> None:
        self.stopped = stopped
        self._state_dir = state_dir
        self._ca_file = ca_file
        self._mqtt = mqtt
        self._pool: Any = None  # worker threads of HTTP downloads and uploads

    async def run(self, job: Callable[..., Optional[str]], *args: Any) -> Optional[str]:
        """``job(*args, cancel)`` in a worker thread (a blocking download or upload); ``cancel``
        (a ``threading.Event``) is set when the agent stops or this task is cancelled, and the
        job then ends at its next block. Returns what the job returns."""
        import threading

        cancel = threading.Event()
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            # its own threads: a download held by a slow server (retries sleep in the worker)
            # must not take the default pool's threads the MQTT connect needs
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vmr-http")
        loop = asyncio.get_running_loop()
        work: asyncio.Future[Optional[str]] = asyncio.ensure_future(
            loop.run_in_executor(self._pool, functools.partial(job, *args, cancel))
        )
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self.stopped.wait())
        try:
            await asyncio.wait([work, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            cancel.set()  # (done already, or the agent stops: end the job)
        return await work

    def verify(self) -> bool | str:
        """TLS trust for https resources: ``http_ca_file``, else the broker's CA (``ca_pem`` is
        written to ``<state>/http-ca.pem``: requests needs a file), else the system CAs."""
        mqtt = self._mqtt
        if self._ca_file or mqtt is None or not (mqtt.ca_file or mqtt.ca_pem):
            return self._ca_file or True
        if mqtt.ca_file:
            return mqtt.ca_file
        path = os.path.join(self._state_dir, "http-ca.pem")
        atomic_write(path, str(mqtt.ca_pem).encode(), mode=0o644)
        return path

    def shutdown(self) -> None:
        """Let the worker threads go (their jobs were told to stop: cancel events)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)


class Resources:
    """Fetches the VM-resource files of a schedule (and, chunk-wise, a large schedule).

    Args:
        state_dir: the agent's state directory (files go to ``<state_dir>/resources``).
        link: the channel to the host.
        report: ``report(EventType, **data)`` sends a report (the agent's sink).
        jobs: runs the HTTP(S) downloads.

    Attributes:
        announced: ``{file name: {"sha256", "size", "url", "token"}}`` as the ``schedule``
            event announced them (set by the agent).
    """

    def __init__(self, state_dir: str, link: HostLink, report: Callable[..., None], jobs: HttpJobs) -> None:
        self._state_dir = state_dir
        self._link = link
        self._report = report
        self._jobs = jobs
        self.announced: Dict[str, Dict[str, Any]] = {}

    async def fetch_all(self, schedule: Schedule) -> str:
        """Fetch every VM-resource file the schedule drops into ``<state>/resources``: over
        HTTP(S) when the schedule event gave it a ``url`` (:meth:`_fetch_http`), else in
        ``resource_chunk`` events over the channel (:meth:`fetch_one`)."""
        root = os.path.join(self._state_dir, RESOURCES_DIR)
        os.makedirs(root, exist_ok=True)
        names = sorted({d.filename for e in schedule.entries for d in e.data if isinstance(d, FileDrop)})
        failed: Dict[str, str] = {}
        for name in names:
            try:
                resource_path(root, name)  # the name must stay inside the resource dir
            except EntryError as exc:
                self._report(EventType.SCHEDULE_WARNING, status="error", details=str(exc))
                continue
            info = self.announced.get(name, {})
            want = info.get("sha256")
            target = os.path.join(root, hashlib.sha256(name.encode()).hexdigest()[:16])
            if want and os.path.exists(target) and sha256_file(target) == want:
                _link_name(root, name, target)
                continue
            error = await self._fetch_http(name, target, info) if "url" in info else "no url"
            if error and "url" in info and not self._jobs.stopped.is_set():
                # the HTTP server may be unreachable or busy (e.g. held by another guest): the
                # channel still works, and the schedule's sha256 decides in both cases
                self._report(
                    EventType.SCHEDULE_WARNING,
                    status="error",
                    details=f"resource {name!r} over HTTP failed ({error}); fetching it over the channel",
                )
            if error and not self._jobs.stopped.is_set():
                error = await self.fetch_one(name, target)
                if error is None and want and sha256_file(target) != want:
                    # the chunks' own sha256 is unsigned: the schedule's (signed) one decides
                    os.unlink(target)
                    error = "sha256 differs from the one the schedule announced"
            if self._jobs.stopped.is_set():
                break
            if error:
                self._report(
                    EventType.SCHEDULE_WARNING, status="error", details=f"resource {name!r}: {error}"
                )
                failed[name] = error
                continue
            _link_name(root, name, target)
        with contextlib.suppress(OSError):  # only makes a later error text better
            atomic_write(os.path.join(root, FETCH_ERRORS), json.dumps(failed).encode())
        return root

    async def fetch_appended(self, announced: Mapping[str, Mapping[str, Any]], batch: Schedule) -> str:
        """An appended batch's files: ``announced`` (``{file name: {"sha256", "size"[, "url",
        "token"]}}`` of its ``schedule_append`` event) joins :attr:`announced`, then
        :meth:`fetch_all` fetches what ``batch`` drops; the resource directory's path (the
        engine's :class:`~vmr_handler.agent.engine.ports.BatchResources`)."""
        self.announced.update({name: dict(info) for name, info in announced.items()})
        return await self.fetch_all(batch)

    async def fetch_one(self, name: str, target: str) -> Optional[str]:
        """Download one resource with resume-from-offset retries; None on success, else why not."""
        tmp = target + ".part"
        for _attempt in range(50):
            offset = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            await self._link.welcomed.wait()
            try:
                ident, queue = await self._link.request(P.RESOURCE_REQUEST, name=name, offset=offset)
            except ChannelClosed:
                await asyncio.sleep(0.5)
                continue
            try:
                while True:
                    event = await asyncio.wait_for(queue.get(), 30)
                    d = event.data
                    if event.type == P.RESULT and d.get("status") == "error":
                        return str(d.get("details"))
                    have = os.path.getsize(tmp) if os.path.exists(tmp) else 0
                    if d.get("offset") != have:
                        break  # out of step (a resend): ask again from what we have
                    with open(tmp, "ab") as fh:
                        fh.write(base64.b64decode(str(d.get("data_b64", ""))))
                    if d.get("last"):
                        if sha256_file(tmp) != d.get("sha256"):
                            os.unlink(tmp)
                            return "sha256 mismatch after download"
                        os.replace(tmp, target)
                        return None
            except asyncio.TimeoutError:
                continue
            finally:
                self._link.forget_request(ident)
        return "gave up after 50 attempts"

    async def _fetch_http(self, name: str, target: str, info: Mapping[str, Any]) -> Optional[str]:
        """Download one resource from the ``url`` announced with the schedule (``vmr-host serve
        --http``) in a worker thread (:func:`vmr_handler.agent.connected.httpfetch.fetch`: resumable, retried,
        checked against the announced sha256); None on success, else why not. Ends at the next
        block when the agent stops (the ``.part`` file is kept for the next start)."""
        from vmr_handler.agent.connected.httpfetch import fetch

        url, token, sha256, size = (info.get(k) for k in ("url", "token", "sha256", "size"))
        if not (isinstance(url, str) and isinstance(token, str) and isinstance(sha256, str)):
            return "announced with a url but without token and sha256"
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return "announced with a url but without a size"
        return await self._jobs.run(fetch, url, token, target, sha256, size, self._jobs.verify())


def _link_name(root: str, name: str, target: str) -> None:
    """Make ``<root>/<name>`` (the name the schedule uses) point at the fetched file."""
    dest = os.path.join(root, name)
    if os.path.realpath(dest) == os.path.realpath(target):
        return
    os.makedirs(os.path.dirname(dest) or root, exist_ok=True)
    tmp = dest + ".lnk"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, dest)
