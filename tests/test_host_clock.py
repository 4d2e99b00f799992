"""The host's timing rules on a fake clock: exact instants, no sleeping.

The serving process takes a :class:`~vmr_handler.core.clock.Clock` when made (the experiment,
the sessions, the event maker); here a :class:`~vmr_handler.core.clock.FakeClock` drives a real
:class:`~vmr_handler.host.serve.experiment.experiment.Experiment` and real
:class:`~vmr_handler.host.serve.session.session.VmSession`\\ s (their logs on disk, a link that
keeps what is sent): the barrier's start and release, a peer marked silent exactly after
``silent_after``, heartbeats after send silence (neither over a transport that tells liveness,
MQTT), RESUME stamps before and after the start, what a handshake re-sends (nothing the agent
holds; once per agent connection when hellos cross), the clock answers and the debounced save.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from vmr_handler.core.clock import FakeClock
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import FrameDecoder, encode_message
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.serve.config import HostConfig, Limits, VmSpec
from vmr_handler.host.serve.experiment.experiment import DEBOUNCE, Experiment
from vmr_handler.host.serve.files.resources import ResourceStore
from vmr_handler.host.serve.files.transfers import TransferStore
from vmr_handler.host.serve.session.api import HostEvents
from vmr_handler.host.serve.session.session import VmSession

T0 = 1_800_000_000.0
SCHEDULE = b"entries: []\n"
BUFFER = 10.0


class KeptLink:
    """A session's link that keeps every frame sent (never closes by itself)."""

    def __init__(self) -> None:
        self.sent: List[bytes] = []
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self._closed = True

    def events(self) -> List[Tuple[float, Event]]:
        """Every event sent so far with its frame's ``now``, in order."""
        decoder = FrameDecoder()
        return [(m.now, ev) for m in decoder.feed(b"".join(self.sent)) for ev in m.events]

    def types(self) -> List[str]:
        return [ev.type for _now, ev in self.events()]


class Host:
    """An experiment of ``vms`` (all expected) on a fake clock, with a session per VM."""

    def __init__(self, root: Path, vms: Tuple[str, ...] = ("vm1",), limits: Optional[Limits] = None) -> None:
        self.clock = FakeClock(T0)
        self.limits = limits or Limits()
        specs = {
            vm: VmSpec(vm, str(root / f"{vm}.yaml"), SCHEDULE, hashlib.sha256(SCHEDULE).hexdigest(), "yaml")
            for vm in vms
        }
        config = HostConfig(
            vms=specs, expected=frozenset(vms), logs=str(root), channels=str(root), start_buffer=BUFFER
        )
        self.sessions: Dict[str, VmSession] = {}
        self.experiment = Experiment(config, self.sessions, self.clock)
        events = HostEvents(self.clock)
        for vm, spec in specs.items():
            vmlog = VmLog(str(root), vm, self.limits.log_quota)
            transfers = TransferStore(str(root), vm, self.limits.transfer_file, self.limits.transfer_total)
            session = VmSession(
                spec, True, self.limits, vmlog, transfers, ResourceStore(None), self.experiment, events, {},
                clock=self.clock,
            )  # fmt: skip
            transfers.open()
            vmlog.open(replay=session.apply)
            self.sessions[vm] = session
        self.experiment.replayed()
        self._n = 0

    def connect(self, vm: str = "vm1", transport_liveness: bool = False) -> KeptLink:
        link = KeptLink()
        assert self.sessions[vm].attach(link, self.clock.time(), transport_liveness)
        return link

    def agent_says(self, to: str, type_: str, **data: Any) -> None:
        """A frame of one agent event reaches VM ``to``'s session now."""
        self._n += 1
        ev = Event(type_, self.clock.time(), f"{to}-ev-{self._n}", data)
        self.sessions[to].feed(encode_message([ev], self.clock.time()), self.clock.time())

    def hello(self, vm: str = "vm1", journal: Optional[Dict[str, Any]] = None, **more: Any) -> None:
        self.agent_says(
            vm, "hello", protocol=1, agent_version="t", boot_id="b1", vm=vm, journal=journal or {}, **more
        )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---------------------------------------------------------------------------- the barrier
