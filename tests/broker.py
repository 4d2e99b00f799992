"""Test harness: a real mosquitto broker started by the test on a free 127.0.0.1 port.

The broker runs as the current user (``user`` in its config), so its config, password file,
ACL, certificates, persistence directory and log can all live in a temp dir the test owns
(``qemu-mqtt-lab.md``: started as root, mosquitto would otherwise drop to user ``mosquitto``).
It is stopped by PID. ``mosquitto`` comes from the Debian package that ``.ci/run`` installs.
"""

from __future__ import annotations

import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections (32768 when unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, picked below the kernel's ephemeral
    range: a port from that range (``bind(0)``) can be taken by any outgoing connection before
    the server that was meant to listen on it starts (thousands of MQTT clients of a benchmark
    running beside the tests did exactly that)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """One mosquitto process.

    Args:
        root: directory for config, persistence and log (a new temp dir when None).
        extra_config: lines appended to the generated config (listeners, auth, TLS...).
        listener: write a plain ``listener PORT 127.0.0.1`` with anonymous access; False when
            ``extra_config`` brings its own listeners (then pass ``port``).
        persistence: keep QoS 1 sessions and retained messages across a restart.
        config: an existing config file to run as-is (e.g. one ``vmr-host mqtt-config``
            wrote); ``extra_config``, ``listener`` and ``persistence`` are then ignored and
            ``port`` is the listener to wait for.
    """

    def __init__(
        self,
        root: Optional[Path] = None,
        extra_config: str = "",
        listener: bool = True,
        port: Optional[int] = None,
        persistence: bool = True,
        config: Optional[Path] = None,
    ) -> None:
        self.root = root or Path(tempfile.mkdtemp(dir="/tmp", prefix="vhmq"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.conf = config or self.root / "mosquitto.conf"
        self.log = self.root / "mosquitto.log"
        self.proc: Optional[subprocess.Popen] = None
        if config is not None:
            return
        lines: List[str] = [
            f"user {getpass.getuser()}",
            f"log_dest file {self.log}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type subscribe",
            "log_timestamp true",
            "max_queued_messages 100000",
        ]
        if persistence:
            lines += ["persistence true", f"persistence_location {self.root}/", "autosave_interval 1"]
        if listener:
            lines += [f"listener {self.port} 127.0.0.1", "allow_anonymous true"]
        self.conf.write_text("\n".join(lines) + "\n" + extra_config)

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:PORT``."""
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> Broker:
        """Start mosquitto and wait until its port accepts connections. Raises RuntimeError."""
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "mosquitto.err", "ab"),  # noqa: SIM115 - owned by the process
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited {self.proc.returncode}: {self.errors()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port}: {self.errors()}")

    def errors(self) -> str:
        """What mosquitto wrote to its stderr and log (for failure messages)."""
        out = ""
        for path in (self.root / "mosquitto.err", self.log):
            if path.exists():
                out += path.read_text(errors="replace")[-4000:]
        return out

    def stop(self) -> None:
        """SIGTERM by PID (mosquitto saves its persistence file), SIGKILL after 5 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again on the same port."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def close(self) -> None:
        """Stop and remove the temp dir."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
