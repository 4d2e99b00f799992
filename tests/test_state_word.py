"""One truth about every VM on a fake clock: the one state word
(:mod:`vmr_handler.host.model.stateword`) that every view reads, ``lost`` exactly at
``lost_after`` (not before) and recovered when the agent talks again, a completed VM given a
break at that break, and one failed drop counted once in every view.

A real :class:`~vmr_handler.host.serve.experiment.experiment.Experiment` and real
:class:`~vmr_handler.host.serve.session.session.VmSession`\\ s on a
:class:`~vmr_handler.core.clock.FakeClock` (``tests/test_host_clock.py``'s ``Host``); the views
are read the way the control socket, the console and ``/metrics`` read them.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Dict, List

from prometheus_client.parser import text_string_to_metric_families

from tests.test_host_clock import T0, Host, KeptLink
from vmr_handler.core.events import Event
from vmr_handler.host.cli._offline import offline_status
from vmr_handler.host.cli._waiting import progress
from vmr_handler.host.cli.statustext import any_failed, format_status, keep
from vmr_handler.host.console.metrics import ConsoleMetrics
from vmr_handler.host.console.views import all_rows, experiment_view, timeline_end, timeline_ends
from vmr_handler.host.logs.jsonlread import records_from
from vmr_handler.host.model.stateword import STATES, Presence, finished, state_word
from vmr_handler.host.report.fold import ExperimentTimeline
from vmr_handler.host.report.render import timeline_fragment
from vmr_handler.host.serve.config import Limits

#: silence and loss far apart, heartbeats never due
LIMITS = Limits(heartbeat=1000.0, silent_after=15.0, lost_after=30.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def status(host: Host) -> Dict[str, Any]:
    """What the control socket's ``status`` answers now (its ``vms`` and ``experiment``)."""
    now = host.clock.time()
    start = host.experiment.barrier.start_time
    return {
        "now": now,
        "experiment": host.experiment.barrier_status(now),
        "resumes": [],
        "vms": [s.status(start, now) for s in host.sessions.values()],
    }


def vm_status(host: Host, vm: str = "vm1") -> Dict[str, Any]:
    return next(v for v in status(host)["vms"] if v["vm"] == vm)


def word(host: Host, vm: str = "vm1") -> str:
    return str(vm_status(host, vm)["state"])


def configured(host: Host, vm: str = "vm1") -> KeptLink:
    """``vm`` connects, says hello and is configured now."""
    link = host.connect(vm)
    host.hello(vm)
    host.agent_says(vm, "configured", at=host.clock.time())
    return link


# ---------------------------------------------------------------------------- lost
def test_a_disconnected_agent_is_lost_exactly_at_lost_after_and_recovers_when_back(tmp_path: Path) -> None:
    host = Host(tmp_path, limits=LIMITS)
    s = host.sessions["vm1"]

    async def main() -> None:
        link = configured(host)
        await host.clock.advance(20.0)  # past the start (+10 s): running
        host.agent_says("vm1", "entry_started", index=3, start_time=5, lateness=0.001)
        heard = host.clock.time()
        await host.clock.advance(1.0)
        s.detach(link, host.clock.time(), "closed by peer")  # kill -9: the socket ends
        await host.clock.advance(29.999)
        assert word(host) == "running"
        await host.clock.advance(0.001)
        lost = vm_status(host)
        assert lost["state"] == "lost" and lost["problem"] and lost["gone_for"] == 30.0
        assert lost["last_seen"] == heard and lost["lost_after"] == 30.0
        # every view says it: status text (a problem, with the hint), exit code, filters
        result = status(host)
        text = format_status(result)
        assert "1 VM(s): 1 lost" in text
        hint = [line for line in text.splitlines() if line.startswith("vm1 is lost:")]
        assert len(hint) == 1 and "(t=+10.0s)" in hint[0] and "gone for 30.0 s" in hint[0], text
        assert "vmr-host logs vm1" in hint[0]
        assert "check the VM's console and the agent's service (vmr-handler)" in hint[0]
        assert any_failed(result) and keep(lost, ["lost"], []) and not keep(lost, ["running"], [])
        # waited for, never given up on (it may come back)
        assert progress(result, "complete", ["vm1"]) == ([], ["vm1"], [])
        # the console's rows and counts, REST ?problems=1
        rows = all_rows(host.experiment, host.clock.time())
        assert [(r["vm"], r["state"], r["problem"]) for r in rows] == [("vm1", "lost", True)]
        view = experiment_view(host.experiment, "listen", rows, host.clock.time())
        assert view["counts"] == {"lost": 1} and view["problems"] == 1 and view["states"] == list(STATES)
        # the agent comes back: no longer lost
        host.connect()
        assert word(host) == "running" and vm_status(host)["gone_for"] is None

    run(main())