def test_the_start_is_the_last_configured_receive_time_plus_the_buffer(tmp_path: Path) -> None:
    host = Host(tmp_path, ("a", "b"))

    async def main() -> None:
        await host.clock.advance(1.0)
        host.connect("a")
        host.agent_says("a", "configured", at=T0)  # the agent's own time is not what counts
        await host.clock.advance(2.5)
        assert host.experiment.barrier.start_time is None
        host.connect("b")
        host.agent_says("b", "configured", at=T0)

    run(main())
    barrier = host.experiment.barrier
    assert barrier.configured == {"a": T0 + 1.0, "b": T0 + 3.5}
    assert barrier.start_time == T0 + 3.5 + BUFFER
    assert host.experiment.start_set_at == T0 + 3.5
    start = host.experiment.start_event()
    assert start is not None and start.timestamp == T0 + 3.5 and start.data["start_time"] == T0 + 13.5


def test_a_release_starts_at_the_later_of_now_and_the_last_configured_plus_the_buffer(tmp_path: Path) -> None:
    host = Host(tmp_path, ("a", "b", "c"))

    async def main() -> None:
        await host.clock.advance(2.0)
        host.experiment.on_configured("a", host.clock.time())
        await host.clock.advance(5.0)
        host.experiment.release(["b"])  # c still missing: no start yet
        assert host.experiment.barrier.start_time is None
        await host.clock.advance(0.25)
        host.experiment.release([])  # without whoever is still missing, now

    run(main())
    barrier = host.experiment.barrier
    assert barrier.excluded == {"b"} and barrier.released == {"c"}
    assert barrier.released_at == T0 + 7.25
    assert barrier.start_time == T0 + 7.25 + BUFFER
    assert host.experiment.start_set_at == T0 + 7.25


def test_a_release_with_nobody_configured_starts_a_buffer_after_now(tmp_path: Path) -> None:
    host = Host(tmp_path, ("a",))
    run(host.clock.advance(42.0))
    host.experiment.release([])
    assert host.experiment.barrier.start_time == T0 + 42.0 + BUFFER


def test_the_start_reaches_a_connected_vm_the_instant_it_is_set(tmp_path: Path) -> None:
    host = Host(tmp_path, ("a", "b"))
    link = host.connect("a")
    host.hello("a")
    assert "start_time" not in link.types()
    run(host.clock.advance(3.0))
    host.experiment.on_configured("a", host.clock.time())
    host.experiment.on_configured("b", host.clock.time())
    sent = [(now, ev) for now, ev in link.events() if ev.type == "start_time"]
    assert len(sent) == 1
    now, ev = sent[0]
    assert now == T0 + 3.0 and ev.data["start_time"] == T0 + 3.0 + BUFFER


# ---------------------------------------------------------------------------- liveness
def test_a_peer_is_silent_exactly_after_silent_after_and_talks_again_with_a_frame(tmp_path: Path) -> None:
    limits = Limits(heartbeat=1000.0, silent_after=15.0)
    host = Host(tmp_path, limits=limits)
    session = host.sessions["vm1"]

    async def main() -> None:
        host.connect()
        await host.clock.advance(14.999)
        session.tick(host.clock.time())
        assert not session.silent
        await host.clock.advance(0.001)
        session.tick(host.clock.time())
        assert session.silent
        await host.clock.advance(100.0)
        host.agent_says("vm1", "heartbeat")
        assert not session.silent and session.state.last_seen == T0 + 115.0
        await host.clock.advance(14.5)  # silence counts from the last frame
        session.tick(host.clock.time())
        assert not session.silent
        await host.clock.advance(0.5)
        session.tick(host.clock.time())
        assert session.silent

    run(main())
    notes = (tmp_path / "vm1.log").read_text()
    assert notes.count("peer silent for 15 s") == 2 and notes.count("peer talks again") == 1


