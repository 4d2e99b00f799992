"""``vmr-host pull (VM... | --all) PATH [--to DIR] [--timeout S] [--json]``: copy a file or a
directory out of running VMs (``firewheel vm pull file``).

PATH is one transfer-out entry appended at :data:`~vmr_handler.host.cli.live.follow.LIVE_TIME`
(``{"location": PATH, "interval": null}``: sent once), as FIREWHEEL's ``pull file`` appends
one. It lands where every transfer out does, confined to the VM's directory:
``<logs>/transfers/<vm>/<PATH without its leading />`` (:mod:`vmr_handler.host.serve.files.transfers`).

The agent says nothing when a transfer out is over, so the same entry also runs
``find -H PATH -type f -print0`` in the VM: the files it lists are the files the agent sends
(both walk regular files, follow PATH itself when it is a symlink and no symlink below it).
The command line follows each VM's log (:mod:`vmr_handler.host.cli.live.follow`) until every listed
file is in place (the host logs a ``transfer_chunk``/``transfer_uploaded`` with ``complete``
for it) or refused, and prints where each VM's copy is; ``--to DIR`` then copies them to
``DIR/<vm>/<basename of PATH>[/...]``. PATH must be absolute, without ``..`` components; it
is refused here before anything is sent (the host's confinement would refuse it again).
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import shlex
import shutil
from typing import Any, Dict, List, Mapping, Optional

from vmr_handler.core.errors import TransferRefused, UsageError
from vmr_handler.core.events import Event
from vmr_handler.core.readable import escaped, few_names
from vmr_handler.core.wire.protocol import TRANSFER_CHUNK, TRANSFER_UPLOADED
from vmr_handler.host.cli.live.follow import (
    LIVE_TIME,
    VmFollow,
    logs_dir,
    outcome_code,
    piece_bytes,
    run_batch,
    split_targets,
)
from vmr_handler.host.logs.text import printable
from vmr_handler.host.serve.files.transferpaths import confine_location
from vmr_handler.host.serve.files.transfers import TRANSFERS_DIR

#: Seconds ``pull`` and ``push`` wait for every VM by default (``--timeout``).
DEFAULT_WAIT = 300.0


def vm_path(path: str, what: str) -> str:
    """``path`` (a path in the VM) checked and made canonical: absolute, no ``..`` component,
    no NUL, within the transfer limits (:func:`~vmr_handler.host.serve.files.transferpaths.confine_location`),
    without ``.`` components, repeated or trailing ``/``.

    Raises:
        UsageError: it is refused (the message names ``what`` and why).
    """
    if not path.startswith("/"):
        raise UsageError(f"{what} {printable(path, 200)!r} must be an absolute path in the VM")
    try:
        parts = confine_location(path)
    except TransferRefused as exc:
        raise UsageError(f"{what} refused: {exc}") from exc
    return "/" + "/".join(parts)


def pull_entry(path: str) -> Dict[str, Any]:
    """The entry that sends ``path`` (canonical, :func:`vm_path`) to the host once and lists
    the files it sends (``find``'s NUL-separated output)."""
    return {
        "start_time": LIVE_TIME,
        "data": [{"location": path, "interval": None}],
        "executable": "find",
        "arguments": shlex.join(["-H", path, "-type", "f", "-print0"]),
        "ignore_failure": True,
    }


class PullFollow(VmFollow):
    """The files of one VM's pull: what ``find`` listed, what the host put in place.

    Args:
        vm: the VM name.
        path: PATH, canonical.

    Attributes:
        listed: the VM paths ``find`` listed (as the host logs locations), None until it ended.
        received: VM path -> where the host keeps it, relative to ``<logs>/transfers/<vm>``.
        refused: VM path -> why the host refused it.
    """

    def __init__(self, vm: str, path: str) -> None:
        super().__init__(vm)
        self.path = path
        self.out: List[bytes] = []
        self.err: List[bytes] = []
        self.listed: Optional[List[str]] = None
        self.exit_code: Any = None
        self.received: Dict[str, str] = {}
        self.refused: Dict[str, str] = {}

    def take(self, ev: Event) -> None:
        """A transfer report for a file under PATH, or an event of the entry."""
        d = ev.data
        if ev.type in (TRANSFER_CHUNK, TRANSFER_UPLOADED):
            self._transfer(d)
        elif self.entry(ev) == 0:
            if ev.type == "output":
                (self.out if d.get("stream") == "stdout" else self.err).append(
                    piece_bytes(d) + (b"\n" if d.get("eol") else b"")
                )
            elif ev.type == "entry_exited":
                names = b"".join(self.out).split(b"\0")
                self.listed = [printable(n.decode("utf-8", "surrogateescape"), 4096) for n in names if n]
                self.exit_code = d.get("exit_code")
            elif ev.type == "entry_failed":
                self.finish(f"could not list {self.path}: {d.get('details')}")
                return
        self._check()

    def _transfer(self, d: Mapping[str, Any]) -> None:
        """A ``transfer_chunk``/``transfer_uploaded`` the host logged: complete, or refused."""
        location = d.get("location")
        if not isinstance(location, str) or not f"{location}/".startswith(f"{self.path}/"):
            return
        if d.get("status") == "success" and str(d.get("details", "")).startswith("complete"):
            self.received[location] = str(d.get("stored_as"))
            self.refused.pop(location, None)
        elif d.get("status") == "error":
            self.refused[location] = str(d.get("details"))

    def _check(self) -> None:
        """Done once every listed file is in place or refused."""
        if self.done or self.listed is None or self.missing():
            return
        stderr = printable(escaped(b"".join(self.err)).strip(), 500)
        bad = [f"{name}: {why}" for name, why in sorted(self.refused.items()) if name in self.listed]
        if not self.listed and self.exit_code != 0:
            self.finish(f"nothing to pull: {stderr or f'find exited {self.exit_code}'}")
        elif bad:
            self.finish(f"{len(bad)} file(s) refused by the host: {few_names(bad, 3)}")
        else:
            self.finish(None if self.exit_code == 0 else f"some of {self.path} cannot be read: {stderr}")

    def missing(self) -> List[str]:
        """Listed files neither in place nor refused yet."""
        return [n for n in self.listed or [] if n not in self.received and n not in self.refused]

    def late(self, waited: float, logs: str) -> None:
        """Not done in time: which files did not come."""
        if self.listed is None:
            super().late(waited, logs)
        else:
            missing = self.missing()
            self.finish(f"{len(missing)} of {len(self.listed)} file(s) not received within {waited:.0f} s: "
                        f"{few_names(missing, 3)}")  # fmt: skip


def copy_out(logs: str, f: PullFollow, to: str) -> Dict[str, str]:
    """Copy the files ``f`` received to ``to/<vm>/<basename of PATH>[/...]``; VM path -> copy.

    Only files the host put in place under ``<logs>/transfers/<vm>/<PATH>`` are copied (their
    names come from the host's confined store, not from the guest); a symlink is skipped.

    Raises:
        OSError: a copy failed.
    """
    prefix = f.path.lstrip("/")
    root = os.path.join(logs, TRANSFERS_DIR, f.vm)
    copied = {}
    for location, stored in sorted(f.received.items()):
        if stored != prefix and not stored.startswith(prefix + "/"):
            continue
        source = os.path.join(root, *stored.split("/"))
        if os.path.islink(source) or not os.path.isfile(source):
            continue
        rest = stored[len(prefix) :].lstrip("/")
        target = os.path.join(to, f.vm, posixpath.basename(f.path), *([rest] if rest else []))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target)
        copied[location] = target
    return copied


