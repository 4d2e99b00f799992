"""What the HTTP(S) server's downloads and uploads share (:mod:`vmr_handler.host.serve.http.server`).

The outcomes told to the host's ``note`` callback, the token check, per-VM refusal counting
and plain-text answers: :class:`HttpApp`, the base of the upload half
(:class:`~vmr_handler.host.serve.http._uploads.UploadRequests`) and of the whole server
(:class:`~vmr_handler.host.serve.http.server.ResourceHttp`). Everything here runs in the connections'
threads, so shared counters are kept under one lock.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler
from typing import Callable, Dict, Mapping, Optional

from vmr_handler.core.ratelimit import worth_logging
from vmr_handler.host.serve.config import HttpOptions, VmSpec
from vmr_handler.host.serve.http.options import load_tokens, token_key

log = logging.getLogger("vmr_handler.host.serve.http.server")

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


def is_count(text: str) -> bool:
    """ASCII digits only, at most 19 of them (``str.isdigit`` also takes ``'²'``, on which
    ``int`` fails, and a guest's 5000-digit number would only cost time)."""
    return 0 < len(text) < 20 and text.isascii() and text.isdigit()


class HttpApp:
    """The state and helpers every request of the HTTP(S) server uses.

    Args:
        options: the ``--http*`` flags (:func:`~vmr_handler.host.serve.http.options.parse_http_options`).
        vms: the served VMs.
        logs: the logs directory (``http-tokens.json``).
        streams: concurrent downloads per VM (``Limits.resource_streams``), and as many
            concurrent uploads.

    Raises:
        HostSetupError: the token file cannot be used (exit 1).
    """

    def __init__(self, options: HttpOptions, vms: Mapping[str, VmSpec], logs: str, streams: int) -> None:
        self.options = options
        self.vms = dict(vms)
        self.streams = streams
        self.tokens = load_tokens(logs, sorted(vms))
        self._by_token = {token_key(t): vm for vm, t in self.tokens.items()}
        self._refused: Dict[Optional[str], int] = {}
        self._lock = threading.Lock()
        self._note: NoteFn = lambda vm, text, outcome: None
        self._stopping = threading.Event()

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

    def _answer(
        self, h: BaseHTTPRequestHandler, code: int, text: str, headers: Optional[Mapping[str, str]] = None
    ) -> None:
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
        return self._by_token.get(token_key(token.strip()))
