"""on_host entries run by the host (``vmr_handler/host/serve/experiment/hostentries.py``).

The runner is driven with REAL processes (scripts written to tmp dirs) through a real
``VmSession`` (its real log on disk; the agent's side of the link captured), fed the agent's
``host_entry`` frames as bytes. The last tests run the real ``vmr-host serve`` with a fake
agent over a unix socket. Every wait is bounded; nothing asserts on speed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, TypeVar

import psutil
import pytest
import yaml

from tests.fakeagent import WAIT, Host
from tests.hostfakes import FakeExperiment
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import FrameDecoder, encode_message
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.serve.config import Limits, VmSpec
from vmr_handler.host.serve.experiment.hostentries import (
    DISABLED,
    RESTARTED,
    STOPPED,
    HostEntryRunner,
    schedule_lookup,
)
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.session.api import HostEvents
from vmr_handler.host.serve.session.session import VmSession

_T = TypeVar("_T")


def script(path: Path, body: str) -> str:
    """An executable shell script at ``path``; its absolute path."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


class CaptureLink:
    """The agent's end of a session's link: decodes every frame the host sends."""

    closed = False

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.events: List[Event] = []

    def send_bytes(self, data: bytes) -> None:
        for msg in self.decoder.feed(data):
            self.events.extend(msg.events)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def results(self, request_id: str) -> List[Event]:
        return [e for e in self.events if e.type == "result" and e.data.get("answers") == request_id]


class RunnerHost(FakeExperiment):
    """The experiment a session asks: its ``host_entry`` goes to the runner under test."""

    runner: Optional[HostEntryRunner] = None

    def host_entry(self, vm: str, rid: str, index: Optional[int], at: Optional[float]) -> Optional[str]:
        assert self.runner is not None
        return self.runner.request(vm, rid, index, at)


class Rig:
    """VM ``vm1`` with ``entries`` as its schedule: a real session (logs in ``tmp/logs``), a
    capture link, and a runner (``enabled``, ``--resources`` ``tmp/res``, minimega on ``path``)."""

    def __init__(self, tmp: Path, entries: List[Dict[str, Any]], enabled: bool = True, **kw: Any) -> None:
        self.tmp = tmp
        self.logs = tmp / "logs"
        self.resources = tmp / "res"
        self.logs.mkdir(exist_ok=True)
        self.resources.mkdir(exist_ok=True)
        data = yaml.safe_dump(entries).encode()
        self.spec = VmSpec("vm1", str(tmp / "vm1.yaml"), data, hashlib.sha256(data).hexdigest(), "yaml")
        limits = Limits()
        self.vmlog = VmLog(str(self.logs), "vm1", limits.log_quota)
        transfers = TransferStore(str(self.logs), "vm1", limits.transfer_file, limits.transfer_total)
        self.host = RunnerHost()
        self.session = VmSession(
            self.spec, True, limits, self.vmlog, transfers, ResourceStore(None), self.host, HostEvents(), {}
        )
        transfers.open()
        self.vmlog.open(replay=self.session.apply)
        self.runner = self.new_runner(enabled, **kw)
        self.link = CaptureLink()
        self.session.attach(self.link, time.time())
        self.counter = 0

    def new_runner(self, enabled: bool = True, **kw: Any) -> HostEntryRunner:
        kw.setdefault("path", str(self.tmp / "no-minimega-here"))
        kw.setdefault("specs", {"vm1": self.spec})
        runner = HostEntryRunner(
            enabled,
            str(self.logs),
            {"vm1": self.session},
            schedule_lookup({"vm1": self.spec}, ()),
            ResourceStore(str(self.resources)),
            HostEvents(),
            **kw,
        )
        runner.open()
        self.host.runner = runner
        return runner

    def ask(self, index: Any, scheduled: Optional[float] = None) -> str:
        """The agent's ``host_entry`` frame, fed to the session as bytes; its id."""
        self.counter += 1
        ev = Event(
            "host_entry",
            time.time(),
            f"agent0001-{self.counter:08d}",
            {"index": index, "scheduled": scheduled},
        )
        self.session.feed(encode_message([ev], time.time()), time.time())
        return ev.id

    async def answer(self, request_id: str) -> Dict[str, Any]:
        """The (one) result answering ``request_id``, waited for."""
        await until(lambda: self.link.results(request_id), f"an answer to {request_id}")
        (result,) = self.link.results(request_id)
        return dict(result.data)

    def events(self, type_: Optional[str] = None) -> List[Dict[str, Any]]:
        path = self.logs / "vm1.jsonl"
        if not path.exists():
            return []
        out = [json.loads(line)["event"] for line in path.read_text().splitlines()]
        return [e for e in out if type_ is None or e["type"] == type_]

    def outcomes(self) -> Dict[str, Any]:
        return json.loads((self.logs / "host_entries" / "vm1.json").read_text())["entries"]


