"""``vmr-host check DIR``: every schedule file of a ``--schedules`` directory checked, with no
host running (row ``check`` of :data:`vmr_handler.host.cli.vmr_host.COMMANDS`).
"""

from __future__ import annotations

import argparse

from vmr_handler.host.cli.control_client import EXIT_OK, EXIT_USAGE


def add_arguments(check: argparse.ArgumentParser) -> None:
    """``check DIR [--resources DIR] [--allow-class NAME]... [--json]``."""
    check.add_argument("schedules", metavar="DIR", help="one schedule per VM: <vm>.pkl|.yaml|.json")
    check.add_argument("--resources", metavar="DIR",
                       help="also check every `filename` drop is a file of DIR (as serve's)")  # fmt: skip
    check.add_argument("--allow-class", action="append", default=[], metavar="MODULE.NAME",
                       help="also admit this schedule-entry class name in pickles (as serve's)")  # fmt: skip
    check.add_argument("--json", action="store_true",
                       help="print {vms: {...}, problems: [...], resources: {...}} as JSON")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``vmr-host check DIR [--resources RES]``: every bad schedule file at once, each named with
    the loader's message, and with ``--resources`` every ``filename`` drop that is not a file of
    RES (:mod:`vmr_handler.host.serve.files.resources`, the listing ``serve`` refuses to start with).

    Returns:
        0 when all can be used, 2 when some file cannot or some resource is missing.

    Raises:
        UsageError: no such directory or no schedule in it; ``--resources`` is not a directory.
    """
    import json

    from vmr_handler.host.serve.files.resources import check_resources
    from vmr_handler.host.serve.specs import check_specs

    specs, problems = check_specs(args.schedules, args.allow_class)
    resources = check_resources(specs, args.resources)
    if args.json:
        vms = {vm: {"path": sp.schedule_path, "sha256": sp.digest, "format": sp.format}
               for vm, sp in specs.items()}  # fmt: skip
        print(json.dumps({"vms": vms, "problems": problems, "resources": resources.to_dict()}, indent=1))
    else:
        for vm, spec in sorted(specs.items()):
            print(f"ok       {vm}: {spec.schedule_path} ({spec.format}, sha256 {spec.digest[:12]})")
        for line in problems:
            print(f"PROBLEM  {line}")
        for line in resources.lines():
            print(line)
        print(f"{len(specs)} schedule(s) usable, {len(problems)} file(s) with problems{resources.summary()}")
    return EXIT_USAGE if problems or resources.missing else EXIT_OK
