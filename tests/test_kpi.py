"""KPIs (seed 004): the agent's :class:`~vmr_handler.agent.machine.kpi.KpiSampler`
on a FakeClock (intervals, a change, 0 = off, stop, failing readings, skipped samples), a real
sample of this machine, the host's ``kpi`` payload on hostile data, the latest sample in
``vmr-host status``, and a real ``vmr-handler run --local --kpi-interval`` process.

Timing semantics are checked on the FakeClock (exact instants and rates); nothing here asserts
that something was fast (the cost is measured by ``benchmarks/bench_kpi.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest

from tests.agent import Agent, cli
from tests.hostfakes import FakeExperiment, make_session
from tests.test_payloads import _Link
from vmr_handler.agent.machine.kpi import READINGS, KpiSampler, PsutilProbe, check_interval
from vmr_handler.core.clock import FakeClock
from vmr_handler.core.errors import PayloadError, SavedStateError, UsageError
from vmr_handler.core.events import Event, EventType, describe
from vmr_handler.core.payloads import KPI_NET_FIELDS, MAX_KPI_INTERFACES, Kpi, parse_payload
from vmr_handler.core.readable import kpi_brief, kpi_text, size
from vmr_handler.core.wire.protocol import encode_message
from vmr_handler.host.cli.statustext import format_status, kpi_cell
from vmr_handler.host.model.vmstate import KPI_HISTORY, KPI_NAME, KPI_SERIES, VmState
from vmr_handler.host.serve.config import HostConfig, Limits

T0 = 1_800_000_000.0
GiB = 1 << 30


class Counters:
    """A probe whose counters grow linearly with the FakeClock's monotonic time: 2 cores 25 %
    busy, 1000 B/s read, 4096 B/s written, eth0 100/200 B/s out/in, 1/2 packets/s."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.fail: Set[str] = set()
        self.calls = 0
        self.eth0_reset = False

    def _t(self, name: str) -> float:
        self.calls += 1
        if name in self.fail:
            raise OSError(f"/proc/{name}: No such file or directory")
        return self.clock.monotonic()

    def cpu(self) -> Tuple[float, float]:
        t = self._t("cpu")
        return 0.5 * t, 2.0 * t

    def load(self) -> Tuple[float, float, float]:
        self._t("load")
        return (0.5, 0.25, 0.75)

    def memory(self) -> Dict[str, int]:
        self._t("memory")
        return {"mem_used": GiB, "mem_available": 3 * GiB, "mem_total": 4 * GiB}

    def disk(self) -> Dict[str, int]:
        self._t("disk")
        return {"disk_used": 5 * GiB, "disk_total": 20 * GiB}

    def disk_io(self) -> Tuple[int, int]:
        t = self._t("disk_io")
        return int(1000 * t), int(4096 * t)

    def net(self) -> Dict[str, Tuple[int, int, int, int]]:
        t = self._t("net")
        eth0 = (0, 0, 0, 0) if self.eth0_reset else (int(100 * t), int(200 * t), int(t), int(2 * t))
        return {"eth0": eth0, "eth1": (int(10 * t), 0, 0, 0)}


class Run:
    """A sampler on a FakeClock with the :class:`Counters` probe; ``samples``: (reference UTC,
    data) of every sample reported."""

    def __init__(self, interval: float, **kw: Any) -> None:
        self.clock = FakeClock(T0)
        self.probe = Counters(self.clock)
        self.samples: List[Tuple[float, Dict[str, Any]]] = []
        self.sampler = KpiSampler(self.emit, self.clock, interval, probe=self.probe, **kw)

    def emit(self, type_: EventType, **data: Any) -> None:
        assert type_ is EventType.KPI
        self.samples.append((self.clock.time(), data))

    def at(self) -> List[float]:
        """Experiment-relative instants of the samples (s after T0)."""
        return [round(t - T0, 6) for t, _ in self.samples]


def fake(scenario: Any, interval: float, **kw: Any) -> Run:
    """Run ``scenario(run)`` (a coroutine function) on a started sampler, then close it."""
    run = Run(interval, **kw)

    async def main() -> None:
        run.sampler.start()
        await scenario(run)
        await run.sampler.close()

    asyncio.run(main())
    return run


