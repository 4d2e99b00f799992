"""Test helpers for ``vmr-host``: a FAKE agent speaking the protocol over a plain socket, and
the real ``vmr-host serve`` in a subprocess.

The fake agent is deliberately dumb and explicit: tests decide what it sends (``\\n``,
``hello``, reports, ``configured``, ``clock_req``, ``resource_request``,
``transfer_chunk``, raw garbage) and read what the host sends back (``hello``, ``welcome``,
``schedule``, ``start_time``, ``resume``, ``ack``...). Every wait is bounded.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

import yaml

from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import FrameDecoder, encode_message

WAIT = 20.0  # upper bound of any wait, seconds (a bound, not a speed assertion)


class FakeAgent:
    """A protocol peer on a connected unix socket.

    Args:
        sock: connected socket (to the host's listening channel, or accepted from the host).
        vm: the name this fake claims in its hello.
    """

    def __init__(self, sock: socket.socket, vm: str) -> None:
        self.sock = sock
        self.vm = vm
        self.decoder = FrameDecoder()
        self.inbox: List[Event] = []
        self.prefix = uuid.uuid4().hex[:8]
        self.counter = 0
        self.closed = False

    # ------------------------------------------------------------------ connecting
    @classmethod
    def connect(cls, path: str, vm: str, timeout: float = WAIT) -> FakeAgent:
        """Connect to a channel socket the host listens on (retrying until it exists)."""
        deadline = time.monotonic() + timeout
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                break
            except OSError:
                s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        agent = cls(s, vm)
        agent.send_raw(b"\n")
        return agent

    @classmethod
    def accept(cls, listener: socket.socket, vm: str, timeout: float = WAIT) -> FakeAgent:
        """Accept the host's connection on ``listener`` (connect mode: the test plays QEMU)."""
        listener.settimeout(timeout)
        s, _ = listener.accept()
        agent = cls(s, vm)
        agent.send_raw(b"\n")
        return agent

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ sending
    def new_id(self) -> str:
        self.counter += 1
        return f"{self.prefix}-{self.counter:08d}"

    def event(self, type_: str, data: Optional[Dict[str, Any]] = None, id: Optional[str] = None) -> Event:
        return Event(type_, time.time(), id or self.new_id(), data or {})

    def send_raw(self, data: bytes) -> None:
        self.sock.settimeout(WAIT)  # sendall's timeout bounds the whole send
        self.sock.sendall(data)

    def send(self, *events: Event) -> List[str]:
        """Send one message with ``events``; returns their ids."""
        self.send_raw(encode_message(list(events), time.time()))
        return [e.id for e in events]

    def report(self, type_: str, id: Optional[str] = None, **data: Any) -> str:
        """Send one report event; returns its id."""
        return self.send(self.event(type_, data, id))[0]

    def hello(
        self,
        digest: Optional[str] = None,
        configured_at: Optional[float] = None,
        start_time: Optional[float] = None,
        claimed: Optional[str] = None,
    ) -> str:
        data = {
            "protocol": 1,
            "agent_version": "fake",
            "boot_id": "boot-" + self.prefix,
            "vm": claimed or self.vm,
            "journal": {
                "digest": digest,
                "configured_at": configured_at,
                "start_time": start_time,
                "stages_done": [],
                "resumes": 0,
            },
            "unacked": 0,
        }
        return self.send(self.event("hello", data))[0]

    def handshake(self, digest: Optional[str] = None, **kw: Any) -> Event:
        """Wait for the host hello, send ours, return the welcome."""
        self.take("hello")
        self.hello(digest, **kw)
        return self.take("welcome")

    # ------------------------------------------------------------------ receiving
    def pump(self, timeout: float) -> bool:
        """Read what is available within ``timeout``; False on EOF."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(1 << 20)
        except (socket.timeout, BlockingIOError):
            return True
        except OSError:
            return False
        if not data:
            return False
        for msg in self.decoder.feed(data):
            self.inbox.extend(msg.events)
        return True

    def take(
        self, type_: str, pred: Optional[Callable[[Event], bool]] = None, timeout: float = WAIT
    ) -> Event:
        """Remove and return the first received event of ``type_`` matching ``pred``."""
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.inbox):
                if ev.type == type_ and (pred is None or pred(ev)):
                    return self.inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.vm}: no {type_!r} within {timeout}s; inbox: {[e.type for e in self.inbox]}"
                )
            if not self.pump(min(left, 0.2)):
                raise AssertionError(f"{self.vm}: connection closed while waiting for {type_!r}")

    def none_of(self, type_: str, within: float) -> None:
        """Assert that no ``type_`` event arrives within ``within`` seconds."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if any(e.type == type_ for e in self.inbox):
                raise AssertionError(f"{self.vm}: unexpected {type_!r}: {self.inbox}")
            if not self.pump(0.05):
                break
        assert not any(e.type == type_ for e in self.inbox), self.inbox

    def wait_ack(self, ids: Iterable[str], timeout: float = WAIT) -> None:
        """Wait until every id in ``ids`` was acknowledged."""
        want = set(ids)
        deadline = time.monotonic() + timeout
        while want:
            ack = self.take("ack", timeout=max(0.01, deadline - time.monotonic()))
            want -= set(ack.data["ids"])

    def wait_closed(self, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.pump(0.2):
                return
        raise AssertionError(f"{self.vm}: connection still open")

    # ------------------------------------------------------------------ conveniences
    def accept_schedule(self, timeout: float = WAIT) -> Event:
        """Take the schedule, answer ``result`` success, return the schedule event."""
        sched = self.take("schedule", timeout=timeout)
        self.send(self.event("result", {"answers": sched.id, "status": "success", "details": "loaded"}))
        return sched


def short_dir() -> str:
    """A short directory in /tmp (unix socket paths must stay < 108 bytes)."""
    return tempfile.mkdtemp(dir="/tmp", prefix="vh")


SIMPLE = [
    {"start_time": -10, "executable": "/bin/true"},
    {"start_time": 5, "executable": "/bin/true"},
]


class Host:
    """The real ``vmr-host serve`` in a subprocess, in a short temp dir.

    Args:
        schedules: VM name -> list of entries (written as ``<vm>.yaml``) or raw bytes.
        args: extra ``serve`` arguments.
    """

    def __init__(self, schedules: Dict[str, Any], args: Iterable[str] = (), start: bool = True) -> None:
        self.base = Path(short_dir())
        self.sched_dir = self.base / "s"
        self.logs = self.base / "l"
        self.channels = self.base / "c"
        self.resources = self.base / "r"
        for d in (self.sched_dir, self.resources):
            d.mkdir()
        for vm, sched in schedules.items():
            if isinstance(sched, bytes):
                (self.sched_dir / f"{vm}.pkl").write_bytes(sched)
            else:
                (self.sched_dir / f"{vm}.yaml").write_text(yaml.safe_dump(sched))
        self.args = list(args)
        self.proc: Optional[subprocess.Popen] = None
        self.stderr_path = self.base / "stderr.txt"
        if start:
            self.start()

    def serve_argv(self) -> List[str]:
        return [
            sys.executable, "-m", "vmr_handler.host", "serve",
            "--schedules", str(self.sched_dir), "--logs", str(self.logs),
            "--channels", str(self.channels), "--resources", str(self.resources), *self.args,
        ]  # fmt: skip

    def start(self, wait: bool = True) -> None:
        self.proc = subprocess.Popen(
            self.serve_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.stderr_path, "ab"),  # noqa: SIM115
        )  # fmt: skip
        if wait:
            deadline = time.monotonic() + WAIT
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(f"vmr-host exited {self.proc.returncode}: {self.stderr()}")
                r = self.cli("status", "--json")
                # up when the running host answers (not the status read from the logs)
                if r.returncode in (0, 1) and r.stdout.strip() and not json.loads(r.stdout).get("offline"):
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"vmr-host did not come up: {self.stderr()}")
                time.sleep(0.05)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "vmr_handler.host", *args]
        if args and args[0] in ("status", "resume", "release"):
            argv += ["--logs", str(self.logs)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)

    def status(self) -> Dict[str, Any]:
        r = self.cli("status", "--json")
        assert r.returncode in (0, 1), r.stderr  # 1: some VM failed
        return json.loads(r.stdout)

    def vm_status(self, vm: str) -> Dict[str, Any]:
        return next(v for v in self.status()["vms"] if v["vm"] == vm)

    def sock(self, vm: str) -> str:
        return str(self.channels / f"{vm}.sock")

    def agent(self, vm: str, claimed: Optional[str] = None) -> FakeAgent:
        return FakeAgent.connect(self.sock(vm), claimed or vm)

    def jsonl(self, vm: str) -> List[Dict[str, Any]]:
        path = self.logs / f"{vm}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def experiment(self) -> Dict[str, Any]:
        return json.loads((self.logs / "experiment.json").read_text())

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)

    def stop(self) -> int:
        """SIGTERM; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)
        return self.proc.returncode

    def wait_until(self, pred: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; host stderr:\n{self.stderr()[-3000:]}")
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT)
        shutil.rmtree(self.base, ignore_errors=True)


def wait_file_lines(path: Path, n: int, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has fewer than {n} lines")
        time.sleep(0.05)


__all__ = ["SIMPLE", "WAIT", "FakeAgent", "Host", "short_dir", "wait_file_lines"]
