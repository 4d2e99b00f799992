"""What ``experiment.json`` says about the experiment (SPEC section 4, the barrier), read
defensively, with what the VMs reported as the fallback: :class:`Facts`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from vmr_handler.host.report.fold import ExperimentTimeline
from vmr_handler.host.report.text import _clean, _num


@dataclass
class ResumeFact:
    """A RESUME the operator issued, as ``experiment.json`` keeps it.

    Attributes:
        id: its id. at: the experiment time it was stamped with (text: ``-inf`` before the
        start). issued: when it was issued (UTC) or None. targets: the VMs it was sent to
        (cleaned names). answered: how many answered.
    """

    id: str
    at: str
    issued: Optional[float]
    targets: List[str]
    answered: int


@dataclass
class Facts:
    """What ``experiment.json`` says (SPEC section 4, the barrier), read defensively.

    Attributes:
        start: experiment start time (UTC); ``start_source`` says where it came from.
        buffer: start buffer, seconds. set_at: when the host set the start (UTC).
        configured: VM -> host receive time of its ``configured`` report (UTC).
        resumes: the RESUMEs issued (:class:`ResumeFact`).
        name: the experiment's name (``name``; empty when none).
    """

    start: Optional[float] = None
    start_source: str = ""
    buffer: Optional[float] = None
    set_at: Optional[float] = None
    expected: List[str] = field(default_factory=list)
    excluded: List[str] = field(default_factory=list)
    released: List[str] = field(default_factory=list)
    configured: Dict[str, float] = field(default_factory=dict)
    resumes: List[ResumeFact] = field(default_factory=list)
    name: str = ""

    @classmethod
    def read(cls, experiment: Mapping[str, Any], timeline: ExperimentTimeline) -> Facts:
        """Facts from ``experiment.json``'s content, else from what the VMs reported."""
        f = cls()
        barrier = experiment.get("barrier") if isinstance(experiment, Mapping) else None
        barrier = barrier if isinstance(barrier, Mapping) else {}

        def names(value: Any) -> List[str]:
            return (
                sorted(_clean(v, 64) for v in value if isinstance(v, str)) if isinstance(value, list) else []
            )

        name = experiment.get("name") if isinstance(experiment, Mapping) else None
        f.name = _clean(name, 120) if isinstance(name, str) else ""
        f.start = _num(barrier.get("start_time"))
        f.start_source = "experiment.json" if f.start is not None else ""
        f.buffer = _num(barrier.get("buffer"))
        f.set_at = _num(experiment.get("start_set_at")) if isinstance(experiment, Mapping) else None
        f.expected, f.excluded, f.released = (
            names(barrier.get(k)) for k in ("expected", "excluded", "released")
        )
        configured = barrier.get("configured")
        if isinstance(configured, Mapping):
            for vm, when in configured.items():
                w = _num(when)
                if isinstance(vm, str) and w is not None:
                    f.configured[_clean(vm, 64)] = w
        if f.start is None:  # no experiment.json (or no start yet): what the VMs were told
            starts = sorted(v.vm_start for v in timeline.vms.values() if v.vm_start is not None)
            if starts:
                f.start, f.start_source = starts[len(starts) // 2], "VM reports"
        if not f.configured:
            f.configured = {
                n: v.configured_at for n, v in timeline.vms.items() if v.configured_at is not None
            }
        resumes = experiment.get("resumes") if isinstance(experiment, Mapping) else None
        for r in resumes if isinstance(resumes, list) else []:
            if isinstance(r, Mapping):
                targets = r.get("targets") if isinstance(r.get("targets"), list) else []
                answered = r.get("answered") if isinstance(r.get("answered"), Mapping) else {}
                at = _num(r.get("at"))
                f.resumes.append(
                    ResumeFact(
                        _clean(r.get("id"), 40),
                        f"{at:.3f}" if at is not None else _clean(r.get("at"), 10),
                        _num(r.get("issued")),
                        [_clean(t, 64) for t in targets or []],
                        len(answered or {}),
                    )
                )
        return f

    def last_configured(self) -> Optional[Tuple[str, float]]:
        """The VM that configured last and when (UTC) among those the barrier waited for: the
        expected ones when known, never one the operator excluded or released (it did not hold
        the start), nor one that configured after the host set the start (a late joiner: it got
        the start already set, SPEC section 4)."""
        left_out = set(self.excluded) | set(self.released)
        pool = {
            k: v
            for k, v in self.configured.items()
            if (not self.expected or k in self.expected)
            and k not in left_out
            and (self.set_at is None or v <= self.set_at)
        }
        if not pool:
            return None
        vm = max(pool, key=lambda k: pool[k])
        return vm, pool[vm]
