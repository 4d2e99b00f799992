"""What ``vmr-host push|pull|exec`` share: issue a generated batch, then follow it.

Each of the three commands is a batch of entries appended to the target VMs' schedules, as
``vmr-host schedule add`` appends one (validated, signed, journaled on both sides, exactly
once, over either transport): :func:`issue_batch` writes the batch as a JSON schedule file
under the logs directory and hands it to the running host (the ``schedule_add`` control
request, :func:`vmr_handler.host.cli.schedule.add.request_add`).

:func:`follow` then watches what becomes of it in each target VM, from the files the host
keeps: the VM's answer in ``<logs>/appends.json`` (the ``first_index`` of the batch's entries,
or why it was refused; :class:`~vmr_handler.host.serve.experiment.appendbook.AppendBook`), then the VM's log
``<logs>/<vm>.jsonl`` from the offset it had when the batch was issued
(:func:`~vmr_handler.host.logs.jsonlread.records_from`). A :class:`VmFollow` per VM reads the
events it cares about and says when the VM is done.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar

from vmr_handler.core.errors import UsageError
from vmr_handler.core.events import Event
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.readable import few_names
from vmr_handler.host.cli.options import host_command
from vmr_handler.host.cli.schedule.add import request_add
from vmr_handler.host.logs.jsonlread import end_offset, event_of, records_from
from vmr_handler.host.serve.experiment.appendbook import AppendBook, AppendRecord

#: Where the entries of ``push``/``pull``/``exec`` run: a negative time, so each batch runs at
#: once as a stage of its own (``firewheel vm push/pull file`` append theirs at -100000 too).
LIVE_TIME = -100000
#: Seconds between two looks at ``appends.json`` and the VMs' logs.
FOLLOW_INTERVAL = 0.2


class VmFollow:
    """What becomes of a batch in one VM. Subclasses read the events (:meth:`take`).

    Args:
        vm: the VM name.

    Attributes:
        first: the index the batch's first entry got in the VM's schedule (None: no answer yet).
        done: nothing more to wait for.
        problem: why the VM did not do what was asked (None: it did, or not done yet).
    """

    def __init__(self, vm: str) -> None:
        self.vm = vm
        self.first: Optional[int] = None
        self.done = False
        self.problem: Optional[str] = None

    def answered(self, answer: Mapping[str, Any]) -> None:
        """The VM's answer to the batch (``appends.json``): where its entries went, or a refusal."""
        if answer.get("status") == "success" and isinstance(answer.get("first_index"), int):
            self.first = int(answer["first_index"])
        else:
            self.finish(f"refused by the VM: {answer.get('details')}")

    def take(self, ev: Event) -> None:
        """One event of the VM's log written after the batch was issued (any entry's)."""
        raise NotImplementedError

    def finish(self, problem: Optional[str] = None) -> None:
        """Done, with ``problem`` (None: success)."""
        self.done = True
        self.problem = problem

    def late(self, waited: float, logs: str) -> None:
        """Not done after ``waited`` seconds (the command stops waiting; the VM goes on; its
        log is in ``logs``)."""
        if self.first is None:
            self.finish(
                f"no answer within {waited:.0f} s (not connected? the batch is sent at its next "
                "connection and runs then)"
            )
        else:
            see = host_command(logs, "logs", self.vm)
            self.finish(f"not finished within {waited:.0f} s (it goes on in the VM: {see})")

    def entry(self, ev: Event) -> Optional[int]:
        """Which of the batch's entries ``ev`` is about (0: the first), None: none of them."""
        index = ev.data.get("index")
        if self.first is None or not isinstance(index, int) or index < self.first:
            return None
        return index - self.first


#: A kind of :class:`VmFollow`.
F = TypeVar("F", bound=VmFollow)


def split_targets(words: List[str], after: int, everyone: bool, what: str) -> Tuple[List[str], List[str]]:
    """``[VM ...] X...`` of a command line: the VMs, then the last ``after`` words.

    Raises:
        UsageError: too few words, or neither or both of VM names and ``--all``.
    """
    if len(words) < after:
        raise UsageError(f"{what}: missing arguments (see vmr-host {what.split()[0]} --help)")
    vms, rest = words[: len(words) - after], words[len(words) - after :]
    if bool(vms) == everyone:
        raise UsageError(f"{what} needs VM names or --all (not both)")
    return vms, rest


def logs_dir(logs: str) -> str:
    """``--logs`` as an absolute path (the host reads the batch file from it).

    Raises:
        UsageError: it is not a directory (no ``vmr-host serve`` keeps its logs there).
    """
    if not os.path.isdir(logs):
        raise UsageError(
            f"no vmr-host serve runs with the logs directory {os.path.abspath(logs)} (not a directory): "
            "give the running host's --logs DIR, or set VMR_LOGS"
        )
    return os.path.abspath(logs)


def log_offsets(logs: str, vms: List[str], everyone: bool) -> Dict[str, int]:
    """Where each VM's log ends now (every VM with a log when ``everyone``): its records from
    there on are the ones written after the batch is issued."""
    if everyone:
        try:
            vms = [n[: -len(".jsonl")] for n in os.listdir(logs) if n.endswith(".jsonl")]
        except OSError:
            vms = []
    return {vm: end_offset(os.path.join(logs, f"{vm}.jsonl")) for vm in vms}


