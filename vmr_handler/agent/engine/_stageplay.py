"""The negative stages in order: the schedule's own, then those appended to it (SPEC section
4). Each stage is run by :class:`~vmr_handler.agent.engine.stages.StageRunner`; this module
decides which runs when and journals it done.

A batch appended while the schedule's stages run makes stages of its own that run once the
current stage ended, before the next of the schedule's; appended after the stages are over,
they run in a task of their own while positive time goes on (:meth:`StagePlay.kick`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from vmr_handler.agent.engine.appends import pending_stages
from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.agent.engine.stages import StageRunner
from vmr_handler.core.schedule.model import EntryKind, ScheduleEntry


@dataclass
class StagePlay:
    """Which stage runs when, for the engine.

    Args:
        state: what the engine's parts share: the schedule now (appended entries included;
            read at each stage), the journal (the stages done, the appended stages), the
            reports (no new stage starts while they are held), the phase it sets.
        runner: runs one stage (``ok``, ``reboot`` or ``failed``).
        stop: ``stop(reason)``: stops the engine (a reboot asked for by an appended stage).

    Attributes:
        current: the number of the stage running now, or None.
        over: True once the schedule's own stages are over (appended ones then run in a task).
        task: the task running appended stages, or None.
    """

    state: EngineState
    runner: StageRunner
    stop: Callable[[str], None]
    current: Optional[int] = field(default=None, init=False)
    over: bool = field(default=False, init=False)
    task: Optional[asyncio.Task[str]] = field(default=None, init=False)

    @property
    def busy(self) -> bool:
        """An appended stage runs or waits to run."""
        return self.task is not None or bool(pending_stages(self.state.journal))

    async def run_all(self) -> str:
        """Run every unfinished stage of the schedule (:attr:`EngineState.stages`) and every
        appended one. Returns ``ok``, ``reboot`` or ``failed``."""
        by_stage: Dict[float, List[ScheduleEntry]] = {}
        for entry in self.state.schedule.entries:
            kind = entry.kind
            if kind is EntryKind.NEGATIVE or (kind is EntryKind.HOST and entry.start_time < 0):
                by_stage.setdefault(entry.start_time, []).append(entry)
        for number, start_time in enumerate(self.state.stages):
            outcome = await self.appended()  # appended meanwhile: once the last stage ended
            if outcome == "ok" and number not in self.state.journal.stages_done:
                outcome = await self.stage(number, start_time, by_stage[start_time])
            if outcome != "ok":
                return outcome
        outcome = await self.appended()
        self.over = True
        return outcome

    async def stage(self, number: int, start_time: float, entries: List[ScheduleEntry]) -> str:
        """Run one stage (``ok``, ``reboot`` or ``failed``), journaled done when ``ok``."""
        await self.state.reports.wait_room()
        self.state.check_stop()
        state = self.state
        before = state.phase
        state.phase = "stages"
        self.current = number
        outcome = await self.runner.run(number, start_time, entries)
        self.current = None
        if outcome == "ok":
            self.state.journal.mark_stage_done(number)
            await self.state.persist()
        if self.over and state.phase == "stages":  # an appended stage while positive time goes on
            state.phase = "positive" if before == "complete" else before  # (a completed VM runs again)
        return outcome

    async def appended(self) -> str:
        """Run the appended stages not done yet, in order (``ok``, ``reboot`` or ``failed``)."""
        entries = self.state.schedule.entries
        for number, start_time, indices in pending_stages(self.state.journal):
            outcome = await self.stage(number, start_time, [entries[i] for i in indices])
            if outcome != "ok":
                return outcome
        return "ok"

    def kick(self) -> None:
        """Once the schedule's own stages are over, run appended stages in a task of their own."""
        if self.task is not None or not self.over or not pending_stages(self.state.journal):
            return
        self.task = task = asyncio.ensure_future(self.appended())

        def done(t: asyncio.Task[str]) -> None:
            self.task = None
            if not t.cancelled() and t.exception() is None:
                if t.result() == "reboot":
                    self.stop("reboot requested by an appended stage")
                else:
                    self.kick()  # appended again while it ran
            self.state.wake()

        task.add_done_callback(done)

    async def cancel(self) -> None:
        """Stop the task running appended stages (engine shutdown)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
