"""One truth: every view of an experiment says the same of every VM, and it is what happened.

One real ``vmr-host serve --console`` with real agents over unix sockets plays, at once, the
scenarios an operator meets: a VM that completes with a failed entry; one that fails in its
stage (left out of the barrier), then recovers when its agent starts again; one held at a
break; one whose break a stored RESUME ended before it began (FIREWHEEL's ``vm resume``); one
whose agent is killed with SIGKILL; a completed VM given a break with ``schedule add``; a late
joiner the operator excluded; ``exec``, ``push`` and ``pull`` on a running VM. At three
moments (all of that at once; after ``resume --all``; after the host stopped) every view is
read for every VM:

- ``vmr-host status --json`` (and its text's counts),
- the console's REST rows (``GET /api/v1/vms``) and counts (``GET /api/v1/experiment``),
- ``/metrics``, parsed with prometheus-client's parser,
- the console's timeline (``GET /api/v1/timeline``: each lane's word and problem),
- ``vmr-host schedule show --json`` (failed entries, breaks still holding),
- the console page in Chromium (each row's state pill and where, the header),
- and, once the host is gone, ``status`` from the logs and ``vmr-host report``,

and each must agree with the others and with what the agents did (:data:`EXPECTED`).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.hostenv import HostEnv
from tests.test_console_browser import Page, browser  # noqa: F401 - the browser fixture

STAGE = {"start_time": -5, "executable": "/bin/echo", "arguments": "configured"}
SCHEDULES: Dict[str, List[Dict[str, Any]]] = {
    # completes, with one failed entry (a problem, not a failed VM)
    "fails-entry": [STAGE, {"start_time": 1, "executable": "/bin/sh", "arguments": "-c 'exit 3'"},
                    {"start_time": 2, "executable": "/bin/echo", "arguments": "goes on"}],
    # its stage fails (a VM resource the host does not have): the VM fails, the barrier goes on
    "fails-vm": [{"start_time": -5, "data": [{"filename": "gone.bin", "location": "/tmp/vmr-gone.bin"}]}],
    # held at a break until a RESUME
    "holds": [STAGE, {"start_time": 1, "pause_duration": "inf"},
              {"start_time": 2, "executable": "/bin/echo", "arguments": "after the break"}],
    # FIREWHEEL's vm resume: a break at -inf, and the RESUME entry it stores
    "stored": [{"start_time": float("-inf"), "pause_duration": "inf"},
               {"start_time": float("-inf"), "data": [{"resume": True}]}, STAGE],
    # its agent is killed with SIGKILL in positive time, in a long entry
    "killed": [STAGE, {"start_time": 1, "executable": "/bin/sleep", "arguments": "600"}],
    # completes, then gets a break with schedule add
    "appended": [STAGE, {"start_time": 1, "executable": "/bin/echo", "arguments": "done"}],
    # excluded by the operator, joins late
    "late": [STAGE, {"start_time": 1, "executable": "/bin/echo", "arguments": "late"}],
    # running while exec, push and pull reach it
    "live": [STAGE, {"start_time": 300, "executable": "/bin/echo", "arguments": "much later"}],
}  # fmt: skip

#: What the agents did, at each moment: VM -> (state word, problem, failed entries).
EXPECTED: Dict[str, Dict[str, Tuple[str, bool, int]]] = {
    "all at once": {
        "fails-entry": ("complete", True, 1),
        "fails-vm": ("failed", True, 1),
        "holds": ("at_break", False, 0),
        "stored": ("complete", False, 0),
        "killed": ("lost", True, 0),
        "appended": ("at_break", False, 0),
        "late": ("complete", False, 0),
        "live": ("running", False, 0),
    },
}
EXPECTED["after resume --all"] = {
    **EXPECTED["all at once"],
    "fails-vm": ("complete", True, 1),  # recovered; its failed entry (a run) still counts
    "holds": ("complete", False, 0),
    "appended": ("complete", False, 0),
}
#: From the logs alone (no host: nobody knows the killed agent is gone, it was running).
EXPECTED["host stopped"] = {
    **EXPECTED["after resume --all"],
    "killed": ("running", False, 0),
}

LOST_AFTER = 3.0


@pytest.fixture
def env() -> Iterator[HostEnv]:
    e = HostEnv(SCHEDULES, start_buffer=1.0)
    (e.resources / "note.txt").write_text("pushed\n")
    yield e
    e.close()


# ---------------------------------------------------------------------------- the views
def _status(env: HostEnv) -> Dict[str, Any]:
    res = env.cli("status", "--json")
    assert res.returncode in (0, 1), res.stderr
    return dict(json.loads(res.stdout))


class Console:
    """The console's REST API and metrics of ``env``'s host."""

    def __init__(self, env: HostEnv) -> None:
        self.url = env.wait_for(lambda: _read(env.logs / "console.url"), "console.url").strip().rstrip("/")
        self.headers = {"Authorization": f"Bearer {(env.logs / 'console.token').read_text().strip()}"}

    def get(self, path: str) -> requests.Response:
        res = requests.get(self.url + path, headers=self.headers, timeout=30)
        assert res.status_code == 200, (path, res.status_code, res.text)
        return res


def _read(path: Path) -> Optional[str]:
    return path.read_text() if path.exists() else None


def _lanes(fragment: str) -> Dict[str, Tuple[str, bool]]:
    """VM -> (word, problem) of every lane of a timeline fragment."""
    out = {}
    for tag in re.findall(r'<div class="tl-lane"[^>]*>', fragment):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        out[attrs["data-vm"]] = (attrs["data-cat"], "data-problem" in attrs)
    return out


def _metrics(console: Console) -> Tuple[Dict[str, str], Dict[str, int]]:
    """VM -> its state (``vmr_vm_state`` at 1) and VM -> failed entries (``vmr_vm_failures``)."""
    states: Dict[str, str] = {}
    failures: Dict[str, int] = collections.defaultdict(int)
    for family in text_string_to_metric_families(console.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "vmr_vm_state" and sample.value == 1:
                assert sample.labels["vm"] not in states, "one state per VM"
                states[sample.labels["vm"]] = sample.labels["state"]
            elif sample.name == "vmr_vm_failures":
                failures[sample.labels["vm"]] = int(sample.value)
    return states, failures


def _shown(env: HostEnv, vm: str) -> Tuple[int, bool]:
    """``schedule show``'s failed entries of ``vm`` (docs/host.md, "Terms": runs that exited
    non-zero or could not run) and whether a break of it still holds."""
    res = env.cli("schedule", "show", vm, "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["entries"]
    failed = sum(1 for r in rows for run in r["runs"] if run["status"] in ("error", "failed"))
    holding = any(h["kind"] == "break" and h["end"] is None for r in rows for h in r["holds"])
    return failed, holding


def _page(page: Page) -> Dict[str, Tuple[str, str]]:
    """VM -> (state, where) of every row of the console page."""
    rows = page.driver.execute_script(
        "return Array.from(document.querySelectorAll('#vm-rows tr'),"
        " (tr) => [tr.dataset.vm, tr.dataset.state, (tr.querySelector('td.where') || {}).textContent]);"
    )
    return {vm: (state, where) for vm, state, where in rows}


def _stable(where: str) -> str:
    """A VM's ``where`` without what changes every second: a running VM's experiment time now."""
    return "t=now" if re.fullmatch(r"t=[+-][0-9.]+s", where) else where


def _agree(env: HostEnv, console: Console, page: Page, moment: str) -> None:
    """Every live view says, of every VM, what :data:`EXPECTED` says the agents did."""
    want = EXPECTED[moment]
    status = {v["vm"]: v for v in _status(env)["vms"]}
    assert {vm: (v["state"], v["problem"], v["failures"]) for vm, v in status.items()} == want, moment
    rest = {r["vm"]: r for r in console.get("/api/v1/vms").json()["vms"]}
    assert {vm: (r["state"], r["problem"], r["failures"]) for vm, r in rest.items()} == want, moment
    wheres = {vm: _stable(v["where"]) for vm, v in status.items()}
    assert {vm: _stable(r["where"]) for vm, r in rest.items()} == wheres, moment
    counts = console.get("/api/v1/experiment").json()
    assert counts["counts"] == dict(collections.Counter(w for w, _p, _f in want.values()))
    assert counts["problems"] == sum(1 for _w, p, _f in want.values() if p)
    states, failures = _metrics(console)
    assert states == {vm: w for vm, (w, _p, _f) in want.items()}, moment
    assert {vm: failures[vm] for vm in want} == {vm: f for vm, (_w, _p, f) in want.items()}, moment
    lanes = {vm: (w, p) for vm, (w, p, _f) in want.items()}
    # the fragment is drawn again at most every 2 s: the one served then says the same
    env.wait_for(lambda: _lanes(console.get("/api/v1/timeline").text) == lanes, f"the lanes: {lanes}")
    for vm, (word, _problem, failed) in want.items():
        assert _shown(env, vm) == (failed, word == "at_break"), (moment, vm)
    wanted = {vm: (w, wheres[vm]) for vm, (w, _p, _f) in want.items()}
    page.until(
        lambda: {vm: (w, _stable(x)) for vm, (w, x) in _page(page).items()} == wanted,
        f"the console page's rows at '{moment}': {wanted}",
    )


# ---------------------------------------------------------------------------- the scenario
def _batch(env: HostEnv, entries: List[Dict[str, Any]]) -> str:
    path = env.root / "break.yaml"
    path.write_text(yaml.safe_dump(entries))
    return str(path)


def _host_cli(env: HostEnv, *args: str, command: Tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``vmr-host ARGS --logs LOGS [-- COMMAND]`` (``exec``'s command after its ``--``)."""
    argv = [sys.executable, "-m", "vmr_handler.host", *args, "--logs", str(env.logs)]
    argv += ["--", *command] if command else []
    return subprocess.run(argv, capture_output=True, text=True, timeout=90)


