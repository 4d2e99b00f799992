"""Realistic host logs of an experiment with N VMs, for the report's tests and benchmark.

:func:`generate` writes ``<logs>/<vm>.jsonl`` (host log records, ``docs/host.md``) and
``<logs>/experiment.json`` as a host would have after a run of N VMs: the VMs boot over 20 s,
run a negative stage (two entries, output, some reboot and restart their agent), configure, get
the start time (last configured + 10 s buffer), run positive entries with output, lateness (a
few VMs are late by 50-500 ms), a pause (some), a break at t=60 ended by one RESUME to every
VM, KPI samples every ``kpi_interval`` seconds. Some VMs go wrong, in fixed shares (at least
one each from 50 VMs): ``failed`` (an entry that cannot start: every other one in the stage,
the others later), ``rejected`` (the schedule), ``with failures`` (an entry exits 2),
``interrupted`` (the agent stopped in an entry, the log ends there), ``at break`` (a second
break never resumed), ``running`` (the log ends in an entry). A few refuse a control message
or ignore a RESUME.

Deterministic for a seed. Run as ``python -m tests.reportgen DIR --vms N`` to look at one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC
BUFFER = 10.0
BREAK_AT = 60.0  # experiment s: every VM's break, ended by RESUME 1
RESUME_AT = 75.0
LAST_BREAK_AT = 150.0  # the "at break" VMs' second break, never resumed
#: Share of the VMs made each way (the rest complete); at least one each from 50 VMs.
SHARES = (
    ("failed", 0.04),
    ("rejected", 0.01),
    ("with failures", 0.05),
    ("interrupted", 0.02),
    ("at break", 0.03),
    ("running", 0.04),
)
#: The state word (host/model/stateword.py) each way a VM was made ends in, as every view says
#: it; ``with failures`` completes with a failed entry (a problem), ``interrupted`` (the log ends
#: in an entry its agent was stopped in) and ``running`` are ``running`` as far as the logs tell.
WORDS = {
    "failed": "failed",
    "rejected": "schedule_rejected",
    "with failures": "complete",
    "interrupted": "running",
    "at break": "at_break",
    "running": "running",
    "complete": "complete",
}
#: The ways made that are problems (a failed VM, a refused schedule, a failed entry).
PROBLEM_KINDS = frozenset({"failed", "rejected", "with failures"})
COMMANDS = (
    "/usr/bin/iperf3 -c 10.0.0.{peer} -t {dur} --json",
    "/opt/exp/bin/load --rate {rate} --target http://10.0.0.{peer}:8080/",
    "/bin/sh -c 'ping -c {dur} 10.0.0.{peer} | tail -2'",
    "python3 /opt/exp/collect.py --out /var/tmp/run-{i}.csv --interval 0.5",
    "/usr/sbin/tc qdisc change dev eth0 root netem delay {rate}ms",
)


@dataclass
class Generated:
    """What :func:`generate` wrote.

    Attributes:
        logs: the logs directory. vms: VM names, sorted. start: experiment start (UTC).
        kinds: VM -> what was made of it (one of :data:`SHARES`, or ``complete``).
        late: VMs with entries late by 50-500 ms. restarts: VMs whose agent restarted.
        lines: log records written.
    """

    logs: str
    vms: List[str]
    start: float
    kinds: Dict[str, str] = field(default_factory=dict)
    late: List[str] = field(default_factory=list)
    restarts: List[str] = field(default_factory=list)
    lines: int = 0

    def words(self) -> Dict[str, str]:
        """VM -> the state word its logs end in (:data:`WORDS`)."""
        return {vm: WORDS[kind] for vm, kind in self.kinds.items()}

    def problems(self) -> List[str]:
        """The VMs that are problems (:data:`PROBLEM_KINDS`), sorted."""
        return sorted(vm for vm, kind in self.kinds.items() if kind in PROBLEM_KINDS)


class _Vm:
    """The records of one VM, made in any order and written sorted by time."""

    def __init__(self, name: str, rng: random.Random) -> None:
        self.name, self.rng = name, rng
        self.records: List[Tuple[float, int, Dict[str, Any]]] = []
        self.ids = 0
        self.prefix = f"{rng.getrandbits(32):08x}"

    def ev(self, t: float, type_: str, **data: Any) -> None:
        self.ids += 1
        rec = {
            "host_received": round(t + 0.002 + self.rng.random() * 0.02, 6),
            "vm": self.name,
            "event": {
                "timestamp": round(t, 6),
                "type": type_,
                "id": f"{self.prefix}-{self.ids}",
                "data": data,
            },
        }
        self.records.append((t, self.ids, rec))

    def entry(
        self,
        t: float,
        index: int,
        cmd: str,
        dur: float,
        *,
        at: Optional[float] = None,
        late: float = 0.0,
        exit_code: Optional[int] = 0,
        lines: int = 3,
        end: str = "exited",
    ) -> float:
        """One entry run from ``t`` (spawned; ``at``: experiment s it was due, positive only)
        for ``dur`` s; ``end``: exited, failed, interrupted or running. Returns its end."""
        exe = cmd.split()[0]
        if end == "failed":
            self.ev(
                t,
                "entry_failed",
                index=index,
                executable=exe,
                status="error",
                exit_code=None,
                duration=0.0,
                details=f"cannot start {exe}: [Errno 2] No such file or directory",
            )
            return t
        extra: Dict[str, Any] = {}
        if at is not None:
            extra = {"scheduled": t - late, "spawned_at": t, "lateness": late}
        self.ev(
            t + 0.0004,
            "entry_started",
            index=index,
            executable=exe,
            pid=1000 + index,
            start_time=at if at is not None else -30.0,
            working_dir=f"/var/lib/vmr/entries/{index}",
            command=cmd,
            shell="/bin/sh",
            **extra,
        )
        for i in range(lines):
            self.ev(
                t + dur * (i + 1) / (lines + 1),
                "output",
                index=index,
                stream="stdout",
                seq=i + 1,
                continued=False,
                eol=True,
                line=self._line(i, index),
            )
        if end == "running":
            return t + dur
        if end == "interrupted":
            self.ev(
                t + dur,
                "entry_interrupted",
                index=index,
                executable=exe,
                exit_code=None,
                signal=15,
                duration=dur,
                details="terminated because the agent stopped; runs again when the agent restarts",
            )
            return t + dur
        status = "success" if exit_code == 0 else "error"
        self.ev(
            t + dur,
            "entry_exited",
            index=index,
            executable=exe,
            exit_code=exit_code,
            signal=None,
            duration=round(dur, 3),
            status=status,
            details=f"exit code {exit_code}",
        )
        return t + dur

    def _line(self, i: int, index: int) -> str:
        r = self.rng.random()
        if r < 0.5:
            return f"[{index}] {self.rng.randint(100, 999)} KB/s sent, {self.rng.randint(0, 3)} retransmits"
        if r < 0.8:
            return f"rtt min/avg/max = 0.{self.rng.randint(100, 999)}/1.{i}02/4.{i}1 ms"
        return f"step {i}: ok ({self.rng.random():.4f})"

    def kpis(self, t0: float, t1: float, interval: float, base: float) -> None:
        if interval <= 0:
            return
        t = t0 + interval
        while t < t1:
            cpu = min(100.0, max(0.0, base + self.rng.gauss(0, 8) + (30 if self.rng.random() < 0.1 else 0)))
            used = 900e6 + self.rng.random() * 400e6
            self.ev(
                t,
                "kpi",
                cpu_percent=round(cpu, 1),
                load=[cpu / 50, cpu / 60, cpu / 70],
                mem_used=used,
                mem_available=2048e6 - used,
                mem_total=2048e6,
                disk_used=3.1e9,
                disk_total=9.8e9,
                disk_read_rate=self.rng.random() * 1e5,
                disk_write_rate=self.rng.random() * 4e5,
                net={
                    "eth0": {
                        "bytes_sent": self.rng.random() * 1e6,
                        "bytes_recv": self.rng.random() * 1e6,
                        "packets_sent": 800.0,
                        "packets_recv": 900.0,
                    }
                },
                interval=interval,
                duration=0.004,
            )
            t += interval

    def write(self, path: str) -> int:
        self.records.sort(key=lambda r: (r[0], r[1]))
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(rec, separators=(",", ":")) + "\n" for _, _, rec in self.records)
        return len(self.records)


def _kinds(names: List[str], rng: random.Random) -> Dict[str, str]:
    """VM -> what goes wrong with it (:data:`SHARES`), spread at random over the names."""
    order = names[:]
    rng.shuffle(order)
    kinds: Dict[str, str] = {}
    i = 0
    for kind, share in SHARES:
        count = round(len(names) * share) if len(names) < 50 else max(1, round(len(names) * share))
        for vm in order[i : i + count]:
            kinds[vm] = kind
        i += count
    return {vm: kinds.get(vm, "complete") for vm in names}


def _stage(v: _Vm, boot: float, restart: bool) -> Tuple[float, bool]:
    """Agent start, schedule accepted, the stage at -30 (two entries; a reboot in the first
    when ``restart``). Returns (when it configured, whether the VM failed in it)."""
    v.ev(boot, "agent_started", version="0.9.0", pid=311, resumed_from_journal=False)
    v.ev(boot + 0.3, "result", answers="schedule-" + "ab" * 16, status="success", details="schedule accepted")
    v.ev(boot + 0.4, "stage_started", stage=0, start_time=-30.0, entries=[0, 1])
    t = v.entry(boot + 0.5, 0, "/usr/bin/apt-get install -y iperf3 nginx", 4 + v.rng.random() * 6, lines=6)
    if restart:
        v.ev(t, "reboot_requested", stage=0, requesters=[0], command="/sbin/reboot")
        t += 14 + v.rng.random() * 4
        v.ev(t, "agent_started", version="0.9.0", pid=298, resumed_from_journal=True)
    return t, False


def _positive(v: _Vm, kind: str, start: float, entries: int, late: bool, lines: int) -> float:
    """The positive entries, pause and breaks of one VM from the start; returns its last time."""
    rng, t_end = v.rng, start
    index = 2
    if rng.random() < 0.2:
        v.ev(start + 30, "pause_started", index=900, at=30.0, duration=10.0, until=40.0)
        v.ev(start + 40.002, "pause_ended", index=900, at=40.0, duration=10.0)
    fail_at = rng.randrange(entries) if kind in ("failed", "with failures", "interrupted", "running") else -1
    for k in range(entries):
        at = 1.0 + k * (190.0 / max(entries, 1)) + rng.random() * 2
        if at >= BREAK_AT:
            at += RESUME_AT - BREAK_AT  # entries after the break wait for its RESUME
        if kind == "at break" and at >= LAST_BREAK_AT + RESUME_AT - BREAK_AT:
            v.ev(
                start + LAST_BREAK_AT + 15,
                "break_started",
                index=901,
                at=LAST_BREAK_AT,
                details="held until a RESUME",
            )
            return start + LAST_BREAK_AT + 15
        lateness = rng.uniform(0.05, 0.5) if late and rng.random() < 0.3 else rng.uniform(0.0005, 0.004)
        cmd = rng.choice(COMMANDS).format(
            peer=rng.randint(2, 250), dur=rng.randint(2, 20), rate=rng.randint(1, 90), i=k
        )
        dur = rng.uniform(0.3, 18.0)
        t = start + at + lateness
        n_out = rng.randint(0, lines * 2)
        if k == fail_at:
            if kind == "failed":
                v.entry(t, index, "/opt/exp/bin/missing-tool --go", 0, end="failed")
                v.ev(
                    t + 0.001,
                    "vm_failed",
                    index=index,
                    status="error",
                    details=f"entry {index} could not start",
                )
                return t
            if kind in ("interrupted", "running"):
                v.entry(t, index, cmd, dur, at=at, late=lateness, lines=n_out, end=kind)
                if kind == "interrupted":
                    v.ev(t + dur + 0.01, "agent_stopped", reason="SIGTERM")
                return t + dur
            t_end = max(t_end, v.entry(t, index, cmd, dur, at=at, late=lateness, exit_code=2, lines=n_out))
        else:
            t_end = max(t_end, v.entry(t, index, cmd, dur, at=at, late=lateness, lines=n_out))
        index += 1
    return t_end


def _one_vm(v: _Vm, kind: str, restart: bool, boot: float, in_stage: bool) -> Tuple[float, float]:
    """The negative part of one VM; returns (configured at, boot). The positive part is added
    by :func:`generate` once every VM's configured time (so the start) is known."""
    if kind == "rejected":
        v.ev(boot, "agent_started", version="0.9.0", pid=311, resumed_from_journal=False)
        v.ev(
            boot + 0.3,
            "schedule_warning",
            status="error",
            details="schedule refused: entry 3: unknown key 'argumnets'",
        )
        v.ev(
            boot + 0.3,
            "result",
            answers="schedule-" + "ab" * 16,
            status="error",
            details="entry 3: unknown key 'argumnets'",
        )
        return -1.0, boot
    t, _ = _stage(v, boot, restart)
    if kind == "failed" and in_stage:  # fails in the stage
        v.entry(t + 0.1, 1, "/opt/setup/missing.sh", 0, end="failed")
        v.ev(t + 0.2, "vm_failed", index=1, status="error", details="entry 1 could not start")
        return -1.0, boot
    t = v.entry(t + 0.1, 1, "/opt/exp/setup.sh --role web --peers 16", 2 + v.rng.random() * 8, lines=4)
    v.ev(t + 0.001, "stage_finished", stage=0, start_time=-30.0, duration=t - boot)
    v.ev(t + 0.002, "configured", at=t + 0.002, stages=1)
    return t + 0.002, boot


