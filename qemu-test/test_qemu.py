"""Real QEMU guests (TCG) running the frozen agent, talking to a real ``vmr-host serve``
over a real virtio-serial port. Every assertion is on the host's logs (``<logs>/<vm>.jsonl``).

Session fixture: ``packaging/build.sh`` (the frozen onedir agent), then
``qemu-test/build-guest.sh`` (Debian cloud kernel + busybox initramfs with the agent as
``/usr/local/bin/vmr-handler run --quiet``). Kernel and modules are cached in
``qemu-test/.cache``. At most 2 guests run at once. Every wait is bounded; nothing asserts on
speed (timings are printed: run pytest with ``-s`` to see them).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from tests.hostenv import HostEnv

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUILD_TIMEOUT = 600.0
RUN_TIMEOUT = 180.0  # boot + stages + barrier + positive time, under TCG
PORT_NAME = "org.vmr.handler.0"
NONUTF8 = b"pos \xff\xfe end\n"

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 120)


REPORT: List[str] = []


def _say(msg: str) -> None:
    REPORT.append(msg)
    print(f"[qemu-test] {msg}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session", autouse=True)
def _report(pytestconfig: pytest.Config) -> Iterator[None]:
    yield
    getattr(pytestconfig, "qemu_report", []).extend(REPORT)


@pytest.fixture(scope="session")
def guest() -> Iterator[Dict[str, Any]]:
    """Build the frozen agent and the guest once: ``{"kernel", "initrd", "timings"}``."""
    if not shutil.which("apt-get") and not shutil.which("qemu-system-x86_64"):
        pytest.fail("qemu-test needs qemu-system-x86_64 (or apt-get to install it)")
    work = Path(tempfile.mkdtemp(prefix="vmr-qemu-build."))
    timings: Dict[str, float] = {}
    env = {**os.environ, "PYTHON": sys.executable, "VMR_BUILD_WORK": str(work / "pyi")}
    env.pop("VMR_PYI_MODE", None)
    t0 = time.monotonic()
    res = subprocess.run(
        ["bash", str(REPO / "packaging" / "build.sh"), str(work / "dist")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        env=env,
        cwd=REPO,
    )
    if res.returncode != 0:
        pytest.fail(f"packaging/build.sh failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}")
    timings["agent_build"] = time.monotonic() - t0
    t1 = time.monotonic()
    res = subprocess.run(
        [
            "bash",
            str(HERE / "build-guest.sh"),
            os.environ.get("VMR_QEMU_CACHE", str(HERE / ".cache")),
            str(work / "dist" / "vmr-handler"),
        ],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        env={**os.environ, "VMR_GUEST_OUT": str(work / "guest")},
        cwd=REPO,
    )
    if res.returncode != 0:
        pytest.fail(f"build-guest.sh failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}")
    timings["guest_build"] = time.monotonic() - t1
    out = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    _say(
        f"agent build {timings['agent_build']:.1f} s, guest build {timings['guest_build']:.1f} s "
        f"({res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ''})"
    )
    yield {"kernel": out["KERNEL"], "initrd": out["INITRD"], "timings": timings}
    shutil.rmtree(work, ignore_errors=True)


def _schedule(vm: str, config_sleep: int) -> List[Dict[str, Any]]:
    return [
        # stage 0 (-20): a content drop read back by the entry that dropped it
        {
            "start_time": -20,
            "executable": "/bin/cat",
            "arguments": "hello.txt",
            "data": [{"location": "hello.txt", "content": f"hello from {vm}\n"}],
        },
        # stage 1 (-10): configuration of a different length per VM
        {"start_time": -10, "executable": "sleep", "arguments": str(config_sleep)},
        # positive time: non-UTF-8 output, then a 2 s pause at 2, then an entry at 3 (fires at 5)
        {"start_time": 1, "executable": "printf", "arguments": r"'pos \xff\xfe end\n'"},
        {"start_time": 2, "pause_duration": 2},
        {"start_time": 3, "executable": "/bin/echo", "arguments": f"after pause on {vm}"},
    ]


class Qemu:
    """One guest: QEMU as the client of vmr-host's listening channel socket."""

    def __init__(self, env: HostEnv, vm: str, kernel: str, initrd: str) -> None:
        self.vm = vm
        self.console = env.root / f"{vm}.console"
        self.out = env.root / f"{vm}.qemu"
        cmd = [
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-m",
            "512",
            "-smp",
            "1",
            "-nographic",
            "-no-reboot",
            "-nic",
            "none",
            "-monitor",
            "none",
            "-serial",
            f"file:{self.console}",
            "-kernel",
            kernel,
            "-initrd",
            initrd,
            "-append",
            f"console=ttyS0 panic=-1 quiet vmr.name={vm}",
            "-chardev",
            f"socket,id=c0,path={env.sock(vm)},reconnect=1",
            "-device",
            "virtio-serial-pci,id=vser0",
            "-device",
            f"virtserialport,bus=vser0.0,chardev=c0,name={PORT_NAME}",
        ]
        self.started = time.time()
        with open(self.out, "wb") as log, open(os.devnull, "rb") as null:
            self.proc = subprocess.Popen(cmd, stdin=null, stdout=log, stderr=log)

    def tail(self) -> str:
        text = ""
        for p in (self.out, self.console):
            if p.exists():
                text += f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
        return text

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def _ev(env: HostEnv, vm: str, type_: str) -> List[Dict[str, Any]]:
    return env.events(vm, type_)


