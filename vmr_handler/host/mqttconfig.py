"""``vmr-host mqtt-config``: a mosquitto configuration for one experiment (issue 6 §2).

Writes, into one output directory, everything a broker and its clients need so that every
VM reaches only its own topics (SPEC §6: "per-VM credentials/ACL so that one VM can neither
read nor write another VM's topics"; SPEC §7: every guest is hostile):

::

    DIR/mosquitto.conf        listeners, auth, persistence (no secrets; 0644)
    DIR/passwd                mosquitto password file ($7$ PBKDF2-SHA512; 0600, broker user)
    DIR/acl                   pattern ACL for VMs, user blocks for hosts (0600, broker user)
    DIR/data/                 persistence directory (0700, broker user)
    DIR/tls/ca.crt server.crt server.key       with --tls (key 0600, broker user)
    DIR/private/ca.key        with --tls: the CA key, never read by the broker (0600)
    DIR/vms/<vm>.yaml         one self-contained agent config per VM (fw_cfg blob; 0600)
    DIR/host/<user>.yaml      one config per host user (0600)

The topic tree (``docs/mqtt.md``) is defined once here: :data:`VM_TOPICS`, :func:`topic`.
Certificates come from the ``cryptography`` x509 builder; passwords from :mod:`secrets`;
password hashes from ``mosquitto_passwd -U`` when it is installed, else :func:`hash_password`
(PBKDF2-HMAC-SHA512 from :mod:`hashlib`, the format mosquitto 2.0 reads).
"""

from __future__ import annotations

# The rest of the standard library is imported where it is used: this module is imported by
# every ``vmr-host`` command line (argparse), and ``status``/``resume`` must start quickly.
import argparse
import os
import re
import stat
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vmr_handler.core.errors import UsageError
from vmr_handler.core.names import name_problem
from vmr_handler.host.specs import load_specs

#: First level of every topic.
TOPIC_ROOT = "vmr"
#: Per-VM topic leaves under ``vmr/<experiment>/<vm>/`` and what the VM itself may do there
#: (mosquitto ACL access). The host users may read and write all of them.
VM_TOPICS: Tuple[Tuple[str, str], ...] = (
    ("up", "write"),  # agent -> host, QoS 1
    ("down", "read"),  # host -> agent, QoS 1
    ("presence", "write"),  # retained online/offline, offline is the agent's last will
    ("start", "read"),  # retained start-time message written by the host
)
#: Topic level below ``vmr/<experiment>/`` reserved for host-to-host coordination; VM names
#: may not start with ``_``, so no VM can ever be named like it.
HOSTS_LEVEL = "_hosts"
DEFAULT_HOST_USER = "vmr-host"
DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
#: QEMU fw_cfg name under which ``vms/<vm>.yaml`` is passed to the guest.
FW_CFG_NAME = "opt/org.vmr/config"
#: Largest MQTT packet the broker accepts (SPEC §7 size limits): room for a 1 MiB protocol
#: frame (docs/protocol.md) several times over, far below mosquitto's 256 MiB default.
MAX_PACKET_SIZE = 4 * 1024 * 1024
#: QoS 1 messages queued per offline client (mosquitto's default is 1000): a host that is
#: down for a while keeps its backlog; the agent resends anything lost beyond it anyway.
MAX_QUEUED_MESSAGES = 100_000
#: Bytes queued per client (in flight + waiting): a VM that asks for data and never reads it
#: cannot fill the broker's memory (messages beyond are dropped; the protocol asks again).
MAX_QUEUED_BYTES = 128 * 1024 * 1024
#: PBKDF2 iterations and salt length of ``mosquitto_passwd`` 2.0 (its ``$7$`` format).
PBKDF2_ITERATIONS = 101
PBKDF2_SALT_BYTES = 12
#: The OS user a root-started mosquitto drops to when its config has no ``user`` line.
MOSQUITTO_DEFAULT_USER = "mosquitto"
WILDCARD_BINDS = ("0.0.0.0", "::", "")
#: A DNS name for the server certificate and the VMs' broker URL.
HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")


