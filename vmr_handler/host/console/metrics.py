"""``GET /metrics`` of the console: the experiment in the Prometheus text
format (prometheus-client), for the Prometheus and Grafana testbed operators already run.

Two sources:

- what only the stream of reports tells (:meth:`ConsoleMetrics.observe`, called for every
  stored report, the logs written before the console started included): entry runs by status
  and the lateness histogram of positive entries;
- what the live state holds, read at scrape time (:meth:`ConsoleMetrics.snapshot`): each VM's
  state word (the one of ``vmr-host status``), the counts per state, connected VMs, the
  barrier, the start time, each VM's failures, maximum lateness, latest KPI sample, malformed
  frames and refused reports.

Cost (``benchmarks/bench_metrics.py``): at 1000 VMs about 32 lines per VM; reading the state
takes a few ms, prometheus-client's text about 0.3 s of CPU. :meth:`ConsoleMetrics.exposition`
reads the state on the event loop and makes the text in a worker thread.

Names follow the Prometheus conventions: base units in the name (``_seconds``, ``_bytes``,
``_ratio``), ``_total`` for counters; times are UTC epoch seconds. The registry is the
console's own (never prometheus-client's global one). Label values a guest chose (network
interface names) are made printable by the host and escaped by prometheus-client; text no
UTF-8 can hold is escaped here, so one hostile name cannot break the exposition.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from vmr_handler.core.errors import PayloadError
from vmr_handler.core.events import Event
from vmr_handler.core.gcpause import paused_gc
from vmr_handler.core.payloads import (
    EntryExited,
    EntryFailed,
    EntryInterrupted,
    EntryStarted,
    parse_payload,
)
from vmr_handler.host.model.stateword import STATES
from vmr_handler.host.model.vmstate import run_status
from vmr_handler.host.serve.experiment.experiment import Experiment
from vmr_handler.host.serve.session.session import VmSession

#: Upper bounds (s) of the ``vmr_entry_lateness_seconds`` buckets: 1 ms to 60 s (the agent's
#: target is p99 < 10 ms; a minute late is a VM that was stopped or starved).
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: The ``status`` label of ``vmr_entry_runs_total``, every one shown for every VM (0 too).
RUN_STATUSES = ("started", "success", "error", "failed", "interrupted")
#: The report types :meth:`ConsoleMetrics.observe` reads (the others are skipped unparsed).
ENTRY_TYPES = frozenset(t.TYPE for t in (EntryStarted, EntryExited, EntryFailed, EntryInterrupted))

_LATEST = " (latest KPI sample)"
_NET = " on an interface of the VM (latest KPI sample)"
#: Metric name (a counter's without ``_total``) -> its HELP text.
HELP: Dict[str, str] = {
    "vmr_experiment": "The served experiment: its name and this host's run id (value 1)",
    "vmr_vm_state": "1 for the VM's state word (that of vmr-host status, lost too); the other states "
    "are absent",
    "vmr_vms": "VMs served by this host in each state (every state word, 0 too)",
    "vmr_vms_connected": "VMs whose channel is connected now",
    "vmr_vm_connected": "1 while the VM's channel is connected, else 0",
    "vmr_vm_last_seen_timestamp_seconds": "When the host last heard from the VM (UTC epoch)",
    "vmr_barrier_waiting": "VMs (and peer hosts) the start barrier still waits for; 0 once started",
    "vmr_barrier_expected": "VMs (and peer hosts) the start barrier counts (expected, not excluded)",
    "vmr_experiment_start_time_seconds": "Experiment start time (UTC epoch); absent before it is set",
    "vmr_vm_failures": "Failed entries the VM reported so far: runs that exited non-zero or could not run "
    "(a vm_failed after one is not counted again)",
    "vmr_vm_max_lateness_seconds": "Largest lateness of an entry start the VM reported",
    "vmr_malformed_frames": "Frames from the VM that could not be decoded (over every connection)",
    "vmr_oversize_frames": "Frames from the VM refused for their size (over every connection)",
    "vmr_refused": "What the host refused or dropped from the VM, by kind (vmr-host status's "
    "refused); a kind appears at its first count",
    "vmr_entry_runs": "Entry runs reported, by status: started, success, error (non-zero exit), "
    "failed (could not run), interrupted",
    "vmr_entry_lateness_seconds": "Lateness of positive entries' starts over every VM: spawned_at - "
    "scheduled (an early start counts as 0)",
    "vmr_vm_cpu_usage_ratio": "CPU busy over all the VM's cores, 0-1" + _LATEST,
    "vmr_vm_memory_used_bytes": "Memory used in the VM" + _LATEST,
    "vmr_vm_memory_available_bytes": "Memory available in the VM" + _LATEST,
    "vmr_vm_memory_total_bytes": "Memory of the VM" + _LATEST,
    "vmr_vm_disk_used_bytes": "Disk space used in the VM" + _LATEST,
    "vmr_vm_disk_total_bytes": "Disk space of the VM" + _LATEST,
    "vmr_vm_disk_read_bytes_per_second": "Bytes read from disk per second in the VM" + _LATEST,
    "vmr_vm_disk_write_bytes_per_second": "Bytes written to disk per second in the VM" + _LATEST,
    "vmr_kpi_interval_seconds": "Seconds between two KPI samples the host asks of every agent (0: none)",
    "vmr_vm_kpi_sample_timestamp_seconds": "When the host received the VM's latest KPI sample (UTC epoch)",
    "vmr_vm_load1": "Load average over 1 min in the VM" + _LATEST,
    "vmr_vm_load5": "Load average over 5 min in the VM" + _LATEST,
    "vmr_vm_load15": "Load average over 15 min in the VM" + _LATEST,
    "vmr_vm_network_receive_bytes_per_second": "Bytes received per second" + _NET,
    "vmr_vm_network_transmit_bytes_per_second": "Bytes sent per second" + _NET,
    "vmr_vm_network_receive_packets_per_second": "Packets received per second" + _NET,
    "vmr_vm_network_transmit_packets_per_second": "Packets sent per second" + _NET,
}
#: Scalar members of a VM's latest KPI sample (:func:`vmr_handler.host.model.vmstate.kpi_record`):
#: (member, metric, factor to the metric's unit: percent to ratio).
KPI_GAUGES: Tuple[Tuple[str, str, float], ...] = (
    ("cpu_percent", "vmr_vm_cpu_usage_ratio", 0.01),
    ("mem_used", "vmr_vm_memory_used_bytes", 1.0),
    ("mem_available", "vmr_vm_memory_available_bytes", 1.0),
    ("mem_total", "vmr_vm_memory_total_bytes", 1.0),
    ("disk_used", "vmr_vm_disk_used_bytes", 1.0),
    ("disk_total", "vmr_vm_disk_total_bytes", 1.0),
    ("disk_read_rate", "vmr_vm_disk_read_bytes_per_second", 1.0),
    ("disk_write_rate", "vmr_vm_disk_write_bytes_per_second", 1.0),
    ("at", "vmr_vm_kpi_sample_timestamp_seconds", 1.0),
)
#: The ``load`` members of a KPI sample (1, 5, 15 min), in order: metric names (node_exporter's).
KPI_LOADS = ("vmr_vm_load1", "vmr_vm_load5", "vmr_vm_load15")
#: Per-interface rates of a KPI sample: (member, metric); labels ``vm``, ``interface``.
KPI_NET: Tuple[Tuple[str, str], ...] = (
    ("bytes_recv", "vmr_vm_network_receive_bytes_per_second"),
    ("bytes_sent", "vmr_vm_network_transmit_bytes_per_second"),
    ("packets_recv", "vmr_vm_network_receive_packets_per_second"),
    ("packets_sent", "vmr_vm_network_transmit_packets_per_second"),
)
_VM = ("vm",)
#: What :meth:`ConsoleMetrics.collect` reads from the live state: (kind, name, labels); kind
#: ``gauge`` or ``counter`` (a counter's name without ``_total``); HELP from :data:`HELP`.
STATE_METRICS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("gauge", "vmr_vm_state", ("vm", "state")),
    ("gauge", "vmr_vms", ("state",)),
    ("gauge", "vmr_vms_connected", ()),
    ("gauge", "vmr_vm_connected", _VM),
    ("gauge", "vmr_vm_last_seen_timestamp_seconds", _VM),
    ("gauge", "vmr_barrier_waiting", ()),
    ("gauge", "vmr_barrier_expected", ()),
    ("gauge", "vmr_experiment_start_time_seconds", ()),
    ("gauge", "vmr_kpi_interval_seconds", ()),
    ("gauge", "vmr_vm_failures", _VM),
    ("gauge", "vmr_vm_max_lateness_seconds", _VM),
    ("counter", "vmr_malformed_frames", _VM),
    ("counter", "vmr_oversize_frames", _VM),
    ("counter", "vmr_refused", ("vm", "kind")),
    ("counter", "vmr_entry_runs", ("vm", "status")),
    *(("gauge", name, _VM) for _member, name, _factor in KPI_GAUGES),
    *(("gauge", name, _VM) for name in KPI_LOADS),
    *(("gauge", name, ("vm", "interface")) for _member, name in KPI_NET),
)
#: A rendered exposition younger than this (s) is served again by :meth:`ConsoleMetrics.exposition`
#: (two Prometheus servers scraping, a browser reloading); older, it is made again.
FRESH = 1.0
#: The experiment-wide histogram of positive entries' lateness, and the experiment's info metric.
LATENESS_METRIC = "vmr_entry_lateness_seconds"
INFO_METRIC = "vmr_experiment"

Families = Dict[str, Union[GaugeMetricFamily, CounterMetricFamily]]


def label_text(text: str) -> str:
    """``text`` as a label value any exposition can carry: what UTF-8 cannot encode (lone
    surrogates from a guest's JSON or a non-UTF-8 argument) is ``\\uXXXX``-escaped. Escaping
    quotes, backslashes and newlines is prometheus-client's."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def number(value: Any) -> Optional[float]:
    """``value`` as a float when it is a real number (not a bool), else None (a KPI member
    the guest did not send well, or a checkpoint an older host wrote)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def is_positive(p: EntryStarted) -> bool:
    """Whether the started entry is in positive experiment time (scheduled against the start),
    as the report decides (:mod:`vmr_handler.host.report.fold`)."""
    return p.scheduled is not None or (p.start_time or 0) > 0


def le_text(bound: float) -> str:
    """A histogram bucket's ``le`` label: ``+Inf`` or the float's shortest repr (``0.001``, ``1.0``)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def new_families() -> Families:
    """Empty families of every metric :data:`STATE_METRICS` names (metric name -> family)."""
    made: Families = {}
    for kind, name, labels in STATE_METRICS:
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        made[name] = cls(name, HELP[name], labels=labels)
    return made


class VmFacts(NamedTuple):
    """What the metrics show of one VM, read on the event loop (:func:`vm_facts`).

    ``kpi`` is the VM's latest KPI sample itself (:func:`~vmr_handler.host.model.vmstate.kpi_record`:
    replaced at each sample, never changed in place, so it may be read in another thread).
    """

    vm: str
    word: str
    connected: bool
    last_seen: Optional[float]
    failures: int
    max_lateness: Optional[float]
    malformed: int
    oversize: int
    refused: Tuple[Tuple[str, int], ...]
    kpi: Optional[Mapping[str, Any]]


class Snapshot(NamedTuple):
    """Everything one scrape shows, read at once (:meth:`ConsoleMetrics.snapshot`); turning it
    into text (:meth:`ConsoleMetrics.render`) reads nothing else, in any thread."""

    name: str
    run_id: str
    start_time: Optional[float]
    kpi_interval: float
    waiting: int
    expected: int
    vms: Tuple[VmFacts, ...]
    runs: Mapping[Tuple[str, str], int]
    buckets: Tuple[int, ...]
    lateness_sum: float


def vm_facts(session: VmSession, start: Optional[float], now: float) -> VmFacts:
    """One VM's :class:`VmFacts` (``start``: the experiment start, UTC epoch s, or None; ``now``:
    UTC epoch s: a configured VM is ``running`` once ``now`` passed the start)."""
    st = session.state
    connected = session.connected
    frames = session.decoder_stats()
    return VmFacts(
        session.name,
        st.word(start, now, session.presence()),
        connected,
        st.last_seen,
        st.failures,
        st.max_lateness,
        frames.malformed,
        frames.oversize,
        tuple((kind, n) for kind, n in session.counters.refused().items() if n),
        st.kpi,
    )


class ConsoleMetrics:
    """The console's Prometheus metrics of ``experiment``.

    A prometheus-client collector of its own :attr:`registry`. Reports are counted as they are
    stored (:meth:`observe`; thread-safe: the console's first fold runs in a worker thread).
    The live state is read at each scrape (:meth:`snapshot`, a few ms at 1000 VMs: on the host's
    event loop, where the state changes); making the text of it is most of a scrape's cost and
    reads nothing else (:meth:`render` with a snapshot, in a worker thread: :meth:`exposition`).

    Args:
        experiment: the served experiment (``sessions``, ``barrier``, ``config``, ``run_id``).
        clock: UTC epoch seconds now (the state word of a configured VM depends on it; default
            the experiment's clock).

    Attributes:
        registry: the registry :meth:`render` exposes (never the global one).
    """

    def __init__(self, experiment: Experiment, clock: Optional[Callable[[], float]] = None) -> None:
        self.experiment = experiment
        self.clock = clock or experiment.clock.time
        self._lock = threading.Lock()
        self._runs: Dict[Tuple[str, str], int] = {}
        #: lateness observations per bucket of :data:`LATENESS_BUCKETS`, the last one +Inf
        self._buckets: List[int] = [0] * (len(LATENESS_BUCKETS) + 1)
        self._lateness_sum = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._last: Optional[Tuple[float, Tuple[bytes, str]]] = None  # (monotonic s, render)
        self._pending: Optional[asyncio.Future[Tuple[bytes, str]]] = None

    def observe(self, vm: str, event: Event, received: float) -> None:
        """Count one newly stored report of ``vm`` (received at host UTC ``received``).

        Entry reports count in ``vmr_entry_runs_total`` (:func:`run_status`); an
        ``entry_started`` of a positive entry (:func:`is_positive`) with a finite lateness adds
        it (s, an early start as 0, so the histogram's sum never decreases) to
        ``vmr_entry_lateness_seconds``. A malformed payload is ignored (the session counts it
        in ``refused.malformed_payloads``); never raises for a report.
        """
        if event.type not in ENTRY_TYPES:
            return
        try:
            p = parse_payload(event)
        except PayloadError:
            return
        status = run_status(p)
        if status is None:
            return
        late: Optional[float] = None
        if isinstance(p, EntryStarted) and p.lateness is not None and is_positive(p):
            late = max(p.lateness, 0.0)
        with self._lock:
            key = (vm, status)
            self._runs[key] = self._runs.get(key, 0) + 1
            if late is not None:
                self._buckets[bisect.bisect_left(LATENESS_BUCKETS, late)] += 1
                self._lateness_sum += late

    def snapshot(self) -> Snapshot:
        """What a scrape shows now: the live state of every VM and the counts so far."""
        exp = self.experiment
        now = self.clock()
        start = exp.barrier.start_time
        vms = tuple(vm_facts(s, start, now) for s in exp.sessions.values())
        with self._lock:
            runs = dict(self._runs)
            buckets = tuple(self._buckets)
            total = self._lateness_sum
        return Snapshot(
            exp.config.name, exp.run_id, start, exp.kpi_interval, exp.barrier.waiting_count(),
            len(exp.barrier.active), vms, runs, buckets, total,
        )  # fmt: skip

    def describe(self) -> Iterable[Metric]:
        """The families :meth:`collect` yields, without samples (prometheus-client's name check)."""
        info = InfoMetricFamily(INFO_METRIC, HELP[INFO_METRIC], labels=("name", "run_id"))
        return [*new_families().values(), HistogramMetricFamily(LATENESS_METRIC, HELP[LATENESS_METRIC]), info]

    def collect(self) -> Iterable[Metric]:
        """Every metric now (prometheus-client's collector protocol): :func:`families` of
        :meth:`snapshot`."""
        return families(self.snapshot())

    def render(self, snap: Optional[Snapshot] = None) -> Tuple[bytes, str]:
        """The exposition (the text format, UTF-8 bytes) of ``snap``, or of :attr:`registry` now,
        and its content type: prometheus-client's ``CONTENT_TYPE_LATEST`` (``text/plain;
        version=1.0.0; charset=utf-8`` with 0.26; every name here is a classic one, so
        Prometheus 2 reads it too), for ``GET /metrics``. With ``snap`` it reads nothing else:
        it may run in a worker thread."""
        with paused_gc():  # ~10 small objects per line, no cycles: collection passes only cost
            if snap is None:
                return generate_latest(self.registry), CONTENT_TYPE_LATEST
            return generate_latest(_Frozen(snap)), CONTENT_TYPE_LATEST

    async def exposition(self) -> Tuple[bytes, str]:
        """:meth:`render` for ``GET /metrics`` on the host's event loop: the :meth:`snapshot` is
        taken on the loop, the text made in a worker thread (the loop keeps running: it gets
        the GIL back every few ms instead of waiting the whole render); scrapes meanwhile share
        that render, and one younger than :data:`FRESH` s is served again. A scrape that goes
        away does not cancel the render the others wait for."""
        last = self._last
        if last is not None and self.experiment.clock.monotonic() - last[0] < FRESH:
            return last[1]
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._render_off_loop())
        return await asyncio.shield(self._pending)

    async def _render_off_loop(self) -> Tuple[bytes, str]:
        try:
            snap = self.snapshot()
            done = await asyncio.to_thread(self.render, snap)
            self._last = (self.experiment.clock.monotonic(), done)
            return done
        finally:
            self._pending = None