async def until(pred: Callable[[], _T], what: str) -> _T:
    deadline = time.monotonic() + WAIT
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


# ------------------------------------------------------------------------------ running
def test_absolute_path_runs_with_arguments_output_and_exit_code(tmp_path: Path) -> None:
    prog = script(tmp_path / "prog.sh", 'echo "args:$#:$1|$2"; pwd; echo "to stderr" >&2; exit 3\n')
    entries = [
        {"start_time": -10, "executable": "/bin/true"},
        {"start_time": -10, "executable": prog, "arguments": "one 'two words'", "on_host": True},
    ]

    async def main() -> None:
        rig = Rig(tmp_path, entries)
        rid = rig.ask(1)
        answer = await rig.answer(rid)
        assert answer["status"] == "error" and answer["details"] == "exit code 3"
        assert (answer["exit_code"], answer["signal"], answer["refused"]) == (3, None, False)
        (started,) = rig.events("entry_started")
        workdir = str(rig.logs / "host_entries" / "vm1" / "1")
        assert started["data"]["on_host"] is True and started["data"]["index"] == 1
        assert started["data"]["command"] == f"{prog} one 'two words'"
        assert started["data"]["working_dir"] == workdir and started["data"]["pid"] > 0
        assert "scheduled" not in started["data"]  # a negative stage: no lateness
        lines = [(e["data"]["stream"], e["data"]["seq"], e["data"]["line"]) for e in rig.events("output")]
        assert ("stdout", 1, "args:2:one|two words") in lines and ("stdout", 2, workdir) in lines
        assert ("stderr", 1, "to stderr") in lines
        assert all(e["data"]["index"] == 1 and e["data"]["eol"] is True for e in rig.events("output"))
        (exited,) = rig.events("entry_exited")
        assert exited["data"]["exit_code"] == 3 and exited["data"]["status"] == "error"
        assert exited["data"]["on_host"] is True and exited["data"]["duration"] >= 0
        assert rig.session.state.failures == 1 and not rig.session.state.running  # the VM's state saw it
        assert rig.outcomes()["1"]["state"] == "ended" and rig.outcomes()["1"]["exit_code"] == 3

    run(main)


def test_positive_time_reports_lateness_and_exit_10_is_no_reboot(tmp_path: Path) -> None:
    prog = script(tmp_path / "p.sh", "exit 10\n")

    async def main() -> None:
        rig = Rig(tmp_path, [{"start_time": 30, "executable": prog, "on_host": True}])
        due = time.time() - 2.0
        answer = await rig.answer(rig.ask(0, due))
        assert answer["exit_code"] == 10 and answer["status"] == "error"
        assert "reboot request: refused for on_host entries" in answer["details"]
        data = rig.events("entry_started")[0]["data"]
        assert data["scheduled"] == due and data["lateness"] == data["spawned_at"] - due >= 2.0
        assert rig.session.state.max_lateness == data["lateness"]
        assert "reboot_requested" not in rig.events("entry_exited")[0]["data"]

    run(main)


