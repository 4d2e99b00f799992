"""Files a VM sends out through its session: a ``transfer_chunk`` report is written to the
VM's :class:`~vmr_handler.host.transfers.TransferStore`; a ``transfer_uploaded`` report puts
in place the file it names, uploaded over HTTP(S). Either is logged as a summary (no file
data) with the outcome; refusals are counted and remarked, never raised.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Callable, Dict, Mapping

from vmr_handler.core.errors import TransferRefused
from vmr_handler.core.events import Event
from vmr_handler.core.protocol import TRANSFER_CHUNK, TRANSFER_UPLOADED
from vmr_handler.host.logtext import printable
from vmr_handler.host.transfers import TransferStore
from vmr_handler.host.vmstate import Counters

#: ``warn(kind, text, now)``: a rate-limited remark on hostile input (the session's).
WarnFn = Callable[[str, str, float], None]

#: The report types this module takes.
TRANSFER_TYPES = frozenset({TRANSFER_CHUNK, TRANSFER_UPLOADED})


def take_transfer(ev: Event, transfers: TransferStore, counters: Counters, warn: WarnFn, now: float) -> Event:
    """Store a ``transfer_chunk``, or put in place a file uploaded over HTTP(S) that a
    ``transfer_uploaded`` report names (:meth:`TransferStore.commit_upload`); return the
    event to log in its place (no file data; ``status``/``details`` say what happened)."""
    d = ev.data
    summary: Dict[str, Any] = {
        k: d.get(k) for k in ("location", "offset", "size", "sha256", "last", "mtime") if k in d
    }
    if isinstance(summary.get("location"), str):
        summary["location"] = printable(summary["location"], 4096)
    what = "transfer chunk" if ev.type == TRANSFER_CHUNK else "uploaded transfer"
    try:
        if ev.type == TRANSFER_UPLOADED:
            args = (d.get("location"), d.get("sha256"), d.get("size"), d.get("mtime"))
            outcome = transfers.commit_upload(*args)
            summary.update(stored_as=outcome.path, status="success", details="complete (uploaded over HTTP)")
            return Event(ev.type, ev.timestamp, ev.id, summary)
        _write_chunk(d, transfers, counters, warn, now, summary)
    except TransferRefused as exc:
        counters.transfer_refused += 1
        summary.update(status="error", details=f"refused: {exc}")
        warn("transfer", f"{what} refused: {exc}", now)
    except OSError as exc:
        counters.transfer_refused += 1
        summary.update(status="error", details=f"host could not store it: {exc.strerror or exc}")
        warn("transfer-io", f"{what} not stored: {exc}", now)
    return Event(ev.type, ev.timestamp, ev.id, summary)


def _write_chunk(
    d: Mapping[str, Any],
    transfers: TransferStore,
    counters: Counters,
    warn: WarnFn,
    now: float,
    summary: Dict[str, Any],
) -> None:
    """Decode and store one ``transfer_chunk``; its outcome goes into ``summary``.

    Raises:
        TransferRefused: bad data, or the store refuses it.
        OSError: the store cannot write it.
    """
    raw = d.get("data_b64", "")
    if not isinstance(raw, str):
        raise TransferRefused("data_b64 must be a string")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TransferRefused(f"data_b64 is not base64: {exc}") from exc
    summary["data_len"] = len(data)
    outcome = transfers.write_chunk(
        d.get("location"),
        d.get("offset"),
        data,
        d.get("size"),
        d.get("sha256"),
        bool(d.get("last")),
        d.get("mtime"),
    )
    summary["stored_as"] = outcome.path
    if outcome.sha256_ok is False:
        counters.transfer_bad_sha256 += 1
        summary.update(status="error", details="sha256 of the assembled file does not match")
        warn("transfer-sha", f"transfer {outcome.path!r}: sha256 mismatch, not put in place", now)
    else:
        summary.update(status="success", details="complete" if outcome.complete else "chunk stored")
