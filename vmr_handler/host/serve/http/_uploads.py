"""Uploads to the HTTP(S) server: ``HEAD|PUT <base>/t/<vm>/<location>``
(:mod:`vmr_handler.host.serve.http.server`).

The bytes of a PUT go to :meth:`~vmr_handler.host.serve.files.transfers.TransferStore.upload` of the VM's
transfer store, staged by sha256 until the VM's ``transfer_uploaded`` report puts the file in
place; the status codes are listed in :mod:`vmr_handler.host.serve.http.server`. :class:`UploadRequests` is
the upload half of :class:`~vmr_handler.host.serve.http.server.ResourceHttp`; it runs in the connections'
threads.
"""

from __future__ import annotations

import contextlib
import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import Dict, Mapping, Optional, Tuple

from vmr_handler.core.errors import TransferConflict, TransferMismatch, TransferRefused, TransferTooLarge
from vmr_handler.host.serve.config import HttpOptions, VmSpec
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.http.common import (
    CHUNK,
    INTERRUPTED,
    UPLOAD_REFUSED,
    UPLOADED,
    HttpApp,
    is_count,
)

log = logging.getLogger("vmr_handler.host.serve.http.server")


class UploadRequests(HttpApp):
    """The ``/t/`` requests: uploads into every VM's transfer store.

    Args:
        options, vms, logs, streams: as :class:`~vmr_handler.host.serve.http.common.HttpApp`
            (``streams``: concurrent uploads per VM).
        transfers: every VM's transfer store (opened by the host before the server starts);
            a VM without one is answered 503.

    Raises:
        HostSetupError: the token file cannot be used (exit 1).
    """

    def __init__(
        self,
        options: HttpOptions,
        vms: Mapping[str, VmSpec],
        logs: str,
        streams: int,
        transfers: Mapping[str, TransferStore],
    ) -> None:
        super().__init__(options, vms, logs, streams)
        self.transfers = transfers
        self._uploading: Dict[str, int] = {}

    def _upload(self, h: BaseHTTPRequestHandler, vm: str, location: str, head: bool) -> None:
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
        h: BaseHTTPRequestHandler,
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
        h: BaseHTTPRequestHandler,
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


def _header_int(h: BaseHTTPRequestHandler, name: str, missing: int = 400) -> int:
    """Header ``name`` as an integer >= 0. Raises _Refusal (``missing`` when absent, else 400)."""
    text = h.headers.get(name)
    if text is None:
        raise _Refusal(missing, f"{name} is needed")
    if not is_count(text.strip()):
        raise _Refusal(400, f"{name} must be an integer >= 0")
    return int(text)


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
    if unit != "bytes" or not slash or not dash or not all(is_count(x) for x in (first, last, total)):
        raise _Refusal(400, f"Content-Range {header[:100]!r}: expected bytes N-M/SIZE")
    start, end, size = int(first), int(last), int(total)
    if end - start + 1 != length or end >= size:
        raise _Refusal(400, f"Content-Range {header[:100]!r} does not match Content-Length {length}")
    return start, size
