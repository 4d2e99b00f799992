"""What this build of the agent can do: the optional part a frozen build may leave out.

Signature checks (SPEC section 7) need the ``cryptography`` package, and only they do.
``packaging/build.sh --without-signatures`` leaves it out of the frozen agent (12 MB less to
unpack at every start of the single file; packaging/README.md). Such an agent cannot verify the
host's Ed25519 signatures, so it must never start with a ``public_key`` configured: it would
otherwise have to choose between refusing every control message and running unsigned ones.

This module imports nothing heavy (``--version`` reads it): :func:`signature_checks` only asks
the import system whether ``cryptography`` is there, it does not import it.
"""

from __future__ import annotations

import sys

from vmr_handler.core.errors import SigningError

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    from typing import List, Optional

#: The build option that leaves the signature checks out.
WITHOUT_OPTION = "packaging/build.sh --without-signatures"


def signature_checks() -> bool:
    """Whether this agent can check Ed25519 signatures: ``cryptography`` can be found.

    True for the package installed with its dependencies and for a default frozen build;
    False for a ``--without-signatures`` build (and a Python without ``cryptography``).
    Finds the package without importing it (no cost for ``--version``).
    """
    import importlib.util

    try:
        return importlib.util.find_spec("cryptography") is not None
    except (ImportError, ValueError):  # a broken parent entry in sys.modules / sys.path hook
        return False


def about_lines() -> List[str]:
    """What ``vmr-handler --version`` prints after the version line: one line that says
    whether signature checks are built in (``signature checks: built in`` or
    ``signature checks: not built in (...)``)."""
    if signature_checks():
        return ["signature checks: built in (Ed25519, cryptography)"]
    return [f"signature checks: not built in ({_why_missing()}); a public_key is refused"]


def _why_missing() -> str:
    """Why ``cryptography`` is missing: the frozen build's option, or the Python's package."""
    if getattr(sys, "frozen", False):
        return f"built with {WITHOUT_OPTION}"
    return f"no cryptography package in {sys.executable}"


def unsigned_build_error(setting: str, cause: Optional[BaseException] = None) -> SigningError:
    """The error that stops an agent without signature checks when a key is configured.

    Args:
        setting: where the key was set, for the message: ``"--public-key"`` or
            ``"public_key in /etc/vmr-handler/config.yaml"``.
        cause: the ImportError met, if any (named in the message when not frozen).

    Returns:
        a :class:`SigningError` (the CLI exits 1 with it, as for other config errors) naming
        the setting, why the checks are missing and the two ways out.
    """
    if getattr(sys, "frozen", False):
        what = (
            f"this vmr-handler was built without signature checks ({WITHOUT_OPTION}), so it cannot "
            "verify the host's signed schedules, start times and RESUMEs, and it never runs unsigned ones "
            "when a key is set"
        )
        fix = "rebuild the agent with packaging/build.sh without --without-signatures"
    else:
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        what = (
            f"the Python running vmr-handler ({sys.executable}) cannot import cryptography{detail}, so it "
            "cannot verify the host's signed messages, and it never runs unsigned ones when a key is set"
        )
        fix = "install it (pip install cryptography)"
    return SigningError(
        f"{setting} is set, but {what}. To go on: {fix}, or remove that setting to run unsigned"
    )


def require_signature_checks(setting: str) -> None:
    """Stop at once when a key is configured (``setting`` names where) and this agent cannot
    check signatures; nothing is started before.

    Raises:
        SigningError: :func:`unsigned_build_error`.
    """
    if not signature_checks():
        raise unsigned_build_error(setting)
