"""A reboot request in negative time that really reboots a QEMU guest.

One TCG guest (the busybox initramfs from ``build-guest.sh``) with a persistent ext2 state
disk (a raw image made here with ``mkfs.ext2``, attached as ``/dev/vda``; ``/init`` binds its
``state/`` to ``/var/lib/vmr-handler`` and ``launch/`` to ``/var/launch``) and QEMU started
WITHOUT ``-no-reboot``: the agent's reboot command (``sync; reboot -f`` in this guest) restarts
the kernel, QEMU boots it again, ``/init`` mounts the same disk, and the agent resumes from its
journal. Run twice, once per way an entry can request a reboot (docs/schedule.md): R exits
with code 10 (``exit10``), or R exits 0 leaving a file named ``reboot`` in its working dir
(``file``). Asserted on the host's logs: ``reboot_requested`` with requesters [R], a second
``agent_started`` from a new boot (``boot_id`` in the host's handshake notes differs), R started
twice (the ``reboot`` file removed by the agent before the rerun), A and B once, then
``schedule_complete``; every event id logged once.

The ``exit10`` run has its launch dir on the tmpfs ``/tmp`` (``vmr.launch=/tmp/launch``), so the
reboot empties it while the journal on the disk says every entry's data was placed: R, B and
the positive entry run after the reboot with their data, placed again by the agent and reported
so (``data_placed``, ``outcome: restored``, "rebooted"). The ``file`` run keeps the launch dir on
the state disk (the ``reboot`` file must survive the reboot to be removed), where nothing is
placed again. The counters of both runs are on the state disk (``/var/launch``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import guestlab as tq
import pytest

from tests.hostenv import HostEnv

WAIT = 240.0
VM = "vmr"

pytestmark = pytest.mark.timeout(tq.BUILD_TIMEOUT + WAIT + 120)

# Each entry counts its runs in its own file on the state disk (/var/launch/<x>.runs) and prints
# the content of the file it drops (`<x>.txt` in its working dir), so a run without its data shows.
# R prints whether a `reboot` file is in its working dir when it starts: the agent must have
# removed it before running R again (else R would request a reboot forever).
_R = (
    "echo r >> /var/launch/r.runs; n=$(wc -l < /var/launch/r.runs); "
    "if [ -e reboot ]; then f=left; else f=gone; fi; echo R $n $f $(cat r.txt); "
)
#: How R asks for a reboot on its first run (docs/schedule.md: exit code 10, or a `reboot` file
#: left in its working dir, here with exit code 0).
REQUESTS = {
    "exit10": _R + "[ $n -ge 2 ] || exit 10",
    "file": _R + "[ $n -ge 2 ] || touch reboot",
}
#: R's exit codes (first run, run after the reboot).
EXITS = {"exit10": [10, 0], "file": [0, 0]}
#: Kernel command-line words per run: ``exit10`` has its launch dir on the tmpfs /tmp.
APPEND = {"exit10": "vmr.launch=/tmp/launch", "file": ""}


def _entry(start_time: float, name: str, line: str) -> Dict[str, Any]:
    """An entry that runs ``line`` with ``/bin/sh -c`` and drops ``<name>.txt`` (``data-<name>``)."""
    return {
        "start_time": start_time,
        "executable": "/bin/sh",
        "arguments": f"-c '{line}'",
        "data": [{"location": f"{name}.txt", "content": f"data-{name}\n"}],
    }


def _counted(letter: str) -> str:
    """Count a run in ``/var/launch/<letter>.runs`` and print ``<LETTER> <count> <dropped data>``."""
    runs = f"/var/launch/{letter}.runs"
    return f"echo {letter} >> {runs}; echo {letter.upper()} $(wc -l < {runs}) $(cat {letter}.txt)"


def schedule(how: str) -> List[Dict[str, Any]]:
    """A (runs once), R (requests a reboot on its first run, the ``how`` way) in stage -10,
    B in stage -5, one positive entry; each drops a file and prints it."""
    return [
        _entry(-10, "a", _counted("a")),  # 0 = A: runs once
        _entry(-10, "r", REQUESTS[how]),  # 1 = R: asks for a reboot on its first run only
        _entry(-5, "b", _counted("b")),  # 2 = B: the next stage, after the reboot
        _entry(1, "p", "echo positive after reboot $(cat p.txt)"),  # 3: positive time
    ]


def _data(env: HostEnv, type_: str, **match: Any) -> List[Dict[str, Any]]:
    return [
        r["event"]["data"]
        for r in env.events(VM, type_)
        if all(r["event"]["data"].get(k) == v for k, v in match.items())
    ]


def _lines(env: HostEnv, index: int) -> List[str]:
    out = [r["event"]["data"] for r in env.events(VM, "output") if r["event"]["data"]["index"] == index]
    return [d.get("line", "") for d in out]


def _handshakes(env: HostEnv) -> List[Tuple[float, str]]:
    """(host time, agent boot id) of every handshake, from the host's notes in ``<vm>.log``."""
    path = env.logs / f"{VM}.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return [
        (tq.utc(when), boot)
        for when, boot in re.findall(r"^(\S+) \[host\] handshake: agent \S+ boot (\S+)", text, re.M)
    ]


