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
from typing import Awaitable, Callable, Dict, List, Optional

from vmr_handler.agent.engine.entries import Emit, EntryLauncher, Prepared
from vmr_handler.agent.engine.hostcalls import HostAsk, run_on_host
from vmr_handler.agent.engine.ports import Processes
from vmr_handler.agent.machine.executor import REBOOT_EXIT_CODE, REBOOT_FILE
from vmr_handler.agent.state.journal import Journal
from vmr_handler.core.clock import Clock
from vmr_handler.core.events import EventType
from vmr_handler.core.schedule.model import ScheduleEntry

log = logging.getLogger("vmr_handler.agent.engine.engine")


@dataclass
class StageRunner:
    """Runs stages through the engine's :class:`~vmr_handler.agent.engine.entries.EntryLauncher`.

    Args:
        entries: the launcher (prepare, start together, the VM's failure).
        journal: the engine's journal (reboot requests).
        clock: durations of stages.
        processes: runs the reboot command.
        emit: ``emit(EventType, **data)``.
        workdirs: working dir per entry index (``reboot`` files).
        reboot_command: the shell command that reboots the machine.
        persist: saves the journal durably (waits out a full disk; raises when the engine stops).
        host_ask: has the host run a stage's on_host entries (:mod:`vmr_handler.agent.engine.hostcalls`);
            None: they are not run (reported skipped).
    """

    entries: EntryLauncher
    journal: Journal
    clock: Clock
    processes: Processes
    emit: Emit
    workdirs: Dict[int, str]
    reboot_command: str
    persist: Callable[[], Awaitable[None]]
    host_ask: Optional[HostAsk] = None

    def recover(self) -> None:
        """After a reboot the requesters run again: their ``reboot`` files and journal states go."""
        reboot = self.journal.reboot
        if reboot:
            for index in reboot.get("requesters", []):
                path = os.path.join(self.workdirs[index], REBOOT_FILE)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self.journal.forget(index)
            self.journal.reboot = None

    async def run(
        self, number: int, start_time: float, entries: List[ScheduleEntry], check_stop: Callable[[], None]
    ) -> str:
        """Run one stage's unfinished entries together; carry out a reboot request.

        Args:
            number: the stage's number (0 = the earliest negative start_time).
            start_time: the stage's (negative) start_time.
            entries: every entry of the stage (finished ones are skipped).
            check_stop: raises when the engine is stopping (called after the entries ended).

        Returns:
            ``ok``, ``reboot`` (the reboot command was run) or ``failed`` (the VM failed).
        """
        todo = [e for e in entries if self.journal.entry_state(e.index) is None]
        t0 = self.clock.monotonic()
        self.emit(
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
        check_stop()
        if self.entries.failure is not None:
            return "failed"
        requesters = [
            index
            for index, result in results.items()
            if result is not None
            and (
                result.exit_code == REBOOT_EXIT_CODE
                or os.path.exists(os.path.join(self.workdirs[index], REBOOT_FILE))
            )
        ]
        self.emit(
            EventType.STAGE_FINISHED,
            stage=number,
            start_time=start_time,
            duration=self.clock.monotonic() - t0,
        )
        if not requesters:
            return "ok"
        self.journal.reboot = {"stage": number, "requesters": requesters}
        await self.persist()  # on disk before the reboot, or the stage would run again
        self.emit(
            EventType.REBOOT_REQUESTED,
            stage=number,
            requesters=requesters,
            command=self.reboot_command,
        )
        log.warning("rebooting: %s", self.reboot_command)
        await self.processes.reboot(self.reboot_command, self.entries.ctx.env)
        return "reboot"

    async def on_host(self, entries: List[ScheduleEntry], scheduled: Optional[float]) -> None:
        """Have the host run on_host entries (a stage's, or those due at host UTC ``scheduled``)
        and wait for its answers; nothing without a host."""
        if entries and self.host_ask is not None:
            ctx = self.entries.ctx
            await run_on_host(entries, scheduled, self.host_ask, ctx.journal, ctx.journal_changed, ctx.wake)
