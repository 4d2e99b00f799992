"""Shell completion scripts for ``vmr-handler`` and ``vmr-host``, generated from
their argparse parsers by shtab (so they never drift from the real options).

Install for bash: ``vmr-host completion bash > /etc/bash_completion.d/vmr-host`` (and the same
for ``vmr-handler``), or ``source <(vmr-host completion bash)`` in a shell.
"""

from __future__ import annotations

import argparse

#: The shells shtab writes scripts for.
SHELLS = ("bash", "zsh", "tcsh")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of the ``completion SHELL`` command (both CLIs' command tables)."""
    p.add_argument("shell", choices=SHELLS, help="the shell")


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of :data:`SHELLS`)."""
    import shtab

    return str(shtab.complete(parser, shell=shell))
