"""Where a VM's transferred file goes: its location confined to the VM's transfer root
(:class:`~vmr_handler.host.serve.files.transfers.TransferStore`), directories walked without following
symlinks, the partial file opened safely.
"""

from __future__ import annotations

import os
from typing import Any, List

from vmr_handler.core.errors import TransferRefused
from vmr_handler.host.logs.text import printable

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

#: Most path components a transferred file's location may have (a guest's tree that deep is
#: refused rather than stored: nothing on the host walks it recursively anyway).
MAX_LOCATION_DEPTH = 256


def confine_location(location: Any) -> List[str]:
    """The path components of ``location`` under the root.

    Raises:
        TransferRefused: not a string, empty, NUL, a ``..`` component, a component
            longer than 255 bytes, more than :data:`MAX_LOCATION_DEPTH` components, or more
            than 4096 bytes in all.
    """
    if not isinstance(location, str) or not location:
        raise TransferRefused("location must be a non-empty string")
    if "\x00" in location:
        raise TransferRefused("location contains NUL")
    if len(location.encode("utf-8", errors="replace")) > 4096:
        raise TransferRefused("location longer than 4096 bytes")
    parts = [p for p in location.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise TransferRefused(f"location {printable(location, 200)!r} has a '..' component")
    if not parts:
        raise TransferRefused(f"location {printable(location, 200)!r} names no file")
    if any(len(p.encode("utf-8", errors="replace")) > 255 for p in parts):
        raise TransferRefused("a location component is longer than 255 bytes")
    if len(parts) > MAX_LOCATION_DEPTH:
        raise TransferRefused(
            f"location has {len(parts)} directory levels, more than the limit of {MAX_LOCATION_DEPTH}"
        )
    return parts


def walk_dirs(real_root: str, dirs: List[str]) -> int:
    """A descriptor of ``real_root``/``dirs`` (made, mode 0700, where missing), walked with
    ``O_NOFOLLOW`` from the root down.

    Raises:
        TransferRefused: a component on the way is a symlink or no directory.
    """
    fd = os.open(real_root, _O_DIR)
    try:
        for name in dirs:
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nfd = os.open(name, _O_DIR, dir_fd=fd)
            except OSError as exc:
                raise TransferRefused(
                    f"{printable(name, 200)!r} on the way is a symlink or no directory ({exc.strerror})"
                ) from exc
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_part(dir_fd: int, part: str, rel: str) -> int:
    """A read-write descriptor of the partial file ``part`` in ``dir_fd`` (created, mode 0600;
    never a link of a placed file: such a link is replaced by a new file).

    Raises:
        TransferRefused: it cannot be opened (``rel`` names the file in the message).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(part, flags, 0o600, dir_fd=dir_fd)
        if os.fstat(fd).st_nlink > 1:  # a link of a placed file must never be written into
            os.close(fd)
            os.unlink(part, dir_fd=dir_fd)
            fd = os.open(part, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise TransferRefused(f"cannot open {printable(rel, 200)!r}: {exc.strerror}") from exc
    return fd
