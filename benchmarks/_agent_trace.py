"""Run ``vmr-handler`` in-process with timing probes around a few engine internals.

Used by ``bench_agent.py`` (sections 1c and 2b) to explain where the lateness of a burst of
same-instant entries, or of a fast stream of entries, goes. Usage::

    python benchmarks/_agent_trace.py TRACE.json run --local SCHEDULE ... (normal CLI args)

The probes are best effort: an internal that no longer exists is simply not traced, so the
benchmark keeps working while ``vmr_handler`` evolves. Nothing in ``vmr_handler`` is changed
on disk; the wrappers only live in this process.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# name -> list of (t_in, t_out) in time.time() seconds
SPANS: Dict[str, List[List[float]]] = {}


def _record(name: str, t_in: float, t_out: float) -> None:
    SPANS.setdefault(name, []).append([t_in, t_out])


def _wrap(owner: Any, attr: str, name: str) -> bool:
    orig = getattr(owner, attr, None)
    if orig is None:
        return False
    if inspect.iscoroutinefunction(orig):

        @functools.wraps(orig)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            t_in = time.time()
            try:
                return await orig(*args, **kwargs)
            finally:
                _record(name, t_in, time.time())

        setattr(owner, attr, awrapper)
    else:

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t_in = time.time()
            try:
                return orig(*args, **kwargs)
            finally:
                _record(name, t_in, time.time())

        setattr(owner, attr, wrapper)
    return True


def _install() -> List[str]:
    traced: List[str] = []
    try:
        from vmr_handler.agent.engine import engine, entries

        for owner, attr, name in (
            (engine.Engine, "_fire_group", "fire_group"),
            (entries.EntryLauncher, "prepare", "prepare"),
            (entries.EntryLauncher, "launch_all", "launch_all"),
            (engine.Engine, "_save", "journal_save"),  # full snapshot: json + fsync + rename + dir fsync
        ):
            if _wrap(owner, attr, name):
                traced.append(name)
        # Working dirs made ahead of time; runs in a worker thread, not on the event loop.
        # (A module global looked up at call time, so wrapping the module attribute works.)
        if _wrap(engine, "_make_dirs", "make_dirs"):
            traced.append("make_dirs")
    except ImportError:
        pass
    try:
        from vmr_handler.agent.state import journal

        for attr, name in (
            ("_log_entry", "journal_append"),  # one entry change: json line + os.write
            ("sync", "journal_sync"),  # fsync of journal.log (one per 50 ms burst)
        ):
            if _wrap(journal.Journal, attr, name):
                traced.append(name)
    except ImportError:
        pass
    try:
        from vmr_handler.transports import local

        if _wrap(local.LocalReporter, "__call__", "report_write"):
            traced.append("report_write")
    except ImportError:
        pass
    try:
        import psutil

        if _wrap(psutil.Process, "create_time", "psutil_create_time"):
            traced.append("psutil_create_time")
    except ImportError:
        pass
    # The synchronous fork/exec inside every spawn (blocks the event loop).
    import subprocess

    if _wrap(subprocess.Popen, "__init__", "popen"):
        traced.append("popen")
    # The whole spawn: asyncio.create_subprocess_exec call -> return (includes waiting).
    orig_cse: Callable[..., Any] = asyncio.create_subprocess_exec

    async def cse(*args: Any, **kwargs: Any) -> Any:
        t_in = time.time()
        proc = await orig_cse(*args, **kwargs)
        _record("spawn", t_in, time.time())
        return proc

    asyncio.create_subprocess_exec = cse
    traced.append("spawn")
    return traced


def main() -> int:
    out_path = sys.argv[1]
    argv = sys.argv[2:]
    traced = _install()
    from vmr_handler.agent.cli import commandline as cli

    rc = 1
    try:
        rc = cli.main(argv)
    finally:
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump({"traced": traced, "spans": SPANS, "rc": rc}, fh)
    return rc


if __name__ == "__main__":
    sys.exit(main())
