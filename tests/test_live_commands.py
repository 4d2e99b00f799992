"""``vmr-host push|pull|exec`` with a real ``vmr-host serve`` and real
agents, over unix sockets and over a real mosquitto. Each command is a batch appended to the
VMs' schedules (``schedule add``: tests/test_schedule_add.py): files pushed land with their
content and mode, files and directories pulled arrive whole under ``<logs>/transfers/<vm>/``,
a command's output is streamed per VM with each VM's exit code; hostile paths are refused
before anything is sent. The agents run on this machine: "in the VM" is under the env's
temporary directory. Pure parts: staged pushes as a resource root of their own, and following a
batch (answers, output pieces, the wait) on a fake clock."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.hostenv import WAIT, HostEnv
from vmr_handler.core.errors import ResourceMissing, ResourceRefused
from vmr_handler.host.cli.live._exec import ExecFollow
from vmr_handler.host.cli.live.follow import follow
from vmr_handler.host.serve.experiment.appendbook import AppendBook
from vmr_handler.host.serve.files.resources import ResourceStore, pushed_name

SCHEDULE: List[Dict[str, Any]] = [{"start_time": -1, "executable": "/bin/echo", "arguments": "configured"}]


def _env(transport: str, vms: List[str]) -> HostEnv:
    env = HostEnv({vm: SCHEDULE for vm in vms}, start_buffer=0.5, transport=transport)
    env.start_host()
    for vm in vms:
        env.start_agent(vm)
    for vm in vms:
        env.wait_event(vm, "schedule_complete")
    return env


@pytest.fixture(params=["unix", "mqtt"])
def env(request: pytest.FixtureRequest) -> Iterator[HostEnv]:
    e = _env(request.param, ["a", "b"])
    yield e
    e.close()


@pytest.fixture
def unix_env() -> Iterator[HostEnv]:
    e = _env("unix", ["a"])
    yield e
    e.close()


def _cli(env: HostEnv, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``vmr-host COMMAND --logs LOGS ARGS...`` (``--logs`` first: ``exec`` takes what follows
    ``--`` as the command)."""
    argv = [sys.executable, "-m", "vmr_handler.host", command, "--logs", str(env.logs), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)


def _batches(env: HostEnv) -> int:
    path = env.logs / "appends.json"
    return len(json.loads(path.read_text())) if path.exists() else 0


