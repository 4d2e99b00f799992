"""One contract suite over every transport (transports/base.py): memory, unix socket, pty, MQTT.

Each transport gives an agent end and a host end; the same tests run over all of them:
framing and order in both directions, many small writes, a large frame, a peer that goes away
(seen or not, as ``sees_disconnects`` says) and, where the transport allows, comes back. The
pty stands in for a virtio-serial port (as in tests/vserial.py); MQTT runs over a real
mosquitto started here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from typing import AsyncIterator, Awaitable, Callable, Dict, Iterator, List, Tuple

import pytest

from tests.broker import Broker
from vmr_handler.core.errors import ChannelClosed, InvalidArgument
from vmr_handler.transports.base import ByteChannel
from vmr_handler.transports.memory import memory_pair
from vmr_handler.transports.mqtt.bridge import PahoBridge
from vmr_handler.transports.mqtt.guest import MqttChannel
from vmr_handler.transports.mqtt.options import MqttOptions
from vmr_handler.transports.mqtt.topics import Topics
from vmr_handler.transports.stream import UnixChannel
from vmr_handler.transports.virtio_serial import CharDeviceChannel

Pair = Tuple[ByteChannel, ByteChannel]
EXPERIMENT = "contract"


class BrokerHostEnd(ByteChannel):
    """The host's end of one VM's MQTT topics, for this suite: reads ``up``, writes ``down``."""

    sees_disconnects = False

    def __init__(self, bridge: PahoBridge, topics: Topics) -> None:
        self.bridge = bridge
        self.topics = topics

    @classmethod
    async def connect(cls, url: str, vm: str) -> BrokerHostEnd:
        topics = Topics(EXPERIMENT, vm)
        bridge = PahoBridge(MqttOptions(broker=url, experiment=EXPERIMENT), f"host-{vm}", [(topics.up, 1)])
        await bridge.connect()
        return cls(bridge, topics)

    async def read(self) -> bytes:
        while True:
            item = await self.bridge.messages.get()
            if item is None:
                raise ChannelClosed("broker connection lost")
            if item[0] == self.topics.up and item[1]:
                return item[1]

    async def write(self, data: bytes) -> None:
        await self.bridge.publish(self.topics.down, data)

    def close(self) -> None:
        self.bridge.close()


@contextlib.asynccontextmanager
async def memory() -> AsyncIterator[Pair]:
    agent, host = memory_pair()
    yield agent, host
    agent.close()
    host.close()


@contextlib.asynccontextmanager
async def unix_socket() -> AsyncIterator[Pair]:
    path = os.path.join(tempfile.mkdtemp(dir="/tmp", prefix="vhtc"), "vm.sock")
    accepted: asyncio.Queue[UnixChannel] = asyncio.Queue()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(UnixChannel(reader, writer))

    server = await asyncio.start_unix_server(on_connect, path, limit=2**20)
    agent = await UnixChannel.connect(path)
    host = await asyncio.wait_for(accepted.get(), 5)
    yield agent, host
    agent.close()
    host.close()
    server.close()


@contextlib.asynccontextmanager
async def pty() -> AsyncIterator[Pair]:
    master, slave = os.openpty()
    os.set_blocking(master, False)
    agent = await CharDeviceChannel.open(os.ttyname(slave))
    os.close(slave)  # the agent opened its own descriptor of the port
    host = CharDeviceChannel("pty master", master)
    yield agent, host
    agent.close()
    host.close()


_BROKER: Dict[str, Broker] = {}


@contextlib.asynccontextmanager
async def mqtt() -> AsyncIterator[Pair]:
    broker = _BROKER["broker"]
    vm = f"vm{len(_BROKER)}"
    _BROKER[vm] = broker
    host = await BrokerHostEnd.connect(broker.url, vm)
    agent = await MqttChannel.connect(MqttOptions(broker=broker.url, experiment=EXPERIMENT), vm, "boot-1")
    yield agent, host
    agent.close()
    host.close()


TRANSPORTS: Dict[str, Callable[[], contextlib.AbstractAsyncContextManager[Pair]]] = {
    "memory": memory,
    "unix": unix_socket,
    "pty": pty,
    "mqtt": mqtt,
}


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    b = Broker().start()
    _BROKER["broker"] = b
    yield b
    b.stop()


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest, broker: Broker) -> str:
    return str(request.param)


def run(transport: str, body: Callable[[ByteChannel, ByteChannel], Awaitable[None]]) -> None:
    async def main() -> None:
        async with TRANSPORTS[transport]() as (agent, host):
            await asyncio.wait_for(body(agent, host), 30)

    asyncio.run(main())


async def read_lines(channel: ByteChannel, count: int) -> List[bytes]:
    """``count`` newline-terminated frames read from ``channel``, however the bytes came."""
    buffer = b""
    while buffer.count(b"\n") < count:
        buffer += await channel.read()
    lines = buffer.split(b"\n")
    assert lines[count:] == [b""], "more bytes than the frames written"
    return lines[:count]


def frames(prefix: str, n: int) -> List[bytes]:
    return [f'{{"{prefix}":{i}}}'.encode() for i in range(n)]


def test_frames_arrive_whole_and_in_order_both_ways_at_once(transport: str) -> None:
    async def body(agent: ByteChannel, host: ByteChannel) -> None:
        up, down = frames("up", 300), frames("down", 300)

        async def send(channel: ByteChannel, items: List[bytes]) -> None:
            for item in items:
                await channel.write(item + b"\n")

        got = await asyncio.gather(
            send(agent, up), send(host, down), read_lines(host, 300), read_lines(agent, 300)
        )
        assert got[2] == up and got[3] == down

    run(transport, body)


def test_a_large_frame_arrives_intact(transport: str) -> None:
    async def body(agent: ByteChannel, host: ByteChannel) -> None:
        big = b'{"pad":"' + os.urandom(384 * 1024).hex().encode() + b'"}'  # 768 KiB

        async def send() -> None:
            await agent.write(big + b"\n")

        _, lines = await asyncio.gather(send(), read_lines(host, 1))
        assert lines == [big]

    run(transport, body)


def test_many_small_writes_make_one_ordered_stream(transport: str) -> None:
    async def body(agent: ByteChannel, host: ByteChannel) -> None:
        if transport == "mqtt":  # a message per write: small pieces are messages of their own
            pieces = [f"{i}\n".encode() for i in range(200)]
        else:  # a byte stream: frames may be cut anywhere
            pieces = [b"".join(f"{i}\n".encode() for i in range(200))[j : j + 3] for j in range(0, 890, 3)]
        text = b"".join(pieces)

        async def send() -> None:
            for piece in pieces:
                await host.write(piece)

        _, lines = await asyncio.gather(send(), read_lines(agent, text.count(b"\n")))
        assert b"\n".join(lines) + b"\n" == text

    run(transport, body)


def test_ephemeral_writes_arrive_like_others_while_the_peer_is_there(transport: str) -> None:
    async def body(agent: ByteChannel, host: ByteChannel) -> None:
        await agent.write_ephemeral(b'{"hello":1}\n', ttl=10.0)
        assert await read_lines(host, 1) == [b'{"hello":1}']

    run(transport, body)


def test_a_peer_that_goes_away_is_seen_or_not_as_the_transport_says(transport: str) -> None:
    async def body(agent: ByteChannel, host: ByteChannel) -> None:
        await host.write(b'{"last":1}\n')
        assert await read_lines(agent, 1) == [b'{"last":1}']
        host.close()
        if agent.sees_disconnects:
            with pytest.raises(ChannelClosed):
                await asyncio.wait_for(agent.read(), 5)
            with pytest.raises(ChannelClosed):
                for _ in range(50):  # a socket may take a write or two to notice
                    await agent.write(b'{"after":1}\n')
                    await asyncio.sleep(0.01)
        else:  # virtio-serial and MQTT: the host going away is silence, not an error
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(agent.read(), 0.5)

    run(transport, body)


def test_mqtt_host_that_comes_back_gets_what_the_agent_sent_meanwhile(broker: Broker) -> None:
    async def main() -> None:
        async with mqtt() as (agent, host):
            assert isinstance(host, BrokerHostEnd)
            vm = host.topics.vm
            await host.write(b'{"hi":1}\n')
            assert await read_lines(agent, 1) == [b'{"hi":1}']
            host.close()  # the host goes away; the broker keeps its session
            await agent.write(b'{"while-away":1}\n')
            again = await BrokerHostEnd.connect(broker.url, vm)
            try:
                assert await asyncio.wait_for(read_lines(again, 1), 10) == [b'{"while-away":1}']
            finally:
                again.close()

    asyncio.run(main())


def test_pty_host_that_comes_back_is_heard_again() -> None:
    async def main() -> None:
        master, slave = os.openpty()
        os.set_blocking(master, False)
        agent = await CharDeviceChannel.open(os.ttyname(slave))
        try:
            os.write(master, b'{"one":1}\n')
            assert await asyncio.wait_for(read_lines(agent, 1), 5) == [b'{"one":1}']
            # the host side stays quiet for a while (as virtio-serial with no host): no error
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(agent.read(), 0.3)
            os.write(master, b'{"two":2}\n')
            assert await asyncio.wait_for(read_lines(agent, 1), 5) == [b'{"two":2}']
        finally:
            agent.close()
            os.close(master)
            os.close(slave)

    asyncio.run(main())


def test_memory_pair_holds_writes_back_at_its_limit_and_reads_what_is_left_after_close() -> None:
    async def main() -> None:
        agent, host = memory_pair(limit=1000)
        writing = asyncio.ensure_future(agent.write(b"x" * 2500))
        await asyncio.sleep(0.01)
        assert not writing.done()  # 1000 bytes unread on the host end: the writer waits
        got = b""
        while len(got) < 2500:
            got += await host.read()
        await writing
        await agent.write(b"tail")
        agent.close()
        assert await host.read() == b"tail"  # what was written before the close is read
        with pytest.raises(ChannelClosed):
            await host.read()
        with pytest.raises(ChannelClosed):
            await host.write(b"to nobody")
        with pytest.raises(InvalidArgument):
            memory_pair(limit=0)

    asyncio.run(main())
