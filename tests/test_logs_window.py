"""``vmr-host logs VM --tail N --since T``: the last N lines, those from T on (ISO UTC,
experiment time ``t=+X``, a duration ago), with the other filters; a T that is no time is
refused naming the forms it takes. On a log written by hand, through the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from vmr_handler.core.errors import UsageError
from vmr_handler.host.cli.logs import since_time

START = 1_795_000_000.0  # 2026-11-18T11:06:40Z


def _logs(tmp_path: Path, start: float = START) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir(parents=True)
    (logs / "experiment.json").write_text(json.dumps({"barrier": {"start_time": start}}))
    lines = []
    for i in range(10):  # output lines at t=+0 .. t=+9
        ev = {"type": "output", "timestamp": start + i, "id": f"o{i}",
              "data": {"index": i % 2, "stream": "stdout", "line": f"line {i}"}}  # fmt: skip
        lines.append(json.dumps({"event": ev}))
    (logs / "vm1.jsonl").write_text("\n".join(lines) + "\n")
    return logs


def _run(logs: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "vmr_handler.host", "logs", "vm1", *args, "--logs", str(logs)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _said(res: subprocess.CompletedProcess) -> List[str]:
    assert res.returncode == 0, res.stderr
    return [line.rsplit(": ", 1)[1] for line in res.stdout.splitlines()]


def test_tail_keeps_the_last_lines_after_the_filters(tmp_path: Path) -> None:
    logs = _logs(tmp_path)
    assert _said(_run(logs, "--tail", "3")) == ["line 7", "line 8", "line 9"]
    assert _said(_run(logs, "--tail", "2", "--entry", "0")) == ["line 6", "line 8"]
    assert _said(_run(logs, "--tail", "0")) == []
    assert _said(_run(logs, "--tail", "50")) == [f"line {i}" for i in range(10)]
    bad = _run(logs, "--tail", "-1")
    assert bad.returncode == 2 and "not a number of lines" in bad.stderr


def test_since_takes_utc_experiment_time_and_a_duration_ago(tmp_path: Path) -> None:
    logs = _logs(tmp_path)
    assert _said(_run(logs, "--since", "t=+7")) == ["line 7", "line 8", "line 9"]
    assert _said(_run(logs, "--since", "t=+7.5s", "--tail", "1")) == ["line 9"]
    assert _said(_run(logs, "--since", "2026-11-18T11:06:48Z")) == ["line 8", "line 9"]
    assert _said(_run(logs, "--since", "2026-11-18T11:06:48")) == ["line 8", "line 9"]  # no zone: UTC
    assert _said(_run(logs, "--since", "5m")) == []  # the log is older than 5 minutes
    recent = _logs(tmp_path / "recent", start=time.time() - 5)
    lately = _said(_run(recent, "--since", "2s"))  # lines at now-5 .. now+4: from about line 3
    assert "line 9" in lately and "line 0" not in lately and "line 2" not in lately, lately
    assert len(_said(_run(recent, "--since", "1h"))) == 10
    bad = _run(logs, "--since", "yesterday")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "'yesterday' is not a time" in bad.stderr and "t=+30" in bad.stderr and "5m" in bad.stderr


def test_since_units_and_an_unset_start() -> None:
    assert since_time("90s", None, 1000.0) == 910.0
    assert since_time("2m", None, 1000.0) == 880.0
    assert since_time("1h", None, 10000.0) == 6400.0
    assert since_time("30", None, 1000.0) == 970.0
    assert since_time("t=-5", 100.0, 0.0) == 95.0
    with pytest.raises(UsageError, match="start is not set"):
        since_time("t=+5", None, 0.0)
