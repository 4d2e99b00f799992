"""The ids of the reports a VM's log holds, in bounded memory.

An agent run names its events ``<prefix>-<counter>`` (:class:`vmr_handler.core.events.EventFactory`:
a random prefix per agent process, a counter from 1 written with at least 8 digits), and sends
its unacknowledged reports oldest first with at most 2000 in flight
(:mod:`vmr_handler.agent.connected.link`). So instead of every id ever seen, :class:`SeenIds` keeps per
prefix (an agent *run*) the highest counter seen (``top``) and one bit per counter in the
``window`` counters below it. An id is *seen* when:

- its counter is in its run's window and its bit is set (exact), or
- its counter is at or below ``top - window`` (older than the window: treated as seen,
  acknowledged and not stored again). An honest agent never has an unacknowledged report that
  far behind the newest one of its run that the host stored, so for it this is exact;
- its run is *retired* (more than ``runs`` runs were active since, oldest used first) and its
  counter is at or below that run's ``top``.

Runs beyond ``prefixes`` are forgotten (oldest used first), and so are ids of any other form
(not what an agent makes) beyond ``others``: a forgotten id sent again is stored again. Only a
hostile guest gets there; its log is still held to its quota. Memory per VM is at most about
``runs * window / 8`` bytes of windows plus ~200 bytes per remembered run or other id.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from vmr_handler.core.errors import InvalidArgument, SavedStateError

#: longest prefix taken as an agent run's (longer ids count as "other")
MAX_PREFIX = 64


@dataclass(frozen=True)
class SeenLimits:
    """How much a VM's de-duplication may remember (``Limits.dedup_*``).

    Attributes:
        window: counters per agent run known exactly (a multiple of 8).
        runs: agent runs with a window at a time (older ones keep only their top counter).
        prefixes: agent runs remembered at all.
        others: ids of any other form remembered.
    """

    window: int = 65536
    runs: int = 16
    prefixes: int = 4096
    others: int = 4096

    def __post_init__(self) -> None:
        if self.window < 8 or self.window % 8 or min(self.runs, self.prefixes, self.others) < 1:
            raise InvalidArgument(f"bad de-duplication limits: {self}")


def split_id(event_id: str) -> Optional[Tuple[str, int]]:
    """``(prefix, counter)`` of an id an agent makes (``<prefix>-<counter>``, the counter in
    its canonical form: at least 8 digits, no extra leading zero), else None."""
    prefix, sep, digits = event_id.rpartition("-")
    if not sep or not prefix or len(prefix) > MAX_PREFIX or len(digits) < 8 or not digits.isdigit():
        return None
    if not digits.isascii() or (len(digits) > 8 and digits[0] == "0"):
        return None
    return prefix, int(digits)


class _Run:
    """One agent run: its top counter and a ring of ``window`` bits below it (None: retired)."""

    __slots__ = ("ring", "top")

    def __init__(self, top: int, ring: Optional[bytearray]) -> None:
        self.top = top
        self.ring = ring


class SeenIds:
    """Which ids a VM's log holds (see the module docstring for what is exact).

    Args:
        limits: the memory bounds (default: :class:`SeenLimits`'s).
    """

    def __init__(self, limits: Optional[SeenLimits] = None) -> None:
        self.limits = limits or SeenLimits()
        self._runs: OrderedDict[str, _Run] = OrderedDict()  # least recently used first
        self._live = 0  # runs with a ring
        self._others: OrderedDict[str, None] = OrderedDict()
        self._last = ""  # the prefix of the last id added (its run is the last used)
        #: runs and other ids forgotten to stay in bounds (a resend of theirs is stored again)
        self.forgotten = 0

    def __contains__(self, event_id: str) -> bool:
        parts = split_id(event_id)
        if parts is None:
            return event_id in self._others
        run = self._runs.get(parts[0])
        if run is None or parts[1] > run.top:
            return False
        if run.ring is None or parts[1] <= run.top - self.limits.window:
            return True
        pos = parts[1] % self.limits.window
        return bool(run.ring[pos >> 3] >> (pos & 7) & 1)

    def add(self, event_id: str) -> None:
        """Remember ``event_id`` (forgetting the oldest runs or other ids beyond the limits)."""
        parts = split_id(event_id)
        if parts is None:
            self._others[event_id] = None
            self._others.move_to_end(event_id)
            if len(self._others) > self.limits.others:
                self._others.popitem(last=False)
                self.forgotten += 1
            return
        prefix, counter = parts
        if prefix == self._last:  # the usual case: the run of the id before (last used already)
            run = self._runs[prefix]
        else:
            got = self._runs.get(prefix)
            if got is None:
                run = self._new_run(prefix, counter)
            else:
                run = got
                self._runs.move_to_end(prefix)
            self._last = prefix
        if run.ring is None:
            run.top = max(run.top, counter)
            return
        if counter > run.top + 1:
            self._advance(run, counter)
        elif counter == run.top + 1:  # the next one: its bit is the one that leaves the window
            run.top = counter
        elif counter <= run.top - self.limits.window:
            return
        pos = counter % self.limits.window
        run.ring[pos >> 3] |= 1 << (pos & 7)

    def update(self, ids: List[str]) -> None:
        """:meth:`add` each of ``ids``."""
        for i in ids:
            self.add(i)

    def _new_run(self, prefix: str, counter: int) -> _Run:
        run = _Run(counter, bytearray(self.limits.window // 8))
        self._runs[prefix] = run
        self._live += 1
        if self._live > self.limits.runs:  # retire the least recently used run with a ring
            for old in self._runs.values():
                if old.ring is not None:
                    old.ring = None
                    self._live -= 1
                    break
        if len(self._runs) > self.limits.prefixes:
            _, gone = self._runs.popitem(last=False)
            self._live -= gone.ring is not None
            self.forgotten += 1
        return run

    def _advance(self, run: _Run, counter: int) -> None:
        """Move ``run``'s top to ``counter``: clear the bits of the counters it passes."""
        window = self.limits.window
        assert run.ring is not None
        if counter - run.top >= window:
            run.ring[:] = bytes(window // 8)
        else:
            first, last = (run.top + 1) % window, counter % window
            if first <= last:
                _clear(run.ring, first, last + 1)
            else:
                _clear(run.ring, first, window)
                _clear(run.ring, 0, last + 1)
        run.top = counter

    def stats(self) -> Dict[str, int]:
        """``{"runs", "windows", "other_ids", "forgotten", "bytes"}`` (``bytes``: the windows)."""
        return {
            "runs": len(self._runs),
            "windows": self._live,
            "other_ids": len(self._others),
            "forgotten": self.forgotten,
            "bytes": self._live * (self.limits.window // 8),
        }

    # ------------------------------------------------------------------ checkpoint
    def dump(self) -> Dict[str, Any]:
        """A JSON-safe copy (for the restart checkpoint): runs oldest used first."""
        return {
            "window": self.limits.window,
            "runs": [
                [p, r.top, base64.b64encode(r.ring).decode("ascii") if r.ring is not None else None]
                for p, r in self._runs.items()
            ],
            "others": list(self._others),
            "forgotten": self.forgotten,
        }

    def load(self, data: Any) -> None:
        """Replace the content with a :meth:`dump` (made with the same ``window``).

        Raises:
            SavedStateError: ``data`` is not such a dump.
        """
        try:
            if data["window"] != self.limits.window:
                raise SavedStateError(f"window {data['window']} is not {self.limits.window}")
            runs: OrderedDict[str, _Run] = OrderedDict()
            for prefix, top, ring in data["runs"]:
                raw = bytearray(base64.b64decode(ring, validate=True)) if ring is not None else None
                if (raw is not None and len(raw) != self.limits.window // 8) or not isinstance(top, int):
                    raise SavedStateError(f"bad run {prefix!r}")
                runs[str(prefix)] = _Run(top, raw)
            others = OrderedDict((str(i), None) for i in data["others"])
            forgotten = int(data["forgotten"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SavedStateError(f"not a de-duplication dump: {exc}") from exc
        self._runs, self._others, self.forgotten = runs, others, forgotten
        self._last = ""
        live = sum(r.ring is not None for r in runs.values())
        for run in runs.values():  # within smaller limits than the dump's: oldest first
            if live <= self.limits.runs:
                break
            live -= run.ring is not None
            run.ring = None
        while len(runs) > self.limits.prefixes:
            runs.popitem(last=False)
            self.forgotten += 1
        self._live = sum(r.ring is not None for r in runs.values())


def _clear(ring: bytearray, start: int, stop: int) -> None:
    """Clear bits ``start`` to ``stop - 1`` of ``ring``."""
    while start < stop and start & 7:
        ring[start >> 3] &= ~(1 << (start & 7)) & 0xFF
        start += 1
    while stop > start and stop & 7:
        stop -= 1
        ring[stop >> 3] &= ~(1 << (stop & 7)) & 0xFF
    if start < stop:
        ring[start >> 3 : stop >> 3] = bytes((stop - start) >> 3)
