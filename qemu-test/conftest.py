"""qemu-test: make the repository root importable (for ``tests.hostenv``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = str(Path(__file__).resolve().parent.parent)
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def pytest_configure(config: pytest.Config) -> None:
    config.qemu_report = []  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the timings the qemu tests measured (also without ``-s``)."""
    lines = getattr(config, "qemu_report", [])
    if lines:
        terminalreporter.section("qemu-test timings")
        for line in lines:
            terminalreporter.write_line(line)
