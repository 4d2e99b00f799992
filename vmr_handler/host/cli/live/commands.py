"""``vmr-host push|pull|exec``: change running VMs, the sub-commands' parsers.

Each command is a batch appended to the target VMs' schedules, as ``vmr-host schedule add``
appends one (:mod:`vmr_handler.host.cli.live.follow`): :mod:`.livepush`, :mod:`.livepull`,
:mod:`.liveexec`. Exit codes: 0 every VM did what was asked; 1 some VM did not (each says
why), or no host runs with these ``--logs``; 2 bad usage or a batch the host refused.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, List, Optional, Tuple

#: The sub-commands of this module.
COMMANDS = ("push", "pull", "exec")


def _wait(text: str) -> float:
    """``--timeout`` seconds: a finite number > 0."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def add_parsers(sub: Any, add_logs: Any) -> None:
    """``push``, ``pull`` and ``exec`` (``sub``: the ``vmr-host`` sub-parsers; ``add_logs``
    adds ``--logs``)."""
    from vmr_handler.host.cli.live.pull import DEFAULT_WAIT

    wait = f"seconds to wait for every VM (default {DEFAULT_WAIT:g}; the VMs go on after)"
    common = "[--timeout S] [--logs DIR] [--json]"
    usage = f"vmr-host push (VM ... | --all) LOCAL DEST [--mode MODE] {common}"
    push = sub.add_parser("push", help="put a file or directory of this host into running VMs", usage=usage)
    what = "the VMs (or --all), a file or directory here, then its absolute path in the VMs"
    push.add_argument("targets", nargs="+", metavar="[VM ...] LOCAL DEST", help=what)
    push.add_argument("--mode", metavar="MODE", help="octal mode of the files placed (e.g. 0755)")
    pull = sub.add_parser("pull", help="copy a file or directory out of running VMs (<logs>/transfers/<vm>/)",
                          usage=f"vmr-host pull (VM ... | --all) PATH [--to DIR] {common}")  # fmt: skip
    pull.add_argument("targets", nargs="+", metavar="[VM ...] PATH",
                      help="the VMs (or --all), then an absolute path of a file or directory")  # fmt: skip
    pull.add_argument("--to", metavar="DIR", help="also copy each VM's files to DIR/<vm>/")
    for p in (push, pull):
        p.add_argument("--all", action="store_true", help="every VM this host serves")
        p.add_argument("--timeout", type=_wait, default=DEFAULT_WAIT, metavar="S", help=wait)
        add_logs(p)
        p.add_argument("--json", action="store_true", help="print each VM's outcome as JSON")
    usage = "vmr-host exec (VM ... | --all) [--timeout S] [--logs DIR] -- CMD [ARG ...]"
    ex = sub.add_parser("exec", help="run a command in running VMs: output and exit code per VM", usage=usage)
    ex.add_argument("vms", nargs="*", metavar="VM")
    ex.add_argument("--all", action="store_true", help="every VM this host serves")
    ex.add_argument("--timeout", type=_wait, metavar="S",
                    help="stop the command after S seconds (coreutils timeout: exit 124)")  # fmt: skip
    add_logs(ex)


def split_command(argv: List[str]) -> Tuple[List[str], Optional[List[str]]]:
    """``vmr-host`` arguments without the command of ``exec`` (the words after its first
    ``--``, taken as they are), and that command (None: not ``exec``, or no ``--``)."""
    command = next((a for a in argv if not a.startswith("-")), None)  # global flags take no value
    if command != "exec" or "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def run_live(args: argparse.Namespace, command: Optional[List[str]]) -> int:
    """Run ``push``, ``pull`` or ``exec`` (``command``: exec's words after ``--``); the exit code."""
    if args.command == "push":
        from vmr_handler.host.cli.live._push import cmd_push

        return cmd_push(args)
    if args.command == "pull":
        from vmr_handler.host.cli.live.pull import cmd_pull

        return cmd_pull(args)
    from vmr_handler.host.cli.live._exec import cmd_exec

    return cmd_exec(args, command)
