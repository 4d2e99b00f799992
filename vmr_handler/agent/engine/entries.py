"""Running entries: prepare, start together, follow to the end (SPEC section 5).

:class:`EntryLauncher` is the part of the engine that touches processes: it places an entry's
data if the preload did not, builds the command line the reference would run, starts every
entry of a group together (one journal append each before the spawn), reports output and
exits, and explains the shell's 126/127. A failure to place data fails the VM unless
``ignore_failure``; a failure to start is the entry's own (the schedule goes on).

Done means reported: an entry is journaled done (or failed) only once every report it made is
written (the outbox, the report file). While reports are held on a full disk it stays
``running`` in the journal, so an agent killed meanwhile runs it again after a restart
(:meth:`EntryLauncher.recover`) instead of losing its output; a stage, a reboot request and
``schedule_complete`` wait for those marks like for the entries' ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple

from vmr_handler.agent.engine.ports import OutputCallback, Process
from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.agent.machine.executor import (
    NOT_EXECUTABLE_EXIT_CODE,
    NOT_FOUND_EXIT_CODE,
    REBOOT_EXIT_CODE,
    REBOOT_FILE,
    ProcessResult,
    shell_command,
)
from vmr_handler.agent.state.journal import DONE, FAILED, RUNNING
from vmr_handler.core.clock import Timer
from vmr_handler.core.errors import EntryError
from vmr_handler.core.events import Event, EventType, encode_output
from vmr_handler.core.schedule.commands import command_line, first_word, program_missing, target_path
from vmr_handler.core.schedule.model import ScheduleEntry, TransferOut

log = logging.getLogger(__name__)

#: Seconds a timed-out entry's tree has between SIGTERM and SIGKILL.
TIMEOUT_GRACE = 10.0
#: What a shell's exit codes 126/127 mean (POSIX).
_SHELL_CODES = {NOT_EXECUTABLE_EXIT_CODE: "not executable", NOT_FOUND_EXIT_CODE: "command not found"}

Emit = Callable[..., Event]


@dataclass
class Running:
    """An entry whose process runs: since ``started_mono`` (monotonic seconds)."""

    entry: ScheduleEntry
    process: Process
    started_mono: float
    killed: bool = False  # terminated by the agent's own stop/failure
    #: ended by ``vmr-host kill`` or its timeout: what its ``entry_exited`` says of it
    #: (:meth:`EntryLauncher.kill`, :meth:`EntryLauncher._time_out`)
    ended_by: Optional[Dict[str, Any]] = None
    timer: Optional[Timer] = None  # its timeout, while it runs
    stderr_tail: Dict[str, bytes] = field(default_factory=dict)  # {"last": last stderr line}


@dataclass
class Prepared:
    """An entry ready to start: its working dir and argv (None: data-only, nothing to run)."""

    entry: ScheduleEntry
    workdir: str
    argv: Optional[List[str]]
    line: str = ""  # the command line, as the reference writes it


class EntryLauncher:
    """Prepares, starts and follows entries; holds the running ones and the VM's failure.

    Args:
        state: what the engine's parts share (:class:`~vmr_handler.agent.engine.shared.EngineState`):
            the journal, the clock, the process port, the working dirs, the data placement, the
            reports (an entry's output waits while they are held, back-pressure; its end is
            journaled once they are written).

    Attributes:
        running: entry index -> :class:`Running`, while its process runs.
        failure: why the VM failed (a placement error without ``ignore_failure``), or None.
    """

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.running: Dict[int, Running] = {}
        self.failure: Optional[str] = None
        self._marking: Set[asyncio.Future[None]] = set()  # entry_failed marks waiting for reports

    @property
    def busy(self) -> bool:
        """An entry runs, or an entry's end waits for its reports to be written."""
        return bool(self.running or self._marking)

    # ------------------------------------------------------------------ failures
    def entry_failed(self, entry: ScheduleEntry, exc: Exception, can_fail_vm: bool = True) -> None:
        """Report a placement/start failure; a placement failure fails the VM unless ignore_failure
        (SPEC section 5: only data that cannot be placed fails the VM)."""
        fatal = can_fail_vm and not entry.ignore_failure
        self.state.emit(
            EventType.ENTRY_FAILED,
            index=entry.index,
            executable=entry.executable,
            status="error",
            details=str(exc),
            ignore_failure=entry.ignore_failure,
        )
        if fatal:
            self.failure = f"{entry.label}: {exc}"
            # the event names the entry in its own fields: the cause is said once
            self.state.emit(
                EventType.VM_FAILED,
                index=entry.index,
                executable=entry.executable,
                status="error",
                details=str(exc),
            )
            self.state.wake()
        else:
            later = self._journal_done(entry.index, FAILED)
            if later is not None:
                task = asyncio.ensure_future(later)
                self._marking.add(task)
                task.add_done_callback(self._marked)

    def _marked(self, task: asyncio.Future[None]) -> None:
        self._marking.discard(task)
        self.state.wake()

    async def journaled(self) -> None:
        """Wait until the entry_failed marks waiting for their reports are journaled (or were
        given up: the agent stopped)."""
        if self._marking:
            await asyncio.gather(*self._marking, return_exceptions=True)

    # ------------------------------------------------------------------ done means reported
    def _journal_done(
        self, index: int, end: str, exit_code: Optional[int] = None
    ) -> Optional[Awaitable[None]]:
        """Journal ``index`` ended (``end``: done or failed, ``exit_code``) once every report made so far is
        written: at once when it is (None is returned: the sink works), else an awaitable that
        does it then. Meanwhile the journal says ``running`` with ``reports_held``: a crash
        runs the entry again. When the agent stops first it stays so (logged)."""
        wait = self.state.reports.reported()
        if wait is None:
            self._mark_done(index, end, exit_code)
            return None
        self.state.journal.mark_reports_held(index, exit_code)
        self.state.journal_changed()
        return self._journal_done_later(wait, index, end, exit_code)

    async def _journal_done_later(
        self, wait: Awaitable[bool], index: int, end: str, exit_code: Optional[int]
    ) -> None:
        if await wait:
            self._mark_done(index, end, exit_code)
        else:
            log.warning(
                "entry %d: its reports were not written before the agent stopped: it runs again "
                "when the agent restarts",
                index,
            )

    def _mark_done(self, index: int, end: str, exit_code: Optional[int]) -> None:
        self.state.journal.mark_done(index, end, exit_code)
        self.state.journal_changed()

    # ------------------------------------------------------------------ prepare
    def prepare(self, entry: ScheduleEntry) -> Optional[Prepared]:
        """Place the entry's data unless already in place, and build its command; None if the
        data could not be placed (already reported)."""
        workdir = self.state.workdirs[entry.index]
        try:
            self.state.data.ensure(entry)
            line = command_line(entry, workdir) if entry.executable else ""
        except EntryError as exc:
            self.entry_failed(entry, exc)
            return None
        argv = shell_command(self.state.shell, workdir, line) if entry.executable else None
        for item in entry.data:
            if isinstance(item, TransferOut):
                self.state.emit(
                    EventType.TRANSFER_REGISTERED,
                    index=entry.index,
                    location=item.location,
                    path=target_path(item.location, workdir),
                    interval=item.interval,
                    destination=item.destination,
                    details="local mode: recorded only, no host to transfer to"
                    if self.state.config.local_start
                    else "sent to the host once, or every interval seconds when it changed",
                )
        return Prepared(entry, workdir, argv, line)

    def prepare_due(self, entries: List[ScheduleEntry]) -> List[Prepared]:
        """:meth:`prepare` each of ``entries`` that has not run (the journal has no state for it)."""
        prepared = []
        for entry in entries:
            if self.state.journal.entry_state(entry.index) is None:
                item = self.prepare(entry)
                if item is not None:
                    prepared.append(item)
        return prepared

    # ------------------------------------------------------------------ launch
    async def launch_all(
        self, prepared: List[Prepared], scheduled: Optional[float]
    ) -> Dict[int, Optional[ProcessResult]]:
        """Start every prepared entry together and wait for all; results by index.

        Args:
            prepared: the entries to start.
            scheduled: reference UTC they were due at (positive time; lateness is reported),
                or None in a negative stage.
        """
        for item in prepared:
            self.state.journal.mark_running(item.entry.index)  # one append each, before the spawn
        self.state.journal_changed()
        started = await asyncio.gather(*(self._start(item, scheduled) for item in prepared))
        results: Dict[int, Optional[ProcessResult]] = {}
        waits = [self._finish(item, run) for item, run in zip(prepared, started)]
        for item, result in zip(prepared, await asyncio.gather(*waits)):
            results[item.entry.index] = result
        await self.journaled()  # entries that could not be placed or started: journaled too
        return results

    def _output_reporter(self, entry: ScheduleEntry, tail: Dict[str, bytes]) -> OutputCallback:
        seq = {"stdout": 0, "stderr": 0}

        def on_output(stream: str, piece: bytes, continued: bool, eol: bool) -> Optional[Awaitable[None]]:
            seq[stream] += 1
            if stream == "stderr" and piece.strip():
                tail["last"] = piece[-400:]
            self.state.emit(
                EventType.OUTPUT,
                index=entry.index,
                stream=stream,
                seq=seq[stream],
                continued=continued,
                eol=eol,
                **encode_output(piece),
            )
            return self.state.reports.room()  # the pump waits on it before reading more

        return on_output

    async def _start(self, item: Prepared, scheduled: Optional[float]) -> Optional[Running]:
        entry = item.entry
        if item.argv is None:
            return None
        tail: Dict[str, bytes] = {}
        process = self.state.processes.process(self._output_reporter(entry, tail))
        # the fork happens synchronously inside start() before its first suspension, so this
        # is when this entry's process starts (gather() runs every start up to there first)
        spawned_at = self.state.clock.time()
        try:
            pid = await process.start(item.argv, item.workdir, self.state.env)
        except EntryError as exc:
            self.entry_failed(entry, exc, can_fail_vm=False)
            return None
        running = Running(entry, process, self.state.clock.monotonic(), stderr_tail=tail)
        self.running[entry.index] = running
        self.state.journal.mark_running(entry.index, pid, process.create_time)  # pid: cleanup after a crash
        self.state.journal_changed()
        timeout = entry.timeout or self.state.config.default_timeout
        if timeout:
            clock = self.state.clock
            running.timer = clock.call_at(clock.time() + timeout, self._time_out, running, timeout)
        extra: Dict[str, Any] = {}
        if scheduled is not None:
            extra = {"scheduled": scheduled, "spawned_at": spawned_at, "lateness": spawned_at - scheduled}
        self.state.emit(
            EventType.ENTRY_STARTED,
            index=entry.index,
            executable=entry.executable,
            pid=pid,
            start_time=entry.start_time,
            working_dir=item.workdir,
            command=item.line,
            shell=self.state.shell,
            **extra,
        )
        return running

    async def _data_only_done(self, item: Prepared) -> None:
        entry = item.entry
        # (launch_all journaled it running before the start: a data-only entry ends here)
        if item.argv is None and self.state.journal.entry_state(entry.index) in (None, RUNNING):
            self.state.emit(
                EventType.ENTRY_EXITED,
                index=entry.index,
                executable=None,
                exit_code=None,
                duration=0.0,
                status="success",
                details="data-only entry: data placed",
            )
            later = self._journal_done(entry.index, DONE)
            if later is not None:
                await later

    async def _finish(self, item: Prepared, running: Optional[Running]) -> Optional[ProcessResult]:
        entry = item.entry
        if running is None:
            await self._data_only_done(item)
            return None
        result = await running.process.wait()
        self.running.pop(entry.index, None)
        if running.timer is not None:
            running.timer.cancel()
        ended = {  # which entry, and how its process ended: the same in either report
            "index": entry.index,
            "executable": entry.executable,
            "exit_code": result.exit_code,
            "signal": result.signal,
        }
        if running.killed:
            # terminated by our own stop: left "running" in the journal so a restart runs it again
            self.state.emit(
                EventType.ENTRY_INTERRUPTED,
                **ended,
                details="terminated because the agent stopped; runs again when the agent restarts",
            )
            return result
        if running.ended_by is not None:
            await self._killed_end(entry, ended, result, running.ended_by)
            return None  # ended by the operator: no reboot request, whatever it left behind
        reboot = result.exit_code == REBOOT_EXIT_CODE or os.path.exists(
            os.path.join(item.workdir, REBOOT_FILE)
        )
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
        self.state.emit(
            EventType.ENTRY_EXITED,
            **ended,
            duration=result.duration,
            status="success" if ok else "error",
            details=details,
            reboot_requested=reboot,
        )
        later = self._journal_done(entry.index, DONE, result.exit_code)  # done once reported
        if later is not None:
            await later
        self.state.wake()
        return result

    async def _killed_end(
        self, entry: ScheduleEntry, ended: Dict[str, Any], result: ProcessResult, kill: Dict[str, Any]
    ) -> None:
        """Report and journal the end of ``entry`` that ``vmr-host kill`` or its timeout asked for
        (``kill``: :attr:`Running.ended_by`): not a failure (``status: killed`` or ``timeout``,
        ``ended_by``), the signal it was sent and the one that ended it (SIGKILL when it
        outlived the grace period)."""
        self.state.emit(
            EventType.ENTRY_EXITED,
            **ended,
            duration=result.duration,
            status="timeout" if kill.get("ended_by") == "timeout" else "killed",
            details=killed_text(kill, result),
            **kill,
        )
        later = self._journal_done(entry.index, DONE, result.exit_code)
        if later is not None:
            await later
        self.state.wake()

    def _not_run(self, item: Prepared, running: Running, code: int) -> str:
        """Why an entry exited 127 ("command not found") or 126 ("not executable"), naming the program."""
        word = first_word(item.line)
        if code == NOT_EXECUTABLE_EXIT_CODE:
            path = os.path.join(item.workdir, word)
            if os.path.isfile(path) and not os.access(path, os.X_OK):
                mode = oct(os.stat(path).st_mode & 0o777)
                return (
                    f": {word!r} is not executable (mode {mode}); a drop is made executable only when "
                    "its data item says executable: true (as in FIREWHEEL 3.1.0): set it on that drop "
                    "(docs/firewheel.md)"
                )
        elif program_missing(word, item.workdir, (self.state.env or os.environ).get("PATH")):
            return f": {word!r} was not found (no such file, not on the PATH); the schedule goes on"
        last = running.stderr_tail.get("last", b"").decode("utf-8", "replace").strip()
        return f" (the shell's code for {_SHELL_CODES[code]!r})" + (f": {last}" if last else "")

    # ------------------------------------------------------------------ stop, status
    async def kill_running(self) -> None:
        """Terminate every running entry's process tree (in worker threads)."""
        running = list(self.running.values())
        for r in running:
            r.killed = True
        if running:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(None, r.process.kill_tree) for r in running))

    def kill_once(
        self, kill_id: str, index: int, signame: str, grace: float, by: Optional[str]
    ) -> Dict[str, Any]:
        """``vmr-host kill`` ``kill_id`` of entry ``index`` (:meth:`kill`), applied once: the
        outcome ``{"ok", "details", "index"}`` is journaled with the id (a resent kill gets it
        again, ``"repeated": True``) and marks the entry, so a restarted agent reports it killed
        instead of running it again."""
        journal = self.state.journal
        first = journal.applied_kill(kill_id)
        if first is not None:
            return {**first, "repeated": True}
        ok, details = self.kill(index, signame, grace, by)
        outcome = {"ok": ok, "details": details, "index": index}
        journal.record_kill(kill_id, outcome, index, self.running[index].ended_by if ok else None)
        self.state.syncer.save_soon()
        return outcome

    def kill(self, index: int, signame: str, grace: float, by: Optional[str]) -> Tuple[bool, str]:
        """``vmr-host kill``: send signal ``SIG<signame>`` to running entry ``index``'s process
        tree, SIGKILL what is left after ``grace`` s (a worker thread); its ``entry_exited`` then
        says ``ended_by: operator`` (and ``requested_by: by``). A negative-time entry ends its
        stage's wait like any end: the stage finishes and the next one begins.

        Returns:
            (True, what was done) or (False, why not: the entry is not running, and whether it
            never started, ended, could not run, or is no entry of the schedule).
        """
        running = self.running.get(index)
        if running is None or running.killed:
            return False, self._not_running(index)
        first = signal.Signals[f"SIG{signame}"]
        mark = {"ended_by": "operator", "requested_by": by, "kill_signal": first.name, "grace": grace}
        if not self._end_tree(running, mark):
            return True, f"entry {index} is being ended already ({(running.ended_by or {}).get('ended_by')})"
        after = "" if first == signal.SIGKILL else f", SIGKILL to what is left after {grace:g} s"
        return True, f"{first.name} sent to entry {index}'s process tree (pid {running.process.pid}){after}"

    def _time_out(self, running: Running, timeout: float) -> None:
        """``running``'s entry ran for its ``timeout`` s: its tree is ended as by ``vmr-host kill``
        (SIGTERM, SIGKILL after :data:`TIMEOUT_GRACE` s) and its ``entry_exited`` says
        ``ended_by: timeout``. The mark is journaled first: an agent restarted meanwhile does
        not run it again."""
        if self.running.get(running.entry.index) is not running or running.killed:
            return
        mark = {"ended_by": "timeout", "timeout": timeout, "kill_signal": "SIGTERM", "grace": TIMEOUT_GRACE}
        if self._end_tree(running, mark):
            self.state.journal.mark_killed(running.entry.index, mark)
            self.state.journal_changed()

    def _end_tree(self, running: Running, mark: Dict[str, Any]) -> bool:
        """Send ``mark["kill_signal"]`` to ``running``'s process tree and SIGKILL to what is left
        after ``mark["grace"]`` s (a worker thread), unless it is being ended already; ``mark``
        is what its ``entry_exited`` will say. Returns whether it was ended now."""
        if running.ended_by is not None:
            return False
        running.ended_by = mark
        first = int(signal.Signals[mark["kill_signal"]])
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(None, running.process.kill_tree, mark["grace"], first)
        job.add_done_callback(lambda f: f.cancelled() or f.exception())
        return True

    def _not_running(self, index: int) -> str:
        """Why entry ``index`` cannot be killed: it is not running, and what became of it."""
        entries = self.state.schedule.entries
        if not 0 <= index < len(entries):
            return f"no entry {index}: the schedule has {len(entries)} entries (0-{len(entries) - 1})"
        if entries[index].on_host:
            return f"entry {index} is an on_host entry: it runs on the host, not in this VM"
        state = self.state.journal.entry_state(index)
        if state is None:
            return f"entry {index} is not running: it has not started"
        if state == FAILED:
            return f"entry {index} is not running: it could not run (entry_failed)"
        if state == RUNNING:
            return f"entry {index} is not running: it ended, its end is being reported"
        code = self.state.journal.entry_outcomes()[index][1]
        how = f"exit code {code}" if code is not None else "by a signal, or with data only"
        return f"entry {index} is not running: it ended ({how})"

    def recover(self, schedule_entries: List[ScheduleEntry]) -> None:
        """Entries the journal says were running when the agent stopped: terminate what is left
        of their process trees, report them interrupted, and let them run again."""
        for index, rec in self.state.journal.running_entries().items():
            if schedule_entries[index].on_host:  # the host ran it: asked again, it answers once
                self.state.journal.forget(index)
                continue
            pid = rec.get("pid")
            killed = self.state.processes.kill_leftover(int(pid), rec.get("create_time"), 3.0) if pid else []
            kill = self.state.journal.killed_by(index)
            if kill is not None:  # vmr-host kill asked for its end: it does not run again
                self.state.emit(
                    EventType.ENTRY_EXITED, index=index, executable=schedule_entries[index].executable,
                    exit_code=rec.get("exit_code"), signal=None, killed_pids=killed,
                    status="timeout" if kill.get("ended_by") == "timeout" else "killed",
                    details=f"{killed_text(kill, None)}; the agent restarted before its end was reported",
                    **kill,
                )  # fmt: skip
                self.state.journal.mark_done(index, DONE, rec.get("exit_code"))
                continue
            self.state.emit(
                EventType.ENTRY_INTERRUPTED,
                index=index,
                executable=schedule_entries[index].executable,
                killed_pids=killed,
                details="it had ended, but its reports were not on disk yet when the agent stopped "
                "(a full state dir); runs again"
                if rec.get("reports_held")
                else "was running when the agent stopped; runs again",
            )
            self.state.journal.forget(index)

    def status(self) -> List[Dict[str, Any]]:
        """The running entries for ``vmr-handler status``: index, executable, pid, seconds running."""
        mono = self.state.clock.monotonic()
        return [
            {
                "index": r.entry.index,
                "executable": r.entry.executable,
                "pid": r.process.pid,
                "running_for": mono - r.started_mono,
            }
            for r in self.running.values()
        ]


def killed_text(kill: Dict[str, Any], result: Optional[ProcessResult]) -> str:
    """What an entry ended by ``vmr-host kill`` or its timeout says of its end (``kill``: its
    :attr:`Running.ended_by`; ``result``: how its process ended, None when unknown):
    ``killed by operator (SIGTERM)`` or ``timed out after 30 s (SIGTERM)``, then how it ended when
    that is not by the signal sent (SIGKILL after the grace period, or an exit code: the program
    caught the signal and exited)."""
    sent = str(kill.get("kill_signal"))
    text = f"killed by operator ({sent})"
    if kill.get("ended_by") == "timeout":
        text = f"timed out after {kill.get('timeout'):g} s ({sent})"
    if result is None or (result.signal is not None and signal_name(result.signal) == sent):
        return text
    if result.signal == signal.SIGKILL:
        return text + f": still running after the {kill.get('grace'):g} s grace period, ended by SIGKILL"
    if result.signal is not None:
        return text + f": ended by {signal_name(result.signal)}"
    return text + f": it exited with code {result.exit_code}"


def signal_name(number: int) -> str:
    """``15`` -> ``SIGTERM``; a number no signal has -> ``signal 99``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
