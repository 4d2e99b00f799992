"""Validators of one entry's ``data`` items (SPEC section 3), and the helpers every field
check shares: :func:`parse_number`, :func:`show`, :class:`_Problems`.

Split from :mod:`.validate` (which re-exports the public names); each validator reports at
most one problem naming the entry and its ``data[N]`` field.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from vmr_handler.core.schedule.limits import (
    MAX_CONTENT_BYTES as MAX_CONTENT_BYTES,
)  # the limit applied (also by .screen)
from vmr_handler.core.schedule.limits import Budget, LimitReached
from vmr_handler.core.schedule.model import (
    ContentDrop,
    DataItem,
    FileDrop,
    PauseSpec,
    ResumeMark,
    TransferOut,
)

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


#: Fields of YAML/JSON entries only: a FIREWHEEL pickle's object has none (an attribute of such
#: a name is ignored with a warning, as any other extra attribute).
YAML_FIELDS = frozenset({"timeout"})


def parse_timeout(
    record: Mapping[str, Any], yaml: bool, runs_program: bool, report: Callable[[str, str], None]
) -> Optional[float]:
    """An entry's ``timeout``, seconds, or None: absent or null, a pickle's (``yaml`` False: an
    attribute of that name is not the field), or a problem reported (field, message) with
    ``report``: not a number > 0 and finite, or on an entry that runs no program in the VM
    (``runs_program`` False: data-only, pause, on_host)."""
    raw = record.get("timeout") if yaml else None
    if raw is None:
        return None
    seconds = parse_number(raw)
    if seconds is None or not 0 < seconds < math.inf:
        report("timeout", f"must be seconds > 0 (or null), got {show(raw)}")
    elif not runs_program:
        report("timeout", "bounds how long a program runs: only on an entry with an executable run in the VM")
    else:
        return seconds
    return None


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
    """The problems found so far (``entry N: field 'F': message`` lines), and the :class:`Budget`
    of what the entries checked so far expand to."""

    def __init__(self, budget: Optional[Budget] = None) -> None:
        self.items: List[str] = []
        self.budget = budget or Budget()
        #: id of a content text -> its UTF-8 bytes: a text shared by many drops is encoded once
        #: (the texts live as long as the records under validation)
        self.encoded: Dict[int, bytes] = {}

    def add(self, where: str, field: Any, message: str) -> None:
        name = field if isinstance(field, str) else show(field)
        self.items.append(f"{where}: field {name!r}: {message}")

    def charge(self, where: str, field: str, size: int = 0, items: int = 0) -> None:
        """Charge ``size`` bytes and ``items`` list elements of ``where``'s ``field`` to the
        budget, before they are allocated or visited.

        Raises:
            LimitReached: over a limit; the text names the entry and field.
        """
        problem = self.budget.over_items(items) if items else None
        problem = problem or (self.budget.over_bytes(size) if size else None)
        if problem:
            raise LimitReached(f"{where}: field {field!r}: {problem}")


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
    """A content drop's ``content``: text (stored as UTF-8) or bytes, at most
    :data:`MAX_CONTENT_BYTES`, charged to the budget before it is encoded or copied."""
    if not isinstance(content, (str, bytes, bytearray)):
        problems.add(where, f"{field}.content", f"must be text or bytes, got {type(content).__name__}")
        return None
    size = len(content)
    if _content_too_big(size, where, field, problems):
        return None
    problems.charge(where, f"{field}.content", size)
    if not isinstance(content, str):
        return bytes(content)
    encoded = problems.encoded.get(id(content))
    if encoded is None:
        encoded = problems.encoded[id(content)] = content.encode("utf-8")  # up to 4x: checked again
    if _content_too_big(len(encoded), where, field, problems):
        return None
    problems.charge(where, f"{field}.content", len(encoded) - size)
    return encoded


def _content_too_big(size: int, where: str, field: str, problems: _Problems) -> bool:
    """Report and return True when a content of ``size`` bytes is over :data:`MAX_CONTENT_BYTES`."""
    if size <= MAX_CONTENT_BYTES:
        return False
    problems.add(where, f"{field}.content", f"{size:,} bytes, over the limit of {MAX_CONTENT_BYTES:,}")
    return True


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
    if destination is not None:
        why = destination_problem(destination)
        if why is not None:
            problems.add(where, f"{field}.destination", f"{why}, got {show(destination)}")
            return None
    return TransferOut(location, interval, destination)


def destination_problem(destination: Any) -> Optional[str]:
    """Why a transfer's ``destination`` (a directory on the host: files land in
    ``<destination>/<vm>/<location>``, FIREWHEEL ``schedule_entry.py`` ``add_file_transfer``)
    cannot be used, or None: it must be an absolute path without ``..`` or NUL, at most 4096
    bytes."""
    if not isinstance(destination, str):
        return "must be a string (an absolute directory on the host) or null"
    if not destination.startswith("/"):
        return "must be an absolute directory on the host (it is where <destination>/<vm>/ is made)"
    if "\x00" in destination or len(destination.encode("utf-8", "replace")) > 4096:
        return "must be a path without NUL, at most 4096 bytes"
    if ".." in destination.split("/"):
        return "must not have a '..' component"
    return None


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