def topic(experiment: str, vm: str, leaf: str) -> str:
    """The topic ``vmr/<experiment>/<vm>/<leaf>`` (``docs/mqtt.md``, topic tree)."""
    return f"{TOPIC_ROOT}/{experiment}/{vm}/{leaf}"


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


def layout_from_args(args: argparse.Namespace) -> MqttLayout:
    """Check the ``mqtt-config`` arguments and make the :class:`MqttLayout`.

    Raises:
        UsageError: a bad experiment, VM or host user name (SPEC §6 topic tree; names
            starting with ``_`` are reserved), duplicates, a host user named like a VM (it
            would get the VM's topics and the host's), unusable ``--vms-from`` schedules,
            TLS-only options without ``--tls``, clashing ports, a wildcard ``--bind``
            without ``--broker-host``, a bad ``--hostname`` or ``--days``.
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
        if not (_is_ip(name.strip("[]")) or HOSTNAME.match(name)):
            raise UsageError(f"{name!r} is not a host name or IP address (--broker-host/--hostname)")
    if not 1 <= args.days <= 36500:
        raise UsageError(f"--days must be 1-36500, got {args.days}")
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
    )


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------- rendered contents
def render_acl(experiment: str, host_users: Sequence[str]) -> str:
    """The mosquitto ACL file: one ``pattern`` line per :data:`VM_TOPICS` leaf (``%u`` is
    the connecting username, i.e. the VM name), then a ``user`` block per host user with
    ``topic readwrite vmr/<experiment>/#``. Anything not granted is denied (mosquitto ACL
    files are allow-lists), so a VM reaches no other VM's topics, no ``_hosts`` topic and
    no other experiment (SPEC §6).
    """
    lines = [
        f"# mosquitto ACL of vmr experiment {experiment} (vmr-host mqtt-config; docs/mqtt.md).",
        "# VMs: the username is the VM name; each reaches only its own vmr/EXPERIMENT/VM/ topics.",
        *(f"pattern {access} {topic(experiment, '%u', leaf)}" for leaf, access in VM_TOPICS),
    ]
    for user in host_users:
        lines += ["", f"user {user}", f"topic readwrite {TOPIC_ROOT}/{experiment}/#"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BrokerPaths:
    """Absolute paths the broker config names (all under :attr:`MqttLayout.out`)."""

    passwd: str
    acl: str
    data: str
    ca_cert: str
    server_cert: str
    server_key: str

    @classmethod
    def under(cls, out: str) -> BrokerPaths:
        """The standard layout of ``out`` (see the module docstring)."""
        tls = os.path.join(out, "tls")
        return cls(
            passwd=os.path.join(out, "passwd"),
            acl=os.path.join(out, "acl"),
            data=os.path.join(out, "data"),
            ca_cert=os.path.join(tls, "ca.crt"),
            server_cert=os.path.join(tls, "server.crt"),
            server_key=os.path.join(tls, "server.key"),
        )


def render_conf(layout: MqttLayout, paths: BrokerPaths) -> str:
    """``mosquitto.conf`` for mosquitto 2.0.

    Anonymous clients are refused, every client authenticates against ``passwd`` and is
    confined by ``acl``; ``use_username_as_clientid`` stops one client from taking over
    (disconnecting) another's session by reusing its client id. With both a plain and a TLS
    listener, ``per_listener_settings true`` and the auth block after each listener
    (mosquitto requires it then); otherwise the auth block is global.
    """
    auth = [
        "allow_anonymous false",
        f"password_file {paths.passwd}",
        f"acl_file {paths.acl}",
    ]
    per_listener = layout.port is not None and layout.tls_port is not None
    lines = [
        f"# mosquitto 2.0 broker of vmr experiment {layout.experiment}: vmr-host mqtt-config (docs/mqtt.md).",
        "# Started as root, mosquitto drops to the 'user' below (default: mosquitto); that user",
        "# owns passwd, acl, tls/server.key and data/.",
    ]
    if per_listener:
        lines.append("per_listener_settings true")
    if layout.broker_user:
        lines.append(f"user {layout.broker_user}")
    lines += [
        "persistence true",
        f"persistence_location {paths.data}",
        "log_dest stderr",
        "log_timestamp true",
        f"max_packet_size {MAX_PACKET_SIZE}",
        f"max_queued_messages {MAX_QUEUED_MESSAGES}",
        f"max_queued_bytes {MAX_QUEUED_BYTES}",
    ]
    if not per_listener:
        lines += ["", *auth]
    if layout.port is not None:
        lines += ["", f"listener {layout.port} {layout.bind}", "use_username_as_clientid true"]
        lines += auth if per_listener else []
    if layout.tls_port is not None:
        lines += [
            "",
            f"listener {layout.tls_port} {layout.bind}",
            "use_username_as_clientid true",
            f"cafile {paths.ca_cert}",
            f"certfile {paths.server_cert}",
            f"keyfile {paths.server_key}",
            "tls_version tlsv1.2",
        ]
        if layout.client_certs:
            lines.append("require_certificate true")
        lines += auth if per_listener else []
    return "\n".join(lines) + "\n"


def hash_password(password: str, salt: Optional[bytes] = None, iterations: int = PBKDF2_ITERATIONS) -> str:
    """The mosquitto 2.0 ``$7$`` hash of ``password``: ``$7$ITER$b64(salt)$b64(dk)`` with
    dk = PBKDF2-HMAC-SHA512(password, salt, ITER, 64 bytes) (:func:`hashlib.pbkdf2_hmac`),
    the format ``mosquitto_passwd`` writes. ``salt`` defaults to 12 random bytes.
    """
    import base64
    import hashlib
    import secrets

    salt = secrets.token_bytes(PBKDF2_SALT_BYTES) if salt is None else salt
    dk = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(dk).decode()}"


def render_passwd(credentials: Dict[str, str], tool: Optional[str]) -> bytes:
    """The password file for ``{username: password}``.

    ``tool`` is a ``mosquitto_passwd`` executable: the plain ``user:password`` lines are
    written to a private temp file and hashed in place with ``mosquitto_passwd -U`` (no
    password on any command line). Without it, :func:`hash_password` hashes them.

    Raises:
        ValueError: a username or password contains ``:`` or a line break (the file's
            separators: ``mosquitto_passwd -U`` would hash only part of such a password).
        OSError: ``mosquitto_passwd`` failed (its message) or the temp file failed.
    """
    import subprocess
    import tempfile

    for user, password in credentials.items():
        if any(sep in text for text in (user, password) for sep in ":\r\n"):
            raise ValueError(f"user {user!r}: ':' or a line break in a password-file entry")
    if tool is None:
        return "".join(f"{u}:{hash_password(p)}\n" for u, p in credentials.items()).encode()
    fd, path = tempfile.mkstemp(prefix="vmr-passwd-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f"{u}:{p}\n" for u, p in credentials.items()))
        done = subprocess.run([tool, "-U", path], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise OSError(f"{tool} -U failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)


# ------------------------------------------------------------------------------------ TLS
@dataclass(frozen=True)
class Pki:
    """A CA (key kept for issuing more certificates later) and the broker's certificate.

    Attributes are PEM bytes.
    """

    ca_key: bytes
    ca_cert: bytes
    server_key: bytes
    server_cert: bytes


def _names(names: Sequence[str]) -> List[Any]:
    import ipaddress

    from cryptography import x509

    out: List[Any] = []
    for name in dict.fromkeys(n.strip("[]") for n in names):
        if _is_ip(name):
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        else:
            out.append(x509.DNSName(name))
    return out


def issue(
    ca_key_pem: bytes, ca_cert_pem: bytes, common_name: str, days: int, server_names: Sequence[str] = ()
) -> Tuple[bytes, bytes]:
    """A leaf key and certificate signed by the CA (``cryptography`` x509 builder, EC P-256).

    With ``server_names``: a server certificate (SAN = those names, EKU serverAuth);
    without: a client certificate for ``common_name`` (EKU clientAuth), so a VM's client
    certificate can never pose as the broker.

    Returns:
        (key PEM, certificate PEM).
    """
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if server_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(_names(server_names)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def make_pki(experiment: str, server_names: Sequence[str], days: int) -> Pki:
    """A new CA for ``experiment`` and a server certificate for ``server_names``
    (``cryptography`` x509 builder; EC P-256, SHA-256 signatures).
    """
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"vmr {experiment} broker CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca_key, ca_cert = _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)
    server_key, server_cert = issue(ca_key, ca_cert, "vmr broker", days, server_names)
    return Pki(ca_key, ca_cert, server_key, server_cert)


# --------------------------------------------------------------------------------- writing
def _yaml(doc: Dict[str, Any]) -> bytes:
    """``doc`` as YAML, PEM blocks as literal ``|`` scalars (readable, still plain YAML)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False).encode()


