"""``vmr-host keygen --out DIR [--force]``: make the host's Ed25519 signing key pair.

Writes ``DIR/host.key`` (private, PEM PKCS8, mode 0600; stays on the host) and ``DIR/host.pub``
(public, PEM SubjectPublicKeyInfo; goes into the guest image / agent config), creating DIR
(mode 0700) when missing. Existing files are never overwritten without ``--force``. Prints the
key id (``vmr_handler.core.wire.signing.key_id``) and both paths. Exit 0, or 2 when a file exists, or 1
when the disk fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Tuple

from vmr_handler.core.errors import SigningError
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.wire.signing import generate_keypair, key_id, load_public_key

PRIVATE_NAME = "host.key"
PUBLIC_NAME = "host.pub"


def write_keypair(out: str, force: bool = False) -> Tuple[str, str, str]:
    """Generate a key pair into ``out``; returns ``(private path, public path, key id)``.

    Raises:
        SigningError: a key file already exists and ``force`` is false (nothing is written).
        OSError: the directory or a file cannot be written.
    """
    private_path, public_path = os.path.join(out, PRIVATE_NAME), os.path.join(out, PUBLIC_NAME)
    existing = [p for p in (private_path, public_path) if os.path.lexists(p)]
    if existing and not force:
        verb = "exists" if len(existing) == 1 else "exist"
        raise SigningError(f"{' and '.join(existing)} already {verb}; use --force to replace the key pair")
    os.makedirs(out, mode=0o700, exist_ok=True)
    private_pem, public_pem = generate_keypair()
    atomic_write(private_path, private_pem, 0o600)
    atomic_write(public_path, public_pem, 0o644)
    return private_path, public_path, key_id(load_public_key(public_pem))


def add_arguments(keygen: argparse.ArgumentParser) -> None:
    """``keygen --out DIR [--force]``."""
    keygen.add_argument(
        "--out", required=True, metavar="DIR", help="writes DIR/host.key (mode 0600) and DIR/host.pub"
    )
    keygen.add_argument("--force", action="store_true", help="replace an existing key pair")


def cmd_keygen(args: argparse.Namespace) -> int:
    """The ``keygen`` subcommand (``args.out``, ``args.force``); returns the exit code."""
    try:
        private_path, public_path, kid = write_keypair(args.out, args.force)
    except SigningError as exc:
        print(f"vmr-host: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vmr-host: error: cannot write the key pair in {args.out}: {exc}", file=sys.stderr)
        return 1
    print(f"key id: {kid}")
    print(f"public key: {public_path} (give it to the agents)")
    print(f"private key: {private_path} (mode 0600, keep it on the host)")
    return 0
