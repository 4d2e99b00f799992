"""``vmr-host serve --transport mqtt``: every VM's session over one broker connection.

One paho client (its own network thread; everything else on the host's event loop)
subscribes to ``vmr/E/+/up`` and ``vmr/E/+/presence`` and hands each VM's frames to that
VM's channel (:class:`~vmr_handler.transports.mqtt.host.VmTopicsChannel`), served as a unix
socket connection is (:mod:`vmr_handler.host.serve.channels.links`: the same link, reader, session layer,
barrier, logs and de-duplication by event id). What differs (``docs/mqtt.md``):

* a VM is *connected* while its retained presence says ``online`` (or it talks);
  ``offline`` (its last will, or a clean stop) detaches it once what it sent before is read;
* frames to a VM are published on ``vmr/E/V/down`` (QoS 1; the broker queues them while
  the VM is away, since every client keeps a persistent session), paced per VM
  (:data:`DOWN_RATE`); a VM over its byte rate has its ``up`` messages dropped (one
  connection carries every VM: reading cannot pause for one);
* the start time is published **retained**, once for all this host's VMs, on
  ``vmr/E/_hosts/<host>/start`` (one message the broker fans out, instead of one
  per VM on ``down`` and ``start``; signed for every VM of the run when signing), so a late or
  rebooted VM learns it from the broker even while this host is away. VMs whose presence
  does not say that their agent reads it (older agents, a broker ACL from before that topic,
  VMs never seen) get it as before, retained on ``vmr/E/V/start`` (and on ``down`` from their
  session). A host that starts an experiment with no start time yet replaces those retained
  messages first (its own start topic by an empty frame, which lets agents see that they may
  read it), and every start names this host's run (:mod:`vmr_handler.core.wire.runs`): an agent
  ignores another run's;
* at every connect the start waits for this host's own echo on ``vmr/E/_hosts/<host>/sync``
  (the broker has then delivered every retained presence and this host's retained start): it is
  not published again where the broker kept it (unsigned), so a restarted host sends nothing a
  VM already has (:meth:`MqttService._on_synced`);
* no application heartbeat crosses the broker: a VM's liveness is its MQTT keep-alive and
  retained last will, so its session is never *silent* while its presence says ``online``;
* a lost broker connection detaches every VM and reconnects with backoff (tenacity).

Several hosts, one broker (``--coordinator`` / ``--member``): the coordinator publishes its
run retained on ``vmr/E/_hosts/_start``; a member that has seen it publishes its VMs, their
configured times and that run retained on ``vmr/E/_hosts/<host>/state``; the coordinator
takes only announcements of its run (an earlier run's retained ones are ignored), waits for
every ``--peers`` host's VMs as for its own, decides the start and publishes it on
``_start``; members adopt it and pass it to their VMs. The broker (a mosquitto bridge, or a
clustered broker) is the distributed part; a coordinator restarted on its logs is the same
run and carries on (``docs/mqtt.md``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Protocol, Set, Tuple

from vmr_handler.core.clock import Clock
from vmr_handler.core.events import Event
from vmr_handler.core.ratelimit import TokenBucket
from vmr_handler.core.wire.protocol import START_TIME, FrameDecoder, encode_message
from vmr_handler.core.wire.runs import EVERY_VM_OF_RUN
from vmr_handler.host.serve.channels._waits import backoff, pause
from vmr_handler.host.serve.channels.links import ChannelLink, SessionReader
from vmr_handler.host.serve.config import HostConfig
from vmr_handler.host.serve.experiment.barrier import Barrier
from vmr_handler.host.serve.session.session import VmSession
from vmr_handler.transports.mqtt.bridge import PahoBridge
from vmr_handler.transports.mqtt.host import VmTopicsChannel
from vmr_handler.transports.mqtt.options import MqttOptions, check_name
from vmr_handler.transports.mqtt.topics import (
    COORDINATOR_START,
    EVERY_VM,
    HOST_STATE,
    PRESENCE,
    READS_HOST_START,
    UP,
    Topics,
    coordinator_topic,
    host_start_topic,
    host_state_topic,
    host_sync_topic,
    hosts_topic,
    topic,
    vm_of,
)

log = logging.getLogger("vmr_handler.host")

#: Bytes per second streamed to one VM (resource chunks) and the burst before pacing starts:
#: the broker accepts whatever is published and queues it for the VM, so a VM that asks for
#: large resources and never reads them cannot make the host stream them into its memory at once.
DOWN_RATE = 16 * 1024 * 1024
DOWN_BURST = 8 * 1024 * 1024
#: Largest presence payload read (a guest controls it).
MAX_PRESENCE = 4096
#: Largest host announcement or start message read, bytes.
MAX_HOST_MESSAGE = 16 * 1024 * 1024
#: Seconds between re-signed publications of the retained start time (agents refuse
#: signatures older than 300 s by default).
START_REFRESH = 60.0
#: Seconds a signed retained start lives in the broker (the agents' default signature age).
SIGNED_START_EXPIRY = 300


class MqttHost(Protocol):
    """What :class:`MqttService` needs of the host
    (:class:`vmr_handler.host.serve.experiment.experiment.Experiment`
    is one): its sessions, barrier and start, and the peer-host hooks of a split experiment."""

    config: HostConfig
    barrier: Barrier
    sessions: Dict[str, VmSession]

    @property
    def signs(self) -> bool:
        """Whether control events are signed."""

    def host_state(self) -> Optional[Dict[str, Any]]:
        """This host's state document for its peers (retained on the broker); None while it
        has nothing to announce (a member that has not seen the coordinator's run yet)."""

    def on_peer_state(self, peer: str, doc: Mapping[str, Any]) -> None:
        """A member host's state document arrived (coordinator only)."""

    def on_coordinator_start(self, doc: Mapping[str, Any]) -> None:
        """The coordinator's start announcement arrived (members only)."""

    def start_event(self) -> Optional[Event]:
        """The ``start_time`` event, once the start is set."""

    def start_announcement(self) -> Dict[str, Any]:
        """The run (and start, once set) a coordinator announces to its members."""

    def sign_for(self, vm: str, event: Event) -> Event:
        """``event`` signed for ``vm`` (unchanged when signing is off)."""


class MqttService:
    """Serves every VM of ``server`` over the broker in ``options`` until cancelled.

    Args:
        server: the host's :class:`~vmr_handler.host.serve.experiment.experiment.Experiment` (sessions,
    barrier).
        options: broker, experiment and the host's credentials.
        host_id: this host's name in its client id (``vmr-host-<experiment>-<host_id>``).
        reconnect: (initial, max) seconds of the reconnect backoff: a failed attempt is retried
            after ``min(initial * 2 ** (n - 1) + U(0, initial), max)`` seconds (``n``: the
            failures in a row), a lost connection after ``initial`` seconds.
        clock: the host's clock (frame times, the signed start's refresh, the reconnect
            waits, the VMs' download pacing).
    """

    def __init__(
        self,
        server: MqttHost,
        options: MqttOptions,
        host_id: Optional[str] = None,
        reconnect: Tuple[float, float] = (0.2, 5.0),
        *,
        clock: Clock,
    ) -> None:
        self.server = server
        self.clock = clock
        self.options = options
        self.experiment = check_name("experiment", options.experiment)
        self.host_id = check_name("host id", host_id or socket.gethostname())
        self.reconnect = reconnect
        self.bridge: Optional[PahoBridge] = None
        #: VM name -> its current channel (fed by :meth:`_on_message`)
        self.channels: Dict[str, VmTopicsChannel] = {}
        self._serving: Dict[str, asyncio.Task[None]] = {}  # VM name -> its latest channel's task
        #: VMs whose agent showed it reads this host's start topic: from an ``online`` presence
        #: that says so until one that does not (an ``offline`` one, e.g. a last will written
        #: at connect before it could know, changes nothing)
        self.reads_host_start: Set[str] = set()
        self.unknown = 0
        self.connected = asyncio.Event()
        #: this connection's echo on :attr:`sync_topic`: when it comes back, every retained
        #: presence and this host's retained start have been read (:meth:`_on_synced`)
        self._sync_token = ""
        #: id of the start event the broker holds retained on :attr:`start_topic` (as read)
        self._kept_start: Optional[str] = None

    def topics(self, vm: str) -> Topics:
        return Topics(self.experiment, vm)

    async def run(self) -> None:
        """Connect, serve, and reconnect after a lost connection, forever (cancel to stop).

        Raises:
            MqttError: the broker refused this host (credentials, ACL, TLS): not retried.
        """
        initial, maximum = self.reconnect
        first = True
        while True:
            async for attempt in backoff(self.clock, initial, maximum, self._note_failure):
                with attempt:
                    bridge = PahoBridge(
                        self.options,
                        client_id=f"vmr-host-{self.experiment}-{self.host_id}",
                        subscriptions=self._subscriptions(),
                    )
                    await bridge.connect()
            self.bridge = bridge
            log.warning(
                "connected to broker %s as %s (experiment %s)", bridge.url, self.host_id, self.experiment
            )
            if first and self.server.barrier.start_time is None:
                # a stale start of an earlier run must not be learnt; an empty frame (no event)
                # in its place shows the agents that they may read this topic (guest.py)
                bridge.publish_nowait(self.start_topic, encode_message([], self.clock.time()), retain=True)
                for vm in self.server.sessions:
                    bridge.publish_nowait(self.topics(vm).start, b"", retain=True)
            first = False
            self._kept_start = None
            self._sync_token = uuid.uuid4().hex  # the start waits for the echo (_on_synced)
            bridge.publish_nowait(self.sync_topic, self._sync_token.encode())
            self.publish_host_state()
            self.connected.set()
            refresh = asyncio.ensure_future(self._refresh_start()) if self.server.signs else None
            try:
                await self._serve(bridge)
            finally:
                if refresh is not None:
                    refresh.cancel()
                self.connected.clear()
                await self._end_all("broker connection lost")
                bridge.close()
                self.bridge = None
            await pause(self.clock, initial)

    def _note_failure(self, retry_state: Any) -> None:
        """A connection attempt failed: say why (each time: the broker is the host's only link)."""
        exc = retry_state.outcome.exception() if retry_state.outcome else ""
        log.warning("broker %s: %s; retrying", self.options.broker, exc)

    async def _serve(self, bridge: PahoBridge) -> None:
        handled = 0
        while True:
            handled += 1
            if handled % 64 == 0:  # a full queue never suspends get(): let the ticker etc. run
                await asyncio.sleep(0)
            item = await bridge.messages.get()
            if item is None:
                log.warning("lost the broker %s; reconnecting", bridge.url)
                return
            topic, payload = item
            try:
                self._on_message(bridge, topic, payload)
            except Exception:  # one VM's input must never stop the others
                log.exception("error handling %s", topic)

    @property
    def role(self) -> str:
        return self.server.config.role

    def hosts_topic(self, leaf: str) -> str:
        """``vmr/E/_hosts/<leaf>`` (host-to-host topics; VMs have no access)."""
        return hosts_topic(self.experiment, leaf)

    @property
    def start_topic(self) -> str:
        """``vmr/E/_hosts/<this host>/start``: this host's start for all its VMs (they may read it)."""
        return host_start_topic(self.experiment, self.host_id)

    @property
    def sync_topic(self) -> str:
        """``vmr/E/_hosts/<this host>/sync`` (:func:`host_sync_topic`)."""
        return host_sync_topic(self.experiment, self.host_id)

    def _subscriptions(self) -> List[Tuple[str, int]]:
        subs = [(topic(self.experiment, EVERY_VM, leaf), 1) for leaf in (UP, PRESENCE)]
        subs += [(self.start_topic, 1), (self.sync_topic, 1)]  # (subscribed after the presences)
        if self.role == "coordinator":
            subs.append((host_state_topic(self.experiment, EVERY_VM), 1))
        elif self.role == "member":
            subs.append((coordinator_topic(self.experiment), 1))
        return subs

    def publish_host_state(self) -> None:
        """Announce this member's VMs and configured times (retained; no-op for other roles)."""
        state = self.server.host_state() if self.role == "member" and self.bridge is not None else None
        if state is not None and self.bridge is not None:
            doc = json.dumps(state, separators=(",", ":")).encode()
            self.bridge.publish_nowait(host_state_topic(self.experiment, self.host_id), doc, retain=True)

    def _on_host_message(self, topic: str, payload: bytes) -> None:
        prefix = self.hosts_topic("")
        if not payload or len(payload) > MAX_HOST_MESSAGE:
            return
        try:
            doc = json.loads(payload)
        except ValueError:
            log.warning("malformed message on %s ignored", topic)
            return
        if not isinstance(doc, dict):
            return
        rest = topic[len(prefix) :].split("/")
        if rest == [COORDINATOR_START]:
            self.server.on_coordinator_start(doc)
        elif len(rest) == 2 and rest[1] == HOST_STATE and rest[0] != self.host_id:
            self.server.on_peer_state(rest[0], doc)

    def _on_own_message(self, topic: str, payload: bytes) -> bool:
        """This host's retained start (note which start the broker keeps) or its connect echo
        (:meth:`_on_synced`); False for any other topic."""
        if topic == self.start_topic:
            events = [ev for m in FrameDecoder().feed(payload.rstrip(b"\n") + b"\n") for ev in m.events]
            self._kept_start = next((ev.id for ev in events if ev.type == START_TIME), None)
            return True
        if topic == self.sync_topic:
            if self._sync_token and payload == self._sync_token.encode():
                self._sync_token = ""
                self._on_synced()
            return True
        return False

    def _on_synced(self) -> None:
        """Every retained message of this connection's subscriptions has been read: which VMs
        read this host's start topic (their presence), and whether the broker still holds this
        host's start. Publish the start where it is missing: not again on :attr:`start_topic`
        when the broker kept this very start unsigned (a restarted host, a reconnect), and on
        the own topic of no VM that reads that one."""
        start = self.server.start_event()
        kept = start is not None and start.id == self._kept_start and not self.server.signs
        self.publish_start(kept=kept)

    def _on_message(self, bridge: PahoBridge, topic: str, payload: bytes) -> None:
        if self._on_own_message(topic, payload):
            return
        if topic.startswith(self.hosts_topic("")):
            self._on_host_message(topic, payload)
            return
        parsed = vm_of(topic, self.experiment)
        session = self.server.sessions.get(parsed[0]) if parsed else None
        if parsed is None or session is None:
            self.unknown += 1
            if self.unknown <= 5 or self.unknown % 1000 == 0:
                log.warning("message on %s from no VM of this experiment ignored (x%d)", topic, self.unknown)
            return
        vm, leaf = parsed
        if leaf == PRESENCE:
            state, reads = _presence(payload)
            if state == "online":
                (self.reads_host_start.add if reads else self.reads_host_start.discard)(vm)
                self._channel(bridge, vm)
            elif state == "offline":
                channel = self.channels.pop(vm, None)
                if channel is not None:
                    channel.end("VM offline (presence)")
            return
        if leaf != UP:
            return
        if session.over_byte_rate(len(payload)):  # a flooding VM must not hold up the others
            return
        self._channel(bridge, vm).deliver(payload)

    def _channel(self, bridge: PahoBridge, vm: str) -> VmTopicsChannel:
        """``vm``'s channel (its presence said online, or it talks): a new one, attached once
        the VM's previous one is detached, unless the current one is still live."""
        old = self.channels.get(vm)
        if old is not None and old.live:
            # already attached: a new connection of the agent says hello itself (and frames
            # are whole per message, so no decoder state to reset); re-attaching on every
            # "online" let a VM flooding its presence churn handshakes and grow its log
            return old
        if old is not None:
            old.end("VM reconnected to the broker")
        channel = VmTopicsChannel(bridge, self.topics(vm))
        self.channels[vm] = channel
        self._serving[vm] = asyncio.ensure_future(self._serve_vm(vm, channel, self._serving.get(vm)))
        return channel

    async def _serve_vm(
        self, vm: str, channel: VmTopicsChannel, previous: Optional[asyncio.Task[None]]
    ) -> None:
        """One connection of ``vm`` over ``channel``: attach, feed, and detach with the reason
        the channel was ended for (a closed link stays attached, as not connected, until then)."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        session = self.server.sessions[vm]
        link = ChannelLink.of(session, channel, TokenBucket(DOWN_RATE, DOWN_BURST, session.clock.monotonic()))
        if not session.attach(link, session.clock.time(), channel.transport_liveness, channel.framed):
            link.close()
            return
        reader = SessionReader(session, channel, link)
        try:
            await reader.run()
            session.acks.flush()  # what it sent before going offline is acknowledged (fsynced)
            link.close()
            await channel.wait_ended()
        finally:
            session.detach(link, session.clock.time(), channel.ended or reader.reason)
            link.close()

    async def _end_all(self, reason: str) -> None:
        """End every VM's channel for ``reason``; return once each is detached."""
        for channel in self.channels.values():
            channel.end(reason)
        self.channels.clear()
        serving = list(self._serving.values())
        self._serving.clear()
        if serving:
            await asyncio.gather(*serving, return_exceptions=True)

    async def _refresh_start(self) -> None:
        """Re-sign and re-publish the retained start time (a signed one goes stale)."""
        never = asyncio.Event()
        while True:
            await self.clock.wait(never, self.clock.time() + START_REFRESH)
            self.publish_start()

    def publish_start(self, kept: bool = False) -> FrozenSet[str]:
        """Publish the start time (once it is set), retained: once on :attr:`start_topic` for
        every VM (signed for :data:`EVERY_VM_OF_RUN` with a key), and on the ``start`` topic of
        each VM not known to read that (:attr:`reads_host_start`); and a coordinator's run and
        start on ``_hosts/_start`` (retained; replaces an earlier run's, so members answer
        this run). ``kept``: the broker holds this very start on :attr:`start_topic` already
        (read back at connect, unsigned): not published there again (the broker would bring
        it to every VM once more).

        Returns:
            The VMs the broker brings the start to through :attr:`start_topic`: their agents
            read it, so the caller need not send it on their sessions (empty when not
            connected or the start is not set).
        """
        bridge = self.bridge
        if bridge is None:
            return frozenset()
        if self.role == "coordinator":
            doc = json.dumps(self.server.start_announcement(), separators=(",", ":")).encode()
            bridge.publish_nowait(coordinator_topic(self.experiment), doc, retain=True)
        start = self.server.start_event()
        if start is None:
            return frozenset()
        began = self.clock.monotonic()
        # signed: expires with its signature (300 s), re-published every START_REFRESH s, so no
        # stale copy waits in the broker or the queue of a VM that is away
        expiry = SIGNED_START_EXPIRY if self.server.signs else None
        if not kept:
            everyone = encode_message([self.server.sign_for(EVERY_VM_OF_RUN, start)], self.clock.time())
            if not bridge.publish_nowait(self.start_topic, everyone, retain=True, expiry=expiry):
                return frozenset()
            bridge.flush()  # to the broker now, before the loop turns to anything else
        reached = frozenset(self.reads_host_start.intersection(self.server.sessions))
        others = [vm for vm in self.server.sessions if vm not in reached]
        for vm in others:
            frame = encode_message([self.server.sign_for(vm, start)], self.clock.time())
            bridge.publish_nowait(self.topics(vm).start, frame, retain=True, expiry=expiry)
        log.info(
            "start time %s %s for %d VM(s), and on the own start topic of %d VM(s) "
            "not known to read it, in %.1f ms",
            "kept by the broker on" if kept else "published on",
            self.start_topic,
            len(reached),
            len(others),
            (self.clock.monotonic() - began) * 1000,
        )
        return reached


def _presence(payload: bytes) -> Tuple[Optional[str], bool]:
    """A presence message's state (``online``/``offline``, else None) and whether it says
    that the VM's agent reads the host start topics (:data:`READS_HOST_START`)."""
    if not payload or len(payload) > MAX_PRESENCE:
        return None, False
    try:
        doc: Any = json.loads(payload)
    except ValueError:
        return None, False
    if not isinstance(doc, dict):
        return None, False
    state = doc.get("state")
    return (state if state in ("online", "offline") else None), doc.get(READS_HOST_START) is True
