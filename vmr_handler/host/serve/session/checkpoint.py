"""A VM session's restart checkpoint: what replaying its ``.jsonl`` gave, saved and taken back
(:class:`~vmr_handler.host.logs.store.Checkpoint`), and :class:`ToldHost`, which remembers
what the experiment must be told again from it."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from vmr_handler.core.errors import SavedStateError
from vmr_handler.host.model.vmstate import Counters, VmState
from vmr_handler.host.serve.session.api import HostApi

#: RESUME answers a restart checkpoint keeps per VM (one per RESUME issued to it)
MAX_ANSWERS = 1000


class ToldHost:
    """The experiment as a VM's reports tell it things (:class:`ReportHost`), remembering what
    a restart checkpoint must tell it again: the last outcome and the answers to RESUMEs
    still pending (at most :data:`MAX_ANSWERS`).

    Args:
        host: the experiment.
    """

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.outcome: Optional[Tuple[str, Optional[str], float]] = None
        self.answers: List[Tuple[str, Dict[str, Any], float]] = []

    def on_configured(self, vm: str, at: float) -> None:
        """Forwarded."""
        self.host.on_configured(vm, at)

    def on_outcome(self, vm: str, outcome: str, details: Optional[str], at: float) -> None:
        """Forwarded and remembered."""
        self.outcome = (outcome, details, at)
        self.host.on_outcome(vm, outcome, details, at)

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        """Forwarded; remembered when it answers a RESUME still pending for ``vm``."""
        if len(self.answers) < MAX_ANSWERS and any(r.id == resume_id for r in self.host.pending_resumes(vm)):
            keep = ("status", "details", "ended_break", "ignored")
            self.answers.append((resume_id, {k: data.get(k) for k in keep}, at))
        self.host.on_resume_answer(vm, resume_id, data, at)

    def snapshot(self) -> Dict[str, Any]:
        """``{"outcome": [outcome, details, at] | None, "answers": [[id, data, at], ...]}``."""
        return {"outcome": self.outcome, "answers": self.answers}

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ToldHost:
        """What a :meth:`snapshot` holds, in a :class:`ToldHost` of no experiment.

        Raises:
            ValueError, TypeError, KeyError: ``data`` is not such a snapshot.
        """
        told = cls.__new__(cls)
        out = data["outcome"]
        if out is not None:
            out = (str(out[0]), None if out[1] is None else str(out[1]), float(out[2]))
        told.outcome = out
        told.answers = [(str(i), dict(d), float(t)) for i, d, t in data["answers"]]
        return told


def snapshot_session(state: VmState, counters: Counters, told: ToldHost) -> Dict[str, Any]:
    """What replaying a VM's ``.jsonl`` so far gave (JSON safe): its state, the outcome and
    RESUME answers the experiment was told, the malformed payloads counted (the restart
    checkpoint, :class:`~vmr_handler.host.logs.store.Checkpoint`)."""
    return {"vm": state.snapshot(), "malformed_payloads": counters.malformed_payloads, **told.snapshot()}


def restore_session(vm: str, state: VmState, counters: Counters, told: ToldHost, data: Any) -> None:
    """Take a :func:`snapshot_session` of VM ``vm`` back (instead of replaying what it covers)
    and tell the experiment (through ``told``) what the replay would have told it.

    Raises:
        SavedStateError: ``data`` is not a snapshot (nothing changed).
    """
    try:
        malformed = int(data["malformed_payloads"])
        saved = ToldHost.parse(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise SavedStateError(f"not a session snapshot: {exc!r}") from exc
    state.restore(data["vm"])
    counters.malformed_payloads = malformed
    if state.configured_at is not None:
        told.on_configured(vm, state.configured_at)
    if saved.outcome is not None:
        told.on_outcome(vm, *saved.outcome)
    for resume_id, answer, at in saved.answers:
        told.on_resume_answer(vm, resume_id, answer, at)
