"""The broker's files of ``vmr-host mqtt-config`` (:mod:`vmr_handler.host.cli.mqtt_config.command`) as text:
``mosquitto.conf``, the ACL and the password file.

Password hashes come from ``mosquitto_passwd -U`` when it is installed, else
:func:`hash_password` (PBKDF2-HMAC-SHA512 from :mod:`hashlib`, the format mosquitto 2.0 reads).
"""

from __future__ import annotations

# The rest of the standard library is imported where it is used (see mqttlayout).
import os
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from vmr_handler.core.errors import InvalidArgument, OsCallFailed
from vmr_handler.host.cli.mqtt_config.bridges import BridgeFiles, bridge_acl, render_bridge
from vmr_handler.host.cli.mqtt_config.layout import MqttLayout
from vmr_handler.transports.mqtt.topics import VM_TOPICS, experiment_topics, topic, vm_shared_topics

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


def render_acl(
    experiment: str, host_users: Sequence[str], vms: Sequence[str] = (), bridge_members: Sequence[str] = ()
) -> str:
    """The mosquitto ACL file: one ``pattern`` line per ``VM_TOPICS`` leaf (the topic tree,
    :mod:`vmr_handler.transports.mqtt.topics`; ``%u`` is the connecting username, i.e. the VM
    name), then a ``user`` block per host user with ``topic readwrite vmr/<experiment>/#``,
    then one per VM of ``vms`` with its experiment's shared topics (``vm_shared_topics``: read
    the hosts' start topics; a ``user`` block, not a pattern, so that no VM of another
    experiment sharing the broker gets them), then one per bridge user of ``bridge_members``
    (:func:`vmr_handler.host.cli.mqtt_config.bridges.bridge_acl`: the coordination topics
    only). Anything not granted is denied (mosquitto ACL files are allow-lists), so a VM
    reaches no other VM's topics, no other ``_hosts`` topic and no other experiment, and a
    bridge no VM topic (SPEC §6).
    """
    lines = [
        f"# mosquitto ACL of vmr experiment {experiment} (vmr-host mqtt-config; docs/mqtt.md).",
        "# VMs: the username is the VM name; each reaches only its own vmr/EXPERIMENT/VM/ topics.",
        *(f"pattern {access} {topic(experiment, '%u', leaf)}" for leaf, access in VM_TOPICS),
    ]
    for user in host_users:
        lines += ["", f"user {user}", f"topic readwrite {experiment_topics(experiment)}"]
    shared = [f"topic {access} {name}" for name, access in vm_shared_topics(experiment)]
    if vms:
        lines += ["", "# Each VM of the experiment reads every host's start for all its VMs."]
    for vm in vms:
        lines += ["", f"user {vm}", *shared]
    if bridge_members:
        lines += ["", "# Bridges of member hosts' brokers: the coordination topics of their member only."]
        lines += bridge_acl(experiment, bridge_members)
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
    (mosquitto requires it then); otherwise the auth block is global. With
    :attr:`MqttLayout.bridge_to`, the bridge's ``connection`` section comes last
    (:func:`vmr_handler.host.cli.mqtt_config.bridges.render_bridge`; it holds the bridge
    user's password, so the file is then written 0600 for the broker user).
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
    if layout.bridge_to is not None:
        lines += render_bridge(layout.bridge_to, BridgeFiles.under(layout.out))
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
        InvalidArgument: a username or password contains ``:`` or a line break (the file's
            separators: ``mosquitto_passwd -U`` would hash only part of such a password).
        OSError: ``mosquitto_passwd`` failed (its message) or the temp file failed.
    """
    import subprocess
    import tempfile

    for user, password in credentials.items():
        if any(sep in text for text in (user, password) for sep in ":\r\n"):
            raise InvalidArgument(f"user {user!r}: ':' or a line break in a password-file entry")
    if tool is None:
        return "".join(f"{u}:{hash_password(p)}\n" for u, p in credentials.items()).encode()
    fd, path = tempfile.mkstemp(prefix="vmr-passwd-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f"{u}:{p}\n" for u, p in credentials.items()))
        done = subprocess.run([tool, "-U", path], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            raise OsCallFailed(f"{tool} -U failed ({done.returncode}): {said}")
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)
