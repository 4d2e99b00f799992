"""``packaging/build-old-glibc.sh`` (a debootstrap chroot build, minutes): only checked here,
not run; its measured run is in packaging/README.md."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "packaging" / "build-old-glibc.sh"


def test_script_parses() -> None:
    """``bash -n``: the script is syntactically valid bash."""
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_script_builds_with_build_sh_and_its_pins() -> None:
    """It runs packaging/build.sh inside the chroot (so the PyInstaller pin lives in one place)
    and installs the project itself with ``pip install``, not an editable install."""
    text = SCRIPT.read_text()
    assert "packaging/build.sh /out" in text
    assert "pip install -q /src" in text
