"""The project's error tree. Library errors are translated at the boundary (``raise ... from``).

::

    VmrError
     +-- ScheduleError            a schedule cannot be used (exit code 2 from the CLI)
     |    +-- ScheduleFormatError    bytes are not a pickle/YAML/JSON list of entries
     |    +-- UnsafePickleError      the pickle names a global outside the allow-list
     |    +-- ScheduleValidationError  entries break SPEC section 3/4 rules (all problems listed)
     +-- EntryError               one entry cannot be prepared or started (data drop, exec path)
     +-- JournalError             the on-disk journal cannot be read or written
     +-- ControlError             the local control socket cannot be reached
     +-- SigningError             an Ed25519 key or the replay memory cannot be used (signing.py)
          +-- SignatureError         a control message is refused: unsigned, bad signature, stale...
"""

from __future__ import annotations

from typing import Sequence


class VmrError(Exception):
    """Base class of every error vmr-handler raises on purpose."""


class ScheduleError(VmrError):
    """A schedule cannot be loaded or used."""


class ScheduleFormatError(ScheduleError):
    """The schedule bytes are not a readable pickle, YAML or JSON list of schedule entries."""


class UnsafePickleError(ScheduleError):
    """A pickle names a callable or class outside the allow-list (SPEC section 7).

    Raised from ``find_class`` *before* the named object is ever called.

    Attributes:
        global_name: the ``module.name`` the pickle asked for.
    """

    def __init__(self, global_name: str) -> None:
        super().__init__(
            f"refused to unpickle {global_name!r}: only schedule-entry classes and plain builtins "
            "are allowed (allow-list more schedule-entry class names with --allow-class)"
        )
        self.global_name = global_name


class ScheduleValidationError(ScheduleError):
    """One or more schedule entries break the rules of SPEC section 3/4.

    Attributes:
        problems: every problem found, each naming the entry (index, executable) and field.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            f"{len(self.problems)} problem(s) in schedule:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )


class EntryError(VmrError):
    """A schedule entry cannot be prepared or started (data drop failed, executable not found)."""


class JournalError(VmrError):
    """The journal in the state directory cannot be read or written."""


class ControlError(VmrError):
    """The running agent's local control socket cannot be reached or answered badly."""


class SigningError(VmrError):
    """An Ed25519 key file or the replay memory cannot be used (``vmr_handler/signing.py``);
    the message names the file and what is wrong."""


class SignatureError(SigningError):
    """A control message is refused by :class:`vmr_handler.signing.Verifier` (SPEC section 7).

    Attributes:
        event_type: the refused event's ``type``.
        event_id: the refused event's ``id``.
        reason: what is wrong, e.g. ``"unsigned"``, ``"bad signature"``,
            ``"stale: signed 412.0 s ago (limit 300 s)"``.
    """

    def __init__(self, event_type: str, event_id: str, reason: str) -> None:
        super().__init__(f"refused {event_type} event {event_id!r}: {reason}")
        self.event_type = event_type
        self.event_id = event_id
        self.reason = reason
