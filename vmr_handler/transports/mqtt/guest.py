"""The agent's side of the MQTT transport: :class:`MqttChannel`, a byte channel over the broker."""

from __future__ import annotations

import json
from typing import Any

from vmr_handler.core.errors import ChannelClosed
from vmr_handler.transports.base import ByteChannel
from vmr_handler.transports.mqtt.bridge import PahoBridge
from vmr_handler.transports.mqtt.options import MqttOptions, check_name
from vmr_handler.transports.mqtt.topics import Topics


def presence_payload(state: str, **info: Any) -> bytes:
    """The retained presence message: ``{"state": "online"|"offline", ...}`` as JSON bytes."""
    return json.dumps({"state": state, **info}, separators=(",", ":")).encode()


class MqttChannel(ByteChannel):
    """The agent's channel over MQTT: writes go to ``up``; ``down`` and ``start`` are read.

    Like a virtio-serial port, the host going away is not visible (the broker stays): the
    session layer notices host silence and says hello again. A lost broker connection ends
    the channel (:class:`ChannelClosed`) and the agent connects again; the broker kept the
    session, so frames the host sent meanwhile arrive then.
    """

    sees_disconnects = False

    def __init__(self, bridge: PahoBridge, topics: Topics) -> None:
        self._bridge = bridge
        self.topics = topics

    @classmethod
    async def connect(cls, options: MqttOptions, vm: str, boot_id: str) -> MqttChannel:
        """Connect as ``vm`` (client id ``vmr-<experiment>-<vm>``), subscribe, say online.

        Raises:
            MqttError: refused for good (credentials, TLS, names).
            OSError: the broker is not reachable now.
        """
        topics = Topics(check_name("experiment", options.experiment), check_name("VM name", vm))
        bridge = PahoBridge(
            options,
            client_id=f"vmr-{options.experiment}-{vm}",
            subscriptions=[(topics.down, 1), (topics.start, 1)],
            will=(topics.presence, presence_payload("offline", vm=vm, boot_id=boot_id)),
        )
        await bridge.connect()
        channel = cls(bridge, topics)
        try:
            await bridge.publish(
                topics.presence, presence_payload("online", vm=vm, boot_id=boot_id), retain=True
            )
        except ChannelClosed as exc:  # lost right after CONNACK: a retry like any failed connect
            bridge.close()
            raise OSError(str(exc)) from exc
        return channel

    async def read(self) -> bytes:
        while True:
            item = await self._bridge.messages.get()
            if item is None:
                raise ChannelClosed(f"broker {self._bridge.url}: connection lost")
            topic, payload = item
            if payload and topic in (self.topics.down, self.topics.start):
                return payload if payload.endswith(b"\n") else payload + b"\n"

    async def write(self, data: bytes) -> None:
        await self._bridge.publish(self.topics.up, data)

    async def write_ephemeral(self, data: bytes, ttl: float) -> None:
        # MQTT v5 message expiry: while the host is away the broker keeps the host's session,
        # and without it would hand a restarted host every hello and heartbeat of the outage
        await self._bridge.publish(self.topics.up, data, expiry=max(1, round(ttl)))

    def close(self) -> None:
        bridge = self._bridge
        if not bridge.closed:
            bridge.client.publish(
                self.topics.presence, presence_payload("offline", vm=self.topics.vm), qos=1, retain=True
            )
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
