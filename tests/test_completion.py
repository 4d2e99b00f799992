"""Shell completion for both CLIs: the generated bash script, sourced in a real bash,
completes commands, options and choices from the real parsers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent

PROBE = r"""
source <("$1" completion bash)
fn=$(complete -p "$2" | sed 's/.* -F \([^ ]*\) .*/\1/')
shift 2
COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
"$fn" "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


def _complete(prog: str, *words: str) -> list:
    exe = BIN / prog
    if not exe.exists():
        pytest.fail(f"{exe} is not installed (pip install -e .)")
    res = subprocess.run(["bash", "-c", PROBE, "probe", str(exe), prog, prog, *words],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_vmr_host_completes_commands_options_and_choices() -> None:
    assert shutil.which("bash")
    assert _complete("vmr-host", "sta") == ["status"]
    assert set(_complete("vmr-host", "")) >= {"serve", "status", "wait", "logs", "resume", "check", "report"}
    assert _complete("vmr-host", "wait", "--for", "") == ["configured", "started", "complete", "at-break"]
    assert "--dry-run" in _complete("vmr-host", "resume", "--")


def test_vmr_handler_completes_commands() -> None:
    assert set(_complete("vmr-handler", "")) >= {"run", "plan", "check", "status", "resume", "completion"}
    assert "--wait" in _complete("vmr-handler", "status", "--")
