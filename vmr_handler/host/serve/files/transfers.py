"""Files a VM transfers out (SPEC section 8), confined to its own directories.

Layout under the logs directory::

    <logs>/transfers/<vm>/<loc>  files transferred out of the VM (confined to that directory)
    <logs>/uploads/<vm>/<sha256> files uploaded over HTTP(S), staged until their
                                 ``transfer_uploaded`` report puts them in place (``.part``: under way)

:class:`TransferStore` takes ``transfer_chunk`` reports (on the host's loop) and uploads over
HTTP(S) (:mod:`vmr_handler.host.serve.http.server`, in HTTP threads); the rest of the logs directory is
:mod:`vmr_handler.host.logs.store`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

from vmr_handler.core.errors import TransferConflict, TransferMismatch, TransferRefused, TransferTooLarge
from vmr_handler.core.fsutil import walk_files
from vmr_handler.host.logs.text import printable
from vmr_handler.host.serve.files.chunkhash import PendingHash, RunningHashes, hash_from
from vmr_handler.host.serve.files.transferpaths import confine_location, open_part, walk_dirs

log = logging.getLogger("vmr_handler.host")

TRANSFERS_DIR = "transfers"
UPLOADS_DIR = "uploads"
#: Staged uploads (complete or not) kept per VM; the oldest is deleted to make room.
MAX_STAGED = 8


@dataclass
class TransferOutcome:
    """What became of one ``transfer_chunk`` or ``transfer_uploaded`` report.

    Attributes:
        path: the file's path relative to the VM's transfer root.
        complete: True when this was the last chunk and the file is in place.
        sha256_ok: on the last chunk, whether the whole file matched the announced sha256.
    """

    path: str
    complete: bool = False
    sha256_ok: Optional[bool] = None


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _mtime(value: Any) -> Optional[float]:
    """``value`` as an mtime to set (UTC seconds, finite, 0 <= m < 2**33), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value) if 0 <= value < 2**33 else None
    return None