def test_push_a_file_and_a_directory(env: HostEnv) -> None:
    local = env.root / "local"
    (local / "tree" / "sub").mkdir(parents=True)
    (local / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (local / "tree" / "sub" / "x.txt").write_bytes(b"x" * 300_000)  # over one resource chunk
    (local / "tree" / "run").write_text("#!/bin/sh\n")
    (local / "tree" / "run").chmod(0o755)
    (local / "tree" / "inside").symlink_to("run")  # a symlink inside LOCAL is followed
    area = env.root / "guest"

    res = _cli(env, "push", "a", str(local / "tool.sh"), f"{area}/bin/tool.sh", "--mode", "0750")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == f"a: 1 file(s) at {area}/bin/tool.sh, mode 0750"
    placed = area / "bin" / "tool.sh"
    assert placed.read_text() == "#!/bin/sh\necho tool\n"
    assert stat.S_IMODE(placed.stat().st_mode) == 0o750
    assert json.loads((env.logs / "appends.json").read_text())[0]["targets"] == ["a"]

    res = _cli(env, "push", "--all", str(local / "tree"), f"{area}/tree", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["files"] == 3 and sorted(out["vms"]) == ["a", "b"]
    # both agents run on this machine: one placed each file, the other found it there already
    for name in ("sub/x.txt", "run", "inside"):
        outcomes = {out["vms"][vm]["placed"][f"{area}/tree/{name}"] for vm in ("a", "b")}
        assert outcomes <= {"placed", "present"} and "placed" in outcomes, outcomes
    assert (area / "tree" / "sub" / "x.txt").read_bytes() == b"x" * 300_000
    assert stat.S_IMODE((area / "tree" / "run").stat().st_mode) == 0o755  # its local x bit
    assert stat.S_IMODE((area / "tree" / "sub" / "x.txt").stat().st_mode) == 0o644
    assert (area / "tree" / "inside").read_text() == "#!/bin/sh\n"
    for vm in ("a", "b"):
        env.wait_event(vm, "schedule_appended")  # the batch is a schedule append, in the VM's log

    # a file already there with other content is kept, not overwritten (as the reference)
    (local / "other").write_text("other\n")
    res = _cli(env, "push", "a", str(local / "other"), f"{area}/bin/tool.sh")
    assert res.returncode == 1 and "not overwritten" in res.stdout, res.stdout + res.stderr
    assert placed.read_text() == "#!/bin/sh\necho tool\n"
    staged = sorted(p.name for p in (env.logs / "pushed").iterdir())
    assert len(staged) == 4 and all(len(n) == 64 for n in staged)


def test_push_refuses_bad_input_before_anything_is_sent(unix_env: HostEnv) -> None:
    env = unix_env
    local = env.root / "local"
    local.mkdir()
    (local / "f").write_text("f\n")
    outside = env.root / "secret"
    outside.write_text("secret\n")
    cases = [
        (("a", str(local / "f"), "relative/dest"), "must be an absolute path"),
        (("a", str(local / "f"), "/tmp/../etc/passwd"), "'..'"),
        (("a", str(local / "f"), "/tmp/x", "--mode", "u+x"), "octal mode"),
        (("a", str(local / "nope"), "/tmp/x"), "no such file"),
        (("--all", "a", str(local / "f"), "/tmp/x"), "not both"),
        (("zz", str(local / "f"), str(env.root / "x")), "unknown VM"),
    ]
    for args, message in cases:
        res = _cli(env, "push", *args)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
    (local / "leak").symlink_to(outside)
    res = _cli(env, "push", "a", str(local), "/tmp/x")
    assert res.returncode == 2 and "leading out of" in res.stderr, res.stderr
    assert _batches(env) == 0


def test_staged_pushes_are_a_read_only_root_of_their_own(tmp_path: Path) -> None:
    resources, pushed = tmp_path / "res", tmp_path / "logs" / "pushed"
    resources.mkdir()
    pushed.mkdir(parents=True)
    good, bad = b"pushed content", b"staged, then changed"
    good_sha, bad_sha = (hashlib.sha256(b).hexdigest() for b in (good, bad))
    (pushed / good_sha).write_bytes(good)
    (pushed / bad_sha).write_bytes(b"another content")
    (pushed / ("0" * 64)).symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text("secret")
    (resources / "pushed").mkdir()
    (resources / "pushed" / "plain").write_text("a --resources file")
    for store in (ResourceStore(str(resources), str(pushed)), ResourceStore(None, str(pushed))):
        info = store.info(pushed_name(good_sha))
        assert (info.path, info.size, info.sha256) == (str(pushed / good_sha), len(good), good_sha)
        with pytest.raises(ResourceRefused, match="changed since it was staged"):
            store.info(pushed_name(bad_sha))
        with pytest.raises(ResourceRefused, match="resolves outside"):
            store.info(pushed_name("0" * 64))
    store = ResourceStore(str(resources), str(pushed))
    assert store.info("pushed/plain").path == str(resources / "pushed" / "plain")  # not a staged name
    with pytest.raises(ResourceMissing, match="--resources"):
        store.info("pushed/" + good_sha[:12])
    with pytest.raises(ResourceRefused, match="no --resources"):
        ResourceStore(None, str(pushed)).info("pushed/plain")


def _record(type_: str, **data: Any) -> str:
    return json.dumps({"event": {"type": type_, "timestamp": 1.0, "id": f"x-{type_}", "data": data}}) + "\n"


def test_follow_answers_output_pieces_and_its_wait_on_a_fake_clock(tmp_path: Path) -> None:
    book = AppendBook(str(tmp_path))
    batch = book.add(b"[]", "json", 1, ["a", "b", "c"], {}, 0.0)
    book.on_answer("a", batch.id, {"status": "success", "first_index": 5}, 1.0)
    book.on_answer("b", batch.id, {"status": "error", "details": "the VM failed (entry 2)"}, 1.0)
    book.save()
    (tmp_path / "a.jsonl").write_text(
        _record("output", index=4, stream="stdout", line="not ours", continued=False, eol=True)
        + _record("output", index=5, stream="stdout", line="he", continued=True, eol=False)
        + _record("output", index=5, stream="stdout", line="llo\x1b[2J", continued=False, eol=True)
        + _record("output", index=5, stream="stderr", line_b64="/w==", continued=False, eol=False)
    )
    out, err = io.StringIO(), io.StringIO()
    followers = {vm: ExecFollow(vm, None, out, err) for vm in ("a", "b", "c")}
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    follow(str(tmp_path), batch.id, followers, {}, 2.0, clock=lambda: now[0], sleep=sleep)
    assert now[0] == pytest.approx(102.0)  # gave up after its wait, not before
    assert out.getvalue() == "a: hello\\x1b[2J\n"  # one line from two pieces, the escape shown
    assert err.getvalue() == "a: \\xff\n"  # a byte that is not UTF-8, escaped
    see = f"vmr-host logs a --logs {tmp_path}"  # a command that runs as printed, from anywhere
    assert followers["a"].problem == f"not finished within 2 s (it goes on in the VM: {see})"
    assert followers["b"].problem == "refused by the VM: the VM failed (entry 2)"
    assert followers["c"].problem is not None and followers["c"].problem.startswith("no answer within 2 s")

    with open(tmp_path / "a.jsonl", "a") as fh:
        fh.write(_record("entry_exited", index=5, exit_code=0, signal=None, duration=0.25))
    again = {"a": ExecFollow("a", None, out, err)}
    follow(str(tmp_path), batch.id, again, {}, None, clock=lambda: now[0], sleep=sleep)
    assert again["a"].problem is None and again["a"].summary() == "a: [exit 0, 250.0 ms]"


def test_pull_a_file_and_a_directory(env: HostEnv, tmp_path: Path) -> None:
    area = env.root / "guest"
    (area / "d" / "sub").mkdir(parents=True)
    (area / "d" / "one.txt").write_text("one\n")
    (area / "d" / "sub" / "two.bin").write_bytes(bytes(range(256)) * 2000)  # 512 000 bytes: 2 chunks
    (area / "d" / "we ird\nname").write_text("odd\n")
    (area / "d" / "empty").write_bytes(b"")

    res = _cli(env, "pull", "--all", f"{area}/d", "--to", str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout + res.stderr
    for vm in ("a", "b"):
        copy = env.logs / "transfers" / vm / str(area).lstrip("/") / "d"
        assert f"{vm}: 4 file(s) of {area}/d -> {copy}" in res.stdout
        for root in (copy, tmp_path / "out" / vm / "d"):
            assert (root / "one.txt").read_text() == "one\n"
            assert (root / "sub" / "two.bin").read_bytes() == bytes(range(256)) * 2000
            assert (root / "we ird\nname").read_text() == "odd\n"
            assert (root / "empty").read_bytes() == b""

    res = _cli(env, "pull", "b", f"{area}/d/one.txt", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)["vms"]
    assert list(out) == ["b"] and out["b"]["ok"]
    (host_copy,) = out["b"]["files"].values()
    assert Path(host_copy).read_text() == "one\n"

    res = _cli(env, "pull", "a", f"{area}/nothing-here")
    assert res.returncode == 1 and "a: FAILED: nothing to pull" in res.stdout, res.stdout
    assert "No such file" in res.stdout


def test_pull_refuses_hostile_paths(unix_env: HostEnv) -> None:
    env = unix_env
    for path, message in [
        ("etc/passwd", "must be an absolute path"),
        ("/var/../../etc/shadow", "'..'"),
        ("/", "names no file"),
        ("/tmp/" + "x" * 300, "longer than 255 bytes"),
        ("/tmp/./d/..", "'..'"),
    ]:
        res = _cli(env, "pull", "a", path)
        assert res.returncode == 2 and message in res.stderr, (path, res.stderr)
    assert _batches(env) == 0


SCRIPT = 'case "$PWD" in */vm/b/*) echo "b fails" >&2; exit 3;; esac; printf "%s|" "$@"; echo'


def test_exec_streams_output_and_exit_codes_per_vm(env: HostEnv) -> None:
    res = _cli(env, "exec", "--all", "--", "sh", "-c", SCRIPT, "sh", "two words", "$HOME", "--logs", "*")
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout == "a: two words|$HOME|--logs|*|\n"  # every word one word, nothing expanded
    assert "b: b fails" in res.stderr
    assert "a: [exit 0" in res.stderr and "b: [FAILED: exit 3" in res.stderr
    index = env.wait_event("a", "schedule_appended")["event"]["data"]["first_index"]
    line = env.wait_event("a", "output", index=index)["event"]["data"]["line"]
    assert line == "two words|$HOME|--logs|*|"  # and the output stays in the VM's log

    res = _cli(env, "exec", "a", "--", "true")
    assert res.returncode == 0 and res.stdout == "" and "a: [exit 0" in res.stderr, res.stderr
    res = _cli(env, "exec", "a")
    assert res.returncode == 2 and "needs the command after --" in res.stderr


def test_exec_with_a_timeout_streams_before_it_ends(unix_env: HostEnv) -> None:
    env = unix_env
    argv = [sys.executable, "-m", "vmr_handler.host", "exec", "a", "--timeout", "3", "--logs", str(env.logs),
            "--", "sh", "-c", "echo first; exec sleep 60"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "a: first\n"
        assert proc.poll() is None  # printed while the command still runs
        rest, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and rest == "", err
    assert "a: [FAILED: timed out after 3 s (exit 124)" in err
    exited = env.wait_event("a", "entry_exited", exit_code=124)["event"]["data"]
    assert (
        "timeout -k 5 3 sh -c"
        in env.wait_event("a", "entry_started", index=exited["index"])["event"]["data"]["command"]
    )
