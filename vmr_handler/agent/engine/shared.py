"""What the engine's parts share: one :class:`EngineState`, passed to each part by name.

The engine (:mod:`vmr_handler.agent.engine.engine`) makes one and gives it to every part
(:class:`~vmr_handler.agent.engine.entries.EntryLauncher`,
:class:`~vmr_handler.agent.engine.stages.StageRunner`,
:class:`~vmr_handler.agent.engine._stageplay.StagePlay`,
:class:`~vmr_handler.agent.engine.holds.InitialHolds`,
:class:`~vmr_handler.agent.engine.arming.PositiveTimers`). A part reads the schedule, the
journal, the clock... here at each use and keeps no copy of them. Only the engine replaces the
schedule and adds working dirs (a batch appended); the engine and the part that plays a phase
set ``phase``. The parts report, wake the engine, save the journal and check for a stop
through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

from vmr_handler.agent.engine.config import EngineConfig
from vmr_handler.agent.engine.placement import DataPlacement
from vmr_handler.agent.engine.ports import Processes
from vmr_handler.agent.machine.bundle import child_environment
from vmr_handler.agent.state.journal import Journal, SyncSoon
from vmr_handler.agent.state.reporthold import ReportHold
from vmr_handler.core.clock import Clock
from vmr_handler.core.events import Event, EventFactory, EventType
from vmr_handler.core.schedule.commands import find_shell, working_dirs
from vmr_handler.core.schedule.model import Schedule

log = logging.getLogger("vmr_handler.agent.engine.engine")


class _Stopped(Exception):
    """Raised inside the engine when a stop was requested (:meth:`EngineState.check_stop`);
    :func:`stops_here` ends it."""


@contextlib.contextmanager
def stops_here() -> Iterator[None]:
    """Ends the block quietly where a part found the engine stopping (:meth:`EngineState.check_stop`)."""
    with contextlib.suppress(_Stopped):
        yield


@dataclass
class EngineState:
    """The state every part of the engine reads, and the few things they all do through it.

    Args:
        schedule: the schedule played now, appended batches included. The engine replaces it
            when a batch is appended: a part reads it here each time, never keeps it.
        config: how and where the engine works.
        journal: this schedule's journal (progress that outlives a crash).
        clock: the reference clock.
        processes: the process port.
        reports: every event goes there (held and retried when it cannot be written).

    Attributes:
        phase: where the engine is (``starting``, ``placing data``, ``break``, ``stages``,
            ``configured``, ``positive``, ``complete``, ``failed``...), for status; set by the
            engine and by the part that plays the phase.
        stages: start times of the schedule's own negative stages, ascending (appended stages
            are in the journal).
        workdirs: working dir per entry index (the engine adds the appended entries').
        data: where entries' data lands (:class:`~vmr_handler.agent.engine.placement.DataPlacement`).
        shell: the shell that runs command lines; ``env``: the entries' environment.
        events: makes the events (stamped on the clock).
        syncer: saves the journal soon, or durably.
        stop_requested: set once a stop was requested (``stop_reason`` says why).
        woken: set to make the engine's main loop look again (a RESUME, an entry's end...).
    """

    schedule: Schedule
    config: EngineConfig
    journal: Journal
    clock: Clock
    processes: Processes
    reports: ReportHold
    phase: str = "starting"
    stages: Tuple[float, ...] = field(init=False)
    workdirs: Dict[int, str] = field(init=False)
    data: DataPlacement = field(init=False)
    shell: str = field(init=False)
    env: Optional[Dict[str, str]] = field(init=False)
    events: EventFactory = field(init=False)
    syncer: SyncSoon = field(init=False)
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    stop_reason: str = field(default="", init=False)
    woken: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        config = self.config
        self.stages = self.schedule.stage_times()
        self.workdirs = working_dirs(list(self.schedule.entries), config.launch_dir)
        self.shell = config.shell or find_shell()
        self.env = child_environment(config.env)
        self.events = EventFactory(self.clock.time)
        self.data = DataPlacement(
            workdirs=self.workdirs,
            resources_dir=config.resources_dir,
            emit=self.emit,
            journal=self.journal,
            now=self.clock.time,
        )
        self.syncer = SyncSoon(self.journal)

    # ------------------------------------------------------------------ reporting, the journal
    def emit(self, type_: EventType, **data: Any) -> Event:
        """Make an event and hand it to the reports (held and retried when it fails; never raises)."""
        event = self.events.make(type_, **data)
        self.reports(event)
        return event

    def journal_changed(self) -> None:
        """Entry states were appended to the journal: it is fsynced soon."""
        self.syncer.changed()

    async def persist(self) -> None:
        """Snapshot the journal, waiting out a full disk (raises on a stop)."""
        await self.syncer.save_durably(lambda s: self.sleep_until(self.clock.time() + s))

    # ------------------------------------------------------------------ waking, stopping
    def wake(self) -> None:
        """Make the engine's main loop look again."""
        self.woken.set()

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self.stop_requested.is_set()

    def request_stop(self, reason: str) -> bool:
        """Record a stop and wake the engine; False when one was requested before."""
        if self.stop_requested.is_set():
            return False
        log.info("stopping: %s", reason)
        self.stop_reason = reason
        self.stop_requested.set()
        self.woken.set()
        return True

    def check_stop(self) -> None:
        """Raise when a stop was requested (the engine's :func:`stops_here` ends the play)."""
        if self.stop_requested.is_set():
            raise _Stopped()

    async def sleep_until(self, utc: float) -> None:
        """Sleep until reference UTC ``utc`` unless stopped (then raise)."""
        while True:
            self.check_stop()
            if self.clock.time() >= utc:
                return
            self.woken.clear()
            await self.clock.wait(self.woken, utc)

    async def wait_woken(self) -> None:
        """Wait until the engine is woken; raise when it is stopping."""
        self.woken.clear()
        await self.woken.wait()
        self.check_stop()
