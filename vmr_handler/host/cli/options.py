"""What several ``vmr-host`` commands share and the lean ones need: ``--logs`` and its default,
the commands a hint prints, and the refusal of VM names the host does not know.

The logs directory is ``--logs DIR``, else the environment variable ``VMR_LOGS``, else
``./vmr-logs``. Imports only the standard library's ``os`` at import time, so
that any command module (the lean control commands included) can take it without an import
cycle.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    import argparse
    from typing import Iterable, Optional, Sequence

#: ``--logs`` when neither it nor :data:`ENV_LOGS` is given.
DEFAULT_LOGS = "vmr-logs"
#: The environment variable every ``vmr-host`` command reads its logs directory from when no
#: ``--logs`` is given.
ENV_LOGS = "VMR_LOGS"


def default_logs() -> str:
    """The logs directory without ``--logs``: ``$VMR_LOGS``, else :data:`DEFAULT_LOGS`."""
    return os.environ.get(ENV_LOGS) or DEFAULT_LOGS


def add_logs(p: argparse.ArgumentParser) -> None:
    """``--logs DIR`` (default ``$VMR_LOGS``, else :data:`DEFAULT_LOGS`): every command that
    finds the host by its logs."""
    p.add_argument(
        "--logs", default=default_logs(), metavar="DIR",
        help=f"logs directory (default ${ENV_LOGS}, else ./{DEFAULT_LOGS})",
    )  # fmt: skip


def program() -> str:
    """``vmr-host`` as a printed command names it: ``vmr-host`` when that is what the shell
    finds on ``PATH`` (or this process was not started by the console script: ``python -m``),
    else the absolute path of the script this process runs (``.venv/bin/vmr-host`` typed
    without the venv on ``PATH``)."""
    import sys

    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) != "vmr-host":
        return "vmr-host"
    mine = os.path.realpath(argv0)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = os.path.join(folder or ".", "vmr-host")
        if os.path.isfile(found) and os.access(found, os.X_OK):
            return "vmr-host" if os.path.realpath(found) == mine else mine
    return mine


def host_command(logs: Optional[str], *words: str) -> str:
    """``vmr-host WORDS --logs DIR``: a command as a hint prints it, one that runs as printed
    from any directory: :func:`program`, every word shell-quoted, and the logs directory
    ``logs`` as an absolute path, left out only when ``$VMR_LOGS`` names that directory (the
    operator's shell finds it then) or ``logs`` is None."""
    import shlex

    text = " ".join([shlex.quote(program()), *(shlex.quote(w) for w in words)])
    if logs is None:
        return text
    where = os.path.abspath(logs)
    env = os.environ.get(ENV_LOGS)
    if env and os.path.abspath(env) == where:
        return text
    return f"{text} --logs {shlex.quote(where)}"


def check_known(names: Iterable[str], known: Sequence[str]) -> None:
    """Refuse VM names the host does not know.

    Raises:
        UsageError: (exit 2) some of ``names`` are not in ``known``; it names them and a few
            of the known ones.
    """
    have = set(known)
    unknown = list(dict.fromkeys(n for n in names if n not in have))
    if unknown:
        from vmr_handler.core.errors import UsageError
        from vmr_handler.core.readable import unknown_text

        raise UsageError(unknown_text(unknown, sorted(have)))
