"""The console's ``/metrics`` (:mod:`vmr_handler.host.console.metrics`) on a
real :class:`Experiment` with real :class:`VmSession`\\ s on real logs: reports are fed as frames
to the sessions, stored, applied and passed to the metrics the way the console's watcher does;
the exposition is parsed with prometheus-client's parser and every value checked: entry runs by
status, the lateness histogram (buckets, count, sum; negative entries and early starts), the
state one-hot and counts before and after the start, the barrier, KPI gauges per interface,
malformed frames and refused reports, and a guest's hostile interface name."""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from tests.test_payloads import _Link
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import encode_message
from vmr_handler.host.console import metrics as metrics_module
from vmr_handler.host.console.metrics import LATENESS_BUCKETS, RUN_STATUSES, ConsoleMetrics, le_text
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.model.stateword import STATES
from vmr_handler.host.model.vmstate import short
from vmr_handler.host.serve.config import HostConfig, Limits, VmSpec
from vmr_handler.host.serve.experiment.experiment import Experiment
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.session.api import HostEvents
from vmr_handler.host.serve.session.session import VmSession

T0 = 1_700_000_000.0
SCHEDULE = b"- {start_time: -5, executable: /bin/true}\n- {start_time: 1, executable: /bin/true}\n"
GiB = 1 << 30
KPI: Dict[str, Any] = {
    "interval": 10, "cpu_percent": 12.5, "load": [0.52, 0.3, 0.1],
    "mem_used": 1.5 * GiB, "mem_available": 2 * GiB, "mem_total": 4 * GiB,
    "disk_used": 5 * GiB, "disk_total": 20 * GiB, "disk_read_rate": 0.0, "disk_write_rate": 12_800.0,
    "net": {"eth0": {"bytes_sent": 300.0, "bytes_recv": 1536.0, "packets_sent": 3.0, "packets_recv": 4.0}},
}  # fmt: skip
#: An interface name a hostile guest chose: quotes, backslashes, a newline, a fake sample, a
#: lone surrogate (no UTF-8 can hold it).
HOSTILE = 'ev"il\\\n} 1\nvmr_vms{state="x"} 9\ud800'


class Host:
    """A real experiment of VMs ``names`` (expected, logs in ``logs``), its sessions connected
    to fake links, and its :class:`ConsoleMetrics` fed by a watcher like the console's."""

    def __init__(self, logs: Path, names: List[str], limits: Limits) -> None:
        specs = {n: VmSpec(n, str(logs / f"{n}.yaml"), SCHEDULE, hashlib.sha256(SCHEDULE).hexdigest(), "yaml")
                 for n in names}  # fmt: skip
        config = HostConfig(
            vms=specs, expected=frozenset(names), logs=str(logs), channels=str(logs),
            start_buffer=1.0, limits=limits, name='exp "one"',
        )  # fmt: skip
        self.sessions: Dict[str, VmSession] = {}
        self.experiment = Experiment(config, self.sessions)
        self.experiment.load()
        for n, spec in specs.items():
            vmlog = VmLog(str(logs), n, limits.log_quota)
            transfers = TransferStore(str(logs), n, limits.transfer_file, limits.transfer_total)
            session = VmSession(
                spec, True, limits, vmlog, transfers, ResourceStore(None), self.experiment, HostEvents(), {}
            )
            self.sessions[n] = session
            transfers.open()
            vmlog.open(replay=session.apply)
        self.experiment.replayed()
        self.now = T0
        self.metrics = ConsoleMetrics(self.experiment, clock=lambda: self.now)
        self.experiment.watchers.append(self._stored)
        self._ids = 0

    def _stored(self, vm: str, events: List[Event], received: float) -> None:
        for ev in events:
            self.metrics.observe(vm, ev, received)

    def report(self, vm: str, type_: str, **data: Any) -> None:
        """``vm`` sends one report now (a frame on its channel)."""
        self._ids += 1
        self.now += 0.1
        ev = Event(type_, self.now, f"{vm}-{self._ids}", data)
        self.sessions[vm].feed(encode_message([ev], self.now), self.now)

    def scrape(self) -> Dict[str, Any]:
        """The exposition parsed: metric name -> family."""
        body, kind = self.metrics.render()
        assert kind == CONTENT_TYPE_LATEST and kind.startswith("text/plain; version=")
        return {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}


def values(family: Any, sample: str = "") -> Dict[Tuple[Tuple[str, str], ...], float]:
    """A family's samples named ``sample`` (default: the family's name): sorted labels -> value."""
    name = sample or family.name
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name == name}


def by_vm(family: Any, sample: str = "") -> Dict[str, float]:
    return {dict(k)["vm"]: v for k, v in values(family, sample).items()}


