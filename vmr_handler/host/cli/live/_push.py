"""``vmr-host push (VM... | --all) LOCAL DEST [--mode MODE] [--timeout S] [--json]``: put a file
or a directory of this host into running VMs (``firewheel vm push file``).

LOCAL's files are staged under ``<logs>/pushed/<sha256>`` (content-addressed, mode 0600),
which the running host serves as VM resources named ``pushed/<sha256>``
(:class:`~vmr_handler.host.serve.files.resources.ResourceStore`, a second read-only root) to the VMs a
batch drops them for. The batch: one entry at :data:`~vmr_handler.host.cli.live.follow.LIVE_TIME`
whose data are ``filename`` drops (``{"filename": "pushed/<sha256>", "location":
DEST[/relpath]}``, ``executable`` when the mode has an x bit: ``--mode``'s, else the local
file's), and with ``--mode`` a following entry that runs ``chmod MODE`` on the files dropped.

Drops are placed as every drop is (``docs/firewheel.md``): a DEST that already exists with
other content is kept, not overwritten, as in the reference; ``push`` says so and exits 1.
The command line follows each VM's log (:mod:`vmr_handler.host.cli.live.follow`) until its files
are placed (``data_placed``) and the mode applied.

Limits: at most :data:`MAX_FILES` files, each at most ``Limits.transfer_file`` bytes and
``Limits.transfer_total`` in all (the limits of files pulled out of a VM); a symlink in LOCAL
that leads out of it is refused (nothing is pushed), one to a directory is not followed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import posixpath
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from vmr_handler.core.errors import UsageError
from vmr_handler.core.events import Event
from vmr_handler.core.readable import few_names, size
from vmr_handler.host.cli.live import follow as livefollow
from vmr_handler.host.cli.live.follow import LIVE_TIME, VmFollow, outcome_code, piece_bytes
from vmr_handler.host.cli.live.pull import vm_path
from vmr_handler.host.logs.text import printable
from vmr_handler.host.serve.config import Limits
from vmr_handler.host.serve.files.resources import PUSHED_DIR, pushed_name

#: Most files one push carries (one drop each, in one batch).
MAX_FILES = 1000
_MODE = re.compile(r"[0-7]{1,4}")


@dataclass(frozen=True)
class LocalFile:
    """One file of LOCAL: ``rel`` (``/``-separated, ``""`` for LOCAL itself), the path it is read
    from, its size (bytes) and whether it has an x bit."""

    rel: str
    path: str
    size: int
    executable: bool


def _one(rel: str, path: str) -> LocalFile:
    st = os.stat(path)
    return LocalFile(rel, path, st.st_size, bool(st.st_mode & 0o111))


def local_files(local: str, note: Any = None) -> List[LocalFile]:
    """The regular files of ``local`` (a file, or every file below a directory), sorted.

    A symlink inside the directory is followed when it leads to a file inside it; one to a
    directory, a broken one and special files are left out (``note(text)`` is told).

    Raises:
        UsageError: ``local`` does not exist, cannot be read, or holds a symlink leading out.
    """
    top = os.path.realpath(local)
    if os.path.isfile(top):
        return [_one("", top)]
    if not os.path.isdir(top):
        raise UsageError(f"LOCAL {local}: no such file or directory")
    out, stack = [], [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(top, rel_dir)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise UsageError(f"cannot read {os.path.join(local, rel_dir)}: {exc.strerror}") from exc
        for e in entries:
            rel = posixpath.join(rel_dir, e.name) if rel_dir else e.name
            real = os.path.realpath(e.path)
            if e.is_symlink() and not real.startswith(top + os.sep):
                raise UsageError(f"{e.path} is a symlink leading out of {local} (to {real}); nothing pushed")
            if e.is_dir(follow_symlinks=False):
                stack.append(rel)
            elif os.path.isfile(real):
                out.append(_one(rel, real))
            elif note is not None:
                why = "a symlink to a directory" if e.is_symlink() else "not a regular file"
                note(f"left out {e.path}: {why}")
    return sorted(out, key=lambda f: f.rel)


def check_sizes(files: List[LocalFile], local: str, limits: Limits) -> None:
    """Refuse a push over the limits (see the module docstring).

    Raises:
        UsageError: too many files, a file or the whole too large, or no file at all.
    """
    if not files:
        raise UsageError(f"LOCAL {local} holds no file to push")
    if len(files) > MAX_FILES:
        raise UsageError(f"LOCAL {local} holds {len(files):,} files, over the limit of {MAX_FILES:,} a push")
    big = [f for f in files if f.size > limits.transfer_file]
    if big:
        raise UsageError(f"{big[0].path} is {size(big[0].size)}, over the per-file limit of "
                         f"{size(limits.transfer_file)}")  # fmt: skip
    total = sum(f.size for f in files)
    if total > limits.transfer_total:
        raise UsageError(f"LOCAL {local} is {size(total)}, over the limit of {size(limits.transfer_total)}")


def stage(logs: str, f: LocalFile) -> str:
    """Copy ``f`` to ``<logs>/pushed/<sha256>`` (once per content, mode 0600); its sha256.

    Raises:
        OSError: it cannot be read or the logs directory written.
    """
    pushed = os.path.join(logs, PUSHED_DIR)
    os.makedirs(pushed, mode=0o700, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=pushed, prefix=".push-")
    try:
        with open(f.path, "rb") as src, os.fdopen(fd, "wb") as dst:
            while block := src.read(1 << 20):
                h.update(block)
                dst.write(block)
            dst.flush()
            os.fsync(dst.fileno())
        digest = h.hexdigest()
        os.replace(tmp, os.path.join(pushed, digest))
    except BaseException:
        os.unlink(tmp)
        raise
    return digest


def push_entries(logs: str, files: List[LocalFile], dest: str, mode: Optional[str]) -> List[Dict[str, Any]]:
    """Stage ``files`` and make the batch: the drops, then ``chmod MODE`` when ``mode`` is given.

    Raises:
        UsageError: a location is refused (:func:`~vmr_handler.host.cli.live.pull.vm_path`).
        OSError: as :func:`stage`.
    """
    executable = None if mode is None else bool(int(mode, 8) & 0o111)
    drops = []
    for f in files:
        location = vm_path(dest if not f.rel else f"{dest}/{f.rel}", "destination")
        drops.append({"filename": pushed_name(stage(logs, f)), "location": location,
                      "executable": f.executable if executable is None else executable})  # fmt: skip
    entries: List[Dict[str, Any]] = [{"start_time": LIVE_TIME, "data": drops, "ignore_failure": True}]
    if mode is not None:
        entries.append({"start_time": LIVE_TIME + 1, "executable": "chmod", "ignore_failure": True,
                        "arguments": shlex.join([mode, *(str(d["location"]) for d in drops)])})  # fmt: skip
    return entries


class PushFollow(VmFollow):
    """One VM's push: each file's ``data_placed`` outcome (one per drop, whether written, found
    there already or kept), then the ``chmod``.

    Args:
        vm: the VM name.
        files: how many files are dropped.
        with_mode: a ``chmod`` entry follows the drops.
    """

    def __init__(self, vm: str, files: int, with_mode: bool) -> None:
        super().__init__(vm)
        self.files = files
        self.with_mode = with_mode
        self.outcomes: Dict[str, str] = {}
        self.chmod_err: List[bytes] = []

    def take(self, ev: Event) -> None:
        """The drops' and the ``chmod``'s events."""
        which, d = self.entry(ev), ev.data
        if which == 0:
            if ev.type == "data_placed":
                self.outcomes[str(d.get("location"))] = str(d.get("outcome"))
                if len(self.outcomes) == self.files and not self.with_mode:
                    self.finish(self._kept())
            elif ev.type == "entry_failed":
                self.finish(f"not placed: {d.get('details')}")
        elif which == 1 and self.with_mode:
            if ev.type == "output" and d.get("stream") == "stderr":
                self.chmod_err.append(piece_bytes(d))
            elif ev.type == "entry_failed":
                self.finish(f"mode not applied: {d.get('details')}")
            elif ev.type == "entry_exited":
                code = d.get("exit_code")
                why = printable(b" ".join(self.chmod_err).decode("utf-8", "replace"), 300)
                self.finish(self._kept() or (None if code == 0 else f"chmod exited {code}: {why}"))

    def _kept(self) -> Optional[str]:
        """The files not written because another file was there (None: none)."""
        kept = sorted(loc for loc, outcome in self.outcomes.items() if outcome == "kept")
        if not kept:
            return None
        return f"{len(kept)} file(s) already there with other content, not overwritten: {few_names(kept, 3)}"

    def text(self, dest: str, mode: Optional[str]) -> str:
        """The VM's line: what was placed, or why not."""
        if self.problem is not None:
            return f"{self.vm}: FAILED: {self.problem}"
        present = sum(1 for o in self.outcomes.values() if o == "present")
        same = f" ({present} already there)" if present else ""
        return f"{self.vm}: {len(self.outcomes)} file(s) at {dest}{same}{f', mode {mode}' if mode else ''}"


