"""Test helper: schedule entries shaped exactly as FIREWHEEL's own helpers build them.

Written from the reference's behaviour (sandialabs/firewheel_repo_base
``base_objects/model_component_objects.py`` and sandialabs/firewheel ``schedule_entry.py``,
``lib/experiment_utils.py``, ``cli/helpers/push|pull/file``; facts in
``../shared/notes/firewheel-reference.md``), not copied: each function returns the instance
``__dict__`` of the ``ScheduleEntry`` the reference helper makes, and :func:`firewheel_pickle`
pickles a list of them the way the reference's schedule plugin does (one global,
``firewheel.vm_resource_manager.schedule_entry.ScheduleEntry``, default protocol).
"""

from __future__ import annotations

import math
import pickle
from typing import Any, Dict, List, Optional, Sequence, Union

from tests.refpickle import reference_pause, reference_pickle, reference_record

Record = Dict[str, Any]


def _arguments(arguments: Union[str, Sequence[str], None]) -> str:
    """``ScheduleEntry.append_arguments``: a list is joined with spaces."""
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else " ".join(arguments)


def run_executable(
    start_time: float,
    program: str,
    arguments: Union[str, Sequence[str], None] = None,
    vm_resource: bool = False,
) -> Record:
    """``Vertex.run_executable``: ``vm_resource=True`` also drops the program file (executable)."""
    record = reference_record(start_time, executable=program, arguments=_arguments(arguments))
    if vm_resource:
        record["data"] = [{"location": program, "filename": program, "executable": True}]
    return record


def _drop(
    start_time: float, location: str, item: Record, preload: bool, moved: str, move: str = "mv"
) -> Record:
    """``DropContentScheduleEntry`` / ``DropFileScheduleEntry``: with a preload move command the
    data goes to ``moved`` in the working dir and ``mv <moved> <location>`` runs at the time
    (``move`` on a Windows endpoint)."""
    if preload:
        return reference_record(
            start_time, executable=move, arguments=f"{moved} {location}", data=[{"location": moved, **item}]
        )
    return reference_record(start_time, data=[{"location": location, **item}])


def drop_content(
    start_time: float, location: str, content: str, executable: bool = False, preload: bool = True
) -> Record:
    """``Vertex.drop_content``: preloaded by default (content in the working dir, ``mv`` at the time)."""
    item = {"content": content, "executable": executable}
    return _drop(start_time, location, item, preload, "preloaded_content")


def drop_file(
    start_time: float, location: str, filename: str, executable: bool = False, preload: bool = True
) -> Record:
    """``Vertex.drop_file``: preloaded by default (the file in the working dir, ``mv`` at the time)."""
    return _drop(start_time, location, {"filename": filename, "executable": executable}, preload, filename)


def windows_drop_file(start_time: float, location: str, filename: str) -> Record:
    """``Vertex.drop_file`` on an ``AbstractWindowsEndpoint``: the preload runs ``move``."""
    item = {"filename": filename, "executable": False}
    return _drop(start_time, location, item, True, filename, move="move")


def run_powershell(
    start_time: float, script: str, arguments: Optional[str] = None, batch: bool = False
) -> Record:
    """firewheel_repo_windows' ``PowershellScheduleEntry`` as the schedule plugin pickles it (its
    class flipped back to ``ScheduleEntry``): the script dropped, run by ``powershell`` (or by
    ``powershell_wrapper.exe`` for a batch shell)."""
    full = f"{script} {arguments}" if arguments else script
    data: List[Record] = [{"location": script, "filename": script, "executable": False}]
    if batch:
        wrapper = "powershell_wrapper.exe"
        data.append({"location": wrapper, "filename": wrapper, "executable": False})
        return reference_record(start_time, executable=wrapper, arguments=full, data=data)
    args = f"-ExecutionPolicy Bypass -File {full}"
    return reference_record(start_time, executable="powershell", arguments=args, data=data)


def add_vm_resource(
    name: str, start_time: float, dynamic: Optional[str] = None, static: Optional[str] = None
) -> Record:
    """``VmResourceScheduleEntry`` (pre-2.0 VMRs): arguments ``dynamic|None STATIC|None reboot``."""
    data: List[Record] = [{"location": name, "filename": name, "executable": True}]
    args = []
    if dynamic:
        data.append({"location": "dynamic", "content": dynamic, "executable": False})
        args.append("dynamic")
    else:
        args.append("None")
    if static:
        data.append({"location": static, "filename": static, "executable": False})
        args.append(static)
    else:
        args.append("None")
    args.append("reboot")
    return reference_record(start_time, executable=name, arguments=" ".join(args), data=data)


def file_transfer(location: str, interval: Optional[float] = 60, start_time: float = 1) -> Record:
    """``Vertex.file_transfer`` (``file_transfer_once``: ``interval=None``, start -1)."""
    return reference_record(
        start_time, data=[{"location": location, "interval": interval, "destination": None}]
    )


def set_pause(start_time: float, duration: float) -> Record:
    """``Vertex.set_pause`` (``set_break``: ``duration=math.inf``)."""
    return reference_pause(start_time, duration)


def stored_resume() -> Record:
    """What ``firewheel vm resume`` appends: ``ScheduleEntry(-inf)`` with data ``[{resume: True}]``."""
    return reference_record(-math.inf, data=[{"resume": True}])


def push_file(file_name: str, destination: str) -> Record:
    """What ``firewheel push file`` appends: at -100000, ignore_failure, ``mv <file> <destination>``."""
    return reference_record(
        -100000,
        ignore_failure=True,
        executable="mv",
        arguments=f"{file_name} {destination}",
        data=[{"location": file_name, "filename": file_name, "executable": False}],
    )


def pull_file(file_name: str) -> Record:
    """What ``firewheel pull file`` appends: a transfer once at -100000."""
    return reference_record(-100000, data=[{"location": file_name, "interval": None, "destination": None}])


def firewheel_pickle(records: List[Record]) -> bytes:
    """The schedule pickle the reference stores: a list of ScheduleEntry objects, default protocol."""
    return reference_pickle(records, pickle.DEFAULT_PROTOCOL)
