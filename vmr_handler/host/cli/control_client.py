"""``vmr-host status|resume|release|kill``: the control commands, kept lean.

A RESUME is on the critical path of an experiment: from the operator's command to the next
entry's fork it should take < 100 ms. This module is all those three commands import besides
the command table (:mod:`vmr_handler.host.cli.vmr_host`): the standard library's
``argparse``/``json``/``os``/``socket``/``sys`` and :mod:`vmr_handler.core.control` (no logging,
no host configuration, no ``typing``). ``benchmarks/bench_cli_start.py`` measures what the
path costs.

Exit codes as the rest of ``vmr-host``: 0 success, 1 runtime error (no running host), 2 bad
usage or a request the host refused.
"""

from __future__ import annotations

import sys
from collections import namedtuple

from vmr_handler.host.cli.options import DEFAULT_LOGS, add_logs
from vmr_handler.host.logs.logsdir import ask_host

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Dict, Sequence

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2


_ClientFields = namedtuple(
    "_ClientFields",
    ("command", "logs", "json", "vms", "all", "exclude", "states", "force", "dry_run", "entry", "signal",
     "grace"),
    defaults=(DEFAULT_LOGS, False, (), False, (), (), False, False, None, "TERM", 10.0),
)  # fmt: skip


class ClientCommand(_ClientFields):
    """One control command, a named tuple (``collections``'; ``typing.NamedTuple`` would import
    ``typing`` on the lean path): ``command`` (str: ``status``, ``resume``, ``release``,
    ``kill``), ``logs`` (str, the logs dir), ``json`` (bool, ``--json``), ``vms`` (tuple of str,
    the VMs named: ``status``, ``resume``, ``kill``), ``all`` (bool, ``resume --all``, ``kill
    --all``), ``exclude`` (tuple of str, ``release --exclude``), ``states`` (tuple of str,
    ``status --state``), ``force`` and ``dry_run`` (bool, ``resume``), and ``kill``'s ``entry``
    (int or None), ``signal`` (str, ``TERM``...) and ``grace`` (float, seconds)."""

    __slots__ = ()


def add_status(status: argparse.ArgumentParser) -> None:
    """``status [VM...] [--state S]... [--watch [--interval S]] [--logs DIR] [--json]``."""
    from vmr_handler.host.cli.statustext import FILTERS

    status.add_argument("vms", nargs="*", metavar="VM", help="only these VMs' rows")
    status.add_argument("--state", action="append", default=[], choices=FILTERS,
                        help="only VMs in this state (repeatable: any of them)")  # fmt: skip
    status.add_argument("--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between redraws (default 2)")
    add_logs(status)
    status.add_argument("--json", action="store_true",
                        help="print the full status as JSON (--watch: one line per refresh)")  # fmt: skip


def add_resume(resume: argparse.ArgumentParser) -> None:
    """``resume (VM... | --all) [--force] [--dry-run] [--logs DIR] [--json]``: the request's
    fields as declared (:mod:`vmr_handler.host.control.commands`), then the CLI's own."""
    from vmr_handler.host.control.commands import COMMANDS, add_arguments

    add_arguments(resume, COMMANDS["resume"])
    add_logs(resume)
    resume.add_argument("--json", action="store_true")


def add_release(release: argparse.ArgumentParser) -> None:
    """``release [--exclude VM...] [--logs DIR] [--json]``: the request's fields as declared."""
    from vmr_handler.host.control.commands import COMMANDS, add_arguments

    add_arguments(release, COMMANDS["release"])
    add_logs(release)
    release.add_argument("--json", action="store_true")


def add_kill(kill: argparse.ArgumentParser) -> None:
    """``kill (VM... | --all) --entry N [--signal S] [--grace S] [--logs DIR] [--json]``: the
    request's fields as declared."""
    from vmr_handler.host.control.commands import COMMANDS, add_arguments

    add_arguments(kill, COMMANDS["kill"])
    add_logs(kill)
    kill.add_argument("--json", action="store_true")


