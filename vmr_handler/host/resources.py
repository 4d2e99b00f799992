"""The VM-resource store (``--resources DIR``): files for ``filename`` drops, served by name.

A name is served only when (a) it is one of the ``filename`` drops of the requesting VM's
own schedule, (b) it is a relative path without ``..`` components, and (c) its
``os.path.realpath`` is a regular file inside the resource directory (so a symlink that
leads out of the directory is refused too). Sizes and sha256 digests are cached by
``(device, inode, size, mtime)``.

Files ``vmr-host push`` staged (issue 12) are a second, read-only root: a name of the form
``pushed/<sha256>`` (:func:`pushed_name`) is always ``<logs>/pushed/<sha256>``, with the same
confinement, and its content must have that sha256.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from vmr_handler.core.errors import ResourceMissing, ResourceRefused
from vmr_handler.core.fsutil import sha256_file

#: Where ``vmr-host push`` stages files, under the logs directory; also the prefix of their names.
PUSHED_DIR = "pushed"
_PUSHED = re.compile(PUSHED_DIR + r"/([0-9a-f]{64})")


def pushed_name(sha256: str) -> str:
    """The resource name of the staged push of content ``sha256`` (64 lowercase hex digits)."""
    return f"{PUSHED_DIR}/{sha256}"


@dataclass(frozen=True)
class ResourceInfo:
    """A resolved resource file.

    Attributes:
        name: the requested name.
        path: its real path (inside the resource directory).
        size: bytes.
        sha256: hex digest of the whole file.
    """

    name: str
    path: str
    size: int
    sha256: str


class ResourceStore:
    """Resolves and hashes resource files.

    Args:
        root: the resource directory, or None when the host serves no resources.
        pushed: the directory of staged pushes (``<logs>/pushed``), or None: names
            ``pushed/<sha256>`` are then looked for in ``root`` like any other.
    """

    def __init__(self, root: Optional[str], pushed: Optional[str] = None) -> None:
        self.root = os.path.realpath(root) if root else None
        self.pushed = os.path.realpath(pushed) if pushed else None
        self._cache: Dict[str, Tuple[Tuple[int, int, int, int], str]] = {}

    def _root_of(self, name: str) -> Tuple[str, str, str]:
        """``(directory, name inside it, what to call the directory)`` where ``name`` is looked for.

        Raises:
            ResourceRefused: no resource directory for it.
        """
        staged = _PUSHED.fullmatch(name) if self.pushed is not None else None
        if staged is not None and self.pushed is not None:
            return self.pushed, staged.group(1), f"the staged pushes {self.pushed}"
        if self.root is None:
            raise ResourceRefused("this host serves no VM resources (no --resources directory)")
        return self.root, name, f"the host's --resources directory {self.root}"

    def resolve(self, name: Any) -> Tuple[str, os.stat_result]:
        """The real path and stat of resource ``name``.

        Raises:
            ResourceRefused: no resource directory, a bad/escaping name, not found, or not a
                regular file.
        """
        if not isinstance(name, str) or not name or len(name) > 1024 or "\x00" in name:
            raise ResourceRefused("resource name must be a non-empty string")
        root, inside, where = self._root_of(name)
        parts = name.split("/")
        if name.startswith("/") or any(p == ".." for p in parts):
            raise ResourceRefused(f"resource name {name!r} refused: absolute or with '..'")
        path = os.path.realpath(os.path.join(root, inside))
        if not path.startswith(root + os.sep):
            raise ResourceRefused(f"resource name {name!r} refused: resolves outside the resource directory")
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ResourceMissing(f"resource {name!r} is not in {where}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ResourceRefused(f"resource {name!r} is not a regular file")
        return path, st

    def info(self, name: Any) -> ResourceInfo:
        """Resolve ``name`` and return its size and sha256 (hashing it if not cached).

        Blocking (reads the whole file when it changed): call it from a thread for large
        files on a running event loop.

        Raises:
            ResourceRefused: as :meth:`resolve`, or the file cannot be read.
        """
        path, st = self.resolve(name)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == key:
            return ResourceInfo(str(name), path, st.st_size, cached[1])
        try:
            digest = sha256_file(path)
        except OSError as exc:
            raise ResourceRefused(f"resource {name!r} cannot be read: {exc.strerror}") from exc
        staged = _PUSHED.fullmatch(name) if self.pushed is not None else None
        if staged is not None and staged.group(1) != digest:
            raise ResourceRefused(f"staged push {name!r} changed since it was staged (sha256 {digest})")
        self._cache[path] = (key, digest)
        return ResourceInfo(str(name), path, st.st_size, digest)

    def is_cached(self, name: Any) -> bool:
        """True when :meth:`info` would answer without reading the file (cheap to call inline)."""
        try:
            path, st = self.resolve(name)
        except ResourceRefused:
            return True  # answered at once with the refusal
        cached = self._cache.get(path)
        return cached is not None and cached[0] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
