"""VM resources the host does not have are found before anything boots (SPEC section 8: refused
before any VM is served). A real ``vmr-host serve`` exits 2 listing every missing file once
with the VMs and entries that need it, and serves nothing; ``--allow-missing-resources``
serves anyway with one warning per file; ``vmr-host check DIR --resources RES`` lists the
same; ``schedule add`` and ``push`` (a real host over unix sockets) refuse a batch naming a
file the host does not have, with nothing appended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from tests.hostenv import WAIT, HostEnv

PROFILES = {"location": "/tmp/profiles.tgz", "filename": "combined_profiles.tgz"}
HERE = {"location": "/tmp/here.bin", "filename": "here.bin"}


def _linux(extra: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """A schedule as FIREWHEEL's components build one: entry 1 drops ``combined_profiles.tgz``."""
    return [
        {"start_time": -100, "executable": "/bin/echo", "arguments": "first"},
        {"start_time": -90, "executable": None, "data": [PROFILES, HERE]},
        *extra,
    ]


SCHEDULES = {
    **{f"vm{i}": _linux([]) for i in range(1, 7)},
    "vm10": _linux([{"start_time": -5, "data": [{"location": "/tmp/t", "filename": "tool.bin"}]}]),
}


@pytest.fixture
def env() -> Iterator[HostEnv]:
    e = HostEnv(SCHEDULES)
    (e.resources / "here.bin").write_bytes(b"here\n")
    yield e
    e.close()


def _serve(env: HostEnv, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "vmr_handler.host", "serve", "--schedules", str(env.schedules),
            "--logs", str(env.logs), "--channels", str(env.channels), *extra]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)  # a host that serves: fails


def test_serve_refuses_to_start_listing_every_missing_file(env: HostEnv) -> None:
    res = _serve(env, "--resources", str(env.resources))
    assert res.returncode == 2, res.stderr
    err = res.stderr
    assert "2 VM resource file(s) named by the schedules are not on this host" in err, err
    # each file once, its VMs (in natural order, a few of many) and the entries that drop it
    assert err.count("combined_profiles.tgz") == 1 and err.count("tool.bin") == 1, err
    assert "combined_profiles.tgz: needed by 7 VMs (vm1 entry 1, vm2 entry 1, vm3 entry 1 and 4 more)" in err
    assert "tool.bin: needed by 1 VM (vm10 entry 2)" in err
    assert "here.bin" not in err
    assert f"put them in {os.path.realpath(env.resources)}" in err and "--allow-missing-resources" in err
    # nothing served: no channel socket, no control socket, nothing in the logs directory
    assert list(env.channels.iterdir()) == [] and list(env.logs.iterdir()) == []

    bare = _serve(env)  # no --resources at all
    assert bare.returncode == 2, bare.stderr
    assert "this host has no --resources directory" in bare.stderr, bare.stderr
    assert "combined_profiles.tgz: needed by 7 VMs" in bare.stderr and "here.bin" in bare.stderr
    assert list(env.logs.iterdir()) == []


def test_allow_missing_resources_serves_and_warns_once_per_file(env: HostEnv) -> None:
    env.start_host("--allow-missing-resources")
    assert env.status()["vms"], "the host serves"
    warnings = [ln for ln in env.host_log().splitlines() if " WARNING " in ln]
    profiles = [ln for ln in warnings if "combined_profiles.tgz" in ln]
    tools = [ln for ln in warnings if "tool.bin" in ln]
    assert len(profiles) == 1 and len(tools) == 1, warnings
    assert "7 VMs" in profiles[0] and "--allow-missing-resources" in profiles[0], profiles
    assert "1 VM " in tools[0] or "1 VM (" in tools[0], tools
    assert not any("here.bin" in ln for ln in warnings)


