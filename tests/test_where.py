"""``where``: the one text of where a VM is, read by ``vmr-host status``, its ``--json`` and the
console's rows (host/model/where.py), on the host's model of a VM fed real report shapes."""

from __future__ import annotations

from typing import Any

from vmr_handler.core.events import Event
from vmr_handler.host.model.stateword import Presence
from vmr_handler.host.model.vmstate import Untold, VmState
from vmr_handler.host.model.where import where

START = 1_800_000_000.0


def _state(*events: Any) -> VmState:
    state = VmState("vm1", "", None, Untold())
    for i, (at, kind, data) in enumerate(events):
        state.apply(Event(kind, START + at, f"e{i}", data), START + at)
    return state


TALKING = Presence(connected=True, ever=True)


def _where(state: VmState, now: float, presence: Presence = TALKING) -> str:
    return where(state, state.word(START, START + now, presence), START, START + now)


STAGE = (-12.0, "stage_started", {"stage": 1, "start_time": -10.0, "entries": [0]})
CONFIGURED = (-2.0, "configured", {"at": START - 2, "stages": 2})


def test_a_stage_then_configured_then_experiment_time() -> None:
    assert _where(_state(), -20) == "-"
    state = _state(STAGE)
    assert _where(state, -11) == "stage 1 (-10 s) running"
    finished = {"stage": 1, "start_time": -10.0, "duration": 9.0}
    state.apply(Event("stage_finished", START - 3, "f", finished), START - 3)
    assert _where(state, -3) == "stage 1 (-10 s) done"
    state.apply(Event("configured", START - 2, "c", {"at": START - 2}), START - 2)
    assert _where(state, -1.5) == "configured, start in 1.50 s"
    assert _where(state, 30.25) == "t=+30.2s"  # never a stage once in positive time


def test_holds_and_runs_in_experiment_time() -> None:
    state = _state(STAGE, CONFIGURED, (1.0, "entry_started", {"index": 4, "executable": "x"}))
    assert _where(state, 2) == "entry 4 running"
    state.apply(Event("break_started", START + 12, "b", {"index": 6, "at": 12.0}), START + 12)
    assert _where(state, 20) == "at break #6 since t=+12.0s"


def test_a_lost_vm_says_when_it_was_last_heard_not_now() -> None:
    state = _state(STAGE, CONFIGURED, (5.8, "entry_started", {"index": 2, "executable": "x"}))
    gone = Presence(connected=False, ever=True, gone_for=40.0, lost_after=30.0)
    assert _where(state, 60, gone) == "last heard t=+5.8s"


def test_failed_leaves_where_and_why_to_its_hint_and_complete_says_its_counts() -> None:
    state = _state(STAGE, (-11.0, "vm_failed", {"index": 0, "details": "entry 0 could not start"}))
    assert _where(state, -5) == "failed"
    done = _state(STAGE, CONFIGURED, (9.0, "schedule_complete", {"ran": 3, "exited_nonzero": 1}))
    assert _where(done, 10) == "complete (3 ran, 1 exited non-zero)"