def test_resources_file_runs_and_escapes_are_refused(tmp_path: Path) -> None:
    outside = script(tmp_path / "outside.sh", "echo escaped\n")
    entries = [
        {"start_time": -10, "executable": "tool.sh", "arguments": "x", "on_host": True},
        {"start_time": -10, "executable": "../outside.sh", "on_host": True},
        {"start_time": -10, "executable": "link.sh", "on_host": True},
        {"start_time": -10, "executable": "missing.sh", "on_host": True},
        {"start_time": -10, "executable": "plain.txt", "on_host": True},
    ]

    async def main() -> None:
        rig = Rig(tmp_path, entries)
        script(rig.resources / "tool.sh", 'echo "tool $1"\n')
        os.symlink(outside, rig.resources / "link.sh")  # a symlink that leads out
        (rig.resources / "plain.txt").write_text("not a program\n")
        ok = await rig.answer(rig.ask(0))
        assert ok["status"] == "success" and ok["exit_code"] == 0 and ok["refused"] is False
        started = rig.events("entry_started")[0]["data"]
        assert started["command"] == f"{os.path.realpath(rig.resources / 'tool.sh')} x"
        assert [e["data"]["line"] for e in rig.events("output")] == ["tool x"]
        whys = {1: "absolute or with '..'", 2: "resolves outside the resource directory",
                3: "is not in the host's --resources directory", 4: "is not executable"}  # fmt: skip
        for index, why in whys.items():
            answer = await rig.answer(rig.ask(index))
            assert answer["status"] == "error" and answer["refused"] is True, answer
            assert why in answer["details"] and answer["exit_code"] is None
        failed = rig.events("entry_failed")
        assert [e["data"]["index"] for e in failed] == [1, 2, 3, 4]
        assert all(e["data"]["refused"] and e["data"]["on_host"] for e in failed)
        assert len(rig.events("entry_started")) == 1  # nothing else ran
        assert not any("escaped" in str(e["data"].get("line")) for e in rig.events("output"))

    run(main)


def test_the_entry_gets_firewheels_environment(tmp_path: Path) -> None:
    """FIREWHEEL 3.1.0's ``_build_host_vm_resource_env``: the VM's name and uuid (none known: empty),
    the Python running the host (its directory first on PATH) and the VM's config as JSON; the
    host's own environment is kept."""
    prog = script(
        tmp_path / "env.sh",
        'echo "name=$FIREWHEEL_VM_NAME"; echo "uuid=[$FIREWHEEL_VM_UUID]"; echo "py=$FIREWHEEL_PYTHON"\n'
        'echo "path1=${PATH%%:*}"; echo "config=$FIREWHEEL_VM_CONFIG_JSON"; echo "kept=$VMR_TEST_KEPT"\n'
        '"$FIREWHEEL_PYTHON" -c "import sys; print(\'runs=\' + sys.executable)"\n',
    )
    os.environ["VMR_TEST_KEPT"] = "yes"

    async def main() -> None:
        rig = Rig(tmp_path, [{"start_time": -1, "executable": prog, "on_host": True}])
        assert (await rig.answer(rig.ask(0)))["status"] == "success"
        lines = dict(e["data"]["line"].split("=", 1) for e in rig.events("output"))
        assert lines["name"] == "vm1" and lines["uuid"] == "[]" and lines["kept"] == "yes"
        assert lines["py"] == sys.executable == lines["runs"]
        assert lines["path1"] == os.path.dirname(sys.executable)
        config = json.loads(lines["config"])
        assert config == {"vm_name": "vm1", "vm_uuid": "", "schedule": str(tmp_path / "vm1.yaml")}

    try:
        run(main)
    finally:
        del os.environ["VMR_TEST_KEPT"]


