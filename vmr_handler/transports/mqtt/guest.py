"""The agent's side of the MQTT transport: :class:`MqttChannel`, a byte channel over the broker."""

from __future__ import annotations

import json
from typing import Any

from vmr_handler.core.errors import ChannelClosed, ConnectFailed
from vmr_handler.transports.base import ByteChannel
from vmr_handler.transports.mqtt.bridge import PahoBridge
from vmr_handler.transports.mqtt.options import MqttOptions, check_name
from vmr_handler.transports.mqtt.topics import HOST_START_QOS, READS_HOST_START, Topics, is_host_start


def presence_payload(state: str, **info: Any) -> bytes:
    """The retained presence message: ``{"state": "online"|"offline", ...}`` as JSON bytes
    (``host_start=True`` in ``info``: :data:`READS_HOST_START`)."""
    return json.dumps({"state": state, **info}, separators=(",", ":")).encode()


class MqttChannel(ByteChannel):
    """The agent's channel over MQTT: writes go to ``up``; ``down``, ``start`` and every host's
    start topic (``vmr/E/_hosts/+/start``, one retained message per host for all its VMs) are
    read. A host's start is only applied when it is of the run of the host that serves this
    VM (:class:`vmr_handler.core.wire.runs.StartGate`: several hosts may share the broker).

    The first message from a host's start topic on a connection (a host leaves one there
    from its first connect on, a start or an empty frame) shows that the broker lets this VM
    read them: the channel then says so in its presence (``"host_start": true``), and from
    then on its host sends the start on none of this VM's own topics. A broker whose
    ACL predates those topics delivers nothing from them, so the VM is never counted on them.

    Like a virtio-serial port, the host going away is not visible (the broker stays): the
    session layer notices host silence and says hello again. A lost broker connection ends
    the channel (:class:`ChannelClosed`) and the agent connects again; the broker kept the
    session, so frames the host sent meanwhile arrive then.
    """

    sees_disconnects = False
    transport_liveness = True
    framed = True

    def __init__(self, bridge: PahoBridge, topics: Topics, boot_id: str = "") -> None:
        self._bridge = bridge
        self.topics = topics
        self.boot_id = boot_id
        #: a host's start topic delivered something on this connection (see the class doc)
        self.reads_host_start = False

    @classmethod
    async def connect(cls, options: MqttOptions, vm: str, boot_id: str) -> MqttChannel:
        """Connect as ``vm`` (client id ``vmr-<experiment>-<vm>``), subscribe, say online.

        Raises:
            MqttError: refused for good (credentials, TLS, names).
            ConnectFailed: the broker is not reachable now.
        """
        topics = Topics(check_name("experiment", options.experiment), check_name("VM name", vm))
        bridge = PahoBridge(
            options,
            client_id=f"vmr-{options.experiment}-{vm}",
            subscriptions=[(topics.down, 1), (topics.start, 1), (topics.host_starts, HOST_START_QOS)],
            will=(topics.presence, presence_payload("offline", vm=vm, boot_id=boot_id)),
        )
        await bridge.connect()
        channel = cls(bridge, topics, boot_id)
        try:
            await bridge.publish(
                topics.presence, presence_payload("online", vm=vm, boot_id=boot_id), retain=True
            )
        except ChannelClosed as exc:  # lost right after CONNACK: a retry like any failed connect
            bridge.close()
            raise ConnectFailed(str(exc)) from exc
        return channel

    async def read(self) -> bytes:
        while True:
            item = await self._bridge.messages.get()
            if item is None:
                raise ChannelClosed(f"broker {self._bridge.url}: connection lost")
            topic, payload = item
            if is_host_start(topic, self.topics.experiment) and not self.reads_host_start:
                self.reads_host_start = True
                self._bridge.publish_nowait(self.topics.presence, self._presence("online"), retain=True)
            if payload and (
                topic in (self.topics.down, self.topics.start) or is_host_start(topic, self.topics.experiment)
            ):
                return payload if payload.endswith(b"\n") else payload + b"\n"

    def _presence(self, state: str) -> bytes:
        flag = {READS_HOST_START: True} if self.reads_host_start else {}
        return presence_payload(state, vm=self.topics.vm, boot_id=self.boot_id, **flag)

    async def write(self, data: bytes) -> None:
        await self._bridge.publish(self.topics.up, data)

    async def write_ephemeral(self, data: bytes, ttl: float) -> None:
        # MQTT v5 message expiry: while the host is away the broker keeps the host's session,
        # and without it would hand a restarted host every hello and heartbeat of the outage
        await self._bridge.publish(self.topics.up, data, expiry=max(1, round(ttl)))

    def close(self) -> None:
        bridge = self._bridge
        if not bridge.closed:
            bridge.client.publish(self.topics.presence, self._presence("offline"), qos=1, retain=True)
        bridge.close()


class MqttOpener:
    """Connects the agent to the broker as VM ``vm`` (:meth:`MqttChannel.connect`).

    Args:
        options: broker, experiment, credentials.
        vm: this VM's name (its MQTT username and topic level).
        boot_id: this boot's id, in the retained presence message.
    """

    def __init__(self, options: MqttOptions, vm: str, boot_id: str) -> None:
        self.options = options
        self.vm = vm
        self.boot_id = boot_id
        self.where = options.broker

    async def open(self) -> ByteChannel:
        """A connected :class:`MqttChannel`. Raises OSError (retry soon) or MqttError (refused)."""
        return await MqttChannel.connect(self.options, self.vm, self.boot_id)
