"""Reports survive a sink that fails: held in bounded memory, retried, in order.

The engine on a FakeClock (tests/enginefakes.py) with a sink that raises ENOSPC: every report
arrives exactly once and in the order it was made, and while the hold is full nothing new
starts (entries start late and say so). Real processes on a real full disk:
tests/test_outbox_full_disk.py.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path
from typing import Any, Coroutine, List

import pytest

from tests.enginefakes import T0, Harness
from vmr_handler.agent.engine.engine import EXIT_OK, Engine
from vmr_handler.agent.state.reporthold import HoldLimits, ReportHold
from vmr_handler.core.clock import FakeClock
from vmr_handler.core.errors import JournalError
from vmr_handler.core.events import Event, EventFactory, EventType


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


class FlakySink:
    """Raises ENOSPC for the first ``failures`` writes, or while ``broken``; keeps the rest."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.broken = False
        self.calls = 0
        self.written: List[Event] = []

    def __call__(self, event: Event) -> None:
        self.calls += 1
        if self.broken or self.failures > 0:
            self.failures = max(0, self.failures - 1)
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written.append(event)


def _engine(h: Harness, sink: FlakySink, limits: HoldLimits, made: List[Event]) -> Engine:
    """``h``'s engine again, on a hold in front of ``sink`` that notes every report made."""
    hold = ReportHold(sink, h.clock, limits, note=made.append)
    h.engine = Engine(
        schedule=h.schedule,
        config=h.config,
        sink=hold,
        clock=h.clock,
        processes=h.processes,
        journal=h.journal,
    )
    return h.engine


def test_a_sink_failing_n_times_loses_nothing_and_keeps_the_order(tmp_path: Path, caplog) -> None:
    sched = [{"start_time": -1, "executable": "setup"}, {"start_time": 1, "executable": "one"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"setup": (2.0, 0, b"ready\n"), "one": (1.0, 0, b"done\n")})
        sink, made = FlakySink(failures=7), []
        _engine(h, sink, HoldLimits(), made)
        await h.start()
        assert await h.finish() == EXIT_OK
        assert sink.calls > len(made)  # it did fail, and was retried
        assert [e.id for e in sink.written] == [e.id for e in made]  # each once, in order
        assert [e.type for e in sink.written][-1] == "schedule_complete"
        assert len(h.engine.reports) == 0

    with caplog.at_level(logging.WARNING, logger="vmr_handler.agent.state.reporthold"):
        run(go())
    # one line when it starts failing, one when it recovers: not one per report
    assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
    assert "holding them in memory" in caplog.records[0].getMessage()
    assert "written again" in caplog.records[1].getMessage()


def test_a_full_hold_makes_entries_wait_instead_of_dropping(tmp_path: Path) -> None:
    sched = [{"start_time": 1, "executable": "one"}, {"start_time": 2, "executable": "two"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"one": (0.5, 0, b"1\n"), "two": (0.5, 0, b"2\n")}, start_buffer=1.0)
        sink, made = FlakySink(), []
        sink.broken = True
        _engine(h, sink, HoldLimits(events=3), made)
        await h.start()
        await h.clock.advance(20.0)  # far past both entries' instants
        assert h.processes.started == []  # the hold is full: nothing new started
        assert len(h.engine.reports) >= 3 and sink.written == []
        sink.broken = False  # space came back: the retry writes the held reports, then entries run
        assert await h.finish() == EXIT_OK
        assert [line for _t, line in h.processes.started] == ["one", "two"]
        assert [e.id for e in sink.written] == [e.id for e in made]
        started = [e for e in sink.written if e.type == "entry_started"]
        start = T0 + 1.0
        assert started[0].data["lateness"] > 20.0 - 1.0 - 1.0  # honest: they started late
        assert started[0].data["scheduled"] == start + 1.0

    run(go())


def test_a_stop_while_the_hold_is_full_still_ends_the_engine(tmp_path: Path) -> None:
    sched = [{"start_time": 1, "executable": "one"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=1.0)
        sink, made = FlakySink(), []
        sink.broken = True
        _engine(h, sink, HoldLimits(events=2), made)
        await h.start()
        await h.clock.advance(5.0)
        h.engine.stop("test")
        task = h.task
        assert task is not None
        await h.clock.advance(10.0)  # the stop grace (5 s) passes with the sink still broken
        await h.until(task.done)
        assert task.result() == EXIT_OK and h.processes.started == []
        assert len(h.engine.reports) == len(made)  # still held, not dropped, not written

    run(go())


@pytest.mark.parametrize("error", [OSError(errno.EIO, "I/O error"), JournalError("outbox full")])
def test_the_hold_retries_disk_errors_and_drops_only_what_can_never_be_written(error, caplog) -> None:
    async def go() -> None:
        clock = FakeClock(T0)
        calls: List[str] = []
        written: List[str] = []

        def sink(event: Event) -> None:
            calls.append(event.id)
            if event.data.get("poison"):
                raise ValueError("not JSON")
            if len(calls) <= 2:
                raise error
            written.append(event.id)

        hold = ReportHold(sink, clock)
        f = EventFactory(clock.time)
        events = [f.make(EventType.OUTPUT, line=str(i), poison=i == 3) for i in range(6)]
        for e in events:
            hold(e)
        assert len(hold) == 6 and hold.room() is None
        await clock.advance(5.0)
        assert written == [e.id for i, e in enumerate(events) if i != 3]
        assert await hold.drained(0) and len(hold) == 0

    run(go())
    assert any("report dropped" in r.getMessage() for r in caplog.records)
