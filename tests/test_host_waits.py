"""The host's waits on its clock: download pacing, a reader over its VM's read rate, and the
reconnect back-offs of ``--connect`` and of the broker, each at exact instants of a
:class:`~vmr_handler.core.clock.FakeClock`.

Real parts: in-memory channel pairs, real unix sockets and a real mosquitto; only time is
virtual. A wait the code does on the host's clock is a timer of the fake clock
(:meth:`FakeClock.next_timer`), so its length is read, not timed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, List

import pytest

from tests.broker import Broker, free_port
from tests.test_host_clock import T0, Host
from vmr_handler.core.clock import FakeClock
from vmr_handler.core.events import Event
from vmr_handler.core.ratelimit import TokenBucket
from vmr_handler.core.wire.protocol import encode_message
from vmr_handler.host.serve.channels.links import MAX_READ_PAUSE, ChannelLink, serve_channel
from vmr_handler.host.serve.channels.mqtt import MqttService
from vmr_handler.host.serve.channels.streams import StreamChannels, channel_path
from vmr_handler.host.serve.config import Limits
from vmr_handler.transports.memory import memory_pair
from vmr_handler.transports.mqtt.options import MqttOptions

#: (initial, max) seconds of the reconnect back-offs tested
INITIAL, MAXIMUM = 0.5, 2.0
#: float slack of an instant read back as a length (epoch seconds near 1.8e9)
EPS = 1e-6


async def until(check: Any, what: str) -> None:
    """Let the loop and the threads run (real time) until ``check()`` holds; no assertion on
    how long it took, only that it happens."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def armed(clock: FakeClock) -> float:
    """The instant of the next wait armed on ``clock`` (waiting in real time for the code
    to arm it, e.g. after a connection attempt in a worker thread)."""
    await until(lambda: clock.next_timer() is not None, "a wait armed on the host's clock")
    due = clock.next_timer()
    assert due is not None
    return due


async def backoff_waits(clock: FakeClock, failures: int) -> List[float]:
    """The lengths of the next ``failures`` back-off waits, each passed at its instant."""
    waits = []
    for _ in range(failures):
        due = await armed(clock)
        waits.append(due - clock.time())
        await clock.advance_to(due)
    return waits


def check_backoff(waits: List[float]) -> None:
    """The n-th wait is ``min(INITIAL * 2 ** (n - 1) + jitter, MAXIMUM)``, jitter in
    ``[0, INITIAL]``: 0.5-1.0, 1.0-1.5, then the cap of 2.0 s exactly."""
    assert INITIAL - EPS <= waits[0] <= 2 * INITIAL + EPS, waits
    assert 2 * INITIAL - EPS <= waits[1] <= 3 * INITIAL + EPS, waits
    assert waits[2:] == [pytest.approx(MAXIMUM, abs=EPS)] * (len(waits) - 2), waits


# ---------------------------------------------------------------------------- pacing
def test_a_drain_over_the_download_budget_waits_the_debt_on_the_host_clock_at_most_max_pace() -> None:
    """1000 bytes/s, a 1000-byte burst: 500 bytes pass at once; 3000 more are 2500 over, a
    wait of exactly 2.5 s; 4000 more after that would be 4 s, capped at ``max_pace`` (3 s)."""
    clock = FakeClock(T0)

    async def main() -> None:
        agent_end, host_end = memory_pair()
        budget = TokenBucket(1000.0, 1000.0, clock.monotonic())
        link = ChannelLink(host_end, 1 << 20, lambda: None, budget=budget, max_pace=3.0, clock=clock)
        link.send_bytes(b"a" * 500)
        await link.drain()  # within the burst: no wait armed, none needed
        assert clock.next_timer() is None
        link.send_bytes(b"b" * 3000)
        draining = asyncio.ensure_future(link.drain())
        assert await armed(clock) == T0 + 2.5
        await clock.advance_to(T0 + 2.5 - 0.001)
        assert not draining.done()
        await clock.advance_to(T0 + 2.5)
        await until(draining.done, "the drain ends when the debt is paid")
        draining.result()
        link.send_bytes(b"c" * 4000)
        draining = asyncio.ensure_future(link.drain())
        capped = clock.time() + 3.0
        assert await armed(clock) == capped
        await clock.advance_to(capped)
        await until(draining.done, "the drain ends at max_pace")
        got = b""
        while len(got) < 7500:
            got += await agent_end.read()
        assert got == b"a" * 500 + b"b" * 3000 + b"c" * 4000
        link.close()

    asyncio.run(main())


