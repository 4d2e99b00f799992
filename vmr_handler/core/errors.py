"""The project's whole error tree. Library errors are translated at the boundary (``raise ... from``).

Every exception vmr-handler raises on purpose derives from :class:`VmrError`; the modules that
raise one re-export its name (``vmr_handler.host.logs.store.TransferRefused`` is this module's class)::

    VmrError
     +-- UsageError               bad command-line input (exit code 2)
     +-- InvalidArgument          a function called with a value outside its contract (also a ValueError)
     +-- InternalError            an invariant of vmr-handler itself is broken (also a RuntimeError)
     +-- OsCallFailed             an OS call or tool failed without an error of its own (also an OSError)
     +-- SavedStateError          a file the host saved cannot be read back (also a ValueError)
     +-- RequestRefused           a control or console request that cannot be honoured (also a ValueError)
     +-- ScheduleError            a schedule cannot be used (exit code 2 from the CLI)
     |    +-- ScheduleFormatError    bytes are not a pickle/YAML/JSON list of entries
     |    +-- UnsafePickleError      the pickle names a global outside the allow-list
     |    +-- ScheduleValidationError  entries break SPEC section 3/4 rules (all problems listed)
     |    +-- WindowsScheduleError     entries written for a Windows guest (no Windows agent exists)
     +-- EntryError               one entry cannot be prepared or started (data drop, exec path)
     +-- JournalError             the on-disk journal cannot be read or written
     +-- ControlError             the local control socket cannot be reached
     +-- SigningError             an Ed25519 key or the replay memory cannot be used (signing.py)
     |    +-- SignatureError         a control message is refused: unsigned, bad signature, stale...
     +-- ProtocolError            a frame or message breaks the protocol (never fatal to a peer)
     +-- PayloadError             an event's ``data`` is malformed for its type (payloads.py)
     +-- ChannelClosed            a transport's connection is gone for good; reconnect to go on
     +-- ConnectFailed            a connection attempt failed for now; retried (also an OSError)
     +-- LinkLost                 a VM link closed before queued bytes were written (also a ConnectionError)
     +-- MqttError                a broker URL, name or credential that cannot be used
     +-- FetchRefused             an HTTP resource fetch refused for good (4xx, wrong file)
     +-- FetchCancelled           the agent stops while an HTTP fetch runs
     +-- HostSetupError           ``vmr-host serve`` cannot start (exit code 2 or 1)
     +-- BarrierError             an operator request the barrier cannot honour (also a ValueError)
     +-- VmNotConnected           a request for a VM's agent, which is not connected now (also a ValueError)
     +-- EntryNotRunning          a kill of an entry that is not running (also a ValueError)
     +-- ResourceRefused          a VM-resource request the host will not serve
     |    +-- ResourceMissing        no such file in the resource directory (HTTP 404)
     |    +-- RangeNotSatisfiable    a byte range that starts past the end of the file (HTTP 416)
     +-- ResourcesMissing         a batch names VM resources the host does not have (also a ValueError)
     +-- BatchError               a batch file to append cannot be used (also a ValueError)
     +-- AppendRefused            a batch cannot be appended to a VM's running schedule (the agent)
     +-- TransferRefused          a file transfer the host will not store
     |    +-- TransferTooLarge       over the per-file or per-VM limit (HTTP 413)
     |    +-- TransferConflict       does not continue what the host holds (HTTP 409)
     |    +-- TransferMismatch       the bytes do not have the announced sha256 (HTTP 422)
     +-- NoLogs                   a logs directory holds no ``<vm>.jsonl`` (``vmr-host report``)
     +-- ExportError              a FIREWHEEL experiment cannot be exported (``vmr_handler.firewheel``)
"""

from __future__ import annotations

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    from typing import Sequence, Tuple


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


class WindowsScheduleError(ScheduleError):
    """A schedule written for a Windows guest (PowerShell, ``move``, ``.ps1``/``.bat``/``.exe``
    programs, drive-letter paths): vmr-handler has no Windows agent, so it is refused at load
    (:mod:`vmr_handler.core.schedule.guestos`).

    Attributes:
        entries: ``(entry index, executable, why)`` of every Windows entry found.
    """

    def __init__(self, message: str, entries: Sequence[Tuple[int, str, str]]) -> None:
        super().__init__(message)
        self.entries = list(entries)


class EntryError(VmrError):
    """A schedule entry cannot be prepared or started (data drop failed, executable not found)."""


class JournalError(VmrError):
    """The journal in the state directory cannot be read or written."""


class ControlError(VmrError):
    """The running agent's local control socket cannot be reached or answered badly."""


class SigningError(VmrError):
    """An Ed25519 key file or the replay memory cannot be used (``vmr_handler/core/wire/signing.py``);
    the message names the file and what is wrong."""


