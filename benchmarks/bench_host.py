#!/usr/bin/env python3
"""Benchmarks of vmr-host with real agents over unix sockets (the virtio-serial stand-in).

Run from the repository root::

    .venv/bin/python benchmarks/bench_host.py            # full run (~70 s)
    .venv/bin/python benchmarks/bench_host.py --quick    # smoke run (~35 s)

Every figure is printed next to its target with an ``ok`` / ``MISSED`` label; the script
never fails because something is slow (exit 0 unless the benchmark itself breaks, e.g.
the host cannot be started). See ``benchmarks/README.md`` for what each figure means.

Sections (1-3 share one experiment: one real ``vmr-host serve`` and N+1 real agents):
  1  N agents (20; ``--quick``: 8), each a negative ``sleep`` of a different length and a
     positive ``/bin/true`` at t=1: cross-VM spread of that entry's ``spawned_at``, and how
     long after the last ``configured`` every VM had the start time.
  2  a break at t=2 and ``/bin/true`` at t=2+1e-6 on every VM; ``vmr-host resume --all``:
     latency from the CLI call to each VM's fork, and the parts of it.
  3  one more agent with ``--debug-clock-skew 5``: its clock-offset error (it should believe
     the host is 5 s behind it, exactly), plus the same error for the unskewed agents.
  4  one agent, ``seq 1 200000`` (``--quick``: 50 000): output lines/s as logged by the host,
     none lost, none duplicated.
  5  100 simulated idle agents (asyncio protocol clients in this process): host CPU %, RSS,
     fds over 10 s (``--quick``: 5 s).
  6  2 agents, same-instant groups of 1, 10 and 60 entries with and without a 200-byte drop
     each: first and last fork after the instant, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import psutil
import yaml
from _procs import stop_child  # benchmarks/ is sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from vmr_handler.core.control import request as agent_request  # noqa: E402
from vmr_handler.core.events import Event  # noqa: E402
from vmr_handler.core.wire.protocol import CONNECT_PREFIX, FrameDecoder, encode_message  # noqa: E402

# --------------------------------------------------------------------------- targets
TARGET_SPREAD_P99_MS = 20.0
TARGET_RESUME_MS = 100.0
TARGET_OFFSET_ERR_MS = 5.0
TARGET_STREAM_LPS = 5000.0
TARGET_IDLE_CPU_PCT = 2.0

#: where experiment dirs go (``--tmp-root``); short, so unix socket paths stay < 108 bytes
TMP_ROOT = ["/tmp"]
SKEW_S = 5.0
BREAK_AT = 2.0
RESUME_EPS = 1e-6

# --------------------------------------------------------------------------- child processes
_CHILDREN: List[subprocess.Popen] = []


def _spawn(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """Start a child in its own session and remember it for cleanup."""
    proc = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
    _CHILDREN.append(proc)
    return proc


def _stop_child(proc: subprocess.Popen, term_timeout: float = 10.0) -> None:
    """SIGTERM ``proc``, then kill what is left of its tree (:func:`_procs.stop_child`)."""
    stop_child(proc, term_timeout)
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


def _stop_all(procs: Sequence[subprocess.Popen], term_timeout: float = 10.0) -> None:
    """SIGTERM every process at once, then wait for (or kill) each one."""
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + term_timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _stop_child(proc, term_timeout=1.0)


def _cleanup_children() -> None:
    try:
        _stop_all(list(_CHILDREN), term_timeout=5.0)
    except Exception:
        pass
    _CHILDREN.clear()


def _on_signal(signum: int, _frame: Any) -> None:
    _cleanup_children()
    sys.exit(128 + signum)


# --------------------------------------------------------------------------- helpers
def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def fmt_ms(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if abs(value) < 1:
        return f"{value:.3f} ms"
    return f"{value:.1f} ms" if abs(value) < 10000 else f"{value / 1000:.2f} s"


def script(name: str) -> List[str]:
    """The venv's console script ``name`` (``vmr-handler`` / ``vmr-host``), else ``python -m``."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(path) and os.access(path, os.X_OK):
        return [path]
    module = {"vmr-handler": "vmr_handler", "vmr-host": "vmr_handler.host"}[name]
    return [sys.executable, "-m", module]


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def fs_type(path: str) -> str:
    path = os.path.realpath(path)
    best = ("", "?")
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best[0]):
            best = (mp, part.fstype)
    return best[1]


class MachineLoad:
    """Whole-machine CPU busy % and load average over a section (context for noisy figures)."""

    def __init__(self) -> None:
        self.t0 = psutil.cpu_times()

    def text(self) -> str:
        t1 = psutil.cpu_times()
        busy = (
            sum(t1)
            - sum(self.t0)
            - ((t1.idle + getattr(t1, "iowait", 0)) - (self.t0.idle + getattr(self.t0, "iowait", 0)))
        )
        total = sum(t1) - sum(self.t0)
        pct_busy = 100.0 * busy / total if total > 0 else math.nan
        return f"whole machine CPU busy {pct_busy:.0f} %, load {os.getloadavg()[0]:.2f}"


# --------------------------------------------------------------------------- report
class Report:
    """Figures, printed as they come and kept for the summary / JSON."""

    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []
        self.notes: List[str] = []

    def add(
        self,
        section: str,
        metric: str,
        text: str,
        value: Any = None,
        target: str = "-",
        ok: Optional[bool] = None,
    ) -> None:
        label = "-" if ok is None else ("ok" if ok else "MISSED")
        self.rows.append(
            {
                "section": section,
                "metric": metric,
                "text": text,
                "value": value,
                "target": target,
                "label": label,
            }
        )
        print(f"  {metric:<62} {text:>14}   target {target:<10} {label}", flush=True)

    def ms(self, section: str, metric: str, value_ms: float, target_ms: Optional[float] = None) -> None:
        ok = None
        target = "-"
        if target_ms is not None:
            target = f"< {target_ms:g} ms"
            ok = None if math.isnan(value_ms) else value_ms < target_ms
            if math.isnan(value_ms):
                ok = False
        self.add(section, metric, fmt_ms(value_ms), value_ms, target, ok)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)


