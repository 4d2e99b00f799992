"""Run ids: which run of an experiment a message belongs to (``docs/mqtt.md``).

Over MQTT, retained messages outlive the processes that wrote them: an earlier run of the
same experiment name leaves its hosts' announcements and its VMs' start times in the broker.
Each ``vmr-host`` therefore has a **run id** (:func:`new_run_id`), fresh for a new logs
directory and kept in ``<logs>/experiment.json`` across restarts on the same logs. It goes
into the host's ``welcome``, its ``start_time`` events (so into the retained start of each
VM) and its announcements to peer hosts.

:class:`StartGate` is the agent's rule: a ``start_time`` is applied only when its ``run`` is
the run of the host that welcomed the agent. Pure apart from one small file that keeps that
run across agent restarts.

Over MQTT a host publishes its start once for all its VMs (``vmr/E/_hosts/<host>/start``)
and every agent reads every host's: the run is what makes an agent take its own
host's only. With a signing key that message is signed for :data:`EVERY_VM_OF_RUN` instead
of one VM (:func:`signed_for` is the agent's rule): the signature covers the run (in
``data``), so it is good for each VM of that run and for no other run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from typing import Awaitable, Callable, Dict, List, Optional, Set

from vmr_handler.core.events import Event
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.wire.protocol import START_TIME

log = logging.getLogger(__name__)

#: Runs whose start is kept while the host's run is not known yet (the newest per run; over
#: MQTT every host sharing the broker has one retained start).
MAX_HELD = 64
#: An async handler of one event from the host.
Handler = Callable[[Event], Awaitable[None]]
#: Longest run id taken from the wire (``run-`` + 16 hex digits is what hosts make).
MAX_RUN_ID = 64
#: The ``vm`` a host's start for all its VMs is signed for (``data.signature.vm``); no VM
#: can be named so (``vmr_handler.core.names``).
EVERY_VM_OF_RUN = "*"


def new_run_id() -> str:
    """A fresh random run id, ``run-<16 hex digits>`` (64 random bits)."""
    return f"run-{uuid.uuid4().hex[:16]}"


def signed_for(event: Event, vm: str) -> str:
    """The VM name VM ``vm`` checks ``event``'s signature against (``Verifier.check``): ``vm``,
    or :data:`EVERY_VM_OF_RUN` for a ``start_time`` that names a run and is signed for every
    VM of it (a host's start for all its VMs). Only a ``start_time`` qualifies: a
    start is the same for every VM of a run, and the agent applies one only when its run is its
    host's (:class:`StartGate`, before the signature is checked); schedules and RESUMEs stay
    signed per VM."""
    if event.type != START_TIME or run_of(event.data.get("run")) is None:
        return vm
    signature = event.data.get("signature")
    if isinstance(signature, dict) and signature.get("vm") == EVERY_VM_OF_RUN:
        return EVERY_VM_OF_RUN
    return vm


def run_of(value: object) -> Optional[str]:
    """``value`` as a run id: a non-empty string of at most :data:`MAX_RUN_ID` characters, else
    None (no run: a host of a version without run ids, or garbage)."""
    if isinstance(value, str) and 0 < len(value) <= MAX_RUN_ID:
        return value
    return None


class StartGate:
    """Which ``start_time`` events an agent applies: only those of its host's run.

    The run is known from the host's ``welcome`` (:meth:`welcomed`), and from ``path`` after
    an agent restart. Until it is known, start events are held (the newest of each run, at
    most :data:`MAX_HELD` runs); then one whose ``run`` differs (or is missing while the host
    has one) is ignored and logged once per run: over MQTT it is another host's start (hosts
    sharing the broker) or an earlier run's retained one. A host without run ids (an older
    version) welcomes with none: its starts, which carry none, are applied, as before run ids.

    Args:
        path: file keeping the last host run (JSON ``{"run": ...}``); None keeps it in memory.
    """

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self.known = False
        self.run: Optional[str] = None
        self._held: Dict[Optional[str], Event] = {}  # run -> its newest start, oldest run first
        self._ignored: Set[Optional[str]] = set()
        if path is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                with open(path, encoding="utf-8") as fh:
                    doc = json.load(fh)
                self.run, self.known = run_of(doc.get("run")), True

    def offer(self, event: Event) -> bool:
        """True when ``event`` is to be applied now: not a ``start_time``, or one of the host's
        run. False when it is held (run not known yet) or ignored (another run)."""
        if event.type != START_TIME:
            return True
        if not self.known:
            run = run_of(event.data.get("run"))
            self._held.pop(run, None)
            self._held[run] = event
            while len(self._held) > MAX_HELD:
                del self._held[next(iter(self._held))]
            log.info("start_time %s held until the host says which run it is", event.id)
            return False
        return self._judge(event)

    def welcomed(self, run: object) -> List[Event]:
        """The host's ``welcome`` named its ``run`` (None: a host without run ids): remember it
        (in ``path`` when it changed) and return the held start events of that run, to apply."""
        new = run_of(run)
        if not self.known or new != self.run:
            self._save(new)
        self.run, self.known = new, True
        held, self._held = list(self._held.values()), {}
        return [event for event in held if self._judge(event)]

    def guard(self, handler: Handler) -> Handler:
        """``handler`` (of ``start_time`` events), called only for the events :meth:`offer` lets
        through."""

        async def guarded(event: Event) -> None:
            if self.offer(event):
                await handler(event)

        return guarded

    def on_welcome(self, handler: Handler, control: Handler) -> Handler:
        """``handler`` (of ``welcome`` events), then :meth:`welcomed` with the welcome's ``run``
        and ``control`` for each held start of that run."""

        async def welcome(event: Event) -> None:
            await handler(event)
            for held in self.welcomed(event.data.get("run")):
                await control(held)

        return welcome

    def _judge(self, event: Event) -> bool:
        run = run_of(event.data.get("run"))
        if run == self.run:
            return True
        if run not in self._ignored:
            self._ignored.add(run)
            log.warning(
                "start_time %s ignored: it is of run %s, the host's run is %s (another host's "
                "start on a shared broker, or a stale retained start of an earlier run)",
                event.id,
                run or "(none)",
                self.run or "(none)",
            )
        return False

    def _save(self, run: Optional[str]) -> None:
        if self.path is None:
            return
        try:
            atomic_write(self.path, json.dumps({"run": run}).encode())
        except OSError as exc:  # kept in memory: only a restart before the next welcome loses it
            log.warning("cannot save the host's run to %s: %s", self.path, exc)
