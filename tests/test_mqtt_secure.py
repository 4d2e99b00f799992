"""A secured MQTT experiment end to end: what an operator deploys.

``vmr-host mqtt-config --tls`` writes the broker config, password file, ACL, CA and per-VM
credential files; a real mosquitto runs that config; ``vmr-host serve`` logs in with the host
credentials; each agent gets its identity and credentials only from its per-VM file, read
the way a guest reads a QEMU fw_cfg blob (``--fw-cfg``), never from flags or a shared image.
Then a VM's credentials are tried against another VM's topics through the real agent: the
broker refuses, and the other VM's experiment is untouched.
"""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.broker import Broker, free_port
from tests.hostenv import HostEnv

SCHED = [
    {"start_time": -1, "executable": "sleep", "arguments": "0.3"},
    {"start_time": 1, "executable": "/bin/echo", "arguments": "secured"},
]


@pytest.fixture(params=["password", "client-certs"])
def secured(request) -> Iterator[tuple]:
    """A broker from ``mqtt-config --tls`` (passwords; or passwords + client certificates,
    carried inline as ``cert_pem``/``key_pem`` in the per-VM and host files)."""
    env = HostEnv({"a": SCHED, "b": SCHED}, start_buffer=1.0)
    out = env.root / "mq"
    tls_port = free_port()
    certs = ["--client-certs"] if request.param == "client-certs" else []
    res = subprocess.run(
        [
            sys.executable, "-m", "vmr_handler.host", "mqtt-config", "--experiment", "sec",
            "--vms", "a,b", "--out", str(out), "--tls", "--tls-port", str(tls_port),
            "--user", getpass.getuser(), *certs,
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    broker = Broker(root=out, config=out / "mosquitto.conf", port=tls_port).start()
    env.broker = broker
    yield env, out
    env.close()
    broker.close()


def _agent(env: HostEnv, vm: str, blob: Path) -> None:
    """An agent with no identity flags: name, broker, experiment, credentials, CA from ``blob``."""
    base = env.root / "vm" / vm
    base.mkdir(parents=True, exist_ok=True)
    log = open(base / "agent.out", "ab")  # noqa: SIM115 - owned by the process
    env.agents[vm] = subprocess.Popen(
        [
            sys.executable, "-m", "vmr_handler", "run", "--fw-cfg", str(blob),
            "--state-dir", str(base / "state"), "--launch-dir", str(base / "launch"),
        ],
        stdout=log, stderr=log,
    )  # fmt: skip
    log.close()


def test_tls_acl_and_per_vm_credentials_from_the_fw_cfg_blob(secured) -> None:
    env, out = secured
    blob_a = yaml.safe_load((out / "vms" / "a.yaml").read_text())
    assert blob_a["broker"].startswith("mqtts://") and "BEGIN CERTIFICATE" in blob_a["ca_pem"]
    host_creds = next((out / "host").glob("*.yaml"))
    log = open(env.root / "host.out", "ab")  # noqa: SIM115
    env.host = subprocess.Popen(
        [
            sys.executable, "-m", "vmr_handler.host", "serve", "--schedules", str(env.schedules),
            "--logs", str(env.logs), "--start-buffer", "1", "--transport", "mqtt",
            "--credentials", str(host_creds), "--host-id", "h1",
        ],
        stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    env.wait_for(lambda: (env.logs / "vmr-host.sock").exists(), "host control socket")
    _agent(env, "a", out / "vms" / "a.yaml")
    _agent(env, "b", out / "vms" / "b.yaml")
    for vm in ("a", "b"):
        assert env.wait_event(vm, "output", index=1)["event"]["data"]["line"] == "secured"
    starts = {env.wait_event(vm, "entry_started", index=1)["event"]["data"]["scheduled"] for vm in "ab"}
    assert len(starts) == 1
    assert "mqtts://" in env.status()["broker"]

    # a's credentials, claiming to be b: the broker lets the client in (as a: the client id is
    # the username, so it takes a's place), but every topic of b is refused by the ACL and
    # b's log gets nothing from it
    env.agents["a"].terminate()
    env.agents["a"].wait(30)
    evil = dict(blob_a, vm_name="b")
    evil_blob = env.root / "evil.yaml"
    evil_blob.write_text(yaml.safe_dump(evil))
    before = len(env.events("b"))
    _agent(env, "evil", evil_blob)
    refused = "Not authorized on vmr/sec/b/"
    env.wait_for(lambda: refused in env.agent_log("evil"), "the broker refusing b's topics")
    assert len(env.events("b")) == before
    assert not env.events("evil")

    # a wrong password is refused at connect, with a clear error, and the agent keeps trying
    wrong = dict(blob_a, password="not-the-password")
    wrong_blob = env.root / "wrong.yaml"
    wrong_blob.write_text(yaml.safe_dump(wrong))
    _agent(env, "wrong", wrong_blob)
    env.wait_for(lambda: "refused the connection" in env.agent_log("wrong"), "connection refused")
    assert env.agents["wrong"].poll() is None


def test_tls_with_another_ca_is_refused(secured) -> None:
    env, out = secured
    blob = yaml.safe_load((out / "vms" / "a.yaml").read_text())
    other = env.root / "other"
    res = subprocess.run(
        [
            sys.executable, "-m", "vmr_handler.host", "mqtt-config", "--experiment", "x", "--vms", "a",
            "--out", str(other), "--tls", "--user", getpass.getuser(),
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    blob["ca_pem"] = yaml.safe_load((other / "vms" / "a.yaml").read_text())["ca_pem"]
    path = env.root / "otherca.yaml"
    path.write_text(yaml.safe_dump(blob))
    _agent(env, "a", path)
    env.wait_for(lambda: "TLS certificate not trusted" in env.agent_log("a"), "certificate refusal")
    assert env.agents["a"].poll() is None  # it keeps trying: the operator may fix the broker
