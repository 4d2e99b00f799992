"""``vmr-handler status|resume``: the control commands, kept lean.

What these two commands import besides the command table
(:mod:`vmr_handler.agent.cli.commandline`): the standard library's ``argparse``/``json``/
``socket``/``sys`` and :mod:`vmr_handler.core.control` (no logging, nothing of the engine, no
``typing``). Exit codes: 0 success,
1 the agent could not be reached or answered with an error.

When no agent answers, ``status`` (``--wait`` too) reads how the last ``run --local`` in the
state directory ended (:data:`LAST_RUN`, written as it ends) and answers like
``cloud-init status --wait``: ``complete`` exit 0, anything else exit 1.
"""

from __future__ import annotations

import sys
from collections import namedtuple

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Dict

#: ``--state-dir`` when none is given.
DEFAULT_STATE_DIR = "/var/lib/vmr-handler"
#: Engine phases after which nothing more happens (``status --wait`` returns: 0 / 1).
DONE = ("complete", "failed")
#: Seconds between two questions of ``status --wait``.
WAIT_INTERVAL = 1.0
#: The file in the state directory that says how the last ``run --local`` ended: the engine's
#: last ``status`` answer, ``ended_at`` (UTC) and ``exit_code``; removed as a run starts.
LAST_RUN = "last-run.json"


_ControlFields = namedtuple(
    "_ControlFields", ("command", "state_dir", "json", "wait"), defaults=(DEFAULT_STATE_DIR, False, False)
)


class ControlCommand(_ControlFields):
    """A named tuple (``collections``': ``typing.NamedTuple`` would import ``typing`` on the
    lean path): ``command`` (str) is ``status`` or ``resume`` to the agent using ``state_dir``
    (str); ``json`` (bool): print the raw reply; ``wait`` (bool, ``status --wait``): ask until
    the schedule is complete or failed, like ``cloud-init status --wait``."""

    __slots__ = ()


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    p.add_argument("--json", action="store_true", help="print the raw JSON reply")


def add_status(p: argparse.ArgumentParser) -> None:
    """``status [--state-dir DIR] [--json] [--wait]``."""
    _add_common(p)
    p.add_argument("--wait", action="store_true",
                   help="ask until the schedule is complete (exit 0) or failed (exit 1)")  # fmt: skip


def add_resume(p: argparse.ArgumentParser) -> None:
    """``resume [--state-dir DIR] [--json]``."""
    _add_common(p)


def run(args: argparse.Namespace) -> int:
    """``status`` or ``resume`` of the parsed arguments: :func:`run_control`."""
    return run_control(ControlCommand(args.command, args.state_dir, args.json, getattr(args, "wait", False)))


def run_control(cmd: ControlCommand) -> int:
    """Send ``cmd`` to the running agent's control socket and print the answer.

    Returns:
        0 when the agent answered with success, else 1 (the error is printed on stderr).
    """
    from vmr_handler.core.control import request
    from vmr_handler.core.errors import ControlError

    try:
        try:
            reply = request(cmd.state_dir, cmd.command)
        except ControlError as exc:
            reply = _last_run(cmd, exc)
        while cmd.wait and reply.get("status") == "success" and reply["result"].get("phase") not in DONE:
            import time

            time.sleep(WAIT_INTERVAL)
            last = reply["result"].get("phase")
            try:
                reply = request(cmd.state_dir, cmd.command)
            except ControlError as exc:
                gone = ControlError(f"the agent stopped while waiting (last phase: {last}): {exc}")
                reply = _last_run(cmd, gone)
        if reply.get("ended"):
            print(f"vmr-handler: no agent runs; its last run ended at {reply['ended']}", file=sys.stderr)
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
    if (cmd.wait or reply.get("ended")) and reply.get("status") == "success":
        return 0 if reply["result"].get("phase") == "complete" else 1
    return 0 if reply.get("status") == "success" else 1


def _last_run(cmd: ControlCommand, why: Exception) -> Dict[str, Any]:
    """``status`` with no agent answering: the reply of how the last run ended (:data:`LAST_RUN`:
    ``ended`` says when).

    Raises:
        ControlError: ``why``, when the command is not ``status`` or no run ended there.
    """
    import json
    import os

    if cmd.command != "status":
        raise why
    try:
        with open(os.path.join(cmd.state_dir, LAST_RUN), encoding="utf-8") as fh:
            doc = json.load(fh)
        result, ended = dict(doc["result"]), str(doc["ended_at"])
    except (OSError, ValueError, KeyError, TypeError):
        raise why from None
    return {"status": "success", "result": result, "ended": ended}


def save_last_run(state_dir: str, result: Dict[str, Any], exit_code: int) -> None:
    """Keep how a ``run --local`` ended (:data:`LAST_RUN`): the engine's last ``status`` answer
    ``result`` and the run's ``exit_code``. A state directory that cannot take it is left as
    it is (the run's outcome is its exit code and its report)."""
    import json
    import os
    import time

    from vmr_handler.core.fsutil import atomic_write, utc_text

    doc = {"ended_at": utc_text(time.time()), "exit_code": exit_code, "result": result}
    try:
        atomic_write(os.path.join(state_dir, LAST_RUN), json.dumps(doc, default=str).encode())
    except OSError:
        pass


def forget_last_run(state_dir: str) -> None:
    """A run starts: how the last one ended no longer says anything."""
    import os

    try:
        os.unlink(os.path.join(state_dir, LAST_RUN))
    except FileNotFoundError:
        pass


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
        lines.append(
            f"next break: entry {result['next_break']} (held there until a RESUME; one before it is ignored)"
        )
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