def _count(value: Any, what: str) -> int:
    """``value`` as an integer >= 0. Raises TransferRefused naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TransferRefused(f"{what} must be an integer >= 0")
    return value


class TransferStore:
    """``<logs>/transfers/<vm>/``: files a VM transfers out, confined to that directory.

    A ``location`` is taken relative to the VM's transfer root (a leading ``/`` is
    dropped: ``/var/log/x`` lands in ``<root>/var/log/x``). Refused: ``..`` components,
    NUL, empty names, any path that ``os.path.realpath`` resolves outside the root, and any
    symlink on the way (directories are walked with ``O_NOFOLLOW`` relative to the root's
    descriptor, so a symlink planted later is not followed either). A file is assembled in
    a hidden ``.<name>.vmr-part`` beside its destination and renamed into place when its
    last chunk arrives.

    Over HTTP(S) (:mod:`vmr_handler.host.serve.http.server`) a file is uploaded to
    ``<logs>/uploads/<vm>/<sha256>.part``, renamed to ``<sha256>`` when complete and verified
    (:meth:`upload`), and put in place when the VM's ``transfer_uploaded`` report arrives
    (:meth:`commit_upload`), in the order of its other reports. Staged bytes count towards the
    per-VM total. :meth:`upload` and :meth:`upload_have` run in HTTP threads, the rest on the
    host's loop: the total is kept under a lock.

    Args:
        logs: the logs directory.
        vm: the VM name.
        max_file: largest file, bytes.
        max_total: bytes kept for this VM in all (what is on disk at start counts).
    """

    def __init__(self, logs: str, vm: str, max_file: int, max_total: int) -> None:
        self.vm = vm
        self.root = os.path.join(logs, TRANSFERS_DIR, vm)
        self.staging = os.path.join(logs, UPLOADS_DIR, vm)
        self.max_file = max_file
        self.max_total = max_total
        self.total = 0
        self.files = 0
        self.refused = 0
        self.hashes = RunningHashes()
        #: bytes hashed at a last chunk because no chunk on the way hashed them (out of order,
        #: rewritten, a host restart); in a worker thread when a session runs it
        self.rehashed_bytes = 0
        self._lock = threading.Lock()  # total, _active
        self._active: Set[str] = set()  # sha256 of uploads under way
        self._placed: Dict[str, Tuple[str, int, int]] = {}  # sha256 -> (rel, st_dev, st_ino) put in place

    def open(self) -> None:
        """Create the root and the staging directory (mode 0700) and count what they hold.

        Raises:
            OSError: they cannot be created.
        """
        total = 0
        for top in (self.root, self.staging):
            os.makedirs(top, mode=0o700, exist_ok=True)
            for dirpath, files in walk_files(top):  # any depth; symlinks are not followed
                for name in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, name)).st_size
                    except OSError:
                        pass
        self.total = total

    @staticmethod
    def confine(location: Any) -> List[str]:
        """The path components of ``location`` under the root (:func:`confine_location`)."""
        return confine_location(location)

    def resolve(self, location: Any) -> Tuple[str, List[str], str]:
        """Check ``location`` (:meth:`confine`, and its real path now inside the root).

        Returns:
            ``(real root, components, relative path)``.

        Raises:
            TransferRefused: it is refused.
        """
        parts = self.confine(location)
        rel = "/".join(parts)
        real_root = os.path.realpath(self.root)
        target = os.path.realpath(os.path.join(real_root, *parts))
        if not target.startswith(real_root + os.sep):
            raise TransferRefused(f"location {printable(rel, 200)!r} resolves outside the transfer root")
        return real_root, parts, rel

    def check_size(self, size: Any) -> int:
        """``size`` (bytes of a whole file) if within the per-file limit.

        Raises:
            TransferRefused: not an integer >= 0. TransferTooLarge: over ``max_file``.
        """
        n = _count(size, "size")
        if n > self.max_file:
            raise TransferTooLarge(f"file larger than the per-file limit of {self.max_file} bytes")
        return n

    def _charge(self, grow: int) -> None:
        """Count ``grow`` more bytes (may be < 0) for this VM; refuse growth past the total."""
        with self._lock:
            if grow > 0 and self.total + grow > self.max_total:
                raise TransferTooLarge(f"per-VM transfer limit of {self.max_total} bytes reached")
            self.total += grow

    def write_chunk(self, *args: Any, **kw: Any) -> TransferOutcome:
        """:meth:`begin_chunk` (same arguments), hashing what must be hashed on the calling
        thread (:meth:`finish_chunk`)."""
        step = self.begin_chunk(*args, **kw)
        return self.finish_chunk(step.run()) if isinstance(step, PendingHash) else step

    def begin_chunk(
        self,
        location: Any,
        offset: Any,
        data: bytes,
        size: Any,
        sha256: Any,
        last: bool,
        mtime: Any = None,
    ) -> Union[TransferOutcome, PendingHash]:
        """Store one chunk; its outcome, or, for a last chunk whose file has bytes no chunk
        hashed on the way (:mod:`vmr_handler.host.serve.files.chunkhash`), a :class:`PendingHash` to run
        (in a worker thread) and hand to :meth:`finish_chunk`.

        Raises:
            TransferRefused: the location escapes the root, or a size limit is hit, or the
                chunk is inconsistent (offset/size), or it repeats a file already in place
                with this sha256 (``offset`` > 0: a new version starts at 0).
        """
        self.confine(location)
        offset = _count(offset, "offset")
        size = _count(size, "size")
        end = offset + len(data)
        self.check_size(max(size, end))
        if end > size:
            raise TransferRefused(f"chunk ends at {end}, past the announced size {size}")
        real_root, parts, rel = self.resolve(location)
        self.hashes.check_repeat(rel, offset, size, sha256)
        dir_fd = walk_dirs(real_root, parts[:-1])
        pending = PendingHash(rel, parts[-1], dir_fd, -1, size, sha256, mtime, 0, None)
        try:
            pending.fd = open_part(dir_fd, f".{parts[-1]}.vmr-part"[:255], rel)
            self._write(pending, offset, data, last)
        except BaseException:
            pending.close()
            raise
        if not last:
            pending.close()
            return TransferOutcome(rel)
        pending.hashed, pending.h = self.hashes.at_last(rel, size)
        if pending.missing:
            self.rehashed_bytes += pending.missing
            return pending
        return self.finish_chunk(pending)

    def _write(self, p: PendingHash, offset: int, data: bytes, last: bool) -> None:
        """Write ``data`` at ``offset`` of the part file (and cut it to its size when ``last``),
        charging the growth to this VM and hashing what continues the file's hash."""
        before = os.fstat(p.fd).st_size
        after = p.size if last else max(before, offset + len(data))
        self._charge(max(0, after - before))
        try:
            if data:
                self.hashes.before_write(p.rel, p.fd, offset, data)
                os.pwrite(p.fd, data, offset)
            if last:
                os.ftruncate(p.fd, p.size)  # a shorter new version leaves no stale tail
        finally:  # count what is there now
            self._charge(os.fstat(p.fd).st_size - before - max(0, after - before))

    def finish_chunk(self, p: PendingHash) -> TransferOutcome:
        """Verify a last chunk's file (its hash complete: :meth:`PendingHash.run`) and put it in
        place when it matches; closes ``p``'s descriptors. On the loop.

        Raises:
            TransferRefused: it cannot be put in place.
        """
        try:
            self.hashes.hashed(p.rel, p.size, p.h)
            ok = isinstance(p.sha256, str) and p.h.hexdigest() == p.sha256.lower()
            if not ok:
                return TransferOutcome(p.rel, complete=False, sha256_ok=False)
            m = _mtime(p.mtime)
            if m is not None:
                os.utime(p.fd, (m, m))
            os.close(p.fd)
            p.fd = -1
            self._put_in_place(p.dir_fd, p.rel, p.name, f".{p.name}.vmr-part"[:255], p.dir_fd, 0)
        finally:
            p.close()
        self.hashes.placed(p.rel, p.size, p.sha256)
        return TransferOutcome(p.rel, complete=True, sha256_ok=True)

    def _put_in_place(
        self, dir_fd: int, rel: str, name: str, src: str, src_dir_fd: Optional[int], added: int
    ) -> None:
        """Rename ``src`` to ``name`` (replacing an older version) and count it; ``added``:
        bytes not counted yet (a hard link of a file already counted).

        The charge is taken before the rename (over the limit: nothing moves) and undone if the
        rename fails. ``src`` that is already the file at ``name`` (a re-reported upload) is
        removed and nothing is counted: a rename between two links of one file is a no-op
        that would leave the link behind (and the next chunk writing into the placed file).

        Raises:
            TransferTooLarge: over the per-VM total.
            TransferRefused: the rename failed.
        """
        src_st = os.stat(src, dir_fd=src_dir_fd, follow_symlinks=False)
        try:
            dst_st: Optional[os.stat_result] = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            dst_st = None
        if dst_st is not None and (dst_st.st_dev, dst_st.st_ino) == (src_st.st_dev, src_st.st_ino):
            os.unlink(src, dir_fd=src_dir_fd)
            return
        old_size = dst_st.st_size if dst_st is not None else 0
        self._charge(added - old_size)
        try:
            os.rename(src, name, src_dir_fd=src_dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            self._charge(old_size - added)
            raise TransferRefused(f"cannot put {printable(rel, 200)!r} in place: {exc.strerror}") from exc
        self.files += 1

    # ---------------------------------------------------------------- uploads over HTTP(S)
    def _staged(self, sha256: Any) -> str:
        """The staging path of content ``sha256`` (``+ ".part"`` while under way).

        Raises:
            TransferRefused: ``sha256`` is not 64 lowercase hex digits.
        """
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise TransferRefused("sha256 must be 64 lowercase hex digits")
        return os.path.join(self.staging, sha256)

    def upload_have(self, location: Any, sha256: Any, size: Any) -> int:
        """Bytes of this content the host holds (``size`` when the upload is complete), after
        the checks a chunk gets (location, per-file limit).

        Raises:
            TransferRefused: the location or sha256 is refused. TransferTooLarge: ``size`` is
                over the per-file limit, or the missing bytes over the per-VM total.
        """
        self.resolve(location)
        whole = self.check_size(size)
        staged = self._staged(sha256)
        if os.path.isfile(staged):
            return whole
        try:
            have = os.path.getsize(staged + ".part")
        except FileNotFoundError:
            have = 0
        # a whole .part is not verified yet (a crash, a disk error): its last byte is asked again
        have = max(0, min(have, whole - 1)) if have <= whole else 0
        with self._lock:
            if whole - have > self.max_total - self.total:
                raise TransferTooLarge(f"per-VM transfer limit of {self.max_total} bytes reached")
        return have

    def upload(
        self,
        location: Any,
        sha256: Any,
        size: Any,
        offset: int,
        length: int,
        read: Callable[[int], bytes],
        pace: Optional[Callable[[int], None]] = None,
        chunk: int = 256 * 1024,
    ) -> int:
        """Append ``length`` bytes (``read(n)`` gives up to ``n``) at ``offset`` of the staged
        upload of ``sha256`` (a file of ``size`` bytes); blocking, for an HTTP thread.

        ``offset`` must be 0 (start again) or the bytes the host holds. Stops early when
        ``read`` returns ``b""`` (the client went away): what arrived is kept, to resume from.
        When the last byte arrives the whole file is hashed: a match is renamed to
        ``<sha256>``, a mismatch deleted.

        Args:
            pace: called with the bytes received so far after each piece (debug rate).
            chunk: bytes per ``read``.

        Returns:
            The bytes the host holds of this content now (``size``: complete and verified).

        Raises:
            TransferRefused: location or sha256 refused, or ``offset + length`` past ``size``.
            TransferTooLarge: over the per-file or the per-VM limit (nothing was read).
            TransferConflict: another upload of this content is under way, or ``offset`` is
                not 0 nor the bytes held (nothing was read).
            TransferMismatch: complete, but not of this sha256 (deleted).
            OSError: the disk refused.
        """
        have = self.upload_have(location, sha256, size)
        whole = self.check_size(size)
        staged = self._staged(sha256)
        if offset + length > whole:
            raise TransferRefused(f"body ends at {offset + length}, past the size {whole}")
        if have == whole:
            return whole
        if offset not in (0, have):
            raise TransferConflict(f"upload at offset {offset}, the host holds {have} bytes", have)
        with self._lock:
            if sha256 in self._active:
                raise TransferConflict("an upload of this content is under way", have)
            self._active.add(sha256)
        try:
            if offset == 0 and have == 0:
                self._make_room()
            grow = max(0, offset + length - have)
            self._charge(grow)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(staged + ".part", flags, 0o600)
            pos = offset
            try:
                before = os.fstat(fd).st_size
                if offset == 0:
                    os.ftruncate(fd, 0)
                pos = _receive(fd, read, offset, offset + length, chunk, pace)
            finally:
                self._charge(os.fstat(fd).st_size - before - grow)
                complete = pos == whole
                digest = hash_from(fd, hashlib.sha256(), 0, whole).hexdigest() if complete else None
                os.close(fd)
            if not complete:
                return pos
            if digest != sha256:
                os.unlink(staged + ".part")
                self._charge(-whole)
                raise TransferMismatch(f"the {whole} bytes received have sha256 {digest}, not {sha256}")
            os.replace(staged + ".part", staged)
            return whole
        finally:
            with self._lock:
                self._active.discard(sha256)

    def _make_room(self) -> None:
        """Delete the oldest unfinished staged uploads (``.part``, not under way) beyond
        :data:`MAX_STAGED` - 1. A complete one waits for its ``transfer_uploaded`` report
        (which may come much later, behind other reports) and is never deleted here; it
        counts towards the VM's total like everything else."""
        entries = []
        for entry in os.scandir(self.staging):
            if (
                entry.name.endswith(".part")
                and entry.name.split(".")[0] not in self._active
                and entry.is_file(follow_symlinks=False)
            ):
                st = entry.stat(follow_symlinks=False)
                entries.append((st.st_mtime, entry.path, st.st_size))
        for _when, path, size in sorted(entries)[: max(0, len(entries) - MAX_STAGED + 1)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                self._charge(-size)
                log.info("staged upload %s deleted to make room", path)

    def commit_upload(self, location: Any, sha256: Any, size: Any, mtime: Any = None) -> TransferOutcome:
        """Put the staged upload of ``sha256`` in place at ``location`` (a ``transfer_uploaded``
        report); the same content reported for a second location is hard-linked from the first.

        Raises:
            TransferRefused: the location is refused, no complete upload of this content and
                size is held, or it cannot be put in place.
        """
        real_root, parts, rel = self.resolve(location)
        size = self.check_size(size)
        staged = self._staged(sha256)
        dir_fd = walk_dirs(real_root, parts[:-1])
        try:
            name = parts[-1]
            try:
                st = os.stat(staged, follow_symlinks=False)
                src, added = staged, 0
            except FileNotFoundError:
                st, src = _placed_copy(self._placed.get(sha256), real_root, sha256, dir_fd, name)
                added = st.st_size
            if st.st_size != size:
                if src != staged:
                    os.unlink(src, dir_fd=dir_fd)
                raise TransferRefused(f"the upload of {sha256[:16]}... holds {st.st_size} bytes, not {size}")
            m = _mtime(mtime)
            try:
                if m is not None:
                    os.utime(src, (m, m), dir_fd=None if src == staged else dir_fd, follow_symlinks=False)
                self._put_in_place(dir_fd, rel, name, src, None if src == staged else dir_fd, added)
            except BaseException:
                if src != staged:  # the link made for this location: never left behind
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(src, dir_fd=dir_fd)
                raise
            self._placed[sha256] = (rel, st.st_dev, st.st_ino)
            return TransferOutcome(rel, complete=True, sha256_ok=True)
        finally:
            os.close(dir_fd)


def _receive(
    fd: int,
    read: Callable[[int], bytes],
    start: int,
    end: int,
    chunk: int,
    pace: Optional[Callable[[int], None]],
) -> int:
    """Write what ``read(n)`` gives (up to ``chunk`` bytes a call) into ``fd`` from offset
    ``start`` up to ``end``, calling ``pace(bytes so far)`` after each piece; stop early when
    ``read`` returns ``b""``.

    Returns:
        The offset reached.

    Raises:
        OSError: the write failed.
    """
    pos = start
    while pos < end:
        piece = read(min(chunk, end - pos))
        if not piece:
            break
        os.pwrite(fd, piece, pos)
        pos += len(piece)
        if pace is not None:
            pace(pos - start)
    return pos


def _placed_copy(
    placed: Optional[Tuple[str, int, int]], real_root: str, sha256: str, dir_fd: int, name: str
) -> Tuple[os.stat_result, str]:
    """A hard link, beside ``name``, of the file this content was put in place as before
    (``placed``: its ``(rel, st_dev, st_ino)``, None when there was none).

    Raises:
        TransferRefused: there is none (never uploaded, or replaced since).
    """
    rel, dev, ino = placed or ("", -1, -1)
    path = os.path.join(real_root, *rel.split("/")) if rel else ""
    try:
        st = os.stat(path, follow_symlinks=False) if path else None
    except OSError:
        st = None
    if st is None or (st.st_dev, st.st_ino) != (dev, ino):
        raise TransferRefused(f"no complete upload of sha256 {str(sha256)[:16]}... is held")
    tmp = f".{name}.vmr-part"[:255]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    os.link(path, tmp, dst_dir_fd=dir_fd, follow_symlinks=False)
    return st, tmp
