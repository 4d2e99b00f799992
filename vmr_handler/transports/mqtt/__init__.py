"""MQTT transport: the same protocol as virtio-serial, carried by a broker (issue 6, SPEC §6).

Topic tree (``docs/mqtt.md``), experiment ``E``, VM ``V`` (the VM's broker username):

========================  =============  ======================================================
topic                     written by     what
========================  =============  ======================================================
``vmr/E/V/up``            agent          protocol frames agent -> host (QoS 1)
``vmr/E/V/down``          host           protocol frames host -> agent (QoS 1)
``vmr/E/V/presence``      agent          retained ``{"state": "online"|"offline", ...}``;
                                         ``offline`` is the agent's last will
``vmr/E/V/start``         host           retained ``start_time`` frame: a late or rebooted VM
                                         learns the experiment start at once
``vmr/E/_hosts/...``      hosts          host-to-host coordination (never VMs)
========================  =============  ======================================================

Payloads are the newline-framed JSON messages of ``docs/protocol.md`` (one or more whole
frames per MQTT message), so the session layers of both sides are the same code for both
transports. Every client uses MQTT v5 with ``clean_start=False`` and a session expiry, so
QoS 1 messages published while one side is away are delivered when it comes back.

This module holds what the agent and ``vmr-host`` share (broker URL, topic names, a paho
client bridged into asyncio) and the agent's :class:`MqttChannel`. paho-mqtt 2.x does the
MQTT protocol work, keep-alives and the network thread; nothing MQTT is written by hand.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from vmr_handler.core.errors import ChannelClosed, MqttError
from vmr_handler.core.names import name_problem
from vmr_handler.transports.channel import ByteChannel

log = logging.getLogger(__name__)

#: Seconds the broker keeps a disconnected client's session (subscriptions + queued QoS 1).
SESSION_EXPIRY = 7 * 24 * 3600
#: Publishes not yet acknowledged by the broker before :meth:`PahoBridge.publish` waits.
MAX_INFLIGHT = 200


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


@dataclass(frozen=True)
class Topics:
    """The topics of one VM of one experiment (see the module docstring)."""

    experiment: str
    vm: str

    @property
    def base(self) -> str:
        return f"vmr/{self.experiment}/{self.vm}"

    @property
    def up(self) -> str:
        return self.base + "/up"

    @property
    def down(self) -> str:
        return self.base + "/down"

    @property
    def presence(self) -> str:
        return self.base + "/presence"

    @property
    def start(self) -> str:
        return self.base + "/start"


def vm_of(topic: str, experiment: str) -> Optional[Tuple[str, str]]:
    """``(vm, leaf)`` of ``vmr/<experiment>/<vm>/<leaf>``, or None for any other topic."""
    parts = topic.split("/")
    if len(parts) != 4 or parts[0] != "vmr" or parts[1] != experiment:
        return None
    return parts[2], parts[3]


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


class PahoBridge:
    """One paho-mqtt client driven by the asyncio event loop, its callbacks delivered there.

    paho's own network thread (``loop_start``) waits in ``select()``, which refuses file
    descriptors of 1024 and above: a host serving ~500 VMs (two log files each) got a broker
    socket above that and could never connect (measured, ``benchmarks/README.md``). So the
    socket is watched by the event loop instead (paho's external-loop callbacks:
    ``on_socket_open/close/register_write/unregister_write`` + ``loop_read/loop_write/
    loop_misc``; epoll, no thread). Only the blocking connect (TCP, TLS handshake, CONNECT)
    runs in a worker thread; every paho callback after it runs on the event loop.

    Messages arrive on :attr:`messages` as ``(topic, payload)``; a lost connection puts
    ``None`` there (the caller makes a new bridge to reconnect: the broker keeps the session).

    Args:
        options: broker and credentials.
        client_id: the MQTT client id (stable across reconnects: the session is keyed by it).
        subscriptions: ``[(topic filter, qos)]`` subscribed on every connect.
        will: ``(topic, payload)`` published retained by the broker if this client vanishes.
    """

    def __init__(
        self,
        options: MqttOptions,
        client_id: str,
        subscriptions: List[Tuple[str, int]],
        will: Optional[Tuple[str, bytes]] = None,
    ) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.options = options
        self.url = parse_broker(options.broker)
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.messages: asyncio.Queue[Optional[Tuple[str, bytes]]] = asyncio.Queue()
        self._subscriptions = subscriptions
        self._connected: asyncio.Future[None] = self._loop.create_future()
        self._inflight = 0
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False
        self.refusals: Dict[str, str] = {}  # topic (filter) -> why the broker refused it
        self._pending: Dict[int, str] = {}  # message id -> topic, until the broker acks
        self._fd: Optional[int] = None  # the socket the event loop watches
        self._writing = False
        self._misc: Optional[asyncio.Task[None]] = None
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        client.max_inflight_messages_set(MAX_INFLIGHT)
        client.max_queued_messages_set(0)
        if options.username is not None:
            client.username_pw_set(options.username, options.password)
        if self.url.tls:
            client.tls_set_context(options.ssl_context())
        if will is not None:
            client.will_set(will[0], will[1], qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        self._props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        self._props.SessionExpiryInterval = SESSION_EXPIRY
        self.client = client

    # ------------------------------------------------------------ paho callbacks
    def _call(self, fn: Any, *args: Any) -> None:
        """Run ``fn`` on the event loop: now when called there, else (the connect worker) soon."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _on_socket_open(self, _c: Any, _u: Any, sock: Any) -> None:
        self._call(self._watch, sock)

    def _watch(self, sock: Any) -> None:
        fd = sock.fileno()
        if fd < 0 or self.closed:  # closed again before the loop got here (a failed connect)
            return
        self._fd = fd
        self._loop.add_reader(fd, self._readable, sock)
        if self._writing:
            self._loop.add_writer(fd, self._writable)
        if self._misc is None:
            self._misc = self._loop.create_task(self._misc_loop())

    def _on_socket_close(self, _c: Any, _u: Any, _sock: Any) -> None:
        self._call(self._unwatch)

    def _unwatch(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
            self._fd = None

    def _on_register_write(self, _c: Any, _u: Any, _sock: Any) -> None:
        self._call(self._want_write, True)

    def _on_unregister_write(self, _c: Any, _u: Any, _sock: Any) -> None:
        self._call(self._want_write, False)

    def _want_write(self, on: bool) -> None:
        self._writing = on
        if self._fd is None:
            return
        if on:
            self._loop.add_writer(self._fd, self._writable)
        else:
            self._loop.remove_writer(self._fd)

    def _readable(self, sock: Any) -> None:
        self.client.loop_read()
        # TLS: decrypted bytes may wait in the SSL object with nothing left on the socket
        while self._fd is not None and isinstance(sock, ssl.SSLSocket) and sock.pending():
            self.client.loop_read()

    def _writable(self) -> None:
        self.client.loop_write()

    async def _misc_loop(self) -> None:
        """Keep-alive pings and their timeouts (paho's ``loop_misc``), once a second."""
        while not self.closed and self.client.loop_misc() == 0:
            await asyncio.sleep(1.0)

    def _on_connect(self, client: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self._call(self._set_connected, MqttError(f"broker {self.url} refused the connection: {reason}"))
            return
        if self._subscriptions:
            client.subscribe([(t, q) for t, q in self._subscriptions])
        self._call(self._set_connected, None)

    def _set_connected(self, exc: Optional[BaseException]) -> None:
        if self._connected.done():
            return
        if exc is None:
            self._connected.set_result(None)
        else:
            self._connected.set_exception(exc)

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        self._call(self._lost, str(reason))

    def _lost(self, reason: str) -> None:
        self._set_connected(ChannelClosed(f"broker {self.url} closed the connection: {reason}"))
        if not self.closed:
            self.closed = True
            self.messages.put_nowait(None)
        self._room.set()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        self.messages.put_nowait((msg.topic, bytes(msg.payload)))

    def _on_publish(self, _c: Any, _u: Any, mid: Any, reason: Any, _props: Any) -> None:
        self._inflight -= 1
        if self._inflight < MAX_INFLIGHT:
            self._room.set()
        topic = self._pending.pop(mid, "?")
        if getattr(reason, "is_failure", False):  # MQTT v5 PUBACK 0x87 Not authorized (ACL)
            self._note_refusal(topic, f"publish refused: {reason}")

    def _on_subscribe(self, _c: Any, _u: Any, _mid: Any, reasons: Any, _props: Any) -> None:
        bad = [str(r) for r in reasons if getattr(r, "is_failure", False)]
        if bad:
            topics = ", ".join(t for t, _q in self._subscriptions)
            self._note_refusal(topics, f"subscription refused: {', '.join(bad)}")

    def _note_refusal(self, topic: str, why: str) -> None:
        """Log a refusal by the broker once per topic (mosquitto 2.0 refuses publishes outside
        the ACL with PUBACK 0x87; it grants such subscriptions but delivers nothing)."""
        if self.refusals.get(topic) == why:
            return
        self.refusals[topic] = why
        log.error(
            "broker %s: %s on %s (this client's credentials do not cover that topic: check the VM "
            "name, username and the broker's ACL)",
            self.url,
            why,
            topic,
        )

    # ------------------------------------------------------------ asyncio side
    async def connect(self) -> None:
        """Connect and subscribe; returns once the broker accepted.

        Raises:
            MqttError: the broker refused (bad credentials, not authorised) or TLS failed.
            OSError: the broker cannot be reached (the caller retries with backoff).
        """
        connect = functools.partial(
            self.client.connect,
            self.url.host,
            self.url.port,
            keepalive=self.options.keepalive,
            clean_start=False,
            properties=self._props,
        )
        try:  # TCP + TLS handshake + CONNECT in a worker thread: errors surface here, named
            await asyncio.wait_for(self._loop.run_in_executor(None, connect), self.options.connect_timeout)
            await asyncio.wait_for(asyncio.shield(self._connected), self.options.connect_timeout)
        except ssl.SSLCertVerificationError as exc:
            self.close()
            raise MqttError(
                f"broker {self.url}: TLS certificate not trusted ({exc.verify_message}): "
                "check ca_file/ca_pem and the broker's certificate names"
            ) from exc
        except ssl.SSLError as exc:
            self.close()
            raise MqttError(f"broker {self.url}: TLS failed: {exc}") from exc
        except asyncio.TimeoutError as exc:
            self.close()
            raise OSError(f"no answer from broker {self.url} in {self.options.connect_timeout:g} s") from exc
        except ChannelClosed as exc:
            self.close()
            raise OSError(str(exc)) from exc
        except MqttError:
            self.close()
            raise
        except (OSError, ValueError) as exc:
            self.close()
            raise OSError(f"cannot reach broker {self.url}: {exc}") from exc

    async def publish(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, expiry: Optional[int] = None
    ) -> None:
        """Publish; waits while :data:`MAX_INFLIGHT` publishes are unacknowledged.

        ``expiry``: seconds after which the broker drops the message if it is still queued
        for an offline subscriber (MQTT v5 Message Expiry Interval); None: never.

        Raises:
            ChannelClosed: the connection is gone (the caller reconnects; QoS 1 reports are
                kept in the agent's outbox / the host's session and sent again).
        """
        while self._inflight >= MAX_INFLIGHT and not self.closed:
            self._room.clear()
            await self._room.wait()
        if self.closed:
            raise ChannelClosed(f"broker {self.url}: not connected")
        if not self.publish_nowait(topic, payload, qos, retain, expiry):
            raise ChannelClosed(f"broker {self.url}: publish failed")

    def publish_nowait(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, expiry: Optional[int] = None
    ) -> bool:
        """Publish without waiting for room (host fan-out); False when not connected.

        Event loop thread only (like every use of the client after :meth:`connect`)."""
        if self.closed:
            return False
        props = None
        if expiry is not None:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.MessageExpiryInterval = int(expiry)
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=props)
        if info.rc != 0:
            return False
        self._inflight += 1
        self._pending[info.mid] = topic
        return True

    def close(self) -> None:
        """Disconnect cleanly (no last will): queued packets and DISCONNECT are written now,
        as far as the socket takes them; the loop stops watching the socket."""
        self.closed = True
        try:
            self.client.disconnect()
            self.client.loop_write()
        except Exception:  # already gone
            pass
        self._unwatch()
        if self._misc is not None:
            self._misc.cancel()
        self._room.set()


def presence_payload(state: str, **info: Any) -> bytes:
    """The retained presence message: ``{"state": "online"|"offline", ...}`` as JSON bytes."""
    return json.dumps({"state": state, **info}, separators=(",", ":")).encode()


class MqttChannel(ByteChannel):
    """The agent's channel over MQTT: writes go to ``up``; ``down`` and ``start`` are read.

    Like a virtio-serial port, the host going away is not visible (the broker stays): the
    session layer notices host silence and says hello again. A lost broker connection ends
    the channel (:class:`ChannelClosed`) and the agent connects again; the broker kept the
    session, so frames the host sent meanwhile arrive then.
    """

    sees_disconnects = False

    def __init__(self, bridge: PahoBridge, topics: Topics) -> None:
        self._bridge = bridge
        self.topics = topics

    @classmethod
    async def connect(cls, options: MqttOptions, vm: str, boot_id: str) -> MqttChannel:
        """Connect as ``vm`` (client id ``vmr-<experiment>-<vm>``), subscribe, say online.

        Raises:
            MqttError: refused for good (credentials, TLS, names).
            OSError: the broker is not reachable now.
        """
        topics = Topics(check_name("experiment", options.experiment), check_name("VM name", vm))
        bridge = PahoBridge(
            options,
            client_id=f"vmr-{options.experiment}-{vm}",
            subscriptions=[(topics.down, 1), (topics.start, 1)],
            will=(topics.presence, presence_payload("offline", vm=vm, boot_id=boot_id)),
        )
        await bridge.connect()
        channel = cls(bridge, topics)
        try:
            await bridge.publish(
                topics.presence, presence_payload("online", vm=vm, boot_id=boot_id), retain=True
            )
        except ChannelClosed as exc:  # lost right after CONNACK: a retry like any failed connect
            bridge.close()
            raise OSError(str(exc)) from exc
        return channel

    async def read(self) -> bytes:
        while True:
            item = await self._bridge.messages.get()
            if item is None:
                raise ChannelClosed(f"broker {self._bridge.url}: connection lost")
            topic, payload = item
            if payload and topic in (self.topics.down, self.topics.start):
                return payload if payload.endswith(b"\n") else payload + b"\n"

    async def write(self, data: bytes) -> None:
        await self._bridge.publish(self.topics.up, data)

    async def write_ephemeral(self, data: bytes, ttl: float) -> None:
        # MQTT v5 message expiry: while the host is away the broker keeps the host's session,
        # and without it would hand a restarted host every hello and heartbeat of the outage
        await self._bridge.publish(self.topics.up, data, expiry=max(1, round(ttl)))

    def close(self) -> None:
        bridge = self._bridge
        if not bridge.closed:
            bridge.client.publish(
                self.topics.presence, presence_payload("offline", vm=self.topics.vm), qos=1, retain=True
            )
        bridge.close()


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
