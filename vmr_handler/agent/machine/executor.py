"""Executor: working directories, data drops, exec paths, process trees and output (SPEC section 5).

Nothing here knows about stages or time; the engine decides *when*, this module does *what*.

Working dirs and command lines are pure rules of the schedule (:mod:`vmr_handler.core.schedule.commands`).

* :func:`place_data` -- atomic content/file drops with modes and sha256, never overwriting.
* :func:`find_shell` / :func:`shell_command` -- the reference's ``cd <dir>`` then
  ``<exec path> <arguments>`` unquoted, through bash (else the POSIX shell).
* :class:`ProcessRunner` -- start a command in its own session, stream stdout/stderr line by
  line while it runs, report exit code and duration, kill the whole tree (psutil); it lives in
  :mod:`vmr_handler.core.processes` (the host runs on_host entries with it) and is re-exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from vmr_handler.core.errors import EntryError
from vmr_handler.core.fsutil import write_temp
from vmr_handler.core.processes import OutputCallback as OutputCallback
from vmr_handler.core.processes import ProcessResult as ProcessResult
from vmr_handler.core.processes import ProcessRunner as ProcessRunner
from vmr_handler.core.processes import kill_tree as kill_tree
from vmr_handler.core.schedule.commands import target_path
from vmr_handler.core.schedule.model import ContentDrop, FileDrop, ScheduleEntry

#: Name of the file an entry leaves in its working dir to request a reboot (reference).
REBOOT_FILE = "reboot"
#: Exit code with which an entry requests a reboot (reference).
REBOOT_EXIT_CODE = 10
#: Seconds the reboot command may take before it is given up (it usually never returns).
REBOOT_TIMEOUT = 120.0
#: Exit code of a shell that cannot find the program (POSIX "command not found").
NOT_FOUND_EXIT_CODE = 127
#: Exit code of a shell that found the program but cannot execute it (POSIX).
NOT_EXECUTABLE_EXIT_CODE = 126

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlacedFile:
    """A file dropped by :func:`place_data`: where, how big, its sha256 and mode.

    ``outcome``: ``placed`` (written now), ``present`` (the same content was already there) or
    ``kept`` (something else was there and was left untouched; ``size``/``sha256`` are of it).
    """

    location: str
    path: str
    size: int
    sha256: str
    mode: int
    outcome: str = "placed"


def _sha256_of(path: str) -> Tuple[int, str]:
    """``(size, sha256 hex)`` of the regular file at ``path``."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _existing(path: str, payload: bytes) -> Tuple[str, int, str]:
    """What is at ``path`` already: ``("present", ...)`` when it is a regular file with exactly
    ``payload``, else ``("kept", size, sha256)`` (sha256 empty when it is not a regular file)."""
    try:
        if os.path.isfile(path) and not os.path.islink(path):
            size, sha = _sha256_of(path)
            same = size == len(payload) and sha == hashlib.sha256(payload).hexdigest()
            return ("present" if same else "kept"), size, sha
    except OSError:
        pass
    return "kept", 0, ""


def _write_no_clobber(path: str, data: bytes, mode: int) -> bool:
    """Write ``data`` to ``path`` atomically unless something already exists there.

    The data goes to a temp file in the target directory (fsynced, mode set) that is then
    hard-linked to ``path``: the link fails when the name exists, so nothing is ever overwritten,
    not even a file created between the check and the write. Filesystems without hard links
    fall back to an existence check and a rename.

    Returns:
        True when written, False when ``path`` already existed (left untouched).

    Raises:
        OSError: the directory or file cannot be written (disk full, read-only, ...).
    """
    if os.path.lexists(path):
        return False  # the common case after a restart: no temp file, no fsync
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = write_temp(directory, data, mode, prefix=".vmr-")
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(path):
            return False
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return True


_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}


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


#: In the agent's resource directory: ``{name: why}`` of the VM resources the host did not
#: send (written by the connected agent's resource fetch), so that a drop that needs one names
#: the host's cause rather than only a missing file in the guest.
FETCH_ERRORS = ".fetch-errors.json"


def _fetch_error(resources_dir: str, name: str) -> Optional[str]:
    """Why the host did not send resource ``name``, if the fetch recorded it."""
    import json

    try:
        with open(os.path.join(resources_dir, FETCH_ERRORS), encoding="utf-8") as fh:
            why = json.load(fh).get(name)
    except (OSError, ValueError, AttributeError):
        return None
    return why if isinstance(why, str) else None


def _payload(item: Union[ContentDrop, FileDrop], resources_dir: str) -> bytes:
    """The bytes a drop puts in place. Raises EntryError naming the resource and the cause."""
    if isinstance(item, ContentDrop):
        return item.content
    try:
        with open(resource_path(resources_dir, item.filename), "rb") as fh:
            return fh.read()
    except OSError as exc:
        why = _fetch_error(resources_dir, item.filename)
        if why is not None:
            raise EntryError(f"VM resource {item.filename!r} was not received from the host: {why}") from exc
        raise EntryError(
            f"cannot read VM resource {item.filename!r} from {resources_dir}: {exc.strerror or exc}"
        ) from exc


def drops(entry: ScheduleEntry) -> List[Union[ContentDrop, FileDrop]]:
    """The entry's content and file drops, in data order (its other data puts nothing in place)."""
    return [item for item in entry.data if isinstance(item, (ContentDrop, FileDrop))]


def make_workdir(workdir: str) -> None:
    """Create the working dir ``workdir`` and its parents (nothing when it exists).

    Raises:
        EntryError: it cannot be created (the path and the cause).
    """
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as exc:
        raise EntryError(f"cannot create working dir {workdir}: {exc.strerror or exc}") from exc


def place_data(
    entry: ScheduleEntry,
    workdir: str,
    resources_dir: str,
    only: Optional[List[Union[ContentDrop, FileDrop]]] = None,
) -> List[PlacedFile]:
    """Create ``workdir`` and drop the entry's content/file data, never overwriting anything.

    Relative locations are relative to ``workdir``. Each file is written to a temp file in the
    target directory, fsynced, given mode 0755 (``executable``) or 0644, then linked into place
    (:func:`_write_no_clobber`). As in the reference (``vm_resource_handler.py``
    ``load_files_in_target``: written only if the target does not exist), an existing target is
    never overwritten: the same content already there is ``present`` (an earlier run of this
    agent put it there), anything else is ``kept`` and reported (``docs/firewheel.md``).

    Args:
        entry: the entry whose data is dropped.
        workdir: its working dir (absolute).
        resources_dir: where ``filename`` drops are read from.
        only: these drops of the entry (default: all of them, :func:`drops`).

    Returns:
        One :class:`PlacedFile` per content/file drop placed, in data order.

    Raises:
        EntryError: the location, the resource and the cause (missing resource, disk full...);
            the message does not repeat the entry's label (the caller's report names the entry).
    """
    placed: List[PlacedFile] = []
    make_workdir(workdir)
    for item in drops(entry) if only is None else only:
        path = target_path(item.location, workdir)
        payload = _payload(item, resources_dir)
        mode = 0o755 if item.executable else 0o644
        try:
            written = _write_no_clobber(path, payload, mode)
        except OSError as exc:
            raise EntryError(f"cannot place data at {path}: {exc.strerror or exc}") from exc
        if written:
            placed.append(
                PlacedFile(item.location, path, len(payload), hashlib.sha256(payload).hexdigest(), mode)
            )
            continue
        outcome, size, sha = _existing(path, payload)
        if outcome == "present":
            with contextlib.suppress(OSError):
                os.chmod(path, mode)
        placed.append(PlacedFile(item.location, path, size, sha, mode, outcome))
    return placed


def shell_command(shell: str, workdir: str, line: str) -> List[str]:
    """argv that runs ``line`` in ``workdir`` as the reference's ``call_arguments.sh`` does.

    The script is ``CURRENT_DIR=<dir>``, ``cd <dir>``, then ``line`` verbatim (quoting,
    redirection, variables and builtins behave as there). The directory is quoted here
    (the reference leaves it unquoted, which breaks on spaces); when ``cd`` fails nothing runs.
    """
    quoted = shlex.quote(workdir)
    return [shell, "-c", f"CURRENT_DIR={quoted}\ncd {quoted} || exit 1\n{line}\n"]


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


class SystemProcesses:
    """The real :class:`~vmr_handler.agent.engine.ports.Processes` port: asyncio subprocesses,
    psutil process trees, and the reboot command run without blocking the event loop."""

    def process(self, on_output: OutputCallback) -> ProcessRunner:
        """A :class:`ProcessRunner` reporting to ``on_output``."""
        return ProcessRunner(on_output)

    def kill_leftover(self, pid: int, create_time: Optional[float], timeout: float = 3.0) -> List[int]:
        """:func:`kill_tree` of a process an earlier agent started."""
        return kill_tree(pid, create_time, timeout)

    async def reboot(self, command: str, env: Optional[Dict[str, str]]) -> None:
        """Run ``command`` with ``/bin/sh`` (2 minutes at most); a failure is logged."""
        try:
            proc = await asyncio.create_subprocess_shell(
                command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            _out, err = await asyncio.wait_for(proc.communicate(), REBOOT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            log.error("reboot command failed: %s", exc or "timed out")
            return
        if proc.returncode != 0:
            log.error("reboot command exited %d: %s", proc.returncode, err.decode(errors="replace"))
