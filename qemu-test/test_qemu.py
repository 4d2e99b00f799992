"""Real QEMU guests (TCG) running the frozen agent, talking to a real ``vmr-host serve``
over a real virtio-serial port. Every assertion is on the host's logs (``<logs>/<vm>.jsonl``).

Session fixture: ``packaging/build.sh`` (the frozen onedir agent), then
``qemu-test/build-guest.sh`` (Debian cloud kernel + busybox initramfs with the agent as
``/usr/local/bin/vmr-handler run --quiet``). Kernel and modules are cached in
``qemu-test/.cache``. At most 2 guests run at once. Every wait is bounded; nothing asserts on
speed (timings are printed: run pytest with ``-s`` to see them).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any, Dict, List, Tuple

import pytest
from guestlab import BUILD_TIMEOUT, Qemu, reassemble, say, stage_order, utc

from tests.hostenv import HostEnv

RUN_TIMEOUT = 180.0  # boot + stages + barrier + positive time, under TCG
NONUTF8 = b"pos \xff\xfe end\n"

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 120)


def _schedule(vm: str, config_sleep: int) -> List[Dict[str, Any]]:
    return [
        # stage 0 (-20): a content drop read back by the entry that dropped it
        {
            "start_time": -20,
            "executable": "/bin/cat",
            "arguments": "hello.txt",
            "data": [{"location": "hello.txt", "content": f"hello from {vm}\n"}],
        },
        # stage 1 (-10): configuration of a different length per VM
        {"start_time": -10, "executable": "sleep", "arguments": str(config_sleep)},
        # positive time: non-UTF-8 output, then a 2 s pause at 2, then an entry at 3 (fires at 5)
        {"start_time": 1, "executable": "printf", "arguments": r"'pos \xff\xfe end\n'"},
        {"start_time": 2, "pause_duration": 2},
        {"start_time": 3, "executable": "/bin/echo", "arguments": f"after pause on {vm}"},
        # FIREWHEEL command lines: a builtin with the rest of the line, a missing program
        {"start_time": -10, "executable": "cd", "arguments": "/; echo in $PWD"},
        {"start_time": -10, "executable": "no-such-program-xyz"},
    ]


def _ev(env: HostEnv, vm: str, type_: str) -> List[Dict[str, Any]]:
    return env.events(vm, type_)


def test_two_guests_schedule_barrier_positive_pause_nonutf8(guest: Dict[str, Any]) -> None:
    t_test = time.monotonic()
    sleeps = {"vm1": 1, "vm2": 5}
    schedules = {vm: _schedule(vm, s) for vm, s in sleeps.items()}
    env = HostEnv(schedules, start_buffer=2.0)
    qemus: Dict[str, Qemu] = {}
    try:
        env.start_host()
        for vm in sleeps:
            qemus[vm] = Qemu(env, vm, guest["kernel"], guest["initrd"])

        def guest_alive() -> None:
            for q in qemus.values():
                if q.proc.poll() is not None:
                    raise AssertionError(f"{q.vm}: QEMU exited {q.proc.returncode}\n{q.tail()}")

        def done(vm: str) -> bool:
            guest_alive()
            return any(r["event"]["data"]["index"] == 4 for r in _ev(env, vm, "entry_exited"))

        try:
            env.wait_for(
                lambda: all([done(vm) for vm in sleeps]), "both VMs: last entry exited", timeout=RUN_TIMEOUT
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n"
                + "\n".join(q.tail() for q in qemus.values())
                + "\n"
                + "\n".join(
                    (env.logs / f"{vm}.log").read_text(errors="replace")[-3000:]
                    for vm in sleeps
                    if (env.logs / f"{vm}.log").exists()
                )
            ) from None
        elapsed_run = time.monotonic() - t_test

        # -------------------------------------------------- schedule over the real port
        for vm in sleeps:
            started = _ev(env, vm, "agent_started")
            assert started, f"{vm}: no agent_started"
            loaded = _ev(env, vm, "schedule_loaded")
            assert len(loaded) == 1, loaded
            digest = hashlib.sha256((env.schedules / f"{vm}.yaml").read_bytes()).hexdigest()
            assert loaded[0]["event"]["data"]["digest"] == digest
            assert loaded[0]["event"]["data"]["entries"] == len(schedules[vm])
            log = (env.logs / f"{vm}.log").read_text(errors="replace")
            assert "[host]" in log
            # the content drop, and the entry that read it back
            placed = [r["event"]["data"] for r in _ev(env, vm, "data_placed")]
            assert any(d["location"] == "hello.txt" for d in placed), placed
            assert reassemble(env, vm, 0) == f"hello from {vm}\n".encode()
            # a guest without bash: the POSIX shell runs the reference's command lines
            ent = {r["event"]["data"]["index"]: r["event"]["data"] for r in _ev(env, vm, "entry_started")}
            assert ent[5]["shell"] == "/bin/sh" and ent[5]["command"] == "cd /; echo in $PWD", ent[5]
            assert reassemble(env, vm, 5) == b"in /\n"
            exited = {r["event"]["data"]["index"]: r["event"]["data"] for r in _ev(env, vm, "entry_exited")}
            assert exited[6]["exit_code"] == 127, exited[6]
            assert "'no-such-program-xyz' was not found" in exited[6]["details"], exited[6]

        # -------------------------------------------------- stages in order, then configured
        configured_rx: Dict[str, float] = {}
        boot_to: Dict[str, Tuple[float, float]] = {}
        for vm in sleeps:
            order = stage_order(env, vm)
            assert order == [
                ("stage_started", 0),
                ("stage_finished", 0),
                ("stage_started", 1),
                ("stage_finished", 1),
                ("configured", None),
            ], order
            fin1 = [
                d for d in (r["event"]["data"] for r in _ev(env, vm, "stage_finished")) if d["stage"] == 1
            ]
            assert fin1[0]["duration"] >= sleeps[vm] - 0.1, fin1
            cfg = _ev(env, vm, "configured")[0]
            configured_rx[vm] = utc(cfg["host_received"])
            first = utc(_ev(env, vm, "agent_started")[0]["host_received"])
            boot_to[vm] = (first - qemus[vm].started, configured_rx[vm] - qemus[vm].started)

        # -------------------------------------------------- one start time for both (barrier)
        starts = {
            vm: [r["event"]["data"]["start_time"] for r in _ev(env, vm, "start_time_set")] for vm in sleeps
        }
        assert all(len(s) == 1 for s in starts.values()), starts
        start = starts["vm1"][0]
        assert starts["vm2"][0] == start, starts
        assert start >= max(configured_rx.values()) + 2.0 - 0.5, (start, configured_rx)
        assert configured_rx["vm1"] < configured_rx["vm2"], configured_rx  # different config lengths

        # -------------------------------------------------- positive entry on both, pause shifts the next
        spawned: Dict[str, float] = {}
        received: Dict[str, float] = {}
        for vm in sleeps:
            received[vm] = next(
                r["host_received"] for r in _ev(env, vm, "entry_started") if r["event"]["data"]["index"] == 2
            )
            ent = {r["event"]["data"]["index"]: r["event"]["data"] for r in _ev(env, vm, "entry_started")}
            assert abs(ent[2]["scheduled"] - (start + 1)) < 1e-6, ent[2]
            assert abs(ent[4]["scheduled"] - (start + 3 + 2)) < 1e-6, ent[4]  # 2 s pause at 2
            spawned[vm] = ent[2]["spawned_at"]
            pauses = [r["event"]["data"] for r in _ev(env, vm, "pause_started")]
            assert len(pauses) == 1 and pauses[0]["duration"] == 2, pauses
            # -------------------------------------------------- non-UTF-8 output, lossless
            out = [r["event"]["data"] for r in _ev(env, vm, "output") if r["event"]["data"]["index"] == 2]
            assert any("line_b64" in d for d in out), out
            assert reassemble(env, vm, 2) == NONUTF8
            assert reassemble(env, vm, 4) == f"after pause on {vm}\n".encode()
            late = {i: ent[i]["spawned_at"] - ent[i]["scheduled"] for i in (2, 4)}
            say(
                f"{vm}: |spawned_at - scheduled| entry@1 {abs(late[2]) * 1000:.1f} ms, "
                f"entry@3(+pause) {abs(late[4]) * 1000:.1f} ms"
            )
        spread = max(spawned.values()) - min(spawned.values())
        rx_spread = max(received.values()) - min(received.values())
        say(
            f"cross-VM spread of the positive entry at 1 s: spawned_at (agents' host-corrected clocks) "
            f"{spread * 1000:.1f} ms; host receive time of entry_started {rx_spread * 1000:.1f} ms"
        )
        for vm, (hello, cfg) in boot_to.items():
            console = qemus[vm].console.read_text(errors="replace")
            m = re.search(r"uptime ([0-9.]+) s, starting vmr-handler", console)
            say(f"{vm}: guest uptime when /init starts the agent: {m.group(1) if m else '?'} s")
            say(
                f"{vm}: QEMU start -> agent_started received {hello:.1f} s, -> configured received "
                f"{cfg:.1f} s (stage sleep {sleeps[vm]} s)"
            )
        tm = guest["timings"]
        say(
            f"test run (host + 2 guests to last entry): {elapsed_run:.1f} s; "
            f"builds: agent {tm['agent_build']:.1f} s, guest {tm['guest_build']:.1f} s"
        )
    finally:
        for q in qemus.values():
            q.kill()
        env.close()
        say(f"whole test incl. teardown: {time.monotonic() - t_test:.1f} s")
