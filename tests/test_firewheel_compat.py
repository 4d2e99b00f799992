"""FIREWHEEL schedules run unchanged: entries built the way FIREWHEEL's helpers build
them (:mod:`tests.fwhelpers`), pickled as the reference stores them, played by the real
``vmr-handler run --local`` and through a real ``vmr-host`` with real agents.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests import fwhelpers as fw
from tests.agent import Agent, cli
from tests.hostenv import HostEnv


def _run(agents: list, root: Path, records, **kw) -> Agent:
    a = Agent(root, fw.firewheel_pickle(records), start_buffer=kw.pop("start_buffer", 0.2), **kw)
    agents.append(a)
    return a


def _fake_vbash(root: Path) -> Path:
    """A stand-in for VyOS's /bin/vbash: runs its script with the POSIX shell."""
    vbash = root / "bin" / "vbash"
    vbash.parent.mkdir(parents=True, exist_ok=True)
    vbash.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
    vbash.chmod(0o755)
    return vbash


def test_vyos_router_executable_with_its_own_arguments(tmp_path, agents):
    """VyOS: drop_content(-100, <config>, executable=True) then run_executable(-95, "/bin/vbash <config>")."""
    vbash = _fake_vbash(tmp_path)
    config = tmp_path / "opt" / "vyatta" / "firewheel-config.sh"
    config.parent.mkdir(parents=True)
    records = [
        fw.drop_content(-100, str(config), 'echo "configured $1 in $(basename "$PWD")"\n', executable=True),
        fw.run_executable(-95, f"{vbash} {config}", "eth0"),
    ]
    a = _run(agents, tmp_path, records)
    assert a.run() == 0, a.log()
    started = a.by_index("entry_started")[1][0]["data"]
    # the executable text as written, then the arguments, unquoted: exactly the reference's line
    assert started["command"] == f"{vbash} {config} eth0"
    assert started["working_dir"] == str(a.launch / "-95" / "firewheel-config.sh")
    assert a.output_bytes(1) == b"configured eth0 in firewheel-config.sh\n"
    assert a.by_index("entry_exited")[1][0]["data"]["exit_code"] == 0
    assert f"command={vbash} {config} eth0" in a.log()  # the readable log shows the exact line


def test_cd_builtin_python_vm_install_from_source(tmp_path, agents):
    """python_vm: run_executable(t, "cd", "<dir>; python3 setup.py install")."""
    src = tmp_path / "pkg-src"
    src.mkdir()
    setup = "import os\nopen('installed', 'w').write(os.getcwd())\nprint('installed')\n"
    (src / "setup.py").write_text(setup)
    records = [fw.run_executable(-10, "cd", f"{src}; {sys.executable} setup.py install")]
    a = _run(agents, tmp_path, records)
    assert a.run() == 0, a.log()
    command = a.by_index("entry_started")[0][0]["data"]["command"]
    assert command == f"cd {src}; {sys.executable} setup.py install"
    assert a.output_bytes(0) == b"installed\n"
    assert (src / "installed").read_text() == str(src)
    assert a.by_index("entry_exited")[0][0]["data"]["exit_code"] == 0


def test_missing_program_is_exit_127_and_the_schedule_goes_on(tmp_path, agents):
    records = [
        fw.run_executable(-20, "no-such-program-xyz", "--flag"),
        fw.run_executable(-20, "/opt/nowhere/bin/tool"),
        fw.run_executable(-10, "/bin/sh", "-c 'no-such-inner-cmd-xyz'"),
        fw.run_executable(-5, "/bin/echo", "stage -5 ran"),
        fw.run_executable(0.5, "no-such-program-xyz"),
        fw.run_executable(0.6, "/bin/echo", "positive ran"),
    ]
    a = _run(agents, tmp_path, records)
    assert a.run() == 0, a.log()  # nothing failed the VM
    assert not a.events("vm_failed") and not a.events("entry_failed")
    exited = {i: e[0]["data"] for i, e in a.by_index("entry_exited").items()}
    for index in (0, 1, 2, 4):
        assert exited[index]["exit_code"] == 127 and exited[index]["status"] == "error"
    assert "'no-such-program-xyz' was not found" in exited[0]["details"]
    assert "'/opt/nowhere/bin/tool' was not found" in exited[1]["details"]
    # the program exists; what was not found is inside it: the shell's own words name it
    assert "no-such-inner-cmd-xyz" in exited[2]["details"]
    assert a.output_bytes(3) == b"stage -5 ran\n" and a.output_bytes(5) == b"positive ran\n"
    assert a.events("configured") and a.events("schedule_complete")


