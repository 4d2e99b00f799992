"""Schedules: the frozen model and everything that makes one from a file.

General layout::

    model        frozen entries (Schedule, ScheduleEntry, drops, pauses)
    items        the reference's item forms, read into the model
    limits       the sizes a schedule may reach
    unpickler    the restricted unpickler; pickle_scan: the pickle read without running it
    validate     validation; loader: pickle, YAML or JSON to a validated Schedule
    screen       validation's column screen: plain program and drop entries checked as columns
    guestos      schedules written for a Windows guest, refused at load
    commands     the command line as the reference runs it
    appended     batches appended to a running schedule (``vmr-host schedule add``)
    lint         ``check``'s lint

This package re-exports the model's names and the loaders (the one ``__init__`` that imports).

May import: ``core``; nothing of ``transports``, ``agent`` or ``host``.
"""

from vmr_handler.core.schedule.loader import detect_format, load_schedule, load_schedule_bytes
from vmr_handler.core.schedule.model import (
    ContentDrop,
    DataItem,
    EntryKind,
    FileDrop,
    PauseSpec,
    ResumeMark,
    Schedule,
    ScheduleEntry,
    TransferOut,
)

__all__ = [
    "ContentDrop",
    "DataItem",
    "EntryKind",
    "FileDrop",
    "PauseSpec",
    "ResumeMark",
    "Schedule",
    "ScheduleEntry",
    "TransferOut",
    "detect_format",
    "load_schedule",
    "load_schedule_bytes",
]
