"""The console's REST API, event stream and metrics against a real
``vmr-host serve --console`` with real agents over unix sockets: requests for the API (the token
rule, paging, filters, refusals), a real Server-Sent Events stream read while a break begins and
a RESUME sent through the API ends it, ``/metrics`` parsed with prometheus-client's parser, the
OpenAPI document against the routes, HTTPS with a certificate, and the pure token rule.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.hostenv import HostEnv, write_pki
from vmr_handler.host.console.auth import is_loopback, refusal
from vmr_handler.host.console.openapi import openapi_document

BREAK = {"start_time": 1, "pause_duration": "inf"}


def _sched(extra: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{"start_time": -5, "executable": "/bin/echo", "arguments": "configured"}, *extra]


@pytest.fixture
def env() -> Iterator[HostEnv]:
    e = HostEnv(
        {
            "vm1": _sched(
                [BREAK, {"start_time": 2, "executable": "/bin/echo", "arguments": "after the break"}]
            ),
            "vm2": _sched(
                [
                    {
                        "start_time": 1,
                        "executable": "/bin/sh",
                        "arguments": "-c 'echo out; echo err >&2; exit 3'",
                    }
                ]
            ),
            "vm3": _sched([]),
        },
        start_buffer=1.0,
    )
    yield e
    e.close()


class Api:
    """The console of ``env``'s host: its URL and token, and requests with or without it."""

    def __init__(self, env: HostEnv, verify: Any = True) -> None:
        self.url = env.wait_for(lambda: _read(env.logs / "console.url"), "console.url").strip().rstrip("/")
        self.token = (env.logs / "console.token").read_text().strip()
        self.verify = verify

    def get(self, path: str, token: bool = False, **params: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if token else {}
        return requests.get(self.url + path, params=params, headers=headers, timeout=30, verify=self.verify)

    def json(self, path: str, **params: Any) -> Any:
        res = self.get(path, **params)
        assert res.status_code == 200, (path, res.status_code, res.text)
        return res.json()

    def post(self, path: str, body: Any, token: Optional[str] = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.post(self.url + path, json=body, headers=headers, timeout=30, verify=self.verify)


def _read(path: Path) -> Optional[str]:
    return path.read_text() if path.exists() else None


class Stream:
    """A real SSE client in a thread: every ``(event, data)`` received, in order."""

    def __init__(self, api: Api) -> None:
        self.messages: List[Tuple[str, Any]] = []
        self.response = requests.get(api.url + "/api/v1/stream", stream=True, timeout=60, verify=api.verify)
        assert self.response.status_code == 200, self.response.text
        assert self.response.headers["Content-Type"].startswith("text/event-stream")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        kind = ""
        try:
            for line in self.response.iter_lines(decode_unicode=True):
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    self.messages.append((kind, json.loads(line[6:])))
        except (requests.RequestException, AttributeError, OSError, ValueError):
            pass  # closed by close(): urllib3 may fail either way mid-read

    def find(self, kind: str, **match: Any) -> Optional[Any]:
        for k, data in list(self.messages):
            if k == kind and all(_dig(data, key) == value for key, value in match.items()):
                return data
        return None

    def close(self) -> None:
        self.response.close()


def _dig(data: Any, key: str) -> Any:
    for part in key.split("__"):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def test_console_api_follows_and_steers_a_real_experiment(env: HostEnv) -> None:
    env.start_host(
        "--console", "127.0.0.1:0", "--expect", "vm1,vm2", "--kpi-interval", "1", "--name", "console test"
    )
    api = Api(env)
    token_mode = stat.S_IMODE(os.stat(env.logs / "console.token").st_mode)
    assert token_mode == 0o600 and len(api.token) == 64
    assert "console at http://127.0.0.1:" in env.host_log()

    # before any agent: every VM not seen, the barrier waits for vm1 and vm2
    x = api.json("/api/v1/experiment")
    assert x["name"] == "console test" and x["vms"] == 3 and x["counts"] == {"not_seen": 3}, x
    assert x["barrier"]["waiting_for"] == ["vm1", "vm2"] and x["start_time"] is None

    stream = Stream(api)
    try:
        env.wait_for(lambda: stream.find("experiment"), "the first experiment message")
        env.start_agent("vm1")
        env.start_agent("vm2")
        env.wait_event("vm1", "break_started")
        env.wait_event("vm2", "entry_exited", index=1)

        # the stream saw the break begin: the report itself and vm1's row at the break
        assert env.wait_for(
            lambda: stream.find("vm_event", vm="vm1", event__type="break_started"), "break event"
        )
        row = env.wait_for(lambda: stream.find("vm", vm="vm1", state="at_break"), "vm1's row at the break")
        assert row["at_break"] == 1 and row["problem"] is False
        started = env.wait_for(
            lambda: next((d for k, d in stream.messages if k == "experiment" and d["start_time"]), None),
            "an experiment message with the start time set",
        )
        assert started["barrier"]["waiting_for"] == [] and started["counts"].get("not_seen") == 1, started

        # rows: problems first (vm2's entry exited 3), state filter
        rows = api.json("/api/v1/vms")["vms"]
        assert rows[0]["vm"] == "vm2" and rows[0]["problem"] and rows[0]["failures"] == 1, rows
        assert [r["vm"] for r in api.json("/api/v1/vms", state="at_break")["vms"]] == ["vm1"]
        assert [r["vm"] for r in api.json("/api/v1/vms", problems="1")["vms"]] == ["vm2"]

        # one VM: its status, entries (with exit code and lateness) and KPIs
        vm2 = api.json("/api/v1/vms/vm2")
        runs = {r["index"]: r for r in vm2["entries"]}
        assert runs[1]["exit_code"] == 3 and runs[1]["status"] == "error" and runs[1]["lateness"] is not None
        assert vm2["row"]["state"] in ("complete", "running"), vm2["row"]
        kpi = env.wait_for(lambda: api.json("/api/v1/vms/vm1/kpi")["latest"], "a KPI sample of vm1")
        assert kpi["cpu_percent"] is not None and api.json("/api/v1/vms/vm1/kpi")["series"]["cpu_percent"]

        # events, paged by cursor: 2 at a time, following "next", give the whole log in order
        everything = api.json("/api/v1/vms/vm2/events", limit="1000")["events"]
        paged: List[Dict[str, Any]] = []
        after = 0
        while True:
            page = api.json("/api/v1/vms/vm2/events", limit="2", after=str(after))
            paged += page["events"]
            after = page["next"]
            if not page["more"]:
                break
        assert [e["event"]["id"] for e in paged] == [e["event"]["id"] for e in everything] and len(paged) > 4
        out = api.json("/api/v1/vms/vm2/events", type="output", entry="1", tail="5")["events"]
        assert sorted(e["event"]["data"].get("stream") for e in out) == ["stderr", "stdout"], out

        # bad requests say what was wrong
        assert api.get("/api/v1/vms/nope").json() == {"error": "unknown VM 'nope'"}
        bad = api.get("/api/v1/vms/vm2/events", limit="ten")
        assert bad.status_code == 400 and "limit='ten'" in bad.json()["error"]
        assert api.get("/api/v1/nothing").status_code == 404

        # writes need the token, always (even on loopback)
        refused = api.post("/api/v1/resume", {"vms": ["vm1"]})
        assert refused.status_code == 401 and "console.token" in refused.json()["error"]
        assert api.post("/api/v1/resume", {"vms": ["vm1"]}, token="0" * 64).status_code == 401
        # the CLI's rules with the CLI's defaults: vm2 is at no break, so the RESUME is refused
        no = api.post("/api/v1/resume", {"vms": ["vm2"]}, token=api.token)
        assert no.status_code == 400 and "not at a break: vm2" in no.json()["error"], no.text
        assert "--force" in no.json()["error"]
        cli = env.cli("resume", "vm2")
        assert cli.returncode == 2 and "not at a break: vm2" in cli.stderr and "--force" in cli.stderr
        assert api.post("/api/v1/resume", "not an object", token=api.token).status_code == 400
        dry = api.post("/api/v1/resume", {"vms": ["vm1"], "dry_run": True}, token=api.token).json()
        assert dry == {"dry_run": True, "targets": ["vm1"], "at_break": {"vm1": 1}, "not_at_break": []}
        every = api.post("/api/v1/resume", {"all": True, "dry_run": True}, token=api.token).json()
        assert every == {"dry_run": True, "targets": ["vm1"], "at_break": {"vm1": 1},
                         "not_at_break": ["vm2", "vm3"]}  # fmt: skip
        # all: the VMs at a break get it, the others are listed (SPEC section 8)
        done = api.post("/api/v1/resume", {"all": True}, token=api.token)
        assert done.status_code == 200 and done.json()["sent_now"] == ["vm1"], done.text
        assert done.json()["targets"] == ["vm1"] and done.json()["not_at_break"] == ["vm2", "vm3"]
        env.wait_event("vm1", "entry_exited", index=2)
        assert env.wait_for(lambda: stream.find("vm", vm="vm1", state="complete"), "vm1 complete, streamed")
        resumes = api.json("/api/v1/experiment")["resumes"]
        assert [r["targets"] for r in resumes] == [["vm1"]]
        assert "console: resume by 127.0.0.1" in env.host_log()
    finally:
        stream.close()

    # /metrics: the Prometheus exposition, parsed by prometheus-client's own parser
    text = api.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    states = {s.labels["vm"]: s.labels["state"] for s in families["vmr_vm_state"].samples if s.value == 1}
    assert states == {"vm1": "complete", "vm2": "complete", "vm3": "not_seen"}, states


def test_openapi_names_every_route(env: HostEnv) -> None:
    """The OpenAPI document lists every /api/v1 route and /metrics the server answers."""
    from vmr_handler.host.console.app import Console

    doc = openapi_document()
    paths = set(doc["paths"])
    console = Console.__new__(Console)
    routes = {r.resource.canonical for r in console.app().router.routes() if r.resource is not None}  # type: ignore[attr-defined]
    api_routes = {r for r in routes if r.startswith("/api/v1/") or r == "/metrics"} - {"/api/v1/openapi.json"}
    assert api_routes == paths, api_routes ^ paths
    json.dumps(doc, allow_nan=False)


def test_console_over_https(env: HostEnv, tmp_path: Path) -> None:
    """``--console-cert/--console-key``: HTTPS with the given certificate; plain HTTP is not served."""
    write_pki(tmp_path)
    env.start_host(
        "--console", "127.0.0.1:0", "--console-cert", str(tmp_path / "server.crt"),
        "--console-key", str(tmp_path / "server.key"),
    )  # fmt: skip
    api = Api(env, verify=str(tmp_path / "ca.crt"))
    assert api.url.startswith("https://127.0.0.1:")
    assert api.json("/api/v1/experiment")["counts"] == {"not_seen": 3}
    with pytest.raises(requests.ConnectionError):
        requests.get(api.url.replace("https:", "http:") + "/api/v1/experiment", timeout=10)


def test_bad_console_flags_are_refused(env: HostEnv) -> None:
    """A malformed ``--console`` and a key without a certificate: exit 2, the flag named."""
    for args, text in (
        (["--console", "127.0.0.1:http"], "--console '127.0.0.1:http': expected [HOST:]PORT"),
        (["--console", "8080", "--console-key", "k.pem"], "--console-key needs --console-cert"),
        (["--console-cert", "c.pem"], "--console-cert/--console-key need --console"),
    ):
        res = env.cli("serve", "--schedules", str(env.schedules), *args)
        assert res.returncode == 2 and text in res.stderr, (args, res.stderr)


def test_token_rule() -> None:
    """Reads need no token on loopback only; writes always need the right bearer token."""
    tok = "ab" * 32
    assert refusal(None, tok, write=False, loopback=True) is None
    assert "needs the token" in str(refusal(None, tok, write=False, loopback=False))
    assert "needs the token" in str(refusal(None, tok, write=True, loopback=True))
    assert refusal(f"Bearer {tok}", tok, write=True, loopback=False) is None
    assert refusal(f"bearer {tok}", tok, write=True, loopback=True) is None
    assert "wrong token" in str(refusal("Bearer nope", tok, write=True, loopback=True))
    assert "wrong token" in str(refusal(f"Basic {tok}", tok, write=False, loopback=False))
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.org")
