"""Where a VM is, in words: the ``WHERE`` column of ``vmr-host status``, the ``where`` member of
its ``--json`` and of the console's rows (``GET /api/v1/vms``), one text for every view.

It says what the VM's state word (:mod:`~vmr_handler.host.model.stateword`) leaves out, in
experiment time: ``at break #6 since t=+12.0s``, ``paused (#3, 5.0 s)``, ``entries 4, 5
running``, ``t=+30.2s``, ``stage 1 (-10 s) running``, ``complete (12 ran, 1 exited non-zero)``,
``last heard t=+5.8s`` (a ``lost`` VM: nobody knows what
it does since).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Protocol

from vmr_handler.core.fsutil import utc_text
from vmr_handler.core.readable import duration

#: Entries named at most in ``entries 4, 5 running`` (then `` ...``).
MAX_NAMED = 6


class Placed(Protocol):
    """What :func:`where` reads of a VM's folded reports (a
    :class:`~vmr_handler.host.model.vmstate.VmState`)."""

    failed: Optional[str]
    failed_entry: Optional[int]
    at_break: Optional[Dict[str, Any]]
    paused: Optional[Dict[str, Any]]
    complete: bool
    completion: Optional[Dict[str, Any]]
    running: Dict[int, float]
    configured_at: Optional[float]
    stage: Optional[int]
    stage_time: Optional[float]
    stage_running: bool
    last_seen: Optional[float]


def exp_time(start: Optional[float], at: Optional[float]) -> str:
    """Experiment time of UTC ``at`` as ``t=+12.3s`` (``t=-4.0s`` before the start; '' when unknown)."""
    if start is None or at is None:
        return ""
    return f"t={at - start:+.1f}s"


def completion_note(completion: Optional[Mapping[str, Any]]) -> str:
    """What a VM's ``schedule_complete`` counted, in words: `` (12 ran, 1 exited non-zero, 2
    could not start)``; '' when the agent sent no counts."""
    if not completion or completion.get("ran") is None:
        return ""
    parts = [f"{completion['ran']} ran"]
    if completion.get("exited_nonzero"):
        parts.append(f"{completion['exited_nonzero']} exited non-zero")
    if completion.get("not_started"):
        parts.append(f"{completion['not_started']} could not start")
    return f" ({', '.join(parts)})"


def stage_words(state: Placed) -> str:
    """The VM's current or last stage: ``stage 1 (-10 s)`` (the agent's stage number, the
    stage's start time); '' before any."""
    if state.stage is None and state.stage_time is None:
        return ""
    number = f" {state.stage}" if state.stage is not None else ""
    at = f" ({state.stage_time:g} s)" if state.stage_time is not None else ""
    return f"stage{number}{at}"


def where(state: Placed, word: str, start: Optional[float], now: float) -> str:
    """Where the VM whose state word is ``word`` is at host UTC ``now``, the experiment
    starting at UTC ``start`` (None before it is set), in words (module docstring); ``-`` when
    nothing is known."""
    if word == "failed":  # where and why: the hint's, said once (``vmr-host status``)
        return "failed"
    if word == "lost":
        heard = exp_time(start, state.last_seen) or utc_text(state.last_seen)
        return f"last heard {heard}" if state.last_seen is not None else "never heard"
    if state.at_break is not None:
        b = state.at_break
        return f"at break #{b['index']} since {exp_time(start, b['since']) or utc_text(b['since'])}"
    if state.paused is not None:
        p = state.paused
        length = duration(p["duration"]) if isinstance(p.get("duration"), (int, float)) else "?"
        return f"paused (#{p['index']}, {length})"
    if state.complete:
        return "complete" + completion_note(state.completion)
    if state.running:
        names = sorted(state.running)
        text = ", ".join(str(i) for i in names[:MAX_NAMED]) + (" ..." if len(names) > MAX_NAMED else "")
        return f"entr{'y' if len(names) == 1 else 'ies'} {text} running"
    if state.configured_at is not None:
        if start is not None and now >= start:
            return exp_time(start, now)
        return "configured" + (f", start in {duration(start - now)}" if start is not None else "")
    if state.stage_time is not None or state.stage is not None:
        return f"{stage_words(state)} {'running' if state.stage_running else 'done'}"
    return "-"
