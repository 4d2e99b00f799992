"""When an entry's data lands: ahead of time, as the reference preloads it, and again whenever
it vanished (SPEC section 5).

:class:`DataPlacement` keeps which entries' data was placed, in the journal
(:attr:`~vmr_handler.agent.state.journal.Journal.placements`). The engine calls
:meth:`DataPlacement.preload` once before anything runs and :meth:`DataPlacement.ensure` when
an entry is about to run; placing itself is :func:`~vmr_handler.agent.machine.executor.place_data` (never
overwrites). The rules, in ``docs/firewheel.md`` ("When data lands"):

1. Every content/file drop of every entry the agent runs is placed before anything runs
   (reference ``vm_resource_handler.py`` ``preload_files``), in a worker thread.
2. Data that cannot be placed then is a ``schedule_warning`` and is tried again at the entry's
   time, where the failure counts (reference: ``load_files_in_target`` again at run time).
3. The journal is not the disk: a reboot empties a launch dir on a tmpfs, an entry may delete
   working dirs. For an entry whose data was placed, the preload (after a restart or reboot)
   and ``ensure`` (just before the entry starts) look at the disk: one ``lstat`` per drop and,
   when nothing is gone, one ``stat`` of the working dir; no file is read or hashed. A drop
   whose file is gone is placed again (``data_placed``, ``outcome: restored``, saying why); a
   file that is there is left alone whatever it holds (an entry may have changed it on
   purpose); a missing working dir is made again, also for an entry without data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from vmr_handler.agent.machine.executor import PlacedFile, drops, make_workdir, place_data
from vmr_handler.agent.state.journal import Journal
from vmr_handler.core.errors import EntryError
from vmr_handler.core.events import EventType
from vmr_handler.core.fsutil import kernel_boot_id, utc_text
from vmr_handler.core.schedule.commands import target_path
from vmr_handler.core.schedule.model import ContentDrop, EntryKind, FileDrop, ScheduleEntry

Emit = Callable[..., Any]
"""``emit(EventType, **data)``: the engine's reporting function."""

Group = Dict[str, Any]
"""One group of :attr:`~vmr_handler.agent.state.journal.Journal.placements`."""

#: What :meth:`DataPlacement._place` did: the files, and the group the entry's data had been
#: placed in before (None: placed for the first time).
Outcome = Tuple[List[PlacedFile], Optional[Group]]


def vanished(entry: ScheduleEntry, workdir: str) -> List[Union[ContentDrop, FileDrop]]:
    """The drops of ``entry`` whose file is gone from the disk (``lstat``: a file, a link or a
    directory of that name counts as there); when none is gone, the working dir ``workdir`` is
    made again if it is missing. Nothing is read or hashed.

    Raises:
        EntryError: the working dir cannot be made (the path and the cause).
    """
    gone = [item for item in drops(entry) if not os.path.lexists(target_path(item.location, workdir))]
    if not gone and not os.path.isdir(workdir):
        make_workdir(workdir)  # no data of its own in it: the entry must not start in a missing dir
    return gone


def why_gone(path: str, group: Group, boot: Optional[str]) -> str:
    """The ``details`` of a drop placed again: when and how it had been placed, and why it is
    gone (a reboot when the boot id changed, a deletion when it did not, either when unknown).

    Args:
        path: the drop's absolute path.
        group: the journal group the entry's data was placed in (``at``: reference UTC seconds
            or None, ``boot``: kernel boot id or None, ``ahead``: placed before anything ran).
        boot: this boot's id (:func:`~vmr_handler.core.fsutil.kernel_boot_id`), None if unknown.
    """
    at = group.get("at")
    when = (
        f" at {utc_text(at)}" + (f" (boot {str(group['boot'])[:8]})" if group.get("boot") else "")
        if at is not None
        else " by an earlier agent (time and boot not recorded)"
    )
    how = "ahead of time" if group.get("ahead", True) else "at its entry's time"
    was = group.get("boot")
    if was is None or boot is None:
        since = "rebooted (a launch dir on a tmpfs is emptied) or deleted"
    elif was != boot:
        since = "the machine rebooted since: a reboot empties a launch dir on a tmpfs"
    else:
        since = "deleted in this boot, by an entry or by hand"
    return f"{path} was placed {how}{when}, gone since ({since}): placed again"


