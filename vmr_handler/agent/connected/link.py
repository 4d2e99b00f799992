"""The agent's side of the channel to ``vmr-host`` (docs/protocol.md).

:class:`HostLink` keeps one conversation with the host alive across channel drops, host
restarts and agent restarts: handshake on every (re)connection, NTP-style clock sync,
at-least-once reports from the :class:`~vmr_handler.agent.state.outbox.Outbox`, heartbeats
where the transport does not tell liveness (a virtio-serial guest cannot see the host leave;
over MQTT the broker's keep-alive and last will do), and dispatch of control events (a table
from event type to handler method).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Optional, Protocol, Tuple

from vmr_handler import __version__
from vmr_handler.agent.connected._stamps import NotedEvents, PresyncGate, PresyncStamps
from vmr_handler.agent.machine.features import unsigned_build_error
from vmr_handler.agent.state.journal import JOURNAL_NAME
from vmr_handler.agent.state.outbox import Outbox
from vmr_handler.core.clock import SystemClock
from vmr_handler.core.errors import ChannelClosed, SignatureError, VmrError
from vmr_handler.core.events import Event, EventFactory, EventType
from vmr_handler.core.fsutil import kernel_boot_id
from vmr_handler.core.wire import protocol as P
from vmr_handler.core.wire.clockanswers import ClockAnswers
from vmr_handler.core.wire.runs import StartGate, signed_for
from vmr_handler.transports.base import ByteChannel, Opener

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

#: Events per message and bytes per message when sending reports.
BATCH_EVENTS = 200
BATCH_BYTES = 512 * 1024
#: Reports sent on this connection but not yet acked before the sender waits for acks.
WINDOW_EVENTS = 2000
#: What a control handler returns when it answers later (with :meth:`HostLink.send_event`).
LATER: Dict[str, Any] = {}
#: Round trip (s) under which a clock sample is trusted; above it the agent re-syncs within 5 s.
GOOD_CLOCK_DELAY = 0.002
#: Seconds without any ack while reports are in flight before they are sent again.
RESEND_AFTER = 10.0


class LinkConfig(Protocol):
    """The settings :class:`HostLink` reads (those of
    :class:`~vmr_handler.agent.connected.agent.AgentConfig`, which documents them)."""

    state_dir: str
    vm_name: str
    heartbeat: float
    peer_timeout: float
    clock_samples: int
    clock_interval: float
    public_key: Optional[str]
    signature_max_age: float


class HostLink:
    """The agent's side of the conversation with the host.

    Args:
        config: the settings (:class:`~vmr_handler.agent.connected.agent.AgentConfig`).
        opener: the transport, built by the CLI (a port or the broker); opened again after
            every loss.
        boot_id: this boot's id (:func:`machine_boot_id`), told to the host in every hello.
        outbox: reports to deliver.
        clock: the agent's reference clock; its ``offset`` is set from clock sync.
        on_event: called for each control event from the host (``schedule``, ``start_time``,
            ``resume``); returns the ``data`` of the answer (a ``result``), or None for an ack.
    """

    def __init__(
        self,
        config: LinkConfig,
        opener: Opener,
        boot_id: str,
        outbox: Outbox,
        clock: SystemClock,
        on_event: Callable[[Event], Awaitable[Optional[Dict[str, Any]]]],
    ) -> None:
        self.config = config
        self.opener = opener
        self.outbox = outbox
        self.clock = clock
        self._on_event = on_event
        #: events stamped before the first clock sync: corrected when they are sent
        self.stamps = PresyncStamps(clock)
        self.events: EventFactory = NotedEvents(clock.time, self.stamps)
        self.boot_id = boot_id
        self.welcomed = asyncio.Event()
        self.synced = asyncio.Event()  # the clock offset to the host has been estimated once
        self.on_clock: Optional[Callable[[], None]] = None
        self.on_welcome: Callable[[Dict[str, Any]], None] = lambda welcome: None  # each welcome's
        self._channel: Optional[ByteChannel] = None
        self._write_lock = asyncio.Lock()
        self._more = asyncio.Event()  # new reports or acks
        self._sent: Dict[str, float] = {}  # report id -> monotonic time sent on this connection
        self._samples: List[P.ClockSample] = []
        self._clock_waiters = ClockAnswers()  # clock_req ids in flight (signed answers with a key)
        self._requests: Dict[str, asyncio.Queue[Event]] = {}
        self._last_rx = self._last_tx = time.monotonic()
        self._hello_sent_at = 0.0
        self._connection = ""  # this connection's id, in every hello on it (the host answers once)
        self.welcome: Dict[str, Any] = {}
        #: where refusals are reported (the agent's event sink); set by the agent
        self.report: Optional[Callable[[Event], None]] = None
        self.verifier: Any = None
        self._held: List[Event] = []  # signed control events waiting for the first clock sync
        self.runs = StartGate(os.path.join(config.state_dir, "host-run.json"))  # whose start_time
        self._gate = PresyncGate(self.stamps, self.synced)  # nothing leaves before the first sync
        self._handlers: Dict[str, Callable[[Event], Awaitable[None]]] = {
            P.HELLO: self._on_hello,
            P.WELCOME: self.runs.on_welcome(self._on_welcome, self._on_control_event),
            P.ACK: self._on_ack,
            P.CLOCK_RESP: self._on_clock_resp,
            P.RESOURCE_CHUNK: self._on_answer,
            P.RESULT: self._on_answer,
            P.SCHEDULE: self._on_control_event,
            P.START_TIME: self.runs.guard(self._on_control_event),  # only the host's run's
            P.RESUME: self._on_control_event,
            P.SCHEDULE_APPEND: self._on_control_event,
            P.KILL: self._on_control_event,
            P.HEARTBEAT: self._on_heartbeat,
        }
        if config.public_key:
            try:
                from vmr_handler.core.wire.signing import Verifier, load_public_key
            except ImportError as exc:  # never run unsigned control messages when a key is set
                raise unsigned_build_error("public_key", exc) from exc
            self.verifier = Verifier(
                load_public_key(config.public_key),
                os.path.join(config.state_dir, "signed-ids.json"),
                max_age=config.signature_max_age,
            )
            self._clock_waiters = ClockAnswers(self.verifier, config.vm_name, self._refused)

    # ------------------------------------------------------------------ public
    def notify(self, event: Optional[Event] = None) -> None:
        """New reports are in the outbox (``event``: the one just added, stamped now)."""
        if event is not None:
            self.stamps.note(event)
        self._more.set()

    async def run(self) -> None:
        """Keep a channel open and a session running on it, forever (cancel to stop)."""
        while True:
            channel = await _connect(self.opener)
            self._channel = channel
            try:
                await self._session(channel)
            except ChannelClosed as exc:
                log.info("channel to host closed: %s", exc)
            except Exception:  # never let one bad session end the link for good
                log.exception("session with the host failed; reconnecting")
                await asyncio.sleep(1.0)
            finally:
                self._channel = None
                self.welcomed.clear()
                channel.close()
            await asyncio.sleep(0.1)

    @property
    def where(self) -> str:
        """The channel in words (port or broker URL)."""
        return self.opener.where

    async def request(self, type_: str, **data: Any) -> Tuple[str, asyncio.Queue[Event]]:
        """Send a request event; returns its id and the queue its answers (``answers`` = id) go to.

        Raises:
            ChannelClosed: no channel to send on.
        """
        event = self.events.make_raw(type_, **data)
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._requests[event.id] = queue
        try:
            await self._send([event])
        except ChannelClosed:
            self._requests.pop(event.id, None)
            raise
        return event.id, queue

    async def send_event(self, type_: str, **data: Any) -> None:
        """Send one answer now (e.g. a late ``result``), or at the first clock sync when it has
        not happened yet (:class:`PresyncStamps`). Raises ChannelClosed."""
        await self._gate.answer(self.events.make_raw(type_, **data), self._send)

    def forget_request(self, ident: str) -> None:
        """Stop routing answers to the request ``ident`` (from :meth:`request`)."""
        self._requests.pop(ident, None)

    # ------------------------------------------------------------------ session
    async def _session(self, channel: ByteChannel) -> None:
        self._sent.clear()
        self._held.clear()  # the host sends every control event again after the handshake
        self._gate.clear()  # (and so they are answered again)
        self._last_rx = time.monotonic()
        self._connection = uuid.uuid4().hex
        if not channel.framed:  # a byte stream: end any partial frame left in it
            await self._write(P.CONNECT_PREFIX)
        await self._send_hello()
        tasks = [
            asyncio.ensure_future(self._reader(channel)),
            asyncio.ensure_future(self._sender()),
            asyncio.ensure_future(self._keepalive(channel)),
            asyncio.ensure_future(self._clock_sync()),
        ]
        try:
            done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                exc = task.exception()
                if exc is not None:
                    raise exc
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send_hello(self) -> None:
        self._hello_sent_at = time.monotonic()
        journal = _journal_summary(self.config.state_dir)
        await self._send(
            [
                self.events.make_raw(
                    P.HELLO,
                    protocol=P.PROTOCOL_VERSION,
                    agent_version=__version__,
                    boot_id=self.boot_id,
                    vm=self.config.vm_name,
                    journal=journal,
                    unacked=len(self.outbox),
                    signed=self.verifier is not None,  # the host says so when it cannot sign
                    connection=self._connection,  # a second hello on it gets the welcome alone
                    # the transport tells liveness (MQTT keep-alive, last will): no heartbeats
                    heartbeats=not self._liveness_from_transport,
                )
            ],
            ttl=2 * self.config.heartbeat,  # a newer hello follows every heartbeat until welcomed
        )

    async def _write(self, data: bytes) -> None:
        channel = self._channel
        if channel is None:
            raise ChannelClosed("no channel")
        async with self._write_lock:
            await channel.write(data)
        self._last_tx = time.monotonic()

    async def _send(self, events: List[Event], ttl: Optional[float] = None) -> None:
        """Send one message; ``ttl``: worthless after that many seconds (hello, heartbeat,
        clock request), so a transport that queues for an absent host may drop it."""
        data = P.encode_message(events, self.clock.time())
        if ttl is None:
            await self._write(data)
            return
        channel = self._channel
        if channel is None:
            raise ChannelClosed("no channel")
        async with self._write_lock:
            await channel.write_ephemeral(data, ttl)
        self._last_tx = time.monotonic()

    async def _reader(self, channel: ByteChannel) -> None:
        decoder = P.FrameDecoder()
        while True:
            data = await channel.read()
            self._last_rx = time.monotonic()
            for message in decoder.feed(data):
                for event in message.events:
                    await self._dispatch(event)
            if decoder.stats.malformed or decoder.stats.oversize:
                log.warning("host sent bad frames: %s", decoder.stats.last_error)
                decoder.stats.malformed = decoder.stats.oversize = 0

    async def _dispatch(self, event: Event) -> None:
        """Hand one event from the host to its handler (:attr:`_handlers`); others are logged."""
        handler = self._handlers.get(event.type)
        if handler is None:
            self._ignore(event)
        else:
            await handler(event)

    @staticmethod
    def _ignore(event: Event) -> None:
        log.info("ignored %s event %s from the host", event.type, event.id)  # never answered: no ping-pong

    async def _on_hello(self, event: Event) -> None:
        """The host (re)connected: introduce ourselves, resend everything."""
        # Not yet welcomed and our hello of this connection is recent: the host answers it
        # (a second hello would make it send welcome and the schedule twice; measured with
        # 1000 agents over MQTT, where the host's hello came 2-3 s after our own). If that
        # hello was lost, _keepalive says hello again after `heartbeat` seconds.
        recent = time.monotonic() - self._hello_sent_at < self.config.heartbeat
        if self.welcomed.is_set() or not recent:
            self.welcomed.clear()
            self._sent.clear()
            await self._send_hello()

    async def _on_welcome(self, event: Event) -> None:
        self.welcome = dict(event.data)
        self.on_welcome(self.welcome)
        self.welcomed.set()
        self._more.set()
        log.info("host welcomed us as %s", event.data.get("vm"))

    async def _on_ack(self, event: Event) -> None:
        ids = event.data.get("ids")
        if isinstance(ids, list):
            self.outbox.ack(ids)
            for ident in ids:
                if isinstance(ident, str):
                    self._sent.pop(ident, None)
                    self.stamps.forget(ident)
            self._more.set()

    async def _on_clock_resp(self, event: Event) -> None:
        data = event.data
        t4 = self.clock.local_time()
        t1 = self._clock_waiters.take(event)  # with a key: signed, answering a pending request
        t2, t3 = data.get("t2"), data.get("t3")
        if t1 is not None and isinstance(t2, (int, float)) and isinstance(t3, (int, float)):
            self._samples = [*self._samples[-15:], P.ClockSample(t1, float(t2), float(t3), t4)]

    async def _on_answer(self, event: Event) -> None:
        """A ``resource_chunk`` or ``result``: to the queue of the request it answers."""
        queue = self._requests.get(str(event.data.get("answers")))
        if queue is None:
            self._ignore(event)
        else:
            await queue.put(event)

    async def _on_control_event(self, event: Event) -> None:
        """``schedule``, ``start_time``, ``resume``: held until the first clock sync when signed."""
        if self.verifier is not None and not self.synced.is_set():
            self._held.append(event)  # freshness is judged on the host's clock: sync first
            return
        await self._control(event)

    async def _on_heartbeat(self, event: Event) -> None:
        """Nothing to do: any frame from the host already counts as a sign of life."""

    async def _control(self, event: Event) -> None:
        """Verify (with a key configured), apply and answer one control event."""
        if self.verifier is not None and not self._verified(event):
            return
        answer = await self._on_event(event)
        if answer is LATER:
            pass
        elif answer is None:
            await self.send_event(P.ACK, ids=[event.id])
        else:
            await self.send_event(P.RESULT, **answer)

    def _verified(self, event: Event) -> bool:
        """Check ``event``'s signature; a refusal is reported (``control_refused``) and answered."""
        from vmr_handler.core.errors import SigningError

        try:
            # a host's start for all its VMs is signed for "*" (of its run, which the gate checked)
            self.verifier.check(event, signed_for(event, self.config.vm_name), self.clock.time())
            return True
        except SignatureError as exc:
            self._refused(event, exc)
            self._answer_later(P.result_data(event.id, False, f"refused: {exc}"))
        except SigningError as exc:  # the replay memory cannot be saved: not applied, host resends
            log.error("cannot check %s %s: %s", event.type, event.id, exc)
        return False

    def _refused(self, event: Event, exc: Exception) -> None:
        """Log and report (``control_refused``) a refused event from the host."""
        log.error("refused %s %s from the host: %s", event.type, event.id, exc)
        details = {"type": event.type, "id": event.id, "status": "error", "details": str(exc)}
        if self.report is not None:
            self.report(self.events.make(EventType.CONTROL_REFUSED, **details))

    def _answer_later(self, data: Dict[str, Any]) -> None:
        task = asyncio.ensure_future(self.send_event(P.RESULT, **data))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _sender(self) -> None:
        """Send every unacknowledged report (oldest first), in batches, with a window; nothing
        before the first clock sync (:class:`~vmr_handler.agent.connected._stamps.PresyncGate`)."""
        await self.welcomed.wait()
        await self._gate.open(self._send)
        while True:
            self._more.clear()
            batch: List[Tuple[float, bytes]] = []
            size = 0
            for ident in self.outbox.ids(limit=WINDOW_EVENTS + BATCH_EVENTS):
                if len(self._sent) >= WINDOW_EVENTS:
                    break
                if ident in self._sent:
                    continue
                item = self.outbox.read_raw(ident)  # stored JSON, sent as it is
                if item is None:
                    continue
                item = self.stamps.raw(ident, item)  # (re-stamped if from before the sync)
                batch.append(item)
                self._sent[ident] = time.monotonic()
                size += len(item[1])
                if len(batch) >= BATCH_EVENTS or size >= BATCH_BYTES:
                    await self._write(P.encode_raw_message(batch, self.clock.time()))
                    batch, size = [], 0
            if batch:
                await self._write(P.encode_raw_message(batch, self.clock.time()))
            if not self.welcomed.is_set():
                await self.welcomed.wait()
                continue
            await self._more.wait()

    @property
    def _liveness_from_transport(self) -> bool:
        """The channel tells liveness itself (MQTT: keep-alive and the last will on presence)."""
        return self._channel is not None and self._channel.transport_liveness

    async def _keepalive(self, channel: ByteChannel) -> None:
        """Heartbeat after ``heartbeat`` s of send silence and notice a host silent for
        ``peer_timeout`` s, unless ``channel`` tells liveness itself (MQTT: the broker sees
        this agent through its keep-alive, and a host that comes back says hello); resend
        reports never acknowledged; say hello again every ``heartbeat`` s until welcomed."""
        step = min(1.0, self.config.heartbeat / 2)
        last_hello = time.monotonic()
        beats = not channel.transport_liveness
        while True:
            await asyncio.sleep(step)
            now = time.monotonic()
            if beats and now - self._last_tx >= self.config.heartbeat:
                await self._send([self.events.make_raw(P.HEARTBEAT)], ttl=2 * self.config.heartbeat)
            if beats and now - self._last_rx >= self.config.peer_timeout:
                if channel.sees_disconnects:
                    raise ChannelClosed(f"host silent for {self.config.peer_timeout:.0f} s")
                if self.welcomed.is_set():
                    log.warning("host silent for %.0f s: waiting for it to come back", now - self._last_rx)
                    self.welcomed.clear()
            stale = [i for i, at in self._sent.items() if now - at > RESEND_AFTER]
            if stale and self.welcomed.is_set():
                # in flight and never acked (a frame the host dropped, e.g. rate limit): send again
                for ident in stale:
                    del self._sent[ident]
                self._more.set()
            if not self.welcomed.is_set() and now - last_hello >= self.config.heartbeat:
                last_hello = now
                self._sent.clear()
                await self._send_hello()  # a hello may have been lost while nobody listened

    async def _clock_sync(self) -> None:
        await self.welcomed.wait()
        while True:
            for _ in range(self.config.clock_samples):
                event = self.events.make_raw(P.CLOCK_REQ, t1=0.0)
                t1 = self.clock.local_time()
                event = Event(event.type, event.timestamp, event.id, {"t1": t1})
                self._clock_waiters.asked(event.id, t1)
                await self._send([event], ttl=2.0)
                await asyncio.sleep(0.02)
            for _ in range(50):  # answers of this burst (bounded wait)
                if not self._clock_waiters.waiting:
                    break
                await asyncio.sleep(0.01)
            best = P.best_offset(self._samples)
            if best is not None and abs(best.offset - self.clock.offset) > 0.0005:
                log.info("clock offset to host %.6f s (delay %.6f s)", best.offset, best.delay)
                self.clock.offset = best.offset
                self.events.clock_changed()
                if self.on_clock is not None:
                    self.on_clock()
            if best is not None:
                self.stamps.synced()
                self.synced.set()
                held, self._held = self._held, []
                for event in held:
                    await self._control(event)
            self._clock_waiters.expire()
            # a noisy estimate (busy machine, long round trips) is refined soon, a good one hourly-ish
            good = best is not None and best.delay < GOOD_CLOCK_DELAY
            await asyncio.sleep(self.config.clock_interval if good else min(5.0, self.config.clock_interval))


#: Seconds the channel may stay away before the agent warns (then every twice as long, up to 5 min).
CHANNEL_WARN_AFTER = 10.0
#: errno values of a channel that is simply not there yet (no file, no listener): retried quietly at first.
NOT_THERE_YET = frozenset(
    {errno.ENOENT, errno.ECONNREFUSED, errno.ENXIO, errno.EAGAIN, errno.ECONNRESET, errno.EPIPE, None}
)


async def _connect(opener: Opener) -> ByteChannel:
    """Open the channel, retrying with backoff (tenacity) until it opens.

    Not there yet (``OSError``: no port, no broker) is retried quickly (50 ms to 2 s);
    refused for good (``VmrError``: credentials, ACL, TLS) is logged once per distinct
    reason and retried slowly (up to 30 s): the operator may fix the broker meanwhile.
    """
    from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

    fast = wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.05)
    slow = wait_exponential_jitter(initial=1.0, max=30.0, jitter=1.0)
    refused: List[str] = []
    began = time.monotonic()
    warn_after = [CHANNEL_WARN_AFTER]

    def note(state: Any) -> None:
        exc = state.outcome.exception() if state.outcome else None
        waited = time.monotonic() - began
        if isinstance(exc, OSError) and exc.errno not in NOT_THERE_YET and str(exc) not in refused[-1:]:
            # the wrong kind of thing (not a character device, a directory...): say it at once
            log.warning("channel %s cannot be used: %s; retrying", opener.where, exc)
            refused.append(str(exc))
        elif isinstance(exc, (OSError, ChannelClosed)):
            if waited >= warn_after[0]:
                log.warning("channel %s not there after %.0f s (%s); still trying. Check --port / the "
                            "config's port and the VM's virtio-serial port (or the broker)",
                            opener.where, waited, exc)  # fmt: skip
                warn_after[0] = min(warn_after[0] * 2, 300.0)
            else:
                log.debug("channel %s not ready: %s", opener.where, exc)
        elif exc is not None and str(exc) not in refused[-1:]:
            log.error("%s", exc)
            refused.append(str(exc))

    def wait(state: Any) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return float((fast if isinstance(exc, (OSError, ChannelClosed)) else slow)(state))

    channel: Optional[ByteChannel] = None
    async for attempt in AsyncRetrying(
        wait=wait,
        retry=retry_if_exception_type((OSError, VmrError, ChannelClosed)),
        before_sleep=note,
    ):
        with attempt:
            channel = await opener.open()
    assert channel is not None
    return channel


def _journal_summary(state_dir: str) -> Dict[str, Any]:
    """What the hello tells about ``<state>/journal.json`` ({} when there is none)."""
    journal: Dict[str, Any] = {}
    with (
        contextlib.suppress(OSError, ValueError),
        open(os.path.join(state_dir, JOURNAL_NAME), "rb") as fh,
    ):
        doc = json.loads(fh.read())
        journal = {
            "digest": doc.get("schedule_digest"),
            "configured_at": doc.get("configured_at"),
            "start_time": doc.get("start_time"),
            "stages_done": doc.get("stages_done"),
            "resumes": len(doc.get("resumes") or []),
        }
    return journal


def machine_boot_id() -> str:
    """This boot's id (the kernel's ``boot_id``, :func:`kernel_boot_id`; a random one where there is none)."""
    return kernel_boot_id() or uuid.uuid4().hex
