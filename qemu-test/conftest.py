"""qemu-test: make the repository root importable (for ``tests.hostenv``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

REPO = str(Path(__file__).resolve().parent.parent)
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(scope="session")
def guest() -> Iterator[Dict[str, Any]]:
    """The frozen agent and the guest, built once per session: ``{"kernel", "initrd", "timings"}``."""
    from guestlab import build_guest

    yield from build_guest()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the timings the qemu tests measured (also without ``-s``)."""
    from guestlab import REPORT

    lines = REPORT
    if lines:
        terminalreporter.section("qemu-test timings")
        for line in lines:
            terminalreporter.write_line(line)
