"""The agent's downloads of VM-resource files and uploads of files transferred out over
HTTP(S), to and from ``vmr-host serve --http``.

Blocking (``requests``): the agent runs :func:`fetch` and :func:`upload` in a worker thread
(``asyncio.to_thread``) so its event loop never waits on the network. ``requests`` is
imported on first use only: the frozen agent starts faster in guests that never fetch over
HTTP.

The file is streamed to ``<target>.part``; a later attempt (after a dropped connection, an
agent restart or a reboot) asks for the rest with ``Range: bytes=<size of .part>-``. When
the whole file is there its sha256 must equal the one announced in the (signed) ``schedule``
event, never one the HTTP server states; only then is it renamed to ``target``.
Attempts are retried by tenacity with exponential backoff and jitter on connection errors,
timeouts, short bodies and 5xx answers; 401/403/404 and other 4xx answers, and a server
certificate that does not verify, are final.

:func:`upload` asks the host (``HEAD``) how many bytes of the file's content it already holds
and sends the rest (``PUT`` with ``Content-Range``), so a dropped upload resumes; the host
checks the sha256 when the last byte arrives. Same retries; 409 (out of step) is retried.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Any, Callable, Optional, Tuple, Union

from vmr_handler.core.errors import FetchCancelled, FetchRefused

log = logging.getLogger(__name__)

#: Bytes per read from the response (and per cancellation check).
CHUNK = 1024 * 1024
#: Seconds to connect, seconds of silence while reading.
TIMEOUT: Tuple[float, float] = (10.0, 30.0)


class _Again(Exception):
    """An attempt to retry: 5xx, a short body, a range the server did not honour."""


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _attempt(
    session: Any,
    url: str,
    token: str,
    part: str,
    size: int,
    verify: Union[bool, str],
    cancel: threading.Event,
) -> None:
    """One request: append the missing bytes to ``part`` (resuming after its current size).

    Raises:
        FetchRefused: a final HTTP error. FetchCancelled: ``cancel`` was set.
        _Again, requests.RequestException: retry.
    """
    if cancel.is_set():
        raise FetchCancelled()
    have = _size(part)
    if have > size:  # a leftover of another version: start over
        os.unlink(part)
        have = 0
    if have == size:
        return  # all there (the last attempt ended after the last byte): just verify
    headers = {"Authorization": f"Bearer {token}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with session.get(url, headers=headers, stream=True, timeout=TIMEOUT, verify=verify) as resp:
        code = resp.status_code
        if code == 416:  # the server's file is not longer than what we have: start over
            os.unlink(part)
            raise _Again("416: range not satisfiable; starting again from byte 0")
        if code >= 500:
            raise _Again(f"HTTP {code}")
        if code not in (200, 206):
            raise FetchRefused(f"HTTP {code}: {resp.text.strip()[:200]}")
        if code == 206 and not resp.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            raise _Again(f"206 with Content-Range {resp.headers.get('Content-Range')!r}, asked from {have}")
        start = have if code == 206 else 0
        if have:
            log.info("%s: %s", url, f"resumed at byte {have}" if start else "whole file sent again")
        with open(part, "r+b" if start else "wb") as fh:
            fh.seek(start)
            fh.truncate()
            for block in resp.iter_content(CHUNK):
                if cancel.is_set():
                    raise FetchCancelled()
                fh.write(block)
        if _size(part) < size:
            raise _Again(f"body ended at byte {_size(part)} of {size}")


def fetch(
    url: str,
    token: str,
    target: str,
    sha256: str,
    size: int,
    verify: Union[bool, str] = True,
    cancel: Optional[threading.Event] = None,
    attempts: int = 10,
    backoff: Tuple[float, float] = (0.5, 30.0),
) -> Optional[str]:
    """Download ``url`` to ``target``, resuming from ``<target>.part``; blocking.

    Args:
        url: the resource URL announced in the schedule event.
        token: the VM's bearer token (the schedule event's ``http.token``).
        target: final path; written only when the sha256 matches.
        sha256: the announced hex digest (from the schedule event).
        size: the announced size, bytes.
        verify: TLS verification for https: True (system CAs) or a CA file path.
        cancel: set by the agent when it stops; the download ends at the next block
            (``<target>.part`` stays for the next start).
        attempts: requests in all before giving up (each resumes where the last stopped).
        backoff: (first, longest) seconds between attempts (exponential, with jitter).

    Returns:
        None when ``target`` holds the file; otherwise why not (``sha256 mismatch ...``,
        ``HTTP 403: ...``, ``gave up after N attempts: ...``, ``stopped``). On a mismatch
        ``<target>.part`` is deleted.
    """
    import requests

    cancel = cancel or threading.Event()
    part = target + ".part"
    fresh_try = True  # one more download from byte 0 when a resumed file does not match
    with requests.Session() as session:
        while True:
            resumed = _size(part) > 0  # bytes of an earlier start (maybe of an older file version)
            error = _with_retries(
                url,
                lambda: _attempt(session, url, token, part, size, verify, cancel),
                cancel,
                attempts,
                backoff,
                f"cannot write {part}",
            )
            if error is not None:
                return error
            got = _sha256_file(part)
            if got == sha256:
                os.replace(part, target)
                return None
            os.unlink(part)
            if resumed and fresh_try:
                fresh_try = False
                continue
            return f"sha256 mismatch after download: got {got}, the schedule announced {sha256}"


def _with_retries(
    url: str,
    attempt: Callable[[], None],
    cancel: threading.Event,
    attempts: int,
    backoff: Tuple[float, float],
    io_error: str,
) -> Optional[str]:
    """Call ``attempt`` until it returns, retrying transient failures (connection errors,
    timeouts, :class:`_Again`) with exponential backoff and jitter; blocking.

    Args:
        url: named in the log lines.
        attempt: one request; raises :class:`FetchRefused` (final), :class:`FetchCancelled`,
            :class:`_Again` or a ``requests`` error (retried), ``OSError`` (a local file).
        cancel: set when the agent stops (the backoff is not sat out).
        attempts: calls in all before giving up.
        backoff: (first, longest) seconds between attempts.
        io_error: the start of the answer for a local ``OSError`` (``cannot write PATH``).

    Returns:
        None on success; else why not (``stopped``, ``HTTP 403: ...``, ``TLS: ...``,
        ``gave up after N attempts: ...``, ``<io_error>: ...``).
    """
    import requests
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

    retry_on = (_Again, requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)

    def transient(exc: BaseException) -> bool:
        # a certificate that does not verify will not verify next time either
        return isinstance(exc, retry_on) and "certificate verify failed" not in str(exc).lower()

    def note(state: Any) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s: attempt %d failed (%s); retrying", url, state.attempt_number, exc)

    def pause(seconds: float) -> None:
        cancel.wait(seconds)  # a stopping agent does not sit out the backoff

    try:
        for state in Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential_jitter(initial=backoff[0], max=backoff[1], jitter=backoff[0]),
            retry=retry_if_exception(transient),
            sleep=pause,
            before_sleep=note,
            reraise=True,
        ):
            with state:
                attempt()
    except FetchCancelled:
        return "stopped"
    except FetchRefused as exc:
        return str(exc)
    except retry_on as exc:  # (requests' errors are OSErrors too: first)
        if not transient(exc):
            return f"TLS: {exc}"
        return f"gave up after {attempts} attempts: {exc}"
    except OSError as exc:
        return f"{io_error}: {exc.strerror or exc}"
    return None


class _Body:
    """``length`` bytes of an open file from its current position, as a ``requests`` body
    (``len`` gives the ``Content-Length``); ends the request when ``cancel`` is set.

    Raises (from ``read``): FetchCancelled; _Again when the file ends early (it shrank:
    the next attempt starts from what the host holds, the host's sha256 check decides).
    """

    def __init__(self, fh: Any, length: int, cancel: threading.Event) -> None:
        self.fh = fh
        self.left = length
        self.cancel = cancel

    def __len__(self) -> int:
        return self.left

    def read(self, n: int = -1) -> bytes:
        if self.cancel.is_set():
            raise FetchCancelled()
        want = self.left if n is None or n < 0 else min(n, self.left)
        piece: bytes = self.fh.read(min(want, CHUNK))
        if want and not piece:
            raise _Again(f"the file ended {self.left} bytes early (it changed while uploaded)")
        self.left -= len(piece)
        return piece


def _answer(resp: Any) -> int:
    """The status code of an upload answer that is not final trouble.

    Raises:
        _Again: 5xx or 409 (out of step with the host: ask again what it holds).
        FetchRefused: other 4xx (401, 403, 413 over a limit, 422 sha256 mismatch, ...).
    """
    code = int(resp.status_code)
    why = resp.text.strip()[:200] or resp.reason  # (an answer to HEAD has no body)
    if code >= 500 or code == 409:
        raise _Again(f"HTTP {code}: {why}")
    if code >= 400:
        raise FetchRefused(f"HTTP {code}: {why}")
    return code


def _put(
    session: Any,
    url: str,
    token: str,
    path: str,
    sha256: str,
    size: int,
    verify: Union[bool, str],
    cancel: threading.Event,
) -> None:
    """One upload attempt: ask what the host holds, send the rest.

    Raises:
        as :func:`_answer`; FetchCancelled; OSError (``path`` cannot be read).
    """
    if cancel.is_set():
        raise FetchCancelled()
    headers = {"Authorization": f"Bearer {token}", "X-Vmr-Sha256": sha256}
    resp = session.head(url, headers={**headers, "X-Vmr-Size": str(size)}, timeout=TIMEOUT, verify=verify)
    _answer(resp)
    have = int(resp.headers.get("X-Vmr-Have", "0"))
    if have >= size:
        return  # the host holds it all (an earlier attempt ended after the last byte)
    if have:
        log.info("%s: resuming the upload at byte %d of %d", url, have, size)
    with open(path, "rb") as fh:
        fh.seek(have)
        headers["Content-Range"] = f"bytes {have}-{size - 1}/{size}"
        headers["Content-Type"] = "application/octet-stream"
        resp = session.put(
            url, data=_Body(fh, size - have, cancel), headers=headers, timeout=TIMEOUT, verify=verify
        )
    if _answer(resp) != 201:
        raise _Again(
            f"HTTP {resp.status_code}: the host holds {resp.headers.get('X-Vmr-Have')} of {size} bytes"
        )


def upload(
    url: str,
    token: str,
    path: str,
    sha256: str,
    size: int,
    verify: Union[bool, str] = True,
    cancel: Optional[threading.Event] = None,
    attempts: int = 10,
    backoff: Tuple[float, float] = (0.5, 30.0),
) -> Optional[str]:
    """Upload the first ``size`` bytes of ``path`` to ``url`` (``PUT``), resuming after what the
    host already holds of this content; blocking.

    Args:
        url: the upload prefix of the schedule event's ``http.upload`` + the percent-encoded
            location.
        token: the VM's bearer token (``http.token``).
        path: the file to send.
        sha256: hex sha256 of those ``size`` bytes (the host checks it).
        size: bytes to send (> 0).
        verify, cancel, attempts, backoff: as :func:`fetch`.

    Returns:
        None when the host holds the whole file, verified; otherwise why not (``HTTP 413:
        ...`` over a limit, ``HTTP 422: ...`` the content did not match ``sha256`` (the file
        changed), ``gave up after N attempts: ...``, ``stopped``, ``cannot read PATH: ...``).
    """
    import requests

    cancel = cancel or threading.Event()
    with requests.Session() as session:
        return _with_retries(
            url,
            lambda: _put(session, url, token, path, sha256, size, verify, cancel),
            cancel,
            attempts,
            backoff,
            f"cannot read {path}",
        )
