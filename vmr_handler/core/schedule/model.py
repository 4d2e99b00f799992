"""The schedule model: frozen, validated schedule entries (SPEC section 3).

Every loader (pickle, YAML, JSON) produces the same :class:`Schedule`; nothing downstream
knows which format a schedule came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Dict, Iterable, List, Optional, Tuple, Union


@dataclass(frozen=True)
class ContentDrop:
    """Drop literal ``content`` at ``location`` (relative = relative to the entry's working dir)."""

    location: str
    content: bytes
    executable: bool = False


@dataclass(frozen=True)
class FileDrop:
    """Drop the VM-resource file ``filename`` (from the resource store) at ``location``."""

    location: str
    filename: str
    executable: bool = False


@dataclass(frozen=True)
class TransferOut:
    """Transfer ``location`` out of the VM once (``interval`` None) or every ``interval`` seconds."""

    location: str
    interval: Optional[float]
    destination: Optional[str]


@dataclass(frozen=True)
class PauseSpec:
    """Pause for ``duration`` seconds; ``math.inf`` makes it a break (held until RESUME)."""

    duration: float

    @property
    def is_break(self) -> bool:
        """True when the duration is infinite (a break)."""
        return math.isinf(self.duration)


@dataclass(frozen=True)
class ResumeMark:
    """``{"resume": True}``: the entry is a RESUME, as ``firewheel vm resume`` appends it to a stored
    schedule (reference ``lib/experiment_utils.py`` ``create_resume_schedule_entry``, always at ``-inf``).

    The agent applies it when it loads the schedule: it ends one active break, else it is
    ignored and reported, like any RESUME (SPEC section 3)."""


DataItem = Union[ContentDrop, FileDrop, TransferOut, PauseSpec, ResumeMark]


class EntryKind(str, Enum):
    """What an entry is, derived from its fields (the ``kind`` column of ``vmr-handler plan``)."""

    NEGATIVE = "negative"
    POSITIVE = "positive"
    PAUSE = "pause"
    BREAK = "break"
    HOST = "host"
    RESUME = "resume"


@dataclass(frozen=True)
class ScheduleEntry:
    """One validated schedule entry.

    Attributes:
        index: position in the loaded schedule (0-based); the entry's identity everywhere.
        start_time: seconds; ``< 0`` configuration stage, ``> 0`` after experiment start,
            ``-inf``/``0``/``> 0`` only for pause/break entries (reference float tricks removed).
        executable: what the shell runs (a file this entry drops, or text as written: a path,
            a name on PATH, a builtin, a program with its own arguments), or None for
            data-only, pause and RESUME entries (:mod:`vmr_handler.core.schedule.commands`).
        arguments: argument string inserted unquoted into the command line, as the reference does.
        ignore_failure: when False, data that cannot be placed fails the VM (SPEC section 5);
            a program that fails or is not found never does.
        data: content/file drops, transfers out, (for pause entries) one :class:`PauseSpec`,
            (for stored RESUME entries) one :class:`ResumeMark`.
        pause: True for pause/break entries.
        on_host: entry for the host controller; the agent reports it and never runs it.
        timeout: seconds the entry's program may run before its process tree is ended
            (SIGTERM, SIGKILL after a grace; ``ended_by: timeout``), None: no bound. YAML/JSON
            only: FIREWHEEL pickles carry no such field.
    """

    index: int
    start_time: float
    executable: Optional[str] = None
    arguments: str = ""
    ignore_failure: bool = False
    data: Tuple[DataItem, ...] = ()
    pause: bool = False
    on_host: bool = False
    timeout: Optional[float] = None

    @property
    def pause_duration(self) -> Optional[float]:
        """Seconds of the pause (``inf`` for a break), or None when this is not a pause entry."""
        for item in self.data:
            if isinstance(item, PauseSpec):
                return item.duration
        return None

    @property
    def is_resume(self) -> bool:
        """True for a stored RESUME entry (data ``[{"resume": True}]``)."""
        return any(isinstance(item, ResumeMark) for item in self.data)

    @property
    def kind(self) -> EntryKind:
        """The entry's :class:`EntryKind`."""
        if self.data and self.is_resume:  # (most entries carry no data: no generator to build)
            return EntryKind.RESUME
        if self.pause:
            duration = self.pause_duration
            return EntryKind.BREAK if duration is not None and math.isinf(duration) else EntryKind.PAUSE
        if self.on_host:
            return EntryKind.HOST
        return EntryKind.NEGATIVE if self.start_time < 0 else EntryKind.POSITIVE

    @property
    def label(self) -> str:
        """Human name used in every message: ``entry 3 ('/usr/bin/ping')``."""
        if self.executable:
            return f"entry {self.index} ({self.executable!r})"
        return f"entry {self.index}"


@dataclass(frozen=True)
class Schedule:
    """A loaded, validated schedule.

    Attributes:
        entries: entries in schedule order (``entries[i].index == i``).
        digest: sha256 hex of the source bytes; the journal uses it to tell schedules apart.
        source_format: ``pickle``, ``yaml`` or ``json``.
        warnings: non-fatal remarks (e.g. extra attributes ignored in a pickle).
    """

    entries: Tuple[ScheduleEntry, ...]
    digest: str
    source_format: str
    warnings: Tuple[str, ...] = ()

    def stage_times(self) -> Tuple[float, ...]:
        """Distinct negative start times of program, data and on_host entries, ascending (the
        local stages; the host runs a stage's on_host entries inside it)."""
        # e.kind is NEGATIVE or HOST, spelled out (the property call per entry costs 4x)
        return stage_times_of(e.start_time for e in self.entries if not e.pause)


def stage_times_of(starts: Iterable[float]) -> Tuple[float, ...]:
    """The local stages of a schedule: the distinct negative ``starts`` (seconds) of its entries
    that are not pauses, ascending, without ``-inf`` (a stored RESUME is at ``-inf``; nothing
    else is). SPEC section 3: entries with the same negative start time form one stage."""
    times = {t for t in set(starts) if t < 0}
    return tuple(sorted(times - {-math.inf}))


def entry_drops(entries: Iterable[ScheduleEntry]) -> Dict[str, Tuple[int, ...]]:
    """VM-resource file name -> the indices of the ``entries`` whose data drop it
    (``{location, filename}``), in schedule order (``vmr-host serve``/``check`` and an appended
    batch: which VMs and entries need a file the host may lack, SPEC section 8)."""
    out: Dict[str, List[int]] = {}
    for entry in entries:
        for item in entry.data:
            if isinstance(item, FileDrop):
                indices = out.setdefault(item.filename, [])
                if entry.index not in indices:
                    indices.append(entry.index)
    return {name: tuple(indices) for name, indices in out.items()}


def entry_destinations(entries: Iterable[ScheduleEntry]) -> Tuple[Tuple[str, str], ...]:
    """``(location, destination)`` of every transfer-out item of ``entries`` that names a
    destination (the host copies what it receives from ``location`` to
    ``<destination>/<vm>/``), in schedule order, each pair once."""
    out: Dict[Tuple[str, str], None] = {}
    for entry in entries:
        for item in entry.data:
            if isinstance(item, TransferOut) and item.destination is not None:
                out[(item.location, item.destination)] = None
    return tuple(out)
