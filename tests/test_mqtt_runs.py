"""Runs over MQTT: what an earlier run left retained in the broker is never taken,
and a coordinator killed with -9 and restarted on its logs carries the experiment on.

Real mosquitto (:class:`tests.broker.Broker`), real ``vmr-host serve`` processes and real
agents (:class:`tests.hostenv.HostEnv`); an "earlier run" is the same experiment name on the
same broker with other logs directories. The pure rules (:class:`StartGate`, the
coordinator's and the member's run checks, what ``experiment.json`` keeps) are unit-tested
at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from tests.broker import Broker
from tests.hostenv import HostEnv
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import SCHEDULE, START_TIME
from vmr_handler.core.wire.runs import StartGate, new_run_id
from vmr_handler.host.serve.config import HostConfig
from vmr_handler.host.serve.experiment.experiment import Experiment

pytestmark = pytest.mark.faults

FAST = [
    {"start_time": -1, "executable": "sleep", "arguments": "0.2"},
    {"start_time": 1, "executable": "/bin/echo", "arguments": "fires"},
]


def _slow(seconds: float) -> List[Dict[str, Any]]:
    return [
        {"start_time": -1, "executable": "sleep", "arguments": str(seconds)},
        {"start_time": 1, "executable": "/bin/echo", "arguments": "fires"},
    ]


class Runs:
    """One broker, one experiment name, and every env (run) made on them; closed at the end."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.experiment = f"runs-{uuid.uuid4().hex[:8]}"
        self.envs: List[HostEnv] = []

    def env(self, schedules: Dict[str, Any], start_buffer: float = 1.0) -> HostEnv:
        env = HostEnv(schedules, start_buffer, "mqtt", broker=self.broker, experiment=self.experiment)
        self.envs.append(env)
        return env

    def retained(self, leaf: str, pred: Any = bool, timeout: float = 30.0) -> Dict[str, Any]:
        """The retained JSON message on ``vmr/<experiment>/<leaf>`` once ``pred`` holds for it."""
        deadline = time.monotonic() + timeout
        topic = f"vmr/{self.experiment}/{leaf}"
        while time.monotonic() < deadline:
            payload = _peek(self.broker.port, topic)
            doc = json.loads(payload) if payload else None
            if doc is not None and pred(doc):
                return doc  # type: ignore[no-any-return]
            time.sleep(0.2)
        raise AssertionError(f"no retained message on {topic} as wanted")


