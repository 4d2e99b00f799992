"""The experiment a ``vmr-host serve`` runs: the :class:`~vmr_handler.host.serve.experiment.barrier.Barrier`
and the start time, the RESUMEs issued (:class:`ResumeRecord`), the peer hosts of an
experiment split over several hosts (coordinator / member, over MQTT), the signing of
control events, and their persistence in ``<logs>/experiment.json``.

An :class:`Experiment` is what every :class:`~vmr_handler.host.serve.session.session.VmSession` asks of the
experiment as a whole (:class:`~vmr_handler.host.serve.session.api.HostApi`) and what the MQTT
service talks to (:class:`~vmr_handler.host.serve.channels.mqtt.MqttHost`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Protocol, Set, Tuple

from vmr_handler import __version__
from vmr_handler.core.clock import Clock, SystemClock
from vmr_handler.core.errors import BarrierError, SavedStateError
from vmr_handler.core.events import Event
from vmr_handler.core.fsutil import utc_text
from vmr_handler.core.names import VM_NAME
from vmr_handler.core.wire.protocol import RESUME, START_TIME
from vmr_handler.core.wire.runs import new_run_id, run_of
from vmr_handler.host.logs.store import ExperimentStore
from vmr_handler.host.serve.config import HostConfig
from vmr_handler.host.serve.experiment.appendbook import AppendBook, allow_resources
from vmr_handler.host.serve.experiment.barrier import Barrier, waiting_text
from vmr_handler.host.serve.experiment.hostentries import HostEntryPort, HostEntryRunner
from vmr_handler.host.serve.experiment.killbook import KillBook
from vmr_handler.host.serve.session.session import VmSession

log = logging.getLogger("vmr_handler.host")

#: Barrier placeholder of a host that has not announced its VMs yet (never a VM name).
PEER_PREFIX = "host:"
#: Seconds a debounced save or announcement may wait (:meth:`Debouncer.soon`).
DEBOUNCE = 0.2
#: ... or this many times what the job took last time, when that is longer: a job that takes
#: 0.3 s (``experiment.json`` of 10 000 VMs) then runs at most every 3 s, ~10 % of the loop,
#: instead of 60 % (measured: 10 000 `configured` reports took the host 29 s to read).
DEBOUNCE_COST_FACTOR = 10.0
#: Most VMs one peer host may announce.
MAX_PEER_VMS = 100_000
STATE_VERSION = 1


@dataclass
class ResumeRecord:
    """A RESUME the operator issued: one id for every target VM.

    Attributes:
        id: event id (stable across host restarts; the agent applies each id once).
        at: host experiment seconds (``-inf`` before the start time is set).
        issued: UTC epoch seconds when it was issued.
        targets: VM names it was sent to.
        answered: VM name -> the agent's answer (status, details, ended_break, ignored, received).
    """

    id: str
    at: float
    issued: float
    targets: List[str]
    answered: Dict[str, Any]

    def event(self) -> Event:
        """The ``resume`` event (the same every time it is sent)."""
        return Event(RESUME, self.issued, self.id, {"at": self.at if math.isfinite(self.at) else "-inf"})

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe form for ``experiment.json``."""
        return {
            "id": self.id,
            "at": self.at if math.isfinite(self.at) else "-inf",
            "issued": self.issued,
            "targets": self.targets,
            "answered": self.answered,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResumeRecord:
        """Inverse of :meth:`to_dict`.

        Raises:
            SavedStateError: bad shape.
            KeyError, TypeError, ValueError: a member is missing or not a number.
        """
        at = float(d["at"])
        if math.isnan(at) or at == math.inf:
            raise SavedStateError(f"bad resume time {d['at']!r}")
        targets = d["targets"]
        answered = d.get("answered", {})
        if not isinstance(targets, list) or not isinstance(answered, dict):
            raise SavedStateError("bad resume record")
        return cls(str(d["id"]), at, float(d["issued"]), [str(t) for t in targets], dict(answered))


class Publisher(Protocol):
    """Where a split experiment's news go (the MQTT service, :mod:`vmr_handler.host.serve.channels.mqtt`)."""

    def publish_host_state(self) -> None:
        """Announce this host's VMs and their configured times (member)."""

    def publish_start(self) -> Collection[str]:
        """Publish the start time (to this host's VMs, and to member hosts when coordinator);
        returns the VMs it reaches that way (no need to send it on their sessions)."""


class Debouncer:
    """Runs a job at most once per burst of requests (:meth:`soon`), on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._pending: Set[str] = set()
        self._cost: Dict[str, float] = {}  # seconds each job took last time

    def soon(self, key: str, job: Callable[[], None]) -> None:
        """Run ``job`` once within :data:`DEBOUNCE` s, however often this is called meanwhile.

        Saving ``experiment.json`` (and announcing a member's VMs) per VM event made a burst
        of N events cost O(N²) (measured: 1000 VMs configuring kept the loop busy 6-15 s).
        Only state that the per-VM logs also hold is saved this way; the start time and
        RESUMEs issued are saved at once. Without a running event loop it runs now. A job that
        took long last time waits longer (:data:`DEBOUNCE_COST_FACTOR`).
        """
        if key in self._pending:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            job()
            return
        clock = self.clock

        def run() -> None:
            self._pending.discard(key)
            t0 = clock.monotonic()
            job()
            self._cost[key] = clock.monotonic() - t0

        self._pending.add(key)
        clock.call_at(clock.time() + max(DEBOUNCE, DEBOUNCE_COST_FACTOR * self._cost.get(key, 0.0)), run)


class Experiment(HostEntryPort):
    """The barrier, the start and the RESUMEs of the VMs in ``sessions`` (and of peer hosts').

    Args:
        config: what ``vmr-host serve`` was told.
        sessions: VM name -> its session, filled by the server (this dict, shared).
        clock: the host's clock: configured and release times, the start, RESUME stamps,
            signing, debounced saves (:class:`~vmr_handler.core.clock.SystemClock` by default).
        appends: the batches appended to running VMs (default: those kept in ``config.logs``).
        host_entries: the on_host entry runner the sessions reach through :meth:`host_entry`
            (None: this host runs none).
        publisher: makes, from this experiment, where a split experiment's news go beyond its
            sessions (:attr:`mqtt`: the broker's service in mqtt mode,
            :func:`vmr_handler.host.serve.channels.factory.broker_publisher`); None: nowhere.
    """

    def __init__(
        self,
        config: HostConfig,
        sessions: Dict[str, VmSession],
        clock: Optional[Clock] = None,
        appends: Optional[AppendBook] = None,
        host_entries: Optional[HostEntryRunner] = None,
        publisher: Optional[Callable[[Experiment], Publisher]] = None,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.clock: Clock = clock or SystemClock()
        self.host_entries = host_entries
        self.store = ExperimentStore(config.logs)
        #: peer host id -> the VMs it announced (coordinator; kept in experiment.json)
        self.peer_vms: Dict[str, List[str]] = {}
        self.barrier = Barrier(self.barrier_expected(), config.start_buffer)
        self.start_id: Optional[str] = None
        self.start_set_at: Optional[float] = None
        self.resumes: List[ResumeRecord] = []
        #: batches appended to running VMs
        self.appends = appends if appends is not None else AppendBook(config.logs)
        allow_resources(sessions, self.appends)
        self.kills = KillBook()  # vmr-host kill: sent until answered (this host run only)
        #: True while the VMs' logs are replayed at start (nothing is sent, announced or saved)
        self.loading = False
        #: VMs that failed / completed, for the running counts of the log
        self.outcomes: Dict[str, Set[str]] = {}
        #: this host's run id: new with new logs, kept in experiment.json
        self.run_id: str = new_run_id()
        #: called with ``(vm, new reports, host UTC received)`` after a VM's reports are stored
        #: and applied (the console: its live timeline, stream and metrics)
        self.watchers: List[Callable[[str, List[Event], float], None]] = []
        #: member: the run of the coordinator, learnt from its retained ``_start`` topic
        self.coordinator_run: Optional[str] = None
        self._stale_noted: Set[Tuple[str, Optional[str]]] = set()  # (peer, run) said ignored
        self._debounced = Debouncer(self.clock)  # experiment.json saves and announcements, per burst
        #: the MqttService in mqtt mode (made last: it talks back to this experiment)
        self.mqtt: Optional[Publisher] = publisher(self) if publisher is not None else None

    @property
    def kpi_interval(self) -> float:
        """Seconds between two KPI samples of each agent (``--kpi-interval``), told in ``welcome``."""
        return self.config.kpi_interval

    @property
    def default_timeout(self) -> Optional[float]:
        """Seconds an entry without a ``timeout`` may run (``--default-timeout``), told in ``welcome``."""
        return self.config.default_timeout

    def on_stored(self, vm: str, events: List[Event], received: float) -> None:
        """``vm``'s new reports were stored and applied: tell every watcher (a failing watcher
        is logged, never lets a report go unacknowledged)."""
        for watch in self.watchers:
            try:
                watch(vm, events, received)
            except Exception:
                log.exception("%s: a watcher of stored reports failed", vm)

    # ------------------------------------------------------------------ state
    def load(self) -> None:
        """Restore ``experiment.json`` (nothing when there is none).

        Raises:
            OSError: it cannot be read.
            SavedStateError: it holds a bad shape.
        """
        saved = self.store.load()
        if not saved:
            return
        barrier = saved.get("barrier", {})
        if not isinstance(barrier, Mapping):
            raise SavedStateError("'barrier' must be an object")
        self.run_id = run_of(saved.get("run_id")) or self.run_id  # saved before run ids: a new one
        self.peer_vms = restore_peers(saved.get("peer_vms"), self.config.peers)
        self.barrier = Barrier.from_dict(barrier, self.barrier_expected(), self.config.start_buffer)
        start_id = saved.get("start_time_id")
        self.start_id = start_id if isinstance(start_id, str) and start_id else None
        set_at = saved.get("start_set_at")
        self.start_set_at = float(set_at) if isinstance(set_at, (int, float)) else None
        resumes = saved.get("resumes", [])
        if not isinstance(resumes, list):
            raise SavedStateError("'resumes' must be a list")
        try:
            self.resumes = [ResumeRecord.from_dict(r) for r in resumes]
        except (KeyError, TypeError) as exc:
            raise SavedStateError(f"bad resume record: {exc}") from exc
        if self.barrier.start_time is not None:
            log.info("restored experiment start time %s", utc_text(self.barrier.start_time))

    def replayed(self) -> None:
        """The VMs' logs are replayed: give a start set by them (or restored without one) its
        event id, and save."""
        if self.barrier.start_time is not None and self.start_id is None:
            self._mark_start()
        self.save()

    def state_dict(self) -> Dict[str, Any]:
        """What ``experiment.json`` holds."""
        return {
            "version": STATE_VERSION,
            "host_version": __version__,
            "run_id": self.run_id,
            "name": self.config.name,
            "peer_vms": self.peer_vms,
            "barrier": self.barrier.to_dict(),
            "start_time_id": self.start_id,
            "start_set_at": self.start_set_at,
            "resumes": [r.to_dict() for r in self.resumes],
        }

    def save(self) -> None:
        """Write ``experiment.json`` now (an error is logged, not raised)."""
        try:
            self.store.save(self.state_dict())
        except OSError as exc:
            log.error("cannot save %s: %s", self.store.path, exc)

    # ------------------------------------------------------------------ several hosts
    def barrier_expected(self) -> Set[str]:
        """What the barrier waits for: this host's expected VMs, plus the VMs each peer
        announced or ``host:<peer>`` until it does (coordinator), or ``host:coordinator``
        (member: never decides)."""
        cfg = self.config
        names = set(cfg.expected)
        if cfg.role == "coordinator":
            names |= {PEER_PREFIX + p for p in cfg.peers if p not in self.peer_vms}
            names = names.union(*self.peer_vms.values())
        elif cfg.role == "member":
            names.add(PEER_PREFIX + "coordinator")
        return names

    def host_state(self) -> Optional[Dict[str, Any]]:
        """This host's announcement to the coordinator (member): its VMs and their configured
        times (UTC, this host's clock; hosts sharing a broker keep NTP time), its run and the
        coordinator's run it answers; None until that run is known."""
        if self.coordinator_run is None:
            return None
        own = set(self.config.expected) - self.barrier.excluded
        return {
            "host": self.config.host_id,
            "run": self.run_id,
            "coordinator_run": self.coordinator_run,
            "expected": sorted(own),
            "configured": {vm: t for vm, t in sorted(self.barrier.configured.items()) if vm in own},
            "sent_at": self.clock.time(),
        }

    def on_peer_state(self, peer: str, doc: Mapping[str, Any]) -> None:
        """A peer host's announcement (coordinator): wait for its VMs, take their configured times.

        Bad input (not a listed peer, wrong shapes, bad names) is logged and ignored.
        """
        if self.config.role != "coordinator":
            return
        if peer not in self.config.peers:
            log.warning("announcement from host %r ignored: not a --peers host", peer)
            return
        if not self._of_this_run(peer, doc):
            return
        expected, configured = doc.get("expected"), doc.get("configured")
        if not isinstance(expected, list) or not isinstance(configured, dict) or len(expected) > MAX_PEER_VMS:
            log.warning("malformed announcement from host %r ignored", peer)
            return
        names = [n for n in expected if isinstance(n, str) and VM_NAME.match(n)]
        elsewhere = set(self.config.vms).union(*(vs for p, vs in self.peer_vms.items() if p != peer))
        clash = sorted(set(names) & elsewhere)
        if clash:
            log.error("host %r announces VM(s) served elsewhere: %s; ignored", peer, ", ".join(clash))
            return
        if self.peer_vms.get(peer) != sorted(names):
            log.info("host %s serves %d VM(s): %s", peer, len(names), ", ".join(sorted(names)[:20]))
        self.peer_vms[peer] = sorted(names)
        just_set = self.barrier.update_expected(add=names, remove=[PEER_PREFIX + peer])
        for vm, at in configured.items():
            if vm in names and isinstance(at, (int, float)) and vm not in self.barrier.configured:
                just_set = self.barrier.configure(vm, float(at)) or just_set
        if just_set:
            self._start_was_set()
        else:
            self.save()

    def _of_this_run(self, peer: str, doc: Mapping[str, Any]) -> bool:
        """Whether ``peer``'s announcement answers this coordinator's run; if not (a retained
        announcement of an earlier run) it is logged once per peer and run."""
        answers = run_of(doc.get("coordinator_run"))
        if answers == self.run_id:
            return True
        if (peer, answers) not in self._stale_noted:
            self._stale_noted.add((peer, answers))
            log.warning(
                "announcement from host %s ignored: it answers run %s, this coordinator's run is "
                "%s (a stale retained announcement of an earlier run; the host announces again "
                "once it sees this run)",
                peer,
                answers or "(none)",
                self.run_id,
            )
        return False

    def on_coordinator_start(self, doc: Mapping[str, Any]) -> None:
        """The coordinator's run and start (member): learn its run (and announce this host's
        VMs to it), then adopt the start unless it is stale.

        A retained start left from an earlier run of the same experiment name would name this
        host's VMs as configured at times this host never saw: such a start is ignored.
        """
        if self.config.role != "member":
            return
        run = run_of(doc.get("run"))
        if run is None:
            log.warning("start from the coordinator without a run id ignored (another version?)")
            return
        if run != self.coordinator_run:
            log.info("coordinator %s runs %s", doc.get("coordinator"), run)
            self.coordinator_run = run
            if self.mqtt is not None:
                self.mqtt.publish_host_state()
        if self.barrier.start_time is not None or doc.get("start_time") is None:
            return
        start, configured = doc.get("start_time"), doc.get("configured")
        released = doc.get("released") or []
        if (
            not isinstance(start, (int, float))
            or isinstance(start, bool)
            or not math.isfinite(start)
            or not isinstance(configured, dict)
            or not isinstance(released, list)
        ):
            log.warning("malformed start from the coordinator ignored")
            return
        if PEER_PREFIX + str(self.config.host_id) in released:
            released = list(self.config.expected)  # released before this host announced its VMs
        for vm in self.config.expected:
            if vm in released:
                continue
            mine, theirs = self.barrier.configured.get(vm), configured.get(vm)
            if mine is None or not isinstance(theirs, (int, float)) or abs(theirs - mine) > 0.001:
                log.warning("start from the coordinator ignored: it does not match %s (stale?)", vm)
                return
        self.barrier.restore_start(float(start))
        self._start_was_set()

    def start_announcement(self) -> Dict[str, Any]:
        """What the coordinator publishes (retained) to member hosts: its run, and the start
        once it is set (``start_time`` None before)."""
        b = self.barrier
        doc: Dict[str, Any] = {"run": self.run_id, "coordinator": self.config.host_id, "start_time": None}
        if b.start_time is None:
            return doc
        return {
            **doc,
            "start_time": b.start_time,
            "configured": dict(sorted(b.configured.items())),
            "released": sorted(b.released | b.excluded),
        }

    # ------------------------------------------------------------------ HostApi
    def start_event(self) -> Optional[Event]:
        """The ``start_time`` event (stable id), or None before the start is set."""
        start = self.barrier.start_time
        if start is None or self.start_id is None:
            return None
        data = {"start_time": start, "run": self.run_id}  # an agent takes only its host's run's
        return Event(START_TIME, self.start_set_at or start, self.start_id, data)

    def pending_resumes(self, vm: str) -> List[Event]:
        """``resume``, ``schedule_append`` and ``kill`` events issued to ``vm`` and not yet answered,
        in the order issued (a RESUME never ends a break appended after it, nor misses one before)."""
        events = [r.event() for r in self.resumes if vm in r.targets and vm not in r.answered]
        events += self.kills.events_for(vm)
        return sorted(events + self.appends.events_for(vm), key=lambda e: e.timestamp)

    def on_configured(self, vm: str, at: float) -> None:
        """Record ``vm`` configured at host UTC ``at``; set and announce the start when it was the last."""
        if vm in self.barrier.configured:
            return
        just_set = self.barrier.configure(vm, at)
        if vm in self.barrier.expected and vm not in self.barrier.excluded:
            done, active = self.barrier.progress()
            log.info("%s configured (%d/%d); barrier waits for %s", vm, done, active,
                     waiting_text(self.barrier))  # fmt: skip
        if just_set:
            self._start_was_set()
        elif not self.loading:
            # the .jsonl holds the `configured` report: a host killed before this save replays it
            self._debounced.soon("save", self.save)
        if self.mqtt is not None and not self.loading:
            self._debounced.soon("announce", self.mqtt.publish_host_state)

    def on_outcome(self, vm: str, outcome: str, details: Optional[str], at: float) -> None:
        """Log a VM's failure or completion at INFO with the running counts."""
        done = self.outcomes.setdefault(outcome, set())
        if vm in done:
            return
        for other in self.outcomes.values():
            other.discard(vm)  # a VM that failed then completed counts once, as complete
        done.add(vm)
        if self.loading:
            return
        total = len(self.barrier.expected) or len(self.sessions)
        counts = ", ".join(f"{k} {len(v)}/{total}" for k, v in sorted(self.outcomes.items()) if v)
        if outcome == "failed":
            log.warning("%s failed: %s (%s)", vm, details or "no details", counts)
        else:
            log.info("%s %s (%s)", vm, outcome, counts)

    def on_resume_answer(self, vm: str, resume_id: str, data: Mapping[str, Any], at: float) -> None:
        """``vm`` answered RESUME (or appended batch, or kill) ``resume_id``: record it (it is no
        longer re-sent to ``vm``)."""
        self.kills.on_answer(vm, resume_id, data, at)
        if self.appends.on_answer(vm, resume_id, data, at) and not self.loading:
            self._debounced.soon("appends", self.appends.save)  # the answer is in the .jsonl too
        for r in self.resumes:
            if r.id == resume_id and vm in r.targets and vm not in r.answered:
                r.answered[vm] = {
                    "status": data.get("status"),
                    "details": data.get("details"),
                    "ended_break": data.get("ended_break"),
                    "ignored": data.get("ignored"),
                    "received": at,
                }
                if not self.loading:
                    self._debounced.soon("save", self.save)  # the answer is in the .jsonl (replayed)
                return

    @property
    def signs(self) -> bool:
        """True when ``--signing-key`` was given: schedule, start time and RESUME are signed."""
        return self.config.signing_key is not None

    def sign_for(self, vm: str, event: Event) -> Event:
        """``event`` as sent to ``vm`` now: signed for ``vm`` with the host key (SPEC §7), or
        unchanged without a key. Signed at every send, so a resend is fresh."""
        if self.config.signing_key is None:
            return event
        from vmr_handler.core.wire.signing import sign

        return sign(self.config.signing_key, event, vm, self.clock.time())

    # ------------------------------------------------------------------ start and RESUME
    def _mark_start(self) -> None:
        self.start_id = f"start-{uuid.uuid4().hex[:16]}"
        self.start_set_at = self.clock.time()

    def _start_was_set(self) -> None:
        self._mark_start()
        self.save()
        start = self.barrier.start_time
        log.warning("experiment start time set: %s; sent to every connected VM", utc_text(start))
        if not self.loading:
            # MQTT: one retained message reaches the VMs whose agents read it
            reached = self.mqtt.publish_start() if self.mqtt is not None else ()
            for s in self.sessions.values():
                if s.name not in reached:
                    s.push_start_time()

    def release(self, exclude: List[str]) -> None:
        """Start without the VMs in ``exclude`` (or without every VM still missing when it is
        empty); the start is set and sent when nobody else is missing.

        Raises:
            BarrierError: this host is a member (the coordinator releases).
            BarrierError: the start is already set, or a name is not an expected VM.
        """
        if self.config.role == "member":
            raise BarrierError("this host is a member: release the barrier on the coordinator host")
        start = self.barrier.release(self.clock.time(), exclude)
        if start is not None:
            self._start_was_set()
        else:
            self.save()

    def resume(self, targets: List[str]) -> Tuple[ResumeRecord, List[str]]:
        """Issue a RESUME to ``targets`` (served VM names) stamped with host experiment time
        ``at = now - start`` (``-inf`` before the start is set); saved at once.

        Returns:
            The record and the VMs it was sent to now (the others get it at their next hello).
        """
        now = self.clock.time()
        start = self.barrier.start_time
        at = -math.inf if start is None else now - start
        record = ResumeRecord(f"resume-{uuid.uuid4().hex[:16]}", at, now, targets, {})
        self.resumes.append(record)
        self.save()
        event = record.event()
        sent = [vm for vm in targets if self.sessions[vm].push_resume(event)]
        log.info("RESUME %s at experiment time %s to %s", record.id, event.data["at"], ", ".join(targets))
        return record, sent

    def barrier_status(self, now: float) -> Dict[str, Any]:
        """The ``experiment`` member of ``vmr-host status`` at UTC ``now``."""
        b = self.barrier
        return {
            "run_id": self.run_id,
            "start_time": b.start_time,
            "start_in": None if b.start_time is None else b.start_time - now,
            "start_buffer": b.buffer,
            "expected": sorted(b.expected),
            "configured": dict(sorted(b.configured.items())),
            "waiting_for": b.waiting_for(),
            "excluded": sorted(b.excluded),
            "released": sorted(b.released),
            "released_at": b.released_at,
        }


def restore_peers(saved: Any, peers: Collection[str]) -> Dict[str, List[str]]:
    """The peers' announced VMs as ``experiment.json`` keeps them (``{peer: [vm, ...]}``), for
    the ``--peers`` hosts still configured (a coordinator restarted with the same logs knows
    them before their retained announcements arrive again).

    Raises:
        SavedStateError: ``saved`` is not such a mapping.
    """
    if saved is None:
        return {}
    if not isinstance(saved, Mapping) or not all(
        isinstance(vms, list) and all(isinstance(v, str) and VM_NAME.match(v) for v in vms)
        for vms in saved.values()
    ):
        raise SavedStateError("'peer_vms' must map host ids to lists of VM names")
    return {str(p): sorted(vms) for p, vms in saved.items() if p in peers}
