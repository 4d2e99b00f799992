"""Real QEMU guests (TCG) with no identity of their own, talking MQTT to a real mosquitto.

``vmr-host mqtt-config`` writes the broker config (passwords, pattern ACL, TLS) and one
settings file per VM; the generated mosquitto runs on the host's 127.0.0.1; ``vmr-host serve
--transport mqtt --credentials`` logs in as the host user. Two guests boot the **same**
kernel and initramfs with the same command line (no ``vmr.name``) and no virtio-serial port:
each gets only its ``vms/<vm>.yaml`` as the QEMU fw_cfg blob ``opt/org.vmr/config`` and a
virtio-net NIC on a restricted user network whose only way out is a ``guestfwd`` from
``10.0.2.100`` to the broker. ``/init`` loads ``qemu_fw_cfg`` and ``virtio_net``, gives eth0
10.0.2.15/24 and runs the agent without ``--vm-name``: name, broker, experiment and
credentials come from ``/sys/firmware/qemu_fw_cfg/by_name/opt/org.vmr/config/raw``.

Parametrized: ``mqtts`` (``--tls``: the guests verify the broker against the CA in the blob;
the broker certificate names 10.0.2.100) and plain ``mqtt`` (``--port``). At most 2 guests
at once; every wait is bounded; timings are printed, never asserted.
"""

from __future__ import annotations

import getpass
import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from guestlab import (
    BUILD_TIMEOUT,
    GUESTFWD_ADDR,
    QemuMqtt,
    agent_lacks_ssl,
    reassemble,
    say,
    stage_order,
    utc,
)

from tests.broker import Broker, free_port
from tests.hostenv import HostEnv

RUN_TIMEOUT = 240.0  # boot + stages + barrier, under TCG, 2 guests on 2 cores
NONUTF8 = b"pos \xff\xfe end\n"
VMS = ("vm1", "vm2")
EXPERIMENT = "qmq"

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 120)


@pytest.fixture(scope="module")
def mqtt_guest(request: pytest.FixtureRequest) -> Dict[str, Any]:
    """The session's guest, when its frozen agent can speak MQTT at all."""
    if agent_lacks_ssl():
        pytest.fail(
            "packaging/vmr-handler.spec excludes ssl: the frozen agent cannot import "
            "vmr_handler.transports.mqtt.options (it imports ssl at module level)"
        )
    return request.getfixturevalue("guest")


def _schedule(vm: str) -> List[Dict[str, Any]]:
    return [
        # stage 0 (-10): what the guest knows of itself besides the blob: nothing
        {
            "start_time": -10,
            "executable": "/bin/sh",
            "arguments": "-c 'echo cmdline: $(cat /proc/cmdline); echo hostname: $(hostname); "
            "echo ports: $(ls /dev/virtio-ports | wc -l)'",
        },
        # stage 1 (-5)
        {"start_time": -5, "executable": "sleep", "arguments": "1"},
        # 2: positive entry on both, non-UTF-8 output
        {"start_time": 1, "executable": "printf", "arguments": r"'pos \xff\xfe end\n'"},
        # 3: a break: everything later waits for a RESUME
        {"start_time": 2, "pause": True, "pause_duration": float("inf")},
        # 4: fires 10 ms (experiment time) after the RESUME
        {"start_time": 2.01, "executable": "/bin/echo", "arguments": f"after resume on {vm}"},
    ]


def _data(env: HostEnv, vm: str, type_: str, **match: Any) -> List[Dict[str, Any]]:
    return [
        r["event"]["data"]
        for r in env.events(vm, type_)
        if all(r["event"]["data"].get(k) == v for k, v in match.items())
    ]


