"""A FIREWHEEL experiment's schedules and VM resources, written for ``vmr-host serve``.

What the ``vmr_handler.export`` model component writes into ``out=DIR``::

    DIR/schedules/<vm>.pkl   pickle.dumps(list(schedule.get_schedule())): the bytes repo-base's
                             vm_resource.schedule plugin stores for the VM (its plugin.py)
    DIR/resources/<name>     every VM resource those schedules drop (``data`` items with a
                             ``filename``), copied from the installed model component that
                             ships it (its MANIFEST's ``vm_resources``)

ready for ``vmr-host serve --schedules DIR/schedules --resources DIR/resources``. FIREWHEEL keeps
its VM resources in one store by base name (``ModelComponent._upload_vm_resources``); the same
name here. Each schedule is loaded with vmr-handler's own loader first: a Windows one is left to
FIREWHEEL's own handler (:func:`served`), any other the agent would refuse stops the export
naming the VM, before any VM boots.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from vmr_handler.core.errors import ExportError, ScheduleError, WindowsScheduleError
from vmr_handler.core.fsutil import atomic_write, sha256_file
from vmr_handler.core.schedule import load_schedule_bytes
from vmr_handler.core.schedule.model import entry_drops

#: Schedule files vmr-host serves from ``--schedules`` (``host/serve/specs.py``).
SCHEDULE_SUFFIXES = (".pkl", ".pickle", ".yaml", ".yml", ".json")


@dataclass(frozen=True)
class VmExport:
    """One VM endpoint of the experiment graph.

    Attributes:
        name: the vertex's name (the schedule's file name ``<name>.pkl``).
        schedule: the pickled list of its schedule entries, as the schedule plugin pickles it.
    """

    name: str
    schedule: bytes


@dataclass(frozen=True)
class ExportResult:
    """What :func:`write_export` wrote.

    Attributes:
        schedules: ``<out>/schedules/<vm>.pkl`` of each VM, by VM name.
        resources: the VM resources copied into ``<out>/resources``, by name -> source path.
        removed: schedule files of VMs not in this experiment, removed from ``<out>/schedules``
            (an earlier export's; vmr-host would serve them).
    """

    schedules: Dict[str, str]
    resources: Dict[str, str]
    removed: Tuple[str, ...]


def _manifest_files(mc_path: str, patterns: Sequence[str]) -> List[Path]:
    """The files of a MANIFEST's ``vm_resources`` patterns: a directory means its files, ``**``
    any depth, as ``ModelComponent._upload_vm_resources`` reads them."""
    found: List[Path] = []
    for pattern in patterns:
        pattern = str(pattern)
        if os.path.isdir(os.path.join(mc_path, pattern)):
            pattern = os.path.join(pattern, "*")
        for match in sorted(glob.glob(os.path.join(mc_path, pattern), recursive=True)):
            if os.path.isfile(match):
                found.append(Path(match))
    return found


def resource_index(components: Iterable[Tuple[str, Mapping[str, Any]]]) -> Dict[str, List[Path]]:
    """Every VM resource the installed model components ship: base name -> the files.

    Args:
        components: ``(model component folder, its MANIFEST as a mapping)`` of each installed
            model component (FIREWHEEL's ``ModelComponentIterator``).
    """
    index: Dict[str, List[Path]] = {}
    for mc_path, manifest in components:
        patterns = manifest.get("vm_resources") or []
        if not isinstance(patterns, list):
            continue
        for path in _manifest_files(mc_path, patterns):
            index.setdefault(path.name, []).append(path)
    return index


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pick(name: str, candidates: Sequence[Path]) -> Path:
    """The one file of ``name``: several model components may ship it when the bytes agree."""
    if len({_digest(p) for p in candidates}) > 1:
        listed = ", ".join(str(p) for p in candidates)
        raise ExportError(
            f"VM resource {name!r} is shipped with different contents by several model components "
            f"({listed}): FIREWHEEL's store keeps one file per name; rename one of them"
        )
    return candidates[0]


def served(vms: Sequence[VmExport]) -> Tuple[List[VmExport], Dict[str, str]]:
    """The VMs vmr-host is to serve, and those left to FIREWHEEL's own VM resource handler: a VM
    whose schedule is written for Windows (:class:`~vmr_handler.core.errors.WindowsScheduleError`:
    vmr-handler has no Windows agent), VM name -> why. A mixed experiment keeps its Windows VMs
    as FIREWHEEL runs them; any other schedule the loader refuses stays in the first list, for
    :func:`needed_resources` to name."""
    keep: List[VmExport] = []
    left: Dict[str, str] = {}
    for vm in vms:
        try:
            load_schedule_bytes(vm.schedule)
        except WindowsScheduleError as exc:
            left[vm.name] = str(exc)
            continue
        except ScheduleError:
            pass
        keep.append(vm)
    return keep, left


def needed_resources(vms: Sequence[VmExport]) -> Dict[str, List[str]]:
    """VM resource name -> the VMs whose schedule drops it.

    Raises:
        ExportError: a schedule vmr-handler's loader refuses (the VM and the loader's reason).
    """
    needs: Dict[str, List[str]] = {}
    for vm in vms:
        try:
            schedule = load_schedule_bytes(vm.schedule)
        except ScheduleError as exc:
            raise ExportError(f"VM {vm.name}: its schedule cannot be served by vmr-host: {exc}") from exc
        for name in entry_drops(schedule.entries):
            needs.setdefault(name, []).append(vm.name)
    return needs


def resolve_resources(
    needs: Mapping[str, Sequence[str]], index: Mapping[str, Sequence[Path]]
) -> Dict[str, Path]:
    """The file of each needed VM resource.

    Raises:
        ExportError: names no installed model component ships (each with the VMs that drop
            it), or a name shipped with different contents.
    """
    missing = sorted(name for name in needs if name not in index)
    if missing:
        lines = "; ".join(
            f"{name} (dropped by {', '.join(needs[name][:3])}{' and more' if len(needs[name]) > 3 else ''})"
            for name in missing
        )
        raise ExportError(
            f"{len(missing)} VM resource(s) no installed model component ships: {lines}. List each in "
            "the MANIFEST vm_resources of a model component of the experiment (pip install its repository)"
        )
    return {name: _pick(name, index[name]) for name in sorted(needs)}


def _copy_resource(source: Path, target: Path) -> None:
    """Copy unless ``target`` already holds the same bytes; the mode is the source's (a 0644
    resource stays 0644: the drop's ``executable`` decides, as in FIREWHEEL)."""
    if target.is_file() and sha256_file(str(target)) == sha256_file(str(source)):
        return
    tmp = target.with_name(f".tmp-{target.name}")
    shutil.copy2(source, tmp)
    os.replace(tmp, target)


def write_export(out: str, vms: Sequence[VmExport], resources: Mapping[str, Path]) -> ExportResult:
    """Write ``<out>/schedules/<vm>.pkl`` and ``<out>/resources/<name>`` (module docstring).

    Schedule files of other VMs left in ``<out>/schedules`` by an earlier export are removed
    (vmr-host would serve every schedule there); other files are left alone.

    Raises:
        ExportError: ``out`` is not absolute, two VMs share a name, or a file cannot be written.
    """
    if not os.path.isabs(out):
        raise ExportError(f"out={out!r} is not an absolute path: give the directory to write the export to")
    names = [vm.name for vm in vms]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ExportError(f"several VMs are named {', '.join(twice)}: one schedule file per VM name")
    schedules_dir, resources_dir = Path(out, "schedules"), Path(out, "resources")
    try:
        schedules_dir.mkdir(parents=True, exist_ok=True)
        resources_dir.mkdir(parents=True, exist_ok=True)
        written = {}
        for vm in vms:
            path = schedules_dir / f"{vm.name}.pkl"
            atomic_write(str(path), vm.schedule, 0o644)
            written[vm.name] = str(path)
        removed = []
        for old in sorted(schedules_dir.iterdir()):
            if old.suffix in SCHEDULE_SUFFIXES and old.stem not in written and old.is_file():
                old.unlink()
                removed.append(str(old))
        for name, source in resources.items():
            _copy_resource(source, resources_dir / name)
    except OSError as exc:
        raise ExportError(f"cannot write the export to {out}: {exc}") from exc
    return ExportResult(written, {n: str(p) for n, p in resources.items()}, tuple(removed))


class HandedOver:
    """A VM's FIREWHEEL schedule once vmr-handler runs it: reads as empty (``bool`` is False),
    gives its entries as before (``get_schedule``, ``get_serialized_schedule``), and takes no
    more (``add_vm_resource`` raises: an entry added after the export would never run).

    repo-base launches FIREWHEEL's own VM resource handler, and gives the VM its QEMU guest
    agent port, only for a VM whose ``vm_resource_schedule`` is truthy
    (``minimega/emulated_entities/model_component_objects.py``,
    ``_generate_vm_resource_handler_communication_config``); handed over, each entry runs once,
    by vmr-handler, while vm_resource.schedule still stores the schedule in FIREWHEEL's
    database as before.

    Attributes:
        schedule: repo-base's ``VmResourceSchedule`` of the VM.
        vm: the VM's name (for the error).
    """

    def __init__(self, schedule: Any, vm: str) -> None:
        self.schedule = schedule
        self.vm = vm

    def __bool__(self) -> bool:
        return False

    def get_schedule(self) -> Any:
        """The schedule's own ``get_schedule()``: its list of entries."""
        return self.schedule.get_schedule()

    def get_serialized_schedule(self) -> Any:
        """The schedule's own ``get_serialized_schedule()``."""
        return self.schedule.get_serialized_schedule()

    def add_vm_resource(self, new_entry: Any) -> None:
        """Refused: the schedule was exported already.

        Raises:
            ExportError: always, naming the VM and what to do.
        """
        raise ExportError(
            f"VM {self.vm}: a schedule entry (start_time {getattr(new_entry, 'start_time', '?')}) was added "
            "after vmr_handler.export wrote the schedule: place the model component that adds it "
            "before vmr_handler.export (it depends on schedules_ready)"
        )
