"""A unix stream socket as a :class:`~vmr_handler.transports.base.ByteChannel`.

The agent connects with ``--port unix:PATH`` (tests, debugging, a host-side listener); a
listener wraps each accepted connection the same way (:meth:`UnixChannel.connect` /
``UnixChannel(reader, writer)``). A peer that closes is seen: :class:`ChannelClosed`.
"""

from __future__ import annotations

import asyncio

from vmr_handler.core.errors import ChannelClosed
from vmr_handler.transports.base import ByteChannel


class UnixChannel(ByteChannel):
    """A connected unix stream socket (``unix:PATH``)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def connect(cls, path: str) -> UnixChannel:
        """Connect to ``path``. Raises OSError (e.g. FileNotFoundError, ConnectionRefusedError)."""
        reader, writer = await asyncio.open_unix_connection(path, limit=2**20)
        return cls(reader, writer)

    async def read(self) -> bytes:
        try:
            data = await self._reader.read(65536)
        except (ConnectionError, OSError) as exc:
            raise ChannelClosed(str(exc)) from exc
        if not data:
            raise ChannelClosed("host closed the connection")
        return data

    async def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def close(self) -> None:
        self._writer.close()
