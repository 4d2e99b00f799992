"""The lean path of the control commands (issue 15): ``vmr-host status|resume|release`` and
``vmr-handler status|resume`` import only what they use, take exactly the forms the full
argparse front end takes, and hand everything else to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

from vmr_handler.agent.cli.control_client import ControlCommand, parse_control
from vmr_handler.host.cli.commandline import _parser, client_command
from vmr_handler.host.cli.control_client import DEFAULT_LOGS, ClientCommand, parse_client

#: Modules the lean path must not import (the full front end, the host's configuration).
HEAVY = ["argparse", "logging", "asyncio", "vmr_handler.host.serve.config",
         "vmr_handler.host.cli.commandline", "yaml"]


def _full(argv: List[str]) -> Optional[ClientCommand]:
    """What the argparse front end makes of ``argv`` (None when it refuses it)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit:
        return None
    return client_command(args)


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--json", "--logs", "/x/logs"],
        ["status", "--logs=/x/l"],
        ["resume", "--all"],
        ["resume", "a", "b", "--logs", "L", "--json"],
        ["resume", "--json", "a", "b"],
        ["resume", "a", "--all"],
        ["resume", "a", "--force"],
        ["resume", "--all", "--dry-run", "--yes"],
        ["resume"],
        ["release"],
        ["release", "--exclude", "a", "b", "--json"],
        ["release", "--logs", "L", "--exclude", "a"],
    ],
)
def test_the_lean_parser_agrees_with_argparse(argv: List[str]) -> None:
    lean = parse_client(argv)
    assert lean is not None
    assert lean == _full(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["-v", "status"],
        ["status", "--help"],
        ["status", "--lo", "x"],  # an abbreviation: argparse's business
        ["status", "extra"],
        ["resume", "a", "--json", "b"],  # two runs of names: argparse refuses it
        ["resume", "--logs"],
        ["release", "--exclude"],
        ["release", "vm"],
        ["serve", "--schedules", "s"],
        [],
    ],
)
def test_other_forms_go_to_the_full_front_end(argv: List[str]) -> None:
    assert parse_client(argv) is None


def test_agent_control_forms() -> None:
    assert parse_control(["status"]) == ControlCommand("status")
    assert parse_control(["resume", "--state-dir", "/s", "--json"]) == ControlCommand("resume", "/s", True)
    assert parse_control(["status", "--state-dir=/t"]) == ControlCommand("status", "/t", False)
    for argv in (["status", "-v"], ["status", "--state-dir"], ["run"], ["resume", "x"]):
        assert parse_control(argv) is None


def _run_lean(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints the exit code, the output is parsed."""
    probe = (
        "import io, json, sys, contextlib\n"
        f"{code}\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        "    rc = run()\n"
        f"print(json.dumps({{'rc': rc, 'err': err.getvalue(), "
        f"'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_vmr_host_resume_imports_only_what_it_uses(tmp_path: Path) -> None:
    logs = tmp_path / DEFAULT_LOGS
    doc = _run_lean(
        "from vmr_handler.host.cli.vmr_host import main\n"
        f"def run(): return main(['resume', '--all', '--logs', {str(logs)!r}])"
    )
    assert doc["rc"] == 1 and "no running vmr-host" in doc["err"]
    assert doc["heavy"] == []


def test_vmr_host_resume_without_target_is_a_usage_error_on_the_lean_path(tmp_path: Path) -> None:
    doc = _run_lean(
        "from vmr_handler.host.cli.vmr_host import main\n"
        f"def run(): return main(['resume', '--logs', {str(tmp_path)!r}])"
    )
    assert doc["rc"] == 2 and "VM names or --all" in doc["err"]
    assert doc["heavy"] == []


def test_vmr_handler_status_imports_only_what_it_uses(tmp_path: Path) -> None:
    doc = _run_lean(
        "from vmr_handler.agent.cli.commandline import main\n"
        f"def run(): return main(['status', '--state-dir', {str(tmp_path)!r}])"
    )
    assert doc["rc"] == 1 and "no running vmr-handler" in doc["err"]
    assert doc["heavy"] == []