class _Frozen:
    """A collector of one :class:`Snapshot`."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterable[Metric]:
        return families(self.snap)


def families(snap: Snapshot) -> List[Metric]:
    """The metric families of ``snap`` (pure; O(VMs))."""
    made = new_families()
    counts = dict.fromkeys(STATES, 0)
    for facts in snap.vms:
        vm_samples(made, facts)
        counts[facts.word] = counts.get(facts.word, 0) + 1
    for word, n in counts.items():
        made["vmr_vms"].add_metric([word], n)
    made["vmr_vms_connected"].add_metric([], sum(1 for f in snap.vms if f.connected))
    made["vmr_barrier_waiting"].add_metric([], snap.waiting)
    made["vmr_barrier_expected"].add_metric([], snap.expected)
    if snap.start_time is not None:
        made["vmr_experiment_start_time_seconds"].add_metric([], snap.start_time)
    made["vmr_kpi_interval_seconds"].add_metric([], snap.kpi_interval)
    runs = made["vmr_entry_runs"]
    for vm in sorted({f.vm for f in snap.vms} | {vm for vm, _status in snap.runs}):
        for status in RUN_STATUSES:
            runs.add_metric([vm, status], snap.runs.get((vm, status), 0))
    info = InfoMetricFamily(INFO_METRIC, HELP[INFO_METRIC])
    info.add_metric([], {"name": label_text(snap.name), "run_id": label_text(snap.run_id)})
    return [info, *made.values(), lateness_histogram(snap.buckets, snap.lateness_sum)]


def lateness_histogram(buckets: Sequence[int], total: float) -> HistogramMetricFamily:
    """``vmr_entry_lateness_seconds`` of the observations per bucket (not cumulative, the last
    one +Inf) and their sum (s)."""
    hist = HistogramMetricFamily(LATENESS_METRIC, HELP[LATENESS_METRIC])
    cumulative, pairs = 0, []
    for bound, count in zip((*LATENESS_BUCKETS, math.inf), buckets):
        cumulative += count
        pairs.append((le_text(bound), float(cumulative)))
    hist.add_metric([], pairs, total)
    return hist


def vm_samples(made: Families, f: VmFacts) -> None:
    """Add one VM's samples to the families ``made``."""
    vm = f.vm
    one = [vm]
    made["vmr_vm_state"].add_metric([vm, f.word], 1)
    made["vmr_vm_connected"].add_metric(one, 1 if f.connected else 0)
    if f.last_seen is not None:
        made["vmr_vm_last_seen_timestamp_seconds"].add_metric(one, f.last_seen)
    made["vmr_vm_failures"].add_metric(one, f.failures)
    if f.max_lateness is not None:
        made["vmr_vm_max_lateness_seconds"].add_metric(one, f.max_lateness)
    made["vmr_malformed_frames"].add_metric(one, f.malformed)
    made["vmr_oversize_frames"].add_metric(one, f.oversize)
    for kind, n in f.refused:
        made["vmr_refused"].add_metric([vm, kind], n)
    if f.kpi is not None:
        kpi_samples(made, vm, f.kpi)


def kpi_samples(made: Families, vm: str, kpi: Mapping[str, Any]) -> None:
    """Add the gauges of ``vm``'s latest KPI sample (:func:`~vmr_handler.host.model.vmstate.kpi_record`
    form); a member that is not a number is left out."""
    one = [vm]
    for member, name, factor in KPI_GAUGES:
        value = number(kpi.get(member))
        if value is not None:
            made[name].add_metric(one, value * factor)
    loads = kpi.get("load")
    if isinstance(loads, list):
        for name, load in zip(KPI_LOADS, loads):
            value = number(load)
            if value is not None:
                made[name].add_metric(one, value)
    net = kpi.get("net")
    if isinstance(net, dict):
        for interface, rates in net.items():
            if isinstance(interface, str) and isinstance(rates, dict):
                net_samples(made, vm, label_text(interface), rates)


def net_samples(made: Families, vm: str, interface: str, rates: Mapping[str, Any]) -> None:
    """Add the per-second rates of one network interface of ``vm`` (labels ``vm``, ``interface``)."""
    labels = [vm, interface]
    for member, name in KPI_NET:
        value = number(rates.get(member))
        if value is not None:
            made[name].add_metric(labels, value)
