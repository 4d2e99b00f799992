"""Every shell script the project ships passes shellcheck (warnings and errors; the README's
test command installs shellcheck, so CI always runs this)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = [
    "packaging/build.sh",
    "packaging/build-old-glibc.sh",
    "images/bake",
    "images/vmr-handler.sysv",
    "qemu-test/build-guest.sh",
    "qemu-test/build-systemd-guest.sh",
    ".ci/run",
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck(script: str) -> None:
    tool = shutil.which("shellcheck")
    if tool is None:
        pytest.fail("shellcheck is not installed (apt-get install shellcheck; README's test command does)")
    cmd = [tool, "-S", "warning", str(REPO / script)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout
