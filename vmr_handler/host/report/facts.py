"""The facts the report keeps of one VM's logs: its spans (stages, pauses, breaks), its entry
runs and its instant markers. Plain data classes, filled by :mod:`vmr_handler.host.report.fold`
and drawn by :mod:`vmr_handler.host.report.svg`; all times are UTC epoch seconds, all strings
already cleaned (:func:`vmr_handler.host.report.text._clean`), not yet escaped.
:class:`KpiSeries` keeps one KPI of one VM for a sparkline, in bounded memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

#: Output lines kept per entry run (the last ones), and characters kept of each.
TAIL_LINES = 5
TAIL_CHARS = 200
#: Characters kept of an entry's command line.
COMMAND_CHARS = 300
#: Points a :class:`KpiSeries` keeps (older samples are merged two by two beyond it).
KPI_POINTS = 60


@dataclass
class Span:
    """A stage, pause or break of one VM.

    Attributes:
        kind: ``stage``, ``failed stage`` (ended by ``vm_failed``), ``pause`` or ``break``.
        start: UTC epoch seconds.
        end: UTC epoch seconds, or None when it had not ended at the end of the logs.
        label: short text (unescaped, already cleaned).
        tip: tooltip lines (unescaped, already cleaned).
        index: the pause or break entry's index (None for stages, or when the guest sent none).
    """

    kind: str
    start: float
    end: Optional[float]
    label: str
    tip: List[str]
    index: Optional[int] = None


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
        output: output lines reported for this run (all counted).
        command: the command line the agent ran (``entry_started`` ``command``, cleaned, at
            most :data:`COMMAND_CHARS` characters; empty when not reported).
        scheduled: when a positive entry was due (UTC; None in a stage or when not reported).
        tail: the last :data:`TAIL_LINES` output lines of this run (each cleaned and cut to
            :data:`TAIL_CHARS` characters), oldest first.
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
    command: str = ""
    scheduled: Optional[float] = None
    tail: List[str] = field(default_factory=list)

    def add_output(self, line: str) -> None:
        """Count one output line and keep it in :attr:`tail` (``line`` already cleaned)."""
        self.output += 1
        self.tail.append(line)
        if len(self.tail) > TAIL_LINES:
            del self.tail[0]


@dataclass
class Marker:
    """An instant on a VM's lane.

    Attributes:
        kind: ``configured``, ``reboot``, ``failed``, ``refused``, ``rejected`` (its schedule),
            ``restart``, ``resume`` (a RESUME this VM received and applied) or ``ignored`` (a
            RESUME that found no break).
        at: UTC epoch seconds.
        tip: tooltip lines (unescaped, cleaned).
    """

    kind: str
    at: float
    tip: List[str]


@dataclass
class KpiSeries:
    """One KPI of one VM over time, for a sparkline: at most :data:`KPI_POINTS` points.

    Samples are averaged ``stride`` at a time into a point; when the points are more than
    :data:`KPI_POINTS`, neighbours are merged two by two and ``stride`` doubles. So the series
    always covers the whole run, at a resolution that halves as it grows (memory is bounded
    whatever a guest sends).

    Attributes:
        points: ``(t, value)``: ``t`` the UTC time of the first sample of the point, ``value``
            the mean of its samples (unit: the KPI's, e.g. percent).
        stride: samples per point. samples: samples added. low, high, last: smallest,
            largest and latest sample value (None before the first).
    """

    points: List[Tuple[float, float]] = field(default_factory=list)
    stride: int = 1
    samples: int = 0
    low: Optional[float] = None
    high: Optional[float] = None
    last: Optional[float] = None
    _acc: List[float] = field(default_factory=list, repr=False)  # [t, sum, count] of the open point

    def add(self, t: float, value: float) -> None:
        """Add one sample taken at UTC ``t`` (samples are expected in time order)."""
        self.samples += 1
        self.last = value
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)
        if not self._acc:
            self._acc = [t, 0.0, 0.0]
        self._acc[1] += value
        self._acc[2] += 1
        if self._acc[2] >= self.stride:
            self.points.append((self._acc[0], self._acc[1] / self._acc[2]))
            self._acc = []
            if len(self.points) > KPI_POINTS:
                pts = self.points
                self.points = [
                    (pts[i][0], (pts[i][1] + pts[i + 1][1]) / 2) if i + 1 < len(pts) else pts[i]
                    for i in range(0, len(pts), 2)
                ]
                self.stride *= 2

    def values(self) -> List[Tuple[float, float]]:
        """The points, and the open one (fewer than ``stride`` samples) at the end."""
        if self._acc:
            return [*self.points, (self._acc[0], self._acc[1] / self._acc[2])]
        return list(self.points)
