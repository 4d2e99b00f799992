"""A full state dir in the guest loses no report, real processes.

``vmr-host serve`` and a real ``vmr-handler run`` agent whose state dir is a 64 KiB tmpfs
(the ``full_disk`` fixture; CI runs as root). The disk is filled while an entry writes its
output: the reports are held in the agent's memory, the agent stays up, and once space
returns every line reaches the host exactly once, in order. Also: an entry whose reports
cannot be written waits on its pipe (back-pressure) instead of its output piling up.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import List, Optional

import psutil
import pytest

from tests.hostenv import HostEnv, fill
from vmr_handler.agent.machine.executor import ProcessRunner

pytestmark = pytest.mark.faults


LINES = 300



def test_a_full_state_dir_holds_reports_until_space_returns(full_disk):
    flags = Path(full_disk).parent  # beside the tmpfs, on the normal disk
    script = (
        f"while [ ! -e {flags}/FULL ]; do sleep 0.05; done; "
        f"i=0; while [ $i -lt {LINES} ]; do echo line-$i; i=$((i+1)); done; "
        f"while [ ! -e {flags}/GO ]; do sleep 0.05; done"
    )
    sched = [{"start_time": 0.5, "executable": "/bin/sh", "arguments": f"-c '{script}'"}]
    env = HostEnv({"a": sched}, start_buffer=0.5)
    try:
        env.start_host()
        agent = env.start_agent("a", "--state-dir", str(full_disk / "state"))
        env.wait_event("a", "entry_started", index=0)
        filler = fill(full_disk)
        (flags / "FULL").touch()
        env.wait_for(lambda: "holding them in memory" in env.agent_log("a"), "the agent holding reports")
        time.sleep(1.0)  # the entry's output is made now, with nowhere to write it
        assert agent.poll() is None, env.agent_log("a")
        assert len(env.events("a", "output")) < LINES  # not all out yet: really held
        filler.unlink()  # space returns: the agent recovers by itself
        (flags / "GO").touch()
        env.wait_event("a", "schedule_complete")
        outputs = [r["event"]["data"] for r in env.events("a", "output")]
        assert [d["line"] for d in outputs] == [f"line-{i}" for i in range(LINES)]  # once, in order
        assert [d["seq"] for d in outputs] == list(range(1, LINES + 1))
        assert "written again" in env.agent_log("a")
        assert env.events("a", "entry_exited")[0]["event"]["data"]["status"] == "success"
        assert not env.events("a", "vm_failed")
        assert agent.poll() is None  # it never exited
    finally:
        env.close()


def test_output_waits_on_its_pipe_while_reports_cannot_be_written(tmp_path):
    async def go() -> None:
        loop = asyncio.get_running_loop()
        gate: asyncio.Future[None] = loop.create_future()
        lines: List[bytes] = []

        def on_output(
            stream: str, piece: bytes, continued: bool, eol: bool
        ) -> Optional[asyncio.Future[None]]:
            lines.append(piece)
            return None if gate.done() else gate  # the hold is full until the gate opens

        runner = ProcessRunner(on_output)
        pid = await runner.start(["seq", "1", "200000"], str(tmp_path))  # ~1.3 MB: > a pipe
        await asyncio.sleep(1.0)
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # blocked writing, not ended
        assert 0 < len(lines) < 200_000 // 4  # only what was read before the wait
        gate.set_result(None)
        result = await asyncio.wait_for(runner.wait(), 60)
        assert result.exit_code == 0
        assert lines == [str(i).encode() for i in range(1, 200_001)]

    asyncio.run(go())


def test_a_journal_on_a_full_disk_keeps_entry_changes_until_it_can_save(full_disk, caplog):
    # an entry that ends while the state dir is full must not fail the VM: its change is kept
    # in memory (no later append, which could replay without it) and saved with the next snapshot
    from vmr_handler.agent.state.journal import Journal

    journal = Journal(str(full_disk), "d" * 64)
    journal.save()
    journal.mark_running(0, 1234, 1.0)
    filler = fill(full_disk)
    marked = 0
    with caplog.at_level("ERROR"):
        while not journal.behind and marked < 1000:  # the log's last page takes a few more lines
            marked += 1
            journal.mark_running(marked, 2000 + marked, 2.0)
        journal.mark_done(0)  # after the failure: kept in memory only
    assert journal.behind and journal.entry_state(0) == "done"
    assert sum("kept in memory" in r.getMessage() for r in caplog.records) == 1  # once, not per change
    filler.unlink()
    journal.sync()  # what SyncSoon does (retrying every second while it fails)
    assert not journal.behind
    journal.close()
    again = Journal(str(full_disk), "d" * 64)
    assert again.entry_state(0) == "done"
    assert all(again.entry_state(i) == "running" for i in range(1, marked + 1))
    again.close()


def test_a_transfer_out_waits_for_space_and_arrives_whole(full_disk):
    """A transfer-out chunk that cannot be written to the outbox (full state dir) is held and
    retried, not dropped with the transfer task: the file arrives whole once space
    returns, and the agent stays up."""
    import os as _os

    payload = _os.urandom(10 * 1024)
    src = Path(full_disk).parent / "results.bin"  # on the normal disk
    src.write_bytes(payload)
    sched = [{"start_time": 2, "data": [{"location": str(src), "interval": None}]}]
    env = HostEnv({"a": sched}, start_buffer=1.0)
    try:
        env.start_host()
        agent = env.start_agent("a", "--state-dir", str(full_disk / "state"))
        env.wait_event("a", "experiment_started")
        filler = fill(full_disk)
        env.wait_for(lambda: "waits for space in the state dir" in env.agent_log("a"), "the transfer waiting")
        time.sleep(0.5)
        assert agent.poll() is None, env.agent_log("a")
        copy = env.logs / "transfers" / "a" / str(src).lstrip("/")
        assert not copy.exists()
        filler.unlink()
        env.wait_for(lambda: copy.exists() and copy.read_bytes() == payload, "the transferred file, whole")
        assert "goes on" in env.agent_log("a")
        assert agent.poll() is None
    finally:
        env.close()