def _result(logs: str, f: PullFollow, copied: Dict[str, str]) -> Dict[str, Any]:
    """One VM's part of ``--json``: ``ok``, ``problem``, ``files`` (VM path -> host path), ``copied``."""
    root = os.path.join(logs, TRANSFERS_DIR, f.vm)
    files = {loc: os.path.join(root, *stored.split("/")) for loc, stored in sorted(f.received.items())
             if loc in (f.listed or [])}  # fmt: skip
    return {"ok": f.problem is None, "problem": f.problem, "files": files, "copied": copied}


def _text(logs: str, f: PullFollow, result: Dict[str, Any], to: Optional[str]) -> str:
    """One VM's line: where its copy is, or why there is none."""
    if f.problem is not None:
        return f"{f.vm}: FAILED: {f.problem}"
    where = os.path.join(logs, TRANSFERS_DIR, f.vm, f.path.lstrip("/"))
    if to and result["copied"]:
        where += f", copied to {os.path.join(to, f.vm, posixpath.basename(f.path))}"
    if f.listed == [f.path]:
        return f"{f.vm}: {f.path} -> {where}"
    return f"{f.vm}: {len(result['files'])} file(s) of {f.path} -> {where}"


def cmd_pull(args: argparse.Namespace) -> int:
    """``vmr-host pull``: append the transfer, wait for every VM's copy, say where it is.

    Raises:
        UsageError: (exit 2) a refused PATH, neither or both of VMs and ``--all``, or the host
            refused the batch.
        ControlError: no host runs with these ``--logs``.
    """
    vms, (raw,) = split_targets(args.targets, 1, bool(args.all), "pull")
    path = vm_path(raw, "PATH")
    logs = logs_dir(args.logs)
    followers = run_batch(logs, vms, bool(args.all), "pull", [pull_entry(path)],
                          lambda vm: PullFollow(vm, path), args.timeout)  # fmt: skip
    results = {}
    for vm, f in sorted(followers.items()):
        copied = copy_out(logs, f, args.to) if args.to and f.problem is None else {}
        results[vm] = _result(logs, f, copied)
        if not args.json:
            print(_text(logs, f, results[vm], args.to))
    if args.json:
        print(json.dumps({"path": path, "vms": results}, indent=1))
    return outcome_code(followers)
