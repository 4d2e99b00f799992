"""Shared fixtures of the test suite."""

from __future__ import annotations

import os
from typing import Iterator, List

import pytest

from tests.agent import Agent

# every vmr-host command reads its logs directory from VMR_LOGS when given no --logs: the tests
# (and the commands they start) never take the one of the shell that runs them
os.environ.pop("VMR_LOGS", None)


@pytest.fixture
def agents() -> Iterator[List[Agent]]:
    """A list to put :class:`tests.agent.Agent` runs in; every one still running is killed at the end."""
    made: List[Agent] = []
    yield made
    for a in made:
        a.close()


@pytest.fixture
def full_disk(tmp_path, request):
    """A 64 KiB tmpfs (root needed, as in CI and in guests): writing more fills it. Another size:
    ``@pytest.mark.parametrize("full_disk", ["2m"], indirect=True)``."""
    import subprocess

    size = getattr(request, "param", "64k")
    mnt = tmp_path / "small"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]
    res = subprocess.run(mount, capture_output=True)
    if res.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the disk-full test: {res.stderr!r}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
