"""A host ``VmSession`` over the in-memory transport, no socket and no subprocess (and over
the broker's per-VM channel, with a stand-in for the broker connection).

The host's end of ``transports.memory.memory_pair()`` is served exactly as a unix socket
connection is (``host.links.serve_channel``: the ``ChannelLink`` send queue and the session
reader); the other end is a scripted agent speaking ``docs/protocol.md``: hello -> welcome,
the schedule delivered and acknowledged, reports acknowledged and stored once, hostile frames
counted, the connection ending from either side, and the link's own rules (write overflow,
back-pressure, the download budget).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, List, Optional

import pytest
import yaml

from tests.hostfakes import make_session
from vmr_handler.core.clock import SystemClock
from vmr_handler.core.errors import ChannelClosed, LinkLost
from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import FrameDecoder, encode_message
from vmr_handler.host.serve.channels.links import ChannelLink, serve_channel
from vmr_handler.host.serve.channels.mqtt import MqttService
from vmr_handler.host.serve.config import Limits
from vmr_handler.host.serve.session.session import VmSession
from vmr_handler.transports.memory import MemoryChannel, memory_pair
from vmr_handler.transports.mqtt.options import MqttOptions
from vmr_handler.transports.mqtt.topics import Topics

WAIT = 10.0  # bound of every wait, seconds (a bound, not a speed assertion)
SCHEDULE = yaml.safe_dump(
    [{"start_time": -10, "executable": "/bin/true"}, {"start_time": 5, "executable": "/bin/true"}]
).encode()
DIGEST = hashlib.sha256(SCHEDULE).hexdigest()


class ScriptedAgent:
    """The agent's end of the pair: sends what a test says, collects what the host sends."""

    def __init__(self, channel: MemoryChannel) -> None:
        self.channel = channel
        self.decoder = FrameDecoder()
        self.inbox: List[Event] = []
        self.prefix = uuid.uuid4().hex[:8]
        self.counter = 0

    def event(self, type_: str, **data: Any) -> Event:
        self.counter += 1
        return Event(type_, time.time(), f"{self.prefix}-{self.counter:08d}", data)

    async def send(self, *events: Event) -> List[str]:
        await self.channel.write(encode_message(list(events), time.time()))
        return [e.id for e in events]

    async def hello(self, digest: Optional[str] = None) -> None:
        journal = {
            "digest": digest,
            "configured_at": None,
            "start_time": None,
            "stages_done": [],
            "resumes": 0,
        }
        await self.send(
            self.event("hello", protocol=1, agent_version="scripted", boot_id="b1", vm="vm1", journal=journal)
        )

    async def take(self, type_: str) -> Event:
        """The first event of ``type_`` the host sent (reading until it comes)."""

        async def find() -> Event:
            while True:
                for i, ev in enumerate(self.inbox):
                    if ev.type == type_:
                        return self.inbox.pop(i)
                for msg in self.decoder.feed(await self.channel.read()):
                    self.inbox.extend(msg.events)

        return await asyncio.wait_for(find(), WAIT)

    async def handshake(self, digest: Optional[str] = None) -> Event:
        await self.channel.write(b"\n")
        assert (await self.take("hello")).data["protocol"] == 1
        await self.hello(digest)
        return await self.take("welcome")

    async def acked(self, event_id: str) -> None:
        while event_id not in (await self.take("ack")).data["ids"]:
            pass


Body = Callable[[ScriptedAgent, VmSession, "asyncio.Task[None]"], Awaitable[None]]


def run(tmp_path: Path, body: Body, limits: Optional[Limits] = None, pair_limit: int = 1 << 20) -> VmSession:
    """Serve the host end of a fresh pair to a new session and run ``body`` with the agent end."""
    session = make_session(tmp_path, SCHEDULE, limits or Limits())

    async def main() -> None:
        agent_end, host_end = memory_pair(pair_limit)
        serving = asyncio.ensure_future(serve_channel(session, host_end))
        try:
            await asyncio.wait_for(body(ScriptedAgent(agent_end), session, serving), 3 * WAIT)
        finally:
            agent_end.close()
            await asyncio.wait_for(serving, WAIT)

    asyncio.run(main())
    session.log.close()
    return session


