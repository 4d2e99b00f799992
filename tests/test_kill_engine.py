"""``vmr-host kill`` in the engine, on a fake clock: what ends, what the stage does, what is
refused, and that a kill is applied once (a resent id, an agent restarted before the end was
journaled). Real processes, agents and hosts: tests/test_kill.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Coroutine

from tests.enginefakes import T0, Harness
from vmr_handler.agent.engine.engine import EXIT_OK
from vmr_handler.core.schedule import load_schedule_bytes


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run one test body on a fresh event loop."""
    asyncio.run(coro)


def test_killing_a_negative_entry_ends_its_stage_and_the_next_begins(tmp_path: Path) -> None:
    sched = [{"start_time": -20, "executable": "hang"}, {"start_time": -10, "executable": "next"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"hang": (1000.0, 0, b"")})
        await h.start()
        await h.clock.advance(30.0)
        assert h.processes.started_at("next") == []  # the stage waits on "hang"
        outcome = h.engine.kill("kill-1", 0, "INT", 4.0, "alice@host")
        assert outcome == {"ok": True, "index": 0,
                           "details": "SIGINT sent to entry 0's process tree (pid 1000), SIGKILL to what "
                                      "is left after 4 s"}  # fmt: skip
        await h.until(lambda: bool(h.of("entry_exited")))
        assert h.processes.kills == [("hang", 2, 4.0)]
        exited = h.of("entry_exited")[0].data
        assert exited["ended_by"] == "operator" and exited["requested_by"] == "alice@host"
        assert exited["status"] == "killed" and exited["kill_signal"] == "SIGINT" and exited["signal"] == 2
        assert exited["details"] == "killed by operator (SIGINT)"
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("next") == [T0 + 30.0]  # the next stage began at the kill

    run(go())


def test_a_kill_is_applied_once_and_refusals_say_why(tmp_path: Path) -> None:
    sched = [
        {"start_time": -10, "executable": "quick"},
        {"start_time": 5, "executable": "long"},
        {"start_time": 500, "executable": "late"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"long": (100.0, 0, b"")})
        await h.start()
        start = await h.started()
        await h.clock.advance(start + 10 - h.clock.time())
        refused = {i: h.engine.kill(f"no-{i}", i, "TERM", 10.0, None) for i in (0, 2, 7)}
        assert not any(o["ok"] for o in refused.values())
        assert refused[0]["details"] == "entry 0 is not running: it ended (exit code 0)"
        assert refused[2]["details"] == "entry 2 is not running: it has not started"
        assert refused[7]["details"] == "no entry 7: the schedule has 3 entries (0-2)"
        first = h.engine.kill("kill-long", 1, "TERM", 10.0, "bob")
        again = h.engine.kill("kill-long", 1, "TERM", 10.0, "bob")  # the host resent it
        assert first["ok"] and again == {**first, "repeated": True}
        await h.until(lambda: bool([e for e in h.of("entry_exited") if e.data["index"] == 1]))
        assert h.processes.kills == [("long", 15, 10.0)]
        later = h.engine.kill("kill-long-2", 1, "TERM", 10.0, "bob")
        assert later == {"ok": False, "index": 1, "details": "entry 1 is not running: it ended (by a signal, "
                                                             "or with data only)"}  # fmt: skip
        assert await h.finish() == EXIT_OK
        assert h.journal.entry_state(1) == "done"

    run(go())


