"""Turn raw entry records (dicts) into validated :class:`ScheduleEntry` objects.

Rules come from SPEC sections 3-4 and issue 3 section 2. Every problem names the entry
(index and, if present, executable) and the field; all problems are collected and raised
together as one :class:`~vmr_handler.core.errors.ScheduleValidationError`.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

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


# ---------------------------------------------------------------------------- data items
# One validator per data shape: ``(raw item, where, field, problems) -> item or None``.
# Each reports at most one problem, naming ``field`` (``data[N]``) or one of its keys.


def _duration(value: Any) -> Optional[float]:
    """A pause duration (seconds, ``inf`` for a break), or None when not a number >= 0."""
    duration = parse_number(value)
    if duration is None or math.isnan(duration) or duration < 0:
        return None
    return duration


def _pause_item(raw: Mapping[str, Any], where: str, field: str, problems: _Problems) -> Optional[DataItem]:
    """``{pause_duration: D}``: D a number >= 0 or inf."""
    duration = _duration(raw["pause_duration"])
    if duration is None:
        problems.add(
            where,
            f"{field}.pause_duration",
            f"must be a number >= 0 or inf, got {show(raw['pause_duration'])}",
        )
        return None
    return PauseSpec(duration)


def _resume_item(raw: Mapping[str, Any], where: str, field: str, problems: _Problems) -> Optional[DataItem]:
    """``{resume: true}``, as ``firewheel vm resume`` writes it."""
    if raw["resume"] is not True:
        problems.add(where, f"{field}.resume", f"must be true (a RESUME), got {show(raw['resume'])}")
        return None
    return ResumeMark()


def _location(raw: Mapping[str, Any], where: str, field: str, problems: _Problems) -> Optional[str]:
    """The ``location`` of a drop or transfer: a non-empty path string without NUL."""
    location = raw["location"]
    if not isinstance(location, str) or not location or "\x00" in location:
        problems.add(where, f"{field}.location", f"must be a non-empty path string, got {show(location)}")
        return None
    return location


def _drop_executable(raw: Mapping[str, Any], where: str, field: str, problems: _Problems) -> Optional[bool]:
    """The ``executable`` flag of a content/filename drop (null or absent is false)."""
    executable = raw.get("executable", False)
    if executable is None:
        return False
    if not isinstance(executable, bool):
        problems.add(where, f"{field}.executable", f"must be true/false, got {show(executable)}")
        return None
    return executable


def _content_bytes(content: Any, where: str, field: str, problems: _Problems) -> Optional[bytes]:
    """A content drop's ``content``: text (stored as UTF-8) or bytes."""
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, (bytes, bytearray)):
        return bytes(content)
    problems.add(where, f"{field}.content", f"must be text or bytes, got {type(content).__name__}")
    return None


def _filename(filename: Any, where: str, field: str, problems: _Problems) -> Optional[str]:
    """A file drop's ``filename``: a non-empty string without NUL."""
    if not isinstance(filename, str) or not filename or "\x00" in filename:
        problems.add(where, f"{field}.filename", f"must be a non-empty string, got {show(filename)}")
        return None
    return filename


def _drop_item(raw: Mapping[str, Any], where: str, field: str, problems: _Problems) -> Optional[DataItem]:
    """``{location, content, executable}`` or ``{location, filename, executable}``."""
    location = _location(raw, where, field, problems)
    if location is None:
        return None
    executable = _drop_executable(raw, where, field, problems)
    if executable is None:
        return None
    if "content" in raw:  # the shape check let exactly one of content/filename through
        content = _content_bytes(raw["content"], where, field, problems)
        return None if content is None else ContentDrop(location, content, executable)
    filename = _filename(raw["filename"], where, field, problems)
    return None if filename is None else FileDrop(location, filename, executable)


def _transfer_item(raw: Mapping[str, Any], where: str, field: str, problems: _Problems) -> Optional[DataItem]:
    """``{location, interval, destination}``: ``interval`` null or 0 is once (the reference loops
    only on a truthy interval), else a number > 0."""
    location = _location(raw, where, field, problems)
    if location is None:
        return None
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


_ItemCheck = Callable[[Mapping[str, Any], str, str, _Problems], Optional[DataItem]]

#: Data shape (its discriminating key, see :data:`_SHAPES`) -> its validator.
_SHAPE_CHECKS: Dict[str, _ItemCheck] = {
    "content": _drop_item,
    "filename": _drop_item,
    "interval": _transfer_item,
    "pause_duration": _pause_item,
    "resume": _resume_item,
}


