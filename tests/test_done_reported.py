"""Done means reported: an entry is journaled done only once its reports are written.

On a FakeClock: :meth:`ReportHold.reported` (resolved when the hold has written past the
reports made so far, None at once while the sink works), and the engine with a sink that
refuses writes (ENOSPC): a program entry, a data-only entry and an entry whose data cannot be
placed (``ignore_failure``) stay ``running`` in the journal, marked ``reports_held``, until
their reports are written; the schedule completes only after. An agent stopped or gone
meanwhile runs them again after a restart and says why. Real processes on a real full disk
killed with SIGKILL: tests/test_crash_full_disk.py.
"""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any, Coroutine, Dict, List, Optional

from tests.enginefakes import T0, Harness
from tests.test_report_hold import FlakySink, _engine
from vmr_handler.agent.engine.engine import EXIT_OK, STOP_GRACE
from vmr_handler.agent.state.reporthold import HoldLimits, ReportHold
from vmr_handler.core.clock import FakeClock
from vmr_handler.core.events import Event, EventFactory, EventType


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


class QuotaSink:
    """Takes ``room`` more reports, then raises ENOSPC (a disk with that much space left)."""

    def __init__(self) -> None:
        self.room = 0
        self.written: List[str] = []

    def __call__(self, event: Event) -> None:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= 1
        self.written.append(event.id)


def waiting(hold: ReportHold) -> asyncio.Future[bool]:
    """:meth:`ReportHold.reported` as a future (it must have something to wait for)."""
    wait = hold.reported()
    assert wait is not None
    return asyncio.ensure_future(wait)


def entry_records(h: Harness) -> Dict[str, Any]:
    """The entries' journal records as a restarted agent reads them (snapshot + log)."""
    again = json.loads(Path(h.journal.path).read_text())["entries"]
    for line in Path(h.journal.log_path).read_text().splitlines()[1:]:
        rec = json.loads(line)
        if rec["r"] is None:
            again.pop(str(rec["i"]), None)
        else:
            again[str(rec["i"])] = rec["r"]
    records: Dict[str, Any] = again
    return records


def test_reported_is_none_while_the_sink_works_and_resolves_once_the_hold_writes_past_it() -> None:
    async def go() -> None:
        clock = FakeClock(T0)
        sink = QuotaSink()
        sink.room = 1
        hold = ReportHold(sink, clock)
        make = EventFactory(clock.time).make
        hold(make(EventType.OUTPUT, line="0"))
        assert hold.reported() is None  # written at once: nothing to wait for
        hold(make(EventType.OUTPUT, line="1"))  # refused: held from here on
        first = waiting(hold)
        for i in (2, 3):
            hold(make(EventType.OUTPUT, line=str(i)))
        second = waiting(hold)
        sink.room = 2  # room for "1" and "2" only
        await clock.advance(5.0)
        assert first.done() and first.result() is True
        assert not second.done()  # "3" is still held
        sink.room = 10
        await clock.advance(5.0)
        assert second.result() is True and len(sink.written) == 4
        assert hold.reported() is None

    run(go())


def test_a_stop_ends_the_wait_after_its_grace_with_the_reports_still_held() -> None:
    async def go() -> None:
        clock = FakeClock(T0)
        hold = ReportHold(QuotaSink(), clock, HoldLimits())
        hold(EventFactory(clock.time).make(EventType.OUTPUT, line="x"))
        held = waiting(hold)
        drained = asyncio.ensure_future(hold.written())
        await clock.advance(60.0)
        assert not held.done() and not drained.done()  # no stop: it waits as long as it takes
        hold.stop_waiting(STOP_GRACE)
        await clock.advance(STOP_GRACE - 0.1)
        assert not held.done()
        await clock.advance(0.2)
        assert held.result() is False and drained.result() is False and len(hold) == 1

    run(go())


SCHED = [
    {"start_time": 1, "executable": "prog"},
    {"start_time": 1, "data": [{"location": "f.txt", "content": "x"}]},  # data-only
    {"start_time": 1, "executable": "z", "ignore_failure": True,
     "data": [{"filename": "missing-file", "location": "z"}]},  # cannot be placed
]  # fmt: skip