def _peek(port: int, topic: str) -> Optional[bytes]:
    """The retained message on ``topic`` (None when there is none within 1 s)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    got: List[bytes] = []
    done = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"peek-{uuid.uuid4().hex[:8]}")

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        got.append(msg.payload)
        done.set()

    client.on_message = on_message
    client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
    client.connect("127.0.0.1", port)
    client.loop_start()
    done.wait(1.0)
    client.loop_stop()
    client.disconnect()
    return got[0] if got else None


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    broker = Broker(tmp_path / "broker").start()
    made = Runs(broker)
    yield made
    for env in reversed(made.envs):
        env.close()
    broker.close()


def _fired(env: HostEnv, vm: str) -> Dict[str, Any]:
    return env.wait_event(vm, "entry_started", index=1)["event"]["data"]  # type: ignore[no-any-return]


def _start_sets(env: HostEnv, vm: str) -> List[float]:
    return [r["event"]["data"]["start_time"] for r in env.events(vm, "start_time_set")]


# --------------------------------------------------------------------------- stale retained
def test_a_stale_announcement_of_an_earlier_run_does_not_start_the_coordinator(runs: Runs) -> None:
    # run 1: member h2 announces its VM b as configured (retained), then everything stops
    old = runs.env({"b": FAST})
    old.start_host("--member", "--host-id", "h2")
    old.start_agent("b")
    old.wait_event("b", "configured")
    # (a coordinator of run 1 is needed for h2 to announce: it answers that coordinator's run)
    old_coord = runs.env({"x": FAST})
    old_coord.start_host("--coordinator", "--peers", "h2", "--host-id", "h1")
    stale = runs.retained("_hosts/h2/state", lambda d: "b" in d.get("configured", {}))
    old.close()
    old_coord.close()
    # run 2, new logs: the coordinator's own VM configures; b's stale announcement is retained
    h1 = runs.env({"a": FAST})
    h1.start_host("--coordinator", "--peers", "h2", "--host-id", "h1")
    h1.start_agent("a")
    h1.wait_event("a", "configured")
    h1.wait_for(lambda: "announcement from host h2 ignored" in h1.host_log(), "the stale announcement seen")
    experiment = h1.status()["experiment"]
    assert experiment["start_time"] is None, experiment
    assert experiment["waiting_for"] == ["host:h2"]
    assert stale["coordinator_run"] in h1.host_log()  # named in the warning
    # h2 of run 2 (new logs) answers this run: the start waits for its b, then both fire together
    h2 = runs.env({"b": _slow(1.0)})
    h2.start_host("--member", "--host-id", "h2")
    h2.start_agent("b")
    b_conf = h2.wait_event("b", "configured")
    a_fire, b_fire = _fired(h1, "a"), _fired(h2, "b")
    assert a_fire["scheduled"] == b_fire["scheduled"]
    start = h1.status()["experiment"]["start_time"]
    # the slowest VM of this run (b, on h2) + the buffer, not the stale announcement's b
    assert start == pytest.approx(h2.status()["experiment"]["configured"]["b"] + 1.0, abs=1e-6)
    assert b_conf["host_received"] <= start


def test_a_stale_retained_start_of_an_earlier_run_is_not_taken_by_an_agent(runs: Runs) -> None:
    sched = _slow(0.5)
    old = runs.env({"a": sched}, start_buffer=0.5)
    old.start_host()
    old.start_agent("a")
    old.wait_event("a", "start_time_set")
    old_status = old.status()["experiment"]
    old_run, old_start = old_status["run_id"], old_status["start_time"]
    old.close()
    time.sleep(1.0)
    # run 2: a new VM (fresh state) connects before its new host: the broker hands it run 1's
    # retained start at once; it must wait for its host's run and ignore that start
    new = runs.env({"a": sched}, start_buffer=0.5)
    new.start_agent("a")
    runs.retained("a/presence", lambda d: d.get("state") == "online")  # subscribed: it has the start
    time.sleep(1.0)
    new.start_host()
    new.wait_event("a", "entry_started", index=1)
    status = new.status()["experiment"]
    assert status["run_id"] != old_run
    assert _start_sets(new, "a") == [status["start_time"]]
    assert status["start_time"] > old_start
    assert f"is of run {old_run}" in new.agent_log("a")  # it had the stale start, and ignored it
    assert json.loads((new.state("a") / "host-run.json").read_text()) == {"run": status["run_id"]}


# --------------------------------------------------------------------------- coordinator kill -9
def _two_hosts(runs: Runs, a: Any, b: Any, start_buffer: float) -> List[HostEnv]:
    h1 = runs.env({"a": a}, start_buffer=start_buffer)
    h2 = runs.env({"b": b}, start_buffer=start_buffer)
    h1.start_host("--coordinator", "--peers", "h2", "--host-id", "h1")
    h2.start_host("--member", "--host-id", "h2")
    h1.start_agent("a")
    h2.start_agent("b")
    return [h1, h2]


def test_coordinator_killed_mid_barrier_and_restarted_carries_the_experiment_on(runs: Runs) -> None:
    h1, h2 = _two_hosts(runs, FAST, _slow(5.0), start_buffer=1.0)
    h1.wait_event("a", "configured")
    h1.wait_for(lambda: h1.status()["experiment"]["waiting_for"] == ["b"], "the coordinator waiting for b")
    run = h1.status()["experiment"]["run_id"]
    h1.kill_host()  # kill -9 at the barrier
    b_conf = h2.wait_event("b", "configured")  # while the coordinator is down
    time.sleep(0.5)
    assert h2.status()["experiment"]["start_time"] is None  # nobody else decides
    h1.start_host("--coordinator", "--peers", "h2", "--host-id", "h1")
    a_fire, b_fire = _fired(h1, "a"), _fired(h2, "b")
    assert a_fire["scheduled"] == b_fire["scheduled"]
    s1, s2 = h1.status(), h2.status()
    assert s1["experiment"]["run_id"] == run  # same logs, same run
    assert s1["experiment"]["start_time"] == s2["experiment"]["start_time"]
    b_at = s2["experiment"]["configured"]["b"]
    assert s1["experiment"]["start_time"] == pytest.approx(b_at + 1.0, abs=1e-6)
    assert b_conf["host_received"] <= s1["experiment"]["start_time"]
    assert s1["peers"] == {"h2": ["b"]}
    for env, vm in ((h1, "a"), (h2, "b")):
        env.wait_event(vm, "schedule_complete")
        ids = [r["event"]["id"] for r in env.events(vm)]
        assert len(ids) == len(set(ids))


def test_coordinator_killed_after_the_start_and_restarted_carries_the_experiment_on(runs: Runs) -> None:
    late = [
        {"start_time": -1, "executable": "sleep", "arguments": "0.2"},
        {"start_time": 4, "executable": "/bin/echo", "arguments": "fires"},
    ]
    h1, h2 = _two_hosts(runs, late, late, start_buffer=1.0)
    start = h1.wait_for(lambda: h1.status()["experiment"]["start_time"], "the start decided")
    h2.wait_for(lambda: h2.status()["experiment"]["start_time"] == start, "the member adopting it")
    h1.kill_host()  # kill -9 after the start was decided, before the VMs fire
    b_fire = _fired(h2, "b")  # the member's VM runs meanwhile
    h1.start_host("--coordinator", "--peers", "h2", "--host-id", "h1")
    a_fire = _fired(h1, "a")
    assert a_fire["scheduled"] == b_fire["scheduled"] == pytest.approx(start + 4.0)
    s1 = h1.status()
    assert s1["experiment"]["start_time"] == start
    assert s1["peers"] == {"h2": ["b"]}
    assert _start_sets(h1, "a") == [start]  # the restarted coordinator never decided another
    announced = runs.retained("_hosts/_start", lambda d: d.get("start_time") is not None, timeout=10)
    assert announced["start_time"] == start and announced["run"] == s1["experiment"]["run_id"]


# --------------------------------------------------------------------------- one start per host
def test_each_hosts_vms_take_their_hosts_start_only(runs: Runs) -> None:
    """Each host publishes its start once for all its VMs on ``_hosts/<host>/start``; every
    agent reads every host's and takes only its own host's run's."""
    h1, h2 = _two_hosts(runs, FAST, FAST, start_buffer=1.0)
    _fired(h1, "a"), _fired(h2, "b")
    e1, e2 = h1.status()["experiment"], h2.status()["experiment"]
    assert e1["start_time"] == e2["start_time"] and e1["run_id"] != e2["run_id"]
    for host, run in (("h1", e1["run_id"]), ("h2", e2["run_id"])):
        payload = _peek(runs.broker.port, f"vmr/{runs.experiment}/_hosts/{host}/start")
        assert payload is not None and json.loads(payload)["events"][0]["data"]["run"] == run
    for env, vm, own, other in ((h1, "a", e1, e2), (h2, "b", e2, e1)):
        assert _start_sets(env, vm) == [own["start_time"]]  # once: its own host's
        assert json.loads((env.state(vm) / "host-run.json").read_text()) == {"run": own["run_id"]}
        ignored = f"is of run {other['run_id']}"  # it had the other host's start, and ignored it
        env.wait_for(lambda env=env, vm=vm, ignored=ignored: ignored in env.agent_log(vm), f"{vm}: {ignored}")


