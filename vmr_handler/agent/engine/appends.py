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

This module computes and keeps a batch; the engine appends its entries to the schedule it
plays (:meth:`vmr_handler.agent.engine.engine.Engine.append`);
the pure rules (numbering, where positive entries land, new stages) in
:mod:`vmr_handler.core.schedule.appended`.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from vmr_handler.agent.engine.ports import BatchResources
from vmr_handler.agent.engine.shared import EngineState
from vmr_handler.agent.engine.status import append_answer
from vmr_handler.agent.state.journal import Journal
from vmr_handler.core.errors import AppendRefused, JournalError, ScheduleError
from vmr_handler.core.events import Event
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.schedule.appended import (
    MAX_BATCH_BYTES,
    batch_entries,
    clamped_start,
    extended,
    new_stages,
    reindexed,
)
from vmr_handler.core.schedule.loader import load_schedule_bytes
from vmr_handler.core.schedule.model import EntryKind, Schedule, ScheduleEntry
from vmr_handler.core.wire.protocol import result_data

APPENDS_DIR = "appends"

#: ``append(batch_id, batch, raw)``: append a batch to the running schedule, its answer
#: (:meth:`vmr_handler.agent.engine.engine.Engine.append`).
AppendFn = Callable[[str, Schedule, bytes], Dict[str, Any]]


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


def answered(journal: Journal, batch_id: str) -> Optional[Dict[str, Any]]:
    """The answer of batch ``batch_id`` appended before, with ``"repeated": True``, or None."""
    for record in journal.appends:
        if record["id"] == batch_id:
            return {**append_answer(record), "repeated": True}
    return None


def keep_appended(
    state: EngineState, batch_id: str, batch: Schedule, raw: bytes
) -> Tuple[Tuple[ScheduleEntry, ...], Dict[str, Any]]:
    """Number and place ``batch``'s entries after the schedule's (:func:`prepare_batch`), keep
    its bytes in ``<state>/appends/`` and its record in the journal, saved. The engine then
    appends the entries (:meth:`vmr_handler.agent.engine.engine.Engine.append`). Returns the
    entries and the record.

    Raises:
        JournalError: the batch cannot be kept (nothing was appended).
    """
    journal = state.journal
    entries, placed = prepare_batch(state.schedule, batch, journal, len(state.stages))
    file, digest = keep_batch(state.config.state_dir, raw, batch.source_format, placed["first_index"])
    record = {"id": batch_id, "file": file, "sha256": digest, "format": batch.source_format,
              "at": state.clock.time(), **placed}  # fmt: skip
    journal.add_append(record)
    try:
        journal.save()
    except JournalError:
        journal.appends.remove(record)
        raise
    return entries, record


async def appended_answer(
    event: Event, append: AppendFn, resources: BatchResources, allowed_classes: Optional[Iterable[str]]
) -> Dict[str, Any]:
    """Apply one ``schedule_append`` event: decode and check the batch (sha256, size, the
    restricted loader and validation), fetch the VM-resource files it drops through
    ``resources`` (the connected agent's), ``append`` it
    (:meth:`vmr_handler.agent.engine.engine.Engine.append`). Returns the ``result`` data to
    answer with (never raises for bad input: a refusal is an error result that says why, and
    nothing is appended)."""
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
        files = {str(k): v for k, v in announced.items() if isinstance(v, dict)}
        await resources.fetch_appended(files, batch)
    try:
        outcome = append(event.id, batch, raw)
    except (AppendRefused, JournalError) as exc:
        return result_data(event.id, False, str(exc))
    first, count = outcome["first_index"], outcome["count"]
    where = f"entries {first}-{first + count - 1}" if count > 1 else f"entry {first}"
    details = f"already appended as {where}" if outcome.get("repeated") else f"appended as {where}"
    return result_data(event.id, True, details, **outcome)
