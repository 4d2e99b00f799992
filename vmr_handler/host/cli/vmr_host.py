"""``vmr-host`` command line: where the console script starts, and its one command table.

:data:`COMMANDS` (pip's ``commands_dict``) names every command with its summary and the
functions that add its arguments and run it; help, shell completion and dispatch are made from
it (:mod:`vmr_handler.core.commandtable`). Running one command imports only that command's
module and what it needs: ``status``, ``resume`` and ``release`` import
:mod:`vmr_handler.host.cli.control_client` and nothing of the host's configuration or logging,
so a RESUME leaves within a few ms of the interpreter's start.

Exit codes: 0 success; 1 runtime error (no running vmr-host, a socket in use, the disk);
2 bad usage or bad input (unusable schedule, unknown VM, a socket path too long, a request
the running host refused).
"""

from __future__ import annotations

import sys

from vmr_handler.core.commandtable import (
    ALL,
    Command,
    build_parser,
    command_word,
    completion_command,
    resolve,
    split_rest,
    top_parser,
)

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    import argparse
    from typing import Dict, List, Optional

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2
_CLI = "vmr_handler.host.cli."
_CLIENT = _CLI + "control_client:"
_LIVE = _CLI + "live.commands:"

#: Every ``vmr-host`` command, in the order ``vmr-host --help`` lists them.
COMMANDS: Dict[str, Command] = {
    "serve": Command("serve every VM's channel (runs until SIGTERM)",
                     _CLI + "serve:add_arguments", _CLI + "serve:run"),
    "status": Command("every VM, where it is and whom the barrier waits for (exit 1: some VM failed)",
                      _CLIENT + "add_status", _CLI + "_waiting:run_status", lean=True),
    "wait": Command("wait until VMs reach a phase (exit 0 reached, 1 a VM failed, 2 timeout)",
                    _CLI + "_waiting:add_arguments", _CLI + "_waiting:run", lean=True),
    "resume": Command("send a RESUME to VMs (stamped with host experiment time)",
                      _CLIENT + "add_resume", _CLIENT + "run", lean=True),
    "release": Command("start the experiment without VMs that are missing",
                       _CLIENT + "add_release", _CLIENT + "run", lean=True),
    "kill": Command("end a running entry in VMs: SIGTERM, then SIGKILL after the grace (docs/host.md)",
                    _CLIENT + "add_kill", _CLIENT + "run", lean=True),
    "mqtt-config": Command("mosquitto config, ACL and credentials (docs/mqtt.md)",
                           _CLI + "mqtt_config.layout:add_arguments",
                           _CLI + "mqtt_config.command:cmd_mqtt_config"),
    "keygen": Command("make the host's Ed25519 key pair for signed control messages",
                      _CLI + "_keygen:add_arguments", _CLI + "_keygen:cmd_keygen"),
    "report": Command("write the experiment timeline as one HTML file (docs/host.md)",
                      _CLI + "logs:add_report_arguments", "vmr_handler.host.report.files:cmd_report"),
    "check": Command("check every schedule file of a --schedules directory (exit 2: some cannot be used)",
                     _CLI + "check:add_arguments", _CLI + "check:run"),
    "logs": Command("a VM's events and output, UTC + experiment time (-f: follow)",
                    _CLI + "logs:add_arguments", _CLI + "logs:run"),
    "schedule": Command("a VM's schedule, what became of every entry; append entries",
                        _CLI + "schedule.show:add_arguments", _CLI + "schedule.show:run"),
    "push": Command("put a file or directory of this host into running VMs",
                    _LIVE + "add_push", _LIVE + "run_push"),
    "pull": Command("copy a file or directory out of running VMs (<logs>/transfers/<vm>/)",
                    _LIVE + "add_pull", _LIVE + "run_pull"),
    "exec": Command("run a command in running VMs: output and exit code per VM",
                    _LIVE + "add_exec", _LIVE + "run_exec", rest=True),
    "completion": completion_command("vmr-host", _CLI + "vmr_host:run_completion"),
}  # fmt: skip


def parser(only: Optional[str] = ALL) -> argparse.ArgumentParser:
    """The ``vmr-host`` parser: the global flags, then one sub-command per :data:`COMMANDS` row;
    only command ``only``'s arguments are added (every command's by default)."""
    top = top_parser(
        "vmr-host",
        "Host controller of a vmr-handler experiment: delivers schedules over each VM's "
        "virtio-serial channel, runs the start barrier, relays RESUME, keeps per-VM logs.",
    )
    top.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    return build_parser(top, COMMANDS, only)


def run_completion(args: argparse.Namespace) -> int:
    """``completion SHELL``: the script, made from the whole parser."""
    from vmr_handler.core.completion import completion_script

    print(completion_script(parser(), args.shell))
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``vmr-host`` console script. Returns the exit code."""
    words = sys.argv[1:] if argv is None else list(argv)
    name = command_word(words, COMMANDS)
    command = COMMANDS[name] if name is not None else None
    words, rest = split_rest(words, command)
    top = parser(name)
    args = top.parse_args(words)
    args.rest = rest
    if command is None:
        top.print_help(sys.stderr)
        return EXIT_USAGE
    if not command.lean:
        import logging

        # INFO by default: each VM's connect, configured, failed and complete with running counts
        # -q for warnings and errors only, -v for debug
        level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")
    return _outcome(command, args)


def _outcome(command: Command, args: argparse.Namespace) -> int:
    """Run ``command``; its errors said once on stderr with their exit code."""
    from vmr_handler.core.errors import ControlError, HostSetupError, UsageError

    try:
        code: int = resolve(command.run)(args)
        return code
    except UsageError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HostSetupError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (ControlError, OSError) as exc:
        from vmr_handler.host.cli.control_client import runtime_error

        return runtime_error(exc)