def _reassemble(env: HostEnv, vm: str, index: int, stream: str = "stdout") -> bytes:
    pieces = sorted(
        (
            r["event"]["data"]
            for r in _ev(env, vm, "output")
            if r["event"]["data"]["index"] == index and r["event"]["data"]["stream"] == stream
        ),
        key=lambda d: d["seq"],
    )
    out = b""
    for d in pieces:
        out += d["line"].encode() if "line" in d else base64.b64decode(d["line_b64"])
        if d.get("eol", True):
            out += b"\n"
    return out


def test_two_guests_schedule_barrier_positive_pause_nonutf8(guest: Dict[str, Any]) -> None:
    t_test = time.monotonic()
    sleeps = {"vm1": 1, "vm2": 5}
    schedules = {vm: _schedule(vm, s) for vm, s in sleeps.items()}
    env = HostEnv(schedules, start_buffer=2.0)
    qemus: Dict[str, Qemu] = {}
    try:
        env.start_host()
        for vm in sleeps:
            qemus[vm] = Qemu(env, vm, guest["kernel"], guest["initrd"])

        def guest_alive() -> None:
            for q in qemus.values():
                if q.proc.poll() is not None:
                    raise AssertionError(f"{q.vm}: QEMU exited {q.proc.returncode}\n{q.tail()}")

        def done(vm: str) -> bool:
            guest_alive()
            return any(r["event"]["data"]["index"] == 4 for r in _ev(env, vm, "entry_exited"))

        try:
            env.wait_for(
                lambda: all([done(vm) for vm in sleeps]), "both VMs: last entry exited", timeout=RUN_TIMEOUT
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n"
                + "\n".join(q.tail() for q in qemus.values())
                + "\n"
                + "\n".join(
                    (env.logs / f"{vm}.log").read_text(errors="replace")[-3000:]
                    for vm in sleeps
                    if (env.logs / f"{vm}.log").exists()
                )
            ) from None
        elapsed_run = time.monotonic() - t_test

        # -------------------------------------------------- schedule over the real port
        for vm in sleeps:
            started = _ev(env, vm, "agent_started")
            assert started, f"{vm}: no agent_started"
            loaded = _ev(env, vm, "schedule_loaded")
            assert len(loaded) == 1, loaded
            digest = hashlib.sha256((env.schedules / f"{vm}.yaml").read_bytes()).hexdigest()
            assert loaded[0]["event"]["data"]["digest"] == digest
            assert loaded[0]["event"]["data"]["entries"] == len(schedules[vm])
            log = (env.logs / f"{vm}.log").read_text(errors="replace")
            assert "[host]" in log
            # the content drop, and the entry that read it back
            placed = [r["event"]["data"] for r in _ev(env, vm, "data_placed")]
            assert any(d["location"] == "hello.txt" for d in placed), placed
            assert _reassemble(env, vm, 0) == f"hello from {vm}\n".encode()

        # -------------------------------------------------- stages in order, then configured
        configured_rx: Dict[str, float] = {}
        boot_to: Dict[str, Tuple[float, float]] = {}
        for vm in sleeps:
            order = [
                (r["event"]["type"], r["event"]["data"].get("stage"))
                for r in env.events(vm)
                if r["event"]["type"] in ("stage_started", "stage_finished", "configured")
            ]
            assert order == [
                ("stage_started", 0),
                ("stage_finished", 0),
                ("stage_started", 1),
                ("stage_finished", 1),
                ("configured", None),
            ], order
            fin1 = [
                d for d in (r["event"]["data"] for r in _ev(env, vm, "stage_finished")) if d["stage"] == 1
            ]
            assert fin1[0]["duration"] >= sleeps[vm] - 0.1, fin1
            cfg = _ev(env, vm, "configured")[0]
            configured_rx[vm] = _utc(cfg["host_received"])
            first = _utc(_ev(env, vm, "agent_started")[0]["host_received"])
            boot_to[vm] = (first - qemus[vm].started, configured_rx[vm] - qemus[vm].started)

        # -------------------------------------------------- one start time for both (barrier)
        starts = {
            vm: [r["event"]["data"]["start_time"] for r in _ev(env, vm, "start_time_set")] for vm in sleeps
        }
        assert all(len(s) == 1 for s in starts.values()), starts
        start = starts["vm1"][0]
        assert starts["vm2"][0] == start, starts
        assert start >= max(configured_rx.values()) + 2.0 - 0.5, (start, configured_rx)
        assert configured_rx["vm1"] < configured_rx["vm2"], configured_rx  # different config lengths

        # -------------------------------------------------- positive entry on both, pause shifts the next
        spawned: Dict[str, float] = {}
        received: Dict[str, float] = {}
        for vm in sleeps:
            received[vm] = next(
                r["host_received"] for r in _ev(env, vm, "entry_started") if r["event"]["data"]["index"] == 2
            )
            ent = {r["event"]["data"]["index"]: r["event"]["data"] for r in _ev(env, vm, "entry_started")}
            assert abs(ent[2]["scheduled"] - (start + 1)) < 1e-6, ent[2]
            assert abs(ent[4]["scheduled"] - (start + 3 + 2)) < 1e-6, ent[4]  # 2 s pause at 2
            spawned[vm] = ent[2]["spawned_at"]
            pauses = [r["event"]["data"] for r in _ev(env, vm, "pause_started")]
            assert len(pauses) == 1 and pauses[0]["duration"] == 2, pauses
            # -------------------------------------------------- non-UTF-8 output, lossless
            out = [r["event"]["data"] for r in _ev(env, vm, "output") if r["event"]["data"]["index"] == 2]
            assert any("line_b64" in d for d in out), out
            assert _reassemble(env, vm, 2) == NONUTF8
            assert _reassemble(env, vm, 4) == f"after pause on {vm}\n".encode()
            late = {i: ent[i]["spawned_at"] - ent[i]["scheduled"] for i in (2, 4)}
            _say(
                f"{vm}: |spawned_at - scheduled| entry@1 {abs(late[2]) * 1000:.1f} ms, "
                f"entry@3(+pause) {abs(late[4]) * 1000:.1f} ms"
            )
        spread = max(spawned.values()) - min(spawned.values())
        rx_spread = max(received.values()) - min(received.values())
        _say(
            f"cross-VM spread of the positive entry at 1 s: spawned_at (agents' host-corrected clocks) "
            f"{spread * 1000:.1f} ms; host receive time of entry_started {rx_spread * 1000:.1f} ms"
        )
        for vm, (hello, cfg) in boot_to.items():
            console = qemus[vm].console.read_text(errors="replace")
            m = re.search(r"uptime ([0-9.]+) s, starting vmr-handler", console)
            _say(f"{vm}: guest uptime when /init starts the agent: {m.group(1) if m else '?'} s")
            _say(
                f"{vm}: QEMU start -> agent_started received {hello:.1f} s, -> configured received "
                f"{cfg:.1f} s (stage sleep {sleeps[vm]} s)"
            )
        tm = guest["timings"]
        _say(
            f"test run (host + 2 guests to last entry): {elapsed_run:.1f} s; "
            f"builds: agent {tm['agent_build']:.1f} s, guest {tm['guest_build']:.1f} s"
        )
    finally:
        for q in qemus.values():
            q.kill()
        env.close()
        _say(f"whole test incl. teardown: {time.monotonic() - t_test:.1f} s")


def _utc(value: Any) -> float:
    """``host_received`` as epoch seconds (a number, or an ISO-8601 string)."""
    if isinstance(value, (int, float)):
        return float(value)
    from datetime import datetime, timezone

    dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
