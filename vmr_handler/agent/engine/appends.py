"""Batches of entries appended to the running schedule (``vmr-host schedule add``).

The host sends a batch (a schedule file of its own) in a signed ``schedule_append`` event whose
id names the batch. The agent keeps the batch's bytes in ``<state>/appends/`` and a record of it
in the journal before it answers, so a batch is appended once (a repeated id gets the first
answer) and a restarted agent rebuilds the same schedule (:func:`restore`): finished entries
keep their index and are never run again.

The record (``Journal.appends``)::

    {"id": batch id, "file": "appends/<first>-<sha12>.<fmt>", "sha256", "format",
     "first_index", "count", "at": agent UTC appended, "moved": {index: start_time},
     "stages": [[number, start_time, [index, ...]], ...]}

What the engine does with the entries is in :meth:`vmr_handler.agent.engine.engine.Engine.append`;
the pure rules (numbering, where positive entries land, new stages) in
:mod:`vmr_handler.core.schedule.appended`.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from typing import Any, Dict, Iterable, List, Optional, Protocol, Tuple

from vmr_handler.agent.connected.resources import Resources
from vmr_handler.agent.engine.arming import PositiveTimers
from vmr_handler.agent.engine.config import EngineConfig
from vmr_handler.agent.engine.entries import EntryLauncher
from vmr_handler.agent.engine.holds import InitialHolds
from vmr_handler.agent.engine.status import append_answer, skip_host_entries
from vmr_handler.agent.state.journal import Journal
from vmr_handler.core.clock import Clock
from vmr_handler.core.errors import AppendRefused, JournalError, ScheduleError
from vmr_handler.core.events import Event, EventType
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.schedule.appended import (
    MAX_BATCH_BYTES,
    batch_entries,
    clamped_start,
    extended,
    new_stages,
    reindexed,
)
from vmr_handler.core.schedule.commands import working_dirs
from vmr_handler.core.schedule.loader import load_schedule_bytes
from vmr_handler.core.schedule.model import EntryKind, Schedule, ScheduleEntry
from vmr_handler.core.wire.protocol import result_data


class Engine(Protocol):
    """What appending needs of :class:`vmr_handler.agent.engine.engine.Engine` (which imports this
    module: a protocol, not an import back)."""

    schedule: Schedule
    journal: Journal
    config: EngineConfig
    clock: Clock
    entries: EntryLauncher
    timers: PositiveTimers
    holds: InitialHolds
    workdirs: Dict[int, str]
    stages: Tuple[float, ...]

    @property
    def stopping(self) -> bool: ...

    def emit(self, type_: EventType, **data: Any) -> Event: ...

    def resume(
        self, at: Optional[float] = None, resume_id: Optional[str] = None, entry: Optional[int] = None
    ) -> Dict[str, Any]: ...

    def append(self, batch_id: str, batch: Schedule, raw: bytes) -> Dict[str, Any]: ...

    def appended(self) -> None: ...

APPENDS_DIR = "appends"


def restore(
    schedule: Schedule, journal: Journal, state_dir: str, allowed_classes: Optional[Iterable[str]] = None
) -> Schedule:
    """``schedule`` with every batch ``journal`` recorded, in order (an agent restart or reboot).

    Raises:
        JournalError: a batch's file is missing, changed or no longer loads (nothing is
            dropped silently: the agent says which and stops).
    """
    for record in journal.appends:
        path = os.path.join(state_dir, str(record["file"]))
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise JournalError(f"appended batch {record['id']}: cannot read {path}: {exc}") from exc
        if hashlib.sha256(raw).hexdigest() != record["sha256"]:
            raise JournalError(f"appended batch {record['id']}: {path} changed since it was appended")
        try:
            entries = batch_entries(raw, record["first_index"], record.get("moved"), allowed_classes)
        except ScheduleError as exc:
            raise JournalError(f"appended batch {record['id']}: {path} no longer loads: {exc}") from exc
        schedule = extended(schedule, entries)
    return schedule


def passed_hold_time(schedule: Schedule, journal: Journal) -> float:
    """The latest start_time of a positive-time pause or break that took effect (``-inf``: none)."""
    latest = -math.inf
    for entry in schedule.entries:
        if entry.pause and entry.start_time >= 0 and journal.hold_passed("hold", entry.index):
            latest = max(latest, entry.start_time)
    return latest


def next_stage_number(base_stages: int, journal: Journal) -> int:
    """The number the next appended stage gets: after the schedule's stages and every appended one."""
    return base_stages + sum(len(r.get("stages", [])) for r in journal.appends)


def prepare_batch(
    schedule: Schedule, batch: Schedule, journal: Journal, base_stages: int
) -> Tuple[Tuple[ScheduleEntry, ...], Dict[str, Any]]:
    """Number ``batch``'s entries after ``schedule``'s and place them (moved start times, new
    stages). Pure apart from reading the journal. Returns the entries and the record's
    ``first_index``, ``count``, ``moved`` and ``stages``."""
    first = len(schedule.entries)
    passed = passed_hold_time(schedule, journal)
    numbered = reindexed(batch.entries, first, {})
    moved = {}
    for entry in numbered:
        start = clamped_start(entry, passed)
        if start != entry.start_time:
            moved[entry.index] = start
    entries = reindexed(batch.entries, first, moved)
    stages = new_stages(entries, next_stage_number(base_stages, journal))
    return entries, {
        "first_index": first,
        "count": len(entries),
        "moved": {str(i): t for i, t in moved.items()},
        "stages": [[n, t, list(ix)] for n, t, ix in stages],
    }


