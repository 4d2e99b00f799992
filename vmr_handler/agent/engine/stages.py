"""Negative time: one stage at a time, and the reboots stages ask for (SPEC section 4-5).

A stage is every entry with the same negative ``start_time``: they start together and the
stage ends when all have ended. An entry that exits with code 10 or leaves a ``reboot`` file in
its working dir asks for a reboot: after the stage, the reboot command runs and the requesters
run again when the agent comes back (as in the reference), then the next stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from typing import List, Optional

from vmr_handler.agent.engine.entries import EntryLauncher, Prepared
from vmr_handler.agent.engine.hostcalls import run_on_host
from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.agent.machine.executor import REBOOT_EXIT_CODE, REBOOT_FILE
from vmr_handler.core.events import EventType
from vmr_handler.core.schedule.model import ScheduleEntry

log = logging.getLogger("vmr_handler.agent.engine.engine")


@dataclass
class StageRunner:
    """Runs stages through the engine's :class:`~vmr_handler.agent.engine.entries.EntryLauncher`.

    Args:
        state: what the engine's parts share (the journal's reboot requests, the clock for
            durations, the process port that reboots, the working dirs' ``reboot`` files, the
            reboot command and ``host_ask`` of its config: has the host run a stage's on_host
            entries, :mod:`vmr_handler.agent.engine.hostcalls`; None: they are reported skipped).
        entries: the launcher (prepare, start together, the VM's failure).
    """

    state: EngineState
    entries: EntryLauncher

    def recover(self) -> None:
        """After a reboot the requesters run again: their ``reboot`` files and journal states go."""
        reboot = self.state.journal.reboot
        if reboot:
            for index in reboot.get("requesters", []):
                path = os.path.join(self.state.workdirs[index], REBOOT_FILE)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self.state.journal.forget(index)
            self.state.journal.reboot = None

    async def run(self, number: int, start_time: float, entries: List[ScheduleEntry]) -> str:
        """Run one stage's unfinished entries together; carry out a reboot request.

        Args:
            number: the stage's number (0 = the earliest negative start_time).
            start_time: the stage's (negative) start_time.
            entries: every entry of the stage (finished ones are skipped).

        Returns:
            ``ok``, ``reboot`` (the reboot command was run) or ``failed`` (the VM failed).
        """
        todo = [e for e in entries if self.state.journal.entry_state(e.index) is None]
        t0 = self.state.clock.monotonic()
        self.state.emit(
            EventType.STAGE_STARTED, stage=number, start_time=start_time, entries=[e.index for e in todo]
        )
        prepared: List[Prepared] = []
        for entry in todo:
            if entry.on_host:
                continue  # the host runs it (or nobody: reported skipped)
            item = self.entries.prepare(entry)
            if item is None:
                if self.entries.failure is not None:
                    return "failed"
                continue
            prepared.append(item)
        on_host = [e for e in todo if e.on_host]
        results, _answers = await asyncio.gather(
            self.entries.launch_all(prepared, scheduled=None), self.on_host(on_host, None)
        )  # the stage ends when the host answered for its on_host entries too
        self.state.check_stop()  # raises when the engine is stopping
        if self.entries.failure is not None:
            return "failed"
        requesters = [
            index
            for index, result in results.items()
            if result is not None
            and (
                result.exit_code == REBOOT_EXIT_CODE
                or os.path.exists(os.path.join(self.state.workdirs[index], REBOOT_FILE))
            )
        ]
        self.state.emit(
            EventType.STAGE_FINISHED,
            stage=number,
            start_time=start_time,
            duration=self.state.clock.monotonic() - t0,
        )
        if not requesters:
            return "ok"
        self.state.journal.reboot = {"stage": number, "requesters": requesters}
        await self.state.persist()  # on disk before the reboot, or the stage would run again
        self.state.emit(
            EventType.REBOOT_REQUESTED,
            stage=number,
            requesters=requesters,
            command=self.state.config.reboot_command,
        )
        log.warning("rebooting: %s", self.state.config.reboot_command)
        await self.state.processes.reboot(self.state.config.reboot_command, self.state.env)
        return "reboot"

    async def on_host(self, entries: List[ScheduleEntry], scheduled: Optional[float]) -> None:
        """Have the host run on_host entries (a stage's, or those due at host UTC ``scheduled``)
        and wait for its answers; nothing without a host."""
        ask = self.state.config.host_ask
        if entries and ask is not None:
            await run_on_host(self.state, ask, entries, scheduled)
