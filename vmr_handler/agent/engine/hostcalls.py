"""on_host entries, the agent's part (reference ``run_vm_resource_host``).

The host runs them (``vmr-host serve --host-entries``, :mod:`vmr_handler.host.serve.experiment.hostentries`),
from its own copy of the schedule; the agent only says *when*: a negative one inside its stage
(the stage ends once the host answered), a positive one at its pause-shifted time. The agent
sends ``host_entry {"index", "scheduled"}`` and waits for the ``result``; the host writes the
entry's start, output and end in the VM's log itself, so the agent reports nothing of its own.
The entry is journaled running, then done, like any entry: after an agent restart or a lost
connection it is asked for again, and the host answers from its record (never runs it twice).

Without a host (``vmr-handler run --local``) on_host entries are reported skipped, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional

from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.agent.state.journal import DONE
from vmr_handler.core.errors import ChannelClosed
from vmr_handler.core.schedule.model import ScheduleEntry
from vmr_handler.core.wire import protocol as P

#: ``ask(index, scheduled)``: have the host run on_host entry ``index`` (due at host UTC
#: ``scheduled``, None in a stage); returns the host's ``result`` data once it ended.
HostAsk = Callable[[int, Optional[float]], Awaitable[Mapping[str, Any]]]
#: Seconds between two looks at whether the connection that carried a request is still up.
LOST_POLL = 1.0


async def run_on_host(
    state: EngineState, ask: HostAsk, entries: List[ScheduleEntry], scheduled: Optional[float]
) -> Dict[int, Mapping[str, Any]]:
    """Have the host run ``entries`` together (``ask``, due at host UTC ``scheduled``) and wait
    until it answered for each; each is journaled running in the engine's journal before it is
    asked for and done (with its exit code) after, then the engine is woken. Returns the
    answers by index."""
    journal = state.journal
    for entry in entries:
        journal.mark_running(entry.index)
    state.journal_changed()
    answers = await asyncio.gather(*(ask(e.index, scheduled) for e in entries))
    for entry, answer in zip(entries, answers):
        code = answer.get("exit_code")
        exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        journal.mark_done(entry.index, DONE, exit_code)
    state.journal_changed()
    state.wake()
    return {e.index: a for e, a in zip(entries, answers)}


class LinkAsker:
    """:data:`HostAsk` over the agent's channel to the host (a ``host_entry`` request, asked
    again on every new connection until a ``result`` answers it).

    Args:
        link: the :class:`~vmr_handler.agent.connected.link.HostLink` (``welcomed``, ``request``,
            ``forget_request``).
    """

    def __init__(self, link: Any) -> None:
        self.link = link

    async def __call__(self, index: int, scheduled: Optional[float]) -> Mapping[str, Any]:
        """Ask until answered (it waits out a host away, and asks again after a reconnection)."""
        while True:
            await self.link.welcomed.wait()
            try:
                ident, queue = await self.link.request(P.HOST_ENTRY, index=index, scheduled=scheduled)
            except ChannelClosed:
                await asyncio.sleep(LOST_POLL)
                continue
            answer = asyncio.ensure_future(queue.get())
            lost = asyncio.ensure_future(self._lost())
            try:
                await asyncio.wait([answer, lost], return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                self.link.forget_request(ident)
            if answer.done():
                event = answer.result()
                return dict(event.data)
            answer.cancel()

    async def _lost(self) -> None:
        """Return once the connection that carried the request is gone (not welcomed)."""
        while self.link.welcomed.is_set():
            await asyncio.sleep(LOST_POLL)
