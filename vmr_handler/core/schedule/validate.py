"""Turn raw entry records (dicts) into validated :class:`ScheduleEntry` objects.

Rules come from SPEC sections 3-4 and issue 3 section 2. Every problem names the entry
(index and, if present, executable) and the field; all problems are collected and raised
together as one :class:`~vmr_handler.core.errors.ScheduleValidationError`.
"""

from __future__ import annotations

import math
import reprlib
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.errors import ScheduleValidationError
from vmr_handler.core.schedule.model import (
    ContentDrop,
    DataItem,
    FileDrop,
    PauseSpec,
    ResumeMark,
    ScheduleEntry,
    TransferOut,
)

ENTRY_FIELDS = frozenset(
    {"start_time", "executable", "arguments", "ignore_failure", "data", "pause", "on_host"}
)
#: YAML/JSON shorthand: a top-level ``pause_duration`` makes a pause entry.
SHORTHAND_FIELDS = frozenset({"pause_duration"})

# The four data shapes (SPEC section 3): discriminating key -> allowed keys.
_SHAPES: Dict[str, Tuple[frozenset[str], frozenset[str]]] = {
    # discriminator: (required keys, optional keys)
    "content": (frozenset({"location", "content"}), frozenset({"executable"})),
    "filename": (frozenset({"location", "filename"}), frozenset({"executable"})),
    "interval": (frozenset({"location"}), frozenset({"interval", "destination"})),
    "pause_duration": (frozenset({"pause_duration"}), frozenset()),
    # appended to a stored schedule by ``firewheel vm resume`` (reference lib/experiment_utils.py)
    "resume": (frozenset({"resume"}), frozenset()),
}

# The reference adds sys.float_info.min (once or twice) to a pause's start_time; anything
# this small is the reference's "0".
_FLOAT_TRICK_LIMIT = 4 * sys.float_info.min


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_number(value: Any) -> Optional[float]:
    """A float from an int/float or a numeric string (``"1e3"``, ``"inf"``, ``"-.inf"``), else None.

    Integers too large for a float give None (reported as invalid, never an OverflowError).
    """
    if _is_number(value):
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, str) and len(value) < 64:
        text = value.strip().lower()
        if text in (".inf", "+.inf"):
            return math.inf
        if text == "-.inf":
            return -math.inf
        try:
            return float(text)
        except ValueError:
            return None
    return None


_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 80
_REPR.maxother = 80


def show(value: Any) -> str:
    """A short, safe ``repr`` of untrusted data for error messages (never raises)."""
    try:
        return _REPR.repr(value)
    except (ValueError, RecursionError, TypeError):
        return f"<{type(value).__name__}>"


def _names(keys: Any) -> List[str]:
    """Sorted printable names of mapping keys of any type."""
    return sorted(k if isinstance(k, str) else show(k) for k in keys)


class _Problems:
    def __init__(self) -> None:
        self.items: List[str] = []

    def add(self, where: str, field: Any, message: str) -> None:
        name = field if isinstance(field, str) else show(field)
        self.items.append(f"{where}: field {name!r}: {message}")


def _where(index: int, record: Mapping[str, Any]) -> str:
    exe = record.get("executable")
    return f"entry {index} ({show(exe)})" if isinstance(exe, str) and exe else f"entry {index}"


def _transfer_item(
    raw: Mapping[str, Any], location: str, where: str, field: str, problems: _Problems
) -> Optional[TransferOut]:
    """``{location, interval, destination}``: ``interval`` null or 0 is once (the reference loops
    only on a truthy interval), else a number > 0."""
    interval_raw = raw.get("interval")
    interval = None if interval_raw is None else parse_number(interval_raw)
    if interval_raw is not None and (interval is None or not math.isfinite(interval) or interval < 0):
        problems.add(
            where, f"{field}.interval", f"must be a number > 0, or 0 or null (once), got {show(interval_raw)}"
        )
        return None
    if interval == 0:
        interval = None  # the reference loops only on a truthy interval: 0 is once
    destination = raw.get("destination")
    if destination is not None and not isinstance(destination, str):
        problems.add(where, f"{field}.destination", f"must be a string or null, got {show(destination)}")
        return None
    return TransferOut(location, interval, destination)


