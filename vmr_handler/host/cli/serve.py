"""``vmr-host`` command line: the full argparse front end of the host controller.

``vmr-host`` starts in :mod:`vmr_handler.host.cli.vmr_host`, which sends the plain forms of the
control commands (``status``, ``resume``, ``release``) down the lean path
(:mod:`vmr_handler.host.cli.control_client`) and everything else here.

The commands and their options: :mod:`vmr_handler.host.cli.vmr_host` (and ``vmr-host --help``).

Exit codes: 0 success; 1 runtime error (no running vmr-host, a socket in use, the disk);
2 bad usage or bad input (unusable schedule, unknown VM, a socket path too long, a request
the running host refused).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from vmr_handler import __version__
from vmr_handler.core.errors import ControlError, UsageError
from vmr_handler.host.cli.control_client import (
    DEFAULT_LOGS,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    ClientCommand,
    run_client,
    runtime_error,
)
from vmr_handler.host.console.options import add_console_args, console_options, experiment_name
from vmr_handler.host.serve.channels.mqtt_options import add_serve_mqtt, mqtt_options
from vmr_handler.host.serve.config import HostConfig, Limits
from vmr_handler.host.serve.http.options import http_options
from vmr_handler.host.serve.specs import load_specs

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


def _count(text: str) -> int:
    """A positive whole number (bytes, ids) of a tuning option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    """The ``vmr-host`` parser: the global flags, then one sub-command per :data:`_COMMANDS` entry."""
    parser = argparse.ArgumentParser(
        prog="vmr-host",
        description="Host controller of a vmr-handler experiment: delivers schedules over each VM's "
        "virtio-serial channel, runs the start barrier, relays RESUME, keeps per-VM logs.",
    )
    parser.add_argument("--version", action="version", version=f"vmr-host {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    from vmr_handler.core.completion import add_completion_parser

    add_completion_parser(sub, "vmr-host")
    return parser


def _add_logs(p: argparse.ArgumentParser) -> None:
    """``--logs DIR`` (default :data:`DEFAULT_LOGS`)."""
    p.add_argument(
        "--logs", default=DEFAULT_LOGS, metavar="DIR", help=f"logs directory (default ./{DEFAULT_LOGS})"
    )


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``serve``: schedules, logs, barrier, signing; MQTT and HTTP(S) flags in their groups."""
    serve = sub.add_parser("serve", help="serve every VM's channel (runs until SIGTERM)")
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
    _add_logs(serve)
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

    # debug/test tuning (docs/host.md): keep --heartbeat well under the agent's 15 s silence limit
    serve.add_argument("--heartbeat", type=_positive, default=5.0, help=argparse.SUPPRESS)
    serve.add_argument("--silent-after", type=_positive, default=15.0, help=argparse.SUPPRESS)
    # per-VM memory and disk bounds (docs/host.md, "Limits and guarantees")
    serve.add_argument("--log-quota", type=_count, default=Limits.log_quota, help=argparse.SUPPRESS)
    serve.add_argument("--dedup-window", type=_count, default=Limits.dedup_window, help=argparse.SUPPRESS)
    every = Limits.checkpoint_every
    serve.add_argument("--checkpoint-every", type=_count, default=every, help=argparse.SUPPRESS)
    serve.add_argument("--http-debug-rate", type=_positive, metavar="BYTES/S", help=argparse.SUPPRESS)
    _add_serve_http(serve)
    add_console_args(serve)


def _add_serve_http(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` group "VM resources over HTTP(S)": ``--http*``."""
    web = serve.add_argument_group("VM resources over HTTP(S) (docs/host.md)")
    web.add_argument("--http", metavar="HOST:PORT", help="serve `filename` drops over HTTP(S) here")
    web.add_argument("--http-url", metavar="URL", help="base URL agents use (default http[s]://HOST:PORT)")
    web.add_argument("--http-cert", metavar="FILE", help="PEM server certificate: serve HTTPS")
    web.add_argument("--http-key", metavar="FILE", help="PEM key of --http-cert (if not in it)")


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``status [VM...] [--state S]... [--watch [--interval S]] [--logs DIR] [--json]``
    and ``wait --for PHASE [VM...] [--timeout S]``."""
    from vmr_handler.host.cli._waiting import PHASES
    from vmr_handler.host.cli.statustext import FILTERS

    status = sub.add_parser(
        "status", help="every VM, where it is and whom the barrier waits for (exit 1: some VM failed)"
    )
    status.add_argument("vms", nargs="*", metavar="VM", help="only these VMs' rows")
    status.add_argument("--state", action="append", default=[], choices=FILTERS,
                        help="only VMs in this state (repeatable: any of them)")  # fmt: skip
    status.add_argument("--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between redraws (default 2)")
    _add_logs(status)
    status.add_argument("--json", action="store_true", help="print the full status as JSON")
    wait = sub.add_parser(
        "wait", help="wait until VMs reach a phase (exit 0 reached, 1 a VM failed, 2 timeout)"
    )
    wait.add_argument("--for", dest="phase", required=True, choices=list(PHASES), help="the phase")
    wait.add_argument("vms", nargs="*", metavar="VM", help="default: every expected VM not excluded")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds (exit 2)")
    _add_logs(wait)
    wait.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _add_resume(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``resume (VM... | --all) [--logs DIR] [--json]``."""
    resume = sub.add_parser("resume", help="send a RESUME to VMs (stamped with host experiment time)")
    resume.add_argument("vms", nargs="*", metavar="VM")
    resume.add_argument("--all", action="store_true", help="every VM")
    resume.add_argument("--force", "--yes", dest="force", action="store_true",
                        help="send it also to VMs not at a break (ends their next break early)")  # fmt: skip
    resume.add_argument("--dry-run", action="store_true", help="say whom it would reach; send nothing")
    _add_logs(resume)
    resume.add_argument("--json", action="store_true")


def _add_release(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``release [--exclude VM...] [--logs DIR] [--json]``."""
    release = sub.add_parser("release", help="start the experiment without VMs that are missing")
    release.add_argument(
        "--exclude",
        nargs="+",
        default=[],
        metavar="VM",
        help="drop these VMs from the barrier (without: start without everyone still missing)",
    )
    _add_logs(release)
    release.add_argument("--json", action="store_true")


def _add_mqtt_config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mqtt-config``: its options are :func:`vmr_handler.host.cli.mqtt_config.layout.add_arguments`."""
    from vmr_handler.host.cli.mqtt_config.layout import add_arguments as mqtt_config_arguments

    mqtt_config = sub.add_parser("mqtt-config", help="mosquitto config, ACL and credentials (docs/mqtt.md)")
    mqtt_config_arguments(mqtt_config)


def _add_keygen(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``keygen --out DIR [--force]``."""
    keygen = sub.add_parser("keygen", help="make the host's Ed25519 key pair for signed control messages")
    keygen.add_argument(
        "--out", required=True, metavar="DIR", help="writes DIR/host.key (mode 0600) and DIR/host.pub"
    )
    keygen.add_argument("--force", action="store_true", help="replace an existing key pair")


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``report [--logs DIR] [--out FILE.html]``."""
    rep = sub.add_parser("report", help="write the experiment timeline as one HTML file (docs/host.md)")
    _add_logs(rep)
    rep.add_argument("--out", metavar="FILE.html", help="where to write it (default <logs>/report.html)")


def _add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``check DIR [--resources DIR] [--allow-class NAME]... [--json]``."""
    check = sub.add_parser(
        "check", help="check every schedule file of a --schedules directory (exit 2: some cannot be used)"
    )
    check.add_argument("schedules", metavar="DIR", help="one schedule per VM: <vm>.pkl|.yaml|.json")
    check.add_argument("--resources", metavar="DIR",
                       help="also check every `filename` drop is a file of DIR (as serve's)")  # fmt: skip
    check.add_argument("--allow-class", action="append", default=[], metavar="MODULE.NAME",
                       help="also admit this schedule-entry class name in pickles (as serve's)")  # fmt: skip
    check.add_argument("--json", action="store_true",
                       help="print {vms: {...}, problems: [...], resources: {...}} as JSON")  # fmt: skip


def cmd_check(args: argparse.Namespace) -> int:
    """``vmr-host check DIR [--resources RES]``: every bad schedule file at once, each named with
    the loader's message, and with ``--resources`` every ``filename`` drop that is not a file of
    RES (:mod:`vmr_handler.host.serve.files.resources`, the listing ``serve`` refuses to start with).

    Returns:
        0 when all can be used, 2 when some file cannot or some resource is missing.

    Raises:
        UsageError: no such directory or no schedule in it; ``--resources`` is not a directory.
    """
    import json

    from vmr_handler.host.serve.files.resources import check_resources
    from vmr_handler.host.serve.specs import check_specs

    specs, problems = check_specs(args.schedules, args.allow_class)
    resources = check_resources(specs, args.resources)
    if args.json:
        vms = {vm: {"path": sp.schedule_path, "sha256": sp.digest, "format": sp.format}
               for vm, sp in specs.items()}  # fmt: skip
        print(json.dumps({"vms": vms, "problems": problems, "resources": resources.to_dict()}, indent=1))
    else:
        for vm, spec in sorted(specs.items()):
            print(f"ok       {vm}: {spec.schedule_path} ({spec.format}, sha256 {spec.digest[:12]})")
        for line in problems:
            print(f"PROBLEM  {line}")
        for line in resources.lines():
            print(line)
        print(f"{len(specs)} schedule(s) usable, {len(problems)} file(s) with problems{resources.summary()}")
    return EXIT_USAGE if problems or resources.missing else EXIT_OK


def _add_logs_cmd(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``logs VM [-f] [--entry N] [--stream stdout|stderr] [--json] [--logs DIR]``."""
    logs = sub.add_parser("logs", help="a VM's events and output, UTC + experiment time (-f: follow)")
    logs.add_argument("vm", metavar="VM")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what the host appends")
    logs.add_argument("--entry", type=int, metavar="N", help="only schedule entry N")
    logs.add_argument("--stream", choices=("stdout", "stderr"), help="only this output stream")
    _add_logs(logs)
    logs.add_argument("--json", action="store_true", help="the stored records, one JSON object per line")


def _add_schedule(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``schedule show VM [--logs DIR] [--json]`` (:mod:`vmr_handler.host.cli.schedule.show`)."""
    from vmr_handler.host.cli.schedule.show import add_arguments

    add_arguments(sub, _add_logs)


def _add_live(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``push``, ``pull`` and ``exec`` (:mod:`vmr_handler.host.cli.live.commands`)."""
    from vmr_handler.host.cli.live.commands import add_parsers

    add_parsers(sub, _add_logs)


#: The sub-commands, in the order ``vmr-host --help`` lists them.
_COMMANDS: Tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    _add_serve,
    _add_status,
    _add_resume,
    _add_release,
    _add_mqtt_config,
    _add_keygen,
    _add_report,
    _add_check,
    _add_logs_cmd,
    _add_schedule,
    _add_live,
)


# ---------------------------------------------------------------------------------- serve
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
        console=console_options(args),
        name=experiment_name(args, mqtt.experiment if mqtt is not None else None),
        host_entries=args.host_entries,
        allow_classes=tuple(args.allow_class),
        allow_missing_resources=args.allow_missing_resources,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the host controller until SIGTERM/SIGINT (exit 0), or fail at set-up (1/2)."""
    import asyncio

    from vmr_handler.host.serve.channels.factory import open_channels
    from vmr_handler.host.serve.server import HostServer

    config = build_config(args)
    server = HostServer(config, open_channels)
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


# -------------------------------------------------------------------------------- clients
def client_command(args: argparse.Namespace) -> ClientCommand:
    """The :class:`ClientCommand` of parsed ``status``/``resume``/``release`` arguments."""
    return ClientCommand(
        args.command,
        args.logs,
        args.json,
        tuple(getattr(args, "vms", ())),
        bool(getattr(args, "all", False)),
        tuple(getattr(args, "exclude", ())),
        tuple(getattr(args, "state", ())),
        bool(getattr(args, "force", False)),
        bool(getattr(args, "dry_run", False)),
    )


def cmd_client(args: argparse.Namespace) -> int:
    """``status``/``resume``/``release`` given in a form only argparse takes (``-v``, an
    abbreviated option, a filter, ``--watch``): the same as the lean path
    (:mod:`vmr_handler.host.cli.control_client`)."""
    command = client_command(args)
    if args.command == "status" and args.watch:
        from vmr_handler.host.cli._waiting import watch
        from vmr_handler.host.cli.statustext import format_status

        def render(result: Dict[str, Any]) -> str:
            return format_status(result, command.states, command.vms)

        return watch(render, args.logs, args.interval)
    return run_client(command)


def cmd_wait(args: argparse.Namespace) -> int:
    """``wait --for PHASE [VM...] [--timeout S]`` (:mod:`vmr_handler.host.cli._waiting`)."""
    from vmr_handler.host.cli._waiting import wait_for

    return wait_for(args.logs, args.phase, args.vms, args.timeout, json_out=args.json)


def main(argv: Optional[List[str]] = None) -> int:
    """The full front end (:func:`vmr_handler.host.cli.vmr_host.main` sends what the lean path does not
    take here). Returns the exit code."""
    from vmr_handler.host.cli.live.commands import COMMANDS as LIVE
    from vmr_handler.host.cli.live.commands import run_live, split_command

    parser = _parser()
    words, command = split_command(sys.argv[1:] if argv is None else argv)  # exec's -- CMD [ARG...]
    args = parser.parse_args(words)
    # INFO by default: each VM's connect, configured, failed and complete with running counts;
    # -q for warnings and errors only, -v for debug
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from vmr_handler.core.errors import HostSetupError

    if args.command == "keygen":
        from vmr_handler.host.cli._keygen import cmd_keygen

        return cmd_keygen(args)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "report":
            from vmr_handler.host.report import cmd_report

            return cmd_report(args)
        if args.command == "mqtt-config":
            from vmr_handler.host.cli.mqtt_config.command import cmd_mqtt_config

            return cmd_mqtt_config(args)
        if args.command == "wait":
            return cmd_wait(args)
        if args.command == "completion":
            from vmr_handler.core.completion import completion_script

            print(completion_script(parser, args.shell))
            return EXIT_OK
        if args.command == "check":
            return cmd_check(args)
        if args.command == "schedule":
            from vmr_handler.host.cli.schedule.add import cmd_schedule_add
            from vmr_handler.host.cli.schedule.show import cmd_schedule_show

            return cmd_schedule_add(args) if args.schedule_cmd == "add" else cmd_schedule_show(args)
        if args.command in LIVE:
            return run_live(args, command)
        if args.command == "logs":
            from vmr_handler.host.cli.logs import show_logs

            return show_logs(args.logs, args.vm, args.follow, args.entry, args.stream, args.json)
        return cmd_client(args)
    except UsageError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HostSetupError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (ControlError, OSError) as exc:
        return runtime_error(exc)
