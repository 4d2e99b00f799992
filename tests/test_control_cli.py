"""The lean path of the control commands: ``vmr-host status|resume|release`` and
``vmr-handler status|resume`` import only what they use, take exactly the forms the full
argparse front end takes, and hand everything else to it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

from tests.agent import Agent
from vmr_handler.agent.cli import commandline as agent_cli
from vmr_handler.agent.cli.control_client import ControlCommand
from vmr_handler.host.cli.control_client import DEFAULT_LOGS, ClientCommand, client_command
from vmr_handler.host.cli.vmr_host import parser as _parser

#: Modules the lean path must not import (the other commands, the host's configuration, and
#: ``typing`` and ``tempfile``: 2-3 and ~5 ms of a 35 ms start, for annotations and for writes).
#: argparse is imported: every command is parsed by the parser its command table makes.
HEAVY = [
    "logging",
    "asyncio",
    "vmr_handler.host.serve.config",
    "vmr_handler.host.cli.serve",
    "yaml",
    "typing",
    "tempfile",
]


def _full(argv: List[str]) -> Optional[ClientCommand]:
    """What the argparse front end makes of ``argv`` (None when it refuses it)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit:
        return None
    return client_command(args)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["status"], ClientCommand("status")),
        (["status", "--json", "--logs", "/x/logs"], ClientCommand("status", "/x/logs", True)),
        (["status", "--logs=/x/l"], ClientCommand("status", "/x/l")),
        (["resume", "--all"], ClientCommand("resume", all=True)),
        (["resume", "a", "b", "--logs", "L", "--json"], ClientCommand("resume", "L", True, ("a", "b"))),
        (["resume", "--json", "a", "b"], ClientCommand("resume", json=True, vms=("a", "b"))),
        (["resume", "a", "--all"], ClientCommand("resume", vms=("a",), all=True)),
        (["resume", "a", "--force"], ClientCommand("resume", vms=("a",), force=True)),
        (["resume", "--all", "--dry-run", "--yes"], ClientCommand("resume", all=True, force=True,
                                                                 dry_run=True)),
        (["resume"], ClientCommand("resume")),
        (["release"], ClientCommand("release")),
        (["release", "--exclude", "a", "b", "--json"], ClientCommand("release", json=True,
                                                                       exclude=("a", "b"))),
        (["release", "--logs", "L", "--exclude", "a"], ClientCommand("release", "L", exclude=("a",))),
        (["-v", "status", "--lo", "x"], ClientCommand("status", "x")),  # a global flag, an abbreviation
    ],
)  # fmt: skip
def test_the_control_forms_parse_as_before(argv: List[str], expected: ClientCommand) -> None:
    assert _full(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [["status", "extra", "--state", "nope"], ["resume", "a", "--json", "b"], ["resume", "--logs"],
     ["release", "--exclude"], ["release", "vm"]],
)  # fmt: skip
def test_bad_control_forms_are_refused(argv: List[str]) -> None:
    assert _full(argv) is None


def test_agent_control_forms() -> None:
    def parsed(argv: List[str]) -> ControlCommand:
        args = agent_cli._parser().parse_args(argv)
        return ControlCommand(args.command, args.state_dir, args.json, getattr(args, "wait", False))

    assert parsed(["status"]) == ControlCommand("status")
    assert parsed(["resume", "--state-dir", "/s", "--json"]) == ControlCommand("resume", "/s", True)
    assert parsed(["status", "--state-dir=/t", "--wait"]) == ControlCommand("status", "/t", False, True)


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
    assert doc["rc"] == 1 and "no vmr-host serve runs with the logs directory" in doc["err"]
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


def test_vmr_handler_status_of_a_running_agent_imports_only_what_it_uses(tmp_path: Path) -> None:
    """The answer printed (phase, times in UTC) costs no more imports than the refusal."""
    agent = Agent(tmp_path, [{"start_time": 3600, "executable": "/bin/true"}]).start()
    try:
        agent.wait_event("configured")
        doc = _run_lean(
            "from vmr_handler.agent.cli.commandline import main\n"
            f"def run(): return main(['status', '--state-dir', {str(agent.state)!r}])"
        )
    finally:
        agent.signal(signal.SIGTERM)
        agent.wait()
    assert doc["rc"] == 0, doc["err"]
    assert doc["heavy"] == []
