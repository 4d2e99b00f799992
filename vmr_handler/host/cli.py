"""``vmr-host`` command line: argparse front end of the host controller.

Commands::

    vmr-host serve --schedules DIR [--resources DIR] [--logs DIR] [--channels DIR]
                   [--start-buffer SECONDS] [--expect VM,...] [--connect] [--allow-class NAME]...
                   [--http HOST:PORT [--http-url URL] [--http-cert FILE [--http-key FILE]]]
    vmr-host status [--logs DIR] [--json]
    vmr-host resume (VM... | --all) [--logs DIR] [--json]
    vmr-host release [--exclude VM...] [--logs DIR] [--json]
    vmr-host keygen --out DIR [--force]

Exit codes: 0 success; 1 runtime error (no running vmr-host, a socket in use, the disk);
2 bad usage or bad input (unusable schedule, unknown VM, a socket path too long, a request
the running host refused).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from vmr_handler import __version__
from vmr_handler.core.errors import ControlError, UsageError
from vmr_handler.core.fsutil import utc_text
from vmr_handler.host.config import HostConfig
from vmr_handler.host.specs import load_specs

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
DEFAULT_LOGS = "vmr-logs"

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


def _parser() -> argparse.ArgumentParser:
    """The ``vmr-host`` parser: the global flags, then one sub-command per :data:`_COMMANDS` entry."""
    parser = argparse.ArgumentParser(
        prog="vmr-host",
        description="Host controller of a vmr-handler experiment: delivers schedules over each VM's "
        "virtio-serial channel, runs the start barrier, relays RESUME, keeps per-VM logs.",
    )
    parser.add_argument("--version", action="version", version=f"vmr-host {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="more logging (info; twice: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
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
        "--signing-key",
        metavar="FILE",
        help="Ed25519 private key (`vmr-host keygen`): sign schedules, start time and RESUME",
    )
    _add_serve_mqtt(serve)
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
    serve.add_argument("--http-debug-rate", type=_positive, metavar="BYTES/S", help=argparse.SUPPRESS)
    _add_serve_http(serve)


def _add_serve_mqtt(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` group "MQTT transport": broker, credentials, several hosts on one broker."""
    mq = serve.add_argument_group("MQTT transport (docs/mqtt.md)")
    mq.add_argument(
        "--transport",
        choices=["virtio-serial", "mqtt"],
        default="virtio-serial",
        help="how VMs are reached (default virtio-serial channel sockets)",
    )
    mq.add_argument("--broker", metavar="URL", help="mqtt://HOST:PORT or mqtts://HOST:PORT")
    mq.add_argument("--experiment", metavar="NAME", help="experiment name (topic vmr/NAME/...)")
    mq.add_argument(
        "--credentials",
        metavar="FILE",
        help="YAML with broker, experiment, username, password, ca_file|ca_pem, cert_file, key_file "
        "(as written by `vmr-host mqtt-config`); flags win",
    )
    mq.add_argument("--username", metavar="NAME", help="broker username of this host")
    mq.add_argument("--password-file", metavar="FILE", help="file holding the broker password")
    mq.add_argument("--ca-file", metavar="FILE", help="CA certificate of the broker (mqtts)")
    mq.add_argument("--cert-file", metavar="FILE", help="client certificate (mqtts, when required)")
    mq.add_argument("--key-file", metavar="FILE", help="client key (mqtts, when required)")
    mq.add_argument(
        "--host-id", metavar="NAME", help="this host among hosts sharing a broker (default hostname)"
    )
    role = mq.add_mutually_exclusive_group()
    role.add_argument(
        "--coordinator",
        action="store_true",
        help="several hosts share the broker and this one decides the start for all (with --peers)",
    )
    role.add_argument(
        "--member",
        action="store_true",
        help="several hosts share the broker: announce this host's VMs, take the coordinator's start",
    )
    mq.add_argument(
        "--peers",
        action="append",
        default=[],
        metavar="HOST,...",
        help="(coordinator) the other hosts' --host-id: the start waits for each one's VMs",
    )


