"""VM-resource files and transfers out over HTTP(S): ``vmr-host serve --http HOST:PORT``.

Large ``filename`` drops do not travel as base64 ``resource_chunk`` events through the
channel or the broker: the agent downloads them from this server, with one secret token per
VM, and checks them against the sha256 announced in the (signed) ``schedule`` event. Large
files transferred out do not travel as ``transfer_chunk`` events either: the agent uploads
them here (``PUT /t/...``, below) and then reports ``transfer_uploaded`` on the channel.

URL layout: ``GET|HEAD <base>/r/<vm>/<name>`` with ``Authorization: Bearer <token>``.

* **401** missing or unknown token (``WWW-Authenticate: Bearer``).
* **403** the token is another VM's, ``name`` is not a ``filename`` drop of that VM's
  schedule, or :class:`~vmr_handler.host.serve.files.resources.ResourceStore` refuses it (absolute, ``..``,
  a symlink leading out of ``--resources``, not a regular file).
* **404** a named resource that is not there; any other path.
* **503** (``Retry-After: 1``) the VM already has ``Limits.resource_streams`` downloads under
  way, or the server holds its maximum of connections.
* **206** for ``Range: bytes=N-`` / ``bytes=N-M`` (one range; ``Content-Range``), **416** for a
  start at or past the end; other ``Range`` forms are ignored (200, whole file).
* ``ETag`` is the quoted sha256 of the file as served now.

Uploads: ``HEAD|PUT <base>/t/<vm>/<location>`` (``location`` percent-encoded, ``/`` as
``%2F`` or not), same token, ``X-Vmr-Sha256: <hex>`` (the whole file's). The bytes go to
:meth:`~vmr_handler.host.serve.files.transfers.TransferStore.upload` (the VM's transfer store: the same
confinement and limits as ``transfer_chunk``), staged by sha256 until the VM's
``transfer_uploaded`` report puts the file in place, in the order of its other reports.

* ``HEAD`` with ``X-Vmr-Size: <bytes>``: **200** and ``X-Vmr-Have: N``, the bytes the host
  holds of this content (the size when complete): where to resume.
* ``PUT`` with ``Content-Length`` (**411** without; no chunked bodies) and optionally
  ``Content-Range: bytes N-M/SIZE`` (without: the whole file, ``N`` 0). **201** the file is
  complete and its sha256 verified; **200** (``X-Vmr-Have``) a piece stored, more to come.
* **400** a malformed header; **401**/**403** as above (403 also: a location the transfer
  store refuses, ``..``, a symlink out); **409** (``X-Vmr-Have``) ``N`` is neither 0 nor the
  bytes held, or this content is being uploaded on another connection; **413** over the
  per-file or the per-VM transfer limit (checked before the body is read; the connection is
  then closed); **422** the complete file does not have the announced sha256 (deleted);
  **503** the VM already has ``Limits.resource_streams`` uploads under way.

Tokens (``secrets.token_urlsafe(32)``, one per VM) live in ``<logs>/http-tokens.json``
(mode 0600) so a restarted host keeps them; VMs new to the file get a token at start.

Design: the stdlib :class:`http.server.ThreadingHTTPServer` in a thread of its own, one
thread per connection, rather than asyncio streams on the host loop. File reads, sha256
hashing of a changed file and (with TLS) handshakes are blocking work that must never stall
the loop that runs the barrier and every VM's channel; threads give that for free, with no
new dependency, and ``http.server`` parses requests and headers for us. The cost is a thread
per open connection, bounded by ``max_connections`` (beyond it connections are closed at
once) and freed after ``SOCKET_TIMEOUT`` seconds of client silence. With TLS the listening
socket is not wrapped: each accepted socket is wrapped without an immediate handshake, so the
handshake happens in the connection's own thread and a slow client cannot hold up ``accept``.

Everything the threads tell the rest of the host goes through the ``note`` callback given to
:meth:`ResourceHttp.start`, which must be thread-safe (the server hands it to its loop).

Modules: this one serves and answers downloads; :mod:`vmr_handler.host.serve.http._uploads` answers
uploads, :mod:`vmr_handler.host.serve.http.common` holds what both use (token check, refusals, the
outcomes told to ``note``), :mod:`vmr_handler.host.serve.http.options` the ``--http*`` flags and tokens.
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Mapping, Optional, Tuple

from vmr_handler import __version__
from vmr_handler.core.errors import HostSetupError, RangeNotSatisfiable, ResourceMissing, ResourceRefused
from vmr_handler.host.serve.config import HttpOptions, VmSpec
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.http._uploads import UploadRequests
from vmr_handler.host.serve.http.common import (
    CHUNK,
    INTERRUPTED,
    REFUSED,
    SERVED,
    SOCKET_TIMEOUT,
    UPLOAD_REFUSED,
    NoteFn,
    is_count,
)

log = logging.getLogger("vmr_handler.host.serve.http.server")

def parse_range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """The byte range ``[start, end]`` (inclusive) a ``Range`` header asks of a ``size``-byte
    file, or None for the whole file (no header, or a form this server ignores: several
    ranges, a suffix range, malformed).

    Raises:
        RangeNotSatisfiable: a single range starting at or past the end (answer 416).
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, dash, last = header[6:].strip().partition("-")
    if not dash or not is_count(first) or (last and not is_count(last)):
        return None
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size:
        raise RangeNotSatisfiable(f"range start {start} is not before the end of the file ({size} bytes)")
    if end < start:
        return None
    return start, end


