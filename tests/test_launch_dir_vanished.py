"""The agent trusts the disk, not only its journal (SPEC section 5, last bullet): the real
``vmr-handler run --local`` whose launch dir an entry deletes (``rm -rf``, as FIREWHEEL's
repo-base tests end), and whose launch dir a "reboot" empties (a tmpfs): every later entry runs
in its working dir with its data, re-placed and reported so; a file an entry changed on purpose
is kept. The same with a real ``vmr-host serve`` and an appended batch: tests/test_host_vanished.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from tests.agent import Agent
from vmr_handler.core.schedule import load_schedule_bytes
from vmr_handler.core.schedule.commands import working_dirs


def _workdirs(schedule: List[Dict[str, Any]], launch: Path) -> Dict[int, str]:
    """The working dir of every entry, as the agent names them (pure: the schedule decides)."""
    return working_dirs(list(load_schedule_bytes(json.dumps(schedule).encode()).entries), str(launch))


def _schedule(launch: Path) -> List[Dict[str, Any]]:
    shared = launch / "shared" / "abs.txt"  # an absolute drop inside the launch dir
    sched: List[Dict[str, Any]] = [
        {"start_time": -30, "executable": "cat", "arguments": "early.txt",
         "data": [{"location": "early.txt", "content": "before the cleanup\n"}]},
        {"start_time": -20, "executable": "/bin/sh", "arguments": f"-c 'rm -rf {launch}'"},
        {"start_time": -15, "executable": "/bin/sh", "arguments": "-c true"},  # edits entry 4's file
        {"start_time": -10, "executable": "cat", "arguments": "neg.txt payload.bin",
         "data": [{"location": "neg.txt", "content": "negative data\n"},
                  {"location": "payload.bin", "filename": "payload.bin"}]},
        {"start_time": -5, "executable": "cat", "arguments": "kept.txt",
         "data": [{"location": "kept.txt", "content": "the schedule's version\n"}]},
        {"start_time": -5, "executable": "/bin/pwd"},  # no data: its dir is made before the spawn
        {"start_time": 0.3, "executable": "cat", "arguments": f"pos.txt {shared}",
         "data": [{"location": "pos.txt", "content": "positive data\n"},
                  {"location": str(shared), "content": "absolute data\n"}]},
        {"start_time": 0.3, "executable": "/bin/pwd"},
    ]  # fmt: skip
    kept = Path(_workdirs(sched, launch)[4]) / "kept.txt"
    sched[2]["arguments"] = f"-c 'mkdir -p {kept.parent} && echo edited on purpose > {kept}'"
    return sched


def _restored(agent: Agent) -> Dict[int, List[Dict[str, Any]]]:
    """``{entry index: its data_placed events with outcome restored}`` (entries with some)."""
    out: Dict[int, List[Dict[str, Any]]] = {}
    for e in agent.events("data_placed"):
        if e["data"]["outcome"] == "restored":
            out.setdefault(e["data"]["index"], []).append(e["data"])
    return out


def test_entries_after_rm_rf_of_the_launch_dir_run_with_their_data(tmp_path: Path, agents: list) -> None:
    launch = tmp_path / "launch"
    (tmp_path / "payload.bin").write_bytes(b"file drop\n")
    sched = _schedule(launch)
    dirs = _workdirs(sched, launch)
    a = Agent(tmp_path, sched, start_buffer=0.2)
    agents.append(a)
    assert a.run() == 0, a.log()
    assert not a.events("entry_failed"), a.events("entry_failed")
    exited = {i: e[0]["data"] for i, e in a.by_index("entry_exited").items()}
    assert sorted(exited) == list(range(8)) and all(x["status"] == "success" for x in exited.values())
    assert a.output_bytes(3) == b"negative data\nfile drop\n"
    assert a.output_bytes(4) == b"edited on purpose\n"  # changed by an entry: kept, not re-placed
    assert a.output_bytes(5) == dirs[5].encode() + b"\n"
    assert a.output_bytes(6) == b"positive data\nabsolute data\n"
    assert a.output_bytes(7) == dirs[7].encode() + b"\n"
    restored = _restored(a)
    assert sorted(p["location"] for p in restored[3]) == ["neg.txt", "payload.bin"]
    assert len(restored[6]) == 2 and 4 not in restored and 0 not in restored
    for placed in restored[3] + restored[6]:
        assert placed["preloaded"] is False and placed["size"] > 0 and len(placed["sha256"]) == 64
        assert "placed ahead of time" in placed["details"] and "gone since" in placed["details"]
        assert "deleted" in placed["details"]  # the same boot: not a reboot


def test_a_reboot_that_empties_the_launch_dir_rerun_requester_and_later_entries(
    tmp_path: Path, agents: list
) -> None:
    """The reboot command stands for a reboot that empties a tmpfs launch dir."""
    launch = tmp_path / "launch"
    runs = tmp_path / "requester.count"
    body = f"cat req.txt; echo x >> {runs}; if [ $(wc -l < {runs}) -eq 1 ]; then exit 10; fi"
    sched = [
        {"start_time": -10, "executable": "/bin/sh", "arguments": f"-c '{body}'",
         "data": [{"location": "req.txt", "content": "requester data\n"}]},
        {"start_time": -5, "executable": "cat", "arguments": "later.txt",
         "data": [{"location": "later.txt", "content": "later data\n"}]},
        {"start_time": 0.2, "executable": "cat", "arguments": "pos.txt",
         "data": [{"location": "pos.txt", "content": "positive data\n"}]},
    ]  # fmt: skip
    first = Agent(tmp_path, sched, start_buffer=0.1, extra=["--reboot-command", f"rm -rf {launch}"])
    agents.append(first)
    assert first.run() == 0, first.log()
    assert first.events("reboot_requested") and not launch.exists()
    second = Agent(tmp_path, sched, start_buffer=0.1)  # "after the reboot"
    second.report = tmp_path / "report2.jsonl"
    second.args[second.args.index("--report") + 1] = str(second.report)
    agents.append(second)
    assert second.run() == 0, second.log()
    assert not second.events("entry_failed"), second.events("entry_failed")
    assert runs.read_text().count("x") == 2
    assert second.output_bytes(0) == b"requester data\n"
    assert second.output_bytes(1) == b"later data\n"
    assert second.output_bytes(2) == b"positive data\n"
    assert sorted(_restored(second)) == [0, 1, 2]
