"""Parts for unit tests of host sessions: a stand-in experiment and a session on real logs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from vmr_handler.core.events import Event
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.serve.config import Limits, VmSpec
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.session.api import HostEvents
from vmr_handler.host.serve.session.session import VmSession


class FakeExperiment:
    """The ``HostApi`` a ``VmSession`` or ``VmState`` asks: no start yet, no RESUMEs, no
    signing; records the VMs configured and the RESUME answers."""

    signs = False
    run_id = "run-fake"
    kpi_interval = 10.0
    default_timeout = None

    def __init__(self) -> None:
        self.configured: Dict[str, float] = {}
        self.answers: List[Tuple[str, Mapping[str, Any]]] = []
        self.outcomes: List[Tuple[str, str]] = []
        self.stored: List[Event] = []

    def start_event(self) -> Optional[Event]:
        return None

    def pending_resumes(self, vm: str) -> List[Event]:
        return []

    def sign_for(self, vm: str, event: Event) -> Event:
        return event

    def on_configured(self, vm: str, at: float) -> None:
        self.configured.setdefault(vm, at)

    def on_outcome(self, vm: str, outcome: str, details: Optional[str], at: float) -> None:
        self.outcomes.append((vm, outcome))

    def on_stored(self, vm: str, events: List[Event], received: float) -> None:
        self.stored.extend(events)

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        self.answers.append((resume_id, data))

    def host_entry(self, vm: str, rid: str, index: Optional[int], at: Optional[float]) -> Optional[str]:
        return "this host runs no on_host entries"


def make_session(logs: Path, schedule: bytes, limits: Limits) -> VmSession:
    """VM ``vm1``'s session with ``schedule`` (YAML bytes), its log and transfers in ``logs``
    (opened, the log replayed), a :class:`FakeExperiment`, no resources."""
    spec = VmSpec("vm1", str(logs / "vm1.yaml"), schedule, hashlib.sha256(schedule).hexdigest(), "yaml")
    vmlog = VmLog(str(logs), "vm1", limits.log_quota)
    transfers = TransferStore(str(logs), "vm1", limits.transfer_file, limits.transfer_total)
    session = VmSession(
        spec, True, limits, vmlog, transfers, ResourceStore(None), FakeExperiment(), HostEvents(), {}
    )
    transfers.open()
    vmlog.open(replay=session.apply)
    return session
