"""The ``--http*`` flags of ``vmr-host serve`` and the per-VM tokens of the HTTP(S) server.

:func:`parse_http_options` checks the flags into :class:`~vmr_handler.host.serve.config.HttpOptions`;
:func:`load_tokens` keeps one secret token per VM in ``<logs>/http-tokens.json`` (mode 0600)
so a restarted host keeps them. The server itself is :mod:`vmr_handler.host.serve.http.server`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import urllib.parse
from typing import Any, Dict, Optional

from vmr_handler.core.errors import HostSetupError, UsageError
from vmr_handler.host.logs.store import atomic_write_json
from vmr_handler.host.serve.config import HttpOptions

TOKENS_FILE = "http-tokens.json"


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
        UsageError: a malformed value, a key without a certificate, a wildcard bind address
            without ``url``, or a ``url`` that is not ``http[s]://``; the message names the flag.
    """
    host, sep, port_text = bind.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--http {bind!r}: expected HOST:PORT with a port 1-65535")
    if key_file and not cert_file:
        raise UsageError("--http-key needs --http-cert")
    for flag, path in (("--http-cert", cert_file), ("--http-key", key_file)):
        if path and not os.path.isfile(path):
            raise UsageError(f"{flag} {path}: no such file")
    if debug_rate is not None and not debug_rate > 0:
        raise UsageError("--http-debug-rate must be > 0 bytes per second")
    scheme = "https" if cert_file else "http"
    if url is None:
        if host in ("0.0.0.0", "::", ""):
            raise UsageError(f"--http {bind}: binds every interface; give --http-url (how agents reach it)")
        url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port_text}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise UsageError(f"--http-url {url!r}: expected http[s]://HOST[:PORT][/PREFIX]")
    return HttpOptions(host, int(port_text), url.rstrip("/"), cert_file, key_file, debug_rate)


def http_options(args: argparse.Namespace) -> Optional[HttpOptions]:
    """The ``--http*`` flags (:func:`~vmr_handler.host.serve.http.options.parse_http_options`), or None.

    Raises:
        UsageError: a malformed flag, or ``--http-url/--http-cert/--http-key`` without ``--http``.
    """
    if not args.http:
        if args.http_url or args.http_cert or args.http_key:
            raise UsageError("--http-url/--http-cert/--http-key need --http HOST:PORT")
        return None
    return parse_http_options(args.http, args.http_url, args.http_cert, args.http_key, args.http_debug_rate)


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
            shape = '{"version": 1, "tokens": {"<vm>": "<token>"}}'
            raise HostSetupError(f"cannot use {path}: expected {shape}")
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


def token_key(token: str) -> str:
    """The key ``token`` is looked up by: its sha256 in hex, so the lookup time tells nothing
    about the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