class DataPlacement:
    """Places schedule entries' data, and places it again when it vanished from the disk.

    Args:
        workdirs: ``{entry index: working dir}`` (:func:`~vmr_handler.core.schedule.commands.working_dirs`).
        resources_dir: where ``filename`` drops are read from.
        emit: reports ``data_placed`` and ``schedule_warning`` events.
        journal: keeps whose data was placed (:attr:`~vmr_handler.agent.state.journal.Journal.placements`,
            appended to in place; the caller saves the journal).
        now: reference UTC seconds now, epoch (the engine's ``clock.time``), recorded with
            each group.

    All by keyword: ``DataPlacement(workdirs=..., resources_dir=..., emit=..., journal=...,
    now=...)``.
    """

    def __init__(
        self,
        *,
        workdirs: Dict[int, str],
        resources_dir: str,
        emit: Emit,
        journal: Journal,
        now: Callable[[], float],
    ) -> None:
        self._workdirs = workdirs
        self._resources = resources_dir
        self._emit = emit
        self._groups = journal.placements
        self._now = now
        self._boot = kernel_boot_id()
        self._where: Dict[int, Group] = {i: g for g in self._groups for i in g["entries"]}
        self._mine: Dict[bool, Group] = {}  # this run's group per way of placing (ahead or not)
        self._stop = threading.Event()

    def stop(self) -> None:
        """End a preload under way after the entry being placed."""
        self._stop.set()

    async def preload(self, entries: List[ScheduleEntry], finished: Callable[[int], bool]) -> bool:
        """Place the data of every entry the agent runs, except finished ones, in a worker
        thread; data placed before (an earlier run of the agent) that vanished is placed again.

        Args:
            entries: the schedule's entries.
            finished: ``finished(index)`` is True for an entry that already ran.

        Returns:
            True when entries were placed for the first time (the caller saves the journal).
        """
        todo = [
            e for e in entries if e.kind in (EntryKind.NEGATIVE, EntryKind.POSITIVE) and not finished(e.index)
        ]
        if not todo:
            return False
        results = await asyncio.get_running_loop().run_in_executor(None, self._place_all, todo)
        recorded = False
        for entry, outcome in results:
            if isinstance(outcome, EntryError):
                then = "is reported (ignore_failure)" if entry.ignore_failure else "fails the VM"
                self._emit(
                    EventType.SCHEDULE_WARNING,
                    index=entry.index,
                    details=f"data not placed ahead of time: {outcome}; tried again at the entry's "
                    f"time, where a failure {then}",
                )
                continue
            recorded = self._done(entry, outcome, ahead=True) or recorded
        return recorded

    def ensure(self, entry: ScheduleEntry) -> None:
        """Make sure ``entry``'s working dir and data are in place now: its data is placed unless
        it was already; what was placed and vanished since is placed again.

        Raises:
            EntryError: the working dir or the data cannot be placed (location, resource and cause).
        """
        self._done(entry, self._place(entry), ahead=False)

    def _place(self, entry: ScheduleEntry) -> Outcome:
        """Place ``entry``'s data, or what of it vanished (any thread). Raises EntryError."""
        workdir = self._workdirs[entry.index]
        before = self._where.get(entry.index)
        if before is None:
            return place_data(entry, workdir, self._resources), None
        gone = vanished(entry, workdir)
        return (place_data(entry, workdir, self._resources, gone) if gone else []), before

    def _place_all(self, entries: List[ScheduleEntry]) -> List[Tuple[ScheduleEntry, Any]]:
        """Worker thread: :meth:`_place` per entry until stopped; results or EntryErrors."""
        results: List[Tuple[ScheduleEntry, Any]] = []
        for entry in entries:
            if self._stop.is_set():
                break
            try:
                results.append((entry, self._place(entry)))
            except EntryError as exc:
                results.append((entry, exc))
        return results

    def _done(self, entry: ScheduleEntry, outcome: Outcome, ahead: bool) -> bool:
        """Report what was placed and record a first placement; True when recorded."""
        placed, before = outcome
        for p in placed:
            if before is not None and p.outcome == "placed":
                p = dataclasses.replace(p, outcome="restored")
            self._report(entry, p, ahead, before)
        if before is not None:
            return False
        group = self._mine.get(ahead)
        if group is None:
            group = self._mine[ahead] = {"boot": self._boot, "at": self._now(), "ahead": ahead, "entries": []}
            self._groups.append(group)
        group["entries"].append(entry.index)
        self._where[entry.index] = group
        return True

    def _report(self, entry: ScheduleEntry, p: PlacedFile, preloaded: bool, before: Optional[Group]) -> None:
        extra: Dict[str, Any] = {}
        if p.outcome == "kept":
            extra["details"] = (
                f"{p.path} already exists: kept, not overwritten (as the reference); "
                "to replace a file, drop it in the working dir and move it (the helpers' preload)"
            )
        elif p.outcome == "present":
            extra["details"] = "already in place with the same content"
        elif p.outcome == "restored" and before is not None:
            extra["details"] = why_gone(p.path, before, self._boot)
        self._emit(
            EventType.DATA_PLACED,
            index=entry.index,
            location=p.location,
            path=p.path,
            size=p.size,
            sha256=p.sha256,
            mode=oct(p.mode),
            outcome=p.outcome,
            preloaded=preloaded,
            **extra,
        )
