"""What an on_host entry runs on the host: its argv (:func:`host_command`) and its environment
(:func:`host_entry_env`), as FIREWHEEL 3.1.0's ``vm_resource_handler.py`` builds them
(``_run_vm_resource_host`` and ``_build_host_vm_resource_env``; ``docs/firewheel.md``,
"Host-side entries").

* The program: an absolute path; ``minimega`` (found on the host's PATH, run as
  ``minimega -e ARGS``); or a file of the host's ``--resources`` (confined as resources are).
  A resource without its executable bits whose ``filename`` drop in the entry says
  ``executable: true`` is copied into the entry's working dir and made executable there (the
  release chmods its cached copy, never the model component's file); one the entry does not
  mark so is refused, saying what to do.
* The environment: the host's, with ``FIREWHEEL_VM_NAME``, ``FIREWHEEL_VM_UUID``,
  ``FIREWHEEL_PYTHON``, ``FIREWHEEL_VM_CONFIG_JSON`` and the bin directory of the Python that
  runs vmr-host first on ``PATH`` (``VIRTUAL_ENV`` set when that Python is a venv's).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import sys
from typing import Dict, List, Mapping, Optional

from vmr_handler.core.errors import EntryError, ResourceRefused
from vmr_handler.core.schedule.model import FileDrop, ScheduleEntry
from vmr_handler.host.serve.files.resources import ResourceStore


def marked_executable(entry: ScheduleEntry) -> bool:
    """True when a ``filename`` drop of ``entry`` names its executable and says
    ``executable: true`` (release ``vm_resource_handler.py`` L491-516: ``local_entry.get("executable")``)."""
    return any(
        isinstance(item, FileDrop) and item.filename == entry.executable and item.executable
        for item in entry.data
    )


def host_command(
    entry: ScheduleEntry, resources: ResourceStore, path: Optional[str], workdir: str
) -> List[str]:
    """The argv of an on_host entry; the arguments split as a shell would (no shell runs them).

    Args:
        entry: the on_host entry (the host's copy of the schedule).
        resources: the host's ``--resources`` store (a relative program is one of its files).
        path: the PATH ``minimega`` is looked up on (None: this process's).
        workdir: the entry's working dir; a resource made executable is copied there (the
            directory made then, mode 0750).

    Raises:
        ResourceRefused: the program is not allowed (relative and not a file of
            ``--resources``, escaping it, not executable and not marked ``executable: true``,
            or no executable at all).
        EntryError: minimega is not on the PATH, the arguments cannot be split, or a
            resource cannot be copied into ``workdir``.
    """
    exe = entry.executable
    if not exe:
        raise ResourceRefused("an on_host entry without an executable: nothing to run on the host")
    try:
        args = shlex.split(entry.arguments)
    except ValueError as exc:
        raise EntryError(f"arguments {entry.arguments!r} cannot be split: {exc}") from exc
    if os.path.isabs(exe):
        return [exe, *args]
    if exe == "minimega":
        found = shutil.which("minimega", path=path)
        if found is None:
            raise EntryError(
                "minimega is not on this host's PATH: install it there, or give its absolute path "
                "as the entry's executable"
            )
        return [found, "-e", *args]
    try:
        program, st = resources.resolve(exe)
    except ResourceRefused as exc:
        raise ResourceRefused(
            f"on_host executable {exe!r} is not an absolute path, not minimega and not a usable file "
            f"of the host's --resources: {exc}"
        ) from exc
    if st.st_mode & stat.S_IXUSR:
        return [program, *args]
    mode = oct(st.st_mode & 0o777)
    if not marked_executable(entry):
        raise ResourceRefused(
            f"resource {exe!r} is not executable (mode {mode}) and the entry's drop of it does not say "
            "executable: true: set executable: true on that drop (FIREWHEEL then makes it executable), "
            "or chmod +x the file in --resources"
        )
    return [_executable_copy(program, st.st_mode, workdir), *args]


def _executable_copy(program: str, mode: int, workdir: str) -> str:
    """``program`` copied into ``workdir`` (its base name), with the executable bits added to
    its ``mode``; the copy's path.

    Raises:
        EntryError: it cannot be copied or its mode set.
    """
    target = os.path.join(workdir, os.path.basename(program))
    partial = target + ".vmr-part"
    try:
        os.makedirs(workdir, mode=0o750, exist_ok=True)
        shutil.copyfile(program, partial)
        os.chmod(partial, (mode & 0o777) | 0o111)
        os.replace(partial, target)
    except OSError as exc:
        raise EntryError(
            f"cannot copy {program} into {workdir} to make it executable: {exc.strerror or exc}; not run"
        ) from exc
    return target


def python_bin() -> Dict[str, str]:
    """``{"python": FIREWHEEL_PYTHON, "bin": the directory put first on PATH, "venv": VIRTUAL_ENV
    or ""}`` for the Python that runs vmr-host (``sys.executable``, its directory not resolved:
    a venv's ``bin`` stays the venv's)."""
    python = sys.executable
    venv = sys.prefix if sys.prefix != getattr(sys, "base_prefix", sys.prefix) else ""
    return {"python": python, "bin": os.path.dirname(python), "venv": venv}


def host_entry_env(
    vm: str, schedule_path: Optional[str], base: Optional[Mapping[str, str]] = None
) -> Dict[str, str]:
    """The environment of an on_host entry of ``vm`` (release ``_build_host_vm_resource_env``,
    ``vm_resource_handler.py`` L834-901).

    Args:
        vm: the VM's name (``FIREWHEEL_VM_NAME``).
        schedule_path: the VM's schedule file as served, or None when not known.
        base: the environment to start from (default this process's).

    Returns:
        ``base`` with ``FIREWHEEL_VM_NAME``; ``FIREWHEEL_VM_UUID`` empty (vmr-host is told no
        VM uuid: the release sets the same when its config has none); ``FIREWHEEL_PYTHON``, the
        Python running vmr-host, whose directory is put first on ``PATH`` (``VIRTUAL_ENV`` set
        when it is a venv's and ``base`` has none); ``FIREWHEEL_VM_CONFIG_JSON``, compact JSON of
        what vmr-host knows of the VM: ``{"vm_name", "vm_uuid": "", "schedule"}``.
    """
    env = dict(os.environ if base is None else base)
    py = python_bin()
    if py["venv"] and not env.get("VIRTUAL_ENV"):
        env["VIRTUAL_ENV"] = py["venv"]
    env["PATH"] = py["bin"] + os.pathsep + env.get("PATH", "")
    env["FIREWHEEL_PYTHON"] = py["python"]
    env["FIREWHEEL_VM_NAME"] = vm
    env["FIREWHEEL_VM_UUID"] = ""
    config = {"vm_name": vm, "vm_uuid": "", "schedule": schedule_path}
    env["FIREWHEEL_VM_CONFIG_JSON"] = json.dumps(config, separators=(",", ":"))
    return env
