"""``vmr-host serve``: its arguments, the :class:`HostConfig` they make, and the server run
until SIGTERM/SIGINT (row ``serve`` of :data:`vmr_handler.host.cli.vmr_host.COMMANDS`).

Exit codes: 0 stopped by a signal; 1 runtime error (a socket in use, the disk); 2 bad usage
or bad input (unusable schedule, unknown VM, a socket path too long).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
from typing import TYPE_CHECKING, List

from vmr_handler.core.errors import UsageError
from vmr_handler.host.cli.control_client import EXIT_OK, EXIT_RUNTIME
from vmr_handler.host.cli.options import add_logs
from vmr_handler.host.console.options import add_console_args, console_options, experiment_name
from vmr_handler.host.serve.channels.mqtt_options import add_serve_mqtt, mqtt_options
from vmr_handler.host.serve.config import HostConfig, Limits
from vmr_handler.host.serve.http.options import http_options
from vmr_handler.host.serve.specs import load_specs

if TYPE_CHECKING:
    from vmr_handler.host.serve.control_api import ControlApi
    from vmr_handler.host.serve.experiment.experiment import Experiment
    from vmr_handler.host.serve.server import Companion, CompanionFactory

log = logging.getLogger("vmr_handler.host")


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _positive(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _kpi_interval(text: str) -> float:
    """0 (off) or seconds >= ``MIN_KPI_INTERVAL`` between two KPI samples (``--kpi-interval``)."""
    from vmr_handler.core.payloads import MIN_KPI_INTERVAL

    value = _seconds(text)
    if 0 < value < MIN_KPI_INTERVAL:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or >= {MIN_KPI_INTERVAL:g}, got {text!r}")
    return value


def _timeout(text: str) -> float:
    """Seconds > 0 and finite (``--default-timeout``)."""
    value = _seconds(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be seconds > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    """A positive whole number (bytes, ids) of a tuning option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """``serve``: schedules, logs, barrier, signing; MQTT and HTTP(S) flags in their groups."""
    serve.add_argument(
        "--schedules", required=True, metavar="DIR", help="one schedule per VM: <vm>.pkl|.yaml|.json"
    )
    serve.add_argument("--resources", metavar="DIR", help="VM-resource files for `filename` drops")
    serve.add_argument(
        "--allow-missing-resources",
        action="store_true",
        help="serve even when schedules name files not in --resources (one warning per file; the VMs "
        "that need one are refused it); without it serve refuses to start, listing them",
    )
    serve.add_argument(
        "--host-entries",
        action="store_true",
        help="run the schedules' on_host entries on this host when their VM asks (an absolute path, "
        "minimega, or a --resources file; docs/host.md); without it they are refused",
    )
    add_logs(serve)
    serve.add_argument(
        "--channels",
        metavar="DIR",
        help="where the <vm>.sock channel sockets are (default <logs>/channels)",
    )
    serve.add_argument(
        "--start-buffer",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="start = last VM configured + SECONDS (default 60)",
    )
    serve.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="VM,...",
        help="the VMs the barrier waits for (default: every schedule)",
    )
    serve.add_argument(
        "--connect",
        action="store_true",
        help="QEMU is the socket server (server=on,wait=off): connect to each <vm>.sock, reconnect "
        "with backoff",
    )
    serve.add_argument(
        "--kpi-interval",
        type=_kpi_interval,
        default=10.0,
        metavar="SECONDS",
        help="each agent reports its VM's CPU, memory, disk and network every SECONDS (default 10; 0 = off)",
    )
    serve.add_argument("--default-timeout", type=_timeout, metavar="SECONDS",
                       help="end a program entry without a timeout of its own after SECONDS in its VM "
                       "(SIGTERM, SIGKILL 10 s later; told to agents without one; default none)")  # fmt: skip
    serve.add_argument(
        "--signing-key",
        metavar="FILE",
        help="Ed25519 private key (`vmr-host keygen`): sign schedules, start time and RESUME",
    )
    add_serve_mqtt(serve)
    serve.add_argument(
        "--allow-class",
        action="append",
        default=[],
        metavar="MODULE.NAME",
        help="also admit this schedule-entry class name in pickles (repeatable)",
    )

    _add_serve_liveness(serve)
    # per-VM memory and disk bounds (docs/host.md, "Limits and guarantees")
    serve.add_argument("--log-quota", type=_count, default=Limits.log_quota, help=argparse.SUPPRESS)
    serve.add_argument("--dedup-window", type=_count, default=Limits.dedup_window, help=argparse.SUPPRESS)
    every = Limits.checkpoint_every
    serve.add_argument("--checkpoint-every", type=_count, default=every, help=argparse.SUPPRESS)
    serve.add_argument("--http-debug-rate", type=_positive, metavar="BYTES/S", help=argparse.SUPPRESS)
    _add_serve_http(serve)
    add_console_args(serve)


