"""The host's folds of a break whose RESUME was reported before it (SPEC sections 4 and 8).

An agent older than the order "break, then the RESUME that ends it" reported a stored
``firewheel vm resume`` entry (``resume_received ended_break=0``) before ``break_started`` of
the ``-inf`` break it ended. Guest agents are frozen in images, so the host must not show that
VM held at break #0 for the whole run: neither its state (``status``, hints, console) nor the
timeline that ``schedule show`` and the report read. A break that comes later still holds.
"""

from __future__ import annotations

from typing import Any, Dict, List

from tests.hostfakes import FakeExperiment
from vmr_handler.core.events import Event
from vmr_handler.host.model.vmstate import VmState
from vmr_handler.host.report.fold import VmTimeline

T0 = 1_700_000_000.0
OLD_ORDER: List[Dict[str, Any]] = [
    {"type": "agent_started", "data": {"version": "0.0.9", "pid": 7, "resumed_from_journal": False}},
    {"type": "resume_received", "data": {"at": "-inf", "ended_break": 0, "ignored": False,
                                         "status": "success", "details": "ended break at entry 0",
                                         "index": 1, "origin": "schedule entry"}},
    {"type": "break_started", "data": {"index": 0, "at": "-inf", "details": "break at -inf"}},
    {"type": "break_started", "data": {"index": 4, "at": 20.0, "details": "schedule held until RESUME"}},
]  # fmt: skip


def _events() -> List[Event]:
    return [Event(e["type"], T0 + i, f"e{i}", e["data"]) for i, e in enumerate(OLD_ORDER)]


def test_the_vm_state_is_not_held_at_a_break_its_resume_already_ended() -> None:
    state = VmState("vm3", "d", "sched-1", FakeExperiment())  # type: ignore[arg-type]
    events = _events()
    for ev in events[:3]:
        state.apply(ev, ev.timestamp)
    assert state.at_break is None
    state.apply(events[3], events[3].timestamp)  # a later break holds as always
    assert state.at_break is not None and state.at_break["index"] == 4
    # a new agent without its journal: the same break holds again
    state.apply(Event("agent_started", T0 + 9, "e9", {"resumed_from_journal": False}), T0 + 9)
    state.apply(Event("break_started", T0 + 10, "e10", {"index": 0, "at": "-inf"}), T0 + 10)
    assert state.at_break is not None and state.at_break["index"] == 0


def test_the_timeline_draws_that_break_ended() -> None:
    timeline = VmTimeline("vm3")
    for i, ev in enumerate(_events()):
        timeline.add({"host_received": T0 + i, "event": ev.to_dict()})
    first, later = timeline.breaks
    assert first.index == 0 and first.end is not None  # schedule show: not "break since"
    assert later.index == 4 and later.end is None
    assert timeline.word(None) == "at_break"  # held at break #4 only