def _shape_of(raw: Mapping[str, Any], where: str, field: str, problems: _Problems) -> Optional[str]:
    """The one data shape ``raw`` has, with exactly its required and allowed keys, else None."""
    keys = set(raw)
    discriminators: List[str] = [k for k in ("content", "filename", "pause_duration", "resume") if k in keys]
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
    return shape


def _data_item(raw: Any, where: str, pos: int, problems: _Problems) -> Optional[DataItem]:
    """Item ``pos`` of an entry's ``data`` list, or None (one problem reported)."""
    field = f"data[{pos}]"
    if not isinstance(raw, Mapping):
        problems.add(where, field, f"must be a mapping, got {type(raw).__name__}")
        return None
    shape = _shape_of(raw, where, field, problems)
    if shape is None:
        return None
    return _SHAPE_CHECKS[shape](raw, where, field, problems)


# ---------------------------------------------------------------------------- entries
@dataclasses.dataclass
class _Draft:
    """One raw entry under validation: the fields checked so far, and where problems go.

    The field checks (:data:`_FIELD_CHECKS`) fill it in order; later checks read what the
    earlier ones found (``is_pause``, ``data``, ``executable``).
    """

    index: int
    record: Mapping[str, Any]
    where: str
    strict_fields: bool
    problems: _Problems
    data: List[DataItem] = dataclasses.field(default_factory=list)
    is_pause: bool = False
    executable: Optional[str] = None
    arguments: str = ""
    start: Optional[float] = None

    def add(self, name: str, message: str) -> None:
        """Report a problem with the entry's field ``name``."""
        self.problems.add(self.where, name, message)

    def entry(self, start: float) -> ScheduleEntry:
        """The validated entry (call only when no check found a problem)."""
        return ScheduleEntry(
            index=self.index,
            start_time=start,
            executable=self.executable,
            arguments=self.arguments,
            ignore_failure=bool(self.record.get("ignore_failure") or False),
            data=tuple(self.data),
            pause=self.is_pause,
            on_host=bool(self.record.get("on_host") or False),
        )


def _unknown_fields(draft: _Draft, warnings: List[str]) -> None:
    """Unknown fields: an error in YAML/JSON, a warning (ignored attributes) in pickles."""
    shorthand = SHORTHAND_FIELDS if draft.strict_fields else frozenset()
    unknown = set(draft.record) - ENTRY_FIELDS - shorthand
    if not unknown:
        return
    if draft.strict_fields:
        draft.add(_names(unknown)[0], f"unknown field(s) {_names(unknown)}; known: {sorted(ENTRY_FIELDS)}")
    else:
        warnings.append(f"{draft.where}: ignored extra attribute(s) {_names(unknown)}")


def _pause_flag(draft: _Draft) -> bool:
    """``pause``: true/false or null (false)."""
    pause_raw = draft.record.get("pause", False)
    if pause_raw is None:
        return False
    if not isinstance(pause_raw, bool):
        draft.add("pause", f"must be true/false, got {show(pause_raw)}")
        return False
    return pause_raw


def _data_list(draft: _Draft) -> int:
    """``data``: a list of items (null is empty). Returns how many are written as pause items."""
    data_raw = draft.record.get("data", [])
    if data_raw is None:
        return 0
    if not isinstance(data_raw, (list, tuple)):
        draft.add("data", f"must be a list of mappings, got {type(data_raw).__name__}")
        return 0
    for pos, raw in enumerate(data_raw):
        item = _data_item(raw, draft.where, pos, draft.problems)
        if item is not None:
            draft.data.append(item)
    # count pause_duration items as written (an invalid one is already reported)
    return sum(1 for raw in data_raw if isinstance(raw, Mapping) and "pause_duration" in raw)


def _shorthand_pause(draft: _Draft) -> int:
    """YAML/JSON top-level ``pause_duration``. Returns 1 if written, else 0."""
    if not (draft.strict_fields and "pause_duration" in draft.record):
        return 0
    duration = _duration(draft.record["pause_duration"])
    if duration is None:
        draft.add(
            "pause_duration", f"must be a number >= 0 or inf, got {show(draft.record['pause_duration'])}"
        )
    else:
        draft.data.append(PauseSpec(duration))
    return 1


