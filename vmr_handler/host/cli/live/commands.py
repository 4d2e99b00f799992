"""``vmr-host push|pull|exec``: change running VMs, the commands' arguments and runs (rows of
:data:`vmr_handler.host.cli.vmr_host.COMMANDS`).

Each command is a batch appended to the target VMs' schedules, as ``vmr-host schedule add``
appends one (:mod:`vmr_handler.host.cli.live.follow`): :mod:`.livepush`, :mod:`.livepull`,
:mod:`.liveexec`. Exit codes: 0 every VM did what was asked; 1 some VM did not (each says
why), or no host runs with these ``--logs``; 2 bad usage or a batch the host refused.
"""

from __future__ import annotations

import argparse
import math

from vmr_handler.host.cli.options import add_logs


def _wait(text: str) -> float:
    """``--timeout`` seconds: a finite number > 0."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


_COMMON = "[--timeout S] [--logs DIR] [--json]"


def _wait_options(p: argparse.ArgumentParser) -> None:
    """``--all``, ``--timeout``, ``--logs`` and ``--json`` of ``push`` and ``pull``."""
    from vmr_handler.host.cli.live.pull import DEFAULT_WAIT

    wait = f"seconds to wait for every VM (default {DEFAULT_WAIT:g}; the VMs go on after)"
    p.add_argument("--all", action="store_true", help="every VM this host serves")
    p.add_argument("--timeout", type=_wait, default=DEFAULT_WAIT, metavar="S", help=wait)
    add_logs(p)
    p.add_argument("--json", action="store_true", help="print each VM's outcome as JSON")


def add_push(push: argparse.ArgumentParser) -> None:
    """``push (VM ... | --all) LOCAL DEST [--mode MODE]``."""
    push.usage = f"vmr-host push (VM ... | --all) LOCAL DEST [--mode MODE] {_COMMON}"
    what = "the VMs (or --all), a file or directory here, then its absolute path in the VMs"
    push.add_argument("targets", nargs="+", metavar="[VM ...] LOCAL DEST", help=what)
    push.add_argument("--mode", metavar="MODE", help="octal mode of the files placed (e.g. 0755)")
    _wait_options(push)


def add_pull(pull: argparse.ArgumentParser) -> None:
    """``pull (VM ... | --all) PATH [--to DIR]``."""
    pull.usage = f"vmr-host pull (VM ... | --all) PATH [--to DIR] {_COMMON}"
    pull.add_argument("targets", nargs="+", metavar="[VM ...] PATH",
                      help="the VMs (or --all), then an absolute path of a file or directory")  # fmt: skip
    pull.add_argument("--to", metavar="DIR", help="also copy each VM's files to DIR/<vm>/")
    _wait_options(pull)


def add_exec(ex: argparse.ArgumentParser) -> None:
    """``exec (VM ... | --all) [--timeout S] [--logs DIR] -- CMD [ARG ...]``."""
    ex.usage = "vmr-host exec (VM ... | --all) [--timeout S] [--logs DIR] -- CMD [ARG ...]"
    ex.add_argument("vms", nargs="*", metavar="VM")
    ex.add_argument("--all", action="store_true", help="every VM this host serves")
    ex.add_argument("--timeout", type=_wait, metavar="S",
                    help="stop the command after S seconds (coreutils timeout: exit 124)")  # fmt: skip
    add_logs(ex)


def run_push(args: argparse.Namespace) -> int:
    """``push``; the exit code."""
    from vmr_handler.host.cli.live._push import cmd_push

    return cmd_push(args)


def run_pull(args: argparse.Namespace) -> int:
    """``pull``; the exit code."""
    from vmr_handler.host.cli.live.pull import cmd_pull

    return cmd_pull(args)


def run_exec(args: argparse.Namespace) -> int:
    """``exec`` (``args.rest``: its words after ``--``); the exit code."""
    from vmr_handler.host.cli.live._exec import cmd_exec

    return cmd_exec(args, args.rest)
