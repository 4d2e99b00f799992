"""The column screen of validation: which raw records are *plain* entries, checked as
columns in C loops, so that only the others take the field checks of :mod:`.validate`.

A plain program entry has only a start time, an executable, arguments and false flags; a plain
drop entry is one with a ``data`` list of content and file drops. The rules applied are those of
the full checks (:mod:`.validate`, :mod:`.items`): a record is plain only when the full checks
would accept it and make the same entry; anything else, valid or not, is left to them
(``doubtful``), and they name what is wrong. tests/test_plan_fast.py and
tests/test_validate_fastpath.py compare the two on generated records.
"""

from __future__ import annotations

import math
from itertools import chain, compress, islice, repeat
from operator import eq, is_
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, cast

import vmr_handler.core.schedule.items as checks
from vmr_handler.core.schedule.limits import MAX_ARGUMENTS_LENGTH, MAX_ITEMS
from vmr_handler.core.schedule.model import ContentDrop, DataItem, FileDrop

#: Integers a float holds exactly: a larger ``start_time`` goes through :func:`parse_number`.
_EXACT = 2**53


class Screen(NamedTuple):
    """:func:`plain_screen`'s findings: a record that is not a plain program entry (nor a plain
    drop entry, when asked for) has the placeholders ``nan``, None, ``""`` in the columns, and
    its index in ``doubtful``.

    Attributes:
        size: characters of the executables and arguments of the entries not doubtful.
        drops: index -> the data items of a *plain drop entry* (:func:`plain_screen`); its
            start time, executable and arguments are in the columns.
        drop_size: bytes of the contents the plain drop entries drop (what the full checks
            charge for them, :mod:`.limits`).
        drop_items: their data items (what the full checks charge for them).
    """

    starts: List[float]
    executables: List[Optional[str]]
    arguments: List[str]
    doubtful: List[int]
    ignored: List[int]
    hosts: List[int]
    size: int
    drops: Dict[int, Tuple[DataItem, ...]]
    drop_size: int
    drop_items: int


#: The fields of a plain program entry besides ``start_time``, ``executable`` and ``arguments``:
#: the types their values may have (``data`` and ``pause`` must also be false as truth values:
#: ``[]``, false).
_OPTIONAL_TYPES = {
    "ignore_failure": frozenset({bool, type(None)}),
    "on_host": frozenset({bool, type(None)}),
    "data": frozenset({list, type(None)}),
    "pause": frozenset({bool, type(None)}),
}
_NUMBER_TYPES = frozenset({float, int})
#: Characters of text joined at most to be searched at once (:func:`_screen_text`).
_JOINED_LIMIT = 16 * 1024 * 1024
_TEXT_TYPES = frozenset({str, type(None)})


def plain_screen(
    records: Sequence[Any],
    first: int = 0,
    drop_room: Optional[int] = None,
    *,
    longest: int = MAX_ARGUMENTS_LENGTH,
) -> Screen:
    """Which records are *valid plain program entries*, with their start times (floats),
    executables and arguments as columns, the indices (from ``first``) of the others
    (``doubtful``, ascending: they take the full checks), and of the plain ones whose
    ``ignore_failure`` or ``on_host`` is true.

    Plain: a dict with only ``start_time`` (an int or float, finite, not 0), ``executable``
    (a non-empty string without NUL, or null), ``arguments`` (a string without NUL, or null),
    both at most ``longest`` characters (the full checks' limit, :data:`MAX_ARGUMENTS_LENGTH`),
    ``ignore_failure``/``on_host`` (true/false/null), ``pause`` (false or null, as the
    reference's pickles carry it) and ``data`` (absent, null or empty).
    These are the rules the field checks apply to such a record (:data:`_FIELD_CHECKS`), so
    the entry is the one :func:`validate_record` returns; everything else (pauses, data items,
    any doubt) takes the full checks, which name what is wrong. No display label is built, no
    problem list is touched and no Python code runs per record: each field is taken out as a
    column and checked in C loops (types, NUL, lengths, sum, min and max), record by record
    only where a column has something odd. Validation at parse speed.

    ``drop_room``: bytes the contents of drops may take (None: no drop is screened). A record
    that would be plain but for a ``data`` list of content and file drops is then a *plain drop
    entry* when every item passes :func:`screen_drops` (``Screen.drops``), and their contents
    and the executables and arguments fit in ``drop_room``.
    """
    bad: Set[int] = set()
    if set(map(type, records)) - {dict}:
        bad.update(i for i, r in enumerate(records) if type(r) is not dict)
        records = [{} if i in bad else r for i, r in enumerate(records)]
    get = dict.get
    starts: List[Any] = list(map(get, records, repeat("start_time")))
    exes: List[Any] = list(map(get, records, repeat("executable")))
    args: List[Any] = list(map(get, records, repeat("arguments")))
    true, dropping = _optional_fields(records, bad, drop_room is not None)
    ints = _screen_starts(starts, bad)
    size = _screen_text(exes, bad, longest, empty=False) + _screen_text(args, bad, longest, empty=True)
    dropping = [i for i in dropping if i not in bad] if bad else dropping
    found = None
    if dropping:
        found = screen_drops([records[i]["data"] for i in dropping], (drop_room or 0) - size)
    drops: Dict[int, Tuple[DataItem, ...]] = {}
    if found is None:
        bad.update(dropping)
    else:
        drops = {first + i: data for i, data in zip(dropping, found.data) if data is not None}
        bad.update(i for i, data in zip(dropping, found.data) if data is None)
    for i in bad:
        size -= sum(len(v) for v in (exes[i], args[i]) if type(v) is str)
        starts[i], exes[i], args[i] = math.nan, None, ""
    if ints:
        starts = list(map(float, starts))
    if None in args:
        args = [a or "" for a in args]
    doubtful = sorted(bad)
    ignored, hosts = ([first + i for i in true[key] if i not in bad] for key in ("ignore_failure", "on_host"))
    drop_size, drop_items = (found.size, found.items) if found is not None and drops else (0, 0)
    return Screen(
        starts, exes, args, [first + i for i in doubtful], ignored, hosts, size, drops, drop_size, drop_items
    )