def test_a_reader_over_its_vms_read_rate_reads_again_after_the_pause_on_the_host_clock(
    tmp_path: Path,
) -> None:
    """1000 bytes/s after a 10-byte burst: a frame of ``n`` bytes read at T0 pauses reading
    ``(n - 10) / 1000`` s, so the next frame is fed exactly then; a pause longer than
    ``MAX_READ_PAUSE`` is cut to it (the reader reads again, and pauses again after)."""
    limits = Limits(read_rate=1000.0, read_burst=10.0, heartbeat=1e6, silent_after=1e6)
    host = Host(tmp_path, limits=limits)
    session = host.sessions["vm1"]
    clock = host.clock

    def frame(n: int, pad: int) -> bytes:
        return encode_message([Event("heartbeat", T0, f"hb-{n}", {"pad": "x" * pad})], T0)

    first, second, third = frame(1, 0), frame(2, 3000), frame(3, 0)

    async def main() -> None:
        agent_end, host_end = memory_pair()
        serving = asyncio.ensure_future(serve_channel(session, host_end))
        await agent_end.write(first)
        await until(lambda: session.state.last_seen == T0, "the first frame fed")
        paused = T0 + (len(first) - 10) / 1000
        assert await armed(clock) == paused
        await agent_end.write(second)
        await clock.advance_to(paused - 0.001)
        assert session.state.last_seen == T0  # read only once the pause is over
        await clock.advance_to(paused)
        await until(lambda: session.state.last_seen == paused, "the second frame fed after the pause")
        capped = paused + MAX_READ_PAUSE  # the 3 KB frame's pause, cut to MAX_READ_PAUSE
        assert len(second) / 1000 > MAX_READ_PAUSE and await armed(clock) == capped
        await agent_end.write(third)
        await clock.advance_to(capped - 0.001)
        assert session.state.last_seen == paused
        await clock.advance_to(capped)  # read again after MAX_READ_PAUSE, though still in debt
        await until(lambda: session.state.last_seen == capped, "the third frame fed after the cut pause")
        agent_end.close()
        await clock.advance(10.0)
        await until(serving.done, "the connection served to its end")

    asyncio.run(main())
    session.log.close()


# ---------------------------------------------------------------------------- --connect
def test_connect_mode_backs_off_on_the_host_clock_and_waits_initial_after_a_connection_ends(
    tmp_path: Path,
) -> None:
    """No socket yet: attempts 0.5-1.0 s, 1.0-1.5 s, then 2.0 s apart on the host's clock.
    The socket appears: the next attempt connects. The connection ends: the next attempt is
    exactly ``initial`` (0.5 s) later."""
    host = Host(tmp_path)
    session = host.sessions["vm1"]
    channels_dir = tempfile.mkdtemp(dir="/tmp", prefix="vhw")  # a short socket path
    config = dataclasses.replace(
        host.experiment.config, connect=True, channels=channels_dir, reconnect=(INITIAL, MAXIMUM)
    )
    channels = StreamChannels(config, host.sessions, host.clock)
    accepted: List[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    async def main() -> None:
        await channels.start(asyncio.Event())
        try:
            check_backoff(await backoff_waits(host.clock, 4))
            qemu = await asyncio.start_unix_server(accept, path=channel_path(channels_dir, "vm1"))
            await host.clock.advance_to(await armed(host.clock))
            await until(lambda: session.connected, "connected at the next attempt")
            assert len(accepted) == 1 and host.clock.next_timer() is None
            accepted[0].close()  # QEMU drops the connection
            await until(lambda: not session.connected, "the end of the connection seen")
            ended = host.clock.time()
            assert await armed(host.clock) == pytest.approx(ended + INITIAL, abs=EPS)
            await host.clock.advance_to(ended + INITIAL - 0.001)
            assert len(accepted) == 1
            await host.clock.advance_to(await armed(host.clock))
            await until(lambda: session.connected and len(accepted) == 2, "connected again")
            qemu.close()
        finally:
            await channels.close()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(channels_dir, ignore_errors=True)
        session.log.close()


# ---------------------------------------------------------------------------- the broker
def test_the_broker_connection_backs_off_on_the_host_clock_and_waits_initial_after_a_loss(
    tmp_path: Path,
) -> None:
    """No broker yet: attempts 0.5-1.0 s, 1.0-1.5 s, then 2.0 s apart on the host's clock. A
    real mosquitto starts: the next attempt connects. It stops: the service reconnects exactly
    ``initial`` (0.5 s) after it saw the loss, then backs off again."""
    host = Host(tmp_path)
    port = free_port()
    options = MqttOptions(broker=f"mqtt://127.0.0.1:{port}", experiment="e1", connect_timeout=5.0)
    service = MqttService(host.experiment, options, "h1", reconnect=(INITIAL, MAXIMUM), clock=host.clock)
    broker = Broker(tmp_path / "broker", port=port)

    async def main() -> None:
        running = asyncio.ensure_future(service.run())
        try:
            check_backoff(await backoff_waits(host.clock, 4))
            broker.start()
            await host.clock.advance_to(await armed(host.clock))
            await until(service.connected.is_set, "connected to the broker at the next attempt")
            assert host.clock.next_timer() is None
            broker.stop()
            await until(lambda: not service.connected.is_set(), "the loss of the broker seen")
            lost = host.clock.time()
            assert await armed(host.clock) == pytest.approx(lost + INITIAL, abs=EPS)
            await host.clock.advance_to(lost + INITIAL)
            check_backoff(await backoff_waits(host.clock, 3))  # the broker still down: back-off anew
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        broker.close()
        for s in host.sessions.values():
            s.log.close()
