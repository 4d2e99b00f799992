"""What ``vmr-host mqtt-config`` generates (:mod:`vmr_handler.host.cli.mqtt_config.command`): the command's
options and their checked form, :class:`MqttLayout`.

The topic tree (``docs/mqtt.md``) is :mod:`vmr_handler.transports.mqtt.topics`.
"""

from __future__ import annotations

# The rest of the standard library is imported where it is used: this module is imported by
# every ``vmr-host`` command line (argparse), and ``status``/``resume`` must start quickly.
import argparse
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from vmr_handler.core.errors import UsageError
from vmr_handler.core.names import name_problem
from vmr_handler.host.cli.mqtt_config.bridges import BridgeTo, bridge_user, load_bridge
from vmr_handler.host.serve.specs import load_specs

DEFAULT_HOST_USER = "vmr-host"
DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
#: QEMU fw_cfg name under which ``vms/<vm>.yaml`` is passed to the guest.
FW_CFG_NAME = "opt/org.vmr/config"
#: The OS user a root-started mosquitto drops to when its config has no ``user`` line.
MOSQUITTO_DEFAULT_USER = "mosquitto"
WILDCARD_BINDS = ("0.0.0.0", "::", "")
#: A DNS name for the server certificate and the VMs' broker URL.
HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")


# ------------------------------------------------------------------------------- checking
def check_names(kind: str, names: Sequence[str]) -> None:
    """Refuse bad or duplicate names, listing every problem.

    Raises:
        UsageError: naming each bad name, what is wrong with it, and each duplicate
            (``kind`` says which option, e.g. ``"VM"``).
    """
    problems: List[str] = []
    seen: Dict[str, int] = {}
    for name in names:
        why = name_problem(name)
        if why:
            problems.append(f"{kind} name {name!r} {why}")
        seen[name] = seen.get(name, 0) + 1
    problems += [f"{kind} name {name!r} is given {n} times" for name, n in seen.items() if n > 1]
    if problems:
        raise UsageError("; ".join(problems))


def split_list(values: Sequence[str]) -> List[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (repeatable, comma-separated options).

    Empty items are kept (``"a,,b"``) so that :func:`check_names` reports them.
    """
    return [item.strip() for value in values for item in value.split(",")]


# ------------------------------------------------------------------------------ the layout
@dataclass(frozen=True)
class MqttLayout:
    """What ``mqtt-config`` generates, checked (:func:`layout_from_args`).

    Attributes:
        experiment: the experiment name (second topic level).
        vms: VM names; each is also that VM's MQTT username.
        host_users: MQTT usernames of the vmr-host processes.
        out: output directory, absolute (the broker config names files by absolute path).
        bind: address the listeners bind to.
        port: plain listener port, or None for none.
        tls_port: TLS listener port, or None without TLS.
        broker_host: broker address written into the VMs' configs.
        hostnames: extra names/addresses in the server certificate.
        client_certs: the TLS listener requires a client certificate (one per VM and host).
        broker_user: the ``user`` line of mosquitto.conf (None: mosquitto's default).
        days: certificate validity, days.
        force: replace an existing configuration in ``out``.
        bridge_members: member hosts whose own brokers bridge to this one (the coordinator's):
            a bridge user each (``--bridge-member``).
        bridge_to: this (member's) broker's bridge to the coordinator's, or None
            (``--bridge-to`` and ``--bridge-credentials``).
    """

    experiment: str
    vms: Tuple[str, ...]
    host_users: Tuple[str, ...]
    out: str
    bind: str
    port: Optional[int]
    tls_port: Optional[int]
    broker_host: str
    hostnames: Tuple[str, ...]
    client_certs: bool
    broker_user: Optional[str]
    days: int
    force: bool
    bridge_members: Tuple[str, ...] = ()
    bridge_to: Optional[BridgeTo] = None

    @property
    def tls(self) -> bool:
        """A TLS listener is configured."""
        return self.tls_port is not None

    def broker_url(self, host: str) -> str:
        """``mqtts://HOST:TLS_PORT`` with TLS, else ``mqtt://HOST:PORT`` (IPv6 in brackets)."""
        shown = f"[{host}]" if ":" in host else host
        if self.tls_port is not None:
            return f"mqtts://{shown}:{self.tls_port}"
        return f"mqtt://{shown}:{self.port}"

    @property
    def local_host(self) -> str:
        """The address host processes on this machine use: the bind address, or loopback."""
        return "127.0.0.1" if self.bind in WILDCARD_BINDS else self.bind


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``mqtt-config`` options (``vmr-host mqtt-config --help``; docs/mqtt.md)."""
    p.add_argument("--experiment", required=True, metavar="NAME", help="experiment name (topic vmr/NAME/...)")
    vms = p.add_mutually_exclusive_group(required=True)
    vms.add_argument(
        "--vms", action="append", metavar="VM,...", help="VM names (comma-separated, repeatable)"
    )
    vms.add_argument(
        "--vms-from", metavar="DIR", help="the VMs of a schedules directory (<vm>.pkl|.yaml|.json, as serve)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument(
        "--host-user",
        action="append",
        default=[],
        metavar="NAME,...",
        help=f"MQTT username(s) of vmr-host processes (repeatable; default {DEFAULT_HOST_USER})",
    )
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR", help="listener address (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=_port,
        metavar="N",
        help=f"plain listener port (default {DEFAULT_PORT}; with --tls: no plain listener unless given)",
    )
    p.add_argument("--tls", action="store_true", help="a TLS listener; a CA and server certificate are made")
    p.add_argument(
        "--tls-port", type=_port, metavar="N", help=f"TLS listener port (default {DEFAULT_TLS_PORT})"
    )
    p.add_argument(
        "--client-certs",
        action="store_true",
        help="with --tls: require a client certificate (one is made per VM and host user)",
    )
    p.add_argument(
        "--hostname",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name or IP address in the server certificate (repeatable)",
    )
    p.add_argument(
        "--broker-host",
        metavar="HOST",
        help="broker address as the VMs reach it (default --bind; 10.0.2.2 for QEMU user networking)",
    )
    p.add_argument(
        "--user",
        metavar="OSUSER",
        help=f"OS user a root-started mosquitto runs as (default: mosquitto's own, {MOSQUITTO_DEFAULT_USER})",
    )
    p.add_argument("--days", type=int, default=365, metavar="N", help="certificate validity (default 365)")
    p.add_argument(
        "--allow-class", action="append", default=[], metavar="MODULE.NAME", help="as serve, for --vms-from"
    )
    p.add_argument("--force", action="store_true", help="replace a configuration already in --out")
    p.add_argument(
        "--bridge-member",
        action="append",
        default=[],
        metavar="HOST,...",
        help="on the coordinator's broker: member host ids (--host-id) whose own broker bridges to this "
        "one; writes bridges/HOST.yaml for each (repeatable)",
    )
    p.add_argument(
        "--bridge-to",
        metavar="HOST:PORT",
        help="on a member's broker: bridge to the coordinator's broker at HOST:PORT (with the next)",
    )
    p.add_argument(
        "--bridge-credentials",
        metavar="FILE",
        help="bridges/<member>.yaml that mqtt-config --bridge-member wrote for the coordinator's broker",
    )


def _bridging(
    args: argparse.Namespace, vms: Sequence[str], host_users: Sequence[str]
) -> Tuple[Tuple[str, ...], Optional[BridgeTo]]:
    """The checked ``--bridge-member`` hosts and ``--bridge-to`` bridge.

    Raises:
        UsageError: bad or duplicate member host ids, a bridge user named like a VM or host
            user, ``--bridge-to`` without ``--bridge-credentials`` or the reverse, both
            kinds of bridging on one broker, a ``--bridge-to`` host that is no host name or IP
            address, or a bad credentials file (:func:`load_bridge`).
    """
    members = split_list(args.bridge_member) if args.bridge_member else []
    check_names("bridge member host", members)
    clash = sorted({bridge_user(m) for m in members} & {*vms, *host_users})
    if clash:
        raise UsageError(f"bridge user(s) {', '.join(clash)} are also VM or host user names: rename them")
    if (args.bridge_to is None) != (args.bridge_credentials is None):
        raise UsageError("--bridge-to and --bridge-credentials go together (the address and the bridge user)")
    if args.bridge_to is None:
        return tuple(members), None
    if members:
        raise UsageError(
            "--bridge-member is for the coordinator's broker and --bridge-to for a member's: not both "
            "(every member's broker bridges to the coordinator's directly)"
        )
    bridge = load_bridge(args.bridge_to, args.bridge_credentials, args.experiment)
    if not (is_ip(bridge.host) or HOSTNAME.match(bridge.host)):
        raise UsageError(f"--bridge-to {args.bridge_to!r}: {bridge.host!r} is not a host name or IP address")
    if bridge.username in {*vms, *host_users}:
        raise UsageError(f"the bridge user {bridge.username} is also a VM or host user name here")
    return (), bridge


def layout_from_args(args: argparse.Namespace) -> MqttLayout:
    """Check the ``mqtt-config`` arguments and make the :class:`MqttLayout`.

    Raises:
        UsageError: a bad experiment, VM or host user name (SPEC §6 topic tree; names
            starting with ``_`` are reserved), duplicates, a host user named like a VM (it
            would get the VM's topics and the host's), unusable ``--vms-from`` schedules,
            TLS-only options without ``--tls``, clashing ports, a wildcard ``--bind``
            without ``--broker-host``, a bad ``--hostname`` or ``--days``, bad bridging
            options (:func:`_bridging`).
    """
    check_names("experiment", [args.experiment])
    if args.vms_from is not None:
        vms = sorted(load_specs(args.vms_from, args.allow_class))
    else:
        vms = split_list(args.vms)
    check_names("VM", vms)
    if not vms:
        raise UsageError("--vms names no VM")
    host_users = split_list(args.host_user) if args.host_user else [DEFAULT_HOST_USER]
    check_names("host user", host_users)
    clash = sorted(set(host_users) & set(vms))
    if clash:
        raise UsageError(
            f"host user(s) {', '.join(clash)} are also VM names: a VM must never get host access"
        )
    if not args.tls:
        for flag, value in (("--tls-port", args.tls_port), ("--client-certs", args.client_certs)):
            if value:
                raise UsageError(f"{flag} needs --tls")
        if args.hostname:
            raise UsageError("--hostname needs --tls (it goes into the server certificate)")
    tls_port = (args.tls_port or DEFAULT_TLS_PORT) if args.tls else None
    port = args.port if args.tls else (args.port or DEFAULT_PORT)
    if port is not None and port == tls_port:
        raise UsageError(f"--port and --tls-port are both {port}")
    if not args.bind or any(c.isspace() for c in args.bind):
        raise UsageError(f"--bind {args.bind!r} is not an address")
    broker_host = args.broker_host or args.bind
    if broker_host in WILDCARD_BINDS:
        raise UsageError(
            f"--bind {args.bind} listens everywhere: say which address VMs use with --broker-host"
        )
    for name in [broker_host, *args.hostname]:
        if not (is_ip(name.strip("[]")) or HOSTNAME.match(name)):
            raise UsageError(f"{name!r} is not a host name or IP address (--broker-host/--hostname)")
    if not 1 <= args.days <= 36500:
        raise UsageError(f"--days must be 1-36500, got {args.days}")
    members, bridge_to = _bridging(args, vms, host_users)
    return MqttLayout(
        experiment=args.experiment,
        vms=tuple(vms),
        host_users=tuple(host_users),
        out=os.path.abspath(args.out),
        bind=args.bind,
        port=port,
        tls_port=tls_port,
        broker_host=broker_host,
        hostnames=tuple(args.hostname),
        client_certs=bool(args.client_certs),
        broker_user=args.user,
        days=args.days,
        force=args.force,
        bridge_members=members,
        bridge_to=bridge_to,
    )


def is_ip(text: str) -> bool:
    """``text`` is an IPv4 or IPv6 address (no brackets)."""
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
