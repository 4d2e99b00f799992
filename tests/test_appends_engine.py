"""Entries appended to a running schedule on the engine's fake clock.

Every rule of :mod:`vmr_handler.core.schedule.appended` at exact instants: numbering after the
schedule, positive entries at start + their pause-shifted time (past ones at once, with their
lateness), negative ones as stages of their own, pauses and breaks from then on, a RESUME that
came before a break never ending it, exactly once per batch id, and a restart that keeps the
batches and runs nothing twice. End to end over both transports: tests/test_schedule_add.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Coroutine, Dict, List

import pytest

from tests.enginefakes import T0, Harness
from vmr_handler.agent.engine.engine import EXIT_OK
from vmr_handler.core.errors import AppendRefused
from vmr_handler.core.schedule import Schedule, load_schedule_bytes


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def batch(records: List[Dict[str, Any]]) -> tuple[Schedule, bytes]:
    raw = json.dumps(records).encode()
    return load_schedule_bytes(raw), raw


def append(h: Harness, batch_id: str, records: List[Dict[str, Any]]) -> Dict[str, Any]:
    sched, raw = batch(records)
    return h.engine.append(batch_id, sched, raw)


def test_positive_entries_fire_at_their_time_past_ones_at_once_with_lateness(tmp_path: Path) -> None:
    sched = [{"start_time": 10, "executable": "e0"}, {"start_time": 100, "executable": "e1"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0, stay=True)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 50.0)
        records = [{"start_time": 20, "executable": "late"}, {"start_time": 70, "executable": "on"}]
        answer = append(h, "b1", records)
        assert answer == {"first_index": 2, "count": 2, "stages": [], "moved": {}}
        await h.clock.advance(0)
        assert h.processes.started_at("late") == [start + 50.0]  # its time (20) passed: at once
        late = next(e for e in h.of("entry_started") if e.data["index"] == 2)
        assert late.data["lateness"] == pytest.approx(30.0)
        await h.clock.advance_to(start + 200.0)
        assert h.processes.started_at("on") == [start + 70.0]
        assert h.processes.started_at("e1") == [start + 100.0]
        appended = h.of("schedule_appended")
        assert [e.data["batch"] for e in appended] == ["b1"] and appended[0].data["first_index"] == 2
        h.engine.stop()
        assert await h.stopped() == EXIT_OK

    run(go())


def test_append_after_complete_runs_again_and_completes_again(tmp_path: Path) -> None:
    async def go() -> None:
        h = Harness(tmp_path, [{"start_time": 5, "executable": "e0"}], start_buffer=0.0, stay=True)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 30.0)
        assert h.engine.phase == "complete" and len(h.of("schedule_complete")) == 1
        assert h.task is not None and not h.task.done()  # stays for batches appended later
        append(h, "b1", [{"start_time": 60, "executable": "more"}])
        await h.clock.advance(0)
        assert h.engine.phase == "positive"
        await h.clock.advance_to(start + 61.0)
        assert h.processes.started_at("more") == [start + 60.0]
        assert len(h.of("schedule_complete")) == 2 and h.engine.phase == "complete"
        assert h.types().count("experiment_started") == 1
        h.engine.stop()
        assert await h.stopped() == EXIT_OK
        assert "agent_stopped" not in h.types()  # it had completed

    run(go())


def test_negative_entries_run_as_a_stage_of_their_own_while_positive_time_goes_on(tmp_path: Path) -> None:
    sched = [{"start_time": -5, "executable": "s0"}, {"start_time": 40, "executable": "p0"}]
    script = {"n1": (30.0, 0, b""), "n2": (1.0, 0, b"")}

    async def go() -> None:
        h = Harness(tmp_path, sched, script, start_buffer=0.0, stay=True)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 20.0)
        records = [{"start_time": -7, "executable": "n2"}, {"start_time": -9, "executable": "n1"}]
        answer = append(h, "b1", records)
        assert answer["stages"] == [[1, -9.0, [3]], [2, -7.0, [2]]]
        await h.clock.advance_to(start + 25.0)
        assert h.engine.phase == "stages" and h.engine.current_stage == 1
        await h.clock.advance_to(start + 100.0)
        assert h.engine.phase == "complete" and h.engine.current_stage is None
        assert h.processes.started_at("n1") == [start + 20.0]
        assert h.processes.started_at("n2") == [start + 50.0]  # after the stage before it, in order
        assert h.processes.started_at("p0") == [start + 40.0]  # positive time went on meanwhile
        stages = [(e.data["stage"], e.data["entries"]) for e in h.of("stage_started")]
        assert stages == [(0, [0]), (1, [3]), (2, [2])]
        assert sorted(h.journal.stages_done) == [0, 1, 2]
        h.engine.stop()
        await h.stopped()

    run(go())


def test_a_batch_appended_during_the_stages_runs_before_the_next_stage(tmp_path: Path) -> None:
    sched = [{"start_time": -20, "executable": "s20"}, {"start_time": -10, "executable": "s10"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"s20": (10.0, 0, b"")}, start_buffer=0.0, stay=True)
        await h.start()
        await h.clock.advance(2.0)
        append(h, "b1", [{"start_time": -100000, "executable": "pushed"}])
        await h.clock.advance(20.0)
        p = h.processes
        assert p.started_at("s20") == [T0] and p.started_at("pushed") == [T0 + 10.0]
        assert p.started_at("s10") == [T0 + 10.0]  # the appended stage took no time
        assert [e.data["stage"] for e in h.of("stage_started")] == [0, 2, 1]
        h.engine.stop()
        await h.stopped()

    run(go())


def test_an_appended_break_holds_later_entries_and_an_earlier_resume_does_not_end_it(tmp_path: Path) -> None:
    async def go() -> None:
        h = Harness(tmp_path, [{"start_time": 500, "executable": "far"}], start_buffer=0.0, stay=True)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 10.0)
        assert h.engine.resume()["ignored"] is True  # no break yet
        await h.clock.advance_to(start + 20.0)
        append(h, "b1", [{"start_time": 15, "pause": True, "pause_duration": ".inf"},
                         {"start_time": 30, "executable": "after"}])  # fmt: skip
        await h.clock.advance_to(start + 600.0)
        assert h.processes.started_at("after") == [] and h.processes.started_at("far") == []
        assert h.engine.status()["blocked_by_break"] == 1
        assert [e.data["index"] for e in h.of("break_started")] == [1]
        assert h.engine.resume()["ended_break"] == 1  # at 600: later entries shift by 600 - 15
        await h.clock.advance_to(start + 2000.0)
        assert h.processes.started_at("after") == [start + 615.0]
        assert h.processes.started_at("far") == [start + 1085.0]
        h.engine.stop()
        await h.stopped()

    run(go())


def test_pauses_that_took_effect_delay_appended_entries_listed_before_them(tmp_path: Path) -> None:
    sched: List[Dict[str, Any]] = [
        {"start_time": 10, "pause": True, "pause_duration": 100},
        {"start_time": 50, "executable": "e"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0, stay=True)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 20.0)  # in the pause (10..110)
        records = [{"start_time": 5, "executable": "early"}, {"start_time": 60, "executable": "mid"}]
        answer = append(h, "b1", records)
        assert list(answer["moved"]) == ["2"]  # before the pause that took effect: moved after it
        await h.clock.advance_to(start + 300.0)
        assert h.processes.started_at("early") == [start + 110.0]
        assert h.processes.started_at("mid") == [start + 160.0]
        assert h.processes.started_at("e") == [start + 150.0]
        h.engine.stop()
        await h.stopped()

    run(go())


def test_a_batch_is_appended_once_and_refused_after_a_failure_or_stop(tmp_path: Path) -> None:
    async def go() -> None:
        h = Harness(tmp_path, [{"start_time": 100, "executable": "e"}], start_buffer=0.0, stay=True)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 1.0)
        first = append(h, "b1", [{"start_time": 50, "executable": "x"}])
        again = append(h, "b1", [{"start_time": 50, "executable": "x"}])
        assert again == {**first, "repeated": True}
        assert len(h.engine.schedule.entries) == 2 and len(h.of("schedule_appended")) == 1
        h.engine.stop()
        with pytest.raises(AppendRefused, match="stopping"):
            append(h, "b2", [{"start_time": 50, "executable": "y"}])
        await h.stopped()

    run(go())


def test_a_restart_keeps_appended_entries_and_never_reruns_a_finished_one(tmp_path: Path) -> None:
    sched = [{"start_time": 10, "executable": "e0"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0, stay=True)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 20.0)
        records = [{"start_time": 30, "executable": "done-before"}, {"start_time": 90, "executable": "later"}]
        append(h, "b1", records)
        await h.clock.advance_to(start + 40.0)
        h.engine.stop()
        await h.stopped()
        # the agent restarts (same state dir): the batch is back, entry 1 is not run again
        h2 = Harness(tmp_path, sched, clock=h.clock, start_buffer=0.0, stay=True)
        assert [e.executable for e in h2.engine.schedule.entries] == ["e0", "done-before", "later"]
        await h2.start()
        await h2.clock.advance_to(start + 100.0)
        assert h2.processes.started_at("done-before") == [] and h2.processes.started_at("e0") == []
        assert h2.processes.started_at("later") == [start + 90.0]
        assert append(h2, "b1", [{"start_time": 30, "executable": "done-before"}])["repeated"] is True
        h2.engine.stop()
        await h2.stopped()

    run(go())