def test_a_connected_agent_is_lost_once_silent_for_lost_after_and_a_frame_recovers_it(tmp_path: Path) -> None:
    host = Host(tmp_path, limits=LIMITS)

    async def main() -> None:
        configured(host)
        await host.clock.advance(14.999)
        assert word(host) == "running" and vm_status(host)["gone_for"] is None  # not silent yet
        await host.clock.advance(0.001)
        assert vm_status(host)["gone_for"] == 15.0 and word(host) == "running"  # silent, not lost
        await host.clock.advance(14.999)
        assert word(host) == "running"
        await host.clock.advance(0.001)
        assert word(host) == "lost"
        host.agent_says("vm1", "heartbeat")
        assert word(host) == "running"

    run(main())


def test_below_silent_after_a_connected_agent_is_lost_when_it_is_silent(tmp_path: Path) -> None:
    """``--lost-after`` below ``silent_after``: a connected agent between two heartbeats is not lost."""
    host = Host(tmp_path, limits=Limits(heartbeat=1000.0, silent_after=15.0, lost_after=2.0))

    async def main() -> None:
        link = configured(host)
        await host.clock.advance(14.999)
        assert word(host) == "running"
        await host.clock.advance(0.001)
        assert word(host) == "lost"
        host.agent_says("vm1", "heartbeat")
        host.sessions["vm1"].detach(link, host.clock.time())
        await host.clock.advance(1.999)
        assert word(host) == "running"
        await host.clock.advance(0.001)
        assert word(host) == "lost"

    run(main())


def test_a_vm_never_heard_from_is_waiting_never_lost(tmp_path: Path) -> None:
    host = Host(tmp_path, ("vm1", "vm2"), limits=LIMITS)
    run(host.clock.advance(1000.0))
    assert word(host, "vm1") == word(host, "vm2") == "not_seen"
    assert not vm_status(host)["problem"] and vm_status(host)["gone_for"] == 1000.0


def test_a_complete_or_failed_vm_is_never_lost(tmp_path: Path) -> None:
    host = Host(tmp_path, ("vm1", "vm2"), limits=LIMITS)

    async def main() -> None:
        a, b = configured(host, "vm1"), configured(host, "vm2")
        await host.clock.advance(11.0)
        host.agent_says("vm1", "schedule_complete", status="success", ran=1, exited_nonzero=0, not_started=0)
        host.agent_says("vm2", "vm_failed", details="gave up", index=None)
        host.sessions["vm1"].detach(a, host.clock.time())
        host.sessions["vm2"].detach(b, host.clock.time())
        await host.clock.advance(1000.0)
        assert (word(host, "vm1"), word(host, "vm2")) == ("complete", "failed")

    run(main())


def test_a_vm_heard_from_before_a_host_restart_is_lost_lost_after_after_the_start(tmp_path: Path) -> None:
    first = Host(tmp_path, limits=LIMITS)
    configured(first)
    for s in first.sessions.values():
        s.log.close()
    host = Host(tmp_path, limits=LIMITS)  # the logs replayed: heard from, not connected
    run(host.clock.advance(29.0))
    assert word(host) == "running"  # the start (configured + 10 s) was kept
    run(host.clock.advance(1.0))
    assert word(host) == "lost"


def test_status_from_the_logs_never_says_lost(tmp_path: Path) -> None:
    host = Host(tmp_path, limits=LIMITS)
    configured(host)
    for s in host.sessions.values():
        s.log.close()
    offline = offline_status(str(tmp_path), now=T0 + 10_000)
    assert [(v["vm"], v["state"], v["gone_for"]) for v in offline["vms"]] == [("vm1", "running", None)]


def test_the_word_is_lost_only_while_neither_complete_nor_failed() -> None:
    class Reports:
        failed = None
        schedule_state = "accepted"
        at_break: Any = None
        paused = None
        complete = False
        configured_at = None
        stage = None

    gone = Presence(False, True, 30.0, 30.0)
    r = Reports()
    assert state_word(r, None, T0, Presence(False, False, 99.0)) == "schedule_accepted"  # never heard
    assert state_word(r, None, T0, Presence(False, True, 29.9)) == "schedule_accepted"
    assert state_word(r, None, T0, gone) == "lost"
    r.complete = True
    assert state_word(r, None, T0, gone) == "complete"
    r.at_break = {"index": 10}  # a break appended after it completed: at it, so lost
    assert state_word(r, None, T0, Presence(True, True)) == "at_break"
    assert state_word(r, None, T0, gone) == "lost"


