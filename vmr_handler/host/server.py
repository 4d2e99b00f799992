"""``vmr-host serve``: one asyncio event loop serving every VM's channel (no thread per VM).

Two QEMU wirings (``docs/host.md``):

* **listen** (default): vmr-host listens on ``<channels>/<vm>.sock`` for each VM and QEMU
  connects as a client (``-chardev socket,id=c0,path=<channels>/<vm>.sock,reconnect=1``).
  One connection per VM socket at a time: a second concurrent one is closed and counted.
* **connect** (``--connect``): QEMU is the server (``server=on,wait=off``); vmr-host
  connects to ``<channels>/<vm>.sock`` and reconnects with exponential backoff
  (``tenacity``) whenever the socket is absent or the connection drops.
* **mqtt** (``--transport mqtt``): every VM over one broker connection
  (:mod:`vmr_handler.host.mqtt`, ``docs/mqtt.md``); no channel sockets.

The server owns the experiment: the :class:`~vmr_handler.host.barrier.Barrier`, the
RESUMEs issued, and their persistence in ``<logs>/experiment.json``; it hands each VM's
bytes to that VM's :class:`~vmr_handler.host.session.VmSession`. The control socket
``<logs>/vmr-host.sock`` (mode 0600) answers ``status``, ``resume`` and ``release``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import stat
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Set

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from vmr_handler import __version__
from vmr_handler.core.control import MAX_SOCKET_PATH, ControlServer
from vmr_handler.core.errors import ControlError, HostSetupError, ResourceRefused
from vmr_handler.core.events import Event
from vmr_handler.core.names import VM_NAME
from vmr_handler.core.protocol import RESUME, START_TIME
from vmr_handler.host.barrier import Barrier
from vmr_handler.host.config import HostConfig, control_socket_path
from vmr_handler.host.http import NoteFn, ResourceHttp
from vmr_handler.host.resources import ResourceStore
from vmr_handler.host.session import HostEvents, VmSession
from vmr_handler.host.store import ExperimentStore, TransferStore, VmLog

log = logging.getLogger("vmr_handler.host")

LOCK_FILE = "vmr-host.lock"
#: Barrier placeholder of a host that has not announced its VMs yet (never a VM name).
PEER_PREFIX = "host:"
#: Seconds a debounced save or announcement may wait (:meth:`HostServer._soon`).
DEBOUNCE = 0.2
#: Most VMs one peer host may announce.
MAX_PEER_VMS = 100_000
READ_SIZE = 64 * 1024
STATE_VERSION = 1


def channel_path(channels: str, vm: str) -> str:
    """``<channels>/<vm>.sock`` as an absolute path."""
    return os.path.join(os.path.abspath(channels), vm + ".sock")


class StreamLink:
    """A :class:`~vmr_handler.host.session.Link` over an asyncio stream writer.

    Args:
        writer: the connection's writer.
        limit: bytes queued towards a peer that does not read before the link closes itself.
        on_overflow: called once when that happens.
    """

    def __init__(self, writer: asyncio.StreamWriter, limit: int, on_overflow: Any) -> None:
        self.writer = writer
        self.limit = limit
        self.on_overflow = on_overflow
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once closed (by either side)."""
        return self._closed or self.writer.is_closing()

    def send_bytes(self, data: bytes) -> None:
        """Queue ``data``; close the link if the peer lets more than ``limit`` bytes pile up."""
        if self.closed:
            return
        self.writer.write(data)
        if self.writer.transport.get_write_buffer_size() > self.limit:
            self.on_overflow()
            self.close()

    async def drain(self) -> None:
        """Wait for the write buffer to drain (raises ConnectionError when the peer is gone)."""
        if self.closed:
            raise ConnectionResetError("link closed")
        await self.writer.drain()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self._closed:
            self._closed = True
            self.writer.close()


