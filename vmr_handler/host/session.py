"""One VM's side of the protocol on the host (``docs/protocol.md``): the connection state
machine, independent of how bytes move.

A :class:`VmSession` lives for the whole host run; connections come and go
(:meth:`VmSession.attach` / :meth:`VmSession.detach`). The server feeds it the bytes read
from the VM's channel (:meth:`VmSession.feed`) and it answers through a :class:`Link`
(one frame per :meth:`Link.send`). What the session needs from the experiment as a whole
(start time, RESUMEs, the barrier) it asks of a :class:`HostApi`.

Per connection: the host sends ``\\n`` + ``hello``; the agent's ``hello`` is answered with
``welcome`` and whatever the agent is missing (``schedule`` when its digest differs,
``start_time`` when set, pending ``resume``\\ s); ``clock_req`` gets ``clock_resp``
(t2 = host receive time, t3 = host send time, UTC); ``resource_request`` gets
``resource_chunk``\\ s; reports are written to the VM's log, then acknowledged.

Hostile guests: frames over the size limit and malformed frames are dropped and counted by
the :class:`~vmr_handler.core.protocol.FrameDecoder`; messages over the per-VM rate or with too
many events are dropped and counted; host-only event types coming from a guest are counted
as protocol errors. The VM's identity is its channel: the ``vm`` name a guest claims is
only compared and logged. Nothing here raises into the server on bad input.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Set

from vmr_handler import __version__
from vmr_handler.core.errors import ResourceRefused, TransferRefused
from vmr_handler.core.events import Event, EventType, json_safe
from vmr_handler.core.protocol import (
    ACK,
    CLOCK_REQ,
    CLOCK_RESP,
    CONNECT_PREFIX,
    HEARTBEAT,
    HELLO,
    PROTOCOL_VERSION,
    RESOURCE_CHUNK,
    RESOURCE_REQUEST,
    RESULT,
    RESUME,
    SCHEDULE,
    START_TIME,
    TRANSFER_CHUNK,
    TRANSFER_UPLOADED,
    WELCOME,
    DecoderStats,
    FrameDecoder,
    Message,
    encode_message,
    result_data,
)
from vmr_handler.core.ratelimit import TokenBucket, worth_logging
from vmr_handler.core.signing import SIGNED_TYPES
from vmr_handler.host.config import Limits, VmSpec
from vmr_handler.host.resources import ResourceStore
from vmr_handler.host.store import TransferStore, VmLog, printable

log = logging.getLogger("vmr_handler.host")

#: Event types only the host sends; a guest sending one breaks the protocol.
HOST_ONLY = frozenset({WELCOME, SCHEDULE, CLOCK_RESP, RESOURCE_CHUNK, START_TIME, RESUME})
#: Handshakes answered per VM: 2 per second, burst 10 (an agent says hello twice per
#: connection; a guest flooding hellos would make the host resend its schedule each time).
HELLO_RATE = 2.0
HELLO_BURST = 10.0
#: Schedules up to this size travel inside the ``schedule`` event; larger ones are fetched by
#: the agent in chunks with ``resource_request`` for :func:`schedule_resource_name`.
INLINE_SCHEDULE = 512 * 1024


def schedule_resource_name(digest: str) -> str:
    """The resource name under which a large schedule is served (docs/protocol.md)."""
    return f"schedule:{digest}"


#: Agent control events that are answered, not stored.
UNSTORED = frozenset({HELLO, HEARTBEAT, ACK, CLOCK_REQ, RESOURCE_REQUEST})


def _finite(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _short(value: Any, limit: int = 128) -> Optional[str]:
    return printable(value, limit) if isinstance(value, str) else None


class Link(Protocol):
    """Where a session's frames go (the server wraps a stream writer)."""

    @property
    def closed(self) -> bool:
        """True once the connection is closed."""

    def send_bytes(self, data: bytes) -> None:
        """Queue raw bytes (never blocks; may close the link when the peer does not read)."""

    async def drain(self) -> None:
        """Wait until the queued bytes are handed to the kernel (back-pressure)."""

    def close(self) -> None:
        """Close the connection."""