def generate(
    logs: str,
    n: int,
    *,
    entries: int = 20,
    seed: int = 1,
    kpi_interval: float = 10.0,
    lines: int = 4,
    name: Optional[str] = "generated experiment",
) -> Generated:
    """Write the logs of ``n`` VMs (``vm0001``...) into ``logs`` (created if needed).

    Args:
        entries: positive entries per VM. lines: mean output lines per entry.
        kpi_interval: seconds between ``kpi`` samples (0: none). name: experiment.json's name.

    Returns:
        What was written (:class:`Generated`).
    """
    os.makedirs(logs, exist_ok=True)
    rng = random.Random(seed)
    names = [f"vm{i:04d}" for i in range(1, n + 1)]
    kinds = _kinds(names, rng)
    out = Generated(logs, names, 0.0, kinds)
    vms: Dict[str, _Vm] = {}
    configured: Dict[str, float] = {}
    boots: Dict[str, float] = {}
    failed = [vm for vm in names if kinds[vm] == "failed"]
    for vm in names:
        v = vms[vm] = _Vm(vm, random.Random(f"{seed}-{vm}"))
        flags = {"restart": v.rng.random() < 0.03, "late": v.rng.random() < 0.1}
        if flags["restart"] and kinds[vm] != "rejected":
            out.restarts.append(vm)
        if flags["late"] and kinds[vm] not in ("rejected",):
            out.late.append(vm)
        in_stage = kinds[vm] == "failed" and failed.index(vm) % 2 == 0  # half of them fail in the stage
        at, boots[vm] = _one_vm(v, kinds[vm], flags["restart"], T0 + v.rng.random() * 20, in_stage)
        if at > 0:
            configured[vm] = at
    start = max(configured.values()) + BUFFER
    out.start = start
    late = set(out.late)
    ignoring = sorted(vm for vm in names if kinds[vm] == "complete" and vms[vm].rng.random() < 0.03)
    for vm, v in vms.items():
        end = boots[vm] + 1
        if vm in configured:
            v.ev(configured[vm] + 0.05, "start_time_set", start_time=start, source="host")
            v.ev(start + 0.0003, "experiment_started", start_time=start, late=0.0003)
            end = _positive(v, kinds[vm], start, entries, vm in late, lines)
            if end > start + BREAK_AT:
                v.ev(start + BREAK_AT, "break_started", index=899, at=BREAK_AT, details="held until a RESUME")
                v.ev(
                    start + RESUME_AT + 0.004,
                    "resume_received",
                    at=RESUME_AT,
                    ended_break=899,
                    ignored=False,
                    status="success",
                    details="break 899 ended",
                )
            if vm in ignoring:
                v.ev(
                    start + 120.003,
                    "resume_received",
                    at=120.0,
                    ended_break=None,
                    ignored=True,
                    status="success",
                    details="no active break: ignored",
                )
            if kinds[vm] == "complete":
                if v.rng.random() < 0.02:
                    v.ev(
                        start + 5,
                        "control_refused",
                        type="resume",
                        id="x-1",
                        status="error",
                        details="signature does not verify",
                    )
                end += 0.01
                v.ev(end, "schedule_complete", entries=entries + 2, failures=0)
            elif kinds[vm] == "with failures":  # it goes on after the failed entry, and completes
                end += 0.01
                v.ev(end, "schedule_complete", status="success", ran=entries + 2, exited_nonzero=1)
        v.kpis(boots[vm], end, kpi_interval, 10 + v.rng.random() * 50)
        out.lines += v.write(os.path.join(logs, f"{vm}.jsonl"))
    resumes = [
        {
            "id": "resume-0123456789abcdef",
            "at": RESUME_AT,
            "issued": start + RESUME_AT,
            "targets": sorted(configured),
            "answered": {vm: {"status": "success"} for vm in sorted(configured) if kinds[vm] != "failed"},
        },
    ]
    if ignoring:
        resumes.append(
            {
                "id": "resume-fedcba9876543210",
                "at": 120.0,
                "issued": start + 120.0,
                "targets": ignoring,
                "answered": {vm: {"ignored": True} for vm in ignoring},
            }
        )
    experiment = {
        "version": 1,
        "run_id": "run-00112233445566778",
        "name": name,
        "barrier": {
            "expected": names,
            "buffer": BUFFER,
            "configured": dict(sorted(configured.items())),
            "excluded": [],
            "released": [],
            "released_at": None,
            "start_time": start,
        },
        "start_set_at": max(configured.values()),
        "resumes": resumes,
    }
    if name is None:
        del experiment["name"]
    with open(os.path.join(logs, "experiment.json"), "w", encoding="utf-8") as fh:
        json.dump(experiment, fh)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m tests.reportgen DIR --vms N``: write the logs, print a summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs")
    ap.add_argument("--vms", type=int, default=200)
    ap.add_argument("--entries", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kpi-interval", type=float, default=10.0)
    args = ap.parse_args(argv)
    g = generate(args.logs, args.vms, entries=args.entries, seed=args.seed, kpi_interval=args.kpi_interval)
    counts: Dict[str, int] = {}
    for kind in g.kinds.values():
        counts[kind] = counts.get(kind, 0) + 1
    print(f"{len(g.vms)} VMs, {g.lines} records in {g.logs}: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
