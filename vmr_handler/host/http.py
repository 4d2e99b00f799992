"""VM-resource files and transfers out over HTTP(S): ``vmr-host serve --http HOST:PORT`` (issue 6 §1).

Large ``filename`` drops do not travel as base64 ``resource_chunk`` events through the
channel or the broker: the agent downloads them from this server, with one secret token per
VM, and checks them against the sha256 announced in the (signed) ``schedule`` event. Large
files transferred out do not travel as ``transfer_chunk`` events either: the agent uploads
them here (``PUT /t/...``, below) and then reports ``transfer_uploaded`` on the channel.

URL layout: ``GET|HEAD <base>/r/<vm>/<name>`` with ``Authorization: Bearer <token>``.

* **401** missing or unknown token (``WWW-Authenticate: Bearer``).
* **403** the token is another VM's, ``name`` is not a ``filename`` drop of that VM's
  schedule, or :class:`~vmr_handler.host.resources.ResourceStore` refuses it (absolute, ``..``,
  a symlink leading out of ``--resources``, not a regular file).
* **404** a named resource that is not there; any other path.
* **503** (``Retry-After: 1``) the VM already has ``Limits.resource_streams`` downloads under
  way, or the server holds its maximum of connections.
* **206** for ``Range: bytes=N-`` / ``bytes=N-M`` (one range; ``Content-Range``), **416** for a
  start at or past the end; other ``Range`` forms are ignored (200, whole file).
* ``ETag`` is the quoted sha256 of the file as served now.

Uploads: ``HEAD|PUT <base>/t/<vm>/<location>`` (``location`` percent-encoded, ``/`` as
``%2F`` or not), same token, ``X-Vmr-Sha256: <hex>`` (the whole file's). The bytes go to
:meth:`~vmr_handler.host.store.TransferStore.upload` (the VM's transfer store: the same
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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import socket
import socketserver
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from vmr_handler import __version__
from vmr_handler.core.errors import (
    HostSetupError,
    ResourceMissing,
    ResourceRefused,
    TransferConflict,
    TransferMismatch,
    TransferRefused,
    TransferTooLarge,
)
from vmr_handler.core.ratelimit import worth_logging
from vmr_handler.host.config import HttpOptions, VmSpec
from vmr_handler.host.resources import ResourceStore
from vmr_handler.host.store import TransferStore, atomic_write_json

log = logging.getLogger("vmr_handler.host.http")

TOKENS_FILE = "http-tokens.json"
#: Bytes read from the file and written to the socket at a time.
CHUNK = 256 * 1024
#: Seconds a connection may stay silent (request line, headers, a stalled reader).
SOCKET_TIMEOUT = 60.0
#: What ``note`` is told about a request: a whole download, a broken one, a refusal, an upload.
#: (``UPLOAD_REFUSED``: a refused upload, counted with the VM's refused transfers.)
SERVED, INTERRUPTED, REFUSED, UPLOADED = "served", "interrupted", "refused", "uploaded"
UPLOAD_REFUSED = "upload_refused"

#: ``note(vm, text, outcome)``: called from HTTP threads, must be thread-safe. ``text`` is the
#: line for the VM's readable log, None for a refusal counted but not logged (rate limit).
NoteFn = Callable[[str, Optional[str], str], None]


def parse_http_options(
    bind: str,
    url: Optional[str] = None,
    cert_file: Optional[str] = None,
    key_file: Optional[str] = None,
    debug_rate: Optional[float] = None,
) -> HttpOptions:
    """:class:`HttpOptions` from the ``--http*`` flags.

    Args:
        bind: ``HOST:PORT`` (``[V6ADDR]:PORT`` for IPv6).
        url: ``--http-url``; default ``http[s]://HOST:PORT`` (not for a wildcard HOST).
        cert_file, key_file: ``--http-cert`` / ``--http-key``.
        debug_rate: ``--http-debug-rate`` bytes per second, > 0.

    Raises:
        ValueError: a malformed value, a key without a certificate, a wildcard bind address
            without ``url``, or a ``url`` that is not ``http[s]://``; the message names the flag.
    """
    host, sep, port_text = bind.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--http {bind!r}: expected HOST:PORT with a port 1-65535")
    if key_file and not cert_file:
        raise ValueError("--http-key needs --http-cert")
    for flag, path in (("--http-cert", cert_file), ("--http-key", key_file)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{flag} {path}: no such file")
    if debug_rate is not None and not debug_rate > 0:
        raise ValueError("--http-debug-rate must be > 0 bytes per second")
    scheme = "https" if cert_file else "http"
    if url is None:
        if host in ("0.0.0.0", "::", ""):
            raise ValueError(f"--http {bind}: binds every interface; give --http-url (how agents reach it)")
        url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port_text}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"--http-url {url!r}: expected http[s]://HOST[:PORT][/PREFIX]")
    return HttpOptions(host, int(port_text), url.rstrip("/"), cert_file, key_file, debug_rate)


def load_tokens(logs: str, vms: Any) -> Dict[str, str]:
    """Every VM's token from ``<logs>/http-tokens.json``, adding (and saving) any missing one.

    Args:
        logs: the host's logs directory (must exist).
        vms: the VM names served now (tokens of VMs no longer served are kept in the file).

    Returns:
        ``{vm: token}`` for every VM in ``vms``.

    Raises:
        HostSetupError: (exit 1) the file cannot be read, is not ``{"version": 1, "tokens":
            {vm: str}}``, or cannot be written.
    """
    path = os.path.join(logs, TOKENS_FILE)
    tokens: Dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        raw = doc.get("tokens") if isinstance(doc, dict) else None
        if not isinstance(raw, dict) or not all(isinstance(v, str) and v for v in raw.values()):
            raise ValueError('expected {"version": 1, "tokens": {"<vm>": "<token>"}}')
        tokens = {str(k): v for k, v in raw.items()}
        os.chmod(path, 0o600)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        raise HostSetupError(f"cannot use {path}: {exc}") from exc
    missing = [vm for vm in vms if vm not in tokens]
    for vm in missing:
        tokens[vm] = secrets.token_urlsafe(32)
    if missing or not os.path.exists(path):
        try:
            atomic_write_json(path, {"version": 1, "tokens": dict(sorted(tokens.items()))})  # mode 0600
        except OSError as exc:
            raise HostSetupError(f"cannot write {path}: {exc}") from exc
    return {vm: tokens[vm] for vm in vms}


def _token_key(token: str) -> str:
    """Tokens are looked up by their sha256, so the lookup time tells nothing about them."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def parse_range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """The byte range ``[start, end]`` (inclusive) a ``Range`` header asks of a ``size``-byte
    file, or None for the whole file (no header, or a form this server ignores: several
    ranges, a suffix range, malformed).

    Raises:
        ValueError: a single range starting at or past the end (answer 416).
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, dash, last = header[6:].strip().partition("-")
    if not dash or not _is_count(first) or (last and not _is_count(last)):
        return None
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size:
        raise ValueError(f"range start {start} is not before the end of the file ({size} bytes)")
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