def _pause_and_data(draft: _Draft) -> None:
    """``pause``, ``data`` and the shorthand; a pause entry has exactly one pause_duration."""
    pause_flag = _pause_flag(draft)
    pause_items = _data_list(draft)
    pause_items += _shorthand_pause(draft)
    draft.is_pause = pause_flag or pause_items > 0
    if draft.is_pause and pause_items != 1:
        draft.add("data", f"a pause entry needs exactly one pause_duration, found {pause_items}")


def _executable(draft: _Draft) -> None:
    """``executable``: a non-empty string without NUL, or null; never on a pause entry."""
    executable = draft.record.get("executable")
    if executable is not None and (not isinstance(executable, str) or not executable or "\x00" in executable):
        draft.add("executable", f"must be a non-empty string or null, got {show(executable)}")
        executable = None
    draft.executable = executable
    if draft.is_pause and executable:
        draft.add("executable", "a pause/break entry cannot run a program")


def _arguments(draft: _Draft) -> None:
    """``arguments``: a string, a list of strings (joined with spaces, as the reference does) or null."""
    arguments_raw = draft.record.get("arguments", "")
    arguments = ""
    if arguments_raw is None:
        arguments = ""
    elif isinstance(arguments_raw, str):
        arguments = arguments_raw
    elif isinstance(arguments_raw, (list, tuple)) and all(isinstance(a, str) for a in arguments_raw):
        arguments = " ".join(arguments_raw)  # the reference joins lists with spaces
    else:
        draft.add("arguments", f"must be a string or a list of strings, got {show(arguments_raw)}")
    if "\x00" in arguments:
        draft.add("arguments", "must not contain NUL bytes")
    draft.arguments = arguments


def _flags(draft: _Draft) -> None:
    """``ignore_failure`` and ``on_host``: true/false or null."""
    for flag in ("ignore_failure", "on_host"):
        value = draft.record.get(flag, False)
        if value is not None and not isinstance(value, bool):
            draft.add(flag, f"must be true/false, got {show(value)}")


def _check_resume(draft: _Draft, start: float) -> None:
    """A stored RESUME entry is exactly what ``firewheel vm resume`` appends: ``ScheduleEntry(-inf)``
    with data ``[{"resume": True}]`` and nothing else (reference ``lib/experiment_utils.py``)."""
    if start != -math.inf:
        draft.add(
            "start_time",
            f"a RESUME entry ({{resume: true}}) must be at -inf, as `firewheel vm resume` writes it, got "
            f"{show(start)}; to end a hold at a set time use a pause with a finite duration",
        )
    if len(draft.data) != 1:
        draft.add("data", f"a RESUME entry carries only {{resume: true}}, found {len(draft.data)} items")
    if draft.executable or draft.is_pause:
        draft.add(
            "executable" if draft.executable else "pause", "a RESUME entry cannot run a program or pause"
        )


def _pause_start(draft: _Draft, start: float) -> None:
    """A pause/break is at -inf, 0 (also the reference's ``0 + sys.float_info.min``) or > 0."""
    if 0 < start <= _FLOAT_TRICK_LIMIT:
        draft.start = start = 0.0  # the reference's pause "at 0" (0 + sys.float_info.min)
    if start == math.inf or (start < 0 and start != -math.inf):
        draft.add("start_time", f"a pause/break may only be at -inf, 0 or > 0, got {show(start)}")


def _normal_start(draft: _Draft, start: float) -> None:
    """A program/data entry is at a finite time other than 0 (the experiment barrier)."""
    if not math.isfinite(start):
        draft.add("start_time", f"must be a finite number, got {show(start)}")
    elif start == 0:
        draft.add("start_time", "0 is the experiment barrier; normal entries need < 0 or > 0")


def _start_time(draft: _Draft) -> None:
    """``start_time``: required, a number, not NaN; then the rules of the entry's kind."""
    if "start_time" not in draft.record:
        draft.add("start_time", "is missing")
        return
    start_raw = draft.record["start_time"]
    start = parse_number(start_raw)
    if start is None:
        draft.add("start_time", f"must be a number, got {show(start_raw)}")
        return
    draft.start = start
    if math.isnan(start):
        draft.add("start_time", "must not be NaN")
    elif any(isinstance(item, ResumeMark) for item in draft.data):
        _check_resume(draft, start)
    elif draft.is_pause:
        _pause_start(draft, start)
    else:
        _normal_start(draft, start)


#: The field checks, in the order their problems are reported (tests compare that order).
_FIELD_CHECKS: Tuple[Callable[[_Draft], None], ...] = (
    _pause_and_data,
    _executable,
    _arguments,
    _flags,
    _start_time,
)


