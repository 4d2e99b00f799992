"""Test harness: a real ``vmr-host serve`` and real ``vmr-handler run`` agents on this machine.

Directories live under a short ``/tmp/vhXXXX`` path so unix socket paths stay < 108 bytes.
Every wait is bounded; nothing asserts on speed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import yaml

from tests.broker import Broker

WAIT = 90.0


class HostEnv:
    """One experiment: schedules, resources, logs, channels; the host and its agents.

    ``transport="mqtt"`` runs the same experiment over a real mosquitto started for it
    (:class:`tests.broker.Broker`, anonymous, on 127.0.0.1) instead of unix sockets; pass
    ``broker`` and ``experiment`` of another env to share them (several hosts, one broker).
    """

    def __init__(
        self,
        schedules: Dict[str, Any],
        start_buffer: float = 1.0,
        transport: str = "unix",
        broker: Optional[Broker] = None,
        experiment: Optional[str] = None,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(dir="/tmp", prefix="vh"))
        self.transport = transport
        self.experiment = experiment or "exp-" + self.root.name
        self.broker: Optional[Broker] = broker
        self.owns_broker = False
        if transport == "mqtt" and broker is None:
            self.broker = Broker(self.root / "broker").start()
            self.owns_broker = True
        self.schedules = self.root / "sch"
        self.resources = self.root / "res"
        self.logs = self.root / "logs"
        self.channels = self.root / "ch"
        for d in (self.schedules, self.resources, self.logs, self.channels):
            d.mkdir()
        for vm, sched in schedules.items():
            (self.schedules / f"{vm}.yaml").write_text(yaml.safe_dump(sched))
        self.start_buffer = start_buffer
        self.host: Optional[subprocess.Popen] = None
        self.agents: Dict[str, subprocess.Popen] = {}

    # ---------------------------------------------------------------- processes
    def start_host(self, *extra: str) -> subprocess.Popen:
        log = open(self.root / "host.out", "ab")  # noqa: SIM115 - owned by the process
        self.host = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vmr_handler.host",
                "serve",
                "--schedules",
                str(self.schedules),
                "--resources",
                str(self.resources),
                "--logs",
                str(self.logs),
                "--channels",
                str(self.channels),
                "--start-buffer",
                str(self.start_buffer),
                *self.host_transport_args(),
                *extra,
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        self.wait_for(self._answers, "the running host answering on its control socket")
        return self.host

    def _answers(self) -> bool:
        """The running host answers ``status`` (a stale socket of a killed host does not, and
        ``status`` then reads the logs instead: ``offline``)."""
        if not (self.logs / "vmr-host.sock").exists():
            return False
        res = self.cli("status", "--json")
        if res.returncode not in (0, 1) or not res.stdout.strip():
            return False
        return not json.loads(res.stdout).get("offline")

    def kill_host(self) -> None:
        assert self.host is not None
        self.host.kill()
        self.host.wait(timeout=WAIT)

    def host_transport_args(self) -> List[str]:
        """``vmr-host serve`` flags of this env's transport."""
        if self.broker is None:
            return []
        return ["--transport", "mqtt", "--broker", self.broker.url, "--experiment", self.experiment]

    def agent_transport_args(self, vm: str, port: Optional[str]) -> List[str]:
        """``vmr-handler run`` flags of this env's transport (``port`` overrides for unix)."""
        if self.broker is None or port is not None:
            return ["--port", port or f"unix:{self.sock(vm)}"]
        return ["--transport", "mqtt", "--broker", self.broker.url, "--experiment", self.experiment]

    def sock(self, vm: str) -> str:
        return str(self.channels / f"{vm}.sock")

    def state(self, vm: str) -> Path:
        return self.root / "vm" / vm / "state"

    def start_agent(
        self, vm: str, *extra: str, port: Optional[str] = None, prefix: Sequence[str] = ()
    ) -> subprocess.Popen:
        """``vmr-handler run`` for ``vm``; ``prefix`` runs it through a wrapper (a sandbox)."""
        base = self.root / "vm" / vm
        base.mkdir(parents=True, exist_ok=True)
        log = open(base / "agent.out", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "vmr_handler",
                "run",
                *self.agent_transport_args(vm, port),
                "--state-dir",
                str(base / "state"),
                "--launch-dir",
                str(base / "launch"),
                "--vm-name",
                vm,
                *extra,
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        self.agents[vm] = proc
        return proc

    def agent_log(self, vm: str) -> str:
        path = self.root / "vm" / vm / "agent.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def host_log(self) -> str:
        path = self.root / "host.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "vmr_handler.host", *args, "--logs", str(self.logs)],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )

    def status(self) -> Dict[str, Any]:
        res = self.cli("status", "--json")
        assert res.returncode in (0, 1), res.stderr  # 1: some VM failed
        return json.loads(res.stdout)

    # ---------------------------------------------------------------- logs
    def events(self, vm: str, type_: Optional[str] = None) -> List[Dict[str, Any]]:
        path = self.logs / f"{vm}.jsonl"
        if not path.exists():
            return []
        out = []
        text = path.read_text()
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]  # the host is writing the last line right now
        for line in text.splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if type_ is None or rec["event"]["type"] == type_:
                out.append(rec)
        return out

    def wait_for(self, pred: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = pred()
            if value:
                return value
            if self.host is not None and self.host.poll() is not None:
                raise AssertionError(
                    f"vmr-host exited {self.host.returncode} waiting for {what}:\n{self.host_log()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\nhost:\n{self.host_log()[-3000:]}")

    def wait_event(self, vm: str, type_: str, **match: Any) -> Dict[str, Any]:
        def find() -> Optional[Dict[str, Any]]:
            for rec in self.events(vm, type_):
                if all(rec["event"]["data"].get(k) == v for k, v in match.items()):
                    return rec
            return None

        return self.wait_for(find, f"{vm}: {type_} {match}\nagent:\n{self.agent_log(vm)[-2000:]}")

    def close(self) -> None:
        for proc in [*self.agents.values(), *([self.host] if self.host else [])]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.agents.values(), *([self.host] if self.host else [])]:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.broker is not None and self.owns_broker:
            self.broker.stop()
        if os.environ.get("VMR_KEEP_TEST_DIRS") is None:
            shutil.rmtree(self.root, ignore_errors=True)


def write_pki(directory: Path) -> None:
    """A test CA and a server certificate for 127.0.0.1 (made like ``vmr-host mqtt-config
    --tls``): ``ca.crt``, ``server.crt`` and ``server.key`` in ``directory``."""
    from vmr_handler.host.cli.mqtt_config._tls import make_pki

    pki = make_pki("t", ["127.0.0.1"], 1)
    (directory / "ca.crt").write_bytes(pki.ca_cert)
    (directory / "server.crt").write_bytes(pki.server_cert)
    (directory / "server.key").write_bytes(pki.server_key)


def fill(directory: Path) -> Path:
    """Write a file into ``directory`` until its file system is full (ENOSPC); the file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler
