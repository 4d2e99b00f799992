"""Connected mode: the agent talking to ``vmr-host`` over a byte channel (issue 4, docs/protocol.md).

:class:`HostLink` keeps one conversation with the host alive across channel drops, host
restarts and agent restarts: handshake on every (re)connection, NTP-style clock sync,
at-least-once reports from the :class:`~vmr_handler.agent.outbox.Outbox`, heartbeats (a
virtio-serial guest cannot see the host leave), and dispatch of control events.
:func:`run_connected` wires it to the :class:`~vmr_handler.agent.engine.Engine`: it waits for the
schedule (or reuses the one stored by a previous start), fetches VM-resource files, runs the
engine with the host's start time, RESUMEs and clock, and sends transfers out.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Mapping, Optional, Tuple

from vmr_handler import __version__
from vmr_handler.agent.executor import resource_path
from vmr_handler.agent.journal import JOURNAL_NAME
from vmr_handler.agent.outbox import Outbox
from vmr_handler.core import protocol as P
from vmr_handler.core.clock import SystemClock
from vmr_handler.core.errors import ChannelClosed, EntryError, ScheduleError, VmrError
from vmr_handler.core.events import Event, EventFactory, EventType, describe
from vmr_handler.core.fsutil import atomic_write, sha256_file
from vmr_handler.core.schedule import FileDrop, Schedule, load_schedule_bytes
from vmr_handler.core.schedule.validate import parse_number
from vmr_handler.transports.channel import DEFAULT_PORT, ByteChannel, open_channel

if TYPE_CHECKING:
    from vmr_handler.transports.mqtt import MqttOptions

log = logging.getLogger(__name__)

SCHEDULE_FILE = "schedule.bin"
RESOURCES_DIR = "resources"
#: Events per message and bytes per message when sending reports.
BATCH_EVENTS = 200
BATCH_BYTES = 512 * 1024
#: Reports sent on this connection but not yet acked before the sender waits for acks.
WINDOW_EVENTS = 2000
TRANSFER_CHUNK = 256 * 1024
#: Files transferred out at least this large (bytes) are uploaded over HTTP(S) when the host
#: offers it (``vmr-host serve --http``); smaller ones travel as ``transfer_chunk`` events.
HTTP_TRANSFER_MIN = 64 * 1024
#: The transfers out under way (``{key: {"data", "seen"}}``), restarted with the agent.
TRANSFERS_FILE = "transfers.json"
#: What a control handler returns when it answers later (with :meth:`HostLink.send_event`).
LATER: Dict[str, Any] = {}
#: Round trip (s) under which a clock sample is trusted; above it the agent re-syncs within 5 s.
GOOD_CLOCK_DELAY = 0.002
#: Seconds without any ack while reports are in flight before they are sent again.
RESEND_AFTER = 10.0


@dataclass
class AgentConfig:
    """Connected-mode settings (config file keys and flags of the same names).

    Attributes:
        port: ``unix:PATH`` or a character device path.
        heartbeat: seconds of silence after which a heartbeat is sent.
        peer_timeout: seconds of silence after which the host is considered gone.
        clock_skew: debug only: seconds added to this agent's own clock reading.
        mqtt: broker, experiment and credentials when the host is reached over MQTT
            (``port`` is not used then); None for virtio-serial / unix socket.
        public_key: the host's Ed25519 public key (PEM text or a file path). When set, a
            schedule, start time or RESUME is applied only with a valid, fresh signature
            (SPEC §7); the ``start_time`` of ``welcome`` (unsigned) is not used.
        signature_max_age: seconds a signature stays fresh (host clock).
        http_ca_file: CA certificate file that signs ``vmr-host``'s HTTPS certificate (resources
            over HTTPS); None: the broker's CA (``mqtt.ca_file``/``ca_pem``), else the system CAs.
    """

    port: str = DEFAULT_PORT
    state_dir: str = "/var/lib/vmr-handler"
    launch_dir: str = "/var/launch"
    reboot_command: Optional[str] = None
    vm_name: str = field(default_factory=socket.gethostname)
    allow_classes: List[str] = field(default_factory=list)
    heartbeat: float = 5.0
    peer_timeout: float = 15.0
    clock_skew: float = 0.0
    clock_samples: int = 8
    clock_interval: float = 60.0
    quiet: bool = False
    mqtt: Optional[MqttOptions] = None
    public_key: Optional[str] = None
    signature_max_age: float = 300.0
    http_ca_file: Optional[str] = None


class HostLink:
    """The agent's side of the conversation with the host.

    Args:
        config: :class:`AgentConfig`.
        outbox: reports to deliver.
        clock: the agent's reference clock; its ``offset`` is set from clock sync.
        on_event: called for each control event from the host (``schedule``, ``start_time``,
            ``resume``); returns the ``data`` of the answer (a ``result``), or None for an ack.
    """

    def __init__(
        self,
        config: AgentConfig,
        outbox: Outbox,
        clock: SystemClock,
        on_event: Callable[[Event], Awaitable[Optional[Dict[str, Any]]]],
    ) -> None:
        self.config = config
        self.outbox = outbox
        self.clock = clock
        self._on_event = on_event
        self.events = EventFactory(clock.time)
        self.boot_id = _boot_id()
        self.welcomed = asyncio.Event()
        self.synced = asyncio.Event()  # the clock offset to the host has been estimated once
        self.on_clock: Optional[Callable[[], None]] = None
        self._channel: Optional[ByteChannel] = None
        self._write_lock = asyncio.Lock()
        self._more = asyncio.Event()  # new reports or acks
        self._sent: Dict[str, float] = {}  # report id -> monotonic time sent on this connection
        self._samples: List[P.ClockSample] = []
        self._clock_waiters: Dict[str, float] = {}
        self._requests: Dict[str, asyncio.Queue[Event]] = {}
        self._last_rx = time.monotonic()
        self._last_tx = time.monotonic()
        self._hello_sent_at = 0.0
        self.welcome: Dict[str, Any] = {}
        #: where refusals are reported (the agent's event sink); set by the agent
        self.report: Optional[Callable[[Event], None]] = None
        self.verifier: Any = None
        self._held: List[Event] = []  # signed control events waiting for the first clock sync
        if config.public_key:
            from vmr_handler.core.signing import Verifier, load_public_key

            self.verifier = Verifier(
                load_public_key(config.public_key),
                os.path.join(config.state_dir, "signed-ids.json"),
                max_age=config.signature_max_age,
            )

    # ------------------------------------------------------------------ public
    def notify(self) -> None:
        """New reports are in the outbox."""
        self._more.set()

    async def run(self) -> None:
        """Keep a channel open and a session running on it, forever (cancel to stop)."""
        while True:
            channel = await self._connect()
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

    async def _connect(self) -> ByteChannel:
        """Open the channel, retrying with backoff (tenacity) until it opens.

        Not there yet (``OSError``: no port, no broker) is retried quickly (50 ms to 2 s);
        refused for good (``VmrError``: credentials, ACL, TLS) is logged once per distinct
        reason and retried slowly (up to 30 s): the operator may fix the broker meanwhile.
        """
        from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

        fast = wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.05)
        slow = wait_exponential_jitter(initial=1.0, max=30.0, jitter=1.0)
        refused: List[str] = []

        def note(state: Any) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, (OSError, ChannelClosed)):
                log.debug("channel %s not ready: %s", self.where, exc)
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
                channel = await self._open()
        assert channel is not None
        return channel

    @property
    def where(self) -> str:
        """The channel in words (port or broker URL)."""
        return self.config.mqtt.broker if self.config.mqtt is not None else self.config.port

    async def _open(self) -> ByteChannel:
        """Open the configured channel. Raises OSError (retry soon) or VmrError (refused)."""
        if self.config.mqtt is not None:
            from vmr_handler.transports.mqtt import MqttChannel

            return await MqttChannel.connect(self.config.mqtt, self.config.vm_name, self.boot_id)
        return await open_channel(self.config.port)

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
        """Send one control event now (e.g. a late ``result``). Raises ChannelClosed."""
        await self._send([self.events.make_raw(type_, **data)])

    def forget_request(self, ident: str) -> None:
        self._requests.pop(ident, None)

    # ------------------------------------------------------------------ session
    async def _session(self, channel: ByteChannel) -> None:
        self._sent.clear()
        self._held.clear()  # the host sends every control event again after the handshake
        self._last_rx = time.monotonic()
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
        journal: Dict[str, Any] = {}
        with (
            contextlib.suppress(OSError, ValueError),
            open(os.path.join(self.config.state_dir, JOURNAL_NAME), "rb") as fh,
        ):
            doc = json.loads(fh.read())
            journal = {
                "digest": doc.get("schedule_digest"),
                "configured_at": doc.get("configured_at"),
                "start_time": doc.get("start_time"),
                "stages_done": doc.get("stages_done"),
                "resumes": len(doc.get("resumes") or []),
            }
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
        kind, data = event.type, event.data
        if kind == P.HELLO:  # the host (re)connected: introduce ourselves, resend everything
            # Not yet welcomed and our hello of this connection is recent: the host answers it
            # (a second hello would make it send welcome and the schedule twice; measured with
            # 1000 agents over MQTT, where the host's hello came 2-3 s after our own). If that
            # hello was lost, _keepalive says hello again after `heartbeat` seconds.
            recent = time.monotonic() - self._hello_sent_at < self.config.heartbeat
            if self.welcomed.is_set() or not recent:
                self.welcomed.clear()
                self._sent.clear()
                await self._send_hello()
        elif kind == P.WELCOME:
            self.welcome = dict(data)
            self.welcomed.set()
            self._more.set()
            log.info("host welcomed us as %s", data.get("vm"))
        elif kind == P.ACK:
            ids = data.get("ids")
            if isinstance(ids, list):
                self.outbox.ack(ids)
                for ident in ids:
                    if isinstance(ident, str):
                        self._sent.pop(ident, None)
                self._more.set()
        elif kind == P.CLOCK_RESP:
            t4 = self.clock.local_time()
            t1 = self._clock_waiters.pop(str(data.get("answers")), None)
            t2, t3 = data.get("t2"), data.get("t3")
            if t1 is not None and isinstance(t2, (int, float)) and isinstance(t3, (int, float)):
                self._samples = [*self._samples[-15:], P.ClockSample(t1, float(t2), float(t3), t4)]
        elif kind in (P.RESOURCE_CHUNK, P.RESULT) and str(data.get("answers")) in self._requests:
            await self._requests[str(data["answers"])].put(event)
        elif kind in (P.SCHEDULE, P.START_TIME, P.RESUME):
            if self.verifier is not None and not self.synced.is_set():
                self._held.append(event)  # freshness is judged on the host's clock: sync first
                return
            await self._control(event)
        elif kind != P.HEARTBEAT:
            log.info("ignored %s event %s from the host", kind, event.id)  # never answered: no ping-pong

    async def _control(self, event: Event) -> None:
        """Verify (with a key configured), apply and answer one control event."""
        if self.verifier is not None and not self._verified(event):
            return
        answer = await self._on_event(event)
        if answer is LATER:
            pass
        elif answer is None:
            await self._send([self.events.make_raw(P.ACK, ids=[event.id])])
        else:
            await self._send([self.events.make_raw(P.RESULT, **answer)])

    def _verified(self, event: Event) -> bool:
        """Check ``event``'s signature; a refusal is reported (``control_refused``) and answered."""
        from vmr_handler.core.errors import SignatureError, SigningError

        try:
            self.verifier.check(event, self.config.vm_name, self.clock.time())
            return True
        except SignatureError as exc:
            log.error("refused %s %s from the host: %s", event.type, event.id, exc)
            if self.report is not None:
                self.report(
                    self.events.make(
                        EventType.CONTROL_REFUSED,
                        type=event.type,
                        id=event.id,
                        status="error",
                        details=str(exc),
                    )
                )
            self._answer_later(P.result_data(event.id, False, f"refused: {exc}"))
        except SigningError as exc:  # the replay memory cannot be saved: not applied, host resends
            log.error("cannot check %s %s: %s", event.type, event.id, exc)
        return False

    def _answer_later(self, data: Dict[str, Any]) -> None:
        task = asyncio.ensure_future(self.send_event(P.RESULT, **data))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _sender(self) -> None:
        """Send every unacknowledged report (oldest first), in batches, with a window."""
        await self.welcomed.wait()
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

    async def _keepalive(self, channel: ByteChannel) -> None:
        step = min(1.0, self.config.heartbeat / 2)
        last_hello = time.monotonic()
        while True:
            await asyncio.sleep(step)
            now = time.monotonic()
            if now - self._last_tx >= self.config.heartbeat:
                await self._send([self.events.make_raw(P.HEARTBEAT)], ttl=2 * self.config.heartbeat)
            if now - self._last_rx >= self.config.peer_timeout:
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
                self._clock_waiters[event.id] = t1
                await self._send([event], ttl=2.0)
                await asyncio.sleep(0.02)
            for _ in range(50):  # answers of this burst (bounded wait)
                if not self._clock_waiters:
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
                self.synced.set()
                held, self._held = self._held, []
                for event in held:
                    await self._control(event)
            self._clock_waiters.clear()
            # a noisy estimate (busy machine, long round trips) is refined soon, a good one hourly-ish
            good = best is not None and best.delay < GOOD_CLOCK_DELAY
            await asyncio.sleep(self.config.clock_interval if good else min(5.0, self.config.clock_interval))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return uuid.uuid4().hex


