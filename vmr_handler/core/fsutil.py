"""File-system helpers shared by the agent and the host: atomic writes, sha256, UTC text.

One home for what both sides need, so neither imports the other's modules:

* :func:`atomic_write` -- the write that never leaves a torn file (the journal, the outbox
  compaction, keys, the host's state and report files);
* :func:`append_whole` -- an append that is on disk whole or not at all (a full disk);
* :func:`sha256_file` -- a file's digest, read in 1 MiB pieces;
* :func:`walk_files` -- a directory tree's files at any depth (no recursion, no symlinks);
* :func:`utc_text` -- the UTC form every log line and report uses;
* :func:`kernel_boot_id` -- this boot's id, where the kernel tells it.

``tempfile`` and ``hashlib`` are imported by the functions that use them, ``typing`` only by
the checker: the commands that print a time (``status``) do not pay ~8 ms for them.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os

from vmr_handler.core.errors import OsCallFailed

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    from typing import Iterator, List, Optional, Tuple

#: Bytes read at a time when hashing.
HASH_PIECE = 1024 * 1024


def write_temp(directory: str, data: bytes, mode: int, prefix: str = ".tmp-") -> str:
    """A new temp file in ``directory`` holding ``data``, fsynced, with permission bits ``mode``;
    its path (the caller renames or links it into place and removes it on failure).

    Raises:
        OSError: it cannot be written (nothing is left behind then).
    """
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same dir, fsync, rename, fsync dir.

    Args:
        path: the file to replace or create.
        data: its whole new content.
        mode: permission bits of the new file (default owner-only).

    Raises:
        OSError: from the file system (e.g. ENOSPC); the old file is left untouched and no
            temp file is left behind.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = write_temp(directory, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def append_whole(fd: int, data: bytes, size: int) -> None:
    """Append ``data`` to the file open on ``fd`` (``O_APPEND``, unbuffered) whole, or cut the
    file back to ``size`` bytes (its length before) and raise: a full disk takes what fits of
    a write and says nothing (a short write), which would leave a torn record.

    Raises:
        OSError: the disk refused the write (a short write is ENOSPC); the file is as before.
    """
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            if not written:
                raise OsCallFailed(errno.ENOSPC, "short write: the disk is full")
            view = view[written:]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def sha256_file(path: str) -> str:
    """The hex sha256 of the file at ``path`` (read in :data:`HASH_PIECE` pieces).

    Raises:
        OSError: the file cannot be opened or read.
    """
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for piece in iter(lambda: fh.read(HASH_PIECE), b""):
            h.update(piece)
    return h.hexdigest()


def utc_text(ts: Optional[float]) -> str:
    """``2026-01-01T12:00:00.000Z`` for a UTC epoch in seconds, ``-`` for None."""
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


#: Where Linux tells this boot's id (a new random UUID at every boot).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def kernel_boot_id() -> Optional[str]:
    """This boot's id as the kernel tells it (:data:`BOOT_ID_PATH`), or None where it cannot be
    read (not Linux, no /proc): two equal ids mean no reboot in between."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None


def walk_files(top: str) -> Iterator[Tuple[str, List[str]]]:
    """``(directory, file names)`` for ``top`` and every directory below it, as ``os.walk``
    gives them (top-down, depth-first, in listing order; a symlink to a directory is neither
    a file nor walked into), but without recursion: a tree of any depth is walked, where
    Python 3.11's ``os.walk`` raises ``RecursionError`` at about 1,000 levels (a hostile guest
    can make such a tree). Directories that cannot be listed are skipped.
    """
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        dirs: List[str] = []
        files: List[str] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield directory, files
        for name in reversed(dirs):
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                stack.append(path)