def validate_record(
    index: int, record: Mapping[str, Any], *, strict_fields: bool, problems: _Problems, warnings: List[str]
) -> Optional[ScheduleEntry]:
    """Validate one raw entry; append problems/warnings; return the entry or None if invalid.

    ``strict_fields``: unknown fields are problems (YAML/JSON) rather than warnings (pickles).
    """
    draft = _Draft(index, record, _where(index, record), strict_fields, problems)
    _unknown_fields(draft, warnings)
    count_before = len(problems.items)
    for check in _FIELD_CHECKS:
        check(draft)
    if len(problems.items) != count_before or draft.start is None:
        return None
    return draft.entry(draft.start)


#: The fields of a plain program entry, the one shape :func:`_plain_entry` takes.
_PLAIN_FIELDS = frozenset(
    {"start_time", "executable", "arguments", "ignore_failure", "on_host", "data", "pause"}
)
#: Integers a float holds exactly: a larger ``start_time`` goes through :func:`parse_number`.
_EXACT = 2**53


def _plain_entry(index: int, record: Any) -> Optional[ScheduleEntry]:
    """``record`` (entry ``index``) as its entry when it is a *valid plain program entry*, else
    None: :func:`_plain_entries` of one record."""
    entries, _doubtful = _plain_entries([record], index)
    return entries[0]


def _plain_entries(records: Sequence[Any], first: int = 0) -> Tuple[List[Optional[ScheduleEntry]], List[int]]:
    """Each record as its entry when it is a *valid plain program entry*, else None; and the
    indices (from ``first``) of the None ones, ascending: they take the full checks.

    Plain: a dict with only ``start_time`` (an int or float, finite, not 0), ``executable``
    (a non-empty string without NUL, or null), ``arguments`` (a string without NUL, or null),
    ``ignore_failure``/``on_host`` (true/false/null), ``pause`` (false or null, as the
    reference's pickles carry it) and ``data`` (absent, null or empty).
    These are the rules the field checks apply to such a record (:data:`_FIELD_CHECKS`), so
    the entry is the one :func:`validate_record` returns; everything else (pauses, data items,
    any doubt) takes the full checks, which name what is wrong. No display label is built and
    no problem list is touched, in one loop without a call per record: validation at parse
    speed (issue 15).
    """
    entries: List[Optional[ScheduleEntry]] = []
    doubtful: List[int] = []
    add, plain_keys, new = entries.append, _PLAIN_FIELDS.issuperset, _new
    for index, record in enumerate(records, first):
        if type(record) is dict and plain_keys(record):
            get: Callable[[str], Any] = record.get
            start, exe, args = get("start_time"), get("executable"), get("arguments")
            ignore, on_host, data, pause = get("ignore_failure"), get("on_host"), get("data"), get("pause")
            kind = type(start)
            if (
                # x - x is 0.0 only for a finite x: NaN and inf are not plain
                ((kind is float and start - start == 0.0) or (kind is int and -_EXACT < start < _EXACT))
                and start != 0
                and (exe is None or (type(exe) is str and exe and "\x00" not in exe))
                and (args is None or (type(args) is str and "\x00" not in args))
                and (ignore is None or type(ignore) is bool)
                and (on_host is None or type(on_host) is bool)
                and (data is None or (type(data) is list and not data))
                and (pause is None or pause is False)
            ):
                # the frozen dataclass's own __init__ costs as much as parsing the record; the
                # fields are what that __init__ would set (tests compare both paths' entries),
                # item by item into the instance dict (it shares its keys with the other
                # instances: half the time of building an 8-key dict)
                entry: ScheduleEntry = new(ScheduleEntry)
                fields = entry.__dict__
                fields["index"] = index
                fields["start_time"] = float(start)
                fields["executable"] = exe
                fields["arguments"] = args or ""
                fields["ignore_failure"] = ignore is True
                fields["data"] = ()
                fields["pause"] = False
                fields["on_host"] = on_host is True
                add(entry)
                continue
        add(None)
        doubtful.append(index)
    return entries, doubtful


_new = object.__new__


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
    fast, doubtful = _plain_entries(records)
    for index in doubtful:  # ascending: problems and warnings come in schedule order
        fast[index] = validate_record(
            index, records[index], strict_fields=strict_fields, problems=problems, warnings=warnings
        )
    if problems.items:
        raise ScheduleValidationError(problems.items)
    entries = tuple(e for e in fast if e is not None) if doubtful else tuple(fast)
    return cast(Tuple[ScheduleEntry, ...], entries), tuple(warnings)
