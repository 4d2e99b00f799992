"""Working dirs and command lines of schedule entries, as the reference computes them (SPEC section 5).

Pure rules about a schedule (the only I/O: :func:`program_missing` looks a program up), shared
by the agent's executor, ``vmr-handler plan`` and ``vmr-handler check``:

* :func:`working_dirs` -- ``<launch>/<start_time>/<name>`` with ``_1``, ``_2`` suffixes
  (reference ``abstract_driver.py`` ``create_paths`` / ``deconflict_agent_path``).
* :func:`exec_path` / :func:`command_line` -- ``<exec path> <arguments>``, unquoted, as the
  reference writes it into its ``call_arguments.sh``; :func:`command_lines` for a whole schedule.
* :func:`first_word` / :func:`program_missing` -- which program a command line starts with,
  and whether the shell would find it.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from vmr_handler.core.errors import EntryError
from vmr_handler.core.schedule.model import ContentDrop, FileDrop, ScheduleEntry

#: A data item that drops a file: content, or a VM resource.
DropItem = Union[ContentDrop, FileDrop]


def format_start_time(start_time: float) -> str:
    """Directory name for a start time: ``-100``, ``10``, ``2.5``, ``-inf``."""
    if math.isinf(start_time):
        return "-inf" if start_time < 0 else "inf"
    if float(start_time).is_integer():
        return str(int(start_time))
    return repr(float(start_time))


def _dir_name(executable: Optional[str]) -> str:
    base = os.path.basename(executable.rstrip("/")) or "entry" if executable else "data"
    return base.replace(os.sep, "_") if base not in (".", "..") else "entry"


def working_dirs(entries: List[ScheduleEntry], launch_dir: str) -> Dict[int, str]:
    """Working directory of every entry: ``<launch_dir>/<start_time>/<name>[_N]``.

    ``name`` is the executable's base name (``data`` for data-only entries); the second
    entry with the same directory gets ``_1``, the third ``_2`` (reference layout). Pure:
    depends only on the schedule, so it is stable across restarts.

    Returns:
        ``{entry index: absolute path}``.
    """
    return _numbered_dirs(((e.index, e.start_time, e.executable) for e in entries), launch_dir)


def working_dirs_of(
    starts: Sequence[float], executables: Sequence[Optional[str]], wanted: Iterable[int], launch_dir: str
) -> Dict[int, str]:
    """:func:`working_dirs` of the entries at the indices ``wanted`` of a schedule given as
    columns (entry ``i``: ``starts[i]``, ``executables[i]``). Only the entries at the same start
    times are looked at (two entries share a directory only when their start times are equal),
    so a few entries of a big schedule cost a pass over the start times.

    Returns:
        ``{entry index: absolute path}`` for every index in ``wanted``.
    """
    wanted = sorted(set(wanted))
    if not wanted:
        return {}
    times = {starts[i] for i in wanted}
    same = [i for i, t in enumerate(starts[: wanted[-1] + 1]) if t in times]
    dirs = _numbered_dirs(((i, starts[i], executables[i]) for i in same), launch_dir)
    return {i: dirs[i] for i in wanted}


def _numbered_dirs(items: Iterable[Tuple[int, float, Optional[str]]], launch_dir: str) -> Dict[int, str]:
    """``{index: <launch_dir>/<start_time>/<name>[_N]}`` of ``(index, start_time, executable)``
    items, numbered in the order given (:func:`working_dirs`)."""
    seen: Dict[str, int] = {}
    result: Dict[int, str] = {}
    root = os.path.abspath(launch_dir)
    # os.path.join(root, time, name): neither part is empty or starts with "/"; each distinct
    # start time and executable is spelled once (100 000 entries: a few dict look-ups each)
    prefix = root if root.endswith("/") else root + "/"
    times: Dict[float, str] = {}
    names: Dict[Optional[str], str] = {}
    for index, start, executable in items:
        time_text = times.get(start)
        if time_text is None:
            time_text = times[start] = prefix + format_start_time(start) + "/"
        name = names.get(executable)
        if name is None:
            name = names[executable] = _dir_name(executable)
        base = time_text + name
        count = seen.get(base, 0)
        seen[base] = count + 1
        result[index] = base if count == 0 else f"{base}_{count}"
    return result


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
    exe = entry.executable
    if not exe or os.path.isabs(exe):
        return None
    for item in entry.data:
        if not isinstance(item, (ContentDrop, FileDrop)) or os.path.isabs(item.location):
            continue
        names = {os.path.normpath(item.location), os.path.basename(item.location)}
        if isinstance(item, FileDrop):
            names.add(item.filename)
        if exe in names or os.path.normpath(exe) in names:
            return item
    return None


def running_drops(entries: Iterable[ScheduleEntry]) -> Dict[int, DropItem]:
    """``{entry index: dropped_item(entry)}`` of the ``entries`` that run a file they drop
    (:func:`dropped_item` not None). Whether an executable names a drop depends only on the
    two, so each distinct (executable, location, file name) is decided once: 100 000 entries
    with data cost a dictionary look-up per item."""
    names: Dict[Tuple[str, str, Optional[str]], bool] = {}
    found: Dict[int, DropItem] = {}
    for entry in entries:
        exe = entry.executable
        if not exe or not entry.data:
            continue
        for item in entry.data:
            if isinstance(item, ContentDrop):
                key: Tuple[str, str, Optional[str]] = (exe, item.location, None)
            elif isinstance(item, FileDrop):
                key = (exe, item.location, item.filename)
            else:
                continue
            named = names.get(key)
            if named is None:
                alone = ScheduleEntry(entry.index, entry.start_time, exe, data=(item,))
                named = names[key] = dropped_item(alone) is not None
            if named:
                found[entry.index] = item
                break
    return found


def dropped_line(item: DropItem, workdir: str, arguments: str) -> str:
    """:func:`command_line` of an entry whose executable names ``item``, a file it drops
    (:func:`dropped_item`), in the working dir ``workdir``: the file's path, shell-quoted only
    when it needs quoting, and the arguments."""
    return _plain_line(shlex.quote(target_path(item.location, workdir)), arguments)


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