# ---------------------------------------------------------------------------- a completed VM given a break
def test_a_completed_vm_given_a_break_is_at_the_break_in_every_view(tmp_path: Path) -> None:
    host = Host(tmp_path, ("vm1", "vm2"), limits=LIMITS)

    async def main() -> None:
        configured(host, "vm1")
        configured(host, "vm2")
        await host.clock.advance(11.0)
        host.agent_says("vm2", "schedule_complete", status="success", ran=1, exited_nonzero=0, not_started=0)
        assert word(host, "vm2") == "complete"
        host.agent_says("vm2", "break_started", index=10, at=12.0)  # schedule add vm2 FILE: a break

    run(main())
    result = status(host)
    vm2 = vm_status(host, "vm2")
    assert vm2["state"] == "at_break"
    row = next(line for line in format_status(result).splitlines() if line.startswith("vm2 "))
    assert "at_break" in row and "complete" not in row, row
    assert progress(result, "at-break", ["vm2"]) == (["vm2"], [], [])
    assert progress(result, "complete", ["vm2"]) == ([], ["vm2"], [])
    assert keep(vm2, ["at-break"], []) and not keep(vm2, ["complete"], [])
    assert any("waiting for RESUME: vm2 (break #10" in line for line in format_status(result).splitlines())
    rows = {r["vm"]: r["state"] for r in all_rows(host.experiment, host.clock.time())}
    assert rows == {"vm1": "running", "vm2": "at_break"}


# ---------------------------------------------------------------------------- a failure counted once
def test_one_failed_drop_is_one_failed_entry_in_every_view(tmp_path: Path) -> None:
    host = Host(tmp_path, limits=LIMITS)
    metrics = ConsoleMetrics(host.experiment)
    stored: List[Event] = []

    def watcher(vm: str, events: List[Event], received: float) -> None:
        stored.extend(events)
        for ev in events:
            metrics.observe(vm, ev, received)

    host.experiment.watchers.append(watcher)

    async def main() -> None:
        configured(host)
        await host.clock.advance(11.0)
        host.agent_says("vm1", "entry_started", index=4, start_time=1, lateness=0.0, executable=None)
        host.agent_says("vm1", "entry_failed", index=4, details="drop tool.bin: sha256 mismatch")
        host.agent_says("vm1", "vm_failed", index=4, details="entry 4: drop tool.bin failed")

    run(main())
    vm = vm_status(host)
    assert vm["state"] == "failed" and vm["failures"] == 1 and vm["failed_entry"] == 4
    row = next(line for line in format_status(status(host)).splitlines() if line.startswith("vm1 "))
    assert re.search(r"ago\s+\S+ ms\s+1\s*$", row), row  # the FAILURES column
    assert all_rows(host.experiment, host.clock.time())[0]["failures"] == 1
    body, _kind = metrics.render()
    families = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
    failures = {s.labels["vm"]: s.value for s in families["vmr_vm_failures"].samples}
    runs = {s.labels["status"]: s.value for s in families["vmr_entry_runs"].samples}
    assert failures == {"vm1": 1.0} and runs["failed"] == 1.0 and runs["error"] == 0.0
    timeline = ExperimentTimeline()
    for _offset, _end, record in records_from(str(tmp_path / "vm1.jsonl"), 0):
        timeline.add(record)
    assert timeline.vm("vm1").failures == 1
    assert offline_status(str(tmp_path), now=host.clock.time())["vms"][0]["failures"] == 1