def test_bash_syntax_and_current_dir_in_arguments(tmp_path, agents):
    records = [
        fw.run_executable(
            -1, "echo", 'x{a,b} $((2+3)) && [[ -n "$CURRENT_DIR" ]] && echo "$CURRENT_DIR" "$PWD"'
        ),
        fw.run_executable(-1, "printf", "'%s\\n' one > out.txt; cat out.txt"),
    ]
    a = _run(agents, tmp_path, records)
    assert a.run() == 0, a.log()
    workdir = a.launch / "-1" / "echo"
    assert a.output_bytes(0) == f"xa xb 5\n{workdir} {workdir}\n".encode()
    assert a.output_bytes(1) == b"one\n"
    assert (a.launch / "-1" / "printf" / "out.txt").read_text() == "one\n"


def test_vm_resource_executables_and_preloaded_moves(tmp_path, agents):
    """run_executable(vm_resource=True), add_vm_resource (pre-2.0), drop_file/drop_content with preload."""
    res = tmp_path / "res"
    res.mkdir()
    (res / "set_name.sh").write_text('#!/bin/sh\necho "name $1"\n')
    (res / "old_vmr.sh").write_text('#!/bin/sh\necho "args $1 $2 $3"; cat "$1"\n')
    (res / "motd").write_text("welcome\n")
    dest = tmp_path / "etc"
    dest.mkdir()
    (dest / "motd").write_text("the image's motd\n")
    records = [
        fw.run_executable(-30, "set_name.sh", "host1", vm_resource=True),
        fw.add_vm_resource("old_vmr.sh", -30, dynamic="dyn text\n"),
        fw.drop_file(-20, str(dest / "motd"), "motd"),  # mv over an existing file: replaced, as there
        fw.drop_content(-20, str(dest / "new.conf"), "a=1\n"),
    ]
    a = _run(agents, tmp_path, records, extra=["--resources", str(res)])
    assert a.run() == 0, a.log()
    assert a.output_bytes(0) == b"name host1\n"
    assert a.output_bytes(1) == b"args dynamic None reboot\ndyn text\n"
    command = a.by_index("entry_started")[0][0]["data"]["command"]
    assert command == f"{a.launch}/-30/set_name.sh/set_name.sh host1"
    assert (dest / "motd").read_text() == "welcome\n"
    assert (dest / "new.conf").read_text() == "a=1\n"
    assert not a.events("reboot_requested")


def test_data_is_preloaded_before_anything_runs_and_never_overwritten(tmp_path, agents):
    early = tmp_path / "early.txt"
    existing = tmp_path / "existing.conf"
    existing.write_text("the image's version\n")
    records = [
        # an entry of the first stage sees the data of a positive entry already in place
        fw.run_executable(-10, "/bin/cat", str(early)),
        fw.drop_content(5, str(early), "placed before the first stage\n", preload=False),
        fw.drop_content(-5, str(existing), "the schedule's version\n", preload=False),
    ]
    a = _run(agents, tmp_path, records)
    assert a.run() == 0, a.log()
    assert a.output_bytes(0) == b"placed before the first stage\n"
    placed = {e["data"]["index"]: e["data"] for e in a.events("data_placed")}
    assert placed[1]["outcome"] == "placed" and placed[1]["preloaded"] is True
    kept = placed[2]
    assert kept["outcome"] == "kept" and "not overwritten" in kept["details"]
    assert existing.read_text() == "the image's version\n"  # as the reference: never overwritten
    types = [e["type"] for e in a.events()]
    assert types.index("data_placed") < types.index("stage_started")
    # a rerun after a crash finds its own files: nothing is placed twice, nothing is reported kept
    (a.state / "journal.json").unlink()
    b = Agent(tmp_path, fw.firewheel_pickle(records), start_buffer=0.2)
    b.report = tmp_path / "second.jsonl"
    b.args[b.args.index("--report") + 1] = str(b.report)
    agents.append(b)
    assert b.run() == 0, b.log()
    again = {e["data"]["index"]: e["data"]["outcome"] for e in b.events("data_placed")}
    assert again == {1: "present", 2: "kept"}


