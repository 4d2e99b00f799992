"""One VM's side of the protocol on the host (``docs/protocol.md``): the connection state
machine, independent of how bytes move.

A :class:`VmSession` lives for the whole host run; connections come and go
(:meth:`VmSession.attach` / :meth:`VmSession.detach`). It is fed the bytes read from the
VM's channel (:meth:`VmSession.feed`) and answers through a :class:`Link` (one frame per
:meth:`Link.send_bytes`); :mod:`vmr_handler.host.serve.channels.links` does both over any
:class:`~vmr_handler.transports.base.ByteChannel`. What the session needs from the experiment
as a whole (start time, RESUMEs, the barrier) it asks of a :class:`HostApi`.

Per connection: the host sends ``\\n`` + ``hello``; the agent's ``hello`` is answered with
``welcome`` and whatever the agent is missing (``schedule`` when its digest differs,
``start_time`` when set, pending ``resume``\\ s); ``clock_req`` gets ``clock_resp``
(t2 = host receive time, t3 = host send time, UTC); ``resource_request`` gets
``resource_chunk``\\ s (:mod:`vmr_handler.host.serve.session._delivery`); reports are written to the VM's
log, then acknowledged. What the reports tell is kept in a
:class:`~vmr_handler.host.model.vmstate.VmState`; transfers go to
:mod:`vmr_handler.host.serve.session.intake`.

Hostile guests: frames over the size limit and malformed frames are dropped and counted by
the :class:`~vmr_handler.core.wire.protocol.FrameDecoder`; messages over the per-VM rate or with too
many events are dropped and counted; host-only event types coming from a guest are counted
as protocol errors; a malformed payload (:mod:`vmr_handler.core.payloads`) is counted in
``refused.malformed_payloads`` and dropped. The VM's identity is its channel: the ``vm``
name a guest claims is only compared and logged. Nothing here raises into the server on bad input.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, TypeVar

from vmr_handler import __version__
from vmr_handler.core.clock import Clock, SystemClock
from vmr_handler.core.errors import PayloadError
from vmr_handler.core.events import Event
from vmr_handler.core.payloads import Ack, ClockReq, Hello, HostEntryRequest
from vmr_handler.core.ratelimit import TokenBucket, worth_logging
from vmr_handler.core.wire.protocol import (
    ACK,
    CLOCK_REQ,
    CLOCK_RESP,
    CONNECT_PREFIX,
    HEARTBEAT,
    HELLO,
    HOST_ENTRY,
    KILL,
    PROTOCOL_VERSION,
    RESOURCE_CHUNK,
    RESOURCE_REQUEST,
    RESULT,
    RESUME,
    SCHEDULE,
    START_TIME,
    WELCOME,
    DecoderStats,
    FrameDecoder,
    Message,
    encode_message,
    result_data,
)
from vmr_handler.core.wire.signing import SIGNED_TYPES
from vmr_handler.host.logs.store import DurableAcks, VmLog
from vmr_handler.host.logs.writespell import WriteSpell
from vmr_handler.host.model.stateword import Presence
from vmr_handler.host.model.vmstate import Counters, VmState, add_stats
from vmr_handler.host.serve.config import Limits, VmSpec
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.session._delivery import ResourceStreams, ScheduleOffer
from vmr_handler.host.serve.session._status import session_presence, session_status
from vmr_handler.host.serve.session.api import HostApi, HostEvents, Link
from vmr_handler.host.serve.session.checkpoint import ToldHost, snapshot_session
from vmr_handler.host.serve.session.clocklead import StampLead
from vmr_handler.host.serve.session.intake import TRANSFER_TYPES, TransferIntake

log = logging.getLogger("vmr_handler.host")
_T = TypeVar("_T")

#: How far ahead a clock_resp's t3 is stamped: what signing and sending take after the stamp,
#: measured over this host's recent answers (every VM's, docs/protocol.md).
CLOCK_LEAD = StampLead()
#: Said (``warn``) when an agent with a public key says hello to a host without a signing key.
UNSIGNED_HOST = (
    "the agent takes only signed control messages (it has a public_key) but this host has no "
    "--signing-key: the VM cannot sync its clock, take its schedule or start; restart vmr-host "
    "with the --signing-key its public_key belongs to"
)
#: Event types only the host sends; a guest sending one breaks the protocol.
HOST_ONLY = frozenset({WELCOME, SCHEDULE, CLOCK_RESP, RESOURCE_CHUNK, START_TIME, RESUME, KILL})
#: Handshakes answered per VM: 2 per second, burst 10 (an agent says hello twice per
#: connection; a guest flooding hellos would make the host resend its schedule each time).
HELLO_RATE = 2.0
HELLO_BURST = 10.0

#: Agent control events that are answered, not stored.
UNSTORED = frozenset({HELLO, HEARTBEAT, ACK, CLOCK_REQ, RESOURCE_REQUEST, HOST_ENTRY})


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
            (:meth:`vmr_handler.host.serve.http.server.ResourceHttp.schedule_data`), announced with the
            schedule as its ``http`` member; None without ``--http``.
        clock: the host's clock (:class:`~vmr_handler.core.clock.SystemClock` by default; a
            test's :class:`~vmr_handler.core.clock.FakeClock`): every timing rule of the
            session reads it (silence, heartbeats, rates, t2/t3 of clock answers).
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
        clock: Optional[Clock] = None,
    ) -> None:
        self.spec = spec
        #: the host's clock: receive and send times, liveness, heartbeats, rates (``SystemClock``)
        self.clock: Clock = clock or SystemClock()
        self.name = spec.name
        self.expected = expected
        self.limits = limits
        self.log = vmlog
        self.transfers = transfers
        self.resources = resources
        self.host = host
        self.events = events
        self.offer = ScheduleOffer(spec, resource_info, http, self.clock)
        self.schedule_id = self.offer.id
        # connection
        self.link: Optional[Link] = None
        self.decoder: Optional[FrameDecoder] = None
        self.stats_base = DecoderStats()
        self.connections = self.handshakes = 0
        self.connected_since: Optional[float] = None
        self.handshaken = False
        self._last_send = self.last_recv = 0.0  # monotonic
        self.silent = False
        #: the transport tells the agent's liveness (attach): heartbeats and silence do not
        self.transport_liveness = False
        self._heartbeats = True  # until the hello of an agent whose transport tells liveness
        self._answered: Optional[str] = None  # the agent connection whose hello was answered
        mono = self.clock.monotonic()  # the buckets count on the clock they are charged on
        self.gone_since = mono  # monotonic: the last connection's end, or this host's start
        self.bucket = TokenBucket(limits.rate, limits.burst, mono)
        self.hello_bucket = TokenBucket(HELLO_RATE, HELLO_BURST, mono)
        self.read_bucket = TokenBucket(limits.read_rate, limits.read_burst, mono)
        self.streams = ResourceStreams(self)
        # what the agent told and the VM did; what was refused
        self.told = ToldHost(host)
        self.state = VmState(self.name, spec.digest, self.schedule_id, self.told)
        self.counters = Counters()
        self._warned: Dict[str, int] = {}
        self.intake = TransferIntake(
            transfers, self.counters, self.warn, self._store, clock=self.clock, destinations=spec.destinations
        )
        self.acks = DurableAcks(vmlog, lambda ids: self._send([self.events.make(ACK, {"ids": ids})]))
        self._write_spell = WriteSpell(self.name)
        #: unstored control event type -> its handler (event, host UTC received)
        self._handlers: Dict[str, Callable[[Event, float], None]] = {
            HELLO: self._on_hello_limited,
            HEARTBEAT: lambda ev, now: None,  # seen (last_seen) is all it says
            ACK: self._on_ack,
            CLOCK_REQ: self._on_clock_req,
            RESOURCE_REQUEST: self.streams.request,
            HOST_ENTRY: self._on_host_entry,
            **{t: self._on_host_only for t in HOST_ONLY},
        }

    # ------------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        """True while a connection to this VM's channel is up."""
        return self.link is not None and not self.link.closed

    def attach(self, link: Link, now: float, transport_liveness: bool = False, framed: bool = False) -> bool:
        """A new connection on this VM's channel at UTC ``now``; ``transport_liveness``: the
        transport tells whether the agent is there (MQTT: keep-alive and last will, see
        :attr:`~vmr_handler.transports.base.ByteChannel.transport_liveness`), so the peer is
        never marked *silent* for lack of frames, and no heartbeat is sent once its hello says
        it needs none. ``framed``: every write arrives whole
        (:attr:`~vmr_handler.transports.base.ByteChannel.framed`), so no connect prefix is sent.

        Returns:
            False (and nothing changes) when a connection is already up: the caller closes
            the new one; it is counted in ``refused_connections``.
        """
        if self.connected:
            self.counters.refused_connections += 1
            self.warn("refused", "a second connection to this VM's channel was refused", now)
            return False
        self.link = link
        self.decoder = FrameDecoder(max_frame=self.limits.max_frame)
        self.connections += 1
        self.connected_since = now
        self.handshaken = False
        self.silent = False
        self.transport_liveness = transport_liveness
        # over a transport that tells liveness, none until a hello asks for them (an older
        # agent's, without ``heartbeats: false``): a restarted host sends none while the hellos
        # of 10 000 VMs come back; elsewhere until the agent's hello says it needs none
        self._heartbeats = not transport_liveness
        self._answered = None
        mono = self.clock.monotonic()
        self.last_recv = mono
        self.log.note(f"channel connected (connection {self.connections})", now)
        if not framed:  # a byte stream: end any partial frame left in it
            self._send_raw(CONNECT_PREFIX)
        self._send([self.events.make(HELLO, {"protocol": PROTOCOL_VERSION, "host_version": __version__})])
        return True

    def detach(self, link: Link, now: float, reason: str = "closed") -> None:
        """The connection ``link`` ended at UTC ``now`` (no-op for a link not attached)."""
        if link is not self.link:
            return
        if self.decoder is not None:
            self.stats_base = add_stats(self.stats_base, self.decoder.stats)
        self.decoder = None
        self.link = None
        self.handshaken = False
        self.streams.cancel()
        self.gone_since = self.clock.monotonic()
        self.log.note(f"channel disconnected ({reason})", now)

    def decoder_stats(self) -> DecoderStats:
        """Frames, malformed and oversize counts over every connection so far."""
        return add_stats(self.stats_base, self.decoder.stats if self.decoder is not None else DecoderStats())

    def _send_raw(self, data: bytes) -> None:
        if self.link is not None and not self.link.closed:
            self.link.send_bytes(data)
            self._last_send = self.clock.monotonic()

    def _send(self, events: Sequence[Event]) -> None:
        if events:
            # schedule, start time and RESUME are signed (at every send) when the host has a key
            events = [self.host.sign_for(self.name, e) if e.type in SIGNED_TYPES else e for e in events]
            self._send_raw(encode_message(events, self.clock.time()))

    def note_sent(self) -> None:
        """Something was just sent on the link (a heartbeat is due only after send silence)."""
        self._last_send = self.clock.monotonic()

    def refuse(self, request_id: str, details: str) -> None:
        """Answer the agent's request ``request_id`` with a failed ``result`` saying ``details``."""
        self.answer(request_id, result_data(request_id, False, details))

    def answer(self, request_id: str, data: Mapping[str, Any]) -> None:
        """Send the agent the ``result`` ``data`` (answering ``request_id``; dropped when not connected)."""
        self._send([self.events.make(RESULT, data)])

    def warn(self, kind: str, text: str, now: float) -> None:
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
        mono = self.clock.monotonic()
        self.last_recv = mono
        before = self.decoder.stats.malformed + self.decoder.stats.oversize
        messages = self.decoder.feed(data)
        bad = self.decoder.stats.malformed + self.decoder.stats.oversize - before
        if bad:
            self.warn(
                "malformed", f"malformed/oversize frame dropped: {self.decoder.stats.last_error}", recv_time
            )
        if messages or bad:
            self.state.last_seen = recv_time
            if self.silent:
                self.silent = False
                self.log.note("peer talks again", recv_time)
        for msg in messages:
            if not self.bucket.take(mono):
                self.counters.rate_limited += 1
                self.warn("rate", f"message dropped: over {self.limits.rate:g} messages/s", recv_time)
                continue
            if len(msg.events) > self.limits.max_events:
                self.counters.too_many_events += 1
                n = len(msg.events)
                self.warn(
                    "events", f"message of {n} events dropped (limit {self.limits.max_events})", recv_time
                )
                continue
            self._on_message(msg, recv_time)

    def over_byte_rate(self, nbytes: int) -> bool:
        """Charge ``nbytes`` received to this VM's byte rate; True (dropped, counted, logged)
        when it is over it. For transports that cannot pause reading one VM (MQTT: one broker
        connection carries every VM): the excess is dropped before it is decoded, and the
        agent sends its unacknowledged reports again later."""
        if self.read_bucket.spend(self.clock.monotonic(), nbytes) <= 0:
            return False
        self.read_bucket.spend(self.clock.monotonic(), -nbytes)  # dropped: not charged
        self.counters.rate_limited += 1
        over = f"message dropped: over {self.limits.read_rate / 2**20:g} MiB/s"
        self.warn("bytes", over, self.clock.time())
        return True

    def read_pause(self, nbytes: int) -> float:
        """Seconds the server should wait before reading more from this VM, after ``nbytes``
        were read: reading pauses while the VM is over its byte rate or its message rate (so a
        flooding guest costs the host bounded CPU; its excess waits in the socket)."""
        mono = self.clock.monotonic()
        return max(self.read_bucket.spend(mono, nbytes), self.bucket.wait(mono))

    def _on_message(self, msg: Message, recv_time: float) -> None:
        to_store: List[Event] = []
        seen_here: Set[str] = set()
        for ev in msg.events:
            handler = self._handlers.get(ev.type)
            if handler is not None:
                handler(ev, recv_time)
            elif ev.type not in TRANSFER_TYPES:
                to_store.append(ev)
            elif self.log.seen(ev.id) or ev.id in seen_here:
                to_store.append(ev)  # a duplicate: acknowledged again, not applied again
            else:
                seen_here.add(ev.id)
                taken = self.intake.take(ev, recv_time)  # None: logged later (hashed off the loop)
                if taken is not None:
                    to_store.append(taken)
        if to_store:
            self._store(to_store, recv_time)

    def record(self, events: List[Event], now: float) -> None:
        """Write host-made reports (an on_host entry's, :mod:`vmr_handler.host.serve.experiment.hostentries`)
        as if
        the agent had sent them at host UTC ``now``: applied, watched, never acknowledged."""
        self._store(events, now, ack=False)

    def _store(self, to_store: List[Event], recv_time: float, ack: bool = True) -> None:
        """Write reports to the log, apply the new ones, acknowledge every one stored (``ack``)."""
        placeholders = self.log.placeholders
        try:
            new = self.log.write([(e, recv_time) for e in to_store])
        except OSError as exc:
            self._write_spell.failed(exc)
            return
        self._write_spell.ok()
        self.counters.unstorable += self.log.placeholders - placeholders
        for ev in new:
            self.apply(ev, recv_time)
        self.host.on_stored(self.name, new, recv_time)
        if self.log.due():
            save_checkpoint(self)
        ids = [e.id for e in to_store if self.log.seen(e.id)]
        if ids and ack:
            self.acks.add(ids)  # sent once they are fsynced

    def apply(self, ev: Event, received: float) -> None:
        """Update this VM's state from a stored report received at host UTC ``received``
        (:meth:`VmState.apply`; also used to replay the ``.jsonl`` at host start). A malformed
        report stays stored but is not applied (:meth:`_payload`)."""
        self._payload(lambda: self.state.apply(ev, received), received)

    def _payload(self, parse: Callable[[], _T], now: float) -> Optional[_T]:
        """``parse()``, or None when it raises ``PayloadError``: the one place a malformed payload
        is counted (``refused.malformed_payloads``) and logged (rate-limited); it is dropped."""
        try:
            return parse()
        except PayloadError as exc:
            self.counters.malformed_payloads += 1
            self.warn("payload", f"{exc}: dropped", now)
            return None

    # ------------------------------------------------------------------ handlers
    def _on_host_only(self, ev: Event, now: float) -> None:
        self.counters.protocol_errors += 1
        self.warn("host-only", f"guest sent a host-only {ev.type!r} event: ignored", now)

    def _on_host_entry(self, ev: Event, now: float) -> None:
        """``host_entry``: run an on_host entry (:meth:`HostApi.host_entry`)."""
        req = self._payload(lambda: HostEntryRequest.parse(ev.data), now)
        problem = req and self.host.host_entry(self.name, ev.id, req.index, req.scheduled)
        if problem:
            self.counters.protocol_errors += 1
            self.warn("host_entry", problem, now)

    def _on_ack(self, ev: Event, now: float) -> None:
        ack = self._payload(lambda: Ack.parse(ev.data), now)
        start = self.host.start_event()
        if ack is not None and start is not None and start.id in ack.ids:
            self.state.start_acked = True

    def _on_hello_limited(self, ev: Event, now: float) -> None:
        if self.hello_bucket.take(self.clock.monotonic()):
            self._on_hello(ev, now)
        else:
            self.counters.hello_flood += 1
            self.warn("hello", "hello ignored: more than 2 handshakes per second", now)

    def _on_hello(self, ev: Event, now: float) -> None:
        hello = self._payload(lambda: Hello.parse(ev.data), now)
        if hello is None:
            return
        if not hello.supported:
            self.counters.protocol_errors += 1
            self.warn("protocol", f"hello with unsupported protocol {hello.protocol}", now)
            details = f"unsupported protocol {hello.protocol}; this host speaks {PROTOCOL_VERSION}"
            self.refuse(ev.id, details)
            return
        self.state.hello(hello)
        if hello.vm_given and hello.vm != self.name:
            self.counters.vm_mismatch += 1
            self.warn(
                "vm",
                f"agent says it is {self.state.claimed_vm!r}; this channel is {self.name!r} (channel wins)",
                now,
            )
        if hello.expects_signed and not self.host.signs:  # said: the VM cannot even sync its clock
            self.warn("unsigned", UNSIGNED_HOST, now)
        digest = hello.journal_digest
        if hello.journal_configured_at is not None and digest == self.spec.digest:
            # the agent configured earlier but its `configured` report never reached this host
            self.state.configured(now)
        self._heartbeats = hello.heartbeats or not self.transport_liveness
        self._answer_hello(hello, now)

    def _answer_hello(self, hello: Hello, now: float) -> None:
        """``welcome``, then only what the agent does not have yet: the schedule when its
        journal's digest differs, the start when its journal holds another (or none), the
        RESUMEs it has not answered. A second hello of the same agent connection (``connection``;
        hellos crossed: the host's came late, so the agent said hello again) gets the welcome
        alone: the rest was sent on this connection already and the transport loses nothing."""
        digest = hello.journal_digest
        start = self.host.start_event()
        pending = self.host.pending_resumes(self.name)
        welcome = {
            "protocol": PROTOCOL_VERSION,
            "host_version": __version__,
            "vm": self.name,
            "schedule_digest": self.spec.digest,
            "start_time": start.data["start_time"] if start is not None else None,
            "resumes": [r.id for r in pending],
            "run": self.host.run_id,  # the agent takes only start times of this run
            "kpi_interval": self.host.kpi_interval,  # the agent samples its VM
            "default_timeout": self.host.default_timeout,  # unless the agent has its own
        }
        self._send([self.events.make(WELCOME, welcome)])
        repeat = hello.connection is not None and hello.connection == self._answered
        self._answered = hello.connection
        self.handshaken = True
        self.handshakes += 1
        if repeat:
            self.log.note("handshake again on the same agent connection: welcome only", now)
            return
        if digest != self.spec.digest:
            self._send_schedule()
        elif self.state.schedule_state != "accepted":
            self.state.schedule_state = "accepted"
        held = start is not None and hello.journal_start_time == start.data["start_time"]
        if held:
            self.state.start_acked = True  # its journal holds this very start
        self._send(([start] if start is not None and not held else []) + pending)
        said = "held by the agent" if held else "sent" if start else "not set"
        self.log.note(
            f"handshake: agent {self.state.agent_version} boot {self.state.boot_id} journal digest "
            f"{'matches' if digest == self.spec.digest else 'differs: schedule sent'}; "
            f"start time {said}; {len(pending)} pending RESUME(s)",
            now,
        )

    def _send_schedule(self) -> None:
        if self.host.signs:
            self._send([self.offer.event])
        else:
            self._send_raw(self.offer.frame())
        if self.state.schedule_state != "rejected":
            self.state.schedule_state = "sent"

    def _on_clock_req(self, ev: Event, recv_time: float) -> None:
        req = self._payload(lambda: ClockReq.parse(ev.data), recv_time)
        if req is None:
            return
        if req.t1 is None:
            self.counters.protocol_errors += 1
            self.warn("clock", "clock_req without a finite t1", recv_time)
            return
        now = self.clock.time()  # t3: stamped ahead by what signing and sending take after it
        data = {"answers": ev.id, "t1": req.t1, "t2": recv_time, "t3": now + CLOCK_LEAD.value}
        resp = self.host.sign_for(self.name, Event(CLOCK_RESP, now, self.events.next_id(), data))
        self._send_raw(encode_message([resp], self.clock.time()))
        CLOCK_LEAD.note(self.clock.time() - now)

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
        """Periodic duty at UTC ``now``: a heartbeat after send silence; mark a silent peer.
        Over a transport that tells liveness (:meth:`attach`) the peer is never *silent*, and
        gets heartbeats only once its hello asked for them, by not saying ``heartbeats: false``
        (an older agent; docs/host.md, States)."""
        if not self.connected:
            return
        mono = self.clock.monotonic()
        beats = self._heartbeats or not self.transport_liveness
        if beats and mono - self._last_send >= self.limits.heartbeat:
            self._send([self.events.make(HEARTBEAT, {})])
        if self.transport_liveness:
            return  # connected = its presence says online: silence is no sign of absence
        if not self.silent and mono - self.last_recv >= self.limits.silent_after:
            self.silent = True
            self.log.note(f"peer silent for {self.limits.silent_after:g} s", now)

    # ------------------------------------------------------------------ status
    def presence(self) -> Presence:
        """Where the agent is now, on the host's clock (:func:`session_presence`)."""
        return session_presence(self)

    def status(self, start_time: Optional[float], now: float) -> Dict[str, Any]:
        """Everything ``vmr-host status`` shows for this VM (JSON safe; :func:`session_status`)."""
        return session_status(self, start_time, now)


def save_checkpoint(session: VmSession) -> None:
    """Save ``session``'s restart checkpoint now (:meth:`VmLog.save_checkpoint`; best effort)."""
    session.log.save_checkpoint(snapshot_session(session.state, session.counters, session.told))
