"""What a VM session delivers to its agent on request (``docs/protocol.md``): its schedule
(:class:`ScheduleOffer`: inline in the ``schedule`` event, or fetched in chunks when large)
and resources (:class:`ResourceStreams`: ``resource_chunk`` streams answering
``resource_request``, the large schedule included).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from typing import Any, Dict, Mapping, Optional, Protocol, Set

from vmr_handler.core.clock import Clock
from vmr_handler.core.errors import ResourceRefused
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import RESOURCE_CHUNK, SCHEDULE, encode_message
from vmr_handler.host.logs.text import printable
from vmr_handler.host.model.vmstate import SCHEDULE_ANSWER, Counters
from vmr_handler.host.serve.config import Limits, VmSpec
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.session.api import HostEvents, Link

log = logging.getLogger("vmr_handler.host")

#: Schedules up to this size travel inside the ``schedule`` event; larger ones are fetched by
#: the agent in chunks with ``resource_request`` for :func:`schedule_resource_name`.
INLINE_SCHEDULE = 512 * 1024


def schedule_resource_name(digest: str) -> str:
    """The resource name under which a large schedule is served (docs/protocol.md)."""
    return f"schedule:{digest}"


def schedule_event_id(digest: str) -> str:
    """The stable id of the ``schedule`` event for a schedule with this sha256."""
    return f"{SCHEDULE_ANSWER}{digest[:32]}"


class ScheduleOffer:
    """One VM's ``schedule`` event, made and encoded once (up to ~1 MiB: never re-encoded
    per handshake).

    Args:
        spec: the VM (its schedule bytes, digest and format).
        resource_info: ``{filename: {"size", "sha256"[, "url"]}}`` announced with the schedule.
        http: ``{"base", "token"}`` of the host's resource HTTP server for this VM, announced
            as the ``http`` member; None without ``--http``.
        clock: the host's clock (the event's timestamp, each frame's ``now``).
    """

    def __init__(
        self,
        spec: VmSpec,
        resource_info: Mapping[str, Mapping[str, Any]],
        http: Optional[Mapping[str, str]],
        clock: Clock,
    ) -> None:
        self.clock = clock
        self.id = schedule_event_id(spec.digest)
        data: Dict[str, Any] = {
            "format_hint": spec.format,
            "sha256": spec.digest,
            "size": len(spec.schedule_bytes),
            "resources": {k: dict(v) for k, v in sorted(resource_info.items())},
        }
        if http is not None:  # large resources come over HTTP(S) (urls in "resources")
            data["http"] = dict(http)
        if len(spec.schedule_bytes) <= INLINE_SCHEDULE:
            data["data_b64"] = base64.b64encode(spec.schedule_bytes).decode("ascii")
        else:  # too big for one frame: the agent fetches it in chunks (resource_request)
            data["fetch"] = schedule_resource_name(spec.digest)
        self._ts = clock.time()
        #: the event (to be signed at every send when the host signs)
        self.event = Event(SCHEDULE, self._ts, self.id, data)
        self._json = json.dumps(self.event.to_dict(), separators=(",", ":"), allow_nan=False)

    def frame(self) -> bytes:
        """The unsigned event as one frame, its ``now`` the current time (never before the event)."""
        now_text = json.dumps(max(self.clock.time(), self._ts))
        return f'{{"now":{now_text},"events":[{self._json}]}}\n'.encode()


class StreamOwner(Protocol):
    """What :class:`ResourceStreams` needs of its session."""

    name: str
    spec: VmSpec
    limits: Limits
    resources: ResourceStore
    events: HostEvents
    counters: Counters
    #: the host's clock
    clock: Clock
    #: the current connection (a stream stops when it changes)
    link: Optional[Link]

    def refuse(self, request_id: str, details: str) -> None:
        """Answer request ``request_id`` with a failed ``result`` saying ``details``."""

    def warn(self, kind: str, text: str, now: float) -> None:
        """A rate-limited remark on hostile input."""

    def note_sent(self) -> None:
        """Something was just sent (no heartbeat needed)."""


class ResourceStreams:
    """The ``resource_request``\\ s of one VM: each answered by a task streaming
    ``resource_chunk`` events from the requested offset, at most ``limits.resource_streams``
    at a time; refusals are counted and answered with a failed ``result``.

    Args:
        owner: the VM's session.
    """

    def __init__(self, owner: StreamOwner) -> None:
        self._owner = owner
        self._tasks: Set[asyncio.Task[None]] = set()

    def cancel(self) -> None:
        """Stop every stream under way (the connection ended)."""
        for task in list(self._tasks):
            task.cancel()

    def request(self, ev: Event, now: float) -> None:
        """A ``resource_request`` ``ev`` (``name``, ``offset``) received at UTC ``now``."""
        o = self._owner
        name = ev.data.get("name")
        offset = ev.data.get("offset", 0)
        is_schedule = name == schedule_resource_name(o.spec.digest)
        if not isinstance(name, str) or (name not in o.spec.filenames and not is_schedule):
            o.counters.resources_refused += 1
            o.warn("resource", f"resource request for {printable(str(name), 200)!r} refused", now)
            o.refuse(ev.id, f"resource {name!r} refused: not a filename drop of this VM's schedule")
            return
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            o.counters.resources_refused += 1
            o.refuse(ev.id, "offset must be an integer >= 0")
            return
        if len(self._tasks) >= o.limits.resource_streams:
            o.counters.resources_refused += 1
            o.refuse(ev.id, f"busy: {len(self._tasks)} resource downloads under way; ask again later")
            return
        link = o.link
        if link is None:
            return
        task = asyncio.get_running_loop().create_task(self._stream(ev.id, name, offset, link))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _push(self, link: Link, chunk: Event) -> None:
        link.send_bytes(encode_message([chunk], self._owner.clock.time()))
        self._owner.note_sent()
        await link.drain()

    async def _stream(self, request_id: str, name: str, offset: int, link: Link) -> None:
        o = self._owner
        if name == schedule_resource_name(o.spec.digest):
            await self._stream_bytes(request_id, name, offset, link, o.spec.schedule_bytes, o.spec.digest)
            return
        try:
            if o.resources.is_cached(name):
                info = o.resources.info(name)
            else:
                info = await asyncio.to_thread(o.resources.info, name)
            if offset > info.size:
                raise ResourceRefused(f"offset {offset} is past the end of {name!r} ({info.size} bytes)")
            try:
                fd = os.open(info.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise ResourceRefused(f"resource {name!r} cannot be opened: {exc.strerror}") from exc
            try:
                pos = offset
                while link is o.link and not link.closed:
                    piece = os.pread(fd, o.limits.resource_chunk, pos)
                    last = not piece or pos + len(piece) >= info.size
                    chunk = o.events.make(
                        RESOURCE_CHUNK,
                        {
                            "answers": request_id,
                            "name": name,
                            "offset": pos,
                            "data_b64": base64.b64encode(piece).decode("ascii"),
                            "size": info.size,
                            "sha256": info.sha256,
                            "last": last,
                        },
                    )
                    await self._push(link, chunk)
                    if last:
                        o.counters.resources_served += 1
                        return
                    pos += len(piece)
            finally:
                os.close(fd)
        except ResourceRefused as exc:
            o.counters.resources_refused += 1
            if link is o.link:
                o.refuse(request_id, str(exc))
        except (ConnectionError, OSError) as exc:
            log.info("%s: resource %r not sent: %s", o.name, name, exc)

    async def _stream_bytes(
        self, request_id: str, name: str, offset: int, link: Link, data: bytes, digest: str
    ) -> None:
        """Stream in-memory ``data`` (a large schedule, sha256 ``digest``) as ``resource_chunk``
        events from ``offset``."""
        o = self._owner
        if offset > len(data):
            o.refuse(request_id, f"offset {offset} is past the end of {name!r} ({len(data)} bytes)")
            return
        pos = offset
        try:
            while link is o.link and not link.closed:
                piece = data[pos : pos + o.limits.resource_chunk]
                last = pos + len(piece) >= len(data)
                chunk = o.events.make(
                    RESOURCE_CHUNK,
                    {"answers": request_id, "name": name, "offset": pos, "size": len(data), "sha256": digest,
                     "last": last, "data_b64": base64.b64encode(piece).decode("ascii")},
                )  # fmt: skip
                await self._push(link, chunk)
                if last:
                    return
                pos += len(piece)
        except (ConnectionError, OSError) as exc:
            log.info("%s: schedule not sent: %s", o.name, exc)
