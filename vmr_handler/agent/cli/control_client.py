"""``vmr-handler status|resume``: the lean path of the control commands.

What these two commands import: the standard library's ``json``/``sys`` and
:mod:`vmr_handler.core.control` (no argparse, no logging, nothing of the engine). The plain
forms are parsed by hand by :func:`parse_control`; anything else (``--help``, ``-v``, an
unknown option) goes to the argparse front end (:mod:`vmr_handler.agent.cli.commandline`), which prints
the usual help or error. Exit codes: 0 success, 1 the agent could not be reached or answered
with an error.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, NamedTuple, Optional, Sequence

#: ``--state-dir`` when none is given.
DEFAULT_STATE_DIR = "/var/lib/vmr-handler"
#: Engine phases after which nothing more happens (``status --wait`` returns: 0 / 1).
DONE = ("complete", "failed")
#: Seconds between two questions of ``status --wait``.
WAIT_INTERVAL = 1.0


class ControlCommand(NamedTuple):
    """``status`` or ``resume`` to the agent using ``state_dir``; ``json``: print the raw reply;
    ``wait`` (``status --wait``): ask until the schedule is complete or failed, like
    ``cloud-init status --wait``."""

    command: str
    state_dir: str = DEFAULT_STATE_DIR
    json: bool = False
    wait: bool = False


def parse_control(argv: Sequence[str]) -> Optional[ControlCommand]:
    """``argv`` (without the program name) as a :class:`ControlCommand` when it is exactly
    ``status|resume [--state-dir DIR | --state-dir=DIR] [--json]`` (``status`` also ``--wait``);
    else None (the full parser handles it)."""
    if not argv or argv[0] not in ("status", "resume"):
        return None
    state_dir, as_json, wait = DEFAULT_STATE_DIR, False, False
    words = list(argv[1:])
    while words:
        word = words.pop(0)
        if word == "--json":
            as_json = True
        elif word == "--wait" and argv[0] == "status":
            wait = True
        elif word.startswith("--state-dir="):
            state_dir = word[len("--state-dir=") :]
        elif word == "--state-dir" and words and not words[0].startswith("-"):
            state_dir = words.pop(0)
        else:
            return None
    return ControlCommand(argv[0], state_dir, as_json, wait)


def run_control(cmd: ControlCommand) -> int:
    """Send ``cmd`` to the running agent's control socket and print the answer.

    Returns:
        0 when the agent answered with success, else 1 (the error is printed on stderr).
    """
    from vmr_handler.core.control import request
    from vmr_handler.core.errors import ControlError

    try:
        reply = request(cmd.state_dir, cmd.command)
        while cmd.wait and reply.get("status") == "success" and reply["result"].get("phase") not in DONE:
            import time

            time.sleep(WAIT_INTERVAL)
            last = reply["result"].get("phase")
            try:
                reply = request(cmd.state_dir, cmd.command)
            except ControlError as exc:
                raise ControlError(f"the agent stopped while waiting (last phase: {last}): {exc}") from exc
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
    if cmd.wait and reply.get("status") == "success":
        return 0 if reply["result"].get("phase") == "complete" else 1
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
    """The human form of the agent's ``status`` answer: times in ISO UTC with the experiment
    time, durations with units."""
    from vmr_handler.core.fsutil import utc_text
    from vmr_handler.core.readable import duration

    start = result.get("start_time")
    now_t = result.get("experiment_time")
    lines = [f"phase: {result.get('phase')}"]
    if result.get("stages"):
        lines.append(
            f"stages: {len(result.get('stages_done') or [])}/{result['stages']} done"
            + (f", running stage {result['stage']}" if result.get("stage") is not None else "")
        )
    if result.get("configured_at") is not None:
        lines.append(f"configured: {utc_text(result['configured_at'])}")
    if start is not None:
        where = f"in {duration(-now_t)}" if now_t is not None and now_t < 0 else f"now t={now_t:+.1f}s"
        lines.append(f"experiment start: {utc_text(start)} ({where})")
    hold = result.get("active_pause")
    if result.get("blocked_by_break") is not None:
        held = result["blocked_by_break"]
        lines.append(f"held at break #{held} until a RESUME (vmr-handler resume, vmr-host resume)")
    elif hold:
        until = hold.get("until")
        end = f" until t={until:+.1f}s" if isinstance(until, (int, float)) else ""
        lines.append(f"paused (#{hold['index']}){end}")
    if result.get("next_break") is not None:
        lines.append(f"next break: entry {result['next_break']} (a RESUME before it ends it early)")
    for item in result.get("next_entries") or []:
        lines.append(f"next: entry {item['index']} at t={item['fire_at']:+.1f}s (in {duration(item['in'])})")
    for item in result.get("running") or []:
        lines.append(
            f"running: entry {item['index']} ({item['executable']}) pid {item['pid']} "
            f"for {duration(item['running_for'])}"
        )
    counts = result.get("entries")
    if isinstance(counts, dict) and any(counts.values()):
        lines.append(
            f"entries: {counts.get('ran', 0)} ran, {counts.get('exited_nonzero', 0)} exited non-zero, "
            f"{counts.get('not_started', 0)} could not start"
        )
    if result.get("held_reports"):
        lines.append(f"reports held in memory (state dir full?): {result['held_reports']}")
    if result.get("failure"):
        lines.append(f"FAILED: {result['failure']}")
    return "\n".join(lines)

