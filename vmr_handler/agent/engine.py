"""The engine: plays a schedule's plan on a clock (SPEC sections 4-5, issue 3 section 4).

Phases, in order, each resumable from the journal:

1. ``-inf`` pauses/breaks (before anything starts).
2. Negative stages in ascending order: prepare every entry of the stage (data drops), start
   them all together, wait until all have ended; reboot requests are honoured after the
   stage (exit code 10 or a ``reboot`` file).
3. *Configured* (time 0). In local mode the experiment start time is configured + start
   buffer, an absolute UTC instant journaled once and never changed.
4. Positive time: every positive entry fires from a timer at ``start + fire_at`` on the
   engine's clock (``Clock.call_at``: ``loop.call_at`` on the monotonic clock for the
   system clock; no polling); entries with the same instant fire in one callback. A RESUME
   recomputes the plan (pure :func:`~vmr_handler.core.timeline.build_plan`) and re-arms the
   timers.

Inputs: RESUME (:meth:`Engine.resume`), stop (:meth:`Engine.stop`). Outputs: events to a
sink callable. The engine never knows which transport carries them.

Parts are passed in (:mod:`vmr_handler.agent.ports`): the clock (a
:class:`~vmr_handler.core.clock.FakeClock` in tests), the process port, the journal and the
sink. Running entries is :mod:`vmr_handler.agent.entries`, the stages and reboots
:mod:`vmr_handler.agent.stages`, the ``-inf`` holds :mod:`vmr_handler.agent.holds`, and the
positive-time timers :mod:`vmr_handler.agent.arming`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set

from vmr_handler import __version__
from vmr_handler.agent.arming import PositiveTimers
from vmr_handler.agent.bundle import child_environment
from vmr_handler.agent.entries import EntryLauncher, LaunchContext
from vmr_handler.agent.executor import SystemProcesses
from vmr_handler.agent.holds import InitialHolds
from vmr_handler.agent.journal import Journal, SyncSoon
from vmr_handler.agent.placement import DataPlacement
from vmr_handler.agent.ports import Processes
from vmr_handler.agent.reminders import remind
from vmr_handler.agent.reporthold import HoldLimits, ReportHold, hold_of
from vmr_handler.agent.stages import StageRunner
from vmr_handler.core.clock import Clock, SystemClock
from vmr_handler.core.errors import JournalError
from vmr_handler.core.events import Event, EventFactory, EventType
from vmr_handler.core.schedule.commands import find_shell, working_dirs
from vmr_handler.core.schedule.model import EntryKind, Schedule, ScheduleEntry
from vmr_handler.core.timeline import build_plan

log = logging.getLogger(__name__)

#: Exit codes of ``Engine.run`` (and of ``vmr-handler run``).
EXIT_OK = 0
EXIT_FAILED = 1

DEFAULT_REBOOT_COMMAND = "systemctl reboot || reboot"
#: Seconds a stopping engine still waits for held reports to be written (issue 16, item 5).
STOP_GRACE = 5.0


@dataclass
class EngineConfig:
    """Where and how the engine works.

    Attributes:
        launch_dir: root of the per-entry working dirs (reference ``/var/launch``).
        state_dir: journal and control socket directory.
        resources_dir: where ``filename`` drops are read from.
        start_buffer: seconds between *configured* and the experiment start (local mode).
        local_start: see below.
        reboot_command: shell command run when a negative stage requests a reboot.
        env: environment for entries (None = the agent's own).
        shell: the shell that runs command lines (None = bash when the machine has it, else
            ``/bin/sh``; SPEC section 5).
        report_hold: how many reports a failing sink may leave held in memory before entries
            wait (:class:`~vmr_handler.agent.reporthold.HoldLimits`; issue 16).
    """

    launch_dir: str = "/var/launch"
    state_dir: str = "/var/lib/vmr-handler"
    resources_dir: str = "."
    start_buffer: float = 60.0
    reboot_command: str = DEFAULT_REBOOT_COMMAND
    env: Optional[Dict[str, str]] = None
    shell: Optional[str] = None
    #: True: start = configured + start_buffer (local mode). False: wait for the host's
    #: experiment start time (:meth:`Engine.set_start_time`).
    local_start: bool = True
    report_hold: HoldLimits = field(default_factory=HoldLimits)


def announce(emit: Callable[..., Event], schedule: Schedule, journal: Journal) -> None:
    """The engine's first events: agent started, schedule loaded, its warnings, a journal reset,
    the on_host entries this agent does not run."""
    emit(
        EventType.AGENT_STARTED,
        version=__version__,
        pid=os.getpid(),
        resumed_from_journal=journal.resumed,
    )
    emit(
        EventType.SCHEDULE_LOADED,
        digest=schedule.digest,
        format=schedule.source_format,
        entries=len(schedule.entries),
        stages=list(schedule.stage_times()),
    )
    for warning in schedule.warnings:
        emit(EventType.SCHEDULE_WARNING, details=warning)
    if journal.reset_from:
        emit(
            EventType.JOURNAL_RESET,
            moved_to=journal.reset_from,
            details="journal belonged to another schedule; starting fresh",
        )
    for entry in schedule.entries:
        if entry.on_host:
            emit(
                EventType.ENTRY_SKIPPED,
                index=entry.index,
                executable=entry.executable,
                start_time=entry.start_time,
                details="on_host entry: run by the host controller",
            )


def open_engine(
    schedule: Schedule,
    config: EngineConfig,
    sink: Callable[[Event], None] | ReportHold,
    clock: Optional[SystemClock] = None,
) -> Engine:
    """An :class:`Engine` on this machine's parts: the system clock (or ``clock``, which the
    connected agent corrects to the host's), real processes, the journal in ``config.state_dir``.

    Raises:
        JournalError: the state directory cannot be used.
    """
    journal = Journal(config.state_dir, schedule.digest)
    return Engine(schedule, config, sink, clock or SystemClock(), SystemProcesses(), journal)


class _Stopped(Exception):
    """Raised inside the engine when a stop was requested."""


class Engine:
    """Drives one schedule on this machine.

    Args:
        schedule: the validated schedule.
        config: :class:`EngineConfig`.
        sink: receives every :class:`~vmr_handler.core.events.Event`; one that fails (OSError,
            JournalError) is held and retried (a :class:`~vmr_handler.agent.reporthold.ReportHold`).
        clock: the reference clock (:class:`~vmr_handler.core.clock.SystemClock`, or a
            :class:`~vmr_handler.core.clock.FakeClock` in tests).
        processes: the process port (:class:`~vmr_handler.agent.executor.SystemProcesses`).
        journal: this schedule's journal (:func:`open_engine` opens it in ``config.state_dir``).

    Construct it inside the running event loop. In local mode the experiment start time is
    ``configured_at + config.start_buffer``.

    Raises (from :meth:`run`):
        JournalError: the state directory cannot be written.
    """

    def __init__(
        self,
        schedule: Schedule,
        config: EngineConfig,
        sink: Callable[[Event], None] | ReportHold,
        clock: Clock,
        processes: Processes,
        journal: Journal,
    ) -> None:
        self.schedule = schedule
        self.config = config
        self.clock = clock
        self.reports = hold_of(sink, clock, config.report_hold)
        self.events = EventFactory(self.clock.time)
        self.journal = journal
        self.processes = processes
        self.workdirs = working_dirs(list(schedule.entries), config.launch_dir)
        self.shell = config.shell or find_shell()
        self._env = child_environment(config.env)
        self.data = DataPlacement(self.workdirs, config.resources_dir, self.emit, self.journal.preloaded)
        self.stages = schedule.stage_times()
        self.phase = "starting"
        self.current_stage: Optional[int] = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # set on RESUME / entry end / failure
        self._stop_reason = ""
        self._syncer = SyncSoon(self.journal)
        #: Set once the reference clock can be trusted (at once in local mode; after the first
        #: clock sync with the host otherwise): positive time waits for it.
        self.clock_ready = asyncio.Event()
        if config.local_start:
            self.clock_ready.set()
        self.entries = EntryLauncher(
            LaunchContext(
                self.journal,
                self.clock,
                self.processes,
                self.emit,
                self._syncer.changed,
                self._wake.set,
                self.workdirs,
                self.data,
                self.shell,
                self._env,
                config.local_start,
                self.reports.room,
            )
        )
        self.stage_runner = StageRunner(
            self.entries,
            self.journal,
            self.clock,
            self.processes,
            self.emit,
            self.workdirs,
            config.reboot_command,
            self._persist,
        )
        self.holds = InitialHolds(
            schedule,
            self.journal,
            self.clock,
            self.emit,
            self._set_phase,
            self._wait_woken,
            self._sleep_until_utc,
            self._persist,
        )
        self.timers = PositiveTimers(
            schedule, self.journal, self.clock, self.emit, self._fire_group, self._wake.set
        )
        self._tasks: Set[asyncio.Task[Any]] = set()

    @property
    def _failure(self) -> Optional[str]:
        return self.entries.failure

    # ------------------------------------------------------------------ reporting
    def emit(self, type_: EventType, **data: Any) -> Event:
        """Make an event and hand it to the sink (held and retried when it fails; never raises)."""
        event = self.events.make(type_, **data)
        self.reports(event)
        return event

    async def _persist(self) -> None:
        """Snapshot the journal, waiting out a full disk (raises _Stopped on a stop; issue 16)."""
        await self._syncer.save_durably(lambda s: self._sleep_until_utc(self.clock.time() + s))

    # ------------------------------------------------------------------ inputs
    def resume(
        self, at: Optional[float] = None, resume_id: Optional[str] = None, entry: Optional[int] = None
    ) -> Dict[str, Any]:
        """Handle a RESUME (SPEC section 4). Returns ``{"at", "ended_break", "ignored"}``.

        Args:
            at: experiment seconds the RESUME is stamped with (the host's experiment time);
                default now on the engine's clock, or ``-inf`` before the start time is known.
            resume_id: the host's id of this RESUME: one already applied is not applied again
                (its first outcome is returned, with ``"repeated": True``).
            entry: index of the stored RESUME entry this RESUME comes from, if any.
        """
        if resume_id is not None:
            first = self.journal.applied_resume(resume_id)
            if first is not None:
                return {**first, "repeated": True}
        start = self.journal.start_time
        if at is None:
            at = -math.inf if start is None else self.clock.time() - start
        self.journal.add_resume(at)
        plan = build_plan(self.schedule.entries, self.journal.resumes)
        ended = plan.resumes[-1].ended_break
        outcome = {"at": at, "ended_break": ended, "ignored": ended is None}
        if resume_id is not None:
            self.journal.record_resume_id(resume_id, dict(outcome))
        self._syncer.save_soon()  # the RESUME and its id in one atomic write (or kept, retried)
        origin = {} if entry is None else {"index": entry, "origin": "schedule entry"}
        self.emit(
            EventType.RESUME_RECEIVED,
            **origin,
            **outcome,
            status="success",
            details=f"ended break at entry {ended}" if ended is not None else "no active break: ignored",
        )
        if self.timers.plan is not None:
            self.timers.arm(plan)
        self._wake.set()
        return outcome

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the engine to stop: timers cancelled, process trees terminated, journal flushed."""
        if not self._stop.is_set():
            log.info("stopping: %s", reason)
            self._stop_reason = reason
            self._stop.set()
            self._wake.set()
            self.reports.stop_waiting()
            task = asyncio.ensure_future(self.entries.kill_running())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ status
    def status(self) -> Dict[str, Any]:
        """Where the engine is, as a JSON-safe dict (``vmr-handler status``; :func:`engine_status`)."""
        return engine_status(self)

    # ------------------------------------------------------------------ main
    async def run(self) -> int:
        """Play the schedule. Returns :data:`EXIT_OK` or :data:`EXIT_FAILED` (reports all written).

        Returns EXIT_OK also after a reboot request was carried out and after a stop.
        """
        done = asyncio.Event()
        reminders = asyncio.ensure_future(remind(lambda: waiting_status(self), self.clock, done))
        try:
            rc = await self._play()
        finally:
            done.set()
            await reminders
        await self.reports.written(self._stop, STOP_GRACE)  # held reports too (issue 16)
        return rc

    async def _play(self) -> int:
        announce(self.emit, self.schedule, self.journal)
        self._recover()
        try:
            await self._persist()
            await self._preload()
            self._stored_resumes()
            await self.holds.run()
            outcome = await self._run_stages()
            if outcome != "ok":
                return EXIT_OK if outcome == "reboot" else self._fail_exit()
            await self._configured()
            await self._positive_phase()
            await self._persist()  # complete only once the journal says so (a full disk waits)
        except _Stopped:
            pass
        finally:
            await self._shutdown()
        if self._failure is not None:
            return self._fail_exit()
        if self._stop.is_set():
            self.emit(EventType.AGENT_STOPPED, reason=self._stop_reason)
            return EXIT_OK
        self.phase = "complete"
        self.emit(EventType.SCHEDULE_COMPLETE, status="success")
        return EXIT_OK

    def _fail_exit(self) -> int:
        self.phase = "failed"
        return EXIT_FAILED

    def _recover(self) -> None:
        """Deal with what a crash or reboot left: interrupted entries, reboot requesters."""
        self.entries.recover(list(self.schedule.entries))
        self.stage_runner.recover()

    def _set_phase(self, phase: str) -> None:
        self.phase = phase

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Stopped()

    async def _sleep_until_utc(self, utc: float) -> None:
        """Sleep until reference UTC ``utc`` unless stopped (then raise _Stopped)."""
        while True:
            self._check_stop()
            if self.clock.time() >= utc:
                return
            self._wake.clear()
            await self.clock.wait(self._wake, utc)

    async def _wait_woken(self) -> None:
        self._wake.clear()
        await self._wake.wait()
        self._check_stop()

    # ------------------------------------------------------------------ phase 0: data, stored RESUMEs
    async def _preload(self) -> None:
        """Place every entry's data before anything runs (:mod:`vmr_handler.agent.placement`)."""
        self.phase = "placing data"
        if await self.data.preload(
            list(self.schedule.entries), lambda i: self.journal.entry_state(i) is not None
        ):
            await self._persist()

    def _stored_resumes(self) -> None:
        """Apply the schedule's stored RESUME entries (``firewheel vm resume``; SPEC section 3), once."""
        for entry in self.schedule.entries:
            if entry.kind is EntryKind.RESUME:
                self.resume(resume_id=f"schedule-entry-{entry.index}", entry=entry.index)

    # ------------------------------------------------------------------ phase 1: -inf holds
    # ------------------------------------------------------------------ phase 2: stages
    async def _run_stages(self) -> str:
        """Run every unfinished stage. Returns ``ok``, ``reboot`` or ``failed``."""
        by_stage: Dict[float, List[ScheduleEntry]] = {}
        for entry in self.schedule.entries:
            if entry.kind is EntryKind.NEGATIVE:
                by_stage.setdefault(entry.start_time, []).append(entry)
        for number, start_time in enumerate(self.stages):
            if number in self.journal.stages_done:
                continue
            await self.reports.wait_room()  # while reports are held, no new stage starts
            self._check_stop()
            self.phase = "stages"
            self.current_stage = number
            outcome = await self.stage_runner.run(number, start_time, by_stage[start_time], self._check_stop)
            if outcome != "ok":
                return outcome
            self.journal.mark_stage_done(number)
            await self._persist()
        self.current_stage = None
        return "ok"

    # ------------------------------------------------------------------ phase 3: barrier
    async def _configured(self) -> None:
        if self.journal.configured_at is None:
            self.journal.configured_at = self.clock.time()
            await self._persist()
        self.phase = "configured"
        configured_at = self.journal.configured_at
        assert configured_at is not None
        self.emit(EventType.CONFIGURED, at=configured_at, stages=len(self.stages))
        if self.journal.start_time is not None and self.journal.resumed:
            self.emit(
                EventType.START_TIME_SET,
                start_time=self.journal.start_time,
                source="journal",
                details="experiment start time kept from before the restart",
            )
        elif self.journal.start_time is None and self.config.local_start:
            self.journal.start_time = configured_at + self.config.start_buffer
            await self._persist()
            self.emit(
                EventType.START_TIME_SET,
                start_time=self.journal.start_time,
                source="local",
                buffer=self.config.start_buffer,
                details="experiment start = configured + start buffer",
            )
        self.phase = "configured, waiting at the barrier"
        while self.journal.start_time is None or not self.clock_ready.is_set():
            await self._wait_woken()  # set_start_time() / set_clock_ready() wake us

    def set_clock_ready(self) -> None:
        """The reference clock is synchronised: positive time may be timed on it."""
        self.clock_ready.set()
        self._wake.set()

    def set_start_time(self, start: float) -> bool:
        """The host's experiment start time (reference UTC seconds) arrived.

        Returns False (and reports nothing new) when it was already set to the same value;
        a different value is refused (the start time never changes) with an error logged.
        """
        current = self.journal.start_time
        if current is not None:
            if current != start:
                log.error("refused a different experiment start time %.6f (already %.6f)", start, current)
            return False
        self.journal.start_time = start
        self._syncer.save_soon()  # a full disk: kept in memory, retried (the host sends it again)
        self.emit(
            EventType.START_TIME_SET,
            start_time=start,
            source="host",
            details="experiment start time from the host barrier",
        )
        self._wake.set()
        return True

    def clock_changed(self) -> None:
        """The reference-clock offset changed: re-arm positive-time timers on the new clock."""
        self.events.clock_changed()
        if self.timers.plan is not None:
            self.timers.arm(self.timers.plan)

    # ------------------------------------------------------------------ phase 4: positive time
    async def _positive_phase(self) -> None:
        start = self.journal.start_time
        assert start is not None
        self.phase = "waiting for start"
        self.timers.arm(build_plan(self.schedule.entries, self.journal.resumes))
        started_reported = False
        while True:
            self._check_stop()
            if self._failure is not None:
                return
            if not started_reported and self.clock.time() >= start:
                started_reported = True
                self.phase = "positive"
                self.emit(EventType.EXPERIMENT_STARTED, start_time=start, late=self.clock.time() - start)
            plan = self.timers.plan
            assert plan is not None
            idle = not self.timers.pending and not self.entries.running and not self._tasks
            if started_reported and idle and plan.blocked_by is None:
                return
            self._wake.clear()
            await self.clock.wait(self._wake, None if started_reported else start)

    def _fire_group(self, fire_at: float, entries: List[ScheduleEntry]) -> None:
        """Timer callback: fire every entry scheduled at experiment time ``fire_at``."""
        if self._stop.is_set() or self._failure is not None:
            return
        start = self.journal.start_time
        assert start is not None
        prepared = self.entries.prepare_due(entries)
        if not prepared:
            self._wake.set()
            return
        launch = self.entries.launch_all(prepared, start + fire_at)
        task = asyncio.ensure_future(self.reports.when_room(self._stop, launch))
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("firing entries at %s failed: %r", fire_at, t.exception())
                self.entries.failure = f"internal error firing entries at {fire_at}: {t.exception()!r}"
            self._wake.set()

        task.add_done_callback(done)

    # ------------------------------------------------------------------ shutdown
    async def _shutdown(self) -> None:
        self.data.stop()
        self.timers.cancel()
        await self.entries.kill_running()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._syncer.cancel()
        with contextlib.suppress(JournalError):
            self.journal.save()
        with contextlib.suppress(JournalError, OSError):
            self.journal.close()


def waiting_status(engine: Engine) -> Dict[str, Any]:
    """What the reminders (:mod:`vmr_handler.agent.reminders`) look at once a second: the phase,
    when it was configured, the break holding it. Cheap: never builds a plan (a schedule of
    100 000 entries would cost ~0.1 s a second at the barrier)."""
    start = engine.journal.start_time
    plan = engine.timers.plan
    hold = engine.holds.current
    if hold is None and plan is not None and plan.blocked_by is not None and start is not None:
        hold = engine.timers.active_hold(plan, engine.clock.time() - start)  # only with a break ahead
    held = hold["index"] if hold is not None and hold.get("kind") == "break" else None
    return {"phase": engine.phase, "configured_at": engine.journal.configured_at, "blocked_by_break": held}


def engine_status(engine: Engine) -> Dict[str, Any]:
    """What :meth:`Engine.status` shows: phase, stages, start time, holds, what runs next and
    now, a failure, reports held because they cannot be written (issue 16)."""
    now = engine.clock.time()
    journal, timers = engine.journal, engine.timers
    start = journal.start_time
    plan = timers.plan or build_plan(engine.schedule.entries, journal.resumes)
    hold = engine.holds.current or timers.active_hold(plan, None if start is None else now - start)
    # a break holds the VM only once its time has come; before, it is the next break (issue 13)
    held = hold["index"] if hold is not None and hold.get("kind") == "break" else None
    return {
        "version": __version__,
        "phase": engine.phase,
        "stage": engine.current_stage,
        "stages": len(engine.stages),
        "stages_done": journal.stages_done,
        "configured_at": journal.configured_at,
        "start_time": start,
        "experiment_time": None if start is None else now - start,
        "active_pause": hold,
        "blocked_by_break": held,
        "next_break": plan.blocked_by if held is None else None,
        "resumes": journal.resumes,
        "next_entries": [] if start is None else timers.upcoming(plan, start, now),
        "running": engine.entries.status(),
        "failure": engine.entries.failure,
        "held_reports": len(engine.reports),
    }
