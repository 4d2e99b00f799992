"""Load a schedule from bytes or a file: pickle (detected by content), YAML or JSON.

Issue 3 section 2; SPEC sections 3 and 7.
"""

from __future__ import annotations

import json
import os
import re
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from vmr_handler.core.errors import ScheduleFormatError
from vmr_handler.core.gcpause import paused_gc
from vmr_handler.core.schedule.guestos import refuse_windows
from vmr_handler.core.schedule.limits import MAX_ENTRIES
from vmr_handler.core.schedule.model import Schedule
from vmr_handler.core.schedule.validate import ScheduleColumns, validate_columns, validate_records

if TYPE_CHECKING:  # the unpickler (pickle, its scanner) is imported for pickles only
    from vmr_handler.core.schedule.unpickler import PickledEntry

_T = TypeVar("_T")


def _yaml() -> ModuleType:
    """PyYAML, imported on first use: a JSON or pickle schedule never needs it (its
    import is ~12 ms of every ``check``/``plan``)."""
    import yaml

    return yaml


def _fast_yaml_loader() -> Any:
    """The safe YAML loader, libyaml-backed (about 6x faster) when PyYAML was built with it."""
    yaml = _yaml()
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: Largest YAML/JSON schedule accepted, bytes.
MAX_TEXT_BYTES = 256 * 1024 * 1024
#: Largest YAML schedule accepted, bytes: libyaml parses about 4 MB/s (a 100 000-entry schedule
#: is 8 MB, 2 s); a bigger schedule is written as JSON (any input loads in seconds).
MAX_YAML_BYTES = 32 * 1024 * 1024
#: Largest YAML schedule that may be nested deeply enough to need the pure-Python parser
#: (10x slower than libyaml), bytes.
MAX_DEEP_YAML_BYTES = 2 * 1024 * 1024


#: Nesting above this (an over-estimate) is parsed by the pure-Python loader, whose recursion
#: limit turns hostile depth into an error; libyaml's composer would overflow the C stack.
_MAX_C_LOADER_DEPTH = 200


_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_LEADING = re.compile(r"^[ \-]+", re.MULTILINE)


