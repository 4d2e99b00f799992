"""Executor: working directories, data drops, exec paths, process trees and output (SPEC section 5).

Nothing here knows about stages or time; the engine decides *when*, this module does *what*.

* :func:`working_dirs` -- ``<launch>/<start_time>/<name>`` with ``_1``, ``_2`` suffixes,
  decided from the schedule alone so an entry gets the same directory after a reboot.
* :func:`place_data` -- atomic content/file drops with modes and sha256.
* :func:`resolve_exec` / :func:`shell_command` -- the reference's ``cd <dir>`` then
  ``<exec path> <arguments>`` through a POSIX shell.
* :class:`ProcessRunner` -- start a command in its own session, stream stdout/stderr line by
  line while it runs, report exit code and duration, kill the whole tree (psutil).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Dict, List, Optional

import psutil

from vmr_handler.errors import EntryError
from vmr_handler.schedule.model import ContentDrop, FileDrop, ScheduleEntry

#: Longest piece of one output line carried in one event, bytes; longer lines are split
#: into pieces marked ``continued`` (lossless).
MAX_LINE_PIECE = 64 * 1024
#: Name of the file an entry leaves in its working dir to request a reboot (reference).
REBOOT_FILE = "reboot"
#: Exit code with which an entry requests a reboot (reference).
REBOOT_EXIT_CODE = 10
SHELL = "/bin/sh"


def format_start_time(start_time: float) -> str:
    """Directory name for a start time: ``-100``, ``10``, ``2.5``, ``-inf``."""
    if math.isinf(start_time):
        return "-inf" if start_time < 0 else "inf"
    if float(start_time).is_integer():
        return str(int(start_time))
    return repr(float(start_time))


def _dir_name(entry: ScheduleEntry) -> str:
    base = os.path.basename(entry.executable.rstrip("/")) or "entry" if entry.executable else "data"
    return base.replace(os.sep, "_") if base not in (".", "..") else "entry"


def working_dirs(entries: List[ScheduleEntry], launch_dir: str) -> Dict[int, str]:
    """Working directory of every entry: ``<launch_dir>/<start_time>/<name>[_N]``.

    ``name`` is the executable's base name (``data`` for data-only entries); the second
    entry with the same directory gets ``_1``, the third ``_2`` (reference layout). Pure:
    depends only on the schedule, so it is stable across restarts.

    Returns:
        ``{entry index: absolute path}``.
    """
    seen: Dict[str, int] = {}
    result: Dict[int, str] = {}
    for entry in entries:
        base = os.path.join(
            os.path.abspath(launch_dir), format_start_time(entry.start_time), _dir_name(entry)
        )
        count = seen.get(base, 0)
        seen[base] = count + 1
        result[entry.index] = base if count == 0 else f"{base}_{count}"
    return result


@dataclass(frozen=True)
class PlacedFile:
    """A file dropped by :func:`place_data`: where, how big, its sha256 and mode."""

    location: str
    path: str
    size: int
    sha256: str
    mode: int


def target_path(location: str, workdir: str) -> str:
    """Absolute path of a data ``location`` (relative = relative to the working dir ``workdir``)."""
    return location if os.path.isabs(location) else os.path.normpath(os.path.join(workdir, location))


def _write_atomic(path: str, data: bytes, mode: int) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".vmr-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def resource_path(resources_dir: str, filename: str) -> str:
    """Path of VM-resource ``filename`` inside ``resources_dir``, confined to it.

    Raises:
        EntryError: the name escapes the directory (``..``, absolute, symlink out).
    """
    root = os.path.realpath(resources_dir)
    candidate = os.path.realpath(os.path.join(root, filename))
    if os.path.isabs(filename) or not (candidate == root or candidate.startswith(root + os.sep)):
        raise EntryError(f"VM resource {filename!r} is outside the resource directory {resources_dir}")
    return candidate


def place_data(entry: ScheduleEntry, workdir: str, resources_dir: str) -> List[PlacedFile]:
    """Create ``workdir`` and drop the entry's content/file data there, atomically.

    Relative locations are relative to ``workdir``. Files are written to a temp file in the
    target directory, fsynced, given mode 0755 (``executable``) or 0644, then renamed.

    Returns:
        One :class:`PlacedFile` per content/file drop, in data order.

    Raises:
        EntryError: naming the entry, the location and the cause (missing resource, disk full...).
    """
    placed: List[PlacedFile] = []
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as exc:
        raise EntryError(
            f"{entry.label}: cannot create working dir {workdir}: {exc.strerror or exc}"
        ) from exc
    for item in entry.data:
        if not isinstance(item, (ContentDrop, FileDrop)):
            continue
        path = target_path(item.location, workdir)
        if isinstance(item, ContentDrop):
            payload = item.content
        else:
            try:
                with open(resource_path(resources_dir, item.filename), "rb") as fh:
                    payload = fh.read()
            except EntryError as exc:
                raise EntryError(f"{entry.label}: {exc}") from exc
            except OSError as exc:
                raise EntryError(
                    f"{entry.label}: cannot read VM resource {item.filename!r} from {resources_dir}: "
                    f"{exc.strerror or exc}"
                ) from exc
        mode = 0o755 if item.executable else 0o644
        try:
            _write_atomic(path, payload, mode)
        except OSError as exc:
            raise EntryError(f"{entry.label}: cannot place data at {path}: {exc.strerror or exc}") from exc
        placed.append(
            PlacedFile(item.location, path, len(payload), hashlib.sha256(payload).hexdigest(), mode)
        )
    return placed


def resolve_exec(entry: ScheduleEntry, workdir: str) -> str:
    """The program path for ``entry`` (SPEC section 5).

    A relative executable that this entry drops -> the dropped file; an absolute path -> as
    is; otherwise a PATH lookup.

    Raises:
        EntryError: not found on PATH / absolute path missing.
    """
    exe = entry.executable
    if not exe:
        raise EntryError(f"{entry.label}: has no executable")
    if not os.path.isabs(exe):
        for item in entry.data:
            if (
                isinstance(item, (ContentDrop, FileDrop))
                and not os.path.isabs(item.location)
                and (
                    os.path.normpath(item.location) == os.path.normpath(exe)
                    or os.path.basename(item.location) == exe
                )
            ):
                return target_path(item.location, workdir)
        found = shutil.which(exe)
        if found is None:
            raise EntryError(
                f"{entry.label}: executable {exe!r} is not dropped by this entry and not on PATH"
            )
        return found
    if not os.path.exists(exe):
        raise EntryError(f"{entry.label}: executable {exe!r} does not exist")
    return exe


def shell_command(workdir: str, exec_path: str, arguments: str) -> List[str]:
    """argv running ``cd <workdir>`` then ``<exec_path> <arguments>`` in a POSIX shell.

    ``arguments`` is inserted verbatim so quoting, redirection and variables behave as in
    the reference.
    """
    script = f"cd {shlex.quote(workdir)} && {shlex.quote(exec_path)}"
    if arguments.strip():
        script += f" {arguments}"
    return [SHELL, "-c", script]


OutputCallback = Callable[[str, bytes, bool, bool], None]
"""``(stream, piece, continued, eol)``: ``continued`` = the line goes on in the next piece;
``eol`` = the piece ended with a newline (False for a last line without one)."""


async def _pump(reader: Optional[asyncio.StreamReader], stream: str, on_output: OutputCallback) -> None:
    if reader is None:
        return
    buf = b""
    while True:
        chunk = await reader.read(MAX_LINE_PIECE)
        if not chunk:
            break
        buf += chunk
        lines = 0
        while True:
            nl = buf.find(b"\n")
            if nl < 0 or nl > MAX_LINE_PIECE:
                break
            on_output(stream, buf[:nl], False, True)
            buf = buf[nl + 1 :]
            lines += 1
            if lines % 256 == 0:
                await asyncio.sleep(0)  # a chunk can hold thousands of lines: let acks and timers in
        while len(buf) > MAX_LINE_PIECE:
            on_output(stream, buf[:MAX_LINE_PIECE], True, False)
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

    def kill_tree(self, timeout: float = 3.0) -> None:
        """Terminate the process and all its descendants; SIGKILL what survives ``timeout`` s."""
        if self.pid is not None:
            kill_tree(self.pid, self.create_time, timeout)


def kill_tree(pid: int, create_time: Optional[float] = None, timeout: float = 3.0) -> List[int]:
    """SIGTERM a process tree (psutil), then SIGKILL whatever is left after ``timeout`` s.

    Args:
        pid: root of the tree.
        create_time: if given, only act when the process still has this create time
            (protects against pid reuse after a reboot or crash).

    Returns:
        The pids that were signalled.
    """
    try:
        root = psutil.Process(pid)
        if create_time is not None and abs(root.create_time() - create_time) > 0.01:
            return []
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return []
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)
    return [p.pid for p in procs]


def install_child_watcher() -> None:
    """Use a pidfd child watcher on Linux with Python < 3.12 (no thread per child process).

    Call from inside the running loop. Python 3.12+ already picks pidfd when it can.
    """
    if sys.version_info >= (3, 12) or not sys.platform.startswith("linux"):
        return
    watcher_cls = getattr(asyncio, "PidfdChildWatcher", None)
    if watcher_cls is None or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return
    watcher = watcher_cls()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.get_event_loop_policy().set_child_watcher(watcher)
