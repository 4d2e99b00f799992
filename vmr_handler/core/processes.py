"""Processes the agent and the host run: one program and its output, followed to the end, and
its whole process tree killed (psutil).

Shared by the agent's entries (:mod:`vmr_handler.agent.machine.executor`) and the host's on_host
entries (:mod:`vmr_handler.host.serve.experiment.hostentries`), so neither imports the other.

* :class:`ProcessRunner` -- start a command in its own session, stream stdout/stderr line by
  line while it runs (:data:`OutputCallback`), report exit code or signal and duration;
* :func:`kill_tree` -- signal a process tree (SIGTERM, or the signal asked for), SIGKILL what is
  left after a grace period;
* :func:`spawn_with_default_signals` -- programs start with the default action of the signals
  they may be sent, even when this process ignores them (``nohup``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Dict, List, Optional

import psutil

from vmr_handler.core.errors import EntryError

#: Longest piece of one output line carried in one event, bytes; longer lines are split
#: into pieces marked ``continued`` (lossless).
MAX_LINE_PIECE = 64 * 1024


OutputCallback = Callable[[str, bytes, bool, bool], Optional[Awaitable[None]]]
"""``(stream, piece, continued, eol)``: ``continued`` = the line goes on in the next piece;
``eol`` = the piece ended with a newline (False for a last line without one). It may return
an awaitable: the pipe is not read again before it is done (back-pressure while reports
cannot be written)."""


#: Signals a program may be sent (``vmr-host kill --signal``, a timeout, the agent's stop) or
#: expect at their default action.
INHERITED_SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM")


#: What :func:`spawn_with_default_signals` changed, once it ran in the main thread.
_DEFAULTS: List[List[str]] = []


def _ignored(signum: int, frame: object) -> None:
    """The handler that stands for an ignored signal (see :func:`spawn_with_default_signals`)."""


def spawn_with_default_signals() -> List[str]:
    """Make every program this process starts from now on begin with the default action of
    :data:`INHERITED_SIGNALS`, while this process keeps ignoring the ones it ignored.

    A signal set to "ignore" is inherited across ``exec`` (POSIX), so an agent started with
    SIGHUP ignored (``nohup``, some init systems and service managers) would start entries that
    ignore SIGHUP: ``vmr-host kill --signal HUP`` would then wait out the grace and SIGKILL them.
    A handler is reset to the default by ``exec``: each ignored signal gets a handler that does
    nothing. Only the main thread may change handlers; elsewhere nothing changes.

    Done once per process (:data:`_DEFAULTS`); later calls return what the first one changed.

    Returns:
        The names of the signals that were ignored (and are now handled by doing nothing).
    """
    if _DEFAULTS:
        return _DEFAULTS[0]
    changed: List[str] = []
    for name in INHERITED_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, _ignored)
                changed.append(name)
        except (ValueError, OSError):  # not the main thread: tried again at the next spawn
            return changed
    _DEFAULTS.append(changed)
    return changed


async def _pump(reader: Optional[asyncio.StreamReader], stream: str, on_output: OutputCallback) -> None:
    if reader is None:
        return
    buf = b""
    waiter: Optional[Awaitable[None]] = None
    while True:
        if waiter is not None:
            await waiter  # reports are held: the entry waits on its full pipe meanwhile
            waiter = None
        chunk = await reader.read(MAX_LINE_PIECE)
        if not chunk:
            break
        buf += chunk
        lines = 0
        while True:
            nl = buf.find(b"\n")
            if nl < 0 or nl > MAX_LINE_PIECE:
                break
            waiter = on_output(stream, buf[:nl], False, True) or waiter
            buf = buf[nl + 1 :]
            lines += 1
            if lines % 256 == 0:
                await asyncio.sleep(0)  # a chunk can hold thousands of lines: let acks and timers in
        while len(buf) > MAX_LINE_PIECE:
            waiter = on_output(stream, buf[:MAX_LINE_PIECE], True, False) or waiter
            buf = buf[MAX_LINE_PIECE:]
    if buf:
        on_output(stream, buf, False, False)


@dataclass
class ProcessResult:
    """How a process ended: ``exit_code`` (None if killed by ``signal``), ``duration`` seconds."""

    exit_code: Optional[int]
    signal: Optional[int]
    duration: float


class ProcessRunner:
    """Starts one command and follows it to the end.

    Usage: ``pid = await runner.start(argv, cwd)`` then ``result = await runner.wait()``.

    Args:
        on_output: called for every output line piece (see :data:`OutputCallback`).
    """

    def __init__(self, on_output: OutputCallback) -> None:
        self._on_output = on_output
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._pumps: Optional[Awaitable[object]] = None
        self._t0 = 0.0
        self.pid: Optional[int] = None
        self.create_time: Optional[float] = None

    async def start(self, argv: List[str], cwd: str, env: Optional[Dict[str, str]] = None) -> int:
        """Spawn ``argv`` in ``cwd`` in a new session, stdin /dev/null, pipes for output.

        Returns:
            The pid.

        Raises:
            EntryError: the process could not be started.
        """
        self._t0 = time.monotonic()
        spawn_with_default_signals()  # once per process
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise EntryError(f"cannot start {argv!r}: {exc.strerror or exc}") from exc
        self.pid = self._proc.pid
        try:
            self.create_time = psutil.Process(self.pid).create_time()
        except psutil.Error:
            self.create_time = None
        self._pumps = asyncio.gather(
            _pump(self._proc.stdout, "stdout", self._on_output),
            _pump(self._proc.stderr, "stderr", self._on_output),
        )
        return self.pid

    async def wait(self) -> ProcessResult:
        """Wait until the process exits and its output is drained."""
        assert self._proc is not None and self._pumps is not None
        returncode = await self._proc.wait()
        await self._pumps
        duration = time.monotonic() - self._t0
        if returncode < 0:
            return ProcessResult(None, -returncode, duration)
        return ProcessResult(returncode, None, duration)

    def kill_tree(self, timeout: float = 3.0, first: int = signal.SIGTERM) -> None:
        """Send ``first`` to the process and all its descendants; SIGKILL what survives
        ``timeout`` s (:func:`kill_tree`)."""
        if self.pid is not None:
            kill_tree(self.pid, self.create_time, timeout, first)


def kill_tree(
    pid: int, create_time: Optional[float] = None, timeout: float = 3.0, first: int = signal.SIGTERM
) -> List[int]:
    """Send ``first`` (SIGTERM by default) to every process of a tree (psutil), then SIGKILL
    whatever is left after ``timeout`` s (at once when ``first`` is SIGKILL).

    Args:
        pid: root of the tree.
        create_time: if given, only act when the process still has this create time
            (protects against pid reuse after a reboot or crash).
        timeout: the grace period, seconds (monotonic).
        first: the signal number sent first (``signal.SIGTERM``, ``SIGINT``, ``SIGHUP``...).

    Returns:
        The pids that were signalled.
    """
    try:
        root = psutil.Process(pid)
        if create_time is not None and abs(root.create_time() - create_time) > 0.01:
            return []
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    # the root first: a parent that saw its children end first could exit 0 in between
    for proc in procs:
        try:
            proc.send_signal(first)
        except psutil.Error:
            pass
    left = set(_wait_tree(procs, 0.0 if first == signal.SIGKILL else timeout))
    alive = [p for p in procs if p in left]  # the root first again
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    _wait_tree(alive, timeout)
    return [p.pid for p in procs]


def _ended(proc: psutil.Process) -> bool:
    """Gone, or a zombie its parent has not reaped yet (it runs nothing any more)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_tree(procs: List[psutil.Process], timeout: float) -> List[psutil.Process]:
    """Wait up to ``timeout`` s for ``procs`` to end; returns those still running.

    This process's own children are never reaped here (``psutil.wait_procs`` would
    ``waitpid`` them and take their exit status from asyncio, which then reports 255 instead
    of the signal that ended the entry): for them "ended" means a zombie, polled every 10 ms.
    """
    me = os.getpid()
    own: List[psutil.Process] = []
    others: List[psutil.Process] = []
    for proc in procs:
        try:
            (own if proc.ppid() == me else others).append(proc)
        except psutil.Error:
            continue
    deadline = time.monotonic() + timeout
    _gone, alive = psutil.wait_procs(others, timeout=timeout)
    while own and time.monotonic() < deadline:
        own = [p for p in own if not _ended(p)]
        if own:
            time.sleep(0.01)
    return [*alive, *[p for p in own if not _ended(p)]]