def test_stored_schedule_after_firewheel_vm_resume(tmp_path, agents):
    """A stored schedule: a break at -inf, `firewheel vm resume` appended, push/pull at -100000."""
    res = tmp_path / "res"
    res.mkdir()
    (res / "pushed.txt").write_text("pushed\n")
    out = tmp_path / "out"
    out.mkdir()
    records = [
        fw.set_pause(-math.inf, math.inf),
        fw.run_executable(-5, "/bin/echo", "configured after the stored RESUME"),
        fw.file_transfer(str(out), interval=0),
        fw.stored_resume(),
        fw.push_file("pushed.txt", str(out / "pushed.txt")),
        fw.pull_file(str(out / "pushed.txt")),
        fw.stored_resume(),  # a second RESUME: no break left, ignored and reported
    ]
    a = _run(agents, tmp_path, records, extra=["--resources", str(res)])
    assert a.run(timeout=30) == 0, a.log()
    resumes = {e["data"]["index"]: e["data"] for e in a.events("resume_received")}
    assert resumes[3]["ended_break"] == 0 and resumes[3]["origin"] == "schedule entry"
    assert resumes[6]["ignored"] is True
    assert (out / "pushed.txt").read_text() == "pushed\n"
    assert a.output_bytes(1) == b"configured after the stored RESUME\n"
    transfers = {e["data"]["index"]: e["data"] for e in a.events("transfer_registered")}
    assert transfers[2]["interval"] is None and transfers[5]["interval"] is None  # interval 0 is once
    # the stage of the pushes (-100000) ran first
    stages = [e["data"]["start_time"] for e in a.events("stage_started")]
    assert stages == [-100000, -5]
    # a restart never applies a stored RESUME twice
    b = Agent(tmp_path, fw.firewheel_pickle(records), start_buffer=0.2)
    b.report = tmp_path / "second.jsonl"
    b.args[b.args.index("--report") + 1] = str(b.report)
    agents.append(b)
    assert b.run(timeout=30) == 0, b.log()
    assert not b.events("resume_received")


def test_plan_and_check_show_and_warn(tmp_path):
    path = tmp_path / "s.pkl"
    path.write_bytes(
        fw.firewheel_pickle(
            [
                fw.run_executable(-95, "/bin/vbash-not-here /opt/cfg.sh"),
                fw.run_executable(-90, "cd", "/tmp; ls 'unterminated"),
                fw.run_executable(5, "set_name.sh", "h1", vm_resource=True),
                fw.set_pause(-math.inf, math.inf),
                fw.stored_resume(),
            ]
        )
    )
    res = cli("plan", str(path), "--json", "--launch-dir", "/L")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    commands = {e["index"]: e["command"] for e in plan["entries"]}
    assert commands == {
        0: "/bin/vbash-not-here /opt/cfg.sh",
        1: "cd /tmp; ls 'unterminated",
        2: "/L/5/set_name.sh/set_name.sh h1",
        3: None,
        4: None,
    }
    assert plan["resumes"] == [{"at": "-inf", "ended_break": 3}]
    table = cli("plan", str(path)).stdout
    assert "/bin/vbash-not-here /opt/cfg.sh" in table and "RESUME (stored by firewheel vm resume)" in table
    res = cli("check", str(path))
    assert res.returncode == 0, res.stderr
    assert "2 warning(s)" in res.stdout
    assert (
        "entry 0 ('/bin/vbash-not-here /opt/cfg.sh'): program '/bin/vbash-not-here' is not found"
        in res.stderr
    )
    assert "entry 1 ('cd'): command line \"cd /tmp; ls 'unterminated\" is not valid shell" in res.stderr
    assert "set_name.sh" not in res.stderr  # dropped by its own entry: nothing to find
    strict = cli("check", "--strict", str(path))
    assert strict.returncode == 2 and "error: entry 0" in strict.stderr