# --------------------------------------------------------------------------- the pure rules
def _start(ident: str, run: Optional[str]) -> Event:
    data: Dict[str, Any] = {"start_time": 1000.0}
    if run is not None:
        data["run"] = run
    return Event(START_TIME, 1.0, ident, data)


def test_start_gate_holds_until_the_hosts_run_is_known_and_ignores_other_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "host-run.json")
    gate = StartGate(path)
    assert gate.offer(Event(SCHEDULE, 1.0, "s", {}))  # only start times are gated
    assert not gate.offer(_start("old", "run-old"))  # run unknown: held
    assert not gate.offer(_start("new", "run-new"))
    with caplog.at_level(logging.WARNING):
        assert [e.id for e in gate.welcomed("run-new")] == ["new"]
        assert not gate.offer(_start("old", "run-old"))  # logged once per run
        assert not gate.offer(_start("none", None))
    assert sum("run-old" in r.getMessage() for r in caplog.records) == 1
    assert gate.offer(_start("new", "run-new"))
    # an agent restarted on its state dir knows the run at once
    again = StartGate(path)
    assert again.known and again.offer(_start("new", "run-new")) and not again.offer(_start("x", "run-x"))


def test_start_gate_with_a_host_without_run_ids_accepts_as_before(tmp_path: Path) -> None:
    gate = StartGate(None)
    assert not gate.offer(_start("a", None))
    assert [e.id for e in gate.welcomed(None)] == ["a"]
    assert gate.offer(_start("b", None))
    assert not gate.offer(_start("c", "run-of-a-newer-host"))
    for garbage in (5, "", "x" * 65, ["run"]):
        assert StartGate(None).welcomed(garbage) == []


