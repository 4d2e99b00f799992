"""Two brokers, bridged: what ``vmr-host mqtt-config`` writes for a member host whose VMs use
a broker of their own, bridged to the coordinator's (``docs/mqtt.md``, "Two brokers, bridged").

* On the **coordinator's broker** (``--bridge-member H``): a bridge user per member host
  (:func:`bridge_user`) whose ACL lets it read the coordinator's run and start and write
  ``H``'s announcement, nothing else (:func:`bridge_acl`), and its credentials for the
  member's broker in ``bridges/H.yaml`` (:func:`bridge_credentials`).
* On the **member's broker** (``--bridge-to HOST:PORT --bridge-credentials bridges/H.yaml``):
  mosquitto's own bridge (a ``connection`` section, :func:`render_bridge`) that carries
  exactly :func:`vmr_handler.transports.mqtt.topics.bridged_topics`. Each host serves its
  own VMs through its own broker, so no VM topic crosses, and a VM of one broker has no
  account on the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vmr_handler.core.errors import UsageError
from vmr_handler.core.names import name_problem
from vmr_handler.transports.mqtt.topics import bridged_topics

#: Username prefix of the bridge user of a member host on the coordinator's broker.
BRIDGE_USER_PREFIX = "bridge-"
#: QoS of every bridged topic (the hosts publish and subscribe them with QoS 1).
BRIDGE_QOS = 1
#: ``restart_timeout BASE CAP`` of the bridge, seconds: reconnect after a lost connection
#: with mosquitto's decorrelated jitter from 1 s up to 10 s (its default, 5 to 30 s, would
#: hold the members' announcements back for half a minute after the other broker restarts).
RESTART_TIMEOUT = (1, 10)


def bridge_user(member: str) -> str:
    """The MQTT username on the coordinator's broker of member host ``member``'s bridge."""
    return f"{BRIDGE_USER_PREFIX}{member}"


def bridge_acl(experiment: str, members: Sequence[str]) -> List[str]:
    """ACL lines (mosquitto ``user`` blocks) of the bridge users of ``members``: each reads
    the coordinator's run and start and writes its member's announcement, and nothing else
    (no VM topic, no other member's announcement, no host's start topic)."""
    lines: List[str] = []
    for member in members:
        lines += ["", f"user {bridge_user(member)}"]
        for name, direction in bridged_topics(experiment, member):
            lines.append(f"topic {'read' if direction == 'in' else 'write'} {name}")
    return lines


@dataclass(frozen=True)
class BridgeTo:
    """The bridge from this (member's) broker to the coordinator's.

    Attributes:
        host: the coordinator's broker as this broker reaches it (name or address).
        port: its listener port (its TLS listener when :attr:`ca_pem` is set).
        experiment: the experiment of the credentials (must be this configuration's).
        member: the member host id whose announcement the bridge carries (``--host-id`` of
            the ``vmr-host serve --member`` that uses this broker).
        username, password: the bridge user's credentials on the coordinator's broker.
        ca_pem: the coordinator's broker CA (PEM), or None for a plain connection.
        cert_pem, key_pem: the bridge user's client certificate and key (PEM), when that
            broker requires client certificates.
    """

    host: str
    port: int
    experiment: str
    member: str
    username: str
    password: str
    ca_pem: Optional[str] = None
    cert_pem: Optional[str] = None
    key_pem: Optional[str] = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` as mosquitto's ``address`` line takes it."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class BridgeFiles:
    """Absolute paths of the bridge's certificate files on the member's broker."""

    ca_cert: str
    client_cert: str
    client_key: str

    @classmethod
    def under(cls, out: str) -> BridgeFiles:
        """``out/bridge/ca.crt``, ``client.crt`` and ``client.key``."""
        base = os.path.join(out, "bridge")
        return cls(*(os.path.join(base, name) for name in ("ca.crt", "client.crt", "client.key")))


def parse_address(text: str) -> Tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as (host, port).

    Raises:
        UsageError: no port, a port outside 1-65535, or an empty or spaced host.
    """
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit():
        raise UsageError(f"--bridge-to {text!r}: give the coordinator's broker as HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise UsageError(f"--bridge-to {text!r}: port must be 1-65535")
    return host, int(port)


def load_bridge(address: str, path: str, experiment: str) -> BridgeTo:
    """The bridge to ``address`` with the credentials file ``path`` (``bridges/<member>.yaml``
    written by ``mqtt-config --bridge-member`` for the coordinator's broker).

    Raises:
        UsageError: a bad address; the file is missing, unreadable, not such a file, of
            another experiment, or names a bad member or user.
    """
    import yaml

    host, port = parse_address(address)
    try:
        with open(path, encoding="utf-8") as fh:
            doc: Any = yaml.safe_load(fh)
    except OSError as exc:
        raise UsageError(f"--bridge-credentials {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"--bridge-credentials {path}: not YAML ({exc})") from exc
    wanted = ("experiment", "member", "username", "password")
    if not isinstance(doc, dict) or any(not isinstance(doc.get(key), str) for key in wanted):
        raise UsageError(
            f"--bridge-credentials {path}: not a bridge credentials file (it needs {', '.join(wanted)}; "
            "use bridges/<member>.yaml of mqtt-config --bridge-member on the coordinator's broker)"
        )
    if doc["experiment"] != experiment:
        raise UsageError(
            f"--bridge-credentials {path} is for experiment {doc['experiment']!r}, not {experiment!r}"
        )
    for kind in ("member", "username"):
        why = name_problem(doc[kind])
        if why:
            raise UsageError(f"--bridge-credentials {path}: {kind} {doc[kind]!r} {why}")
    if not doc["password"] or any(c.isspace() for c in doc["password"]):
        raise UsageError(f"--bridge-credentials {path}: the password is empty or has whitespace")
    pems = {
        key: doc.get(key) if isinstance(doc.get(key), str) else None
        for key in ("ca_pem", "cert_pem", "key_pem")
    }
    return BridgeTo(host, port, doc["experiment"], doc["member"], doc["username"], doc["password"], **pems)


def bridge_credentials(experiment: str, member: str, password: str, broker: str) -> Dict[str, Any]:
    """The ``bridges/<member>.yaml`` document: ``experiment``, ``member``, ``username``
    (:func:`bridge_user`), ``password``, ``broker`` (this broker's URL on this machine, for
    reference: the member's broker is told its address by ``--bridge-to``); the caller adds
    the PEMs with TLS (``ca_pem``; ``cert_pem``/``key_pem`` with client certificates)."""
    return {
        "experiment": experiment,
        "member": member,
        "username": bridge_user(member),
        "password": password,
        "broker": broker,
    }


def render_bridge(bridge: BridgeTo, files: BridgeFiles) -> List[str]:
    """The ``connection`` section of ``mosquitto.conf`` for ``bridge`` (after the listeners).

    MQTT 3.1.1 with ``try_private`` (mosquitto to mosquitto: retained messages keep their
    retain flag across the bridge, so the coordinator's start is retained on both brokers);
    ``cleansession false``, so each broker queues what the other misses while one restarts;
    state notifications on the member's broker only (the bridge user may write nothing else
    on the coordinator's). With TLS, the coordinator's broker is verified against its CA and
    its host name (``bridge_insecure false``).
    """
    lines = [
        "",
        f"# Bridge to the coordinator's broker: the coordination topics of member host {bridge.member}",
        f"connection vmr-{bridge.experiment}-{bridge.member}",
        f"address {bridge.address}",
        f"remote_clientid {bridge.username}",
        f"remote_username {bridge.username}",
        f"remote_password {bridge.password}",
        "bridge_protocol_version mqttv311",
        "try_private true",
        "cleansession false",
        "start_type automatic",
        f"restart_timeout {RESTART_TIMEOUT[0]} {RESTART_TIMEOUT[1]}",
        "notifications true",
        "notifications_local_only true",
    ]
    lines += [
        f"topic {name} {direction} {BRIDGE_QOS}"
        for name, direction in bridged_topics(bridge.experiment, bridge.member)
    ]
    if bridge.ca_pem is not None:
        lines += [f"bridge_cafile {files.ca_cert}", "bridge_insecure false", "bridge_tls_version tlsv1.2"]
        if bridge.cert_pem is not None and bridge.key_pem is not None:
            lines += [f"bridge_certfile {files.client_cert}", f"bridge_keyfile {files.client_key}"]
    return lines