@pytest.mark.parametrize(
    "record, field, words",
    [
        ({"start_time": 5, "data": [{"resume": True}]}, "start_time", "must be at -inf"),
        ({"start_time": "-inf", "data": [{"resume": False}]}, "data[0].resume", "must be true"),
        (
            {"start_time": "-inf", "executable": "/bin/true", "data": [{"resume": True}]},
            "executable",
            "cannot run a program",
        ),
        ({"start_time": 1, "data": [{"location": "/x", "interval": -1}]}, "data[0].interval", "must be"),
        (
            {"start_time": 1, "data": [{"location": "/x", "destination": "out/dir"}]},
            "data[0].destination",
            "must be an absolute directory on the host",
        ),
        (
            {"start_time": 1, "data": [{"location": "/x", "destination": "/srv/../etc"}]},
            "data[0].destination",
            "must not have a '..' component",
        ),
    ],
)
def test_resume_and_transfer_entries_are_validated(tmp_path, record, field, words):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([record]))
    res = cli("check", str(path))
    assert res.returncode == 2
    assert f"field '{field}'" in res.stderr and words in res.stderr


def test_place_data_never_overwrites(tmp_path):
    from vmr_handler.agent.machine.executor import place_data
    from vmr_handler.core.schedule.model import ContentDrop, ScheduleEntry

    target = tmp_path / "t.txt"
    entry = ScheduleEntry(0, -1, data=(ContentDrop(str(target), b"mine", executable=True),))
    first = place_data(entry, str(tmp_path / "wd"), str(tmp_path))
    assert [p.outcome for p in first] == ["placed"] and oct(target.stat().st_mode & 0o777) == "0o755"
    assert [p.outcome for p in place_data(entry, str(tmp_path / "wd"), str(tmp_path))] == ["present"]
    target.write_bytes(b"someone else's")
    kept = place_data(entry, str(tmp_path / "wd"), str(tmp_path))
    assert [p.outcome for p in kept] == ["kept"] and target.read_bytes() == b"someone else's"
    assert kept[0].size == len(b"someone else's")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".vmr-")]  # no temp files left


@pytest.mark.parametrize("transport", ["unix", "mqtt"])
def test_a_missing_program_does_not_hold_the_barrier_through_vmr_host(transport):
    """Two VMs with reference pickles; one image lacks a program used in negative time."""
    records = [
        fw.run_executable(-10, "no-such-program-xyz"),
        fw.run_executable(-5, "cd", "/tmp; echo configured in $PWD"),
        fw.set_pause(-math.inf, math.inf),
        fw.stored_resume(),
        fw.run_executable(1, "/bin/echo", "fired"),
    ]
    env = HostEnv({}, start_buffer=0.5, transport=transport)
    try:
        for vm in ("vm1", "vm2"):
            (env.schedules / f"{vm}.pkl").write_bytes(fw.firewheel_pickle(records))
        env.start_host()
        for vm in ("vm1", "vm2"):
            env.start_agent(vm)
        for vm in ("vm1", "vm2"):
            out = env.wait_event(vm, "output", index=4)
            assert out["event"]["data"]["line"] == "fired"
            exited = env.wait_event(vm, "entry_exited", index=0)["event"]["data"]
            assert exited["exit_code"] == 127 and "'no-such-program-xyz' was not found" in exited["details"]
            started = env.wait_event(vm, "entry_started", index=1)["event"]["data"]
            assert started["command"] == "cd /tmp; echo configured in $PWD"
            assert env.wait_event(vm, "resume_received", index=3)["event"]["data"]["ended_break"] == 2
        assert not any(env.events(vm, "vm_failed") for vm in ("vm1", "vm2"))
    finally:
        env.close()


