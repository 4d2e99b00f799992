"""``on_host`` entries, run on the host when a VM's agent asks (reference
``vm_resource_handler.py`` ``run_vm_resource_host``, ``docs/host.md`` "on_host entries").

The agent reaches an on_host entry (inside its negative stage, or at its pause-shifted positive
time) and sends ``host_entry`` ``{"index", "scheduled"}``; the host answers with a ``result``
once the program ended (``status``, ``details``, ``exit_code``, ``signal``, ``refused``).

* What runs comes from the host's copy of the VM's schedule (``entry_of(vm, index)``), never
  from the guest: an index that is not an on_host entry of it is refused (the session counts
  a protocol error) and nothing runs.
* Without ``vmr-host serve --host-entries`` every request is refused (``refused: true``) and
  the VM's log says why once (``entry_skipped``, ``status: error``): a schedule could
  otherwise run code on the host.
* The program and its environment (:mod:`~vmr_handler.host.serve.experiment.onhost`): an
  absolute path; ``minimega`` with its arguments (``minimega -e ARGS``, found on the host's
  PATH); or a file of the host's ``--resources`` directory (confined as resources are: no
  ``..``, no symlink out; made executable in a copy when its drop says ``executable: true``).
  The arguments are the entry's string split as a shell would (``shlex``), never run by a
  shell. The environment carries FIREWHEEL 3.1.0's ``FIREWHEEL_*`` variables.
* It runs as an asyncio subprocess on the host's loop (:class:`~vmr_handler.core.processes.ProcessRunner`)
  in ``<logs>/host_entries/<vm>/<index>/``, at most :data:`MAX_PER_VM` per VM and
  :data:`MAX_TOTAL` in all at once (more wait their turn). Its start, output and end are
  written to that VM's log as the agent's are (``entry_started``, ``output``,
  ``entry_exited``/``entry_failed``, with ``on_host: true``), so status, logs, the report and
  the console show them.
* Exactly once: every outcome is kept in ``<logs>/host_entries/<vm>.json`` (atomic writes).
  A request for an entry that runs is answered when it ends; for one that ended, at once
  with the recorded outcome and no new events. One that ran when vmr-host died is recorded as
  interrupted at the next start (what is left of its process tree is killed) and answered
  with an error; vmr-host stopping kills the trees of those that run (psutil) and records
  them so. Reboot requests (exit code 10) are refused, as in the reference.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from vmr_handler.core.errors import (
    EntryError,
    HostSetupError,
    ResourceRefused,
    SavedStateError,
    ScheduleError,
)
from vmr_handler.core.events import Event, EventType, encode_output
from vmr_handler.core.processes import ProcessResult, ProcessRunner, kill_tree
from vmr_handler.core.schedule.appended import batch_entries
from vmr_handler.core.schedule.model import ScheduleEntry
from vmr_handler.core.wire.protocol import result_data
from vmr_handler.host.logs.store import atomic_write_json
from vmr_handler.host.serve.config import VmSpec
from vmr_handler.host.serve.experiment.appendbook import AppendBook
from vmr_handler.host.serve.experiment.onhost import host_command, host_entry_env
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.session.api import HostEntrySink, HostEvents

log = logging.getLogger("vmr_handler.host")

#: Directory under the logs: ``<vm>.json`` outcomes, ``<vm>/<index>/`` working dirs.
HOST_ENTRIES_DIR = "host_entries"
#: Host-entry processes running at once for one VM, and in all (more wait their turn).
MAX_PER_VM = 8
MAX_TOTAL = 64
#: Requests waiting for one running entry's answer (an agent re-asks after a reconnection;
#: only the latest few are kept).
MAX_WAITERS = 16
#: Seconds a process tree is given to end after SIGTERM before SIGKILL.
KILL_TIMEOUT = 3.0
#: The exit code with which an entry asks for a reboot (reference): refused on the host.
REBOOT_EXIT_CODE = 10

DISABLED = (
    "on_host entry not run: start vmr-host serve with --host-entries to run on_host entries on this host"
)
RESTARTED = "vmr-host restarted while it ran; not run again"
STOPPED = "vmr-host stopped while it ran (its process tree was killed); not run again"

RUNNING, ENDED, INTERRUPTED = "running", "ended", "interrupted"

#: ``entry_of(vm, index)``: the on_host entry ``index`` of ``vm``'s schedule as the host holds
#: it, or None (no such entry, or not an on_host one).
EntryLookup = Callable[[str, int], Optional[ScheduleEntry]]


def schedule_lookup(
    specs: Mapping[str, VmSpec], allow: Sequence[str], book: Optional[AppendBook] = None
) -> EntryLookup:
    """The default :data:`EntryLookup`: each VM's schedule as the host delivers it
    (``spec.schedule_bytes``), loaded by the restricted loader with the ``--allow-class``
    names ``allow`` the first time the VM asks; its on_host entries are kept. An index past
    them is looked for in the batches ``book`` says the VM appended (``vmr-host schedule add``:
    entries the operator wrote, numbered as the agent answered)."""
    cache: Dict[str, Dict[int, ScheduleEntry]] = {}

    def entry_of(vm: str, index: int) -> Optional[ScheduleEntry]:
        entries = cache.get(vm)
        if entries is None:
            spec = specs.get(vm)
            if spec is None:
                return None
            from vmr_handler.core.schedule.loader import load_schedule_bytes

            try:
                schedule = load_schedule_bytes(spec.schedule_bytes, allow)
            except ScheduleError as exc:  # it loaded when the host started: not expected
                log.error("%s: cannot load its schedule again for on_host entries: %s", vm, exc)
                schedule = None
            entries = {e.index: e for e in schedule.entries if e.on_host} if schedule else {}
            cache[vm] = entries
        found = entries.get(index)
        return found if found is not None or book is None else appended_entry(book, vm, index, allow)

    return entry_of


def appended_entry(book: AppendBook, vm: str, index: int, allow: Sequence[str]) -> Optional[ScheduleEntry]:
    """On_host entry ``index`` of a batch ``vm`` appended, or None (not one, or unreadable)."""
    for record in book.accepted(vm):
        answer = record.answered[vm]
        first = answer.get("first_index")
        if isinstance(first, int) and first <= index < first + record.entries:
            try:
                entry = batch_entries(book.raw(record), first, answer.get("moved"), allow)[index - first]
            except (OSError, ScheduleError, IndexError, ValueError, TypeError) as exc:
                log.error("%s: batch %s cannot be read for on_host entry %d: %s", vm, record.id, index, exc)
                return None
            return entry if entry.on_host else None
    return None


@dataclass
class Outcome:
    """What became of one on_host entry (kept in ``<logs>/host_entries/<vm>.json``).

    Attributes:
        state: ``running`` (spawned, or about to be), ``ended`` (ran to its end, or could not
            start) or ``interrupted`` (vmr-host stopped or died while it ran).
        ok: it exited 0.
        details: what the answer says (``exit code 3``, why it was refused...).
        exit_code, signal: how its process ended (None when it did not run, or by the other).
        refused: the host would not run it (its program is not allowed).
        pid, create_time: its process (to kill what is left after vmr-host died).
        started, ended: host UTC of its spawn and of its end (None when not).
    """

    state: str
    ok: bool = False
    details: str = ""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    refused: bool = False
    pid: Optional[int] = None
    create_time: Optional[float] = None
    started: Optional[float] = None
    ended: Optional[float] = None

    def answer(self, request_id: str) -> Dict[str, Any]:
        """The ``result`` data answering request ``request_id`` with this outcome."""
        extra = {"exit_code": self.exit_code, "signal": self.signal, "refused": self.refused}
        return result_data(request_id, self.ok, self.details, **extra)

    @classmethod
    def parse(cls, data: Any) -> Outcome:
        """An outcome saved by :func:`asdict`.

        Raises:
            SavedStateError, TypeError: ``data`` is not one.
        """
        if not isinstance(data, dict) or data.get("state") not in (RUNNING, ENDED, INTERRUPTED):
            raise SavedStateError(f"not an on_host entry outcome: {data!r:.200}")
        return cls(**data)


class _OutputEvents:
    """An entry's ``output`` reports (the agent's shape), written to the VM's log once per
    loop iteration rather than line by line."""

    def __init__(self, sink: HostEntrySink, events: HostEvents, index: int) -> None:
        self.sink = sink
        self.events = events
        self.index = index
        self.seq = {"stdout": 0, "stderr": 0}
        self.pending: List[Event] = []

    def __call__(self, stream: str, piece: bytes, continued: bool, eol: bool) -> None:
        self.seq[stream] += 1
        data = {"index": self.index, "stream": stream, "seq": self.seq[stream], "continued": continued}
        self.pending.append(
            self.events.make(EventType.OUTPUT.value, {**data, "eol": eol, **encode_output(piece)})
        )
        if len(self.pending) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is pending."""
        if self.pending:
            pending, self.pending = self.pending, []
            self.sink.record(pending, self.events.clock.time())


