"""Schedules: model (:mod:`.model`), restricted unpickler (:mod:`.unpickler`), validation
(:mod:`.validate`) and loading from pickle/YAML/JSON (:mod:`.loader`)."""

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
