"""``vmr-host serve``: one asyncio event loop serving every VM's channel (no thread per VM).

Three wirings of the channels (``docs/host.md``; :mod:`vmr_handler.host.serve.channels.factory`):

* **listen** (default): vmr-host listens on ``<channels>/<vm>.sock`` for each VM and QEMU
  connects as a client (``-chardev socket,id=c0,path=<channels>/<vm>.sock,reconnect=1``).
  One connection per VM socket at a time: a second concurrent one is closed and counted.
* **connect** (``--connect``): QEMU is the server (``server=on,wait=off``); vmr-host
  connects to ``<channels>/<vm>.sock`` and reconnects with exponential backoff
  (``tenacity``) whenever the socket is absent or the connection drops.
* **mqtt** (``--transport mqtt``): every VM over one broker connection
  (:mod:`vmr_handler.host.serve.channels.mqtt`, ``docs/mqtt.md``); no channel sockets.

The server owns the VMs' :class:`~vmr_handler.host.serve.session.session.VmSession`\\ s, their logs and the
:class:`~vmr_handler.host.serve.experiment.experiment.Experiment` (the barrier, the RESUMEs issued, and their
persistence in ``<logs>/experiment.json``); the channels hand each VM's bytes to its session.
The control socket ``<logs>/vmr-host.sock`` (mode 0600) answers ``status``, ``resume`` and
``release`` (:mod:`vmr_handler.host.serve.control_api`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Set

from vmr_handler import __version__
from vmr_handler.core.clock import Clock, SystemClock
from vmr_handler.core.control import ControlServer
from vmr_handler.core.errors import ControlError, HostSetupError, ResourceRefused, ResourcesMissing
from vmr_handler.host.logs.appendfiles import AppendFiles
from vmr_handler.host.logs.logsdir import control_socket_path, write_index
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.serve._fdlimit import ensure_fd_limit, fd_needs, readable_pool
from vmr_handler.host.serve.channels.factory import Channels, broker_publisher, channel_mode
from vmr_handler.host.serve.config import HostConfig, VmSpec
from vmr_handler.host.serve.control_api import ControlApi
from vmr_handler.host.serve.experiment.appendbook import AppendBook
from vmr_handler.host.serve.experiment.barrier import waiting_text
from vmr_handler.host.serve.experiment.experiment import Experiment
from vmr_handler.host.serve.experiment.hostentries import HostEntryRunner, schedule_lookup
from vmr_handler.host.serve.files.resources import (
    PUSHED_DIR,
    ResourceStore,
    batch_needs,
    find_missing,
    missing_text,
    missing_warning,
    schedule_needs,
)
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.http.common import NoteFn
from vmr_handler.host.serve.http.server import ResourceHttp
from vmr_handler.host.serve.session.api import HostEvents
from vmr_handler.host.serve.session.checkpoint import restore_session
from vmr_handler.host.serve.session.session import VmSession, save_checkpoint

log = logging.getLogger("vmr_handler.host")

LOCK_FILE = "vmr-host.lock"


class Companion(Protocol):
    """A service run alongside the serving process on its event loop (the operators' console
    of ``--console``): started once the channels serve, closed when the host stops."""

    async def start(self) -> None:
        """Start serving (bind its address...).

        Raises:
            HostSetupError: it cannot start; the host stops with this error.
        """

    async def close(self) -> None:
        """Stop serving and let go of what it holds."""


#: Makes a :class:`Companion` once the control API exists: ``make(experiment, control_api)``,
#: called in :meth:`HostServer.run` (so a companion's imports are paid only when it runs).
CompanionFactory = Callable[[Experiment, ControlApi], Companion]


class HostServer:
    """Serves every VM of ``config`` on one event loop.

    Call :meth:`open` (synchronous set-up: directories, state, logs replay), then
    ``await`` :meth:`run` until the ``stop`` event is set.

    Args:
        config: what ``vmr-host serve`` was told.
        channels: makes the guests' channels for the experiment (the CLI hands in
            :func:`vmr_handler.host.serve.channels.factory.open_channels`: unix sockets or the broker, by
            ``config``); the server never looks at the transport itself.
        clock: the host's clock, handed to every part with a timing rule (the experiment, the
            sessions, the event maker, the channels): :class:`~vmr_handler.core.clock.SystemClock`
            by default.
        companions: services run alongside, in order, once the channels serve (the CLI hands in
            the console's with ``--console``); closed in reverse order when the host stops.
    """

    def __init__(
        self,
        config: HostConfig,
        channels: Callable[[HostConfig, Experiment], Channels],
        clock: Optional[Clock] = None,
        companions: Sequence[CompanionFactory] = (),
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.clock: Clock = clock or SystemClock()
        self.events = HostEvents(self.clock)
        self.sessions: Dict[str, VmSession] = {}
        # --resources, and the files vmr-host push staged
        self.resources = ResourceStore(config.resources, os.path.join(config.logs, PUSHED_DIR))
        self._unserved: Set[str] = set()  # resources said to be missing (warned about once)
        appends = AppendBook(config.logs)  # batches appended to running VMs
        self.host_entries = HostEntryRunner(
            config.host_entries,
            config.logs,
            self.sessions,
            schedule_lookup(config.vms, config.allow_classes, appends),
            self.resources,
            self.events,
            specs=config.vms,
        )  # on_host entries, reached by the sessions through the experiment
        self.experiment = Experiment(
            config, self.sessions, self.clock, appends, self.host_entries, broker_publisher(config)
        )
        self.channels = channels(config, self.experiment)
        self.http: Optional[ResourceHttp] = None  # with --http
        self._opened = False
        self._tasks: List[asyncio.Task[None]] = []
        self._control: Optional[ControlServer] = None
        self._companion_factories = tuple(companions)
        self.companions: List[Companion] = []  # started, in order
        self._lock_fd: Optional[int] = None

    @property
    def mode(self) -> str:
        """``listen``, ``connect`` or ``mqtt``."""
        return channel_mode(self.config)

    @property
    def fatal(self) -> Optional[str]:
        """Why serving stopped by itself (e.g. the broker refused this host), else None."""
        return self.channels.fatal

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
        self.channels.check()

    def check_resources(self) -> None:
        """Every ``filename`` drop of the schedules is a file the host can serve (SPEC section 8);
        with ``--allow-missing-resources`` one warning per file that is not.

        Raises:
            HostSetupError: (exit 2) some are not, without ``--allow-missing-resources``: every
                such file once, with the VMs and entries that need it, and what to do.
        """
        missing = find_missing(self.resources, schedule_needs(self.config.vms))
        if missing and not self.config.allow_missing_resources:
            raise HostSetupError(missing_text(missing, self.resources, "the schedules", "serve"), 2)
        for m in missing:
            log.warning("%s", missing_warning(m, self.resources))
            self._unserved.add(m.name)

    def open(self) -> None:
        """Create directories, restore ``experiment.json``, replay every VM's ``.jsonl``.

        Raises:
            HostSetupError: the schedules name VM resources the host does not have (exit 2,
                before anything is made; :meth:`check_resources`), a path is too long (exit 2),
                or the state cannot be read, the directories cannot be made or the open-files
                limit cannot be raised to what the VMs need (exit 1; :mod:`vmr_handler.host.serve._fdlimit`).
        """
        self.check_resources()
        self.check_paths()
        cfg = self.config
        http_per_vm = self.limits.resource_streams if cfg.http is not None else 0
        needs = fd_needs(len(cfg.vms), self.mode, http_per_vm)
        soft, _hard = ensure_fd_limit(needs)  # before any log is opened
        #: every VM's readable .log, as many open at once as the open-files limit leaves room for
        self.readable = AppendFiles(readable_pool(soft, needs, len(cfg.vms)))
        try:
            os.makedirs(cfg.logs, mode=0o750, exist_ok=True)
            self._lock_logs()
            write_index(cfg.logs, cfg.vms)  # for `vmr-host schedule show`
            self.channels.prepare()
            self.experiment.load()
        except OSError as exc:
            raise HostSetupError(f"cannot prepare {cfg.logs}: {exc}") from exc
        except ValueError as exc:
            raise HostSetupError(f"cannot restore the experiment state: {exc}") from exc
        limits = self.limits
        transfers = {
            name: TransferStore(cfg.logs, name, limits.transfer_file, limits.transfer_total)
            for name in cfg.vms
        }  # each VM's: its session's, and the HTTP(S) uploads' (the same store as transfer_chunk)
        if cfg.http is not None:  # tokens now: the schedule events carry them
            streams = limits.resource_streams
            self.http = ResourceHttp(cfg.http, cfg.vms, self.resources, cfg.logs, streams, transfers)
        resource_info = self._resource_info()
        self.experiment.loading = True
        try:
            for name, spec in sorted(cfg.vms.items()):
                self._open_session(name, spec, resource_info.get(name, {}), transfers[name])
        finally:
            self.experiment.loading = False
        self.host_entries.open()  # on_host entries that ran when vmr-host died: interrupted
        self.experiment.replayed()
        self._opened = True

    def _open_session(
        self,
        name: str,
        spec: VmSpec,
        resource_info: Mapping[str, Mapping[str, Any]],
        transfers: TransferStore,
    ) -> None:
        """Make ``name``'s session, open its transfer store and replay its log into it.

        Raises:
            HostSetupError: its logs cannot be opened.
        """
        limits = self.limits
        vmlog = VmLog(
            self.config.logs, name, limits.log_quota, limits.seen_limits(), limits.checkpoint_every,
            readable_files=self.readable,
        )  # fmt: skip
        session = VmSession(
            spec,
            name in self.config.expected,
            self.limits,
            vmlog,
            transfers,
            self.resources,
            self.experiment,
            self.events,
            resource_info,
            self.http.schedule_data(name) if self.http is not None else None,
            clock=self.clock,
        )
        self.sessions[name] = session
        try:
            transfers.open()
            restore = functools.partial(restore_session, name, session.state, session.counters, session.told)
            vmlog.open(replay=session.apply, restore=restore)
        except OSError as exc:
            raise HostSetupError(f"cannot open the logs of {name}: {exc}") from exc
        if vmlog.due():  # a long replay: not again at the next start
            save_checkpoint(session)

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

    def _resource_info(self) -> Dict[str, Dict[str, Dict[str, Any]]]:
        """Per VM: ``{filename: {"size", "sha256"[, "url"]}}`` of the resources its schedule names
        (``url`` with ``--http``: the agent fetches them over HTTP(S) instead of the channel).
        A file that cannot be served is left out (the agent is refused it), warned about once."""
        out: Dict[str, Dict[str, Dict[str, Any]]] = {}
        for name, spec in self.config.vms.items():
            info: Dict[str, Dict[str, Any]] = {}
            for filename in sorted(spec.filenames - self._unserved):
                try:
                    info[filename] = self._one_resource(name, filename)
                except ResourceRefused as exc:  # unreadable since check_resources
                    self._unserved.add(filename)
                    log.warning("%s (the VMs that need it are refused it)", exc)
            out[name] = info
        return out

    def _one_resource(self, vm: str, filename: str) -> Dict[str, Any]:
        """``{"size", "sha256"[, "url"]}`` of one resource for ``vm``.

        Raises:
            ResourceRefused: not a file inside ``--resources`` (or no ``--resources``).
        """
        r = self.resources.info(filename)
        info: Dict[str, Any] = {"size": r.size, "sha256": r.sha256}
        if self.http is not None:
            info["url"] = self.http.url(vm, filename)
        return info

    def _append_resources(
        self, targets: List[str], drops: Mapping[str, Sequence[int]]
    ) -> Dict[str, Dict[str, Dict[str, Any]]]:
        """Per target VM, the ``{filename: {"size", "sha256"}}`` of the resources a batch appended
        to it drops (``drops``: file name -> the batch's entries that drop it), fetched over the
        channel (``resource_request``).

        Raises:
            ResourcesMissing: some are neither files inside ``--resources`` nor staged pushes
                (the same check and listing as :meth:`check_resources`; nothing is appended).
        """
        missing = find_missing(self.resources, batch_needs(drops, targets))
        if missing:
            raise ResourcesMissing(missing_text(missing, self.resources, "the batch", "batch"))
        try:
            infos = {name: self.resources.info(name) for name in sorted(drops)}
        except ResourceRefused as exc:  # unreadable, or a staged push changed, since the check
            raise ResourcesMissing(f"{exc}; nothing appended") from exc
        sizes = {name: {"size": r.size, "sha256": r.sha256} for name, r in infos.items()}
        return {vm: {name: dict(v) for name, v in sizes.items()} for vm in targets}

    # ------------------------------------------------------------------ serving
    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then close everything cleanly.

        Raises:
            HostSetupError: a socket cannot be bound (in use by another process: exit 1; a
                non-socket file in the way: exit 2).
        """
        if not self._opened:
            self.open()
        try:
            api = ControlApi(self.experiment, self.mode, self._append_resources)
            self._control = ControlServer(
                self.config.logs, api.handlers(), path=control_socket_path(self.config.logs)
            )
            await self._control.start()
        except ControlError as exc:
            raise HostSetupError(str(exc).replace("vmr-handler", "vmr-host")) from exc
        except OSError as exc:
            raise HostSetupError(f"cannot bind the control socket: {exc}") from exc
        try:
            if self.http is not None:
                self.http.start(self._http_notes(asyncio.get_running_loop()))
            await self.channels.start(stop)
            # after the channels: the console's first fold must not delay the VMs
            for make in self._companion_factories:
                companion = make(self.experiment, api)
                self.companions.append(companion)
                await companion.start()
            self._tasks.append(asyncio.ensure_future(self._ticker()))
            log.info(
                "vmr-host %s serving %d VM(s) (%s mode, %s); barrier waits for %s",
                __version__,
                len(self.sessions),
                self.mode,
                self.channels.describe(),
                waiting_text(self.experiment.barrier),
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
                s.log.note(text, self.clock.time())
                if outcome not in ("refused", "upload_refused"):  # logged, rate-limited, by the HTTP server
                    log.info("%s: %s", vm, text)

        def note(vm: str, text: Optional[str], outcome: str) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the host is gone
                loop.call_soon_threadsafe(apply, vm, text, outcome)

        return note

    async def _ticker(self) -> None:
        """Every ``period`` seconds on the host's clock: each session's :meth:`VmSession.tick`
        (heartbeats after send silence, a silent peer marked)."""
        period = min(1.0, self.limits.heartbeat / 2, self.limits.silent_after / 2)
        never = asyncio.Event()
        while True:
            await self.clock.wait(never, self.clock.time() + period)
            now = self.clock.time()
            for s in self.sessions.values():
                try:
                    s.tick(now)
                except Exception:  # never let one VM stop the heartbeats of all
                    log.exception("%s: tick failed", s.name)

    async def _shutdown(self) -> None:
        await self.host_entries.close()  # their trees killed while the VMs' logs and links are open
        for companion in reversed(self.companions):
            await companion.close()
        if self.http is not None:
            await asyncio.to_thread(self.http.stop)
        for s in self.sessions.values():
            if s.link is not None:
                s.link.close()
        for task in self._tasks:
            task.cancel()
        await self.channels.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._control is not None:
            await self._control.close()
        self.experiment.save()
        for s in self.sessions.values():
            if s.log.due(stopping=True):
                save_checkpoint(s)
            s.log.close()
        self.readable.close_all()
