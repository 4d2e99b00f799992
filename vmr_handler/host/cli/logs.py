"""``vmr-host logs VM [-f] [--tail N] [--since T] [--entry N] [--stream stdout|stderr] [--json]``.

A VM's events and its entries' output from ``<logs>/<vm>.jsonl``, like ``kubectl logs``:
each line in ISO UTC with its experiment time (``t=+12.3s``, from ``experiment.json``),
output lines whole and with bytes that are not UTF-8 escaped (``\\xe9``), never hidden;
``-f`` follows what the running host appends; ``--tail N`` keeps the last N lines (then
follows, with ``-f``), ``--since T`` those from T on (ISO UTC, ``t=+X`` experiment time, or a
duration ago: ``5m``). Reads the files only: it works with or without a running ``vmr-host``.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import re
import sys
import time
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

from vmr_handler.core.errors import UsageError
from vmr_handler.core.events import Event, describe
from vmr_handler.core.fsutil import utc_text
from vmr_handler.core.readable import escaped, unknown_text
from vmr_handler.host.cli.options import add_logs
from vmr_handler.host.logs.jsonlread import event_of, records_from
from vmr_handler.host.logs.text import printable

#: Seconds between two looks at the file with ``-f``.
FOLLOW_INTERVAL = 0.2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``logs VM [-f] [--entry N] [--stream stdout|stderr] [--json] [--logs DIR]``."""
    p.add_argument("vm", metavar="VM")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what the host appends")
    p.add_argument("--tail", type=_count, metavar="N", help="only the last N lines (then follow, with -f)")
    p.add_argument("--since", metavar="T",
                   help="only from T on: ISO UTC (2026-11-24T08:00:00Z), experiment time (t=+30), "
                        "or a duration ago (90s, 5m, 2h)")  # fmt: skip
    p.add_argument("--entry", type=int, metavar="N", help="only schedule entry N")
    p.add_argument("--stream", choices=("stdout", "stderr"), help="only this output stream")
    add_logs(p)
    p.add_argument("--json", action="store_true", help="the stored records, one JSON object per line")


def run(args: argparse.Namespace) -> int:
    """``vmr-host logs``: :func:`show_logs` of the parsed arguments."""
    since = None if args.since is None else since_time(args.since, start_time(args.logs), time.time())
    return show_logs(args.logs, args.vm, args.follow, args.entry, args.stream, args.json, args.tail, since)