class ResumeRecord:
    """A RESUME the operator issued: one id for every target VM.

    Attributes:
        id: event id (stable across host restarts; the agent applies each id once).
        at: host experiment seconds (``-inf`` before the start time is set).
        issued: UTC epoch seconds when it was issued.
        targets: VM names it was sent to.
        answered: VM name -> the agent's answer (status, details, ended_break, ignored, received).
    """

    def __init__(
        self, id: str, at: float, issued: float, targets: List[str], answered: Dict[str, Any]
    ) -> None:
        self.id = id
        self.at = at
        self.issued = issued
        self.targets = targets
        self.answered = answered

    def event(self) -> Event:
        """The ``resume`` event (the same every time it is sent)."""
        return Event(RESUME, self.issued, self.id, {"at": self.at if math.isfinite(self.at) else "-inf"})

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe form for ``experiment.json``."""
        return {
            "id": self.id,
            "at": self.at if math.isfinite(self.at) else "-inf",
            "issued": self.issued,
            "targets": self.targets,
            "answered": self.answered,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResumeRecord:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: bad shape.
        """
        at = float(d["at"])
        if math.isnan(at) or at == math.inf:
            raise ValueError(f"bad resume time {d['at']!r}")
        targets = d["targets"]
        answered = d.get("answered", {})
        if not isinstance(targets, list) or not isinstance(answered, dict):
            raise ValueError("bad resume record")
        return cls(str(d["id"]), at, float(d["issued"]), [str(t) for t in targets], dict(answered))


