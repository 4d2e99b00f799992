"""The VM-resource store (``--resources DIR``): files for ``filename`` drops, served by name.

A name is served only when (a) it is one of the ``filename`` drops of the requesting VM's
own schedule, (b) it is a relative path without ``..`` components, and (c) its
``os.path.realpath`` is a regular file inside the resource directory (so a symlink that
leads out of the directory is refused too). Sizes and sha256 digests are cached by
``(device, inode, size, mtime)``.

Files ``vmr-host push`` staged are a second, read-only root: a name of the form
``pushed/<sha256>`` (:func:`pushed_name`) is always ``<logs>/pushed/<sha256>``, with the same
confinement, and its content must have that sha256.

What the schedules and appended batches need is checked against the store before anything is
served or appended (SPEC section 8: schedules that name VM resources the host does not have are
refused before any VM is served). A forgotten file (FIREWHEEL's own components make every Linux
VM drop ``combined_profiles.tgz``) would otherwise fail every VM of an experiment minutes into
it, at the stage that drops it, while it held the start barrier. One check (:func:`find_missing`,
:meth:`ResourceStore.check`: nothing is read) and one text (:func:`missing_text`) serve
``vmr-host serve`` (exit 2 before anything is made or served, or one warning per file with
``--allow-missing-resources``), ``vmr-host check DIR --resources RES`` (:func:`check_resources`)
and every appended batch (``schedule add``, ``push``: refused, nothing appended)::

    2 VM resource file(s) named by the schedules are not on this host (--resources /srv/res):
      combined_profiles.tgz: needed by 120 VMs (vm1 entry 3, vm2 entry 3, vm3 entry 3 and 117 more)
      tool.bin: needed by 1 VM (vm7 entries 5,9)
    put them in /srv/res, or pass --allow-missing-resources to serve anyway (...)

Entry numbers are those of the schedule (or of the batch file), 0-based, as ``vmr-handler
check`` and the loader's errors number them.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.errors import ResourceMissing, ResourceRefused, UsageError
from vmr_handler.core.fsutil import sha256_file
from vmr_handler.core.readable import few_names
from vmr_handler.host.serve.config import VmSpec

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

    def staged(self, name: str) -> bool:
        """True when ``name`` is looked for among the staged pushes (``pushed/<sha256>``)."""
        return self.pushed is not None and _PUSHED.fullmatch(name) is not None

    def check(self, name: Any) -> str:
        """Whether ``name`` can be served, without reading it: its real path.

        Raises:
            ResourceRefused: as :meth:`resolve`, or the file is not readable by this host.
        """
        path, _st = self.resolve(name)
        if not os.access(path, os.R_OK):
            raise ResourceRefused(f"resource {name!r} cannot be read by this host (permission denied)")
        return path

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


# ---------------------------------------------------------------- what schedules and batches need
#: Per file name: VM -> the indices of its entries that drop that file.
Needs = Mapping[str, Mapping[str, Sequence[int]]]
#: VMs named per missing file before "and N more".
SHOWN_VMS = 3
#: What each command says to do, after :func:`put_them`.
NEXT = {
    "serve": ", or pass --allow-missing-resources to serve anyway (each VM that needs one is refused "
    "it at that entry)",
    "check": ": vmr-host serve refuses to start without them (unless given --allow-missing-resources)",
    "batch": " and run the command again; nothing appended",
}


def schedule_needs(specs: Mapping[str, VmSpec]) -> Dict[str, Dict[str, Tuple[int, ...]]]:
    """The files the schedules of ``specs`` drop: name -> VM -> entry indices (a name a spec
    lists in ``filenames`` without its entries: no index)."""
    needs: Dict[str, Dict[str, Tuple[int, ...]]] = {}
    for vm, spec in specs.items():
        drops = dict(spec.drops)
        for name in spec.filenames:
            needs.setdefault(name, {})[vm] = drops.get(name, ())
    return needs


def batch_needs(
    drops: Mapping[str, Sequence[int]], targets: Sequence[str]
) -> Dict[str, Dict[str, Tuple[int, ...]]]:
    """The files a batch drops (``entry_drops`` of its entries, :mod:`vmr_handler.core.schedule.model`)
    in each of ``targets``."""
    return {name: {vm: tuple(indices) for vm in targets} for name, indices in drops.items()}


def _natural(name: str) -> List[Any]:
    """Sort key: ``vm2`` before ``vm10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


