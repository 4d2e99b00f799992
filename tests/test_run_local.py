"""Integration tests: the real ``vmr-handler run --local`` on real schedules with real processes.

Timing *semantics* are checked through the agent's own scheduled instants (``scheduled`` in
``entry_started`` = start + fire_at, exactly) and through event order, never by asserting
that something was fast.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.agent import Agent, cli


def _agent(agents: list, root: Path, schedule, **kw) -> Agent:
    a = Agent(root, schedule, **kw)
    agents.append(a)
    return a


def test_stages_run_in_order_entries_of_a_stage_overlap(tmp_path, agents):
    sched = [
        {"start_time": -10, "executable": "sleep", "arguments": "0.2"},
        {"start_time": -20, "executable": "sleep", "arguments": "0.6"},
        {"start_time": -20, "executable": "sleep", "arguments": "0.6"},
        {"start_time": -5, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0)
    assert a.run() == 0, a.log()
    started = {i: e[0]["timestamp"] for i, e in a.by_index("entry_started").items()}
    exited = {i: e[0]["timestamp"] for i, e in a.by_index("entry_exited").items()}
    # stage -20 (entries 1, 2) started together: both started before either ended
    assert max(started[1], started[2]) < min(exited[1], exited[2])
    # nothing of stage -10 before everything of -20 ended; -5 after -10
    assert started[0] >= max(exited[1], exited[2])
    assert started[3] >= exited[0]
    types = [e["type"] for e in a.events()]
    assert types.index("configured") > types.index("stage_finished")
    stages = [e["data"]["stage"] for e in a.events("stage_started")]
    assert stages == [0, 1, 2]


def test_positive_entries_fire_at_start_plus_t_and_do_not_wait(tmp_path, agents):
    sched = [
        {"start_time": 1, "executable": "sleep", "arguments": "2"},
        {"start_time": 1.5, "executable": "/bin/echo", "arguments": "second"},
        {"start_time": -1, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0.5)
    assert a.run() == 0, a.log()
    start = a.events("start_time_set")[0]["data"]["start_time"]
    configured = a.events("configured")[0]["data"]["at"]
    assert start == pytest.approx(configured + 0.5)
    st = {i: e[0] for i, e in a.by_index("entry_started").items()}
    assert st[0]["data"]["scheduled"] == pytest.approx(start + 1, abs=1e-6)
    assert st[1]["data"]["scheduled"] == pytest.approx(start + 1.5, abs=1e-6)
    for i in (0, 1):  # never early
        assert st[i]["timestamp"] >= st[i]["data"]["scheduled"] - 0.002
    # entry 1 started while entry 0 (sleep 2) was still running: no barrier in positive time
    exit0 = a.by_index("entry_exited")[0][0]["timestamp"]
    assert st[1]["timestamp"] < exit0
    assert a.events("schedule_complete")


def test_pause_shifts_later_entries(tmp_path, agents):
    sched = [
        {"start_time": 1, "executable": "/bin/true"},
        {"start_time": 1, "pause": True, "data": [{"pause_duration": 1.5}]},
        {"start_time": 2, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0.2)
    assert a.run() == 0, a.log()
    start = a.events("start_time_set")[0]["data"]["start_time"]
    st = {i: e[0]["data"]["scheduled"] - start for i, e in a.by_index("entry_started").items()}
    assert st[0] == pytest.approx(1.0, abs=1e-6)  # at exactly P: before the pause
    assert st[2] == pytest.approx(3.5, abs=1e-6)
    types = [e["type"] for e in a.events()]
    assert types.index("pause_started") < types.index("pause_ended")


def test_break_holds_until_vmr_handler_resume(tmp_path, agents):
    sched = [
        {"start_time": 0.5, "pause": True, "pause_duration": ".inf"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "after break"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0.2).start()
    a.wait_event("break_started")
    status = cli("status", "--state-dir", str(a.state))
    assert status.returncode == 0, status.stderr
    assert "held at break #0 until a RESUME" in status.stdout
    status_json = json.loads(cli("status", "--state-dir", str(a.state), "--json").stdout)
    assert status_json["result"]["blocked_by_break"] == 0
    assert not a.events("entry_started")
    res = cli("resume", "--state-dir", str(a.state))
    assert res.returncode == 0, res.stderr
    assert "ended the break at entry 0" in res.stdout
    assert a.wait() == 0, a.log()
    start = a.events("start_time_set")[0]["data"]["start_time"]
    resume = a.events("resume_received")[0]["data"]
    assert resume["ended_break"] == 0 and resume["ignored"] is False
    scheduled = a.events("entry_started")[0]["data"]["scheduled"]
    # later entries fire at t - P + R
    assert scheduled - start == pytest.approx(1 - 0.5 + resume["at"], abs=1e-6)


def test_resume_without_break_is_ignored_and_reported(tmp_path, agents):
    sched = [{"start_time": 1.5, "executable": "/bin/true"}]
    a = _agent(agents, tmp_path, sched, start_buffer=0.1).start()
    a.wait_event("start_time_set")
    res = cli("resume", "--state-dir", str(a.state))
    assert res.returncode == 0 and "ignored" in res.stdout
    assert a.wait() == 0
    assert a.events("resume_received")[0]["data"]["ignored"] is True


def test_break_at_minus_inf_holds_stages(tmp_path, agents):
    sched = [
        {"start_time": float("-inf"), "pause": True, "data": [{"pause_duration": float("inf")}]},
        {"start_time": -5, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0).start()
    a.wait_event("break_started")
    time.sleep(0.3)
    assert not a.events("stage_started")
    assert cli("resume", "--state-dir", str(a.state)).returncode == 0
    assert a.wait() == 0, a.log()
    assert a.events("stage_started")


def test_sigkill_then_restart_resumes_without_rerunning(tmp_path, agents):
    count_a = tmp_path / "a.count"
    count_b = tmp_path / "b.count"
    sched = [
        {"start_time": -10, "executable": "/bin/sh", "arguments": f"-c 'echo x >> {count_a}'"},
        # first run: hang; second run: finish at once
        {
            "start_time": -5,
            "executable": "/bin/sh",
            "arguments": f"-c 'echo x >> {count_b}; if [ $(wc -l < {count_b}) -eq 1 ]; then sleep 60; fi'",
        },
        {"start_time": 0.5, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0.1).start()
    started_b = a.wait_event("entry_started", index=1)
    orphan = started_b["data"]["pid"]
    a.kill()
    assert psutil.pid_exists(orphan)  # the entry outlived the agent
    b = _agent(agents, tmp_path, sched, start_buffer=0.1)
    b.report = tmp_path / "report2.jsonl"
    b.args[b.args.index("--report") + 1] = str(b.report)
    assert b.run() == 0, b.log()
    assert count_a.read_text().count("x") == 1  # finished entry never re-run
    assert count_b.read_text().count("x") == 2  # interrupted entry ran again
    interrupted = b.events("entry_interrupted")
    assert [e["data"]["index"] for e in interrupted] == [1]
    assert orphan in interrupted[0]["data"]["killed_pids"]
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    assert b.events("agent_started")[0]["data"]["resumed_from_journal"] is True
    assert b.events("schedule_complete")


def _reboot_schedule(tmp_path: Path, how: str) -> list:
    other = tmp_path / "other.count"
    runs = tmp_path / "requester.count"
    if how == "exit":
        body = f"echo x >> {runs}; if [ $(wc -l < {runs}) -eq 1 ]; then exit 10; fi"
    else:
        body = (
            f"echo x >> {runs}; test ! -e reboot || echo STALE; "
            f"if [ $(wc -l < {runs}) -eq 1 ]; then touch reboot; fi"
        )
    return [
        {"start_time": -10, "executable": "/bin/sh", "arguments": f"-c '{body}'"},
        {"start_time": -10, "executable": "/bin/sh", "arguments": f"-c 'echo x >> {other}'"},
        {"start_time": -5, "executable": "/bin/true"},
        {"start_time": 0.2, "executable": "/bin/true"},
    ]


@pytest.mark.parametrize("how", ["exit", "file"])
def test_reboot_request_reboots_then_only_requesters_run_again(tmp_path, agents, how):
    marker = tmp_path / "rebooted"
    sched = _reboot_schedule(tmp_path, how)
    extra = ["--reboot-command", f"touch {marker}"]
    a = _agent(agents, tmp_path, sched, start_buffer=0.1, extra=extra)
    assert a.run() == 0, a.log()
    assert marker.exists()
    req = a.events("reboot_requested")
    assert req and req[0]["data"]["requesters"] == [0]
    assert not a.events("configured") and not a.by_index("entry_started").get(2)
    # "after the reboot"
    b = _agent(agents, tmp_path, sched, start_buffer=0.1)
    b.report = tmp_path / "report2.jsonl"
    b.args[b.args.index("--report") + 1] = str(b.report)
    assert b.run() == 0, b.log()
    assert (tmp_path / "requester.count").read_text().count("x") == 2
    assert (tmp_path / "other.count").read_text().count("x") == 1
    assert sorted(b.by_index("entry_started")) == [0, 2, 3]
    assert b"STALE" not in b.output_bytes(0)
    assert not b.events("reboot_requested")
    assert b.events("schedule_complete")


def test_reboot_request_in_positive_time_is_only_reported(tmp_path, agents):
    marker = tmp_path / "rebooted"
    sched = [{"start_time": 0.2, "executable": "/bin/sh", "arguments": "-c 'exit 10'"}]
    a = _agent(agents, tmp_path, sched, start_buffer=0.1, extra=["--reboot-command", f"touch {marker}"])
    assert a.run() == 0
    assert not marker.exists()
    exited = a.events("entry_exited")[0]["data"]
    assert exited["reboot_requested"] is True and exited["exit_code"] == 10


def test_output_is_streamed_while_running_and_lossless(tmp_path, agents):
    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys, time\n"
        "o = sys.stdout.buffer\n"
        "o.write(b'first\\n'); o.flush(); time.sleep(1.0)\n"
        "o.write(b'\\xff\\xfe\\x00 not utf8\\n')\n"
        "o.write(b'42\\n')\n"
        'o.write(b\'{"type": "output", "id": 1}\\n\')\n'
        "o.write(b'x' * (10 * 1024 * 1024) + b'\\n')\n"
        "o.write(b'no newline at end')\n"
        "sys.stderr.write('err line\\n')\n"
    )
    import sys as _sys

    sched = [{"start_time": -1, "executable": _sys.executable, "arguments": str(script)}]
    a = _agent(agents, tmp_path, sched, start_buffer=0).start()
    first = a.wait_event("output", index=0)
    # the first line arrived while the program was still running
    assert not a.events("entry_exited")
    assert first["data"]["line"] == "first"
    assert a.wait() == 0, a.log()
    expected = (
        b"first\n\xff\xfe\x00 not utf8\n42\n"
        b'{"type": "output", "id": 1}\n' + b"x" * (10 * 1024 * 1024) + b"\nno newline at end"
    )
    assert a.output_bytes(0) == expected
    assert a.output_bytes(0, "stderr") == b"err line\n"
    # every report line is strict JSON with a unique id
    ids = [e["id"] for e in a.events()]
    assert len(ids) == len(set(ids))


def test_ignore_failure_goes_on(tmp_path, agents):
    sched = [
        {"start_time": -5, "executable": "no-such-program-xyz", "ignore_failure": True},
        {"start_time": -4, "data": [{"location": "/proc/vmr-no/x", "content": "y"}], "ignore_failure": True},
        {"start_time": -1, "executable": "/bin/sh", "arguments": "-c 'exit 3'"},
        {"start_time": 0.1, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0)
    assert a.run() == 0, a.log()
    failed = a.by_index("entry_failed")
    assert sorted(failed) == [1]  # a missing program is not a failure to place data: exit 127
    assert "/proc/vmr-no" in failed[1][0]["data"]["details"]
    assert a.by_index("entry_exited")[0][0]["data"]["exit_code"] == 127
    assert a.by_index("entry_exited")[2][0]["data"]["exit_code"] == 3  # non-zero exit: reported, goes on
    # the completion says what happened: an entry that could not start is not "success"
    done = a.events("schedule_complete")[0]["data"]
    assert (done["status"], done["ran"], done["exited_nonzero"], done["not_started"]) == ("error", 3, 2, 1)
    assert done["details"] == (
        "3 entries ran (2 exited non-zero), 1 could not start (see their entry_failed reports)"
    )


def test_unplaceable_data_fails_the_vm_and_names_the_location(tmp_path, agents):
    sched = [{"start_time": -4, "data": [{"location": "/proc/vmr-no/x", "content": "y"}]}]
    a = _agent(agents, tmp_path, sched, start_buffer=0)
    assert a.run() == 1
    assert "/proc/vmr-no/x" in a.events("vm_failed")[0]["data"]["details"]


def test_content_and_file_drops_with_modes_and_hashes(tmp_path, agents):
    import hashlib

    res = tmp_path / "res"
    res.mkdir()
    (res / "tool.sh").write_text("#!/bin/sh\necho tool $1\n")
    sched = [
        {
            "start_time": -5,
            "executable": "tool.sh",
            "arguments": "ran",
            "data": [
                {"location": "tool.sh", "filename": "tool.sh", "executable": True},
                {"location": "conf/a.txt", "content": "hello"},
            ],
        },
        {
            "start_time": -5,
            "executable": "tool.sh",
            "data": [{"location": "tool.sh", "filename": "tool.sh", "executable": True}],
        },
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0, extra=["--resources", str(res)])
    assert a.run() == 0, a.log()
    placed = a.events("data_placed")
    by_loc = {(e["data"]["index"], e["data"]["location"]): e["data"] for e in placed}
    tool = by_loc[(0, "tool.sh")]
    assert tool["sha256"] == hashlib.sha256((res / "tool.sh").read_bytes()).hexdigest()
    assert tool["mode"] == "0o755"
    conf = Path(by_loc[(0, "conf/a.txt")]["path"])
    assert conf.read_text() == "hello" and oct(conf.stat().st_mode & 0o777) == "0o644"
    assert conf == a.launch / "-5" / "tool.sh" / "conf" / "a.txt"
    # duplicate working dir gets _1
    assert Path(by_loc[(1, "tool.sh")]["path"]).parent == a.launch / "-5" / "tool.sh_1"
    assert a.output_bytes(0) == b"tool ran\n"


def test_resource_outside_store_is_refused(tmp_path, agents):
    res = tmp_path / "res"
    res.mkdir()
    (tmp_path / "secret").write_text("s")
    sched = [{"start_time": -1, "data": [{"location": "x", "filename": "../secret"}]}]
    a = _agent(agents, tmp_path, sched, start_buffer=0, extra=["--resources", str(res)])
    assert a.run() == 1
    assert "outside the resource directory" in a.events("vm_failed")[0]["data"]["details"]


def test_sigterm_stops_cleanly_and_kills_process_trees(tmp_path, agents):
    sched = [{"start_time": -1, "executable": "/bin/sh", "arguments": "-c 'sleep 60 & sleep 60; wait'"}]
    a = _agent(agents, tmp_path, sched, start_buffer=0).start()
    pid = a.wait_event("entry_started", index=0)["data"]["pid"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(psutil.Process(pid).children()) < 2:
        time.sleep(0.05)
    tree = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    assert len(tree) >= 3
    a.signal(signal.SIGTERM)
    assert a.wait() == 0
    assert a.events("agent_stopped")
    for p in tree:
        assert not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE
    journal = json.loads((a.state / "journal.json").read_text())
    assert journal["entries"]["0"]["state"] == "running"  # will run again after restart


def test_other_schedule_starts_fresh_journal_kept_aside(tmp_path, agents):
    a = _agent(agents, tmp_path, [{"start_time": -1, "executable": "/bin/true"}], start_buffer=0)
    assert a.run() == 0
    b = _agent(agents, tmp_path, [{"start_time": -2, "executable": "/bin/true"}], start_buffer=0)
    assert b.run() == 0
    reset = [e for e in b.events("journal_reset")]
    assert reset and Path(reset[0]["data"]["moved_to"]).exists()
    assert b.events("agent_started")[-1]["data"]["resumed_from_journal"] is False


def test_finished_schedule_rerun_runs_nothing_again(tmp_path, agents):
    count = tmp_path / "n"
    sched = [
        {"start_time": -1, "executable": "/bin/sh", "arguments": f"-c 'echo x >> {count}'"},
        {"start_time": 0.1, "executable": "/bin/sh", "arguments": f"-c 'echo y >> {count}'"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0)
    assert a.run() == 0
    assert a.run() == 0
    assert count.read_text() == "x\ny\n"


def test_hostile_pickle_is_refused_by_run(tmp_path, agents):
    marker = tmp_path / "pwned"
    payload = b"cposix\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    a = _agent(agents, tmp_path, payload)
    assert a.run() == 2
    assert not marker.exists()
    assert "posix.system" in a.log()


def test_minus_inf_pause_delays_stages_and_positive_entries(tmp_path, agents):
    sched = [
        {"start_time": float("-inf"), "pause": True, "data": [{"pause_duration": 1.0}]},
        {"start_time": -5, "executable": "/bin/true"},
        {"start_time": 0.5, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0.1)
    assert a.run() == 0, a.log()
    ev = a.events()
    types = [e["type"] for e in ev]
    assert types.index("pause_started") < types.index("pause_ended") < types.index("stage_started")
    began = a.events("pause_started")[0]["timestamp"]
    assert a.events("stage_started")[0]["timestamp"] >= began + 1.0 - 0.01
    start = a.events("start_time_set")[0]["data"]["start_time"]
    assert a.by_index("entry_started")[2][0]["data"]["scheduled"] == pytest.approx(start + 1.5, abs=1e-6)


def test_status_shows_active_positive_pause(tmp_path, agents):
    sched = [
        {"start_time": 0.2, "pause": True, "data": [{"pause_duration": 30}]},
        {"start_time": 1, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0.1).start()
    a.wait_event("pause_started")
    reply = json.loads(cli("status", "--state-dir", str(a.state), "--json").stdout)
    result = reply["result"]
    assert result["active_pause"]["kind"] == "pause" and result["active_pause"]["index"] == 0
    assert result["next_entries"][0]["index"] == 1
    assert result["next_entries"][0]["fire_at"] == pytest.approx(31)
    a.signal(signal.SIGTERM)
    assert a.wait() == 0


def test_restart_in_positive_time_fires_overdue_entries_once(tmp_path, agents):
    count = tmp_path / "n"
    sched = [
        {"start_time": 0.2, "executable": "/bin/sh", "arguments": f"-c 'echo a >> {count}'"},
        {"start_time": 0.3, "pause": True, "data": [{"pause_duration": 0.2}]},
        {"start_time": 3, "executable": "/bin/sh", "arguments": f"-c 'echo b >> {count}'"},
        {"start_time": 4, "executable": "/bin/sh", "arguments": f"-c 'echo c >> {count}'"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0.1).start()
    a.wait_event("pause_ended")
    a.kill()
    time.sleep(5.0)  # entries 2 and 3 (at 3.2 and 4.2 s) become overdue while the agent is down
    b = _agent(agents, tmp_path, sched, start_buffer=0.1)
    b.report = tmp_path / "report2.jsonl"
    b.args[b.args.index("--report") + 1] = str(b.report)
    assert b.run() == 0, b.log()
    assert sorted(count.read_text().split()) == ["a", "b", "c"]
    late = {e["data"]["index"]: e["data"]["lateness"] for e in b.events("entry_started")}
    assert sorted(late) == [2, 3] and all(v > 0.5 for v in late.values()), late
    assert not b.events("pause_started")  # already reported before the crash
    start_a = a.events("start_time_set")[0]["data"]["start_time"]
    assert b.events("start_time_set")[0]["data"]["start_time"] == start_a  # never changes



def test_disk_full_drop_fails_clearly_and_keeps_what_was_done(tmp_path, agents, full_disk):
    sched = [
        {"start_time": -2, "executable": "/bin/echo", "arguments": "done before"},
        {"start_time": -1, "data": [{"location": str(full_disk / "big.bin"), "content": "x" * 200_000}]},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0)
    assert a.run() == 1
    details = a.events("vm_failed")[0]["data"]["details"]
    assert str(full_disk / "big.bin") in details and "No space left on device" in details
    assert not list(full_disk.iterdir())  # no partial file left behind
    journal = json.loads((a.state / "journal.json").read_text())
    assert journal["entries"]["0"]["state"] == "done"  # what was done is kept


def test_status_names_a_future_break_as_next(tmp_path, agents):
    """At the barrier a break still in the future is the *next* break, not one that holds the
    VM, and a RESUME before it is ignored (SPEC section 4); times are readable."""
    sched = [
        {"start_time": -1, "executable": "/bin/true"},
        {"start_time": 1.5, "pause": True, "data": [{"pause_duration": float("inf")}]},
        {"start_time": 2, "executable": "/bin/true"},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=30.0).start()
    a.wait_event("start_time_set")
    status = cli("status", "--state-dir", str(a.state))
    assert status.returncode == 0, status.stderr
    assert "held at break" not in status.stdout, status.stdout
    assert "next break: entry 1 (held there until a RESUME; one before it is ignored)" in status.stdout
    # the rule it states: a RESUME with no active break is ignored; the break still comes
    early = cli("resume", "--state-dir", str(a.state))
    assert early.returncode == 0 and "ignored: no active break" in early.stdout, early.stdout
    status = cli("status", "--state-dir", str(a.state))
    assert "next break: entry 1" in status.stdout, status.stdout
    assert re.search(r"experiment start: \S+Z \(in \d", status.stdout), status.stdout
    assert not re.search(r"\d\.\d{4,}", status.stdout), status.stdout
    result = json.loads(cli("status", "--state-dir", str(a.state), "--json").stdout)["result"]
    assert result["blocked_by_break"] is None and result["next_break"] == 1
    a.signal(signal.SIGTERM)
    assert a.wait() == 0


def test_an_entry_ended_by_the_agents_stop_reports_the_signal(tmp_path, agents):
    """The tree killer must not reap the entry's process itself (psutil's wait would take its
    exit status from asyncio, which then reported 255 and logged "exit status already read")."""
    sched = [{"start_time": -5, "executable": "/bin/sleep", "arguments": str(300 + i)} for i in range(6)]
    a = _agent(agents, tmp_path, sched, start_buffer=60).start()
    a.wait_for(lambda evs: sum(e["type"] == "entry_started" for e in evs) == 6)
    a.signal(signal.SIGTERM)
    assert a.wait() == 0
    for rec in a.events("entry_interrupted"):
        assert rec["data"]["signal"] == signal.SIGTERM and rec["data"]["exit_code"] is None, rec
    assert len(a.events("entry_interrupted")) == 6
    assert "already read" not in a.log()  # was there in about 1 run of 3 with one entry


def test_status_wait_after_a_finished_local_run_answers_like_cloud_init(tmp_path, agents):
    """``vmr-handler status --wait`` once the run has ended (no agent answers): how it ended,
    from the state directory, exit 0 complete / 1 failed, like ``cloud-init status --wait``."""
    for sub in ("ok", "bad"):
        (tmp_path / sub).mkdir()
    ok = _agent(agents, tmp_path / "ok", [{"start_time": -1, "executable": "/bin/true"}], start_buffer=0)
    assert ok.run() == 0, ok.log()
    for args in (["status", "--wait"], ["status"]):
        res = cli(*args, "--state-dir", str(ok.state))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "phase: complete" in res.stdout, res.stdout
        assert "no agent runs; its last run ended at 20" in res.stderr, res.stderr
    as_json = json.loads(cli("status", "--wait", "--json", "--state-dir", str(ok.state)).stdout)
    assert as_json["result"]["phase"] == "complete"

    unplaceable = [{"start_time": -4, "data": [{"location": "/proc/vmr-no/x", "content": "y"}]}]
    bad = _agent(agents, tmp_path / "bad", unplaceable, start_buffer=0)
    assert bad.run() == 1
    res = cli("status", "--wait", "--state-dir", str(bad.state))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "phase: failed" in res.stdout and "/proc/vmr-no/x" in res.stdout, res.stdout

    # a state directory where no run ended: still an error, as before
    nothing = cli("status", "--wait", "--state-dir", str(tmp_path / "none"))
    assert nothing.returncode == 1 and "no running vmr-handler" in nothing.stderr, nothing.stderr


def test_default_timeout_bounds_entries_without_their_own(tmp_path, agents):
    sched = [
        {"start_time": -2, "executable": "sleep", "arguments": "1000"},
        {"start_time": -1, "executable": "sleep", "arguments": "1000", "timeout": 0.3},
    ]
    a = _agent(agents, tmp_path, sched, start_buffer=0, extra=["--default-timeout", "0.5"])
    assert a.run() == 0, a.log()
    ends = {i: e[0]["data"] for i, e in a.by_index("entry_exited").items()}
    assert (ends[0]["timeout"], ends[1]["timeout"]) == (0.5, 0.3)
    assert ends[0]["details"] == "timed out after 0.5 s (SIGTERM)" and ends[0]["ended_by"] == "timeout"
    assert "timed out after 0.5 s (SIGTERM)" in a.log()


def test_entries_start_with_default_signals_when_the_agent_ignores_them(tmp_path):
    """An agent started with SIGHUP ignored (``nohup``, some service managers): its entries still
    die of SIGHUP (an ignored signal is inherited across exec; ``vmr-host kill --signal HUP``)."""
    sched = [{"start_time": -1, "executable": "/bin/sh", "arguments": "-c 'kill -HUP $$; echo survived'"}]
    a = Agent(tmp_path, sched, start_buffer=0)
    with open(tmp_path / "agent.log", "ab") as log:
        a.proc = subprocess.Popen(
            [sys.executable, "-m", "vmr_handler", *a.args], stdout=log, stderr=log,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        )  # fmt: skip
    assert a.wait() == 0, a.log()
    (exited,) = a.by_index("entry_exited")[0]
    assert exited["data"]["signal"] == signal.SIGHUP, exited  # not "survived", exit 0
