"""What ``vmr-host status`` shows of one VM (:meth:`vmr_handler.host.serve.session.session.VmSession.status`),
read from the parts of its session (:class:`SessionView`), JSON safe."""

from __future__ import annotations

from typing import Any, Dict, Optional, Protocol

from vmr_handler.core.clock import Clock
from vmr_handler.core.wire.protocol import DecoderStats
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.model.stateword import Presence, is_problem
from vmr_handler.host.model.vmstate import Counters, VmState, frames_status
from vmr_handler.host.model.where import where
from vmr_handler.host.serve.config import Limits
from vmr_handler.host.serve.session.intake import TransferIntake


class SessionView(Protocol):
    """The parts of a :class:`~vmr_handler.host.serve.session.session.VmSession` its status reads."""

    name: str
    expected: bool
    silent: bool
    transport_liveness: bool
    clock: Clock
    limits: Limits
    last_recv: float
    gone_since: float
    connections: int
    handshakes: int
    state: VmState
    counters: Counters
    log: VmLog
    intake: TransferIntake

    @property
    def connected(self) -> bool:
        """True while a connection to the VM's channel is up."""

    def decoder_stats(self) -> DecoderStats:
        """Frames, malformed and oversize counts over every connection so far."""


def session_presence(s: SessionView) -> Presence:
    """Where the agent of ``s`` is, on the host's clock (``monotonic``): connected, it is gone
    once *silent* (no frame for ``limits.silent_after`` s), for as long as it has been silent;
    not connected, it is gone since its last connection ended (``gone_since``: or since this
    host started, for an agent heard from in an earlier run). Over a transport that tells
    liveness (MQTT: its presence says ``online``) a connected agent is never gone. It was heard
    from once when it connected in this run or its reports were stored before."""
    mono = s.clock.monotonic()
    ever = s.connections > 0 or s.state.last_seen is not None
    if s.connected and s.transport_liveness:
        gone = None
    elif s.connected:
        quiet = mono - s.last_recv
        gone = quiet if quiet >= s.limits.silent_after else None
    else:
        gone = mono - s.gone_since
    return Presence(s.connected, ever, gone, s.limits.lost_after)


def session_status(s: SessionView, start_time: Optional[float], now: float) -> Dict[str, Any]:
    """Everything ``vmr-host status`` shows for the VM of ``s`` at host UTC ``now``, the
    experiment starting at ``start_time`` (UTC; None before it is set): ``state`` (the one word,
    :mod:`~vmr_handler.host.model.stateword`), ``problem``, ``where`` (in words,
    :mod:`~vmr_handler.host.model.where`), ``gone_for`` (s the agent has been
    gone, None while it talks) and ``lost_after`` (s), then the folded reports."""
    c = s.counters
    presence = session_presence(s)
    word = s.state.word(start_time, now, presence)
    return {
        "vm": s.name,
        "expected": s.expected,
        "connected": s.connected,
        "silent": s.silent if s.connected else None,
        "state": word,
        "problem": is_problem(word, s.state.failures),
        "where": where(s.state, word, start_time, now),
        "gone_for": presence.gone_for,
        "lost_after": presence.lost_after,
        **s.state.fields(),
        "connections": s.connections,
        "handshakes": s.handshakes,
        "events": {
            "stored": s.log.stored,
            "duplicates": s.log.duplicates,
            "over_quota": s.log.dropped_events,
            "over_quota_bytes": s.log.dropped_bytes,
            "log_bytes": s.log.bytes,
        },
        "memory": s.log.memory(),
        "frames": frames_status(s.decoder_stats()),
        "refused": c.refused(),
        "transfers": s.intake.status(),
        "resources": {"served": c.resources_served, "refused": c.resources_refused},
    }