def _cli(env: HostEnv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", *args, "--logs", str(env.logs)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _broker_connect_times(broker: Broker) -> Dict[str, float]:
    """Epoch time at which mosquitto logged each client's CONNECT (``log_timestamp``)."""
    out: Dict[str, float] = {}
    err = broker.root / "mosquitto.err"
    text = err.read_text(errors="replace") if err.exists() else ""
    for m in re.finditer(r"^(\d+(?:\.\d+)?): New client connected from \S+ as (\S+) ", text, re.M):
        out.setdefault(m.group(2), float(m.group(1)))
    return out


@pytest.mark.parametrize("scheme", ["mqtts", "mqtt"])
def test_two_fw_cfg_guests_over_mqtt(mqtt_guest: Dict[str, Any], scheme: str) -> None:
    t_test = time.monotonic()
    env = HostEnv({vm: _schedule(vm) for vm in VMS}, start_buffer=2.0)
    mq = env.root / "mq"
    port = free_port()
    tls = ["--tls", "--tls-port", str(port), "--hostname", GUESTFWD_ADDR] if scheme == "mqtts" else []
    res = subprocess.run(
        [
            sys.executable, "-m", "vmr_handler.host", "mqtt-config", "--experiment", EXPERIMENT,
            "--vms", ",".join(VMS), "--out", str(mq), *(tls or ["--port", str(port)]),
            "--broker-host", GUESTFWD_ADDR, "--user", getpass.getuser(),
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    blobs = {vm: mq / "vms" / f"{vm}.yaml" for vm in VMS}
    blob_docs = {vm: yaml.safe_load(p.read_text()) for vm, p in blobs.items()}
    for vm, doc in blob_docs.items():
        assert doc["vm_name"] == vm and doc["broker"] == f"{scheme}://{GUESTFWD_ADDR}:{port}", doc
        assert ("ca_pem" in doc) == (scheme == "mqtts")
    broker = Broker(root=mq, config=mq / "mosquitto.conf", port=port).start()
    qemus: Dict[str, QemuMqtt] = {}

    def alive() -> None:
        for q in qemus.values():
            if q.proc.poll() is not None:
                raise AssertionError(f"{q.vm}: QEMU exited {q.proc.returncode}\n{q.tail()}")

    def wait(pred: Any, what: str) -> None:
        try:
            env.wait_for(lambda: (alive(), pred())[1], what, timeout=RUN_TIMEOUT)
        except AssertionError as exc:
            logs = "\n".join(
                (env.logs / f"{vm}.log").read_text(errors="replace")[-3000:]
                for vm in VMS
                if (env.logs / f"{vm}.log").exists()
            )
            raise AssertionError(
                f"{exc}\n" + "\n".join(q.tail() for q in qemus.values()) + "\n" + logs
                + f"\n--- broker\n{broker.errors()[-3000:]}"
            ) from None  # fmt: skip

    try:
        env.start_host("--transport", "mqtt", "--credentials", str(mq / "host" / "vmr-host.yaml"))
        for vm in VMS:
            # the same kernel, initramfs and command line for both: only the blob differs
            qemus[vm] = QemuMqtt(env.root, vm, mqtt_guest["kernel"], mqtt_guest["initrd"], blobs[vm], port)
        assert qemus["vm1"].argv[qemus["vm1"].argv.index("-append") + 1] == "console=ttyS0 panic=-1 quiet"

        # ------------------------------------------------------------ up to the break
        wait(
            lambda: all(
                _data(env, vm, "break_started") and _data(env, vm, "entry_exited", index=2) for vm in VMS
            ),
            "both VMs: break started and the entry at 1 exited",
        )
        t_break = time.monotonic() - t_test

        # identity came from fw_cfg: the hello's claimed VM is the blob's vm_name
        status = env.status()
        claimed = {v["vm"]: v["agent"]["claimed_vm"] for v in status["vms"]}
        assert claimed == {vm: blob_docs[vm]["vm_name"] for vm in VMS}, claimed
        assert status["broker"].startswith(f"{scheme}://127.0.0.1:{port}"), status["broker"]
        for vm in VMS:
            log = (env.logs / f"{vm}.log").read_text(errors="replace")
            assert "agent says it is" not in log, log[-2000:]
            console = qemus[vm].console.read_text(errors="replace")
            assert "fw_cfg blob opt/org.vmr/config present" in console, console[-2000:]
            assert "eth0 10.0.2.15/24 up" in console, console[-2000:]
            # ... and nothing else in the guest names it
            probe = reassemble(env, vm, 0).decode()
            assert "cmdline: console=ttyS0 panic=-1 quiet\n" in probe, probe
            assert "hostname: vmr-guest\n" in probe and "ports: 0\n" in probe, probe

        # schedule delivered over MQTT, stages in order, one start time
        configured_rx: Dict[str, float] = {}
        for vm in VMS:
            loaded = _data(env, vm, "schedule_loaded")
            assert len(loaded) == 1, loaded
            digest = hashlib.sha256((env.schedules / f"{vm}.yaml").read_bytes()).hexdigest()
            assert loaded[0]["digest"] == digest and loaded[0]["entries"] == 5, loaded
            order = stage_order(env, vm)
            assert order == [
                ("stage_started", 0),
                ("stage_finished", 0),
                ("stage_started", 1),
                ("stage_finished", 1),
                ("configured", None),
            ], order
            configured_rx[vm] = utc(env.events(vm, "configured")[0]["host_received"])
        starts = {vm: [d["start_time"] for d in _data(env, vm, "start_time_set")] for vm in VMS}
        assert all(len(s) == 1 for s in starts.values()), starts
        start = starts["vm1"][0]
        assert starts["vm2"][0] == start, starts
        assert start >= max(configured_rx.values()) + 2.0 - 0.5, (start, configured_rx)

        # the positive entry at 1 on both; its non-UTF-8 output arrives byte-exact
        spawned: Dict[str, float] = {}
        received: Dict[str, float] = {}
        for vm in VMS:
            ent = _data(env, vm, "entry_started", index=2)
            assert len(ent) == 1 and abs(ent[0]["scheduled"] - (start + 1)) < 1e-6, ent
            spawned[vm] = ent[0]["spawned_at"]
            received[vm] = utc(
                next(
                    r["host_received"]
                    for r in env.events(vm, "entry_started")
                    if r["event"]["data"]["index"] == 2
                )
            )
            out = _data(env, vm, "output", index=2)
            assert any("line_b64" in d for d in out), out
            assert reassemble(env, vm, 2) == NONUTF8
            assert not _data(env, vm, "entry_started", index=4), vm  # held by the break
        spread = max(spawned.values()) - min(spawned.values())
        rx_spread = max(received.values()) - min(received.values())

        # ------------------------------------------------------------ RESUME --all ends the break
        time.sleep(1.0)
        assert not any(_data(env, vm, "entry_started", index=4) for vm in VMS)
        t_cli = time.time()
        res = _cli(env, "resume", "--all")
        assert res.returncode == 0, res.stdout + res.stderr
        wait(
            lambda: all(_data(env, vm, "entry_exited", index=4) for vm in VMS),
            "both: the entry after the break",
        )
        lat: Dict[str, float] = {}
        for vm in VMS:
            rr = _data(env, vm, "resume_received")
            assert len(rr) == 1 and rr[0]["ended_break"] == 3 and not rr[0]["ignored"], rr
            ent = _data(env, vm, "entry_started", index=4)[0]
            assert ent["spawned_at"] >= t_cli - 0.05, (ent, t_cli)
            lat[vm] = ent["spawned_at"] - t_cli
            assert reassemble(env, vm, 4) == f"after resume on {vm}\n".encode()
            ids = [r["event"]["id"] for r in env.events(vm)]
            assert len(ids) == len(set(ids))
        elapsed = time.monotonic() - t_test

        # ------------------------------------------------------------ timings
        connected = _broker_connect_times(broker)
        for vm in VMS:
            q = qemus[vm]
            console = q.console.read_text(errors="replace")
            m = re.search(r"uptime ([0-9.]+) s, starting vmr-handler", console)
            hello = utc(env.events(vm, "agent_started")[0]["host_received"]) - q.started
            conn = f"{connected[vm] - q.started:.1f} s" if vm in connected else "?"
            say(
                f"{scheme} {vm}: /init starts the agent at uptime {m.group(1) if m else '?'} s; "
                "QEMU start -> "
                f"broker CONNECT {conn}, -> agent_started received {hello:.1f} s, -> configured "
                f"received {configured_rx[vm] - q.started:.1f} s"
            )
        say(
            f"{scheme}: spread of the entry at 1 s: spawned_at {spread * 1000:.1f} ms (per VM "
            + ", ".join(f"{vm} {abs(spawned[vm] - start - 1) * 1000:.1f} ms" for vm in VMS)
            + f"); host receive of entry_started {rx_spread * 1000:.1f} ms"
        )
        say(
            f"{scheme}: RESUME latency (CLI call -> spawned_at of the entry 10 ms after the break): "
            + ", ".join(f"{vm} {v * 1000:.0f} ms" for vm, v in lat.items())
        )
        say(f"{scheme}: QEMU start -> both at the break {t_break:.1f} s, -> after the RESUME {elapsed:.1f} s")
    finally:
        for q in qemus.values():
            q.kill()
        if env.host is not None and env.host.poll() is None:
            env.host.terminate()
            try:
                env.host.wait(15)
            except subprocess.TimeoutExpired:
                env.host.kill()
                env.host.wait(15)
        broker.stop()
        env.close()
        say(f"{scheme}: whole test incl. teardown {time.monotonic() - t_test:.1f} s")


def test_broker_restart_guest_reconnects(mqtt_guest: Dict[str, Any]) -> None:
    """One guest at a break; mosquitto is stopped for 3 s and started again on the same port
    (persistence on). The guest's forward is ``cmd:`` (a new host connection per guest
    connection): the agent reconnects by itself, the host sees a second handshake from the
    same boot, a RESUME reaches it and ends the break, every event is logged once.
    (With the ``tcp:`` chardev forward the guest never got through again: checked by hand,
    95 s; qemu-test/README.md.)"""
    t_test = time.monotonic()
    sched = [
        {"start_time": -1, "executable": "sleep", "arguments": "0.2"},
        {"start_time": 1, "pause": True, "pause_duration": float("inf")},
        {"start_time": 1.01, "executable": "/bin/echo", "arguments": "after the broker restart"},
    ]
    env = HostEnv({"vm1": sched}, start_buffer=1.0)
    mq = env.root / "mq"
    port = free_port()
    res = subprocess.run(
        [
            sys.executable, "-m", "vmr_handler.host", "mqtt-config", "--experiment", EXPERIMENT,
            "--vms", "vm1", "--out", str(mq), "--port", str(port), "--broker-host", GUESTFWD_ADDR,
            "--user", getpass.getuser(),
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    broker = Broker(root=mq, config=mq / "mosquitto.conf", port=port).start()
    q = None

    def handshakes() -> List[str]:
        path = env.logs / "vm1.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return re.findall(r"\[host\] handshake: agent \S+ boot (\S+) ", text)

    def wait(pred: Any, what: str) -> None:
        def check() -> Any:
            if q is not None and q.proc.poll() is not None:
                raise AssertionError(f"QEMU exited {q.proc.returncode}\n{q.tail()}")
            return pred()

        try:
            env.wait_for(check, what, timeout=RUN_TIMEOUT)
        except AssertionError as exc:
            log = env.logs / "vm1.log"
            host_log = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(
                f"{exc}\n{q.tail() if q else ''}\n{host_log}\n--- broker\n{broker.errors()[-3000:]}"
            ) from None

    try:
        env.start_host("--transport", "mqtt", "--credentials", str(mq / "host" / "vmr-host.yaml"))
        q = QemuMqtt(
            env.root,
            "vm1",
            mqtt_guest["kernel"],
            mqtt_guest["initrd"],
            mq / "vms" / "vm1.yaml",
            port,
            forward="cmd",
        )
        wait(lambda: _data(env, "vm1", "break_started"), "vm1 at the break")
        assert len(handshakes()) == 1, handshakes()
        broker.stop()
        time.sleep(3.0)
        t_up = time.time()
        broker.start()
        wait(lambda: len(handshakes()) >= 2, "vm1: a second handshake after the broker restart")
        t_hs = time.time()
        boots = handshakes()
        assert len(set(boots)) == 1, boots  # the same boot: the agent reconnected, not a reboot
        res = _cli(env, "resume", "--all")
        assert res.returncode == 0, res.stdout + res.stderr
        wait(lambda: _data(env, "vm1", "entry_exited", index=2), "vm1: the entry after the break")
        rr = _data(env, "vm1", "resume_received")
        assert len(rr) == 1 and rr[0]["ended_break"] == 1 and not rr[0]["ignored"], rr
        assert reassemble(env, "vm1", 2) == b"after the broker restart\n"
        assert len(_data(env, "vm1", "agent_started")) == 1
        ids = [r["event"]["id"] for r in env.events("vm1")]
        assert len(ids) == len(set(ids))
        say(
            f"broker restart (down 3 s, forward cmd:): broker up -> second handshake logged "
            f"{t_hs - t_up:.1f} s"
        )
    finally:
        if q is not None:
            q.kill()
        if env.host is not None and env.host.poll() is None:
            env.host.terminate()
            try:
                env.host.wait(15)
            except subprocess.TimeoutExpired:
                env.host.kill()
                env.host.wait(15)
        broker.stop()
        env.close()
        say(f"broker restart test incl. teardown {time.monotonic() - t_test:.1f} s")


def test_blob_path_is_the_agents_default() -> None:
    """The fw_cfg name QEMU is given here is the one the agent reads by default."""
    from guestlab import FW_CFG_NAME as LAB_NAME

    from vmr_handler.agent.cli.commandline import DEFAULT_FW_CFG
    from vmr_handler.host.cli.mqtt_config.layout import FW_CFG_NAME

    assert LAB_NAME == FW_CFG_NAME
    assert Path(DEFAULT_FW_CFG) == Path("/sys/firmware/qemu_fw_cfg/by_name") / FW_CFG_NAME / "raw"
