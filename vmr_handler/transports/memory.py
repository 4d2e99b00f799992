"""An in-memory transport: two connected :class:`~vmr_handler.transports.base.ByteChannel` ends.

Everything above the transport (handshake, acks, resends, the host's sessions) can be tested
with no socket, device or broker. It behaves as a unix socket would: bytes arrive in order, a
write waits while the peer has ``limit`` bytes unread (back-pressure), and closing one end is
seen by the other (:class:`ChannelClosed` once what was written before is read).
"""

from __future__ import annotations

import asyncio
from typing import Optional, Tuple

from vmr_handler.core.errors import ChannelClosed, InvalidArgument
from vmr_handler.transports.base import ByteChannel

#: Default bytes one end may hold unread before its peer's writes wait.
DEFAULT_LIMIT = 1024 * 1024


class MemoryChannel(ByteChannel):
    """One end of :func:`memory_pair`. Use it from the event loop it was made in."""

    sees_disconnects = True

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.peer: Optional[MemoryChannel] = None
        self._buffer = bytearray()
        self._closed = False  # this end was closed
        self._peer_closed = False  # the other end was closed: EOF after the buffer
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def closed(self) -> bool:
        """True once this end was closed."""
        return self._closed

    async def read(self) -> bytes:
        """Every byte the peer wrote and this end has not read yet (never empty).

        Raises:
            ChannelClosed: this end is closed, or the peer closed and everything was read.
        """
        while not self._buffer:
            if self._closed:
                raise ChannelClosed("this end of the memory channel is closed")
            if self._peer_closed:
                raise ChannelClosed("the peer closed the memory channel")
            self._readable.clear()
            await self._readable.wait()
        data = bytes(self._buffer)
        self._buffer.clear()
        self._room.set()
        return data

    async def write(self, data: bytes) -> None:
        """Hand all of ``data`` to the peer, waiting while it holds ``limit`` unread bytes.

        Raises:
            ChannelClosed: either end is closed.
        """
        view = memoryview(data)
        while view:
            peer = self._writable_peer()
            room = peer.limit - len(peer._buffer)
            if room <= 0:
                peer._room.clear()
                await peer._room.wait()
                continue
            peer._buffer += view[:room]
            view = view[room:]
            peer._readable.set()

    def _writable_peer(self) -> MemoryChannel:
        if self._closed:
            raise ChannelClosed("this end of the memory channel is closed")
        if self.peer is None or self._peer_closed:
            raise ChannelClosed("the peer closed the memory channel")
        return self.peer

    def close(self) -> None:
        """Close this end: its reads and writes fail; the peer reads what is left, then EOF."""
        if self._closed:
            return
        self._closed = True
        self._readable.set()
        self._room.set()
        if self.peer is not None:
            self.peer._peer_closed = True
            self.peer._readable.set()
            self.peer._room.set()


def memory_pair(limit: int = DEFAULT_LIMIT) -> Tuple[MemoryChannel, MemoryChannel]:
    """Two connected ends, e.g. ``(agent_end, host_end)``.

    Args:
        limit: bytes each end may hold unread before writes to it wait (> 0).

    Raises:
        InvalidArgument: ``limit`` is not positive.
    """
    if limit <= 0:
        raise InvalidArgument(f"limit must be > 0 bytes, got {limit}")
    a, b = MemoryChannel(limit), MemoryChannel(limit)
    a.peer, b.peer = b, a
    return a, b
