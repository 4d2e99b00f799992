"""Every event leaves the agent on the host's clock.

Until the agent's first clock sync with the host, its reference clock is the guest's own; an
event stamped then would reach the host's logs seconds off when the guest clock is wrong.
:class:`PresyncStamps` remembers what was stamped before the sync and corrects it by the
sync's offset when it is sent; :class:`PresyncGate` holds the reports and answers until then
(:class:`~vmr_handler.agent.connected.link.HostLink` uses both); :class:`NotedEvents` is the link's
event factory, noting each event it stamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from vmr_handler.core.clock import SystemClock
from vmr_handler.core.events import Event, EventFactory

log = logging.getLogger(__name__)

#: Seconds after the welcome that reports and answers wait for the first clock sync;
#: a host that never answers a clock request gets them after this, on the guest's own clock.
PRESYNC_HOLD = 30.0


class PresyncStamps:
    """Events stamped before the first clock sync, and their correction.

    Until the first sync the reference clock is the guest's own (the clock's ``offset`` is what
    it was then: 0 in a fresh agent). Nothing stamped then leaves the agent as it is: reports
    wait in the outbox and answers in memory until the first sync, then go out re-stamped with
    ``timestamp + (first offset - offset when stamped)``, the same instant on the host's clock
    (the guest clock's rate is trusted between the two readings; a step of the guest clock in
    between is not seen). The correction is the same on every resend, so the host's
    de-duplication by id is unaffected.

    Args:
        clock: the agent's reference clock (its ``offset`` is read when an event is noted).
    """

    def __init__(self, clock: SystemClock) -> None:
        self._clock = clock
        self._offsets: Dict[str, float] = {}  # event id -> clock offset when it was stamped
        #: the offset of the first sync (None: not synced yet)
        self.first_offset: Optional[float] = None

    def note(self, event: Event) -> None:
        """``event`` was just stamped: remember the offset it was stamped with, before the sync."""
        if self.first_offset is None:
            self._offsets[event.id] = self._clock.offset

    def synced(self) -> None:
        """The first clock sync is done: corrections from now on use the current offset."""
        if self.first_offset is None:
            self.first_offset = self._clock.offset

    def forget(self, ident: str) -> None:
        """The host acknowledged ``ident``: it is never sent again."""
        self._offsets.pop(ident, None)

    def _delta(self, ident: str) -> float:
        stamped = self._offsets.get(ident)
        if stamped is None or self.first_offset is None:
            return 0.0
        return self.first_offset - stamped

    def event(self, event: Event) -> Event:
        """``event``, re-stamped on the host's clock when it was stamped before the first sync."""
        delta = self._delta(event.id)
        return event if not delta else Event(event.type, event.timestamp + delta, event.id, event.data)

    def raw(self, ident: str, item: Tuple[float, bytes]) -> Tuple[float, bytes]:
        """An outbox item ``(timestamp, event JSON)``, re-stamped like :meth:`event`."""
        delta = self._delta(ident)
        if not delta:
            return item
        doc = json.loads(item[1])
        doc["timestamp"] = item[0] + delta
        return doc["timestamp"], json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


class NotedEvents(EventFactory):
    """The link's event factory: every event it stamps before the first sync is noted in
    ``stamps`` (reports the agent adds to the outbox itself, transfers included)."""

    def __init__(self, clock: Callable[[], float], stamps: PresyncStamps) -> None:
        super().__init__(clock)
        self._stamps = stamps

    def make_raw(self, type_: str, **data: Any) -> Event:
        """:meth:`EventFactory.make_raw`, noted in the stamps."""
        event = super().make_raw(type_, **data)
        self._stamps.note(event)
        return event



Send = Callable[[List[Event]], Awaitable[None]]
"""``send(events)``: the link's sending of one message."""


class PresyncGate:
    """Holds reports and answers until the first clock sync (at most :data:`PRESYNC_HOLD` s).

    Args:
        stamps: the link's :class:`PresyncStamps` (answers are re-stamped with it).
        synced: set by the link at its first clock sync.
    """

    def __init__(self, stamps: PresyncStamps, synced: asyncio.Event) -> None:
        self._stamps = stamps
        self._synced = synced
        self._answers: List[Event] = []  # answers to the host stamped before the first sync
        self.is_open = False  # reports and answers may leave (synced, or PRESYNC_HOLD passed)

    def clear(self) -> None:
        """A new session: the host sends its control events again, and they are answered again."""
        self._answers.clear()

    async def answer(self, event: Event, send: Send) -> None:
        """Send an answer to the host on the host's clock: held while the gate is closed."""
        if not self.is_open:
            self._answers.append(event)
            return
        await send([self._stamps.event(event)])

    async def open(self, send: Send) -> None:
        """Wait for the first clock sync (at most :data:`PRESYNC_HOLD` s), open the gate, then
        send the answers held until then, re-stamped."""
        if not self.is_open:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._synced.wait(), PRESYNC_HOLD)
            if not self._synced.is_set():
                log.warning(
                    "no clock sync with the host after %.0f s: reports go out on the guest's clock",
                    PRESYNC_HOLD,
                )
            self.is_open = True
        held, self._answers = self._answers, []
        for event in held:
            await send([self._stamps.event(event)])
