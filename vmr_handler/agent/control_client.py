"""``vmr-handler status|resume``: the lean path of the control commands (issue 15).

What these two commands import: the standard library's ``json``/``sys`` and
:mod:`vmr_handler.core.control` (no argparse, no logging, nothing of the engine). The plain
forms are parsed by hand by :func:`parse_control`; anything else (``--help``, ``-v``, an
unknown option) goes to the argparse front end (:mod:`vmr_handler.agent.cli`), which prints
the usual help or error. Exit codes: 0 success, 1 the agent could not be reached or answered
with an error.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, NamedTuple, Optional, Sequence

#: ``--state-dir`` when none is given.
DEFAULT_STATE_DIR = "/var/lib/vmr-handler"


class ControlCommand(NamedTuple):
    """``status`` or ``resume`` to the agent using ``state_dir``; ``json``: print the raw reply."""

    command: str
    state_dir: str = DEFAULT_STATE_DIR
    json: bool = False


def parse_control(argv: Sequence[str]) -> Optional[ControlCommand]:
    """``argv`` (without the program name) as a :class:`ControlCommand` when it is exactly
    ``status|resume [--state-dir DIR | --state-dir=DIR] [--json]``; else None (the full parser
    handles it)."""
    if not argv or argv[0] not in ("status", "resume"):
        return None
    state_dir, as_json = DEFAULT_STATE_DIR, False
    words = list(argv[1:])
    while words:
        word = words.pop(0)
        if word == "--json":
            as_json = True
        elif word.startswith("--state-dir="):
            state_dir = word[len("--state-dir=") :]
        elif word == "--state-dir" and words and not words[0].startswith("-"):
            state_dir = words.pop(0)
        else:
            return None
    return ControlCommand(argv[0], state_dir, as_json)


def run_control(cmd: ControlCommand) -> int:
    """Send ``cmd`` to the running agent's control socket and print the answer.

    Returns:
        0 when the agent answered with success, else 1 (the error is printed on stderr).
    """
    from vmr_handler.core.control import request
    from vmr_handler.core.errors import ControlError

    try:
        reply = request(cmd.state_dir, cmd.command)
        if cmd.json:
            import json

            print(json.dumps(reply))
        elif reply.get("status") != "success":
            print(f"error: {reply.get('details')}", file=sys.stderr)
        elif cmd.command == "status":
            print(status_text(reply["result"]))
        else:
            print(resume_text(reply["result"]))
    except ControlError as exc:
        print(f"vmr-handler: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 0 if reply.get("status") == "success" else 1


def number_text(value: Any) -> Any:
    """A number as JSON can carry it: ``inf``/``-inf`` as text, integral floats as ints."""
    if value is None or isinstance(value, str):  # JSON replies carry "-inf" as a string
        return value
    if value in (float("inf"), float("-inf")):
        return "-inf" if value < 0 else "inf"
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else value


def resume_text(result: Dict[str, Any]) -> str:
    """The human form of the agent's answer to ``resume``."""
    if result.get("ended_break") is not None:
        return (
            f"RESUME at experiment time {number_text(result['at'])} ended the break at entry "
            f"{result['ended_break']}"
        )
    return f"RESUME at experiment time {number_text(result['at'])} ignored: no active break"


def status_text(result: Dict[str, Any]) -> str:
    """The human form of the agent's ``status`` answer."""
    lines = [f"phase: {result.get('phase')}"]
    if result.get("stages"):
        lines.append(
            f"stages: {len(result.get('stages_done') or [])}/{result['stages']} done"
            + (f", running stage {result['stage']}" if result.get("stage") is not None else "")
        )
    for key in ("configured_at", "start_time", "experiment_time"):
        if result.get(key) is not None:
            lines.append(f"{key}: {result[key]}")
    if result.get("active_pause"):
        lines.append(f"active pause/break: {result['active_pause']}")
    if result.get("blocked_by_break") is not None:
        lines.append(f"held by break at entry {result['blocked_by_break']} until RESUME")
    for item in result.get("next_entries") or []:
        lines.append(
            f"next: entry {item['index']} at experiment time {item['fire_at']} (in {item['in']:.1f} s)"
        )
    for item in result.get("running") or []:
        lines.append(
            f"running: entry {item['index']} ({item['executable']}) pid {item['pid']} "
            f"for {item['running_for']:.1f} s"
        )
    if result.get("failure"):
        lines.append(f"FAILED: {result['failure']}")
    return "\n".join(lines)
