"""VM-resource files over HTTP(S): a real ``vmr-host serve --http`` and real agents.

The agent learns each resource's ``url`` and its VM's token from the schedule event and
fetches with ``requests`` (resumable, sha256 checked against the schedule); refusals are
checked with direct ``requests`` calls against the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests import test_connected
from tests.broker import free_port
from tests.hostenv import HostEnv, write_pki

MB = 1024 * 1024
#: the contract fixtures of test_connected: each experiment over unix sockets and MQTT / unix only
env_factory = test_connected.env_factory
unix_env_factory = test_connected.unix_env_factory


def _drop(name: str, start: float = -5) -> dict:
    return {"start_time": start, "data": [{"location": name, "filename": name}]}


def _start_http_host(env: HostEnv, *extra: str) -> str:
    """Start the host with ``--http 127.0.0.1:<free port>``; the base URL. A port free when
    picked can be taken by another process before the host listens (tests run side by side):
    the host then exits saying so, and it is started again on another port (3 tries)."""
    for attempt in range(3):
        port = free_port()
        try:
            env.start_host("--http", f"127.0.0.1:{port}", *extra)
        except AssertionError as exc:
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
            continue
        return f"http://127.0.0.1:{port}"
    raise AssertionError("unreachable")


def _tokens(env: HostEnv) -> dict:
    return json.loads((env.logs / "http-tokens.json").read_text())["tokens"]


def _vm_log(env: HostEnv, vm: str) -> str:
    path = env.logs / f"{vm}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_20mb_resource_over_http(env_factory):
    env = env_factory(
        {"a": [_drop("big.bin"), {"start_time": 1, "executable": "/bin/true"}]}, start_buffer=0.5
    )
    data = os.urandom(20 * MB)
    (env.resources / "big.bin").write_bytes(data)
    _start_http_host(env)
    env.start_agent("a")
    placed = env.wait_event("a", "data_placed", index=0)["event"]["data"]
    assert placed["size"] == len(data)
    assert placed["sha256"] == hashlib.sha256(data).hexdigest()
    # it came over HTTP (logged by the host in the VM's log), not in resource_chunk events
    assert f"http: GET 'big.bin' 200 {len(data)} bytes sent" in _vm_log(env, "a")
    vm = env.status()["vms"][0]
    assert vm["resources"] == {"served": 1, "refused": 0}
    # the agent kept the url and token for a restart, readable by its owner only
    saved = env.state("a") / "resources.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    info = json.loads(saved.read_text())["big.bin"]
    assert info["url"].endswith("/r/a/big.bin") and info["token"] == _tokens(env)["a"]


def test_dropped_download_resumes_with_a_range(unix_env_factory):
    env = unix_env_factory({"a": [_drop("big.bin")]}, start_buffer=0.5)
    data = os.urandom(20 * MB)
    (env.resources / "big.bin").write_bytes(data)
    _start_http_host(env, "--http-debug-rate", str(4 * MB))  # about 5 s for the file
    first = env.start_agent("a")
    parts = env.state("a") / "resources"
    env.wait_for(lambda: any(p.stat().st_size > 3 * MB for p in parts.glob("*.part")), "3 MB of the download")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    kept = max(p.stat().st_size for p in parts.glob("*.part"))
    assert 0 < kept < len(data)
    env.start_agent("a")
    placed = env.wait_event("a", "data_placed", index=0)["event"]["data"]
    assert placed["sha256"] == hashlib.sha256(data).hexdigest()
    log = _vm_log(env, "a")
    assert "interrupted after" in log
    ranges = [line for line in log.splitlines() if "http: GET 'big.bin' 206 bytes " in line]
    assert ranges, log[-3000:]
    start = int(ranges[-1].split(" 206 bytes ")[1].split("-")[0])
    assert start >= kept > 0
    assert f"-{len(data) - 1}/{len(data)} sent" in ranges[-1]


def test_refusals_ranges_and_tokens(unix_env_factory, tmp_path: Path):
    outside = tmp_path / "secret.txt"
    outside.write_text("not for guests\n")
    env = unix_env_factory(
        {
            "a": [_drop("a.bin"), _drop("link.txt", -4), _drop("gone.bin", -3), _drop("slow.bin", -2)],
            "b": [_drop("b.bin")],
        }
    )
    a_data, b_data = os.urandom(100_000), b"b's file\n"
    (env.resources / "a.bin").write_bytes(a_data)
    (env.resources / "b.bin").write_bytes(b_data)
    (env.resources / "slow.bin").write_bytes(bytes(8 * MB))  # 8 s at the debug rate
    (env.resources / "link.txt").symlink_to(outside)  # named by a's schedule, leads out
    # gone.bin and link.txt cannot be served: on purpose (serve refuses to start without the flag)
    base = _start_http_host(env, "--http-debug-rate", str(MB), "--allow-missing-resources")
    tokens = _tokens(env)
    assert stat.S_IMODE((env.logs / "http-tokens.json").stat().st_mode) == 0o600
    assert tokens["a"] != tokens["b"] and len(tokens["a"]) >= 40

    def get(path: str, token: str = tokens["a"], **headers: str) -> requests.Response:
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return requests.get(base + path, headers=headers, timeout=30)

    assert get("/r/a/a.bin", "").status_code == 401
    assert get("/r/a/a.bin", "x" + tokens["a"]).status_code == 401
    assert get("/r/b/b.bin").status_code == 403  # a's token, b's resource
    assert get("/r/a/b.bin").status_code == 403  # not named by a's schedule
    assert get("/r/a/%2e%2e/sch/a.yaml").status_code == 403  # path escape
    assert get("/r/a/link.txt").status_code == 403  # a symlink out of --resources
    assert get("/r/a/gone.bin").status_code == 404
    assert get("/elsewhere").status_code == 404
    assert get("/r/b/b.bin", tokens["b"]).content == b_data
    whole = get("/r/a/a.bin")
    assert whole.status_code == 200 and whole.content == a_data
    assert whole.headers["ETag"] == f'"{hashlib.sha256(a_data).hexdigest()}"'
    part = get("/r/a/a.bin", Range="bytes=60000-")
    assert part.status_code == 206 and part.content == a_data[60000:]
    assert part.headers["Content-Range"] == f"bytes 60000-{len(a_data) - 1}/{len(a_data)}"
    assert get("/r/a/a.bin", Range="bytes=10-19").content == a_data[10:20]
    assert get("/r/a/a.bin", Range=f"bytes={len(a_data)}-").status_code == 416
    head = requests.head(base + "/r/a/a.bin", headers={"Authorization": f"Bearer {tokens['a']}"}, timeout=30)
    assert head.status_code == 200 and head.headers["Content-Length"] == str(len(a_data)) and not head.content
    log_a = _vm_log(env, "a")
    assert "not this VM's" in log_a and "not a filename drop" in log_a and "outside" in log_a

    # at most Limits.resource_streams (2) downloads per VM at once; the rest are told to retry
    held = [
        requests.get(
            base + "/r/a/slow.bin",
            headers={"Authorization": f"Bearer {tokens['a']}"},
            stream=True,
            timeout=30,
        )
        for _ in range(2)
    ]
    try:
        env.wait_for(lambda: get("/r/a/a.bin").status_code == 503, "a busy answer", timeout=10)
        assert get("/r/b/b.bin", tokens["b"]).status_code == 200  # other VMs are not held up
    finally:
        for r in held:
            r.close()

    # a restarted host keeps the tokens (agents only learn them with the schedule)
    env.host.send_signal(signal.SIGTERM)
    env.host.wait(timeout=30)
    base = _start_http_host(env, "--allow-missing-resources")
    assert _tokens(env) == tokens
    assert get("/r/a/a.bin").content == a_data


def test_sha256_mismatch_is_refused_by_the_agent(unix_env_factory):
    env = unix_env_factory({"a": [_drop("tool.bin")]}, start_buffer=0.5)
    (env.resources / "tool.bin").write_bytes(b"version 1\n")
    _start_http_host(env)  # announces the sha256 of version 1 with the schedule
    (env.resources / "tool.bin").write_bytes(b"version 2, changed afterwards\n")
    env.start_agent("a")
    warning = env.wait_event("a", "schedule_warning")["event"]["data"]
    assert "sha256 mismatch" in warning["details"] and "tool.bin" in warning["details"]
    failed = env.wait_event("a", "entry_failed", index=0)["event"]["data"]
    assert "tool.bin" in str(failed)
    assert not env.events("a", "data_placed")
    assert not list((env.state("a") / "resources").glob("*.part"))  # a wrong download is deleted


def test_http_flags_are_checked(unix_env_factory):
    env = unix_env_factory({"a": [_drop("x")]})
    for flags, words in [
        (["--http", "127.0.0.1"], "HOST:PORT"),
        (["--http", "0.0.0.0:8080"], "--http-url"),
        (["--http-url", "http://h:1"], "need --http"),
        (["--http", "127.0.0.1:8080", "--http-key", "k.pem"], "--http-cert"),
        (["--http", "127.0.0.1:8080", "--http-url", "ftp://h/"], "http[s]://"),
    ]:
        res = env.cli("serve", "--schedules", str(env.schedules), *flags)
        assert res.returncode == 2, (flags, res.stderr)
        assert words in res.stderr, (flags, res.stderr)


def test_host_restart_announces_the_same_token_to_a_running_agent(unix_env_factory):
    """An agent whose download broke because the host went away finishes it from the restarted
    host (same token, same URL)."""
    env = unix_env_factory({"a": [_drop("big.bin")]}, start_buffer=0.5)
    data = os.urandom(12 * MB)
    (env.resources / "big.bin").write_bytes(data)
    port = free_port()
    env.start_host("--http", f"127.0.0.1:{port}", "--http-debug-rate", str(4 * MB))
    env.start_agent("a")
    parts = env.state("a") / "resources"
    env.wait_for(lambda: any(p.stat().st_size > 2 * MB for p in parts.glob("*.part")), "2 MB downloaded")
    env.kill_host()
    time.sleep(1.0)
    env.start_host("--http", f"127.0.0.1:{port}")
    placed = env.wait_event("a", "data_placed", index=0)["event"]["data"]
    assert placed["sha256"] == hashlib.sha256(data).hexdigest()
    assert " 206 bytes " in _vm_log(env, "a")


def test_schedule_event_carries_url_and_token_signed(unix_env_factory, tmp_path: Path):
    """With a signing key the url, token and sha256 the agent relies on are signed."""
    keys = tmp_path / "keys"
    env = unix_env_factory({"a": [_drop("f.txt")]}, start_buffer=0.5)
    res = subprocess.run(
        [sys.executable, "-m", "vmr_handler.host", "keygen", "--out", str(keys)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    (env.resources / "f.txt").write_text("hello\n")
    _start_http_host(env, "--signing-key", str(keys / "host.key"))
    env.start_agent("a", "--public-key", str(keys / "host.pub"))
    placed = env.wait_event("a", "data_placed", index=0)["event"]["data"]
    assert placed["sha256"] == hashlib.sha256(b"hello\n").hexdigest()
    assert "http: GET 'f.txt' 200" in _vm_log(env, "a")


def test_https_with_the_experiment_ca(unix_env_factory, tmp_path: Path):
    """HTTPS: the agent trusts vmr-host's certificate through ``--http-ca-file`` (a CA made
    like ``vmr-host mqtt-config``'s); an agent without that CA refuses at once, no retries."""
    write_pki(tmp_path)
    env = unix_env_factory({"a": [_drop("f.bin")], "b": [_drop("f.bin")]}, start_buffer=0.5)
    data = os.urandom(3 * MB)
    (env.resources / "f.bin").write_bytes(data)
    base = _start_http_host(
        env, "--http-cert", str(tmp_path / "server.crt"), "--http-key", str(tmp_path / "server.key")
    )
    assert requests.get(base.replace("http:", "https:") + "/r/a/f.bin", verify=str(tmp_path / "ca.crt"),
                        timeout=30).status_code == 401  # fmt: skip
    env.start_agent("a", "--http-ca-file", str(tmp_path / "ca.crt"))
    env.start_agent("b")  # system CAs only
    placed = env.wait_event("a", "data_placed", index=0)["event"]["data"]
    assert placed["sha256"] == hashlib.sha256(data).hexdigest()
    warning = env.wait_event("b", "schedule_warning")["event"]["data"]["details"]
    assert "certificate verify failed" in warning.lower(), warning
    assert "gave up" not in warning
    # HTTP failed for b: the file still comes, over the channel, checked against the schedule
    assert "fetching it over the channel" in warning, warning
    placed_b = env.wait_event("b", "data_placed", index=0)["event"]["data"]
    assert placed_b["sha256"] == hashlib.sha256(data).hexdigest()


def test_channel_download_is_checked_against_the_schedule_sha256(env_factory):
    """Without --http the file comes in resource_chunk events, whose own sha256 is not
    signed: the agent checks the result against the sha256 the schedule announced."""
    env = env_factory({"a": [_drop("tool.bin")]}, start_buffer=0.5)
    (env.resources / "tool.bin").write_bytes(b"version 1\n")
    env.start_host()  # announces the sha256 of version 1 with the schedule
    (env.resources / "tool.bin").write_bytes(b"version 2, changed afterwards\n")
    env.start_agent("a")
    warning = env.wait_event("a", "schedule_warning")["event"]["data"]
    assert "differs from the one the schedule announced" in warning["details"], warning
    env.wait_event("a", "entry_failed", index=0)
    assert not env.events("a", "data_placed")
