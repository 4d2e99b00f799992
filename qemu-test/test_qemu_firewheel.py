"""A real QEMU guest (TCG) wired as the FIREWHEEL export wires a VM: the agent's virtio-serial
port given as the VM's ``qemu_append`` items (``vmr_handler/firewheel/wiring.py``), rendered on
QEMU's command line as minimega renders them (``-KEY VALUE`` per item), QEMU listening on the
socket, and ``vmr-host serve --connect`` connecting to it. The frozen agent in the guest plays
its schedule to the end over that port: the wiring docs/firewheel.md tells a FIREWHEEL user
to use works with a real QEMU.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Any, Dict, List

import pytest
from guestlab import BUILD_TIMEOUT, qemu_argv, reassemble

from tests.hostenv import HostEnv
from vmr_handler.firewheel.wiring import qemu_arguments

RUN_TIMEOUT = 180.0
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 120)

SCHEDULE: List[Dict[str, Any]] = [
    {"start_time": -10, "executable": "/bin/echo", "arguments": "configured over the exported port"},
    {"start_time": 1, "executable": "/bin/echo", "arguments": "positive time"},
]


def _without_lab_port(argv: List[str]) -> List[str]:
    """The lab's QEMU command line without its own chardev and port (the export's replace them)."""
    out: List[str] = []
    skip = 0
    for i, word in enumerate(argv):
        if skip:
            skip -= 1
            continue
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if word == "-chardev" or (word == "-device" and ("virtio-serial" in nxt or "virtserialport" in nxt)):
            skip = 1
            continue
        out.append(word)
    return out


def test_a_guest_wired_by_the_firewheel_export_plays_its_schedule(guest: Dict[str, Any]) -> None:
    env = HostEnv({"fw1": SCHEDULE}, start_buffer=1.0)
    proc = None
    try:
        path = str(env.channels / "fw1.sock")
        rendered = shlex.split(" ".join(f"-{key} {value}" for key, value in qemu_arguments(path).items()))
        assert rendered[0] == "-chardev" and f"path={path},server=on" in rendered[1]  # QEMU listens
        console = env.root / "fw1.console"
        argv = _without_lab_port(qemu_argv(env, "fw1", guest["kernel"], guest["initrd"], console)) + rendered
        with open(env.root / "fw1.qemu", "wb") as log, open(os.devnull, "rb") as null:
            proc = subprocess.Popen(argv, stdin=null, stdout=log, stderr=log)
        env.wait_for(lambda: os.path.exists(path), "QEMU listening on the export's socket", timeout=60)
        env.start_host("--connect")

        def done() -> bool:
            if proc is not None and proc.poll() is not None:
                out = (env.root / "fw1.qemu").read_text(errors="replace")[-2000:]
                raise AssertionError(f"QEMU exited {proc.returncode}: {out}")
            return bool(env.events("fw1", "schedule_complete"))

        env.wait_for(done, "the guest's schedule complete over the export's port", timeout=RUN_TIMEOUT)
        assert reassemble(env, "fw1", 0) == b"configured over the exported port\n"
        assert reassemble(env, "fw1", 1) == b"positive time\n"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        env.close()
