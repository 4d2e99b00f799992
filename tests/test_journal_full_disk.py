"""The engine when its journal snapshot cannot be written (a full state dir).

Before: the first snapshot that failed (a stage finished, the VM configured, a reboot asked for)
raised out of the engine and the agent exited 1: a full guest disk ended the VM's run. Now the
engine waits (retrying every ``JOURNAL_RETRY`` seconds) before any step that must not be
repeated, keeps a RESUME or a start time in memory (saved in the background), and goes on by
itself once space returns. On a fake clock with a real journal whose writes fail with ENOSPC
while ``Full.on`` (the real-disk case, a filled tmpfs, is in tests/test_outbox_full_disk.py).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from pathlib import Path
from typing import Any, Coroutine

import pytest

from tests.enginefakes import T0, Harness
from vmr_handler.agent.engine.engine import EXIT_OK
from vmr_handler.agent.state import journal as journal_module
from vmr_handler.core.errors import JournalError

pytestmark = pytest.mark.faults


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run one test body on a fresh event loop."""
    asyncio.run(coro)


class Full:
    """Makes the journal's atomic snapshot fail with ENOSPC while :attr:`on`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
        self.on = False
        self.refused = 0
        real = journal_module.atomic_write

        def atomic_write(path: str, data: bytes) -> None:
            if self.on:
                self.refused += 1
                raise OSError(code, os.strerror(code))
            real(path, data)

        monkeypatch.setattr(journal_module, "atomic_write", atomic_write)


def on_disk(h: Harness) -> dict[str, Any]:
    """The journal snapshot as a restarted agent would read it."""
    data: dict[str, Any] = json.loads(Path(h.journal.path).read_text())
    return data


def test_a_stage_that_ends_on_a_full_disk_waits_and_the_next_stage_runs_once_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    full = Full(monkeypatch)
    sched = [
        {"start_time": -20, "executable": "first"},
        {"start_time": -10, "executable": "second"},
        {"start_time": 1, "executable": "pos"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"first": (2.0, 0, b"")}, start_buffer=0.0)
        await h.start()
        full.on = True
        await h.clock.advance(2.0)  # "first" ends: its stage cannot be saved as done
        await h.clock.advance(30.0)  # the engine waits (retrying), it does not fail
        assert h.task is not None and not h.task.done()
        assert h.processes.started_at("second") == []  # nothing after the unsaved step
        assert on_disk(h)["stages_done"] == []
        assert full.refused >= 30  # retried about once a second
        full.on = False
        assert await h.finish() == EXIT_OK
        assert on_disk(h)["stages_done"] == [0, 1]
        assert h.processes.started_at("first") == [T0]  # never run twice
        assert len(h.processes.started_at("second")) == 1
        assert h.of("schedule_complete")

    with caplog.at_level("ERROR"):
        run(go())
    said = [r.getMessage() for r in caplog.records if "cannot write journal" in r.getMessage()]
    assert len(said) == 1, said  # one cause, said once for the whole episode
    assert "free space in the state dir" in said[0]


def test_a_reboot_is_not_carried_out_before_the_request_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = Full(monkeypatch)
    sched = [{"start_time": -20, "executable": "ask-reboot"}, {"start_time": -10, "executable": "after"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"ask-reboot": (1.0, 10, b"")}, start_buffer=0.0)
        await h.start()
        full.on = True
        await h.clock.advance(20.0)
        assert h.processes.reboots == []  # rebooting now would run the stage again after it
        full.on = False
        assert await h.finish() == EXIT_OK
        assert h.processes.reboots == [h.config.reboot_command]
        assert on_disk(h)["reboot"] == {"stage": 0, "requesters": [0]}

    run(go())


def test_a_stop_while_waiting_for_the_disk_ends_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = Full(monkeypatch)
    sched = [{"start_time": -20, "executable": "first"}, {"start_time": -10, "executable": "second"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"first": (1.0, 0, b"")}, start_buffer=0.0)
        await h.start()
        full.on = True
        await h.clock.advance(5.0)
        h.engine.stop("test")
        assert await h.stopped() == EXIT_OK
        assert h.of("agent_stopped")
        assert h.processes.started_at("second") == []

    run(go())


def test_a_resume_on_a_full_disk_applies_at_once_and_is_saved_when_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = Full(monkeypatch)
    sched = [
        {"start_time": 10, "pause": True, "pause_duration": ".inf"},
        {"start_time": 20, "executable": "after"},
        {"start_time": 1000, "executable": "last"},
    ]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 50.0)
        full.on = True
        outcome = h.engine.resume(resume_id="r1")
        assert outcome["ended_break"] == 0  # the host's RESUME is not refused for a full disk
        assert on_disk(h)["resumes"] == []
        await h.clock.advance(10.0)
        assert h.processes.started_at("after") == [start + 60.0]  # the VM goes on meanwhile
        full.on = False
        # saved in the background (a real-time retry every JOURNAL_RETRY s), with the RESUME's id
        await h.until(lambda: not h.journal.behind, real_timeout=3 * journal_module.JOURNAL_RETRY + 2)
        assert on_disk(h)["resumes"] == [50.0]
        assert h.engine.resume(resume_id="r1")["repeated"] is True
        assert await h.finish() == EXIT_OK

    run(go())


def test_the_schedule_completes_only_once_the_journal_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "after" ran; were the agent to exit with that only in memory, a restart would run it again
    full = Full(monkeypatch)
    sched = [{"start_time": 1, "executable": "after"}, {"start_time": 5, "executable": "last"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, start_buffer=0.0)
        await h.start()
        start = await h.started()
        await h.clock.advance_to(start + 2.0)
        full.on = True
        await h.clock.advance(20.0)
        assert h.processes.started_at("last") == [start + 5.0]
        assert not h.of("schedule_complete") and h.task is not None and not h.task.done()
        full.on = False
        assert await h.finish() == EXIT_OK
        assert h.of("schedule_complete")
        assert on_disk(h)["entries"]["1"]["state"] == "done"

    run(go())


def test_a_read_only_state_dir_still_fails_the_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # only what waiting can cure is waited out (ENOSPC, EDQUOT, EIO): a read-only file system
    # is a configuration error, said at once (exit 1 from the CLI), not an agent hanging
    full = Full(monkeypatch, errno.EROFS)
    sched = [{"start_time": -20, "executable": "first"}, {"start_time": -10, "executable": "second"}]

    async def go() -> None:
        h = Harness(tmp_path, sched, {"first": (1.0, 0, b"")}, start_buffer=0.0)
        await h.start()
        full.on = True
        with pytest.raises(JournalError, match="Read-only file system"):
            await h.finish()
        assert full.refused >= 1 and h.processes.started_at("second") == []

    with caplog.at_level("ERROR"):
        run(go())
    said = [r.getMessage() for r in caplog.records if "cannot write journal" in r.getMessage()]
    assert len(said) == 1 and "make the state dir writable" in said[0]
