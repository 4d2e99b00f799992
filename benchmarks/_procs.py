"""Stopping benchmark child processes (shared by bench_agent.py and bench_host.py).

Trees are killed with ``vmr_handler.agent.machine.executor.kill_tree`` (psutil), the agent's own killer.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from typing import Any

import psutil

from vmr_handler.agent.machine.executor import kill_tree


def stop_child(proc: subprocess.Popen[Any], term_timeout: float = 10.0) -> None:
    """SIGTERM ``proc`` (an agent then stops its own entries' trees) and wait up to
    ``term_timeout`` s; kill its tree if it is still there; kill anything it left behind."""
    if proc.poll() is not None:
        return
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(term_timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid, timeout=2.0)
        proc.wait()
    for child in descendants:  # whatever outlived the process's own shutdown
        with contextlib.suppress(psutil.Error):
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                child.kill()