class HostServer:
    """Serves every VM of ``config`` on one event loop.

    Call :meth:`open` (synchronous set-up: directories, state, logs replay), then
    ``await`` :meth:`run` until the ``stop`` event is set.

    Args:
        config: what ``vmr-host serve`` was told.
    """

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.limits = config.limits
        self.events = HostEvents()
        self.store = ExperimentStore(config.logs)
        self.barrier = Barrier(self.barrier_expected(), config.start_buffer)
        #: peer host id -> the VMs it announced (coordinator)
        self.peer_vms: Dict[str, List[str]] = {}
        self.start_id: Optional[str] = None
        self.start_set_at: Optional[float] = None
        self.resumes: List[ResumeRecord] = []
        self.sessions: Dict[str, VmSession] = {}
        self.resources = ResourceStore(config.resources)
        self.http: Optional[ResourceHttp] = None  # with --http
        self._opened = False
        self._loading = False
        self._servers: List[asyncio.AbstractServer] = []
        self._tasks: List[asyncio.Task[None]] = []
        self._sockets: List[str] = []
        self._control: Optional[ControlServer] = None
        self._lock_fd: Optional[int] = None
        self.mqtt: Any = None  # the MqttService in mqtt mode
        self.fatal: Optional[str] = None  # why serving stopped by itself
        self._pending_jobs: Set[str] = set()  # debounced jobs (_soon)

    @property
    def mode(self) -> str:
        """``listen``, ``connect`` or ``mqtt``."""
        if self.config.mqtt is not None:
            return "mqtt"
        return "connect" if self.config.connect else "listen"

    # ------------------------------------------------------------------ set-up
    def check_paths(self) -> None:
        """Every unix socket path fits (< 108 bytes).

        Raises:
            HostSetupError: (exit 2) naming the first path that is too long.
        """
        try:
            control_socket_path(self.config.logs)
        except ControlError as exc:
            raise HostSetupError(str(exc), 2) from exc
        for vm in sorted(self.config.vms) if self.mode != "mqtt" else []:
            path = channel_path(self.config.channels, vm)
            if len(path.encode()) > MAX_SOCKET_PATH:
                raise HostSetupError(
                    f"channel socket path {path} is {len(path.encode())} bytes, longer than the unix "
                    f"socket limit of {MAX_SOCKET_PATH}; use a shorter --channels directory",
                    2,
                )

    def open(self) -> None:
        """Create directories, restore ``experiment.json``, replay every VM's ``.jsonl``.

        Raises:
            HostSetupError: a path is too long (exit 2), or the state cannot be read or the
                directories cannot be made (exit 1).
        """
        self.check_paths()
        cfg = self.config
        try:
            os.makedirs(cfg.logs, mode=0o750, exist_ok=True)
            self._lock_logs()
            if self.mode == "listen":
                os.makedirs(cfg.channels, mode=0o750, exist_ok=True)
            saved = self.store.load()
            self._restore(saved)
        except OSError as exc:
            raise HostSetupError(f"cannot prepare {cfg.logs}: {exc}") from exc
        except ValueError as exc:
            raise HostSetupError(f"cannot restore the experiment state: {exc}") from exc
        if cfg.http is not None:  # tokens now: the schedule events carry them
            streams = self.limits.resource_streams
            self.http = ResourceHttp(cfg.http, cfg.vms, self.resources, cfg.logs, streams)
        resource_info = self._resource_info()
        self._loading = True
        try:
            for name, spec in sorted(cfg.vms.items()):
                vmlog = VmLog(cfg.logs, name, self.limits.log_quota)
                transfers = TransferStore(
                    cfg.logs, name, self.limits.transfer_file, self.limits.transfer_total
                )
                session = VmSession(
                    spec,
                    name in cfg.expected,
                    self.limits,
                    vmlog,
                    transfers,
                    self.resources,
                    self,
                    self.events,
                    resource_info.get(name, {}),
                    self.http.schedule_data(name) if self.http is not None else None,
                )
                self.sessions[name] = session
                try:
                    transfers.open()
                    vmlog.open(replay=session.apply)
                except OSError as exc:
                    raise HostSetupError(f"cannot open the logs of {name}: {exc}") from exc
        finally:
            self._loading = False
        if self.http is not None:  # uploads over HTTP(S) go to the same stores as transfer_chunk
            self.http.transfers = {name: s.transfers for name, s in self.sessions.items()}
        if self.barrier.start_time is not None and self.start_id is None:
            self._mark_start()
        self._save()
        self._opened = True

    def _lock_logs(self) -> None:
        """Hold ``<logs>/vmr-host.lock`` for the life of the process (one host per logs dir).

        Raises:
            HostSetupError: another vmr-host holds it (exit 1).
        """
        import fcntl

        path = os.path.join(self.config.logs, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            logs = os.path.abspath(self.config.logs)
            raise HostSetupError(
                f"another vmr-host is running with --logs {logs} ({path} is locked)"
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _restore(self, saved: Mapping[str, Any]) -> None:
        cfg = self.config
        if not saved:
            return
        barrier = saved.get("barrier", {})
        if not isinstance(barrier, Mapping):
            raise ValueError("'barrier' must be an object")
        self.barrier = Barrier.from_dict(barrier, self.barrier_expected(), cfg.start_buffer)
        start_id = saved.get("start_time_id")
        self.start_id = start_id if isinstance(start_id, str) and start_id else None
        set_at = saved.get("start_set_at")
        self.start_set_at = float(set_at) if isinstance(set_at, (int, float)) else None
        resumes = saved.get("resumes", [])
        if not isinstance(resumes, list):
            raise ValueError("'resumes' must be a list")
        try:
            self.resumes = [ResumeRecord.from_dict(r) for r in resumes]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"bad resume record: {exc}") from exc
        if self.barrier.start_time is not None:
            log.info("restored experiment start time %.3f", self.barrier.start_time)

    def _resource_info(self) -> Dict[str, Dict[str, Dict[str, Any]]]:
        """Per VM: ``{filename: {"size", "sha256"[, "url"]}}`` of the resources its schedule names
        (``url`` with ``--http``: the agent fetches them over HTTP(S) instead of the channel)."""
        out: Dict[str, Dict[str, Dict[str, Any]]] = {}
        for name, spec in self.config.vms.items():
            info: Dict[str, Dict[str, Any]] = {}
            for filename in sorted(spec.filenames):
                try:
                    r = self.resources.info(filename)
                except ResourceRefused as exc:
                    log.warning("%s: %s (the agent will be refused it)", name, exc)
                    continue
                info[filename] = {"size": r.size, "sha256": r.sha256}
                if self.http is not None:
                    info[filename]["url"] = self.http.url(name, filename)
            out[name] = info
        return out

    # ------------------------------------------------------------------ several hosts
    def barrier_expected(self) -> Set[str]:
        """What the barrier waits for: this host's expected VMs, plus ``host:<peer>`` for each
        peer not yet announced (coordinator) or ``host:coordinator`` (member: never decides)."""
        cfg = self.config
        names = set(cfg.expected)
        if cfg.role == "coordinator":
            names |= {PEER_PREFIX + p for p in cfg.peers}
        elif cfg.role == "member":
            names.add(PEER_PREFIX + "coordinator")
        return names

    def host_state(self) -> Dict[str, Any]:
        """This host's announcement to the coordinator (member): its VMs and their configured
        times (UTC, this host's clock; hosts sharing a broker keep NTP time)."""
        own = set(self.config.expected) - self.barrier.excluded
        return {
            "host": self.config.host_id,
            "expected": sorted(own),
            "configured": {vm: t for vm, t in sorted(self.barrier.configured.items()) if vm in own},
            "sent_at": time.time(),
        }

    def on_peer_state(self, peer: str, doc: Mapping[str, Any]) -> None:
        """A peer host's announcement (coordinator): wait for its VMs, take their configured times.

        Bad input (not a listed peer, wrong shapes, bad names) is logged and ignored.
        """
        if self.config.role != "coordinator":
            return
        if peer not in self.config.peers:
            log.warning("announcement from host %r ignored: not a --peers host", peer)
            return
        expected, configured = doc.get("expected"), doc.get("configured")
        if not isinstance(expected, list) or not isinstance(configured, dict) or len(expected) > MAX_PEER_VMS:
            log.warning("malformed announcement from host %r ignored", peer)
            return
        names = [n for n in expected if isinstance(n, str) and VM_NAME.match(n)]
        elsewhere = set(self.config.vms).union(*(vs for p, vs in self.peer_vms.items() if p != peer))
        clash = sorted(set(names) & elsewhere)
        if clash:
            log.error("host %r announces VM(s) served elsewhere: %s; ignored", peer, ", ".join(clash))
            return
        if self.peer_vms.get(peer) != sorted(names):
            log.warning("host %s serves %d VM(s): %s", peer, len(names), ", ".join(sorted(names)[:20]))
        self.peer_vms[peer] = sorted(names)
        just_set = self.barrier.update_expected(add=names, remove=[PEER_PREFIX + peer])
        for vm, at in configured.items():
            if vm in names and isinstance(at, (int, float)) and vm not in self.barrier.configured:
                just_set = self.barrier.configure(vm, float(at)) or just_set
        if just_set:
            self._start_was_set()
        else:
            self._save()

    def on_coordinator_start(self, doc: Mapping[str, Any]) -> None:
        """The coordinator's start (member): adopt it unless it is stale.

        A retained start left from an earlier run of the same experiment name would name this
        host's VMs as configured at times this host never saw: such a start is ignored.
        """
        if self.config.role != "member" or self.barrier.start_time is not None:
            return
        start, configured = doc.get("start_time"), doc.get("configured")
        released = doc.get("released") or []
        if (
            not isinstance(start, (int, float))
            or isinstance(start, bool)
            or not math.isfinite(start)
            or not isinstance(configured, dict)
            or not isinstance(released, list)
        ):
            log.warning("malformed start from the coordinator ignored")
            return
        if PEER_PREFIX + str(self.config.host_id) in released:
            released = list(self.config.expected)  # released before this host announced its VMs
        for vm in self.config.expected:
            if vm in released:
                continue
            mine, theirs = self.barrier.configured.get(vm), configured.get(vm)
            if mine is None or not isinstance(theirs, (int, float)) or abs(theirs - mine) > 0.001:
                log.warning("start from the coordinator ignored: it does not match %s (stale?)", vm)
                return
        self.barrier.restore_start(float(start))
        self._start_was_set()

    def start_announcement(self) -> Optional[Dict[str, Any]]:
        """The start as the coordinator publishes it to member hosts (None before it is set)."""
        b = self.barrier
        if b.start_time is None:
            return None
        return {
            "start_time": b.start_time,
            "configured": dict(sorted(b.configured.items())),
            "released": sorted(b.released | b.excluded),
            "coordinator": self.config.host_id,
        }

    def state_dict(self) -> Dict[str, Any]:
        """What ``experiment.json`` holds."""
        return {
            "version": STATE_VERSION,
            "host_version": __version__,
            "barrier": self.barrier.to_dict(),
            "start_time_id": self.start_id,
            "start_set_at": self.start_set_at,
            "resumes": [r.to_dict() for r in self.resumes],
        }

    def _save(self) -> None:
        try:
            self.store.save(self.state_dict())
        except OSError as exc:
            log.error("cannot save %s: %s", self.store.path, exc)

    # ------------------------------------------------------------------ HostApi
    def start_event(self) -> Optional[Event]:
        """The ``start_time`` event (stable id), or None before the start is set."""
        start = self.barrier.start_time
        if start is None or self.start_id is None:
            return None
        return Event(START_TIME, self.start_set_at or start, self.start_id, {"start_time": start})

    def pending_resumes(self, vm: str) -> List[Event]:
        """``resume`` events issued to ``vm`` and not yet answered, oldest first."""
        return [r.event() for r in self.resumes if vm in r.targets and vm not in r.answered]

    def on_configured(self, vm: str, at: float) -> None:
        """Record ``vm`` configured at host UTC ``at``; set and announce the start when it was the last."""
        if vm in self.barrier.configured:
            return
        just_set = self.barrier.configure(vm, at)
        if vm in self.barrier.active:
            waiting = self.barrier.waiting_for()
            log.info("%s configured; barrier waits for %s", vm, ", ".join(waiting) or "nobody")
        if just_set:
            self._start_was_set()
        elif not self._loading:
            # the .jsonl holds the `configured` report: a host killed before this save replays it
            self._soon("save", self._save)
        if self.mqtt is not None and not self._loading:
            self._soon("announce", self.mqtt.publish_host_state)

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        """``vm`` answered RESUME ``resume_id``: record it (it is no longer re-sent to ``vm``)."""
        for r in self.resumes:
            if r.id == resume_id and vm in r.targets and vm not in r.answered:
                r.answered[vm] = {
                    "status": data.get("status"),
                    "details": data.get("details"),
                    "ended_break": data.get("ended_break"),
                    "ignored": data.get("ignored"),
                    "received": at,
                }
                if not self._loading:
                    self._soon("save", self._save)  # the answer is in the .jsonl (replayed)
                return

    def _soon(self, key: str, job: Any) -> None:
        """Run ``job`` once within :data:`DEBOUNCE` s, however often this is called meanwhile.

        Saving ``experiment.json`` (and announcing a member's VMs) per VM event made a burst
        of N events cost O(N²) (measured: 1000 VMs configuring kept the loop busy 6-15 s).
        Only state that the per-VM logs also hold is saved this way; the start time and
        RESUMEs issued are saved at once. Without a running event loop it runs now.
        """
        if key in self._pending_jobs:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            job()
            return

        def run() -> None:
            self._pending_jobs.discard(key)
            job()

        self._pending_jobs.add(key)
        loop.call_later(DEBOUNCE, run)

    def _mark_start(self) -> None:
        self.start_id = f"start-{uuid.uuid4().hex[:16]}"
        self.start_set_at = time.time()

    def _start_was_set(self) -> None:
        self._mark_start()
        self._save()
        start = self.barrier.start_time
        log.warning(
            "experiment start time set: %.3f UTC (%s); sent to every connected VM",
            start,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start or 0)),
        )
        if not self._loading:
            for s in self.sessions.values():
                s.push_start_time()
            if self.mqtt is not None:
                self.mqtt.publish_start()

    @property
    def signs(self) -> bool:
        """True when ``--signing-key`` was given: schedule, start time and RESUME are signed."""
        return self.config.signing_key is not None

    def sign_for(self, vm: str, event: Event) -> Event:
        """``event`` as sent to ``vm`` now: signed for ``vm`` with the host key (SPEC §7), or
        unchanged without a key. Signed at every send, so a resend is fresh."""
        if self.config.signing_key is None:
            return event
        from vmr_handler.core.signing import sign

        return sign(self.config.signing_key, event, vm, time.time())

    # ------------------------------------------------------------------ control
    def cmd_status(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``status``: the experiment and every VM."""
        now = time.time()
        b = self.barrier
        return {
            "now": now,
            "host_version": __version__,
            "mode": self.mode,
            "role": self.config.role,
            "host_id": self.config.host_id,
            "peers": {p: self.peer_vms.get(p) for p in sorted(self.config.peers)},
            "logs": os.path.abspath(self.config.logs),
            "channels": None if self.mode == "mqtt" else os.path.abspath(self.config.channels),
            "broker": self.config.mqtt.broker if self.config.mqtt is not None else None,
            "experiment": {
                "start_time": b.start_time,
                "start_in": None if b.start_time is None else b.start_time - now,
                "start_buffer": b.buffer,
                "expected": sorted(b.expected),
                "configured": dict(sorted(b.configured.items())),
                "waiting_for": b.waiting_for(),
                "excluded": sorted(b.excluded),
                "released": sorted(b.released),
                "released_at": b.released_at,
            },
            "resumes": [r.to_dict() for r in self.resumes],
            "vms": [s.status(b.start_time, now) for _n, s in sorted(self.sessions.items())],
        }

    def _names(self, value: Any, what: str) -> List[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"'{what}' must be a list of VM names")
        unknown = sorted(set(value) - set(self.sessions))
        if unknown:
            raise ValueError(
                f"unknown VM(s): {', '.join(unknown)} (served: {', '.join(sorted(self.sessions))})"
            )
        return list(dict.fromkeys(value))

    def cmd_resume(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``resume`` ``{"vms": [...]}`` or ``{"all": true}``: issue a RESUME stamped with host
        experiment time ``at = now - start`` (``-inf`` before the start is set).

        Raises:
            ValueError: neither or both of ``vms``/``all``, or an unknown VM.
        """
        everyone = request.get("all") is True
        if everyone == ("vms" in request and request["vms"] not in (None, [])):
            raise ValueError("resume needs VM names or all (not both)")
        targets = sorted(self.sessions) if everyone else self._names(request.get("vms"), "vms")
        now = time.time()
        start = self.barrier.start_time
        at = -math.inf if start is None else now - start
        record = ResumeRecord(f"resume-{uuid.uuid4().hex[:16]}", at, now, targets, {})
        self.resumes.append(record)
        self._save()
        event = record.event()
        sent = [vm for vm in targets if self.sessions[vm].push_resume(event)]
        log.warning("RESUME %s at experiment time %s to %s", record.id, event.data["at"], ", ".join(targets))
        return {
            "id": record.id,
            "at": record.at,
            "targets": targets,
            "sent_now": sent,
            "pending": [vm for vm in targets if vm not in sent],
        }

    def cmd_release(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``release`` ``{"exclude": [...]}``: start without the named VMs (or without every
        VM still missing when the list is empty).

        Raises:
            ValueError: the start is already set, or a name is not an expected VM.
        """
        exclude = request.get("exclude") or []
        if not isinstance(exclude, list) or not all(isinstance(v, str) for v in exclude):
            raise ValueError("'exclude' must be a list of VM names")
        if self.config.role == "member":
            raise ValueError("this host is a member: release the barrier on the coordinator host")
        start = self.barrier.release(time.time(), exclude)
        if start is not None:
            self._start_was_set()
        else:
            self._save()
        b = self.barrier
        return {
            "start_time": b.start_time,
            "waiting_for": b.waiting_for(),
            "excluded": sorted(b.excluded),
            "released": sorted(b.released),
        }

    # ------------------------------------------------------------------ serving
    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then close everything cleanly.

        Raises:
            HostSetupError: a socket cannot be bound (in use by another process: exit 1; a
                non-socket file in the way: exit 2).
        """
        if not self._opened:
            self.open()
        _raise_fd_limit(5 * len(self.sessions) + 64)
        try:
            self._control = ControlServer(
                self.config.logs,
                {"status": self.cmd_status, "resume": self.cmd_resume, "release": self.cmd_release},
                path=control_socket_path(self.config.logs),
            )
            await self._control.start()
        except ControlError as exc:
            raise HostSetupError(str(exc).replace("vmr-handler", "vmr-host")) from exc
        except OSError as exc:
            raise HostSetupError(f"cannot bind the control socket: {exc}") from exc
        try:
            if self.http is not None:
                self.http.start(self._http_notes(asyncio.get_running_loop()))
            if self.config.mqtt is not None:
                from vmr_handler.host.mqtt import MqttService

                self.mqtt = MqttService(self, self.config.mqtt, self.config.host_id)
                self._tasks.append(asyncio.ensure_future(self._watch(self.mqtt.run(), stop)))
            elif self.config.connect:
                for vm in sorted(self.sessions):
                    self._tasks.append(asyncio.ensure_future(self._connector(vm)))
            else:
                for vm in sorted(self.sessions):
                    await self._listen(vm)
            self._tasks.append(asyncio.ensure_future(self._ticker()))
            log.warning(
                "vmr-host %s serving %d VM(s) (%s mode, %s); barrier waits for %s",
                __version__,
                len(self.sessions),
                self.mode,
                f"broker {self.config.mqtt.broker}"
                if self.config.mqtt is not None
                else f"channels {os.path.abspath(self.config.channels)}",
                ", ".join(self.barrier.waiting_for()) or "nobody",
            )
            await stop.wait()
        finally:
            await self._shutdown()

    def _http_notes(self, loop: asyncio.AbstractEventLoop) -> NoteFn:
        """The thread-safe ``note`` of the HTTP resource server: on the loop, a download or a
        refusal goes to the VM's counters and (``text`` not None) its readable log."""

        def apply(vm: str, text: Optional[str], outcome: str) -> None:
            s = self.sessions.get(vm)
            if s is None:
                return
            if outcome == "served":
                s.counters.resources_served += 1
            elif outcome == "refused":
                s.counters.resources_refused += 1
            elif outcome == "upload_refused":  # a transfer out refused over HTTP(S)
                s.counters.transfer_refused += 1
            if text is not None:
                s.log.note(text, time.time())
                if outcome not in ("refused", "upload_refused"):  # logged, rate-limited, by the HTTP server
                    log.info("%s: %s", vm, text)

        def note(vm: str, text: Optional[str], outcome: str) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the host is gone
                loop.call_soon_threadsafe(apply, vm, text, outcome)

        return note

    async def _watch(self, job: Any, stop: asyncio.Event) -> None:
        """Run ``job``; if it fails for good (e.g. the broker refuses this host), log and stop."""
        try:
            await job
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.fatal = str(exc)
            log.error("%s", exc)
            stop.set()

    async def _listen(self, vm: str) -> None:
        path = channel_path(self.config.channels, vm)
        _clear_stale_socket(path)

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve_connection(vm, reader, writer)

        old_umask = os.umask(0o117)
        try:
            server = await asyncio.start_unix_server(accept, path=path)
        except OSError as exc:
            raise HostSetupError(f"cannot listen on {path}: {exc}") from exc
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o660)
        self._servers.append(server)
        self._sockets.append(path)

    async def _serve_connection(
        self, vm: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        session = self.sessions[vm]

        def overflow() -> None:
            session.counters.write_overflow += 1
            log.warning(
                "%s: peer does not read; %d bytes queued: connection dropped", vm, self.limits.write_buffer
            )

        link = StreamLink(writer, self.limits.write_buffer, overflow)
        if not session.attach(link, time.time()):
            link.close()
            return
        log.info("%s: connected", vm)
        reason = "closed by peer"
        try:
            while not link.closed:
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                session.feed(data, time.time())
                pause = session.read_pause(len(data))
                if pause > 0:
                    await asyncio.sleep(min(pause, 1.0))
            if link.closed and reason == "closed by peer":
                reason = "closed by host"
        except (ConnectionError, OSError) as exc:
            reason = f"error: {exc}"
        except asyncio.CancelledError:
            reason = "host stopping"
            raise
        except Exception as exc:  # a bug must not take the host (or other VMs) down
            reason = f"internal error: {type(exc).__name__}: {exc}"
            log.exception("%s: internal error handling input; connection dropped", vm)
        finally:
            session.detach(link, time.time(), reason)
            link.close()
            log.info("%s: disconnected (%s)", vm, reason)

    async def _connector(self, vm: str) -> None:
        path = channel_path(self.config.channels, vm)
        initial, maximum = self.config.reconnect
        while True:
            failures = 0

            def note_failure(retry_state: Any) -> None:
                nonlocal failures
                failures += 1
                if failures == 1:
                    exc = retry_state.outcome.exception() if retry_state.outcome else None
                    log.info("%s: cannot connect to %s (%s); retrying with backoff", vm, path, exc)

            reader: Optional[asyncio.StreamReader] = None
            writer: Optional[asyncio.StreamWriter] = None
            async for attempt in AsyncRetrying(
                wait=wait_exponential_jitter(initial=initial, max=maximum, jitter=initial),
                retry=retry_if_exception_type(OSError),
                before_sleep=note_failure,
                reraise=True,
            ):
                with attempt:
                    reader, writer = await asyncio.open_unix_connection(path)
            assert reader is not None and writer is not None
            await self._serve_connection(vm, reader, writer)
            await asyncio.sleep(initial)

    async def _ticker(self) -> None:
        period = min(1.0, self.limits.heartbeat / 2, self.limits.silent_after / 2)
        while True:
            await asyncio.sleep(period)
            now = time.time()
            for s in self.sessions.values():
                try:
                    s.tick(now)
                except Exception:  # never let one VM stop the heartbeats of all
                    log.exception("%s: tick failed", s.name)

    async def _shutdown(self) -> None:
        if self.http is not None:
            await asyncio.to_thread(self.http.stop)
        for s in self.sessions.values():
            if s.link is not None:
                s.link.close()
        for task in self._tasks:
            task.cancel()
        for server in self._servers:
            server.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0)
        for path in self._sockets:
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except OSError:
                pass
        if self._control is not None:
            await self._control.close()
        self._save()
        for s in self.sessions.values():
            s.log.close()


def _clear_stale_socket(path: str) -> None:
    """Remove a socket file left by a dead process; refuse when someone answers on it.

    Raises:
        HostSetupError: another process listens there (exit 1), or it is not a socket (exit 2).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise HostSetupError(f"{path} exists and is not a socket; remove it or choose other --channels", 2)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise HostSetupError(
        f"{path} is in use by another process (is another vmr-host or a QEMU in server mode using it? "
        "for QEMU as the server use --connect)"
    )


def _raise_fd_limit(needed: int) -> None:
    """Raise the soft open-files limit towards ``needed`` (listener, connection, two logs per VM)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError) as exc:
        log.warning("cannot raise the open-files limit to %d: %s", needed, exc)