class _Server(ThreadingHTTPServer):
    """The threading server plus: a cap on connections, TLS per connection, the app."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: Tuple[str, int], app: ResourceHttp, tls: Optional[ssl.SSLContext]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.app = app
        self.tls = tls
        self._active = 0
        self._count_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would look up the FQDN of the address (DNS): not needed
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def get_request(self) -> Tuple[Any, Any]:
        sock, addr = self.socket.accept()
        if self.tls is not None:  # handshake later, in the connection's thread
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count_lock:
            full = self._active >= self.app.max_connections
            if not full:
                self._active += 1
        if full:
            self.app.refusals_of(None, f"connection from {client_address[0]} closed: server full")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self._active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.info("http: connection from %s ended with an error", client_address[0], exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = f"vmr-host/{__version__}"
    sys_version = ""
    timeout = SOCKET_TIMEOUT

    def do_GET(self) -> None:
        self.server.app.handle(self, head=False)

    def do_HEAD(self) -> None:
        self.server.app.handle(self, head=True)

    def do_PUT(self) -> None:
        self.server.app.handle(self, head=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: %s %s", self.address_string(), format % args)


class ResourceHttp(UploadRequests):
    """The HTTP(S) resource server of one ``vmr-host serve``: downloads of ``/r/`` here, uploads
    to ``/t/`` in :class:`~vmr_handler.host.serve.http._uploads.UploadRequests`.

    Build it at host set-up (tokens are loaded or made then, so the schedule events can carry
    them), :meth:`start` it on the running host, :meth:`stop` it at shutdown.

    Args:
        options: flags (:func:`~vmr_handler.host.serve.http.options.parse_http_options`).
        vms: the served VMs (a VM may fetch only its own schedule's ``filename`` drops).
        store: the host's resource store (confinement, sizes, cached sha256).
        logs: the logs directory (``http-tokens.json``).
        streams: concurrent downloads per VM (``Limits.resource_streams``), and as many
            concurrent uploads.
        transfers: every VM's transfer store, for uploads (a VM without one is answered 503).

    Raises:
        HostSetupError: the token file cannot be used (exit 1).
    """

    def __init__(
        self,
        options: HttpOptions,
        vms: Mapping[str, VmSpec],
        store: ResourceStore,
        logs: str,
        streams: int,
        transfers: Mapping[str, TransferStore],
    ) -> None:
        super().__init__(options, vms, logs, streams, transfers)
        self.store = store
        #: threads open at most: every VM's downloads plus a keep-alive connection each
        self.max_connections = max(64, (2 * streams + 2) * len(self.vms))
        self._busy: Dict[str, int] = {}
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ what the schedule says
    def url(self, vm: str, name: str) -> str:
        """The URL of resource ``name`` for ``vm``."""
        return f"{self.options.base_url}/r/{urllib.parse.quote(vm)}/{urllib.parse.quote(name)}"

    def schedule_data(self, vm: str) -> Dict[str, str]:
        """The ``http`` member of ``vm``'s ``schedule`` event: ``{"base", "token", "upload"}``
        (``upload``: the URL prefix of its transfers out, to which the percent-encoded
        location is appended)."""
        base = self.options.base_url
        return {
            "base": base,
            "token": self.tokens[vm],
            "upload": f"{base}/t/{urllib.parse.quote(vm, safe='')}/",
        }

    # ------------------------------------------------------------------ life
    @property
    def address(self) -> Tuple[str, int]:
        """The bound address (host, port); only after :meth:`start`."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self, note: NoteFn) -> None:
        """Bind and serve in a daemon thread.

        Args:
            note: thread-safe ``note(vm, text, outcome)`` for the VM's log and counters.

        Raises:
            HostSetupError: the address cannot be bound (exit 1) or the certificate/key cannot
                be loaded (exit 2).
        """
        tls = None
        o = self.options
        if o.cert_file:
            try:
                tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                tls.load_cert_chain(o.cert_file, o.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise HostSetupError(f"--http-cert/--http-key: cannot load {o.cert_file}: {exc}", 2) from exc
        try:
            self._server = _Server((o.host, o.port), self, tls)
        except OSError as exc:
            raise HostSetupError(f"--http {o.host}:{o.port}: cannot listen: {exc}") from exc
        self._note = note
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="vmr-host-http",
            daemon=True,
        )
        self._thread.start()
        log.warning("serving VM resources at %s (listening on %s:%d)", o.base_url, *self.address)

    def stop(self) -> None:
        """Stop accepting, end downloads under way at their next chunk, close the socket.

        Blocking (up to ~0.2 s): call it from a thread on a running loop.
        """
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ requests
    def handle(self, h: _Handler, head: bool) -> None:
        """Answer one GET/HEAD/PUT (in the connection's thread)."""
        parts = urllib.parse.urlsplit(h.path).path.split("/", 3)
        if len(parts) != 4 or parts[0] or parts[1] not in ("r", "t") or not parts[2] or not parts[3]:
            h.close_connection = h.command == "PUT"  # a body we do not read
            self._answer(h, 404, "not found: resources are at /r/<vm>/<name>, uploads at /t/<vm>/<location>")
            return
        upload = parts[1] == "t"
        if h.command not in (("PUT", "HEAD") if upload else ("GET", "HEAD")):
            h.close_connection = True
            self._answer(h, 405, "resources are read with GET, transfers written with PUT")
            return
        vm, name = urllib.parse.unquote(parts[2]), urllib.parse.unquote(parts[3])
        who = self._who(h.headers.get("Authorization"))
        if who is None:
            peer = h.client_address[0]
            self.refusals_of(None, f"{h.command} {h.path[:200]!r} from {peer}: bad or no token")
            h.close_connection = h.command == "PUT"
            self._answer(h, 401, "a valid bearer token is needed", {"WWW-Authenticate": "Bearer"})
            return
        if vm != who:
            self.refusals_of(
                who,
                f"{h.command} {name[:200]!r} of VM {vm[:64]!r} refused: not this VM's",
                UPLOAD_REFUSED if upload else REFUSED,
            )
            h.close_connection = h.command == "PUT"
            self._answer(h, 403, "this token gives access to its own VM's resources and transfers only")
            return
        if upload:
            self._upload(h, who, name, head)
            return
        if name not in self.vms[who].filenames:
            self.refusals_of(who, f"{h.command} {name[:200]!r} refused: not a filename drop of its schedule")
            self._answer(h, 403, f"{name!r} is not a filename drop of this VM's schedule")
            return
        try:
            info = self.store.info(name)  # may hash a changed file: fine in this thread
        except ResourceRefused as exc:
            missing = isinstance(exc, ResourceMissing)
            self.refusals_of(who, f"{h.command} {name[:200]!r}: {exc}")
            self._answer(h, 404 if missing else 403, str(exc))
            return
        with self._lock:
            busy = self._busy.get(who, 0)
            if busy < self.streams:
                self._busy[who] = busy + 1
        if busy >= self.streams:
            self.refusals_of(who, f"{h.command} {name[:200]!r}: busy ({busy} downloads under way)")
            self._answer(h, 503, f"busy: {busy} downloads under way; ask again later", {"Retry-After": "1"})
            return
        try:
            self._send_file(h, who, info.name, info.path, info.size, info.sha256, head)
        finally:
            with self._lock:
                self._busy[who] -= 1

    def _send_file(
        self, h: _Handler, vm: str, name: str, path: str, size: int, sha256: str, head: bool
    ) -> None:
        """Send ``path`` (or the asked range) in :data:`CHUNK` pieces; note the outcome."""
        header = h.headers.get("Range")
        try:
            rng = parse_range(header, size)
        except RangeNotSatisfiable as exc:
            self.refusals_of(vm, f"{h.command} {name!r} Range {header!r}: 416 ({exc})")
            self._answer(h, 416, str(exc), {"Content-Range": f"bytes */{size}"})
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            self._answer(h, 404, f"{name!r} cannot be opened: {exc.strerror}")
            return
        start, end = rng if rng is not None else (0, size - 1)
        code = 206 if rng is not None else 200
        length = end - start + 1
        sent = 0
        began = time.monotonic()
        try:
            h.send_response(code)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", str(length))
            h.send_header("Accept-Ranges", "bytes")
            h.send_header("ETag", f'"{sha256}"')
            if rng is not None:
                h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            h.end_headers()
            if head:
                return
            rate = self.options.debug_rate
            while sent < length and not self._stopping.is_set():
                piece = os.pread(fd, min(CHUNK, length - sent), start + sent)
                if not piece:
                    break  # the file shrank under us: the client sees a short body
                h.wfile.write(piece)
                sent += len(piece)
                if rate and sent < length:
                    time.sleep(max(0.0, began + sent / rate - time.monotonic()))
        except OSError as exc:  # the client went away (BrokenPipe, reset, timeout)
            h.close_connection = True
            log.debug("http: %s %s: %s", vm, name, exc)
        finally:
            os.close(fd)
            if not head:
                took = time.monotonic() - began
                what = f"{code} bytes {start}-{end}/{size}" if rng is not None else f"{code} {size} bytes"
                outcome = SERVED if sent == length else INTERRUPTED
                done = "sent" if outcome == SERVED else f"interrupted after {sent} of {length} bytes"
                self._note(
                    vm,
                    f"http: GET {name!r} {what} {done} in {took:.2f} s "
                    f"({sent / max(took, 1e-6) / 1e6:.1f} MB/s)",
                    outcome,
                )
