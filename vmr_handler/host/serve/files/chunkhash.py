"""The sha256 of a file assembled from ``transfer_chunk`` reports, kept as it grows.

A file sent over the channel is checked against its announced sha256 when its last chunk
arrives. Hashing it whole then would cost the host's event loop ~170 ms for a 250 MiB file,
and a guest could make it do that for every chunk it sends (one byte, ``last: true``, a
sparse file). So:

* :class:`RunningHashes` keeps, per file, the sha256 of its bytes from offset 0 so far and
  extends it with every chunk that continues it: chunks sent in order are hashed once, as they
  arrive, and a chunk sent again with the same bytes (compared with what is on disk, at most a
  chunk's length) changes nothing: what was hashed is never hashed again;
* only what is still missing at the last chunk -- chunks that came out of order, a host
  restarted mid-file, a chunk that rewrote hashed bytes with different ones -- is hashed by a
  :class:`PendingHash`, which the session runs in a worker thread (one at a time per VM: that
  VM's later reports wait, every other VM goes on).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Dict, Tuple

from vmr_handler.core.errors import TransferRefused
from vmr_handler.host.logs.text import printable

#: Bytes read at a time when hashing what is missing.
HASH_PIECE = 1024 * 1024


def hash_from(fd: int, h: Any, start: int, end: int) -> Any:
    """``h`` updated with bytes ``start`` to ``end`` of ``fd`` (read in 1 MiB pieces; a file
    shorter than ``end`` stops early). Blocking: call from a worker thread for big ranges."""
    pos = start
    while pos < end:
        piece = os.pread(fd, min(HASH_PIECE, end - pos), pos)
        if not piece:
            break
        h.update(piece)
        pos += len(piece)
    return h


class RunningHashes:
    """Per file (its path relative to the VM's transfer root): how many bytes from offset 0
    are hashed, and the sha256 object of them.

    Attributes:
        restarts: times a chunk rewrote hashed bytes with different ones (the file's hash
            starts again from offset 0 at its last chunk).
        repeats: chunks refused for repeating a file already in place (:meth:`check_repeat`).
    """

    def __init__(self) -> None:
        self._state: Dict[str, Tuple[int, Any]] = {}
        self._placed: Dict[str, Tuple[int, str]] = {}  # rel -> (size, sha256) last put in place
        self.restarts = 0
        self.repeats = 0

    def check_repeat(self, rel: str, offset: int, size: int, sha256: Any) -> None:
        """Refuse (and count) a chunk past offset 0 of the content last put in place at ``rel``
        (a guest repeating the last chunk of a verified file); offset 0 starts a new version.

        Raises:
            TransferRefused: it repeats the file in place.
        """
        if offset == 0:
            self._placed.pop(rel, None)
        elif isinstance(sha256, str) and self._placed.get(rel) == (size, sha256.lower()):
            self.repeats += 1
            raise TransferRefused(f"{printable(rel, 200)!r} is already in place with this sha256")

    def before_write(self, rel: str, fd: int, offset: int, data: bytes) -> None:
        """Account for ``data`` about to be written at ``offset`` of the part file ``fd``.

        Bytes over the hashed part are compared with the file (at most ``len(data)`` read):
        the same bytes keep the hash, different ones restart it. Bytes that continue the hashed
        part extend it.
        """
        hashed, h = self._state.get(rel, (0, None))
        if h is None:
            hashed, h = 0, hashlib.sha256()
        end = offset + len(data)
        if offset < hashed:
            overlap = min(end, hashed) - offset
            if os.pread(fd, overlap, offset) != data[:overlap]:
                hashed, h = 0, hashlib.sha256()
                self.restarts += 1
        if offset <= hashed < end:
            h.update(data[hashed - offset :])
            hashed = end
        self._state[rel] = (hashed, h)

    def at_last(self, rel: str, size: int) -> Tuple[int, Any]:
        """``(bytes hashed, sha256 object)`` of the first ``size`` bytes so far, for the last
        chunk (a hash past ``size``, from an older and longer version, starts again)."""
        hashed, h = self._state.get(rel, (0, None))
        if h is None or hashed > size:
            self.restarts += h is not None
            return 0, hashlib.sha256()
        return hashed, h

    def hashed(self, rel: str, size: int, h: Any) -> None:
        """The first ``size`` bytes of ``rel`` have the sha256 object ``h`` (kept after a
        mismatch, so a repeated last chunk costs nothing)."""
        self._state[rel] = (size, h)

    def placed(self, rel: str, size: int, sha256: str) -> None:
        """``rel`` was put in place, verified: its part file (and hash) are gone."""
        self._state.pop(rel, None)
        self._placed[rel] = (size, sha256.lower())


@dataclass
class PendingHash:
    """A last chunk written whose file still has bytes to hash before it can be verified.

    :meth:`run` (blocking: a worker thread) hashes them;
    :meth:`~vmr_handler.host.serve.files.transfers.TransferStore.finish_chunk` (on the loop) verifies and
    puts the file in place, and closes both descriptors.

    Attributes:
        rel: the file's path relative to the VM's transfer root.
        name: its last component.
        dir_fd: its directory, open.
        fd: its part file, open.
        size: its announced size (the part file has it).
        sha256: the announced sha256.
        mtime: the announced mtime.
        hashed: bytes already hashed (``h`` holds them).
        h: the sha256 object.
    """

    rel: str
    name: str
    dir_fd: int
    fd: int
    size: int
    sha256: Any
    mtime: Any
    hashed: int
    h: Any

    @property
    def missing(self) -> int:
        """Bytes :meth:`run` has to hash."""
        return self.size - self.hashed

    def run(self) -> PendingHash:
        """Hash the missing bytes (blocking). Returns self."""
        self.h = hash_from(self.fd, self.h, self.hashed, self.size)
        self.hashed = self.size
        return self

    def close(self) -> None:
        """Close both descriptors (once)."""
        for fd in (self.fd, self.dir_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.dir_fd = -1

