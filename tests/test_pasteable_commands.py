"""Every command ``vmr-host`` prints for an operator runs as printed, from any directory, and
reaches the host that printed it; VM names a host does not know are refused by every command
that takes them; ``wait`` says what it waits for.

A real ``vmr-host serve`` (its logs directory has a space in its name: the hints quote it)
and real agents over unix sockets: vm1 and vm2 reach a break at +1, vm2 then has an entry
that cannot start (a VM resource the host lacks), vm3 never connects.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.hostenv import HostEnv
from vmr_handler.core.errors import UsageError
from vmr_handler.host.cli.options import check_known, host_command
from vmr_handler.host.cli.statustext import hints

BREAK = {"start_time": 1, "pause_duration": "inf"}
CONFIGURE = {"start_time": -5, "executable": "/bin/echo", "arguments": "configured"}
#: data the host does not have (``--allow-missing-resources``), failure ignored: it could not start
MISSING = {"start_time": 2, "executable": None, "ignore_failure": True,
           "data": [{"location": "tool", "filename": "tool.bin"}]}  # fmt: skip
ALLOW = "--allow-missing-resources"


@pytest.fixture
def env() -> Iterator[HostEnv]:
    e = HostEnv({"vm1": [CONFIGURE, BREAK], "vm2": [CONFIGURE, BREAK, MISSING], "vm3": [CONFIGURE]},
                start_buffer=1.0)  # fmt: skip
    e.logs = e.root / "the logs"  # a space: a hint that does not quote it does not run
    e.logs.mkdir()
    yield e
    e.close()


def _shell(command: str, **env: str) -> subprocess.CompletedProcess:
    """``command`` run by a shell as an operator pastes it: in another directory, with this
    venv's ``vmr-host`` on PATH and no ``VMR_LOGS`` unless given."""
    environ = {k: v for k, v in os.environ.items() if k != "VMR_LOGS"}
    environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + environ.get("PATH", "")
    environ.update(env)
    with tempfile.TemporaryDirectory() as elsewhere:
        return subprocess.run(["sh", "-c", command], cwd=elsewhere, env=environ, capture_output=True,
                              text=True, timeout=60)  # fmt: skip


def _hint_commands(text: str) -> List[str]:
    """The commands of the hint lines of ``status``'s text: what follows ``: vmr-host``."""
    return [
        "vmr-host " + line.split(": vmr-host ", 1)[1] for line in text.splitlines() if ": vmr-host " in line
    ]