def _data_item(raw: Any, where: str, pos: int, problems: _Problems) -> Optional[DataItem]:
    field = f"data[{pos}]"
    if not isinstance(raw, Mapping):
        problems.add(where, field, f"must be a mapping, got {type(raw).__name__}")
        return None
    keys = set(raw)
    discriminators = [k for k in ("content", "filename", "pause_duration", "resume") if k in keys]
    if not discriminators and keys & {"interval", "destination"}:
        discriminators = ["interval"]
    if len(discriminators) != 1:
        problems.add(
            where,
            field,
            f"keys {_names(keys)} match none or several of the data shapes "
            "{location, content, executable}, {location, filename, executable}, "
            "{location, interval, destination}, {pause_duration}, {resume: true}",
        )
        return None
    shape = discriminators[0]
    required, optional = _SHAPES[shape]
    missing = required - keys
    extra = keys - required - optional - {shape}
    if missing or extra:
        detail = []
        if missing:
            detail.append(f"missing {_names(missing)}")
        if extra:
            detail.append(f"unknown {_names(extra)}")
        problems.add(where, field, f"{shape} item: {', '.join(detail)}")
        return None
    if shape == "pause_duration":
        duration = parse_number(raw["pause_duration"])
        if duration is None or math.isnan(duration) or duration < 0:
            problems.add(
                where,
                f"{field}.pause_duration",
                f"must be a number >= 0 or inf, got {show(raw['pause_duration'])}",
            )
            return None
        return PauseSpec(duration)
    if shape == "resume":
        if raw["resume"] is not True:
            problems.add(where, f"{field}.resume", f"must be true (a RESUME), got {show(raw['resume'])}")
            return None
        return ResumeMark()
    location = raw["location"]
    if not isinstance(location, str) or not location or "\x00" in location:
        problems.add(where, f"{field}.location", f"must be a non-empty path string, got {show(location)}")
        return None
    executable = raw.get("executable", False)
    if executable is None:
        executable = False
    if shape in ("content", "filename") and not isinstance(executable, bool):
        problems.add(where, f"{field}.executable", f"must be true/false, got {show(executable)}")
        return None
    if shape == "content":
        content = raw["content"]
        if isinstance(content, str):
            return ContentDrop(location, content.encode("utf-8"), executable)
        if isinstance(content, (bytes, bytearray)):
            return ContentDrop(location, bytes(content), executable)
        problems.add(where, f"{field}.content", f"must be text or bytes, got {type(content).__name__}")
        return None
    if shape == "filename":
        filename = raw["filename"]
        if not isinstance(filename, str) or not filename or "\x00" in filename:
            problems.add(where, f"{field}.filename", f"must be a non-empty string, got {show(filename)}")
            return None
        return FileDrop(location, filename, executable)
    return _transfer_item(raw, location, where, field, problems)


def _check_resume(
    where: str, start: float, data: List[DataItem], executable: Any, is_pause: bool, problems: _Problems
) -> None:
    """A stored RESUME entry is exactly what ``firewheel vm resume`` appends: ``ScheduleEntry(-inf)``
    with data ``[{"resume": True}]`` and nothing else (reference ``lib/experiment_utils.py``)."""
    if start != -math.inf:
        problems.add(
            where,
            "start_time",
            f"a RESUME entry ({{resume: true}}) must be at -inf, as `firewheel vm resume` writes it, got "
            f"{show(start)}; to end a hold at a set time use a pause with a finite duration",
        )
    if len(data) != 1:
        problems.add(where, "data", f"a RESUME entry carries only {{resume: true}}, found {len(data)} items")
    if executable or is_pause:
        problems.add(
            where, "executable" if executable else "pause", "a RESUME entry cannot run a program or pause"
        )


