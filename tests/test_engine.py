"""The engine on a fake clock: every SPEC section 4 rule at exact instants.

No process is forked and no real time passes (each test takes milliseconds): the engine gets a
:class:`~vmr_handler.core.clock.FakeClock`, scripted processes and a real journal in a temp dir
(tests/enginefakes.py). End-to-end behaviour with real processes is tests/test_run_local.py.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, Coroutine

from tests.enginefakes import T0, Harness
from vmr_handler.agent.engine.engine import EXIT_FAILED, EXIT_OK


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run one test body on a fresh event loop."""
    asyncio.run(coro)


def test_stages_in_ascending_order_entries_of_a_stage_together(tmp_path: Path) -> None:
    sched = [
        {"start_time": -10, "executable": "s10"},
        {"start_time": -20, "executable": "s20a"},
        {"start_time": -20, "executable": "s20b"},
        {"start_time": -5, "executable": "s5"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"s20a": (3.0, 0, b""), "s20b": (7.0, 0, b""), "s10": (2.0, 0, b"")})
        await h.start()
        assert await h.finish() == EXIT_OK
        p = h.processes
        # stage -20 starts both at once; -10 when the longer of them ended (7 s); -5 after 2 s more
        assert p.started_at("s20a") == p.started_at("s20b") == [T0]
        assert p.started_at("s10") == [T0 + 7.0]
        assert p.started_at("s5") == [T0 + 9.0]
        assert [e.data["stage"] for e in h.of("stage_started")] == [0, 1, 2]
        assert h.of("configured")[0].data["at"] == T0 + 9.0

    run(go())