class ResourceHttp:
    """The HTTP(S) resource server of one ``vmr-host serve``.

    Build it at host set-up (tokens are loaded or made then, so the schedule events can carry
    them), :meth:`start` it on the running host, :meth:`stop` it at shutdown.

    Args:
        options: flags (:func:`parse_http_options`).
        vms: the served VMs (a VM may fetch only its own schedule's ``filename`` drops).
        store: the host's resource store (confinement, sizes, cached sha256).
        logs: the logs directory (``http-tokens.json``).
        streams: concurrent downloads per VM (``Limits.resource_streams``), and as many
            concurrent uploads.

    Attributes:
        transfers: every VM's transfer store, for uploads; set by the host once they exist
            (before :meth:`start`). A VM without one is answered 503.

    Raises:
        HostSetupError: the token file cannot be used (exit 1).
    """

    def __init__(
        self, options: HttpOptions, vms: Mapping[str, VmSpec], store: ResourceStore, logs: str, streams: int
    ) -> None:
        self.options = options
        self.vms = dict(vms)
        self.store = store
        self.streams = streams
        self.tokens = load_tokens(logs, sorted(vms))
        self._by_token = {_token_key(t): vm for vm, t in self.tokens.items()}
        #: threads open at most: every VM's downloads plus a keep-alive connection each
        self.max_connections = max(64, (2 * streams + 2) * len(self.vms))
        self.transfers: Dict[str, TransferStore] = {}
        self._busy: Dict[str, int] = {}
        self._uploading: Dict[str, int] = {}
        self._refused: Dict[Optional[str], int] = {}
        self._lock = threading.Lock()
        self._note: NoteFn = lambda vm, text, outcome: None
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()

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
    def refusals_of(self, vm: Optional[str], text: str, outcome: str = REFUSED) -> None:
        """Log a refusal (rate-limited per VM: 1st-5th, then every power of 10); ``vm`` None
        when the requester is unknown (bad token, server full)."""
        with self._lock:
            n = self._refused[vm] = self._refused.get(vm, 0) + 1
        logged = worth_logging(n)
        if logged:
            text = f"http: {text}" + (f" (x{n})" if n > 1 else "")
            log.warning("%s%s", f"{vm}: " if vm else "", text)
        if vm is not None:
            self._note(vm, text if logged else None, outcome)

    def _answer(self, h: _Handler, code: int, text: str, headers: Optional[Mapping[str, str]] = None) -> None:
        body = (text + "\n").encode()
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Type", "text/plain; charset=utf-8")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _who(self, authorization: Optional[str]) -> Optional[str]:
        """The VM whose token ``Authorization: Bearer <token>`` carries, or None."""
        scheme, _sp, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self._by_token.get(_token_key(token.strip()))

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
        except ValueError as exc:
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

    # ------------------------------------------------------------------ uploads
    def _upload(self, h: _Handler, vm: str, location: str, head: bool) -> None:
        """Answer a HEAD or PUT of ``/t/<vm>/<location>`` by ``vm`` (token checked)."""
        what = f"{h.command} {location[:200]!r}"
        store = self.transfers.get(vm)
        sha256 = (h.headers.get("X-Vmr-Sha256") or "").strip().lower()
        try:
            if store is None:
                raise _Refusal(503, "transfers are not ready yet", {"Retry-After": "1"})
            if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
                raise _Refusal(400, "X-Vmr-Sha256 must be the file's sha256 in hex")
            if head:
                size = _header_int(h, "X-Vmr-Size")
                have = store.upload_have(location, sha256, size)
                self._answer(h, 200, f"{have} of {size} bytes held", {"X-Vmr-Have": str(have)})
                return
            length = _header_int(h, "Content-Length", 411)
            offset, size = parse_content_range(h.headers.get("Content-Range"), length)
            with self._lock:
                busy = self._uploading.get(vm, 0)
                if busy < self.streams:
                    self._uploading[vm] = busy + 1
            if busy >= self.streams:
                raise _Refusal(503, f"busy: {busy} uploads under way; ask again later", {"Retry-After": "1"})
            try:
                self._receive(h, vm, store, location, sha256, size, offset, length)
            finally:
                with self._lock:
                    self._uploading[vm] -= 1
        except _Refusal as exc:
            self._refuse_upload(h, vm, what, exc.code, str(exc), exc.headers)
        except TransferConflict as exc:
            self._refuse_upload(h, vm, what, 409, str(exc), {"X-Vmr-Have": str(exc.have)})
        except TransferTooLarge as exc:
            self._refuse_upload(h, vm, what, 413, str(exc))
        except TransferMismatch as exc:
            self._refuse_upload(h, vm, what, 422, str(exc))
        except TransferRefused as exc:
            self._refuse_upload(h, vm, what, 403, str(exc))
        except OSError as exc:  # the disk refused (the client's errors are caught in _receive)
            log.error("%s: %s: cannot store the upload: %s", vm, what, exc)
            self._refuse_upload(h, vm, what, 500, f"the host cannot store it: {exc.strerror or exc}")

    def _refuse_upload(
        self,
        h: _Handler,
        vm: str,
        what: str,
        code: int,
        text: str,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.refusals_of(vm, f"{what}: {code} {text}", UPLOAD_REFUSED)
        if h.command == "PUT":
            h.close_connection = True  # the body (or its rest) is not read
        with contextlib.suppress(OSError):
            self._answer(h, code, text, headers)

    def _receive(
        self,
        h: _Handler,
        vm: str,
        store: TransferStore,
        location: str,
        sha256: str,
        size: int,
        offset: int,
        length: int,
    ) -> None:
        """Stream a PUT body into the VM's staged upload; answer 200/201; note the outcome."""
        gone: list[OSError] = []
        began = time.monotonic()
        rate = self.options.debug_rate
        consumed = [0]

        def read(n: int) -> bytes:
            if self._stopping.is_set():
                return b""
            try:
                piece: bytes = h.rfile.read(n)
            except OSError as exc:  # the client went away or stalled past SOCKET_TIMEOUT
                gone.append(exc)
                return b""
            consumed[0] += len(piece)
            return piece

        def pace(received: int) -> None:
            if rate:
                time.sleep(max(0.0, began + received / rate - time.monotonic()))

        have = store.upload(location, sha256, size, offset, length, read, pace, CHUNK)
        took = time.monotonic() - began
        got = max(0, have - offset)
        speed = f"in {took:.2f} s ({got / max(took, 1e-6) / 1e6:.1f} MB/s)"
        where = f"bytes {offset}-{offset + length - 1}/{size}"
        if consumed[0] < length:  # e.g. the host held this content already: body left unread
            h.close_connection = True
        if have == size:
            text, outcome = (
                f"http: PUT {location!r} {where} received {speed}; complete, sha256 verified",
                UPLOADED,
            )
            self._answer(h, 201, f"complete: {size} bytes, sha256 verified", {"X-Vmr-Have": str(have)})
        elif have >= offset + length:
            text, outcome = f"http: PUT {location!r} {where} received {speed}", UPLOADED
            self._answer(h, 200, f"{have} of {size} bytes held", {"X-Vmr-Have": str(have)})
        else:
            h.close_connection = True
            text, outcome = (
                f"http: PUT {location!r} {where} interrupted after {got} of {length} bytes {speed}",
                INTERRUPTED,
            )
            if gone:
                log.debug("http: %s %s: %s", vm, location, gone[0])
        self._note(vm, text, outcome)


class _Refusal(Exception):
    """An upload answered ``code`` with this message (and these headers)."""

    def __init__(self, code: int, text: str, headers: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(text)
        self.code = code
        self.headers = headers


def _header_int(h: _Handler, name: str, missing: int = 400) -> int:
    """Header ``name`` as an integer >= 0. Raises _Refusal (``missing`` when absent, else 400)."""
    text = h.headers.get(name)
    if text is None:
        raise _Refusal(missing, f"{name} is needed")
    if not _is_count(text.strip()):
        raise _Refusal(400, f"{name} must be an integer >= 0")
    return int(text)


def _is_count(text: str) -> bool:
    """ASCII digits only, at most 19 of them (``str.isdigit`` also takes ``'²'``, on which
    ``int`` fails, and a guest's 5000-digit number would only cost time)."""
    return 0 < len(text) < 20 and text.isascii() and text.isdigit()


def parse_content_range(header: Optional[str], length: int) -> Tuple[int, int]:
    """``(offset, size)`` of a PUT body of ``length`` bytes from ``Content-Range: bytes N-M/SIZE``
    (no header: the whole file, ``(0, length)``).

    Raises:
        _Refusal: (400) malformed, ``M - N + 1 != length``, or ``M`` not before ``SIZE``.
    """
    if header is None:
        return 0, length
    unit, _sp, spec = header.strip().partition(" ")
    span, slash, total = spec.partition("/")
    first, dash, last = span.partition("-")
    if unit != "bytes" or not slash or not dash or not all(_is_count(x) for x in (first, last, total)):
        raise _Refusal(400, f"Content-Range {header[:100]!r}: expected bytes N-M/SIZE")
    start, end, size = int(first), int(last), int(total)
    if end - start + 1 != length or end >= size:
        raise _Refusal(400, f"Content-Range {header[:100]!r} does not match Content-Length {length}")
    return start, size
