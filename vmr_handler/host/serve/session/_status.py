"""What ``vmr-host status`` shows of one VM (:meth:`vmr_handler.host.serve.session.session.VmSession.status`),
read from the parts of its session (:class:`SessionView`), JSON safe."""

from __future__ import annotations

from typing import Any, Dict, Optional, Protocol

from vmr_handler.core.wire.protocol import DecoderStats
from vmr_handler.host.logs.store import VmLog
from vmr_handler.host.model.vmstate import Counters, VmState, frames_status
from vmr_handler.host.serve.session.intake import TransferIntake


class SessionView(Protocol):
    """The parts of a :class:`~vmr_handler.host.serve.session.session.VmSession` its status reads."""

    name: str
    expected: bool
    silent: bool
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


def session_status(s: SessionView, start_time: Optional[float], now: float) -> Dict[str, Any]:
    """Everything ``vmr-host status`` shows for the VM of ``s`` at host UTC ``now``, the
    experiment starting at ``start_time`` (UTC; None before it is set)."""
    c = s.counters
    return {
        "vm": s.name,
        "expected": s.expected,
        "connected": s.connected,
        "silent": s.silent if s.connected else None,
        "state": s.state.word(start_time, now, s.connected, s.connections),
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
