"""Shared harness of the qemu tests: building the frozen agent + guest once, starting QEMU
guests wired to vmr-host's channel sockets, reading output back from the host's logs."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from tests.hostenv import HostEnv

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUILD_TIMEOUT = 600.0
PORT_NAME = "org.vmr.handler.0"

#: Timings the tests measured, printed in pytest's terminal summary (conftest.py).
REPORT: List[str] = []


def say(msg: str) -> None:
    """Record a timing line (and show it on stderr right away)."""
    REPORT.append(msg)
    print(f"[qemu-test] {msg}", file=sys.stderr, flush=True)


def build_guest(onedir: bool = False) -> Iterator[Dict[str, Any]]:
    """Build the frozen agent and the guest once: ``{"kernel", "initrd", "agent", "timings"}``
    (the ``guest`` session fixture of conftest.py). ``agent`` is the single file that
    ``packaging/build.sh`` makes by default, or with ``onedir`` the executable inside the
    ``--onedir`` bundle (the benchmark compares the two)."""
    if not shutil.which("apt-get") and not shutil.which("qemu-system-x86_64"):
        pytest.fail("qemu-test needs qemu-system-x86_64 (or apt-get to install it)")
    work = Path(tempfile.mkdtemp(prefix="vmr-qemu-build."))
    timings: Dict[str, float] = {}
    env = {**os.environ, "PYTHON": sys.executable, "VMR_BUILD_WORK": str(work / "pyi")}
    env.pop("VMR_PYI_MODE", None)
    # a private PyInstaller bincache: a concurrent build elsewhere on the machine (another
    # pytest, packaging/build.sh by hand) rewrites the shared ~/.cache/pyinstaller under us
    env["PYINSTALLER_CONFIG_DIR"] = str(work / "pyi-config")
    t0 = time.monotonic()
    res = subprocess.run(
        ["bash", str(REPO / "packaging" / "build.sh"), *(["--onedir"] if onedir else []), str(work / "dist")],
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
        env={**os.environ, "VMR_GUEST_OUT": str(work / "guest"), "PYTHON": sys.executable},
        cwd=REPO,
    )
    if res.returncode != 0:
        pytest.fail(f"build-guest.sh failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}")
    timings["guest_build"] = time.monotonic() - t1
    out = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    say(
        f"agent build {timings['agent_build']:.1f} s, guest build {timings['guest_build']:.1f} s "
        f"({res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ''})"
    )
    dist = work / "dist" / "vmr-handler"
    agent = dist / "vmr-handler" if onedir else dist
    yield {"kernel": out["KERNEL"], "initrd": out["INITRD"], "agent": str(agent), "timings": timings}
    shutil.rmtree(work, ignore_errors=True)


class Qemu:
    """One guest: QEMU as the client of vmr-host's listening channel socket."""

    def __init__(
        self,
        env: HostEnv,
        vm: str,
        kernel: str,
        initrd: str,
        *,
        no_reboot: bool = True,
        disk: Optional[Path] = None,
        append: str = "",
    ) -> None:
        """``no_reboot=False``: a guest reboot restarts the guest (QEMU keeps running);
        ``disk``: a raw image attached as a virtio disk (the guest's state disk, ``/dev/vda``);
        ``append``: extra kernel command-line words (:func:`qemu_argv`)."""
        self.vm = vm
        self.console = env.root / f"{vm}.console"
        self.out = env.root / f"{vm}.qemu"
        cmd = qemu_argv(env, vm, kernel, initrd, self.console, append=append, no_reboot=no_reboot, disk=disk)
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