class HostApi(Protocol):
    """What a session needs from the experiment (implemented by the server)."""

    def start_event(self) -> Optional[Event]:
        """The ``start_time`` event (stable id), or None before the start is set."""

    def pending_resumes(self, vm: str) -> List[Event]:
        """``resume`` events issued to ``vm`` that it has not answered, oldest first."""

    def on_configured(self, vm: str, at: float) -> None:
        """``vm`` configured at host UTC ``at`` (idempotent)."""

    @property
    def signs(self) -> bool:
        """True when control events are signed (a host signing key is configured)."""

    def sign_for(self, vm: str, event: Event) -> Event:
        """``event`` signed for ``vm`` now (unchanged without a key; ``vmr_handler.core.signing``)."""

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        """``vm`` answered RESUME ``resume_id`` with ``data`` (idempotent)."""


class HostEvents:
    """Makes the host's own events: unique ids (``host-<random>-<n>``), UTC timestamps."""

    def __init__(self) -> None:
        self._prefix = f"host-{uuid.uuid4().hex[:10]}"
        self._counter = itertools.count(1)

    def next_id(self) -> str:
        """A fresh unique event id."""
        return f"{self._prefix}-{next(self._counter):08d}"

    def make(self, type_: str, data: Mapping[str, Any], timestamp: Optional[float] = None) -> Event:
        """A new host event of ``type_`` (a control type) with ``data`` made JSON safe;
        ``timestamp`` is UTC epoch seconds (default now)."""
        ts = time.time() if timestamp is None else timestamp
        return Event(type_, ts, self.next_id(), json_safe(dict(data)))


@dataclass
class Counters:
    """Per-VM counts of everything refused or odd (shown by ``vmr-host status``)."""

    rate_limited: int = 0
    too_many_events: int = 0
    protocol_errors: int = 0
    vm_mismatch: int = 0
    refused_connections: int = 0
    write_overflow: int = 0
    transfer_refused: int = 0
    transfer_bad_sha256: int = 0
    resources_served: int = 0
    resources_refused: int = 0
    unstorable: int = 0
    hello_flood: int = 0


def schedule_event_id(digest: str) -> str:
    """The stable id of the ``schedule`` event for a schedule with this sha256."""
    return f"schedule-{digest[:32]}"


