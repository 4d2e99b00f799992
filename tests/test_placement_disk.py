"""DataPlacement checks the disk, not only the journal (SPEC section 5, last bullet), in a
tmp_path: data placed ahead of time that vanished is placed again and reported so; a file an
entry changed is kept; a missing working dir is made again (also for an entry without data);
a journal of the old format (``preloaded``: a list of entry indices) still loads and is checked
against the disk. The agent as a whole: tests/test_launch_dir_vanished.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from vmr_handler.agent.engine.placement import DataPlacement
from vmr_handler.agent.state.journal import JOURNAL_NAME, Journal
from vmr_handler.core.events import EventType
from vmr_handler.core.schedule import load_schedule_bytes
from vmr_handler.core.schedule.commands import working_dirs
from vmr_handler.core.schedule.model import Schedule

SCHEDULE: List[Dict[str, Any]] = [
    {"start_time": -10, "executable": "cat", "arguments": "a.txt b.txt",
     "data": [{"location": "a.txt", "content": "a\n"}, {"location": "b.txt", "content": "b\n"}]},
    {"start_time": -5, "executable": "/bin/pwd"},
    {"start_time": 5, "executable": "cat", "arguments": "p.txt",
     "data": [{"location": "p.txt", "content": "p\n"}]},
]  # fmt: skip

Events = List[Tuple[EventType, Dict[str, Any]]]


def _setup(tmp_path: Path) -> Tuple[Schedule, Dict[int, str], Journal]:
    schedule = load_schedule_bytes(json.dumps(SCHEDULE).encode())
    dirs = working_dirs(list(schedule.entries), str(tmp_path / "launch"))
    return schedule, dirs, Journal(str(tmp_path / "state"), schedule.digest)


def _placement(journal: Journal, dirs: Dict[int, str], tmp_path: Path, events: Events) -> DataPlacement:
    def emit(type_: EventType, **data: Any) -> None:
        events.append((type_, data))

    return DataPlacement(
        workdirs=dirs, resources_dir=str(tmp_path), emit=emit, journal=journal, now=time.time
    )


def _preloaded(tmp_path: Path) -> Tuple[Schedule, Dict[int, str], Journal, DataPlacement, Events]:
    schedule, dirs, journal = _setup(tmp_path)
    events: Events = []
    data = _placement(journal, dirs, tmp_path, events)
    assert asyncio.run(data.preload(list(schedule.entries), lambda i: False))
    journal.save()
    assert [d["outcome"] for _t, d in events] == ["placed"] * 3
    events.clear()
    return schedule, dirs, journal, data, events


def test_a_vanished_file_is_placed_again_and_a_changed_one_is_kept(tmp_path: Path) -> None:
    schedule, dirs, _journal, data, events = _preloaded(tmp_path)
    a, b = Path(dirs[0]) / "a.txt", Path(dirs[0]) / "b.txt"
    a.unlink()
    b.write_text("changed by an entry\n")
    data.ensure(schedule.entries[0])
    assert a.read_text() == "a\n" and b.read_text() == "changed by an entry\n"
    assert len(events) == 1
    kind, placed = events[0]
    assert kind is EventType.DATA_PLACED and placed["outcome"] == "restored" and placed["path"] == str(a)
    assert placed["preloaded"] is False and placed["size"] == 2
    assert "placed ahead of time" in placed["details"] and "gone since" in placed["details"]
    events.clear()
    data.ensure(schedule.entries[0])  # in place now: nothing more
    assert events == []


def test_missing_working_dirs_are_made_again(tmp_path: Path) -> None:
    schedule, dirs, _journal, data, events = _preloaded(tmp_path)
    shutil.rmtree(tmp_path / "launch")
    data.ensure(schedule.entries[1])  # no data at all: the dir is made before the spawn
    assert Path(dirs[1]).is_dir() and events == []
    data.ensure(schedule.entries[2])
    assert (Path(dirs[2]) / "p.txt").read_text() == "p\n"
    assert [(d["index"], d["outcome"]) for _t, d in events] == [(2, "restored")]


def test_a_restarted_agent_places_again_what_a_reboot_emptied(tmp_path: Path) -> None:
    schedule, dirs, journal, _data, _events = _preloaded(tmp_path)
    journal.close()
    shutil.rmtree(tmp_path / "launch")  # a tmpfs after a reboot
    again = Journal(str(tmp_path / "state"), schedule.digest)
    events: Events = []
    data = _placement(again, dirs, tmp_path, events)
    asyncio.run(data.preload(list(schedule.entries), lambda i: i == 2))  # entry 2 already ran
    assert (Path(dirs[0]) / "a.txt").read_text() == "a\n" and Path(dirs[1]).is_dir()
    assert not Path(dirs[2]).exists()
    assert sorted(d["path"] for _t, d in events if d["outcome"] == "restored") == [
        str(Path(dirs[0]) / "a.txt"), str(Path(dirs[0]) / "b.txt"),
    ]  # fmt: skip
    assert all(d["preloaded"] is True for _t, d in events)


def test_an_old_format_journal_is_checked_against_the_disk(tmp_path: Path) -> None:
    schedule, dirs, journal = _setup(tmp_path)
    journal.save()
    journal.close()
    old = json.loads((tmp_path / "state" / JOURNAL_NAME).read_text())
    old.pop("placed", None)
    old["preloaded"] = [0, 1, 2]  # the format before placements were recorded: indices only
    (tmp_path / "state" / JOURNAL_NAME).write_text(json.dumps(old))
    loaded = Journal(str(tmp_path / "state"), schedule.digest)
    assert loaded.resumed
    events: Events = []
    data = _placement(loaded, dirs, tmp_path, events)
    assert not asyncio.run(data.preload([], lambda i: False))
    Path(dirs[0]).mkdir(parents=True)
    (Path(dirs[0]) / "b.txt").write_text("b\n")  # still there: not reported again
    data.ensure(schedule.entries[0])
    data.ensure(schedule.entries[1])
    assert (Path(dirs[0]) / "a.txt").read_text() == "a\n" and Path(dirs[1]).is_dir()
    assert [(d["location"], d["outcome"]) for _t, d in events] == [("a.txt", "restored")]
    assert "earlier" in events[0][1]["details"]  # when and in which boot: not known
