"""An agent killed while its reports are held loses none of them (done means reported).

Real agents, real processes, a real 2 MiB tmpfs as the state dir (the ``full_disk`` fixture;
root needed, as in CI). Two entries stream their output while the state dir is full: the
reports are held in the agent's memory (the outbox, or the ``--report`` file, refuses them),
the entries end, and the agent is killed with SIGKILL before space returns. Once space is
back the agent is started again: every line of every entry reaches the host (or the report
file) at least once, and the schedule completes.

An entry is journaled done only once its reports are on disk, so the restart finds it still
running, reports it interrupted and runs it again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, List, Set

import pytest

from tests.agent import Agent
from tests.hostenv import HostEnv, fill

pytestmark = pytest.mark.faults

#: lines each entry prints once the state dir is full (far more than the outbox's last page takes)
LINES = 1000
ENTRIES = 2
WAIT = 60.0


@pytest.fixture(autouse=True)
def _release_entries(request):
    """After each test, entries a failed run left behind (the killed agent's children) end
    instead of waiting for ``FULL`` forever."""
    yield
    full = request.node.funcargs.get("full_disk")
    if full is not None:
        (Path(full).parent / "FULL").touch()


def _schedule(flags: Path) -> List[dict]:
    """Entries that print ``e<k>-line-1..LINES`` once ``flags/FULL`` exists, then say they ended."""
    sched = []
    for k in range(ENTRIES):
        script = (
            f"while [ ! -e {flags}/FULL ]; do sleep 0.05; done; "
            f"i=1; while [ $i -le {LINES} ]; do echo e{k}-line-$i; i=$((i+1)); done; "
            f"touch {flags}/ended-{k}"
        )
        sched.append({"start_time": 0.5, "executable": "/bin/sh", "arguments": f"-c '{script}'"})
    return sched


def _missing(lines: Iterable[str]) -> Set[str]:
    """The expected lines that are not in ``lines`` (a re-run repeats some: a set is compared)."""
    expected = {f"e{k}-line-{i}" for k in range(ENTRIES) for i in range(1, LINES + 1)}
    return expected - set(lines)


def _wait(pred, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _entries_ended_with_reports_held(flags: Path, log) -> None:
    """Wait until both entries' processes ended while the agent holds reports, then give the
    agent a moment to handle the ends (the old agent journaled them done here)."""
    _wait(lambda: all((flags / f"ended-{k}").exists() for k in range(ENTRIES)), "the entries to end")
    _wait(lambda: "holding them in memory" in log(), "the agent holding reports")
    time.sleep(1.0)


@pytest.mark.parametrize("full_disk", ["2m"], indirect=True)
def test_a_kill_while_reports_are_held_reruns_the_entries_and_loses_no_line(full_disk):
    flags = Path(full_disk).parent  # beside the tmpfs, on the normal disk
    state = str(full_disk / "state")
    env = HostEnv({"a": _schedule(flags)}, start_buffer=0.5)
    try:
        env.start_host()
        agent = env.start_agent("a", "--state-dir", state)
        for k in range(ENTRIES):
            env.wait_event("a", "entry_started", index=k)
        filler = fill(full_disk)
        (flags / "FULL").touch()
        _entries_ended_with_reports_held(flags, lambda: env.agent_log("a"))
        assert len(env.events("a", "output")) < ENTRIES * LINES  # really held, not sent
        agent.kill()  # SIGKILL: what is only in memory is gone
        agent.wait(timeout=WAIT)
        filler.unlink()  # space is back
        agent = env.start_agent("a", "--state-dir", state)
        env.wait_event("a", "schedule_complete")
        lines = [r["event"]["data"].get("line", "") for r in env.events("a", "output")]
        assert not _missing(lines), f"{len(_missing(lines))} lines lost"
        interrupted = env.events("a", "entry_interrupted")
        assert {r["event"]["data"]["index"] for r in interrupted} == set(range(ENTRIES))
        assert all("not on disk yet" in r["event"]["data"]["details"] for r in interrupted)
        assert agent.poll() is None
    finally:
        env.close()


@pytest.mark.parametrize("full_disk", ["2m"], indirect=True)
def test_local_mode_a_kill_while_the_report_file_is_full_reruns_the_entries(full_disk, agents):
    flags = Path(full_disk).parent
    root = flags / "local"
    root.mkdir()
    report = full_disk / "report.jsonl"  # on the full disk too
    extra = ["--state-dir", str(full_disk / "state"), "--report", str(report)]
    first = Agent(root, _schedule(flags), start_buffer=0.5, extra=extra)
    first.report = report
    agents.append(first.start())
    for k in range(ENTRIES):
        first.wait_event("entry_started", index=k)
    filler = fill(full_disk)
    (flags / "FULL").touch()
    _entries_ended_with_reports_held(flags, first.log)
    first.kill()
    filler.unlink()
    again = Agent(root, _schedule(flags), start_buffer=0.5, extra=extra)
    again.report = report
    agents.append(again)
    assert again.run() == 0, again.log()[-3000:]
    lines = [e["data"].get("line", "") for e in again.events("output")]
    assert not _missing(lines), f"{len(_missing(lines))} lines lost"
    assert again.events("schedule_complete")
    interrupted = again.events("entry_interrupted")
    assert {e["data"]["index"] for e in interrupted} == set(range(ENTRIES))
    assert all("not on disk yet" in e["data"]["details"] for e in interrupted)
