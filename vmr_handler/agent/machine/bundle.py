"""The frozen agent's own run time: its bootloader parent, its unpack directory, its children's environment.

``packaging/build.sh`` makes the guest agent one executable file (PyInstaller onefile).
Such a file is two processes: a small bootloader unpacks the bundle into a fresh
``<temp root>/_MEIxxxxxx`` directory, starts the real agent (Python) as its child, waits
for it and removes the directory when the child ends. Two things go wrong when the
*bootloader* is killed with SIGKILL (a service manager's last resort, an operator's
``kill -9 <main pid>``): the agent keeps running as an orphan, so a restart would meet a
second agent, and nobody removes the unpacked copy. :func:`startup` closes both, before
anything else runs:

* :func:`watch_bootloader` asks the kernel for SIGTERM when the parent dies
  (``prctl(PR_SET_PDEATHSIG)``), so the agent ends cleanly (entries terminated, journal
  flushed) instead of living on; the state-dir lock stays the last guard.
* :func:`claim_unpack_dir` holds an exclusive ``flock`` on ``<unpack dir>/.vmr-handler.lock``
  for the agent's whole life, and :func:`remove_stale_unpacks` removes every other unpacked
  copy of *this program* under the same temp root whose lock nobody holds: the leftovers
  of killed instances. Ten SIGKILLs in a row leave at most one copy (the last one's).

:func:`child_environment` gives entries the environment from before the bootloader
(``LD_LIBRARY_PATH``, ``_PYI_*``, and the ``TMPDIR`` that only pointed the unpack somewhere).

Nothing here applies to the package run from source or to the onedir bundle, which unpack
nothing and have no bootloader parent.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import fnmatch
import os
import shutil
import signal
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from vmr_handler.core.errors import OsCallFailed

#: The file whose ``flock`` says "this unpacked copy is in use" (held by the agent process).
LOCK_NAME = ".vmr-handler.lock"
#: What makes an unpacked directory one of this program's: its distribution metadata,
#: copied into the bundle by ``packaging/vmr-handler.spec`` (``vmr_handler-0.1.0.dist-info``,
#: or ``vmr_handler.egg-info`` from a legacy editable install), so that other programs'
#: copies are never touched.
MARKER_PATTERNS = ("vmr_handler-*.dist-info", "vmr_handler.egg-info", "vmr_handler-*.egg-info")
#: An unpacked copy without a lock file is left alone until it is this old, seconds: it may
#: be an instance still starting (the unpack takes seconds under TCG); older, it was killed
#: before it could take its lock.
STALE_AFTER = 120.0
#: ``prctl`` option number for "signal me when my parent dies" (linux/prctl.h).
PR_SET_PDEATHSIG = 1

#: Open lock of this instance's unpacked copy, kept for the process's whole life.
_held_lock: Optional[int] = None


@dataclass
class Startup:
    """What :func:`startup` did.

    ``home``: this instance's unpack directory (None: not a onefile bundle);
    ``parent_watched``: a parent-death signal is set; ``removed``: stale copies removed, as
    ``(path, bytes)``; ``failed``: stale copies that could not be removed, as ``(path, reason)``.
    """

    home: Optional[str] = None
    parent_watched: bool = False
    removed: List[Tuple[str, int]] = field(default_factory=list)
    failed: List[Tuple[str, str]] = field(default_factory=list)

    def messages(self) -> List[str]:
        """One readable line per removed or failed copy (empty when there was nothing to do)."""
        lines = [f"removed the unpacked copy of a killed instance: {path} ({size / 1e6:.1f} MB)"
                 for path, size in self.removed]
        lines += [f"cannot remove the unpacked copy of a killed instance {path}: {why}; "
                  "remove it by hand" for path, why in self.failed]
        return lines


def unpack_home() -> Optional[str]:
    """This instance's unpack directory (``sys._MEIPASS`` of a onefile bundle), else None.

    A onedir bundle's ``_MEIPASS`` is its ``_internal`` directory and is never unpacked.
    """
    if not getattr(sys, "frozen", False):
        return None
    home = getattr(sys, "_MEIPASS", None)
    if not isinstance(home, str) or not os.path.basename(home).startswith("_MEI"):
        return None
    return home


def watch_bootloader(exit_signal: int = signal.SIGTERM) -> bool:
    """Ask for ``exit_signal`` when the parent process dies, if the parent is our bootloader.

    The parent is the bootloader when ``/proc/<ppid>/exe`` is the same file (device and
    inode) as ``/proc/self/exe``: true for a onefile bundle, also after the file was
    replaced on disk. If the parent died before the request took effect, the signal is
    sent at once. Returns whether the watch is set. Raises OSError when ``prctl`` fails.
    """
    parent = os.getppid()
    try:
        theirs = os.stat(f"/proc/{parent}/exe")
        ours = os.stat("/proc/self/exe")
    except OSError:  # no /proc, or a parent we may not inspect: not our bootloader
        return False
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(exit_signal), 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OsCallFailed(code, f"prctl(PR_SET_PDEATHSIG): {os.strerror(code)}")
    if os.getppid() != parent:  # the bootloader died before the watch was set
        os.kill(os.getpid(), exit_signal)
    return True


def claim_unpack_dir(home: str) -> int:
    """Take (and keep) the exclusive lock that marks ``home`` as in use; returns its fd.

    The fd is close-on-exec, so entries never inherit it. Raises OSError when the lock file
    cannot be made or is held by another process (which would be a bug: each instance
    unpacks into a new directory).
    """
    fd = os.open(os.path.join(home, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _is_ours(path: str) -> bool:
    """A real directory (not a link) owned by this user that holds this program's metadata."""
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        names = os.listdir(path)
    except OSError:
        return False
    return any(fnmatch.fnmatch(name, pattern) for name in names for pattern in MARKER_PATTERNS)