def _scenario(tmp_path: Path) -> Host:
    """vm1 runs entries and reports KPIs from a hostile interface; vm2 fails an entry, sends a
    malformed report and garbage frames, then fails; vm3 is never seen."""
    h = Host(tmp_path, ["vm1", "vm2", "vm3"], Limits(max_frame=4096))
    for vm in ("vm1", "vm2"):
        assert h.sessions[vm].attach(_Link(), h.now)  # type: ignore[arg-type]
    h.report("vm1", "entry_started", index=0, start_time=-5, lateness=0.5)  # negative: no lateness
    h.report("vm1", "entry_exited", index=0, status="success", exit_code=0)
    h.report("vm1", "configured")
    h.report("vm1", "entry_started", index=1, start_time=1, scheduled=T0 + 1, lateness=0.003)
    h.report("vm1", "entry_exited", index=1, status="error", exit_code=3)
    h.report("vm1", "entry_started", index=2, start_time=2, scheduled=T0 + 2, lateness=-0.01)  # early
    h.report("vm1", "kpi", **dict(KPI, net={**KPI["net"], HOSTILE: {"bytes_recv": 7.0, "bytes_sent": "x"}}))
    h.report("vm2", "configured")
    h.report("vm2", "entry_started", index=1, start_time=1, scheduled=T0 + 1, lateness=0.2)
    h.report("vm2", "entry_failed", index=1, details="not found")
    h.report("vm2", "entry_started", index=2, start_time=3, lateness=120.0)  # positive by start_time
    h.report("vm2", "entry_interrupted", index=2)
    h.report("vm2", "entry_exited", index=3, exit_code=0)  # no status: by the exit code
    h.report("vm2", "entry_started", index=4, start_time=4, lateness=10**400)  # malformed: not counted
    h.sessions["vm2"].feed(b"not json\n" + b"{" * 5000 + b"\n", h.now)
    return h


def test_entry_runs_and_the_lateness_histogram(tmp_path: Path) -> None:
    h = _scenario(tmp_path)
    m = h.scrape()
    runs = {
        (dict(k)["vm"], dict(k)["status"]): v
        for k, v in values(m["vmr_entry_runs"], "vmr_entry_runs_total").items()
    }
    assert runs == {
        **{(vm, s): 0.0 for vm in ("vm1", "vm2", "vm3") for s in RUN_STATUSES},
        ("vm1", "started"): 3.0, ("vm1", "success"): 1.0, ("vm1", "error"): 1.0,
        ("vm2", "started"): 2.0, ("vm2", "failed"): 1.0, ("vm2", "interrupted"): 1.0, ("vm2", "success"): 1.0,
    }  # fmt: skip
    assert m["vmr_entry_runs"].type == "counter"
    hist = m["vmr_entry_lateness_seconds"]
    assert hist.type == "histogram"
    # positive starts: 0.003, early (-0.01 counted as 0), 0.2, 120; vm1's negative entry is not one
    observed = [0.003, 0.0, 0.2, 120.0]
    buckets = {dict(k)["le"]: v for k, v in values(hist, "vmr_entry_lateness_seconds_bucket").items()}
    assert list(buckets) == sorted(buckets, key=float) and float(list(buckets)[-1]) == math.inf
    assert buckets == {
        le_text(b): float(sum(1 for x in observed if x <= b)) for b in (*LATENESS_BUCKETS, math.inf)
    }
    assert (
        buckets["0.001"] == 1.0
        and buckets["0.005"] == 2.0
        and buckets["60.0"] == 3.0
        and buckets["+Inf"] == 4.0
    )
    assert values(hist, "vmr_entry_lateness_seconds_count") == {(): 4.0}
    assert values(hist, "vmr_entry_lateness_seconds_sum")[()] == sum(observed)
    # the malformed report was stored and counted by the session, not by the runs
    refused = {
        (dict(k)["vm"], dict(k)["kind"]): v for k, v in values(m["vmr_refused"], "vmr_refused_total").items()
    }
    assert refused == {("vm2", "malformed_payloads"): 1.0}  # a kind appears at its first count
    assert by_vm(m["vmr_malformed_frames"], "vmr_malformed_frames_total") == {
        "vm1": 0.0,
        "vm2": 1.0,
        "vm3": 0.0,
    }
    assert by_vm(m["vmr_oversize_frames"], "vmr_oversize_frames_total") == {
        "vm1": 0.0,
        "vm2": 1.0,
        "vm3": 0.0,
    }
    # a report the metrics do not read, or an odd entry report, never raises
    h.metrics.observe("vm1", Event("entry_exited", T0, "odd", {"index": "x", "exit_code": "zero"}), T0)
    h.metrics.observe("vm1", Event("output", T0, "out", {"index": 1, "line": "x"}), T0)
    assert (
        values(h.scrape()["vmr_entry_runs"], "vmr_entry_runs_total")[(("status", "error"), ("vm", "vm1"))]
        == 2.0
    )