def cmd_push(args: argparse.Namespace) -> int:
    """``vmr-host push``: stage LOCAL, append the drops, wait until every VM placed them.

    Raises:
        UsageError: (exit 2) a bad LOCAL, DEST or MODE, over a limit, neither or both of VMs
            and ``--all``, or the host refused the batch (nothing appended).
        ControlError: no host runs with these ``--logs``.
        OSError: LOCAL cannot be read or the logs directory written.
    """
    vms, (local, raw_dest) = livefollow.split_targets(args.targets, 2, bool(args.all), "push")
    dest = vm_path(raw_dest, "DEST")
    if raw_dest.endswith("/") and os.path.isfile(local):  # into that directory, as cp does
        dest = vm_path(f"{dest}/{os.path.basename(os.path.realpath(local))}", "DEST")
    if args.mode is not None and not _MODE.fullmatch(args.mode):
        raise UsageError(f"--mode {args.mode!r} must be an octal mode such as 644 or 0755")
    files = local_files(local, lambda text: print(f"vmr-host: {text}", file=sys.stderr))
    check_sizes(files, local, Limits())
    logs = livefollow.logs_dir(args.logs)
    entries = push_entries(logs, files, dest, args.mode)
    with_mode = args.mode is not None
    followers = livefollow.run_batch(logs, vms, bool(args.all), "push", entries,
                          lambda vm: PushFollow(vm, len(files), with_mode), args.timeout)  # fmt: skip
    if args.json:
        out = {vm: {"ok": f.problem is None, "problem": f.problem, "placed": f.outcomes}
               for vm, f in sorted(followers.items())}  # fmt: skip
        print(json.dumps({"dest": dest, "files": len(files), "vms": out}, indent=1))
    else:
        for _vm, f in sorted(followers.items()):
            print(f.text(dest, args.mode))
    return outcome_code(followers)
