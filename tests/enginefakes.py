"""Parts for engine unit tests: scripted processes on a FakeClock, and an engine harness.

A :class:`FakeProcesses` port "runs" a command line for a scripted number of virtual seconds
and exit code; nothing is forked. With :class:`~vmr_handler.core.clock.FakeClock` the engine's
SPEC section 4 behaviour is checked at exact instants in milliseconds of wall time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from vmr_handler.agent.engine.appends import restore
from vmr_handler.agent.engine.engine import Engine, EngineConfig
from vmr_handler.agent.engine.ports import OutputCallback
from vmr_handler.agent.machine.executor import ProcessResult
from vmr_handler.agent.state.journal import Journal
from vmr_handler.core.clock import FakeClock
from vmr_handler.core.events import Event
from vmr_handler.core.schedule import load_schedule_bytes

#: Virtual UTC the tests start at.
T0 = 1_800_000_000.0


class FakeProcess:
    """One scripted process: runs ``seconds`` of virtual time, then exits with ``code``."""

    def __init__(self, owner: FakeProcesses, on_output: OutputCallback) -> None:
        self.owner = owner
        self.on_output = on_output
        self.pid: Optional[int] = None
        self.create_time: Optional[float] = None
        self.line = ""
        self._done: Optional[asyncio.Future[ProcessResult]] = None
        self._t0 = 0.0
        self._output = b""

    async def start(self, argv: List[str], cwd: str, env: Optional[Dict[str, str]] = None) -> int:
        self.line = argv[-1].rstrip("\n").rsplit("\n", 1)[-1]  # the entry's line after the cd
        clock = self.owner.clock
        self.owner.started.append((clock.time(), self.line))
        self.owner.workdir_at_start[self.line] = sorted(os.listdir(cwd)) if os.path.isdir(cwd) else None
        seconds, code, output = self.owner.script.get(self.line, (0.0, 0, b""))
        self.pid = next(self.owner.pids)
        self.create_time = clock.time()
        self._t0 = clock.monotonic()
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self.owner.live[self.pid] = self
        self._output = output
        clock.call_at(clock.time() + seconds, self._end, code, None)
        return self.pid

    def _end(self, code: Optional[int], signal: Optional[int]) -> None:
        assert self._done is not None
        if not self._done.done():
            if self._output and signal is None:
                self.on_output("stdout", self._output, False, True)
            self.owner.live.pop(self.pid or 0, None)
            self._done.set_result(ProcessResult(code, signal, self.owner.clock.monotonic() - self._t0))

    async def wait(self) -> ProcessResult:
        assert self._done is not None
        return await self._done

    def kill_tree(self, timeout: float = 3.0, first: int = 15) -> None:
        """Called from a worker thread, as the real one: ends by signal ``first``."""
        self.owner.kills.append((self.line, first, timeout))
        self.owner.loop.call_soon_threadsafe(self._end, None, first)


class FakeProcesses:
    """The :class:`~vmr_handler.agent.engine.ports.Processes` port, scripted.

    Args:
        clock: the fake clock processes run on.
        script: command line -> (virtual seconds, exit code, one stdout line); default (0, 0, b"").
    """

    def __init__(
        self, clock: FakeClock, script: Optional[Dict[str, Tuple[float, int, bytes]]] = None
    ) -> None:
        self.clock = clock
        self.script = dict(script or {})
        self.started: List[Tuple[float, str]] = []
        self.reboots: List[str] = []
        self.leftovers: List[int] = []
        #: (command line, first signal, grace seconds) of every kill_tree
        self.kills: List[Tuple[str, int, float]] = []
        self.pids = itertools.count(1000)
        self.live: Dict[int, FakeProcess] = {}
        #: command line -> the names in its working dir when it was started (None: no dir)
        self.workdir_at_start: Dict[str, Optional[List[str]]] = {}
        self.loop = asyncio.get_event_loop()

    def process(self, on_output: OutputCallback) -> FakeProcess:
        return FakeProcess(self, on_output)

    def kill_leftover(self, pid: int, create_time: Optional[float], timeout: float = 3.0) -> List[int]:
        self.leftovers.append(pid)
        return [pid]

    async def reboot(self, command: str, env: Optional[Dict[str, str]]) -> None:
        self.reboots.append(command)

    def started_at(self, line: str) -> List[float]:
        """Virtual UTC instants at which ``line`` was started."""
        return [t for t, started in self.started if started == line]


class Harness:
    """One engine on a fake clock, with its events, in ``root`` (state and launch dirs).

    Args:
        root: a temporary directory.
        schedule: schedule records (the JSON form).
        script: see :class:`FakeProcesses`.
        clock: share a clock between two harnesses (a restart); default a new one at :data:`T0`.
        **config: :class:`EngineConfig` fields (``start_buffer`` defaults to 5 s).
    """

    def __init__(
        self,
        root: Path,
        schedule: List[Dict[str, Any]],
        script: Optional[Dict[str, Tuple[float, int, bytes]]] = None,
        clock: Optional[FakeClock] = None,
        **config: Any,
    ) -> None:
        self.clock = clock or FakeClock(T0)
        self.schedule = load_schedule_bytes(json.dumps(schedule).encode())
        config.setdefault("start_buffer", 5.0)
        self.config = EngineConfig(
            launch_dir=str(root / "launch"), state_dir=str(root / "state"), shell="/bin/sh", **config
        )
        (root / "launch").mkdir(exist_ok=True)
        (root / "state").mkdir(exist_ok=True)
        self.processes = FakeProcesses(self.clock, script)
        self.events: List[Event] = []
        self.journal = Journal(self.config.state_dir, self.schedule.digest)
        self.schedule = restore(self.schedule, self.journal, self.config.state_dir)  # batches appended before
        self.engine = Engine(
            schedule=self.schedule,
            config=self.config,
            sink=self.events.append,
            clock=self.clock,
            processes=self.processes,
            journal=self.journal,
        )
        self.task: Optional[asyncio.Task[int]] = None

    async def start(self) -> None:
        """Start ``engine.run()`` and let it get past the data preload (a worker thread)."""
        self.task = asyncio.ensure_future(self.engine.run())
        await self.until(lambda: self.engine.phase not in ("starting", "placing data"))

    async def until(self, condition: Callable[[], bool], real_timeout: float = 10.0) -> None:
        """Give the loop turns (and worker threads real milliseconds) until ``condition()``:
        for what runs in threads (data preload, process-tree kills), never for timing."""
        deadline = time.monotonic() + real_timeout
        await self.clock.advance(0)
        while not condition():
            assert time.monotonic() < deadline, f"condition not reached: {self.engine.status()}"
            await asyncio.sleep(0.002)
            await self.clock.advance(0)

    async def stopped(self) -> int:
        """Wait (a thread hop, no virtual time) for ``run()`` to return after ``engine.stop()``."""
        assert self.task is not None
        task = self.task
        await self.until(task.done)
        return task.result()

    async def finish(self, limit: float = 10_000.0) -> int:
        """Advance virtual time until the engine returns (at most ``limit`` virtual seconds)."""
        assert self.task is not None
        waited = 0.0
        while not self.task.done() and waited < limit:
            await self.clock.advance(0)  # what is ready now runs first
            nxt = self.clock.next_timer()
            if self.task.done() or nxt is None:
                break  # done, or nothing armed: the engine waits for an input
            step = max(0.0, min(nxt - self.clock.time(), limit - waited))
            await self.clock.advance(step)
            waited += step
        assert self.task.done(), f"engine still running after {limit} virtual s: {self.engine.status()}"
        return self.task.result()

    def of(self, type_: str) -> List[Event]:
        """Events of one type, in order."""
        return [e for e in self.events if e.type == type_]

    def types(self) -> List[str]:
        return [e.type for e in self.events]

    async def started(self) -> float:
        """The experiment start time, once the engine has set it (no virtual time passes: only
        what is due now runs)."""
        await self.until(lambda: self.journal.start_time is not None)
        start = self.journal.start_time
        assert start is not None
        return start
