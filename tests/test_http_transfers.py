"""Transfers out over HTTP(S): a real ``vmr-host serve --http`` and real agents.

Files of ``HTTP_TRANSFER_MIN`` bytes or more are uploaded (``PUT /t/<vm>/<location>``,
resumable) and put in place when the agent's ``transfer_uploaded`` report arrives; smaller
ones keep travelling as ``transfer_chunk`` events. Refusals are checked with direct
``requests`` calls against the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict

import requests

from tests import test_connected
from tests.broker import free_port
from tests.hostenv import HostEnv, write_pki
from tests.test_http_resources import _start_http_host, _tokens, _vm_log
from vmr_handler.agent.connected.transfers import HTTP_TRANSFER_MIN, TRANSFER_CHUNK

MB = 1024 * 1024
env_factory = test_connected.env_factory
unix_env_factory = test_connected.unix_env_factory


def _out(path: Path, start: float = -5, interval: Any = None) -> Dict[str, Any]:
    return {"start_time": start, "data": [{"location": str(path), "interval": interval}]}


def _copy(env: HostEnv, vm: str, path: Path) -> Path:
    return env.logs / "transfers" / vm / str(path).lstrip("/")


def _vm_status(env: HostEnv, vm: str) -> Dict[str, Any]:
    return next(v for v in env.status()["vms"] if v["vm"] == vm)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_20mb_transfer_out_over_http_not_through_the_channel(env_factory):
    env = env_factory({}, start_buffer=0.5)
    big = env.root / "vm" / "a" / "out" / "big.bin"
    big.parent.mkdir(parents=True)
    data = os.urandom(20 * MB)
    big.write_bytes(data)
    (env.schedules / "a.yaml").write_text(
        f"- start_time: -5\n  data:\n  - location: {big}\n    interval: null\n"
    )
    _start_http_host(env)
    began = time.monotonic()
    env.start_agent("a")
    rec = env.wait_event("a", "transfer_uploaded")["event"]["data"]
    took = time.monotonic() - began
    copy = _copy(env, "a", big)
    assert copy.read_bytes() == data  # in place when the report arrived, before it was logged
    assert rec["status"] == "success" and rec["size"] == len(data) and rec["sha256"] == _sha(data)
    assert rec["stored_as"] == str(big).lstrip("/")
    assert copy.stat().st_mtime == big.stat().st_mtime
    # nothing of it passed through the channel (or the broker)
    assert env.events("a", "transfer_chunk") == []
    vm = _vm_status(env, "a")
    assert vm["frames"]["bytes"] < 2 * MB, vm["frames"]
    assert vm["transfers"]["files"] == 1 and vm["transfers"]["bytes"] == len(data)
    assert not list((env.logs / "uploads" / "a").iterdir())  # the staged upload was moved
    assert f"http: PUT {str(big)!r} bytes 0-{len(data) - 1}/{len(data)} received" in _vm_log(env, "a")
    print(f"\n20 MB transfer out over HTTP ({env.transport}): {took:.2f} s from agent start")


def test_upload_resumes_after_the_agent_is_killed(unix_env_factory):
    env = unix_env_factory({}, start_buffer=0.5)
    big = env.root / "vm" / "a" / "big.bin"
    big.parent.mkdir(parents=True)
    data = os.urandom(20 * MB)
    big.write_bytes(data)
    (env.schedules / "a.yaml").write_text(
        f"- start_time: -5\n  data:\n  - location: {big}\n    interval: null\n"
    )
    _start_http_host(env, "--http-debug-rate", str(4 * MB))  # about 5 s for the file
    first = env.start_agent("a")
    staged = env.logs / "uploads" / "a"
    env.wait_for(lambda: any(p.stat().st_size > 3 * MB for p in staged.glob("*.part")), "3 MB uploaded")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    env.wait_for(lambda: "interrupted after" in _vm_log(env, "a"), "the host noticed the broken upload")
    kept = max(p.stat().st_size for p in staged.glob("*.part"))
    assert 0 < kept < len(data)
    env.start_agent("a")  # the transfer under way is restarted from <state>/transfers.json
    rec = env.wait_event("a", "transfer_uploaded")["event"]["data"]
    assert rec["status"] == "success"
    assert _copy(env, "a", big).read_bytes() == data
    puts = [line for line in _vm_log(env, "a").splitlines() if "http: PUT " in line and "complete" in line]
    assert len(puts) == 1, puts
    start = int(puts[0].split(" bytes ")[1].split("-")[0])
    assert start >= kept, (start, kept)  # resumed, not sent again from byte 0
    assert env.events("a", "transfer_chunk") == []
    assert len(env.events("a", "transfer_uploaded")) == 1


def test_upload_refusals(unix_env_factory):
    env = unix_env_factory({"a": [{"start_time": 100, "executable": "/bin/true"}], "b": []})
    base = _start_http_host(env)
    tokens = _tokens(env)
    body = os.urandom(200_000)
    sha = _sha(body)

    def put(path: str, data: bytes = body, token: str = tokens["a"], **headers: str) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}", "X-Vmr-Sha256": sha, **headers}
        return requests.put(base + path, data=data, headers=headers, timeout=30)

    def head(path: str, size: int = len(body), token: str = tokens["a"]) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}", "X-Vmr-Sha256": sha, "X-Vmr-Size": str(size)}
        return requests.head(base + path, headers=headers, timeout=30)

    assert put("/t/a/x.bin", token="").status_code == 401
    assert put("/t/a/x.bin", token="x" + tokens["a"]).status_code == 401
    assert put("/t/b/x.bin").status_code == 403  # a's token, b's transfers
    assert put("/t/a/%2e%2e/%2e%2e/escape").status_code == 403  # path escape
    assert head("/t/a/..%2Fx").status_code == 403
    assert put("/t/a/x.bin", **{"X-Vmr-Sha256": "nothex"}).status_code == 400
    assert put("/t/a/x.bin", **{"Content-Range": "bytes 0-9/10"}).status_code == 400  # not the body
    assert head("/t/a/big", size=300 * MB).status_code == 413  # over the 256 MiB per-file limit
    over = put("/t/a/big", data=b"x" * 10, **{"Content-Range": f"bytes 0-9/{300 * MB}"})
    assert over.status_code == 413
    assert requests.get(base + "/t/a/x.bin", headers={"Authorization": f"Bearer {tokens['a']}"},
                        timeout=30).status_code == 405  # fmt: skip
    assert put("/r/a/x.bin").status_code == 405
    # a piece, then a piece out of step (409 says what the host holds), then the rest
    first = put("/t/a/x.bin", body[:50_000], **{"Content-Range": f"bytes 0-49999/{len(body)}"})
    assert first.status_code == 200 and first.headers["X-Vmr-Have"] == "50000"
    gap = put("/t/a/x.bin", body[60_000:], **{"Content-Range": f"bytes 60000-199999/{len(body)}"})
    assert gap.status_code == 409 and gap.headers["X-Vmr-Have"] == "50000"
    assert head("/t/a/x.bin").headers["X-Vmr-Have"] == "50000"
    rest = put("/t/a/x.bin", body[50_000:], **{"Content-Range": f"bytes 50000-199999/{len(body)}"})
    assert rest.status_code == 201, rest.text
    assert head("/t/a/x.bin").headers["X-Vmr-Have"] == str(len(body))
    # a body that does not have the announced sha256 is deleted
    wrong = put("/t/a/y.bin", os.urandom(1000), **{"X-Vmr-Sha256": _sha(b"other")})
    assert wrong.status_code == 422
    assert not list((env.logs / "uploads" / "a").glob(f"{_sha(b'other')}*"))
    # an upload alone puts nothing in place: the VM's transfer_uploaded report does
    assert not (env.logs / "transfers" / "a" / "x.bin").exists()
    vm = _vm_status(env, "a")
    assert vm["transfers"]["bytes"] == len(body)  # staged bytes count
    assert vm["transfers"]["refused"] == 9 and vm["resources"]["refused"] == 0
    log_a = _vm_log(env, "a")  # (refusals are logged rate-limited: the first five, the tenth...)
    assert "not this VM's" in log_a and "'..' component" in log_a and "400 X-Vmr-Sha256" in log_a


def test_small_files_over_the_channel_and_periodic_uploads_only_when_changed(unix_env_factory):
    env = unix_env_factory({}, start_buffer=0.5)
    out = env.root / "vm" / "a" / "out"
    out.mkdir(parents=True)
    (out / "small.txt").write_bytes(b"s" * (HTTP_TRANSFER_MIN - 1))
    big = out / "big.bin"
    v1 = os.urandom(HTTP_TRANSFER_MIN * 4)
    big.write_bytes(v1)
    (env.schedules / "a.yaml").write_text(
        f"- start_time: -5\n  data:\n  - location: {out}\n    interval: 0.3\n"
    )
    _start_http_host(env)
    env.start_agent("a")
    copy = _copy(env, "a", big)
    env.wait_for(lambda: copy.exists() and copy.read_bytes() == v1, "first upload")
    env.wait_for(lambda: (_copy(env, "a", out / "small.txt")).exists(), "the small file")
    chunks = env.events("a", "transfer_chunk")
    assert chunks and {c["event"]["data"]["location"] for c in chunks} == {f"{out}/small.txt"}
    time.sleep(1.5)  # five rounds of an unchanged directory
    assert len(env.events("a", "transfer_uploaded")) == 1
    assert len(env.events("a", "transfer_chunk")) == len(chunks)
    v2 = v1 + b"more"
    big.write_bytes(v2)
    env.wait_for(lambda: copy.read_bytes() == v2, "the changed file uploaded again")
    time.sleep(1.0)
    ups = env.events("a", "transfer_uploaded")
    assert [u["event"]["data"]["sha256"] for u in ups] == [_sha(v1), _sha(v2)]
    assert len(env.events("a", "transfer_chunk")) == len(chunks)


def _chunked_once(env: HostEnv, vm: str, path: Path, data: bytes) -> None:
    """``path`` came to ``vm``'s transfers over the channel, exactly once: its
    ``transfer_chunk`` events (no duplicate offset), no ``transfer_uploaded``, nothing staged."""
    copy = _copy(env, vm, path)
    env.wait_for(lambda: copy.exists() and copy.read_bytes() == data, f"{vm}: {path} over the channel")
    time.sleep(1.0)  # anything sent twice (an upload after all, a second round) would show by now
    assert copy.read_bytes() == data
    chunks = [c["event"]["data"] for c in env.events(vm, "transfer_chunk")]
    assert {c["location"] for c in chunks} == {str(path)}
    assert sorted(c["offset"] for c in chunks) == list(range(0, len(data), TRANSFER_CHUNK))
    assert all(c["sha256"] == _sha(data) and c["size"] == len(data) for c in chunks)
    assert env.events(vm, "transfer_uploaded") == []
    staged = env.logs / "uploads" / vm
    assert not staged.exists() or not list(staged.iterdir())
    assert _vm_status(env, vm)["transfers"]["files"] == 1
    assert "http: PUT " not in _vm_log(env, vm)


def test_https_upload_with_the_ca_and_channel_fallback_without_it(
    unix_env_factory: Any, tmp_path: Path
) -> None:
    """HTTPS uploads: an agent given the CA (config key ``http_ca_file``) uploads a file of
    more than 64 KiB byte-identical, with no ``transfer_chunk``; one without it fails
    certificate verification at once (no retries), says so and sends the file over the channel."""
    write_pki(tmp_path)
    (tmp_path / "agent.yaml").write_text(f"http_ca_file: {tmp_path / 'ca.crt'}\n")
    env = unix_env_factory({}, start_buffer=0.5)
    files = {}
    for vm in ("a", "b"):
        big = env.root / "vm" / vm / "out" / "big.bin"
        big.parent.mkdir(parents=True)
        files[vm] = (big, os.urandom(2 * TRANSFER_CHUNK + 1000))  # > 64 KiB, 3 chunks
        big.write_bytes(files[vm][1])
        (env.schedules / f"{vm}.yaml").write_text(
            f"- start_time: -5\n  data:\n  - location: {big}\n    interval: null\n"
        )
    _start_http_host(
        env, "--http-cert", str(tmp_path / "server.crt"), "--http-key", str(tmp_path / "server.key")
    )
    env.start_agent("a", "--config", str(tmp_path / "agent.yaml"))
    env.start_agent("b")  # system CAs only
    big, data = files["a"]
    rec = env.wait_event("a", "transfer_uploaded")["event"]["data"]
    assert rec["status"] == "success" and rec["sha256"] == _sha(data)
    assert _copy(env, "a", big).read_bytes() == data
    assert env.events("a", "transfer_chunk") == []
    assert f"http: PUT {str(big)!r} bytes 0-{len(data) - 1}/{len(data)} received" in _vm_log(env, "a")
    upload = json.loads((env.state("a") / "http.json").read_text())["upload"]
    assert upload.startswith("https://127.0.0.1:"), upload

    big, data = files["b"]
    warning = env.wait_event("b", "schedule_warning")["event"]["data"]["details"]
    assert f"transfer {str(big)!r} over HTTP failed" in warning, warning
    assert "certificate verify failed" in warning.lower() and "gave up" not in warning, warning
    assert "sending it over the channel" in warning
    _chunked_once(env, "b", big, data)
    assert "attempt 2" not in env.agent_log("b") and "retrying" not in env.agent_log("b")


def test_upload_refused_for_good_falls_back_to_the_channel(unix_env_factory: Any) -> None:
    """A final 4xx (here 401: the host no longer accepts the token the agent was given) ends
    the upload at once: a ``schedule_warning`` names the status and the file travels as
    ``transfer_chunk`` events, arriving once, byte-identical."""
    env = unix_env_factory({}, start_buffer=0.5)
    big = env.root / "vm" / "a" / "out" / "big.bin"
    big.parent.mkdir(parents=True)
    data = os.urandom(2 * TRANSFER_CHUNK + 1000)
    big.write_bytes(data)
    # fires 4 s after the start: after the host was restarted with a new token
    (env.schedules / "a.yaml").write_text(
        f"- start_time: 4\n  data:\n  - location: {big}\n    interval: null\n"
    )
    port = free_port()
    env.start_host("--http", f"127.0.0.1:{port}")
    old = _tokens(env)["a"]
    env.start_agent("a")
    env.wait_event("a", "configured")
    env.kill_host()  # (at once: the start is at least 4.5 s after "configured")
    assert json.loads((env.state("a") / "http.json").read_text())["token"] == old
    tokens_file = env.logs / "http-tokens.json"
    tokens_file.write_text(json.dumps({"version": 1, "tokens": {"a": "revoked-" + old}}))
    env.start_host("--http", f"127.0.0.1:{port}")
    assert _tokens(env)["a"] != old
    warning = env.wait_event("a", "schedule_warning")["event"]["data"]["details"]
    # (the refusal came to the HEAD, which has no body: the reason phrase says why)
    assert f"transfer {str(big)!r} over HTTP failed (HTTP 401: Unauthorized)" in warning, warning
    assert "sending it over the channel" in warning
    _chunked_once(env, "a", big, data)
    assert len(env.events("a", "schedule_warning")) == 1
    assert "retrying" not in env.agent_log("a")  # a 401 is final: not retried


def test_a_transfer_with_a_destination_lands_in_destination_vm_as_firewheel_writes_it(unix_env_factory):
    """FIREWHEEL 3.1.0 writes a transfer with a ``destination`` to ``<destination>/<vm>/<location>``;
    here too (a copy; the logs keep theirs), over the channel and over HTTP alike. A destination
    that cannot be written is said in the VM's log, and the file stays in the logs."""
    env = unix_env_factory({}, start_buffer=0.5)
    out = env.root / "vm" / "a" / "out"
    out.mkdir(parents=True)
    small, big, notes = out / "small.txt", out / "big.bin", env.root / "vm" / "a" / "notes.txt"
    small.write_bytes(b"s" * 100)
    big.write_bytes(os.urandom(HTTP_TRANSFER_MIN * 2))
    notes.write_bytes(b"notes\n")
    dest = env.root / "dest"
    (env.root / "plainfile").write_text("not a directory\n")
    bad = env.root / "plainfile" / "sub"  # cannot be made: its parent is a file (even for root)
    records = [
        {"start_time": -5, "data": [{"location": str(out), "interval": None, "destination": str(dest)}]},
        {"start_time": -5, "data": [{"location": str(notes), "interval": None, "destination": str(bad)}]},
    ]
    (env.schedules / "a.json").write_text(json.dumps(records))
    _start_http_host(env)
    env.start_agent("a")
    landed = {p: dest / "a" / str(p).lstrip("/") for p in (small, big)}
    for path, copy in landed.items():
        env.wait_for(lambda c=copy, p=path: c.exists() and c.read_bytes() == p.read_bytes(), f"{copy}")
        assert _copy(env, "a", path).read_bytes() == path.read_bytes()  # the logs keep theirs
        assert copy.stat().st_mtime == path.stat().st_mtime
    uploaded = env.wait_event("a", "transfer_uploaded")["event"]["data"]
    assert uploaded["destinations"] == [str(landed[big])]
    chunked = [c["event"]["data"] for c in env.events("a", "transfer_chunk")]
    chunked = [c for c in chunked if c.get("last")]
    assert [c["destinations"] for c in chunked if c["location"] == str(small)] == [[str(landed[small])]]
    env.wait_for(lambda: _copy(env, "a", notes).exists(), "notes in the logs")
    env.wait_for(lambda: "not copied to" in _vm_log(env, "a"), "the failed copy said")
    said = _vm_log(env, "a")
    assert f"transfer {str(notes).lstrip('/')!r} not copied to {bad / 'a' / str(notes).lstrip('/')}" in said
    assert f"it is in {_copy(env, 'a', notes)}" in said
    transfers = _vm_status(env, "a")["transfers"]
    assert (transfers["destination_copies"], transfers["destination_failures"]) == (2, 1)
