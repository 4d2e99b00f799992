"""``vmr-host schedule add (VM... | --all) FILE``: append entries to running VMs.

The file is a schedule of its own (YAML, JSON or a pickle) and is checked here first with the
same restricted loader and validation as every schedule, so that a bad batch is refused before
the host is asked (the error names the entry and the field; nothing is appended). The running
``vmr-host serve`` then reads it again (same sha256), keeps it in its logs and sends it, signed
when it has a key, to each VM (:mod:`vmr_handler.host.serve.experiment.appendbook`); a VM not connected now
gets
it at its next connection. ``vmr-host schedule show VM`` shows where the entries went and what
became of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from typing import Any, Dict, List

from vmr_handler.core.errors import UsageError
from vmr_handler.core.readable import few_names
from vmr_handler.core.schedule.appended import read_batch
from vmr_handler.host.cli.control_client import EXIT_OK
from vmr_handler.host.control.commands import COMMANDS, validate
from vmr_handler.host.logs.logsdir import ask_host


def add_parser(actions: Any, add_logs: Any) -> None:
    """The ``schedule add`` sub-command (``actions``: the ``schedule`` sub-parsers)."""
    add = actions.add_parser(
        "add", help="append entries (a schedule file of their own) to running VMs' schedules"
    )
    add.add_argument(
        "targets", nargs="+", metavar="[VM ...] FILE",
        help="the VMs (or --all), then the schedule file (YAML, JSON or pickle) with the entries",
    )  # fmt: skip
    add.add_argument("--all", action="store_true", help="every VM this host serves")
    add_logs(add)
    add.add_argument("--json", action="store_true", help="print the host's answer as JSON")


def added_text(result: Dict[str, Any], path: str) -> str:
    """What ``schedule add`` prints: the batch, whom it reached now, who gets it later."""
    n = result["entries"]
    lines = [
        f"batch {result['id']}: {n} entr{'y' if n == 1 else 'ies'} from {path} appended to "
        f"{few_names(result['targets'])}"
    ]
    if result["sent_now"]:
        lines.append(f"  sent now to {len(result['sent_now'])} connected VM(s)")
    if result["pending"]:
        lines.append(f"  {few_names(result['pending'])}: not connected; sent at their next connection")
    lines.append("  what becomes of each entry: vmr-host schedule show VM")
    return "\n".join(lines)


def cmd_schedule_add(args: argparse.Namespace) -> int:
    """Check the batch, hand it to the running host, print the answer. Returns the exit code.

    Raises:
        UsageError: (exit 2) neither or both of VMs and ``--all``, a bad batch file, or the
            host refused it.
        ControlError: no host runs with these ``--logs``.
    """
    *vms, file = args.targets
    if bool(vms) == bool(args.all):
        raise UsageError("schedule add needs VM names or --all (not both), then the file")
    path = os.path.abspath(file)
    result = request_add(args.logs, vms, bool(args.all), path)
    print(json.dumps(result, indent=1) if args.json else added_text(result, file))
    return EXIT_OK


def request_add(logs: str, vms: List[str], everyone: bool, path: str) -> Dict[str, Any]:
    """Check the batch file at ``path`` (absolute) and hand it to the host running with ``logs``
    (the ``schedule_add`` request; also what ``vmr-host push|pull|exec`` send). Returns the
    host's result (``id``, ``entries``, ``targets``, ``sent_now``, ``pending``).

    Raises:
        UsageError: a bad batch file, or the host refused it (its reason; nothing appended).
        ControlError: no host runs with these ``logs``.
    """
    try:
        raw, _batch = read_batch(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    digest = hashlib.sha256(raw).hexdigest()
    request = {"vms": vms, "all": everyone, "path": path, "sha256": digest}
    payload = validate(COMMANDS["schedule_add"], request)  # the request as declared
    reply = ask_host(logs, payload)
    if reply.get("status") != "success":
        raise UsageError(str(reply.get("details")))
    result: Dict[str, Any] = reply["result"]
    return result