# ------------------------------------------------------------------------------ the sampler
def test_samples_every_interval_with_rates_from_a_baseline_taken_at_start() -> None:
    async def scenario(run: Run) -> None:
        await run.clock.advance(35)

    run = fake(scenario, 10)
    assert run.at() == [10, 20, 30]
    first = run.samples[0][1]
    assert first["cpu_percent"] == 25.0 and first["elapsed"] == 10  # the baseline was read at start
    assert (first["disk_read_bytes"], first["disk_write_bytes"]) == (10_000, 40_960)
    assert (first["disk_read_rate"], first["disk_write_rate"]) == (1000.0, 4096.0)
    eth0 = {"bytes_sent": 100.0, "bytes_recv": 200.0, "packets_sent": 1.0, "packets_recv": 2.0}
    assert first["net"]["eth0"] == eth0 and first["net"]["eth1"]["bytes_sent"] == 10.0
    assert first["load"] == [0.5, 0.25, 0.75] and first["interval"] == 10
    assert (first["mem_used"], first["mem_available"], first["mem_total"]) == (GiB, 3 * GiB, 4 * GiB)
    assert (first["disk_used"], first["disk_total"]) == (5 * GiB, 20 * GiB)
    assert first["duration"] >= 0 and "errors" not in first
    json.dumps([d for _, d in run.samples], allow_nan=False)  # strict JSON, as every report
    assert run.sampler.samples == 3 and run.sampler.skipped == 0


def test_an_interval_change_takes_effect_at_once() -> None:
    async def scenario(run: Run) -> None:
        await run.clock.advance(25)  # samples at 10, 20
        run.sampler.set_interval(2)  # due 22, already past: at once, then every 2 s from here
        await run.clock.advance(6)
        run.sampler.set_interval(30)  # last sample at 31: next at 61, none before
        await run.clock.advance(40)

    run = fake(scenario, 10)
    assert run.at() == [10, 20, 25, 27, 29, 31, 61]
    assert run.samples[2][1]["elapsed"] == 5 and run.samples[2][1]["interval"] == 2
    assert run.samples[-1][1]["elapsed"] == 30 and run.samples[-1][1]["interval"] == 30


def test_zero_is_off_and_turning_it_on_takes_a_fresh_baseline() -> None:
    async def scenario(run: Run) -> None:
        await run.clock.advance(100)
        assert run.probe.calls == 0  # off: nothing is even read
        run.sampler.set_interval(5)  # on at 100: baseline now, samples from 105
        await run.clock.advance(12)
        run.sampler.set_interval(0)  # off again at 112
        await run.clock.advance(50)
        run.sampler.set_interval(4)  # on at 162: a fresh baseline, not the one of 110
        await run.clock.advance(4)

    run = fake(scenario, 0)
    assert run.at() == [105, 110, 166]
    assert [d["elapsed"] for _, d in run.samples] == [5, 5, 4]


def test_stop_ends_sampling_at_once() -> None:
    async def scenario(run: Run) -> None:
        await run.clock.advance(15)
        run.sampler.stop()
        await run.clock.advance(100)

    run = fake(scenario, 10)
    assert run.at() == [10]


def test_bad_intervals_are_refused_and_leave_the_interval_unchanged() -> None:
    for good, value in ((0, 0.0), (0.1, 0.1), ("2.5", 2.5), (10, 10.0)):
        assert check_interval(good) == value
    refused = r"kpi_interval must be 0 \(off\) or a finite number of seconds >= 0\.1, got "
    for bad in (-1, 0.05, math.nan, math.inf, "soon", None, True, [1]):
        with pytest.raises(UsageError, match=refused):
            check_interval(bad)
    run = Run(10)
    with pytest.raises(UsageError, match="got -3"):
        run.sampler.set_interval(-3)
    assert run.sampler.interval == 10
    with pytest.raises(UsageError, match="--kpi-interval must be"):
        check_interval(0.01, "--kpi-interval")


