"""What the console's REST API answers, built from the live experiment: pure
functions of the :class:`~vmr_handler.host.serve.experiment.experiment.Experiment`, its sessions and the live
report timeline, returning JSON-safe dicts (times are UTC epoch seconds, durations seconds).

A VM's *row* is the short form the VM table and the event stream carry; its *detail* adds the
whole ``vmr-host status`` object, its entry runs and its KPI series.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Tuple, cast

from vmr_handler.core.events import json_safe
from vmr_handler.host.model.stateword import PROBLEM_STATES, STATES, finished, is_problem
from vmr_handler.host.model.where import where
from vmr_handler.host.report.fold import VmTimeline
from vmr_handler.host.serve.experiment.experiment import Experiment
from vmr_handler.host.serve.session.session import VmSession


def _safe(data: Dict[str, Any]) -> Dict[str, Any]:
    """``data`` with every float JSON can hold (:func:`~vmr_handler.core.events.json_safe`)."""
    return cast(Dict[str, Any], json_safe(data))


def vm_row(session: VmSession, start_time: Optional[float], now: float) -> Dict[str, Any]:
    """The row of one VM: ``vm``, ``state`` (the one word:
    :mod:`~vmr_handler.host.model.stateword`), ``problem``, ``connected``, ``gone_for`` (s the
    agent has been gone, None while it talks), ``where`` (in words, as ``vmr-host status`` says it:
    :mod:`~vmr_handler.host.model.where`), ``stage``, ``at_break`` / ``paused`` (entry
    index or None), ``running`` (entries running), ``failures`` (failed entries),
    ``failed_entry``, ``max_lateness`` (s), ``last_seen`` (UTC) and ``kpi`` (the latest sample,
    or None)."""
    st = session.state
    presence = session.presence()
    word = st.word(start_time, now, presence)
    return _safe(
        {
            "vm": session.name,
            "state": word,
            "problem": is_problem(word, st.failures),
            "expected": session.expected,
            "connected": session.connected,
            "gone_for": presence.gone_for,
            "where": where(st, word, start_time, now),
            "stage": st.stage_text(),
            "at_break": st.at_break.get("index") if st.at_break else None,
            "paused": st.paused.get("index") if st.paused else None,
            "running": len(st.running),
            "failures": st.failures,
            "failed_entry": st.failed_entry,
            "max_lateness": st.max_lateness,
            "last_seen": st.last_seen,
            "kpi": dict(st.kpi) if st.kpi is not None else None,
        }
    )


def sorted_rows(rows: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Problems first, then by state (:data:`STATES` order), then by name."""
    order = {s: i for i, s in enumerate(STATES)}
    return sorted(rows, key=lambda r: (not r["problem"], order.get(r["state"], len(order)), r["vm"]))


def all_rows(experiment: Experiment, now: float) -> List[Dict[str, Any]]:
    """Every VM's row, problems first (:func:`sorted_rows`)."""
    start = experiment.barrier.start_time
    return sorted_rows(vm_row(s, start, now) for s in experiment.sessions.values())


def timeline_end(experiment: Experiment, now: float) -> Optional[float]:
    """Up to when the timeline draws open spans: ``now`` (UTC epoch s) while the experiment runs,
    None (its last event) once it is finished (:func:`~vmr_handler.host.model.stateword.finished`:
    every VM that counts complete or failed), so a finished experiment's timeline ends at its
    end instead of stretching to now."""
    start, active = experiment.barrier.start_time, experiment.barrier.active
    sessions = experiment.sessions.items()
    words = ((s.state.word(start, now, s.presence()), name in active) for name, s in sessions)
    return None if finished(words) else now


def live_words(experiment: Experiment, now: float) -> Dict[str, str]:
    """VM -> its state word at UTC ``now`` (the host's one model, liveness included): the
    words the console's timeline draws its lanes with, as every row and count says them."""
    start = experiment.barrier.start_time
    return {name: s.state.word(start, now, s.presence()) for name, s in experiment.sessions.items()}


def timeline_ends(experiment: Experiment, now: float) -> Dict[str, float]:
    """VM -> UTC epoch seconds up to which its open spans are drawn, for every ``lost`` VM at
    ``now``: when its agent was last heard from (not now: nobody knows what ran after)."""
    start = experiment.barrier.start_time
    return {
        name: s.state.last_seen
        for name, s in experiment.sessions.items()
        if s.state.last_seen is not None and s.state.word(start, now, s.presence()) == "lost"
    }


def experiment_view(
    experiment: Experiment, mode: str, rows: List[Dict[str, Any]], now: float
) -> Dict[str, Any]:
    """``GET /api/v1/experiment``: ``now``, ``name``, ``run_id``, ``mode``, ``start_time``,
    ``barrier`` (the ``experiment`` member of ``vmr-host status``), ``counts`` (state word ->
    VMs, in :data:`STATES` order), ``states`` (every word in that order: the page sorts by it),
    ``problem_states``, ``vms``, ``connected``, ``problems`` and ``resumes``.

    Args:
        rows: every VM's row (:func:`all_rows`) at ``now`` (UTC epoch seconds).
    """
    counts = Counter(r["state"] for r in rows)
    ordered = {s: counts[s] for s in STATES if counts[s]}
    ordered.update({s: n for s, n in sorted(counts.items()) if s not in ordered})
    return _safe(
        {
            "now": now,
            "name": experiment.config.name,
            "run_id": experiment.run_id,
            "mode": mode,
            "start_time": experiment.barrier.start_time,
            "barrier": experiment.barrier_status(now),
            "counts": ordered,
            "states": list(STATES),
            "problem_states": sorted(PROBLEM_STATES),
            "vms": len(rows),
            "connected": sum(1 for r in rows if r["connected"]),
            "problems": sum(1 for r in rows if r["problem"]),
            "resumes": [r.to_dict() for r in experiment.resumes],
        }
    )


def entry_runs(timeline: Optional[VmTimeline]) -> List[Dict[str, Any]]:
    """A VM's entry runs as the report folds them (every field of
    :class:`~vmr_handler.host.report.facts.EntryRun`: index, executable, start/end UTC,
    status, lateness s, exit code, output...), oldest first; [] before any."""
    if timeline is None:
        return []
    return [_safe(dataclasses.asdict(run)) for run in timeline.runs]


def vm_detail(
    experiment: Experiment, session: VmSession, timeline: Optional[VmTimeline], now: float
) -> Dict[str, Any]:
    """``GET /api/v1/vms/{vm}``: the VM's ``vmr-host status`` object, plus ``row``
    (:func:`vm_row`), ``entries`` (:func:`entry_runs`) and ``kpi_series`` (KPI series name ->
    values, oldest first; ``at`` is host UTC)."""
    start = experiment.barrier.start_time
    detail = session.status(start, now)
    detail["row"] = vm_row(session, start, now)
    detail["entries"] = entry_runs(timeline)
    detail["kpi_series"] = session.state.kpi_series()
    return _safe(detail)


def changed_rows(
    rows: List[Dict[str, Any]], last: Dict[str, Dict[str, Any]]
) -> Tuple[List[Dict[str, Any]], Dict[str, Dict[str, Any]]]:
    """The rows that differ from ``last`` (VM -> row sent before), and the new ``last``. Pure."""
    now_rows = {r["vm"]: r for r in rows}
    return [r for vm, r in now_rows.items() if last.get(vm) != r], now_rows
