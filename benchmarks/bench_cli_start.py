"""Start time of the lean control commands (``vmr-host resume|status``, ``vmr-handler status``).

    .venv/bin/python benchmarks/bench_cli_start.py [--runs 20] [--tree OLD_CHECKOUT]

Each command runs ``--runs`` times against a logs / state directory that does not exist (so
nothing answers: the figure is the start-up and the failed connect, no host involved), as the
console script does (``python -c "...main()"``); it prints the median and the fastest wall
time and the median CPU time (user + system: less sensitive to a busy machine), and from one
``python -X importtime`` run of the same command the imports' total (the
sum of the top-level imports' cumulative times) and how many modules of ``vmr_handler`` were
imported. ``--tree DIR`` also runs the ``vmr_handler`` of DIR (e.g. ``git archive HEAD~1
vmr_handler | tar -x -C DIR``), the runs of both interleaved so that a busy machine weighs on
both alike. The modules' bytecode is cached (in a temporary ``PYTHONPYCACHEPREFIX``, warmed by
one run), as an installed package has it; ``--no-cache`` compiles every module at every run,
as this workspace's ``PYTHONDONTWRITEBYTECODE=1`` does. Never fails on slowness.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
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


#: Where the commands run: not the repository, whose ``vmr_handler`` would come first on ``sys.path``.
CWD = "/"


#: The bytecode cache of each tree (None: nothing cached, every module compiled at every run).
CACHE: Dict[Optional[str], Optional[str]] = {}


def _env(tree: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    if CACHE.get(tree):
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(CACHE[tree])
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


Times = List[Tuple[float, float]]


def _walls(command: Sequence[str], trees: Sequence[Optional[str]], runs: int) -> List[Times]:
    """Wall and CPU (user + system) times (ms) of ``command`` under each tree, the trees' runs
    interleaved. The CPU time suffers less from a busy machine than the wall time."""
    times: List[Times] = [[] for _ in trees]
    for _ in range(runs):
        for i, tree in enumerate(trees):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(_argv(command), env=_env(tree), cwd=CWD, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)  # fmt: skip
            wall = (time.perf_counter() - t0) * 1000
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
            times[i].append((wall, cpu))
    return times


def _imports(command: Sequence[str], tree: Optional[str]) -> Tuple[float, int]:
    """Total import time (ms) and the number of ``vmr_handler`` modules of one run of ``command``."""
    argv = _argv(command, "-X", "importtime")
    out = subprocess.run(argv, env=_env(tree), cwd=CWD, capture_output=True, text=True).stderr
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
    ap.add_argument("--no-cache", action="store_true", help="no bytecode cache: compile at every run")
    args = ap.parse_args()
    trees: List[Optional[str]] = [args.tree, None] if args.tree else [None]
    scratch = tempfile.mkdtemp(prefix="bench-cli-")
    for i, tree in enumerate(trees):
        CACHE[tree] = None if args.no_cache else os.path.join(scratch, str(i))
    for command in COMMANDS:  # warm the caches
        _walls(command, trees, 1)
    head = f"{'median ms':>9} {'min ms':>6} {'cpu ms':>6} {'imports':>7} {'mods':>4}"
    print(f"{'command':<44} {'tree':<6} {head}")
    for command in COMMANDS:
        for tree, times in zip(trees, _walls(command, trees, args.runs)):
            total, ours = _imports(command, tree)
            label = "--tree" if tree else "this"
            walls = [w for w, _c in times]
            cpu = statistics.median(c for _w, c in times)
            print(f"{' '.join(command):<44} {label:<6} {statistics.median(walls):9.1f} {min(walls):6.1f} "
                  f"{cpu:6.1f} {total:7.1f} {ours:4d}")  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