def _optional_fields(
    records: Sequence[Dict[Any, Any]], bad: Set[int], drops: bool
) -> Tuple[Dict[str, List[int]], List[int]]:
    """Add to ``bad`` the positions of ``records`` with an unknown field, or an optional field
    (:data:`_OPTIONAL_TYPES`) that is not plain. Returns the positions where ``ignore_failure``
    and ``on_host`` are true, and (``drops``) those whose ``data`` is a non-empty list: not
    added to ``bad``, for :func:`screen_drops`."""
    true: Dict[str, List[int]] = {"ignore_failure": [], "on_host": []}
    dropping: List[int] = []
    everyone = range(len(records))
    for key in set().union(*records) - {"start_time", "executable", "arguments"}:
        holders = list(compress(everyone, map(dict.__contains__, records, repeat(key))))
        if key not in _OPTIONAL_TYPES:
            bad.update(holders)  # an unknown field
            continue
        values = list(map(dict.__getitem__, map(records.__getitem__, holders), repeat(key)))
        types, false_only = _OPTIONAL_TYPES[key], key in ("data", "pause")
        kinds = set(map(type, values))
        if key == "data" and drops and kinds <= types:
            dropping = list(compress(holders, values))  # the non-empty lists
        elif not kinds <= types or (false_only and any(values)):
            odd = [i for i, v in zip(holders, values) if type(v) not in types or (false_only and v)]
            if key == "data" and drops:
                dropping = [i for i in odd if type(records[i]["data"]) is list]
                odd = [i for i in odd if type(records[i]["data"]) is not list]
            bad.update(odd)
        if key in true:
            true[key] = list(compress(holders, map(is_, values, repeat(True))))
    return true, dropping


def _screen_starts(starts: List[Any], bad: Set[int]) -> bool:
    """Add to ``bad`` the positions of ``starts`` that are not a plain start time: an int or a
    float, finite, not 0; an int inside +-2**53 (a larger one takes :func:`parse_number`).
    Returns True when some are ints."""
    types = set(map(type, starts))
    if starts and types <= _NUMBER_TYPES:
        try:
            total = sum(starts)  # NaN or inf when any is; an int too large for a float raises
        except OverflowError:
            total = math.nan
        if total - total == 0.0 and min(starts) > -_EXACT and max(starts) < _EXACT and 0 not in starts:
            return int in types
    bad.update(
        i
        for i, t in enumerate(starts)
        # x - x is 0.0 only for a finite x: NaN and inf are not plain
        if not (((type(t) is float and t - t == 0.0) or (type(t) is int and -_EXACT < t < _EXACT)) and t != 0)
    )
    return int in types


