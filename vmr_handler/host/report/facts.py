"""The facts the report keeps of one VM's logs: its spans (stages, pauses, breaks), its entry
runs and its instant markers. Plain data classes, filled by :mod:`vmr_handler.host.report.fold`
and drawn by :mod:`vmr_handler.host.report.svg`; all times are UTC epoch seconds, all strings
already cleaned (:func:`vmr_handler.host.report.text._clean`), not yet escaped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass
class Span:
    """A stage, pause or break of one VM.

    Attributes:
        kind: ``stage``, ``failed stage`` (ended by ``vm_failed``), ``pause`` or ``break``.
        start: UTC epoch seconds.
        end: UTC epoch seconds, or None when it had not ended at the end of the logs.
        label: short text (unescaped, already cleaned).
        tip: tooltip lines (unescaped, already cleaned).
    """

    kind: str
    start: float
    end: Optional[float]
    label: str
    tip: List[str]


@dataclass
class EntryRun:
    """One run of a schedule entry (an entry runs again after a reboot or an interruption).

    Attributes:
        index: 0-based entry index in the schedule (-1 when the guest sent none).
        executable: as reported (cleaned).
        start: UTC epoch seconds (``spawned_at`` when given, else the event time).
        end: UTC epoch seconds, or None: still running at the end of the logs.
        status: ``success``, ``error`` (non-zero exit), ``failed`` (could not start),
            ``interrupted`` or ``running``.
        positive: an entry of positive experiment time (it has ``scheduled``).
        lateness: ``spawned_at - scheduled``, seconds (positive entries).
        exit_code: as reported (None: killed, data-only, or not ended).
        details: the agent's sentence (cleaned).
        output: output lines reported for this run (counted, never kept).
    """

    index: int
    executable: str
    start: float
    end: Optional[float] = None
    status: str = "running"
    positive: bool = False
    lateness: Optional[float] = None
    exit_code: Optional[int] = None
    details: str = ""
    output: int = 0


@dataclass
class Marker:
    """An instant on a VM's lane.

    Attributes:
        kind: ``configured``, ``reboot``, ``failed``, ``refused``, ``restart`` or ``ignored``
            (a RESUME that found no break).
        at: UTC epoch seconds.
        tip: tooltip lines (unescaped, cleaned).
    """

    kind: str
    at: float
    tip: List[str]
