"""The engine: plays a schedule's plan on a clock (SPEC sections 4-5, issue 3 section 4).

Phases, in order, each resumable from the journal:

1. ``-inf`` pauses/breaks (before anything starts).
2. Negative stages in ascending order: prepare every entry of the stage (data drops), start
   them all together, wait until all have ended; reboot requests are honoured after the
   stage (exit code 10 or a ``reboot`` file).
3. *Configured* (time 0). In local mode the experiment start time is configured + start
   buffer, an absolute UTC instant journaled once and never changed.
4. Positive time: every positive entry fires from a timer at ``start + fire_at`` on the
   monotonic clock (``loop.call_at``; no polling); entries with the same instant fire in one
   callback after one journal write. A RESUME recomputes the plan (pure
   :func:`~vmr_handler.core.timeline.build_plan`) and re-arms the timers.

Inputs: RESUME (:meth:`Engine.resume`), stop (:meth:`Engine.stop`). Outputs: events to a
sink callable. The engine never knows which transport carries them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from vmr_handler import __version__
from vmr_handler.agent.executor import (
    NOT_EXECUTABLE_EXIT_CODE,
    NOT_FOUND_EXIT_CODE,
    REBOOT_EXIT_CODE,
    REBOOT_FILE,
    ProcessResult,
    ProcessRunner,
    child_environment,
    kill_tree,
    shell_command,
)
from vmr_handler.agent.journal import DONE, FAILED, Journal
from vmr_handler.agent.placement import DataPlacement
from vmr_handler.core.clock import SystemClock
from vmr_handler.core.errors import EntryError, JournalError
from vmr_handler.core.events import Event, EventFactory, EventType, encode_output
from vmr_handler.core.schedule.commands import (
    command_line,
    find_shell,
    first_word,
    program_missing,
    target_path,
    working_dirs,
)
from vmr_handler.core.schedule.model import EntryKind, Schedule, ScheduleEntry, TransferOut
from vmr_handler.core.timeline import Plan, PlannedEntry, build_plan

log = logging.getLogger(__name__)

#: Exit codes of ``Engine.run`` (and of ``vmr-handler run``).
EXIT_OK = 0
EXIT_FAILED = 1

DEFAULT_REBOOT_COMMAND = "systemctl reboot || reboot"
#: What a shell's exit codes 126/127 mean (POSIX).
_SHELL_CODES = {NOT_EXECUTABLE_EXIT_CODE: "not executable", NOT_FOUND_EXIT_CODE: "command not found"}
#: Seconds within which appended journal changes are fsynced (bounds loss on a hard VM reset).
JOURNAL_SYNC_DELAY = 0.05


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


class _Stopped(Exception):
    """Raised inside the engine when a stop was requested."""


@dataclass
class _Running:
    entry: ScheduleEntry
    runner: ProcessRunner
    started_mono: float
    killed: bool = False  # terminated by the agent's own stop/failure
    stderr_tail: Dict[str, bytes] = field(default_factory=dict)  # {"last": last stderr line}


@dataclass
class _Prepared:
    entry: ScheduleEntry
    workdir: str
    argv: Optional[List[str]]  # None: data-only entry, nothing to run
    line: str = ""  # the command line, as the reference writes it


@dataclass
class _Positive:
    """Mutable state of the positive phase."""

    plan: Optional[Plan] = None
    timers: List[asyncio.TimerHandle] = field(default_factory=list)  # re-armed on every RESUME
    pending: Set[Tuple[str, int]] = field(default_factory=set)  # ("entry"|"hold"|"hold_end", index) armed


class Engine:
    """Drives one schedule on this machine.

    Args:
        schedule: the validated schedule.
        config: :class:`EngineConfig`.
        sink: receives every :class:`~vmr_handler.core.events.Event` (must not block for long).
        clock: reference clock (default :class:`~vmr_handler.core.clock.SystemClock`).

    Construct it inside the running event loop. In local mode the experiment start time is
    ``configured_at + config.start_buffer``.

    Raises (from :meth:`run`):
        JournalError: the state directory cannot be used.
    """

    def __init__(
        self,
        schedule: Schedule,
        config: EngineConfig,
        sink: Callable[[Event], None],
        clock: Optional[SystemClock] = None,
    ) -> None:
        self.schedule = schedule
        self.config = config
        self.clock = clock or SystemClock()
        self._sink = sink
        self.events = EventFactory(self.clock.time)
        self.journal = Journal(config.state_dir, schedule.digest)
        self.workdirs = working_dirs(list(schedule.entries), config.launch_dir)
        self.shell = config.shell or find_shell()
        self._env = child_environment(config.env)
        self.data = DataPlacement(
            self.workdirs, config.resources_dir, self.emit, self.journal.data.setdefault("preloaded", [])
        )
        self.stages = schedule.stage_times()
        self.phase = "starting"
        self.current_stage: Optional[int] = None
        self._initial_hold: Optional[Dict[str, Any]] = None  # the -inf pause/break being waited out
        self._running: Dict[int, _Running] = {}
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # set on RESUME / entry end / failure
        self._failure: Optional[str] = None
        self._stop_reason = ""
        self._sync_handle: Optional[asyncio.TimerHandle] = None
        #: Set once the reference clock can be trusted (at once in local mode; after the first
        #: clock sync with the host otherwise): positive time waits for it.
        self.clock_ready = asyncio.Event()
        if config.local_start:
            self.clock_ready.set()
        self._pos = _Positive()
        self._tasks: Set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ reporting
    def emit(self, type_: EventType, **data: Any) -> Event:
        """Make an event and hand it to the sink."""
        event = self.events.make(type_, **data)
        try:
            self._sink(event)
        except Exception:  # a broken sink must not stop the schedule
            log.exception("event sink failed for %s", event.type)
        return event

    def _save(self) -> None:
        self.journal.save()

    def _journal_changed(self) -> None:
        """Entry changes were appended to the journal log: fsync it within 50 ms (one fsync per burst)."""
        if self._sync_handle is None:
            self._sync_handle = asyncio.get_running_loop().call_later(JOURNAL_SYNC_DELAY, self._sync_journal)

    def _sync_journal(self) -> None:
        self._sync_handle = None
        try:
            self.journal.sync()
        except JournalError as exc:
            log.error("%s", exc)

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
        applied: Dict[str, Any] = self.journal.data.setdefault("resume_ids", {})
        if resume_id is not None and resume_id in applied:
            return {**applied[resume_id], "repeated": True}
        start = self.journal.start_time
        if at is None:
            at = -math.inf if start is None else self.clock.time() - start
        self.journal.add_resume(at)
        plan = build_plan(self.schedule.entries, self.journal.resumes)
        outcome = plan.resumes[-1]
        ended = outcome.ended_break
        if resume_id is not None:
            applied[resume_id] = {"at": at, "ended_break": ended, "ignored": ended is None}
        self._save()  # the RESUME and its id in one atomic write
        origin = {} if entry is None else {"index": entry, "origin": "schedule entry"}
        self.emit(
            EventType.RESUME_RECEIVED,
            **origin,
            at=at,
            ended_break=ended,
            ignored=ended is None,
            status="success",
            details=f"ended break at entry {ended}" if ended is not None else "no active break: ignored",
        )
        if self._pos.plan is not None:
            self._arm_positive(plan)
        self._wake.set()
        return {"at": at, "ended_break": ended, "ignored": ended is None}

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the engine to stop: timers cancelled, process trees terminated, journal flushed."""
        if not self._stop.is_set():
            log.info("stopping: %s", reason)
            self._stop_reason = reason
            self._stop.set()
            self._wake.set()
            task = asyncio.ensure_future(self._kill_running())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _kill_running(self) -> None:
        """Terminate every running entry's process tree (psutil, in worker threads)."""
        running = list(self._running.values())
        for r in running:
            r.killed = True
        if running:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(None, r.runner.kill_tree) for r in running))

    # ------------------------------------------------------------------ status
    def status(self) -> Dict[str, Any]:
        """Where the engine is, as a JSON-safe dict (``vmr-handler status``)."""
        now = self.clock.time()
        start = self.journal.start_time
        plan = self._pos.plan or build_plan(self.schedule.entries, self.journal.resumes)
        upcoming = []
        if start is not None:
            for p in plan.positive_firings():
                if self.journal.entry_state(p.index) is None and p.fire_at is not None:
                    upcoming.append({"index": p.index, "fire_at": p.fire_at, "in": start + p.fire_at - now})
                if len(upcoming) == 5:
                    break
        mono = self.clock.monotonic()
        return {
            "version": __version__,
            "phase": self.phase,
            "stage": self.current_stage,
            "stages": len(self.stages),
            "stages_done": self.journal.stages_done,
            "configured_at": self.journal.configured_at,
            "start_time": start,
            "experiment_time": None if start is None else now - start,
            "active_pause": self._initial_hold
            or self._active_hold(plan, None if start is None else now - start),
            "blocked_by_break": plan.blocked_by,
            "resumes": self.journal.resumes,
            "next_entries": upcoming,
            "running": [
                {
                    "index": r.entry.index,
                    "executable": r.entry.executable,
                    "pid": r.runner.pid,
                    "running_for": mono - r.started_mono,
                }
                for r in self._running.values()
            ],
            "failure": self._failure,
        }

    def _active_hold(self, plan: Plan, now: Optional[float]) -> Optional[Dict[str, Any]]:
        """The positive-time pause or break in effect at experiment time ``now``, if any."""
        if now is None:
            return None
        for p in plan.entries:
            if p.kind not in (EntryKind.PAUSE, EntryKind.BREAK) or p.fire_at is None:
                continue
            if math.isinf(p.fire_at) or p.fire_at > now:
                continue
            if p.kind is EntryKind.BREAK and plan.blocked_by == p.index:
                return {"index": p.index, "kind": "break", "at": p.fire_at}
            duration = self.schedule.entries[p.index].pause_duration or 0.0
            if p.kind is EntryKind.PAUSE and now < p.fire_at + duration:
                return {"index": p.index, "kind": "pause", "at": p.fire_at, "until": p.fire_at + duration}
        return None

    # ------------------------------------------------------------------ main
    async def run(self) -> int:
        """Play the schedule. Returns :data:`EXIT_OK` or :data:`EXIT_FAILED`.

        Returns EXIT_OK also after a reboot request was carried out and after a stop.
        """
        self.emit(
            EventType.AGENT_STARTED,
            version=__version__,
            pid=os.getpid(),
            resumed_from_journal=self.journal.resumed,
        )
        self.emit(
            EventType.SCHEDULE_LOADED,
            digest=self.schedule.digest,
            format=self.schedule.source_format,
            entries=len(self.schedule.entries),
            stages=list(self.stages),
        )
        for warning in self.schedule.warnings:
            self.emit(EventType.SCHEDULE_WARNING, details=warning)
        if self.journal.reset_from:
            self.emit(
                EventType.JOURNAL_RESET,
                moved_to=self.journal.reset_from,
                details="journal belonged to another schedule; starting fresh",
            )
        for entry in self.schedule.entries:
            if entry.on_host:
                self.emit(
                    EventType.ENTRY_SKIPPED,
                    index=entry.index,
                    executable=entry.executable,
                    start_time=entry.start_time,
                    details="on_host entry: run by the host controller",
                )
        self._recover()
        self._save()
        try:
            await self._preload()
            self._stored_resumes()
            await self._initial_holds()
            outcome = await self._run_stages()
            if outcome != "ok":
                return EXIT_OK if outcome == "reboot" else self._fail_exit()
            await self._configured()
            await self._positive_phase()
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
        for index, rec in self.journal.running_entries().items():
            pid = rec.get("pid")
            killed = kill_tree(int(pid), rec.get("create_time"), timeout=3.0) if pid else []
            entry = self.schedule.entries[index]
            self.emit(
                EventType.ENTRY_INTERRUPTED,
                index=index,
                executable=entry.executable,
                killed_pids=killed,
                details="was running when the agent stopped; runs again",
            )
            self.journal.forget(index)
        reboot = self.journal.data.get("reboot")
        if reboot:
            for index in reboot.get("requesters", []):
                path = os.path.join(self.workdirs[index], REBOOT_FILE)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self.journal.forget(index)
            self.journal.data["reboot"] = None

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Stopped()

    async def _sleep_until_utc(self, utc: float) -> None:
        """Sleep until reference UTC ``utc`` unless stopped (then raise _Stopped)."""
        loop = asyncio.get_running_loop()
        while True:
            self._check_stop()
            remaining = self.clock.deadline(utc) - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)

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
            self._save()

    def _stored_resumes(self) -> None:
        """Apply the schedule's stored RESUME entries (``firewheel vm resume``; SPEC section 3), once."""
        for entry in self.schedule.entries:
            if entry.kind is EntryKind.RESUME:
                self.resume(resume_id=f"schedule-entry-{entry.index}", entry=entry.index)

    # ------------------------------------------------------------------ phase 1: -inf holds
    async def _initial_holds(self) -> None:
        holds = [e for e in self.schedule.entries if e.pause and e.start_time == -math.inf]
        for entry in holds:
            if entry.index in self.journal.data["initial_done"]:
                continue
            duration = entry.pause_duration or 0.0
            if math.isinf(duration):
                self.phase = "break"
                self._initial_hold = {"index": entry.index, "kind": "break", "at": "-inf"}
                self.emit(
                    EventType.BREAK_STARTED,
                    index=entry.index,
                    at=-math.inf,
                    details="break at -inf: holding everything until RESUME",
                )
                # earlier -inf breaks are already resumed, so only this one can block here
                while build_plan(self.schedule.entries, self.journal.resumes).blocked_by == entry.index:
                    await self._wait_woken()
            else:
                began = float(
                    self.journal.data["pause_began"].setdefault(str(entry.index), self.clock.time())
                )
                self._save()
                self.phase = "pause"
                self._initial_hold = {
                    "index": entry.index,
                    "kind": "pause",
                    "at": "-inf",
                    "until": began + duration,
                }
                self.emit(
                    EventType.PAUSE_STARTED,
                    index=entry.index,
                    at=-math.inf,
                    duration=duration,
                    until=began + duration,
                )
                await self._sleep_until_utc(began + duration)
                self.emit(EventType.PAUSE_ENDED, index=entry.index, at=-math.inf, duration=duration)
            self._initial_hold = None
            self.journal.data["initial_done"].append(entry.index)
            self._save()

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
            self._check_stop()
            self.phase = "stages"
            self.current_stage = number
            todo = [e for e in by_stage[start_time] if self.journal.entry_state(e.index) is None]
            t0 = self.clock.monotonic()
            self.emit(
                EventType.STAGE_STARTED, stage=number, start_time=start_time, entries=[e.index for e in todo]
            )
            prepared: List[_Prepared] = []
            for entry in todo:
                item = self._prepare(entry)
                if item is None:
                    if self._failure is not None:
                        return "failed"
                    continue
                prepared.append(item)
            results = await self._launch_all(prepared, scheduled=None)
            self._check_stop()
            if self._failure is not None:
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
            if requesters:
                self.journal.data["reboot"] = {"stage": number, "requesters": requesters}
                self._save()
                self.emit(
                    EventType.REBOOT_REQUESTED,
                    stage=number,
                    requesters=requesters,
                    command=self.config.reboot_command,
                )
                self._reboot()
                return "reboot"
            self.journal.mark_stage_done(number)
            self._save()
        self.current_stage = None
        return "ok"

    def _reboot(self) -> None:
        log.warning("rebooting: %s", self.config.reboot_command)
        try:
            proc = subprocess.run(
                self.config.reboot_command,
                shell=True,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=self._env,
                timeout=120,
                check=False,
            )
            if proc.returncode != 0:
                log.error(
                    "reboot command exited %d: %s", proc.returncode, proc.stderr.decode(errors="replace")
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.error("reboot command failed: %s", exc)

    # ------------------------------------------------------------------ entries
    def _entry_failed(self, entry: ScheduleEntry, exc: Exception, can_fail_vm: bool = True) -> None:
        """Report a placement/start failure; a placement failure fails the VM unless ignore_failure
        (SPEC section 5: only data that cannot be placed fails the VM)."""
        fatal = can_fail_vm and not entry.ignore_failure
        self.emit(
            EventType.ENTRY_FAILED,
            index=entry.index,
            executable=entry.executable,
            status="error",
            details=str(exc),
            ignore_failure=entry.ignore_failure,
        )
        if fatal:
            self._failure = f"{entry.label}: {exc}"
            self.emit(EventType.VM_FAILED, index=entry.index, status="error", details=self._failure)
            self._wake.set()
        else:
            self.journal.mark_done(entry.index, FAILED)

    def _prepare(self, entry: ScheduleEntry) -> Optional[_Prepared]:
        """Place the entry's data unless already in place, and build its command; None if the
        data could not be placed (already reported)."""
        workdir = self.workdirs[entry.index]
        try:
            self.data.ensure(entry)
            line = command_line(entry, workdir) if entry.executable else ""
        except EntryError as exc:
            self._entry_failed(entry, exc)
            return None
        argv = shell_command(self.shell, workdir, line) if entry.executable else None
        for item in entry.data:
            if isinstance(item, TransferOut):
                self.emit(
                    EventType.TRANSFER_REGISTERED,
                    index=entry.index,
                    location=item.location,
                    path=target_path(item.location, workdir),
                    interval=item.interval,
                    destination=item.destination,
                    details="local mode: recorded only, no host to transfer to"
                    if self.config.local_start
                    else "sent to the host once, or every interval seconds when it changed",
                )
        return _Prepared(entry, workdir, argv, line)

    async def _launch_all(
        self, prepared: List[_Prepared], scheduled: Optional[float]
    ) -> Dict[int, Optional[ProcessResult]]:
        """Start every prepared entry together and wait for all; results by index."""
        for item in prepared:
            self.journal.mark_running(item.entry.index)  # one append each, before the spawn
        self._journal_changed()
        runs = [self._start(item, scheduled) for item in prepared]
        started = await asyncio.gather(*runs)
        results: Dict[int, Optional[ProcessResult]] = {}
        waits = [self._finish(item, run) for item, run in zip(prepared, started)]
        for item, result in zip(prepared, await asyncio.gather(*waits)):
            results[item.entry.index] = result
        return results

    async def _start(self, item: _Prepared, scheduled: Optional[float]) -> Optional[_Running]:
        entry = item.entry
        if item.argv is None:
            return None
        seq = {"stdout": 0, "stderr": 0}
        tail: Dict[str, bytes] = {}

        def on_output(stream: str, piece: bytes, continued: bool, eol: bool) -> None:
            seq[stream] += 1
            if stream == "stderr" and piece.strip():
                tail["last"] = piece[-400:]
            self.emit(
                EventType.OUTPUT,
                index=entry.index,
                stream=stream,
                seq=seq[stream],
                continued=continued,
                eol=eol,
                **encode_output(piece),
            )

        runner = ProcessRunner(on_output)
        # the fork happens synchronously inside start() before its first suspension, so this
        # is when this entry's process starts (gather() runs every start up to there first)
        spawned_at = self.clock.time()
        try:
            pid = await runner.start(item.argv, item.workdir, self._env)
        except EntryError as exc:
            self._entry_failed(entry, exc, can_fail_vm=False)
            return None
        running = _Running(entry, runner, self.clock.monotonic(), stderr_tail=tail)
        self._running[entry.index] = running
        self.journal.mark_running(entry.index, pid, runner.create_time)  # pid: cleanup after a crash
        self._journal_changed()
        extra: Dict[str, Any] = {}
        if scheduled is not None:
            extra = {"scheduled": scheduled, "spawned_at": spawned_at, "lateness": spawned_at - scheduled}
        self.emit(
            EventType.ENTRY_STARTED,
            index=entry.index,
            executable=entry.executable,
            pid=pid,
            start_time=entry.start_time,
            working_dir=item.workdir,
            command=item.line,
            shell=self.shell,
            **extra,
        )
        return running

    async def _finish(self, item: _Prepared, running: Optional[_Running]) -> Optional[ProcessResult]:
        entry = item.entry
        if running is None:
            if item.argv is None and self.journal.entry_state(entry.index) is None:
                self.journal.mark_done(entry.index, DONE)
                self.emit(
                    EventType.ENTRY_EXITED,
                    index=entry.index,
                    executable=None,
                    exit_code=None,
                    duration=0.0,
                    status="success",
                    details="data-only entry: data placed",
                )
            return None
        result = await running.runner.wait()
        self._running.pop(entry.index, None)
        if running.killed:
            # terminated by our own stop: left "running" in the journal so a restart runs it again
            self.emit(
                EventType.ENTRY_INTERRUPTED,
                index=entry.index,
                executable=entry.executable,
                exit_code=result.exit_code,
                signal=result.signal,
                details="terminated because the agent stopped; runs again when the agent restarts",
            )
            return result
        reboot_file = os.path.exists(os.path.join(item.workdir, REBOOT_FILE))
        reboot = result.exit_code == REBOOT_EXIT_CODE or reboot_file
        ok = result.exit_code == 0 or (reboot and entry.start_time < 0)
        details = (
            f"exit code {result.exit_code}"
            if result.exit_code is not None
            else f"killed by signal {result.signal}"
        )
        if result.exit_code in (NOT_FOUND_EXIT_CODE, NOT_EXECUTABLE_EXIT_CODE):
            details += self._not_run(item, running, result.exit_code)
        if reboot:
            details += "; reboot requested" + (
                " (reported only in positive time)" if entry.start_time > 0 else ""
            )
        self.journal.mark_done(entry.index, DONE, result.exit_code)
        self._journal_changed()
        self.emit(
            EventType.ENTRY_EXITED,
            index=entry.index,
            executable=entry.executable,
            exit_code=result.exit_code,
            signal=result.signal,
            duration=result.duration,
            status="success" if ok else "error",
            details=details,
            reboot_requested=reboot,
        )
        self._wake.set()
        return result

    def _not_run(self, item: _Prepared, running: _Running, code: int) -> str:
        """Why an entry exited 127 ("command not found") or 126 ("not executable"), naming the program."""
        word = first_word(item.line)
        if code == NOT_EXECUTABLE_EXIT_CODE:
            path = os.path.join(item.workdir, word)
            if os.path.isfile(path) and not os.access(path, os.X_OK):
                mode = oct(os.stat(path).st_mode & 0o777)
                return (
                    f": {word!r} is not executable (mode {mode}); a drop keeps its executable flag here, "
                    "where FIREWHEEL makes every dropped file executable (docs/firewheel.md)"
                )
        elif program_missing(word, item.workdir, (self._env or os.environ).get("PATH")):
            return f": {word!r} was not found (no such file, not on the PATH); the schedule goes on"
        last = running.stderr_tail.get("last", b"").decode("utf-8", "replace").strip()
        return f" (the shell's code for {_SHELL_CODES[code]!r})" + (f": {last}" if last else "")

    # ------------------------------------------------------------------ phase 3: barrier
    async def _configured(self) -> None:
        if self.journal.configured_at is None:
            self.journal.configured_at = self.clock.time()
            self._save()
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
            self._save()
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
        self._save()
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
        if self._pos.plan is not None:
            self._arm_positive(self._pos.plan)

    # ------------------------------------------------------------------ phase 4: positive time
    async def _positive_phase(self) -> None:
        start = self.journal.start_time
        assert start is not None
        self.phase = "waiting for start"
        self._arm_positive(build_plan(self.schedule.entries, self.journal.resumes))
        loop = asyncio.get_running_loop()
        started_reported = False
        while True:
            self._check_stop()
            if self._failure is not None:
                return
            if not started_reported and self.clock.time() >= start:
                started_reported = True
                self.phase = "positive"
                self.emit(EventType.EXPERIMENT_STARTED, start_time=start, late=self.clock.time() - start)
            plan = self._pos.plan
            assert plan is not None
            idle = not self._pos.pending and not self._running and not self._tasks
            if started_reported and idle and plan.blocked_by is None:
                return
            self._wake.clear()
            timeout = None if started_reported else max(0.0, self.clock.deadline(start) - loop.time())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _arm_positive(self, plan: Plan) -> None:
        """(Re)arm the timers of every unfired positive entry and pause/break from ``plan``."""
        for handle in self._pos.timers:
            handle.cancel()
        self._pos.timers = []
        self._pos.pending = set()
        self._pos.plan = plan
        start = self.journal.start_time
        assert start is not None
        loop = asyncio.get_running_loop()
        delta = loop.time() - self.clock.time()  # reference UTC -> loop monotonic
        groups: Dict[float, List[ScheduleEntry]] = {}
        holds: Dict[str, List[int]] = self.journal.data.setdefault("holds", {})
        for p in plan.entries:
            if p.fire_at is None or math.isinf(p.fire_at):
                continue
            entry = self.schedule.entries[p.index]
            if p.kind is EntryKind.POSITIVE and self.journal.entry_state(p.index) is None:
                groups.setdefault(p.fire_at, []).append(entry)
            elif p.kind in (EntryKind.PAUSE, EntryKind.BREAK):
                duration = entry.pause_duration or 0.0
                milestones = [("hold", p.fire_at)]
                if p.kind is EntryKind.PAUSE:
                    milestones.append(("hold_end", p.fire_at + duration))
                for what, at in milestones:
                    if p.index not in holds.get(what, []):
                        self._pos.pending.add((what, p.index))
                        self._pos.timers.append(
                            loop.call_at(start + at + delta, self._hold_milestone, what, p)
                        )
        for fire_at, entries in groups.items():
            self._pos.pending.update(("entry", e.index) for e in entries)
            handle = loop.call_at(start + fire_at + delta, self._fire_group, fire_at, entries)
            self._pos.timers.append(handle)
        self._wake.set()

    def _hold_milestone(self, what: str, p: PlannedEntry) -> None:
        """Timer callback: a pause/break takes effect (``hold``) or a pause ends (``hold_end``)."""
        self._pos.pending.discard((what, p.index))
        self.journal.data.setdefault("holds", {}).setdefault(what, []).append(p.index)
        with contextlib.suppress(JournalError):
            self._save()
        duration = self.schedule.entries[p.index].pause_duration or 0.0
        assert p.fire_at is not None
        if what == "hold_end":
            self.emit(EventType.PAUSE_ENDED, index=p.index, at=p.fire_at + duration, duration=duration)
        elif p.kind is EntryKind.BREAK:
            self.emit(
                EventType.BREAK_STARTED, index=p.index, at=p.fire_at, details="schedule held until RESUME"
            )
        else:
            until = p.fire_at + duration
            self.emit(EventType.PAUSE_STARTED, index=p.index, at=p.fire_at, duration=duration, until=until)
        self._wake.set()

    def _fire_group(self, fire_at: float, entries: List[ScheduleEntry]) -> None:
        """Timer callback: fire every entry scheduled at experiment time ``fire_at``."""
        if self._stop.is_set() or self._failure is not None:
            return
        start = self.journal.start_time
        assert start is not None
        scheduled = start + fire_at
        prepared: List[_Prepared] = []
        for entry in entries:
            self._pos.pending.discard(("entry", entry.index))
            if self.journal.entry_state(entry.index) is not None:
                continue
            item = self._prepare(entry)
            if item is not None:
                prepared.append(item)
        if not prepared:
            self._wake.set()
            return
        task = asyncio.ensure_future(self._launch_all(prepared, scheduled))
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("firing entries at %s failed: %r", fire_at, t.exception())
                self._failure = f"internal error firing entries at {fire_at}: {t.exception()!r}"
            self._wake.set()

        task.add_done_callback(done)

    # ------------------------------------------------------------------ shutdown
    async def _shutdown(self) -> None:
        self.data.stop()
        for handle in self._pos.timers:
            handle.cancel()
        self._pos.timers = []
        await self._kill_running()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sync_handle is not None:
            self._sync_handle.cancel()
            self._sync_handle = None
        with contextlib.suppress(JournalError):
            self._save()
        with contextlib.suppress(JournalError, OSError):
            self.journal.close()
