"""Connected mode: the agent running under ``vmr-host`` over a byte channel (docs/protocol.md).

:class:`ConnectedAgent` wires the parts to the :class:`~vmr_handler.agent.engine.engine.Engine`: the
:class:`~vmr_handler.agent.connected.link.HostLink` (the conversation with the host), the
:class:`~vmr_handler.agent.connected.resources.Resources` (VM-resource files) and the
:class:`~vmr_handler.agent.connected.transfers.Transfers` (files sent out). :func:`run_connected` waits for
the schedule (or reuses the one stored by a previous start), fetches VM-resource files, runs the
engine with the host's start time, RESUMEs and clock, and sends transfers out.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional

from vmr_handler.agent.connected.link import LATER, HostLink
from vmr_handler.agent.connected.resources import HttpJobs, Resources
from vmr_handler.agent.connected.transfers import Transfers
from vmr_handler.agent.engine.appends import appended_answer
from vmr_handler.agent.engine.hostcalls import LinkAsker
from vmr_handler.agent.machine.kpi import KpiSampler
from vmr_handler.agent.state.outbox import Outbox
from vmr_handler.agent.state.reporthold import HoldLimits, ReportHold
from vmr_handler.core.clock import SystemClock
from vmr_handler.core.errors import ChannelClosed, ScheduleError, UsageError, VmrError
from vmr_handler.core.events import Event, EventType, ReadableLines
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.schedule import Schedule, load_schedule_bytes
from vmr_handler.core.schedule.validate import parse_number
from vmr_handler.core.wire import protocol as P
from vmr_handler.transports.base import Opener
from vmr_handler.transports.virtio_serial import DEFAULT_PORT

if TYPE_CHECKING:
    from vmr_handler.transports.mqtt.options import MqttOptions

log = logging.getLogger(__name__)

SCHEDULE_FILE = "schedule.bin"


@dataclass
class AgentConfig:
    """Connected-mode settings (config file keys and flags of the same names).

    Attributes:
        port: ``unix:PATH`` or a character device path.
        heartbeat: seconds of silence after which a heartbeat is sent.
        peer_timeout: seconds of silence after which the host is considered gone.
        clock_skew: debug only: seconds added to this agent's own clock reading.
        mqtt: broker, experiment and credentials when the host is reached over MQTT
            (``port`` is not used then); None for virtio-serial / unix socket.
        public_key: the host's Ed25519 public key (PEM text or a file path). When set, a
            schedule, start time or RESUME is applied only with a valid, fresh signature
            (SPEC §7); the ``start_time`` of ``welcome`` (unsigned) is not used.
        signature_max_age: seconds a signature stays fresh (host clock).
        http_ca_file: CA certificate file that signs ``vmr-host``'s HTTPS certificate (resources
            over HTTPS); None: the broker's CA (``mqtt.ca_file``/``ca_pem``), else the system CAs.
        default_timeout: seconds a program entry without a ``timeout`` of its own may run
            (``--default-timeout``); None: the host's (``welcome``), else no bound.
        report_hold_events, report_hold_bytes: reports (and their JSON bytes) kept in memory
            while the outbox cannot be written (a full state dir) before entries wait
            (:class:`~vmr_handler.agent.state.reporthold.HoldLimits`).
    """

    port: str = DEFAULT_PORT
    state_dir: str = "/var/lib/vmr-handler"
    launch_dir: str = "/var/launch"
    reboot_command: Optional[str] = None
    vm_name: str = field(default_factory=socket.gethostname)
    allow_classes: List[str] = field(default_factory=list)
    heartbeat: float = 5.0
    peer_timeout: float = 15.0
    clock_skew: float = 0.0
    clock_samples: int = 8
    clock_interval: float = 60.0
    quiet: bool = False
    mqtt: Optional[MqttOptions] = None
    public_key: Optional[str] = None
    signature_max_age: float = 300.0
    http_ca_file: Optional[str] = None
    report_hold_events: int = HoldLimits.events
    report_hold_bytes: int = HoldLimits.bytes
    default_timeout: Optional[float] = None


class ConnectedAgent:
    """Runs one VM's part of the experiment under a host (``vmr-handler run`` without --local)."""

    def __init__(
        self, config: AgentConfig, opener: Opener, boot_id: str, log_stream: Optional[Any] = sys.stderr
    ) -> None:
        self.config = config
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        self.clock = SystemClock(skew=config.clock_skew)
        self.outbox = Outbox(config.state_dir)
        self.link = HostLink(config, opener, boot_id, self.outbox, self.clock, self._on_control)
        #: every report goes through here: to the outbox, or held and retried when it fails
        self.reports = ReportHold(
            self._deliver,
            self.clock,
            HoldLimits(config.report_hold_events, config.report_hold_bytes),
            note=self.link.stamps.note,
        )
        self.link.report = self.reports
        self._log = None if config.quiet else log_stream
        self._readable = ReadableLines()
        self._schedule_ready: asyncio.Future[Schedule] = asyncio.get_running_loop().create_future()
        self._schedule: Optional[Schedule] = None
        self._engine: Any = None
        self._pending_start: Optional[float] = None
        self._fetching: Optional[asyncio.Future[None]] = None
        self._stopped = asyncio.Event()
        self.jobs = HttpJobs(self._stopped, config.state_dir, config.http_ca_file, config.mqtt)
        self.resources = Resources(config.state_dir, self.link, self._report, self.jobs)
        self.transfers = Transfers(config.state_dir, self.outbox, self.link, self._report, self.jobs)
        #: the VM's KPIs, every ``kpi_interval`` s the host's welcome says (off until then)
        self.kpi = KpiSampler(self._report, self.clock, 0.0, path=config.state_dir, skip=self._held)
        self.link.on_welcome = self._on_welcome
        #: control event type from the host -> its handler (:meth:`_on_control`)
        self._control_handlers: Dict[str, Callable[[Event], Optional[Dict[str, Any]]]] = {
            P.SCHEDULE: self._take_schedule,
            P.START_TIME: self._set_start_time,
            P.RESUME: self._resume,
            P.SCHEDULE_APPEND: self._take_append,
            P.KILL: self._kill,
        }
        #: ``schedule_append`` events that came before the engine runs (applied when it does)
        self._early_appends: List[Event] = []
        self._default_timeout: Optional[float] = None  # the host's, when the agent has none

    # -------------------------------------------------------------- control from the host
    async def _on_control(self, event: Event) -> Optional[Dict[str, Any]]:
        """Apply one control event; the ``data`` of the ``result`` to answer with, None for an
        ack, or :data:`~vmr_handler.agent.connected.link.LATER`."""
        handler = self._control_handlers.get(event.type)
        if handler is None:
            log.warning("unexpected %s event from host", event.type)
            return P.result_data(event.id, False, f"unknown event type {event.type!r}")
        return handler(event)

    def _set_start_time(self, event: Event) -> Optional[Dict[str, Any]]:
        start = event.data.get("start_time")
        if not isinstance(start, (int, float)):
            return P.result_data(event.id, False, "start_time must be a number")
        if self._engine is not None:
            self._engine.set_start_time(float(start))
        else:
            self._pending_start = float(start)
        return None

    def _resume(self, event: Event) -> Optional[Dict[str, Any]]:
        if self._engine is None:
            return P.result_data(event.id, False, "no schedule is running yet")
        at = parse_number(event.data.get("at"))  # host experiment seconds, "-inf" before the start
        outcome = self._engine.resume(at, resume_id=event.id)
        if outcome.get("repeated"):
            details = "already applied"
        elif outcome["ignored"]:
            details = "ignored: no active break"
        else:
            details = f"ended break at entry {outcome['ended_break']}"
        return P.result_data(
            event.id, True, details, ended_break=outcome["ended_break"], ignored=outcome["ignored"]
        )

    def _kill(self, event: Event) -> Optional[Dict[str, Any]]:
        """``vmr-host kill``: end a running entry's process tree (:meth:`Engine.kill`, applied
        once by id); answered with what was done or why not."""
        d = event.data
        index, grace, signame, by = d.get("index"), parse_number(d.get("grace")), d.get("signal"), d.get("by")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= (grace or -1) <= P.MAX_GRACE:
            details = f"kill needs an entry index and a grace of 0-{P.MAX_GRACE:g} s"
            return P.result_data(event.id, False, details)
        if signame not in P.KILL_SIGNALS:
            details = f"kill signal {signame!r}: not one of {', '.join(P.KILL_SIGNALS)}"
            return P.result_data(event.id, False, details)
        if self._engine is None:
            return P.result_data(event.id, False, "no schedule is running yet: no entry runs")
        outcome = self._engine.kill(event.id, index, signame, grace, by if isinstance(by, str) else None)
        details = "already applied: " + outcome["details"] if outcome.get("repeated") else outcome["details"]
        return P.result_data(event.id, outcome["ok"], details, index=index)

    def _take_append(self, event: Event) -> Optional[Dict[str, Any]]:
        """A batch appended to the schedule: answered once it is journaled."""
        if self._engine is None:
            self._early_appends.append(event)  # answered once the engine runs
        else:
            task = asyncio.ensure_future(self._append(event))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return LATER

    async def _append(self, event: Event) -> None:
        """Check, load and fetch what a ``schedule_append`` batch needs, append it, answer."""
        answer = await appended_answer(event, self._engine.append, self.resources, self.config.allow_classes)
        if answer.get("status") == "error":
            details = f"append refused: {answer['details']}"
            self._report(EventType.SCHEDULE_WARNING, status="error", details=details)
        with contextlib.suppress(ChannelClosed):
            await self.link.send_event(P.RESULT, **answer)

    def _take_schedule(self, event: Event) -> Optional[Dict[str, Any]]:
        data = event.data
        if isinstance(data.get("fetch"), str):  # too big for one frame: fetch it, answer later
            if self._schedule is None and self._fetching is None:
                self._fetching = asyncio.ensure_future(self._fetch_schedule(event))
            return LATER if self._schedule is None else self._accept_schedule(event.id, None, data)
        try:
            raw = base64.b64decode(str(data.get("data_b64", "")), validate=True)
        except ValueError:
            return P.result_data(event.id, False, "schedule data_b64 is not base64")
        return self._accept_schedule(event.id, raw, data)

    async def _fetch_schedule(self, event: Event) -> None:
        """Fetch a large schedule in chunks, then answer the ``schedule`` event."""
        target = os.path.join(self.config.state_dir, SCHEDULE_FILE + ".fetch")
        try:
            error = await self.resources.fetch_one(str(event.data["fetch"]), target)
            if error is None:
                with open(target, "rb") as fh:
                    raw = fh.read()
                os.unlink(target)
                answer = self._accept_schedule(event.id, raw, event.data)
            else:
                answer = P.result_data(event.id, False, f"schedule download failed: {error}")
            with contextlib.suppress(ChannelClosed):
                await self.link.send_event(P.RESULT, **answer)
        finally:
            self._fetching = None

    def _accept_schedule(self, answers: str, raw: Optional[bytes], data: Mapping[str, Any]) -> Dict[str, Any]:
        """Check, load and store delivered schedule bytes; the ``result`` data to answer with.

        ``raw`` None: a re-announcement of a schedule that is already here.
        """
        if raw is None:
            same = self._schedule is not None and self._schedule.digest == data.get("sha256")
            return P.result_data(
                answers, same, "schedule already running" if same else "another schedule is running"
            )
        event_id = answers
        if data.get("sha256") and hashlib.sha256(raw).hexdigest() != data.get("sha256"):
            return P.result_data(event_id, False, "schedule sha256 does not match its data")
        try:
            schedule = load_schedule_bytes(raw, self.config.allow_classes)
        except ScheduleError as exc:
            self._report(EventType.SCHEDULE_WARNING, status="error", details=f"schedule refused: {exc}")
            return P.result_data(event_id, False, str(exc))
        resources = data.get("resources")
        if isinstance(resources, dict):
            self.resources.announced = {str(k): v for k, v in resources.items() if isinstance(v, dict)}
            http = data.get("http")
            self.transfers.http = dict(http) if isinstance(http, dict) else {}
            for info in self.resources.announced.values():  # over HTTP(S): each url with the VM's token
                if "url" in info and isinstance(http, dict):
                    info["token"] = http.get("token")
        if self._schedule is not None:
            same = self._schedule.digest == schedule.digest
            return P.result_data(
                event_id,
                same,
                "schedule already running"
                if same
                else "another schedule is already running; restart the agent to change it",
            )
        atomic_write(os.path.join(self.config.state_dir, SCHEDULE_FILE), raw)
        atomic_write(
            os.path.join(self.config.state_dir, "resources.json"),
            json.dumps(self.resources.announced).encode(),
        )
        atomic_write(
            os.path.join(self.config.state_dir, "http.json"), json.dumps(self.transfers.http).encode()
        )
        self._schedule = schedule
        if not self._schedule_ready.done():
            self._schedule_ready.set_result(schedule)
        return P.result_data(
            event_id, True, f"schedule accepted ({len(schedule.entries)} entries)", digest=schedule.digest
        )

    def _stored_schedule(self) -> Optional[Schedule]:
        path = os.path.join(self.config.state_dir, SCHEDULE_FILE)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
            schedule = load_schedule_bytes(raw, self.config.allow_classes)
        except (OSError, ScheduleError):
            return None
        with (
            contextlib.suppress(OSError, ValueError),
            open(os.path.join(self.config.state_dir, "resources.json"), "rb") as fh,
        ):
            self.resources.announced = json.loads(fh.read())
        with (
            contextlib.suppress(OSError, ValueError),
            open(os.path.join(self.config.state_dir, "http.json"), "rb") as fh,
        ):
            self.transfers.http = json.loads(fh.read())
        return schedule

    # -------------------------------------------------------------- reports
    def sink(self, event: Event) -> None:
        """Report ``event``: written to the outbox now, or held and retried in order when the
        outbox cannot be written (:attr:`reports`); never raises."""
        self.reports(event)

    def _deliver(self, event: Event) -> None:
        """Write one report: outbox (delivered to the host) + readable log.

        Raises:
            JournalError: the outbox cannot be written (nothing of the report was kept).
        """
        self.outbox.add(event)
        self.link.notify()
        if self._log is not None:
            with contextlib.suppress(OSError, ValueError):
                self._log.write(self._readable.line(event) + "\n")
                self._log.flush()
        if event.type == EventType.TRANSFER_REGISTERED.value:
            self.transfers.start(dict(event.data))

    def _report(self, type_: EventType, **data: Any) -> None:
        self.sink(self.link.events.make(type_, **data))

    def _held(self) -> bool:
        return len(self.reports) > 0  # a full disk: a KPI sample is not worth holding

    def _on_welcome(self, welcome: Dict[str, Any]) -> None:
        """The host's ``welcome``: sample KPIs at its ``kpi_interval`` (an older host: none);
        its ``default_timeout`` bounds the entries started from now on, unless this agent has
        its own (``--default-timeout``)."""
        host_timeout = parse_number(welcome.get("default_timeout"))  # None from an older host
        if self.config.default_timeout is None and host_timeout is not None and 0 < host_timeout < math.inf:
            self._default_timeout = host_timeout
            if self._engine is not None:
                self._engine.config.default_timeout = self._default_timeout
        if "kpi_interval" in welcome:
            try:
                self.kpi.set_interval(welcome["kpi_interval"])
            except UsageError as exc:
                log.warning("host's kpi_interval ignored: %s", exc)

    # -------------------------------------------------------------- main
    async def run(self) -> int:
        """Connect, get the schedule, run it; returns the engine's exit code."""
        from vmr_handler.agent.machine.executor import install_child_watcher

        install_child_watcher()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, signal.Signals(sig).name)
        link_task = asyncio.ensure_future(self.link.run())
        self.kpi.start()
        try:
            schedule = await self._wait_for_schedule()
            if schedule is None:
                return 0
            resources = await self.resources.fetch_all(schedule)
            if self._stopped.is_set():
                return 0
            # report on the host's clock from the first event on (bounded: the host may be away)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.link.synced.wait(), 5.0)
            return await self._run_engine(schedule, resources)
        finally:
            transfers = self.transfers.cancel()
            link_task.cancel()
            await asyncio.gather(link_task, *transfers, return_exceptions=True)
            await self.kpi.close()
            self.reports.cancel()
            self.outbox.close()
            self.jobs.shutdown()  # its jobs were told to stop (cancel events)

    async def _wait_for_schedule(self) -> Optional[Schedule]:
        """The schedule a previous start stored, else the one the host delivers; None when the
        agent stops first."""
        schedule = self._stored_schedule()
        if schedule is not None:
            self._schedule = schedule
            return schedule
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self._stopped.wait())
        ready: asyncio.Future[Any] = self._schedule_ready
        await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if self._stopped.is_set():
            return None
        return self._schedule_ready.result()

    async def _run_engine(self, schedule: Schedule, resources: str) -> int:
        """Run the engine (``resources``: its VM-resource dir), then stay until stopped."""
        from vmr_handler.agent.engine.engine import DEFAULT_REBOOT_COMMAND, EngineConfig, open_engine

        config = EngineConfig(
            launch_dir=self.config.launch_dir,
            state_dir=self.config.state_dir,
            resources_dir=resources,
            reboot_command=self.config.reboot_command or DEFAULT_REBOOT_COMMAND,
            local_start=False,
        )
        config.report_hold = self.reports.limits
        config.stay = True  # batches may be appended after the schedule completes
        config.default_timeout = self.config.default_timeout or self._default_timeout
        config.host_ask = LinkAsker(self.link)  # the host runs the on_host entries
        self._engine = engine = open_engine(
            schedule, config, self.reports, self.clock, list(self.config.allow_classes or ())
        )
        for event in self._early_appends:
            self._take_append(event)
        self._early_appends = []
        self.transfers.restart()  # those a previous run left under way
        self.link.on_clock = engine.clock_changed
        # positive time runs on the host's clock: nothing is timed before the first sync
        sync_task = asyncio.ensure_future(self._when_synced(engine))
        if self._pending_start is not None:
            engine.set_start_time(self._pending_start)
        welcome_start = self.link.welcome.get("start_time")
        if isinstance(welcome_start, (int, float)) and self.link.verifier is None:
            engine.set_start_time(float(welcome_start))
        from vmr_handler.core.control import ControlServer

        control = ControlServer(
            self.config.state_dir,
            {
                "status": lambda _r: {**engine.status(), "host": self._host_status()},
                "resume": lambda _r: engine.resume(),
            },
        )
        await control.start()
        try:
            rc: int = await engine.run()
            # a service: stay connected after the schedule ends (reports still owed, periodic
            # transfers, RESUMEs answered as ignored, status) until SIGTERM
            await self._stopped.wait()
        finally:
            sync_task.cancel()
            await control.close()
        return rc

    async def _when_synced(self, engine: Any) -> None:
        await self.link.synced.wait()
        engine.set_clock_ready()

    def _host_status(self) -> Dict[str, Any]:
        return {
            "port": self.link.where,
            "transport": "mqtt" if self.config.mqtt is not None else "channel",
            "welcomed": self.link.welcomed.is_set(),
            "clock_offset": self.clock.offset,
            "unacked_reports": len(self.outbox),
            "held_reports": len(self.reports),
        }

    def _on_signal(self, name: str) -> None:
        self._stopped.set()
        if self._engine is not None:
            self._engine.stop(f"signal {name}")


async def run_connected(config: AgentConfig, opener: Opener, boot_id: str) -> int:
    """Entry point of connected mode. Returns the exit code.

    Args:
        config: the agent's settings.
        opener: the transport to the host, built by the CLI (:func:`channel_opener`).
        boot_id: this boot's id (:func:`~vmr_handler.agent.connected.link.machine_boot_id`).

    Raises:
        VmrError: the state directory cannot be used.
    """
    try:
        agent = ConnectedAgent(config, opener, boot_id)
    except OSError as exc:
        raise VmrError(f"cannot use state dir {config.state_dir}: {exc}") from exc
    return await agent.run()


def channel_opener(config: AgentConfig, boot_id: str) -> Opener:
    """The transport the configuration names: the MQTT broker when ``config.mqtt`` is set, else
    ``config.port`` (a virtio-serial device or ``unix:PATH``)."""
    if config.mqtt is not None:
        from vmr_handler.transports.mqtt.guest import MqttOpener

        return MqttOpener(config.mqtt, config.vm_name, boot_id)
    from vmr_handler.transports.virtio_serial import PortOpener

    return PortOpener(config.port)