def client_command(args: argparse.Namespace) -> ClientCommand:
    """The :class:`ClientCommand` of parsed ``status``/``resume``/``release``/``kill`` arguments."""
    return ClientCommand(
        args.command,
        args.logs,
        args.json,
        tuple(getattr(args, "vms", ())),
        bool(getattr(args, "all", False)),
        tuple(getattr(args, "exclude", ())),
        tuple(getattr(args, "state", ())),
        bool(getattr(args, "force", False)),
        bool(getattr(args, "dry_run", False)),
        getattr(args, "entry", None),
        getattr(args, "signal", "TERM"),
        getattr(args, "grace", 10.0),
    )


def run(args: argparse.Namespace) -> int:
    """``resume``/``release`` (and ``status`` without ``--watch``); the exit code."""
    return run_client(client_command(args))


def _payload(cmd: ClientCommand) -> Dict[str, Any]:
    """The control request of ``cmd``, made from its declaration
    (:func:`vmr_handler.host.control.commands.request_of`).

    Raises:
        UsageError: ``resume`` or ``kill`` without VMs and without ``--all``, or with both.
    """
    from vmr_handler.core.errors import UsageError
    from vmr_handler.host.control.commands import COMMANDS, request_of

    if cmd.command in ("resume", "kill") and bool(cmd.vms) == bool(cmd.all):
        raise UsageError(f"{cmd.command} needs VM names or --all (not both)")
    request = request_of(COMMANDS[cmd.command], cmd._asdict())
    if cmd.command == "kill":
        request["by"] = _who()  # said in the entry's end
    return request


def _who() -> str:
    """``user@host`` of who runs this command (``uid N@host`` when the user has no name)."""
    import getpass
    import os
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def run_client(cmd: ClientCommand) -> int:
    """Send ``cmd`` to the running ``vmr-host serve`` (``<logs>/vmr-host.sock``) and print the
    answer (JSON with ``--json``). Returns the exit code; errors are printed on stderr."""
    from vmr_handler.core.errors import ControlError, UsageError

    try:
        payload = _payload(cmd)
    except UsageError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        reply = ask_host(cmd.logs, payload)
        if reply.get("status") != "success":
            print(f"vmr-host: error: {reply.get('details')}", file=sys.stderr)
            return EXIT_USAGE
        if cmd.command == "status" and not _known(cmd, reply["result"]):
            return EXIT_USAGE
        print(_text(cmd, reply["result"]))
        if cmd.command == "status":
            from vmr_handler.host.cli.statustext import any_failed

            return EXIT_RUNTIME if any_failed(reply["result"]) else EXIT_OK
    except (ControlError, OSError) as exc:
        if cmd.command == "status" and not isinstance(exc, BrokenPipeError):
            return _offline(cmd, exc)
        return runtime_error(exc)
    return EXIT_OK


def _offline(cmd: ClientCommand, why: BaseException) -> int:
    """``status`` with no host answering: the same result rebuilt from the logs (read-only)."""
    from vmr_handler.core.errors import UsageError
    from vmr_handler.host.cli._offline import offline_status
    from vmr_handler.host.cli.statustext import any_failed

    try:
        result = offline_status(cmd.logs)
    except UsageError as exc:
        print(f"vmr-host: error: {exc} (give the running host's --logs DIR, or set VMR_LOGS)",
              file=sys.stderr)  # fmt: skip
        return EXIT_RUNTIME
    print(f"vmr-host: no vmr-host answers ({why}): status read from the logs in {cmd.logs} (read-only)",
          file=sys.stderr)  # fmt: skip
    if not _known(cmd, result):
        return EXIT_USAGE
    print(_text(cmd, result))
    return EXIT_RUNTIME if any_failed(result) else EXIT_OK


def _known(cmd: ClientCommand, result: Dict[str, Any]) -> bool:
    """Whether every VM ``status`` names is one of the ``result``'s; if not, said on stderr."""
    from vmr_handler.core.errors import UsageError
    from vmr_handler.host.cli.options import check_known
    from vmr_handler.host.cli.statustext import known_vms

    try:
        check_known(cmd.vms, known_vms(result))
    except UsageError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return False
    return True


