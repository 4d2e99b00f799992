"""A VM's connection over any transport: the one :class:`~vmr_handler.host.serve.session.api.Link`
over a :class:`~vmr_handler.transports.base.ByteChannel` and the one reader that feeds a
:class:`~vmr_handler.host.serve.session.session.VmSession` from a channel.

* :class:`ChannelLink`: a bounded send queue and a writer task. :meth:`ChannelLink.send_bytes`
  never blocks; a peer that lets more than ``Limits.write_buffer`` bytes pile up loses its
  connection (counted in ``write_overflow``); :meth:`ChannelLink.drain` is the back-pressure
  (and, given a download budget, the pacing of a transport that cannot push back itself);
* :class:`SessionReader`: read, :meth:`~vmr_handler.host.serve.session.session.VmSession.feed`, pause
  while the VM is over its rates, until the channel ends or the link closes; it says why;
* :func:`serve_channel`: one connection of a VM from attach to detach (unix sockets,
  :mod:`vmr_handler.host.serve.channels.streams`; the in-memory pair in the tests). The broker
  (:mod:`vmr_handler.host.serve.channels.mqtt`) uses the link and the reader with its own attach/detach.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable, Deque, Optional

from vmr_handler.core.clock import Clock
from vmr_handler.core.errors import ChannelClosed, LinkLost
from vmr_handler.core.ratelimit import TokenBucket
from vmr_handler.host.serve.channels._waits import pause
from vmr_handler.host.serve.session.session import VmSession
from vmr_handler.transports.base import ByteChannel

log = logging.getLogger("vmr_handler.host")

#: Longest pause of one :meth:`SessionReader.run` step while a VM is over its rates, seconds.
MAX_READ_PAUSE = 1.0


class ChannelLink:
    """A :class:`~vmr_handler.host.serve.session.api.Link` over ``channel``: frames queue here and a
    writer task writes them, one :meth:`ByteChannel.write` per frame (so a message transport
    sends the same messages as frames were sent).

    Args:
        channel: the connection (closed with the link, once what was queued is written).
        limit: bytes queued and not yet written before the link closes itself, dropping
            them and closing the channel at once.
        on_overflow: called once when that happens (before the close).
        name: the VM, for the log of an unexpected write error.
        budget: bytes per second the peer is sent (:meth:`drain` waits while over it), for
            a transport that accepts whatever is written (a broker); None: no pacing. Its
            times are ``clock``'s monotonic seconds.
        max_pace: longest wait of one :meth:`drain` for the budget, seconds.
        clock: the host's clock: the budget is charged and its waits are counted on it.
    """

    def __init__(
        self,
        channel: ByteChannel,
        limit: int,
        on_overflow: Callable[[], None],
        name: str = "",
        budget: Optional[TokenBucket] = None,
        max_pace: float = 5.0,
        *,
        clock: Clock,
    ) -> None:
        self.channel = channel
        self._clock = clock
        self.limit = limit
        self.on_overflow = on_overflow
        self.name = name
        self._budget = budget
        self._max_pace = max_pace
        self._queue: Deque[bytes] = deque()
        self._pending = 0  # bytes queued and not yet written (the write under way included)
        self._queued_total = 0  # bytes ever queued
        self._written_total = 0  # bytes ever written
        self._unpaced = 0  # bytes queued since the last drain (charged to the budget there)
        self._closed = False
        self._failure: Optional[BaseException] = None
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    @classmethod
    def of(
        cls, session: VmSession, channel: ByteChannel, budget: Optional[TokenBucket] = None
    ) -> ChannelLink:
        """The link of ``session``'s VM over ``channel``, with its ``write_buffer`` limit: an
        overflow is counted in ``write_overflow`` and logged."""
        limit = session.limits.write_buffer

        def overflow() -> None:
            session.counters.write_overflow += 1
            log.warning("%s: peer does not read; %d bytes queued: connection dropped", session.name, limit)

        return cls(channel, limit, overflow, session.name, budget, clock=session.clock)

    @property
    def closed(self) -> bool:
        """True once closed (by the host, an overflow or a failed write)."""
        return self._closed

    def send_bytes(self, data: bytes) -> None:
        """Queue ``data`` (ignored once closed); close the link and the channel at once if the
        peer lets more than ``limit`` bytes pile up."""
        if self._closed:
            return
        self._queue.append(data)
        self._pending += len(data)
        self._queued_total += len(data)
        if self._budget is not None:
            self._unpaced += len(data)
        if self._pending > self.limit:
            self.on_overflow()
            self._abort()
            return
        self._wake.set()

    async def drain(self) -> None:
        """Wait until what was queued so far is written, then, given a budget, while it is in
        debt for the bytes queued since the last drain: ``min(debt / rate, max_pace)``
        seconds on the clock.

        Raises:
            LinkLost: the link is or gets closed before those bytes are written.
        """
        target = self._queued_total
        while self._written_total < target or self._closed:
            if self._closed:
                raise LinkLost(str(self._failure) if self._failure else "link closed")
            self._progress.clear()
            await self._progress.wait()
        if self._budget is not None:
            wait = self._budget.spend(self._clock.monotonic(), self._unpaced)
            self._unpaced = 0
            await pause(self._clock, min(wait, self._max_pace))

    def close(self) -> None:
        """Close the link: nothing more is queued; what is queued is still written (as a
        socket flushes on close), then the channel is closed. Idempotent."""
        if not self._closed:
            self._closed = True
            self._progress.set()
            self._wake.set()

    def _abort(self) -> None:
        """Close the link and the channel now, dropping what is queued (an overflow)."""
        self._closed = True
        self._writer.cancel()
        self._shut()

    def _shut(self) -> None:
        self._queue.clear()
        self._pending = 0
        self._progress.set()
        self.channel.close()

    async def _write_loop(self) -> None:
        try:
            while self._queue or not self._closed:
                if not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                data = self._queue[0]
                await self.channel.write(data)
                self._queue.popleft()
                self._pending -= len(data)
                self._written_total += len(data)
                self._progress.set()
        except (ChannelClosed, OSError) as exc:
            self._failure = exc
        except Exception as exc:  # a bug must not leave the session writing to nowhere
            self._failure = exc
            log.exception("%s: internal error writing to the channel; connection dropped", self.name)
        self._closed = True
        self._shut()


class SessionReader:
    """Feeds ``session`` what ``channel`` reads until the channel ends or ``link`` closes.

    Args:
        session: the VM's session (``link`` attached to it).
        channel: where its bytes come from.
        link: the session's link over ``channel``.
        pause: seconds to wait after ``n`` bytes were read (the VM's rates), at most
            :data:`MAX_READ_PAUSE` at a time on the session's clock; None when the transport
            cannot pause one VM and drops its excess before the channel instead.
    """

    def __init__(
        self,
        session: VmSession,
        channel: ByteChannel,
        link: ChannelLink,
        pause: Optional[Callable[[int], float]] = None,
    ) -> None:
        self.session = session
        self.channel = channel
        self.link = link
        self.pause = pause
        #: why reading stopped: ``closed by peer``, ``closed by host``, ``error: ...``,
        #: ``host stopping`` or ``internal error: ...``
        self.reason = "closed by peer"

    async def run(self) -> None:
        """Read and feed until the end; :attr:`reason` says why it ended.

        Raises:
            asyncio.CancelledError: cancelled (``reason`` is ``host stopping``).
        """
        try:
            while not self.link.closed:
                data = await self.channel.read()
                self.session.feed(data, self.session.clock.time())
                wait = self.pause(len(data)) if self.pause is not None else 0.0
                # always yield: with bytes already buffered, read() returns without letting
                # any other VM's reader run, so a flooding VM would hold the loop
                await pause(self.session.clock, min(wait, MAX_READ_PAUSE))
            self.reason = "closed by host"
        except ChannelClosed as exc:
            if isinstance(exc.__cause__, OSError):  # the connection failed, not just ended
                self.reason = f"error: {exc.__cause__}"
            elif self.link.closed:
                self.reason = "closed by host"
        except OSError as exc:
            self.reason = f"error: {exc}"
        except asyncio.CancelledError:
            self.reason = "host stopping"
            raise
        except Exception as exc:  # a bug must not take the host (or other VMs) down
            self.reason = f"internal error: {type(exc).__name__}: {exc}"
            log.exception("%s: internal error handling input; connection dropped", self.session.name)


async def serve_channel(session: VmSession, channel: ByteChannel) -> None:
    """Serve one connection of ``session``'s VM until it ends: attach it (or refuse a second
    one: the channel is closed), feed the session what is read (pausing while the VM is over
    its rates), detach and close. Logs ``connected`` and ``disconnected (<why>)``."""
    link = ChannelLink.of(session, channel)
    if not session.attach(link, session.clock.time(), channel.transport_liveness, channel.framed):
        link.close()
        return
    log.info("%s: connected", session.name)
    reader = SessionReader(session, channel, link, session.read_pause)
    try:
        await reader.run()
    finally:
        session.detach(link, session.clock.time(), reader.reason)
        link.close()
        log.info("%s: disconnected (%s)", session.name, reader.reason)
