"""The ``--schedules`` directory: one ``<vm>.<suffix>`` schedule file per VM (docs/host.md).

Used by ``vmr-host serve`` and ``vmr-host mqtt-config``; each file is read once, validated by
the same restricted loader as the agent's, and kept as bytes with its sha256.
"""

from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

from vmr_handler.core.errors import ScheduleError, UsageError
from vmr_handler.core.names import VM_NAME
from vmr_handler.host.serve.config import VmSpec

#: File name endings read as schedules (a pickle as FIREWHEEL stores it, YAML or JSON).
SCHEDULE_SUFFIXES = (".pkl", ".pickle", ".yaml", ".yml", ".json")


def load_specs(schedules: str, allow: Sequence[str]) -> Dict[str, VmSpec]:
    """Read and validate every ``<vm>.<suffix>`` schedule in ``schedules``.

    Every file is read, so that one run names every problem rather than stopping at the first
    bad file.

    Raises:
        UsageError: no such directory or no schedule; or one line per file that cannot be used
            (an invalid VM name, two files for one VM, the loader's message naming the file,
            entry and field).
    """
    specs, problems = check_specs(schedules, allow)
    if problems:
        head = f"{len(problems)} schedule file(s) in {schedules} cannot be used:"
        raise UsageError("\n  ".join([head, *problems]))
    return specs


def check_specs(schedules: str, allow: Sequence[str]) -> Tuple[Dict[str, VmSpec], List[str]]:
    """The usable schedules of ``schedules`` and one line per file that is not (``vmr-host check``).

    Raises:
        UsageError: no such directory, or no schedule file at all.
    """
    try:
        names = sorted(os.listdir(schedules))
    except OSError as exc:
        raise UsageError(f"cannot read --schedules {schedules}: {exc.strerror}") from exc
    from vmr_handler.core.schedule.loader import format_label, read_schedule  # serve only: a quick CLI
    from vmr_handler.core.schedule.model import entry_destinations, entry_drops

    specs: Dict[str, VmSpec] = {}
    problems: List[str] = []
    seen = 0
    for filename in names:
        stem, suffix = os.path.splitext(filename)
        path = os.path.join(schedules, filename)
        if suffix.lower() not in SCHEDULE_SUFFIXES or not os.path.isfile(path):
            continue
        seen += 1
        if not VM_NAME.match(stem):
            rule = "letters, digits, '.', '_', '-'; at most 64"
            problems.append(f"{path}: {stem!r} is not a usable VM name ({rule})")
            continue
        if stem in specs:
            first = specs[stem].schedule_path
            problems.append(f"{path}: a second schedule for VM {stem!r} (the first: {first})")
            continue
        try:
            data, schedule = read_schedule(path, allow)
        except OSError as exc:
            problems.append(f"{path}: cannot read it: {exc.strerror}")
            continue
        except ScheduleError as exc:
            problems.append(f"{path} ({format_label(path) or 'unreadable'}): {exc}")
            continue
        drops = entry_drops(schedule.entries)
        fmt, digest = schedule.source_format, schedule.digest
        where = entry_destinations(schedule.entries)
        by_name = tuple(sorted(drops.items()))
        specs[stem] = VmSpec(stem, path, data, digest, fmt, frozenset(drops), by_name, where)
    if not seen:
        raise UsageError(f"no schedules (<vm>{'|'.join(SCHEDULE_SUFFIXES)}) in {schedules}")
    return specs, problems