def _status(env: HostEnv) -> Dict:
    res = env.cli("status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def test_every_hint_runs_as_printed_from_another_directory(env: HostEnv) -> None:
    env.start_host(ALLOW)
    env.start_agent("vm1")
    env.start_agent("vm2")
    env.wait_for(
        lambda: all(_vm_state(env, v) == "configured" for v in ("vm1", "vm2")), "vm1, vm2 configured"
    )

    # vm3 never connects: the hint excludes it, with the host's logs directory, quoted
    text = env.cli("status").stdout
    release = [c for c in _hint_commands(text) if " release " in c]
    assert release == [f"vmr-host release --exclude vm3 --logs '{env.logs}'"], text
    res = _shell(release[0])
    assert res.returncode == 0 and "experiment start time set" in res.stdout, res.stdout + res.stderr

    # vm1 and vm2 at their break: the hint resumes them
    env.wait_for(lambda: all(_vm_state(env, v) == "at_break" for v in ("vm1", "vm2")), "vm1, vm2 at break")
    text = env.cli("status").stdout
    resume = [c for c in _hint_commands(text) if " resume " in c]
    assert len(resume) == 1 and "--logs" in resume[0], text
    res = _shell(resume[0])
    assert res.returncode == 0 and "RESUME" in res.stdout and "vm2" in res.stdout, res.stdout + res.stderr

    # vm2's program could not start: the hint shows its log
    env.wait_for(lambda: _vm_state(env, "vm2") == "complete", "vm2 complete")
    text = env.cli("status").stdout
    see = [c for c in _hint_commands(text) if " logs " in c]
    assert see == [f"vmr-host logs vm2 --logs '{env.logs}'"], text
    res = _shell(see[0])
    assert res.returncode == 0 and "tool.bin" in res.stdout, res.stdout + res.stderr


def _vm_state(env: HostEnv, vm: str) -> str:
    return str(next(v["state"] for v in _status(env)["vms"] if v["vm"] == vm))


def test_vmr_logs_is_every_commands_logs_directory_and_its_hints_rely_on_it(env: HostEnv) -> None:
    env.start_host(ALLOW)
    logs = str(env.logs)
    res = _shell("vmr-host status", VMR_LOGS=logs)
    assert res.returncode == 0, res.stderr
    # the operator's shell has VMR_LOGS: the hints need no --logs
    assert "start without it: vmr-host release --exclude vm1\n" in res.stdout + "\n", res.stdout
    assert "--logs" not in res.stdout, res.stdout
    # --logs wins over VMR_LOGS
    wrong = _shell(f"vmr-host status --json --logs {shlex.quote(logs)}", VMR_LOGS="/nonexistent")
    assert wrong.returncode == 0 and json.loads(wrong.stdout)["logs"] == logs, wrong.stderr
    for command in ("wait --for configured vm9", "logs vm9", "schedule show vm9", "resume vm9"):
        res = _shell(f"vmr-host {command}", VMR_LOGS=logs)
        assert res.returncode == 2 and "vm9" in res.stderr and "vm1" in res.stderr, (command, res.stderr)


@pytest.mark.parametrize(
    "command",
    [
        "status vm9 vm1",
        "status --watch vm9",
        "wait --for complete vm9",
        "logs vm9",
        "schedule show vm9",
        "resume vm9",
        "release --exclude vm9",
        "exec vm9 --logs {logs} -- true",
        "push vm9 /etc/hostname /tmp/x",
        "pull vm9 /etc/hostname",
        "schedule add vm9 {schedule}",
    ],
)
def test_unknown_vms_are_refused_by_every_command_that_takes_vm_names(env: HostEnv, command: str) -> None:
    env.start_host(ALLOW)
    schedule = env.schedules / "vm1.yaml"
    words = shlex.split(command.format(logs=shlex.quote(str(env.logs)), schedule=schedule))
    if "--logs" not in words:
        words += ["--logs", str(env.logs)]
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "vmr_handler.host", *words], capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert res.returncode == 2, (command, res.returncode, res.stdout, res.stderr)
    assert time.monotonic() - t0 < 20, "not refused at once"
    err = res.stderr
    assert "vm9" in err and "vm1, vm2, vm3" in err, err  # the unknown one, and the known ones
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line: the cause, said once
    assert res.stdout == "", res.stdout


def test_wait_says_what_it_waits_for_and_waits_for_a_starting_host(env: HostEnv) -> None:
    waiter = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler.host", "wait", "--for", "configured", "vm1", "--timeout", "60",
         "--logs", str(env.logs)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.0)  # the host is not up yet: wait waits for it (it has a timeout)
    assert waiter.poll() is None, waiter.communicate()
    env.start_host(ALLOW)
    env.start_agent("vm1")
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, out + err
    assert "waiting for vm1 to be configured, for at most 60 s" in err, err
    assert "1 VM(s) configured" in out, out
    # without a timeout, it says at once it waits for every expected VM
    res = env.cli("wait", "--for", "configured", "vm1")
    assert res.returncode == 0 and "waiting for vm1 to be configured, with no timeout" in res.stderr
    res = env.cli("wait", "--for", "complete", "--timeout", "0.3")
    assert res.returncode == 2, res.stderr
    assert "waiting for every expected VM (3: vm1, vm2, vm3) to be complete, for at most 0.3 s" in res.stderr


