"""The console's live picture of the experiment: the report's timeline folded from
every VM's ``.jsonl`` at start and then from each report as it is stored, the metrics that
count reports, and the stream of changes to the browsers watching.

:class:`LiveExperiment` is an :attr:`Experiment.watchers
<vmr_handler.host.serve.experiment.experiment.Experiment.watchers>`
entry; everything runs on the host's event loop except the first fold (a worker thread, which
reads the logs up to their size at that moment while the reports stored meanwhile wait).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from vmr_handler.core.errors import InternalError
from vmr_handler.core.events import Event
from vmr_handler.host.console.metrics import ConsoleMetrics
from vmr_handler.host.console.stream import Hub, Message
from vmr_handler.host.console.views import all_rows, changed_rows, experiment_view
from vmr_handler.host.logs.jsonlread import event_of, records_from
from vmr_handler.host.report.fold import ExperimentTimeline
from vmr_handler.host.serve.experiment.experiment import Experiment

log = logging.getLogger("vmr_host.console")
_T = TypeVar("_T")

#: Shortest seconds between two looks for changed VM rows while a browser watches.
ROWS_EVERY = 0.5
#: Looking for changed rows may take at most this share of the loop (it is spaced out more
#: at thousands of VMs).
ROWS_SHARE = 0.05


def record_of(vm: str, event: Event, received: float) -> Dict[str, Any]:
    """The host log record of a stored report (the form of a ``.jsonl`` line; ``docs/host.md``)."""
    return {"vm": vm, "host_received": received, "event": event.to_dict()}


class LiveExperiment:
    """The console's live state of ``experiment``.

    Args:
        experiment: the served experiment (its sessions, barrier and logs).
        mode: ``listen``, ``connect`` or ``mqtt`` (shown by the console).
    """

    def __init__(self, experiment: Experiment, mode: str) -> None:
        self.experiment = experiment
        self.clock = experiment.clock  # the host's: "now" of every view, the costs measured
        self.mode = mode
        self.timeline = ExperimentTimeline()
        self.metrics = ConsoleMetrics(experiment)
        self.hub = Hub()
        #: bumped at every change of the timeline (the rendered fragment is cached by it)
        self.version = 0
        self._waiting: Optional[List[Tuple[str, List[Event], float]]] = []  # None once folded
        self._rows: Dict[str, Dict[str, Any]] = {}
        self._experiment: Optional[Dict[str, Any]] = None
        self._task: Optional[asyncio.Task[None]] = None

    async def start(self) -> None:
        """Fold what the logs hold (in a worker thread), then follow every stored report."""
        self.experiment.watchers.append(self.on_stored)
        sizes = {name: (s.log.jsonl_path, s.log.bytes) for name, s in self.experiment.sessions.items()}
        started = self.clock.monotonic()
        timeline, records = await asyncio.to_thread(self._fold, sizes)
        self.timeline = timeline
        self._release()
        self.version += 1
        log.info(
            "console: %d report(s) of %d VM(s) folded in %.2f s",
            records,
            len(sizes),
            self.clock.monotonic() - started,
        )
        self._task = asyncio.ensure_future(self._watch_rows())

    def _release(self) -> None:
        """Fold the reports held while the timeline was read in a worker thread."""
        waiting, self._waiting = self._waiting or [], None
        for vm, events, received in waiting:
            self.on_stored(vm, events, received)

    async def read_held(self, read: Callable[[ExperimentTimeline], _T]) -> _T:
        """``read(timeline)`` in a worker thread (rendering 1000 VMs takes most of a second: not
        on the host's loop); reports stored meanwhile are held and folded after it, so the
        thread never sees the timeline change. One at a time.

        Raises:
            InternalError: the timeline is already being read (the caller serialises reads).
        """
        if self._waiting is not None:
            raise InternalError("the live timeline is already being read")
        self._waiting = []
        try:
            return await asyncio.to_thread(read, self.timeline)
        finally:
            self._release()

    def _fold(self, sizes: Dict[str, Tuple[str, int]]) -> Tuple[ExperimentTimeline, int]:
        """The timeline of every log up to its size at start (worker thread; unreadable logs
        are logged and left out)."""
        timeline = ExperimentTimeline()
        count = 0
        for vm, (path, size) in sorted(sizes.items()):
            timeline.vm(vm)
            try:
                for _offset, end, record in records_from(path, 0):
                    if end > size:
                        break
                    timeline.add(record)
                    ev = event_of(record)
                    if ev is not None:
                        self.metrics.observe(vm, ev, float(record.get("host_received") or ev.timestamp))
                    count += 1
            except OSError as exc:
                log.warning("console: cannot read %s: %s", path, exc)
        return timeline, count

    def on_stored(self, vm: str, events: List[Event], received: float) -> None:
        """The watcher: fold, count and stream ``vm``'s new reports (held during the first fold)."""
        if not events:
            return
        if self._waiting is not None:
            self._waiting.append((vm, events, received))
            return
        session = self.experiment.sessions.get(vm)
        after = session.log.bytes if session is not None else None
        for ev in events:
            record = record_of(vm, ev, received)
            self.timeline.add(record)
            self.metrics.observe(vm, ev, received)
            if self.hub:
                self.hub.publish("vm_event", {**record, "next": after})
        self.version += 1

    def snapshot(self, now: float) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """Every VM's row and the experiment object at UTC ``now`` (:mod:`.views`)."""
        rows = all_rows(self.experiment, now)
        return rows, experiment_view(self.experiment, self.mode, rows, now)

    def first_messages(self) -> List[Message]:
        """What a new stream subscriber gets first: the experiment object."""
        _rows, view = self.snapshot(self.clock.time())
        return [("experiment", view)]

    async def _watch_rows(self) -> None:
        """While a browser watches: publish the rows and the experiment object that changed,
        looking at most every :data:`ROWS_EVERY` s and at most :data:`ROWS_SHARE` of the loop."""
        pause = ROWS_EVERY
        while True:
            await asyncio.sleep(pause)
            if not self.hub:
                self._rows, self._experiment = {}, None
                continue
            began = self.clock.monotonic()
            rows, view = self.snapshot(self.clock.time())
            changed, self._rows = changed_rows(rows, self._rows)
            for row in changed:
                self.hub.publish("vm", row)
            steady = {k: v for k, v in view.items() if k not in ("now", "barrier")}
            steady["barrier"] = {k: v for k, v in view["barrier"].items() if k != "start_in"}
            if steady != self._experiment:
                self._experiment = steady
                self.hub.publish("experiment", view)
            pause = max(ROWS_EVERY, (self.clock.monotonic() - began) / ROWS_SHARE)

    async def close(self) -> None:
        """Stop following (the host is stopping)."""
        if self.on_stored in self.experiment.watchers:
            self.experiment.watchers.remove(self.on_stored)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
