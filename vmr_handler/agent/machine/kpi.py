"""The VM's key performance indicators, sampled at a set interval (seed 004).

Seed 004's agents report "KPIs at a set interval" (``repeat: <seconds>``). :class:`KpiSampler`
reads this machine's counters with psutil every ``interval`` seconds (reference clock, an
injected :class:`~vmr_handler.core.clock.Clock`) and reports each sample as a ``kpi`` event
through the ``emit(EventType.KPI, **data)`` it is given: a report like every other (unique id,
outbox, acknowledged, de-duplicated by the host). ``data`` (``docs/events.md``, "Measurements"):

* ``cpu_percent``: busy share of all cores since the previous sample, 0-100; ``cpu_count``;
* ``load``: ``[1 min, 5 min, 15 min]`` load averages;
* ``mem_used``, ``mem_available``, ``mem_total``: bytes;
* ``disk_used``, ``disk_total``: bytes of the file system holding the state dir (else ``/``);
* ``disk_read_bytes``, ``disk_write_bytes``: bytes read/written by every disk since the
  previous sample; ``disk_read_rate``, ``disk_write_rate``: the same per second;
* ``net``: interface -> ``{"bytes_sent", "bytes_recv", "packets_sent", "packets_recv"}``, each
  per second since the previous sample (``lo`` left out unless it is the only one; at most
  :data:`~vmr_handler.core.payloads.MAX_KPI_INTERFACES`, by name);
* ``interval`` (s, the one in force), ``elapsed`` (s the rates cover), ``duration`` (s the
  sample took to read), and ``errors`` (what could not be read, the first time only).

The rates of the first sample are taken from a baseline read when sampling starts (at start,
or when the interval goes from 0 to a positive value), so every sample has them. A reading
that fails (no ``/proc``, no disk counters) is logged and reported once in ``errors`` and that
part is left out of every sample; it is never fatal. psutil is imported only when sampling
starts (the lean control commands never import it). A sample costs well under a millisecond
(``benchmarks/bench_kpi.py``), so it runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Set, Tuple

from vmr_handler.core.clock import Clock
from vmr_handler.core.errors import OsCallFailed, UsageError
from vmr_handler.core.events import EventType
from vmr_handler.core.payloads import KPI_NET_FIELDS, MAX_KPI_INTERFACES, MIN_KPI_INTERVAL

log = logging.getLogger(__name__)

#: The readings of a sample, in the order they are taken (:class:`Probe`'s methods).
READINGS = ("cpu", "load", "memory", "disk", "disk_io", "net")

#: ``emit(EventType.KPI, **data)``: reports one sample (the engine's or the link's emit).
Emit = Callable[..., Any]


class Probe(Protocol):
    """Where the counters come from (:class:`PsutilProbe`; tests give fixed values). Each
    method may raise anything: that reading is then left out (:class:`KpiSampler`)."""

    def cpu(self) -> Tuple[float, float]:
        """(busy, total) CPU seconds of all cores since boot."""

    def load(self) -> Tuple[float, float, float]:
        """1, 5 and 15 minute load averages."""

    def memory(self) -> Dict[str, int]:
        """``{"mem_used", "mem_available", "mem_total"}``, bytes."""

    def disk(self) -> Dict[str, int]:
        """``{"disk_used", "disk_total"}``, bytes."""

    def disk_io(self) -> Tuple[int, int]:
        """(read, written) bytes of every disk since boot."""

    def net(self) -> Dict[str, Tuple[int, int, int, int]]:
        """Interface -> (bytes_sent, bytes_recv, packets_sent, packets_recv) since boot."""


class PsutilProbe:
    """This machine's counters, read with psutil (imported here, when sampling starts).

    Args:
        path: a directory on the file system whose use is reported (``/`` when it is not one).
    """

    def __init__(self, path: str = "/") -> None:
        import psutil

        self._ps = psutil
        self.path = path if os.path.isdir(path) else "/"

    def cpu(self) -> Tuple[float, float]:
        """Busy and total seconds as psutil's ``cpu_percent`` counts them (idle and iowait are
        idle; guest time is already in user time)."""
        t = self._ps.cpu_times()
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return total - t.idle - getattr(t, "iowait", 0.0), total

    def load(self) -> Tuple[float, float, float]:
        """``os.getloadavg()`` (psutil emulates it where the OS has none)."""
        return self._ps.getloadavg()

    def memory(self) -> Dict[str, int]:
        """``psutil.virtual_memory()``'s used, available and total."""
        vm = self._ps.virtual_memory()
        return {"mem_used": vm.used, "mem_available": vm.available, "mem_total": vm.total}

    def disk(self) -> Dict[str, int]:
        """``psutil.disk_usage(path)``'s used and total."""
        du = self._ps.disk_usage(self.path)
        return {"disk_used": du.used, "disk_total": du.total}

    def disk_io(self) -> Tuple[int, int]:
        """Bytes read and written by every disk (``psutil.disk_io_counters()``).

        Raises:
            OSError: the machine has no disk counters (psutil returns None).
        """
        io = self._ps.disk_io_counters()
        if io is None:
            raise OsCallFailed("no disk I/O counters on this machine")
        return io.read_bytes, io.write_bytes

    def net(self) -> Dict[str, Tuple[int, int, int, int]]:
        """Per interface counters (``psutil.net_io_counters(pernic=True)``): ``lo`` left out
        unless it is the only one; the first :data:`MAX_KPI_INTERFACES` by name."""
        nics = self._ps.net_io_counters(pernic=True)
        names = sorted(n for n in nics if n != "lo") or sorted(nics)
        return {
            n: (nics[n].bytes_sent, nics[n].bytes_recv, nics[n].packets_sent, nics[n].packets_recv)
            for n in names[:MAX_KPI_INTERFACES]
        }


