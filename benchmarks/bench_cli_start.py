"""Start time of the lean control commands (``vmr-host resume|status``, ``vmr-handler status``).

    .venv/bin/python benchmarks/bench_cli_start.py [--runs 20] [--tree OLD_CHECKOUT]

Each command runs ``--runs`` times against a logs / state directory that does not exist (so
nothing answers: the figure is the start-up and the failed connect, no host involved), as the
console script does (``python -c "...main()"``); it prints the median and the fastest wall
time, and from one ``python -X importtime`` run of the same command the imports' total (the
sum of the top-level imports' cumulative times) and how many modules of ``vmr_handler`` were
imported. ``--tree DIR`` also runs the ``vmr_handler`` of DIR (e.g. ``git archive HEAD~1
vmr_handler | tar -x -C DIR``), the runs of both interleaved so that a busy machine weighs on
both alike. Never fails on slowness.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

#: The console scripts' entry points (pyproject.toml).
MAINS = {"vmr-host": "vmr_handler.host.cli.vmr_host", "vmr-handler": "vmr_handler.agent.cli.commandline"}
COMMANDS = (
    ("vmr-host", "resume", "--all", "--logs", "/nonexistent"),
    ("vmr-host", "status", "--logs", "/nonexistent"),
    ("vmr-handler", "status", "--state-dir", "/nonexistent"),
)


def _argv(command: Sequence[str], *flags: str) -> List[str]:
    code = f"import sys; from {MAINS[command[0]]} import main; sys.exit(main())"
    return [sys.executable, *flags, "-c", code, *command[1:]]


def _env(tree: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    return env


def _walls(command: Sequence[str], trees: Sequence[Optional[str]], runs: int) -> List[List[float]]:
    """Wall times (ms) of ``command`` under each tree, the trees' runs interleaved."""
    times: List[List[float]] = [[] for _ in trees]
    for _ in range(runs):
        for i, tree in enumerate(trees):
            t0 = time.perf_counter()
            subprocess.run(_argv(command), env=_env(tree), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)  # fmt: skip
            times[i].append((time.perf_counter() - t0) * 1000)
    return times


def _imports(command: Sequence[str], tree: Optional[str]) -> Tuple[float, int]:
    """Total import time (ms) and the number of ``vmr_handler`` modules of one run of ``command``."""
    argv = _argv(command, "-X", "importtime")
    out = subprocess.run(argv, env=_env(tree), capture_output=True, text=True).stderr
    total, ours = 0, 0
    for line in out.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _self, cumulative, name = line[len("import time:") :].split("|", 2)
        if not cumulative.strip().isdigit():
            continue
        if not name.startswith("  "):  # a top-level import (the nested ones are indented more)
            total += int(cumulative)
        ours += name.strip().startswith("vmr_handler")
    return total / 1000, ours


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tree", help="also run the vmr_handler package found in this directory")
    args = ap.parse_args()
    trees: List[Optional[str]] = [args.tree, None] if args.tree else [None]
    print(f"{'command':<48} {'tree':<6} {'median ms':>9} {'min ms':>7} {'imports ms':>10} {'vmr mods':>8}")
    for command in COMMANDS:
        for tree, times in zip(trees, _walls(command, trees, args.runs)):
            total, ours = _imports(command, tree)
            label = "--tree" if tree else "this"
            print(f"{' '.join(command):<48} {label:<6} {statistics.median(times):9.1f} {min(times):7.1f} "
                  f"{total:10.1f} {ours:8d}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