def test_a_file_dropped_without_executable_is_not_made_executable(tmp_path, agents):
    """The flag holds, as in FIREWHEEL 3.1.0 (a drop is chmodded only when its ``executable``
    is true): exit 126, explained, and ``check`` warns about the schedule before it runs."""
    res = tmp_path / "res"
    res.mkdir()
    (res / "tool.sh").write_text("#!/bin/sh\necho tool ran\n")
    tool = tmp_path / "opt" / "tool.sh"
    tool.parent.mkdir()
    records = [
        fw.drop_file(-10, str(tool), "tool.sh"),  # the helper's default: executable=False
        fw.run_executable(-5, str(tool)),
    ]
    a = _run(agents, tmp_path, records, extra=["--resources", str(res)])
    assert a.run() == 0, a.log()
    exited = a.by_index("entry_exited")[1][0]["data"]
    assert exited["exit_code"] == 126
    assert f"'{tool}' is not executable (mode 0o644)" in exited["details"]
    assert "made executable only when its data item says executable: true" in exited["details"]
    assert "(as in FIREWHEEL 3.1.0)" in exited["details"]
    path = tmp_path / "s.pkl"
    path.write_bytes(fw.firewheel_pickle(records))
    check = cli("check", str(path))
    assert check.returncode == 0
    assert f"entry 1 ('{tool}'): runs '{tool}', which entry 0 drops with executable: false" in check.stderr


@pytest.mark.parametrize(
    "line, word",
    [
        ("cd /tmp; ls", "cd"),
        ("echo;ls", "echo"),
        ("  /bin/vbash /opt/cfg.sh", "/bin/vbash"),
        ("'/opt/my tool' --x", "/opt/my tool"),
        ("a\\ b c", "a b"),
        ("'unterminated x", "'unterminated"),
        ("", ""),
    ],
)
def test_first_word_is_the_program_the_shell_runs(line, word):
    from vmr_handler.core.schedule.commands import first_word

    assert first_word(line) == word


def test_a_stored_resume_leaves_no_break_in_any_view_of_the_host() -> None:
    """`firewheel vm resume` stored a RESUME after a break at -inf: the agent reports the break,
    then the RESUME that ends it, so neither ``status`` nor ``schedule show`` shows it held and
    no hint asks for a RESUME; a plain ``resume`` is refused (no VM is at a break)."""
    records = [
        fw.set_pause(-math.inf, math.inf),
        fw.stored_resume(),
        fw.run_executable(-5, "/bin/echo", "configured"),
        fw.run_executable(1, "/bin/echo", "fired"),
    ]
    env = HostEnv({}, start_buffer=0.5)
    try:
        (env.schedules / "vm3.pkl").write_bytes(fw.firewheel_pickle(records))
        env.start_host()
        env.start_agent("vm3")
        env.wait_event("vm3", "schedule_complete")
        kinds = [r["event"]["type"] for r in env.events("vm3")]
        assert [k for k in kinds if k in ("break_started", "resume_received")] == [
            "break_started",
            "resume_received",
        ]
        status = env.cli("status", "--json")
        vm = json.loads(status.stdout)["vms"][0]
        assert vm["state"] == "complete" and not (vm.get("phase") or {}).get("at_break"), vm
        text = env.cli("status").stdout
        assert "waiting for RESUME" not in text and "vmr-host resume" not in text, text
        shown = env.cli("schedule", "show", "vm3", "--json")
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)["entries"]
        assert rows[0]["kind"] == "break" and [h["end"] is not None for h in rows[0]["holds"]] == [True]
        assert "break since" not in env.cli("schedule", "show", "vm3").stdout
        refused = env.cli("resume", "vm3")
        assert refused.returncode == 2 and "not at a break: vm3" in refused.stderr, refused.stderr
    finally:
        env.close()
