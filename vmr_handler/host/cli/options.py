"""What several ``vmr-host`` commands share and the lean ones need: ``--logs`` and its default.

Imports only the standard library's ``argparse``, so that any command module (the lean control
commands included) can take it without an import cycle.
"""

from __future__ import annotations

import argparse

#: ``--logs`` when none is given.
DEFAULT_LOGS = "vmr-logs"


def add_logs(p: argparse.ArgumentParser) -> None:
    """``--logs DIR`` (default :data:`DEFAULT_LOGS`): every command that finds the host by its logs."""
    p.add_argument(
        "--logs", default=DEFAULT_LOGS, metavar="DIR", help=f"logs directory (default ./{DEFAULT_LOGS})"
    )
