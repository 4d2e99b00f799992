"""Settings of a ``vmr-host serve`` run: paths, timings and the hostile-guest limits.

Limits are per VM (SPEC section 7: every guest is hostile); defaults are the table of
``docs/protocol.md`` ("Limits").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Optional, Tuple

from vmr_handler.core.wire.protocol import MAX_FRAME
from vmr_handler.host.logs.seenids import SeenLimits
from vmr_handler.host.model.stateword import LOST_AFTER

if TYPE_CHECKING:
    from vmr_handler.transports.mqtt.options import MqttOptions


@dataclass(frozen=True)
class HttpOptions:
    """How ``vmr-host serve`` serves VM resources over HTTP(S).

    Attributes:
        host: address to bind (a name or IP; ``0.0.0.0`` / ``::`` for every interface).
        port: TCP port to bind (1-65535).
        base_url: the URL prefix agents use (``http[s]://NAME:PORT``, no trailing ``/``).
        cert_file: PEM server certificate (chain) for HTTPS; None: plain HTTP.
        key_file: PEM private key of ``cert_file`` (None: the key is in ``cert_file``).
        debug_rate: tests only: bytes per second each download and upload is held to
            (None: full speed).
    """

    host: str
    port: int
    base_url: str
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    debug_rate: Optional[float] = None


@dataclass(frozen=True)
class ConsoleOptions:
    """Where ``vmr-host serve --console`` serves the operators' console: the web page,
    the REST API ``/api/v1``, its event stream and ``/metrics`` (:mod:`vmr_handler.host.console`).

    Attributes:
        host: address to bind (loopback by default; beyond loopback every request needs the
            token of ``<logs>/console.token``).
        port: TCP port to bind (1-65535; 0: any free port, told in the host's log).
        cert_file: PEM server certificate (chain) for HTTPS; None: plain HTTP.
        key_file: PEM private key of ``cert_file`` (None: the key is in ``cert_file``).
    """

    host: str
    port: int
    cert_file: Optional[str] = None
    key_file: Optional[str] = None


MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclass(frozen=True)
class Limits:
    """Per-VM limits (bytes, counts, seconds).

    Attributes:
        max_frame: largest frame accepted (longer ones are dropped unbuffered).
        max_events: events per message (a larger message is dropped whole and counted).
        rate: messages per second per VM (token bucket; excess frames dropped, counted).
        burst: bucket size, messages.
        log_quota: bytes of ``<vm>.jsonl`` written per VM; beyond it events are counted,
            acknowledged and not stored.
        transfer_file: largest transferred file, bytes.
        transfer_total: bytes of transfers kept per VM.
        resource_chunk: bytes of file data per ``resource_chunk``.
        resource_streams: concurrent resource downloads per VM.
        write_buffer: bytes queued towards a VM that does not read before the host drops
            the connection.
        read_rate: bytes per second read from one VM (reading pauses beyond it).
        read_burst: bytes read from one VM at full speed before ``read_rate`` applies.
        heartbeat: seconds of send silence after which the host sends a ``heartbeat``.
        silent_after: seconds without any frame after which a connected peer is *silent*.
        lost_after: seconds an agent heard from may be gone (its connection ended, or it is
            connected and *silent*) before its VM, neither complete nor failed, is ``lost``
            (``serve --lost-after``; :mod:`vmr_handler.host.model.stateword`).
        dedup_window: event counters per agent run whose ids are de-duplicated exactly
            (one bit each; :mod:`vmr_handler.host.logs.seenids`); older ones count as received.
        dedup_runs: agent runs (id prefixes) with such a window at a time.
        dedup_prefixes: agent runs remembered at all (beyond: the oldest is forgotten).
        dedup_others: ids not of the agent's ``<prefix>-<counter>`` form remembered.
        checkpoint_every: bytes of ``<vm>.jsonl`` written between two restart checkpoints
            (``<vm>.ckpt``: a restart replays only what follows it).
    """

    max_frame: int = MAX_FRAME
    max_events: int = 1000
    rate: float = 2000.0
    burst: float = 2000.0
    log_quota: int = GiB
    transfer_file: int = 256 * MiB
    transfer_total: int = GiB
    resource_chunk: int = 256 * 1024
    resource_streams: int = 2
    write_buffer: int = 64 * MiB
    read_rate: float = 64 * MiB
    read_burst: float = 16 * MiB
    heartbeat: float = 5.0
    silent_after: float = 15.0
    lost_after: float = LOST_AFTER
    dedup_window: int = 65536
    dedup_runs: int = 16
    dedup_prefixes: int = 4096
    dedup_others: int = 4096
    checkpoint_every: int = 64 * MiB

    def seen_limits(self) -> SeenLimits:
        """The de-duplication bounds (:class:`vmr_handler.host.logs.seenids.SeenLimits`).

        Raises:
            ValueError: a bound is not positive or the window not a multiple of 8.
        """
        return SeenLimits(self.dedup_window, self.dedup_runs, self.dedup_prefixes, self.dedup_others)


@dataclass(frozen=True)
class VmSpec:
    """One VM served: its name and schedule.

    Attributes:
        name: the VM name (from the schedule file name).
        schedule_path: the schedule file.
        schedule_bytes: its bytes, delivered as-is.
        digest: sha256 hex of ``schedule_bytes``.
        format: ``pickle``, ``yaml`` or ``json``.
        filenames: the ``filename`` drops the schedule names (the only resources this VM
            may request).
        drops: ``(filename, entry indices)`` of the schedule's own drops, by name (what
            ``serve`` and ``check`` list when a file is missing).
        destinations: ``(location, destination)`` of the schedule's transfers that name a
            destination directory on the host (:mod:`vmr_handler.host.serve.files.destinations`).
    """

    name: str
    schedule_path: str
    schedule_bytes: bytes
    digest: str
    format: str
    filenames: FrozenSet[str] = frozenset()
    drops: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()
    destinations: Tuple[Tuple[str, str], ...] = ()


@dataclass
class HostConfig:
    """Everything ``vmr-host serve`` was told.

    Attributes:
        vms: served VMs by name.
        expected: names the barrier waits for.
        logs: logs directory (per-VM logs, ``experiment.json``, transfers, control socket).
        channels: directory of the ``<vm>.sock`` channel sockets.
        resources: VM-resource directory, or None.
        start_buffer: seconds from the last configured VM to the experiment start.
        connect: True = QEMU is the socket server and vmr-host connects (mode 2).
        limits: per-VM limits.
        reconnect: (initial, max) seconds of the reconnect backoff in connect mode (and to
            the broker).
        mqtt: broker, experiment and credentials when VMs are served over MQTT (no
            channel sockets then); None for virtio-serial.
        host_id: this host's name among the hosts sharing a broker (default: hostname).
        role: ``standalone`` (one host decides alone), ``coordinator`` (decides the start for
            every host sharing the broker) or ``member`` (follows the coordinator's start).
        peers: a coordinator's peer host ids: the start waits until each announced its VMs.
        signing_key: the host's Ed25519 private key (``vmr-host keygen``); schedule, start
            time and RESUME are signed with it (SPEC §7). None: unsigned.
        http: serve VM-resource files over HTTP(S) (``--http``, :mod:`vmr_handler.host.serve.http.server`);
            None: only over the channel.
        default_timeout: seconds a program entry without a ``timeout`` of its own may run in
            its VM (``--default-timeout``; None: no bound), told in ``welcome``.
        kpi_interval: seconds between two KPI samples of each agent (``--kpi-interval``; 0 = no
            KPIs, seed 004's ``repeat``); told to every agent in its ``welcome``.
        console: serve the operators' console (``--console``); None: no console.
        name: the experiment's name (``--name``; default the MQTT experiment or the schedules
            directory's name): the console's and the report's title, kept in ``experiment.json``.
        host_entries: run the schedules' ``on_host`` entries on this host when a VM's agent asks
            (``--host-entries``; :mod:`vmr_handler.host.serve.experiment.hostentries`); False:
    refused.
        allow_classes: the ``--allow-class`` names the schedules were loaded with (the host
            loads a VM's schedule again to look its on_host entries up).
        allow_missing_resources: serve even when schedules name VM resources the host does not
            have (``--allow-missing-resources``: one warning per file); False: refuse to start
            (:mod:`vmr_handler.host.serve.files.resources`).
    """

    vms: Dict[str, VmSpec]
    expected: FrozenSet[str]
    logs: str
    channels: str
    resources: Optional[str] = None
    start_buffer: float = 60.0
    connect: bool = False
    limits: Limits = field(default_factory=Limits)
    reconnect: Tuple[float, float] = (0.1, 2.0)
    mqtt: Optional[MqttOptions] = None
    host_id: Optional[str] = None
    role: str = "standalone"
    peers: FrozenSet[str] = frozenset()
    signing_key: Any = None
    http: Optional[HttpOptions] = None
    kpi_interval: float = 10.0
    default_timeout: Optional[float] = None
    console: Optional[ConsoleOptions] = None
    name: str = ""
    host_entries: bool = False
    allow_classes: Tuple[str, ...] = ()
    allow_missing_resources: bool = False
