"""Entries appended to a running schedule (``vmr-host schedule add``): pure.

A batch is a schedule file of its own (YAML, JSON or a pickle, loaded by the same restricted
loader and validation). Appended to a schedule of N entries, its entry ``k`` becomes entry
``N + k``: indices never change once given, so the journal, the logs and the report keep
naming the same entry. The schedule's digest stays the one of the file first delivered (it
names the journal and tells the host which schedule the agent runs).

Where positive entries of a batch land (:func:`clamped_start`): at their pause-shifted time,
like every entry, except that pauses and breaks that already took effect apply to them
whatever their own start_time (FIREWHEEL's updater adds the pause amount so far to every item
it queues, ``schedule_updater.py`` L258-330). An entry listed before such a pause is moved just
after it; it then fires at once (its time has passed) and reports its lateness.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.errors import BatchError, InvalidArgument
from vmr_handler.core.schedule.model import EntryKind, Schedule, ScheduleEntry

#: Largest batch (bytes of the file) one ``schedule add`` carries: it travels in one message.
MAX_BATCH_BYTES = 512 * 1024


def reindexed(
    entries: Iterable[ScheduleEntry], first_index: int, moved: Mapping[int, float]
) -> Tuple[ScheduleEntry, ...]:
    """A batch's entries numbered from ``first_index``, with the start times in ``moved``
    (``{new index: start_time}``, :func:`clamped_start`) applied."""
    out = []
    for k, entry in enumerate(entries):
        index = first_index + k
        changes: Dict[str, object] = {"index": index}
        if index in moved:
            changes["start_time"] = moved[index]
        out.append(dataclasses.replace(entry, **changes))  # type: ignore[arg-type]
    return tuple(out)


def extended(schedule: Schedule, entries: Sequence[ScheduleEntry]) -> Schedule:
    """``schedule`` with ``entries`` (already :func:`reindexed`) after its own; same digest.

    Raises:
        InvalidArgument: the entries are not numbered from ``len(schedule.entries)`` on.
    """
    first = len(schedule.entries)
    if any(e.index != first + k for k, e in enumerate(entries)):
        raise InvalidArgument(f"appended entries must be numbered from {first} on")
    return dataclasses.replace(schedule, entries=schedule.entries + tuple(entries))


def clamped_start(entry: ScheduleEntry, passed: float) -> float:
    """The start_time an appended entry is planned at, given ``passed``: the latest start_time
    of a positive-time pause or break that already took effect (``-inf``: none).

    Pauses and breaks apply from the moment they are appended: one at a negative time (or
    ``-inf``) is moved to 0, after every stage. A positive entry, pause or break at or before
    ``passed`` is moved just after it (the next float up), so that every pause that took effect
    delays it, as in the reference. Negative, host and RESUME entries keep their time.
    """
    kind = entry.kind
    start = entry.start_time
    if kind in (EntryKind.PAUSE, EntryKind.BREAK):
        start = max(start, 0.0)
    elif kind is not EntryKind.POSITIVE:
        return start
    if start > passed:
        return start
    return math.nextafter(passed, math.inf)


#: A stage of appended entries: ``(number, start_time, entry indices)``.
NewStage = Tuple[int, float, Tuple[int, ...]]


def new_stages(entries: Sequence[ScheduleEntry], first_number: int) -> Tuple[NewStage, ...]:
    """The stages a batch's negative entries make: ``(number, start_time, indices)`` per distinct
    start_time, ascending, numbered from ``first_number`` (after every stage so far). A batch's
    negative entries never join a stage of the schedule: they run as stages of their own."""
    staged = (EntryKind.NEGATIVE, EntryKind.HOST)  # on_host entries run inside their stage
    negative = [e for e in entries if e.kind in staged and e.start_time < 0]
    times = sorted({e.start_time for e in negative})
    return tuple(
        (first_number + k, t, tuple(e.index for e in negative if e.start_time == t))
        for k, t in enumerate(times)
    )


def read_batch(path: str, allowed_classes: Optional[Iterable[str]] = None) -> Tuple[bytes, Schedule]:
    """Read and load a batch file (``vmr-host schedule add``): its bytes and the batch.

    Raises:
        BatchError: it cannot be read, is over :data:`MAX_BATCH_BYTES`, or is not a valid
            schedule (the loader's message names the entry and the field).
    """
    from vmr_handler.core.errors import ScheduleError
    from vmr_handler.core.schedule.loader import load_schedule_bytes

    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BATCH_BYTES + 1)
    except OSError as exc:
        raise BatchError(f"cannot read {path}: {exc.strerror}") from exc
    if len(raw) > MAX_BATCH_BYTES:
        raise BatchError(
            f"{path} is over {MAX_BATCH_BYTES // 1024} KiB: a batch travels in one message; split it"
        )
    try:
        return raw, load_schedule_bytes(raw, allowed_classes)
    except ScheduleError as exc:
        raise BatchError(f"{path}: {exc}; nothing appended") from exc


def batch_entries(
    raw: bytes, first_index: Any, moved: Any, allowed_classes: Optional[Iterable[str]] = None
) -> Tuple[ScheduleEntry, ...]:
    """A kept batch's entries as the agent numbered them: ``raw`` loaded by the restricted
    loader, numbered from ``first_index``, with ``moved`` (``{index or its text: start_time}``,
    as the agent's journal and answer keep it) applied. The one place a kept batch is read back
    (the agent's restart, ``schedule show``, the host's on_host entries).

    Raises:
        ScheduleError: the batch no longer loads.
        ValueError, TypeError: ``first_index`` or ``moved`` is not what the agent writes.
    """
    from vmr_handler.core.schedule.loader import load_schedule_bytes

    batch = load_schedule_bytes(raw, allowed_classes)
    shifted = {int(k): float(v) for k, v in dict(moved or {}).items()}
    return reindexed(batch.entries, int(first_index), shifted)