def check_interval(seconds: Any, what: str = "kpi_interval") -> float:
    """``seconds`` as a KPI interval: 0 (off) or a finite number >= :data:`MIN_KPI_INTERVAL`.

    Raises:
        UsageError: anything else (naming ``what`` and the value).
    """
    try:
        value = float(seconds)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if isinstance(seconds, bool) or not math.isfinite(value) or (value != 0 and value < MIN_KPI_INTERVAL):
        raise UsageError(
            f"{what} must be 0 (off) or a finite number of seconds >= {MIN_KPI_INTERVAL:g}, got {seconds!r}"
        )
    return value


@dataclass
class _Previous:
    """The readings a sample's rates are taken against (monotonic seconds ``at``)."""

    at: float
    readings: Dict[str, Any] = field(default_factory=dict)


def _delta(now: Any, before: Any) -> Optional[Tuple[float, ...]]:
    """``now - before`` member by member (tuples), None when either is missing or a counter went
    backwards (a reset: no rate this time)."""
    if now is None or before is None:
        return None
    diff = tuple(float(a) - float(b) for a, b in zip(now, before))
    return None if any(d < 0 for d in diff) else diff


class KpiSampler:
    """Reports a ``kpi`` sample every ``interval`` seconds until stopped (module docstring).

    Args:
        emit: ``emit(EventType.KPI, **data)`` reports a sample (never expected to raise; an
            error is logged and sampling goes on).
        clock: when samples are due (reference UTC) and what rates are measured over
            (``clock.monotonic()``); a FakeClock in tests.
        interval: seconds between samples; 0 = off (:func:`check_interval`).
        probe: where the counters come from; default a :class:`PsutilProbe` of ``path``,
            made when sampling first starts.
        path: the directory whose file system is reported (the agent's state dir).
        skip: called when a sample is due; True skips it (the agent skips while its
            reports are held, a full disk: a KPI sample is not worth holding). The next sample's
            rates then cover the time since the last one taken.

    Raises:
        UsageError: a bad ``interval``.
    """

    def __init__(
        self,
        emit: Emit,
        clock: Clock,
        interval: float = 0.0,
        probe: Optional[Probe] = None,
        path: str = "/",
        skip: Optional[Callable[[], bool]] = None,
    ) -> None:
        self._emit = emit
        self._clock = clock
        self._interval = check_interval(interval)
        self._probe = probe
        self._path = path
        self._skip = skip
        self._changed = asyncio.Event()
        self._stopped = False
        self._previous: Optional[_Previous] = None
        self._due: Optional[float] = None
        self._failed: Set[str] = set()
        self._errors: Dict[str, str] = {}  # first failures not reported yet
        self._task: Optional[asyncio.Task[None]] = None
        #: samples reported and samples skipped so far
        self.samples = 0
        self.skipped = 0

    @property
    def interval(self) -> float:
        """Seconds between samples (0 = off)."""
        return self._interval

    def set_interval(self, seconds: Any) -> None:
        """Sample every ``seconds`` from now on (0 = off). The change takes effect at once: the
        next sample is due ``seconds`` after the last one (now, when that is past); from off,
        a baseline is read now and the first sample follows ``seconds`` later.

        Raises:
            UsageError: a bad interval (:func:`check_interval`); the interval is unchanged.
        """
        self._interval = check_interval(seconds)
        self._changed.set()

    def stop(self) -> None:
        """End :meth:`run` (at once; no sample is taken any more)."""
        self._stopped = True
        self._changed.set()

    def start(self) -> None:
        """Run :meth:`run` in a task of the running loop (end it with :meth:`close`)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())

    async def close(self) -> None:
        """Stop and wait for the task :meth:`start` made."""
        self.stop()
        if self._task is not None:
            await self._task

    async def run(self) -> None:
        """Sample until :meth:`stop`: every ``interval`` seconds on the clock's grid (a sample
        that falls behind by a whole interval, e.g. after a clock jump, restarts the grid)."""
        while not self._stopped:
            self._changed.clear()
            if self._interval <= 0:
                self._previous = self._due = None  # off: a later start reads a fresh baseline
                await self._changed.wait()
                continue
            if self._previous is None or self._due is None:
                self._baseline()
            base = self._due if self._due is not None else self._clock.time()
            due = base + self._interval
            await self._clock.wait(self._changed, due)
            if self._stopped or self._changed.is_set():
                continue  # a new interval: due again from the same last sample
            now = self._clock.time()
            self._due = due if now - due < self._interval else now
            self._take()

    def _baseline(self) -> None:
        """Read the counters the first sample's rates are taken against."""
        if self._probe is None:
            self._probe = PsutilProbe(self._path)
        self._previous = _Previous(self._clock.monotonic(), self._read_all())
        self._due = self._clock.time()

    def _take(self) -> None:
        """Take one sample and report it (or skip it); never raises."""
        try:
            if self._skip is not None and self._skip():
                self.skipped += 1
                return
            self._emit(EventType.KPI, **self.sample())
            self.samples += 1
        except Exception:  # a KPI sample must never stop the agent
            log.exception("KPI sample failed; sampling goes on")

    def sample(self) -> Dict[str, Any]:
        """Read the counters now: the ``kpi`` data (module docstring), rates since the previous
        sample or baseline (none on a sampler that has neither)."""
        started = time.perf_counter()
        if self._probe is None:
            self._probe = PsutilProbe(self._path)
        readings = self._read_all()
        at = self._clock.monotonic()
        previous, self._previous = self._previous, _Previous(at, readings)
        data: Dict[str, Any] = {"interval": self._interval, "cpu_count": os.cpu_count()}
        if readings.get("load") is not None:
            data["load"] = [round(float(v), 2) for v in readings["load"]]
        for part in ("memory", "disk"):
            data.update(readings.get(part) or {})
        if previous is not None and at > previous.at:
            data["elapsed"] = round(at - previous.at, 6)
            data.update(_rates(readings, previous.readings, at - previous.at))
        if self._errors:
            data["errors"], self._errors = self._errors, {}
        data["duration"] = round(time.perf_counter() - started, 6)
        return data

    def _read_all(self) -> Dict[str, Any]:
        """Every reading of :data:`READINGS` that works (None for those that fail); the first
        failure of each is logged and kept for the next sample's ``errors``."""
        readings: Dict[str, Any] = {}
        for name in READINGS:
            try:
                readings[name] = getattr(self._probe, name)()
            except Exception as exc:  # psutil errors, OSError, odd /proc contents: never fatal
                readings[name] = None
                if name not in self._failed:
                    self._failed.add(name)
                    self._errors[name] = why = f"{type(exc).__name__}: {exc}"[:200]
                    log.warning("KPI %s cannot be read (%s): left out of every sample", name, why)
        return readings