@dataclass(frozen=True)
class MissingResource:
    """A file some schedule or batch drops that the host cannot serve.

    Attributes:
        name: the ``filename`` of the drops.
        why: why it cannot be served when that is not simply "not in the directory" (a name
            with ``..``, a symlink leading out, not a regular file, unreadable, a staged push
            gone), else ``""``.
        vms: ``(vm, entry indices)`` of the VMs that need it, in natural order.
    """

    name: str
    why: str
    vms: Tuple[Tuple[str, Tuple[int, ...]], ...]

    def needed_by(self) -> str:
        """``needed by 120 VMs (vm1 entry 3, vm2 entry 3, vm3 entry 3 and 117 more)``."""
        return f"needed by {self.count()} ({self.vm_list()})"

    def count(self) -> str:
        """``1 VM``, ``120 VMs``."""
        return f"{len(self.vms)} VM{'' if len(self.vms) == 1 else 's'}"

    def vm_list(self) -> str:
        """``vm1 entry 3, vm2 entries 3,7, vm3 and 117 more``: a few VMs, each with its entries."""
        parts = []
        for vm, indices in self.vms:
            which = "entry" if len(indices) == 1 else "entries"
            parts.append(f"{vm} {which} {','.join(str(i) for i in indices)}" if indices else vm)
        return few_names(parts, SHOWN_VMS)

    def line(self) -> str:
        """The file's line of :func:`missing_text`."""
        return f"{self.name}: {self.needed_by()}{f'; {self.why}' if self.why else ''}"

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe form (``vmr-host check --json``): ``name``, ``why``, ``vms`` {vm: [index]}."""
        return {"name": self.name, "why": self.why, "vms": {vm: list(ix) for vm, ix in self.vms}}


def find_missing(store: ResourceStore, needs: Needs) -> List[MissingResource]:
    """The files of ``needs`` that ``store`` cannot serve, by name (nothing is read: each is
    resolved, confined and checked readable; :meth:`ResourceStore.check`)."""
    out: List[MissingResource] = []
    for name in sorted(needs):
        try:
            store.check(name)
            continue
        except ResourceRefused as exc:
            plain = isinstance(exc, ResourceMissing) or (store.root is None and not store.staged(name))
            why = "" if plain else str(exc)  # plain: the heading says where it was looked for
        vms = sorted(((vm, tuple(ix)) for vm, ix in needs[name].items()), key=lambda p: _natural(p[0]))
        out.append(MissingResource(name, why, tuple(vms)))
    return out


def where_text(store: ResourceStore, missing: Sequence[MissingResource] = ()) -> str:
    """Where the host looks for the files ``missing`` (``--resources``, the staged pushes)."""
    where = f"--resources {store.root}" if store.root else "this host has no --resources directory"
    if any(store.staged(m.name) for m in missing):
        where += f"; staged pushes {store.pushed}"
    return where


def put_them(store: ResourceStore, missing: Sequence[MissingResource], context: str) -> str:
    """What to do about ``missing`` in ``context`` (``serve``, ``check`` or ``batch``)."""
    if context == "batch" and all(store.staged(m.name) for m in missing):
        return "run vmr-host push again (it stages its files again); nothing appended"
    if store.root is None:
        put = "give vmr-host serve --resources DIR holding them"
        if context == "batch":
            put = "restart vmr-host serve with --resources DIR holding them"
    else:
        put = f"put them in {store.root}"
    return put + NEXT[context]


def missing_text(missing: Sequence[MissingResource], store: ResourceStore, subject: str, context: str) -> str:
    """The listing of ``missing`` (see the module docstring): a heading naming ``subject`` (``the
    schedules``, ``the batch``) and where the host looks, one line per file, then what to do
    in ``context`` (``serve``, ``check`` or ``batch``: :func:`put_them`)."""
    head = f"{len(missing)} VM resource file(s) named by {subject} are not on this host"
    lines = [f"{head} ({where_text(store, missing)}):", *(f"  {m.line()}" for m in missing)]
    return "\n".join([*lines, put_them(store, missing, context)])


def missing_warning(m: MissingResource, store: ResourceStore) -> str:
    """``serve --allow-missing-resources``: the one warning about file ``m``."""
    why = f"; {m.why}" if m.why else ""
    verb = "needs" if len(m.vms) == 1 else "need"
    return (
        f"serving without VM resource {m.name} ({where_text(store, [m])}{why}): {m.count()} {verb} it "
        f"({m.vm_list()}) and each is refused it at that entry (--allow-missing-resources)"
    )


@dataclass(frozen=True)
class ResourceCheck:
    """What ``vmr-host check DIR [--resources RES]`` found of the schedules' VM resources.

    Attributes:
        store: the ``--resources`` looked in; None: not checked (no ``--resources``).
        named: how many distinct files the schedules drop.
        missing: those the host would not have.
    """

    store: Optional[ResourceStore]
    named: int
    missing: Tuple[MissingResource, ...]

    def lines(self) -> List[str]:
        """The lines ``check`` prints before its summary: the listing of the missing files, or
        one line saying they were not checked (none when no file is named)."""
        if self.store is None:
            if not self.named:
                return []
            return [f"VM resources not checked: the schedules name {self.named} file(s); "
                    "give --resources DIR to check them"]  # fmt: skip
        if not self.missing:
            return []
        return missing_text(self.missing, self.store, "the schedules", "check").splitlines()

    def summary(self) -> str:
        """What ends ``check``'s summary line."""
        if self.store is None or not self.named:
            return ""
        if self.missing:
            return f", {len(self.missing)} VM resource file(s) missing"
        return f"; {self.named} VM resource file(s) named, all in {self.store.root}"

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe form: ``checked``, ``directory``, ``named``, ``missing`` (each
        :meth:`MissingResource.to_dict`)."""
        return {
            "checked": self.store is not None,
            "directory": self.store.root if self.store is not None else None,
            "named": self.named,
            "missing": [m.to_dict() for m in self.missing],
        }


def check_resources(specs: Mapping[str, VmSpec], resources: Optional[str]) -> ResourceCheck:
    """``vmr-host check``: the files the schedules of ``specs`` drop, looked for in the directory
    ``resources`` as ``serve --resources`` would (None: not checked).

    Raises:
        UsageError: ``resources`` is not a directory.
    """
    needs = schedule_needs(specs)
    if resources is None:
        return ResourceCheck(None, len(needs), ())
    if not os.path.isdir(resources):
        raise UsageError(f"--resources {resources} is not a directory")
    store = ResourceStore(resources)
    return ResourceCheck(store, len(needs), tuple(find_missing(store, needs)))
