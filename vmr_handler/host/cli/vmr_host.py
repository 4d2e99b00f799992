"""``vmr-host`` command line: where the console script starts.

Commands::

    vmr-host serve --schedules DIR [--resources DIR] [--logs DIR] [--channels DIR]
                   [--start-buffer SECONDS] [--expect VM,...] [--connect] [--allow-class NAME]...
                   [--http HOST:PORT [--http-url URL] [--http-cert FILE [--http-key FILE]]]
    vmr-host status [--logs DIR] [--json]
    vmr-host resume (VM... | --all) [--logs DIR] [--json]
    vmr-host release [--exclude VM...] [--logs DIR] [--json]
    vmr-host keygen --out DIR [--force]

The plain forms of ``status``, ``resume`` and ``release`` take the lean path
(:mod:`vmr_handler.host.cli.control_client`: no argparse, logging or host configuration is
imported, so a RESUME leaves within a few ms of the interpreter's start); everything
else goes to the full front end, :mod:`vmr_handler.host.cli.commandline`.

Exit codes: 0 success; 1 runtime error (no running vmr-host, a socket in use, the disk);
2 bad usage or bad input (unusable schedule, unknown VM, a socket path too long, a request
the running host refused).
"""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``vmr-host`` console script. Returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    from vmr_handler.host.cli.control_client import parse_client, run_client

    command = parse_client(args)
    if command is not None:
        return run_client(command)
    from vmr_handler.host.cli.commandline import main as full_main

    return full_main(args)