def _rates(now: Mapping[str, Any], before: Mapping[str, Any], elapsed: float) -> Dict[str, Any]:
    """The members of a sample measured since the previous one, over ``elapsed`` seconds."""
    out: Dict[str, Any] = {}
    cpu_now, cpu_before = now.get("cpu"), before.get("cpu")
    if cpu_now is not None and cpu_before is not None and cpu_now[1] > cpu_before[1]:
        # busy is total - idle - iowait of counters in 10 ms ticks (and iowait may go back):
        # over a short interval it can come out a tick below the last one; 0, as psutil says
        busy = max(0.0, float(cpu_now[0]) - float(cpu_before[0]))
        out["cpu_percent"] = round(min(100.0, 100.0 * busy / (cpu_now[1] - cpu_before[1])), 2)
    io = _delta(now.get("disk_io"), before.get("disk_io"))
    if io is not None:
        out.update(disk_read_bytes=int(io[0]), disk_write_bytes=int(io[1]))
        out.update(disk_read_rate=round(io[0] / elapsed, 1), disk_write_rate=round(io[1] / elapsed, 1))
    nics_now, nics_before = now.get("net") or {}, before.get("net") or {}
    net = {}
    for name, counters in nics_now.items():
        diff = _delta(counters, nics_before.get(name))
        if diff is not None:
            net[name] = {k: round(d / elapsed, 1) for k, d in zip(KPI_NET_FIELDS, diff)}
    if net:
        out["net"] = net
    return out