def _broken(tmp_path: Path, made: List[Event]) -> tuple[Harness, FlakySink]:
    h = Harness(
        tmp_path, SCHED, {"prog": (1.0, 0, b"hello\n")}, start_buffer=1.0, resources_dir=str(tmp_path)
    )
    sink = FlakySink()
    _engine(h, sink, HoldLimits(), made)
    return h, sink


def test_entries_are_journaled_done_only_once_their_reports_are_written(tmp_path: Path) -> None:
    async def go() -> None:
        made: List[Event] = []
        h, sink = _broken(tmp_path, made)
        await h.start()
        sink.broken = True
        await h.clock.advance(20.0)  # every entry has ended, or could not start
        assert {e.type for e in made} >= {"entry_exited", "entry_failed"}
        assert not {e.type for e in sink.written} & {"entry_exited", "entry_failed"}  # all held
        records = entry_records(h)
        assert {i: r["state"] for i, r in records.items()} == {"0": "running", "1": "running", "2": "running"}
        assert all(r["reports_held"] for r in records.values())
        assert records["0"]["exit_code"] == 0
        assert not [e for e in made if e.type == "schedule_complete"]
        sink.broken = False  # space is back
        assert await h.finish() == EXIT_OK
        states = {i: (r["state"], r["exit_code"]) for i, r in entry_records(h).items()}
        assert states == {"0": ("done", 0), "1": ("done", None), "2": ("failed", None)}
        assert [e.id for e in sink.written] == [e.id for e in made]
        assert sink.written[-1].type == "schedule_complete"

    run(go())


def test_a_stop_while_reports_are_held_ends_and_a_restart_runs_the_entries_again(tmp_path: Path) -> None:
    async def go() -> None:
        made: List[Event] = []
        h, sink = _broken(tmp_path, made)
        await h.start()
        sink.broken = True
        await h.clock.advance(20.0)
        h.engine.stop("test")
        task = h.task
        assert task is not None
        await h.clock.advance(STOP_GRACE + 1.0)  # the disk stays full: the stop still ends
        await h.until(task.done)
        assert task.result() == EXIT_OK
        assert all(r["state"] == "running" and r["reports_held"] for r in entry_records(h).values())
        again = Harness(tmp_path, SCHED, {"prog": (1.0, 0, b"")}, clock=h.clock, resources_dir=str(tmp_path))
        await again.start()
        assert await again.finish() == EXIT_OK
        interrupted = again.of("entry_interrupted")
        assert sorted(e.data["index"] for e in interrupted) == [0, 1, 2]
        assert all("reports were not on disk yet" in e.data["details"] for e in interrupted)
        assert all(e.data["killed_pids"] == [] for e in interrupted)  # its process had ended
        assert len(again.processes.started_at("prog")) == 1  # ran again
        assert len(again.of("entry_exited")) == 2 and len(again.of("entry_failed")) == 1
        states: Dict[str, Optional[str]] = {i: r["state"] for i, r in entry_records(again).items()}
        assert states == {"0": "done", "1": "done", "2": "failed"}

    run(go())


def test_a_stage_ends_only_once_its_entries_reports_are_written(tmp_path: Path) -> None:
    sched = [{"start_time": -10, "executable": "first"}, {"start_time": -5, "executable": "second"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"first": (1.0, 0, b"out\n")})
        sink, made = FlakySink(), list[Event]()
        _engine(h, sink, HoldLimits(), made)
        await h.start()
        sink.broken = True
        await h.clock.advance(30.0)
        assert h.processes.started_at("second") == []  # the stage waits for "first"'s reports
        assert "stage_finished" not in [e.type for e in made]
        assert h.journal.stages_done == []
        sink.broken = False
        assert await h.finish() == EXIT_OK
        assert len(h.processes.started_at("second")) == 1
        assert [e.id for e in sink.written] == [e.id for e in made]

    run(go())