def _screen_text(values: List[Any], bad: Set[int], longest: int, *, empty: bool) -> int:
    """Add to ``bad`` the positions of ``values`` that are not null or a string without NUL of
    at most ``longest`` characters (``empty``: the empty string allowed).
    Returns the characters of all the strings (the expanded size). The strings are
    joined (to look for NUL in one pass) only when they are few characters: they may be one
    shared string (a pickle's memo, YAML aliases) that would expand beyond any limit."""
    if set(map(type, values)) <= _TEXT_TYPES:
        texts = list(filter(None, values))  # without "": it is in values when they differ in length
        total = sum(map(len, texts))
        if (
            (empty or values.count(None) + len(texts) == len(values))
            and (total <= longest or max(map(len, texts)) <= longest)
            and (
                "\x00" not in "".join(texts)
                if total <= _JOINED_LIMIT
                else not any(map(str.__contains__, texts, repeat("\x00")))
            )
        ):
            return total
    bad.update(
        i
        for i, v in enumerate(values)
        if not (v is None or (type(v) is str and (empty or v) and len(v) <= longest and "\x00" not in v))
    )
    return sum(len(v) for v in values if type(v) is str)


class Drops(NamedTuple):
    """:func:`screen_drops`' findings.

    Attributes:
        data: per ``data`` list, in order: its items, or None when one is not a plain drop.
        size: bytes of the contents of the lists not None (as the full checks charge them:
            a text's UTF-8 bytes).
        items: items of the lists not None.
    """

    data: List[Optional[Tuple[DataItem, ...]]]
    size: int
    items: int


#: Keys of a plain drop item (any order): content or file drop, with or without its flag.
_DROP_SHAPES = {
    frozenset({"location", "content"}): "content",
    frozenset({"location", "content", "executable"}): "content",
    frozenset({"location", "filename"}): "filename",
    frozenset({"location", "filename", "executable"}): "filename",
}
#: Keys of a drop item at most (one with more is not copied into a key tuple: it may be shared).
_MOST_KEYS = max(map(len, _DROP_SHAPES))
_CONTENT_TYPES = frozenset({str, bytes, bytearray})
_FLAG_TYPES = frozenset({bool, type(None)})
_new = object.__new__


def screen_drops(lists: Sequence[List[Any]], room: int) -> Optional[Drops]:
    """The data items of each list in ``lists`` (an entry's ``data``, non-empty) when all are
    *plain drops*: a dict with exactly the keys of a content drop (``location``, ``content``,
    optional ``executable``) or a file drop (``location``, ``filename``, optional
    ``executable``), a ``location`` and ``filename`` that are non-empty strings without NUL (at
    most :data:`MAX_ARGUMENTS_LENGTH` characters here), ``executable`` true/false/null, and a
    ``content`` text or bytes of at most
    :data:`~vmr_handler.core.schedule.limits.MAX_CONTENT_BYTES` bytes (text: UTF-8). These
    are the full checks' rules (:mod:`.items`), so the items are those they make. Checked as
    columns; each distinct text is encoded once.

    Returns:
        The :class:`Drops`, or None when the contents (at every use) take more than ``room``
        bytes or the items more than :data:`MAX_ITEMS`: the full checks charge them one by one
        and say where a limit is reached.
    """
    lengths = list(map(len, lists))
    if sum(lengths) > MAX_ITEMS:  # (before the lists are expanded: they may be aliases of one)
        return None
    items: List[Any] = list(chain.from_iterable(lists))
    bad: Set[int] = set()
    if set(map(type, items)) - {dict} or max(map(len, items)) > _MOST_KEYS:
        bad.update(i for i, item in enumerate(items) if type(item) is not dict or len(item) > _MOST_KEYS)
        items = [{} if i in bad else item for i, item in enumerate(items)]
    keys = list(map(tuple, items))  # (a few distinct key orders: each looked at once)
    shape_of = {order: _DROP_SHAPES.get(frozenset(order)) for order in set(keys)}
    shapes = list(map(shape_of.__getitem__, keys))
    if None in shapes:
        bad.update(i for i, shape in enumerate(shapes) if shape is None)
    get = dict.get
    locations: List[Any] = list(map(get, items, repeat("location")))
    _screen_text(locations, bad, MAX_ARGUMENTS_LENGTH, empty=False)
    flags = [flag is True for flag in _flags(list(map(get, items, repeat("executable"))), bad)]
    content_at = list(compress(range(len(items)), map(eq, shapes, repeat("content"))))
    file_at = list(compress(range(len(items)), map(eq, shapes, repeat("filename"))))
    names: List[Any] = [items[i]["filename"] for i in file_at]
    odd: Set[int] = set()
    _screen_text(names, odd, MAX_ARGUMENTS_LENGTH, empty=False)
    bad.update(file_at[k] for k in odd)
    contents = _contents([items[i]["content"] for i in content_at], room)
    if contents is None:
        return None
    if None in locations or None in names or None in contents:  # null where a value is required
        columns = chain(enumerate(locations), zip(file_at, names), zip(content_at, contents))
        bad.update(i for i, value in columns if value is None)
    made: List[Any] = [None] * len(items)
    # each item with the fields its __init__ sets, set in its instance dict (the frozen
    # dataclass's __init__ costs as much as checking it), inline (a call per item costs more)
    for kind, field, at, values in (
        (ContentDrop, "content", content_at, contents),
        (FileDrop, "filename", file_at, names),
    ):
        for i, value in zip(at, values):
            if i not in bad:
                item = made[i] = _new(kind)
                fields = item.__dict__
                fields["location"] = locations[i]
                fields[field] = value
                fields["executable"] = flags[i]
    size = 0 if bad else sum(map(len, cast(List[bytes], contents)))  # (with bad ones: counted list by list)
    return _grouped(made, lengths, bad, size)


