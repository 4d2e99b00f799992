"""Batches of entries the operator appended to running VMs (``vmr-host schedule add``).

Each batch is one :class:`AppendRecord` with a stable id (the ``schedule_append`` event id,
which the agent appends once), the VMs it targets and each VM's answer. Like a RESUME, it is
sent at once to the VMs that are connected and again at each handshake until the VM answered
(:meth:`AppendBook.pending`). It is kept in the logs directory before anything is sent::

    <logs>/appends.json                 the records (atomic writes)
    <logs>/appends/<id>.<format>        each batch's bytes as the operator gave them

The agent's answer says where the entries went (``first_index``, ``count``, ``stages``,
``moved``): ``vmr-host schedule show`` rebuilds each VM's schedule from it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

from vmr_handler.core.errors import SavedStateError
from vmr_handler.core.events import Event
from vmr_handler.core.fsutil import atomic_write
from vmr_handler.core.wire.protocol import SCHEDULE_APPEND
from vmr_handler.host.serve.config import VmSpec

log = logging.getLogger("vmr_handler.host")

APPENDS_FILE = "appends.json"
APPENDS_DIR = "appends"
#: What an answer keeps of the agent's ``result``.
ANSWER_KEYS = ("status", "details", "first_index", "count", "stages", "moved")


@dataclass
class AppendRecord:
    """One batch appended to some VMs.

    Attributes:
        id: the batch id (``append-<hex>``), the same in every ``schedule_append`` sent.
        issued: host UTC it was issued.
        targets: VM names it is for.
        file: its bytes, relative to the logs directory.
        sha256: hex digest of those bytes.
        format: ``yaml``, ``json`` or ``pickle``.
        entries: how many entries it holds.
        resources: per VM, the ``{filename: {"size", "sha256"}}`` of the files it drops.
        answered: VM -> ``{"status", "details", "first_index", "count", "stages", "moved",
            "received"}`` (host UTC received).
    """

    id: str
    issued: float
    targets: List[str]
    file: str
    sha256: str
    format: str
    entries: int
    resources: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    answered: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe form (``appends.json``)."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AppendRecord:
        """Inverse of :meth:`to_dict`.

        Raises:
            SavedStateError: a member is missing or of the wrong type.
        """
        try:
            record = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        except TypeError as exc:
            raise SavedStateError(f"bad append record: {exc}") from exc
        if not isinstance(record.targets, list) or not isinstance(record.answered, dict):
            raise SavedStateError("bad append record: targets must be a list, answered a mapping")
        return record


class AppendBook:
    """The batches appended in this logs directory, loaded at host start.

    Args:
        logs: the logs directory.

    Raises:
        SavedStateError: ``appends.json`` exists but cannot be read (the host refuses to start
            rather than forget batches it promised).
    """

    def __init__(self, logs: str) -> None:
        self.logs = logs
        self.path = os.path.join(logs, APPENDS_FILE)
        self.records: List[AppendRecord] = []
        self._encoded: Dict[str, str] = {}  # batch id -> its bytes in base64
        try:
            with open(self.path, "rb") as fh:
                saved = json.loads(fh.read())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise SavedStateError(f"{self.path} cannot be read: {exc}") from exc
        if not isinstance(saved, list):
            raise SavedStateError(f"{self.path} must hold a list of append records")
        self.records = [AppendRecord.from_dict(r) for r in saved]

    def save(self) -> None:
        """Write ``appends.json`` atomically.

        Raises:
            OSError: it cannot be written.
        """
        data = json.dumps([r.to_dict() for r in self.records], indent=1).encode()
        atomic_write(self.path, data, 0o644)

    def add(
        self, raw: bytes, fmt: str, entries: int, targets: List[str], resources: Dict[str, Dict[str, Any]],
        now: float,
    ) -> AppendRecord:  # fmt: skip
        """Keep a new batch (its bytes, then the record) before it is sent anywhere.

        Raises:
            OSError: the logs directory cannot be written (nothing is kept or sent).
        """
        ident = f"append-{uuid.uuid4().hex[:16]}"
        relative = os.path.join(APPENDS_DIR, f"{ident}.{fmt}")
        os.makedirs(os.path.join(self.logs, APPENDS_DIR), exist_ok=True)
        atomic_write(os.path.join(self.logs, relative), raw, 0o644)
        digest = hashlib.sha256(raw).hexdigest()
        record = AppendRecord(ident, now, targets, relative, digest, fmt, entries, resources)
        self.records.append(record)
        try:
            self.save()
        except OSError:
            self.records.remove(record)
            raise
        return record

    def raw(self, record: AppendRecord) -> bytes:
        """The batch's bytes.

        Raises:
            OSError: the file is gone.
        """
        with open(os.path.join(self.logs, record.file), "rb") as fh:
            return fh.read()

    def event(self, record: AppendRecord, vm: str) -> Event:
        """The ``schedule_append`` event of ``record`` for ``vm`` (the same id every time).

        Raises:
            OSError: the batch's file is gone.
        """
        encoded = self._encoded.get(record.id)
        if encoded is None:  # read and encoded once (every handshake and answer asks again)
            encoded = self._encoded[record.id] = base64.b64encode(self.raw(record)).decode("ascii")
        data = {
            "format": record.format,
            "sha256": record.sha256,
            "entries": record.entries,
            "data_b64": encoded,
            "resources": record.resources.get(vm, {}),
        }
        return Event(SCHEDULE_APPEND, record.issued, record.id, data)

    def events_for(self, vm: str) -> List[Event]:
        """The ``schedule_append`` events ``vm`` has not answered, oldest first (a batch whose
        file is gone is logged and left out)."""
        events = []
        for record in self.pending(vm):
            try:
                events.append(self.event(record, vm))
            except OSError as exc:
                log.error("batch %s for %s cannot be sent: %s", record.id, vm, exc)
        return events

    def pending(self, vm: str) -> List[AppendRecord]:
        """The batches for ``vm`` it has not answered, oldest first."""
        return [r for r in self.records if vm in r.targets and vm not in r.answered]

    def on_answer(self, vm: str, ident: str, data: Mapping[str, Any], at: float) -> bool:
        """``vm`` answered batch ``ident`` (received at host UTC ``at``): recorded. Returns
        whether ``ident`` is a batch for ``vm`` not answered before (the caller saves)."""
        for r in self.records:
            if r.id == ident and vm in r.targets and vm not in r.answered:
                r.answered[vm] = {**{k: data.get(k) for k in ANSWER_KEYS}, "received": at}
                return True
        return False

    def accepted(self, vm: str) -> List[AppendRecord]:
        """The batches ``vm`` appended, in the order it appended them (by ``first_index``)."""
        taken = [r for r in self.records if r.answered.get(vm, {}).get("status") == "success"]
        return sorted(taken, key=lambda r: int(r.answered[vm].get("first_index") or 0))

    def find(self, ident: str) -> Optional[AppendRecord]:
        """The record with id ``ident``, or None."""
        return next((r for r in self.records if r.id == ident), None)


class Pusher(Protocol):
    """What issuing a batch needs of a VM's session
    (:class:`~vmr_handler.host.serve.session.session.VmSession`)."""

    spec: VmSpec

    def push_resume(self, resume: Event) -> bool:
        """Send a control event now if connected and handshaken; whether it was sent."""


def allow_resources(sessions: Mapping[str, Pusher], book: AppendBook) -> None:
    """Let each VM fetch the VM-resource files of the batches appended to it (a VM is served
    only files its own schedule, or a batch appended to it, drops)."""
    for record in book.records:
        for vm, names in record.resources.items():
            session = sessions.get(vm)
            if session is not None and not set(names) <= session.spec.filenames:
                allowed = session.spec.filenames | set(names)
                session.spec = dataclasses.replace(session.spec, filenames=allowed)


def issue_batch(
    book: AppendBook, sessions: Mapping[str, Pusher], raw: bytes, fmt: str, entries: int,
    targets: List[str], resources: Dict[str, Dict[str, Any]], now: float,
) -> Tuple[AppendRecord, List[str]]:  # fmt: skip
    """Keep a batch for ``targets``, then send it to those connected now (the others get it at
    their next handshake). Returns the record and the VMs it was sent to now.

    Raises:
        OSError: the logs directory cannot be written (nothing is sent).
    """
    record = book.add(raw, fmt, entries, targets, resources, now)
    allow_resources(sessions, book)
    sent = [vm for vm in targets if sessions[vm].push_resume(book.event(record, vm))]
    log.info("batch %s (%d entries) appended to %s; sent now to %d", record.id, entries, ", ".join(targets),
             len(sent))  # fmt: skip
    return record, sent