def _make_disk(path: Path) -> str:
    """A 32 MiB raw image, ext2 when mkfs.ext2/mke2fs is here (else /init formats it)."""
    with open(path, "wb") as fh:
        fh.truncate(32 * 1024 * 1024)
    mkfs = shutil.which("mkfs.ext2") or shutil.which("mke2fs")
    if mkfs is None:
        return "blank (formatted by the guest)"
    subprocess.run([mkfs, "-F", "-q", str(path)], check=True, capture_output=True, timeout=60)
    return f"ext2 by {Path(mkfs).name}"


@pytest.mark.parametrize("how", sorted(REQUESTS))
def test_reboot_request_really_reboots_the_guest(guest: Dict[str, Any], how: str) -> None:
    """R asks for a reboot (``how``: exit code 10, or a ``reboot`` file); the guest really
    reboots and resumes from its journal on the state disk; only R runs again."""
    t_test = time.monotonic()
    env = HostEnv({VM: schedule(how)}, start_buffer=2.0)
    q = None
    try:
        disk = env.root / "state.img"
        disk_how = _make_disk(disk)
        env.start_host()
        q = tq.Qemu(env, VM, guest["kernel"], guest["initrd"], no_reboot=False, disk=disk, append=APPEND[how])

        status_boot_ids: List[str] = []

        def done() -> bool:
            if q.proc.poll() is not None:
                raise AssertionError(f"QEMU exited {q.proc.returncode}\n{q.tail()}")
            if len(status_boot_ids) < len(env.events(VM, "agent_started")):
                # the host's view of the agent behind this channel right now (`status --json`)
                vms = [v for v in env.status()["vms"] if v.get("vm", v.get("name")) == VM]
                status_boot_ids.append(str((vms[0].get("agent") or {}).get("boot_id") if vms else None))
            return bool(env.events(VM, "schedule_complete"))

        try:
            env.wait_for(done, "schedule_complete after the reboot", timeout=WAIT)
        except AssertionError as exc:
            log = env.logs / f"{VM}.log"
            raise AssertionError(
                f"{exc}\n{q.tail()}\n" + (log.read_text(errors="replace")[-4000:] if log.exists() else "")
            ) from None
        t_done = time.monotonic()

        # -------------------------------------------------- the reboot request, then a new boot
        req = _data(env, "reboot_requested")
        assert len(req) == 1, req
        assert req[0]["requesters"] == [1] and req[0]["stage"] == 0, req
        assert "reboot -f" in req[0]["command"], req
        started = env.events(VM, "agent_started")
        assert len(started) == 2, [r["event"]["data"] for r in started]
        assert started[1]["event"]["data"]["resumed_from_journal"] is True, started[1]
        shakes = _handshakes(env)
        boots = [b for _t, b in shakes]
        assert len(shakes) == 2 and boots[0] != boots[1], shakes  # the second hello: a new boot
        assert status_boot_ids == boots, (status_boot_ids, boots)  # `vmr-host status` agrees
        # Reboot round trip on the host's clock: the last event received before the reboot
        # (anything received before the second handshake) -> the second agent_started received.
        # The report of the request itself may reach the host only after the reboot (from the
        # outbox on the state disk): `reboot -f` follows it within milliseconds.
        t_hs2 = shakes[1][0]
        rx = [tq.utc(r["host_received"]) for r in env.events(VM)]
        t_last = max(t for t in rx if t < t_hs2)
        t_again = tq.utc(started[1]["host_received"])
        rec_req = env.events(VM, "reboot_requested")[0]
        t_req_agent = tq.utc(rec_req["event"]["timestamp"])  # the guest's clock (RTC-set, +-1 s)
        req_when = (
            "before the reboot"
            if tq.utc(rec_req["host_received"]) < t_hs2
            else "after the reboot (resent from the outbox on the state disk)"
        )
        assert t_again > t_hs2 > t_last
        console = q.console.read_text(errors="replace")
        assert console.count("starting vmr-handler") == 2, console[-3000:]
        assert "state on /dev/vda" in console, console[-3000:]

        # -------------------------------------------------- only the requester ran again
        runs = {i: len(_data(env, "entry_started", index=i)) for i in range(4)}
        assert runs == {0: 1, 1: 2, 2: 1, 3: 1}, runs
        exited = _data(env, "entry_exited", index=1)
        assert [d["exit_code"] for d in exited] == EXITS[how], exited
        assert [d["reboot_requested"] for d in exited] == [True, False], exited
        assert [d["status"] for d in exited] == ["success", "success"], exited
        assert not _data(env, "entry_interrupted"), _data(env, "entry_interrupted")
        assert not _data(env, "entry_failed"), _data(env, "entry_failed")
        assert _lines(env, 0) == ["A 1 data-a"], _lines(env, 0)
        # its counter survived on the disk; a `reboot` file it left was removed before its rerun
        assert _lines(env, 1) == ["R 1 gone data-r", "R 2 gone data-r"], _lines(env, 1)
        assert _lines(env, 2) == ["B 1 data-b"], _lines(env, 2)
        assert _lines(env, 3) == ["positive after reboot data-p"]
        # the reboot emptied a launch dir on the tmpfs: what was still to run was placed again
        restored = {d["index"]: d for d in _data(env, "data_placed", outcome="restored")}
        if APPEND[how]:
            assert sorted(restored) == [1, 2, 3], restored
            for d in restored.values():
                assert d["path"].startswith("/tmp/launch/") and d["preloaded"] is True, d
                assert "rebooted since" in d["details"] and "gone since" in d["details"], d
        else:
            assert restored == {}, restored
        # stage 0 finished once (before the reboot) ... then stage 1, configured, complete
        order = [
            (r["event"]["type"], r["event"]["data"].get("stage"))
            for r in env.events(VM)
            if r["event"]["type"] in ("reboot_requested", "stage_finished", "configured", "schedule_complete")
        ]
        assert order[-3:] == [("stage_finished", 1), ("configured", None), ("schedule_complete", None)], order
        assert ("reboot_requested", 0) in order and order.index(("reboot_requested", 0)) < order.index(
            ("stage_finished", 1)
        ), order
        ids = [r["event"]["id"] for r in env.events(VM)]
        assert len(ids) == len(set(ids)), "an event logged twice"

        # -------------------------------------------------- timings
        first = tq.utc(started[0]["host_received"])
        ups = re.findall(r"uptime ([0-9.]+) s, starting vmr-handler", console)
        tq.say(f"reboot test [{how}]: state disk {disk_how}; boot ids {boots}")
        tq.say(
            f"reboot test [{how}]: QEMU start -> first agent_started {first - q.started:.1f} s; "
            f"reboot round trip: host clock, last event before the reboot -> second hello "
            f"{t_hs2 - t_last:.1f} s, -> second agent_started {t_again - t_last:.1f} s; "
            f"reboot_requested.timestamp (guest clock) -> agent_started {t_again - t_req_agent:.1f} s; "
            f"reboot_requested reached the host {req_when}; "
            f"guest uptime at agent start per boot {ups} s"
        )
        tq.say(f"reboot test [{how}]: host + guest to schedule_complete {t_done - t_test:.1f} s")
    finally:
        if q is not None:
            q.kill()
        env.close()
        tq.say(f"reboot test [{how}] incl. teardown: {time.monotonic() - t_test:.1f} s")
