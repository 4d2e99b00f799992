"""Pure parts of the console: the events page reader on real files (cursors, filters,
tail, a line still being written, garbage and a monster line), the query parser's refusals, the
stream hub's bound on a client that stops reading, and the ``--console`` flags."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from vmr_handler.core.errors import InternalError, RequestRefused, UsageError
from vmr_handler.host.console import events as ev
from vmr_handler.host.console.options import console_options, experiment_name
from vmr_handler.host.console.stream import Hub, sse
from vmr_handler.host.console.views import changed_rows, sorted_rows
from vmr_handler.host.logs import jsonlread


def _rec(i: int, type_: str = "output", index: int = 1) -> bytes:
    doc = {
        "host_received": 1000.0 + i,
        "vm": "a",
        "event": {"type": type_, "timestamp": 1000.0 + i, "id": f"e{i}", "data": {"index": index}},
    }
    return (json.dumps(doc) + "\n").encode()


def _log(tmp_path: Path, lines: List[bytes]) -> str:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(lines))
    return str(path)


def test_pages_follow_cursors_and_skip_what_is_not_a_record(tmp_path: Path) -> None:
    lines = [
        _rec(0),
        b"not json\n",
        _rec(1, "entry_started"),
        b"[1,2]\n",
        _rec(2),
        _rec(3, index=2),
        b'{"cut":',
    ]
    path = _log(tmp_path, lines)
    seen: List[str] = []
    after = 0
    for _ in range(10):
        page = ev.page(path, ev.EventQuery(after=after, limit=1))
        seen += [e["event"]["id"] for e in page["events"]]
        assert page["next"] >= after
        after = page["next"]
        if not page["more"]:
            break
    assert seen == ["e0", "e1", "e2", "e3"]
    # the cut last line is not read, and the cursor stops before it
    assert after == sum(len(x) for x in lines[:-1])
    first = ev.page(path, ev.EventQuery(limit=10))["events"]
    assert [e["cursor"] for e in first] == [
        0,
        len(lines[0]) + len(lines[1]),
        sum(map(len, lines[:4])),
        sum(map(len, lines[:5])),
    ]
    # filters: a type, an entry, the last N
    assert [
        e["event"]["id"] for e in ev.page(path, ev.EventQuery(types=frozenset({"entry_started"})))["events"]
    ] == ["e1"]
    assert [e["event"]["id"] for e in ev.page(path, ev.EventQuery(entry=2))["events"]] == ["e3"]
    tail = ev.page(path, ev.EventQuery(limit=2, types=frozenset({"output"}), tail=True))
    assert [e["event"]["id"] for e in tail["events"]] == ["e2", "e3"] and tail["more"] is False


def test_a_monster_line_is_skipped_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonlread, "MAX_LINE", 200)
    path = _log(tmp_path, [_rec(0), b"x" * 1000 + b"\n", _rec(1)])
    assert [e["event"]["id"] for e in ev.page(path, ev.EventQuery())["events"]] == ["e0", "e1"]


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ({"limit": "-1"}, "limit='-1': expected a whole number"),
        ({"after": "x"}, "after='x'"),
        ({"entry": "1.5"}, "entry='1.5'"),
        ({"since": "1"}, "unknown query parameter(s): since"),
    ],
)
def test_bad_queries_are_named(query: Dict[str, str], text: str) -> None:
    with pytest.raises(RequestRefused, match=None) as err:
        ev.EventQuery.parse(query)
    assert text in str(err.value)


def test_query_limits() -> None:
    assert ev.EventQuery.parse({"limit": "100000"}).limit == ev.MAX_PAGE
    q = ev.EventQuery.parse({"tail": "5", "type": "output,entry_exited", "entry": "3"})
    assert q.tail and q.limit == 5 and q.types == {"output", "entry_exited"} and q.entry == 3


def test_a_client_that_stops_reading_is_dropped_once_not_grown() -> None:
    async def run() -> None:
        hub = Hub()
        slow = hub.subscribe([("experiment", {})])
        fast = hub.subscribe([])
        for i in range(slow.size + 50):
            hub.publish("vm_event", {"i": i})
            while fast.queue.qsize():
                fast.queue.get_nowait()
        assert slow.lagged and slow not in hub.subscribers and fast in hub.subscribers
        assert slow.queue.qsize() == slow.size + 1  # bounded: the last one is the end (None)
        items = [slow.queue.get_nowait() for _ in range(slow.size + 1)]
        assert items[0] == ("experiment", {}) and items[-1] is None
        assert await fast.get(0.01) == ("", None)  # a keepalive tick

    asyncio.run(run())


def test_sse_format() -> None:
    assert sse("vm", {"vm": "a"}) == b'event: vm\ndata: {"vm":"a"}\n\n'


def test_rows_sort_problems_first_and_diff() -> None:
    rows: List[Dict[str, Any]] = [
        {"vm": "b", "state": "complete", "problem": False},
        {"vm": "c", "state": "complete", "problem": True},
        {"vm": "a", "state": "running", "problem": False},
    ]
    assert [r["vm"] for r in sorted_rows(rows)] == ["c", "a", "b"]
    changed, last = changed_rows(rows, {})
    assert len(changed) == 3
    rows2 = [dict(rows[0], state="failed"), rows[1], rows[2]]
    changed, _ = changed_rows(rows2, last)
    assert [r["vm"] for r in changed] == ["b"]


def _args(**kw: Any) -> argparse.Namespace:
    base = {"console": None, "console_cert": None, "console_key": None, "name": None, "schedules": "/x/sch"}
    base.update(kw)
    return argparse.Namespace(**base)


def test_console_flags(tmp_path: Path) -> None:
    assert console_options(_args()) is None
    o = console_options(_args(console="8080"))
    assert o is not None and (o.host, o.port) == ("127.0.0.1", 8080)
    o = console_options(_args(console="[::1]:0"))
    assert o is not None and (o.host, o.port) == ("::1", 0)
    with pytest.raises(UsageError, match="--console-cert /nope: no such file"):
        console_options(_args(console="1", console_cert="/nope"))
    with pytest.raises(UsageError, match="port 0-65535"):
        console_options(_args(console="h:70000"))
    assert experiment_name(_args(), None) == "sch"
    assert experiment_name(_args(), "exp1") == "exp1"
    assert experiment_name(_args(name="Mine"), "exp1") == "Mine"


def test_live_timeline_folds_the_logs_then_holds_reports_while_a_thread_reads_it(tmp_path: Path) -> None:
    """The console's live timeline: the reports stored before it started are folded from the
    ``.jsonl`` once, the ones stored after are folded as they come; while a worker thread reads
    the timeline (a render), new reports wait and are folded (and streamed) right after."""
    import threading

    from tests.test_console_metrics import T0, Host
    from tests.test_payloads import _Link
    from vmr_handler.host.console.live import LiveExperiment
    from vmr_handler.host.serve.config import Limits

    h = Host(tmp_path, ["vm1"], Limits())
    assert h.sessions["vm1"].attach(_Link(), h.now)  # type: ignore[arg-type]
    h.report("vm1", "entry_started", index=1, start_time=1, scheduled=T0 + 1)
    h.report("vm1", "entry_exited", index=1, status="success", exit_code=0)

    async def run() -> None:
        live = LiveExperiment(h.experiment, "listen")
        await live.start()
        runs = live.timeline.vms["vm1"].runs
        assert [(r.index, r.status) for r in runs] == [(1, "success")]
        h.report("vm1", "entry_started", index=2, start_time=2, scheduled=T0 + 2)
        assert [r.index for r in live.timeline.vms["vm1"].runs] == [1, 2]
        sub = live.hub.subscribe([])
        gate, seen = threading.Event(), []

        def read(timeline: Any) -> int:
            assert gate.wait(30)
            seen.append(len(timeline.vms["vm1"].runs))
            return len(seen)

        task = asyncio.ensure_future(live.read_held(read))
        await asyncio.sleep(0.05)
        h.report("vm1", "entry_started", index=3, start_time=3, scheduled=T0 + 3)  # held
        assert [r.index for r in live.timeline.vms["vm1"].runs] == [1, 2] and sub.queue.qsize() == 0
        with pytest.raises(InternalError, match="already being read"):
            await live.read_held(read)
        gate.set()
        assert await task == 1 and seen == [2]
        assert [r.index for r in live.timeline.vms["vm1"].runs] == [1, 2, 3]
        kind, data = sub.queue.get_nowait()  # type: ignore[misc]
        assert kind == "vm_event" and data["event"]["data"]["index"] == 3 and data["next"] > 0
        await live.close()
        assert live.on_stored not in h.experiment.watchers

    asyncio.run(run())
