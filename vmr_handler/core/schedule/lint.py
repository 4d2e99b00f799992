"""Warnings about a schedule's command lines, for ``vmr-handler check`` (issue 10 section 1).

Validation (:mod:`.validate`) decides whether a schedule can run at all. These checks look at
what the shell will be asked to run, on the machine ``check`` runs on, which is often the
host rather than the guest, so they are warnings: ``check --strict`` turns them into errors.

* a program that cannot be found here (not a builtin, not dropped by its entry, no such
  file, not on ``PATH``): in the guest it would be the entry's exit 127;
* a command line the shell cannot parse (``bash -n``, else ``sh -n``): the reference hands
  ``<exec path> <arguments>`` unquoted to bash, so a stray quote is a syntax error there too;
* a program that another entry drops with ``executable: false``: the reference makes every
  dropped file executable, vmr-handler follows the flag (``docs/firewheel.md``).
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Dict, List, Optional

from vmr_handler.core.schedule.commands import (
    command_line,
    dropped_path,
    find_shell,
    first_word,
    program_missing,
    working_dirs,
)
from vmr_handler.core.schedule.model import ContentDrop, FileDrop, Schedule

#: A command line made only of these characters has no shell syntax that could be wrong.
_PLAIN = re.compile(r"[A-Za-z0-9_./,:@%+=\- ]*")
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


def _non_executable_drops(schedule: Schedule) -> Dict[str, int]:
    """``{absolute path: entry index}`` of files dropped with ``executable: false``: at an absolute
    location, or moved there by the helpers' preload (``mv <dropped file> <destination>``)."""
    found: Dict[str, int] = {}
    for entry in schedule.entries:
        drops = [d for d in entry.data if isinstance(d, (ContentDrop, FileDrop)) and not d.executable]
        for drop in drops:
            if os.path.isabs(drop.location):
                found[os.path.normpath(drop.location)] = entry.index
        words = entry.arguments.split()
        moved = entry.executable == "mv" and len(words) == 2 and os.path.isabs(words[1])
        if moved and any(os.path.normpath(d.location) == os.path.normpath(words[0]) for d in drops):
            found[os.path.normpath(words[1])] = entry.index
    return found


def lint_schedule(
    schedule: Schedule,
    launch_dir: str = "/var/launch",
    path: Optional[str] = None,
    shell: Optional[str] = None,
) -> List[str]:
    """Warnings about the command lines of ``schedule`` on this machine.

    Args:
        schedule: a validated schedule.
        launch_dir: root of the working dirs (only used to spell dropped programs' paths).
        path: ``PATH`` to look programs up on (default this process's).
        shell: shell whose syntax is checked (default :func:`~vmr_handler.core.schedule.commands.find_shell`).

    Returns:
        One message per problem, naming the entry, the program or the shell's complaint.
    """
    shell = shell or find_shell()
    workdirs: Dict[int, str] = {}  # made only when an entry drops data (a dropped program's path)
    warnings: List[str] = []
    checked: Dict[str, Optional[str]] = {}  # command line -> the shell's complaint
    missing: Dict[str, bool] = {}  # program -> not found
    non_executable = _non_executable_drops(schedule)
    for entry in schedule.entries:
        if not entry.executable or entry.on_host:
            continue
        if entry.data and not workdirs:
            workdirs = working_dirs(list(schedule.entries), launch_dir)
        workdir = workdirs.get(entry.index, launch_dir)
        line = command_line(entry, workdir)
        word = first_word(line)
        lookup = dropped_path(entry, workdir) is None and (os.path.isabs(word) or "/" not in word)
        if lookup and word not in missing:
            missing[word] = program_missing(word, launch_dir, path)
        if lookup and missing[word]:
            warnings.append(
                f"{entry.label}: program {word!r} is not found on this machine (no such file, not on "
                "PATH, not a shell builtin); in a guest without it the entry exits 127 and the "
                "schedule goes on"
            )
        dropper = non_executable.get(os.path.normpath(word)) if os.path.isabs(word) else None
        if dropper is not None and dropper != entry.index:
            warnings.append(
                f"{entry.label}: runs {word!r}, which entry {dropper} drops with executable: false; "
                "FIREWHEEL makes every dropped file executable, vmr-handler keeps the flag (exit 126 "
                "here): set executable: true on that drop"
            )
        if line not in checked:
            checked[line] = syntax_error(line, shell)
        problem = checked[line]
        if problem is not None:
            warnings.append(f"{entry.label}: command line {line!r} is not valid shell syntax: {problem}")
    return warnings