# ---------------------------------------------------------------------------- the console's timeline
def test_a_finished_experiments_timeline_ends_at_its_end_not_now(tmp_path: Path) -> None:
    host = Host(tmp_path, ("vm1", "vm2", "vm3"), limits=LIMITS)

    async def main() -> None:
        configured(host, "vm1")
        configured(host, "vm2")
        host.experiment.release(["vm3"])  # never seen, excluded: it does not count
        await host.clock.advance(11.0)
        now = host.clock.time()
        assert timeline_end(host.experiment, now) == now  # running: open spans drawn up to now
        host.agent_says("vm1", "schedule_complete", status="success", ran=1, exited_nonzero=0, not_started=0)
        assert timeline_end(host.experiment, now) == now  # vm2 still runs
        host.agent_says("vm2", "vm_failed", details="gave up", index=None)
        await host.clock.advance(500.0)
        assert timeline_end(host.experiment, host.clock.time()) is None  # up to its last event

    run(main())
    assert finished([("complete", True), ("not_seen", False)]) and not finished([("not_seen", True)])
    assert not finished([]) and not finished([("complete", True), ("lost", True)])


def test_a_lost_vms_running_entry_is_drawn_up_to_when_its_agent_was_last_heard_from(tmp_path: Path) -> None:
    host = Host(tmp_path, ("vm1", "vm2"), limits=LIMITS)

    async def main() -> None:
        links = {vm: configured(host, vm) for vm in ("vm1", "vm2")}
        await host.clock.advance(11.0)
        for vm in ("vm1", "vm2"):
            host.agent_says(vm, "entry_started", index=1, start_time=1, lateness=0.0, executable="/bin/sleep")
        await host.clock.advance(5.0)
        host.sessions["vm1"].detach(links["vm1"], host.clock.time())  # killed: lost 30 s later
        await host.clock.advance(100.0)
        host.agent_says("vm2", "heartbeat")  # vm2 lives on

    run(main())
    now = host.clock.time()
    heard = host.sessions["vm1"].state.last_seen
    assert heard == T0 + 11.0 and timeline_ends(host.experiment, now) == {"vm1": heard}
    timeline = ExperimentTimeline()
    for vm in ("vm1", "vm2"):
        for _offset, _end, record in records_from(str(tmp_path / f"{vm}.jsonl"), 0):
            timeline.add(record)
    state = host.experiment.state_dict()
    html = timeline_fragment(timeline, state, now, None, timeline_ends(host.experiment, now))
    origin = float(re.search(r'data-origin="([^"]+)"', html).group(1))  # type: ignore[union-attr]

    def run_end(vm: str) -> float:
        lane = html[html.index(f'<div class="tl-lane" data-vm="{vm}"') :]
        return float(re.search(r'<rect [^>]*class="e-[^"]*"[^>]*data-e="([^"]+)"', lane).group(1))  # type: ignore[union-attr]

    assert run_end("vm1") == heard - origin  # lost: up to its last frame, not now
    assert run_end("vm2") == now - origin  # alive: still running now


def test_an_entry_the_operator_killed_is_not_a_failed_entry() -> None:
    """``vmr-host kill``: its ``entry_exited`` (``status: killed``, ``ended_by: operator``, ended
    by a signal) is a killed run, not a failure, and the host knows how the entry ended."""
    from vmr_handler.core.payloads import EntryExited
    from vmr_handler.host.model.stateword import FAILED_RUNS
    from vmr_handler.host.model.vmstate import run_status

    data = {"index": 2, "exit_code": None, "signal": 15, "status": "killed", "ended_by": "operator",
            "details": "killed by operator (SIGTERM)"}  # fmt: skip
    assert run_status(EntryExited.parse(data)) == "killed" not in FAILED_RUNS
    crashed = {**data, "status": None, "ended_by": None, "details": "killed by signal 15"}
    assert run_status(EntryExited.parse(crashed)) == "error"

    from tests.hostfakes import FakeExperiment
    from vmr_handler.core.events import Event
    from vmr_handler.host.model.vmstate import VmState

    state = VmState("vm1", "d", "sched-1", FakeExperiment())  # type: ignore[arg-type]
    state.apply(Event("entry_started", 1.0, "e1", {"index": 2}), 2.0)
    assert state.running == {2: 2.0} and state.ended == {}
    state.apply(Event("entry_exited", 3.0, "e2", data), 4.0)
    state.apply(Event("entry_exited", 3.0, "e3", {**crashed, "index": 3}), 4.0)
    assert state.failures == 1 and state.running == {}
    assert state.ended == {2: ("killed by operator (SIGTERM)", "killed"), 3: ("killed by signal 15", "error")}
    assert state.fields()["phase"]["killed"] == {"2": "killed by operator (SIGTERM)"}
    again = VmState("vm1", "d", "sched-1", FakeExperiment())  # type: ignore[arg-type]
    again.restore(state.snapshot())  # the restart checkpoint keeps how entries ended
    assert again.ended == state.ended
