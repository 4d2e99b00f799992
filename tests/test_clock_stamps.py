"""Every event leaves the agent on the host's clock, also those stamped before the first
clock sync: :class:`~vmr_handler.agent.connected._stamps.PresyncStamps` on its own, then a real
host and a real agent whose clock is 5 s ahead (``--debug-clock-skew 5``)."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from tests.hostenv import HostEnv
from vmr_handler.agent.connected._stamps import PresyncStamps
from vmr_handler.core.clock import SystemClock
from vmr_handler.core.events import Event

SKEW = 5.0


def test_events_stamped_before_the_first_sync_are_corrected_by_its_offset() -> None:
    clock = SystemClock(skew=SKEW)
    stamps = PresyncStamps(clock)
    early = Event("agent_started", 1000.0 + SKEW, "a-1", {})
    stamps.note(early)
    assert stamps.event(early) is early  # not synced yet: nothing to correct with
    clock.offset = -SKEW  # what the first sync finds
    stamps.synced()
    late = Event("configured", 1001.0, "a-2", {})
    stamps.note(late)  # after the sync: stamped on the host's clock already
    assert stamps.event(early).timestamp == pytest.approx(1000.0)
    assert stamps.event(early).id == "a-1"
    assert stamps.event(late) is late
    raw = json.dumps(early.to_dict()).encode()
    ts, body = stamps.raw("a-1", (early.timestamp, raw))
    assert ts == pytest.approx(1000.0)
    assert json.loads(body) == {**early.to_dict(), "timestamp": ts}
    clock.offset = -SKEW + 0.25  # a later re-sync: the correction stays the first one's
    assert stamps.event(early).timestamp == pytest.approx(1000.0)
    stamps.forget("a-1")  # acknowledged: never sent again
    assert stamps.event(early) is early


@pytest.fixture
def env() -> Iterator[HostEnv]:
    made = HostEnv({"skewed": [{"start_time": 1, "executable": "/bin/true"}]}, start_buffer=1.0)
    yield made
    made.close()


def test_a_skewed_vm_reports_every_event_on_the_host_clock(env: HostEnv) -> None:
    env.start_host()
    env.start_agent("skewed", "--debug-clock-skew", str(SKEW))
    env.wait_event("skewed", "entry_exited", index=0)
    recs = env.events("skewed")
    kinds = {r["event"]["type"] for r in recs}
    # the answer to the schedule and the first reports are made before the first clock sync
    assert {"result", "agent_started", "schedule_loaded", "entry_started"} <= kinds, kinds
    for rec in recs:
        ahead = rec["event"]["timestamp"] - rec["host_received"]
        # on the guest's clock an event would be ~5 s ahead of the host receiving it; on the
        # host's clock it is stamped before it is received (held at most until the first sync)
        assert -2.0 < ahead < 1.0, (ahead, rec)