def runtime_error(exc: BaseException) -> int:
    """Exit code for a runtime error of a ``vmr-host`` command, said once on stderr: a closed
    output pipe (``| head``) is a quiet success, anything else exit 1 with its text."""
    if isinstance(exc, BrokenPipeError):
        return EXIT_OK
    print(f"vmr-host: error: {exc}", file=sys.stderr)
    return EXIT_RUNTIME


def _held(result: Dict[str, Any], vms: Sequence[str]) -> str:
    breaks = result.get("at_break") or {}
    return ", ".join(f"{vm} (break #{breaks[vm]})" if vm in breaks else vm for vm in vms) or "none"


def _resume_text(result: Dict[str, Any]) -> str:
    """What ``resume`` prints: whom the RESUME reached (and which break it ends), or would, and
    the VMs at no break: left out (``--all``), or sent it with ``--force`` (their agent ignores
    it unless a break began meanwhile)."""
    targets = result["targets"]
    others = [vm for vm in result.get("not_at_break") or [] if vm not in targets]
    ignored = [vm for vm in result.get("not_at_break") or [] if vm in targets]
    lines = []
    if result.get("dry_run"):
        lines.append(f"would RESUME: {_held(result, targets)}")
    else:
        at = result["at"]
        when = at if isinstance(at, str) else f"t={at:+.3f}s"
        pending = result["pending"]
        sent = _held(result, result["sent_now"])
        lines.append(
            f"RESUME {result['id']} at host experiment time {when}: sent to {sent}"
            + (f"; pending (sent at their next handshake): {', '.join(pending)}" if pending else "")
        )
    if others or ignored:
        from vmr_handler.core.readable import few_names  # only here: the lean path stays lean

        if others:
            lines.append(f"not at a break, left out: {few_names(others)}")
        if ignored:
            forced = few_names(ignored)
            lines.append(f"not at a break, sent with --force (ignored unless a break began): {forced}")
    if result.get("dry_run"):
        lines.append("nothing sent (--dry-run)")
    return "\n".join(lines)


def _kill_text(result: Dict[str, Any]) -> str:
    """What ``kill`` prints: whom the kill reached, the VMs where the entry does not run (with
    ``--all``) and, for an entry of a stage, that the stage ends with it."""
    pending = [vm for vm in result["targets"] if vm not in result["sent_now"]]
    after = "" if result["signal"] == "KILL" else f", SIGKILL after {result['grace']:g} s"
    lines = [
        f"kill {result['id']}: entry {result['entry']} sent SIG{result['signal']}{after} on "
        + (", ".join(result["sent_now"]) or "no VM")
        + (f"; pending (sent when they reconnect): {', '.join(pending)}" if pending else "")
    ]
    lines += [f"{vm}: {why}" for vm, why in sorted((result.get("not_running") or {}).items())]
    lines += [f"{vm}: {note}" for vm, note in sorted((result.get("stage") or {}).items())]
    lines.append("its end shows in vmr-host logs VM and status (killed by operator)")
    return "\n".join(lines)


def _text(cmd: ClientCommand, result: Dict[str, Any]) -> str:
    """What ``cmd`` prints for the host's ``result``."""
    if cmd.json:
        import json

        return json.dumps(result, indent=1)
    if cmd.command == "status":
        from vmr_handler.host.cli.statustext import format_status

        return format_status(result, cmd.states, cmd.vms)
    if cmd.command == "resume":
        return _resume_text(result)
    if cmd.command == "kill":
        return _kill_text(result)
    if result["start_time"] is not None:
        from vmr_handler.core.fsutil import utc_text

        return f"experiment start time set: {utc_text(result['start_time'])}"
    return f"excluded {', '.join(result['excluded'])}; still waiting for {', '.join(result['waiting_for'])}"