def validate_record(
    index: int, record: Mapping[str, Any], *, strict_fields: bool, problems: _Problems, warnings: List[str]
) -> Optional[ScheduleEntry]:
    """Validate one raw entry; append problems/warnings; return the entry or None if invalid."""
    where = _where(index, record)
    unknown = set(record) - ENTRY_FIELDS - (SHORTHAND_FIELDS if strict_fields else frozenset())
    if unknown:
        if strict_fields:
            problems.add(
                where,
                _names(unknown)[0],
                f"unknown field(s) {_names(unknown)}; known: {sorted(ENTRY_FIELDS)}",
            )
        else:
            warnings.append(f"{where}: ignored extra attribute(s) {_names(unknown)}")
    count_before = len(problems.items)

    # pause / data
    pause_raw = record.get("pause", False)
    if pause_raw is None:
        pause_raw = False
    if not isinstance(pause_raw, bool):
        problems.add(where, "pause", f"must be true/false, got {show(pause_raw)}")
        pause_raw = False
    data_raw = record.get("data", [])
    if data_raw is None:
        data_raw = []
    data: List[DataItem] = []
    if not isinstance(data_raw, (list, tuple)):
        problems.add(where, "data", f"must be a list of mappings, got {type(data_raw).__name__}")
    else:
        for pos, raw in enumerate(data_raw):
            item = _data_item(raw, where, pos, problems)
            if item is not None:
                data.append(item)
    if strict_fields and "pause_duration" in record:
        duration = parse_number(record["pause_duration"])
        if duration is None or math.isnan(duration) or duration < 0:
            problems.add(
                where, "pause_duration", f"must be a number >= 0 or inf, got {show(record['pause_duration'])}"
            )
        else:
            data.append(PauseSpec(duration))
    # count pause_duration items as written (an invalid one is already reported above)
    pause_items = (
        sum(1 for raw in data_raw if isinstance(raw, Mapping) and "pause_duration" in raw)
        if isinstance(data_raw, (list, tuple))
        else 0
    )
    pause_items += 1 if strict_fields and "pause_duration" in record else 0
    is_pause = pause_raw or pause_items > 0
    if is_pause and pause_items != 1:
        problems.add(where, "data", f"a pause entry needs exactly one pause_duration, found {pause_items}")

    is_resume = any(isinstance(item, ResumeMark) for item in data)

    # executable / arguments
    executable = record.get("executable")
    if executable is not None and (not isinstance(executable, str) or not executable or "\x00" in executable):
        problems.add(where, "executable", f"must be a non-empty string or null, got {show(executable)}")
        executable = None
    if is_pause and executable:
        problems.add(where, "executable", "a pause/break entry cannot run a program")
    arguments_raw = record.get("arguments", "")
    arguments = ""
    if arguments_raw is None:
        arguments = ""
    elif isinstance(arguments_raw, str):
        arguments = arguments_raw
    elif isinstance(arguments_raw, (list, tuple)) and all(isinstance(a, str) for a in arguments_raw):
        arguments = " ".join(arguments_raw)  # the reference joins lists with spaces
    else:
        problems.add(where, "arguments", f"must be a string or a list of strings, got {show(arguments_raw)}")
    if "\x00" in arguments:
        problems.add(where, "arguments", "must not contain NUL bytes")

    for flag in ("ignore_failure", "on_host"):
        value = record.get(flag, False)
        if value is not None and not isinstance(value, bool):
            problems.add(where, flag, f"must be true/false, got {show(value)}")

    # start_time
    start_raw = record.get("start_time")
    start = parse_number(start_raw) if "start_time" in record else None
    if start is None:
        problems.add(
            where,
            "start_time",
            f"must be a number, got {show(start_raw)}" if "start_time" in record else "is missing",
        )
    elif math.isnan(start):
        problems.add(where, "start_time", "must not be NaN")
    elif is_resume:
        _check_resume(where, start, data, executable, is_pause, problems)
    elif is_pause:
        if 0 < start <= _FLOAT_TRICK_LIMIT:
            start = 0.0  # the reference's pause "at 0" (0 + sys.float_info.min)
        if start == math.inf or (start < 0 and start != -math.inf):
            problems.add(
                where, "start_time", f"a pause/break may only be at -inf, 0 or > 0, got {show(start)}"
            )
    else:
        if not math.isfinite(start):
            problems.add(where, "start_time", f"must be a finite number, got {show(start)}")
        elif start == 0:
            problems.add(where, "start_time", "0 is the experiment barrier; normal entries need < 0 or > 0")

    if len(problems.items) != count_before or start is None:
        return None
    return ScheduleEntry(
        index=index,
        start_time=start,
        executable=executable,
        arguments=arguments,
        ignore_failure=bool(record.get("ignore_failure") or False),
        data=tuple(data),
        pause=is_pause,
        on_host=bool(record.get("on_host") or False),
    )


def validate_records(
    records: Sequence[Mapping[str, Any]], *, strict_fields: bool
) -> Tuple[Tuple[ScheduleEntry, ...], Tuple[str, ...]]:
    """Validate all raw entries of a schedule.

    Args:
        records: one mapping per entry, in schedule order.
        strict_fields: True for YAML/JSON (unknown fields are errors), False for pickles
            (extra attributes are ignored with a warning).

    Returns:
        ``(entries, warnings)``.

    Raises:
        ScheduleValidationError: listing every problem found.
    """
    problems = _Problems()
    warnings: List[str] = []
    entries: List[ScheduleEntry] = []
    for index, record in enumerate(records):
        entry = validate_record(
            index, record, strict_fields=strict_fields, problems=problems, warnings=warnings
        )
        if entry is not None:
            entries.append(entry)
    if problems.items:
        raise ScheduleValidationError(problems.items)
    return tuple(entries), tuple(warnings)