def _add_serve_liveness(serve: argparse.ArgumentParser) -> None:
    """``--lost-after S`` (docs/host.md, "States"), and the hidden ``--heartbeat`` and
    ``--silent-after`` (debug/test tuning: keep ``--heartbeat`` well under the agent's 15 s
    silence limit)."""
    serve.add_argument(
        "--lost-after", type=_positive, default=Limits.lost_after, metavar="S",
        help="a VM whose agent is gone (disconnected, or connected and silent) this many seconds "
        f"while not complete is `lost` (default {Limits.lost_after:g})",
    )  # fmt: skip
    serve.add_argument("--heartbeat", type=_positive, default=5.0, help=argparse.SUPPRESS)
    serve.add_argument("--silent-after", type=_positive, default=15.0, help=argparse.SUPPRESS)


def _add_serve_http(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` group "VM resources over HTTP(S)": ``--http*``."""
    web = serve.add_argument_group("VM resources over HTTP(S) (docs/host.md)")
    web.add_argument("--http", metavar="HOST:PORT", help="serve `filename` drops over HTTP(S) here")
    web.add_argument("--http-url", metavar="URL", help="base URL agents use (default http[s]://HOST:PORT)")
    web.add_argument("--http-cert", metavar="FILE", help="PEM server certificate: serve HTTPS")
    web.add_argument("--http-key", metavar="FILE", help="PEM key of --http-cert (if not in it)")


def build_config(args: argparse.Namespace) -> HostConfig:
    """A :class:`HostConfig` from ``serve`` arguments.

    Raises:
        UsageError: bad schedules or ``--expect`` naming a VM without a schedule.
    """
    import dataclasses

    specs = load_specs(args.schedules, args.allow_class)
    limits = dataclasses.replace(
        Limits(),
        heartbeat=args.heartbeat,
        silent_after=args.silent_after,
        lost_after=args.lost_after,
        log_quota=args.log_quota,
        dedup_window=-(-args.dedup_window // 8) * 8,
        checkpoint_every=args.checkpoint_every,
    )
    expected = frozenset(specs)
    if args.expect:
        names = [n.strip() for chunk in args.expect for n in chunk.split(",") if n.strip()]
        unknown = sorted(set(names) - set(specs))
        if unknown:
            raise UsageError(
                f"--expect names VM(s) without a schedule in {args.schedules}: {', '.join(unknown)}"
            )
        if not names:
            raise UsageError("--expect names no VM")
        expected = frozenset(names)
    if args.resources and not os.path.isdir(args.resources):
        raise UsageError(f"--resources {args.resources} is not a directory")
    logs = args.logs
    signing_key = None
    if args.signing_key:
        from vmr_handler.core.errors import SigningError
        from vmr_handler.core.wire.signing import load_private_key

        try:
            signing_key = load_private_key(args.signing_key)
        except SigningError as exc:
            raise UsageError(f"--signing-key: {exc}") from exc
    mqtt = None
    if args.transport == "mqtt":
        mqtt = mqtt_options(args)
    elif args.broker or args.credentials or args.coordinator or args.member:
        raise UsageError("--broker/--credentials/--coordinator/--member need --transport mqtt")
    peers = frozenset(n.strip() for chunk in args.peers for n in chunk.split(",") if n.strip())
    if peers and not args.coordinator:
        raise UsageError("--peers is for the --coordinator host")
    if args.coordinator and not peers:
        raise UsageError("--coordinator needs --peers HOST,... (the other hosts' --host-id)")
    role = "coordinator" if args.coordinator else "member" if args.member else "standalone"
    return HostConfig(
        vms=specs,
        expected=expected,
        logs=logs,
        channels=args.channels or os.path.join(logs, "channels"),
        resources=args.resources,
        start_buffer=args.start_buffer,
        connect=args.connect,
        limits=limits,
        mqtt=mqtt,
        host_id=args.host_id or socket.gethostname(),
        role=role,
        peers=peers,
        signing_key=signing_key,
        http=http_options(args),
        kpi_interval=args.kpi_interval,
        default_timeout=args.default_timeout,
        console=console_options(args),
        name=experiment_name(args, mqtt.experiment if mqtt is not None else None),
        host_entries=args.host_entries,
        allow_classes=tuple(args.allow_class),
        allow_missing_resources=args.allow_missing_resources,
    )


def companions(config: HostConfig) -> List[CompanionFactory]:
    """The services ``config`` runs alongside the serving process: the operators' console with
    ``--console`` (:mod:`vmr_handler.host.console`, imported only then), else none."""
    options = config.console
    if options is None:
        return []

    def console(experiment: Experiment, control: ControlApi) -> Companion:
        from vmr_handler.host.console.app import Console
        from vmr_handler.host.console.live import LiveExperiment
        from vmr_handler.host.serve.channels.factory import channel_mode

        live = LiveExperiment(experiment, channel_mode(config))
        return Console(options, config.logs, live, control)

    return [console]


def run(args: argparse.Namespace) -> int:
    """Run the host controller until SIGTERM/SIGINT (exit 0), or fail at set-up (1/2)."""
    import asyncio

    from vmr_handler.host.serve.channels.factory import open_channels
    from vmr_handler.host.serve.server import HostServer

    config = build_config(args)
    server = HostServer(config, open_channels, companions=companions(config))
    server.open()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await server.run(stop)

    asyncio.run(main())
    if server.fatal:
        log.error("vmr-host stopped: %s", server.fatal)
        return EXIT_RUNTIME
    log.info("vmr-host stopped")
    return EXIT_OK