def _lost(env: HostEnv, vm: str) -> bool:
    return any(v["vm"] == vm and v["state"] == "lost" for v in _status(env)["vms"])


def test_every_view_says_the_same_of_every_vm(
    env: HostEnv, browser: WebDriver, tmp_path: Path  # noqa: F811 - the fixture
) -> None:
    env.start_host("--console", "127.0.0.1:0", "--lost-after", f"{LOST_AFTER:g}", "--allow-missing-resources")
    console = Console(env)
    page = Page(browser, env)
    browser.get(page.url)
    for vm in SCHEDULES:
        if vm != "late":
            env.start_agent(vm)
    env.wait_event("fails-vm", "vm_failed")
    res = env.cli("release", "--exclude", "late", "fails-vm")
    assert res.returncode == 0, res.stdout + res.stderr
    for vm in ("fails-entry", "stored", "appended"):
        env.wait_event(vm, "schedule_complete")
    env.wait_event("holds", "break_started")
    env.wait_event("killed", "entry_started", index=1)

    os.kill(env.agents["killed"].pid, signal.SIGKILL)  # gone in positive time, in a long entry
    res = env.cli("schedule", "add", "appended", _batch(env, [{"start_time": 2, "pause_duration": "inf"}]))
    assert res.returncode == 0, res.stdout + res.stderr
    env.start_agent("late")  # joins late: it gets the start time already set
    res = _host_cli(env, "exec", "live", command=("/bin/echo", "hello"))
    assert res.returncode == 0 and "live: hello" in res.stdout, res.stdout + res.stderr
    res = _host_cli(env, "push", "live", str(env.resources / "note.txt"), "/tmp/vmr-one-truth-note.txt")
    assert res.returncode == 0, res.stdout + res.stderr
    res = _host_cli(env, "pull", "live", "/etc/hostname", "--to", str(tmp_path / "pulled"))
    assert res.returncode == 0, res.stdout + res.stderr
    env.wait_event("appended", "break_started")
    env.wait_event("late", "schedule_complete")
    env.wait_for(lambda: _lost(env, "killed"), "the killed VM lost", timeout=LOST_AFTER + 30)
    _agree(env, console, page, "all at once")
    text = env.cli("status").stdout
    assert "8 VM(s): 1 failed, 1 lost, 2 at_break, 1 running, 3 complete" in text, text

    # RESUME, one rule: --all resumes the VMs at a break and lists the others (exit 0)
    res = env.cli("resume", "--all")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "appended" in res.stdout and "holds" in res.stdout and "not at a break" in res.stdout, res.stdout
    # a failure and a recovery: the missing resource is given, the VM's agent started again
    (env.resources / "gone.bin").write_text("here now\n")
    env.agents["fails-vm"].kill()
    env.agents["fails-vm"].wait()
    env.start_agent("fails-vm")
    env.wait_event("fails-vm", "schedule_complete")
    env.wait_event("holds", "entry_exited", index=2)
    env.wait_for(lambda: len(env.events("appended", "schedule_complete")) == 2, "appended completes again")
    _agree(env, console, page, "after resume --all")

    # the host stops: the page says so and stops its clock; the logs tell the same story
    env.kill_host()
    page.until(lambda: "the host is gone" in page.text("#x-clock"), "the page saying the host is gone")
    assert " connected as of " in page.text("#chips")  # not "7 connected", as if it still were
    offline = _status(env)
    assert offline["offline"] is True
    want = EXPECTED["host stopped"]
    assert {v["vm"]: (v["state"], v["problem"], v["failures"]) for v in offline["vms"]} == want
    out = tmp_path / "report.html"
    res = env.cli("report", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert _lanes(out.read_text()) == {vm: (w, p) for vm, (w, p, _f) in want.items()}
    # one row per VM in the report's table too, with the same word
    cells = dict(re.findall(r'<tr[^>]* data-vm="([^"]+)" data-cat="([^"]+)"', out.read_text()))
    assert cells == {vm: w for vm, (w, _p, _f) in want.items()}
    assert browser.find_elements(By.CSS_SELECTOR, "#vm-rows tr")  # the last picture stays shown
