"""Warnings about a schedule's command lines, for ``vmr-handler check``.

Validation (:mod:`.validate`) decides whether a schedule can run at all. These checks look at
what the shell will be asked to run, on the machine ``check`` runs on, which is often the
host rather than the guest, so they are warnings: ``check --strict`` turns them into errors.

* a program that cannot be found here (not a builtin, not dropped by its entry, no such
  file, not on ``PATH``): in the guest it would be the entry's exit 127;
* a command line the shell cannot parse (``bash -n``, else ``sh -n``): the reference hands
  ``<exec path> <arguments>`` unquoted to bash, so a stray quote is a syntax error there too;
* a program that an entry (another one, or the entry that runs it) drops with
  ``executable: false``: the file is left without its executable bits, here as in FIREWHEEL
  3.1.0 (``load_files_in_target`` chmods a drop only when its ``executable`` is true), so the
  entry exits 126 (``docs/firewheel.md``).
"""

from __future__ import annotations

import os
import re
import subprocess
from bisect import bisect_right
from itertools import accumulate, chain, compress, repeat
from operator import attrgetter, eq, not_
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from vmr_handler.core.gcpause import paused_gc
from vmr_handler.core.schedule.commands import (
    DropItem,
    command_line,
    find_shell,
    first_word,
    program_missing,
    running_drops,
    working_dirs_of,
)
from vmr_handler.core.schedule.model import ContentDrop, FileDrop, Schedule, ScheduleEntry
from vmr_handler.core.schedule.validate import ScheduleColumns

#: A command line made only of these characters has no shell syntax that could be wrong.
_PLAIN = re.compile(r"[A-Za-z0-9_./,:@%+=\- ]*")
#: A path made only of these characters is written unquoted (``shlex.quote`` leaves it as it is)
#: and is plain (:data:`_PLAIN`).
_SAFE_PATH = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_DROPS = (ContentDrop, FileDrop)
_DATA, _START, _EXECUTABLE, _ARGUMENTS, _INDEX, _LOCATION, _FLAG = map(
    attrgetter, ("data", "start_time", "executable", "arguments", "index", "location", "executable")
)
#: Longest time one ``bash -n`` may take, seconds (it parses; it never runs anything).
SYNTAX_TIMEOUT = 10.0