def keep_batch(state_dir: str, raw: bytes, fmt: str, first_index: int) -> Tuple[str, str]:
    """Write a batch's bytes durably under ``<state>/appends/``; ``(relative file, sha256)``.

    Raises:
        JournalError: the file cannot be written (the batch is not appended).
    """
    digest = hashlib.sha256(raw).hexdigest()
    relative = os.path.join(APPENDS_DIR, f"{first_index}-{digest[:12]}.{fmt}")
    try:
        os.makedirs(os.path.join(state_dir, APPENDS_DIR), mode=0o700, exist_ok=True)
        atomic_write(os.path.join(state_dir, relative), raw)
    except OSError as exc:
        raise JournalError(f"cannot keep the appended batch: {exc}") from exc
    return relative, digest


def pending_stages(journal: Journal) -> List[Tuple[int, float, List[int]]]:
    """Appended stages not finished yet, in order: ``(number, start_time, indices)``."""
    done = set(journal.stages_done)
    return [
        (int(n), float(t), [int(i) for i in ix])
        for record in journal.appends
        for n, t, ix in record.get("stages", [])
        if int(n) not in done
    ]


def resume_entries(entries: Iterable[ScheduleEntry]) -> List[ScheduleEntry]:
    """The stored RESUME entries of a batch (``firewheel vm resume`` appends one)."""
    return [e for e in entries if e.kind is EntryKind.RESUME]


def append_batch(engine: Engine, batch_id: str, batch: Schedule, raw: bytes) -> Dict[str, Any]:
    """Append a batch of entries to ``engine``'s running schedule (``vmr-host schedule add``).

    The batch is kept and journaled before this returns, once per ``batch_id`` (a repeated id
    returns the first answer with ``"repeated": True``). Its entries are numbered after the
    schedule's; negative ones run as stages of their own, in order, once the current stage
    ended; positive ones fire at start + their pause-shifted time (at once when that has
    passed, lateness reported); pauses and breaks apply from now on
    (:mod:`vmr_handler.core.schedule.appended`); its stored RESUMEs are applied.

    Args:
        engine: the running engine.
        batch_id: the host's id of the batch (the ``schedule_append`` event id).
        batch: the batch, loaded and validated as a schedule of its own.
        raw: its bytes (kept in ``<state>/appends/``).

    Returns:
        ``{"first_index", "count", "stages": [[number, start_time, [index...]]...], "moved"}``.

    Raises:
        AppendRefused: the VM failed or the agent is stopping.
        JournalError: the batch cannot be kept (nothing was appended).
    """
    journal = engine.journal
    for record in journal.appends:
        if record["id"] == batch_id:
            return {**append_answer(record), "repeated": True}
    if engine.entries.failure is not None:
        raise AppendRefused(f"the VM failed ({engine.entries.failure}); nothing appended")
    if engine.stopping:
        raise AppendRefused("the agent is stopping; nothing appended")
    entries, placed = prepare_batch(engine.schedule, batch, journal, len(engine.stages))
    file, digest = keep_batch(engine.config.state_dir, raw, batch.source_format, placed["first_index"])
    record = {"id": batch_id, "file": file, "sha256": digest, "format": batch.source_format,
              "at": engine.clock.time(), **placed}  # fmt: skip
    journal.add_append(record)
    try:
        journal.save()
    except JournalError:
        journal.appends.remove(record)
        raise
    engine.schedule = extended(engine.schedule, entries)  # every part of the engine plays it
    engine.timers.schedule = engine.holds.schedule = engine.schedule
    engine.workdirs.update(working_dirs(list(engine.schedule.entries), engine.config.launch_dir))
    engine.emit(EventType.SCHEDULE_APPENDED, batch=batch_id, **append_answer(record))
    if engine.config.host_ask is None:
        skip_host_entries(engine.emit, entries)
    for entry in resume_entries(entries):
        engine.resume(resume_id=f"schedule-entry-{entry.index}", entry=entry.index)
    engine.appended()
    return append_answer(record)


async def appended_answer(
    event: Event, engine: Engine, resources: Resources, allowed_classes: Optional[Iterable[str]]
) -> Dict[str, Any]:
    """Apply one ``schedule_append`` event: decode and check the batch (sha256, size, the
    restricted loader and validation), fetch the VM-resource files it drops, append it to
    ``engine``. Returns the ``result`` data to answer with (never raises for bad input: a
    refusal is an error result that says why, and nothing is appended)."""
    data = event.data
    try:
        raw = base64.b64decode(str(data.get("data_b64", "")), validate=True)
    except ValueError:
        return result_data(event.id, False, "schedule_append data_b64 is not base64")
    if len(raw) > MAX_BATCH_BYTES:
        return result_data(event.id, False, f"batch of {len(raw)} bytes is over {MAX_BATCH_BYTES}")
    if hashlib.sha256(raw).hexdigest() != data.get("sha256"):
        return result_data(event.id, False, "batch sha256 does not match its data")
    try:
        batch = load_schedule_bytes(raw, allowed_classes)
    except ScheduleError as exc:
        return result_data(event.id, False, f"batch refused: {exc}")
    announced = data.get("resources")
    if isinstance(announced, dict):
        resources.announced.update({str(k): v for k, v in announced.items() if isinstance(v, dict)})
        await resources.fetch_all(batch)
    try:
        outcome = engine.append(event.id, batch, raw)
    except (AppendRefused, JournalError) as exc:
        return result_data(event.id, False, str(exc))
    first, count = outcome["first_index"], outcome["count"]
    where = f"entries {first}-{first + count - 1}" if count > 1 else f"entry {first}"
    details = f"already appended as {where}" if outcome.get("repeated") else f"appended as {where}"
    return result_data(event.id, True, details, **outcome)
