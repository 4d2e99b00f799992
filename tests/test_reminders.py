"""The agent says what it waits for: reminders at the barrier and at a break, and a
warning at the default level when its channel is missing or the wrong kind of file."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from vmr_handler.agent.engine._reminders import AT_BARRIER, FIRST, MAX, Reminder

BARRIER = {"phase": AT_BARRIER, "configured_at": 1795490376.3, "blocked_by_break": None}
BREAK = {"phase": "positive", "blocked_by_break": 6}
RUNNING = {"phase": "positive", "blocked_by_break": None}


def test_barrier_reminders_back_off_and_reset() -> None:
    r = Reminder()
    assert r.check(BARRIER, 100.0) is None  # the wait begins
    assert r.check(BARRIER, 100.0 + FIRST - 0.1) is None
    text = r.check(BARRIER, 100.0 + FIRST)
    assert text is not None and text.startswith("still waiting at the experiment barrier after 10.0 s")
    assert "configured 2026-" in text and "vmr-host status" in text
    times = [t for t in range(111, 2000) if r.check(BARRIER, float(t))]
    gaps = [b - a for a, b in zip([110, *times], times)]
    assert gaps[:4] == [20, 40, 80, 160] and max(gaps) == MAX
    assert r.check(RUNNING, 2000.0) is None  # the start came: nothing to say, the clock resets
    assert r.check(BREAK, 2001.0) is None
    text = r.check(BREAK, 2001.0 + FIRST)
    assert text is not None and text.startswith("held at break #6 for 10.0 s: waiting for a RESUME")


def _run(port: str, tmp_path: Path, seconds: float) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler", "run", "--port", port, "--vm-name", "vm1",
         "--state-dir", str(tmp_path / "s"), "--launch-dir", str(tmp_path / "l")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(seconds)
    proc.terminate()
    _out, err = proc.communicate(timeout=30)
    return err


def test_a_wrong_or_missing_port_is_said_at_the_default_level(tmp_path: Path) -> None:
    regular = tmp_path / "not-a-device"
    regular.write_text("")
    err = _run(str(regular), tmp_path, 3.0)
    assert "WARNING" in err and f"channel {regular} cannot be used" in err, err
    assert "not a character device (use unix:PATH for a socket)" in err
    assert err.count("cannot be used") == 1, err  # said once, not at every retry
    err = _run(str(tmp_path / "missing"), tmp_path, FIRST + 2.5)
    assert "not there after 1" in err and "still trying" in err, err


def test_the_reminders_look_at_a_cheap_status_that_never_builds_a_plan(monkeypatch) -> None:
    """At the barrier the engine has no armed plan; building one for a big schedule every second
    would cost CPU while the agent only waits (idle CPU 0 %)."""
    from vmr_handler.agent.engine import engine as engine_mod

    class Holds:
        current = None

    class Timers:
        plan = None

    class Journal:
        start_time = None
        configured_at = 1795490376.3

    class FakeEngine:
        phase = AT_BARRIER
        holds, timers, journal = Holds(), Timers(), Journal()

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("waiting_status built a plan")

    monkeypatch.setattr(engine_mod, "build_plan", boom)
    status = engine_mod.Engine.waiting_status(FakeEngine())  # type: ignore[arg-type]
    assert status == {"phase": AT_BARRIER, "configured_at": 1795490376.3, "blocked_by_break": None}
    assert Reminder.situation(status) == ("barrier", 1795490376.3)