def test_a_bad_frame_also_shows_the_peer_alive(tmp_path: Path) -> None:
    host = Host(tmp_path, limits=Limits(heartbeat=1000.0, silent_after=15.0))
    session = host.sessions["vm1"]

    async def main() -> None:
        host.connect()
        await host.clock.advance(20.0)
        session.tick(host.clock.time())
        assert session.silent
        session.feed(b"not json\n", host.clock.time())
        assert not session.silent

    run(main())


def test_a_heartbeat_is_sent_after_send_silence_and_not_before(tmp_path: Path) -> None:
    host = Host(tmp_path, limits=Limits(heartbeat=5.0, silent_after=1000.0))
    session = host.sessions["vm1"]
    beats: List[float] = []

    async def main() -> None:
        link = host.connect()  # sends the connect prefix and hello: send silence starts now
        for step in (4.999, 0.001, 2.0, 2.999, 0.001):
            await host.clock.advance(step)
            session.tick(host.clock.time())
            beats[:] = [now for now, ev in link.events() if ev.type == "heartbeat"]
        assert beats == [T0 + 5.0, T0 + 10.0]
        await host.clock.advance(4.0)
        host.hello()  # the welcome is a send: the next heartbeat is due 5 s after it
        await host.clock.advance(4.5)
        session.tick(host.clock.time())
        assert [now for now, ev in link.events() if ev.type == "heartbeat"] == beats
        await host.clock.advance(0.5)
        session.tick(host.clock.time())
        assert [now for now, ev in link.events() if ev.type == "heartbeat"] == [*beats, T0 + 19.0]

    run(main())


def test_no_heartbeat_and_no_silence_without_a_connection(tmp_path: Path) -> None:
    host = Host(tmp_path, limits=Limits(heartbeat=1.0, silent_after=2.0))
    session = host.sessions["vm1"]
    run(host.clock.advance(100.0))
    session.tick(host.clock.time())
    assert not session.silent and session.link is None


def test_over_a_transport_that_tells_liveness_the_peer_is_never_silent_nor_heartbeaten(
    tmp_path: Path,
) -> None:
    """MQTT: the broker's keep-alive and the agent's last will say whether it is there."""
    host = Host(tmp_path, limits=Limits(heartbeat=5.0, silent_after=15.0))
    session = host.sessions["vm1"]

    async def main() -> None:
        link = host.connect(transport_liveness=True)
        host.hello(heartbeats=False, connection="c1")
        for _ in range(10):
            await host.clock.advance(30.0)
            session.tick(host.clock.time())
        assert not session.silent and "heartbeat" not in link.types()
        status = session.status(None, host.clock.time())
        assert status["silent"] is False and status["gone_for"] is None and status["state"] != "lost"

    run(main())
    assert "peer silent" not in (tmp_path / "vm1.log").read_text()


def test_an_agent_that_wants_heartbeats_gets_them_over_any_transport(tmp_path: Path) -> None:
    """An older agent (no ``heartbeats: false`` in its hello) watches the host's silence. Over
    MQTT it gets none before its hello asks (a restarted host does not heartbeat every VM while
    their hellos come back)."""
    host = Host(tmp_path, limits=Limits(heartbeat=5.0, silent_after=15.0))
    session = host.sessions["vm1"]

    async def main() -> None:
        link = host.connect(transport_liveness=True)
        await host.clock.advance(12.0)  # the hello takes its time
        session.tick(host.clock.time())
        assert "heartbeat" not in link.types()
        host.hello()
        await host.clock.advance(5.0)
        session.tick(host.clock.time())
        assert link.types().count("heartbeat") == 1
        await host.clock.advance(100.0)
        session.tick(host.clock.time())
        assert not session.silent  # its presence, not its frames, says it is there

    run(main())