class VmSession:
    """The host's state of one VM and its protocol engine.

    Args:
        spec: the VM (name, schedule).
        expected: whether the barrier waits for it.
        limits: the per-VM limits.
        vmlog: its log (already opened).
        transfers: its transfer store (already opened).
        resources: the shared resource store.
        host: the experiment (start time, RESUMEs, barrier).
        events: the host's event maker.
        resource_info: ``{filename: {"size", "sha256"[, "url"]}}`` announced with the schedule.
        http: ``{"base", "token"}`` of the host's resource HTTP server for this VM
            (:meth:`vmr_handler.host.http.ResourceHttp.schedule_data`), announced with the
            schedule as its ``http`` member; None without ``--http``.
    """

    def __init__(
        self,
        spec: VmSpec,
        expected: bool,
        limits: Limits,
        vmlog: VmLog,
        transfers: TransferStore,
        resources: ResourceStore,
        host: HostApi,
        events: HostEvents,
        resource_info: Mapping[str, Mapping[str, Any]],
        http: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.expected = expected
        self.limits = limits
        self.log = vmlog
        self.transfers = transfers
        self.resources = resources
        self.host = host
        self.events = events
        self.schedule_id = schedule_event_id(spec.digest)
        schedule_data: Dict[str, Any] = {
            "format_hint": spec.format,
            "sha256": spec.digest,
            "size": len(spec.schedule_bytes),
            "resources": {k: dict(v) for k, v in sorted(resource_info.items())},
        }
        if http is not None:  # large resources come over HTTP(S) (urls in "resources")
            schedule_data["http"] = dict(http)
        if len(spec.schedule_bytes) <= INLINE_SCHEDULE:
            schedule_data["data_b64"] = base64.b64encode(spec.schedule_bytes).decode("ascii")
        else:  # too big for one frame: the agent fetches it in chunks (resource_request)
            schedule_data["fetch"] = schedule_resource_name(spec.digest)
        #: the schedule event encoded once (up to ~1 MiB: never re-encoded per handshake)
        self._schedule_ts = time.time()
        self._schedule_event = Event(SCHEDULE, self._schedule_ts, self.schedule_id, schedule_data)
        self._schedule_json = json.dumps(
            self._schedule_event.to_dict(),
            separators=(",", ":"),
            allow_nan=False,
        )
        # connection
        self.link: Optional[Link] = None
        self.decoder: Optional[FrameDecoder] = None
        self.stats_base = DecoderStats()
        self.connections = 0
        self.connected_since: Optional[float] = None
        self.handshaken = False
        self.handshakes = 0
        self._last_send = 0.0  # monotonic
        self._last_recv = 0.0  # monotonic
        self.silent = False
        self.bucket = TokenBucket(limits.rate, limits.burst)
        self.hello_bucket = TokenBucket(HELLO_RATE, HELLO_BURST)
        self.read_bucket = TokenBucket(limits.read_rate, limits.read_burst)
        self._streams: Set[asyncio.Task[None]] = set()
        # what the agent told
        self.agent_version: Optional[str] = None
        self.boot_id: Optional[str] = None
        self.claimed_vm: Optional[str] = None
        self.unacked: Optional[int] = None
        # what the VM did (rebuilt from the .jsonl at start, then live)
        self.schedule_state = "pending"  # pending|sent|accepted|rejected
        self.schedule_details: Optional[str] = None
        self.stage: Optional[int] = None
        self.stage_time: Optional[float] = None
        self.stage_running = False
        self.stages_done = 0
        self.configured_at: Optional[float] = None
        self.failed: Optional[str] = None
        self.complete = False
        self.last_seen: Optional[float] = None
        self.max_lateness: Optional[float] = None
        self.failures = 0
        self.start_acked = False
        self.counters = Counters()
        self._warned: Dict[str, int] = {}

    # ------------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        """True while a connection to this VM's channel is up."""
        return self.link is not None and not self.link.closed

    def attach(self, link: Link, now: float) -> bool:
        """A new connection on this VM's channel at UTC ``now``.

        Returns:
            False (and nothing changes) when a connection is already up: the caller closes
            the new one; it is counted in ``refused_connections``.
        """
        if self.connected:
            self.counters.refused_connections += 1
            self._warn("refused", "a second connection to this VM's channel was refused", now)
            return False
        self.link = link
        self.decoder = FrameDecoder(max_frame=self.limits.max_frame)
        self.connections += 1
        self.connected_since = now
        self.handshaken = False
        self.silent = False
        mono = time.monotonic()
        self._last_recv = mono
        self.log.note(f"channel connected (connection {self.connections})", now)
        self._send_raw(CONNECT_PREFIX)
        self._send([self.events.make(HELLO, {"protocol": PROTOCOL_VERSION, "host_version": __version__})])
        return True

    def detach(self, link: Link, now: float, reason: str = "closed") -> None:
        """The connection ``link`` ended at UTC ``now`` (no-op for a link not attached)."""
        if link is not self.link:
            return
        if self.decoder is not None:
            s = self.decoder.stats
            b = self.stats_base
            b.frames += s.frames
            b.malformed += s.malformed
            b.oversize += s.oversize
            b.bytes += s.bytes
            b.last_error = s.last_error or b.last_error
        self.decoder = None
        self.link = None
        self.handshaken = False
        for task in list(self._streams):
            task.cancel()
        self.log.note(f"channel disconnected ({reason})", now)

    def decoder_stats(self) -> DecoderStats:
        """Frames, malformed and oversize counts over every connection so far."""
        b = self.stats_base
        s = self.decoder.stats if self.decoder is not None else DecoderStats()
        return DecoderStats(
            b.frames + s.frames,
            b.malformed + s.malformed,
            b.oversize + s.oversize,
            b.bytes + s.bytes,
            s.last_error or b.last_error,
        )

    def _send_raw(self, data: bytes) -> None:
        if self.link is not None and not self.link.closed:
            self.link.send_bytes(data)
            self._last_send = time.monotonic()

    def _send(self, events: Sequence[Event]) -> None:
        if events:
            # schedule, start time and RESUME are signed (at every send) when the host has a key
            events = [self.host.sign_for(self.name, e) if e.type in SIGNED_TYPES else e for e in events]
            self._send_raw(encode_message(events, time.time()))

    def _warn(self, kind: str, text: str, now: float) -> None:
        """Log a hostile-input remark, rate-limited per kind (1st-5th, then every power of 10)."""
        n = self._warned.get(kind, 0) + 1
        self._warned[kind] = n
        if worth_logging(n):
            more = f" (x{n})" if n > 1 else ""
            log.warning("%s: %s%s", self.name, text, more)
            self.log.note(text + more, now)

    # ------------------------------------------------------------------ input
    def feed(self, data: bytes, recv_time: float) -> None:
        """Bytes read from the channel at UTC ``recv_time``: decode and handle every whole frame.

        Never raises on bad input (it is counted); an ``OSError`` from the log disk is
        logged and the events are left unacknowledged (the agent resends them).
        """
        if self.decoder is None:
            return
        mono = time.monotonic()
        self._last_recv = mono
        before = self.decoder.stats.malformed + self.decoder.stats.oversize
        messages = self.decoder.feed(data)
        bad = self.decoder.stats.malformed + self.decoder.stats.oversize - before
        if bad:
            self._warn(
                "malformed", f"malformed/oversize frame dropped: {self.decoder.stats.last_error}", recv_time
            )
        if messages or bad:
            self.last_seen = recv_time
            if self.silent:
                self.silent = False
                self.log.note("peer talks again", recv_time)
        for msg in messages:
            if not self.bucket.take(mono):
                self.counters.rate_limited += 1
                self._warn("rate", f"message dropped: over {self.limits.rate:g} messages/s", recv_time)
                continue
            if len(msg.events) > self.limits.max_events:
                self.counters.too_many_events += 1
                n = len(msg.events)
                self._warn(
                    "events", f"message of {n} events dropped (limit {self.limits.max_events})", recv_time
                )
                continue
            self._on_message(msg, recv_time)

    def over_byte_rate(self, nbytes: int) -> bool:
        """Charge ``nbytes`` received to this VM's byte rate; True (dropped, counted, logged)
        when it is over it. For transports that cannot pause reading one VM (MQTT: one broker
        connection carries every VM): the excess is dropped before it is decoded, and the
        agent sends its unacknowledged reports again later."""
        if self.read_bucket.spend(time.monotonic(), nbytes) <= 0:
            return False
        self.read_bucket.spend(time.monotonic(), -nbytes)  # dropped: not charged
        self.counters.rate_limited += 1
        self._warn("bytes", f"message dropped: over {self.limits.read_rate / 2**20:g} MiB/s", time.time())
        return True

    def read_pause(self, nbytes: int) -> float:
        """Seconds the server should wait before reading more from this VM, after ``nbytes``
        were read: reading pauses while the VM is over its byte rate or its message rate (so a
        flooding guest costs the host bounded CPU; its excess waits in the socket)."""
        mono = time.monotonic()
        return max(self.read_bucket.spend(mono, nbytes), self.bucket.wait(mono))

    def _on_message(self, msg: Message, recv_time: float) -> None:
        to_store: List[Event] = []
        seen_here: Set[str] = set()
        for ev in msg.events:
            t = ev.type
            if t == HELLO:
                if self.hello_bucket.take(time.monotonic()):
                    self._on_hello(ev, recv_time)
                else:
                    self.counters.hello_flood += 1
                    self._warn("hello", "hello ignored: more than 2 handshakes per second", recv_time)
            elif t in (HEARTBEAT,):
                pass
            elif t == ACK:
                ids = ev.data.get("ids")
                start = self.host.start_event()
                if isinstance(ids, list) and start is not None and start.id in ids:
                    self.start_acked = True
            elif t == CLOCK_REQ:
                self._on_clock_req(ev, recv_time)
            elif t == RESOURCE_REQUEST:
                self._on_resource_request(ev, recv_time)
            elif t in HOST_ONLY:
                self.counters.protocol_errors += 1
                self._warn("host-only", f"guest sent a host-only {t!r} event: ignored", recv_time)
            elif t in (TRANSFER_CHUNK, TRANSFER_UPLOADED):
                if self.log.seen(ev.id) or ev.id in seen_here:
                    to_store.append(ev)  # a duplicate: acknowledged again, not applied again
                else:
                    seen_here.add(ev.id)
                    to_store.append(self._on_transfer(ev, recv_time))
            else:
                to_store.append(ev)
        if not to_store:
            return
        try:
            new = self.log.write([(e, recv_time) for e in to_store])
        except OSError as exc:
            log.error("%s: cannot write the log (%s): events left unacknowledged", self.name, exc)
            return
        for ev in new:
            self.apply(ev, recv_time)
        ids = [e.id for e in to_store if self.log.seen(e.id)]
        self.counters.unstorable += len(to_store) - len(ids)
        if ids:
            self._send([self.events.make(ACK, {"ids": list(dict.fromkeys(ids))})])

    # ------------------------------------------------------------------ state from reports
    def apply(self, ev: Event, received: float) -> None:
        """Update this VM's state from a stored report received at host UTC ``received``.

        Used live and when the ``.jsonl`` is replayed at host start (so a restarted host
        shows the same state). Never raises on odd data.
        """
        d = ev.data
        t = ev.type
        if self.last_seen is None or received > self.last_seen:
            self.last_seen = received
        if t == EventType.STAGE_STARTED.value:
            stage = d.get("stage")
            self.stage = stage if isinstance(stage, int) and not isinstance(stage, bool) else self.stage
            self.stage_time = _finite(d.get("start_time"))
            self.stage_running = True
        elif t == EventType.STAGE_FINISHED.value:
            self.stage_running = False
            self.stages_done += 1
        elif t == EventType.CONFIGURED.value:
            if self.configured_at is None:
                self.configured_at = received
            self.host.on_configured(self.name, received)
        elif t == EventType.VM_FAILED.value:
            self.failed = _short(d.get("details"), 500) or "vm_failed"
            self.failures += 1
        elif t == EventType.SCHEDULE_COMPLETE.value:
            self.complete = True
        elif t == EventType.ENTRY_STARTED.value:
            late = _finite(d.get("lateness"))
            if late is not None and (self.max_lateness is None or late > self.max_lateness):
                self.max_lateness = late
        elif t == EventType.ENTRY_FAILED.value or (
            t == EventType.ENTRY_EXITED.value and d.get("status") == "error"
        ):
            self.failures += 1
        elif t == RESULT:
            answers = d.get("answers")
            if answers == self.schedule_id:
                ok = d.get("status") == "success"
                self.schedule_state = "accepted" if ok else "rejected"
                self.schedule_details = _short(d.get("details"), 2000)
            elif isinstance(answers, str):
                self.host.on_resume_answer(self.name, answers, d, received)

    # ------------------------------------------------------------------ handlers
    def _on_hello(self, ev: Event, now: float) -> None:
        d = ev.data
        if d.get("protocol") != PROTOCOL_VERSION:
            self.counters.protocol_errors += 1
            self._warn("protocol", f"hello with unsupported protocol {d.get('protocol')!r}", now)
            details = f"unsupported protocol {d.get('protocol')!r}; this host speaks {PROTOCOL_VERSION}"
            self._send([self.events.make(RESULT, result_data(ev.id, False, details))])
            return
        claimed = d.get("vm")
        self.claimed_vm = _short(claimed)
        if claimed is not None and claimed != self.name:
            self.counters.vm_mismatch += 1
            self._warn(
                "vm",
                f"agent says it is {self.claimed_vm!r}; this channel is {self.name!r} (channel wins)",
                now,
            )
        self.agent_version = _short(d.get("agent_version"))
        self.boot_id = _short(d.get("boot_id"))
        unacked = d.get("unacked")
        self.unacked = unacked if isinstance(unacked, int) and not isinstance(unacked, bool) else None
        journal = d.get("journal")
        journal = journal if isinstance(journal, dict) else {}
        digest = journal.get("digest")
        if _finite(journal.get("configured_at")) is not None and digest == self.spec.digest:
            # the agent configured earlier but its `configured` report never reached this host
            if self.configured_at is None:
                self.configured_at = now
            self.host.on_configured(self.name, now)
        start = self.host.start_event()
        pending = self.host.pending_resumes(self.name)
        welcome = {
            "protocol": PROTOCOL_VERSION,
            "host_version": __version__,
            "vm": self.name,
            "schedule_digest": self.spec.digest,
            "start_time": start.data["start_time"] if start is not None else None,
            "resumes": [r.id for r in pending],
        }
        self._send([self.events.make(WELCOME, welcome)])
        if digest != self.spec.digest:
            if self.host.signs:
                self._send([self._schedule_event])
            else:
                now_text = json.dumps(max(time.time(), self._schedule_ts))
                self._send_raw(f'{{"now":{now_text},"events":[{self._schedule_json}]}}\n'.encode())
            if self.schedule_state != "rejected":
                self.schedule_state = "sent"
        elif self.schedule_state != "accepted":
            self.schedule_state = "accepted"
        self._send(([start] if start is not None else []) + pending)
        self.handshaken = True
        self.handshakes += 1
        self.log.note(
            f"handshake: agent {self.agent_version} boot {self.boot_id} journal digest "
            f"{'matches' if digest == self.spec.digest else 'differs: schedule sent'}; "
            f"start time {'sent' if start else 'not set'}; {len(pending)} pending RESUME(s)",
            now,
        )

    def _on_clock_req(self, ev: Event, recv_time: float) -> None:
        t1 = _finite(ev.data.get("t1"))
        if t1 is None:
            self.counters.protocol_errors += 1
            self._warn("clock", "clock_req without a finite t1", recv_time)
            return
        t3 = time.time()
        resp = Event(
            CLOCK_RESP, t3, self.events.next_id(), {"answers": ev.id, "t1": t1, "t2": recv_time, "t3": t3}
        )
        self._send([resp])

    def _refuse(self, request_id: str, details: str) -> None:
        self._send([self.events.make(RESULT, result_data(request_id, False, details))])

    def _on_resource_request(self, ev: Event, now: float) -> None:
        name = ev.data.get("name")
        offset = ev.data.get("offset", 0)
        is_schedule = name == schedule_resource_name(self.spec.digest)
        if not isinstance(name, str) or (name not in self.spec.filenames and not is_schedule):
            self.counters.resources_refused += 1
            self._warn("resource", f"resource request for {printable(str(name), 200)!r} refused", now)
            self._refuse(ev.id, f"resource {name!r} refused: not a filename drop of this VM's schedule")
            return
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            self.counters.resources_refused += 1
            self._refuse(ev.id, "offset must be an integer >= 0")
            return
        if len(self._streams) >= self.limits.resource_streams:
            self.counters.resources_refused += 1
            self._refuse(ev.id, f"busy: {len(self._streams)} resource downloads under way; ask again later")
            return
        link = self.link
        if link is None:
            return
        task = asyncio.get_running_loop().create_task(self._stream_resource(ev.id, name, offset, link))
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def _stream_resource(self, request_id: str, name: str, offset: int, link: Link) -> None:
        if name == schedule_resource_name(self.spec.digest):
            await self._stream_bytes(
                request_id, name, offset, link, self.spec.schedule_bytes, self.spec.digest
            )
            return
        try:
            if self.resources.is_cached(name):
                info = self.resources.info(name)
            else:
                info = await asyncio.to_thread(self.resources.info, name)
            if offset > info.size:
                raise ResourceRefused(f"offset {offset} is past the end of {name!r} ({info.size} bytes)")
            try:
                fd = os.open(info.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise ResourceRefused(f"resource {name!r} cannot be opened: {exc.strerror}") from exc
            try:
                pos = offset
                while link is self.link and not link.closed:
                    piece = os.pread(fd, self.limits.resource_chunk, pos)
                    last = not piece or pos + len(piece) >= info.size
                    chunk = self.events.make(
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
                    link.send_bytes(encode_message([chunk], time.time()))
                    self._last_send = time.monotonic()
                    await link.drain()
                    if last:
                        self.counters.resources_served += 1
                        return
                    pos += len(piece)
            finally:
                os.close(fd)
        except ResourceRefused as exc:
            self.counters.resources_refused += 1
            if link is self.link:
                self._refuse(request_id, str(exc))
        except (ConnectionError, OSError) as exc:
            log.info("%s: resource %r not sent: %s", self.name, name, exc)

    async def _stream_bytes(
        self, request_id: str, name: str, offset: int, link: Link, data: bytes, digest: str
    ) -> None:
        """Stream in-memory ``data`` (a large schedule, sha256 ``digest``) as ``resource_chunk``
        events from ``offset``."""
        if offset > len(data):
            self._refuse(request_id, f"offset {offset} is past the end of {name!r} ({len(data)} bytes)")
            return
        pos = offset
        try:
            while link is self.link and not link.closed:
                piece = data[pos : pos + self.limits.resource_chunk]
                last = pos + len(piece) >= len(data)
                chunk = self.events.make(
                    RESOURCE_CHUNK,
                    {"answers": request_id, "name": name, "offset": pos, "size": len(data), "sha256": digest,
                     "last": last, "data_b64": base64.b64encode(piece).decode("ascii")},
                )  # fmt: skip
                link.send_bytes(encode_message([chunk], time.time()))
                self._last_send = time.monotonic()
                await link.drain()
                if last:
                    return
                pos += len(piece)
        except (ConnectionError, OSError) as exc:
            log.info("%s: schedule not sent: %s", self.name, exc)

    def _on_transfer(self, ev: Event, now: float) -> Event:
        """Store a ``transfer_chunk``, or put in place a file uploaded over HTTP(S) that a
        ``transfer_uploaded`` report names (:meth:`TransferStore.commit_upload`); return the
        event to log in its place (no file data)."""
        d = ev.data
        raw = d.get("data_b64", "")
        summary: Dict[str, Any] = {
            k: d.get(k) for k in ("location", "offset", "size", "sha256", "last", "mtime") if k in d
        }
        if isinstance(summary.get("location"), str):
            summary["location"] = printable(summary["location"], 4096)
        what = "transfer chunk" if ev.type == TRANSFER_CHUNK else "uploaded transfer"
        try:
            if ev.type == TRANSFER_UPLOADED:
                args = (d.get("location"), d.get("sha256"), d.get("size"), d.get("mtime"))
                outcome = self.transfers.commit_upload(*args)
                summary.update(
                    stored_as=outcome.path, status="success", details="complete (uploaded over HTTP)"
                )
                return Event(ev.type, ev.timestamp, ev.id, summary)
            if not isinstance(raw, str):
                raise TransferRefused("data_b64 must be a string")
            try:
                data = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise TransferRefused(f"data_b64 is not base64: {exc}") from exc
            summary["data_len"] = len(data)
            outcome = self.transfers.write_chunk(
                d.get("location"),
                d.get("offset"),
                data,
                d.get("size"),
                d.get("sha256"),
                bool(d.get("last")),
                d.get("mtime"),
            )
            summary["stored_as"] = outcome.path
            if outcome.sha256_ok is False:
                self.counters.transfer_bad_sha256 += 1
                summary.update(status="error", details="sha256 of the assembled file does not match")
                self._warn(
                    "transfer-sha", f"transfer {outcome.path!r}: sha256 mismatch, not put in place", now
                )
            else:
                summary.update(status="success", details="complete" if outcome.complete else "chunk stored")
        except TransferRefused as exc:
            self.counters.transfer_refused += 1
            summary.update(status="error", details=f"refused: {exc}")
            self._warn("transfer", f"{what} refused: {exc}", now)
        except OSError as exc:
            self.counters.transfer_refused += 1
            summary.update(status="error", details=f"host could not store it: {exc.strerror or exc}")
            self._warn("transfer-io", f"{what} not stored: {exc}", now)
        return Event(ev.type, ev.timestamp, ev.id, summary)

    # ------------------------------------------------------------------ pushes from the host
    def push_start_time(self) -> None:
        """Send the (just set) start time, if this VM is connected and has said hello."""
        start = self.host.start_event()
        if start is not None and self.handshaken and self.connected:
            self._send([start])

    def push_resume(self, resume: Event) -> bool:
        """Send a RESUME now if connected and handshaken. Returns whether it was sent."""
        if self.handshaken and self.connected:
            self._send([resume])
            return True
        return False

    def tick(self, now: float) -> None:
        """Periodic duty at UTC ``now``: a heartbeat after send silence; mark a silent peer."""
        if not self.connected:
            return
        mono = time.monotonic()
        if mono - self._last_send >= self.limits.heartbeat:
            self._send([self.events.make(HEARTBEAT, {})])
        if not self.silent and mono - self._last_recv >= self.limits.silent_after:
            self.silent = True
            self.log.note(f"peer silent for {self.limits.silent_after:g} s", now)

    # ------------------------------------------------------------------ status
    def state(self, start_time: Optional[float], now: float) -> str:
        """One word for ``vmr-host status``."""
        if self.failed:
            return "failed"
        if self.schedule_state == "rejected":
            return "schedule_rejected"
        if self.complete:
            return "complete"
        if self.configured_at is not None:
            return "running" if start_time is not None and now >= start_time else "configured"
        if self.stage is not None:
            return "configuring"
        if self.schedule_state in ("sent", "accepted"):
            return f"schedule_{self.schedule_state}"
        if self.connections or self.last_seen is not None:
            return "connected" if self.connected else "seen"
        return "not_seen"

    def status(self, start_time: Optional[float], now: float) -> Dict[str, Any]:
        """Everything ``vmr-host status`` shows for this VM (JSON safe)."""
        st = self.decoder_stats()
        c = self.counters
        stage: Optional[str] = None
        if self.stage is not None:
            where = f" ({self.stage_time:g})" if self.stage_time is not None else ""
            stage = f"{self.stage}{where} {'running' if self.stage_running else 'done'}"
        return {
            "vm": self.name,
            "expected": self.expected,
            "connected": self.connected,
            "silent": self.silent if self.connected else None,
            "state": self.state(start_time, now),
            "schedule": {
                "state": self.schedule_state,
                "digest": self.spec.digest,
                "details": self.schedule_details,
            },
            "stage": stage,
            "stages_done": self.stages_done,
            "configured_at": self.configured_at,
            "failed": self.failed,
            "complete": self.complete,
            "last_seen": self.last_seen,
            "max_lateness": self.max_lateness,
            "failures": self.failures,
            "start_acked": self.start_acked,
            "agent": {
                "version": self.agent_version,
                "boot_id": self.boot_id,
                "claimed_vm": self.claimed_vm,
                "unacked": self.unacked,
            },
            "connections": self.connections,
            "handshakes": self.handshakes,
            "events": {
                "stored": self.log.stored,
                "duplicates": self.log.duplicates,
                "over_quota": self.log.dropped_events,
                "over_quota_bytes": self.log.dropped_bytes,
                "log_bytes": self.log.bytes,
            },
            "frames": {
                "ok": st.frames,
                "malformed": st.malformed,
                "oversize": st.oversize,
                "bytes": st.bytes,
                "last_error": st.last_error,
            },
            "refused": {
                "rate_limited": c.rate_limited,
                "too_many_events": c.too_many_events,
                "protocol_errors": c.protocol_errors,
                "vm_mismatch": c.vm_mismatch,
                "second_connections": c.refused_connections,
                "write_overflow": c.write_overflow,
                "unstorable": c.unstorable,
                "hello_flood": c.hello_flood,
            },
            "transfers": {
                "files": self.transfers.files,
                "bytes": self.transfers.total,
                "refused": c.transfer_refused,
                "bad_sha256": c.transfer_bad_sha256,
            },
            "resources": {"served": c.resources_served, "refused": c.resources_refused},
        }
