"""Start time of the lean commands (``vmr-host resume|status``, ``vmr-handler status``, and
``vmr-handler plan --json`` of a small schedule).

    .venv/bin/python benchmarks/bench_cli_start.py [--runs 20] [--tree OLD_CHECKOUT]

Each control command runs ``--runs`` times against a logs / state directory that does not exist
(so nothing answers: the figure is the start-up and the failed connect, no host involved), as
the console script does (``python -c "...main()"``); ``plan --json`` reads a 50-entry schedule
(written to a scratch directory: its figure is the start-up, the parse of the command line
and the imports of the plan, not the plan's work). It prints the median and the fastest wall
time and the median CPU time (user + system: less sensitive to a busy machine), then from five
``python -X importtime`` runs of the same command the median of the imports' total (the sum of
the modules' own times after the interpreter's start, i.e. after ``site``; a module imported
by ``importlib.import_module``, as the command tables import a command's module, is not in
that log, so its own time is missing) and how many modules of ``vmr_handler`` were imported
(read from ``sys.modules`` at exit). ``--tree DIR`` also runs the ``vmr_handler`` of DIR (e.g.
``git archive HEAD~1 vmr_handler | tar -x -C DIR``), the runs of both interleaved so that a
busy machine weighs on both alike. The modules' bytecode is cached (in a temporary
``PYTHONPYCACHEPREFIX``, warmed by one run), as an installed package has it; ``--no-cache``
compiles every module at every run, as this workspace's ``PYTHONDONTWRITEBYTECODE=1`` does.
Never fails on slowness.
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
#: ``{schedule}``: the small schedule :func:`_small_schedule` writes.
COMMANDS = (
    ("vmr-host", "resume", "--all", "--logs", "/nonexistent"),
    ("vmr-host", "status", "--logs", "/nonexistent"),
    ("vmr-handler", "status", "--state-dir", "/nonexistent"),
    ("vmr-handler", "plan", "{schedule}", "--resume", "-inf", "--json"),
)
#: Printed for ``{schedule}``.
SMALL = "small.json"


def _argv(command: Sequence[str], *flags: str, code: str = "") -> List[str]:
    code = code or f"import sys; from {MAINS[command[0]]} import main; sys.exit(main())"
    return [sys.executable, *flags, "-c", code, *command[1:]]


def _small_schedule(path: str) -> None:
    """50 entries: a stage of 5, a pause, a break, 42 timed ones."""
    import json

    entries: List[Dict[str, object]] = [{"start_time": -1 - i, "executable": "/bin/true"} for i in range(5)]
    entries.append({"start_time": 3, "pause": True, "data": [{"pause_duration": 2}]})
    entries.append({"start_time": 40, "pause": True, "data": [{"pause_duration": "inf"}]})
    entries += [{"start_time": 1 + i, "executable": "/bin/echo", "arguments": f"n {i}"} for i in range(43)]
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(entries, fh)


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


#: Says at exit how many ``vmr_handler`` modules the command imported (``-X importtime`` does
#: not log those imported by ``importlib.import_module``).
_COUNTING = (
    "import atexit, sys; atexit.register(lambda: print('vmr_handler modules:', "
    "sum(m.split('.')[0] == 'vmr_handler' for m in sys.modules), file=sys.stderr)); "
    "from {main} import main; sys.exit(main())"
)


def _imports(command: Sequence[str], tree: Optional[str], runs: int = 5) -> Tuple[float, int]:
    """Import time (ms: the modules' own times after ``site``, the median of ``runs`` runs) and
    the number of ``vmr_handler`` modules of ``command``."""
    figures = [_imports_once(command, tree) for _ in range(runs)]
    return statistics.median(total for total, _ours in figures), figures[0][1]


def _imports_once(command: Sequence[str], tree: Optional[str]) -> Tuple[float, int]:
    """:func:`_imports` of one run."""
    argv = _argv(command, "-X", "importtime", code=_COUNTING.format(main=MAINS[command[0]]))
    out = subprocess.run(argv, env=_env(tree), cwd=CWD, capture_output=True, text=True).stderr
    total, ours, started = 0, 0, False
    for line in out.splitlines():
        if line.startswith("vmr_handler modules:"):
            ours = int(line.split(":")[1])
        if not line.startswith("import time:") or "|" not in line:
            continue
        own, _cumulative, name = line[len("import time:") :].split("|", 2)
        if started and own.strip().isdigit():
            total += int(own)
        started = started or name.strip() == "site"
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
    schedule = os.path.join(scratch, SMALL)
    _small_schedule(schedule)
    commands = [tuple(w.replace("{schedule}", schedule) for w in command) for command in COMMANDS]
    for command in commands:  # warm the caches
        _walls(command, trees, 1)
    head = f"{'median ms':>9} {'min ms':>6} {'cpu ms':>6} {'imports':>7} {'mods':>4}"
    print(f"{'command':<50} {'tree':<6} {head}")
    for command in commands:
        shown = " ".join(command).replace(schedule, SMALL)
        for tree, times in zip(trees, _walls(command, trees, args.runs)):
            total, ours = _imports(command, tree)
            label = "--tree" if tree else "this"
            walls = [w for w, _c in times]
            cpu = statistics.median(c for _w, c in times)
            print(f"{shown:<50} {label:<6} {statistics.median(walls):9.1f} {min(walls):6.1f} "
                  f"{cpu:6.1f} {total:7.1f} {ours:4d}")  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
