"""Guest channels over unix stream sockets, one ``<channels>/<vm>.sock`` per VM (``docs/host.md``).

* **listen** (default): vmr-host listens on the socket and QEMU connects as a client
  (``-chardev socket,id=c0,path=<channels>/<vm>.sock,reconnect=1``). One connection per VM
  socket at a time: a second concurrent one is closed and counted.
* **connect** (``--connect``): QEMU is the server (``server=on,wait=off``); vmr-host
  connects to the socket and reconnects with exponential backoff (``tenacity``) whenever
  the socket is absent or the connection drops.

Either way each connection is a :class:`~vmr_handler.transports.stream.UnixChannel` served by
:func:`~vmr_handler.host.serve.channels.links.serve_channel`: its
:class:`~vmr_handler.host.serve.channels.links.ChannelLink`
is attached to the VM's :class:`~vmr_handler.host.serve.session.session.VmSession`, which is fed the bytes
read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from typing import Any, Dict, List, Optional

from vmr_handler.core.clock import Clock
from vmr_handler.core.control import socket_problem
from vmr_handler.core.errors import HostSetupError
from vmr_handler.host.serve.channels._waits import backoff, pause
from vmr_handler.host.serve.channels.links import serve_channel
from vmr_handler.host.serve.config import HostConfig
from vmr_handler.host.serve.session.session import VmSession
from vmr_handler.transports.stream import UnixChannel

log = logging.getLogger("vmr_handler.host")


def channel_path(channels: str, vm: str) -> str:
    """``<channels>/<vm>.sock`` as an absolute path."""
    return os.path.join(os.path.abspath(channels), vm + ".sock")


class StreamChannels:
    """Every VM's channel socket, listened on or connected to (``config.connect``).

    In connect mode a failed attempt is retried after ``min(initial * 2 ** (n - 1) + U(0,
    initial), max)`` seconds (``config.reconnect``; ``n``: the failures in a row), and a
    connection that ends is followed by ``initial`` seconds before the next attempt; both on
    ``clock``.

    Args:
        config: the channels directory, the mode, the reconnect backoff and the limits.
        sessions: VM name -> its session (filled before :meth:`start`).
        clock: the host's clock the reconnect waits are counted on.
    """

    def __init__(self, config: HostConfig, sessions: Dict[str, VmSession], clock: Clock) -> None:
        self.config = config
        self.sessions = sessions
        self.clock = clock
        #: why serving stopped by itself (never: the sockets are retried or refused at start)
        self.fatal: Optional[str] = None
        self._servers: List[asyncio.AbstractServer] = []
        self._tasks: List[asyncio.Task[None]] = []
        self._sockets: List[str] = []

    def describe(self) -> str:
        """Where the channels are, for the start-up log line."""
        return f"channels {os.path.abspath(self.config.channels)}"

    def check(self) -> None:
        """Every channel socket path fits (< 108 bytes).

        Raises:
            HostSetupError: (exit 2) naming the first path that is too long.
        """
        for vm in sorted(self.config.vms):
            problem = socket_problem(
                channel_path(self.config.channels, vm), "channel socket", "--channels directory"
            )
            if problem is not None:
                raise HostSetupError(problem, 2)

    def prepare(self) -> None:
        """Create the channels directory (listen mode).

        Raises:
            OSError: it cannot be made.
        """
        if not self.config.connect:
            os.makedirs(self.config.channels, mode=0o750, exist_ok=True)

    async def start(self, stop: asyncio.Event) -> None:
        """Listen on every VM's socket, or start connecting to each.

        Raises:
            HostSetupError: a socket cannot be bound (in use by another process: exit 1; a
                non-socket file in the way: exit 2).
        """
        for vm in sorted(self.sessions):
            if self.config.connect:
                self._tasks.append(asyncio.ensure_future(self._connector(vm)))
            else:
                await self._listen(vm)

    async def close(self) -> None:
        """Stop listening and connecting; remove the sockets this host made."""
        for task in self._tasks:
            task.cancel()
        for server in self._servers:
            server.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0)
        for path in self._sockets:
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except OSError:
                pass

    async def _listen(self, vm: str) -> None:
        path = channel_path(self.config.channels, vm)
        _clear_stale_socket(path)

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await serve_channel(self.sessions[vm], UnixChannel(reader, writer))

        old_umask = os.umask(0o117)
        try:
            server = await asyncio.start_unix_server(accept, path=path)
        except OSError as exc:
            raise HostSetupError(f"cannot listen on {path}: {exc}") from exc
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o660)
        self._servers.append(server)
        self._sockets.append(path)

    async def _connector(self, vm: str) -> None:
        path = channel_path(self.config.channels, vm)
        initial, maximum = self.config.reconnect
        while True:
            failures = 0

            def note_failure(retry_state: Any) -> None:
                nonlocal failures
                failures += 1
                if failures == 1:
                    exc = retry_state.outcome.exception() if retry_state.outcome else None
                    log.info("%s: cannot connect to %s (%s); retrying with backoff", vm, path, exc)

            reader: Optional[asyncio.StreamReader] = None
            writer: Optional[asyncio.StreamWriter] = None
            async for attempt in backoff(self.clock, initial, maximum, note_failure):
                with attempt:
                    reader, writer = await asyncio.open_unix_connection(path)
            assert reader is not None and writer is not None
            await serve_channel(self.sessions[vm], UnixChannel(reader, writer))
            await pause(self.clock, initial)


def _clear_stale_socket(path: str) -> None:
    """Remove a socket file left by a dead process; refuse when someone answers on it.

    Raises:
        HostSetupError: another process listens there (exit 1), or it is not a socket (exit 2).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise HostSetupError(f"{path} exists and is not a socket; remove it or choose other --channels", 2)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise HostSetupError(
        f"{path} is in use by another process (is another vmr-host or a QEMU in server mode using it? "
        "for QEMU as the server use --connect)"
    )