def _yaml_loader_for(text: str) -> Any:
    """The safe YAML loader for ``text``: libyaml's (fast) unless it may be nested deeply."""
    yaml, fast = _yaml(), _fast_yaml_loader()
    if fast is yaml.SafeLoader:
        return fast
    depth = max_depth = 0
    for ch in _NOT_BRACKETS.sub("", text):  # brackets only (quotes not trusted: over-estimate)
        if ch in "[{":
            depth += 1
            max_depth = max(max_depth, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    indent = max(map(len, _LEADING.findall(text)), default=0)
    if max_depth + indent <= _MAX_C_LOADER_DEPTH:
        return fast
    if len(text) > MAX_DEEP_YAML_BYTES:
        raise ScheduleFormatError(
            f"YAML nested more than {_MAX_C_LOADER_DEPTH} levels (brackets or indentation) and larger "
            f"than {MAX_DEEP_YAML_BYTES:,} bytes: write it as JSON, or nest it less"
        )
    return yaml.SafeLoader


def detect_format(data: bytes) -> str:
    """``pickle``, ``json`` or ``yaml``, decided by content (never by file name)."""
    if data[:1] not in (b"[", b"{"):  # no pickle starts so: JSON needs no unpickler
        from vmr_handler.core.schedule.unpickler import looks_like_pickle

        if looks_like_pickle(data):
            return "pickle"
    head = data.lstrip()[:1]
    if head in (b"[", b"{"):
        return "json"
    return "yaml"


#: The format a schedule file's name says it holds (the content decides: :func:`detect_format`).
NAMED_FORMATS = {".pkl": "pickle", ".pickle": "pickle", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}


def format_label(path: str) -> str:
    """The format the content of the file at ``path`` is read as, for a line people read:
    ``yaml``, or ``yaml by its content, not the pickle its name says``; ``""`` when it cannot
    be read."""
    try:
        with open(path, "rb") as fh:
            fmt = detect_format(fh.read())
    except OSError:
        return ""
    named = NAMED_FORMATS.get(os.path.splitext(path)[1].lower())
    if named is None or named == fmt:
        return fmt
    return f"{fmt} by its content, not the {named} its name says"


def _records_from_text(data: bytes, fmt: str) -> Sequence[Mapping[str, Any]]:
    if len(data) > MAX_TEXT_BYTES:
        raise ScheduleFormatError(f"schedule is {len(data)} bytes, more than the limit of {MAX_TEXT_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScheduleFormatError(f"not a pickle, and not UTF-8 text for YAML/JSON: {exc}") from exc
    doc: Any
    if fmt == "json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            # JSON is also YAML; fall back only if YAML accepts it (and is small enough for YAML).
            yaml = _yaml()
            try:
                if len(data) > MAX_YAML_BYTES:
                    raise ScheduleFormatError("too large for YAML")
                doc = yaml.load(text, Loader=_yaml_loader_for(text))
            except (yaml.YAMLError, ValueError, RecursionError, ScheduleFormatError):
                raise ScheduleFormatError(f"invalid JSON: {exc}") from exc
        except (ValueError, RecursionError) as exc:  # too deep, integer too long
            raise ScheduleFormatError(f"invalid JSON: {type(exc).__name__}: {exc}") from exc
    else:
        if len(data) > MAX_YAML_BYTES:
            raise ScheduleFormatError(
                f"YAML schedule is {len(data):,} bytes, more than the limit of {MAX_YAML_BYTES:,} "
                "(write a bigger schedule as JSON)"
            )
        yaml = _yaml()
        try:
            doc = yaml.load(text, Loader=_yaml_loader_for(text))
        except yaml.YAMLError as exc:
            raise ScheduleFormatError(f"invalid YAML: {exc}") from exc
        except (ValueError, RecursionError) as exc:
            raise ScheduleFormatError(f"invalid YAML: {type(exc).__name__}: {exc}") from exc
    if isinstance(doc, Mapping) and set(doc) == {"schedule"}:
        doc = doc["schedule"]
    if doc is None:
        doc = []
    if not isinstance(doc, list):
        raise ScheduleFormatError(
            f"a {fmt.upper()} schedule must be a list of entries, got {type(doc).__name__}"
        )
    if not set(map(type, doc)) <= {dict}:  # (one C loop; the ABC check is slow)
        for i, item in enumerate(doc):
            if type(item) is not dict and not isinstance(item, Mapping):
                got = type(item).__name__
                raise ScheduleFormatError(f"entry {i}: must be a mapping of fields, got {got}")
    return doc


def load_schedule_bytes(data: bytes, allowed_classes: Optional[Iterable[str]] = None) -> Schedule:
    """Parse and validate schedule bytes.

    Args:
        data: pickle (protocols 0-5), YAML or JSON bytes.
        allowed_classes: extra schedule-entry class names admitted by the restricted unpickler.

    Returns:
        The validated :class:`Schedule` (``digest`` = sha256 of ``data``).

    Raises:
        ScheduleFormatError, UnsafePickleError, ScheduleValidationError.
        WindowsScheduleError: entries written for a Windows guest (:mod:`.guestos`).
    """
    with paused_gc():  # a big schedule is many small objects: collection passes double the load time
        return _load(data, allowed_classes)


def _load(data: bytes, allowed_classes: Optional[Iterable[str]]) -> Schedule:
    import hashlib  # here: ``plan --json`` (load_schedule_columns) needs no digest

    fmt, records = _records(data, allowed_classes)
    entries, warnings = validate_records(records, strict_fields=fmt != "pickle", source_size=len(data))
    return Schedule(entries, hashlib.sha256(data).hexdigest(), fmt, warnings)


def _records(
    data: bytes, allowed_classes: Optional[Iterable[str]]
) -> Tuple[str, Sequence[Mapping[str, Any]]]:
    """The format of ``data`` and its raw entry records (not validated yet)."""
    fmt = detect_format(data)
    records: Sequence[Mapping[str, Any]]
    if fmt == "pickle":
        from vmr_handler.core.schedule.unpickler import unpickle_entries

        records = _pickled_records(unpickle_entries(data, allowed_classes))
    else:
        records = _records_from_text(data, fmt)
    if len(records) > MAX_ENTRIES:
        raise ScheduleFormatError(
            f"entry {MAX_ENTRIES:,} and later: the schedule has {len(records):,} entries, more than the "
            f"limit of {MAX_ENTRIES:,}"
        )
    refuse_windows(records)
    return fmt, records


def load_schedule_columns(path: str, allowed_classes: Optional[Iterable[str]] = None) -> ScheduleColumns:
    """The schedule file at ``path`` validated as :class:`ScheduleColumns` (``plan
    --json`` needs no object per entry, nor the digest). Accepts and refuses exactly what
    :func:`load_schedule` does, with the same errors.

    Raises:
        ScheduleFormatError, UnsafePickleError, ScheduleValidationError, WindowsScheduleError: as
            :func:`load_schedule`.
    """

    def columns(data: bytes) -> ScheduleColumns:
        with paused_gc():
            fmt, records = _records(data, allowed_classes)
            valid = validate_columns(records, strict_fields=fmt != "pickle", source_size=len(data))
            return valid._replace(source_format=fmt)

    return _from_file(path, columns)


def _pickled_records(entries: List[PickledEntry]) -> List[Mapping[str, Any]]:
    """The state dict of every unpickled entry; ``{}`` for one the pickle gave no state (its
    fields are then reported missing). The attribute is read plainly first: ``getattr`` with a
    default costs 20 ms per 100 000 entries."""
    try:
        return [e.state for e in entries]
    except AttributeError:
        return [getattr(e, "state", {}) for e in entries]


def read_schedule(path: str, allowed_classes: Optional[Iterable[str]] = None) -> Tuple[bytes, Schedule]:
    """The bytes of the schedule file at ``path`` and the schedule they hold (see
    :func:`load_schedule_bytes`). The errors do not name ``path``: each caller says it its own way.

    Raises:
        OSError: the file cannot be read.
        ScheduleFormatError, UnsafePickleError, ScheduleValidationError, WindowsScheduleError: as
            :func:`load_schedule_bytes`.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    return data, load_schedule_bytes(data, allowed_classes)


def load_schedule(path: str, allowed_classes: Optional[Iterable[str]] = None) -> Schedule:
    """Read and validate the schedule file at ``path`` (see :func:`load_schedule_bytes`).

    Raises:
        ScheduleFormatError: the file cannot be read (message names the path), or as above.
    """
    return _from_file(path, lambda data: load_schedule_bytes(data, allowed_classes))


def _from_file(path: str, load: Callable[[bytes], _T]) -> _T:
    """``load`` of the bytes of the file at ``path``; errors name the path (:func:`load_schedule`)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        return load(data)
    except OSError as exc:
        raise ScheduleFormatError(f"cannot read schedule {path}: {exc.strerror or exc}") from exc
    except ScheduleFormatError as exc:
        raise type(exc)(f"{os.fspath(path)}: {exc}") from exc
