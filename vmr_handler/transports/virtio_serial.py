"""A virtio-serial port (or a pty standing in for one) as a byte channel; the agent's ``--port``.

``--port PATH`` is a character device (default ``/dev/virtio-ports/org.vmr.handler.0``);
``--port unix:PATH`` a unix socket the agent connects to (tests, debugging, or a host-side
listener). Both give the same small interface, :class:`ByteChannel`.

Measured virtio-serial behaviour this module is written for (``qemu-mqtt-lab.md``): with no
host connected the port reads EOF at once and forever (POLLHUP), so a read loop must back
off instead of spinning; a non-blocking write gets EAGAIN until a host connects; a host
reconnect is invisible (the session layer re-handshakes when the host says ``hello``).
A pty used as a stand-in for the device reads EIO while its master is closed: the same case.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat

from vmr_handler.core.errors import ChannelClosed, OsCallFailed
from vmr_handler.transports.base import ByteChannel
from vmr_handler.transports.stream import UnixChannel

#: Longest wait between two reads of a port that says EOF/EIO (no host), seconds.
MAX_IDLE_BACKOFF = 1.0
DEFAULT_PORT = "/dev/virtio-ports/org.vmr.handler.0"


class CharDeviceChannel(ByteChannel):
    """A virtio-serial port (or a pty standing in for one), opened non-blocking.

    Reads that find no host (EOF, EIO) back off up to :data:`MAX_IDLE_BACKOFF` seconds and
    try again: the device stays open and a host that (re)connects is simply heard again.
    """

    sees_disconnects = False

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, path: str) -> CharDeviceChannel:
        """Open the device read-write, non-blocking; a tty is put in raw mode.

        Raises:
            OSError: it does not exist (yet) or cannot be opened.
        """
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            if os.isatty(fd):
                import termios
                import tty

                tty.setraw(fd, termios.TCSANOW)
        except Exception:
            os.close(fd)
            raise
        return cls(path, fd)

    async def _wait(self, writable: bool, timeout: float) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        add, remove = (
            (self._loop.add_writer, self._loop.remove_writer)
            if writable
            else (self._loop.add_reader, self._loop.remove_reader)
        )
        add(self._fd, ready)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            remove(self._fd)

    async def read(self) -> bytes:
        backoff = 0.05
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                await self._wait(writable=False, timeout=MAX_IDLE_BACKOFF)
                continue
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise ChannelClosed(f"{self.path}: {exc.strerror}") from exc
                data = b""
            if data:
                return data
            # EOF/EIO: no host on the other side; poll() would say POLLHUP at once: sleep
            await asyncio.sleep(backoff)
            backoff = min(MAX_IDLE_BACKOFF, backoff * 2)

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        backoff = 0.05
        while view:
            try:
                n = os.write(self._fd, view)
                view = view[n:]
                backoff = 0.05
            except BlockingIOError:
                await self._wait(writable=True, timeout=backoff)
                backoff = min(MAX_IDLE_BACKOFF, backoff * 2)
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise ChannelClosed(f"{self.path}: {exc.strerror}") from exc
                await asyncio.sleep(backoff)
                backoff = min(MAX_IDLE_BACKOFF, backoff * 2)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


async def open_channel(spec: str) -> ByteChannel:
    """Open the channel named by ``spec`` (``unix:PATH`` or a device path).

    Raises:
        OSError: not there yet / refused (the caller retries with backoff).
    """
    if spec.startswith("unix:"):
        return await UnixChannel.connect(spec[len("unix:") :])
    if os.path.exists(spec) and not stat.S_ISCHR(os.stat(spec).st_mode):
        raise OsCallFailed(errno.ENODEV, f"{spec} is not a character device (use unix:PATH for a socket)")
    return await CharDeviceChannel.open(spec)


class PortOpener:
    """Opens ``--port``: a virtio-serial device or ``unix:PATH`` (:func:`open_channel`)."""

    def __init__(self, port: str) -> None:
        self.where = port

    async def open(self) -> ByteChannel:
        """The port, opened. Raises OSError when it is not there (yet)."""
        return await open_channel(self.where)
