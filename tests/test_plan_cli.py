"""The real ``vmr-handler`` CLI in a subprocess: ``plan`` (JSON and table), ``check``, ``--version``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import vmr_handler

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "demo.yaml"

ENTRY_KEYS = {"index", "start_time", "kind", "stage", "fire_at", "command"}
RESUME_KEYS = {"at", "ended_break"}

# SPEC section 4, worked example 2: E1@10, break@15, E2@30, E3@50, RESUME at 1000.
EXAMPLE_2 = """\
- start_time: 10
  executable: /bin/echo
  arguments: E1
- start_time: 15
  pause: true
  data:
    - pause_duration: .inf
- start_time: 30
  executable: /bin/echo
  arguments: E2
- start_time: 50
  executable: /bin/echo
  arguments: E3
"""

# Worked example 3: E1@10, E2@30, E3@50, pause@5 for 60, break@15, pause@40 for 100, RESUME at 1000.
EXAMPLE_3 = """\
- {start_time: 10, executable: /bin/echo, arguments: E1}
- {start_time: 30, executable: /bin/echo, arguments: E2}
- {start_time: 50, executable: /bin/echo, arguments: E3}
- {start_time: 5, pause: true, data: [{pause_duration: 60}]}
- {start_time: 15, pause: true, data: [{pause_duration: inf}]}
- {start_time: 40, pause: true, data: [{pause_duration: 100}]}
"""

# Worked example 4 as JSON: E1@10, E2@30, E3@50, break@15, break@40, RESUMEs at 100 and 300.
EXAMPLE_4: List[Dict[str, Any]] = [
    {"start_time": 10, "executable": "/bin/echo", "arguments": "E1"},
    {"start_time": 30, "executable": "/bin/echo", "arguments": "E2"},
    {"start_time": 50, "executable": "/bin/echo", "arguments": "E3"},
    {"start_time": 15, "pause": True, "data": [{"pause_duration": "inf"}]},
    {"start_time": 40, "pause": True, "data": [{"pause_duration": "inf"}]},
]

# Negative stages, a -inf pause, a host entry and a break nobody resumes.
MIXED = """\
- {start_time: -20, executable: /bin/true}
- {start_time: -inf, pause: true, data: [{pause_duration: 30}]}
- {start_time: -10, executable: /bin/true}
- {start_time: 5, executable: /bin/true}
- {start_time: 7, executable: /usr/bin/host-tool, on_host: true}
- {start_time: 8, pause: true, data: [{pause_duration: .inf}]}
- {start_time: 9, executable: /bin/true}
- {start_time: -20, executable: /bin/true}
"""

BAD = """\
- {start_time: 0, executable: /bin/true}
"""


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler", *args],
        capture_output=True, text=True, timeout=60, cwd=str(cwd), env=env,
    )


def plan_json(path: Path, *resumes: str) -> Dict[str, Any]:
    args = ["plan", str(path), "--json"]
    for r in resumes:
        args.append(f"--resume={r}")
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # exactly one JSON object, nothing else
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    assert set(doc) == {"entries", "resumes"}
    for entry in doc["entries"]:
        assert set(entry) == ENTRY_KEYS
        assert entry["kind"] in {"negative", "positive", "pause", "break", "host", "resume"}
        # the exact command line: the executable as written, then the arguments
        assert entry.pop("command") is None or entry["kind"] in {"negative", "positive", "host"}
    for resume in doc["resumes"]:
        assert set(resume) == RESUME_KEYS
    return doc


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def e(index: int, start: Any, kind: str, fire_at: Any, stage: Any = None) -> Dict[str, Any]:
    return {"index": index, "start_time": start, "kind": kind, "stage": stage, "fire_at": fire_at}


# ---------------------------------------------------------------------------- plan --json
def test_plan_json_example_2(tmp_path: Path) -> None:
    doc = plan_json(write(tmp_path, "ex2.yaml", EXAMPLE_2), "1000")
    assert doc["entries"] == [
        e(0, 10, "positive", 10),
        e(1, 15, "break", 15),
        e(2, 30, "positive", 1015),
        e(3, 50, "positive", 1035),
    ]
    assert doc["resumes"] == [{"at": 1000, "ended_break": 1}]


def test_plan_json_example_2_without_resume_holds(tmp_path: Path) -> None:
    doc = plan_json(write(tmp_path, "ex2.yaml", EXAMPLE_2))
    assert [x["fire_at"] for x in doc["entries"]] == [10, 15, None, None]
    assert doc["resumes"] == []


def test_plan_json_example_3(tmp_path: Path) -> None:
    doc = plan_json(write(tmp_path, "ex3.yml", EXAMPLE_3), "1000")
    assert doc["entries"] == [
        e(0, 10, "positive", 70),
        e(1, 30, "positive", 1015),
        e(2, 50, "positive", 1135),
        e(3, 5, "pause", 5),
        e(4, 15, "break", 75),
        e(5, 40, "pause", 1025),
    ]
    assert doc["resumes"] == [{"at": 1000, "ended_break": 4}]


def test_plan_json_example_4(tmp_path: Path) -> None:
    doc = plan_json(write(tmp_path, "ex4.json", json.dumps(EXAMPLE_4)), "100", "300")
    assert doc["entries"] == [
        e(0, 10, "positive", 10),
        e(1, 30, "positive", 115),
        e(2, 50, "positive", 310),
        e(3, 15, "break", 15),
        e(4, 40, "break", 125),
    ]
    assert doc["resumes"] == [{"at": 100, "ended_break": 3}, {"at": 300, "ended_break": 4}]


def test_plan_json_example_4_with_extra_ignored_resume(tmp_path: Path) -> None:
    doc = plan_json(write(tmp_path, "ex4.json", json.dumps(EXAMPLE_4)), "1", "100", "300", "1000")
    assert [x["fire_at"] for x in doc["entries"]] == [10, 115, 310, 15, 125]
    assert doc["resumes"] == [
        {"at": 1, "ended_break": None},
        {"at": 100, "ended_break": 3},
        {"at": 300, "ended_break": 4},
        {"at": 1000, "ended_break": None},
    ]


def test_plan_json_negative_minus_inf_host_and_held(tmp_path: Path) -> None:
    doc = plan_json(write(tmp_path, "mixed.yaml", MIXED), "-inf")
    assert doc["entries"] == [
        e(0, -20, "negative", None, 0),
        e(1, "-inf", "pause", "-inf"),
        e(2, -10, "negative", None, 1),
        e(3, 5, "positive", 35),
        e(4, 7, "host", 37),
        e(5, 8, "break", 38),
        e(6, 9, "positive", None),
        e(7, -20, "negative", None, 0),
    ]
    # the break is at 38, a RESUME at -inf came before it: ignored
    assert doc["resumes"] == [{"at": "-inf", "ended_break": None}]


def test_plan_resume_minus_inf_as_separate_argument(tmp_path: Path) -> None:
    """``--resume -inf`` (the form the help text suggests) must work like ``--resume=-inf``."""
    path = write(tmp_path, "brk.yaml", "- {start_time: -inf, pause: true, data: [{pause_duration: .inf}]}\n"
                                       "- {start_time: 5, executable: /bin/true}\n")
    proc = run_cli("plan", str(path), "--json", "--resume", "-inf")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [x.pop("command") for x in doc["entries"]] == [None, "/bin/true"]
    assert doc["entries"] == [e(0, "-inf", "break", "-inf"), e(1, 5, "positive", 5)]
    assert doc["resumes"] == [{"at": "-inf", "ended_break": 0}]


# ---------------------------------------------------------------------------- plan table
@pytest.mark.parametrize("text, resumes, count", [(EXAMPLE_3, ["1000"], 6), (MIXED, [], 8)])
def test_plan_table_mentions_every_index(tmp_path: Path, text: str, resumes: List[str], count: int) -> None:
    path = write(tmp_path, "s.yaml", text)
    args = ["plan", str(path)]
    for r in resumes:
        args += ["--resume", r]  # space-separated form, with a non-negative time
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:5] == ["index", "start_time", "kind", "stage", "fire_at"]
    first_column = {line.split()[0] for line in lines[1:] if line.strip()}
    assert {str(i) for i in range(count)} <= first_column
    with pytest.raises(json.JSONDecodeError):
        json.loads(proc.stdout)


# ---------------------------------------------------------------------------- errors, check, version
def test_plan_bad_schedule_exits_2(tmp_path: Path) -> None:
    proc = run_cli("plan", str(write(tmp_path, "bad.yaml", BAD)), "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "entry 0" in proc.stderr
    assert "start_time" in proc.stderr


def test_plan_missing_file_exits_2(tmp_path: Path) -> None:
    proc = run_cli("plan", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "nope.yaml" in proc.stderr


def test_check_demo_ok() -> None:
    proc = run_cli("check", str(DEMO))
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout


def test_check_bad_exits_2(tmp_path: Path) -> None:
    proc = run_cli("check", str(write(tmp_path, "bad.yaml", BAD)))
    assert proc.returncode == 2
    assert "start_time" in proc.stderr
    assert "OK" not in proc.stdout


def test_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        f"vmr-handler {vmr_handler.__version__}",
        "signature checks: built in (Ed25519, cryptography)",
    ]