@pytest.mark.parametrize(
    "command",
    ["wait --for complete", "resume --all", "release", "status", "schedule add --all {schedule}",
     "exec --all --logs {logs} -- true"],
)  # fmt: skip
def test_no_host_says_where_it_looked_and_how_to_name_another(tmp_path: Path, command: str) -> None:
    """Without a host (and, for ``wait``, without a timeout): exit 1 at once, one line saying
    which directory was looked in and how to name the running host's."""
    logs = tmp_path / "nothing here"
    schedule = tmp_path / "s.yaml"
    schedule.write_text("- start_time: -1\n  executable: /bin/true\n")
    words = shlex.split(command.format(logs=shlex.quote(str(logs)), schedule=schedule))
    if "--logs" not in words:
        words += ["--logs", str(logs)]
    res = subprocess.run([sys.executable, "-m", "vmr_handler.host", *words], capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert res.returncode in (1, 2) and res.stderr.count("\n") == 1, res.stderr
    assert str(logs) in res.stderr and "--logs DIR, or set VMR_LOGS" in res.stderr, res.stderr


def test_status_watch_json_streams_one_object_per_refresh(env: HostEnv) -> None:
    env.start_host(ALLOW)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmr_handler.host", "status", "--watch", "--json", "--interval", "0.2",
         "--logs", str(env.logs)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.kill()
        proc.wait()
    assert [sorted(v["vm"] for v in d["vms"]) for d in docs] == [["vm1", "vm2", "vm3"]] * 3
    assert docs[0]["now"] < docs[2]["now"]


# ---------------------------------------------------------------------------- units
def test_host_command_quotes_and_makes_the_logs_directory_absolute(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.delenv("VMR_LOGS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert host_command("my logs", "logs", "vm1") == f"vmr-host logs vm1 --logs '{tmp_path}/my logs'"
    assert host_command(None, "resume", "--all") == "vmr-host resume --all"
    assert host_command("/x", "release", "--exclude", "a b") == "vmr-host release --exclude 'a b' --logs /x"
    monkeypatch.setenv("VMR_LOGS", str(tmp_path / "my logs"))
    assert host_command("my logs", "logs", "vm1") == "vmr-host logs vm1"
    assert host_command("/elsewhere", "logs", "vm1") == "vmr-host logs vm1 --logs /elsewhere"


def test_hints_carry_the_hosts_logs_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VMR_LOGS", raising=False)
    result = {
        "logs": "/srv/exp one/logs",
        "experiment": {"start_time": None, "waiting_for": ["vm3"], "expected": ["vm3"]},
        "vms": [{"vm": "vm3", "state": "not_seen", "connected": False, "expected": True}],
    }
    assert hints(result) == [
        "vm3 is not connected and the barrier waits for it; start without it: "
        "vmr-host release --exclude vm3 --logs '/srv/exp one/logs'"
    ]


def test_unknown_names_are_named_with_a_few_known_ones() -> None:
    known = [f"vm{i:05d}" for i in range(10_000)]
    with pytest.raises(UsageError) as caught:
        check_known(["vm00001", "web1", "web2"], known)
    assert str(caught.value) == (
        "unknown VMs web1, web2 (this host's VMs: vm00000, vm00001, vm00002, vm00003, vm00004, vm00005, "
        "vm00006, vm00007 and 9,992 more)"
    )
    check_known(["vm00001"], known)  # known: nothing said


def test_a_hint_names_vmr_host_as_the_shell_finds_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``vmr-host`` when the shell finds this very script on PATH (or under ``python -m``), else
    the script's absolute path (``.venv/bin/vmr-host`` typed without the venv on PATH)."""
    venv = tmp_path / "venv bin"
    venv.mkdir()
    script = venv / "vmr-host"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.delenv("VMR_LOGS", raising=False)
    monkeypatch.setattr(sys, "argv", ["/x/vmr_handler/host/__main__.py", "status"])
    assert host_command("/l", "resume", "--all") == "vmr-host resume --all --logs /l"
    monkeypatch.setattr(sys, "argv", [str(script), "status"])
    monkeypatch.setenv("PATH", f"{venv}{os.pathsep}/usr/bin")
    assert host_command("/l", "resume", "--all") == "vmr-host resume --all --logs /l"
    monkeypatch.setenv("PATH", "/usr/bin")
    assert host_command("/l", "resume", "--all") == f"'{script}' resume --all --logs /l"
