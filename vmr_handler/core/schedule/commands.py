"""Working dirs and command lines of schedule entries, as the reference computes them (SPEC section 5).

Pure rules about a schedule (the only I/O: :func:`program_missing` looks a program up), shared
by the agent's executor, ``vmr-handler plan`` and ``vmr-handler check``:

* :func:`working_dirs` -- ``<launch>/<start_time>/<name>`` with ``_1``, ``_2`` suffixes
  (reference ``abstract_driver.py`` ``create_paths`` / ``deconflict_agent_path``);
  :func:`working_dirs_of` for some entries of a schedule given as columns.
* :func:`exec_path` / :func:`command_line` -- ``<exec path> <arguments>``, unquoted, as the
  reference writes it into its ``call_arguments.sh``; :func:`command_lines` for a whole schedule.
* :func:`running_drops` / :func:`dropped_lines` -- the entries that run a file they drop and
  their command lines, decided as columns (``plan --json`` and ``check`` at parse speed).
* :func:`first_word` / :func:`program_missing` -- which program a command line starts with,
  and whether the shell would find it.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
from collections import Counter
from itertools import chain, compress, repeat
from operator import add, and_, attrgetter, eq, is_not, itemgetter, lt, not_, or_
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from vmr_handler.core.errors import EntryError
from vmr_handler.core.schedule.model import ContentDrop, DataItem, FileDrop, ScheduleEntry

#: A data item that drops a file: content, or a VM resource.
DropItem = Union[ContentDrop, FileDrop]


def format_start_time(start_time: float) -> str:
    """Directory name for a start time: ``-100``, ``10``, ``2.5``, ``-inf``."""
    if math.isinf(start_time):
        return "-inf" if start_time < 0 else "inf"
    if float(start_time).is_integer():
        return str(int(start_time))
    return repr(float(start_time))


_START, _EXECUTABLE, _INDEX = attrgetter("start_time"), attrgetter("executable"), attrgetter("index")
_DATA, _LOCATION = attrgetter("data"), attrgetter("location")


def _dir_name(executable: Optional[str]) -> str:
    base = os.path.basename(executable.rstrip("/")) or "entry" if executable else "data"
    return base.replace(os.sep, "_") if base not in (".", "..") else "entry"


def working_dirs(entries: Sequence[ScheduleEntry], launch_dir: str) -> Dict[int, str]:
    """Working directory of every entry: ``<launch_dir>/<start_time>/<name>[_N]``.

    ``name`` is the executable's base name (``data`` for data-only entries); the second
    entry with the same directory gets ``_1``, the third ``_2`` (reference layout). Pure:
    depends only on the schedule, so it is stable across restarts.

    Returns:
        ``{entry index: absolute path}``.
    """
    starts = list(map(_START, entries))
    parts = _dir_parts(starts, list(map(_EXECUTABLE, entries)), range(len(starts)), None)
    return dict(zip(map(_INDEX, entries), map("".join, zip(repeat(_prefix(launch_dir)), *parts))))


def working_dirs_of(
    starts: Sequence[float],
    executables: Sequence[Optional[str]],
    wanted: Iterable[int],
    launch_dir: str,
    texts: Optional[Sequence[str]] = None,
) -> Dict[int, str]:
    """:func:`working_dirs` of the entries at the indices ``wanted`` of a schedule given as
    columns (entry ``i``: ``starts[i]``, ``executables[i]``). Only the entries at the same start
    times are looked at (two entries share a directory only when their start times are equal),
    so a few entries of a big schedule cost a pass over the start times. ``texts``: the
    :func:`start_time_texts` of ``starts`` when the caller has them (else spelled here).

    Returns:
        ``{entry index: absolute path}`` for every index in ``wanted``.
    """
    wanted = sorted(set(wanted))
    parts = _dir_parts(starts, executables, wanted, texts)
    return dict(zip(wanted, map("".join, zip(repeat(_prefix(launch_dir)), *parts))))


def _prefix(launch_dir: str) -> str:
    """``<launch_dir>/``, absolute: what every working dir starts with (``os.path.join(root,
    time, name)``: neither part is empty or starts with ``/``)."""
    root = os.path.abspath(launch_dir)
    return root if root.endswith("/") else root + "/"


def _dir_parts(
    starts: Sequence[float],
    executables: Sequence[Optional[str]],
    wanted: Sequence[int],
    texts: Optional[Sequence[str]],
) -> Tuple[List[str], List[str], List[str]]:
    """What follows the launch dir in the working dirs of the entries at the ascending
    distinct indices ``wanted``, in that order: the start time as spelled in a dir
    (``texts[i]``, else :func:`start_time_texts`), ``/<name>``, and ``""`` or ``_<N>``.

    Two entries share a directory only at equal start times, so only the entries at a time
    the ``wanted`` ones have are looked at, and only those at a time more than one of them
    has are numbered one by one, by (time, name), in index order."""
    if not wanted:
        return [], [], []
    end = wanted[-1] + 1
    if texts is None:  # equal start times are equal texts: either is the key of a time
        keys: Sequence[Any] = starts
        spelled = start_time_texts(list(map(starts.__getitem__, wanted)))
    else:
        keys, spelled = texts, list(map(texts.__getitem__, wanted))  # (a text hashes once)
    times = set(map(keys.__getitem__, wanted))
    same = list(compress(range(end), map(times.__contains__, keys[:end])))
    names = {exe: "/" + _dir_name(exe) for exe in set(map(executables.__getitem__, same))}
    named = list(map(names.__getitem__, map(executables.__getitem__, wanted)))
    at = list(map(keys.__getitem__, same))
    counts = Counter(at)
    if len(counts) == len(at):
        return spelled, named, [""] * len(wanted)
    numbers = dict.fromkeys(wanted, "")
    seen: Dict[Tuple[Any, str], int] = {}
    for pos in compress(range(len(same)), map(lt, repeat(1), map(counts.__getitem__, at))):
        index = same[pos]
        key = (at[pos], names[executables[index]])
        count = seen[key] = seen.get(key, 0) + 1
        if count > 1 and index in numbers:
            numbers[index] = f"_{count - 1}"
    return spelled, named, list(numbers.values())


def start_time_texts(values: Sequence[float]) -> List[str]:
    """:func:`format_start_time` of every value in ``values`` (seconds)."""
    texts, others = trimmed_reprs(values, _POSITIONAL)
    for index in others:
        texts[index] = format_start_time(values[index])
    return texts


#: Floats below this (in magnitude) have a positional ``repr``.
_POSITIONAL = 1e16


def trimmed_reprs(values: Sequence[float], bound: float) -> Tuple[List[str], List[int]]:
    """``repr(v)`` without a trailing ``.0`` of every float ``v`` in ``values`` (``2.5``,
    ``3`` for ``3.0``), and the positions of the values that are 0 (also ``-0.0``), infinite,
    NaN or not inside ``+-bound``: those a caller spells by its own rule. The repr of a finite
    integral float below 1e16 ends in ``.0`` and no other does, so one C loop spells nearly
    all; ``bound`` must not be over 1e16."""
    texts = list(map(str.removesuffix, map(repr, values), repeat(".0")))
    if values:
        try:
            total = sum(values)  # NaN or inf when any is
        except OverflowError:
            total = math.nan
        if total - total == 0.0 and min(values) > -bound and max(values) < bound and 0.0 not in values:
            return texts, []
    return texts, [i for i, v in enumerate(values) if not -bound < v < bound or v == 0]


def target_path(location: str, workdir: str) -> str:
    """Absolute path of a data ``location`` (relative = relative to the working dir ``workdir``)."""
    return location if os.path.isabs(location) else os.path.normpath(os.path.join(workdir, location))


def dropped_item(entry: ScheduleEntry) -> Optional[DropItem]:
    """The drop of this entry (at a relative location) that its executable names, else None.

    The executable names a drop when it equals the drop's location or that location's base
    name, or (file drops) the VM-resource file name, as the reference's ``create_paths`` does
    (``abstract_driver.py``: ``exec_path = working_dir / executable`` when a ``filename`` drop
    equals the executable).
    """
    return _first_named(entry.executable, entry.data) if entry.executable else None


def _names(exe: str, location: str, filename: Optional[str]) -> bool:
    """True when the relative ``exe`` names the drop at ``location`` (of the VM-resource file
    ``filename``; None: a content drop), as :func:`dropped_item` decides."""
    if os.path.isabs(location):
        return False
    names = {os.path.normpath(location), os.path.basename(location), filename}
    return exe in names or os.path.normpath(exe) in names


def running_drops(entries: Iterable[ScheduleEntry]) -> Dict[int, DropItem]:
    """``{entry index: dropped_item(entry)}`` of the ``entries`` that run a file they drop
    (:func:`dropped_item` not None), by ascending index when ``entries`` come so
    (:func:`_drops`: decided once per distinct executable and location, as columns)."""
    listed = list(entries)
    found = _drops(list(map(_INDEX, listed)), list(map(_EXECUTABLE, listed)), list(map(_DATA, listed)))
    return dict(zip(found.indices, found.items))


class _Drops(NamedTuple):
    """The entries that run a file they drop (:func:`_drops`): their indices, the drop each
    runs and its location, aligned."""

    indices: List[int]
    items: List[DropItem]
    locations: List[str]


def _drops(
    indices: List[int], exes: Sequence[Optional[str]], datas: Sequence[Tuple[DataItem, ...]]
) -> _Drops:
    """The entries ``indices[k]`` (executable ``exes[k]``, data ``datas[k]``) that run a file
    they drop, as :func:`dropped_item` decides, in the order given when ``indices`` ascend.

    Whether an executable names a drop depends only on the executable, the location and the
    file name: the entries are taken executable by executable (the relative ones: an absolute
    executable names no drop), each distinct location is decided once, and the items are
    walked as columns (C loops; 100 000 entries with data: a few passes, no Python call per
    entry). Past :data:`_GROUPS` distinct relative executables, entry by entry.
    """
    distinct = set(exes)
    groups = [exe for exe in distinct if exe and not os.path.isabs(exe)]
    if len(groups) > _GROUPS:
        firsts = [(i, _first_named(exe, data)) for i, exe, data in zip(indices, exes, datas) if exe and data]
        return _Drops(*_unzip([(i, item, item.location) for i, item in firsts if item is not None], 3))
    parts = []
    for exe in groups:
        if len(distinct) == 1:
            parts.append(_named_drops(exe, indices, datas))
        else:
            runs = list(map(eq, exes, repeat(exe)))
            parts.append(_named_drops(exe, list(compress(indices, runs)), list(compress(datas, runs))))
    if len(parts) == 1:
        return parts[0]
    rows = sorted(chain.from_iterable(zip(*part) for part in parts), key=itemgetter(0))
    return _Drops(*_unzip(rows, 3))


def _unzip(rows: Sequence[Tuple[Any, ...]], width: int) -> List[List[Any]]:
    """The columns of ``rows`` (each ``width`` long)."""
    return [list(column) for column in zip(*rows)] if rows else [[] for _ in range(width)]


#: Distinct relative executables past which :func:`_drops` goes entry by entry.
_GROUPS = 16


def _named_drops(exe: str, indices: List[int], datas: Sequence[Tuple[DataItem, ...]]) -> _Drops:
    """:func:`_drops` of the entries ``indices`` (data ``datas``), which all run the relative ``exe``."""
    counts = list(map(len, datas))
    items: List[Any] = list(chain.from_iterable(datas))  # (drops, once screened below)
    single = counts.count(1) == len(counts)  # one item each
    owners = indices if single else list(chain.from_iterable(map(repeat, indices, counts)))
    types = set(map(type, items))
    if not _DROP_TYPES.issuperset(types):  # transfers out, pauses, or a subclass
        drops = list(map(isinstance, items, repeat((ContentDrop, FileDrop))))
        items, owners = list(compress(items, drops)), list(compress(owners, drops))
    locations = list(map(_LOCATION, items))
    named = {location: _names(exe, location, None) for location in set(locations)}
    flags = list(map(named.__getitem__, locations))
    exe_names = {exe, os.path.normpath(exe)}
    if not all(flags) and any(issubclass(t, FileDrop) for t in types):  # named by its VM-resource file?
        by_file = map(exe_names.__contains__, map(getattr, items, repeat("filename"), repeat(None)))
        relative = {location: not os.path.isabs(location) for location in named}
        flags = list(map(or_, flags, map(and_, map(relative.__getitem__, locations), by_file)))
    found = _Drops(
        list(compress(owners, flags)), list(compress(items, flags)), list(compress(locations, flags))
    )
    if single or len(set(found.indices)) == len(found.indices):
        return found
    # the first item named of each entry: the last one written when written backwards
    first = sorted(dict(zip(reversed(found.indices), reversed(range(len(found.indices))))).values())
    return _Drops(
        list(map(found.indices.__getitem__, first)),
        list(map(found.items.__getitem__, first)),
        list(map(found.locations.__getitem__, first)),
    )


def _first_named(exe: str, data: Tuple[DataItem, ...]) -> Optional[DropItem]:
    """The first drop in ``data`` that ``exe`` names (:func:`dropped_item`), else None."""
    if os.path.isabs(exe):
        return None
    for item in data:
        if isinstance(item, (ContentDrop, FileDrop)) and _names(
            exe, item.location, getattr(item, "filename", None)
        ):
            return item
    return None


_DROP_TYPES = frozenset((ContentDrop, FileDrop))


def dropped_line(item: DropItem, workdir: str, arguments: str) -> str:
    """:func:`command_line` of an entry whose executable names ``item``, a file it drops
    (:func:`dropped_item`), in the working dir ``workdir``: the file's path, shell-quoted only
    when it needs quoting, and the arguments."""
    return _plain_line(shlex.quote(target_path(item.location, workdir)), arguments)


def dropped_lines(
    columns: Tuple[Sequence[float], Sequence[Optional[str]], Sequence[str]],
    datas: Mapping[int, Tuple[DataItem, ...]],
    launch_dir: str,
    texts: Optional[Sequence[str]] = None,
) -> Dict[int, str]:
    """``{entry index: command line}`` (:func:`command_line`, working dirs under
    ``launch_dir``) of the entries that run a file they drop, in a schedule given as
    ``columns`` ``(starts, executables, arguments)`` (entry ``i``: ``starts[i]``,
    ``executables[i]``, ``arguments[i]``; ``datas``: the data of its entries with data, by
    index). ``texts``: the :func:`start_time_texts` of ``starts`` when the caller has them.

    A line is the dropped file's path, ``<working dir>/<location>`` normalised and
    shell-quoted when it needs it, then the arguments. Where the location stays under the
    working dir and the launch dir, the executable's name and the location need no quoting
    (decided once per distinct one), the paths are joined as columns; any other entry takes
    :func:`dropped_line`.

    Returns:
        ``{entry index: command line}``, in ascending index order.
    """
    starts, executables, arguments = columns
    keys = sorted(datas)
    exes = list(map(executables.__getitem__, keys))
    drops = _drops(keys, exes, list(map(datas.__getitem__, keys)))
    indices = drops.indices
    if not indices:
        return {}
    prefix, (spelled, named, numbers) = _prefix(launch_dir), _dir_parts(starts, executables, indices, texts)
    plain = os.sep == "/" and _UNSAFE(prefix) is None  # a start time needs no quoting
    exes = list(map(executables.__getitem__, indices))
    names = {exe: plain and _UNSAFE(_dir_name(exe)) is None for exe in set(exes)}
    tails = {location: _tail(location) for location in set(drops.locations)}
    suffixes = list(map(tails.__getitem__, drops.locations))
    args = list(map(arguments.__getitem__, indices))
    spaces = [" " if a else "" for a in args] if "" in args else repeat(" ")
    if all(names.values()) and None not in tails.values():  # (the usual case: no flag per entry)
        parts = zip(repeat(prefix), spelled, named, numbers, suffixes, spaces, args)
        return dict(zip(indices, map("".join, parts)))
    spaced = list(map(add, spaces, args))
    dirs = list(map("".join, zip(repeat(prefix), spelled, named, numbers)))
    fast = list(map(and_, map(names.__getitem__, exes), map(is_not, suffixes, repeat(None))))
    lines = [f"{d}{s}{a}" if f else "" for d, s, a, f in zip(dirs, suffixes, spaced, fast)]
    for k in compress(range(len(lines)), map(not_, fast)):
        lines[k] = dropped_line(drops.items[k], dirs[k], spaced[k][1:])
    return dict(zip(indices, lines))


#: A character that makes ``shlex.quote`` quote a word (its own test).
_UNSAFE = re.compile(r"[^\w@%+=:,./-]", re.ASCII).search


def _tail(location: str) -> Optional[str]:
    """What follows a working dir in the normalised path of a file dropped at ``location``
    (relative to it): ``""`` or ``/<normalised location>``; None when the location is absolute,
    leaves the working dir (``..``) or needs shell quoting."""
    if os.path.isabs(location):
        return None
    norm = os.path.normpath(location)
    if norm == ".":
        return ""
    if norm == ".." or norm.startswith("../") or _UNSAFE(norm) is not None:
        return None
    return "/" + norm


def dropped_path(entry: ScheduleEntry, workdir: str) -> Optional[str]:
    """Absolute path (under the working dir ``workdir``) of the file this entry drops that its
    executable names (:func:`dropped_item`), else None."""
    item = dropped_item(entry)
    return target_path(item.location, workdir) if item is not None else None


def exec_path(entry: ScheduleEntry, workdir: str) -> str:
    """The exec path of ``entry`` as the reference computes it (SPEC section 5).

    The absolute path of the file this entry drops when the executable names such a file
    (shell-quoted only when it needs quoting); otherwise the executable text exactly as
    written, for the shell to find: it may carry its own arguments (``/bin/vbash /opt/cfg.sh``)
    or be a builtin (``cd``).

    Raises:
        EntryError: the entry has no executable.
    """
    if not entry.executable:
        raise EntryError("has no executable")
    dropped = dropped_path(entry, workdir)
    return shlex.quote(dropped) if dropped is not None else entry.executable


def command_line(entry: ScheduleEntry, workdir: str) -> str:
    """``<exec path> <arguments>``, unquoted, exactly as the reference writes it into its
    ``call_arguments.sh`` (``abstract_driver.py`` ``create_paths``)."""
    return _plain_line(exec_path(entry, workdir), entry.arguments)


def command_lines(entries: Sequence[ScheduleEntry], launch_dir: str) -> Dict[int, str]:
    """``{entry index: command line}`` of every entry that runs a program (:func:`command_line`,
    working dirs under ``launch_dir``). The working dirs are computed only when an entry drops
    a file (only a drop can change an exec path): 100 000 plain entries in ~20 ms."""
    drops = any(isinstance(d, (ContentDrop, FileDrop)) for e in entries if e.data for d in e.data)
    dirs = working_dirs(list(entries), launch_dir) if drops else {}
    return {
        e.index: command_line(e, dirs[e.index]) if dirs and e.data else _plain_line(e.executable, e.arguments)
        for e in entries
        if e.executable
    }


def _plain_line(exe: str, arguments: str) -> str:
    """:func:`command_line` of an entry without data: its executable as written, then its arguments."""
    return f"{exe} {arguments}" if arguments else exe


#: Words the shell runs itself: never "not found" on PATH (bash builtins and keywords).
#: The POSIX shell, used when the machine has no bash.
SHELL = "/bin/sh"
#: Where bash usually is (the reference's ``#!/bin/bash``).
BASH = "/bin/bash"


def find_shell() -> str:
    """The shell that runs command lines: bash when the machine has it (as the reference's
    ``#!/bin/bash``), else the POSIX shell ``/bin/sh``."""
    return shutil.which("bash") or (BASH if os.access(BASH, os.X_OK) else SHELL)


SHELL_BUILTINS = frozenset(
    """. : [ alias bg bind break builtin caller case cd command compgen complete compopt continue
    declare dirs disown do done echo elif else enable esac eval exec exit export false fc fg fi for
    function getopts hash help history if in jobs kill let local logout mapfile popd printf pushd pwd
    read readarray readonly return select set shift shopt source suspend test then time times trap
    true type typeset ulimit umask unalias unset until wait while { } [[ ]] !""".split()  # noqa: SIM905
)


_OPERATOR = re.compile(r"[;&|<>()]")


def first_word(line: str) -> str:
    """The program a command line starts with: its first shell word, unquoted (on a quoting
    error, its first blank-separated word). Only the first word is parsed."""
    head = line.split(None, 1)
    if not head:
        return ""
    if not any(c in head[0] for c in "'\"\\"):
        return _OPERATOR.split(head[0], 1)[0]  # "echo;ls" runs echo
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return lexer.get_token() or ""
    except ValueError:
        return head[0]


def program_missing(word: str, cwd: str, path: Optional[str] = None) -> bool:
    """True when the shell could not find ``word``: not a builtin, no such file (a word with a
    ``/``, relative to ``cwd``), or not on ``path`` (default the ``PATH`` of this process)."""
    if not word or word in SHELL_BUILTINS or "=" in word.split("/", 1)[0]:
        return False
    if "/" in word:
        return not os.path.exists(os.path.join(cwd, word))
    return shutil.which(word, path=path if path is not None else os.environ.get("PATH", os.defpath)) is None
