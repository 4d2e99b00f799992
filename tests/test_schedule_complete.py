"""What the host makes of ``schedule_complete``'s counts: the VM's status, its checkpoint, the
hint that sends an operator to the entries that could not start."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from vmr_handler.core.events import Event
from vmr_handler.host.cli.statustext import format_status, hints
from vmr_handler.host.model.vmstate import VmState
from vmr_handler.host.model.where import where


class _Host:
    def __init__(self) -> None:
        self.outcomes: List[str] = []

    def on_configured(self, vm: str, at: float) -> None:
        pass

    def on_resume_answer(self, *args: Any) -> None:
        pass

    def on_outcome(self, vm: str, outcome: str, details: Optional[str], at: float) -> None:
        self.outcomes.append(outcome)


def _complete(data: Dict[str, Any]) -> VmState:
    vm = VmState("vm1", "d" * 64, "sched-1", _Host())  # type: ignore[arg-type]
    vm.apply(Event(timestamp=1.0, type="schedule_complete", id="e1", data=data), 2.0)
    return vm


def _status(vm: VmState) -> Dict[str, Any]:
    row = {"vm": "vm1", "state": "complete", "connected": True, "expected": True, "max_lateness": None,
           "frames": {"malformed": 0, "oversize": 0}, "refused": {}, "last_seen": 2.0, "failures": 0,
           "stage": None, **vm.fields(), "where": where(vm, "complete", 1.0, 3.0)}  # fmt: skip
    exp = {"start_time": 1.0, "waiting_for": [], "expected": ["vm1"], "configured": ["vm1"],
           "excluded": [], "released": []}  # fmt: skip
    return {"now": 3.0, "experiment": exp, "vms": [row]}


def test_counts_reach_the_status_and_a_vm_with_entries_that_could_not_start_gets_a_hint() -> None:
    vm = _complete({"status": "error", "ran": 3, "exited_nonzero": 2, "not_started": 1, "details": "x"})
    assert vm.fields()["completion"] == {"status": "error", "ran": 3, "exited_nonzero": 2, "not_started": 1}
    result = _status(vm)
    assert "complete (3 ran, 2 exited non-zero, 1 could not start)" in format_status(result)
    assert hints(result) == ["vm1 completed, but 1 entry could not start; see why: vmr-host logs vm1"]


def test_a_clean_completion_has_no_hint_and_an_older_agent_shows_plain_complete() -> None:
    clean = _status(_complete({"status": "success", "ran": 2, "exited_nonzero": 0, "not_started": 0}))
    assert "complete (2 ran)" in format_status(clean) and hints(clean) == []
    old = _status(_complete({"status": "success"}))
    assert old["vms"][0]["completion"]["ran"] is None
    assert hints(old) == [] and "complete (" not in format_status(old)


def test_the_counts_survive_the_checkpoint_and_an_older_checkpoint_still_loads() -> None:
    vm = _complete({"status": "error", "ran": 1, "exited_nonzero": 0, "not_started": 4})
    snap = vm.snapshot()
    again = VmState("vm1", "d" * 64, "sched-1", _Host())  # type: ignore[arg-type]
    again.restore(snap)
    assert again.completion == vm.completion
    del snap["completion"]  # a checkpoint written before the counts existed
    again.restore(snap)
    assert again.completion is None and again.complete
