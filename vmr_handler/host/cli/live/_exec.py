"""``vmr-host exec (VM... | --all) [--timeout S] -- CMD [ARG...]``: run a command in running VMs
(miniccc's ``cc exec``).

The command is one entry appended at :data:`~vmr_handler.host.cli.live.follow.LIVE_TIME` (a stage
of its own, at once): ``CMD`` and its arguments each quoted with :func:`shlex.quote` (the
reference writes an entry's arguments unquoted into a bash line: here every word stays one
word), inside coreutils ``timeout -k 5 S`` when ``--timeout S`` is given (exit 124: timed
out; 137: killed 5 s later). Its output and exit code stay in the VM's logs like any entry's.

The command line follows each VM's log for that entry (:mod:`vmr_handler.host.cli.live.follow`):
every output line is printed as it arrives, prefixed ``vm: `` (stdout lines on stdout, stderr
lines on stderr, control characters escaped), then one line per VM with its exit code. Exit 0
when the command exited 0 in every VM; 1 when it failed, timed out, could not run, or did not
finish within ``S`` + :data:`GRACE` seconds in some VM (each says which).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, Dict, List, Mapping, Optional, TextIO

from vmr_handler.core.errors import UsageError
from vmr_handler.core.events import Event
from vmr_handler.core.readable import duration, escaped
from vmr_handler.host.cli.live.follow import LIVE_TIME, VmFollow, outcome_code, piece_bytes, run_batch
from vmr_handler.host.logs.text import printable

#: Seconds ``timeout`` waits after its signal before it kills the command (``-k``).
KILL_AFTER = 5
#: Seconds waited beyond ``--timeout`` (and :data:`KILL_AFTER`) for the VMs' answers and logs.
GRACE = 30.0
#: Exit codes of coreutils ``timeout``: the command timed out, or was killed after ``-k``.
TIMED_OUT = (124, 128 + 9)


def exec_entry(command: List[str], timeout: Optional[float]) -> Dict[str, Any]:
    """The entry that runs ``command`` (argv, each word quoted), within ``timeout`` seconds
    when given (``timeout -k 5 S``). A command that fails does not fail the VM."""
    words = command if timeout is None else ["timeout", "-k", str(KILL_AFTER), f"{timeout:g}", *command]
    return {
        "start_time": LIVE_TIME,
        "executable": shlex.quote(words[0]),
        "arguments": shlex.join(words[1:]),
        "ignore_failure": True,
    }


class ExecFollow(VmFollow):
    """The command's output and exit in one VM.

    Args:
        vm: the VM name.
        timeout: the ``--timeout`` (seconds) or None.
        out: where stdout lines are printed; ``err``: stderr lines.
    """

    def __init__(self, vm: str, timeout: Optional[float], out: TextIO, err: TextIO) -> None:
        super().__init__(vm)
        self.timeout = timeout
        self.streams = {"stdout": out, "stderr": err}
        self.pieces: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        self.exit_code: Optional[int] = None
        self.took: Optional[float] = None

    def take(self, ev: Event) -> None:
        """Print its output; note how it ended."""
        if self.entry(ev) != 0:
            return
        d = ev.data
        if ev.type == "output" and d.get("stream") in self.pieces:
            self._piece(str(d["stream"]), d)
        elif ev.type == "entry_exited":
            self._flush()
            self.exit_code = d.get("exit_code") if isinstance(d.get("exit_code"), int) else None
            self.took = d.get("duration") if isinstance(d.get("duration"), (int, float)) else None
            self.finish(self._problem(d.get("signal")))
        elif ev.type == "entry_failed":
            self._flush()
            self.finish(f"could not run: {d.get('details')}")

    def _piece(self, stream: str, d: Mapping[str, Any]) -> None:
        """One output piece: printed with the VM's prefix once its line is whole."""
        self.pieces[stream].append(piece_bytes(d))
        if not d.get("continued"):
            line = escaped(b"".join(self.pieces[stream]))
            self.pieces[stream].clear()
            print(f"{self.vm}: {printable(line)}", file=self.streams[stream], flush=True)

    def _flush(self) -> None:
        """A line cut short (the command ended in the middle of a long line): printed as it is."""
        for stream, pieces in self.pieces.items():
            if pieces:
                self._piece(stream, {"line": "", "continued": False})

    def _problem(self, signal: Any) -> Optional[str]:
        """Why the command's exit is a failure (None: exit 0)."""
        code = self.exit_code
        if code == 0:
            return None
        if self.timeout is not None and code in TIMED_OUT:
            return f"timed out after {self.timeout:g} s (exit {code})"
        if code is None:
            return f"killed by signal {signal}"
        return f"exit {code}"

    def summary(self) -> str:
        """The VM's last line: its exit code and how long it ran, or why it did not."""
        took = f", {duration(self.took)}" if self.took is not None else ""
        if self.problem is None:
            return f"{self.vm}: [exit 0{took}]"
        return f"{self.vm}: [FAILED: {self.problem}{took}]"


def cmd_exec(args: argparse.Namespace, command: Optional[List[str]]) -> int:
    """``vmr-host exec``: append the command, print its output per VM, then each VM's exit.

    Args:
        command: the words after ``--`` (None: there was no ``--``).

    Raises:
        UsageError: (exit 2) no command, neither or both of VMs and ``--all``, or the host
            refused the batch.
        ControlError: no host runs with these ``--logs``.
    """
    if not command:
        raise UsageError("exec needs the command after --: vmr-host exec (VM... | --all) -- CMD [ARG...]")
    if bool(args.vms) == bool(args.all):
        raise UsageError("exec needs VM names or --all (not both)")
    wait = None if args.timeout is None else args.timeout + KILL_AFTER + GRACE
    followers = run_batch(
        args.logs, list(args.vms), bool(args.all), "exec", [exec_entry(command, args.timeout)],
        lambda vm: ExecFollow(vm, args.timeout, sys.stdout, sys.stderr), wait,
    )  # fmt: skip
    for vm in sorted(followers):
        print(followers[vm].summary(), file=sys.stderr)
    return outcome_code(followers)
