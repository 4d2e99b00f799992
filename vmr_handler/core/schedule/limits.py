"""Allocation limits of the schedule loader.

A schedule may share one object in many places (a YAML alias, a pickle memo reference) and
the loader expands what it shares: it joins an ``arguments`` list, encodes a ``content``
text, and later writes every entry's command line and drops. Each limit below is checked
*before* the allocation it guards, so any file within the size limit loads in bounded time
and memory, or is refused with a :class:`~vmr_handler.core.errors.ScheduleError` naming the
entry and field (``vmr-handler check``/``run`` exit 2). docs/schedule.md lists them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from vmr_handler.core.errors import ScheduleError

#: Entries in one schedule (10x the 100 000-entry schedule the benchmarks load).
MAX_ENTRIES = 1_000_000
#: Characters of one entry's ``arguments`` after a list is joined, and of its ``executable``.
MAX_ARGUMENTS_LENGTH = 1024 * 1024
#: Bytes of one content drop's ``content`` (after UTF-8 encoding of a text).
MAX_CONTENT_BYTES = 64 * 1024 * 1024
#: The whole schedule's ``executable`` + ``arguments`` + ``content`` sizes, each counted for every
#: entry that uses it (a shared value costs again at every use): what running it writes. At most
#: :data:`EXPANSION_FACTOR` times the file's size (but :data:`EXPANDED_FLOOR` whatever its size),
#: and never more than this.
MAX_EXPANDED_BYTES = 256 * 1024 * 1024
#: See :data:`MAX_EXPANDED_BYTES`.
EXPANSION_FACTOR = 16
#: See :data:`MAX_EXPANDED_BYTES`.
EXPANDED_FLOOR = 16 * 1024 * 1024
#: ``arguments`` list strings, ``data`` items and the fields of records with more than 8 (extra
#: pickle attributes) of the whole schedule, each counted for every entry that uses it: the
#: elements validation visits one by one.
MAX_ITEMS = 1_000_000
#: Nesting of tuples in a pickle (hashing a deeper tuple overflows the C stack).
MAX_NESTING = 100
#: Problems reported in one validation error; validation stops at this many.
MAX_PROBLEMS = 1000


def expanded_limit(source_size: Optional[int]) -> int:
    """The expanded-size limit (bytes) of a schedule file of ``source_size`` bytes (None: unknown,
    the absolute limit): see :data:`MAX_EXPANDED_BYTES`."""
    if source_size is None:
        return MAX_EXPANDED_BYTES
    return min(MAX_EXPANDED_BYTES, max(EXPANDED_FLOOR, EXPANSION_FACTOR * source_size))


class Budget:
    """What the entries validated so far expand to, against :func:`expanded_limit` and
    :data:`MAX_ITEMS`. One per :func:`~vmr_handler.core.schedule.validate.validate_records` call.

    Attributes:
        expanded: bytes (characters for text) charged so far.
        items: list elements charged so far.
        limit: the expanded-size limit, bytes.
    """

    def __init__(self, expanded: int = 0, limit: int = MAX_EXPANDED_BYTES) -> None:
        self.expanded = expanded
        self.items = 0
        self.limit = limit

    def over_items(self, count: int) -> Optional[str]:
        """Charge ``count`` elements (before visiting them); the problem text when that is over
        the limit (nothing is charged then), else None."""
        if self.items + count > MAX_ITEMS:
            return (
                f"{count:,} more list elements make the schedule's {self.items + count:,} (arguments "
                f"strings, data items, fields of records with extras, at every use), over the limit of "
                f"{MAX_ITEMS:,}"
            )
        self.items += count
        return None

    def over_bytes(self, size: int) -> Optional[str]:
        """Charge ``size`` bytes (before allocating them); the problem text when that is over the
        limit (nothing is charged then), else None."""
        if self.expanded + size > self.limit:
            return (
                f"{size:,} more bytes make the schedule's executables, arguments and contents "
                f"{self.expanded + size:,} bytes (at every use), over the limit of {self.limit:,} "
                f"({EXPANSION_FACTOR} times the file's size, at least {EXPANDED_FLOOR:,}, "
                f"at most {MAX_EXPANDED_BYTES:,})"
            )
        self.expanded += size
        return None


class LimitReached(ScheduleError):
    """Validation must stop (a limit is reached); carries the problem text, naming the entry
    and field.

    :func:`~vmr_handler.core.schedule.validate.validate_records` turns it into a
    :class:`~vmr_handler.core.errors.ScheduleValidationError` with the problems found so far."""


def joined_arguments(parts: Sequence[Any]) -> Optional[str]:
    """``" ".join(parts)`` (the reference joins an ``arguments`` list with spaces), its length
    checked against :data:`MAX_ARGUMENTS_LENGTH` before it is built; None when an element is not
    a string (the caller reports the field).

    Raises:
        ScheduleError: joined, it would be too long (the text says how long).
    """
    if len(parts) > MAX_ARGUMENTS_LENGTH + 1:  # every element but the first adds a space
        raise ScheduleError(
            f"a list of {len(parts):,} strings, over the limit of {MAX_ARGUMENTS_LENGTH:,} characters"
        )
    if not all(isinstance(a, str) for a in parts):
        return None
    size = sum(map(len, parts)) + max(len(parts) - 1, 0)
    if size > MAX_ARGUMENTS_LENGTH:
        raise ScheduleError(f"joined, {size:,} characters, over the limit of {MAX_ARGUMENTS_LENGTH:,}")
    return " ".join(parts)
