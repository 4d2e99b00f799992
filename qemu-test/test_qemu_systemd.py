"""A real systemd guest: Debian 12 debootstrap'd root filesystem, agent baked by ``images/bake``.

``qemu-test/build-systemd-guest.sh`` makes an ext4 disk image of a ``debootstrap --variant=minbase``
bookworm root filesystem (systemd, udev, kmod, the cloud kernel's modules) into which
``images/bake`` installed the frozen agent, ``vmr-handler.service`` (enabled) and
``90-vmr-handler.rules``. Nothing in the guest starts the agent but those two: no ``/init`` of
ours runs after ``switch_root`` to systemd, and udev in the guest loads ``virtio_console``
itself. The guest plays a schedule with a real ``vmr-host serve``; every assertion is on the
host's logs (``<logs>/<vm>.jsonl`` and the ``[host]`` notes in ``<vm>.log``).

Then the port is unplugged and plugged again through QEMU's QMP socket, with the guest running:
the unit (``BindsTo=`` the port's device) stops the agent, and the udev rule alone starts it
again (nothing else wants the unit any more once the boot is over; ``NRestarts`` stays 0). The
restarted agent resumes from its journal on the same boot and plays the rest of the schedule.

Before that, in stage 0, an entry (R) asks for a reboot (exit code 10) after adding a tmpfs on
``/var/launch`` to ``/etc/fstab`` (the disk is a snapshot: the change lives as long as QEMU).
The guest really reboots (QEMU runs without ``-no-reboot``), systemd mounts the empty tmpfs
on the launch dir before it starts the unit, and the journal on the disk still says every
entry's data was placed: R runs again with its data, the next stage's entry (no data) gets its
working dir back, and the positive entries find their data, placed again by the agent and
reported so (``data_placed``, ``outcome: restored``, "rebooted").

Every wait is bounded; timings are printed in "qemu-test timings", never asserted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from guestlab import BUILD_TIMEOUT, HERE, PORT_NAME, REPO, reassemble, say, stage_order, utc

from tests.hostenv import HostEnv

VM = "vm1"
BOOT_TIMEOUT = 420.0  # QEMU start -> two boots -> the positive entry at +1 (TCG: ~40-60 s a boot)
REPLUG_TIMEOUT = 180.0  # port back -> the entry after the replug has run
UNPLUGGED_FOR = 8.0  # seconds the port stays away
AFTER_REPLUG_AT = 30  # experiment time of the entry that must run after the replug
UNIT_CGROUP = "0::/system.slice/vmr-handler.service"

pytestmark = pytest.mark.timeout(2 * BUILD_TIMEOUT + BOOT_TIMEOUT + REPLUG_TIMEOUT + 120)

# Printed by entry 0 (stage 0) and entry 3 (after the replug) inside the guest: who runs the agent.
PROBE = r"""echo "cgroup $(cat /proc/self/cgroup)"
echo "pid1 $(cat /proc/1/comm)"
echo "port $(readlink -f /dev/virtio-ports/org.vmr.handler.0)"
udevadm info -q property -n /dev/virtio-ports/org.vmr.handler.0 | sed -n 's/^SYSTEMD_WANTS=/wants /p'
echo "restarts $(systemctl show -p NRestarts --value vmr-handler.service)"
echo "active $(systemctl is-active vmr-handler.service)"
echo "started $(journalctl -b -o cat -u vmr-handler.service | grep -c '^Started vmr-handler.service')"
echo "agent_start_us $(systemctl show -p ExecMainStartTimestampMonotonic --value vmr-handler.service)"
echo "uptime $(cut -d' ' -f1 /proc/uptime)"
echo "copies $(ls -d /var/lib/vmr-handler/tmp/_MEI* 2>/dev/null | wc -l)"
echo "tmpdir ${TMPDIR-unset}"
echo "launchfs $(stat -f -c %T /var/launch)"
"""
#: R (entry 4, stage 0): its first run puts a tmpfs on /var/launch from the next boot on and asks
#: for a reboot; it counts its runs on the disk (/root) and prints the file it drops.
REQUESTER = (
    "echo r >> /root/r.runs; n=$(wc -l < /root/r.runs); echo R $n $(cat r.txt); "
    'if [ $n -eq 1 ]; then echo "tmpfs /var/launch tmpfs mode=755 0 0" >> /etc/fstab; exit 10; fi'
)


def _schedule() -> List[Dict[str, Any]]:
    return [
        # stage 0 (-20): drop the probe and run it: the agent's cgroup, PID 1, the udev properties
        {
            "start_time": -20,
            "executable": "/bin/sh",
            "arguments": "probe.sh",
            "data": [{"location": "probe.sh", "content": PROBE}],
        },
        # stage 1 (-10): a second configuration stage (no data: its working dir is made again)
        {"start_time": -10, "executable": "sleep", "arguments": "1"},
        # positive time: one entry at +1 (before the unplug), one after the replug
        {
            "start_time": 1,
            "executable": "cat",
            "arguments": "positive.txt",
            "data": [{"location": "positive.txt", "content": f"positive on {VM}\n"}],
        },
        {
            "start_time": AFTER_REPLUG_AT,
            "executable": "/bin/sh",
            "arguments": "probe.sh",
            "data": [{"location": "probe.sh", "content": PROBE}],
        },
        # 4 = R, stage 0 too: the reboot onto a tmpfs launch dir
        {
            "start_time": -20,
            "executable": "/bin/sh",
            "arguments": f"-c '{REQUESTER}'",
            "data": [{"location": "r.txt", "content": "data-r\n"}],
        },
    ]


def _agent_dir(guest: Dict[str, Any]) -> Path:
    """The single file the session fixture built (``guestlab.build_guest`` puts it next to the guest)."""
    if guest.get("agent"):
        return Path(guest["agent"])
    return Path(guest["kernel"]).resolve().parent.parent / "dist" / "vmr-handler"


@pytest.fixture(scope="module")
def systemd_guest(guest: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """``build-systemd-guest.sh`` with the session's frozen agent: ``{"kernel", "initrd", "disk", ...}``."""
    if os.geteuid() != 0:
        pytest.skip("build-systemd-guest.sh needs root (debootstrap, chroot); CI runs as root")
    agent = _agent_dir(guest)
    if not agent.is_file():
        pytest.fail(f"no frozen agent at {agent} (guestlab.build_guest's layout changed?)")
    work = Path(tempfile.mkdtemp(prefix="vmr-qemu-sd."))
    t0 = time.monotonic()
    res = subprocess.run(
        [
            "bash",
            str(HERE / "build-systemd-guest.sh"),
            os.environ.get("VMR_QEMU_CACHE", str(HERE / ".cache")),
            str(agent),
        ],
        capture_output=True,
        text=True,
        timeout=2 * BUILD_TIMEOUT,
        env={**os.environ, "VMR_GUEST_OUT": str(work / "guest")},
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    if res.returncode != 0:
        pytest.fail(f"build-systemd-guest.sh failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}")
    elapsed = time.monotonic() - t0
    out = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    steps = [ln.split(": ", 1)[1] for ln in res.stderr.splitlines() if ln.startswith("build-systemd-guest: ")]
    say(f"systemd guest build {elapsed:.1f} s: " + "; ".join(steps))
    yield {"kernel": out["KERNEL"], "initrd": out["INITRD"], "disk": out["DISK"], "build": elapsed}
    shutil.rmtree(work, ignore_errors=True)


class Qmp:
    """A minimal QMP client (QEMU's JSON machine protocol) on a unix socket."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        """Connect (the socket appears a few ms after QEMU starts) and leave capabilities mode."""
        deadline = time.monotonic() + timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            try:
                self.sock.connect(str(path))
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.file = self.sock.makefile("rw", encoding="utf-8")
        greeting = json.loads(self.file.readline())
        assert "QMP" in greeting, greeting
        self.events: List[Dict[str, Any]] = []
        self.command("qmp_capabilities")

    def command(self, execute: str, **arguments: Any) -> Any:
        """Run one command; its ``return`` value (an ``error`` fails the test). Events are kept."""
        msg: Dict[str, Any] = {"execute": execute}
        if arguments:
            msg["arguments"] = arguments
        self.file.write(json.dumps(msg) + "\n")
        self.file.flush()
        while True:
            reply = json.loads(self.file.readline())
            if "event" in reply:
                self.events.append(reply)
                continue
            assert "error" not in reply, (execute, arguments, reply)
            return reply["return"]

    def close(self) -> None:
        """Close the connection (QEMU keeps running)."""
        self.file.close()
        self.sock.close()


class SystemdQemu:
    """The systemd guest: QEMU as the client of vmr-host's channel socket, a QMP socket beside it."""

    def __init__(self, env: HostEnv, guest: Dict[str, Any]) -> None:
        """Boot ``guest`` (kernel, initramfs, disk image opened with ``snapshot=on``)."""
        self.console = env.root / f"{VM}.console"
        self.out = env.root / f"{VM}.qemu"
        self.qmp_path = env.root / "qmp.sock"
        cmd = [
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-m",
            "1024",
            "-smp",
            "2",  # MTTCG: systemd starts services in parallel (one guest at a time here)
            "-nographic",  # no -no-reboot: a guest reboot boots it again (the disk snapshot stays)
            "-nic",
            "none",
            "-monitor",
            "none",
            "-serial",
            f"file:{self.console}",
            "-qmp",
            f"unix:{self.qmp_path},server=on,wait=off",
            "-kernel",
            guest["kernel"],
            "-initrd",
            guest["initrd"],
            "-append",
            "console=ttyS0 panic=-1 root=/dev/vda quiet systemd.show_status=1",
            "-drive",
            f"file={guest['disk']},format=raw,if=virtio,snapshot=on",
            "-chardev",
            f"socket,id=c0,path={env.sock(VM)},reconnect=1",
            "-device",
            "virtio-serial-pci,id=vser0",
            "-device",
            f"virtserialport,bus=vser0.0,chardev=c0,name={PORT_NAME},id=port0",
        ]
        self.started = time.time()
        with open(self.out, "wb") as log, open(os.devnull, "rb") as null:
            self.proc = subprocess.Popen(cmd, stdin=null, stdout=log, stderr=log)
        self.qmp: Optional[Qmp] = None

    def monitor(self) -> Qmp:
        """The QMP connection (opened on first use)."""
        if self.qmp is None:
            self.qmp = Qmp(self.qmp_path)
        return self.qmp

    def unplug_port(self) -> None:
        """Hot-unplug the virtio-serial port (the chardev stays, connected to vmr-host)."""
        self.monitor().command("device_del", id="port0")

    def plug_port(self) -> None:
        """Hot-plug the port again, same chardev and name."""
        self.monitor().command(
            "device_add", driver="virtserialport", bus="vser0.0", chardev="c0", name=PORT_NAME, id="port0"
        )

    def tail(self) -> str:
        """The end of QEMU's output and of the serial console."""
        text = ""
        for p in (self.out, self.console):
            if p.exists():
                text += f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
        return text

    def kill(self) -> None:
        """SIGKILL QEMU (by PID) and reap it."""
        if self.qmp is not None:
            self.qmp.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def _probe(env: HostEnv, index: int) -> Dict[str, str]:
    """The ``key value`` lines the probe printed in entry ``index``."""
    text = reassemble(env, VM, index).decode(errors="replace")
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def _entry_started(env: HostEnv, index: int) -> Dict[str, Any]:
    """The data of entry ``index``'s first ``entry_started``."""
    return next(
        r["event"]["data"] for r in env.events(VM, "entry_started") if r["event"]["data"]["index"] == index
    )


def _handshake_boots(env: HostEnv) -> List[str]:
    """The agent boot id of every handshake, from the host's notes in ``<vm>.log``."""
    path = env.logs / f"{VM}.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return re.findall(r"^\S+ \[host\] handshake: agent \S+ boot (\S+)", text, re.M)


def test_systemd_unit_and_udev_rule_start_the_agent(systemd_guest: Dict[str, Any]) -> None:
    """Boot, schedule, barrier and positive entries under systemd; unplug/replug restarts the agent."""
    t_test = time.monotonic()
    schedule = _schedule()
    env = HostEnv({VM: schedule}, start_buffer=2.0)
    qemu: Optional[SystemdQemu] = None
    try:
        env.start_host()
        qemu = SystemdQemu(env, systemd_guest)
        q = qemu

        def alive() -> None:
            if q.proc.poll() is not None:
                raise AssertionError(f"QEMU exited {q.proc.returncode}\n{q.tail()}")
            failed = env.events(VM, "entry_failed")  # e.g. started in a missing working dir
            if failed:
                raise AssertionError(f"an entry failed: {[r['event']['data'] for r in failed]}")

        def exited(index: int) -> bool:
            alive()
            return any(r["event"]["data"]["index"] == index for r in env.events(VM, "entry_exited"))

        def wait(pred: Any, what: str, timeout: float) -> None:
            try:
                env.wait_for(pred, what, timeout=timeout)
            except AssertionError as exc:
                log = env.logs / f"{VM}.log"
                raise AssertionError(
                    f"{exc}\n{q.tail()}\n" + (log.read_text(errors="replace")[-4000:] if log.exists() else "")
                ) from None

        # ------------------------------------------------------------ boot: the unit starts the agent
        # (R asks for a reboot in stage 0; the unit starts the agent again in the second boot)
        wait(lambda: exited(2), "the positive entry at +1 has run", BOOT_TIMEOUT)
        t_booted = time.monotonic() - t_test
        booted = env.events(VM, "agent_started")
        assert len(booted) == 2, booted
        first = booted[0]
        assert first["event"]["data"]["resumed_from_journal"] is False, first
        assert booted[1]["event"]["data"]["resumed_from_journal"] is True, booted[1]
        hello_after = utc(first["host_received"]) - q.started
        rebooted_after = utc(booted[1]["host_received"]) - utc(first["host_received"])

        loaded = env.events(VM, "schedule_loaded")
        assert len(loaded) == 2, loaded  # once per boot (the second from the stored schedule)
        digest = hashlib.sha256((env.schedules / f"{VM}.yaml").read_bytes()).hexdigest()
        for one in loaded:
            assert one["event"]["data"]["digest"] == digest  # delivered over the real port
            assert one["event"]["data"]["entries"] == len(schedule)

        placed = [r["event"]["data"] for r in env.events(VM, "data_placed")]
        assert any(d["index"] == 0 and d["location"] == "probe.sh" for d in placed), placed
        boot_probe = _probe(env, 0)
        assert boot_probe.get("cgroup") == UNIT_CGROUP, boot_probe  # the agent runs as the unit
        assert boot_probe.get("pid1") == "systemd", boot_probe
        assert re.fullmatch(r"/dev/vport\d+p1", boot_probe.get("port", "")), boot_probe  # made by udev
        assert boot_probe.get("wants") == "vmr-handler.service", boot_probe  # the rule matched the port
        assert boot_probe.get("active") == "active" and boot_probe.get("restarts") == "0", boot_probe
        # the single file unpacked once, where the unit's TMPDIR says; entries do not see that TMPDIR
        assert boot_probe.get("copies") == "1" and boot_probe.get("tmpdir") == "unset", boot_probe
        assert boot_probe.get("launchfs") != "tmpfs", boot_probe  # the first boot: on the disk

        # ------------------------------------------------------------ the reboot onto a tmpfs launch dir
        requested = [r["event"]["data"] for r in env.events(VM, "reboot_requested")]
        assert len(requested) == 1 and requested[0]["requesters"] == [4], requested
        assert reassemble(env, VM, 4) == b"R 1 data-r\nR 2 data-r\n"  # ran again, with its data
        assert not env.events(VM, "entry_failed"), env.events(VM, "entry_failed")
        restored = {
            r["event"]["data"]["index"]: r["event"]["data"]
            for r in env.events(VM, "data_placed")
            if r["event"]["data"]["outcome"] == "restored"
        }
        assert sorted(restored) == [2, 3, 4], restored  # what was still to run; entry 0 had run
        for d in restored.values():
            assert d["preloaded"] is True and "rebooted since" in d["details"], d

        assert stage_order(env, VM) == [
            ("stage_started", 0),
            ("stage_finished", 0),  # then the reboot: R alone runs stage 0 again
            ("stage_started", 0),
            ("stage_finished", 0),
            ("stage_started", 1),
            ("stage_finished", 1),
            ("configured", None),
        ]
        starts = [r["event"]["data"] for r in env.events(VM, "start_time_set")]
        assert len(starts) == 1 and starts[0]["source"] == "host", starts
        start = starts[0]["start_time"]
        configured_rx = utc(env.events(VM, "configured")[0]["host_received"])
        assert start >= configured_rx + 2.0 - 0.5, (start, configured_rx)
        positive = _entry_started(env, 2)
        assert abs(positive["scheduled"] - (start + 1)) < 1e-6, positive
        assert reassemble(env, VM, 2) == f"positive on {VM}\n".encode()

        # ------------------------------------------------------------ unplug: BindsTo stops the agent
        t_unplug = time.time()
        q.unplug_port()
        time.sleep(UNPLUGGED_FOR)
        alive()
        assert not any(r["event"]["data"]["index"] == 3 for r in env.events(VM, "entry_started"))
        # ------------------------------------------------------------ replug: the udev rule starts it
        t_plug = time.time()
        q.plug_port()
        wait(lambda: exited(3), "the entry after the replug has run", REPLUG_TIMEOUT)

        stopped = [
            r["event"] for r in env.events(VM, "agent_stopped") if r["event"]["timestamp"] > t_unplug - 1.0
        ]
        assert len(stopped) == 1 and "SIGTERM" in stopped[0]["data"]["reason"], stopped
        # the agent stopped while the port was away (agent clock, host-corrected; ~ms after the
        # device_del), not at the replug; its report arrived through the new connection
        assert t_unplug - 1.0 < stopped[0]["timestamp"] < t_plug - 1.0, (t_unplug, stopped, t_plug)
        started = env.events(VM, "agent_started")[1:]  # the second boot's, then the replug's
        assert len(started) == 2, started
        assert started[1]["event"]["data"]["resumed_from_journal"] is True, started[1]
        assert utc(started[1]["host_received"]) > t_plug
        boots = _handshake_boots(env)
        assert len(boots) == 3 and boots[0] != boots[1] == boots[2], boots  # a reboot, then a restart
        after = _probe(env, 3)
        assert after.get("cgroup") == UNIT_CGROUP, after
        # started twice by systemd in this boot, and not by Restart= (NRestarts counts those)
        assert after.get("started") == "2" and after.get("restarts") == "0", after
        assert after.get("copies") == "1", after  # the stopped agent's copy went with it
        assert after.get("wants") == "vmr-handler.service", after
        assert after.get("port", "").startswith("/dev/vport"), after
        assert after.get("launchfs") == "tmpfs", after  # the second boot: the launch dir on a tmpfs
        starts = [r["event"]["data"] for r in env.events(VM, "start_time_set")]
        assert [s["start_time"] for s in starts] == [start, start], starts  # kept from the journal
        late = _entry_started(env, 3)
        assert abs(late["scheduled"] - (start + AFTER_REPLUG_AT)) < 1e-6, late

        # ------------------------------------------------------------ nothing ran twice
        ran = sorted(r["event"]["data"]["index"] for r in env.events(VM, "entry_started"))
        assert ran == [0, 1, 2, 3, 4, 4], ran
        assert not env.events(VM, "entry_interrupted")
        wait(lambda: env.events(VM, "schedule_complete"), "schedule_complete", 60.0)
        ids = [r["event"]["id"] for r in env.events(VM)]
        assert len(ids) == len(set(ids))

        agent_start_s = int(boot_probe.get("agent_start_us", "0") or 0) / 1e6
        say(
            f"systemd guest: QEMU start -> agent_started received {hello_after:.1f} s (systemd started "
            f"the unit at guest uptime {agent_start_s:.1f} s, the probe ran at {boot_probe.get('uptime')}); "
            f"reboot onto the tmpfs launch dir: first -> second agent_started {rebooted_after:.1f} s; "
            f"-> positive entry done {t_booted:.1f} s"
        )
        say(
            f"systemd guest: port unplug -> agent_stopped {stopped[0]['timestamp'] - t_unplug:.2f} s; "
            f"replug -> agent_started received {utc(started[1]['host_received']) - t_plug:.1f} s; "
            f"entry at +{AFTER_REPLUG_AT} lateness {late['lateness'] * 1000:.0f} ms"
        )
    finally:
        if qemu is not None:
            qemu.kill()
        env.close()
        say(f"systemd guest test incl. teardown: {time.monotonic() - t_test:.1f} s")
