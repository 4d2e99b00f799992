"""The console's live stream: Server-Sent Events of the experiment's changes.

A :class:`Hub` fans messages out to every subscriber, each with a bounded queue: a client that
falls behind (a stalled browser tab) gets one ``lagged`` message and is dropped from the fan-out
until it reconnects, so it can never grow the host. Message kinds (the SSE ``event:`` field):

* ``experiment``: the ``/api/v1/experiment`` object, on connect and when it changes;
* ``vm``: a VM's row (``/api/v1/vms``), when it changes;
* ``vm_event``: ``{"vm", "host_received", "event", "next"}`` for every stored report
  (``next``: the byte offset after it in ``<vm>.jsonl``, a cursor for the events endpoint);
* ``lagged``: this client missed messages; reload through the REST API and reconnect.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, List, Optional, Tuple

#: Messages queued per client before it is said to lag.
QUEUE = 2000
#: Seconds between two ``: keepalive`` comments on an idle stream (proxies close silent ones).
KEEPALIVE = 15.0

Message = Tuple[str, Any]


def sse(kind: str, data: Any) -> bytes:
    """One Server-Sent Events message: ``event: kind`` and one ``data:`` line of JSON."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str)
    return f"event: {kind}\ndata: {text}\n\n".encode()


class Subscriber:
    """One client's bounded queue of messages (None: it lagged and must reconnect)."""

    def __init__(self, size: int = QUEUE) -> None:
        self.queue: asyncio.Queue[Optional[Message]] = asyncio.Queue(size + 1)
        self.size = size
        self.lagged = False

    def put(self, message: Message) -> None:
        """Queue ``message``; past :attr:`size` queued, queue the end instead (once)."""
        if self.lagged:
            return
        if self.queue.qsize() >= self.size:
            self.lagged = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(message)

    async def get(self, timeout: float) -> Optional[Message]:
        """The next message; ``("", None)`` after ``timeout`` seconds with none; None: lagged.

        Raises:
            asyncio.CancelledError: the client went away.
        """
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return ("", None)


class Hub:
    """Fans messages out to every :class:`Subscriber` (all on the host's event loop)."""

    def __init__(self) -> None:
        self.subscribers: List[Subscriber] = []

    def subscribe(self, first: List[Message]) -> Subscriber:
        """A new subscriber, with ``first`` queued (the current experiment)."""
        sub = Subscriber()
        for message in first:
            sub.put(message)
        self.subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Forget ``sub`` (its client went away)."""
        if sub in self.subscribers:
            self.subscribers.remove(sub)

    def publish(self, kind: str, data: Any) -> None:
        """Send one message to every subscriber (dropping those that lag)."""
        for sub in list(self.subscribers):
            sub.put((kind, data))
            if sub.lagged:
                self.unsubscribe(sub)

    def __bool__(self) -> bool:
        return bool(self.subscribers)