def _count(text: str) -> int:
    """``--tail N``: a count of lines, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines (0 or more)")
    return n


#: Units of a ``--since`` duration, in seconds.
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def since_time(text: str, start: Optional[float], now: float) -> float:
    """The UTC instant (epoch seconds) of ``--since T``: ISO UTC (``2026-11-24T08:00:00Z``; no
    zone is UTC), ``t=+X`` (experiment time: X seconds after the start ``start``), or a
    duration ago from ``now`` (``90s``, ``5m``, ``2h``, ``1d``; a bare number is seconds).

    Raises:
        UsageError: it is none of them, or ``t=`` while the start is not set.
    """
    text = text.strip()
    exp = re.fullmatch(r"t=([+-]?\d+(?:\.\d+)?)s?", text)
    if exp:
        if start is None:
            raise UsageError(f"--since {text}: the experiment start is not set yet, so there is no "
                             "experiment time; give a UTC time or a duration ago (5m)")  # fmt: skip
        return start + float(exp.group(1))
    ago = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text)
    if ago:
        return now - float(ago.group(1)) * _UNITS[ago.group(2)]
    from datetime import datetime, timezone

    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since {text!r} is not a time: give ISO UTC (2026-11-24T08:00:00Z), experiment time "
            "(t=+30) or a duration ago (5m)"
        ) from None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """``report [--logs DIR] [--out FILE.html]`` (run by :func:`vmr_handler.host.report.files.cmd_report`:
    the logs as one HTML file)."""
    add_logs(p)
    p.add_argument("--out", metavar="FILE.html", help="where to write it (default <logs>/report.html)")


def start_time(logs: str) -> Optional[float]:
    """The experiment start time (UTC epoch seconds) in ``<logs>/experiment.json``, if set."""
    try:
        with open(os.path.join(logs, "experiment.json"), encoding="utf-8") as f:
            value = json.load(f).get("barrier", {}).get("start_time")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def log_path(logs: str, vm: str) -> str:
    """``<logs>/<vm>.jsonl``.

    Raises:
        UsageError: there is no such log (the message lists a few of the VMs that have one).
    """
    path = os.path.join(logs, f"{vm}.jsonl")
    if os.sep in vm or not os.path.isfile(path):
        try:
            known = sorted(n[: -len(".jsonl")] for n in os.listdir(logs) if n.endswith(".jsonl"))
        except OSError as exc:
            raise UsageError(f"cannot read the logs directory {logs}: {exc.strerror}") from exc
        raise UsageError(f"no log in {logs}: {unknown_text([vm], known)}")
    return path


def records(
    path: str, follow: bool = False, interval: float = FOLLOW_INTERVAL, start: int = 0
) -> Iterator[Dict[str, Any]]:
    """The records of a ``.jsonl`` log from byte ``start`` (a line start); with ``follow``,
    then every record appended, forever (:func:`~vmr_handler.host.logs.jsonlread.records_from`
    again from where it stopped, every ``interval`` seconds).

    A last line still being written is read once it is whole; a line that is not a record
    (not JSON, no ``event`` object) is skipped (the host never writes one; a torn line is cut
    back by the host)."""
    at = start
    while True:
        for _offset, end, rec in records_from(path, at):
            at = end
            if isinstance(rec.get("event"), dict):
                yield rec
        if not follow:
            return
        time.sleep(interval)


def keep(ev: Event, entry: Optional[int], stream: Optional[str]) -> bool:
    """``--entry`` and ``--stream`` (``--stream`` keeps output lines only)."""
    if entry is not None and ev.data.get("index") != entry:
        return False
    return stream is None or (ev.type == "output" and ev.data.get("stream") == stream)


def line_text(ev: Event, start: Optional[float]) -> str:
    """One readable line: UTC, experiment time, then the event (an output line whole)."""
    t = f" t={ev.timestamp - start:+.1f}s" if start is not None else ""
    if ev.type == "output":
        d = ev.data
        if "line_b64" in d:
            try:
                text = escaped(base64.b64decode(d["line_b64"]))
            except ValueError:
                text = "<undecodable line_b64>"
        else:
            text = str(d.get("line", ""))
        tail = "" if d.get("eol", True) else " [no newline]"
        where = f"entry {d.get('index')} {d.get('stream')}"
        return f"{utc_text(ev.timestamp)}{t} {where}: {printable(text)}{tail}"
    stamp, rest = describe(ev).split(" ", 1)
    return f"{stamp}{t} {printable(rest)}"


def _kept(
    rec: Dict[str, Any], entry: Optional[int], stream: Optional[str], since: Optional[float]
) -> Optional[Event]:
    """The event of record ``rec`` when ``--entry``, ``--stream`` and ``--since`` keep it."""
    ev = event_of(rec) if isinstance(rec.get("event"), dict) else None
    if ev is None or not keep(ev, entry, stream) or (since is not None and ev.timestamp < since):
        return None
    return ev


def show_logs(logs: str, vm: str, follow: bool = False, entry: Optional[int] = None,
              stream: Optional[str] = None, as_json: bool = False, tail: Optional[int] = None,
              since: Optional[float] = None) -> int:  # fmt: skip
    """Print VM ``vm``'s log (see the module docstring); returns the exit code (0). ``tail``:
    only the last that many lines of what is there now (then every line appended, with
    ``follow``); ``since``: only events from that UTC instant on.

    Raises:
        UsageError: no log for ``vm``.
    """
    path = log_path(logs, vm)
    start = start_time(logs)
    out: List[str] = []
    at = 0
    if tail is not None:
        last: Deque[Tuple[Dict[str, Any], Event]] = collections.deque(maxlen=tail)
        for _offset, end, rec in records_from(path, 0):
            at = end
            kept = _kept(rec, entry, stream, since)
            if kept is not None:
                last.append((rec, kept))
        out = [json.dumps(rec) if as_json else line_text(ev, start) for rec, ev in last]
    try:
        for rec in records(path, follow, start=at):
            ev = _kept(rec, entry, stream, since)
            if ev is None:
                continue
            out.append(json.dumps(rec) if as_json else line_text(ev, start))
            if follow or len(out) >= 256:
                sys.stdout.write("\n".join(out) + "\n")
                sys.stdout.flush()
                out.clear()
                if follow and start is None:
                    start = start_time(logs)
    except KeyboardInterrupt:
        pass
    if out:
        sys.stdout.write("\n".join(out) + "\n")
    return 0
