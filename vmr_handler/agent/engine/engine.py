"""The engine: plays a schedule's plan on a clock (SPEC sections 4-5).

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

Inputs: RESUME (:meth:`Engine.resume`), appended batches (:meth:`Engine.append`), the host's
start time and clock (:meth:`Engine.set_start_time`, :meth:`Engine.set_clock_ready`,
:meth:`Engine.clock_changed`), stop (:meth:`Engine.stop`). Outputs: events to a sink callable
and :meth:`Engine.status`. The engine never knows which transport carries them.

The machine's parts are passed in (:mod:`vmr_handler.agent.engine.ports`): the clock (a
:class:`~vmr_handler.core.clock.FakeClock` in tests), the process port, the journal and the
sink. The engine puts them in one :class:`~vmr_handler.agent.engine.shared.EngineState` with
the schedule and its phase, and gives that to each of its parts by name: running entries
(:mod:`vmr_handler.agent.engine.entries`), the stages and reboots
(:mod:`vmr_handler.agent.engine.stages`, in order by :mod:`vmr_handler.agent.engine._stageplay`),
the ``-inf`` holds (:mod:`vmr_handler.agent.engine.holds`) and the positive-time timers
(:mod:`vmr_handler.agent.engine.arming`). Only the engine changes the shared schedule: a RESUME
and an appended batch are applied here, and re-arm the parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from vmr_handler import __version__
from vmr_handler.agent.engine._reminders import remind
from vmr_handler.agent.engine._stageplay import StagePlay
from vmr_handler.agent.engine.appends import answered, keep_appended, restore, resume_entries
from vmr_handler.agent.engine.arming import PositiveTimers
from vmr_handler.agent.engine.config import DEFAULT_REBOOT_COMMAND, EngineConfig
from vmr_handler.agent.engine.entries import EntryLauncher, Prepared
from vmr_handler.agent.engine.holds import InitialHolds
from vmr_handler.agent.engine.ports import Processes
from vmr_handler.agent.engine.shared import EngineState, stops_here
from vmr_handler.agent.engine.stages import StageRunner
from vmr_handler.agent.engine.status import (
    announce,
    append_answer,
    completion,
    entry_counts,
    skip_host_entries,
)
from vmr_handler.agent.machine.executor import SystemProcesses
from vmr_handler.agent.state.journal import Journal
from vmr_handler.agent.state.reporthold import ReportHold, hold_of
from vmr_handler.core.clock import Clock, SystemClock
from vmr_handler.core.errors import AppendRefused, JournalError
from vmr_handler.core.events import Event, EventType
from vmr_handler.core.schedule.appended import extended
from vmr_handler.core.schedule.commands import working_dirs
from vmr_handler.core.schedule.model import EntryKind, Schedule, ScheduleEntry
from vmr_handler.core.timeline import Plan, build_plan

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_REBOOT_COMMAND", "EXIT_FAILED", "EXIT_OK", "Engine", "EngineConfig", "open_engine"]

#: Exit codes of ``Engine.run`` (and of ``vmr-handler run``).
EXIT_OK = 0
EXIT_FAILED = 1

#: Seconds a stopping engine still waits for held reports to be written.
STOP_GRACE = 5.0


def open_engine(
    schedule: Schedule,
    config: EngineConfig,
    sink: Callable[[Event], None] | ReportHold,
    clock: Optional[SystemClock] = None,
    allowed_classes: Optional[List[str]] = None,
) -> Engine:
    """An :class:`Engine` on this machine's parts: the system clock (or ``clock``, which the
    connected agent corrects to the host's), real processes, the journal in ``config.state_dir``,
    the schedule with the batches appended to it before a restart (``allowed_classes``: what
    the restricted unpickler admits when it loads them again).

    Raises:
        JournalError: the state directory cannot be used, or an appended batch is lost.
    """
    journal = Journal(config.state_dir, schedule.digest)
    schedule = restore(schedule, journal, config.state_dir, allowed_classes)
    return Engine(
        schedule=schedule,
        config=config,
        sink=sink,
        clock=clock or SystemClock(),
        processes=SystemProcesses(),
        journal=journal,
    )


class Engine:
    """Drives one schedule on this machine.

    Args:
        schedule: the validated schedule.
        config: :class:`EngineConfig`.
        sink: receives every :class:`~vmr_handler.core.events.Event`; one that fails (OSError,
            JournalError) is held and retried (a :class:`~vmr_handler.agent.state.reporthold.ReportHold`).
        clock: the reference clock (:class:`~vmr_handler.core.clock.SystemClock`, or a
            :class:`~vmr_handler.core.clock.FakeClock` in tests).
        processes: the process port (:class:`~vmr_handler.agent.machine.executor.SystemProcesses`).
        journal: this schedule's journal (:func:`open_engine` opens it in ``config.state_dir``).

    Construct it inside the running event loop, every argument by keyword. In local mode the
    experiment start time is ``configured_at + config.start_buffer``.

    Raises (from :meth:`run`):
        JournalError: the state directory cannot be written.
    """

    def __init__(
        self,
        *,
        schedule: Schedule,
        config: EngineConfig,
        sink: Callable[[Event], None] | ReportHold,
        clock: Clock,
        processes: Processes,
        journal: Journal,
    ) -> None:
        self.config = config
        self.state = state = EngineState(
            schedule=schedule,
            config=config,
            journal=journal,
            clock=clock,
            processes=processes,
            reports=hold_of(sink, clock, config.report_hold),
        )
        #: Set once the reference clock can be trusted (at once in local mode; after the first
        #: clock sync with the host otherwise): positive time waits for it.
        self.clock_ready = asyncio.Event()
        if config.local_start:
            self.clock_ready.set()
        self.entries = EntryLauncher(state)
        self.stage_runner = StageRunner(state, self.entries)
        self.holds = InitialHolds(state)
        self.timers = PositiveTimers(state, fire=self._fire_group)
        self.stageplay = StagePlay(state, self.stage_runner, stop=self.stop)
        self._tasks: Set[asyncio.Task[Any]] = set()
        self._started_reported = False
        self._completed = False

    # ------------------------------------------------------------------ what it shares with its parts
    @property
    def schedule(self) -> Schedule:
        """The schedule played now (appended entries included)."""
        return self.state.schedule

    @property
    def phase(self) -> str:
        """Where the engine is (``status``'s ``phase``)."""
        return self.state.phase

    @property
    def journal(self) -> Journal:
        """This schedule's journal."""
        return self.state.journal

    @property
    def clock(self) -> Clock:
        """The reference clock."""
        return self.state.clock

    @property
    def reports(self) -> ReportHold:
        """Where every event goes (held while it cannot be written)."""
        return self.state.reports

    @property
    def current_stage(self) -> Optional[int]:
        """The number of the stage running now, or None."""
        return self.stageplay.current

    @property
    def _failure(self) -> Optional[str]:
        return self.entries.failure

    @property
    def stages(self) -> Tuple[float, ...]:
        """Start times of the schedule's own negative stages."""
        return self.state.stages

    # ------------------------------------------------------------------ reporting
    def emit(self, type_: EventType, **data: Any) -> Event:
        """Make an event and hand it to the sink (held and retried when it fails; never raises)."""
        return self.state.emit(type_, **data)

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
        journal = self.journal
        if resume_id is not None:
            first = journal.applied_resume(resume_id)
            if first is not None:
                return {**first, "repeated": True}
        start = journal.start_time
        if at is None:
            at = -math.inf if start is None else self.clock.time() - start
        # the RESUME remembers how many entries the schedule had: it never ends a break appended
        # after it (:func:`~vmr_handler.core.timeline.build_plan`)
        journal.add_resume(at, len(self.schedule.entries))
        plan = self.plan()
        ended = plan.resumes[-1].ended_break
        outcome = {"at": at, "ended_break": ended, "ignored": ended is None}
        if resume_id is not None:
            journal.record_resume_id(resume_id, dict(outcome))
        if ended is not None:
            self._break_reached(plan, ended)  # a break is reported before the RESUME that ends it
        self.state.syncer.save_soon()  # the RESUME and its id in one atomic write (or kept, retried)
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
        self.state.wake()
        return outcome

    def kill(self, kill_id: str, index: int, signame: str, grace: float, by: Optional[str]) -> Dict[str, Any]:
        """``vmr-host kill`` ``kill_id`` of entry ``index``, once (:meth:`EntryLauncher.kill_once`)."""
        return self.entries.kill_once(kill_id, index, signame, grace, by)

    def _break_reached(self, plan: Plan, index: int) -> None:
        """Report break ``index`` started if the agent had not reached it yet: the RESUME ending
        it arrived first (a stored one, or one stamped after the break's time while its timer
        had not fired). Each view of the host folds the break, then its end."""
        entry = self.schedule.entries[index]
        if entry.start_time == -math.inf:
            self.holds.report(entry)
            return
        at = next((p.fire_at for p in plan.entries if p.index == index), None)
        if at is not None:
            self.timers.break_reached(index, at)

    def plan(self) -> Plan:
        """The plan of the schedule (appended entries included) with the RESUMEs received."""
        return build_plan(self.schedule.entries, self.journal.resumes, self.journal.resume_visibility)

    def append(self, batch_id: str, batch: Schedule, raw: bytes) -> Dict[str, Any]:
        """Append a batch of entries to the running schedule (``vmr-host schedule add``).

        The batch is kept and journaled before this returns, once per ``batch_id`` (a repeated
        id returns the first answer with ``"repeated": True``; :mod:`vmr_handler.agent.engine.appends`).
        Its entries are numbered after the schedule's; negative ones run as stages of their
        own, in order, once the current stage ended; positive ones fire at start + their
        pause-shifted time (at once when that has passed, lateness reported); pauses and breaks
        apply from now on (:mod:`vmr_handler.core.schedule.appended`); its stored RESUMEs are
        applied.

        Args:
            batch_id: the host's id of the batch (the ``schedule_append`` event id).
            batch: the batch, loaded and validated as a schedule of its own.
            raw: its bytes (kept in ``<state>/appends/``).

        Returns:
            ``{"first_index", "count", "stages": [[number, start_time, [index...]]...], "moved"}``.

        Raises:
            AppendRefused: the VM failed or the agent is stopping.
            JournalError: the batch cannot be kept (nothing was appended).
        """
        repeated = answered(self.journal, batch_id)
        if repeated is not None:
            return repeated
        if self.entries.failure is not None:
            raise AppendRefused(f"the VM failed ({self.entries.failure}); nothing appended")
        if self.stopping:
            raise AppendRefused("the agent is stopping; nothing appended")
        entries, record = keep_appended(self.state, batch_id, batch, raw)
        state = self.state
        state.schedule = extended(state.schedule, entries)  # every part of the engine plays it
        state.workdirs.update(working_dirs(list(state.schedule.entries), self.config.launch_dir))
        self.emit(EventType.SCHEDULE_APPENDED, batch=batch_id, **append_answer(record))
        if self.config.host_ask is None:
            skip_host_entries(self.emit, entries)
        for entry in resume_entries(entries):
            self.resume(resume_id=f"schedule-entry-{entry.index}", entry=entry.index)
        if self.timers.plan is not None:  # re-arm positive time, run appended stages, look again
            self.timers.arm(self.plan())
        self.stageplay.kick()
        state.wake()
        return append_answer(record)

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self.state.stopping

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the engine to stop: timers cancelled, process trees terminated, journal flushed."""
        if self.state.request_stop(reason):
            self.reports.stop_waiting(STOP_GRACE)
            task = asyncio.ensure_future(self.entries.kill_running())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ status
    def status(self) -> Dict[str, Any]:
        """Where the engine is, as a JSON-safe dict (``vmr-handler status``): phase, stages,
        start time, holds, what runs next and now, a failure, how its entries ended, reports
        held because they cannot be written."""
        journal, timers = self.journal, self.timers
        now = self.clock.time()
        start = journal.start_time
        plan = timers.plan or self.plan()
        hold = self.holds.current or timers.active_hold(plan, None if start is None else now - start)
        # a break holds the VM only once its time has come; before, it is the next break
        held = hold["index"] if hold is not None and hold.get("kind") == "break" else None
        return {
            "version": __version__,
            "phase": self.phase,
            "stage": self.current_stage,
            "stages": len(self.stages),
            "stages_done": journal.stages_done,
            "configured_at": journal.configured_at,
            "start_time": start,
            "experiment_time": None if start is None else now - start,
            "active_pause": hold,
            "blocked_by_break": held,
            "next_break": plan.blocked_by if held is None else None,
            "resumes": journal.resumes,
            "next_entries": [] if start is None else timers.upcoming(plan, start, now),
            "running": self.entries.status(),
            "failure": self.entries.failure,
            "entries": entry_counts(journal, self.schedule.entries),
            "held_reports": len(self.reports),
        }

    def waiting_status(self) -> Dict[str, Any]:
        """What the reminders (:mod:`vmr_handler.agent.engine._reminders`) look at once a second:
        the phase, when it was configured, the break holding it. Cheap: never builds a plan (a
        schedule of 100 000 entries would cost ~0.1 s a second at the barrier)."""
        start = self.journal.start_time
        plan = self.timers.plan
        hold = self.holds.current
        if hold is None and plan is not None and plan.blocked_by is not None and start is not None:
            hold = self.timers.active_hold(plan, self.clock.time() - start)  # only with a break ahead
        held = hold["index"] if hold is not None and hold.get("kind") == "break" else None
        return {"phase": self.phase, "configured_at": self.journal.configured_at, "blocked_by_break": held}

    # ------------------------------------------------------------------ main
    async def run(self) -> int:
        """Play the schedule. Returns :data:`EXIT_OK` or :data:`EXIT_FAILED` (reports all written).

        Returns EXIT_OK also after a reboot request was carried out and after a stop.
        """
        done = asyncio.Event()
        reminders = asyncio.ensure_future(remind(self.waiting_status, self.clock, done))
        try:
            rc = await self._play()
        finally:
            done.set()
            await reminders
        await self.reports.written()  # held reports too (at a stop: STOP_GRACE at most)
        return rc

    async def _play(self) -> int:
        announce(self.state)
        self._recover()
        state = self.state
        try:
            with stops_here():
                await state.persist()
                await self._preload()
                self._stored_resumes()
                await self.holds.run()
                outcome = await self.stageplay.run_all()
                if outcome != "ok":
                    return EXIT_OK if outcome == "reboot" else self._fail_exit()
                await self._configured()
                await self._positive_phase()
                await state.persist()  # complete only once the journal says so (a full disk waits)
                while self.config.stay and self._failure is None and not state.stopping:
                    self._complete()  # then wait for appended entries (or a RESUME re-arming some)
                    await self._more_work()
                    await self._positive_phase()
                    await state.persist()
        finally:
            await self._shutdown()
        if self._failure is not None:
            return self._fail_exit()
        if state.stopping:
            if not self._completed:
                self.emit(EventType.AGENT_STOPPED, reason=state.stop_reason)
            return EXIT_OK
        self._complete()
        return EXIT_OK

    def _complete(self) -> None:
        self.state.phase = "complete"
        self._completed = True
        counts = entry_counts(self.journal, self.schedule.entries)
        self.emit(EventType.SCHEDULE_COMPLETE, **completion(counts))

    def _busy(self) -> bool:
        """Something of the schedule is armed, running or still to run."""
        return bool(
            self.timers.pending or self.entries.busy or self._tasks or self.stageplay.busy
        )  # fmt: skip

    async def _more_work(self) -> None:
        """Wait (after the schedule completed) until entries are appended or re-armed."""
        while not self._busy():
            await self.state.wait_woken()
        self._completed = False
        self.state.phase = "positive"

    def _fail_exit(self) -> int:
        self.state.phase = "failed"
        return EXIT_FAILED

    def _recover(self) -> None:
        """Deal with what a crash or reboot left: interrupted entries, reboot requesters."""
        self.entries.recover(list(self.schedule.entries))
        self.stage_runner.recover()

    # ------------------------------------------------------------------ phase 0: data, stored RESUMEs
    async def _preload(self) -> None:
        """Place every entry's data before anything runs (:mod:`vmr_handler.agent.engine.placement`)."""
        self.state.phase = "placing data"
        if await self.state.data.preload(
            list(self.schedule.entries), lambda i: self.journal.entry_state(i) is not None
        ):
            await self.state.persist()

    def _stored_resumes(self) -> None:
        """Apply the schedule's stored RESUME entries (``firewheel vm resume``; SPEC section 3), once."""
        for entry in self.schedule.entries:
            if entry.kind is EntryKind.RESUME:
                self.resume(resume_id=f"schedule-entry-{entry.index}", entry=entry.index)

    # ------------------------------------------------------------------ phase 3: barrier
    async def _configured(self) -> None:
        state = self.state
        if self.journal.configured_at is None:
            self.journal.configured_at = self.clock.time()
            await state.persist()
        state.phase = "configured"
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
            await state.persist()
            self.emit(
                EventType.START_TIME_SET,
                start_time=self.journal.start_time,
                source="local",
                buffer=self.config.start_buffer,
                details="experiment start = configured + start buffer",
            )
        state.phase = "configured, waiting at the barrier"
        while self.journal.start_time is None or not self.clock_ready.is_set():
            await state.wait_woken()  # set_start_time() / set_clock_ready() wake us

    def set_clock_ready(self) -> None:
        """The reference clock is synchronised: positive time may be timed on it."""
        self.clock_ready.set()
        self.state.wake()

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
        self.state.syncer.save_soon()  # a full disk: kept in memory, retried (the host sends it again)
        self.emit(
            EventType.START_TIME_SET,
            start_time=start,
            source="host",
            details="experiment start time from the host barrier",
        )
        self.state.wake()
        return True

    def clock_changed(self) -> None:
        """The reference-clock offset changed: re-arm positive-time timers on the new clock."""
        self.state.events.clock_changed()
        if self.timers.plan is not None:
            self.timers.arm(self.timers.plan)

    # ------------------------------------------------------------------ phase 4: positive time
    async def _positive_phase(self) -> None:
        state = self.state
        start = self.journal.start_time
        assert start is not None
        state.phase = "waiting for start" if not self._started_reported else "positive"
        self.timers.arm(self.plan())
        while True:
            state.check_stop()
            if self._failure is not None:
                return
            if not self._started_reported and self.clock.time() >= start:
                self._started_reported = True
                state.phase = "positive"
                self.emit(EventType.EXPERIMENT_STARTED, start_time=start, late=self.clock.time() - start)
            plan = self.timers.plan
            assert plan is not None
            if self._started_reported and not self._busy() and plan.blocked_by is None:
                return
            state.woken.clear()
            await self.clock.wait(state.woken, None if self._started_reported else start)

    def _fire_group(self, fire_at: float, entries: List[ScheduleEntry]) -> None:
        """Timer callback: fire every entry scheduled at experiment time ``fire_at``."""
        if self.stopping or self._failure is not None:
            return
        start = self.journal.start_time
        assert start is not None
        host = [e for e in entries if e.on_host and self.journal.entry_state(e.index) is None]
        prepared = self.entries.prepare_due([e for e in entries if not e.on_host])
        if not prepared and not host:
            self.state.wake()
            return
        launch = self._launch(prepared, host, start + fire_at)
        task = asyncio.ensure_future(self.reports.when_room(self.state.stop_requested, launch))
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("firing entries at %s failed: %r", fire_at, t.exception())
                self.entries.failure = f"internal error firing entries at {fire_at}: {t.exception()!r}"
            self.state.wake()

        task.add_done_callback(done)

    async def _launch(self, prepared: List[Prepared], host: List[ScheduleEntry], scheduled: float) -> None:
        """Start ``prepared`` and have the host run ``host`` (on_host entries), all due at ``scheduled``."""
        on_host = self.stage_runner.on_host(host, scheduled)
        await asyncio.gather(self.entries.launch_all(prepared, scheduled), on_host)

    # ------------------------------------------------------------------ shutdown
    async def _shutdown(self) -> None:
        self.state.data.stop()
        self.timers.cancel()
        await self.stageplay.cancel()
        await self.entries.kill_running()
        await self.entries.journaled()  # entry_failed marks (at a stop: STOP_GRACE at most)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.state.syncer.cancel()
        with contextlib.suppress(JournalError):
            self.journal.save()
        with contextlib.suppress(JournalError, OSError):
            self.journal.close()
