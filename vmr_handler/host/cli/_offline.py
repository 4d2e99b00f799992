"""``vmr-host status`` without a running host: the same result, rebuilt from the logs.

After the experiment (or when the host died) the operator still asks "who failed, who
finished?". This rebuilds the ``status`` result the control socket would give from
``<logs>/experiment.json`` (the barrier, the RESUMEs) and every ``<logs>/<vm>.jsonl``, replayed
into a :class:`~vmr_handler.host.model.vmstate.VmState` as the host does at its start. It is
read-only and says so (``"offline": true``; nothing is connected, and no VM is ``lost``: no host
watched its agent go).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from vmr_handler.core.errors import PayloadError, UsageError
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import DecoderStats
from vmr_handler.host.cli.logs import records
from vmr_handler.host.logs.store import CHECKPOINT_SUFFIX, JSONL_SUFFIX, Checkpoint
from vmr_handler.host.model.stateword import Presence, is_problem
from vmr_handler.host.model.vmstate import Counters, VmState, frames_status
from vmr_handler.host.model.where import where


class _Recorder:
    """The :class:`~vmr_handler.host.serve.session.api.ReportHost` of a replay: notes, changes nothing."""

    def __init__(self) -> None:
        self.configured: Dict[str, float] = {}

    def on_configured(self, vm: str, at: float) -> None:
        self.configured.setdefault(vm, at)

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        """Answers are read from ``experiment.json`` instead."""

    def on_outcome(self, vm: str, outcome: str, details: Optional[str], at: float) -> None:
        """Read from the VM's state instead."""


def _experiment(logs: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(logs, "experiment.json"), encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {os.path.join(logs, 'experiment.json')}: {exc}") from exc
    return doc if isinstance(doc, dict) else {}


def _replay(
    vm: str, path: str, host: _Recorder, use_checkpoint: bool = True
) -> Tuple[VmState, Dict[str, Any]]:
    """VM ``vm``'s state from its log: from its restart checkpoint (``<vm>.ckpt``, checked
    against the ``.jsonl`` as the host does) and the tail after it, else the whole file; and
    what was read (``{"checkpoint", "replayed_lines"}``)."""
    start, saved = 0, None
    checkpoint = Checkpoint(path[: -len(JSONL_SUFFIX)] + CHECKPOINT_SUFFIX, vm, path)
    data = checkpoint.load() if use_checkpoint else None
    if data is not None:
        try:
            saved, start = data["state"]["vm"], int(data["offset"])
        except (KeyError, TypeError, ValueError):
            saved, start = None, 0
    state = VmState(vm, "", None, host)  # any schedule event's answer accepts or rejects it
    if saved is not None:
        try:
            state.restore(saved)
        except (KeyError, TypeError, ValueError):  # not what this version saves: read it all
            return _replay(vm, path, host, use_checkpoint=False)
    read = 0
    for rec in records(path, start=start):  # streamed: a 1 GB log is never held in memory
        read += 1
        ev = rec["event"]
        try:
            event = Event(str(ev["type"]), float(ev["timestamp"]), str(ev["id"]), dict(ev.get("data") or {}))
            state.apply(event, float(rec.get("host_received") or event.timestamp))
        except (KeyError, TypeError, ValueError, AttributeError, PayloadError):
            continue  # the live host counted it as malformed; a status shows the rest
    note = checkpoint.note if use_checkpoint else "unusable: full replay"
    return state, {"checkpoint": note, "replayed_lines": read}


def offline_status(logs: str, now: Optional[float] = None) -> Dict[str, Any]:
    """The ``status`` result rebuilt from the logs directory ``logs`` (UTC ``now``, default the clock).

    Raises:
        UsageError: ``logs`` has neither ``experiment.json`` nor any ``<vm>.jsonl``.
    """
    now = time.time() if now is None else now
    doc = _experiment(logs)
    barrier = doc.get("barrier") or {}
    try:
        names = sorted(n[: -len(".jsonl")] for n in os.listdir(logs) if n.endswith(".jsonl"))
    except OSError as exc:
        raise UsageError(f"no running vmr-host and no logs to read in {logs}: {exc.strerror}") from exc
    if not names and not doc:
        raise UsageError(f"no running vmr-host and no logs to read in {logs}")
    expected: List[str] = sorted(barrier.get("expected") or names)
    host = _Recorder()
    start = barrier.get("start_time")
    vms = []
    for vm in sorted(set(names) | set(expected)):
        path = os.path.join(logs, f"{vm}.jsonl")
        state, read = _replay(vm, path, host) if vm in names else (VmState(vm, "", None, host), {})
        # nobody can tell whether its agent is gone (no host watched it): never lost here
        word = state.word(start, now, Presence(False, state.last_seen is not None))
        vms.append({
            "vm": vm, "expected": vm in expected, "connected": False, "silent": None,
            "state": word, "problem": is_problem(word, state.failures),
            "where": where(state, word, start, now), "gone_for": None,
            "lost_after": None, **state.fields(),
            "frames": frames_status(DecoderStats()), "refused": Counters().refused(), "read": read,
        })  # fmt: skip
    configured = dict(barrier.get("configured") or host.configured)
    excluded = sorted(barrier.get("excluded") or [])
    released = sorted(barrier.get("released") or [])
    waiting = [] if start is not None else [
        v for v in expected if v not in configured and v not in excluded and v not in released
    ]
    return {
        "now": now,
        "offline": True,
        "logs": os.path.abspath(logs),
        "experiment": {
            "start_time": start, "expected": expected, "configured": configured, "waiting_for": waiting,
            "excluded": excluded, "released": released,
        },
        "resumes": list(doc.get("resumes") or []),
        "vms": vms,
    }  # fmt: skip
