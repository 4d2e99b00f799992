"""The one state word of a VM, and what a failed entry is: every view reads them from here.

``vmr-host status`` (text and ``--json``), ``wait``, the hints, the console's rows, pills, sort
and counts, the REST API (``?problems=1`` too), the ``/metrics`` state gauges and ``status``
rebuilt from the logs all call :func:`state_word` with the VM's folded reports
(:class:`~vmr_handler.host.model.vmstate.VmState`, read as :class:`Reported`) and its
:class:`Presence`, and sort and
count by :data:`STATES`, so no two views disagree (SPEC section 8, "One truth").

The words, problems first (:data:`STATES`):

- ``failed`` (the VM reported ``vm_failed``), ``schedule_rejected``;
- ``lost``: the agent was heard from once and is gone (its connection ended, or it is
  connected and silent) for :data:`LOST_AFTER` seconds or more (``serve --lost-after``) while
  the VM is neither complete nor failed; it is a word of its own until the agent talks again;
- ``seen`` (heard from, not connected now, no schedule accepted yet);
- ``at_break``, ``paused`` (also after the VM had completed: a batch appended later holds it);
- ``running`` (configured and the experiment started), ``configured``, ``configuring`` (in a
  stage before the start), ``schedule_accepted``, ``schedule_sent``, ``connected``, ``not_seen``;
- ``complete``.

Imports nothing but ``typing`` (the lean ``vmr-host status`` reads it).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, NamedTuple, Optional, Protocol, Tuple

#: Every state word, problems first: the order of every count and sort.
STATES = (
    "failed", "schedule_rejected", "lost", "seen", "at_break", "paused", "running", "configured",
    "configuring", "schedule_accepted", "schedule_sent", "connected", "not_seen", "complete",
)  # fmt: skip
#: The words that end a VM's run for ``wait`` and make ``vmr-host status`` exit 1, with ``lost``.
FAILED_STATES = frozenset({"failed", "schedule_rejected"})
#: The words of a VM whose part of the experiment is over (it plays nothing more unless a batch
#: is appended): the experiment is finished when every VM that counts has one (:func:`finished`).
ENDED_STATES = FAILED_STATES | {"complete"}
#: The words that are problems by themselves (a VM with a failed entry is one too: :func:`is_problem`).
PROBLEM_STATES = frozenset({"failed", "schedule_rejected", "lost", "seen"})
#: The words of a VM that has not started its part of the experiment yet (``--state waiting``).
WAITING_STATES = frozenset(
    {"not_seen", "seen", "connected", "schedule_sent", "schedule_accepted", "configuring", "configured"}
)
#: Seconds an agent may be gone (disconnected, or connected and silent) before its VM is ``lost``
#: (``vmr-host serve --lost-after``).
LOST_AFTER = 30.0
#: The status of an entry run that makes it *a failed entry* (docs/host.md, "Terms"): ``error``
#: (it exited non-zero, as the agent said) and ``failed`` (it could not run: a drop or a start
#: that failed). A ``vm_failed`` that follows is *the VM failed*, not one more failed entry.
FAILED_RUNS = frozenset({"error", "failed"})


class Reported(Protocol):
    """What the word reads of a VM's folded reports (a
    :class:`~vmr_handler.host.model.vmstate.VmState`)."""

    failed: Optional[str]
    schedule_state: str
    at_break: Optional[Dict[str, Any]]
    paused: Optional[Dict[str, Any]]
    complete: bool
    configured_at: Optional[float]
    stage: Optional[int]


class Presence(NamedTuple):
    """Where a VM's agent is, as the host's clock sees it.

    Attributes:
        connected: a connection to the VM's channel is up now.
        ever: the agent was heard from once (this host run, or an earlier one the logs tell).
        gone_for: seconds the agent has been gone, on the host's clock: since its connection
            ended (or this host started, for an agent heard from before it), or, connected,
            since its last frame once it is *silent* (``silent_after``); None while it talks,
            and when nobody can tell (``status`` rebuilt from the logs).
        lost_after: seconds gone from which the VM is ``lost`` (:data:`LOST_AFTER`).
    """

    connected: bool
    ever: bool
    gone_for: Optional[float] = None
    lost_after: float = LOST_AFTER

    @property
    def lost(self) -> bool:
        """The agent was heard from and is gone for :attr:`lost_after` seconds or more."""
        return self.ever and self.gone_for is not None and self.gone_for >= self.lost_after


def reported_word(state: Reported, start_time: Optional[float], now: float, presence: Presence) -> str:
    """The word the VM's reports and connection give, before liveness (:func:`state_word`)."""
    if state.failed:
        return "failed"
    if state.schedule_state == "rejected":
        return "schedule_rejected"
    if state.at_break is not None:
        return "at_break"
    if state.paused is not None:
        return "paused"
    if state.complete:
        return "complete"
    if state.configured_at is not None:
        return "running" if start_time is not None and now >= start_time else "configured"
    if state.stage is not None:
        return "configuring"
    if state.schedule_state in ("sent", "accepted"):
        return f"schedule_{state.schedule_state}"
    if presence.ever:
        return "connected" if presence.connected else "seen"
    return "not_seen"


def state_word(state: Reported, start_time: Optional[float], now: float, presence: Presence) -> str:
    """The VM's one state word (:data:`STATES`) at host UTC ``now``, the experiment starting at
    UTC ``start_time`` (None before it is set): ``lost`` when :attr:`Presence.lost` and the VM
    is neither complete nor failed, else :func:`reported_word`."""
    word = reported_word(state, start_time, now, presence)
    if presence.lost and word not in FAILED_STATES and word != "complete":
        return "lost"
    return word


def spoken(word: str) -> str:
    """A state word as people read it: ``at_break`` -> ``at break``."""
    return word.replace("_", " ")


def is_problem(word: str, failed_entries: int) -> bool:
    """Whether a VM is a problem (sorted first, counted in ``problems``, ``?problems=1``): its
    word is one of :data:`PROBLEM_STATES`, or one of its entries failed."""
    return word in PROBLEM_STATES or failed_entries > 0


def finished(words: Iterable[Tuple[str, bool]]) -> bool:
    """Whether the experiment is over: every VM's word (``(word, counts)`` pairs; ``counts``:
    the barrier waits or waited for it) is one of :data:`ENDED_STATES`, a ``not_seen`` VM that
    does not count left out; False with no VM that ended."""
    ended = False
    for word, counts in words:
        if word in ENDED_STATES:
            ended = True
        elif counts or word != "not_seen":
            return False
    return ended
