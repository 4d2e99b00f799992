"""Broker URL, names and the client options of the MQTT transport (``docs/mqtt.md``); the topic
tree is :mod:`vmr_handler.transports.mqtt.topics`."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any, Dict, Optional
from urllib.parse import urlsplit

from vmr_handler.core.errors import MqttError
from vmr_handler.core.names import name_problem


@dataclass(frozen=True)
class BrokerUrl:
    """A parsed ``mqtt://HOST:PORT`` or ``mqtts://HOST:PORT`` (TLS)."""

    host: str
    port: int
    tls: bool

    def __str__(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def parse_broker(url: str) -> BrokerUrl:
    """Parse a broker URL; the port defaults to 1883 (``mqtt``) or 8883 (``mqtts``).

    Raises:
        MqttError: another scheme, no host, a bad port, or a path/credentials in the URL.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise MqttError(f"broker URL {url!r}: the scheme must be mqtt:// or mqtts://")
    try:
        port = parts.port
    except ValueError as exc:
        raise MqttError(f"broker URL {url!r}: bad port ({exc})") from exc
    if not parts.hostname:
        raise MqttError(f"broker URL {url!r}: no host")
    if parts.username or parts.password:
        raise MqttError(f"broker URL {url!r}: give credentials as username/password, not in the URL")
    if parts.path not in ("", "/") or parts.query:
        raise MqttError(f"broker URL {url!r}: a broker URL has no path or query")
    tls = parts.scheme == "mqtts"
    return BrokerUrl(parts.hostname, port or (8883 if tls else 1883), tls)


def check_name(what: str, value: str) -> str:
    """``value`` if it can be a VM, experiment or host name (:func:`name_problem`).

    Raises:
        MqttError: naming ``what`` and what is wrong with ``value``.
    """
    why = name_problem(value) if isinstance(value, str) else "is not a string"
    if why:
        raise MqttError(f"{what} {value!r} {why}")
    return value


@dataclass
class MqttOptions:
    """How to reach and log in to the broker (config keys of the same names, ``docs/mqtt.md``).

    Attributes:
        broker: ``mqtt://HOST:PORT`` or ``mqtts://HOST:PORT``.
        experiment: the experiment name (second topic level).
        username, password: broker credentials (per VM for agents).
        ca_file: CA certificate file that signs the broker's certificate (mqtts).
        ca_pem: the same, inline PEM text (a fw_cfg blob carries no files).
        cert_file, key_file: client certificate and key when the broker requires one.
        cert_pem, key_pem: the same, inline PEM text (``mqtt-config --client-certs`` puts them
            in the per-VM fw_cfg blob).
        keepalive: MQTT keep-alive, seconds (the broker drops a silent client after 1.5x).
        connect_timeout: seconds to wait for CONNACK.
    """

    broker: str
    experiment: str
    username: Optional[str] = None
    password: Optional[str] = None
    ca_file: Optional[str] = None
    ca_pem: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    cert_pem: Optional[str] = None
    key_pem: Optional[str] = None
    keepalive: int = 15
    connect_timeout: float = 10.0

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that verifies the broker (system CAs unless a CA is given).

        Raises:
            MqttError: a CA or client certificate that cannot be loaded (named).
        """
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_pem)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise MqttError(f"cannot load the broker CA ({self.ca_file or 'ca_pem'}): {exc}") from exc
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise MqttError(f"cannot load the client certificate {self.cert_file}: {exc}") from exc
        elif self.cert_pem:
            _load_inline_chain(ctx, self.cert_pem, self.key_pem)
        return ctx


def _load_inline_chain(ctx: ssl.SSLContext, cert_pem: str, key_pem: Optional[str]) -> None:
    """Load an inline client certificate + key (``ssl`` reads only files: a private temp dir,
    mode 0700, removed at once).

    Raises:
        MqttError: the PEM text is not a usable certificate/key pair.
    """
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="vmr-tls-")
    try:
        cert, key = os.path.join(tmp, "client.crt"), os.path.join(tmp, "client.key")
        for path, text in ((cert, cert_pem), (key, key_pem or "")):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(text)
        ctx.load_cert_chain(cert, key if key_pem else None)
    except (OSError, ssl.SSLError, UnicodeError) as exc:
        raise MqttError(f"cannot load the inline client certificate (cert_pem/key_pem): {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: Keys of :class:`MqttOptions` accepted from a config file, a fw_cfg blob or a credentials
#: file (``password_file`` is read into ``password``).
OPTION_KEYS = {
    "broker": str, "experiment": str, "username": str, "password": str, "password_file": str,
    "ca_file": str, "ca_pem": str, "cert_file": str, "key_file": str, "cert_pem": str,
    "key_pem": str, "keepalive": int,
}  # fmt: skip


def options_from(settings: Dict[str, Any], source: str) -> MqttOptions:
    """:class:`MqttOptions` from a mapping of :data:`OPTION_KEYS` (other keys are ignored).

    Args:
        settings: merged settings (command line over fw_cfg over config file, ``docs/mqtt.md``).
        source: where they came from, for error messages.

    Raises:
        MqttError: no ``broker`` or ``experiment``, a value of the wrong type, a bad URL or
            name, an unreadable ``password_file``, or ``mqtts`` options without TLS.
    """
    for key, kind in OPTION_KEYS.items():
        value = settings.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise MqttError(f"{source}: {key} must be a {kind.__name__}, not {type(value).__name__}")
    broker, experiment = settings.get("broker"), settings.get("experiment")
    if not broker:
        raise MqttError(f"{source}: the MQTT transport needs a broker (mqtt[s]://HOST:PORT)")
    if not experiment:
        raise MqttError(f"{source}: the MQTT transport needs an experiment name")
    url = parse_broker(broker)
    check_name("experiment", experiment)
    password = settings.get("password")
    if settings.get("password_file"):
        try:
            with open(settings["password_file"], encoding="utf-8") as fh:
                password = fh.read().strip()
        except OSError as exc:
            raise MqttError(f"{source}: cannot read password_file: {exc}") from exc
    tls_keys = [
        k for k in ("ca_file", "ca_pem", "cert_file", "key_file", "cert_pem", "key_pem") if settings.get(k)
    ]
    if tls_keys and not url.tls:
        raise MqttError(f"{source}: {', '.join(tls_keys)} given but the broker URL is not mqtts://")
    return MqttOptions(
        broker=str(url),
        experiment=experiment,
        username=settings.get("username"),
        password=password,
        ca_file=settings.get("ca_file"),
        ca_pem=settings.get("ca_pem"),
        cert_file=settings.get("cert_file"),
        key_file=settings.get("key_file"),
        cert_pem=settings.get("cert_pem"),
        key_pem=settings.get("key_pem"),
        keepalive=int(settings.get("keepalive") or 15),
    )