def _write(path: str, data: bytes, mode: int, owner: Optional[Tuple[int, int]] = None) -> None:
    """Write ``path`` atomically with ``mode`` (and ``owner``) set before any byte lands."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, *owner)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _mkdir(path: str, mode: int, owner: Optional[Tuple[int, int]] = None) -> None:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, *owner)


def broker_owner(user: Optional[str]) -> Optional[Tuple[int, int]]:
    """(uid, gid) that must own the files the broker reads, or None when no chown is needed.

    Only when this runs as root: a root-started mosquitto drops to ``user`` (default
    ``mosquitto``; ``qemu-mqtt-lab.md``), which then must be able to read ``passwd``,
    ``acl`` and the server key and write ``data/``. Not as root: the broker runs as the
    current user, who owns everything already.

    Raises:
        UsageError: ``user`` names no OS user (mosquitto would exit at start).
    """
    import pwd

    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(user or MOSQUITTO_DEFAULT_USER)
    except KeyError:
        if user:
            raise UsageError(f"--user {user}: no such OS user (mosquitto would refuse to start)") from None
        return None  # mosquitto falls back to 'nobody': only --user makes that work
    return (entry.pw_uid, entry.pw_gid)


def unreachable_ancestor(path: str, uid: int, gid: int) -> Optional[str]:
    """The first directory on the way to ``path`` that user ``uid``/``gid`` cannot enter
    (no execute permission for it), or None. ``uid`` 0 enters everything.
    """
    if uid == 0:
        return None
    current = os.path.abspath(path)
    chain = []
    while True:
        chain.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(chain):
        st = os.stat(directory)
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        if not st.st_mode & bit:
            return directory
    return None


def _prepare_out(layout: MqttLayout) -> None:
    out = layout.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} exists and is not a directory")
    if os.path.exists(os.path.join(out, "mosquitto.conf")) and not layout.force:
        raise UsageError(
            f"--out {out} already holds a configuration (mosquitto.conf); --force replaces it "
            "(every password changes)"
        )
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {out}: {exc.strerror}") from exc
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out} is not writable")
    probe = os.path.join(out, ".vmr-write-probe")
    try:
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"--out {out} is not writable: {exc.strerror}") from exc
    if layout.force:  # credentials of VMs no longer listed would only mislead
        for sub in ("vms", "host"):
            directory = os.path.join(out, sub)
            if os.path.isdir(directory):
                for name in os.listdir(directory):
                    if name.endswith(".yaml"):
                        os.unlink(os.path.join(directory, name))


def generate(layout: MqttLayout, passwd_tool: Optional[str] = None) -> List[str]:
    """Write the whole configuration of ``layout`` into ``layout.out``.

    Args:
        layout: the checked options.
        passwd_tool: ``mosquitto_passwd`` to hash with (None: :func:`hash_password`).

    Returns:
        Warnings for the operator (e.g. the broker user cannot reach ``out``).

    Raises:
        UsageError: ``out`` is not a directory, not writable, or already configured
            (without ``force``); ``--user`` names no OS user.
        OSError: writing failed (disk, ``mosquitto_passwd``).
    """
    import secrets

    owner = broker_owner(layout.broker_user)
    _prepare_out(layout)
    out, paths = layout.out, BrokerPaths.under(layout.out)
    warnings: List[str] = []
    if owner is not None:
        blocked = unreachable_ancestor(out, *owner)
        if blocked:
            warnings.append(
                f"the broker user (uid {owner[0]}) cannot enter {blocked}: mosquitto started as root "
                "will not read its password file; chmod o+x it or choose another --out"
            )
    elif os.geteuid() == 0 and not layout.broker_user:
        warnings.append(
            f"no OS user {MOSQUITTO_DEFAULT_USER!r}: a root-started mosquitto becomes 'nobody'; pass --user"
        )
    os.chmod(out, 0o755)

    credentials = {name: secrets.token_urlsafe(24) for name in (*layout.vms, *layout.host_users)}
    _write(paths.passwd, render_passwd(credentials, passwd_tool), 0o600, owner)
    _write(paths.acl, render_acl(layout.experiment, layout.host_users).encode(), 0o600, owner)
    _mkdir(paths.data, 0o700, owner)

    tls: Dict[str, str] = {}
    pki: Optional[Pki] = None
    if layout.tls:
        names = ["127.0.0.1", "localhost", layout.broker_host, *layout.hostnames]
        if layout.bind not in WILDCARD_BINDS:
            names.append(layout.bind)
        pki = make_pki(layout.experiment, names, layout.days)
        _mkdir(os.path.dirname(paths.ca_cert), 0o755)
        _write(paths.ca_cert, pki.ca_cert, 0o644)
        _write(paths.server_cert, pki.server_cert, 0o644)
        _write(paths.server_key, pki.server_key, 0o600, owner)
        _mkdir(os.path.join(out, "private"), 0o700)
        _write(os.path.join(out, "private", "ca.key"), pki.ca_key, 0o600)
        tls["ca_pem"] = pki.ca_cert.decode()

    def client(doc: Dict[str, Any], user: str) -> bytes:
        doc.update(tls)
        if pki is not None and layout.client_certs:
            key, cert = issue(pki.ca_key, pki.ca_cert, user, layout.days)
            doc.update(cert_pem=cert.decode(), key_pem=key.decode())
        return _yaml(doc)

    for sub in ("vms", "host"):
        _mkdir(os.path.join(out, sub), 0o700)
    common = {"transport": "mqtt", "experiment": layout.experiment}
    for vm in layout.vms:
        doc = {**common, "broker": layout.broker_url(layout.broker_host), "vm_name": vm, "username": vm}
        doc["password"] = credentials[vm]
        _write(os.path.join(out, "vms", f"{vm}.yaml"), client(doc, vm), 0o600)
    for user in layout.host_users:
        doc = {**common, "broker": layout.broker_url(layout.local_host), "username": user}
        doc["password"] = credentials[user]
        _write(os.path.join(out, "host", f"{user}.yaml"), client(doc, user), 0o600)
    _write(os.path.join(out, "mosquitto.conf"), render_conf(layout, paths).encode(), 0o644)
    return warnings


def cmd_mqtt_config(args: argparse.Namespace) -> int:
    """``vmr-host mqtt-config``: check the arguments, write the configuration, print a summary.

    Raises:
        UsageError: bad input (see :func:`layout_from_args` and :func:`generate`).
        OSError: writing failed.
    """
    import shutil

    layout = layout_from_args(args)
    for warning in generate(layout, shutil.which("mosquitto_passwd")):
        print(f"vmr-host: warning: {warning}", file=sys.stderr)
    listeners = [f"{layout.bind}:{layout.port} (plain)"] if layout.port is not None else []
    if layout.tls_port is not None:
        listeners.append(
            f"{layout.bind}:{layout.tls_port} (TLS{', client certificates' if layout.client_certs else ''})"
        )
    print(
        f"experiment {layout.experiment}: {len(layout.vms)} VM(s), "
        f"host user(s) {', '.join(layout.host_users)}; listeners {', '.join(listeners)}\n"
        f"  broker:  mosquitto -c {os.path.join(layout.out, 'mosquitto.conf')}\n"
        f"  VMs:     {os.path.join(layout.out, 'vms')}/<vm>.yaml "
        f"(QEMU: -fw_cfg name={FW_CFG_NAME},file={os.path.join(layout.out, 'vms')}/<vm>.yaml)\n"
        f"  hosts:   {os.path.join(layout.out, 'host')}/<user>.yaml"
    )
    return 0