def test_a_resource_stored_0644_runs_when_its_drop_says_executable(tmp_path: Path) -> None:
    """FIREWHEEL 3.1.0 chmods the cached copy of a host-side resource whose data item says
    ``executable: true``; here a copy in the entry's working dir is made executable and run, the
    file in --resources is left as it is. Without the flag it is refused, saying what to do."""
    drop = {"location": "tool.sh", "filename": "tool.sh"}
    entries = [
        {"start_time": -10, "executable": "tool.sh", "arguments": "a", "on_host": True,
         "data": [{**drop, "executable": True}]},
        {"start_time": -10, "executable": "tool.sh", "on_host": True,
         "data": [{**drop, "executable": False}]},
    ]  # fmt: skip

    async def main() -> None:
        rig = Rig(tmp_path, entries)
        tool = rig.resources / "tool.sh"
        tool.write_text('#!/bin/sh\necho "tool $1 in $(pwd)"\n')
        tool.chmod(0o644)
        ok = await rig.answer(rig.ask(0))
        assert ok["status"] == "success" and ok["exit_code"] == 0, ok
        workdir = rig.logs / "host_entries" / "vm1" / "0"
        assert rig.events("entry_started")[0]["data"]["command"] == f"{workdir / 'tool.sh'} a"
        assert [e["data"]["line"] for e in rig.events("output")] == [f"tool a in {workdir}"]
        assert (workdir / "tool.sh").stat().st_mode & 0o777 == 0o755
        assert tool.stat().st_mode & 0o777 == 0o644  # --resources is never changed
        refused = await rig.answer(rig.ask(1))
        assert refused["refused"] is True and refused["status"] == "error"
        assert "is not executable (mode 0o644)" in refused["details"]
        assert "set executable: true on that drop" in refused["details"]
        assert len(rig.events("entry_started")) == 1

    run(main)


def test_minimega_absent_is_a_clear_error_and_present_gets_its_arguments(tmp_path: Path) -> None:
    entries = [{"start_time": -10, "executable": "minimega", "arguments": "vm info", "on_host": True}]

    async def main() -> None:
        rig = Rig(tmp_path, entries)  # PATH: a directory without minimega
        answer = await rig.answer(rig.ask(0))
        assert answer["status"] == "error" and answer["refused"] is False
        assert "minimega is not on this host's PATH" in answer["details"]
        assert rig.events("entry_failed")[0]["data"]["details"] == answer["details"]

        bindir = tmp_path / "bin"
        bindir.mkdir()
        fake = script(bindir / "minimega", 'echo "minimega $*"\n')
        (tmp_path / "second").mkdir()
        other = Rig(tmp_path / "second", entries, path=str(bindir))
        answer = await other.answer(other.ask(0))
        assert answer["status"] == "success"
        assert other.events("entry_started")[0]["data"]["command"] == f"{fake} -e vm info"
        assert [e["data"]["line"] for e in other.events("output")] == ["minimega -e vm info"]

    run(main)


def test_a_program_that_cannot_start_or_arguments_that_cannot_be_split_fail_clearly(tmp_path: Path) -> None:
    entries = [
        {"start_time": -10, "executable": str(tmp_path / "absent"), "on_host": True},
        {"start_time": -10, "executable": "/bin/echo", "arguments": "'unbalanced", "on_host": True},
    ]

    async def main() -> None:
        rig = Rig(tmp_path, entries)
        absent = await rig.answer(rig.ask(0))
        assert absent["status"] == "error" and absent["refused"] is False
        assert "cannot start" in absent["details"] and "No such file" in absent["details"]
        split = await rig.answer(rig.ask(1))
        assert split["status"] == "error" and "cannot be split" in split["details"]
        assert [e["data"]["index"] for e in rig.events("entry_failed")] == [0, 1]
        assert not rig.events("entry_started")

    run(main)


# ------------------------------------------------------------------------------ exactly once
def test_a_running_entry_is_answered_when_it_ends_and_an_ended_one_at_once(tmp_path: Path) -> None:
    go = tmp_path / "go"
    count = tmp_path / "count"
    prog = script(
        tmp_path / "slow.sh", f"echo x >> {count}\nwhile [ ! -e {go} ]; do sleep 0.02; done\nexit 4\n"
    )

    async def main() -> None:
        rig = Rig(tmp_path, [{"start_time": -10, "executable": prog, "on_host": True}])
        first = rig.ask(0)
        await until(lambda: rig.events("entry_started"), "the entry started")
        second = rig.ask(0)  # the agent asks again (after a reconnection): no second run
        await asyncio.sleep(0.3)
        assert not rig.link.results(first) and not rig.link.results(second)
        go.write_text("")
        a1, a2 = await rig.answer(first), await rig.answer(second)
        assert a1["exit_code"] == a2["exit_code"] == 4
        before = len(rig.events())
        third = await rig.answer(rig.ask(0))  # ended: the recorded outcome at once, nothing new
        assert (third["exit_code"], third["details"]) == (4, "exit code 4")
        assert len(rig.events()) == before
        assert count.read_text() == "x\n"  # it ran once

    run(main)


