"""Transfers with a ``destination``: each file a VM transfers out is kept in
``<logs>/transfers/<vm>/<location>`` (:class:`~vmr_handler.host.serve.files.transfers.TransferStore`)
and, when the schedule's transfer names a destination directory on the host, also copied to
``<destination>/<vm>/<location>``, where FIREWHEEL 3.1.0 writes it
(``vm_resource_handler.py`` ``_transfer_data``, L958-963 and L1022; ``docs/firewheel.md``, "Transfers
with a destination").

The destination comes from the host's copy of the schedule (its author chose it), never from
the guest: validation admits only absolute paths without ``..``
(:func:`~vmr_handler.core.schedule.items.destination_problem`). What the guest names below it
is confined as in the logs (no ``..``; directories walked with ``O_NOFOLLOW`` from the
destination down, so a symlink planted under it is not followed).
"""

from __future__ import annotations

import os
import shutil
from typing import List, Optional, Sequence, Tuple

from vmr_handler.core.errors import TransferRefused
from vmr_handler.host.serve.files.transferpaths import confine_location, open_part, walk_dirs


class TransferDestinations:
    """The destination directories of one VM's transfers.

    Args:
        vm: the VM's name (files land in ``<destination>/<vm>/``).
        pairs: ``(location, destination)`` of the schedule's transfers that name one
            (:attr:`~vmr_handler.host.serve.config.VmSpec.destinations`).
    """

    def __init__(self, vm: str, pairs: Sequence[Tuple[str, str]]) -> None:
        self.vm = vm
        self._pairs: List[Tuple[str, str]] = []
        for location, destination in pairs:
            try:
                rel = "/".join(confine_location(location))
            except TransferRefused:  # a location that names no file: nothing ever lands there
                continue
            self._pairs.append((rel, os.path.normpath(destination)))

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def targets(self, rel: str) -> List[str]:
        """The destination directories of the file stored as ``rel`` (its path under the VM's
        transfer root): those of every transfer whose location is ``rel`` or a directory above it."""
        out: List[str] = []
        for location, destination in self._pairs:
            if (rel == location or rel.startswith(location + "/")) and destination not in out:
                out.append(destination)
        return out

    def path(self, destination: str, rel: str) -> str:
        """Where the file stored as ``rel`` lands under ``destination``: ``<destination>/<vm>/<rel>``."""
        return os.path.join(destination, self.vm, *rel.split("/"))

    def deliver(self, root: str, rel: str, destinations: Sequence[str]) -> List[Tuple[str, Optional[str]]]:
        """Copy ``<root>/<rel>`` to each destination (blocking: run it in a worker thread).

        Returns:
            ``(path it landed at, None)`` or ``(path, why it did not)`` per destination.
        """
        results: List[Tuple[str, Optional[str]]] = []
        for destination in destinations:
            target = self.path(destination, rel)
            try:
                copy_into(os.path.join(root, *rel.split("/")), destination, [self.vm, *rel.split("/")])
            except TransferRefused as exc:
                results.append((target, str(exc)))
            except OSError as exc:
                results.append((target, exc.strerror or str(exc)))
            else:
                results.append((target, None))
        return results


def copy_into(source: str, destination: str, parts: List[str]) -> None:
    """Copy the file ``source`` to ``destination``/``parts`` (a hidden ``.<name>.vmr-part``
    renamed into place, mode 0644, ``source``'s mtime): ``destination`` is made when missing,
    the directories under it (mode 0700) walked without following symlinks.

    Raises:
        OSError: ``destination`` cannot be made or written, or ``source`` cannot be read.
        TransferRefused: a directory on the way under ``destination`` is a symlink or no directory.
    """
    os.makedirs(destination, mode=0o755, exist_ok=True)
    dir_fd = walk_dirs(os.path.realpath(destination), parts[:-1])
    try:
        name, part = parts[-1], f".{parts[-1]}.vmr-part"[:255]
        out_fd = open_part(dir_fd, part, "/".join(parts))
        try:
            with open(source, "rb") as src, open(out_fd, "wb", closefd=False) as dst:
                shutil.copyfileobj(src, dst, 1024 * 1024)
                st = os.fstat(src.fileno())
            os.ftruncate(out_fd, st.st_size)  # a part left longer by an earlier try
            os.fchmod(out_fd, 0o644)
            os.utime(out_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out_fd)
        os.rename(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
