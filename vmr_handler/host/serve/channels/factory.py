"""How the VMs' channels reach their sessions, chosen once from the configuration
(:func:`open_channels`): unix stream sockets
(:class:`~vmr_handler.host.serve.channels.streams.StreamChannels`,
``listen`` or ``connect`` mode) or one broker connection (:class:`BrokerChannels`, ``mqtt``
mode: :mod:`vmr_handler.host.serve.channels.mqtt`, ``docs/mqtt.md``). The server sees a :class:`Channels`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Optional, Protocol

from vmr_handler.host.serve.channels.streams import StreamChannels
from vmr_handler.host.serve.config import HostConfig
from vmr_handler.host.serve.experiment.experiment import Experiment, Publisher

log = logging.getLogger("vmr_handler.host")


class Channels(Protocol):
    """The VMs' channels, whatever carries them."""

    #: why serving stopped by itself (e.g. the broker refuses this host), else None
    fatal: Optional[str]

    def describe(self) -> str:
        """Where the channels are, for the start-up log line."""

    def check(self) -> None:
        """Refuse a set-up that cannot work before anything is made (raises ``HostSetupError``)."""

    def prepare(self) -> None:
        """Create what the channels need on disk (raises ``OSError``)."""

    async def start(self, stop: asyncio.Event) -> None:
        """Start serving every VM; on a failure for good later, set ``fatal`` and ``stop``
        (raises ``HostSetupError`` when serving cannot start)."""

    async def close(self) -> None:
        """Stop serving; remove what :meth:`start` made."""


def channel_mode(config: HostConfig) -> str:
    """``listen``, ``connect`` or ``mqtt``."""
    if config.mqtt is not None:
        return "mqtt"
    return "connect" if config.connect else "listen"


def broker_publisher(config: HostConfig) -> Optional[Callable[[Experiment], Publisher]]:
    """What makes the experiment's :class:`~vmr_handler.host.serve.experiment.experiment.Publisher`:
    in mqtt mode its broker service (made with the experiment, served by :class:`BrokerChannels`),
    else None."""
    options = config.mqtt
    if options is None:
        return None

    def make(experiment: Experiment) -> Publisher:
        from vmr_handler.host.serve.channels.mqtt import MqttService

        return MqttService(experiment, options, config.host_id, clock=experiment.clock)

    return make


def open_channels(config: HostConfig, experiment: Experiment) -> Channels:
    """The channels of ``config``'s mode for the VMs of ``experiment.sessions``."""
    if config.mqtt is not None:
        return BrokerChannels(config, experiment)
    return StreamChannels(config, experiment.sessions, experiment.clock)


class BrokerChannels:
    """Every VM over one broker connection (:class:`vmr_handler.host.serve.channels.mqtt.MqttService`, which
    talks to ``experiment`` for the start and the peer hosts: its publisher, made with it by
    :func:`broker_publisher`).

    Args:
        config: with ``mqtt`` set (the broker options) and ``host_id``.
        experiment: the experiment and the VMs' sessions, made with its broker publisher.
    """

    def __init__(self, config: HostConfig, experiment: Experiment) -> None:
        from vmr_handler.host.serve.channels.mqtt import MqttService

        assert isinstance(experiment.mqtt, MqttService), "made without broker_publisher(config)"
        self.config = config
        self.experiment = experiment
        self.service = experiment.mqtt
        self.fatal: Optional[str] = None
        self._task: Optional[asyncio.Task[None]] = None

    def describe(self) -> str:
        """``broker <url>``."""
        assert self.config.mqtt is not None
        return f"broker {self.config.mqtt.broker}"

    def check(self) -> None:
        """Nothing to check (no channel sockets)."""

    def prepare(self) -> None:
        """Nothing to make (no channel sockets)."""

    async def start(self, stop: asyncio.Event) -> None:
        """Connect to the broker in the background; if that fails for good, log, set
        :attr:`fatal` and ``stop``."""
        self._task = asyncio.ensure_future(self._watch(self.service.run(), stop))

    async def close(self) -> None:
        """Cancel the broker connection."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.sleep(0)

    async def _watch(self, job: Any, stop: asyncio.Event) -> None:
        """Run ``job``; if it fails for good (e.g. the broker refuses this host), log and stop."""
        try:
            await job
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.fatal = str(exc)
            log.error("%s", exc)
            stop.set()