def reassemble(env: HostEnv, vm: str, index: int, stream: str = "stdout") -> bytes:
    pieces = sorted(
        (
            r["event"]["data"]
            for r in env.events(vm, "output")
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


def stage_order(env: HostEnv, vm: str) -> List[Tuple[str, Optional[int]]]:
    """``(type, stage)`` of the VM's stage_started / stage_finished / configured events, in log order."""
    return [
        (r["event"]["type"], r["event"]["data"].get("stage"))
        for r in env.events(vm)
        if r["event"]["type"] in ("stage_started", "stage_finished", "configured")
    ]


def utc(value: Any) -> float:
    """``host_received`` as epoch seconds (a number, or an ISO-8601 string)."""
    if isinstance(value, (int, float)):
        return float(value)
    from datetime import datetime, timezone

    dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def qemu_argv(
    env: HostEnv,
    vm: str,
    kernel: str,
    initrd: str,
    console: Path,
    *,
    append: str = "",
    no_reboot: bool = True,
    disk: Optional[Path] = None,
) -> List[str]:
    """The QEMU command line of :class:`Qemu` (the same wiring), with ``append``: extra words
    for the kernel command line (``vmr.timing``: ``/init`` times ``vmr-handler --version``
    cold and warm before it starts the agent)."""
    return [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        "512",
        "-smp",
        "1",
        "-nographic",
        *(["-no-reboot"] if no_reboot else []),
        "-nic",
        "none",
        "-monitor",
        "none",
        "-serial",
        f"file:{console}",
        "-kernel",
        kernel,
        "-initrd",
        initrd,
        "-append",
        f"console=ttyS0 panic=-1 quiet vmr.name={vm}" + (f" {append}" if append else ""),
        "-chardev",
        f"socket,id=c0,path={env.sock(vm)},reconnect=1",
        "-device",
        "virtio-serial-pci,id=vser0",
        "-device",
        f"virtserialport,bus=vser0.0,chardev=c0,name={PORT_NAME}",
        *(["-drive", f"file={disk},format=raw,if=virtio"] if disk is not None else []),
    ]


class QemuAppend(Qemu):
    """A :class:`Qemu` guest with extra kernel command-line words (see :func:`qemu_argv`)."""

    def __init__(self, env: HostEnv, vm: str, kernel: str, initrd: str, append: str) -> None:
        """Start QEMU at once (``-no-reboot``, no disk); ``started`` is the wall time of the start."""
        super().__init__(env, vm, kernel, initrd, append=append)


# ---------------------------------------------------------------------- MQTT guests (fw_cfg)
#: QEMU fw_cfg name of the per-VM settings blob (``vmr-host mqtt-config``'s ``vms/<vm>.yaml``).
FW_CFG_NAME = "opt/org.vmr/config"
#: The address the guests reach the broker at: a slirp ``guestfwd`` to the host's 127.0.0.1.
GUESTFWD_ADDR = "10.0.2.100"
SPEC = REPO / "packaging" / "vmr-handler.spec"


def agent_lacks_ssl() -> bool:
    """The frozen agent of ``packaging/vmr-handler.spec`` is built without ``ssl``.

    ``vmr_handler.transports.mqtt.options`` imports ``ssl`` at module level, so such an agent cannot
    use the MQTT transport at all (not even ``mqtt://``): ``ModuleNotFoundError: ssl``.
    The spec keeps ``ssl`` since the MQTT transport; this names the failure if that regresses.
    """
    code = "\n".join(line.split("#", 1)[0] for line in SPEC.read_text().splitlines())
    return '"ssl"' in code


def qemu_mqtt_argv(
    kernel: str,
    initrd: str,
    console: Path,
    blob: Path,
    broker_port: int,
    *,
    guest_port: Optional[int] = None,
    append: str = "",
    forward: str = "tcp",
) -> List[str]:
    """A guest with no identity of its own and no virtio-serial port: the per-VM settings only
    as the fw_cfg blob ``blob`` (``-fw_cfg name=opt/org.vmr/config,file=BLOB``), and a
    virtio-net NIC on a restricted slirp network whose only way out is a ``guestfwd`` from
    ``10.0.2.100:GUEST_PORT`` (default ``broker_port``) to the broker on the host's
    ``127.0.0.1:BROKER_PORT``. The kernel command line names no VM (``/init`` gives eth0
    10.0.2.15/24, ``vmr.ip=`` overrides).

    ``forward``: ``"tcp"`` forwards to the chardev ``tcp:127.0.0.1:PORT`` (the lab notes'
    recipe): QEMU opens that one connection to the broker when it starts and the guest's
    connection is spliced onto it, so the broker must listen before QEMU starts, and after the
    broker closes it (a restart) the guest never gets through again. ``"cmd"`` runs
    ``/bin/busybox nc 127.0.0.1 PORT`` (busybox-static, which build-guest.sh installs) for
    every connection the guest opens: a reconnect gets a new host connection."""
    gport = guest_port or broker_port
    if forward == "tcp":
        target = f"tcp:127.0.0.1:{broker_port}"
    elif forward == "cmd":
        target = f"cmd:/bin/busybox nc 127.0.0.1 {broker_port}"
    else:
        raise ValueError(f"forward must be 'tcp' or 'cmd', not {forward!r}")
    return [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        "512",
        "-smp",
        "1",
        "-nographic",
        "-no-reboot",
        "-monitor",
        "none",
        "-serial",
        f"file:{console}",
        "-kernel",
        kernel,
        "-initrd",
        initrd,
        "-append",
        "console=ttyS0 panic=-1 quiet" + (f" {append}" if append else ""),
        "-netdev",
        f"user,id=n0,restrict=on,guestfwd=tcp:{GUESTFWD_ADDR}:{gport}-{target}",
        "-device",
        "virtio-net-pci,netdev=n0,romfile=",
        "-fw_cfg",
        f"name={FW_CFG_NAME},file={blob}",
    ]


class QemuMqtt(Qemu):
    """A guest that gets everything from its fw_cfg blob and talks MQTT (:func:`qemu_mqtt_argv`);
    ``vm`` names only the files on the host side (console, QEMU output)."""

    def __init__(
        self,
        root: Path,
        vm: str,
        kernel: str,
        initrd: str,
        blob: Path,
        broker_port: int,
        append: str = "",
        forward: str = "tcp",
    ) -> None:
        """Start QEMU at once; ``started`` is the wall time of the start."""
        self.vm = vm
        self.console = root / f"{vm}.console"
        self.out = root / f"{vm}.qemu"
        self.argv = qemu_mqtt_argv(
            kernel, initrd, self.console, blob, broker_port, append=append, forward=forward
        )
        self.started = time.time()
        with open(self.out, "wb") as log, open(os.devnull, "rb") as null:
            self.proc = subprocess.Popen(self.argv, stdin=null, stdout=log, stderr=log)