def notes(tmp_path: Path) -> str:
    return (tmp_path / "vm1.log").read_text()


def test_hello_welcome_then_the_schedule_delivered_and_acknowledged(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        welcome = await agent.handshake(digest=None)
        assert welcome.data["vm"] == "vm1" and welcome.data["schedule_digest"] == DIGEST
        assert welcome.data["start_time"] is None and welcome.data["resumes"] == []
        schedule = await agent.take("schedule")
        assert base64.b64decode(schedule.data["data_b64"]) == SCHEDULE
        assert schedule.data["sha256"] == DIGEST and schedule.data["format_hint"] == "yaml"
        assert session.connected and session.handshaken and session.state.schedule_state == "sent"
        (result,) = await agent.send(
            agent.event("result", answers=schedule.id, status="success", details="loaded")
        )
        await agent.acked(result)
        assert session.state.schedule_state == "accepted"

    session = run(tmp_path, body)
    assert session.handshakes == 1 and session.connections == 1


def test_an_agent_with_the_schedule_is_not_sent_it_again(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        await agent.handshake(digest=DIGEST)
        (probe,) = await agent.send(agent.event("clock_req", t1=time.time()))
        assert (await agent.take("clock_resp")).data["answers"] == probe
        assert not [e for e in agent.inbox if e.type == "schedule"]
        assert session.state.schedule_state == "accepted"

    run(tmp_path, body)


def test_reports_are_acknowledged_and_a_resent_one_is_stored_once(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        await agent.handshake(digest=DIGEST)
        report = agent.event("stage_started", stage=0, start_time=-10, entries=[0])
        await agent.send(report)
        await agent.acked(report.id)
        await agent.send(report)  # as after a lost ack: acknowledged again, not stored again
        await agent.acked(report.id)
        assert session.log.stored == 1 and session.log.duplicates == 1
        assert session.state.stage == 0 and session.state.stage_running

    run(tmp_path, body)
    stored = [json.loads(line) for line in (tmp_path / "vm1.jsonl").read_text().splitlines()]
    assert [r["event"]["type"] for r in stored] == ["stage_started"]


def test_malformed_and_oversize_frames_are_counted_and_not_fatal(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        await agent.handshake(digest=DIGEST)
        await agent.channel.write(b"{not json\n")
        await agent.channel.write(b'{"pad":"' + b"x" * 8000 + b'"}\n')  # over max_frame
        await agent.channel.write(b"\xff\xfe garbage\n")
        report = agent.event("stage_finished", stage=0, start_time=-10, duration=0.1)
        await agent.send(report)
        await agent.acked(report.id)  # still served
        stats = session.decoder_stats()
        assert stats.malformed >= 2 and stats.oversize == 1
        assert session.connected and not serving.done()

    session = run(tmp_path, body, Limits(max_frame=4096))
    assert "malformed/oversize frame dropped" in notes(tmp_path)
    assert session.status(None, time.time())["frames"]["oversize"] == 1


def test_the_peer_closing_ends_the_connection(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        await agent.handshake(digest=DIGEST)
        agent.channel.close()
        await asyncio.wait_for(serving, WAIT)
        assert not session.connected and session.link is None

    run(tmp_path, body)
    assert "channel disconnected (closed by peer)" in notes(tmp_path)


def test_the_host_closing_ends_the_connection_and_the_peer_sees_it(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        await agent.handshake(digest=DIGEST)
        assert session.link is not None
        session.link.close()  # as the server does when it stops
        await asyncio.wait_for(serving, WAIT)
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(agent.channel.read(), WAIT)

    run(tmp_path, body)
    assert "channel disconnected (closed by host)" in notes(tmp_path)


def test_a_second_connection_is_refused_and_the_first_one_stays(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        await agent.handshake(digest=DIGEST)
        other_agent, other_host = memory_pair()
        await asyncio.wait_for(serve_channel(session, other_host), WAIT)  # returns at once
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(other_agent.read(), WAIT)
        assert session.counters.refused_connections == 1 and session.connected
        (probe,) = await agent.send(agent.event("clock_req", t1=time.time()))
        assert (await agent.take("clock_resp")).data["answers"] == probe

    run(tmp_path, body)


def test_a_peer_that_does_not_read_loses_its_connection_at_the_write_buffer(tmp_path: Path) -> None:
    async def body(agent: ScriptedAgent, session: VmSession, serving: asyncio.Task[None]) -> None:
        await agent.channel.write(b"\n")
        await asyncio.sleep(0.05)  # the hello sits unread in the agent's 1 KiB end
        for i in range(100):  # ~200 KiB of answers at once, never read
            session.refuse(f"r{i}", "x" * 2000)
        assert session.counters.write_overflow == 1 and not session.connected
        await asyncio.wait_for(serving, WAIT)

    run(tmp_path, body, Limits(write_buffer=64 * 1024), pair_limit=1024)
    assert "channel disconnected (closed by host)" in notes(tmp_path)


def test_drain_waits_for_the_peer_then_fails_once_closed() -> None:
    async def main() -> None:
        agent_end, host_end = memory_pair(limit=1000)
        overflows: List[int] = []
        link = ChannelLink(host_end, 10_000, lambda: overflows.append(1), clock=SystemClock())
        link.send_bytes(b"x" * 3000)
        draining = asyncio.ensure_future(link.drain())
        await asyncio.sleep(0.05)
        assert not draining.done()  # 1000 bytes unread at the agent: back-pressure
        got = b""
        while len(got) < 3000:
            got += await agent_end.read()
        await asyncio.wait_for(draining, WAIT)
        link.send_bytes(b"y" * 20_000)  # over the limit at once: dropped, not queued
        assert overflows == [1] and link.closed
        with pytest.raises(LinkLost):
            await link.drain()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(agent_end.read(), WAIT)

    asyncio.run(main())


class FakeBridge:
    """The host's broker connection as a VM's channel uses it: publishes are recorded."""

    url = "mqtt://nowhere:1883"
    closed = False

    def __init__(self) -> None:
        self.published: List[tuple] = []

    def publish_nowait(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, expiry=None
    ) -> bool:
        self.published.append((topic, payload))
        return True


def test_the_broker_channel_feeds_what_came_before_offline_then_detaches(tmp_path: Path) -> None:
    """The service hands each VM's messages to that VM's channel, served by the same link and
    reader: what the VM sent before its ``offline`` is stored and acknowledged, then it detaches."""
    session = make_session(tmp_path, SCHEDULE, Limits())
    topics = Topics("e1", "vm1")
    agent = ScriptedAgent(memory_pair()[0])  # only its event maker is used
    hello = agent.event("hello", protocol=1, agent_version="scripted", boot_id="b1", vm="vm1", journal={})
    report = agent.event("stage_started", stage=0, start_time=-10, entries=[0])

    async def main() -> None:
        server = SimpleNamespace(sessions={"vm1": session}, config=SimpleNamespace(role="standalone"))
        options = MqttOptions(broker=FakeBridge.url, experiment="e1")
        service = MqttService(server, options, host_id="h1", clock=session.clock)
        bridge = FakeBridge()
        for topic, payload in [
            (topics.presence, b'{"state":"online"}'),
            (topics.up, encode_message([hello], time.time())),
            (topics.up, encode_message([report], time.time())),
            (topics.presence, b'{"state":"offline"}'),  # all in one batch, as from a backlog
        ]:
            service._on_message(bridge, topic, payload)
        await asyncio.wait_for(asyncio.gather(*service._serving.values()), WAIT)
        assert not session.connected and session.handshakes == 1
        decoder = FrameDecoder()
        sent = [
            ev.type for t, payload in bridge.published for msg in decoder.feed(payload) for ev in msg.events
        ]
        assert {t for t, _ in bridge.published} == {topics.down}
        assert sent[:3] == ["hello", "welcome", "schedule"] and sent[-1] == "ack"

    asyncio.run(main())
    session.log.close()
    assert session.log.stored == 1
    assert "channel disconnected (VM offline (presence))" in notes(tmp_path)
