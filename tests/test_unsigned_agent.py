"""An agent that cannot check signatures (SPEC §7) and is given a host key stops at once.

The frozen ``build.sh --without-signatures`` agent is checked in ``tests/test_frozen.py``. Here
the installed package runs in a real subprocess whose ``cryptography`` cannot be imported
(``sys.modules[name] = None`` makes ``import name`` raise ImportError): not found at all, which
``run`` refuses before anything starts, or found but broken inside, which the host link refuses
when it would load the key. Either way the agent exits 1 with one error naming the key setting
and never connects: its channel is a unix socket nobody listens on, which it would retry forever.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import vmr_handler
from vmr_handler.core.wire.signing import generate_keypair

REPO = Path(__file__).resolve().parent.parent
WAIT = 60.0


def _agent(blocked: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``vmr-handler ARGS`` in a Python where importing ``blocked`` raises ImportError."""
    shim = (
        f"import sys; sys.modules[{blocked!r}] = None; "
        "from vmr_handler.agent.cli.commandline import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", shim, *args], capture_output=True, text=True, timeout=WAIT, cwd=cwd
    )


def test_version_says_signature_checks_are_missing(tmp_path: Path) -> None:
    res = _agent("cryptography", "--version", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"vmr-handler {vmr_handler.__version__}",
        f"signature checks: not built in (no cryptography package in {sys.executable});"
        " a public_key is refused",
    ]


@pytest.mark.parametrize(
    "blocked, setting",
    [
        ("cryptography", "--public-key"),
        ("cryptography", "config"),
        ("cryptography.exceptions", "--public-key"),
    ],
)
def test_a_key_without_cryptography_stops_the_agent(tmp_path: Path, blocked: str, setting: str) -> None:
    key = tmp_path / "host.pub"
    key.write_bytes(generate_keypair()[1])
    config = tmp_path / "config.yaml"
    config.write_text(f"public_key: {key}\n" if setting == "config" else "vm_name: vm1\n")
    args = ["run", "--config", str(config), "--fw-cfg", "", "--port", "unix:none.sock",
            "--state-dir", str(tmp_path / "st"), "--launch-dir", str(tmp_path / "la")]  # fmt: skip
    if setting == "--public-key":
        args += ["--public-key", str(key)]
    res = _agent(blocked, *args, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    [line] = res.stderr.splitlines()
    named = {"--public-key": "--public-key", "config": f"public_key in {config}"}[setting]
    if blocked == "cryptography":  # refused by `run` before anything starts
        assert line.startswith(f"vmr-handler: error: {named} is set, but the Python running vmr-handler "), (
            line
        )
        assert not (tmp_path / "st").exists() and not (tmp_path / "la").exists(), "nothing started"
    else:  # found, but broken inside: refused where the key would be loaded
        assert line.startswith(
            "vmr-handler: error: public_key is set, but the Python running vmr-handler "
        ), line
        assert "(ModuleNotFoundError: import of cryptography.exceptions halted; None in sys.modules)" in line
    assert f"({sys.executable}) cannot import cryptography" in line
    assert line.endswith(
        "so it cannot verify the host's signed messages, and it never runs unsigned ones when a key is set. "
        "To go on: install it (pip install cryptography), or remove that setting to run unsigned"
    ), line
