"""What the engine needs from the machine, as protocols (the engine's seams).

The engine (:mod:`vmr_handler.agent.engine.engine`) is given its parts -- a
:class:`~vmr_handler.core.clock.Clock`, a :class:`Processes` port, a journal and an event
sink -- and never discovers them. An appended batch's files come through a
:class:`BatchResources` (the connected agent's
:class:`~vmr_handler.agent.connected.resources.Resources`). The real ports are
:class:`~vmr_handler.agent.machine.executor.SystemProcesses`
(asyncio subprocesses, psutil process trees) and :class:`~vmr_handler.core.clock.SystemClock`;
tests pass a :class:`~vmr_handler.core.clock.FakeClock` and scripted processes.
"""

from __future__ import annotations

import signal
from typing import Any, Dict, List, Mapping, Optional, Protocol

from vmr_handler.agent.machine.executor import OutputCallback, ProcessResult
from vmr_handler.core.schedule.model import Schedule

__all__ = ["BatchResources", "OutputCallback", "Process", "Processes"]


class Process(Protocol):
    """One entry's process (tree): start it, wait for its end, terminate it."""

    pid: Optional[int]
    create_time: Optional[float]

    async def start(self, argv: List[str], cwd: str, env: Optional[Dict[str, str]] = None) -> int:
        """Spawn ``argv`` in ``cwd`` (fork before the first suspension) and return its pid.

        Raises:
            EntryError: the program cannot be started.
        """

    async def wait(self) -> ProcessResult:
        """Wait for the end of the process and of its output; how it ended."""

    def kill_tree(self, timeout: float = 3.0, first: int = signal.SIGTERM) -> None:
        """Send signal ``first`` to the process and its descendants, SIGKILL what is left after
        ``timeout`` s (blocking: call from a worker thread)."""


class Processes(Protocol):
    """Makes entry processes and handles what is left of earlier runs."""

    def process(self, on_output: OutputCallback) -> Process:
        """A new, not yet started process whose output goes to ``on_output``."""

    def kill_leftover(self, pid: int, create_time: Optional[float], timeout: float = 3.0) -> List[int]:
        """Terminate the tree of a process an earlier agent started (only if ``pid`` still has
        ``create_time``); the pids signalled."""

    async def reboot(self, command: str, env: Optional[Dict[str, str]]) -> None:
        """Run the reboot ``command`` with the shell (failures are logged, never raised)."""


class BatchResources(Protocol):
    """Fetches the VM-resource files an appended batch drops, before the batch is appended."""

    async def fetch_appended(self, announced: Mapping[str, Mapping[str, Any]], batch: Schedule) -> str:
        """Add ``announced`` (``{file name: {"sha256", "size"[, "url", "token"]}}``, as the
        ``schedule_append`` event announced them) to what the schedule announced, then fetch
        every file ``batch`` drops into the resource directory; that directory's path. A file
        that cannot be fetched is reported, never raised (its entry fails when it needs it)."""
