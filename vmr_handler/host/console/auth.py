"""Who may use the console: one bearer token per logs directory, kept owner-only in
``<logs>/console.token``, and the rule of :func:`refusal`.

Guests never reach the console (its own listener, loopback by default), but anything else on a
shared machine might: every write (POST resume/release) needs the token always; reads need it
when the console is bound beyond loopback.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from typing import Optional

from vmr_handler.core.errors import HostSetupError

TOKEN_FILE = "console.token"
#: Random bytes of a new token (shown as hex: 64 characters).
TOKEN_BYTES = 32


def load_token(logs: str) -> str:
    """The console token of ``logs``: read from ``<logs>/console.token``, or made and written
    there (mode 0600, created exclusively) when there is none. A restarted host keeps it.

    Raises:
        HostSetupError: the file cannot be read or written, is empty, or is readable by others
            (the message says what to do).
    """
    path = os.path.join(logs, TOKEN_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    except FileExistsError:
        return _read(path)
    except OSError as exc:
        raise HostSetupError(f"cannot write the console token {path}: {exc.strerror}") from exc
    token = secrets.token_hex(TOKEN_BYTES)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(token + "\n")
    return token


def _read(path: str) -> str:
    try:
        st = os.stat(path)
        with open(path, encoding="ascii") as fh:
            token = fh.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostSetupError(f"cannot read the console token {path}: {exc}") from exc
    if st.st_mode & 0o077:
        raise HostSetupError(
            f"the console token {path} is readable by others (mode {st.st_mode & 0o777:o}); "
            f"chmod 600 it, or delete it for a new one"
        )
    if not token:
        raise HostSetupError(f"the console token {path} is empty; delete it for a new one")
    return token


def is_loopback(host: str) -> bool:
    """True when ``host`` (a bind address) reaches only this machine: ``localhost``, 127.0.0.0/8, ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refusal(authorization: Optional[str], token: str, write: bool, loopback: bool) -> Optional[str]:
    """Why a request is refused (None: it may go on). Pure.

    Args:
        authorization: the request's ``Authorization`` header (``Bearer <token>``), or None.
        token: the console token.
        write: the request changes the experiment (POST).
        loopback: the console is bound to loopback only (reads need no token then).
    """
    if not write and loopback:
        return None
    if not authorization:
        what = "changing the experiment" if write else "reading the console beyond loopback"
        return (
            f"{what} needs the token: send 'Authorization: Bearer <token>' "
            f"(the token is in <logs>/{TOKEN_FILE})"
        )
    scheme, _sep, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        return f"wrong token (it is in <logs>/{TOKEN_FILE} of the host)"
    return None
