"""The kills the operator issued (``vmr-host kill``, ``docs/host.md``): one ``kill`` event per
request, sent to the VMs named, and again at their next handshake until each answered.

The agent applies a kill id once (its journal keeps it), so a resend is harmless: it answers
again with what it did the first time. The book lives in memory: a kill not answered when
``vmr-host`` restarts is not sent again (the operator sees it unanswered in ``vmr-host logs``
and kills again). A signed host signs each kill for its VM at every send, like a RESUME
(:mod:`vmr_handler.core.wire.signing`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from vmr_handler.core.events import Event
from vmr_handler.core.wire.protocol import KILL
from vmr_handler.host.serve.experiment.appendbook import Pusher

log = logging.getLogger("vmr_handler.host")

#: Kills kept (the oldest are dropped: answered long ago, or never to be answered).
MAX_KILLS = 1000


@dataclass
class KillRecord:
    """A kill the operator issued: one id for every target VM.

    Attributes:
        id: the event id (the agent applies each id once).
        index: the entry's index.
        signal: the signal sent first, without ``SIG`` (``TERM``, ``KILL``, ``INT``, ``HUP``).
        grace: seconds before SIGKILL ends what is left.
        by: who asked (``user@host`` from the CLI), or None.
        issued: host UTC epoch seconds when it was issued.
        targets: the VMs it is for.
        answered: VM -> the agent's answer (``status``, ``details``, ``received`` host UTC).
    """

    id: str
    index: int
    signal: str
    grace: float
    by: Optional[str]
    issued: float
    targets: List[str]
    answered: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    def event(self) -> Event:
        """The ``kill`` event (the same every time it is sent; signed per VM when sent)."""
        data = {"index": self.index, "signal": self.signal, "grace": self.grace, "by": self.by}
        return Event(KILL, self.issued, self.id, data)


class KillBook:
    """The kills issued in this host run (:class:`KillRecord`), at most :data:`MAX_KILLS`."""

    def __init__(self) -> None:
        self.records: List[KillRecord] = []

    def issue(
        self, sessions: Mapping[str, Pusher], targets: List[str], index: int, signal: str, grace: float,
        by: Optional[str], now: float,
    ) -> Tuple[KillRecord, List[str]]:  # fmt: skip
        """Keep a kill of entry ``index`` for ``targets`` (issued at host UTC ``now``) and send it
        to those connected now. Returns the record and the VMs it was sent to now."""
        record = KillRecord(f"kill-{uuid.uuid4().hex[:16]}", index, signal, grace, by, now, list(targets))
        self.records = [*self.records[-(MAX_KILLS - 1) :], record]
        sent = [vm for vm in targets if sessions[vm].push_resume(record.event())]
        log.warning("kill %s: entry %d, SIG%s (grace %g s) by %s to %s; sent now to %d",
                    record.id, index, signal, grace, by or "?", ", ".join(targets), len(sent))  # fmt: skip
        return record, sent

    def events_for(self, vm: str) -> List[Event]:
        """The ``kill`` events ``vm`` has not answered, oldest first."""
        return [r.event() for r in self.records if vm in r.targets and vm not in r.answered]

    def on_answer(self, vm: str, ident: str, data: Mapping[str, Any], at: float) -> bool:
        """``vm`` answered kill ``ident`` (received at host UTC ``at``): recorded. Returns
        whether ``ident`` is a kill for ``vm`` not answered before."""
        for r in self.records:
            if r.id == ident and vm in r.targets and vm not in r.answered:
                r.answered[vm] = {"status": data.get("status"), "details": data.get("details"),
                                  "received": at}  # fmt: skip
                return True
        return False