def test_crossing_hellos_of_one_agent_connection_get_the_schedule_once(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.experiment.on_configured("vm1", host.clock.time())
    run(host.clock.advance(BUFFER + 1.0))
    record, _sent = host.experiment.resume(["vm1"])
    link = host.connect(transport_liveness=True)
    host.hello(connection="c1")  # its own hello
    host.hello(connection="c1")  # its answer to the host's hello, which came late
    assert link.types().count("welcome") == 2
    assert [link.types().count(t) for t in ("schedule", "start_time", "resume")] == [1, 1, 1]
    assert host.sessions["vm1"].handshakes == 2
    host.hello(connection="c2")  # a new connection of the agent (it may have lost what was sent)
    assert [link.types().count(t) for t in ("schedule", "start_time", "resume")] == [2, 2, 2]
    assert record.id in [ev.id for _now, ev in link.events() if ev.type == "resume"]


def test_a_handshake_sends_no_start_the_agent_journal_holds(tmp_path: Path) -> None:
    """A restarted host: the agent's journal holds this schedule and this start."""
    host = Host(tmp_path)
    host.experiment.on_configured("vm1", host.clock.time())
    run(host.clock.advance(BUFFER + 1.0))
    session = host.sessions["vm1"]
    start = T0 + BUFFER
    link = host.connect()
    host.hello(journal={"digest": session.spec.digest, "start_time": start, "configured_at": T0})
    assert link.types().count("welcome") == 1
    assert "schedule" not in link.types() and "start_time" not in link.types()
    assert session.state.start_acked
    host.hello(journal={"digest": session.spec.digest, "start_time": start - 1.0}, connection="c2")
    assert link.types().count("start_time") == 1  # another start in its journal: this one is sent


# ---------------------------------------------------------------------------- RESUME
def test_a_resume_before_the_start_is_stamped_minus_infinity(tmp_path: Path) -> None:
    host = Host(tmp_path)
    run(host.clock.advance(7.0))
    record, sent = host.experiment.resume(["vm1"])
    assert record.at == -math.inf and record.issued == T0 + 7.0 and sent == []
    assert record.event().data == {"at": "-inf"} and record.event().timestamp == T0 + 7.0


def test_a_resume_is_stamped_with_host_experiment_time_now_minus_start(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.experiment.on_configured("vm1", host.clock.time())  # start = T0 + BUFFER
    run(host.clock.advance(4.0))
    early, _ = host.experiment.resume(["vm1"])  # set but not reached: negative experiment time
    run(host.clock.advance(BUFFER - 4.0 + 7.5))
    late, _ = host.experiment.resume(["vm1"])
    assert early.at == 4.0 - BUFFER and late.at == 7.5
    assert late.event().data == {"at": 7.5} and late.issued == T0 + BUFFER + 7.5


def test_a_handshake_re_sends_the_start_and_the_resumes_not_answered(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.experiment.on_configured("vm1", host.clock.time())
    run(host.clock.advance(BUFFER + 2.0))
    record, sent = host.experiment.resume(["vm1"])  # not connected: pending
    assert sent == []
    run(host.clock.advance(30.0))
    link = host.connect()
    host.hello()
    events = {ev.type: (now, ev) for now, ev in link.events()}
    assert {"welcome", "schedule", "start_time", "resume"} <= set(events)
    now, resume = events["resume"]
    assert now == T0 + BUFFER + 32.0  # sent now ...
    assert resume.id == record.id and resume.data == {"at": 2.0}  # ... stamped when it was issued
    assert events["welcome"][1].data["resumes"] == [record.id]
    assert events["start_time"][1].data["start_time"] == T0 + BUFFER
    host.agent_says("vm1", "result", answers=record.id, status="success", details="resumed")
    assert set(host.experiment.resumes[0].answered) == {"vm1"}
    host.sessions["vm1"].detach(link, host.clock.time())
    run(host.clock.advance(60.0))
    link2 = host.connect()
    host.hello()
    again = link2.types()
    assert "start_time" in again and "resume" not in again  # answered: not sent again


# ---------------------------------------------------------------------------- clock answers, saves
def test_a_clock_answer_stamps_t2_at_receipt_and_t3_on_the_host_clock(tmp_path: Path) -> None:
    host = Host(tmp_path)
    link = host.connect()
    run(host.clock.advance(3.0))
    host.agent_says("vm1", "clock_req", t1=T0 - 100.0)
    ((now, resp),) = [(n, ev) for n, ev in link.events() if ev.type == "clock_resp"]
    assert resp.data["t1"] == T0 - 100.0 and resp.data["t2"] == T0 + 3.0
    assert resp.data["t3"] >= T0 + 3.0 and now == T0 + 3.0


def test_a_configured_vm_is_saved_debounced_on_the_host_clock(tmp_path: Path) -> None:
    host = Host(tmp_path, ("a", "b"))
    saved = tmp_path / "experiment.json"

    async def main() -> None:
        before = saved.read_text()
        host.experiment.on_configured("a", host.clock.time())
        await host.clock.advance(DEBOUNCE * 0.99)
        assert saved.read_text() == before
        await host.clock.advance(DEBOUNCE * 0.01)
        assert '"a"' in saved.read_text()

    run(main())


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_event_times_follow_the_host_clock(tmp_path: Path, offset: float) -> None:
    host = Host(tmp_path)
    run(host.clock.advance(offset))
    ev = host.sessions["vm1"].events.make("heartbeat", {})
    assert ev.timestamp == T0 + offset


# ---------------------------------------------------------------------------- the server's ticker
def test_the_server_ticks_its_sessions_on_its_clock(tmp_path: Path) -> None:
    """``HostServer`` hands its clock to the experiment and the sessions; its ticker wakes every
    ``min(1, heartbeat / 2, silent_after / 2)`` s of that clock: a heartbeat at the first tick
    after ``heartbeat`` s of send silence, the peer silent at the first tick after
    ``silent_after`` s without a frame."""
    from vmr_handler.host.serve.server import HostServer

    clock = FakeClock(T0)
    limits = Limits(heartbeat=4.0, silent_after=10.0)  # ticks every second
    spec = VmSpec("vm1", str(tmp_path / "vm1.yaml"), SCHEDULE, hashlib.sha256(SCHEDULE).hexdigest(), "yaml")
    config = HostConfig(
        vms={"vm1": spec},
        expected=frozenset({"vm1"}),
        logs=str(tmp_path),
        channels=str(tmp_path),
        limits=limits,
    )
    server = HostServer(config, lambda config, experiment: None, clock=clock)  # type: ignore[arg-type,return-value]
    assert server.experiment.clock is clock and server.events.clock is clock
    vmlog = VmLog(str(tmp_path), "vm1", limits.log_quota)
    transfers = TransferStore(str(tmp_path), "vm1", limits.transfer_file, limits.transfer_total)
    session = VmSession(
        spec,
        True,
        limits,
        vmlog,
        transfers,
        server.resources,
        server.experiment,
        server.events,
        {},
        clock=clock,
    )
    transfers.open()
    vmlog.open(replay=session.apply)
    server.sessions["vm1"] = session
    link = KeptLink()

    async def main() -> None:
        ticker = asyncio.ensure_future(server._ticker())
        try:
            await clock.advance(0)
            assert session.attach(link, clock.time())
            await clock.advance(3.5)  # ticks at T0+1, +2, +3
            assert "heartbeat" not in link.types()
            await clock.advance(0.5)  # the tick at T0+4
            beats = [now for now, ev in link.events() if ev.type == "heartbeat"]
            assert beats == [T0 + 4.0] and not session.silent
            await clock.advance(5.5)
            assert not session.silent
            await clock.advance(0.5)  # the tick at T0+10
            assert session.silent
            assert [now for now, ev in link.events() if ev.type == "heartbeat"] == [T0 + 4.0, T0 + 8.0]
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)

    run(main())
