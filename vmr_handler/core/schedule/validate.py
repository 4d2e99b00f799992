"""Turn raw entry records (dicts) into validated :class:`ScheduleEntry` objects.

Rules come from SPEC sections 3-4. Every problem names the entry
(index and, if present, executable) and the field; all problems are collected and raised
together as one :class:`~vmr_handler.core.errors.ScheduleValidationError`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, cast

import vmr_handler.core.schedule.items as items
from vmr_handler.core.errors import ScheduleError, ScheduleValidationError
from vmr_handler.core.schedule.items import _data_item, _duration, _names, _Problems, parse_number, show
from vmr_handler.core.schedule.limits import (
    MAX_ARGUMENTS_LENGTH,
    MAX_PROBLEMS,
    Budget,
    LimitReached,
    expanded_limit,
    joined_arguments,
)
from vmr_handler.core.schedule.model import DataItem, PauseSpec, ResumeMark, ScheduleEntry, stage_times_of
from vmr_handler.core.schedule.screen import Screen, plain_screen

__all__ = [
    "ENTRY_FIELDS", "SHORTHAND_FIELDS", "ScheduleColumns", "parse_number", "show", "validate_columns",
    "validate_record", "validate_records",
]  # fmt: skip

ENTRY_FIELDS = frozenset(
    {"start_time", "executable", "arguments", "ignore_failure", "data", "pause", "on_host"}
)
#: YAML/JSON shorthand: a top-level ``pause_duration`` makes a pause entry.
SHORTHAND_FIELDS = frozenset({"pause_duration"})
KNOWN = ENTRY_FIELDS | items.YAML_FIELDS  # the fields of a YAML/JSON entry

# The reference adds sys.float_info.min (once or twice) to a pause's start_time; anything
# this small is the reference's "0".
_FLOAT_TRICK_LIMIT = 4 * sys.float_info.min


def _where(index: int, record: Mapping[str, Any]) -> str:
    exe = record.get("executable")
    return f"entry {index} ({show(exe)})" if isinstance(exe, str) and exe else f"entry {index}"


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
    timeout: Optional[float] = None

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
            timeout=self.timeout,
        )


def _unknown_fields(draft: _Draft, warnings: List[str]) -> None:
    """Unknown fields: an error in YAML/JSON, a warning (ignored attributes) in pickles."""
    shorthand = SHORTHAND_FIELDS | items.YAML_FIELDS if draft.strict_fields else frozenset()
    unknown = set(draft.record) - ENTRY_FIELDS - shorthand
    if not unknown:
        return
    if draft.strict_fields:
        draft.add(_names(unknown)[0], f"unknown field(s) {_names(unknown)}; known: {_names(KNOWN)}")
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
    draft.problems.charge(draft.where, "data", items=len(data_raw))
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
    elif executable is not None and len(executable) > MAX_ARGUMENTS_LENGTH:
        draft.add("executable", f"{len(executable):,} characters, over the limit of {MAX_ARGUMENTS_LENGTH:,}")
        executable = None
    draft.problems.charge(draft.where, "executable", len(executable or ""))
    draft.executable = executable
    if draft.is_pause and executable:
        draft.add("executable", "a pause/break entry cannot run a program")


def _arguments(draft: _Draft) -> None:
    """``arguments``: a string, a list of strings (joined with spaces, as the reference does) or
    null; at most :data:`MAX_ARGUMENTS_LENGTH` characters, checked before a list is joined."""
    arguments_raw = draft.record.get("arguments", "")
    arguments = ""
    if isinstance(arguments_raw, str):
        arguments = arguments_raw
    elif isinstance(arguments_raw, (list, tuple)):
        draft.problems.charge(draft.where, "arguments", items=len(arguments_raw))
        try:
            joined = joined_arguments(arguments_raw)  # the reference joins lists with spaces
        except ScheduleError as exc:
            draft.add("arguments", str(exc))
        else:
            if joined is None:
                draft.add("arguments", f"must be a string or a list of strings, got {show(arguments_raw)}")
            else:
                arguments = joined
    elif arguments_raw is not None:
        draft.add("arguments", f"must be a string or a list of strings, got {show(arguments_raw)}")
    if len(arguments) > MAX_ARGUMENTS_LENGTH:
        draft.add("arguments", f"{len(arguments):,} characters, over the limit of {MAX_ARGUMENTS_LENGTH:,}")
        arguments = ""
    if "\x00" in arguments:
        draft.add("arguments", "must not contain NUL bytes")
    draft.problems.charge(draft.where, "arguments", len(arguments))
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


def _timeout(draft: _Draft) -> None:
    """``timeout``, of YAML/JSON entries only (:func:`.items.parse_timeout`)."""
    runs = bool(draft.executable) and not draft.is_pause and not draft.record.get("on_host")
    draft.timeout = items.parse_timeout(draft.record, draft.strict_fields, runs, draft.add)


#: The field checks, in the order their problems are reported (tests compare that order).
_FIELD_CHECKS: Tuple[Callable[[_Draft], None], ...] = (
    _pause_and_data,
    _executable,
    _arguments,
    _flags,
    _start_time,
    _timeout,
)


def validate_record(
    index: int, record: Mapping[str, Any], *, strict_fields: bool, problems: _Problems, warnings: List[str]
) -> Optional[ScheduleEntry]:
    """Validate one raw entry; append problems/warnings; return the entry or None if invalid.

    ``strict_fields``: unknown fields are problems (YAML/JSON) rather than warnings (pickles).

    Raises:
        LimitReached: the record's fields, or what its values expand to, take the schedule over
            a limit of :mod:`.limits` (``problems.budget``).
    """
    draft = _Draft(index, record, _where(index, record), strict_fields, problems)
    if len(record) > len(ENTRY_FIELDS) + 1:  # extra attributes: records may be shared
        problems.charge(draft.where, "fields", items=len(record))
    _unknown_fields(draft, warnings)
    count_before = len(problems.items)
    for check in _FIELD_CHECKS:
        check(draft)
    if len(problems.items) != count_before or draft.start is None:
        return None
    return draft.entry(draft.start)


def _plain_entry(index: int, record: Any) -> Optional[ScheduleEntry]:
    """``record`` (entry ``index``) as its entry when it is a *valid plain program entry*, else
    None: :func:`_plain_entries` of one record."""
    return _plain_entries([record], index)[0][0]


def _plain_entries(
    records: Sequence[Any], first: int = 0
) -> Tuple[List[Optional[ScheduleEntry]], List[int], int]:
    """Each record as its entry when it is a *valid plain program entry*
    (:func:`~vmr_handler.core.schedule.screen.plain_screen`), else None; the indices (from
    ``first``) of the None ones, ascending: they take the full checks; and the characters of the
    plain entries' executables and arguments (the expanded size).
    """
    screen = plain_screen(records, first, longest=MAX_ARGUMENTS_LENGTH)
    return _entries_of(screen, first), screen.doubtful, screen.size


def _entries_of(screen: Screen, first: int = 0) -> List[Optional[ScheduleEntry]]:
    """The entry of every record ``screen`` vouches for (plain program and plain drop entries),
    None for the doubtful ones; entry ``first + k`` at position ``k``."""
    entries: List[Optional[ScheduleEntry]] = list(
        _new_entries(
            range(first, first + len(screen.starts)), screen.starts, screen.executables, screen.arguments
        )
    )
    for name, indices in (("ignore_failure", screen.ignored), ("on_host", screen.hosts)):
        for index in indices:
            entries[index - first].__dict__[name] = True  # type: ignore[union-attr]
    for index, data in screen.drops.items():
        entries[index - first].__dict__["data"] = data  # type: ignore[union-attr]
    for index in screen.doubtful:
        entries[index - first] = None
    return entries


def _new_entries(
    indices: Iterable[int],
    starts: Iterable[float],
    executables: Iterable[Optional[str]],
    arguments: Iterable[str],
) -> List[ScheduleEntry]:
    """A plain program entry per index, from its start time, executable and arguments (no
    data, false flags: the caller sets the others)."""
    entries: List[ScheduleEntry] = []
    add, new = entries.append, _new
    for index, start, exe, args in zip(indices, starts, executables, arguments):
        # the frozen dataclass's own __init__ costs as much as parsing the record; the fields
        # are what that __init__ would set (tests compare both paths' entries), item by item
        # into the instance dict (it shares its keys with the other instances: half the time
        # of building an 8-key dict). The fields left at their defaults (no data, false flags,
        # no timeout) are not stored: they are read from the class, where the dataclass keeps
        # its defaults (equality, hashing, repr, replace and pickling all read attributes)
        entry: ScheduleEntry = new(ScheduleEntry)
        fields = entry.__dict__
        fields["index"] = index
        fields["start_time"] = start
        fields["executable"] = exe
        fields["arguments"] = args
        add(entry)
    return entries


_new = object.__new__


def validate_records(
    records: Sequence[Mapping[str, Any]], *, strict_fields: bool, source_size: Optional[int] = None
) -> Tuple[Tuple[ScheduleEntry, ...], Tuple[str, ...]]:
    """Validate all raw entries of a schedule.

    Args:
        records: one mapping per entry, in schedule order.
        strict_fields: True for YAML/JSON (unknown fields are errors), False for pickles
            (extra attributes are ignored with a warning).
        source_size: bytes of the file the records come from (sets the expanded-size limit,
            :func:`~vmr_handler.core.schedule.limits.expanded_limit`); None: the absolute limit.

    Returns:
        ``(entries, warnings)``.

    Raises:
        ScheduleValidationError: listing every problem found (at most :data:`MAX_PROBLEMS`), or
            the first entry and field over a limit of :mod:`.limits`, checked before the
            allocation it guards.
    """
    screen, checked, warnings = _checked(records, strict_fields, source_size)
    fast = _entries_of(screen)
    for index, entry in checked.items():
        fast[index] = entry
    entries = tuple(e for e in fast if e is not None) if screen.doubtful else tuple(fast)
    return cast(Tuple[ScheduleEntry, ...], entries), warnings


def _checked(
    records: Sequence[Mapping[str, Any]], strict_fields: bool, source_size: Optional[int]
) -> Tuple[Screen, Dict[int, ScheduleEntry], Tuple[str, ...]]:
    """The screen of ``records`` (plain program and drop entries), then the full checks of
    the others (:func:`_full_checks`). When these find a problem and plain drop entries were
    screened, all drops take the full checks again: the plain drops' charges made ahead would
    change the totals a limit's message names, so the error is the one the full checks give.

    Raises:
        ScheduleValidationError: as :func:`validate_records`.
    """
    limit = expanded_limit(source_size)
    screen = plain_screen(records, drop_room=limit, longest=MAX_ARGUMENTS_LENGTH)
    try:
        return (screen, *_full_checks(records, screen, limit, strict_fields))
    except ScheduleValidationError:
        if not screen.drops:
            raise
    screen = plain_screen(records, longest=MAX_ARGUMENTS_LENGTH)
    return (screen, *_full_checks(records, screen, limit, strict_fields))


class ScheduleColumns(NamedTuple):
    """A validated schedule as columns, without an object per plain entry (``plan
    --json`` of 100 000 entries at parse speed). Entry ``i`` is ``others[i]`` when that is
    present, else the plain entry ``starts[i]``, ``executables[i]``, ``arguments[i]`` with the
    data ``drops[i]`` (none when absent), ``on_host`` when ``i`` is in ``hosts``
    (``ignore_failure`` is not kept).

    Attributes:
        starts: every entry's ``start_time`` (seconds, float), in schedule order.
        executables: every entry's executable (None: none), in schedule order.
        arguments: every entry's arguments (``""``: none), in schedule order.
        hosts: indices of the plain entries (program and drop entries) with ``on_host`` true,
            ascending.
        others: every entry that is neither a plain program entry nor a plain drop entry
            (pauses, RESUMEs, transfers, anything the full checks made), by index.
        drops: the data of every plain drop entry (a plain program entry but for a ``data``
            list of content and file drops, :func:`~.screen.plain_screen`), by index: no entry
            object is made for it.
        warnings: as :func:`validate_records` gives them.
        source_format: ``pickle``, ``yaml`` or ``json`` (set by the loader; ``""`` when unknown).
    """

    starts: List[float]
    executables: List[Optional[str]]
    arguments: List[str]
    hosts: List[int]
    others: Dict[int, ScheduleEntry]
    drops: Dict[int, Tuple[DataItem, ...]]
    warnings: Tuple[str, ...]
    source_format: str = ""

    def entries_at(self, indices: Sequence[int]) -> List[ScheduleEntry]:
        """Entries ``indices`` as objects, in that order: ``others``' own, the plain ones made
        here (as validation makes them: no ``__init__`` per entry)."""
        plain = [i for i in indices if i not in self.others]
        starts = map(self.starts.__getitem__, plain)
        exes, args = map(self.executables.__getitem__, plain), map(self.arguments.__getitem__, plain)
        made = dict(zip(plain, _new_entries(plain, starts, exes, args)))
        hosts = set(self.hosts)
        for index, entry in made.items():
            data = self.drops.get(index)
            if data is not None:
                entry.__dict__["data"] = data
            if index in hosts:
                entry.__dict__["on_host"] = True
        return [made[i] if i in made else self.others[i] for i in indices]

    def datas(self) -> Dict[int, Tuple[DataItem, ...]]:
        """The data of every entry that has some, by ascending index."""
        found = {i: entry.data for i, entry in self.others.items() if entry.data}
        found.update(self.drops)
        return dict(sorted(found.items())) if self.drops and len(found) > len(self.drops) else found

    def stage_times(self) -> Tuple[float, ...]:
        """:meth:`Schedule.stage_times <vmr_handler.core.schedule.model.Schedule.stage_times>` of
        these entries."""
        pauses = [i for i, entry in self.others.items() if entry.pause]
        if not pauses:
            return stage_times_of(self.starts)
        starts = list(self.starts)
        for i in pauses:
            starts[i] = math.nan  # (never negative)
        return stage_times_of(starts)


def validate_columns(
    records: Sequence[Mapping[str, Any]], *, strict_fields: bool, source_size: Optional[int] = None
) -> ScheduleColumns:
    """:func:`validate_records` with the schedule as :class:`ScheduleColumns`: the same checks,
    the same errors (raises ScheduleValidationError exactly when it does, with the same
    problems), the same entries, but no object is made for a plain program entry, nor for a
    plain drop entry (only its data items)."""
    screen, checked, warnings = _checked(records, strict_fields, source_size)
    starts, executables, arguments = screen.starts, screen.executables, screen.arguments
    for index, entry in checked.items():
        starts[index], executables[index], arguments[index] = (
            entry.start_time,
            entry.executable,
            entry.arguments,
        )
    return ScheduleColumns(starts, executables, arguments, screen.hosts, checked, screen.drops, warnings)


def _full_checks(
    records: Sequence[Mapping[str, Any]], screen: Screen, limit: int, strict_fields: bool
) -> Tuple[Dict[int, ScheduleEntry], Tuple[str, ...]]:
    """The full field checks of the records ``screen`` found doubtful, after the entries it
    vouches for (their executables, arguments, contents and items charged first, against the
    expanded-size ``limit``; the plain entries are charged one by one only when they alone go
    over it). Returns the entries checked, by index, and the warnings.

    Raises:
        ScheduleValidationError: as :func:`validate_records`.
    """
    problems = _Problems(Budget(screen.size + screen.drop_size, limit))
    problems.budget.items = screen.drop_items
    warnings: List[str] = []
    checked: Dict[int, ScheduleEntry] = {}
    try:
        if screen.size > limit:
            _charge_plain(_entries_of(screen), limit)
        for index in screen.doubtful:  # ascending: problems and warnings come in schedule order
            if len(problems.items) >= MAX_PROBLEMS:
                problems.items.append(f"(validation stopped after {MAX_PROBLEMS} problems)")
                break
            entry = validate_record(
                index, records[index], strict_fields=strict_fields, problems=problems, warnings=warnings
            )
            if entry is not None:
                checked[index] = entry
    except LimitReached as exc:
        raise ScheduleValidationError([*problems.items, str(exc)]) from None
    if problems.items:
        raise ScheduleValidationError(problems.items)
    return checked, tuple(warnings)


def _charge_plain(entries: Sequence[Optional[ScheduleEntry]], limit: int) -> None:
    """Charge the plain entries one by one to a fresh budget: raises LimitReached naming the
    first whose executable and arguments take the schedule over ``limit`` bytes."""
    budget = _Problems(Budget(0, limit))
    for entry in entries:
        if entry is not None:
            field = "arguments" if entry.arguments else "executable"
            budget.charge(entry.label, field, len(entry.executable or "") + len(entry.arguments))