def test_a_host_that_died_while_an_entry_ran_is_interrupted_and_its_tree_killed(tmp_path: Path) -> None:
    prog = script(tmp_path / "p.sh", "sleep 60\n")
    rig_entries = [{"start_time": -10, "executable": prog, "on_host": True}]
    # what a dead vmr-host leaves: the entry's process running, its outcome "running"
    left = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        root = tmp_path / "logs" / "host_entries"
        root.mkdir(parents=True)
        record = {"state": "running", "pid": left.pid, "create_time": psutil.Process(left.pid).create_time(),
                  "started": time.time()}  # fmt: skip
        (root / "vm1.json").write_text(json.dumps({"version": 1, "vm": "vm1", "entries": {"0": record}}))

        async def main() -> None:
            rig = Rig(tmp_path, rig_entries)  # open(): the leftover is killed, the entry interrupted
            assert left.wait(WAIT) == -15
            (interrupted,) = rig.events("entry_interrupted")
            assert interrupted["data"]["details"] == RESTARTED
            assert interrupted["data"]["killed_pids"] == [left.pid]
            answer = await rig.answer(rig.ask(0))
            assert answer["status"] == "error" and answer["details"] == RESTARTED
            assert not rig.events("entry_started")  # not run again
            assert rig.outcomes()["0"]["state"] == "interrupted"

        run(main)
    finally:
        left.kill()
        left.wait(WAIT)