def test_an_agent_restarted_before_the_killed_entry_ended_does_not_run_it_again(tmp_path: Path) -> None:
    sched = [{"start_time": -20, "executable": "hang"}, {"start_time": -10, "executable": "next"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"hang": (1000.0, 0, b"")})
        await h.start()
        await h.clock.advance(3.0)
        # the kill was journaled, then the agent died during the grace period
        mark = {"ended_by": "operator", "requested_by": "alice", "kill_signal": "SIGTERM", "grace": 10.0}
        h.journal.record_kill("kill-1", {"ok": True, "index": 0, "details": "sent"}, 0, mark)
        h.journal.save()
        h.engine.stop()
        await h.stopped()
        again = Harness(tmp_path, sched, {"hang": (1000.0, 0, b"")}, clock=h.clock)
        await again.start()
        assert await again.finish() == EXIT_OK
        assert again.processes.started_at("hang") == [] and again.processes.leftovers == [1000]
        exited = [e.data for e in again.of("entry_exited") if e.data["index"] == 0]
        assert len(exited) == 1 and exited[0]["ended_by"] == "operator" and exited[0]["status"] == "killed"
        assert exited[0]["details"] == (
            "killed by operator (SIGTERM); the agent restarted before its end was reported"
        )
        assert again.processes.started_at("next") == [T0 + 3.0]  # at once: nothing runs again
        resent = again.engine.kill("kill-1", 0, "TERM", 10.0, "alice")
        assert resent == {"ok": True, "index": 0, "details": "sent", "repeated": True}

    run(go())


def test_a_timeout_ends_a_stage_entry_and_a_positive_one_at_their_instant(tmp_path: Path) -> None:
    sched = [
        {"start_time": -20, "executable": "hang", "timeout": 5},
        {"start_time": -10, "executable": "next"},
        {"start_time": 2, "executable": "long", "timeout": 7.5},
        {"start_time": 3, "executable": "quick", "timeout": 100},
    ]

    async def go() -> None:
        script = {"hang": (1000.0, 0, b""), "long": (1000.0, 0, b""), "quick": (1.0, 0, b"")}
        h = Harness(tmp_path, sched, script)
        await h.start()
        assert await h.finish() == EXIT_OK
        start = await h.started()
        assert h.processes.started_at("next") == [T0 + 5.0]  # the stage ended with its timed-out entry
        ends = {e.data["index"]: e for e in h.of("entry_exited")}
        assert ends[0].timestamp == T0 + 5.0 and ends[2].timestamp == start + 2 + 7.5
        for index, seconds in ((0, 5), (2, 7.5)):
            d = ends[index].data
            assert d["ended_by"] == "timeout" and d["status"] == "timeout" and d["timeout"] == seconds
            assert d["details"] == f"timed out after {seconds:g} s (SIGTERM)" and d["grace"] == 10.0
        assert ends[3].data["status"] == "success" and "ended_by" not in ends[3].data
        assert h.processes.kills == [("hang", 15, 10.0), ("long", 15, 10.0)]

    run(go())


def test_the_default_timeout_bounds_entries_without_their_own(tmp_path: Path) -> None:
    sched = [
        {"start_time": -20, "executable": "hang"},
        {"start_time": -10, "executable": "own", "timeout": 50},
    ]

    async def go() -> None:
        script = {"hang": (1000.0, 0, b""), "own": (1000.0, 0, b"")}
        h = Harness(tmp_path, sched, script, default_timeout=30.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        ends = {e.data["index"]: e for e in h.of("entry_exited")}
        assert ends[0].timestamp == T0 + 30.0 and ends[0].data["timeout"] == 30.0
        assert ends[1].timestamp == T0 + 80.0 and ends[1].data["timeout"] == 50.0

    run(go())


def test_an_appended_batch_keeps_its_entries_timeouts(tmp_path: Path) -> None:
    async def go() -> None:
        h = Harness(tmp_path, [{"start_time": 5, "executable": "e0"}], {"more": (1000.0, 0, b"")},
                    start_buffer=0.0, stay=True)  # fmt: skip
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 30.0)
        raw = json.dumps([{"start_time": 60, "executable": "more", "timeout": 12}]).encode()
        assert h.engine.append("b1", load_schedule_bytes(raw), raw)["first_index"] == 1
        await h.clock.advance_to(start + 100.0)
        ended = next(e for e in h.of("entry_exited") if e.data["index"] == 1)
        assert ended.timestamp == start + 72.0 and ended.data["ended_by"] == "timeout"
        h.engine.stop()
        assert await h.stopped() == EXIT_OK

    run(go())
