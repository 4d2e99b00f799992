"""A paho-mqtt 2.x client bridged into asyncio: shared by the agent and vmr-host.

paho does the MQTT protocol work and keep-alives; its socket is watched by the asyncio loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import threading
from typing import Any, Dict, List, Optional, Tuple

from vmr_handler.core.errors import ChannelClosed, ConnectFailed, MqttError
from vmr_handler.transports.mqtt.options import MqttOptions, parse_broker

log = logging.getLogger("vmr_handler.transports.mqtt")

#: Seconds the broker keeps a disconnected client's session (subscriptions + queued QoS 1).
SESSION_EXPIRY = 7 * 24 * 3600
#: Publishes not yet acknowledged by the broker before :meth:`PahoBridge.publish` waits.
MAX_INFLIGHT = 200


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
        # paho's own window re-scans its whole queue at every PUBACK (quadratic in a host's
        # fan-out of 20 000 start messages): unlimited in paho, bounded here (publish) instead
        client.max_inflight_messages_set(0)
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
            ConnectFailed: the broker cannot be reached (the caller retries with backoff).
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
            wait = self.options.connect_timeout
            raise ConnectFailed(f"no answer from broker {self.url} in {wait:g} s") from exc
        except ChannelClosed as exc:
            self.close()
            raise ConnectFailed(str(exc)) from exc
        except MqttError:
            self.close()
            raise
        except (OSError, ValueError) as exc:
            self.close()
            raise ConnectFailed(f"cannot reach broker {self.url}: {exc}") from exc

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

    def flush(self) -> None:
        """Write what is queued in paho now, as far as the socket takes it (an urgent message,
        e.g. the host's start for all its VMs, need not wait for the event loop's next turn:
        the rest goes when the socket is writable again). Event loop thread only."""
        if not self.closed and self._fd is not None:
            self.client.loop_write()

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
