"""The one transport contract: a byte channel between an agent and vmr-host (both sides).

Every transport gives the same small interface, :class:`ByteChannel`: ``read`` some bytes,
``write`` all of some bytes, ``write_ephemeral`` a message worthless after a while, ``close``.
What travels is the newline-framed protocol of ``docs/protocol.md``; the session layers above
(:mod:`vmr_handler.agent.connected.link`, :mod:`vmr_handler.host.serve.session.session`) are the same code
whatever
carries the bytes. The transports, one module each::

    base.py           this contract (+ ChannelClosed, from core.errors)
    memory.py         an in-memory pair: tests of everything above the transport, no I/O
    stream.py         a unix stream socket (``--port unix:PATH``; the host's listener side)
    virtio_serial.py  a virtio-serial port or a pty standing in for one (``--port DEVICE``)
    mqtt/             the broker: options and topics, the paho bridge, the agent's channel
    local.py          no host at all: events to a JSON-lines file and a readable log

``sees_disconnects`` says whether a peer that goes away is visible: a socket or the memory
pair says so (:class:`ChannelClosed` on read); a virtio-serial port and a broker do not (the
session layer notices silence and says hello again). tests/test_transport_contract.py runs
one suite over every transport. ``transport_liveness`` says whether the transport reports
the peer's presence itself (MQTT: keep-alive and last will), which replaces the heartbeats;
``framed`` whether each write arrives whole as one message (MQTT), which needs no connect prefix.
"""

from __future__ import annotations

from typing import Protocol

from vmr_handler.core.errors import ChannelClosed

__all__ = ["ByteChannel", "ChannelClosed", "Opener"]


class ByteChannel:
    """What the session layers need from a transport (the whole contract).

    Raises (every method but ``close``):
        ChannelClosed: the channel is gone for good; open a new one to go on.
    """

    #: True when a peer disconnect is visible (unix socket); False for a character device.
    sees_disconnects = True
    #: True when the transport itself tells whether the peer is there, so neither side sends
    #: application heartbeats over it and silence is no sign of absence: MQTT (the broker
    #: drops a client silent for 1.5x its keep-alive and publishes its retained last will,
    #: ``offline``, on its presence topic). False: the session layers heartbeat (sockets,
    #: virtio-serial).
    transport_liveness = False
    #: True when every write arrives whole, as one message of its own (MQTT): no partial frame
    #: can be left in the stream, so no :data:`~vmr_handler.core.wire.protocol.CONNECT_PREFIX`
    #: is sent first (at 10 000 VMs, 10 000 broker messages less per host restart).
    #: False: a byte stream (sockets, virtio-serial), where the prefix ends any partial frame.
    framed = False

    async def read(self) -> bytes:
        """Some bytes (never empty). Raises :class:`ChannelClosed` when the peer is gone."""
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        """Write all of ``data``. Raises :class:`ChannelClosed` when the peer is gone."""
        raise NotImplementedError

    async def write_ephemeral(self, data: bytes, ttl: float) -> None:
        """Write a message that is worthless after ``ttl`` seconds (hello, heartbeat, clock
        request). A transport that stores messages for an absent peer (MQTT) drops it after
        ``ttl``; a byte stream just writes it. Raises :class:`ChannelClosed`."""
        await self.write(data)

    def close(self) -> None:
        """Release the channel."""


class Opener(Protocol):
    """How the agent reaches the host: the CLI builds one from the configuration and hands it
    to the agent, which opens a new channel with it after every loss (with backoff).

    Attributes:
        where: the channel in words, for logs and status (a port path, a broker URL).
    """

    where: str

    async def open(self) -> ByteChannel:
        """A new open channel.

        Raises:
            OSError: not there yet (no port, no broker): retry soon.
            VmrError: refused for good (credentials, TLS, names): retry slowly.
        """