def test_start_gate_welcome_handler_replays_held_starts(tmp_path: Path) -> None:
    gate = StartGate(None)
    applied: List[str] = []

    async def control(event: Event) -> None:
        applied.append(event.id)

    async def welcome(event: Event) -> None:
        applied.append("welcome")

    async def scenario() -> None:
        await gate.guard(control)(_start("held", "run-1"))
        await gate.guard(control)(_start("stale", "run-0"))
        await gate.on_welcome(welcome, control)(Event("welcome", 1.0, "w", {"run": "run-1"}))
        await gate.guard(control)(_start("again", "run-1"))

    asyncio.run(scenario())
    assert applied == ["welcome", "held", "again"]


def _experiment(tmp_path: Path, role: str, **kw: Any) -> Experiment:
    config = HostConfig(
        vms={}, expected=frozenset(kw.pop("expected", ["a"])), logs=str(tmp_path), channels=str(tmp_path),
        start_buffer=1.0, host_id=kw.pop("host_id", "h1"), role=role, **kw,
    )  # fmt: skip
    exp = Experiment(config, {})
    exp.load()
    return exp


def test_coordinator_takes_only_announcements_answering_its_run(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, "coordinator", peers=frozenset({"h2"}))
    exp.on_configured("a", 100.0)
    stale = {"expected": ["b"], "configured": {"b": 50.0}, "run": "run-m", "coordinator_run": "run-old"}
    exp.on_peer_state("h2", stale)
    exp.on_peer_state("h2", {**stale, "coordinator_run": None})  # a host without run ids
    assert exp.barrier.start_time is None and exp.barrier.waiting_for() == ["host:h2"]
    exp.on_peer_state("h2", {**stale, "coordinator_run": exp.run_id})
    assert exp.barrier.start_time == 101.0
    announced = exp.start_announcement()
    assert announced["run"] == exp.run_id and announced["start_time"] == 101.0
    # a restart on the same logs keeps the run, the start and the peers' VMs
    again = _experiment(tmp_path, "coordinator", peers=frozenset({"h2"}))
    assert (again.run_id, again.barrier.start_time, again.peer_vms) == (exp.run_id, 101.0, {"h2": ["b"]})
    assert "host:h2" not in again.barrier.expected and "b" in again.barrier.expected
    # new logs: a new run
    assert _experiment(tmp_path / "other", "coordinator", peers=frozenset({"h2"})).run_id != exp.run_id


def test_member_answers_the_coordinators_run_and_adopts_only_its_start(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, "member", host_id="h2", expected=["b"])
    exp.on_configured("b", 50.0)
    assert exp.host_state() is None  # nothing to announce before the coordinator's run is known
    exp.on_coordinator_start({"run": "run-c", "coordinator": "h1", "start_time": None})
    state = exp.host_state()
    assert state is not None and state["coordinator_run"] == "run-c" and state["run"] == exp.run_id
    exp.on_coordinator_start({"start_time": 60.0, "configured": {"b": 50.0}})  # no run: ignored
    assert exp.barrier.start_time is None
    exp.on_coordinator_start({"run": "run-c2", "start_time": 60.0, "configured": {"b": 40.0}})  # stale
    assert exp.barrier.start_time is None and exp.coordinator_run == "run-c2"
    exp.on_coordinator_start({"run": "run-c2", "start_time": 51.0, "configured": {"b": 50.0}})
    assert exp.barrier.start_time == 51.0
    event = exp.start_event()
    assert event is not None and event.data == {"start_time": 51.0, "run": exp.run_id}


def test_new_run_ids_differ() -> None:
    ids = {new_run_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("run-") and len(i) == 20 for i in ids)