def test_check_lists_missing_resources(env: HostEnv) -> None:
    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "vmr_handler.host", "check", str(env.schedules), *extra]
        return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)

    res = check("--resources", str(env.resources))
    assert res.returncode == 2, res.stdout + res.stderr
    out = res.stdout
    assert "combined_profiles.tgz: needed by 7 VMs (vm1 entry 1, vm2 entry 1, vm3 entry 1 and 4 more)" in out
    assert "tool.bin: needed by 1 VM (vm10 entry 2)" in out
    assert "2 VM resource file(s) missing" in out.splitlines()[-1], out
    doc = json.loads(check("--resources", str(env.resources), "--json").stdout)
    assert doc["resources"]["checked"] is True
    missing = {m["name"]: m for m in doc["resources"]["missing"]}
    assert sorted(missing) == ["combined_profiles.tgz", "tool.bin"]
    assert missing["tool.bin"]["vms"] == {"vm10": [2]}

    (env.resources / "combined_profiles.tgz").write_bytes(b"profiles")
    (env.resources / "tool.bin").write_bytes(b"tool")
    res = check("--resources", str(env.resources))
    assert res.returncode == 0 and "3 VM resource file(s) named, all in" in res.stdout, res.stdout

    unchecked = check()  # schedules only: one line says the resources were not checked
    assert unchecked.returncode == 0, unchecked.stdout
    notes = [ln for ln in unchecked.stdout.splitlines() if "--resources" in ln]
    assert len(notes) == 1 and "not checked" in notes[0], unchecked.stdout


def _appends(env: HostEnv) -> int:
    path = env.logs / "appends.json"
    return len(json.loads(path.read_text())) if path.exists() else 0


def test_schedule_add_of_a_batch_naming_a_missing_file_appends_nothing() -> None:
    env = HostEnv({"a": _linux([]), "b": _linux([])})
    try:
        for name in ("combined_profiles.tgz", "here.bin"):
            (env.resources / name).write_bytes(b"x")
        env.start_host()
        batch = env.root / "batch.yaml"
        batch.write_text(yaml.safe_dump([
            {"start_time": -100000, "executable": "/bin/true"},
            {"start_time": -100000, "data": [{"location": "/tmp/n", "filename": "new.tgz"}, HERE]},
        ]))  # fmt: skip
        res = env.cli("schedule", "add", "--all", str(batch))
        assert res.returncode == 2, res.stdout + res.stderr
        assert "1 VM resource file(s) named by the batch are not on this host" in res.stderr, res.stderr
        assert "new.tgz: needed by 2 VMs (a entry 1, b entry 1)" in res.stderr, res.stderr
        assert "nothing appended" in res.stderr and "here.bin" not in res.stderr
        assert _appends(env) == 0
        (env.resources / "new.tgz").write_bytes(b"new")
        assert env.cli("schedule", "add", "--all", str(batch)).returncode == 0
        assert _appends(env) == 1
    finally:
        env.close()


def test_push_whose_staged_file_is_gone_appends_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A staged push removed (``<logs>/pushed`` cleaned) before the host took the batch."""
    from vmr_handler.host.cli.live import _push as livepush
    from vmr_handler.host.cli.vmr_host import main

    env = HostEnv({"a": [{"start_time": -1, "executable": "/bin/true"}]})
    try:
        env.start_host()
        local = env.root / "f.txt"
        local.write_text("pushed\n")
        staged = livepush.push_entries

        def staged_then_removed(logs: str, *args: Any) -> List[Dict[str, Any]]:
            entries = staged(logs, *args)
            for f in Path(logs, "pushed").iterdir():
                f.unlink()
            return entries

        monkeypatch.setattr(livepush, "push_entries", staged_then_removed)
        code = main(["push", "--logs", str(env.logs), "a", str(local), "/tmp/f.txt", "--timeout", "5"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "1 VM resource file(s) named by the batch are not on this host" in err, err
        assert "needed by 1 VM (a entry 0)" in err and "staged pushes" in err and "nothing appended" in err
        assert _appends(env) == 0
    finally:
        env.close()
