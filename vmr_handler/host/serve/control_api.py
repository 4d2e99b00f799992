"""The requests ``vmr-host status|resume|release|kill`` send to the control socket
``<logs>/vmr-host.sock`` (:class:`~vmr_handler.core.control.ControlServer`): one handler per
command (:meth:`ControlApi.handlers`), each taking the request dict and returning the answer
dict; a :class:`~vmr_handler.core.errors.RequestRefused`, or a refusal the command declares,
becomes the error answer.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

from vmr_handler import __version__
from vmr_handler.core.errors import EntryNotRunning, RequestRefused, VmNotConnected
from vmr_handler.core.readable import duration, few_names, unknown_text
from vmr_handler.core.schedule.appended import read_batch
from vmr_handler.core.schedule.model import entry_drops
from vmr_handler.host.control.commands import COMMANDS, ControlCommand, validate
from vmr_handler.host.serve.experiment.appendbook import issue_batch
from vmr_handler.host.serve.experiment.experiment import Experiment

if TYPE_CHECKING:
    from vmr_handler.core.control import Handler

#: Per target VM, the ``{filename: {"size", "sha256"}}`` of the files a batch drops, from the
#: target VMs and the batch's drops (file name -> entry indices); raises ``ResourcesMissing``.
ResourceInfo = Callable[[List[str], Mapping[str, Sequence[int]]], Dict[str, Dict[str, Dict[str, Any]]]]


class ControlApi:
    """Answers control requests about ``experiment`` and its VMs.

    Args:
        experiment: the experiment (its config, barrier, RESUMEs and the VMs' sessions).
        mode: ``listen``, ``connect`` or ``mqtt`` (shown by ``status``).
        resource_info: checks and describes the files a batch drops (the server's); None: a
            batch is sent without them.
    """

    def __init__(
        self,
        experiment: Experiment,
        mode: str,
        resource_info: Optional[ResourceInfo] = None,
    ) -> None:
        self.experiment = experiment
        self.mode = mode
        self.resource_info = resource_info

    def handlers(self) -> Dict[str, Handler]:
        """Command name -> its handler: the method of that name of every command declared in
        :data:`vmr_handler.host.control.commands.COMMANDS`, the request validated against the
        declaration first (an unknown field or one of the wrong kind refused, defaults filled)."""

        def checked(command: ControlCommand) -> Handler:
            answer: Handler = getattr(self, command.name)

            def handler(request: Dict[str, Any]) -> Dict[str, Any]:
                try:
                    return answer(validate(command, request))
                except command.refusals as exc:  # declared: the socket answers them as refused
                    raise RequestRefused(str(exc)) from exc

            return handler

        return {name: checked(command) for name, command in COMMANDS.items()}

    def schedule_add(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``schedule_add`` ``{"vms": [...] | "all": true, "path", "sha256"}``: append the entries
        of the schedule file at ``path`` (on this host; its sha256 as the CLI read it) to the
        VMs' running schedules (:mod:`vmr_handler.host.serve.experiment.appendbook`).

        Raises:
            RequestRefused: bad targets; the file cannot be read, changed since the CLI read it, is
                too big, or is not a valid schedule (the loader's message, naming the entry and
                field); ``ResourcesMissing``: a ``filename`` drop the host does not have (every
                such file, with the VMs and entries that need it). Nothing is appended.
        """
        targets = self._targets(request, "schedule add")
        path = str(request.get("path"))
        raw, batch = read_batch(path, self.experiment.config.allow_classes)
        if hashlib.sha256(raw).hexdigest() != request.get("sha256"):
            raise RequestRefused(f"{path} changed since it was read; run the command again")
        drops = entry_drops(batch.entries)
        resources = self.resource_info(targets, drops) if self.resource_info else {vm: {} for vm in targets}
        x = self.experiment
        try:
            record, sent = issue_batch(
                x.appends, x.sessions, raw, batch.source_format, len(batch.entries), targets, resources,
                x.clock.time(),
            )  # fmt: skip
        except OSError as exc:
            raise RequestRefused(f"cannot keep the batch in {x.config.logs}: {exc}") from exc
        pending = [vm for vm in targets if vm not in sent]
        return {"id": record.id, "entries": len(batch.entries), "targets": targets, "sent_now": sent,
                "pending": pending}  # fmt: skip

    def _targets(self, request: Dict[str, Any], what: str) -> List[str]:
        """The VMs of ``{"vms": [...]}`` or ``{"all": true}``.

        Raises:
            RequestRefused: neither or both, or an unknown VM.
        """
        everyone = request.get("all") is True
        if everyone == ("vms" in request and request["vms"] not in (None, [])):
            raise RequestRefused(f"{what} needs VM names or all (not both)")
        return sorted(self.experiment.sessions) if everyone else self._names(request.get("vms"), "vms")

    def status(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``status``: the experiment and every VM."""
        now = self.experiment.clock.time()
        x = self.experiment
        cfg = x.config
        return {
            "now": now,
            "host_version": __version__,
            "mode": self.mode,
            "role": cfg.role,
            "host_id": cfg.host_id,
            "peers": {p: x.peer_vms.get(p) for p in sorted(cfg.peers)},
            "logs": os.path.abspath(cfg.logs),
            "channels": None if self.mode == "mqtt" else os.path.abspath(cfg.channels),
            "broker": cfg.mqtt.broker if cfg.mqtt is not None else None,
            "experiment": x.barrier_status(now),
            "resumes": [r.to_dict() for r in x.resumes],
            "vms": [s.status(x.barrier.start_time, now) for _n, s in sorted(x.sessions.items())],
        }

    def _names(self, value: Any, what: str) -> List[str]:
        sessions = self.experiment.sessions
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RequestRefused(f"'{what}' must be a list of VM names")
        unknown = sorted(set(value) - set(sessions))
        if unknown:
            raise RequestRefused(unknown_text(unknown, sorted(sessions)))
        return list(dict.fromkeys(value))

    def resume(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``resume`` ``{"vms": [...]}`` or ``{"all": true}``: issue a RESUME stamped with host
        experiment time ``at = now - start`` (``-inf`` before the start is set).

        One rule (SPEC sections 4 and 8): a RESUME ends the break a VM is at, else its agent
        ignores it and reports it ignored. So ``all`` resumes the VMs at a break and leaves the
        others out (``not_at_break``); VMs named must all be at a break. ``"force": true`` sends
        it to every VM named (or all) whatever the host last heard: a VM at no break ignores
        it, unless a break became active there before its report reached the host.
        ``"dry_run": true`` says whom it would reach (``targets``) and which break each is held
        at (``at_break``), or is refused as the RESUME would be; nothing is sent.

        Raises:
            RequestRefused: neither or both of ``vms``/``all``, an unknown VM, and without
                ``force``: a VM named that is not at a break, or ``all`` with no VM at a break.
        """
        targets = self._targets(request, "resume")
        sessions = self.experiment.sessions
        breaks = {vm: sessions[vm].state.at_break for vm in targets}
        at_break = {vm: b["index"] for vm, b in breaks.items() if b is not None}
        not_at_break = [vm for vm in targets if vm not in at_break]
        if request.get("force") is not True:
            targets = _resumable(targets, at_break, not_at_break, everyone=request.get("all") is True)
        if request.get("dry_run") is True:
            return {"dry_run": True, "targets": targets, "at_break": at_break, "not_at_break": not_at_break}
        record, sent = self.experiment.resume(targets)
        return {
            "id": record.id,
            "at": record.at,
            "targets": targets,
            "sent_now": sent,
            "pending": [vm for vm in targets if vm not in sent],
            "at_break": at_break,
            "not_at_break": not_at_break,
        }

    def kill(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``kill`` ``{"vms": [...] | "all": true, "entry": N, "signal", "grace", "by"}``: end
        entry N's process tree in those VMs (their agents send ``SIG<signal>``, then SIGKILL to
        what is left after ``grace`` s; signed like a RESUME when the host has a key). VMs named
        must all be connected and running the entry; ``all`` kills it where it runs and lists the
        others (``not_running``). An entry of a negative stage may be killed: the stage ends when
        it ends and the next begins (said in ``stage``).

        Raises:
            RequestRefused: neither or both of ``vms``/``all``, an unknown VM, no ``entry``.
            VmNotConnected: a VM named is not connected (lost or not heard from): nothing is sent.
            EntryNotRunning: a VM named does not run the entry (not started, or ended: how), or
                with ``all``, no VM runs it: nothing is sent.
        """
        targets = self._targets(request, "kill")
        index = request.get("entry")
        if index is None:
            raise RequestRefused("kill needs the entry's index (--entry N; vmr-host schedule VM lists them)")
        x = self.experiment
        why = {vm: _not_killable(x, vm, index) for vm in targets}
        if request.get("all") is not True:
            for problem in why.values():
                if problem is not None:
                    raise problem
        runs = [vm for vm in targets if why[vm] is None]
        if not runs:
            raise EntryNotRunning(f"entry {index} runs on no VM: " + "; ".join(str(e) for e in why.values()))
        record, sent = x.kills.issue(x.sessions, runs, index, request["signal"], request["grace"],
                                     request.get("by") or None, x.clock.time())  # fmt: skip
        return {
            "id": record.id,
            "entry": index,
            "signal": record.signal,
            "grace": record.grace,
            "targets": runs,
            "sent_now": sent,
            "not_running": {vm: str(e) for vm, e in why.items() if e is not None},
            "stage": {vm: note for vm in runs if (note := _stage_note(x, vm, index))},
        }

    def release(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``release`` ``{"exclude": [...]}``: start without the named VMs (or without every
        VM still missing when the list is empty).

        Raises:
            RequestRefused: ``exclude`` is not a list of names.
            BarrierError: this host is a member, the start is already set, or a name is not an
                expected VM.
        """
        exclude = request.get("exclude") or []
        if not isinstance(exclude, list) or not all(isinstance(v, str) for v in exclude):
            raise RequestRefused("'exclude' must be a list of VM names")
        self.experiment.release(exclude)
        b = self.experiment.barrier
        return {
            "start_time": b.start_time,
            "waiting_for": b.waiting_for(),
            "excluded": sorted(b.excluded),
            "released": sorted(b.released),
        }


def _resumable(
    targets: List[str], at_break: Mapping[str, int], not_at_break: List[str], everyone: bool
) -> List[str]:
    """The VMs a RESUME without ``force`` goes to: every VM at a break (``everyone``), or every
    VM named, which must all be at a break (SPEC section 4: a RESUME at no break is ignored).

    Raises:
        RequestRefused: a VM named is not at a break, or no VM at all is (``everyone``).
    """
    if everyone:
        if not at_break:
            raise RequestRefused(
                f"no VM is at a break ({few_names(not_at_break)}): nothing to resume, a RESUME now "
                "would be ignored. Send it anyway with --force (or --yes)"
            )
        return [vm for vm in targets if vm in at_break]
    if not_at_break:
        raise RequestRefused(
            f"not at a break: {few_names(not_at_break)}; a RESUME now would be ignored there. Send it "
            "anyway with --force (or --yes): it ends a break only if one began meanwhile; resume the "
            "VMs at a break with --all"
        )
    return targets


def _not_killable(x: Experiment, vm: str, index: int) -> Optional[Exception]:
    """Why ``vm``'s entry ``index`` cannot be killed now, as the error to refuse with, or None:
    its agent is not connected, or the entry is not running there (by what the VM reported)."""
    session = x.sessions[vm]
    if not (session.connected and session.handshaken):
        gone = session.presence().gone_for
        since = f" for {duration(gone)}" if gone is not None else ""
        return VmNotConnected(
            f"{vm} is not connected{since}: a kill cannot reach its agent, nothing is sent; "
            f"kill again once it is back (vmr-host status {vm} says CONN yes)"
        )
    state = session.state
    if index in state.running:
        return None
    ended = state.ended.get(index)
    if ended is not None:
        return EntryNotRunning(f"entry {index} is not running on {vm}: it ended ({ended[0]})")
    return EntryNotRunning(
        f"entry {index} is not running on {vm}: it has not started (or is no entry of its schedule: "
        f"vmr-host schedule {vm} lists them)"
    )


def _stage_note(x: Experiment, vm: str, index: int) -> Optional[str]:
    """What killing ``vm``'s running entry ``index`` does to its stage: in a negative stage (the
    VM is before the experiment start), the stage waits on it, so it ends when the entry ends
    and the next stage begins; None in positive time."""
    state = x.sessions[vm].state
    if state.stage_running and state.stage_time is not None and state.stage_time < 0:
        return (
            f"entry {index} belongs to stage {state.stage} (start_time {state.stage_time:g}), which waits "
            "on it: the stage ends when the entry ends, then the next stage begins"
        )
    return None
