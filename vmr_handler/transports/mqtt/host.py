"""vmr-host's side of the MQTT transport: :class:`VmTopicsChannel`, one VM's byte channel.

vmr-host has one broker connection for every VM (:mod:`vmr_handler.host.serve.channels.mqtt`): it reads
``vmr/E/+/up`` and hands each message to the channel of the VM it came from
(:meth:`VmTopicsChannel.deliver`); a channel's writes go to that VM's ``down`` topic. So the
host's session layer sees each VM over a :class:`~vmr_handler.transports.base.ByteChannel`,
as over a unix socket.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Deque, Optional

from vmr_handler.core.errors import ChannelClosed
from vmr_handler.transports.base import ByteChannel
from vmr_handler.transports.mqtt.bridge import PahoBridge
from vmr_handler.transports.mqtt.topics import Topics


class VmTopicsChannel(ByteChannel):
    """One VM's topics as the host's channel: reads what the host's broker connection
    delivered from ``up``, one message per read; each write is one QoS 1 message on ``down``,
    published at once (the broker queues it while the VM is away; pacing is the caller's).

    The VM going away is not seen by reading: the host learns it from the VM's presence and
    :meth:`end`\\ s the channel (reads then return what was delivered before, and raise).

    Args:
        bridge: the host's broker connection (shared by every VM's channel).
        topics: the VM's topics.
    """

    sees_disconnects = False
    transport_liveness = True
    framed = True

    def __init__(self, bridge: PahoBridge, topics: Topics) -> None:
        self._bridge = bridge
        self.topics = topics
        self._inbox: Deque[bytes] = deque()
        self._readable = asyncio.Event()
        self._ended = asyncio.Event()
        #: why the host ended this channel (:meth:`end`), else None
        self.ended: Optional[str] = None
        self._closed = False

    @property
    def live(self) -> bool:
        """True until the channel is ended or closed."""
        return self.ended is None and not self._closed

    def deliver(self, payload: bytes) -> None:
        """A message the VM published on ``up`` (dropped when empty or once the channel is not
        live)."""
        if payload and self.live:
            self._inbox.append(payload)
            self._readable.set()

    def end(self, reason: str) -> None:
        """No more messages (the VM went offline, the broker connection was lost...): reads
        return what was delivered, then raise :class:`ChannelClosed` (``reason``). Idempotent:
        the first reason stays."""
        if self.ended is None:
            self.ended = reason
            self._ended.set()
            self._readable.set()

    async def wait_ended(self) -> None:
        """Return once :meth:`end` was called."""
        await self._ended.wait()

    async def read(self) -> bytes:
        """The next message delivered (never empty).

        Raises:
            ChannelClosed: closed, or ended and every message delivered before was read.
        """
        while not self._inbox:
            if self._closed:
                raise ChannelClosed("the host closed the channel")
            if self.ended is not None:
                raise ChannelClosed(self.ended)
            self._readable.clear()
            await self._readable.wait()
        return self._inbox.popleft()

    async def write(self, data: bytes) -> None:
        """Publish ``data`` as one message on ``down`` now (no wait for the broker's acks).

        Raises:
            ChannelClosed: the channel is closed or the broker connection is gone.
        """
        if self._closed or not self._bridge.publish_nowait(self.topics.down, data):
            raise ChannelClosed(f"broker {self._bridge.url}: not connected")

    def close(self) -> None:
        """Stop reading and writing (the broker connection stays: it is every VM's)."""
        self._closed = True
        self._inbox.clear()
        self._readable.set()
