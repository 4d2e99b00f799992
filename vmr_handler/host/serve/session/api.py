"""The interfaces a :class:`~vmr_handler.host.serve.session.session.VmSession` works through.

* :class:`Link`: where its frames go (whatever the transport:
  :class:`~vmr_handler.host.serve.channels.links.ChannelLink` over a
  :class:`~vmr_handler.transports.base.ByteChannel`);
* :class:`HostApi`: what it asks of the experiment as a whole (start time, RESUMEs, the
  barrier, signing; :class:`~vmr_handler.host.serve.experiment.experiment.Experiment`), the
  model's :class:`~vmr_handler.host.model.vmstate.ReportHost` and more;
* :class:`HostEntrySink`: what the host's on_host entry runner asks of a session (its log,
  its answers; :mod:`vmr_handler.host.serve.experiment.hostentries`);
* :class:`HostEvents`: the maker of the host's own events (ids, timestamps).
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, List, Mapping, Optional, Protocol

from vmr_handler.core.clock import Clock, SystemClock
from vmr_handler.core.events import Event, json_safe
from vmr_handler.host.model.vmstate import ReportHost


class Link(Protocol):
    """Where a session's frames go (:class:`~vmr_handler.host.serve.channels.links.ChannelLink`)."""

    @property
    def closed(self) -> bool:
        """True once the connection is closed."""

    def send_bytes(self, data: bytes) -> None:
        """Queue raw bytes (never blocks; may close the link when the peer does not read)."""

    async def drain(self) -> None:
        """Wait until the queued bytes are written to the transport (back-pressure).

        Raises:
            ConnectionError: the link is closed, or closes before they are written.
        """

    def close(self) -> None:
        """Close the connection."""


class HostApi(ReportHost, Protocol):
    """What a session needs from the experiment (implemented by
    :class:`~vmr_handler.host.serve.experiment.experiment.Experiment`)."""

    @property
    def run_id(self) -> Optional[str]:
        """This host's run id (``vmr_handler.core.wire.runs``), told in ``welcome``."""

    @property
    def kpi_interval(self) -> float:
        """Seconds between two KPI samples of each agent (``serve --kpi-interval``; 0 = off),
        told in ``welcome`` (seed 004)."""

    @property
    def default_timeout(self) -> Optional[float]:
        """Seconds a program entry without a ``timeout`` of its own may run (``serve
        --default-timeout``; None: no bound), told in ``welcome``."""

    def on_stored(self, vm: str, events: List[Event], received: float) -> None:
        """``vm``'s new reports ``events`` were stored and applied, received at host UTC
        ``received`` (the console watches them)."""

    def start_event(self) -> Optional[Event]:
        """The ``start_time`` event (stable id), or None before the start is set."""

    def pending_resumes(self, vm: str) -> List[Event]:
        """``resume`` events issued to ``vm`` that it has not answered, oldest first."""

    @property
    def signs(self) -> bool:
        """True when control events are signed (a host signing key is configured)."""

    def sign_for(self, vm: str, event: Event) -> Event:
        """``event`` signed for ``vm`` now (unchanged without a key; ``vmr_handler.core.wire.signing``)."""

    def host_entry(
        self, vm: str, request_id: str, index: Optional[int], scheduled: Optional[float]
    ) -> Optional[str]:
        """``vm``'s agent asks (request ``request_id``) that its on_host entry ``index`` be run,
        due at host UTC ``scheduled`` (None in a negative stage); the answer, a ``result``,
        comes through the VM's :class:`HostEntrySink`
        (:meth:`vmr_handler.host.serve.experiment.hostentries.HostEntryRunner.request`).

        Returns:
            What is wrong with a request that breaks the protocol (not an on_host entry of the
            VM's schedule: answered, refused, never run; the session counts it), else None.
        """


class HostEntrySink(Protocol):
    """What the on_host entry runner (:mod:`vmr_handler.host.serve.experiment.hostentries`) asks of one VM's
    session (:class:`~vmr_handler.host.serve.session.session.VmSession`)."""

    def record(self, events: List[Event], now: float) -> None:
        """Write host-made reports (an on_host entry's start, output, end) to the VM's log at
        host UTC ``now``, applied as the agent's are (state, console); nothing is acknowledged."""

    def answer(self, request_id: str, data: Mapping[str, Any]) -> None:
        """Send the agent a ``result`` event of ``data`` (dropped when it is not connected)."""


class HostEvents:
    """Makes the host's own events: unique ids (``host-<random>-<n>``), UTC timestamps.

    Args:
        clock: the host's clock (timestamps; :class:`~vmr_handler.core.clock.SystemClock`
            by default).
    """

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._prefix = f"host-{uuid.uuid4().hex[:10]}"
        self._counter = itertools.count(1)

    def next_id(self) -> str:
        """A fresh unique event id."""
        return f"{self._prefix}-{next(self._counter):08d}"

    def make(self, type_: str, data: Mapping[str, Any], timestamp: Optional[float] = None) -> Event:
        """A new host event of ``type_`` (a control type) with ``data`` made JSON safe;
        ``timestamp`` is UTC epoch seconds (default now)."""
        ts = self.clock.time() if timestamp is None else timestamp
        return Event(type_, ts, self.next_id(), json_safe(dict(data)))
