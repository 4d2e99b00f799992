"""The ``--console*`` and ``--name`` flags of ``vmr-host serve``: argparse group and
their checking into :class:`~vmr_handler.host.serve.config.ConsoleOptions`."""

from __future__ import annotations

import argparse
import os
from typing import Optional

from vmr_handler.core.errors import UsageError
from vmr_handler.host.serve.config import ConsoleOptions

#: Where ``--console`` binds when only a port is given (guests must never reach the console).
LOOPBACK = "127.0.0.1"


def add_console_args(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` group "operators' console": ``--console``, ``--console-cert``,
    ``--console-key`` and ``--name``."""
    g = serve.add_argument_group("operators' console (docs/console.md)")
    g.add_argument(
        "--console",
        metavar="[HOST:]PORT",
        help="serve the web console, REST API /api/v1 and /metrics here (default host 127.0.0.1; "
        "the token is in <logs>/console.token)",
    )
    g.add_argument(
        "--console-cert", metavar="FILE", help="PEM server certificate: serve the console over HTTPS"
    )
    g.add_argument("--console-key", metavar="FILE", help="PEM key of --console-cert (if not in it)")
    g.add_argument("--name", help="the experiment's name (console and report title)")


def console_options(args: argparse.Namespace) -> Optional[ConsoleOptions]:
    """:class:`ConsoleOptions` from the flags, or None without ``--console``.

    Raises:
        UsageError: a malformed ``--console`` (not ``[HOST:]PORT``, port not 0-65535), a missing
            certificate or key file, or ``--console-cert/--console-key`` without ``--console``;
            the message names the flag.
    """
    if not args.console:
        if args.console_cert or args.console_key:
            raise UsageError("--console-cert/--console-key need --console [HOST:]PORT")
        return None
    host, sep, port_text = str(args.console).rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep:
        host = LOOPBACK
    if not host or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise UsageError(f"--console {args.console!r}: expected [HOST:]PORT with a port 0-65535")
    if args.console_key and not args.console_cert:
        raise UsageError("--console-key needs --console-cert")
    for flag, path in (("--console-cert", args.console_cert), ("--console-key", args.console_key)):
        if path and not os.path.isfile(path):
            raise UsageError(f"{flag} {path}: no such file")
    return ConsoleOptions(host, int(port_text), args.console_cert, args.console_key)


def experiment_name(args: argparse.Namespace, mqtt_experiment: Optional[str]) -> str:
    """``--name``, else the MQTT experiment, else the schedules directory's name."""
    if args.name:
        return str(args.name)
    if mqtt_experiment:
        return mqtt_experiment
    return os.path.basename(os.path.abspath(args.schedules)) or "experiment"
