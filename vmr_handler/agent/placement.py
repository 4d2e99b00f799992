"""When an entry's data lands: ahead of time, as the reference preloads it (issue 10 section 2).

:class:`DataPlacement` keeps which entries' data is in place. The engine calls
:meth:`DataPlacement.preload` once before anything runs and :meth:`DataPlacement.ensure` when
an entry is about to run; placing itself is :func:`~vmr_handler.agent.executor.place_data` (never
overwrites). The rules, in ``docs/firewheel.md`` ("When data lands"):

1. Every content/file drop of every entry the agent runs is placed before anything runs
   (reference ``vm_resource_handler.py`` ``preload_files``), in a worker thread.
2. Data that cannot be placed then is a ``schedule_warning`` and is tried again at the entry's
   time, where the failure counts (reference: ``load_files_in_target`` again at run time).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Dict, List, Set, Tuple

from vmr_handler.agent.executor import PlacedFile, place_data
from vmr_handler.core.errors import EntryError
from vmr_handler.core.events import EventType
from vmr_handler.core.schedule.model import EntryKind, ScheduleEntry

Emit = Callable[..., Any]
"""``emit(EventType, **data)``: the engine's reporting function."""


class DataPlacement:
    """Places schedule entries' data, each entry's once.

    Args:
        workdirs: ``{entry index: working dir}`` (:func:`~vmr_handler.core.schedule.commands.working_dirs`).
        resources_dir: where ``filename`` drops are read from.
        emit: reports ``data_placed`` and ``schedule_warning`` events.
        done: the journal's list of entry indices whose data was placed ahead of time; appended
            to in place (the caller saves the journal).
    """

    def __init__(self, workdirs: Dict[int, str], resources_dir: str, emit: Emit, done: List[int]) -> None:
        self._workdirs = workdirs
        self._resources = resources_dir
        self._emit = emit
        self._done = done
        self._placed: Set[int] = set(done)
        self._stop = threading.Event()

    def stop(self) -> None:
        """End a preload under way after the entry being placed."""
        self._stop.set()

    async def preload(self, entries: List[ScheduleEntry], finished: Callable[[int], bool]) -> bool:
        """Place the data of every entry the agent runs, except finished ones, in a worker thread.

        Args:
            entries: the schedule's entries.
            finished: ``finished(index)`` is True for an entry that already ran.

        Returns:
            True when something was attempted (the caller saves the journal).
        """
        todo = [
            e
            for e in entries
            if e.kind in (EntryKind.NEGATIVE, EntryKind.POSITIVE)
            and e.index not in self._placed
            and not finished(e.index)
        ]
        if not todo:
            return False
        results = await asyncio.get_running_loop().run_in_executor(None, self._place_all, todo)
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
            self._report(entry, outcome, preloaded=True)
            self._placed.add(entry.index)
            self._done.append(entry.index)
        return True

    def ensure(self, entry: ScheduleEntry) -> None:
        """Place ``entry``'s data now unless it is in place already.

        Raises:
            EntryError: the data cannot be placed (location, resource and cause).
        """
        if entry.index in self._placed:
            return
        placed = place_data(entry, self._workdirs[entry.index], self._resources)
        self._placed.add(entry.index)
        self._report(entry, placed, preloaded=False)

    def _place_all(self, entries: List[ScheduleEntry]) -> List[Tuple[ScheduleEntry, Any]]:
        """Worker thread: :func:`place_data` per entry until stopped; results or EntryErrors."""
        results: List[Tuple[ScheduleEntry, Any]] = []
        for entry in entries:
            if self._stop.is_set():
                break
            try:
                results.append((entry, place_data(entry, self._workdirs[entry.index], self._resources)))
            except EntryError as exc:
                results.append((entry, exc))
        return results

    def _report(self, entry: ScheduleEntry, placed: List[PlacedFile], preloaded: bool) -> None:
        for p in placed:
            extra: Dict[str, Any] = {}
            if p.outcome == "kept":
                extra["details"] = (
                    f"{p.path} already exists: kept, not overwritten (as the reference); "
                    "to replace a file, drop it in the working dir and move it (the helpers' preload)"
                )
            elif p.outcome == "present":
                extra["details"] = "already in place with the same content"
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