def _contents(values: List[Any], room: int) -> Optional[List[Optional[bytes]]]:
    """The bytes of each content drop's ``content`` in ``values``: a text's UTF-8 bytes (each
    distinct text object encoded once), bytes as they are; None for one that is neither, or
    over :data:`~vmr_handler.core.schedule.limits.MAX_CONTENT_BYTES` bytes. None for all when
    together (at every use) they take more than ``room`` bytes; checked before encoding, on the
    characters, and as encoded."""
    most = checks.MAX_CONTENT_BYTES  # the full checks' limit, read where they read it
    if set(map(type, values)) == {str}:
        lengths = list(map(len, values))
        if sum(lengths) > room:
            return None
        if (
            max(lengths) <= most
            and all(map(str.isascii, values))
            and len(set(map(id, values))) == len(values)
        ):
            return list(map(str.encode, values))  # ASCII texts, none shared: as long as they are
    if not set(map(type, values)) <= _CONTENT_TYPES:
        values = [v if type(v) in _CONTENT_TYPES else None for v in values]
    lengths = [len(v) if v is not None else 0 for v in values]
    if sum(lengths) > room:
        return None
    texts = {id(v): v for v, n in zip(values, lengths) if type(v) is str and n <= most}
    encoded: Dict[int, bytes] = {}
    grown = 0  # bytes the texts grow by when encoded, for each distinct text
    for key, text in texts.items():
        data = encoded[key] = text.encode("utf-8")
        grown += len(data) - len(text)
        if grown > room:
            return None
    if values and set(map(type, values)) == {str} and max(lengths) <= most:  # all encoded
        out: List[Optional[bytes]] = list(map(encoded.__getitem__, map(id, values)))
        sizes = list(map(len, out))  # type: ignore[arg-type]
        if max(sizes) <= most:
            return None if sum(sizes) > room else out
    out, total = [], 0
    for value, n in zip(values, lengths):
        raw = encoded.get(id(value)) if type(value) is str else value
        if raw is None or len(raw) > most or n > most:
            out.append(None)
            continue
        data = bytes(raw)  # (bytes as they are; a bytearray copied, as the full checks do)
        total += len(data)
        out.append(data)
    return None if total > room else out


def _grouped(made: List[Any], lengths: List[int], bad: Set[int], size: int) -> Drops:
    """:class:`Drops` of the ``made`` items, ``lengths[k]`` of them for list ``k``; a list with
    a position in ``bad`` is None (``size``: the contents' bytes when none is)."""
    data: List[Optional[Tuple[DataItem, ...]]]
    if len(made) == len(lengths):
        data = list(zip(made))  # one item each
    else:
        each = iter(made)
        data = [tuple(islice(each, n)) for n in lengths]
    if bad:
        owners = list(chain.from_iterable(map(repeat, range(len(lengths)), lengths)))
        for k in {owners[i] for i in bad}:
            data[k] = None
    if not bad:
        return Drops(data, size, len(made))
    kept = [d for d in data if d is not None]
    size = sum(len(item.content) for d in kept for item in d if type(item) is ContentDrop)
    return Drops(data, size, sum(map(len, kept)))


def _flags(values: List[Any], bad: Set[int]) -> List[Any]:
    """Add to ``bad`` the positions of ``values`` (``executable`` flags) that are not
    true/false/null; returns ``values``."""
    if not set(map(type, values)) <= _FLAG_TYPES:
        bad.update(i for i, v in enumerate(values) if type(v) not in _FLAG_TYPES)
    return values
