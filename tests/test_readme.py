"""The README's test command is exactly what .ci/run runs (keep them from drifting apart); its
host example runs pasted as a whole."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _command_lines(text: str) -> list:
    return [line.strip() for line in text.splitlines() if ".venv/bin/python -m pytest" in line]


def test_ci_runs_the_readme_test_command():
    readme = _command_lines((ROOT / "README.md").read_text())
    ci = _command_lines((ROOT / ".ci" / "run").read_text())
    assert len(readme) == 1 and len(ci) == 1
    assert readme == ci


def test_readme_first_command_runs_the_bundled_example():
    text = (ROOT / "README.md").read_text()
    assert "vmr-handler run --local examples/demo.yaml" in text
    assert (ROOT / "examples" / "demo.yaml").exists()


def _block_after(text: str, heading: str) -> str:
    """The first ```sh block after ``heading``."""
    rest = text[text.index(heading) :]
    start = rest.index("```sh\n") + len("```sh\n")
    return rest[start : rest.index("```", start)]


def test_readme_host_block_runs_pasted_as_a_whole(tmp_path: Path) -> None:
    """The host example, pasted as a whole into a shell, with the bundled example: no command asks
    the host before it is up, every one succeeds, both VMs complete. Its directory and the
    console's port are this test's own; the rest is the README's text."""
    block = _block_after((ROOT / "README.md").read_text(), "## A host and agents on one machine")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    exp = tempfile.mkdtemp(dir="/tmp", prefix="vx")  # short: the channels' socket paths
    assert "/tmp/exp" in block and "8080" in block
    script = block.replace("/tmp/exp", exp).replace("8080", port)
    environ = {k: v for k, v in os.environ.items() if k != "VMR_LOGS"}
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=ROOT, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the block left running when it failed
        except ProcessLookupError:
            pass
        proc.wait()
        shutil.rmtree(exp, ignore_errors=True)
    out = stdout + stderr
    assert proc.returncode == 0, out
    assert "2 VM(s) configured" in stdout and "2 VM(s) complete" in stdout, out
    assert '"expected"' in stdout, out  # the console answered
    assert "vm1: Linux " in stdout and "vm2: Linux " in stdout, out  # exec's output, per VM
    assert "error" not in stderr and "Traceback" not in out, out