# ====================================================================== orchestration
class ConnectedAgent:
    """Runs one VM's part of the experiment under a host (``vmr-handler run`` without --local)."""

    def __init__(self, config: AgentConfig, log_stream: Optional[Any] = sys.stderr) -> None:
        self.config = config
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        self.clock = SystemClock(skew=config.clock_skew)
        self.outbox = Outbox(config.state_dir)
        self.link = HostLink(config, self.outbox, self.clock, self._on_control)
        self.link.report = self.sink
        self._log = None if config.quiet else log_stream
        self._schedule_ready: asyncio.Future[Schedule] = asyncio.get_running_loop().create_future()
        self._schedule: Optional[Schedule] = None
        self._engine: Any = None
        self._resources: Dict[str, Dict[str, Any]] = {}
        self._pending_start: Optional[float] = None
        self._fetching: Optional[asyncio.Future[None]] = None
        self._transfers: Dict[str, asyncio.Task[None]] = {}
        self._transfer_state: Dict[str, Dict[str, Any]] = {}
        self._http: Dict[str, Any] = {}  # the schedule event's "http": base, token, upload
        self._stopped = asyncio.Event()
        self._transfer_pool: Any = None  # worker threads of HTTP downloads and uploads

    # -------------------------------------------------------------- control from the host
    async def _on_control(self, event: Event) -> Optional[Dict[str, Any]]:
        data = event.data
        if event.type == P.SCHEDULE:
            return self._take_schedule(event)
        if event.type == P.START_TIME:
            start = data.get("start_time")
            if not isinstance(start, (int, float)):
                return P.result_data(event.id, False, "start_time must be a number")
            if self._engine is not None:
                self._engine.set_start_time(float(start))
            else:
                self._pending_start = float(start)
            return None
        if event.type == P.RESUME:
            if self._engine is None:
                return P.result_data(event.id, False, "no schedule is running yet")
            at = parse_number(data.get("at"))  # host experiment seconds, "-inf" before the start
            outcome = self._engine.resume(at, resume_id=event.id)
            if outcome.get("repeated"):
                details = "already applied"
            elif outcome["ignored"]:
                details = "ignored: no active break"
            else:
                details = f"ended break at entry {outcome['ended_break']}"
            return P.result_data(
                event.id, True, details, ended_break=outcome["ended_break"], ignored=outcome["ignored"]
            )
        log.warning("unexpected %s event from host", event.type)
        return P.result_data(event.id, False, f"unknown event type {event.type!r}")

    def _take_schedule(self, event: Event) -> Optional[Dict[str, Any]]:
        data = event.data
        if isinstance(data.get("fetch"), str):  # too big for one frame: fetch it, answer later
            if self._schedule is None and self._fetching is None:
                self._fetching = asyncio.ensure_future(self._fetch_schedule(event))
            return LATER if self._schedule is None else self._accept_schedule(event.id, None, data)
        try:
            raw = base64.b64decode(str(data.get("data_b64", "")), validate=True)
        except ValueError:
            return P.result_data(event.id, False, "schedule data_b64 is not base64")
        return self._accept_schedule(event.id, raw, data)

    async def _fetch_schedule(self, event: Event) -> None:
        """Fetch a large schedule in chunks, then answer the ``schedule`` event."""
        target = os.path.join(self.config.state_dir, SCHEDULE_FILE + ".fetch")
        try:
            error = await self._fetch_one(str(event.data["fetch"]), target)
            if error is None:
                with open(target, "rb") as fh:
                    raw = fh.read()
                os.unlink(target)
                answer = self._accept_schedule(event.id, raw, event.data)
            else:
                answer = P.result_data(event.id, False, f"schedule download failed: {error}")
            with contextlib.suppress(ChannelClosed):
                await self.link.send_event(P.RESULT, **answer)
        finally:
            self._fetching = None

    def _accept_schedule(self, answers: str, raw: Optional[bytes], data: Mapping[str, Any]) -> Dict[str, Any]:
        """Check, load and store delivered schedule bytes; the ``result`` data to answer with.

        ``raw`` None: a re-announcement of a schedule that is already here.
        """
        if raw is None:
            same = self._schedule is not None and self._schedule.digest == data.get("sha256")
            return P.result_data(
                answers, same, "schedule already running" if same else "another schedule is running"
            )
        event_id = answers
        if data.get("sha256") and hashlib.sha256(raw).hexdigest() != data.get("sha256"):
            return P.result_data(event_id, False, "schedule sha256 does not match its data")
        try:
            schedule = load_schedule_bytes(raw, self.config.allow_classes)
        except ScheduleError as exc:
            self._report(EventType.SCHEDULE_WARNING, status="error", details=f"schedule refused: {exc}")
            return P.result_data(event_id, False, str(exc))
        resources = data.get("resources")
        if isinstance(resources, dict):
            self._resources = {str(k): v for k, v in resources.items() if isinstance(v, dict)}
            http = data.get("http")
            self._http = dict(http) if isinstance(http, dict) else {}
            for info in self._resources.values():  # over HTTP(S): each url with the VM's token
                if "url" in info and isinstance(http, dict):
                    info["token"] = http.get("token")
        if self._schedule is not None:
            same = self._schedule.digest == schedule.digest
            return P.result_data(
                event_id,
                same,
                "schedule already running"
                if same
                else "another schedule is already running; restart the agent to change it",
            )
        atomic_write(os.path.join(self.config.state_dir, SCHEDULE_FILE), raw)
        atomic_write(
            os.path.join(self.config.state_dir, "resources.json"), json.dumps(self._resources).encode()
        )
        atomic_write(os.path.join(self.config.state_dir, "http.json"), json.dumps(self._http).encode())
        self._schedule = schedule
        if not self._schedule_ready.done():
            self._schedule_ready.set_result(schedule)
        return P.result_data(
            event_id, True, f"schedule accepted ({len(schedule.entries)} entries)", digest=schedule.digest
        )

    def _stored_schedule(self) -> Optional[Schedule]:
        path = os.path.join(self.config.state_dir, SCHEDULE_FILE)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
            schedule = load_schedule_bytes(raw, self.config.allow_classes)
        except (OSError, ScheduleError):
            return None
        with (
            contextlib.suppress(OSError, ValueError),
            open(os.path.join(self.config.state_dir, "resources.json"), "rb") as fh,
        ):
            self._resources = json.loads(fh.read())
        with (
            contextlib.suppress(OSError, ValueError),
            open(os.path.join(self.config.state_dir, "http.json"), "rb") as fh,
        ):
            self._http = json.loads(fh.read())
        return schedule

    # -------------------------------------------------------------- reports
    def sink(self, event: Event) -> None:
        """The engine's event sink: outbox (delivered to the host) + readable log."""
        self.outbox.add(event)
        self.link.notify()
        if self._log is not None:
            with contextlib.suppress(OSError, ValueError):
                self._log.write(describe(event) + "\n")
                self._log.flush()
        if event.type == EventType.TRANSFER_REGISTERED.value:
            self._start_transfer(dict(event.data))

    def _report(self, type_: EventType, **data: Any) -> None:
        self.sink(self.link.events.make(type_, **data))

    def _start_transfer(self, data: Dict[str, Any], seen: Optional[Dict[str, str]] = None) -> None:
        """Run a transfer out (a ``transfer_registered`` report's data), once per entry and
        location; ``seen``: ``{relative name: sha256}`` already sent (a restarted agent)."""
        key = f"{data.get('index')}:{data.get('location')}"
        if key not in self._transfers:
            self._transfer_state[key] = {"data": data, "seen": dict(seen or {})}
            self._save_transfers()
            self._transfers[key] = asyncio.ensure_future(self._transfer(key))

    def _save_transfers(self) -> None:
        """Keep the transfers under way in ``<state>/transfers.json`` (for a restart)."""
        with contextlib.suppress(OSError):
            path = os.path.join(self.config.state_dir, TRANSFERS_FILE)
            atomic_write(path, json.dumps(self._transfer_state).encode())

    def _restart_transfers(self) -> None:
        """Restart the transfers a previous run of the agent left under way."""
        try:
            with open(os.path.join(self.config.state_dir, TRANSFERS_FILE), "rb") as fh:
                saved = json.loads(fh.read())
        except (OSError, ValueError):
            return
        for rec in saved.values() if isinstance(saved, dict) else []:
            if (
                isinstance(rec, dict)
                and isinstance(rec.get("data"), dict)
                and isinstance(rec.get("seen"), dict)
            ):
                self._start_transfer(rec["data"], rec["seen"])

    async def _transfer(self, key: str) -> None:
        """Send a transfer-out location to the host once, or every ``interval`` s when it changed:
        files of :data:`HTTP_TRANSFER_MIN` bytes or more over HTTP(S) when the host offers it
        (:meth:`_upload`), the others (and those HTTP refused) as ``transfer_chunk`` events."""
        state = self._transfer_state[key]
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
                    await self._upload(name, full, seen.get(rel))
                    if big and self._http.get("upload")
                    else None
                )
                if digest is None:
                    digest = await self._send_chunks(name, full, seen.get(rel))
                if digest is not None and seen.get(rel) != digest:
                    seen[rel] = digest
                    changed = True
            if changed:  # once per pass, not per file (a large directory was quadratic)
                self._save_transfers()
                changed = False
            if not isinstance(interval, (int, float)) or interval <= 0:
                self._transfer_state.pop(key, None)
                self._save_transfers()
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
                    self.outbox.add(
                        self.link.events.make_raw(
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
                    self.link.notify()
                    await asyncio.sleep(0)
        except OSError:
            return None
        return digest

    async def _upload(self, name: str, full: str, sent: Optional[str]) -> Optional[str]:
        """Upload ``full`` over HTTP(S) (:func:`vmr_handler.agent.httpfetch.upload`, resumable, in a
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

        from vmr_handler.agent.httpfetch import upload

        url, token = str(self._http.get("upload")) + quote(name, safe=""), str(self._http.get("token"))
        error: Optional[str] = None
        for _try in range(3):
            try:
                digest = await asyncio.to_thread(sha256_file, full)
                st = os.stat(full)
            except OSError:
                return None
            if digest == sent:
                return digest
            error = await self._in_thread(upload, url, token, full, digest, st.st_size, self._http_verify())
            if error is None:
                uploaded = P.TRANSFER_UPLOADED
                data = {"location": name, "size": st.st_size, "sha256": digest, "mtime": st.st_mtime}
                self.outbox.add(self.link.events.make_raw(uploaded, **data))
                self.link.notify()
                return digest
            if self._stopped.is_set():
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

    # -------------------------------------------------------------- resources
    async def _fetch_resources(self, schedule: Schedule) -> str:
        """Fetch every VM-resource file the schedule drops into ``<state>/resources``: over
        HTTP(S) when the schedule event gave it a ``url`` (:meth:`_fetch_http`), else in
        ``resource_chunk`` events over the channel (:meth:`_fetch_one`)."""
        root = os.path.join(self.config.state_dir, RESOURCES_DIR)
        os.makedirs(root, exist_ok=True)
        names = sorted({d.filename for e in schedule.entries for d in e.data if isinstance(d, FileDrop)})
        for name in names:
            try:
                resource_path(root, name)  # the name must stay inside the resource dir
            except EntryError as exc:
                self._report(EventType.SCHEDULE_WARNING, status="error", details=str(exc))
                continue
            info = self._resources.get(name, {})
            want = info.get("sha256")
            target = os.path.join(root, hashlib.sha256(name.encode()).hexdigest()[:16])
            if want and os.path.exists(target) and sha256_file(target) == want:
                _link_name(root, name, target)
                continue
            error = await self._fetch_http(name, target, info) if "url" in info else "no url"
            if error and "url" in info and not self._stopped.is_set():
                # the HTTP server may be unreachable or busy (e.g. held by another guest): the
                # channel still works, and the schedule's sha256 decides in both cases
                self._report(
                    EventType.SCHEDULE_WARNING,
                    status="error",
                    details=f"resource {name!r} over HTTP failed ({error}); fetching it over the channel",
                )
            if error and not self._stopped.is_set():
                error = await self._fetch_one(name, target)
                if error is None and want and sha256_file(target) != want:
                    # the chunks' own sha256 is unsigned: the schedule's (signed) one decides
                    os.unlink(target)
                    error = "sha256 differs from the one the schedule announced"
            if self._stopped.is_set():
                break
            if error:
                self._report(
                    EventType.SCHEDULE_WARNING, status="error", details=f"resource {name!r}: {error}"
                )
                continue
            _link_name(root, name, target)
        return root

    async def _fetch_one(self, name: str, target: str) -> Optional[str]:
        """Download one resource with resume-from-offset retries; None on success, else why not."""
        tmp = target + ".part"
        for _attempt in range(50):
            offset = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            await self.link.welcomed.wait()
            try:
                ident, queue = await self.link.request(P.RESOURCE_REQUEST, name=name, offset=offset)
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
                self.link.forget_request(ident)
        return "gave up after 50 attempts"

    async def _fetch_http(self, name: str, target: str, info: Mapping[str, Any]) -> Optional[str]:
        """Download one resource from the ``url`` announced with the schedule (``vmr-host serve
        --http``) in a worker thread (:func:`vmr_handler.agent.httpfetch.fetch`: resumable, retried,
        checked against the announced sha256); None on success, else why not. Ends at the next
        block when the agent stops (the ``.part`` file is kept for the next start)."""
        from vmr_handler.agent.httpfetch import fetch

        url, token, sha256, size = (info.get(k) for k in ("url", "token", "sha256", "size"))
        if not (isinstance(url, str) and isinstance(token, str) and isinstance(sha256, str)):
            return "announced with a url but without token and sha256"
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return "announced with a url but without a size"
        return await self._in_thread(fetch, url, token, target, sha256, size, self._http_verify())

    async def _in_thread(self, job: Callable[..., Optional[str]], *args: Any) -> Optional[str]:
        """``job(*args, cancel)`` in a worker thread (a blocking download or upload); ``cancel``
        (a ``threading.Event``) is set when the agent stops or this task is cancelled, and the
        job then ends at its next block. Returns what the job returns."""
        import threading

        cancel = threading.Event()
        if self._transfer_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            # its own threads: a download held by a slow server (retries sleep in the worker)
            # must not take the default pool's threads the MQTT connect needs
            self._transfer_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vmr-http")
        loop = asyncio.get_running_loop()
        work: asyncio.Future[Optional[str]] = asyncio.ensure_future(
            loop.run_in_executor(self._transfer_pool, functools.partial(job, *args, cancel))
        )
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait([work, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            cancel.set()  # (done already, or the agent stops: end the job)
        return await work

    def _http_verify(self) -> bool | str:
        """TLS trust for https resources: ``http_ca_file``, else the broker's CA (``ca_pem`` is
        written to ``<state>/http-ca.pem``: requests needs a file), else the system CAs."""
        mqtt = self.config.mqtt
        if self.config.http_ca_file or mqtt is None or not (mqtt.ca_file or mqtt.ca_pem):
            return self.config.http_ca_file or True
        if mqtt.ca_file:
            return mqtt.ca_file
        path = os.path.join(self.config.state_dir, "http-ca.pem")
        atomic_write(path, str(mqtt.ca_pem).encode(), mode=0o644)
        return path

    # -------------------------------------------------------------- main
    async def run(self) -> int:
        """Connect, get the schedule, run it; returns the engine's exit code."""
        from vmr_handler.agent.engine import DEFAULT_REBOOT_COMMAND, Engine, EngineConfig
        from vmr_handler.agent.executor import install_child_watcher

        install_child_watcher()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, signal.Signals(sig).name)
        link_task = asyncio.ensure_future(self.link.run())
        try:
            schedule = self._stored_schedule()
            if schedule is not None:
                self._schedule = schedule
            else:
                stopped: asyncio.Future[Any] = asyncio.ensure_future(self._stopped.wait())
                ready: asyncio.Future[Any] = self._schedule_ready
                await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if self._stopped.is_set():
                    return 0
                schedule = self._schedule_ready.result()
            resources = await self._fetch_resources(schedule)
            if self._stopped.is_set():
                return 0
            # report on the host's clock from the first event on (bounded: the host may be away)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.link.synced.wait(), 5.0)
            config = EngineConfig(
                launch_dir=self.config.launch_dir,
                state_dir=self.config.state_dir,
                resources_dir=resources,
                reboot_command=self.config.reboot_command or DEFAULT_REBOOT_COMMAND,
                local_start=False,
            )
            self._engine = engine = Engine(schedule, config, self.sink, self.clock)
            self._restart_transfers()  # those a previous run left under way
            self.link.on_clock = engine.clock_changed
            # positive time runs on the host's clock: nothing is timed before the first sync
            sync_task = asyncio.ensure_future(self._when_synced(engine))
            if self._pending_start is not None:
                engine.set_start_time(self._pending_start)
            welcome_start = self.link.welcome.get("start_time")
            if isinstance(welcome_start, (int, float)) and self.link.verifier is None:
                engine.set_start_time(float(welcome_start))
            from vmr_handler.core.control import ControlServer

            control = ControlServer(
                self.config.state_dir,
                {
                    "status": lambda _r: {**engine.status(), "host": self._host_status()},
                    "resume": lambda _r: engine.resume(),
                },
            )
            await control.start()
            try:
                rc: int = await engine.run()
                # a service: stay connected after the schedule ends (reports still owed, periodic
                # transfers, RESUMEs answered as ignored, status) until SIGTERM
                await self._stopped.wait()
            finally:
                sync_task.cancel()
                await control.close()
            return rc
        finally:
            for task in self._transfers.values():
                task.cancel()
            link_task.cancel()
            await asyncio.gather(link_task, *self._transfers.values(), return_exceptions=True)
            self.outbox.close()
            if self._transfer_pool is not None:  # its jobs were told to stop (cancel events)
                self._transfer_pool.shutdown(wait=False)

    async def _when_synced(self, engine: Any) -> None:
        await self.link.synced.wait()
        engine.set_clock_ready()

    def _host_status(self) -> Dict[str, Any]:
        return {
            "port": self.link.where,
            "transport": "mqtt" if self.config.mqtt is not None else "channel",
            "welcomed": self.link.welcomed.is_set(),
            "clock_offset": self.clock.offset,
            "unacked_reports": len(self.outbox),
        }

    def _on_signal(self, name: str) -> None:
        self._stopped.set()
        if self._engine is not None:
            self._engine.stop(f"signal {name}")


def _walk(path: str) -> List[Tuple[str, str]]:
    """``(relative name, full path)`` of a file, or of every file under a directory."""
    if os.path.isdir(path):
        out = []
        for root, _dirs, files in os.walk(path, followlinks=False):
            for name in sorted(files):
                full = os.path.join(root, name)
                if os.path.isfile(full) and not os.path.islink(full):
                    out.append((os.path.relpath(full, path), full))
        return out
    return [("", path)] if os.path.isfile(path) else []


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


async def run_connected(config: AgentConfig) -> int:
    """Entry point of connected mode. Returns the exit code.

    Raises:
        VmrError: the state directory cannot be used.
    """
    try:
        agent = ConnectedAgent(config)
    except OSError as exc:
        raise VmrError(f"cannot use state dir {config.state_dir}: {exc}") from exc
    return await agent.run()
