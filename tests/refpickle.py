"""Test helper: build reference-style schedule pickles without firewheel.

The reference system pickles a ``list`` of ``ScheduleEntry`` objects whose instance
``__dict__`` holds the entry fields. :func:`reference_pickle` builds the same bytes from
plain dicts with a throw-away stand-in class registered under the requested
``module.Class`` name. The stand-in modules live in ``sys.modules`` only while pickling
(:func:`standin_class` restores whatever was there before), so nothing leaks between
tests and the loader under test can never find a real class by that name.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import threading
import types
from typing import Any, Dict, Iterator, List

REFERENCE_CLASS = "firewheel.vm_resource_manager.schedule_entry.ScheduleEntry"

_LOCK = threading.RLock()
_MISSING = object()


@contextlib.contextmanager
def standin_class(class_path: str = REFERENCE_CLASS) -> Iterator[type]:
    """A fresh empty class that :mod:`pickle` names ``class_path``, registered only inside the block.

    Every package level of the module name gets a fresh :class:`types.ModuleType` in
    ``sys.modules`` (pickle imports the module to check the name); on exit the previous
    entries (or their absence) are restored.
    """
    module_name, _, class_name = class_path.rpartition(".")
    if not module_name or not class_name:
        raise ValueError(f"class path must be 'module.Class', got {class_path!r}")
    cls = type(class_name, (), {"__module__": module_name, "__qualname__": class_name})
    parts = module_name.split(".")
    names = [".".join(parts[: i + 1]) for i in range(len(parts))]
    with _LOCK:
        saved = {name: sys.modules.get(name, _MISSING) for name in names}
        try:
            parent = None
            for name in names:
                module = types.ModuleType(name)
                sys.modules[name] = module
                if parent is not None:
                    setattr(parent, name.rpartition(".")[2], module)
                parent = module
            setattr(parent, class_name, cls)
            yield cls
        finally:
            for name, old in saved.items():
                if old is _MISSING:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = old


def reference_pickle(
    records: List[Dict[str, Any]], protocol: int, class_path: str = REFERENCE_CLASS
) -> bytes:
    """Pickle ``records`` as a list of ``class_path`` objects whose ``__dict__`` is each record (as given)."""
    with standin_class(class_path) as cls:
        objects = []
        for record in records:
            obj = cls.__new__(cls)
            obj.__dict__.update(record)
            objects.append(obj)
        return pickle.dumps(objects, protocol=protocol)


def reference_record(start_time: Any, **fields: Any) -> Dict[str, Any]:
    """The ``__dict__`` the reference ``ScheduleEntry(start_time)`` starts with, updated by ``fields``."""
    record: Dict[str, Any] = {
        "start_time": start_time,
        "ignore_failure": False,
        "data": [],
        "pause": None,
        "executable": None,
        "arguments": "",
        "on_host": False,
    }
    record.update(fields)
    return record


def reference_pause(start_time: float, duration: float, **fields: Any) -> Dict[str, Any]:
    """A pause/break record as the reference builds it: ``set_pause`` turns 0 into
    ``sys.float_info.min``, then ``add_pause`` adds ``sys.float_info.min`` again."""
    if start_time == 0:
        start_time = sys.float_info.min
    record = reference_record(start_time, **fields)
    record["start_time"] += sys.float_info.min
    record["data"] = [*record["data"], {"pause_duration": duration}]
    record["pause"] = True
    return record
