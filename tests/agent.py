"""Test helper: run the real ``vmr-handler`` CLI in a subprocess and read its report.

Every wait has a time limit; nothing here asserts on speed.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import yaml

WAIT = 60.0  # upper bound for any wait, seconds (a bound, not a speed assertion)


def cli(*args: str, timeout: float = WAIT) -> subprocess.CompletedProcess:
    """Run ``python -m vmr_handler ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler", *args], capture_output=True, text=True, timeout=timeout
    )


class Agent:
    """One agent run (``run --local``) on a schedule written into ``root``.

    Args:
        root: test directory; gets ``schedule.yaml``, ``launch/``, ``state/``, ``report.jsonl``.
        schedule: list of entry dicts (written as YAML) or raw bytes (written as-is).
    """

    def __init__(
        self, root: Path, schedule: Any, *, start_buffer: float = 1.0, extra: Optional[List[str]] = None
    ):
        self.root = root
        self.launch = root / "launch"
        self.state = root / "s"
        self.report = root / "report.jsonl"
        self.schedule_path = root / "schedule.yaml"
        if isinstance(schedule, bytes):
            self.schedule_path.write_bytes(schedule)
        else:
            self.schedule_path.write_text(yaml.safe_dump(schedule))
        self.args = [
            "run",
            "--local",
            str(self.schedule_path),
            "--start-buffer",
            str(start_buffer),
            "--launch-dir",
            str(self.launch),
            "--state-dir",
            str(self.state),
            "--report",
            str(self.report),
            *(extra or []),
        ]
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> Agent:
        """Start the agent; its stdout/stderr go to ``agent.log`` (a pipe nobody reads could fill)."""
        with open(self.root / "agent.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vmr_handler", *self.args], stdout=log, stderr=log
            )
        return self

    def wait(self, timeout: float = WAIT) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def run(self, timeout: float = WAIT) -> int:
        """Start and wait; returns the exit code."""
        return self.start().wait(timeout)

    def log(self) -> str:
        """What the agent wrote on stdout/stderr (the readable log)."""
        path = self.root / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(timeout=WAIT)

    def events(self, type_: Optional[str] = None) -> List[Dict[str, Any]]:
        if not self.report.exists():
            return []
        out = []
        for line in self.report.read_text(encoding="utf-8").splitlines():
            if line.strip():
                ev = json.loads(line)
                if type_ is None or ev["type"] == type_:
                    out.append(ev)
        return out

    def wait_for(
        self, pred: Callable[[List[Dict[str, Any]]], bool], timeout: float = WAIT
    ) -> List[Dict[str, Any]]:
        """Poll the report until ``pred(events)`` holds (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            evs = self.events()
            if pred(evs):
                return evs
            if self.proc is not None and self.proc.poll() is not None:
                evs = self.events()
                if pred(evs):
                    return evs
                raise AssertionError(
                    f"agent exited {self.proc.returncode} before condition; events: {evs[-5:]}"
                )
            time.sleep(0.05)
        raise AssertionError("timed out waiting for condition")

    def wait_event(self, type_: str, **match: Any) -> Dict[str, Any]:
        def pred(evs: List[Dict[str, Any]]) -> bool:
            return any(
                e["type"] == type_ and all(e["data"].get(k) == v for k, v in match.items()) for e in evs
            )

        evs = self.wait_for(pred)
        return next(
            e for e in evs if e["type"] == type_ and all(e["data"].get(k) == v for k, v in match.items())
        )

    def by_index(self, type_: str) -> Dict[int, List[Dict[str, Any]]]:
        out: Dict[int, List[Dict[str, Any]]] = {}
        for e in self.events(type_):
            out.setdefault(e["data"]["index"], []).append(e)
        return out

    def output_bytes(self, index: int, stream: str = "stdout") -> bytes:
        """Reassemble an entry's output stream from its ``output`` events (lossless check)."""
        data = b""
        for e in self.events("output"):
            d = e["data"]
            if d["index"] != index or d["stream"] != stream:
                continue
            piece = d["line"].encode("utf-8") if "line" in d else base64.b64decode(d["line_b64"])
            data += piece + (b"\n" if d["eol"] else b"")
        return data

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