def _lock_if_dead(path: str, now: float, stale_after: float) -> Tuple[bool, Optional[int]]:
    """Whether the copy at ``path`` is dead, and the fd of its lock taken to prove it (if any)."""
    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        try:
            return now - os.lstat(path).st_mtime > stale_after, None
        except OSError:
            return False, None
    except OSError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False, None  # a live instance holds it
    return True, fd


def _tree_size(path: str) -> int:
    """Bytes in the files under ``path`` (an unpacked copy: shallow, our own)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def remove_stale_unpacks(home: str, now: Optional[float] = None,
                         stale_after: float = STALE_AFTER) -> Startup:
    """Remove the unpacked copies of dead instances of this program next to ``home``.

    Looks at the ``_MEI*`` siblings of ``home`` (the same temp root): a copy is removed
    when it is ours (:func:`_is_ours`: our metadata, our uid, not a link) and dead (its
    lock is free, or it has no lock and is older than ``stale_after`` seconds). ``now`` is
    UTC epoch seconds (default: the clock). Never raises for one copy; what could not be
    removed is in ``failed``.
    """
    report = Startup(home=home)
    root, own = os.path.split(home)
    now = time.time() if now is None else now
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        report.failed.append((root, exc.strerror or str(exc)))
        return report
    for name in names:
        path = os.path.join(root, name)
        if not name.startswith("_MEI") or name == own or not _is_ours(path):
            continue
        dead, fd = _lock_if_dead(path, now, stale_after)
        if not dead:
            continue
        try:
            size = _tree_size(path)
            shutil.rmtree(path)
            report.removed.append((path, size))
        except OSError as exc:
            report.failed.append((path, exc.strerror or str(exc)))
        finally:
            if fd is not None:
                os.close(fd)
    return report


def startup() -> Startup:
    """Everything the frozen onefile agent does before its CLI: parent watch, lock, clean-up.

    A no-op (``Startup()``) for the package and the onedir bundle. Called by
    ``packaging/entry.py`` first thing; prints one line to stderr per removed or failed
    stale copy (stdout stays the command's own).
    """
    global _held_lock
    home = unpack_home()
    if home is None:
        return Startup()
    watched = watch_bootloader()
    if _held_lock is None:
        _held_lock = claim_unpack_dir(home)
    report = remove_stale_unpacks(home)
    report.parent_watched = watched
    for line in report.messages():
        print(f"vmr-handler: {line}", file=sys.stderr)
    return report


def child_environment(env: Optional[Dict[str, str]] = None) -> Optional[Dict[str, str]]:
    """The environment entries and the reboot command run with (None = this process's own).

    In the frozen agent, PyInstaller's bootloader points ``LD_LIBRARY_PATH`` at the bundle's
    own libraries (libssl, libcrypto, libz...), which would shadow the guest's in every
    program an entry runs (a guest's ``python3`` or ``curl`` against the build host's
    OpenSSL). As the PyInstaller docs advise ("Run-time Information", LD_LIBRARY_PATH
    considerations), the value from before the bootloader (``LD_LIBRARY_PATH_ORIG``) is
    restored, or the variable removed. The bootloader's own ``_PYI_*`` variables are
    removed too: with them, an entry running this same file (``vmr-handler status``) would
    take itself for the agent's child and use the agent's unpacked copy. ``TMPDIR`` is
    removed when it only told the bootloader where to unpack (it names this instance's
    temp root, as the images' service files set it).
    """
    if not getattr(sys, "frozen", False):
        return env
    result = dict(os.environ if env is None else env)
    original = result.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is not None:
        result["LD_LIBRARY_PATH"] = original
    else:
        result.pop("LD_LIBRARY_PATH", None)
    for name in [key for key in result if key.startswith("_PYI_") or key == "_MEIPASS2"]:
        del result[name]
    home = unpack_home()
    tmpdir = result.get("TMPDIR")
    if home is not None and tmpdir and os.path.realpath(tmpdir) == os.path.realpath(os.path.dirname(home)):
        del result["TMPDIR"]
    return result
