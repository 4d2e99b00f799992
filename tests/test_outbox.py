"""The outbox keeps every report until acked, across restarts and torn writes."""

from __future__ import annotations

import time

import pytest

from vmr_handler.agent.state.outbox import Outbox
from vmr_handler.core.errors import JournalError
from vmr_handler.core.events import EventFactory, EventType


def _events(n: int):
    f = EventFactory(time.time)
    return [f.make(EventType.OUTPUT, index=0, line=f"line {i}", blob="\x00\xff" * i) for i in range(n)]


def test_pending_until_acked_and_survives_restart(tmp_path):
    evs = _events(10)
    box = Outbox(str(tmp_path))
    for e in evs:
        box.add(e)
    box.ack([evs[0].id, evs[5].id, "unknown-id"])
    assert len(box) == 8
    box.close()
    again = Outbox(str(tmp_path))
    assert again.ids() == [e.id for i, e in enumerate(evs) if i not in (0, 5)]
    assert again.read(evs[9].id)["data"]["blob"] == "\x00\xff" * 9
    again.close()


@pytest.mark.faults
def test_torn_last_line_is_ignored(tmp_path):
    evs = _events(3)
    box = Outbox(str(tmp_path))
    for e in evs:
        box.add(e)
    box.close()
    with open(box.path, "ab") as fh:
        fh.write(b'{"e":{"timestamp":1,"type":"out')  # agent killed mid-write
    again = Outbox(str(tmp_path))
    assert again.ids() == [e.id for e in evs]
    extra = _events(1)[0]
    again.add(extra)  # appends after the torn line; still readable after another restart
    again.close()
    third = Outbox(str(tmp_path))
    assert third.ids()[-1] == extra.id and third.read(extra.id)["id"] == extra.id
    third.close()


def test_compaction_keeps_only_pending(tmp_path):
    evs = _events(50)
    box = Outbox(str(tmp_path))
    for e in evs:
        box.add(e)
    box.ack([e.id for e in evs[:45]])
    box.compact()
    assert box.ids() == [e.id for e in evs[45:]]
    assert all(box.read(e.id)["data"]["line"] == e.data["line"] for e in evs[45:])
    box.close()
    assert Outbox(str(tmp_path)).ids() == [e.id for e in evs[45:]]


@pytest.mark.faults
def test_a_full_disk_never_leaves_a_torn_record_to_send(full_disk):
    # tmpfs takes what fits of the last write and says nothing (a short write): the outbox cuts
    # it off again, so every pending record reads back whole, now and after a restart
    box = Outbox(str(full_disk))
    refused = 0
    added = []
    for e in _events(400):
        try:
            box.add(e)
            added.append(e.id)
        except JournalError as exc:
            refused += 1
            assert "outbox" in str(exc)
    assert refused and added
    assert box.ids() == added
    for ident in added:
        assert box.read(ident)["id"] == ident
    size = (full_disk / "outbox.log").stat().st_size
    assert (full_disk / "outbox.log").read_bytes().endswith(b"\n")
    box.close()
    again = Outbox(str(full_disk))
    assert again.ids() == added
    assert (full_disk / "outbox.log").stat().st_size == size


def test_acknowledged_reports_never_fill_a_small_state_dir(full_disk):
    # 64 KiB: without compaction below COMPACT_BYTES the acked records would fill it after ~200
    # reports and every later add would fail; compacting once the file outgrows the free space
    # keeps it small for as long as the host acknowledges
    box = Outbox(str(full_disk))
    f = EventFactory(time.time)
    evs = [f.make(EventType.OUTPUT, index=0, line=f"line {i}", pad="x" * 200) for i in range(1500)]
    for n, e in enumerate(evs):
        box.add(e)
        if n % 10 == 9:
            assert box.ack([x.id for x in evs[n - 9 : n + 1]]) == 10
    assert len(box) == 0
    assert (full_disk / "outbox.log").stat().st_size < 64 * 1024
    box.close()


def test_a_restart_counts_what_the_file_holds_acknowledged(tmp_path):
    box = Outbox(str(tmp_path))
    evs = _events(40)
    for e in evs:
        box.add(e)
    box.ack([e.id for e in evs[:30]])
    box.close()
    again = Outbox(str(tmp_path))
    size = (tmp_path / "outbox.log").stat().st_size
    assert again._acked_bytes * 2 > size  # known acked at once: compacted at the next ack
    again.compact()
    assert again.ids() == [e.id for e in evs[30:]]
    assert (tmp_path / "outbox.log").stat().st_size < size / 2
    again.close()
