"""Real QEMU guests (TCG) against the real ``vmr-host``: the host-side items.

1. ``test_three_guests_barrier_filename_drop_break_resume_transfer``: 3 guests with configuration
   stages of different lengths, one start time for all, a positive entry on every VM (spread
   printed), a ``filename`` drop from ``--resources``, a break ended by ``vmr-host resume --all``
   (RESUME latency printed), and a transfer out of the VM into ``<logs>/transfers/<vm>/``.
2. ``test_host_kill9_while_guest_streams``: ``kill -9`` of ``vmr-host`` while a guest streams
   3000 lines, restart on the same ``--logs``/``--channels`` after ~5 s (QEMU reconnects by itself,
   ``reconnect=1``): every line arrives exactly once, the schedule completes.

The guest (frozen agent + busybox initramfs) is built by ``packaging/build.sh`` and
``qemu-test/build-guest.sh`` as in ``test_qemu.py``, and QEMU is wired the same way.
Every wait is bounded; timings are printed (also in the "qemu-test timings" section), never asserted.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

import pytest
from guestlab import BUILD_TIMEOUT, Qemu, reassemble, say, stage_order, utc

from tests.hostenv import HostEnv

WAIT = 240.0
LINES = 3000

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 2 * WAIT + 180)


def _data(env: HostEnv, vm: str, type_: str, **match: Any) -> List[Dict[str, Any]]:
    return [
        r["event"]["data"]
        for r in env.events(vm, type_)
        if all(r["event"]["data"].get(k) == v for k, v in match.items())
    ]


def _wait(
    env: HostEnv, qemus: Dict[str, Any], pred: Callable[[], Any], what: str, timeout: float = WAIT
) -> Any:
    """``env.wait_for`` that also fails at once when a QEMU died, with the consoles and logs."""

    def check() -> Any:
        for q in qemus.values():
            if q.proc.poll() is not None:
                raise AssertionError(f"{q.vm}: QEMU exited {q.proc.returncode}\n{q.tail()}")
        return pred()

    try:
        return env.wait_for(check, what, timeout=timeout)
    except AssertionError as exc:
        logs = "\n".join(
            f"--- {vm}.log\n" + (env.logs / f"{vm}.log").read_text(errors="replace")[-3000:]
            for vm in qemus
            if (env.logs / f"{vm}.log").exists()
        )
        raise AssertionError(f"{exc}\n" + "\n".join(q.tail() for q in qemus.values()) + "\n" + logs) from None


def _cli(env: HostEnv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", *args, "--logs", str(env.logs)],
        capture_output=True,
        text=True,
        timeout=60,
    )


# ====================================================================== 1. three guests
SLEEPS = {"vm1": 1, "vm2": 3, "vm3": 6}
PAYLOAD = "payload.bin"


def _schedule3(vm: str, config_sleep: int) -> List[Dict[str, Any]]:
    return [
        # stage 0 (-20): a filename drop from the host's --resources, hashed inside the guest
        {
            "start_time": -20,
            "executable": "sha256sum",
            "arguments": PAYLOAD,
            "data": [{"location": PAYLOAD, "filename": PAYLOAD}],
        },
        # stage 1 (-10): configuration of a different length per VM
        {"start_time": -10, "executable": "sleep", "arguments": str(config_sleep)},
        # 2: positive entry on every VM
        {"start_time": 1, "executable": "/bin/echo", "arguments": f"at one on {vm}"},
        # 3: writes the files transferred out later
        {
            "start_time": 2,
            "executable": "/bin/sh",
            "arguments": (
                f"-c 'mkdir -p /tmp/out-dir/sub && echo result of {vm} > /tmp/out-dir/sub/result.txt"
                f" && seq 1 500 > /tmp/out-dir/numbers.txt'"
            ),
        },
        # 4: a break: everything later waits for a RESUME
        {"start_time": 3, "pause": True, "pause_duration": float("inf")},
        # 5: fires 10 ms (experiment time) after the RESUME
        {"start_time": 3.01, "executable": "/bin/echo", "arguments": f"after resume on {vm}"},
        # 6: transfer out of the VM, once
        {"start_time": 3.02, "data": [{"location": "/tmp/out-dir", "interval": None}]},
    ]


def test_three_guests_barrier_filename_drop_break_resume_transfer(guest: Dict[str, Any]) -> None:
    t_test = time.monotonic()
    schedules = {vm: _schedule3(vm, s) for vm, s in SLEEPS.items()}
    env = HostEnv(schedules, start_buffer=2.0)
    payload = os.urandom(300_000) + b"vmr payload\n"  # > one 256 KiB resource chunk
    (env.resources / PAYLOAD).write_bytes(payload)
    payload_sha = hashlib.sha256(payload).hexdigest()
    qemus: Dict[str, Any] = {}
    try:
        env.start_host()
        for vm in SLEEPS:
            qemus[vm] = Qemu(env, vm, guest["kernel"], guest["initrd"])

        # ---------------------------------------------------------------- up to the break
        _wait(
            env,
            qemus,
            lambda: all(
                _data(env, vm, "break_started") and _data(env, vm, "entry_exited", index=3) for vm in SLEEPS
            ),
            "every VM: break started and the writer entry exited",
        )
        t_break = time.monotonic() - t_test

        # filename drop: the host's file, placed byte-exact (sha256 by the agent and by sha256sum)
        for vm in SLEEPS:
            placed = [d for d in _data(env, vm, "data_placed") if d["location"] == PAYLOAD]
            assert len(placed) == 1, placed
            assert placed[0]["sha256"] == payload_sha, (vm, placed)
            assert placed[0]["size"] == len(payload)
            assert reassemble(env, vm, 0).decode().split()[0] == payload_sha

        # stages in order, different configuration lengths
        configured_rx: Dict[str, float] = {}
        for vm, secs in SLEEPS.items():
            order = stage_order(env, vm)
            assert order == [
                ("stage_started", 0),
                ("stage_finished", 0),
                ("stage_started", 1),
                ("stage_finished", 1),
                ("configured", None),
            ], order
            fin1 = [d for d in _data(env, vm, "stage_finished") if d["stage"] == 1]
            assert fin1[0]["duration"] >= secs - 0.1, fin1
            configured_rx[vm] = utc(env.events(vm, "configured")[0]["host_received"])

        # the barrier: one start time for all, after the last configured + buffer
        starts = {vm: [d["start_time"] for d in _data(env, vm, "start_time_set")] for vm in SLEEPS}
        assert all(len(s) == 1 for s in starts.values()), starts
        start = starts["vm1"][0]
        assert all(s[0] == start for s in starts.values()), starts
        assert start >= max(configured_rx.values()) + 2.0 - 0.5, (start, configured_rx)
        say(
            "3 VMs configured (host receive, relative to the first): "
            + ", ".join(
                f"{vm} (sleep {SLEEPS[vm]}) +{configured_rx[vm] - min(configured_rx.values()):.1f} s"
                for vm in SLEEPS
            )
            + f"; start = last configured + {start - max(configured_rx.values()):.2f} s"
        )

        # the positive entry at 1 on every VM
        spawned: Dict[str, float] = {}
        received: Dict[str, float] = {}
        for vm in SLEEPS:
            ent = _data(env, vm, "entry_started", index=2)
            assert len(ent) == 1, ent
            assert abs(ent[0]["scheduled"] - (start + 1)) < 1e-6, ent
            spawned[vm] = ent[0]["spawned_at"]
            received[vm] = utc(
                next(
                    r["host_received"]
                    for r in env.events(vm, "entry_started")
                    if r["event"]["data"]["index"] == 2
                )
            )
            assert reassemble(env, vm, 2) == f"at one on {vm}\n".encode()
            # nothing after the break ran before the RESUME
            assert not _data(env, vm, "entry_started", index=5), vm
        spread = max(spawned.values()) - min(spawned.values())
        rx_spread = max(received.values()) - min(received.values())
        say(
            f"3-VM spread of the entry at 1 s: spawned_at {spread * 1000:.1f} ms"
            " (per VM |spawned_at - scheduled|: "
            + ", ".join(f"{vm} {abs(spawned[vm] - start - 1) * 1000:.1f} ms" for vm in SLEEPS)
            + f"); host receive of entry_started {rx_spread * 1000:.1f} ms"
        )

        # ---------------------------------------------------------------- RESUME --all
        time.sleep(1.0)
        assert not any(_data(env, vm, "entry_started", index=5) for vm in SLEEPS)
        t_cli = time.time()
        res = _cli(env, "resume", "--all")
        t_cli_done = time.time()
        assert res.returncode == 0, res.stdout + res.stderr
        _wait(
            env,
            qemus,
            lambda: all(_data(env, vm, "entry_started", index=5) for vm in SLEEPS),
            "every VM: the entry after the break started",
        )
        lat: Dict[str, float] = {}
        for vm in SLEEPS:
            rr = _data(env, vm, "resume_received")
            assert len(rr) == 1 and rr[0]["ended_break"] == 4 and not rr[0]["ignored"], rr
            ent = _data(env, vm, "entry_started", index=5)[0]
            assert ent["spawned_at"] >= t_cli - 0.05, (ent, t_cli)  # after the RESUME, not before
            lat[vm] = ent["spawned_at"] - t_cli
        say(
            "RESUME latency (CLI call -> entry_started.spawned_at of the entry 10 ms after the break): "
            + ", ".join(f"{vm} {v * 1000:.0f} ms" for vm, v in lat.items())
            + f"; CLI call itself {(t_cli_done - t_cli) * 1000:.0f} ms"
        )

        # ---------------------------------------------------------------- transfer out, completion
        def transferred(vm: str) -> bool:
            root = env.logs / "transfers" / vm / "tmp" / "out-dir"
            return (root / "sub" / "result.txt").exists() and (root / "numbers.txt").exists()

        _wait(
            env,
            qemus,
            lambda: all(transferred(vm) and _data(env, vm, "schedule_complete") for vm in SLEEPS),
            "every VM: transfer landed and schedule complete",
        )
        numbers = "".join(f"{i}\n" for i in range(1, 501))
        for vm in SLEEPS:
            root = env.logs / "transfers" / vm / "tmp" / "out-dir"
            assert (root / "sub" / "result.txt").read_text() == f"result of {vm}\n"
            assert (root / "numbers.txt").read_text() == numbers
            files = sorted(
                str(p.relative_to(env.logs / "transfers" / vm)) for p in root.rglob("*") if p.is_file()
            )
            assert files == ["tmp/out-dir/numbers.txt", "tmp/out-dir/sub/result.txt"], files
            assert reassemble(env, vm, 5) == f"after resume on {vm}\n".encode()
            ids = [r["event"]["id"] for r in env.events(vm)]
            assert len(ids) == len(set(ids))
        say(
            f"3-VM test: QEMU start -> all at the break {t_break:.1f} s, "
            f"-> transfers + schedule_complete {time.monotonic() - t_test:.1f} s"
        )
    finally:
        for q in qemus.values():
            q.kill()
        env.close()
        say(f"3-VM test incl. teardown: {time.monotonic() - t_test:.1f} s")


# ====================================================================== 2. host kill -9
def _stream_schedule() -> List[Dict[str, Any]]:
    loop = f'i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo "line $i"; usleep 3000; done'
    return [
        {"start_time": -5, "executable": "/bin/sh", "arguments": f"-c '{loop}'"},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "after the stream"},
    ]


def test_host_kill9_while_guest_streams(guest: Dict[str, Any]) -> None:
    t_test = time.monotonic()
    vm = "vs1"
    env = HostEnv({vm: _stream_schedule()}, start_buffer=1.0)
    qemus: Dict[str, Any] = {}
    try:
        env.start_host()
        qemus[vm] = Qemu(env, vm, guest["kernel"], guest["initrd"])

        def lines_now() -> int:
            return len(_data(env, vm, "output", index=0))

        _wait(env, qemus, lambda: lines_now() >= 200, "200 lines streamed")
        t_first = time.monotonic()
        assert env.host is not None
        env.host.kill()  # SIGKILL
        env.host.wait(timeout=30)
        t_kill = time.monotonic()
        before = lines_now()
        time.sleep(5.0)
        at_restart = lines_now()
        assert at_restart == before, (before, at_restart)  # nobody writes the log meanwhile
        # the lock and the stale sockets are dealt with by serve itself
        env.start_host()
        t_restart = time.monotonic()
        t_restart_utc = time.time()
        _wait(
            env,
            qemus,
            lambda: len(_data(env, vm, "output", index=0)) > before,
            "the first line received after the restart",
        )
        t_again = time.monotonic()
        _wait(
            env,
            qemus,
            lambda: _data(env, vm, "schedule_complete"),
            "schedule complete after the host restart",
        )
        t_done = time.monotonic()

        outs = _data(env, vm, "output", index=0, stream="stdout")
        seqs = [d["seq"] for d in outs]
        assert len(seqs) == len(set(seqs)), "duplicated output seq"
        assert sorted(seqs) == list(range(1, LINES + 1)), (
            len(seqs),
            sorted(set(range(1, LINES + 1)) - set(seqs))[:20],
        )
        by_seq = {d["seq"]: d["line"] for d in outs}
        assert all(by_seq[i] == f"line {i}" for i in range(1, LINES + 1))
        out_of_order = sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)
        ids = [r["event"]["id"] for r in env.events(vm)]
        assert len(ids) == len(set(ids)), "an event id was written twice"
        exited = _data(env, vm, "entry_exited", index=0)
        assert len(exited) == 1 and exited[0]["exit_code"] == 0, exited
        assert _data(env, vm, "entry_started", index=1)
        assert reassemble(env, vm, 1) == b"after the stream\n"
        notes = [
            line.strip()
            for line in (env.logs / f"{vm}.log").read_text(errors="replace").splitlines()
            if "[host]" in line
        ]
        burst = sum(
            1
            for r in env.events(vm, "output")
            if r["event"]["data"]["index"] == 0
            and t_restart_utc <= utc(r["host_received"]) < t_restart_utc + 2
        )
        say(
            f"host kill -9 while streaming: {before} of {LINES} lines in the log at the kill "
            f"({t_first - t_test:.1f} s after QEMU start); host down {t_restart - t_kill + 0.0:.1f} s; "
            f"restart -> first new line {t_again - t_restart:.1f} s; restart -> schedule_complete "
            f"{t_done - t_restart:.1f} s; all {LINES} lines exactly once "
            f"({out_of_order} places where seq went backwards in the file); "
            f"{burst} lines received in the first 2 s after the restart"
        )
        for note in notes:
            say(f"  {vm}.log: {note[:200]}")
    finally:
        for q in qemus.values():
            q.kill()
        env.close()
        say(f"kill -9 test incl. teardown: {time.monotonic() - t_test:.1f} s")