class SignatureError(SigningError):
    """A control message is refused by :class:`vmr_handler.core.wire.signing.Verifier` (SPEC section 7).

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


class UsageError(VmrError):
    """Bad command-line input (exit code 2); the message names the option and what is wrong."""


class InvalidArgument(VmrError, ValueError):
    """A function was called with a value outside its contract (a caller's bug, not user input);
    the message names the parameter and the value.

    Also a ``ValueError``, what Python code expects of a bad argument.
    """


class InternalError(VmrError, RuntimeError):
    """An invariant of vmr-handler itself is broken (a packaged file is wrong, a call came out of
    order); never the user's doing.

    Also a ``RuntimeError``.
    """


class OsCallFailed(VmrError, OSError):
    """An operating-system call or tool failed where the OS raised nothing itself (a short write,
    ``prctl``, missing disk counters, ``mosquitto_passwd``, a path that is not a device).

    Also an ``OSError`` (with ``errno`` when one applies), so callers handle it like the OS's own.
    """


class SavedStateError(VmrError, ValueError):
    """A file the host saved (a checkpoint, ``experiment.json``, the append records, a
    de-duplication dump) cannot be read back; the message names the file or the part.

    Also a ``ValueError``, as the JSON errors it is raised alongside.
    """


class RequestRefused(VmrError, ValueError):
    """A request of the local control socket or the console that cannot be honoured (a
    malformed request, an unknown VM, a RESUME for VMs not at a break); the message says why.

    Also a ``ValueError``, so that the control socket answers it as a refused request.
    """


class ProtocolError(VmrError):
    """A frame or message breaks the protocol; ``details`` says how (never fatal to a peer)."""


class PayloadError(VmrError):
    """An event's ``data`` is malformed for its type (:mod:`vmr_handler.core.payloads`); the
    consumer counts the event and drops it.

    Attributes:
        event_type: the event's ``type``.
        field: the field (``data`` for the whole object, ``journal.digest`` for a nested one).
        problem: what is wrong, e.g. ``"must be a string, got int"``.
    """

    def __init__(self, event_type: str, field: str, problem: str) -> None:
        super().__init__(f"malformed {event_type} event: {field!r} {problem}")
        self.event_type = event_type
        self.field = field
        self.problem = problem


class ChannelClosed(VmrError):
    """The channel is gone for good (a unix socket peer closed); reconnect to go on."""


class ConnectFailed(VmrError, OSError):
    """A connection attempt failed for now (no answer from the broker, the connection lost
    right after it was made); the caller retries it like any failed connect.

    Also an ``OSError``, what a failed connect raises.
    """


class LinkLost(VmrError, ConnectionResetError):
    """The host's link to a VM closed before the bytes queued on it were written.

    Also a ``ConnectionResetError``, so it is handled as any lost connection.
    """


class MqttError(VmrError):
    """A broker URL, name or credential that cannot be used, or a connection refused for good."""


class FetchRefused(VmrError):
    """The HTTP resource server refused for good (401, 403, 404, other 4xx) or the file is wrong."""


class FetchCancelled(VmrError):
    """The agent is stopping (the fetch's ``cancel`` was set)."""


class HostSetupError(VmrError):
    """``vmr-host serve`` cannot start; ``exit_code`` is 2 for bad input, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class BarrierError(VmrError, ValueError):
    """An operator request the barrier cannot honour (unknown VM, start already set).

    Also a ``ValueError``, so that the control socket answers it as a refused request.
    """


class VmNotConnected(VmrError, ValueError):
    """A request that must reach a VM's agent now (``vmr-host kill``) while the agent is not
    connected (lost, or not heard from since the host started); the message names the VM, how
    long it has been gone and what to do. Nothing is sent.

    Also a ``ValueError``, so that the control socket answers it as a refused request.
    """


class EntryNotRunning(VmrError, ValueError):
    """``vmr-host kill`` of an entry that is not running on a VM: it has not started, or it
    ended (how, when the host knows). Nothing is sent.

    Also a ``ValueError``, so that the control socket answers it as a refused request.
    """


class ResourceRefused(VmrError):
    """A resource request the host will not serve; the message says why (sent to the agent)."""


class ResourceMissing(ResourceRefused):
    """The name is acceptable but no such file is in the resource directory (HTTP 404)."""


class RangeNotSatisfiable(ResourceRefused):
    """A single byte range that starts at or past the end of the file (HTTP 416)."""


class ResourcesMissing(VmrError, ValueError):
    """An appended batch names VM resources the host does not have (SPEC section 8); nothing is
    appended. The message lists every such file with the VMs and entries that need it.

    Also a ``ValueError``, so that the control socket answers it as a refused request.
    """


class BatchError(VmrError, ValueError):
    """A batch file to append (``vmr-host schedule add``) cannot be used: unreadable, too big, or
    not a valid schedule; the message names the file. Nothing is appended.

    Also a ``ValueError``, so that the control socket answers it as a refused request.
    """


class TransferRefused(VmrError):
    """A transfer the host will not store (path escape, size limit); the message says why."""


class TransferTooLarge(TransferRefused):
    """Over the per-file or the per-VM limit (HTTP 413)."""


class TransferConflict(TransferRefused):
    """An upload that does not continue what the host holds (HTTP 409).

    Attributes:
        have: bytes of this content the host holds (the offset to resume from).
    """

    def __init__(self, text: str, have: int) -> None:
        super().__init__(text)
        self.have = have


class TransferMismatch(TransferRefused):
    """The uploaded bytes do not have the announced sha256 (HTTP 422); they were deleted."""


class NoLogs(VmrError):
    """The logs directory holds no ``<vm>.jsonl``."""


class AppendRefused(VmrError):
    """A batch of entries cannot be appended to this VM's running schedule: the VM
    failed, the agent is stopping, or the batch is not a valid schedule."""


class ExportError(VmrError):
    """A FIREWHEEL experiment cannot be exported for ``vmr-host`` (``vmr_handler.firewheel``):
    a VM name or socket path vmr-host cannot use, a schedule it would refuse, VM resources
    that no installed model component ships. The message names each one and what to do."""
