"""What people read is readable: the agent's and the host's readable logs carry no
epoch float, no number with more than 3 decimals, no Python repr, and bytes that are not UTF-8
escaped, never hidden; ``vmr-host check`` names every bad schedule file at once."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostenv import HostEnv
from vmr_handler.core.events import Event, describe
from vmr_handler.core.readable import duration, field_text

REPO = Path(__file__).resolve().parent.parent
EPOCH_FLOAT = re.compile(r"\b1[6-9]\d{8}\.\d+")
LONG_DECIMALS = re.compile(r"\d\.\d{4,}")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0021, "2.1 ms"), (1.0073879540000235, "1.01 s"), (16.5336, "16.5 s"), (192.0, "3.2 min"),
     (9000.0, "2.5 h"), (5400.0, "90.0 min"), (-0.25, "-250.0 ms"), (float("inf"), "inf")],
)  # fmt: skip
def test_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_fields() -> None:
    assert field_text("duration", 1.0073879540000235) == "1.01 s"
    assert field_text("at", 1795490376.3353314).startswith("20") and "Z" in field_text("at", 1795490376.3)
    assert field_text("experiment_time", 16.284084796905518) == "16.284"
    assert field_text("start_time", -5.0) == "-5"
    nxt = {"index": 6, "kind": "break", "at": 12.0}
    assert field_text("next", nxt) == '{"index":6,"kind":"break","at":12.0}'
    assert field_text("entries", [0, 1]) == "[0,1]"


def test_output_not_utf8_is_escaped_not_hidden() -> None:
    raw = b"caf\xe9 \xff ok"
    data = {"index": 2, "stream": "stdout", "line_b64": base64.b64encode(raw).decode()}
    ev = Event("output", 1795490376.3, "a-1", data)
    line = describe(ev)
    assert "caf\\xe9 \\xff ok" in line and "not UTF-8" in line


def test_agent_readable_log_of_the_demo(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "vmr_handler", "run", "--local", "examples/demo.yaml", "--start-buffer", "1",
         "--launch-dir", str(tmp_path / "l"), "--state-dir", str(tmp_path / "s"),
         "--report", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stderr
    assert "schedule_complete" in log
    assert not EPOCH_FLOAT.search(log), EPOCH_FLOAT.search(log)
    assert not LONG_DECIMALS.search(log), LONG_DECIMALS.search(log)
    assert "{'" not in log  # no Python dict repr
    assert re.search(r"duration=\d+(\.\d)? ms|duration=\d\.\d\d s", log), log[-2000:]
    # once the start is known, every line carries the experiment time too
    assert re.search(r"Z t=\+1\.\ds entry_started entry \d+ \(/bin/echo\)", log), log[-3000:]
    assert re.search(r"Z t=\+\d+\.\ds schedule_complete", log), log[-500:]


def _check(directory: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "check", str(directory), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_check_names_every_bad_schedule_file_at_once(tmp_path: Path) -> None:
    (tmp_path / "vm1.yaml").write_text("- start_time: -5\n  executable: /bin/true\n")
    (tmp_path / "vm2.yaml").write_text("- start_time: -5\n  executable: [oops\n")
    (tmp_path / "vm3.yaml").write_text("- start_time: 0\n  executable: /bin/true\n")
    (tmp_path / "_x.yaml").write_text("[]\n")
    res = _check(tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    out = res.stdout
    assert "ok       vm1:" in out
    # each problem names the format the file was read as (its content decides)
    assert f"PROBLEM  {tmp_path}/vm2.yaml (yaml): invalid YAML" in out and "line 2" in out
    assert f"PROBLEM  {tmp_path}/vm3.yaml (yaml):" in out and "field 'start_time'" in out
    assert "'_x' is not a usable VM name" in out
    assert "1 schedule(s) usable, 3 file(s) with problems" in out
    doc = json.loads(_check(tmp_path, "--json").stdout)
    assert sorted(doc["vms"]) == ["vm1"] and len(doc["problems"]) == 3
    for bad in ("vm2.yaml", "vm3.yaml", "_x.yaml"):
        (tmp_path / bad).unlink()
    good = _check(tmp_path)
    assert good.returncode == 0 and "1 schedule(s) usable, 0 file(s) with problems" in good.stdout
    # serve says the same before it starts: every problem in one error
    (tmp_path / "vm2.yaml").write_text("- start_time: -5\n  executable: [oops\n")
    (tmp_path / "vm3.yaml").write_text("- start_time: 0\n  executable: /bin/true\n")
    serve = subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "serve", "--schedules", str(tmp_path),
         "--logs", str(tmp_path / "L")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert serve.returncode == 2
    assert "2 schedule file(s)" in serve.stderr and "vm2.yaml" in serve.stderr and "vm3.yaml" in serve.stderr


def test_check_names_the_format_it_read_each_file_as(tmp_path: Path) -> None:
    (tmp_path / "vm1.pkl").write_bytes((REPO / "examples" / "demo.pkl").read_bytes())
    (tmp_path / "vm2.json").write_text('[{"start_time": "soon", "executable": "/bin/true"}]')
    (tmp_path / "vm3.pkl").write_bytes(b"- start_time: -1\n  executable: [\n")  # YAML, named a pickle
    out = _check(tmp_path).stdout
    assert f"ok       vm1: {tmp_path}/vm1.pkl (pickle, sha256 " in out, out
    assert f"PROBLEM  {tmp_path}/vm2.json (json): " in out, out
    named = "(yaml by its content, not the pickle its name says): invalid YAML"
    assert f"PROBLEM  {tmp_path}/vm3.pkl {named}" in out, out
    for name, said in (("vm2.json", "(json): "), ("vm3.pkl", "(yaml by its content, not the pickle")):
        res = subprocess.run([sys.executable, "-m", "vmr_handler", "check", str(tmp_path / name)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 2 and f"error: {tmp_path / name} {said}" in res.stderr, res.stderr
        assert res.stderr.count(str(tmp_path / name)) == 1, res.stderr  # the file named once
    ok = subprocess.run([sys.executable, "-m", "vmr_handler", "check", str(tmp_path / "vm1.pkl")],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0 and "OK (pickle, " in ok.stdout, ok.stdout


def test_host_log_and_errors_say_times_in_utc_never_epoch_seconds() -> None:
    """The host's log (a start, its start time restored by a restart) and its errors (release
    after the start) say instants as ISO UTC, never as epoch seconds."""
    env = HostEnv({"vm1": [{"start_time": -1, "executable": "/bin/true"}]}, start_buffer=0.5)
    try:
        env.start_host()
        env.start_agent("vm1")
        env.wait_for(lambda: env.status()["experiment"]["start_time"], "the start time set")
        late = env.cli("release")
        assert late.returncode == 2 and "already set (20" in late.stderr, late.stderr
        assert not EPOCH_FLOAT.search(late.stderr), late.stderr
        env.kill_host()
        env.start_host()  # restores the start time from the logs
        log = env.host_log()
        assert "experiment start time set: 20" in log and "restored experiment start time 20" in log, log
        assert not EPOCH_FLOAT.search(log), EPOCH_FLOAT.search(log)
    finally:
        env.close()