class HostEntryRunner:
    """Runs the VMs' on_host entries when their agents ask, each at most once.

    Args:
        enabled: ``--host-entries`` was given (else every request is refused).
        logs: the logs directory (outcomes and working dirs under :data:`HOST_ENTRIES_DIR`).
        sinks: VM name -> its session (the server's dict, filled before any request).
        entry_of: the on_host entries of the host's copy of each VM's schedule.
        resources: the ``--resources`` store (relative programs are its files).
        events: the host's event maker (and its clock).
        per_vm, total: processes at once per VM and in all.
        path: the PATH ``minimega`` is looked up on (None: this process's).
        specs: the served VMs (their schedule files, told to the entries in
            ``FIREWHEEL_VM_CONFIG_JSON``; :func:`~vmr_handler.host.serve.experiment.onhost.host_entry_env`).
    """

    def __init__(
        self,
        enabled: bool,
        logs: str,
        sinks: Mapping[str, HostEntrySink],
        entry_of: EntryLookup,
        resources: ResourceStore,
        events: HostEvents,
        per_vm: int = MAX_PER_VM,
        total: int = MAX_TOTAL,
        path: Optional[str] = None,
        specs: Optional[Mapping[str, VmSpec]] = None,
    ) -> None:
        self.enabled = enabled
        self.specs: Mapping[str, VmSpec] = specs or {}
        self.root = os.path.join(logs, HOST_ENTRIES_DIR)
        self.sinks = sinks
        self.entry_of = entry_of
        self.resources = resources
        self.events = events
        self.clock = events.clock  # the host's clock: what happened when, as the reports say
        self.per_vm, self.total = per_vm, total
        self.path = path
        self.outcomes: Dict[str, Dict[int, Outcome]] = {}
        self._slots: Dict[str, asyncio.Semaphore] = {}  # per VM, and "" for all (made on the loop)
        self._waiters: Dict[Tuple[str, int], List[str]] = {}
        self._tasks: Dict[Tuple[str, int], asyncio.Task[None]] = {}
        self._procs: Dict[Tuple[str, int], ProcessRunner] = {}
        self._refused_noted: Set[Tuple[str, int]] = set()
        self._stopping = False
        self._killed: Set[Tuple[str, int]] = set()  # entries whose tree vmr-host killed as it stopped

    # ------------------------------------------------------------------ set-up
    def open(self) -> None:
        """Read every VM's outcomes; an entry that was running when vmr-host died is recorded
        as interrupted (the VM's log says so) and what is left of its process tree is killed.
        Call once the sessions are open, before serving.

        Raises:
            HostSetupError: an outcomes file cannot be read or written (nothing runs twice:
                the host does not start rather than forget what ran).
        """
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HostSetupError(f"cannot read {self.root}: {exc.strerror or exc}") from exc
        for name in names:
            vm, suffix = os.path.splitext(name)
            if suffix == ".json" and vm in self.sinks:
                self._load(vm)

    def _load(self, vm: str) -> None:
        path = self._file(vm)
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            outcomes = {int(i): Outcome.parse(o) for i, o in doc["entries"].items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise HostSetupError(
                f"cannot read {path} (what the on_host entries of {vm} did): {exc}; "
                "remove it only if none of them may have run"
            ) from exc
        self.outcomes[vm] = outcomes
        died = {i: o for i, o in outcomes.items() if o.state == RUNNING}
        for index, outcome in died.items():
            killed = kill_tree(outcome.pid, outcome.create_time, KILL_TIMEOUT) if outcome.pid else []
            outcome.state, outcome.ok, outcome.details = INTERRUPTED, False, RESTARTED
            outcome.ended = self.clock.time()
            entry = self.entry_of(vm, index)
            data = {"index": index, "executable": entry.executable if entry else None, "exit_code": None,
                    "signal": None, "details": RESTARTED, "killed_pids": killed, "on_host": True}  # fmt: skip
            interrupted = self.events.make(EventType.ENTRY_INTERRUPTED.value, data)
            self.sinks[vm].record([interrupted], self.clock.time())
        if died:
            try:
                self._save(vm)
            except OSError as exc:
                raise HostSetupError(f"cannot write {path}: {exc.strerror or exc}") from exc

    def _file(self, vm: str) -> str:
        return os.path.join(self.root, f"{vm}.json")

    def _save(self, vm: str) -> None:
        """Write ``vm``'s outcomes (atomic).

        Raises:
            OSError: it cannot be written.
        """
        os.makedirs(self.root, mode=0o750, exist_ok=True)
        entries = {str(i): asdict(o) for i, o in sorted(self.outcomes.get(vm, {}).items())}
        atomic_write_json(self._file(vm), {"version": 1, "vm": vm, "entries": entries})

    # ------------------------------------------------------------------ requests
    def request(
        self, vm: str, request_id: str, index: Optional[int], scheduled: Optional[float]
    ) -> Optional[str]:
        """``vm``'s agent asks (request ``request_id``) that its on_host entry ``index`` be run,
        due at host UTC ``scheduled`` (None in a negative stage). Answered through the VM's
        sink: at once (refused, or already ended) or when the program ends.

        Returns:
            The problem when ``index`` is not an on_host entry of the host's copy of the VM's
            schedule (answered ``refused``; the caller counts a protocol error), else None.
        """
        sink = self.sinks[vm]
        entry = self.entry_of(vm, index) if index is not None else None
        if index is None or entry is None or not entry.on_host:
            problem = f"host_entry for entry {index!r} refused: not an on_host entry of this VM's schedule"
            sink.answer(request_id, Outcome(ENDED, details=problem, refused=True).answer(request_id))
            return problem
        if not self.enabled:
            self._refuse_disabled(vm, sink, request_id, entry)
            return None
        key = (vm, index)
        waiters = self._waiters.get(key)
        if waiters is not None:  # running now: answered when it ends
            waiters.append(request_id)
            del waiters[:-MAX_WAITERS]
            return None
        known = self.outcomes.get(vm, {}).get(index)
        if known is not None:  # ended (or interrupted): the recorded outcome, nothing new
            sink.answer(request_id, known.answer(request_id))
            return None
        if self._stopping:
            return None  # vmr-host stops: the agent asks again after its restart
        self._waiters[key] = [request_id]
        self._tasks[key] = asyncio.ensure_future(self._run(vm, sink, entry, scheduled))
        return None

    def _refuse_disabled(self, vm: str, sink: HostEntrySink, request_id: str, entry: ScheduleEntry) -> None:
        if (vm, entry.index) not in self._refused_noted:  # said once per host run
            self._refused_noted.add((vm, entry.index))
            data = {"index": entry.index, "executable": entry.executable, "start_time": entry.start_time,
                    "status": "error", "details": DISABLED, "on_host": True}  # fmt: skip
            sink.record([self.events.make(EventType.ENTRY_SKIPPED.value, data)], self.clock.time())
        sink.answer(request_id, Outcome(ENDED, details=DISABLED, refused=True).answer(request_id))

    # ------------------------------------------------------------------ running
    async def _run(
        self, vm: str, sink: HostEntrySink, entry: ScheduleEntry, scheduled: Optional[float]
    ) -> None:
        key = (vm, entry.index)
        own = self._slots.setdefault(vm, asyncio.Semaphore(self.per_vm))
        every = self._slots.setdefault("", asyncio.Semaphore(self.total))
        outcome: Optional[Outcome] = None
        try:
            async with own, every:
                if not self._stopping:
                    outcome = await self._execute(vm, sink, entry, scheduled)
        finally:
            waiters = self._waiters.pop(key, [])
            self._tasks.pop(key, None)
            self._procs.pop(key, None)
        if outcome is not None:
            for request_id in waiters:
                sink.answer(request_id, outcome.answer(request_id))

    def _keep(self, vm: str, index: int, outcome: Outcome) -> Outcome:
        """Record ``outcome`` of ``vm``'s entry ``index`` (logged when it cannot be written)."""
        self.outcomes.setdefault(vm, {})[index] = outcome
        try:
            self._save(vm)
        except OSError as exc:
            log.error("%s: cannot record what on_host entry %d did in %s: %s", vm, index, self.root, exc)
        return outcome

    def _failed(self, vm: str, sink: HostEntrySink, entry: ScheduleEntry, exc: Exception) -> Outcome:
        """``entry`` could not start (``exc``): reported as the agent reports it, recorded."""
        refused = isinstance(exc, ResourceRefused)
        data = {"index": entry.index, "executable": entry.executable, "status": "error", "details": str(exc),
                "refused": refused, "on_host": True}  # fmt: skip
        sink.record([self.events.make(EventType.ENTRY_FAILED.value, data)], self.clock.time())
        return self._keep(
            vm, entry.index, Outcome(ENDED, details=str(exc), refused=refused, ended=self.clock.time())
        )

    async def _execute(
        self, vm: str, sink: HostEntrySink, entry: ScheduleEntry, scheduled: Optional[float]
    ) -> Outcome:
        index = entry.index
        workdir = os.path.join(self.root, vm, str(index))
        try:
            argv = host_command(entry, self.resources, self.path, workdir)
            os.makedirs(workdir, mode=0o750, exist_ok=True)
            self.outcomes.setdefault(vm, {})[index] = Outcome(RUNNING)
            self._save(vm)  # before the spawn: a host that dies now never runs it again
        except (EntryError, ResourceRefused) as exc:
            return self._failed(vm, sink, entry, exc)
        except OSError as exc:
            self.outcomes.get(vm, {}).pop(index, None)
            return self._failed(vm, sink, entry, EntryError(f"cannot prepare {workdir}: {exc}; not run"))
        output = _OutputEvents(sink, self.events, index)
        runner = ProcessRunner(output)
        spawned_at = self.clock.time()
        try:
            spec = self.specs.get(vm)
            pid = await runner.start(argv, workdir, host_entry_env(vm, spec.schedule_path if spec else None))
        except EntryError as exc:
            return self._failed(vm, sink, entry, exc)
        self._procs[(vm, index)] = runner
        if self._stopping:  # vmr-host began to stop while it spawned
            self._killed.add((vm, index))
            await asyncio.to_thread(runner.kill_tree, KILL_TIMEOUT)
        running = Outcome(RUNNING, pid=pid, create_time=runner.create_time, started=spawned_at)
        self._keep(vm, index, running)
        extra: Dict[str, Any] = {}
        if scheduled is not None:
            extra = {"scheduled": scheduled, "spawned_at": spawned_at, "lateness": spawned_at - scheduled}
        started = {"index": index, "executable": entry.executable, "command": shlex.join(argv),
                   "pid": pid, "start_time": entry.start_time, "working_dir": workdir, "on_host": True,
                   **extra}  # fmt: skip
        sink.record([self.events.make(EventType.ENTRY_STARTED.value, started)], self.clock.time())
        result = await runner.wait()
        output.flush()
        return self._exited(vm, sink, entry, result, running)

    def _exited(
        self, vm: str, sink: HostEntrySink, entry: ScheduleEntry, result: ProcessResult, running: Outcome
    ) -> Outcome:
        """``entry``'s process ended with ``result``: its ``entry_exited`` (or, when vmr-host
        stopped it, ``entry_interrupted``) report and its recorded outcome."""
        ended = {"index": entry.index, "executable": entry.executable, "exit_code": result.exit_code,
                 "signal": result.signal, "on_host": True}  # fmt: skip
        outcome = Outcome(ENDED, exit_code=result.exit_code, signal=result.signal, pid=running.pid,
                          create_time=running.create_time, started=running.started,
                          ended=self.clock.time())  # fmt: skip
        if (vm, entry.index) in self._killed:
            outcome.state, outcome.details = INTERRUPTED, STOPPED
            event = self.events.make(EventType.ENTRY_INTERRUPTED.value, {**ended, "details": STOPPED})
        else:
            outcome.ok = result.exit_code == 0
            outcome.details = exit_text(result)
            status = "success" if outcome.ok else "error"
            data = {**ended, "duration": result.duration, "status": status, "details": outcome.details}
            event = self.events.make(EventType.ENTRY_EXITED.value, data)
        sink.record([event], self.clock.time())
        return self._keep(vm, entry.index, outcome)

    # ------------------------------------------------------------------ stop, status
    async def close(self) -> None:
        """vmr-host stops: kill the process trees of the entries that run (in worker threads;
        each recorded interrupted, answered when the agent is still connected), drop those
        waiting their turn (never run: asked again after the restart)."""
        self._stopping = True
        self._killed = set(self._procs)
        running = list(self._procs.values())
        await asyncio.gather(*(asyncio.to_thread(r.kill_tree, KILL_TIMEOUT) for r in running))
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def running(self) -> List[Tuple[str, int]]:
        """``(vm, index)`` of the on_host entries whose process runs now."""
        return sorted(self._procs)


class HostEntryPort:
    """How sessions reach the on_host entry runner: the experiment's
    :meth:`~vmr_handler.host.serve.session.api.HostApi.host_entry` (a base of
    :class:`~vmr_handler.host.serve.experiment.experiment.Experiment`, given its
    :attr:`host_entries` when made)."""

    host_entries: Optional[HostEntryRunner] = None

    def host_entry(
        self, vm: str, request_id: str, index: Optional[int], scheduled: Optional[float]
    ) -> Optional[str]:
        """:meth:`HostEntryRunner.request` (without a runner: the problem, answered by nobody)."""
        if self.host_entries is None:
            return "this host runs no on_host entries"
        return self.host_entries.request(vm, request_id, index, scheduled)


def exit_text(result: ProcessResult) -> str:
    """``exit code N`` or ``killed by signal S``; exit code 10 says the reboot it asks for is
    refused (reference: host-based VM resources cannot request reboots)."""
    if result.exit_code is None:
        return f"killed by signal {result.signal}"
    text = f"exit code {result.exit_code}"
    if result.exit_code == REBOOT_EXIT_CODE:
        text += " (a reboot request: refused for on_host entries, nothing is rebooted)"
    return text
