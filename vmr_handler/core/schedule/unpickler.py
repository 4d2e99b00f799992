"""Restricted unpickler for reference schedules (SPEC section 7).

Reference schedules are a pickled ``list`` of
``firewheel.vm_resource_manager.schedule_entry.ScheduleEntry`` objects (or subclasses)
whose instance ``__dict__`` holds the entry fields. Unpickling untrusted bytes normally
runs arbitrary code, so :class:`RestrictedUnpickler` resolves *names* itself:

* an allow-listed schedule-entry class name -> :class:`PickledEntry`, an inert stand-in
  whose only behaviour is to keep the state dict it is given;
* ``copyreg._reconstructor`` / ``copy_reg._reconstructor`` -> a safe replacement that only
  builds a :class:`PickledEntry` (the real one calls ``base.__new__`` / ``base.__init__``);
* ``builtins.object`` / ``__builtin__.object`` -> a marker only that replacement accepts;
* ``_codecs.encode`` and ``builtins.bytes`` -> safe bytes builders (protocol 0-2 bytes).

Everything else is refused in ``find_class``, i.e. before it could ever be called, with
:class:`~vmr_handler.core.errors.UnsafePickleError` naming ``module.name``. The firewheel package
is never imported.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Dict, FrozenSet, Iterable, List, Optional

from vmr_handler.core.errors import ScheduleFormatError, UnsafePickleError
from vmr_handler.core.schedule.pickle_scan import scan_pickle

#: The reference system's schedule entry class (always allowed).
REFERENCE_ENTRY_CLASS = "firewheel.vm_resource_manager.schedule_entry.ScheduleEntry"
#: Allowed by default besides the reference class: the subclass name model components use.
DEFAULT_ALLOWED_CLASSES: FrozenSet[str] = frozenset({REFERENCE_ENTRY_CLASS, "base_objects.ScheduleEntry"})
#: Largest pickle accepted, bytes (a schedule with 100 000 entries is 4-5 MB, the largest, of
#: :data:`~vmr_handler.core.schedule.limits.MAX_ENTRIES`, 40-55 MB): the opcode scan of the
#: largest takes at most ~5 s.
MAX_PICKLE_BYTES = 64 * 1024 * 1024


class PickledEntry:
    """Inert stand-in for any allow-listed schedule-entry class.

    Attributes:
        class_name: ``module.name`` the pickle named.
        state: the instance ``__dict__`` the pickle carried (validated later, never trusted).
    """

    class_name: str = ""

    def __init__(self) -> None:
        self.state: Dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        if type(state) is dict:  # what every reference entry carries: the checks below, in short
            # kept, not copied: entries may share one state dict (a memo reference each),
            # and nothing changes it
            self.state = state
            return
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slotstate)
            merged: Dict[str, Any] = {}
            for part in state:
                if part is not None and not isinstance(part, dict):
                    raise ScheduleFormatError(f"{self.class_name}: instance state is not a dict")
                merged.update(part or {})
            state = merged
        if not isinstance(state, dict):
            raise ScheduleFormatError(
                f"{self.class_name}: instance state is {type(state).__name__}, expected a dict of fields"
            )
        self.state = dict(state)


def _entry_class(name: str) -> type:
    """A fresh :class:`PickledEntry` subclass remembering the pickled class name."""
    return type("PickledEntry", (PickledEntry,), {"class_name": name})


class _SafeGlobal:
    """What ``find_class`` returns for an admitted helper: a fresh, immutable callable per load.

    A pickle's BUILD opcode would otherwise ``setattr`` on the shared function; here it raises.
    """

    __slots__ = ("_fn", "name")

    def __init__(self, name: str, fn: Any) -> None:
        self.name = name
        self._fn = fn

    def __call__(self, *args: Any) -> Any:
        return self._fn(self.name, *args)

    def __setstate__(self, state: Any) -> None:
        raise UnsafePickleError(f"setting state on {self.name}")


def _object_marker(name: str, *args: Any) -> Any:
    """``builtins.object()`` called by a pickle: harmless, but nothing a schedule needs."""
    raise UnsafePickleError(f"{name}() call")


def _safe_reconstructor(name: str, cls: Any, base: Any, state: Any = None) -> PickledEntry:
    """Safe ``copyreg._reconstructor``: builds only allow-listed entries on a plain object base."""
    if not (isinstance(cls, type) and issubclass(cls, PickledEntry)):
        raise UnsafePickleError(f"{name}({getattr(cls, '__name__', type(cls).__name__)}, ...)")
    if not (isinstance(base, _SafeGlobal) and base.name.endswith(".object")) or state is not None:
        base_name = base.name if isinstance(base, _SafeGlobal) else type(base).__name__
        raise UnsafePickleError(f"{name} with base {base_name} (only object is allowed)")
    obj = cls.__new__(cls)
    obj.state = {}
    return obj


def _safe_codecs_encode(name: str, text: Any, encoding: str = "utf-8") -> bytes:
    """Safe ``_codecs.encode``: protocol 0-2 pickles spell bytes as ``encode(str, 'latin1')``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        raise UnsafePickleError(f"{name}({type(text).__name__}, {str(encoding)[:20]!r})")
    return text.encode(encoding)