def test_local_start_is_configured_plus_buffer_and_entries_fire_at_start_plus_t(tmp_path: Path) -> None:
    sched = [
        {"start_time": -1, "executable": "setup"},
        {"start_time": 2, "executable": "two"},
        {"start_time": 0.5, "executable": "half"},
        {"start_time": 2, "executable": "also-two"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"setup": (4.0, 0, b"")}, start_buffer=10.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        start = T0 + 4.0 + 10.0
        assert await h.started() == start
        assert h.processes.started_at("half") == [start + 0.5]
        assert h.processes.started_at("two") == h.processes.started_at("also-two") == [start + 2.0]
        for e in h.of("entry_started"):
            if e.data["start_time"] > 0:
                assert e.data["lateness"] == 0.0 and e.data["scheduled"] == start + e.data["start_time"]
        assert h.types()[-1] == "schedule_complete"

    run(go())


def test_pause_shifts_later_entries_by_its_duration(tmp_path: Path) -> None:
    sched = [
        {"start_time": 1, "executable": "at-p"},
        {"start_time": 1, "pause": True, "data": [{"pause_duration": 1.5}]},
        {"start_time": 2, "executable": "after"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        start = await h.started()
        assert h.processes.started_at("at-p") == [start + 1.0]  # at exactly P: before the pause
        assert h.processes.started_at("after") == [start + 3.5]
        types = h.types()
        assert types.index("pause_started") < types.index("pause_ended")

    run(go())


def test_break_holds_until_resume_then_entries_shift(tmp_path: Path) -> None:
    # E1@10, break@15, E2@30, RESUME at 100 -> E1@10, E2@115 (SPEC section 4, example 2)
    sched = [
        {"start_time": 10, "executable": "e1"},
        {"start_time": 15, "pause": True, "pause_duration": ".inf"},
        {"start_time": 30, "executable": "e2"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 100.0)
        assert h.processes.started_at("e1") == [start + 10.0]
        assert h.processes.started_at("e2") == []
        assert h.engine.status()["blocked_by_break"] == 1
        assert h.engine.status()["active_pause"] == {"index": 1, "kind": "break", "at": 15.0}
        outcome = h.engine.resume()
        assert outcome == {"at": 100.0, "ended_break": 1, "ignored": False}
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("e2") == [start + 115.0]

    run(go())


def test_resume_without_a_break_is_ignored_and_a_repeated_id_applies_once(tmp_path: Path) -> None:
    sched = [
        {"start_time": 5, "pause": True, "pause_duration": ".inf"},
        {"start_time": 10, "executable": "e"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 2.0)
        early = h.engine.resume(resume_id="r1")  # before the break takes effect: ignored
        assert early["ignored"] is True
        assert h.engine.resume(resume_id="r1") == {**early, "repeated": True}
        await h.clock.advance_to(start + 20.0)
        assert h.processes.started_at("e") == []
        h.engine.resume(at=20.0, resume_id="r2")
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("e") == [start + 25.0]
        assert [e.data["ignored"] for e in h.of("resume_received")] == [True, False]

    run(go())


def test_minus_inf_break_holds_the_stages_until_resume(tmp_path: Path) -> None:
    sched = [
        {"start_time": -math.inf, "pause": True, "pause_duration": ".inf"},
        {"start_time": -5, "executable": "stage"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched)
        await h.start()
        await h.clock.advance(3600.0)
        assert h.processes.started == []
        assert h.engine.phase == "break"
        h.engine.resume()
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("stage") == [T0 + 3600.0]

    run(go())


def test_minus_inf_pause_delays_the_stages_and_shifts_positive_time(tmp_path: Path) -> None:
    # the stages wait the pause out; positive entries are also shifted by it (SPEC section 4)
    sched = [
        {"start_time": -math.inf, "pause": True, "data": [{"pause_duration": 30}]},
        {"start_time": -5, "executable": "stage"},
        {"start_time": 1, "executable": "pos"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=2.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("stage") == [T0 + 30.0]
        assert await h.started() == T0 + 30.0 + 2.0
        assert h.processes.started_at("pos") == [await h.started() + 30.0 + 1.0]

    run(go())


def test_barrier_waits_for_the_hosts_start_time_and_the_clock(tmp_path: Path) -> None:
    sched = [{"start_time": -1, "executable": "setup"}, {"start_time": 3, "executable": "pos"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, local_start=False)
        await h.start()
        await h.clock.advance(600.0)
        assert h.engine.phase == "configured, waiting at the barrier"
        assert h.processes.started_at("pos") == []
        start = T0 + 900.0
        assert h.engine.set_start_time(start) is True
        assert h.engine.set_start_time(start) is False  # the same value again: nothing new
        await h.clock.advance(200.0)
        assert h.processes.started_at("pos") == []  # the clock is not synchronised yet
        h.engine.set_clock_ready()
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("pos") == [start + 3.0]
        assert [e.data["source"] for e in h.of("start_time_set")] == ["host"]

    run(go())


def test_entry_output_exit_codes_and_a_missing_program_do_not_fail_the_vm(tmp_path: Path) -> None:
    sched = [
        {"start_time": -2, "executable": "no-such-program-xyz"},
        {"start_time": -1, "executable": "say"},
        {"start_time": 1, "executable": "bad"},
    ]

    async def go() -> None:
        script = {"no-such-program-xyz": (0.0, 127, b""), "say": (1.0, 0, b"hello"), "bad": (0.5, 3, b"")}
        h = Harness(tmp_path, sched, script, start_buffer=0.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        exited = {e.data["index"]: e.data for e in h.of("entry_exited")}
        assert exited[0]["exit_code"] == 127 and "was not found" in exited[0]["details"]
        assert exited[1]["status"] == "success" and exited[1]["duration"] == 1.0
        assert exited[2]["status"] == "error" and exited[2]["exit_code"] == 3
        out = h.of("output")
        assert [(o.data["index"], o.data["stream"], o.data["line"]) for o in out] == [(1, "stdout", "hello")]

    run(go())


def test_a_reboot_request_runs_the_command_then_a_restart_goes_on(tmp_path: Path) -> None:
    # the requester runs again after the reboot, as in the reference (it checks its own work)
    sched = [
        {"start_time": -20, "executable": "ask-reboot"},
        {"start_time": -10, "executable": "after-reboot"},
        {"start_time": 1, "executable": "pos"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"ask-reboot": (1.0, 10, b"")}, start_buffer=0.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        assert h.processes.reboots == [h.config.reboot_command]
        assert h.of("reboot_requested")[0].data["requesters"] == [0]
        assert h.processes.started_at("after-reboot") == []
        # the machine came back: a new engine on the same state dir goes on from the journal
        again = Harness(tmp_path, sched, {"ask-reboot": (1.0, 0, b"")}, clock=h.clock, start_buffer=0.0)
        await again.start()
        assert await again.finish() == EXIT_OK
        assert again.processes.started_at("ask-reboot") == [T0 + 1.0]
        assert again.processes.started_at("after-reboot") == [T0 + 2.0]
        assert again.processes.reboots == []

    run(go())


def test_a_restart_in_positive_time_fires_overdue_entries_once_and_never_reruns(tmp_path: Path) -> None:
    sched = [
        {"start_time": -1, "executable": "setup"},
        {"start_time": 1, "executable": "early"},
        {"start_time": 50, "executable": "late"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 10.0)
        h.engine.stop("test: agent killed")
        assert await h.stopped() == EXIT_OK
        await h.clock.advance_to(start + 100.0)  # the agent was down past the late entry's time
        again = Harness(tmp_path, sched, clock=h.clock, start_buffer=0.0)
        await again.start()
        assert await again.finish() == EXIT_OK
        assert again.journal.start_time == start  # the start time never changes
        assert again.processes.started_at("setup") == again.processes.started_at("early") == []
        assert again.processes.started_at("late") == [start + 100.0]
        late = next(e for e in again.of("entry_started") if e.data["index"] == 2)
        assert late.data["lateness"] == 50.0

    run(go())


def test_a_stop_interrupts_running_entries_and_they_run_again_after_restart(tmp_path: Path) -> None:
    sched = [{"start_time": -1, "executable": "long"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"long": (100.0, 0, b"")})
        await h.start()
        await h.clock.advance(5.0)
        h.engine.stop()
        assert await h.stopped() == EXIT_OK
        assert h.of("entry_interrupted")[0].data["index"] == 0
        assert h.types()[-1] == "agent_stopped"
        again = Harness(tmp_path, sched, {"long": (1.0, 0, b"")}, clock=h.clock)
        await again.start()
        assert await again.finish() == EXIT_OK
        assert again.processes.started_at("long") == [T0 + 5.0]

    run(go())


def test_data_that_cannot_be_placed_fails_the_vm_before_the_barrier(tmp_path: Path) -> None:
    sched = [
        {"start_time": -1, "executable": "x", "data": [{"filename": "missing-file", "location": "x"}]},
        {"start_time": 1, "executable": "pos"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, resources_dir=str(tmp_path))
        await h.start()
        assert await h.finish() == EXIT_FAILED
        assert h.of("vm_failed") and not h.of("configured")
        assert h.processes.started == []
        assert h.engine.phase == "failed"

    run(go())


def test_a_group_with_drops_fires_with_its_data_already_in_place(tmp_path: Path) -> None:
    """Prepare early, fire cheap: every drop is placed before anything runs, each
    entry's file is there when its process starts, and firing places nothing more."""
    script = "#!/bin/sh\necho hi\n"
    sched = [
        {"start_time": 3, "executable": f"run{i}.sh", "data": [{"location": f"run{i}.sh", "content": script,
                                                                "executable": True}]}
        for i in range(5)
    ]  # fmt: skip

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=2.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        start = await h.started()
        placed = h.of("data_placed")
        assert len(placed) == 5 and all(e.data["preloaded"] for e in placed)
        first_start = h.types().index("entry_started")
        assert all(h.events.index(e) < h.types().index("configured") for e in placed)
        assert "data_placed" not in h.types()[first_start:]
        for i in range(5):
            line = h.of("entry_started")[i].data["command"]
            assert h.processes.started_at(line) == [start + 3.0]
            assert f"run{i}.sh" in (h.processes.workdir_at_start[line] or [])

    run(go())


def test_a_data_only_entry_reports_its_end_and_is_journaled_done(tmp_path: Path) -> None:
    # launch_all journals every entry running before the start; a data-only entry has no
    # process: it must still end (entry_exited once, journal "done"), or a restart re-runs it
    target = tmp_path / "dropped.txt"
    sched = [
        {"start_time": -5, "data": [{"location": str(target), "content": "hello"}]},
        {"start_time": 3, "data": [{"location": str(tmp_path / "later.txt"), "content": "x"}]},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        assert await h.finish() == EXIT_OK
        exited = [e.data["index"] for e in h.of("entry_exited")]
        assert exited == [0, 1]
        assert h.journal.entry_state(0) == "done" and h.journal.entry_state(1) == "done"
        assert target.read_text() == "hello"

    run(go())


def test_a_stored_resume_reports_the_minus_inf_break_before_ending_it(tmp_path: Path) -> None:
    # `firewheel vm resume` stored a RESUME at -inf after a -inf break: the agent reports the
    # break, then the RESUME that ends it (never a RESUME of a break not reported yet); a
    # second stored RESUME finds no break and is ignored; a restart reports neither again
    sched = [
        {"start_time": -math.inf, "pause": True, "pause_duration": ".inf"},
        {"start_time": -5, "executable": "stage"},
        {"start_time": -math.inf, "data": [{"resume": True}]},
        {"start_time": -math.inf, "data": [{"resume": True}]},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched)
        await h.start()
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("stage") == [T0]
        held = [(e.type, e.data.get("index"), e.data.get("ended_break")) for e in h.events
                if e.type in ("break_started", "resume_received")]  # fmt: skip
        assert held == [("break_started", 0, None), ("resume_received", 2, 0), ("resume_received", 3, None)]
        assert h.of("resume_received")[1].data["ignored"] is True

    run(go())


def test_a_resume_stamped_after_a_break_its_timer_has_not_reached_reports_the_break_first(
    tmp_path: Path,
) -> None:
    # the host's clock is ahead of the agent's timers: a RESUME stamped t=15.5 ends the break at
    # 15 before the agent's timer for it fired; the break is reported first, and only once
    sched = [
        {"start_time": 15, "pause": True, "pause_duration": ".inf"},
        {"start_time": 30, "executable": "e2"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 14.9)
        assert h.engine.resume(at=15.5)["ended_break"] == 0
        assert await h.finish() == EXIT_OK
        assert h.processes.started_at("e2") == [start + 30.5]
        held = [(e.type, e.data.get("ended_break")) for e in h.events
                if e.type in ("break_started", "resume_received")]  # fmt: skip
        assert held == [("break_started", None), ("resume_received", 0)]

    run(go())