def _add_serve_http(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` group "VM resources over HTTP(S)": ``--http*``."""
    web = serve.add_argument_group("VM resources over HTTP(S) (docs/host.md)")
    web.add_argument("--http", metavar="HOST:PORT", help="serve `filename` drops over HTTP(S) here")
    web.add_argument("--http-url", metavar="URL", help="base URL agents use (default http[s]://HOST:PORT)")
    web.add_argument("--http-cert", metavar="FILE", help="PEM server certificate: serve HTTPS")
    web.add_argument("--http-key", metavar="FILE", help="PEM key of --http-cert (if not in it)")


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``status [--logs DIR] [--json]``."""
    status = sub.add_parser("status", help="every VM and whom the barrier waits for")
    _add_logs(status)
    status.add_argument("--json", action="store_true", help="print the full status as JSON")


def _add_resume(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``resume (VM... | --all) [--logs DIR] [--json]``."""
    resume = sub.add_parser("resume", help="send a RESUME to VMs (stamped with host experiment time)")
    resume.add_argument("vms", nargs="*", metavar="VM")
    resume.add_argument("--all", action="store_true", help="every VM")
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
    """``mqtt-config``: its options are :func:`vmr_handler.host.mqttlayout.add_arguments`."""
    from vmr_handler.host.mqttlayout import add_arguments as mqtt_config_arguments

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


#: The sub-commands, in the order ``vmr-host --help`` lists them.
_COMMANDS: Tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    _add_serve,
    _add_status,
    _add_resume,
    _add_release,
    _add_mqtt_config,
    _add_keygen,
    _add_report,
)


# ---------------------------------------------------------------------------------- serve
def build_config(args: argparse.Namespace) -> HostConfig:
    """A :class:`HostConfig` from ``serve`` arguments.

    Raises:
        UsageError: bad schedules or ``--expect`` naming a VM without a schedule.
    """
    import dataclasses

    from vmr_handler.host.config import Limits

    specs = load_specs(args.schedules, args.allow_class)
    limits = dataclasses.replace(Limits(), heartbeat=args.heartbeat, silent_after=args.silent_after)
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
        from vmr_handler.core.signing import load_private_key

        try:
            signing_key = load_private_key(args.signing_key)
        except SigningError as exc:
            raise UsageError(f"--signing-key: {exc}") from exc
    http = None
    if args.http:
        from vmr_handler.host.httpopts import parse_http_options

        try:
            http = parse_http_options(
                args.http, args.http_url, args.http_cert, args.http_key, args.http_debug_rate
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    elif args.http_url or args.http_cert or args.http_key:
        raise UsageError("--http-url/--http-cert/--http-key need --http HOST:PORT")
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
        http=http,
    )


def mqtt_options(args: argparse.Namespace) -> Any:
    """:class:`~vmr_handler.transports.mqtt.options.MqttOptions` from ``--credentials`` and flags.

    Raises:
        UsageError: unreadable credentials file, or options the MQTT transport cannot use.
    """
    import yaml

    from vmr_handler.core.errors import MqttError
    from vmr_handler.transports.mqtt.options import options_from

    settings: Dict[str, Any] = {}
    source = "command line"
    if args.credentials:
        source = args.credentials
        try:
            with open(args.credentials, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read --credentials {args.credentials}: {exc}") from exc
        if not isinstance(doc, dict):
            raise UsageError(f"--credentials {args.credentials}: must be a YAML mapping")
        settings.update(doc)
    for key in ("broker", "experiment", "username", "password_file", "ca_file", "cert_file", "key_file"):
        if getattr(args, key, None):
            settings[key] = getattr(args, key)
            if key == "password_file":
                settings.pop("password", None)
    try:
        return options_from(settings, source)
    except MqttError as exc:
        raise UsageError(str(exc)) from exc


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the host controller until SIGTERM/SIGINT (exit 0), or fail at set-up (1/2)."""
    import asyncio

    from vmr_handler.host.channels import open_channels
    from vmr_handler.host.server import HostServer

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
    log.warning("vmr-host stopped")
    return EXIT_OK


# -------------------------------------------------------------------------------- clients
def _request(args: argparse.Namespace, payload: Dict[str, Any]) -> Dict[str, Any]:
    from vmr_handler.core.control import request_at
    from vmr_handler.host.config import control_socket_path

    return request_at(control_socket_path(args.logs), payload)


def _ago(now: float, ts: Optional[float]) -> str:
    if ts is None:
        return "-"
    d = now - ts
    return f"{d:.1f}s ago" if d < 120 else f"{d / 60:.0f}m ago"


def format_status(result: Dict[str, Any]) -> str:
    """The human form of a ``status`` result."""
    now = float(result.get("now") or time.time())
    exp = result["experiment"]
    lines: List[str] = []
    if exp["start_time"] is None:
        waiting = exp["waiting_for"]
        lines.append(
            f"experiment start: not set; barrier waiting for {len(waiting)} VM(s): "
            + (", ".join(waiting) if waiting else "nobody")
        )
    else:
        delta = exp["start_time"] - now
        when = f"in {delta:.1f}s" if delta > 0 else f"{-delta:.1f}s ago"
        lines.append(f"experiment start: {utc_text(exp['start_time'])} ({when})")
    cfg = exp["configured"]
    lines.append(
        f"expected: {len(exp['expected'])} VM(s), configured {sum(1 for v in exp['expected'] if v in cfg)}"
        + (f"; excluded: {', '.join(exp['excluded'])}" if exp["excluded"] else "")
        + (f"; released: {', '.join(exp['released'])}" if exp["released"] else "")
    )
    header = ("VM", "CONN", "STATE", "STAGE", "LAST SEEN", "LATENESS", "FAILURES", "NOTES")
    rows = [header]
    for vm in result["vms"]:
        conn = "yes" if vm["connected"] else "no"
        if vm["connected"] and vm.get("silent"):
            conn = "silent"
        late = vm["max_lateness"]
        notes: List[str] = []
        if not vm["expected"]:
            notes.append("not expected")
        if vm["failed"]:
            notes.append(f"failed: {vm['failed'][:60]}")
        if vm["schedule"]["state"] == "rejected":
            notes.append(f"schedule rejected: {(vm['schedule']['details'] or '')[:60]}")
        bad = vm["frames"]["malformed"] + vm["frames"]["oversize"] + sum(vm["refused"].values())
        if bad:
            notes.append(f"{bad} refused/malformed")
        rows.append(
            (
                vm["vm"],
                conn,
                vm["state"],
                vm["stage"] or "-",
                _ago(now, vm["last_seen"]),
                "-" if late is None else f"{late * 1000:.1f}ms",
                str(vm["failures"]),
                "; ".join(notes),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    pending = [r for r in result.get("resumes", []) if set(r["targets"]) - set(r["answered"])]
    for r in pending:
        missing = sorted(set(r["targets"]) - set(r["answered"]))
        lines.append(f"RESUME {r['id']} (at {r['at']}) not yet answered by: {', '.join(missing)}")
    return "\n".join(lines)


def cmd_client(args: argparse.Namespace) -> int:
    """``status``/``resume``/``release``: talk to the running ``vmr-host serve``."""
    if args.command == "status":
        payload: Dict[str, Any] = {"cmd": "status"}
    elif args.command == "resume":
        if bool(args.vms) == bool(args.all):
            raise UsageError("resume needs VM names or --all (not both)")
        payload = {"cmd": "resume", "all": True} if args.all else {"cmd": "resume", "vms": args.vms}
    else:
        payload = {"cmd": "release", "exclude": args.exclude}
    reply = _request(args, payload)
    if reply.get("status") != "success":
        print(f"vmr-host: error: {reply.get('details')}", file=sys.stderr)
        return EXIT_USAGE
    result = reply["result"]
    if args.json:
        print(json.dumps(result, indent=1))
    elif args.command == "status":
        print(format_status(result))
    elif args.command == "resume":
        at = result["at"]
        print(
            f"RESUME {result['id']} at host experiment time {at if isinstance(at, str) else f'{at:.3f}'} s: "
            f"sent to {', '.join(result['sent_now']) or 'none'}"
            + (
                f"; pending (sent at their next handshake): {', '.join(result['pending'])}"
                if result["pending"]
                else ""
            )
        )
    else:
        if result["start_time"] is not None:
            print(f"experiment start time set: {utc_text(result['start_time'])}")
        else:
            excluded, waiting = ", ".join(result["excluded"]), ", ".join(result["waiting_for"])
            print(f"excluded {excluded}; still waiting for {waiting}")
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``vmr-host`` console script. Returns the exit code."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    level = logging.WARNING
    if args.verbose:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from vmr_handler.core.errors import HostSetupError

    if args.command == "keygen":
        from vmr_handler.host.keygen import cmd_keygen

        return cmd_keygen(args)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "report":
            from vmr_handler.host.report import cmd_report

            return cmd_report(args)
        if args.command == "mqtt-config":
            from vmr_handler.host.mqttconfig import cmd_mqtt_config

            return cmd_mqtt_config(args)
        return cmd_client(args)
    except UsageError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HostSetupError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ControlError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
