"""``vmr-host mqtt-config``: a mosquitto configuration for one experiment.

Writes, into one output directory, everything a broker and its clients need so that every
VM reaches only its own topics (SPEC §6: "per-VM credentials/ACL so that one VM can neither
read nor write another VM's topics"; SPEC §7: every guest is hostile):

::

    DIR/mosquitto.conf        listeners, auth, persistence (no secrets; 0644)
    DIR/passwd                mosquitto password file ($7$ PBKDF2-SHA512; 0600, broker user)
    DIR/acl                   pattern ACL for VMs, user blocks for hosts and for each VM's
                              read of the hosts' start topics (0600, broker user)
    DIR/data/                 persistence directory (0700, broker user)
    DIR/tls/ca.crt server.crt server.key       with --tls (key 0600, broker user)
    DIR/private/ca.key        with --tls: the CA key, never read by the broker (0600)
    DIR/vms/<vm>.yaml         one self-contained agent config per VM (fw_cfg blob; 0600)
    DIR/host/<user>.yaml      one config per host user (0600)
    DIR/bridges/<member>.yaml with --bridge-member: a member broker's bridge credentials (0600)
    DIR/bridge/ca.crt client.crt client.key    with --bridge-to over TLS (key 0600, broker user)

The pieces live in :mod:`vmr_handler.host.cli.mqtt_config.layout` (topic tree :data:`VM_TOPICS`,
:func:`topic`; options; :class:`MqttLayout`), :mod:`vmr_handler.host.cli.mqtt_config._files` (the broker's
files as text; password hashes from ``mosquitto_passwd -U`` when it is installed, else
:func:`hash_password`, PBKDF2-HMAC-SHA512 from :mod:`hashlib`, the format mosquitto 2.0 reads)
and :mod:`vmr_handler.host.cli.mqtt_config._tls` (certificates from the ``cryptography`` x509 builder);
passwords come from :mod:`secrets`. This module writes them all out (:func:`generate`), runs
the command (:func:`cmd_mqtt_config`) and re-exports the pieces' public names.
"""

from __future__ import annotations

# The rest of the standard library is imported where it is used: this module is imported by
# every ``vmr-host`` command line (argparse), and ``status``/``resume`` must start quickly.
import argparse
import os
import stat
import sys
from typing import Any, Dict, List, Optional, Tuple

from vmr_handler.core.errors import UsageError
from vmr_handler.host.cli.mqtt_config._files import (
    BrokerPaths,
    render_acl,
    render_conf,
    render_passwd,
)
from vmr_handler.host.cli.mqtt_config._tls import Pki, issue, make_pki
from vmr_handler.host.cli.mqtt_config.bridges import BridgeFiles, bridge_credentials, bridge_user
from vmr_handler.host.cli.mqtt_config.layout import (
    FW_CFG_NAME,
    MOSQUITTO_DEFAULT_USER,
    WILDCARD_BINDS,
    MqttLayout,
    layout_from_args,
)


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
        for sub in ("vms", "host", "bridges"):
            directory = os.path.join(out, sub)
            if os.path.isdir(directory):
                for name in os.listdir(directory):
                    if name.endswith(".yaml"):
                        os.unlink(os.path.join(directory, name))
        bridge = BridgeFiles.under(out)  # an earlier bridge's certificate and key
        for path in (bridge.ca_cert, bridge.client_cert, bridge.client_key):
            if os.path.exists(path):
                os.unlink(path)


def _owner_warnings(layout: MqttLayout, owner: Optional[Tuple[int, int]]) -> List[str]:
    """What the operator should know about the broker user's access to ``layout.out``."""
    if owner is not None:
        blocked = unreachable_ancestor(layout.out, *owner)
        if blocked:
            return [
                f"the broker user (uid {owner[0]}) cannot enter {blocked}: mosquitto started as root "
                "will not read its password file; chmod o+x it or choose another --out"
            ]
    elif os.geteuid() == 0 and not layout.broker_user:
        return [
            f"no OS user {MOSQUITTO_DEFAULT_USER!r}: a root-started mosquitto becomes 'nobody'; pass --user"
        ]
    return []


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
    warnings = _owner_warnings(layout, owner)
    os.chmod(out, 0o755)

    bridge_users = [bridge_user(member) for member in layout.bridge_members]
    credentials = {
        name: secrets.token_urlsafe(24) for name in (*layout.vms, *layout.host_users, *bridge_users)
    }
    _write(paths.passwd, render_passwd(credentials, passwd_tool), 0o600, owner)
    acl = render_acl(layout.experiment, layout.host_users, layout.vms, layout.bridge_members)
    _write(paths.acl, acl.encode(), 0o600, owner)
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

    for sub in ("vms", "host", *(("bridges",) if layout.bridge_members else ())):
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
    for member in layout.bridge_members:
        url = layout.broker_url(layout.local_host)
        doc = bridge_credentials(layout.experiment, member, credentials[bridge_user(member)], url)
        _write(os.path.join(out, "bridges", f"{member}.yaml"), client(doc, bridge_user(member)), 0o600)
    _write_bridge_certs(layout, owner)
    conf = render_conf(layout, paths).encode()  # holds the bridge's password when bridged
    _write(os.path.join(out, "mosquitto.conf"), conf, 0o644 if layout.bridge_to is None else 0o600, owner)
    return warnings


def _write_bridge_certs(layout: MqttLayout, owner: Optional[Tuple[int, int]]) -> None:
    """The CA (and client certificate and key) of a ``--bridge-to`` bridge over TLS, as files
    for mosquitto (:class:`BridgeFiles`; the key 0600 for the broker user); nothing otherwise."""
    bridge = layout.bridge_to
    if bridge is None or bridge.ca_pem is None:
        return
    files = BridgeFiles.under(layout.out)
    _mkdir(os.path.dirname(files.ca_cert), 0o755)
    _write(files.ca_cert, bridge.ca_pem.encode(), 0o644)
    if bridge.cert_pem is not None and bridge.key_pem is not None:
        _write(files.client_cert, bridge.cert_pem.encode(), 0o644)
        _write(files.client_key, bridge.key_pem.encode(), 0o600, owner)


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
    for member in layout.bridge_members:
        print(
            f"  bridge:  {os.path.join(layout.out, 'bridges', member + '.yaml')} for member host {member}'s "
            "broker (mqtt-config --bridge-to THIS_BROKER:PORT --bridge-credentials FILE there)"
        )
    if layout.bridge_to is not None:
        print(
            f"  bridged: to {layout.bridge_to.address} as {layout.bridge_to.username}, carrying the "
            f"coordination topics of member host {layout.bridge_to.member}"
        )
    return 0