def syntax_error(line: str, shell: str) -> Optional[str]:
    """The shell's complaint about ``line`` (``<shell> -n -c``), or None when it parses.

    Lines made only of words (no quotes, ``$``, redirections, ``;``...) are not handed to the
    shell: they cannot be wrong, and big schedules stay fast to check.
    """
    if _PLAIN.fullmatch(line):
        return None
    try:
        proc = subprocess.run(
            [shell, "-n", "-c", line],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=SYNTAX_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not be checked with {shell} -n: {exc}"
    if proc.returncode == 0:
        return None
    text = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    return text[0] if text else f"{shell} -n exited {proc.returncode}"


def _non_executable_drops(entries: Sequence[ScheduleEntry]) -> Dict[str, int]:
    """``{absolute path: entry index}`` of files dropped with ``executable: false`` by ``entries``
    (in schedule order; a later entry's drop at the same path wins): at an absolute location, or
    moved there by the helpers' preload (``mv <dropped file> <destination>``). Read as columns
    of the data items (C loops): only the non-executable drops are looked at one by one."""
    datas = list(map(_DATA, entries))
    items = list(chain.from_iterable(datas))
    # transfers, pauses and RESUMEs have no ``executable``: never a non-executable drop
    at = list(compress(range(len(items)), map(not_, map(getattr, items, repeat("executable"), repeat(True)))))
    locations = list(map(_LOCATION, map(items.__getitem__, at)))
    absolute = list(compress(zip(at, locations), map(str.startswith, locations, repeat("/"))))
    ends = list(accumulate(map(len, datas)))  # item k belongs to entries[bisect_right(ends, k)]
    normpath = os.path.normpath
    # (entry index, 0 for a drop / 1 for the move of a drop, path): applied in this order
    found = [(entries[bisect_right(ends, k)].index, 0, normpath(location)) for k, location in absolute]
    for entry in compress(entries, map(eq, map(_EXECUTABLE, entries), repeat("mv"))):
        words = entry.arguments.split()
        if len(words) != 2 or not words[1].startswith("/"):
            continue
        drops = [d for d in entry.data if isinstance(d, _DROPS) and not d.executable]
        if any(normpath(d.location) == normpath(words[0]) for d in drops):
            found.append((entry.index, 1, normpath(words[1])))
    return {path: index for index, _, path in sorted(found)}


class LintView(NamedTuple):
    """What the lint reads of a validated schedule: its columns (entry ``i`` at position ``i``)
    and its entries with data. Made from a :class:`Schedule` or, without an object per plain
    entry, from :class:`~vmr_handler.core.schedule.validate.ScheduleColumns`.

    Attributes:
        starts: every entry's start time (seconds).
        executables: every entry's executable (None: none).
        arguments: every entry's arguments (``""``: none).
        entries: the entries at some positions, in that order (made when asked, for plain ones).
        dropping: the entries with data, in schedule order.
    """

    starts: Sequence[float]
    executables: Sequence[Optional[str]]
    arguments: Sequence[str]
    entries: Callable[[Sequence[int]], List[ScheduleEntry]]
    dropping: List[ScheduleEntry]

    @classmethod
    def of_schedule(cls, schedule: Schedule) -> LintView:
        """The view of ``schedule`` (its columns read in C loops)."""
        entries = schedule.entries
        return cls(
            list(map(_START, entries)),
            list(map(_EXECUTABLE, entries)),
            list(map(_ARGUMENTS, entries)),
            lambda indices: list(map(entries.__getitem__, indices)),
            list(compress(entries, map(_DATA, entries))),
        )

    @classmethod
    def of_columns(cls, columns: ScheduleColumns) -> LintView:
        """The view of ``columns``: a plain program entry is made only when the lint asks for it."""
        dropping = columns.entries_at(list(columns.datas()))
        return cls(columns.starts, columns.executables, columns.arguments, columns.entries_at, dropping)


class _Lint:
    """One :func:`lint_schedule` pass: the checks of one entry, and what is cached across entries.

    Caches (``check`` at parse speed): whether a program is missing, per program; the
    shell's complaint, per distinct command line; and, per executable of an entry that drops
    nothing, whether any warning is possible at all (program found, no non-executable drop
    at its path, no shell syntax in it): such an entry with plain arguments is skipped.
    """

    def __init__(self, view: LintView, launch_dir: str, path: Optional[str], shell: str) -> None:
        self.view, self.launch_dir, self.path, self.shell = view, launch_dir, path, shell
        self.workdirs: Dict[int, str] = {}  # of the entries checked that run a file they drop
        self.checked: Dict[str, Optional[str]] = {}  # command line -> the shell's complaint
        self.missing: Dict[str, bool] = {}  # program -> not found
        #: the entries with data (most have none: each pass below looks at these alone)
        self.dropping = view.dropping
        self.non_executable = _non_executable_drops(self.dropping)
        self.quiet: Dict[str, bool] = {}  # executable of a data-less entry -> no warning possible
        #: entry index -> the drop it runs (:func:`~vmr_handler.core.schedule.commands.running_drops`)
        self.owns = running_drops(self.dropping)
        #: (executable, location) -> the dropped file's path is plain whatever its working dir
        self.safe: Dict[Tuple[str, str], bool] = {}
        self.root = os.path.abspath(launch_dir)

    def _is_missing(self, word: str) -> bool:
        if word not in self.missing:
            self.missing[word] = program_missing(word, self.launch_dir, self.path)
        return self.missing[word]

    def _quiet(self, exe: str) -> bool:
        """True when an entry that drops nothing and runs ``exe`` with plain arguments (or none)
        gets no warning: its program is found, not dropped non-executable, and ``exe`` is plain."""
        if not _PLAIN.fullmatch(exe) or not exe.strip():
            return False
        word = first_word(exe)  # no quotes in exe: the first word of "<exe> <arguments>" too
        if (os.path.isabs(word) or "/" not in word) and self._is_missing(word):
            return False
        return not (os.path.isabs(word) and os.path.normpath(word) in self.non_executable)

    def _safe_drop(self, exe: str, location: str) -> bool:
        """True when the path of a file dropped at the relative ``location`` by an entry running
        ``exe`` is plain and unquoted wherever its working dir is: ``<launch>/<start time>/<base
        name of exe>[_N]/<location>``, normalised, has only characters of these parts (a start
        time is spelled with digits, ``.``, ``e``, ``+``, ``-``, ``inf``)."""
        key = (exe, location)
        safe = self.safe.get(key)
        if safe is None:
            safe = self.safe[key] = _SAFE_PATH.fullmatch(self.root + exe + location) is not None
        return safe

    def _needs_checks(self, entry: ScheduleEntry, plain_arguments: bool) -> bool:
        """False when ``entry`` (it runs a program, here) cannot get a warning: it runs a file it
        drops executable, at a plain path, with plain arguments; or it runs no file it drops (its
        command line is then its executable and arguments, as without data) and its executable
        is quiet (:meth:`_quiet`) and its arguments plain."""
        exe = entry.executable or ""
        own = self.owns.get(entry.index) if entry.data else None
        if own is not None:
            return not (plain_arguments and own.executable and self._safe_drop(exe, own.location))
        known = self.quiet.get(exe)
        if known is None:
            known = self.quiet[exe] = self._quiet(exe)
        return not (known and plain_arguments)

    def run(self) -> List[str]:
        """Every warning, in entry order (per entry: program, drop flag, syntax)."""
        warnings: List[str] = []
        view = self.view
        checked = self._candidates()
        # the working dirs of the entries checked that run a file they drop: only those spell
        # a working dir in their command line
        owners = [e.index for e in checked if e.index in self.owns]
        if owners:
            self.workdirs = working_dirs_of(view.starts, view.executables, owners, self.launch_dir)
        for entry in checked:
            self.entry(entry, warnings)
        return warnings

    def _candidates(self) -> List[ScheduleEntry]:
        """The entries, ascending, that run a program and may get a warning
        (:meth:`_needs_checks`). Looked at as columns (C loops): each distinct executable, and
        each distinct (executable, drop) of an entry that runs a file it drops, is judged once;
        an entry that cannot get a warning (most entries) is never visited."""
        executables, arguments = self.view.executables, self.view.arguments
        plain = _PLAIN.fullmatch
        # one match over every argument string (" " is plain): when it holds, no entry's
        # arguments need their own (100 000 matches cost more than the join)
        all_plain = plain(" ".join(arguments)) is not None
        owns = self.owns
        judged = list(executables)  # by its executable: every entry but those running their drop
        for i in owns:
            judged[i] = None
        distinct = set(judged)
        for exe in distinct - self.quiet.keys():
            if exe:
                self.quiet[exe] = self._quiet(exe)
        loud = {exe for exe in distinct if exe and not self.quiet[exe]}
        visit = set(compress(range(len(judged)), map(loud.__contains__, judged))) if loud else set()
        if owns:  # by its drop: executable, at a path that needs no quoting
            at = list(owns)
            drops = list(owns.values())
            keys = list(zip(map(executables.__getitem__, at), map(_LOCATION, drops), map(_FLAG, drops)))
            needs = {key: not (key[2] and self._safe_drop(key[0] or "", key[1])) for key in set(keys)}
            visit.update(compress(at, map(needs.__getitem__, keys)))
        if not all_plain:  # some arguments are not plain: their entries too
            visit.update(i for i, args in enumerate(arguments) if args and plain(args) is None)
        found: List[ScheduleEntry] = []
        for entry in self.view.entries(sorted(visit)):
            if not entry.executable or entry.on_host:
                continue
            args = entry.arguments
            if self._needs_checks(entry, all_plain or not args or plain(args) is not None):
                found.append(entry)
        return found

    def non_executable_warning(
        self, entry: ScheduleEntry, word: str, own: Optional[DropItem]
    ) -> Optional[str]:
        """The warning when ``entry`` runs ``word``, a file dropped with ``executable: false``:
        by ``entry`` itself (``own``, its drop that its executable names, or a drop at the
        absolute path ``word``) or by another entry."""
        if own is not None:
            dropper: Optional[int] = entry.index if not own.executable else None
        else:
            dropper = self.non_executable.get(os.path.normpath(word)) if os.path.isabs(word) else None
        if dropper is None:
            return None
        who = "it drops itself" if dropper == entry.index else f"entry {dropper} drops"
        return (
            f"{entry.label}: runs {word!r}, which {who} with executable: false; the file is left "
            "without its executable bits (as in FIREWHEEL 3.1.0), so the entry exits 126: set "
            "executable: true on that drop, or run the file through its interpreter (/bin/sh FILE)"
        )

    def entry(self, entry: ScheduleEntry, warnings: List[str]) -> None:
        """Append the warnings of one entry that runs a program."""
        workdir = self.workdirs.get(entry.index, self.launch_dir)
        line = command_line(entry, workdir)
        word = first_word(line)
        own = self.owns.get(entry.index)
        lookup = own is None and (os.path.isabs(word) or "/" not in word)
        if lookup and self._is_missing(word):
            warnings.append(
                f"{entry.label}: program {word!r} is not found on this machine (no such file, not on "
                "PATH, not a shell builtin); in a guest without it the entry exits 127 and the "
                "schedule goes on"
            )
        warning = self.non_executable_warning(entry, word, own)
        if warning is not None:
            warnings.append(warning)
        if line not in self.checked:
            self.checked[line] = syntax_error(line, self.shell)
        problem = self.checked[line]
        if problem is not None:
            warnings.append(f"{entry.label}: command line {line!r} is not valid shell syntax: {problem}")


def lint_schedule(
    schedule: Union[Schedule, ScheduleColumns],
    launch_dir: str = "/var/launch",
    path: Optional[str] = None,
    shell: Optional[str] = None,
) -> List[str]:
    """Warnings about the command lines of ``schedule`` on this machine.

    Args:
        schedule: a validated schedule, as a :class:`Schedule` or as the columns of
            :func:`~vmr_handler.core.schedule.loader.load_schedule_columns` (``check``: no
            object is made for a plain program entry that cannot get a warning).
        launch_dir: root of the working dirs (only used to spell dropped programs' paths).
        path: ``PATH`` to look programs up on (default this process's).
        shell: shell whose syntax is checked (default :func:`~vmr_handler.core.schedule.commands.find_shell`).

    Returns:
        One message per problem, naming the entry, the program or the shell's complaint.
        Each program is looked up once and each distinct command line checked once; an entry
        that drops nothing, runs a found plain program and has plain arguments is never
        looked at on its own (100 000 such entries: a few column passes in C, ms). The cyclic
        garbage collector is paused meanwhile (:func:`~vmr_handler.core.gcpause.paused_gc`):
        with a big schedule alive, its passes cost more than the lint.
    """
    with paused_gc():
        if isinstance(schedule, Schedule):
            view = LintView.of_schedule(schedule)
        else:
            view = LintView.of_columns(schedule)
        return _Lint(view, launch_dir, path, shell or find_shell()).run()
