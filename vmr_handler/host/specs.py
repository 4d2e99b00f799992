"""The ``--schedules`` directory: one ``<vm>.<suffix>`` schedule file per VM (docs/host.md).

Used by ``vmr-host serve`` and ``vmr-host mqtt-config``; each file is read once, validated by
the same restricted loader as the agent's, and kept as bytes with its sha256.
"""

from __future__ import annotations

import os
from typing import Dict, Sequence

from vmr_handler.core.errors import ScheduleError, UsageError
from vmr_handler.core.names import VM_NAME
from vmr_handler.host.config import VmSpec

#: File name endings read as schedules (a pickle as FIREWHEEL stores it, YAML or JSON).
SCHEDULE_SUFFIXES = (".pkl", ".pickle", ".yaml", ".yml", ".json")


def load_specs(schedules: str, allow: Sequence[str]) -> Dict[str, VmSpec]:
    """Read and validate every ``<vm>.<suffix>`` schedule in ``schedules``.

    Raises:
        UsageError: no such directory, no schedule, a duplicate or invalid VM name, or a
            schedule that cannot be used (the loader's message, naming the file).
    """
    try:
        names = sorted(os.listdir(schedules))
    except OSError as exc:
        raise UsageError(f"cannot read --schedules {schedules}: {exc.strerror}") from exc
    from vmr_handler.core.schedule import FileDrop  # serve only: keeps the CLI quick
    from vmr_handler.core.schedule.loader import read_schedule

    specs: Dict[str, VmSpec] = {}
    for filename in names:
        stem, suffix = os.path.splitext(filename)
        if suffix.lower() not in SCHEDULE_SUFFIXES:
            continue
        path = os.path.join(schedules, filename)
        if not os.path.isfile(path):
            continue
        if not VM_NAME.match(stem):
            raise UsageError(
                f"{path}: {stem!r} is not a usable VM name (letters, digits, '.', '_', '-'; at most 64)"
            )
        if stem in specs:
            raise UsageError(f"two schedules for VM {stem!r}: {specs[stem].schedule_path} and {path}")
        try:
            data, schedule = read_schedule(path, allow)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
        except ScheduleError as exc:
            raise UsageError(f"schedule {path} cannot be used: {exc}") from exc
        filenames = frozenset(
            item.filename for e in schedule.entries for item in e.data if isinstance(item, FileDrop)
        )
        specs[stem] = VmSpec(stem, path, data, schedule.digest, schedule.source_format, filenames)
    if not specs:
        raise UsageError(f"no schedules (<vm>{'|'.join(SCHEDULE_SUFFIXES)}) in {schedules}")
    return specs
