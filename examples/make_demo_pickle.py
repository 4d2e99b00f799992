"""Turn ``examples/demo.yaml`` into ``examples/demo.pkl``, a reference-compatible pickled schedule.

The reference system (FIREWHEEL) hands its VM resource handler a pickled ``list`` of
``firewheel.vm_resource_manager.schedule_entry.ScheduleEntry`` objects whose instance
``__dict__`` holds the entry fields (``start_time``, ``ignore_failure``, ``data``, ``pause``,
``executable``, ``arguments``, ``on_host``). This script writes the same bytes without
firewheel: a minimal stand-in class is registered under that exact module and class name,
so :mod:`pickle` records the reference's global name. Pause entries get the reference's
``add_pause`` treatment: ``start_time += sys.float_info.min`` (a pause "at 0" first becomes
``sys.float_info.min``, as the reference's ``set_pause`` does, because the reference refuses
a start time of 0).

Usage::

    python examples/make_demo_pickle.py [--protocol N] [--input demo.yaml] [--output demo.pkl]

firewheel is never imported; ``vmr-handler check examples/demo.pkl`` loads the result.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import types
from typing import Any, Dict, List

import yaml

MODULE = "firewheel.vm_resource_manager.schedule_entry"
HERE = os.path.dirname(os.path.abspath(__file__))


class ScheduleEntry:
    """Stand-in for the reference class: same instance attributes, same ``add_pause``."""

    def __init__(self, start_time: float, ignore_failure: bool = False) -> None:
        self.start_time = start_time
        self.ignore_failure = ignore_failure
        self.data: List[Dict[str, Any]] = []
        self.pause = None
        self.executable = None
        self.arguments = ""
        self.on_host = False

    def add_pause(self, duration: float) -> None:
        """Make this a pause (``inf`` = break) entry, exactly as the reference does."""
        self.start_time += sys.float_info.min
        self.data.append({"pause_duration": duration})
        self.pause = True


ScheduleEntry.__module__ = MODULE
ScheduleEntry.__qualname__ = "ScheduleEntry"


def register_standin() -> None:
    """Put ``firewheel``, its subpackage and the entry module in ``sys.modules`` (pickle imports them)."""
    parts = MODULE.split(".")
    modules = [types.ModuleType(".".join(parts[: i + 1])) for i in range(len(parts))]
    for parent, child in zip(modules, modules[1:]):
        setattr(parent, child.__name__.rpartition(".")[2], child)
    modules[-1].ScheduleEntry = ScheduleEntry
    sys.modules.update({m.__name__: m for m in modules})


def entry_from_record(record: Dict[str, Any]) -> ScheduleEntry:
    """One reference-style entry from one YAML record (the ``pause_duration`` shorthand included)."""
    data = list(record.get("data") or [])
    durations = [item["pause_duration"] for item in data if "pause_duration" in item]
    if "pause_duration" in record:
        durations.append(record["pause_duration"])
    start = record["start_time"]
    if (durations or record.get("pause")) and start == 0:
        start = sys.float_info.min  # the reference's set_pause(0)
    entry = ScheduleEntry(start, bool(record.get("ignore_failure", False)))
    entry.executable = record.get("executable")
    arguments = record.get("arguments") or ""
    entry.arguments = " ".join(arguments) if isinstance(arguments, list) else arguments
    entry.on_host = bool(record.get("on_host", False))
    entry.data = [dict(item) for item in data if "pause_duration" not in item]
    for duration in durations:
        entry.add_pause(duration)
    return entry


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=os.path.join(HERE, "demo.yaml"), help="YAML schedule to read")
    parser.add_argument("--output", default=os.path.join(HERE, "demo.pkl"), help="pickle to write")
    parser.add_argument(
        "--protocol",
        type=int,
        default=2,
        choices=range(pickle.HIGHEST_PROTOCOL + 1),
        help="pickle protocol (default 2)",
    )
    args = parser.parse_args(argv)
    with open(args.input, encoding="utf-8") as fh:
        records = yaml.safe_load(fh) or []
    register_standin()
    blob = pickle.dumps([entry_from_record(r) for r in records], protocol=args.protocol)
    with open(args.output, "wb") as fh:
        fh.write(blob)
    print(f"wrote {args.output}: {len(records)} entries, protocol {args.protocol}, {len(blob)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