def test_state_counts_barrier_and_start(tmp_path: Path) -> None:
    h = _scenario(tmp_path)
    h.report("vm2", "vm_failed", details="gave up", index=1)
    m = h.scrape()
    state = {dict(k)["vm"]: dict(k)["state"] for k, v in values(m["vmr_vm_state"]).items() if v == 1.0}
    assert state == {"vm1": "configured", "vm2": "failed", "vm3": "not_seen"}
    assert len(values(m["vmr_vm_state"])) == 3  # one sample per VM: its state
    counts = {dict(k)["state"]: v for k, v in values(m["vmr_vms"]).items()}
    assert set(STATES) <= set(counts) and sum(counts.values()) == 3
    assert counts["configured"] == counts["failed"] == counts["not_seen"] == 1.0 and counts["running"] == 0.0
    assert values(m["vmr_vms_connected"]) == {(): 2.0}
    assert by_vm(m["vmr_vm_connected"]) == {"vm1": 1.0, "vm2": 1.0, "vm3": 0.0}
    assert values(m["vmr_barrier_waiting"]) == {(): 1.0} and values(m["vmr_barrier_expected"]) == {(): 3.0}
    assert "vmr_experiment_start_time_seconds" not in {s.name for f in m.values() for s in f.samples}
    # vm1: an error exit; vm2: a failed entry, then vm_failed: one failed entry (the VM failed)
    assert by_vm(m["vmr_vm_failures"]) == {"vm1": 1.0, "vm2": 1.0, "vm3": 0.0}
    assert by_vm(m["vmr_vm_max_lateness_seconds"]) == {"vm1": 0.5, "vm2": 120.0}  # never seen: absent
    seen = by_vm(m["vmr_vm_last_seen_timestamp_seconds"])
    assert set(seen) == {"vm1", "vm2"} and seen["vm2"] == h.sessions["vm2"].state.last_seen
    info = m["vmr_experiment_info"]  # an info metric is a gauge of 1 in the text format
    assert info.type == "gauge" and values(info) == {
        (("name", 'exp "one"'), ("run_id", h.experiment.run_id)): 1.0
    }

    # the operator releases the barrier: the start is set; vm1 runs once it is passed
    h.experiment.release([])
    start = h.experiment.barrier.start_time
    assert start is not None
    m = h.scrape()
    assert values(m["vmr_experiment_start_time_seconds"]) == {(): start}
    assert values(m["vmr_barrier_waiting"]) == {(): 0.0}
    assert (("state", "configured"), ("vm", "vm1")) in values(m["vmr_vm_state"])
    h.now = start + 0.5
    m = h.scrape()
    assert values(m["vmr_vm_state"])[(("state", "running"), ("vm", "vm1"))] == 1.0
    assert {dict(k)["state"]: v for k, v in values(m["vmr_vms"]).items()}["running"] == 1.0


