"""Schedules written for a Windows guest, found and refused at load.

FIREWHEEL builds Windows schedules with ``firewheel_repo_windows``' ``PowershellScheduleEntry``
(``powershell -ExecutionPolicy Bypass -File <script>.ps1``, or ``powershell_wrapper.exe``
for a batch shell) and repo-base's ``drop_file``/``drop_content`` preload on a Windows
endpoint runs ``move`` instead of ``mv`` (``model_component_objects.py`` L780-781, L848-849).
Its schedule plugin turns every entry back into a plain ``ScheduleEntry`` before pickling, so
the class name is gone: an entry is recognised by the program it runs (:func:`windows_reason`).

vmr-handler has no Windows agent (``packaging/README.md``, "Windows guests"), so such a
schedule would fail entry by entry in a Linux guest (``powershell: command not found``). The
loader refuses it instead (:func:`refuse_windows`), naming the entries: ``check``, ``plan``,
``vmr-host serve`` and the agent all say so before anything runs.
"""

from __future__ import annotations

import re
from itertools import repeat
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from vmr_handler.core.errors import WindowsScheduleError

#: Programs only a Windows guest has (compared in lower case, as Windows does).
WINDOWS_PROGRAMS = {
    "powershell": "runs Windows PowerShell",
    "powershell.exe": "runs Windows PowerShell",
    "move": "runs move, the Windows shell's mv (FIREWHEEL's drop preload on a Windows VM)",
}
#: File types only Windows runs.
WINDOWS_SUFFIXES = {
    ".ps1": "a PowerShell script",
    ".bat": "a batch file",
    ".cmd": "a batch file",
    ".exe": "a Windows program",
}
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")
#: Entries named in the error; more are counted.
MAX_NAMED = 10


def windows_reason(executable: str) -> Optional[str]:
    """Why ``executable`` (an entry's executable text) is a Windows program, or None.

    Its first word is looked at: ``powershell``, ``move``, a ``.ps1``/``.bat``/``.cmd``/``.exe``
    file, or a path with a drive letter (``C:\\...``)."""
    words = executable.split(None, 1)
    if not words:
        return None
    word = words[0]
    if _DRIVE.match(word):
        return "runs a program at a Windows drive-letter path"
    name = re.split(r"[\\/]", word)[-1].lower()
    known = WINDOWS_PROGRAMS.get(name)
    if known is not None:
        return known
    for suffix, what in WINDOWS_SUFFIXES.items():
        if name.endswith(suffix):
            return f"runs {what} ({suffix})"
    return None


def windows_entries(records: Sequence[Mapping[str, Any]]) -> List[Tuple[int, str, str]]:
    """``(index, executable, why)`` of every record whose executable is a Windows program
    (:func:`windows_reason`). Each distinct executable is looked at once: a 100 000-entry
    schedule costs one pass over its records."""
    verdicts: Dict[str, str] = {}
    try:  # (a C loop over dicts, as parsed: 100 000 records in a few ms)
        column: List[Any] = list(map(dict.get, records, repeat("executable")))  # type: ignore[arg-type]
    except TypeError:  # some record is another kind of mapping
        column = [r.get("executable") for r in records]
    try:
        distinct = set(column)
    except TypeError:  # an unhashable value (the validation names it)
        distinct = {e for e in column if type(e) is str}
    for exe in distinct:
        why = windows_reason(exe) if type(exe) is str else None
        if why is not None:
            verdicts[exe] = why
    if not verdicts:
        return []
    found: List[Tuple[int, str, str]] = []
    for index, record in enumerate(records):
        value = record.get("executable")
        if type(value) is str and value in verdicts:
            found.append((index, value, verdicts[value]))
    return found


def refuse_windows(records: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a schedule written for a Windows guest.

    Raises:
        WindowsScheduleError: some entry runs a Windows program (:func:`windows_entries`); the
            message names each (the first :data:`MAX_NAMED`) with why, and what to do.
    """
    found = windows_entries(records)
    if not found:
        return
    named = "; ".join(f"entry {i} ({exe[:80]!r}) {why}" for i, exe, why in found[:MAX_NAMED])
    more = f"; and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
    raise WindowsScheduleError(
        f"a Windows schedule ({len(found)} of {len(records)} entries are for a Windows guest: "
        f"{named}{more}); "
        "vmr-handler has no Windows agent (packaging/README.md, 'Windows guests'): leave this VM to "
        "FIREWHEEL's own VM resource handler, or rewrite these entries for a Linux guest",
        found,
    )