def _safe_bytes(name: str, *args: Any) -> bytes:
    """Safe ``builtins.bytes``: only ``bytes()`` or ``bytes(list_of_ints)``."""
    if not args:
        return b""
    if len(args) == 1 and isinstance(args[0], (list, tuple)) and all(isinstance(x, int) for x in args[0]):
        return bytes(args[0])
    raise UnsafePickleError(f"{name} with unexpected arguments")


_SAFE_GLOBALS: Dict[str, Any] = {
    "copyreg._reconstructor": _safe_reconstructor,
    "copy_reg._reconstructor": _safe_reconstructor,
    "builtins.object": _object_marker,
    "__builtin__.object": _object_marker,
    "_codecs.encode": _safe_codecs_encode,
    "builtins.bytes": _safe_bytes,
    "__builtin__.bytes": _safe_bytes,
}


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only allow-listed names (see module doc).

    Args:
        data: the pickle bytes.
        allowed_classes: ``module.Name`` strings of schedule-entry classes to admit.

    Raises (from :meth:`load`):
        UnsafePickleError: a global outside the allow-list is named.
        ScheduleFormatError: the bytes are not a valid pickle.
    """

    def __init__(self, data: bytes, allowed_classes: Iterable[str]) -> None:
        # BufferedReader: with a bare BytesIO the C unpickler makes a read call per opcode, 3x
        # the time of the whole load; the buffer it peeks into changes nothing else
        stream = io.BufferedReader(io.BytesIO(data))
        super().__init__(stream, fix_imports=False, encoding="utf-8", errors="strict")
        self._allowed = {name: _entry_class(name) for name in allowed_classes}

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in self._allowed:
            return self._allowed[full]
        if full in _SAFE_GLOBALS:
            return _SafeGlobal(full, _SAFE_GLOBALS[full])  # fresh per use: nothing shared to mutate
        raise UnsafePickleError(full)

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"persistent id {pid!r}")


def looks_like_pickle(data: bytes) -> bool:
    """True when ``data`` is (probably) a pickle: protocol 2+ header or a protocol 0/1 shape.

    Detection is by content, never by file name.
    """
    if not data:
        return False
    if data[0] == 0x80 and len(data) > 1 and data[1] <= pickle.HIGHEST_PROTOCOL:
        return True
    stripped = data.rstrip(b"\r\n")
    return stripped.endswith(b".") and data[:1] in (b"(", b"]", b"c", b"}", b"l", b")")


def unpickle_entries(data: bytes, allowed_classes: Optional[Iterable[str]] = None) -> List[PickledEntry]:
    """Unpickle a reference schedule into :class:`PickledEntry` objects without running code.

    Args:
        data: pickle bytes (protocols 0-5).
        allowed_classes: extra schedule-entry class names (``module.Name``) to admit on top
            of :data:`DEFAULT_ALLOWED_CLASSES`.

    Returns:
        The entries in schedule order.

    Raises:
        UnsafePickleError: the pickle names anything outside the allow-list.
        ScheduleFormatError: not a pickle, too large, an opcode that would allocate beyond the
            file (:func:`~vmr_handler.core.schedule.pickle_scan.scan_pickle`), or not
            a list of schedule entries.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise ScheduleFormatError(f"pickle is {len(data)} bytes, more than the limit of {MAX_PICKLE_BYTES}")
    scan_pickle(data)
    allowed = set(DEFAULT_ALLOWED_CLASSES) | set(allowed_classes or ())
    try:
        obj = RestrictedUnpickler(data, allowed).load()
    except (UnsafePickleError, ScheduleFormatError):
        raise
    except RecursionError as exc:
        raise ScheduleFormatError("pickle is nested too deeply") from exc
    except Exception as exc:  # pickle raises many types on corrupt input
        raise ScheduleFormatError(f"not a readable pickle: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, list):
        raise ScheduleFormatError(f"pickle holds a {type(obj).__name__}, expected a list of schedule entries")
    # the few types of the items, found in C (an isinstance per item: 15 ms per 100 000)
    if not all(issubclass(kind, PickledEntry) for kind in set(map(type, obj))):
        for i, item in enumerate(obj):
            if not issubclass(type(item), PickledEntry):
                raise ScheduleFormatError(
                    f"pickle item {i} is a {type(item).__name__}, expected a schedule entry object"
                )
    return obj