def issue_batch(
    logs: str, vms: List[str], everyone: bool, kind: str, entries: List[Dict[str, Any]]
) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """Append ``entries`` to the VMs' schedules through the host running with ``logs``.

    The batch is written to ``<logs>/.<kind>-<hex>.json`` for the host to read (it keeps its own
    copy in ``<logs>/appends/``), then removed.

    Returns:
        The host's result (``id``, ``targets``, ``sent_now``, ``pending``) and each VM's log
        offset from before the batch was issued (:func:`log_offsets`).

    Raises:
        UsageError: the batch is refused (a bad entry, an unknown VM, a resource not staged),
            or ``logs`` is not a directory.
        ControlError: no host runs with these ``logs``.
        OSError: the logs directory cannot be written.
    """
    logs = logs_dir(logs)
    offsets = log_offsets(logs, vms, everyone)
    path = os.path.join(logs, f".{kind}-{uuid.uuid4().hex[:12]}.json")
    atomic_write(path, json.dumps(entries, indent=1).encode(), 0o644)
    try:
        result = request_add(logs, vms, everyone, path)
    finally:
        os.unlink(path)
    return result, offsets


def _record(logs: str, batch_id: str) -> Optional[AppendRecord]:
    """The host's record of the batch (None: ``appends.json`` cannot be read right now)."""
    try:
        return AppendBook(logs).find(batch_id)
    except (OSError, ValueError):
        return None


def _read(logs: str, f: VmFollow, start: int) -> int:
    """Hand ``f`` the events of its VM's log from byte ``start``; the offset reached."""
    try:
        for _offset, end, rec in records_from(os.path.join(logs, f"{f.vm}.jsonl"), start):
            start = end
            ev = event_of(rec)
            if ev is not None:
                f.take(ev)
            if f.done:
                break
    except FileNotFoundError:
        pass
    return start


def follow(
    logs: str,
    batch_id: str,
    followers: Mapping[str, VmFollow],
    offsets: Dict[str, int],
    wait: Optional[float],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Follow batch ``batch_id`` in each VM until every follower is done, or for ``wait``
    seconds at most (None: until done; then :meth:`VmFollow.late` for the others).

    Args:
        offsets: VM -> where its log is read from (:func:`log_offsets`); advanced in place.
        clock: monotonic seconds; ``sleep``: waits that many seconds.
    """
    started = clock()
    while True:
        waiting = [f for f in followers.values() if not f.done]
        if any(f.first is None for f in waiting):
            record = _record(logs, batch_id)
            for f in waiting:
                answer = record.answered.get(f.vm) if record is not None else None
                if f.first is None and answer is not None:
                    f.answered(answer)
        for f in waiting:
            if f.first is not None and not f.done:
                offsets[f.vm] = _read(logs, f, offsets.get(f.vm, 0))
        waiting = [f for f in waiting if not f.done]
        if not waiting:
            return
        if wait is not None and clock() - started >= wait:
            for f in waiting:
                f.late(clock() - started, logs)
            return
        sleep(FOLLOW_INTERVAL)


def run_batch(
    logs: str,
    vms: List[str],
    everyone: bool,
    kind: str,
    entries: List[Dict[str, Any]],
    make: Callable[[str], F],
    wait: Optional[float],
) -> Dict[str, F]:
    """:func:`issue_batch`, then :func:`follow` it with ``make(vm)`` for each target VM, for
    ``wait`` seconds at most (None: until every VM is done). Ctrl-C stops waiting (each VM not
    done says so; the batch goes on in the VMs). Returns the followers by VM.

    Raises:
        UsageError, ControlError, OSError: as :func:`issue_batch` (nothing was appended).
    """
    result, offsets = issue_batch(logs, vms, everyone, kind, entries)
    followers = {vm: make(vm) for vm in result["targets"]}
    if result["pending"]:
        print(
            f"vmr-host: {few_names(result['pending'])}: not connected; the batch is sent at their next "
            "connection",
            file=sys.stderr,
        )
    try:
        follow(logs_dir(logs), result["id"], followers, offsets, wait)
    except KeyboardInterrupt:
        for f in followers.values():
            if not f.done:
                f.finish(f"stopped waiting (Ctrl-C); batch {result['id']} goes on in the VM")
    return followers


def outcome_code(followers: Mapping[str, VmFollow]) -> int:
    """The exit code of a command: 0 when every VM did what was asked, else 1."""
    return 1 if any(f.problem is not None for f in followers.values()) else 0


def piece_bytes(data: Mapping[str, Any]) -> bytes:
    """The bytes of one ``output`` event's piece (``line`` as UTF-8, or ``line_b64`` decoded;
    ``docs/events.md``), without the newline ``eol`` stands for."""
    if "line_b64" in data:
        try:
            return base64.b64decode(str(data["line_b64"]))
        except ValueError:
            return b"<undecodable line_b64>"
    return str(data.get("line", "")).encode("utf-8", "surrogateescape")