def test_stopping_kills_the_tree_and_it_never_runs_again(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    prog = script(tmp_path / "tree.sh", f"sleep 60 &\necho $! > {pids}\nwait\n")

    async def main() -> None:
        rig = Rig(tmp_path, [{"start_time": -10, "executable": prog, "on_host": True}])
        rid = rig.ask(0)
        await until(lambda: pids.exists() and pids.read_text().strip(), "the child started")
        child = int(pids.read_text())
        await rig.runner.close()
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        answer = await rig.answer(rid)
        assert answer["details"] == STOPPED and answer["signal"] == 15
        assert rig.events("entry_interrupted")[0]["data"]["details"] == STOPPED
        again = rig.new_runner()  # the next start: answered from the record, not run
        answer = await rig.answer(rig.ask(0))
        assert answer["details"] == STOPPED and again.running() == []
        assert len(rig.events("entry_started")) == 1

    run(main)


def test_processes_wait_their_turn_beyond_the_per_vm_cap(tmp_path: Path) -> None:
    go = tmp_path / "go"
    prog = script(tmp_path / "w.sh", f"while [ ! -e {go} ]; do sleep 0.02; done\n")
    entries = [{"start_time": -10, "executable": prog, "on_host": True} for _ in range(3)]

    async def main() -> None:
        rig = Rig(tmp_path, entries, per_vm=2)
        ids = [rig.ask(i) for i in range(3)]
        await until(lambda: len(rig.events("entry_started")) == 2, "two started")
        await asyncio.sleep(0.3)
        assert len(rig.events("entry_started")) == 2 and len(rig.runner.running()) == 2
        go.write_text("")
        for rid in ids:
            assert (await rig.answer(rid))["status"] == "success"
        assert len(rig.events("entry_started")) == 3

    run(main)


# ------------------------------------------------------------------------------ refusals
def test_without_host_entries_the_request_is_refused_and_said_once(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    prog = script(tmp_path / "p.sh", f"touch {ran}\n")

    async def main() -> None:
        rig = Rig(tmp_path, [{"start_time": 5, "executable": prog, "on_host": True}], enabled=False)
        answer = await rig.answer(rig.ask(0, time.time()))
        assert answer["status"] == "error" and answer["refused"] is True and answer["details"] == DISABLED
        (skipped,) = rig.events("entry_skipped")
        assert skipped["data"]["status"] == "error" and skipped["data"]["details"] == DISABLED
        assert "--host-entries" in DISABLED
        assert (await rig.answer(rig.ask(0)))["refused"] is True
        assert len(rig.events("entry_skipped")) == 1  # said once
        assert rig.session.counters.protocol_errors == 0  # asking is no protocol error
        await asyncio.sleep(0.2)
        assert not ran.exists()

    run(main)


def test_an_index_that_is_not_an_on_host_entry_is_refused_and_counted(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    entries = [{"start_time": -10, "executable": f"touch {ran}"},
               {"start_time": -10, "executable": "/bin/true", "on_host": True}]  # fmt: skip

    async def main() -> None:
        rig = Rig(tmp_path, entries)
        for index in (0, 7, -1, "1", None, True):
            answer = await rig.answer(rig.ask(index))
            assert answer["status"] == "error" and answer["refused"] is True
            assert "not an on_host entry of this VM's schedule" in answer["details"]
        assert rig.session.counters.protocol_errors == 6
        assert not rig.events("entry_started") and not rig.events("entry_failed")
        await asyncio.sleep(0.2)
        assert not ran.exists()

    run(main)


# ------------------------------------------------------------------------------ the real vmr-host
@pytest.fixture
def hosts():
    made: List[Host] = []
    yield made
    for h in made:
        h.close()


def _handshaken(h: Host):
    a = h.agent("vm1")
    a.handshake()
    a.accept_schedule()
    return a


def test_serve_host_entries_runs_answers_and_never_reruns_after_a_restart(hosts, tmp_path: Path) -> None:
    count = tmp_path / "count"
    prog = script(tmp_path / "prog.sh", f'echo ran >> {count}\necho "hello $1"\n')
    h = Host({"vm1": [{"start_time": -10, "executable": prog, "arguments": "host", "on_host": True}]},
             ["--host-entries"])  # fmt: skip
    hosts.append(h)
    a = _handshaken(h)
    rid = a.send(a.event("host_entry", {"index": 0, "scheduled": None}))[0]
    result = a.take("result", lambda e: e.data.get("answers") == rid)
    assert result.data["status"] == "success" and result.data["exit_code"] == 0
    assert result.data["refused"] is False and result.data["signal"] is None
    types = [r["event"]["type"] for r in h.jsonl("vm1")]
    assert "entry_started" in types and "entry_exited" in types
    assert any(r["event"]["data"].get("line") == "hello host" for r in h.jsonl("vm1"))
    shown = h.cli("logs", "vm1", "--logs", str(h.logs)).stdout
    assert "hello host" in shown

    assert h.stop() == 0
    h.start()
    b = _handshaken(h)
    again = b.send(b.event("host_entry", {"index": 0, "scheduled": None}))[0]
    result = b.take("result", lambda e: e.data.get("answers") == again)
    assert result.data["status"] == "success" and result.data["exit_code"] == 0
    assert count.read_text() == "ran\n"  # once, across the restart
    assert [r["event"]["type"] for r in h.jsonl("vm1")].count("entry_started") == 1


def test_serve_without_host_entries_refuses(hosts, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    prog = script(tmp_path / "prog.sh", f"touch {ran}\n")
    h = Host({"vm1": [{"start_time": -10, "executable": prog, "on_host": True}]})
    hosts.append(h)
    a = _handshaken(h)
    rid = a.send(a.event("host_entry", {"index": 0, "scheduled": None}))[0]
    result = a.take("result", lambda e: e.data.get("answers") == rid)
    assert result.data["status"] == "error" and result.data["refused"] is True
    assert "--host-entries" in result.data["details"]
    h.wait_until(lambda: any(r["event"]["type"] == "entry_skipped" for r in h.jsonl("vm1")), "entry_skipped")
    assert h.vm_status("vm1")["refused"]["protocol_errors"] == 0
    assert not ran.exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
