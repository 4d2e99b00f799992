"""``vmr-host wait`` and ``vmr-host status --watch``: follow the running host's status.

Both ask the running ``vmr-host serve`` for its ``status`` over the control socket, again and
again (every ``interval`` seconds), like ``kubectl wait --for`` and ``kubectl get -w``.

``wait --for PHASE [VM...] [--timeout S]`` exits 0 when every VM named (default: every
expected VM the barrier has not excluded) reached the phase, 1 as soon as one of them failed
(it never will), 2 on the timeout (and for bad usage, a VM the host does not know), saying who
it still waits for. It says at once on stderr what it waits for; with ``--timeout`` it also
waits that long for a host that does not answer yet (one starting: ``serve ... &`` then
``wait``), without it a host that does not answer is an error at once (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from vmr_handler.host.cli.control_client import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from vmr_handler.host.cli.options import add_logs
from vmr_handler.host.logs.logsdir import ask_host, control_socket_path
from vmr_handler.host.model.stateword import FAILED_STATES

#: The phases ``wait --for`` knows, and whether one VM's status dict has reached it (the
#: experiment's start time is passed too: ``started`` is the experiment's start on the host's clock);
#: ``complete`` and ``at-break`` are the VM's state word (a ``lost`` VM is neither: it is waited for).
PHASES: Dict[str, Callable[[Dict[str, Any], Optional[float], float], bool]] = {
    "configured": lambda vm, start, now: vm.get("configured_at") is not None,
    "started": lambda vm, start, now: (
        start is not None and now >= start and vm.get("configured_at") is not None
    ),
    "complete": lambda vm, start, now: vm["state"] == "complete",
    "at-break": lambda vm, start, now: vm["state"] == "at_break",
}
#: Seconds between two status requests.
INTERVAL = 0.5


def add_arguments(wait: argparse.ArgumentParser) -> None:
    """``wait --for PHASE [VM...] [--timeout S] [--logs DIR] [--json]``."""
    wait.add_argument("--for", dest="phase", required=True, choices=list(PHASES), help="the phase")
    wait.add_argument("vms", nargs="*", metavar="VM", help="default: every expected VM not excluded")
    wait.add_argument(
        "--timeout", type=float, help="give up after S seconds (exit 2); waits for a host starting too"
    )
    add_logs(wait)
    wait.add_argument("--json", action="store_true", help="print the outcome as JSON")


def run(args: argparse.Namespace) -> int:
    """``vmr-host wait``: :func:`wait_for` of the parsed arguments."""
    return wait_for(args.logs, args.phase, args.vms, args.timeout, json_out=args.json)


def run_status(args: argparse.Namespace) -> int:
    """``vmr-host status``: redrawn every ``--interval`` seconds with ``--watch``, else asked once
    (:func:`vmr_handler.host.cli.control_client.run`)."""
    from vmr_handler.host.cli.control_client import client_command, run

    if not args.watch:
        return run(args)
    from vmr_handler.host.cli.options import check_known
    from vmr_handler.host.cli.statustext import format_status, known_vms

    command = client_command(args)

    def render(result: Dict[str, Any]) -> str:
        check_known(command.vms, known_vms(result))
        if command.json:
            return json.dumps(result)
        return format_status(result, command.states, command.vms)

    return watch(render, args.logs, args.interval, stream=command.json)


def _status(logs: str, until: Optional[float] = None) -> Dict[str, Any]:
    """The running host's ``status`` result; asked again every :data:`INTERVAL` until the
    monotonic time ``until`` while no host answers (None: asked once).

    Raises:
        ControlError: no host answers on the socket (by ``until``), or it refused the request.
    """
    from vmr_handler.core.errors import ControlError

    said = False
    while True:
        try:
            reply = ask_host(logs, {"cmd": "status"})
            break
        except ControlError:
            if until is None or time.monotonic() >= until:
                raise
            if not said:
                path = control_socket_path(logs)
                print(f"vmr-host: waiting for vmr-host serve to answer at {path}", file=sys.stderr)
                said = True
            time.sleep(INTERVAL)
    if reply.get("status") != "success":
        raise ControlError(f"the host refused the status request: {reply.get('details')}")
    result: Dict[str, Any] = reply["result"]
    return result


def progress(
    result: Dict[str, Any], phase: str, vms: Sequence[str]
) -> Tuple[List[str], List[str], List[str]]:
    """``(reached, waiting, failed)`` VM names for ``phase`` in a status ``result``.

    ``vms`` empty means every expected VM not excluded. A VM the host does not know is
    waiting (it may not have connected yet)."""
    exp = result["experiment"]
    now = float(result.get("now") or time.time())
    start = exp.get("start_time")
    by_name = {vm["vm"]: vm for vm in result["vms"]}
    names = list(vms) or [v for v in exp["expected"] if v not in set(exp.get("excluded") or [])]
    reached, waiting, failed = [], [], []
    for name in names:
        vm = by_name.get(name)
        if vm is None:
            waiting.append(name)
        elif vm["state"] in FAILED_STATES:
            failed.append(name)
        elif PHASES[phase](vm, start, now):
            reached.append(name)
        else:
            waiting.append(name)
    return reached, waiting, failed


def wait_for(logs: str, phase: str, vms: Sequence[str], timeout: Optional[float],
             interval: float = INTERVAL, json_out: bool = False) -> int:  # fmt: skip
    """Poll until ``vms`` reach ``phase``; the exit code (0 reached, 1 a VM failed, 2 timeout).

    ``timeout`` in seconds (None: no limit). Prints one line when done (JSON with ``json_out``).

    Raises:
        ControlError: no host answers (the CLI turns it into exit 1).
    """
    if phase not in PHASES:
        print(f"vmr-host: error: --for must be one of {', '.join(PHASES)}, not {phase!r}", file=sys.stderr)
        return EXIT_USAGE
    t0 = time.monotonic()
    result = _status(logs, None if timeout is None else t0 + timeout)
    _announce(result, phase, vms, timeout)
    while True:
        reached, waiting, failed = progress(result, phase, vms)
        elapsed = time.monotonic() - t0
        done = {"phase": phase, "reached": reached, "waiting": waiting, "failed": failed, "waited": elapsed}
        if failed:
            causes = {vm["vm"]: vm.get("failed") for vm in result["vms"] if vm["vm"] in failed}
            why = [f"{n} failed: {causes.get(n) or 'schedule rejected'}" for n in failed]
            _say(json_out, done, "; ".join(why))
            return EXIT_RUNTIME
        if not waiting:
            _say(json_out, done, f"{len(reached)} VM(s) {phase} after {elapsed:.1f} s")
            return EXIT_OK
        if timeout is not None and elapsed >= timeout:
            _say(json_out, done, f"timed out after {timeout:g} s: {len(waiting)} VM(s) not {phase}: "
                 + ", ".join(waiting))  # fmt: skip
            return EXIT_USAGE
        time.sleep(interval if timeout is None else max(0.0, min(interval, timeout - elapsed)))
        result = _status(logs)


def _announce(result: Dict[str, Any], phase: str, vms: Sequence[str], timeout: Optional[float]) -> None:
    """Say on stderr what ``wait`` waits for: which VMs, which phase, how long.

    Raises:
        UsageError: ``vms`` names a VM the host does not know (exit 2).
    """
    from vmr_handler.core.readable import few_names
    from vmr_handler.host.cli.options import check_known
    from vmr_handler.host.cli.statustext import known_vms

    check_known(vms, known_vms(result))
    exp = result["experiment"]
    names = list(vms) or [v for v in exp["expected"] if v not in set(exp.get("excluded") or [])]
    whom = few_names(names) if vms else f"every expected VM ({len(names)}: {few_names(names) or 'none'})"
    limit = f"for at most {timeout:g} s" if timeout is not None else "with no timeout (Ctrl-C stops)"
    print(f"vmr-host: waiting for {whom} to be {phase}, {limit}", file=sys.stderr)


def _say(json_out: bool, done: Dict[str, Any], text: str) -> None:
    if json_out:
        print(json.dumps(done))
    else:
        print(text)


def watch(render: Callable[[Dict[str, Any]], str], logs: str, interval: float,
          rounds: Optional[int] = None, stream: bool = False) -> int:  # fmt: skip
    """Redraw ``render(status)`` in place every ``interval`` seconds until Ctrl-C (or
    ``rounds`` redraws); a terminal gets the screen cleared, a pipe one block per round.
    ``stream``: each ``render`` is one line (``status --watch --json``: one JSON object per
    refresh, one per line), never a cleared screen."""
    tty = sys.stdout.isatty() and not stream
    n = 0
    try:
        while rounds is None or n < rounds:
            text = render(_status(logs))
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J")
            sys.stdout.write(f"{text}\n" if tty or stream else f"{text}\n\n")
            sys.stdout.flush()
            n += 1
            if rounds is None or n < rounds:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    return EXIT_OK