def test_kpi_gauges_per_interface_and_a_hostile_name(tmp_path: Path) -> None:
    h = _scenario(tmp_path)
    m = h.scrape()
    one = {name: by_vm(m[name]) for name in (
        "vmr_vm_cpu_usage_ratio", "vmr_vm_memory_used_bytes", "vmr_vm_memory_available_bytes",
        "vmr_vm_memory_total_bytes", "vmr_vm_disk_used_bytes", "vmr_vm_disk_total_bytes",
        "vmr_vm_disk_read_bytes_per_second", "vmr_vm_disk_write_bytes_per_second", "vmr_vm_load1",
        "vmr_vm_load5", "vmr_vm_load15", "vmr_vm_kpi_sample_timestamp_seconds",
    )}  # fmt: skip
    assert one["vmr_vm_cpu_usage_ratio"] == {"vm1": 0.125}  # percent as a ratio; only vm1 sent KPIs
    assert one["vmr_vm_memory_used_bytes"] == {"vm1": 1.5 * GiB}
    assert one["vmr_vm_memory_available_bytes"] == {"vm1": 2 * GiB}
    assert one["vmr_vm_memory_total_bytes"] == {"vm1": 4 * GiB}
    assert one["vmr_vm_disk_used_bytes"] == {"vm1": 5 * GiB} and one["vmr_vm_disk_total_bytes"] == {
        "vm1": 20 * GiB
    }
    assert one["vmr_vm_disk_read_bytes_per_second"] == {"vm1": 0.0}
    assert one["vmr_vm_disk_write_bytes_per_second"] == {"vm1": 12_800.0}
    assert (one["vmr_vm_load1"], one["vmr_vm_load5"], one["vmr_vm_load15"]) == (
        {"vm1": 0.52},
        {"vm1": 0.3},
        {"vm1": 0.1},
    )
    assert values(m["vmr_kpi_interval_seconds"]) == {(): 10.0}  # the host's --kpi-interval
    assert one["vmr_vm_kpi_sample_timestamp_seconds"] == {"vm1": h.sessions["vm1"].state.kpi["at"]}  # type: ignore[index]
    # the hostile name: made printable by the host, escaped in the exposition, read back whole
    shown = short(HOSTILE, 64)
    assert shown is not None and "\n" not in shown
    expected = shown.encode("utf-8", "backslashreplace").decode("utf-8")
    recv = {dict(k)["interface"]: v for k, v in values(m["vmr_vm_network_receive_bytes_per_second"]).items()}
    assert recv == {"eth0": 1536.0, expected: 7.0}
    sent = {dict(k)["interface"]: v for k, v in values(m["vmr_vm_network_transmit_bytes_per_second"]).items()}
    assert sent == {"eth0": 300.0}  # the hostile one's "x" is no number: absent
    assert by_vm(m["vmr_vm_network_receive_packets_per_second"]) == {"vm1": 4.0}
    assert by_vm(m["vmr_vm_network_transmit_packets_per_second"]) == {"vm1": 3.0}
    # the fake sample in the name did not become one
    assert {dict(k)["state"] for k in values(m["vmr_vms"])} == set(STATES)


def test_every_metric_has_help_and_a_conventional_name(tmp_path: Path) -> None:
    h = _scenario(tmp_path)
    m = h.scrape()
    described = {f.name + ("_info" if f.type == "info" else "") for f in h.metrics.describe()}
    assert set(m) == described  # every family collected (KPIs present), none undeclared
    for family in m.values():
        assert family.documentation.strip(), family.name
        assert family.name.startswith("vmr_"), family.name
        if family.type == "counter":
            assert {s.name for s in family.samples} == {family.name + "_total"}, family.name
        elif family.type == "gauge":
            assert not family.name.endswith("_total"), family.name
        for s in family.samples:
            assert not math.isnan(s.value), (family.name, s)


def test_a_snapshot_renders_in_another_thread_as_it_was(tmp_path: Path) -> None:
    h = _scenario(tmp_path)
    snap = h.metrics.snapshot()
    assert h.metrics.render(snap) == h.metrics.render()  # nothing changed meanwhile
    h.report("vm1", "entry_started", index=5, start_time=5, scheduled=T0 + 5, lateness=0.04)
    h.sessions["vm1"].feed(b"garbage\n", h.now)
    with ThreadPoolExecutor(1) as pool:
        body, _kind = pool.submit(h.metrics.render, snap).result()
    old = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
    new = h.scrape()
    for m, started, malformed, count in ((old, 3.0, 0.0, 4.0), (new, 4.0, 1.0, 5.0)):
        assert (
            values(m["vmr_entry_runs"], "vmr_entry_runs_total")[(("status", "started"), ("vm", "vm1"))]
            == started
        )
        assert by_vm(m["vmr_malformed_frames"], "vmr_malformed_frames_total")["vm1"] == malformed
        assert values(m["vmr_entry_lateness_seconds"], "vmr_entry_lateness_seconds_count") == {(): count}


def test_exposition_renders_off_the_loop_shared_and_briefly_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _scenario(tmp_path)
    threads: List[str] = []
    render = h.metrics.render

    def spy(snap: Any = None) -> Tuple[bytes, str]:
        threads.append(threading.current_thread().name)
        return render(snap)

    monkeypatch.setattr(h.metrics, "render", spy)

    async def scrapes() -> List[Tuple[bytes, str]]:
        first = await asyncio.gather(h.metrics.exposition(), h.metrics.exposition())  # one render, shared
        again = await h.metrics.exposition()  # younger than FRESH: the same
        h.report("vm1", "entry_started", index=5, start_time=5, scheduled=T0 + 5, lateness=0.04)
        monkeypatch.setattr(metrics_module, "FRESH", 0.0)
        return [*first, again, await h.metrics.exposition()]

    a, b, c, d = asyncio.run(scrapes())
    assert a is b and b is c and d != a
    assert len(threads) == 2 and threading.main_thread().name not in threads
    runs = values(
        {f.name: f for f in text_string_to_metric_families(d[0].decode())}["vmr_entry_runs"],
        "vmr_entry_runs_total",
    )
    assert runs[(("status", "started"), ("vm", "vm1"))] == 4.0
