"""The journal: the agent's progress on disk, written atomically (SPEC section 5).

Two files in the state directory:

* ``journal.json`` -- a snapshot: schedule digest, each entry's state, finished stages, the
  experiment start time, RESUMEs received, pause progress and reboot requesters.
  :meth:`Journal.save` writes a temp file, fsyncs it, renames it over the old one and fsyncs
  the directory, so the file is always either the old or the new state, never a torn one.
* ``journal.log`` -- entry state changes since that snapshot, one JSON line each, appended
  with a single ``write`` as they happen (so an agent killed with SIGKILL loses nothing) and
  fsynced by :meth:`Journal.sync`, which the engine calls within 50 ms (so a hard VM reset
  loses at most that). Firing an entry costs one small append, not a rewrite of the whole
  journal (benchmarks/README.md has the figures). Each snapshot empties the log; loading
  replays it, ignoring a torn last line.

A journal made for a different schedule digest is moved aside
(``journal.<digest12>.<utc>.json``) and a fresh one begins.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import os
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from vmr_handler.core.errors import JournalError
from vmr_handler.core.fsutil import append_whole, atomic_write

#: What a RESUME recorded before visibility was kept counts as having seen (every entry).
ALL_VISIBLE = 2**62

log = logging.getLogger(__name__)

JOURNAL_VERSION = 1
#: Seconds within which appended journal changes are fsynced (bounds loss on a hard VM reset).
JOURNAL_SYNC_DELAY = 0.05
#: Seconds between attempts to save a journal whose entry changes could not be appended.
JOURNAL_RETRY = 1.0
JOURNAL_NAME = "journal.json"
LOG_NAME = "journal.log"

#: Entry states recorded in the journal.
RUNNING = "running"
DONE = "done"
FAILED = "failed"


def _encode_float(value: Optional[float]) -> Any:
    if value is None:
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _decode_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    return float(value)  # float("-inf") parses the string form


class Journal:
    """Persistent progress of one schedule in one state directory.

    Args:
        state_dir: directory (created 0700 if missing).
        digest: sha256 of the schedule being run.

    Attributes:
        reset_from: path the previous journal was moved to when it belonged to another
            schedule (or was unreadable), else None.
        resumed: True when an existing journal for this schedule was loaded.

    Raises:
        JournalError: the directory or file cannot be created/read.
    """

    def __init__(self, state_dir: str, digest: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, JOURNAL_NAME)
        self.reset_from: Optional[str] = None
        self.resumed = False
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot create state dir {state_dir}: {exc.strerror or exc}") from exc
        self.log_path = os.path.join(state_dir, LOG_NAME)
        self._log_fd: Optional[int] = None
        self._unsynced = False
        #: an entry change could not be appended (a full disk): kept in memory, no more appends
        #: until a snapshot (:meth:`save`, retried by :class:`SyncSoon`) writes them all
        self.behind = False
        self.data: Dict[str, Any] = self._fresh(digest)
        if os.path.exists(self.path):
            old = self._read()
            if (
                old is not None
                and old.get("schedule_digest") == digest
                and old.get("version") == JOURNAL_VERSION
            ):
                self.data = old
                self.resumed = True
                self._replay_log(digest)
            else:
                old_digest = str((old or {}).get("schedule_digest", "unreadable"))[:12]
                aside = os.path.join(state_dir, f"journal.{old_digest}.{int(time.time())}.json")
                try:
                    os.replace(self.path, aside)
                except OSError as exc:
                    raise JournalError(f"cannot move old journal aside to {aside}: {exc}") from exc
                self.reset_from = aside

    @staticmethod
    def _fresh(digest: str) -> Dict[str, Any]:
        return {
            "version": JOURNAL_VERSION,
            "schedule_digest": digest,
            "entries": {},  # str(index) -> {"state": running|done|failed, ...}
            "stages_done": [],
            "initial_done": [],  # indices of -inf pauses/breaks passed
            "pause_began": {},  # str(index) -> UTC when a -inf pause began
            "configured_at": None,
            "start_time": None,
            "resumes": [],
            "reboot": None,  # {"stage": k, "requesters": [...]}
            "holds": {},  # {"hold": [index...], "hold_end": [index...]}: positive-time pauses passed
            "placed": [],  # [{"boot", "at", "ahead", "entries": [index...]}]: Journal.placements
            "failed": None,
        }

    def _read(self) -> Optional[Dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                doc = json.loads(fh.read().decode("utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def _replay_log(self, digest: str) -> None:
        """Apply ``journal.log`` lines written after the snapshot (same digest only)."""
        try:
            with open(self.log_path, "rb") as fh:
                lines = fh.read().split(b"\n")
        except OSError:
            return
        if not lines or lines[0] != json.dumps({"digest": digest}).encode():
            return  # belongs to another snapshot
        for raw in lines[1:]:
            try:
                rec = json.loads(raw)
                index, value = int(rec["i"]), rec["r"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line
            if value is None:
                self.data["entries"].pop(str(index), None)
            else:
                self.data["entries"][str(index)] = value

    def save(self) -> None:
        """Persist the whole state atomically (snapshot), then empty the entry log.

        Raises:
            JournalError: the write failed (disk full, read-only...); the old journal stays.
        """
        try:
            atomic_write(self.path, json.dumps(self.data, separators=(",", ":")).encode("utf-8"))
            self._open_log(truncate=True)
        except OSError as exc:
            if not self.behind:  # said once per episode; the state stays in memory meanwhile
                waits = exc.errno in WAIT_ERRNOS
                log.error(
                    "cannot write journal %s (%s): the agent's progress is kept in memory %s",
                    self.path,
                    exc.strerror or exc,
                    "and saved as soon as the disk lets it (free space in the state dir)"
                    if waits
                    else "only: make the state dir writable (read-only file system? permissions?)",
                )
            self.behind = True  # no appends after a lost snapshot: the next save writes it all
            raise JournalError(f"cannot write journal {self.path}: {exc.strerror or exc}") from exc
        if self.behind:
            self.behind = False
            log.warning("journal %s written again: the entry changes kept in memory are saved", self.path)

    def _open_log(self, truncate: bool) -> int:
        if self._log_fd is not None and not truncate:
            return self._log_fd
        if self._log_fd is not None:
            os.close(self._log_fd)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        os.write(fd, json.dumps({"digest": self.data["schedule_digest"]}).encode() + b"\n")
        self._log_fd = fd
        self._unsynced = False
        return fd

    def _log_entry(self, index: int, record: Optional[Dict[str, Any]]) -> None:
        """Append one entry change; on a full disk keep it in memory (:attr:`behind`, logged
        once) rather than fail the VM: the next successful :meth:`save` writes every change."""
        if self.behind:
            return  # appending after a lost change could replay a later state without it
        line = json.dumps({"i": index, "r": record}, separators=(",", ":")).encode() + b"\n"
        try:
            fd = self._open_log(truncate=False)
            append_whole(fd, line, os.fstat(fd).st_size)  # whole or not at all
        except OSError as exc:
            self.behind = True
            log.error(
                "cannot append to journal log %s (%s): entry changes kept in memory until the "
                "journal can be saved again",
                self.log_path,
                exc.strerror or exc,
            )
            return
        self._unsynced = True

    @property
    def unsynced(self) -> bool:
        """True when entry changes were written but not yet fsynced."""
        return self._unsynced

    def sync(self) -> None:
        """fsync the entry log (call soon after entry changes; cheap when nothing changed);
        when changes are kept in memory (:attr:`behind`), :meth:`save` them first.

        Raises:
            JournalError: the fsync or that save failed.
        """
        if self.behind:
            self.save()
        if self._log_fd is not None and self._unsynced:
            try:
                os.fsync(self._log_fd)
            except OSError as exc:
                raise JournalError(
                    f"cannot fsync journal log {self.log_path}: {exc.strerror or exc}"
                ) from exc
            self._unsynced = False

    def close(self) -> None:
        """Sync and close the entry log."""
        try:
            self.sync()
        finally:
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None

    # --- entries -------------------------------------------------------------------------
    def entry_state(self, index: int) -> Optional[str]:
        """``running``, ``done``, ``failed`` or None (never started)."""
        rec = self.data["entries"].get(str(index))
        return None if rec is None else str(rec.get("state"))

    def mark_running(
        self, index: int, pid: Optional[int] = None, create_time: Optional[float] = None
    ) -> None:
        """Record (in the log, at once) that ``index`` is being started or has started as ``pid``."""
        self._set_entry(index, {"state": RUNNING, "pid": pid, "create_time": create_time})

    def _set_entry(self, index: int, record: Optional[Dict[str, Any]]) -> None:
        if record is None:
            self.data["entries"].pop(str(index), None)
        else:
            self.data["entries"][str(index)] = record
        self._log_entry(index, record)

    def mark_reports_held(self, index: int, exit_code: Optional[int] = None) -> None:
        """Record (in the log, at once) that ``index`` ended (``exit_code``) but some of its
        reports are not written yet: it stays ``running`` (a restart runs it again) with no
        process left to kill, and ``reports_held`` says why it runs again."""
        self._set_entry(index, {"state": RUNNING, "exit_code": exit_code, "reports_held": True})

    def mark_done(self, index: int, state: str = DONE, exit_code: Optional[int] = None) -> None:
        """Record (in the log, at once) that ``index`` ended (``done``) or could not run (``failed``)."""
        self._set_entry(index, {"state": state, "exit_code": exit_code})

    def entry_outcomes(self) -> Dict[int, Tuple[str, Optional[int]]]:
        """Every recorded entry: ``{index: (state, exit_code)}`` (state ``running``, ``done`` or
        ``failed``; exit_code None for a data-only entry, a signal or no exit yet)."""
        return {int(k): (str(v.get("state")), v.get("exit_code")) for k, v in self.data["entries"].items()}

    def running_entries(self) -> Dict[int, Dict[str, Any]]:
        """Entries recorded as running (left over by a crash): ``{index: record}``."""
        return {int(k): v for k, v in self.data["entries"].items() if v.get("state") == RUNNING}

    def forget(self, index: int) -> None:
        """Drop an entry's record so that it runs again (interrupted or reboot requester)."""
        self._set_entry(index, None)

    # --- stages, barrier, pauses -----------------------------------------------------------
    @property
    def stages_done(self) -> List[int]:
        """0-based stage numbers that have finished."""
        return list(self.data["stages_done"])

    def mark_stage_done(self, stage: int) -> None:
        """Record that ``stage`` finished."""
        if stage not in self.data["stages_done"]:
            self.data["stages_done"].append(stage)

    @property
    def configured_at(self) -> Optional[float]:
        """UTC epoch seconds when the last stage ended, or None."""
        return _decode_float(self.data["configured_at"])

    @configured_at.setter
    def configured_at(self, value: float) -> None:
        self.data["configured_at"] = value

    @property
    def start_time(self) -> Optional[float]:
        """Experiment start time, UTC epoch seconds, or None (never changes once set)."""
        return _decode_float(self.data["start_time"])

    @start_time.setter
    def start_time(self, value: float) -> None:
        if self.data["start_time"] is not None and float(self.data["start_time"]) != value:
            raise JournalError("experiment start time is already set and never changes")
        self.data["start_time"] = value

    @property
    def resumes(self) -> List[float]:
        """RESUME times received, experiment seconds (``-inf`` = before the experiment start)."""
        return [float(r) for r in self.data["resumes"]]

    def add_resume(self, at: float, visible: Optional[int] = None) -> None:
        """Record a RESUME received at experiment time ``at``, when the schedule had ``visible``
        entries (it ends no break appended after it: :func:`~vmr_handler.core.timeline.build_plan`)."""
        self.data["resumes"].append(_encode_float(at))
        if visible is not None:
            marks: List[Optional[int]] = self.data.setdefault("resume_visible", [])
            marks.extend([None] * (len(self.data["resumes"]) - 1 - len(marks)))
            marks.append(visible)

    @property
    def resume_visibility(self) -> Optional[List[int]]:
        """Per RESUME, how many entries the schedule had when it arrived (a RESUME recorded
        without it saw them all); None when no RESUME has one (nothing was ever appended)."""
        marks: Optional[List[Optional[int]]] = self.data.get("resume_visible")
        if not marks:
            return None
        count = len(self.data["resumes"])
        padded = (marks + [None] * count)[:count]
        return [ALL_VISIBLE if m is None else int(m) for m in padded]

    # Batches appended to the running schedule (``vmr-host schedule add``).
    @property
    def appends(self) -> List[Dict[str, Any]]:
        """The batches appended, in order: ``{"id", "file", "sha256", "format", "first_index",
        "count", "at", "stages": [[number, start_time, [index, ...]], ...], "moved": {index: t}}``
        (:mod:`vmr_handler.agent.engine.appends`)."""
        batches: List[Dict[str, Any]] = self.data.setdefault("appends", [])
        return batches

    def add_append(self, record: Dict[str, Any]) -> None:
        """Record an appended batch (saved by :meth:`save`; the caller saves before answering)."""
        self.appends.append(record)

    # The engine's other progress, each through one method (nothing edits ``data`` directly).
    def applied_resume(self, resume_id: str) -> Optional[Dict[str, Any]]:
        """The first outcome of the RESUME with host id ``resume_id``, None if never applied."""
        applied: Dict[str, Dict[str, Any]] = self.data.setdefault("resume_ids", {})
        return applied.get(resume_id)

    def record_resume_id(self, resume_id: str, outcome: Dict[str, Any]) -> None:
        """Remember that RESUME ``resume_id`` was applied, with its outcome (saved by :meth:`save`)."""
        self.data.setdefault("resume_ids", {})[resume_id] = outcome

    def applied_kill(self, kill_id: str) -> Optional[Dict[str, Any]]:
        """The outcome of the host's kill ``kill_id`` (``vmr-host kill``), None if never applied."""
        applied: Dict[str, Dict[str, Any]] = self.data.setdefault("kill_ids", {})
        return applied.get(kill_id)

    def record_kill(
        self,
        kill_id: str,
        outcome: Dict[str, Any],
        index: Optional[int] = None,
        mark: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Remember kill ``kill_id``'s outcome (saved by :meth:`save`); with ``index`` and
        ``mark`` (what its ``entry_exited`` will say), also mark that running entry as ended by
        it (in the log, at once), so that an agent restarted before its end was journaled does
        not run it again (:meth:`killed_by`)."""
        self.data.setdefault("kill_ids", {})[kill_id] = outcome
        if mark is not None and index is not None:
            self.mark_killed(index, mark)

    def mark_killed(self, index: int, mark: Dict[str, Any]) -> None:
        """Mark running entry ``index`` as ended by a kill or its timeout (``mark``: what its
        ``entry_exited`` will say), in the log at once (:meth:`killed_by`)."""
        rec = self.data["entries"].get(str(index))
        if rec is not None and rec.get("state") == RUNNING:
            self._set_entry(index, {**rec, "kill": mark})

    def killed_by(self, index: int) -> Optional[Dict[str, Any]]:
        """The kill mark (:meth:`record_kill`) of running entry ``index``, None if not killed."""
        rec = self.data["entries"].get(str(index)) or {}
        kill = rec.get("kill")
        return kill if isinstance(kill, dict) else None

    @property
    def placements(self) -> List[Dict[str, Any]]:
        """Whose data was placed, when and in which boot: a live list, saved by :meth:`save`.

        One group per agent run and way of placing: ``{"boot": kernel boot id or None, "at":
        reference UTC seconds the group began or None, "ahead": True when placed before
        anything ran, "entries": [entry index, ...]}`` (:mod:`vmr_handler.agent.engine.placement`).
        A journal of the older format (``"preloaded": [index, ...]``) reads as one group with
        boot and time unknown, once: the list is moved here.
        """
        groups: List[Dict[str, Any]] = self.data.setdefault("placed", [])
        legacy = self.data.pop("preloaded", None)
        if isinstance(legacy, list) and legacy:
            groups.insert(0, {"boot": None, "at": None, "ahead": True, "entries": [int(i) for i in legacy]})
        return groups

    def initial_done(self, index: int) -> bool:
        """Whether the ``-inf`` pause/break at entry ``index`` was passed."""
        return index in self.data["initial_done"]

    def mark_initial_done(self, index: int) -> None:
        """The ``-inf`` pause/break at entry ``index`` was passed."""
        self.data["initial_done"].append(index)

    def pause_began(self, index: int, now: float) -> float:
        """UTC when the ``-inf`` pause at entry ``index`` began: ``now`` the first time asked."""
        return float(self.data["pause_began"].setdefault(str(index), now))

    def hold_passed(self, what: str, index: int) -> bool:
        """Whether positive-time milestone ``what`` (``hold`` or ``hold_end``) of entry ``index`` passed."""
        holds: Dict[str, List[int]] = self.data.setdefault("holds", {})
        return index in holds.get(what, [])

    def mark_hold(self, what: str, index: int) -> None:
        """Positive-time milestone ``what`` of the pause/break at entry ``index`` passed."""
        self.data.setdefault("holds", {}).setdefault(what, []).append(index)

    @property
    def reboot(self) -> Optional[Dict[str, Any]]:
        """The pending reboot request ``{"stage": k, "requesters": [index...]}``, or None."""
        reboot: Optional[Dict[str, Any]] = self.data.get("reboot")
        return reboot

    @reboot.setter
    def reboot(self, value: Optional[Dict[str, Any]]) -> None:
        self.data["reboot"] = value


#: Why a journal write may succeed later: no space, over quota, an I/O error (a full or failing
#: disk). Anything else (read-only, permissions) fails the run at once.
WAIT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


def _worth_waiting(exc: BaseException) -> bool:
    return isinstance(exc, JournalError) and getattr(exc.__cause__, "errno", None) in WAIT_ERRNOS


class SyncSoon:
    """fsyncs a journal's appended changes within :data:`JOURNAL_SYNC_DELAY` of the first one:
    one fsync per burst, off the firing path (a timer on the running asyncio loop).

    Args:
        journal: the journal to sync.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._handle: Optional[asyncio.TimerHandle] = None

    def changed(self) -> None:
        """Entry changes were appended: sync within the delay (no effect when a sync is due)."""
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(JOURNAL_SYNC_DELAY, self._sync)

    def _sync(self) -> None:
        self._handle = None
        try:
            self.journal.sync()
        except JournalError as exc:
            if not self.journal.behind:
                log.error("%s", exc)
        if self.journal.behind:  # a full disk: try again until the snapshot is written
            self._handle = asyncio.get_running_loop().call_later(JOURNAL_RETRY, self._sync)

    def save_soon(self) -> None:
        """Snapshot the journal now; on a full disk keep the state in memory and retry every
        :data:`JOURNAL_RETRY` seconds in the background (never raises). For changes that may
        wait for the disk (a RESUME, the start time: the host sends them again after a crash);
        before an act that must not be repeated use :meth:`save_durably`. Issue 16."""
        try:
            self.journal.save()
        except JournalError:
            self.changed()

    async def save_durably(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        """Snapshot the journal, waiting (retried every :data:`JOURNAL_RETRY` seconds) until the
        disk takes it: the engine waits rather than lose its progress (full disk).

        Args:
            sleep: waits that many seconds (the engine's clock); it raises to give up (a stop).

        Raises:
            JournalError: the disk refused it for a reason waiting cannot cure (a read-only
                file system, permissions: :data:`WAIT_ERRNOS` lists what is waited out).
        """
        from tenacity import AsyncRetrying, retry_if_exception, wait_fixed  # only when needed

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_worth_waiting),
            wait=wait_fixed(JOURNAL_RETRY),
            sleep=sleep,
            reraise=True,
        ):
            with attempt:
                self.journal.save()

    def cancel(self) -> None:
        """Drop a sync that is due (the caller saves or closes the journal itself)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