def test_a_reading_that_fails_is_reported_once_and_left_out(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(run: Run) -> None:
        run.probe.fail = {"disk_io", "load"}
        await run.clock.advance(30)

    with caplog.at_level(logging.WARNING, logger="vmr_handler.agent.machine.kpi"):
        run = fake(scenario, 10)
    datas = [d for _, d in run.samples]
    assert len(datas) == 3  # never fatal: every sample still comes
    assert set(datas[0]["errors"]) == {"disk_io", "load"}  # reported once ...
    assert datas[0]["errors"]["disk_io"] == "OSError: /proc/disk_io: No such file or directory"
    assert all("errors" not in d for d in datas[1:])  # ... and not again
    for d in datas:
        assert "load" not in d and "disk_read_rate" not in d and "disk_read_bytes" not in d
        assert d["cpu_percent"] == 25.0 and d["mem_total"] == 4 * GiB  # the rest is there
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and any("KPI disk_io cannot be read" in w for w in warnings), warnings


def test_a_counter_that_goes_back_gives_no_rate_that_time() -> None:
    async def scenario(run: Run) -> None:
        await run.clock.advance(10)
        run.probe.eth0_reset = True  # the interface was reset: its counters start again
        await run.clock.advance(10)
        run.probe.eth0_reset = False
        await run.clock.advance(10)

    run = fake(scenario, 10)
    nets = [d["net"] for _, d in run.samples]
    assert set(nets[0]) == {"eth0", "eth1"}
    assert set(nets[1]) == {"eth1"}  # no negative rate for eth0
    assert nets[2]["eth0"]["bytes_sent"] == 300.0  # 3000 bytes in 10 s: from 0 after the reset


def test_skipped_samples_and_an_emit_that_fails_do_not_stop_sampling() -> None:
    held = {"now": False}

    async def scenario(run: Run) -> None:
        await run.clock.advance(10)
        held["now"] = True  # reports are held (a full disk): samples are skipped
        await run.clock.advance(20)
        held["now"] = False
        await run.clock.advance(10)

    run = fake(scenario, 10, skip=lambda: held["now"])
    assert run.at() == [10, 40]
    assert run.samples[1][1]["elapsed"] == 30  # the rates cover the time since the last one taken
    assert (run.sampler.samples, run.sampler.skipped) == (2, 2)

    calls: List[float] = []

    def failing(type_: EventType, **data: Any) -> None:
        calls.append(clock.time())
        raise RuntimeError("sink broken")

    clock = FakeClock(T0)
    sampler = KpiSampler(failing, clock, 1, probe=Counters(clock))

    async def main() -> None:
        sampler.start()
        await clock.advance(3)
        await sampler.close()

    asyncio.run(main())
    assert [c - T0 for c in calls] == [1, 2, 3]


# ------------------------------------------------------------------------------ a real sample
def test_a_real_sample_of_this_machine(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    sampler = KpiSampler(lambda *a, **k: None, clock, 1.0, path=str(tmp_path))
    baseline = sampler.sample()  # a sampler without a previous sample reports no rates
    assert "errors" not in baseline and "elapsed" not in baseline and "cpu_percent" not in baseline, baseline
    data = sampler.sample()
    assert set(data) >= {"interval", "cpu_count", "load", "mem_used", "mem_available", "mem_total",
                         "disk_used", "disk_total", "duration"}  # fmt: skip
    assert 0 < data["mem_available"] <= data["mem_total"] and 0 < data["mem_used"] <= data["mem_total"]
    assert 0 < data["disk_used"] <= data["disk_total"]
    assert len(data["load"]) == 3 and all(v >= 0 for v in data["load"])
    assert data["cpu_count"] >= 1 and data["duration"] >= 0
    # rates over real time: the FakeClock did not move, so none; move it and they come
    assert "cpu_percent" not in data and "net" not in data
    asyncio.run(clock.advance(2.0))
    time.sleep(0.3)  # (the CPU counters move in 10 ms ticks: give them some)
    data = sampler.sample()
    assert 0 <= data["cpu_percent"] <= 100 and data["elapsed"] == 2.0
    assert data["disk_read_rate"] >= 0 and data["disk_write_rate"] >= 0
    nets = data["net"]
    assert 0 < len(nets) <= MAX_KPI_INTERFACES
    if set(PsutilProbe(str(tmp_path)).net()) != {"lo"}:
        assert "lo" not in nets  # loopback only when it is the only interface
    assert all(set(r) == set(KPI_NET_FIELDS) and min(r.values()) >= 0 for r in nets.values())
    json.dumps(data, allow_nan=False)
    # what the agent sends, the host reads whole: every field a number
    kpi = Kpi.parse(data)
    numbers = ("cpu_percent", "load_1", "load_5", "load_15", "mem_used", "mem_available", "mem_total",
               "disk_used", "disk_total", "disk_read_rate", "disk_write_rate", "interval")  # fmt: skip
    for name in numbers:
        assert isinstance(getattr(kpi, name), float), name
    assert set(kpi.net) == set(data["net"])
    assert set(READINGS) == {"cpu", "load", "memory", "disk", "disk_io", "net"}


def test_the_readable_line_of_a_kpi_event() -> None:
    data = {
        "interval": 10, "cpu_percent": 12.5, "load": [0.52, 0.3, 0.1], "mem_used": 1.5 * GiB,
        "mem_available": 2 * GiB, "mem_total": 4 * GiB, "disk_used": 5 * GiB, "disk_total": 20 * GiB,
        "disk_read_rate": 0.0, "disk_write_rate": 12_800.0, "duration": 0.0004,
        "net": {f"eth{i}": {"bytes_recv": 1536.0, "bytes_sent": 300.0} for i in range(6)},
        "errors": {"disk_io": "OSError: no disk I/O counters on this machine"},
    }  # fmt: skip
    line = describe(Event("kpi", T0, "k-1", data), T0 - 12.0)
    assert line.startswith("2027-01-15T08:00:00.000Z t=+12.0s kpi cpu 12.5%; load 0.52 0.3 0.1; "), line
    assert "mem 1.50 GiB/4.00 GiB (2.00 GiB available); disk 5.00 GiB/20.0 GiB" in line
    assert "disk read 0 B/s write 12.5 KiB/s" in line
    assert "net eth0 in 1.50 KiB/s out 300 B/s" in line and "eth3 in" in line and "(+2 more)" in line
    assert "unavailable: " in line and "no disk I/O counters" in line and line.endswith("sampled in 0.4 ms")
    assert kpi_brief(data) == "cpu 12.5%, mem 1.50 GiB/4.00 GiB, load 0.52"
    sizes = [size(v) for v in (0, 1023, 1024, 10 * 1024**2, 3.5 * GiB)]
    assert sizes == ["0 B", "1023 B", "1.00 KiB", "10.0 MiB", "3.50 GiB"]
    # a guest's odd values: left out, never an error
    for odd in ({}, {"load": "x", "net": [1], "errors": 3}, {"cpu_percent": 10**400, "net": {"e": 5}},
                {"load": [None, float("nan")], "mem_used": True, "disk_read_rate": "1"}):  # fmt: skip
        assert isinstance(kpi_text(odd), str) and isinstance(kpi_brief(odd), str)
    assert kpi_text({}) == "(no values)" and kpi_brief({}) == "-"


# ------------------------------------------------------------------------------ the host
GOOD = {
    "interval": 10, "cpu_count": 2, "cpu_percent": 12.5, "load": [0.52, 0.3, 0.1],
    "mem_used": 1.5 * GiB, "mem_available": 2 * GiB, "mem_total": 4 * GiB,
    "disk_used": 5 * GiB, "disk_total": 20 * GiB, "disk_read_bytes": 0, "disk_write_bytes": 128_000,
    "disk_read_rate": 0.0, "disk_write_rate": 12_800.0, "elapsed": 10.0, "duration": 0.0004,
    "net": {"eth0": {"bytes_sent": 300.0, "bytes_recv": 1536.0, "packets_sent": 3.0, "packets_recv": 4.0},
            "eth1": {"bytes_sent": 100.0, "bytes_recv": 64.0, "packets_sent": 1.0, "packets_recv": 1.0}},
}  # fmt: skip


def _session(logs: Path) -> Any:
    """VM ``vm1``'s real host session (its log in ``logs``), connected."""
    session = make_session(logs, b"- {start_time: 1, executable: /bin/true}\n", Limits())
    assert session.attach(_Link(), T0)  # type: ignore[arg-type]
    return session


def _state() -> VmState:
    return VmState("vm1", "d", "sched-1", FakeExperiment())  # type: ignore[arg-type]


def test_the_host_keeps_the_latest_sample_and_a_bounded_series() -> None:
    state = _state()
    assert state.fields()["kpi"] is None
    for i in range(KPI_HISTORY + 40):
        state.apply(Event("kpi", T0 + i, f"k-{i}", dict(GOOD, cpu_percent=float(i))), T0 + i + 0.5)
    kpi = state.fields()["kpi"]
    assert kpi["cpu_percent"] == KPI_HISTORY + 39 and kpi["at"] == T0 + KPI_HISTORY + 39.5
    assert kpi["load"] == [0.52, 0.3, 0.1] and kpi["mem_total"] == 4 * GiB and kpi["interval"] == 10
    assert kpi["net"]["eth0"]["bytes_recv"] == 1536.0
    json.dumps(state.fields(), allow_nan=False)
    series = state.kpi_series()
    assert list(series) == list(KPI_SERIES)
    assert len(series["at"]) == KPI_HISTORY and series["cpu_percent"][0] == 40.0  # the oldest dropped
    assert series["net_recv"][-1] == 1600.0 and series["net_sent"][-1] == 400.0  # every interface
    assert series["mem_used"][-1] == 1.5 * GiB and series["load_1"][-1] == 0.52

    # the restart checkpoint keeps them; an older host's checkpoint (none) restores too
    again = _state()
    again.restore(json.loads(json.dumps(state.snapshot())))
    assert again.fields()["kpi"] == state.fields()["kpi"] and again.kpi_series() == series
    older = {k: v for k, v in state.snapshot().items() if not k.startswith("kpi")}
    third = _state()
    third.restore(older)
    assert third.kpi is None and not third.kpi_history
    for bad in ({"kpi": [1]}, {"kpi_history": "x"}, {"kpi_history": [[1, 2]]}, {"kpi_history": [["a"] * 8]}):
        with pytest.raises(SavedStateError, match="bad kpi or kpi_history"):
            _state().restore(dict(state.snapshot(), **bad))


def test_hostile_kpi_reports_are_bounded_or_counted_as_malformed(tmp_path: Path) -> None:
    state = _state()
    many = {f"if{i}": {"bytes_sent": 1.0} for i in range(10_000)}
    state.apply(Event("kpi", T0, "k-1", {"net": many, "cpu_percent": "high", "load": "x"}), T0)
    kpi = state.fields()["kpi"]
    assert len(kpi["net"]) == MAX_KPI_INTERFACES and kpi["cpu_percent"] is None and kpi["load"] == [None] * 3
    name = "\x1b[31m" + "A" * 100_000
    odd = {name: {"bytes_sent": math.inf, "bytes_recv": True, "packets_sent": "1"}, "ok": 5, "x": [1]}
    state.apply(Event("kpi", T0, "k-2", {"net": odd, "load": [1, math.nan]}), T0 + 1)
    kpi = state.fields()["kpi"]
    (kept,) = kpi["net"]  # the interfaces that are not objects are skipped
    assert len(kept) <= KPI_NAME + 20 and "\x1b" not in kept  # printable, cut
    assert kpi["net"][kept] == dict.fromkeys(KPI_NET_FIELDS)  # no finite numbers: None
    assert kpi["load"] == [1.0, None, None]
    # a number no float can hold is malformed: the report is not applied
    for bad in ({"mem_used": 10**400}, {"load": [10**400]}, {"net": {"eth0": {"bytes_recv": 10**400}}}):
        with pytest.raises(PayloadError, match="malformed kpi event"):
            parse_payload(Event("kpi", T0, "k-x", bad))
    with pytest.raises(PayloadError, match=r"'net\.eth0\.bytes_recv' is a number no float can hold"):
        Kpi.parse({"net": {"eth0": {"bytes_recv": 10**400}}})

    # over a real session: stored, counted, not applied; the good ones shown
    session = _session(tmp_path)
    reports = [
        Event("kpi", T0, "h-1", GOOD),
        Event("kpi", T0 + 1, "h-2", dict(GOOD, mem_total=10**400)),
        Event("kpi", T0 + 2, "h-3", {"data": "not what a sample holds"}),
    ]
    session.feed(encode_message(reports, T0 + 2), T0 + 3)
    status = session.status(None, T0 + 4)
    assert status["refused"]["malformed_payloads"] == 1 and status["events"]["stored"] == 3
    assert status["kpi"]["at"] == T0 + 3 and status["kpi"]["cpu_percent"] is None  # h-3: nothing in it
    log = (tmp_path / "vm1.log").read_text()
    assert "malformed kpi event: 'mem_total' is a number no float can hold: dropped" in log
    assert "kpi cpu 12.5%; load 0.52 0.3 0.1" in log  # the readable log line
    session.log.close()


def _host(*args: str) -> subprocess.CompletedProcess[str]:
    """``vmr-host ARGS`` run to completion."""
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", *args], capture_output=True, text=True, timeout=60
    )


def test_status_shows_the_latest_sample(tmp_path: Path) -> None:
    past = time.time() - 600  # ten minutes ago
    session = _session(tmp_path)
    samples = [Event("kpi", past + i, f"s-{i}", dict(GOOD, cpu_percent=c)) for i, c in enumerate((50, 12.5))]
    session.feed(encode_message(samples, past + 1), past + 1)
    assert session.status(None, past + 2)["kpi"]["cpu_percent"] == 12.5
    session.log.close()
    # `vmr-host status` with no host running reads the logs: the latest sample, in a KPI column
    res = _host("status", "--logs", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    header = next(ln for ln in res.stdout.splitlines() if ln.startswith("VM "))
    assert "KPI" in header.split() and header.index("FAILURES") < header.index("KPI") < header.index("NOTES")
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("vm1 "))
    assert "cpu 12.5%, mem 1.50 GiB/4.00 GiB, load 0.52" in row and "old)" in row  # long ago: its age
    res = _host("status", "--json", "--logs", str(tmp_path))
    (vm,) = json.loads(res.stdout)["vms"]
    assert vm["kpi"]["cpu_percent"] == 12.5 and vm["kpi"]["at"] == past + 1

    # a fresh sample has no age; no VM with KPIs: no column at all
    result = json.loads(res.stdout)
    assert kpi_cell(vm, past + 5) == "cpu 12.5%, mem 1.50 GiB/4.00 GiB, load 0.52"
    assert kpi_cell(vm, past + 151) == "cpu 12.5%, mem 1.50 GiB/4.00 GiB, load 0.52 (2.5 min old)"
    vm["kpi"] = None
    assert "KPI" not in format_status(result).split("\n")[3].split()


def test_the_host_option_and_its_default(tmp_path: Path) -> None:
    assert HostConfig({}, frozenset(), "logs", "channels").kpi_interval == 10.0
    from vmr_handler.host.cli.serve import build_config
    from vmr_handler.host.cli.vmr_host import parser as _parser

    (tmp_path / "vm1.yaml").write_text("- {start_time: 1, executable: /bin/true}\n")
    base = ["serve", "--schedules", str(tmp_path), "--logs", str(tmp_path / "logs")]
    assert build_config(_parser().parse_args(base)).kpi_interval == 10.0
    assert build_config(_parser().parse_args([*base, "--kpi-interval", "2.5"])).kpi_interval == 2.5
    assert build_config(_parser().parse_args([*base, "--kpi-interval", "0"])).kpi_interval == 0.0
    for bad in ("0.05", "-1", "nan", "inf"):
        res = _host(*base, "--kpi-interval", bad)
        assert res.returncode == 2 and "--kpi-interval" in res.stderr, res.stderr


# ------------------------------------------------------------------------------ a real agent
def test_run_local_reports_kpi_events(tmp_path: Path, agents: List[Agent]) -> None:
    sched = [{"start_time": 0.5, "executable": "sleep", "arguments": "1.5"}]
    a = Agent(tmp_path, sched, start_buffer=0, extra=["--kpi-interval", "0.2"])
    agents.append(a)
    assert a.run() == 0, a.log()
    events = a.events()
    kpis = [e for e in events if e["type"] == "kpi"]
    assert len(kpis) >= 2, a.log()  # a 2 s schedule sampled every 0.2 s
    ids = [e["id"] for e in events]
    assert len(set(ids)) == len(ids)  # unique ids, as every report
    types = [e["type"] for e in events]
    assert types.index("agent_started") < types.index("kpi")
    for e in kpis:
        d = e["data"]
        assert d["interval"] == 0.2 and 0 <= d["cpu_percent"] <= 100 and d["mem_total"] > 0
        assert len(d["load"]) == 3 and d["elapsed"] > 0
        assert isinstance(Kpi.parse(d).mem_used, float)
    stamps = [e["timestamp"] for e in kpis]
    assert stamps == sorted(stamps)
    assert "kpi cpu " in a.log()  # the readable log on stderr

    # without the flag: none; a bad interval: exit 2, naming the option, before anything runs
    other = tmp_path / "s2"
    res = cli("run", "--local", str(a.schedule_path), "--kpi-interval", "0.01", "--state-dir", str(other))
    assert res.returncode == 2, res.stderr
    assert "--kpi-interval must be 0 (off) or a finite number of seconds >= 0.1, got 0.01" in res.stderr
    assert not other.exists()


@pytest.mark.parametrize("transport", ["unix", "mqtt"])
def test_the_hosts_interval_reaches_connected_agents_and_their_samples_come_back(transport: str) -> None:
    # wired end to end: serve --kpi-interval -> welcome -> the agent samples ->
    # kpi reports, stored once each in <vm>.jsonl and the latest shown by `vmr-host status`
    from tests.hostenv import HostEnv

    sched = [{"start_time": -5, "executable": "/bin/true"}, {"start_time": 30, "executable": "/bin/true"}]
    env = HostEnv({"a": sched, "b": sched}, start_buffer=0.5, transport=transport)
    try:
        env.start_host("--kpi-interval", "0.3")
        for vm in ("a", "b"):
            env.start_agent(vm)
        for vm in ("a", "b"):
            env.wait_for(lambda vm=vm: len(env.events(vm, "kpi")) >= 3, f"{vm}: three kpi reports")
            ids = [r["event"]["id"] for r in env.events(vm, "kpi")]
            assert len(ids) == len(set(ids))
            data = env.events(vm, "kpi")[-1]["event"]["data"]
            assert data["interval"] == 0.3 and data["mem_total"] > 0
            assert 0.0 <= data["cpu_percent"] <= 100.0
        def every_vm_has_kpis() -> Any:
            status = env.status()
            return status if all(v.get("kpi") for v in status["vms"]) else None

        status = env.wait_for(every_vm_has_kpis, "status showing every VM's latest sample")
        assert all(v["kpi"]["mem_total"] > 0 for v in status["vms"])
        text = env.cli("status").stdout
        assert "cpu " in text and "mem " in text
    finally:
        env.close()


def test_cpu_busy_a_tick_below_the_last_sample_is_zero_percent_not_missing() -> None:
    # /proc/stat's idle and iowait move in 10 ms ticks and iowait may go back: over 0.2 s the
    # busy share (total - idle - iowait) came out a tick lower than before, and the sample had
    # no cpu_percent at all (seen in CI); psutil calls that 0 %
    from vmr_handler.agent.machine.kpi import _rates

    out = _rates({"cpu": (10.00, 100.30)}, {"cpu": (10.01, 100.10)}, 0.2)
    assert out["cpu_percent"] == 0.0
    assert _rates({"cpu": (10.10, 100.30)}, {"cpu": (10.00, 100.10)}, 0.2)["cpu_percent"] == 50.0
    assert "cpu_percent" not in _rates({"cpu": (1.0, 50.0)}, {"cpu": (10.0, 100.0)}, 0.2)  # a reset