# --------------------------------------------------------------------------- the host's .jsonl
class Tail:
    """Reads a ``<vm>.jsonl`` incrementally (the host may be half-way through a line)."""

    def __init__(self, path: str, keep: Optional[Callable[[Dict[str, Any]], bool]] = None) -> None:
        self.path = path
        self.pos = 0
        self.buf = b""
        self.recs: List[Dict[str, Any]] = []
        self.keep = keep

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return 0
        if not data:
            return 0
        self.pos += len(data)
        lines = (self.buf + data).split(b"\n")
        self.buf = lines.pop()
        added = 0
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if self.keep is None or self.keep(rec):
                self.recs.append(rec)
                added += 1
        return added

    def find(self, type_: str, **match: Any) -> Optional[Dict[str, Any]]:
        for rec in self.recs:
            ev = rec["event"]
            if ev["type"] == type_ and all(ev["data"].get(k) == v for k, v in match.items()):
                return rec
        return None


class Experiment:
    """One real ``vmr-host serve`` and its agents, in a short ``/tmp/vbXXXX`` directory."""

    def __init__(self, schedules: Dict[str, Any], start_buffer: float, keep: bool) -> None:
        self.root = tempfile.mkdtemp(dir=TMP_ROOT[0], prefix="vb")
        self.keep = keep
        self.sch = os.path.join(self.root, "sch")
        self.res = os.path.join(self.root, "res")
        self.logs = os.path.join(self.root, "logs")
        self.ch = os.path.join(self.root, "ch")
        for d in (self.sch, self.res, self.logs, self.ch):
            os.makedirs(d)
        for vm, sched in schedules.items():
            with open(os.path.join(self.sch, f"{vm}.yaml"), "w", encoding="utf-8") as fh:
                yaml.safe_dump(sched, fh)
        self.start_buffer = start_buffer
        self.host: Optional[subprocess.Popen] = None
        self.agents: Dict[str, subprocess.Popen] = {}
        self.tails: Dict[str, Tail] = {}

    def start_host(self, *extra: str, timeout: float = 30.0) -> subprocess.Popen:
        with open(os.path.join(self.root, "host.out"), "ab") as out:
            self.host = _spawn(
                [
                    *script("vmr-host"), "serve", "--schedules", self.sch, "--resources", self.res,
                    "--logs", self.logs, "--channels", self.ch, "--start-buffer", str(self.start_buffer),
                    *extra,
                ],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=child_env(), cwd=REPO,
            )  # fmt: skip
        sock = os.path.join(self.logs, "vmr-host.sock")
        deadline = time.monotonic() + timeout
        while not os.path.exists(sock):
            if self.host.poll() is not None:
                raise RuntimeError(f"vmr-host exited {self.host.returncode}:\n{self.host_out()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vmr-host did not come up in {timeout:.0f} s:\n{self.host_out()[-2000:]}")
            time.sleep(0.05)
        return self.host

    def host_out(self) -> str:
        try:
            with open(os.path.join(self.root, "host.out"), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""

    def sock(self, vm: str) -> str:
        return os.path.join(self.ch, f"{vm}.sock")

    def state(self, vm: str) -> str:
        return os.path.join(self.root, "vm", vm, "state")

    def start_agent(self, vm: str, *extra: str) -> subprocess.Popen:
        base = os.path.join(self.root, "vm", vm)
        os.makedirs(base, exist_ok=True)
        with open(os.path.join(base, "agent.out"), "ab") as out:
            proc = _spawn(
                [
                    *script("vmr-handler"), "run", "--port", f"unix:{self.sock(vm)}",
                    "--state-dir", os.path.join(base, "state"), "--launch-dir", os.path.join(base, "launch"),
                    "--vm-name", vm, *extra,
                ],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=child_env(), cwd=REPO,
            )  # fmt: skip
        self.agents[vm] = proc
        return proc

    def tail(self, vm: str, keep: Optional[Callable[[Dict[str, Any]], bool]] = None) -> Tail:
        if vm not in self.tails:
            self.tails[vm] = Tail(os.path.join(self.logs, f"{vm}.jsonl"), keep)
        return self.tails[vm]

    def wait_all(
        self, vms: Sequence[str], type_: str, timeout: float, **match: Any
    ) -> Dict[str, Dict[str, Any]]:
        """Wait (bounded) until every VM logged a ``type_`` event matching ``match``; returns
        what was found (possibly fewer VMs after the timeout)."""
        found: Dict[str, Dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while True:
            for vm in vms:
                if vm in found:
                    continue
                t = self.tail(vm)
                t.poll()
                rec = t.find(type_, **match)
                if rec is not None:
                    found[vm] = rec
            if len(found) == len(vms) or time.monotonic() > deadline:
                return found
            if self.host is not None and self.host.poll() is not None:
                print(f"  vmr-host exited {self.host.returncode} while waiting for {type_}", flush=True)
                return found
            time.sleep(0.05)

    def experiment_json(self) -> Dict[str, Any]:
        try:
            with open(os.path.join(self.logs, "experiment.json"), encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        _stop_all(list(self.agents.values()))
        if self.host is not None:
            _stop_child(self.host)
        if self.keep:
            print(f"  kept {self.root}", flush=True)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


# =========================================================================== sections 1-3
def sections_123(report: Report, n_vms: int, keep: bool, only: set) -> None:
    print(f"\n== 1-3: {n_vms} agents + 1 skewed agent, one vmr-host", flush=True)
    vms = [f"vm{i:02d}" for i in range(n_vms)]
    everyone = [*vms, "skew"]

    def sched(i: int) -> List[Dict[str, Any]]:
        return [
            {"start_time": -1, "executable": "sleep", "arguments": f"{0.5 + 0.03 * i:.2f}"},
            {"start_time": 1, "executable": "/bin/true"},
            {"start_time": 1.5, "executable": "/bin/date", "arguments": "+%s.%N"},
            {"start_time": BREAK_AT, "pause": True, "pause_duration": float("inf")},
            {"start_time": BREAK_AT + RESUME_EPS, "executable": "/bin/true"},
        ]

    scheds = {vm: sched(i) for i, vm in enumerate(vms)}
    scheds["skew"] = sched(n_vms // 2)
    exp = Experiment(scheds, start_buffer=1.0, keep=keep)
    load = MachineLoad()
    try:
        exp.start_host()
        t0 = time.time()
        for vm in vms:
            exp.start_agent(vm)
        exp.start_agent("skew", "--debug-clock-skew", str(SKEW_S))
        conf = exp.wait_all(everyone, "configured", timeout=90)
        took = time.time() - t0
        print(
            f"  {len(conf)}/{len(everyone)} configured {took:.1f} s after the agents were started", flush=True
        )
        started = exp.wait_all(everyone, "entry_started", timeout=30, index=1)
        dated = exp.wait_all(everyone, "output", timeout=15, index=2)
        if "1" in only:
            _section1(report, exp, vms, conf, started)
        brk = exp.wait_all(everyone, "break_started", timeout=15)
        if "3" in only:  # before the RESUME: an agent answers `status` only while its schedule runs
            _section3(report, exp, vms, started, dated)
        if "2" in only:
            if len(brk) == len(everyone):
                _section2(report, exp, everyone)
                _status_after_complete(report, exp, everyone)
            else:
                report.note(f"section 2 skipped: only {len(brk)}/{len(everyone)} VMs reached the break")
        print(f"  ({load.text()})", flush=True)
    finally:
        exp.close()


def _section1(
    report: Report,
    exp: Experiment,
    vms: List[str],
    conf: Dict[str, Dict[str, Any]],
    started: Dict[str, Dict[str, Any]],
) -> None:
    print(f"-- 1: one positive entry at t=1 on {len(vms)} VMs", flush=True)
    got = [vm for vm in vms if vm in started]
    if len(got) < len(vms):
        report.note(f"only {len(got)}/{len(vms)} VMs logged entry_started of the t=1 entry")
    if not got:
        return
    data = {vm: started[vm]["event"]["data"] for vm in got}
    scheduled = {d.get("scheduled") for d in data.values()}
    if len(scheduled) != 1:
        report.note(f"VMs disagree on the scheduled instant: {sorted(scheduled)}")
    dev = [abs(d["spawned_at"] - d["scheduled"]) * 1000 for d in data.values()]
    spawned = [d["spawned_at"] for d in data.values()]
    report.ms("1 spread", "|spawned_at - scheduled| p50", pct(dev, 50))
    report.ms(
        "1 spread", f"|spawned_at - scheduled| p99 (n={len(dev)}: = max)", pct(dev, 99), TARGET_SPREAD_P99_MS
    )
    report.ms("1 spread", "|spawned_at - scheduled| max", max(dev))
    report.ms("1 spread", "cross-VM spread of spawned_at (max - min)", (max(spawned) - min(spawned)) * 1000)
    if "skew" in started:
        d = started["skew"]["event"]["data"]
        allsp = [*spawned, d["spawned_at"]]
        report.ms("1 spread", "  same, including the +5 s skewed VM", (max(allsp) - min(allsp)) * 1000)
    deliver = [(started[vm]["host_received"] - data[vm]["spawned_at"]) * 1000 for vm in got]
    report.ms("1 spread", "entry_started delivery (host_received - spawned_at) p50", pct(deliver, 50))
    report.ms("1 spread", "entry_started delivery (host_received - spawned_at) max", max(deliver))
    # the barrier: last configured (host receive time) -> every VM has the start time
    everyone = [*vms, "skew"]
    if len(conf) < len(everyone):
        report.note(f"only {len(conf)}/{len(everyone)} VMs configured")
        return
    last_conf = max(r["host_received"] for r in conf.values())
    exp_state = exp.experiment_json()
    set_at = exp_state.get("start_set_at")
    start = (exp_state.get("barrier") or {}).get("start_time")
    if isinstance(set_at, (int, float)):
        report.ms(
            "1 barrier",
            "host sets the start: start_set_at - last configured (host)",
            (set_at - last_conf) * 1000,
        )
    sts = {}
    for vm in everyone:
        rec = exp.tail(vm).find("start_time_set")
        if rec is not None:
            sts[vm] = rec
    if len(sts) < len(everyone):
        report.note(f"only {len(sts)}/{len(everyone)} VMs logged start_time_set")
    if sts:
        # the skewed VM's event timestamps are wrong for ~5 s after its clock sync (see 3)
        agent_ts = [(r["event"]["timestamp"] - last_conf) * 1000 for vm, r in sts.items() if vm != "skew"]
        host_rx = [(r["host_received"] - last_conf) * 1000 for r in sts.values()]
        if agent_ts:
            report.ms("1 barrier", "start_time_set agent timestamp - last configured, p50", pct(agent_ts, 50))
            report.ms(
                "1 barrier",
                f"  every VM has it (agent timestamp, {len(agent_ts)} unskewed), max",
                max(agent_ts),
            )
        report.ms("1 barrier", "  start_time_set host_received - last configured, p50", pct(host_rx, 50))
        report.ms(
            "1 barrier",
            f"  start_time_set host_received - last configured, max ({len(host_rx)} VMs)",
            max(host_rx),
        )
    # how often each agent was sent its schedule on its one connection (its `result`s answering it)
    answers = [
        sum(
            1
            for r in exp.tail(vm).recs
            if r["event"]["type"] == "result"
            and str(r["event"]["data"].get("answers", "")).startswith("schedule-")
        )
        for vm in everyone
    ]
    report.add(
        "1 barrier",
        "schedule deliveries per agent, one connection each (min .. max)",
        f"{min(answers)} .. {max(answers)}",
        answers,
        "1",
        max(answers) == 1,
    )
    if isinstance(start, (int, float)):
        report.add(
            "1 barrier",
            "start time - last configured (= --start-buffer 1 s)",
            fmt_ms((start - last_conf) * 1000),
            (start - last_conf) * 1000,
        )


def _section2(report: Report, exp: Experiment, everyone: List[str]) -> None:
    print(f"-- 2: RESUME to {len(everyone)} VMs (vmr-host resume --all)", flush=True)
    time.sleep(0.5)  # let the agents settle after break_started
    t_cli = time.time()
    proc = _spawn(
        [*script("vmr-host"), "resume", "--all", "--logs", exp.logs, "--json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=REPO,
    )  # fmt: skip
    try:
        _out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        _stop_child(proc)
        report.note("vmr-host resume did not return within 30 s")
        return
    t_cli_end = time.time()
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)
    if proc.returncode != 0:
        report.note(f"vmr-host resume exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
        return
    fired = exp.wait_all(everyone, "entry_started", timeout=20, index=4)
    rr = exp.wait_all(everyone, "resume_received", timeout=5)
    if len(fired) < len(everyone):
        report.note(f"only {len(fired)}/{len(everyone)} VMs fired the entry after the break")
    if not fired:
        return
    issued = None
    for r in exp.experiment_json().get("resumes") or []:
        issued = r.get("issued")
    lat = [(r["event"]["data"]["spawned_at"] - t_cli) * 1000 for r in fired.values()]
    report.ms("2 resume", "CLI call -> fork (spawned_at - t_cli) p50", pct(lat, 50))
    report.ms("2 resume", "CLI call -> fork (spawned_at - t_cli) max", max(lat), TARGET_RESUME_MS)
    # the skewed VM's event timestamps are still off here (see 3): left out
    rx = [(r["event"]["timestamp"] - t_cli) * 1000 for vm, r in rr.items() if vm != "skew"]
    if rx:
        report.ms("2 resume", f"CLI call -> resume_received timestamp ({len(rx)} unskewed), p50", pct(rx, 50))
        report.ms("2 resume", "CLI call -> resume_received timestamp, max", max(rx))
    if "skew" in rr:
        report.ms(
            "2 resume",
            "  skewed VM: CLI call -> resume_received timestamp (wrong, see 3)",
            (rr["skew"]["event"]["timestamp"] - t_cli) * 1000,
        )
    report.ms("2 resume", "vmr-host resume wall time (process start to exit)", (t_cli_end - t_cli) * 1000)
    if isinstance(issued, (int, float)):
        report.ms(
            "2 resume", "  of which CLI start-up + connect (host 'issued' - t_cli)", (issued - t_cli) * 1000
        )
        host_part = [(r["event"]["data"]["spawned_at"] - issued) * 1000 for r in fired.values()]
        report.ms("2 resume", "host issued -> fork (= lateness of the entry) p50", pct(host_part, 50))
        report.ms(
            "2 resume", "host issued -> fork (= lateness of the entry) max", max(host_part), TARGET_RESUME_MS
        )
        recv = [(r["event"]["timestamp"] - issued) * 1000 for vm, r in rr.items() if vm != "skew"]
        if recv:
            report.ms("2 resume", "host issued -> resume_received timestamp (unskewed), max", max(recv))
    ignored = [vm for vm, r in rr.items() if r["event"]["data"].get("ignored")]
    if ignored:
        report.note(f"RESUME ignored (no active break) on {ignored}")
    if isinstance(issued, (int, float)):
        _resume_baseline(report, exp, (issued - t_cli) * 1000)


#: A client of the host control socket with the standard library only: the floor of "CLI start
#: to RESUME issued" (the interpreter's start, json, socket), run by the same Python.
STDLIB_RESUME = (
    "import json, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.connect(sys.argv[1])\n"
    "s.sendall(json.dumps({'cmd': 'resume', 'all': True}).encode() + b'\\n')\n"
    "data = b''\n"
    "while not data.endswith(b'\\n'):\n"
    "    chunk = s.recv(65536)\n"
    "    if not chunk:\n"
    "        break\n"
    "    data += chunk\n"
    "print(data.decode())\n"
)


def _issued_after(exp: Experiment, t0: float) -> Optional[float]:
    for r in exp.experiment_json().get("resumes") or []:
        if isinstance(r.get("issued"), (int, float)) and r["issued"] >= t0:
            return float(r["issued"])
    return None


def _resume_baseline(report: Report, exp: Experiment, cli_ms: float, runs: int = 3) -> None:
    """``vmr-host resume --all`` against a stdlib client on the same socket (the agents have no
    break any more: these RESUMEs are ignored), CLI start to RESUME issued, best of ``runs``."""
    sock = os.path.join(exp.logs, "vmr-host.sock")
    figures: Dict[str, List[float]] = {"stdlib": [], "vmr-host": []}
    commands = {
        "stdlib": [sys.executable, "-c", STDLIB_RESUME, sock],
        "vmr-host": [*script("vmr-host"), "resume", "--all", "--logs", exp.logs, "--json"],
    }
    for _ in range(runs):
        for name, argv in commands.items():
            t0 = time.time()
            done = subprocess.run(
                argv, capture_output=True, timeout=30, env=child_env(), cwd=REPO, check=False
            )
            issued = _issued_after(exp, t0)
            if done.returncode == 0 and issued is not None:
                figures[name].append((issued - t0) * 1000)
    if not figures["stdlib"] or not figures["vmr-host"]:
        report.note(f"RESUME baseline incomplete: {figures}")
        return
    base, cli = min(figures["stdlib"]), min(figures["vmr-host"])
    report.ms("2 resume", f"stdlib client: start -> RESUME issued (best of {runs})", base)
    report.ms("2 resume", f"vmr-host resume: start -> RESUME issued (best of {runs}, again)", cli)
    report.add(
        "2 resume",
        "  vmr-host / stdlib client (first resume / best)",
        f"{cli_ms / base:.2f}x / {cli / base:.2f}x",
        [cli_ms / base, cli / base],
        "<= 2x",
        cli / base <= 2.0,
    )


def _section3(
    report: Report,
    exp: Experiment,
    vms: List[str],
    started: Dict[str, Dict[str, Any]],
    dated: Dict[str, Dict[str, Any]],
) -> None:
    print(f"-- 3: clock offset with a +{SKEW_S:g} s skewed guest clock", flush=True)
    # the agent's belief, through the real CLI (vmr-handler status --state-dir --json)
    offset = None
    try:
        res = subprocess.run(
            [*script("vmr-handler"), "status", "--state-dir", exp.state("skew"), "--json"],
            capture_output=True, text=True, timeout=30, env=child_env(), cwd=REPO,
        )  # fmt: skip
        reply = json.loads(res.stdout)
        offset = reply["result"]["host"]["clock_offset"]
    except subprocess.TimeoutExpired:
        report.note("vmr-handler status of the skewed agent timed out")
    except (ValueError, KeyError, TypeError) as exc:
        report.note(
            f"vmr-handler status of the skewed agent failed: {exc}: {res.stdout[-300:]}{res.stderr[-300:]}"
        )
    if isinstance(offset, (int, float)):
        report.add("3 clock", "skewed agent clock_offset (status --json)", f"{offset:.6f} s", offset)
        report.ms(
            "3 clock",
            f"|clock_offset + {SKEW_S:g}| (true offset: same machine)",
            abs(offset + SKEW_S) * 1000,
            TARGET_OFFSET_ERR_MS,
        )
    # the unskewed agents: the true offset is 0 (same machine, same clock)
    errs = []
    for vm in vms:
        try:
            reply = agent_request(exp.state(vm), "status", timeout=5)
            errs.append(abs(float(reply["result"]["host"]["clock_offset"])) * 1000)
        except Exception:
            pass
    if errs:
        report.ms("3 clock", f"unskewed agents |clock_offset| p50 (n={len(errs)})", pct(errs, 50))
        report.ms("3 clock", "unskewed agents |clock_offset| max", max(errs), TARGET_OFFSET_ERR_MS)
    # the same thing seen in the events
    if "skew" in started:
        d = started["skew"]["event"]["data"]
        report.ms(
            "3 clock",
            "skewed VM: spawned_at - scheduled (agent's view)",
            (d["spawned_at"] - d["scheduled"]) * 1000,
        )
        report.ms(
            "3 clock",
            "skewed VM: host_received - scheduled (host clock)",
            (started["skew"]["host_received"] - d["scheduled"]) * 1000,
        )
        normal = [vm for vm in vms if vm in started]
        if normal:
            hr = [
                (started[vm]["host_received"] - started[vm]["event"]["data"]["scheduled"]) * 1000
                for vm in normal
            ]
            report.ms("3 clock", "  unskewed VMs: host_received - scheduled, median", median(hr))

    # event timestamps are on the reference clock: never later than the host received them
    def ahead(vm: str) -> List[float]:
        return [(r["event"]["timestamp"] - r["host_received"]) * 1000 for r in exp.tail(vm).recs]

    sk_ahead = ahead("skew")
    un_ahead = [a for vm in vms for a in ahead(vm)]
    if sk_ahead and un_ahead:
        report.ms(
            "3 clock",
            f"unskewed VMs: event timestamp - host_received, max ({len(un_ahead)} events)",
            max(un_ahead),
        )
        n_bad = sum(a > TARGET_OFFSET_ERR_MS for a in sk_ahead)
        report.add(
            "3 clock",
            f"skewed VM: event timestamp - host_received, max ({n_bad}/{len(sk_ahead)} > 5 ms)",
            fmt_ms(max(sk_ahead)),
            max(sk_ahead),
            f"< {TARGET_OFFSET_ERR_MS:g} ms",
            max(sk_ahead) < TARGET_OFFSET_ERR_MS,
        )
        last = exp.tail("skew").recs[-1]
        report.ms(
            "3 clock",
            f"  skewed VM, its last event so far ({last['event']['type']})",
            (last["event"]["timestamp"] - last["host_received"]) * 1000,
        )

    # /bin/date at t=1.5: the process reads the real clock (the debug skew is the agent's only)
    def exec_minus_spawn(vm: str) -> Optional[float]:
        st = exp.tail(vm).find("entry_started", index=2)
        out = dated.get(vm)
        if st is None or out is None:
            return None
        try:
            real = float(out["event"]["data"]["line"])
        except (KeyError, ValueError):
            return None
        return (real - st["event"]["data"]["spawned_at"]) * 1000

    base = [v for v in (exec_minus_spawn(vm) for vm in vms) if v is not None]
    sk = exec_minus_spawn("skew")
    if base and sk is not None:
        report.ms("3 clock", "unskewed: date's own clock - spawned_at, median (exec delay)", median(base))
        report.add(
            "3 clock", "  unskewed: the same, min .. max", f"{min(base):.1f} .. {max(base):.1f} ms", base
        )
        report.ms("3 clock", "skewed:   date's own clock - spawned_at", sk)
        report.ms(
            "3 clock",
            "event-based offset error |skewed - unskewed median| (noisy)",
            abs(sk - median(base)),
        )


def _status_after_complete(report: Report, exp: Experiment, everyone: List[str]) -> None:
    """Connected mode is a service: does `vmr-handler status` still answer after the schedule?"""
    done = exp.wait_all(everyone, "schedule_complete", timeout=10)
    if not done:
        return
    vm = sorted(done)[0]
    try:
        agent_request(exp.state(vm), "status", timeout=5)
        report.add("2 resume", "agent `status` after schedule_complete", "answers", True, "answers", True)
    except Exception as exc:
        report.add("2 resume", "agent `status` after schedule_complete", "no answer", False, "answers", False)
        report.note(f"{vm}: `vmr-handler status` after schedule_complete: {exc}")


# =========================================================================== section 4
def section4(report: Report, n_lines: int, keep: bool, timeout: float) -> None:
    print(f"\n== 4: output streaming, one entry printing {n_lines} lines", flush=True)
    exp = Experiment(
        {"out": [{"start_time": 0.5, "executable": "seq", "arguments": f"1 {n_lines}"}]},
        start_buffer=0.5,
        keep=keep,
    )
    load = MachineLoad()
    try:
        exp.start_host()
        agent = exp.start_agent("out")
        host_p = psutil.Process(exp.host.pid)  # type: ignore[union-attr]
        agent_p = psutil.Process(agent.pid)
        path = os.path.join(exp.logs, "out.jsonl")
        # light polling while the host writes: count lines, parse once at the end
        pos, count, exited, t_start = 0, 0, False, None
        cpu0: Tuple[float, float] = (0.0, 0.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.25)
            try:
                with open(path, "rb") as fh:
                    fh.seek(pos)
                    data = fh.read()
            except FileNotFoundError:
                continue
            cut = data.rfind(b"\n") + 1
            data = data[:cut]
            pos += cut
            if t_start is None and b'"entry_started"' in data:
                t_start = time.time()
                cpu0 = (cpu_s(host_p), cpu_s(agent_p))
            n = data.count(b'"type":"output"')
            count += n
            exited = exited or b'"entry_exited"' in data
            if exited and count >= n_lines:
                break
            if agent.poll() is not None or (exp.host and exp.host.poll() is not None):
                report.note("a process died during streaming")
                break
        cpu1 = (cpu_s(host_p), cpu_s(agent_p))
        wall = time.time() - (t_start or time.time())
        if count < n_lines:
            report.note(f"only {count}/{n_lines} output events logged within {timeout:.0f} s")
        seqs: List[int] = []
        first = last = None
        bad = 0
        ts: List[float] = []
        spawned = None
        with open(path, "rb") as fh:
            for line in fh:
                if b'"type":"output"' in line:
                    rec = json.loads(line)
                    d = rec["event"]["data"]
                    if d.get("stream") != "stdout":
                        continue
                    seqs.append(d["seq"])
                    if d.get("line") != str(d["seq"]):
                        bad += 1
                    hr = rec["host_received"]
                    first = hr if first is None else min(first, hr)
                    last = hr if last is None else max(last, hr)
                    ts.append(rec["event"]["timestamp"])
                elif b'"entry_started"' in line:
                    spawned = json.loads(line)["event"]["data"].get("spawned_at")
        uniq = set(seqs)
        lost = n_lines - len(uniq & set(range(1, n_lines + 1)))
        dup = len(seqs) - len(uniq)
        if first is not None and last is not None and last > first:
            lps = (len(seqs) - 1) / (last - first)
            report.add(
                "4 stream",
                "lines/s, first -> last output event (host_received)",
                f"{lps:,.0f}/s",
                lps,
                f"> {TARGET_STREAM_LPS:,.0f}/s",
                lps > TARGET_STREAM_LPS and lost == 0,
            )
            report.add(
                "4 stream", "first -> last output host_received", f"{last - first:.2f} s", last - first
            )
            if ts:
                report.add(
                    "4 stream",
                    "  agent emitted them over (event timestamps)",
                    f"{max(ts) - min(ts):.2f} s",
                    max(ts) - min(ts),
                )
            if spawned is not None:
                report.add(
                    "4 stream",
                    "  fork -> last line logged by the host",
                    f"{last - spawned:.2f} s",
                    last - spawned,
                )
        report.add(
            "4 stream",
            "lines lost / duplicated / wrong text",
            f"{lost} / {dup} / {bad}",
            [lost, dup, bad],
            "0 / 0 / 0",
            lost == 0 and dup == 0 and bad == 0,
        )
        if t_start is not None and wall > 0:
            report.add(
                "4 stream",
                "host CPU while streaming (s, % of one core)",
                f"{cpu1[0] - cpu0[0]:.1f} s {100 * (cpu1[0] - cpu0[0]) / wall:.0f} %",
                cpu1[0] - cpu0[0],
            )
            report.add(
                "4 stream",
                "agent CPU while streaming (s, % of one core)",
                f"{cpu1[1] - cpu0[1]:.1f} s {100 * (cpu1[1] - cpu0[1]) / wall:.0f} %",
                cpu1[1] - cpu0[1],
            )
        _stream_gaps(report, path)
        print(f"  ({load.text()})", flush=True)
    finally:
        exp.close()


def _stream_gaps(report: Report, path: str) -> None:
    """Longest pause in the host's logging of output events (stalls on the way)."""
    times: List[float] = []
    with open(path, "rb") as fh:
        for line in fh:
            if b'"type":"output"' in line:
                i = line.find(b'"host_received":')
                j = line.find(b",", i)
                try:
                    times.append(float(line[i + 16 : j]))
                except ValueError:
                    pass
    if len(times) > 1:
        times.sort()
        gap = max(b - a for a, b in zip(times, times[1:]))
        report.ms("4 stream", "longest pause between two logged output events", gap * 1000)


# =========================================================================== section 5
class IdleAgent:
    """A minimal protocol client: handshake, accept the schedule, answer acks, heartbeat every 5 s
    of send silence; otherwise silent. Many share one event loop."""

    def __init__(self, vm: str, path: str, counters: Dict[str, int]) -> None:
        self.vm = vm
        self.path = path
        self.counters = counters
        self.prefix = uuid.uuid4().hex[:8]
        self.n = 0
        self.writer: Optional[asyncio.StreamWriter] = None
        self.last_tx = time.monotonic()
        self.welcomed = asyncio.Event()
        self.schedule_acked = asyncio.Event()
        self.schedule_id: Optional[str] = None
        self.result_id: Optional[str] = None

    def _event(self, type_: str, data: Dict[str, Any]) -> Event:
        self.n += 1
        return Event(type_, time.time(), f"{self.prefix}-{self.n:08d}", data)

    def _send(self, *events: Event) -> None:
        assert self.writer is not None
        self.writer.write(encode_message(list(events), time.time()))
        self.last_tx = time.monotonic()

    def _hello(self) -> None:
        self._send(
            self._event(
                "hello",
                {
                    "protocol": 1, "agent_version": "bench-idle", "boot_id": "boot-" + self.prefix,
                    "vm": self.vm,
                    "journal": {"digest": None, "configured_at": None, "start_time": None,
                                "stages_done": [], "resumes": 0},
                    "unacked": 0,
                },
            )
        )  # fmt: skip

    async def run(self) -> None:
        for _ in range(100):
            try:
                reader, self.writer = await asyncio.open_unix_connection(self.path)
                break
            except OSError:
                await asyncio.sleep(0.1)
        else:
            self.counters["connect_failed"] += 1
            return
        self.writer.write(CONNECT_PREFIX)
        keep = asyncio.ensure_future(self._keepalive())
        decoder = FrameDecoder()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    self.counters["closed_by_host"] += 1
                    return
                for msg in decoder.feed(data):
                    for ev in msg.events:
                        self._on(ev)
        finally:
            keep.cancel()
            self.writer.close()

    def _on(self, ev: Event) -> None:
        self.counters["rx_" + ev.type] = self.counters.get("rx_" + ev.type, 0) + 1
        if ev.type == "hello":
            self._hello()
        elif ev.type == "welcome":
            self.welcomed.set()
            for _ in range(8):  # like the real agent: a burst of clock requests after the welcome
                self._send(self._event("clock_req", {"t1": time.time()}))
        elif ev.type == "schedule":
            self.schedule_id = ev.id
            res = self._event("result", {"answers": ev.id, "status": "success", "details": "loaded"})
            self.result_id = res.id
            self._send(res)
        elif ev.type == "ack":
            if self.result_id is not None and self.result_id in (ev.data.get("ids") or []):
                self.schedule_acked.set()
        elif ev.type in ("start_time",):
            self._send(self._event("ack", {"ids": [ev.id]}))
        elif ev.type == "resume":
            self._send(
                self._event(
                    "result",
                    {
                        "answers": ev.id,
                        "status": "success",
                        "details": "ignored",
                        "ended_break": None,
                        "ignored": True,
                    },
                )
            )

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            if time.monotonic() - self.last_tx >= 5.0:
                self._send(self._event("heartbeat", {}))
                self.counters["tx_heartbeat"] = self.counters.get("tx_heartbeat", 0) + 1


def section5(report: Report, n_agents: int, window: float, keep: bool) -> None:
    print(f"\n== 5: host with {n_agents} idle connected agents (simulated), {window:g} s window", flush=True)
    vms = [f"i{i:03d}" for i in range(n_agents)]
    sched = [{"start_time": -1, "executable": "/bin/true"}, {"start_time": 1, "executable": "/bin/true"}]
    exp = Experiment({vm: sched for vm in vms}, start_buffer=60.0, keep=keep)
    try:
        exp.start_host()
        host_p = psutil.Process(exp.host.pid)  # type: ignore[union-attr]
        time.sleep(1.0)
        c0, w0 = cpu_s(host_p), time.monotonic()
        time.sleep(3.0)
        c1, w1 = cpu_s(host_p), time.monotonic()
        base_cpu = 100 * (c1 - c0) / (w1 - w0)
        base_rss = host_p.memory_info().rss / 2**20
        base_fds = host_p.num_fds()
        asyncio.run(_section5_async(report, exp, vms, host_p, window, (base_cpu, base_rss, base_fds)))
    finally:
        exp.close()


async def _section5_async(
    report: Report,
    exp: Experiment,
    vms: List[str],
    host_p: psutil.Process,
    window: float,
    base: Tuple[float, float, int],
) -> None:
    counters: Dict[str, int] = {"connect_failed": 0, "closed_by_host": 0}
    agents = [IdleAgent(vm, exp.sock(vm), counters) for vm in vms]
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(a.run()) for a in agents]
    try:
        try:
            await asyncio.wait_for(asyncio.gather(*(a.schedule_acked.wait() for a in agents)), 60)
        except asyncio.TimeoutError:
            pass
        ready = sum(a.schedule_acked.is_set() for a in agents)
        print(
            f"  {ready}/{len(agents)} handshaken and schedule acked in {time.monotonic() - t0:.1f} s",
            flush=True,
        )
        if ready < len(agents):
            report.note(f"only {ready}/{len(agents)} simulated agents completed the handshake")
        await asyncio.sleep(2.0)  # settle (the clock_req bursts, the first heartbeats)
        rx0 = dict(counters)
        me = psutil.Process()
        c0, m0, w0 = cpu_s(host_p), cpu_s(me), time.monotonic()
        rss_max = 0.0
        end = w0 + window
        while time.monotonic() < end:
            await asyncio.sleep(min(1.0, max(0.0, end - time.monotonic())))
            rss_max = max(rss_max, host_p.memory_info().rss / 2**20)
        c1, m1, w1 = cpu_s(host_p), cpu_s(me), time.monotonic()
        cpu = 100 * (c1 - c0) / (w1 - w0)
        fds = host_p.num_fds()
        threads = host_p.num_threads()
        hb = counters.get("rx_heartbeat", 0) - rx0.get("rx_heartbeat", 0)
        report.add(
            "5 idle",
            f"host CPU with {len(vms)} idle agents ({window:g} s, % of one core)",
            f"{cpu:.2f} %",
            cpu,
            f"< {TARGET_IDLE_CPU_PCT:g} %",
            cpu < TARGET_IDLE_CPU_PCT,
        )
        report.add(
            "5 idle", "  host CPU with the same VMs, none connected (3 s)", f"{base[0]:.2f} %", base[0]
        )
        report.add("5 idle", "host RSS, max over the window", f"{rss_max:.1f} MB", rss_max)
        report.add("5 idle", "  host RSS before any agent connected", f"{base[1]:.1f} MB", base[1])
        report.add("5 idle", "host open fds (before any connection)", f"{fds} ({base[2]})", fds)
        report.add("5 idle", "host threads", str(threads), threads)
        report.add(
            "5 idle", "heartbeats host -> agents per second", f"{hb / (w1 - w0):.1f}/s", hb / (w1 - w0)
        )
        report.add(
            "5 idle",
            "  simulated agents' own CPU (this process, % of one core)",
            f"{100 * (m1 - m0) / (w1 - w0):.1f} %",
            100 * (m1 - m0) / (w1 - w0),
        )
        if counters["closed_by_host"]:
            report.note(f"the host closed {counters['closed_by_host']} simulated connections")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # the host's own view (after the window: a CLI call costs the host CPU)
    try:
        res = subprocess.run(
            [*script("vmr-host"), "status", "--json", "--logs", exp.logs],
            capture_output=True, text=True, timeout=30, env=child_env(), cwd=REPO,
        )  # fmt: skip
        st = json.loads(res.stdout)
        handshakes = sum(v.get("handshakes", 0) for v in st["vms"])
        refused = sum(sum(v["refused"].values()) for v in st["vms"])
        report.add(
            "5 idle",
            "host status: handshakes / refused inputs",
            f"{handshakes} / {refused}",
            [handshakes, refused],
        )
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError) as exc:
        report.note(f"vmr-host status failed: {exc}")


# =========================================================================== main
# =========================================================================== section 6
#: A 200-byte shell script: the data each entry of a "with drops" group puts in place.
DROP_SCRIPT = "#!/bin/sh\n# dropped by the benchmark: 200 bytes of script\n" + "echo x >/dev/null\n" * 7
DROP_SCRIPT += "#" * (199 - len(DROP_SCRIPT)) + "\n"
#: (group size, with drops) in firing order, and the experiment second each group fires at.
DROP_GROUPS = [(n, drops) for n in (1, 10, 60) for drops in (False, True)]
DROP_STEP_S = 2.0


def _drop_schedule() -> List[Dict[str, Any]]:
    records: List[Dict[str, Any]] = []
    for g, (n, drops) in enumerate(DROP_GROUPS):
        for _ in range(n):
            rec: Dict[str, Any] = {"start_time": 1 + g * DROP_STEP_S, "executable": "/bin/true"}
            if drops:
                rec["data"] = [{"location": "run.sh", "content": DROP_SCRIPT, "executable": True}]
            records.append(rec)
    return records


def section6(report: Report, n_agents: int, keep: bool) -> None:
    """Same-instant groups of 1, 10 and 60 entries with and without a 200-byte drop each, on
    ``n_agents`` connected agents: first and last fork after the instant."""
    print(f"\n== 6: drop / no-drop groups (1, 10, 60 entries) on {n_agents} connected agents", flush=True)
    vms = [f"d{i}" for i in range(n_agents)]
    records = _drop_schedule()
    exp = Experiment({vm: records for vm in vms}, start_buffer=1.0, keep=keep)
    load = MachineLoad()
    try:
        exp.start_host()
        for vm in vms:
            exp.start_agent(vm)
        exp.wait_all(vms, "configured", timeout=60)
        last = len(records) - 1
        exp.wait_all(vms, "entry_started", timeout=30 + len(DROP_GROUPS) * DROP_STEP_S, index=last)
        time.sleep(0.5)
        figures: Dict[Tuple[int, bool], Tuple[float, float]] = {}
        for g, (n, drops) in enumerate(DROP_GROUPS):
            fire_at = 1 + g * DROP_STEP_S
            firsts, lasts = [], []
            for vm in vms:
                exp.tail(vm).poll()
                lat = [
                    r["event"]["data"]["lateness"] * 1000
                    for r in exp.tail(vm).recs
                    if r["event"]["type"] == "entry_started"
                    and r["event"]["data"].get("start_time") == fire_at
                    and "lateness" in r["event"]["data"]
                ]
                if len(lat) == n:
                    firsts.append(min(lat))
                    lasts.append(max(lat))
            if len(firsts) == len(vms):
                figures[(n, drops)] = (max(firsts), max(lasts))
            else:
                report.note(f"group of {n} (drops={drops}): only {len(firsts)}/{len(vms)} VMs started all")
        for n in (1, 10, 60):
            if (n, True) not in figures or (n, False) not in figures:
                continue
            (f_d, l_d), (f_n, l_n) = figures[(n, True)], figures[(n, False)]
            report.add(
                "6 drops",
                f"{n} entries: first fork, drops / none (max over VMs)",
                f"{f_d:.1f} / {f_n:.1f} ms",
                [f_d, f_n],
                "<= 1.5x+2ms",
                f_d <= 1.5 * f_n + 2.0,
            )
            report.add(
                "6 drops",
                f"{n} entries: last fork, drops / none (max over VMs)",
                f"{l_d:.1f} / {l_n:.1f} ms",
                [l_d, l_n],
                "<= +10 ms",
                l_d <= l_n + 10.0,
            )
        print(f"  ({load.text()})", flush=True)
    finally:
        exp.close()


def git_head() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller runs (8 agents, 50 000 lines, 5 s idle window)"
    )
    parser.add_argument(
        "--only", default="1,2,3,4,5,6", help="comma-separated sections to run (default all)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the /tmp/vbXXXX experiment directories")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument(
        "--tmp-root",
        default="/tmp",
        metavar="DIR",
        help="where the experiment dirs go (host logs, agents' state with their fsynced journals); "
        "default /tmp. Keep it short: unix socket paths must stay < 108 bytes",
    )
    args = parser.parse_args()
    TMP_ROOT[0] = args.tmp_root
    only = {s.strip() for s in args.only.split(",") if s.strip()}

    atexit.register(_cleanup_children)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    head = git_head()
    started = _dt.datetime.now(_dt.timezone.utc)
    print(
        f"bench_host.py {'--quick ' if args.quick else ''}at {started:%Y-%m-%d %H:%M:%S} UTC, git {head}, "
        f"Python {platform.python_version()}, {psutil.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
        f"dirs in {args.tmp_root} ({fs_type(args.tmp_root)})",
        flush=True,
    )
    report = Report()
    t0 = time.monotonic()
    sections: List[Tuple[str, Callable[[], None]]] = []
    if only & {"1", "2", "3"}:
        sections.append(("1-3", lambda: sections_123(report, 8 if args.quick else 20, args.keep, only)))
    if "4" in only:
        sections.append(
            (
                "4",
                lambda: section4(
                    report, 50_000 if args.quick else 200_000, args.keep, 60 if args.quick else 150
                ),
            )
        )
    if "5" in only:
        sections.append(("5", lambda: section5(report, 100, 5.0 if args.quick else 10.0, args.keep)))
    if "6" in only:
        sections.append(("6", lambda: section6(report, 2, args.keep)))
    broken = False
    for name, run in sections:
        try:
            run()
        except Exception as exc:  # the benchmark itself broke: report it, go on, exit 1
            broken = True
            report.note(f"section {name} broke: {type(exc).__name__}: {exc}")
        finally:
            _cleanup_children()

    print(f"\n== summary ({time.monotonic() - t0:.0f} s, git {head})", flush=True)
    for row in report.rows:
        if row["label"] != "-":
            sec, metric, text = row["section"], row["metric"], row["text"]
            print(f"  {sec:<10} {metric:<62} {text:>14}   {row['target']:<10} {row['label']}")
    for note in report.notes:
        print(f"  note: {note}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "started": started.isoformat(),
                    "git": head,
                    "quick": args.quick,
                    "rows": report.rows,
                    "notes": report.notes,
                },
                fh,
                indent=1,
                default=str,
            )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
