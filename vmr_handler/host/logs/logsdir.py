"""The files of a logs directory that others find by name: the host's control socket
(``vmr-host.sock``, for ``status``, ``resume``, ``release`` and the other control commands) and
the index of the schedules it delivers (``schedules.json``, for ``vmr-host schedule show``).

Imports nothing at import time beyond the standard library (the lean command paths read it).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # no ``typing`` on the lean paths (core.commandtable.TYPE_CHECKING)
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Protocol

    class DeliveredSchedule(Protocol):
        """What the index says of one VM's schedule (a ``VmSpec`` of ``host.serve.config``)."""

        @property
        def schedule_path(self) -> str:
            """The schedule file the host read."""

        @property
        def format(self) -> str:
            """``yaml``, ``json`` or ``pickle``."""

        @property
        def digest(self) -> str:
            """The sha256 of its bytes."""


#: Name of the host control socket inside the logs directory.
CONTROL_SOCKET = "vmr-host.sock"
#: Name of the index of the delivered schedules inside the logs directory.
INDEX_FILE = "schedules.json"


def control_socket_path(logs: str) -> str:
    """Path of the host control socket for logs directory ``logs``.

    Raises:
        ControlError: the path is too long for a unix socket.
    """
    from vmr_handler.core.control import checked_socket_path

    return checked_socket_path(os.path.join(logs, CONTROL_SOCKET), "--logs")


def ask_host(logs: str, payload: Dict[str, Any]) -> Dict[str, Any]:
    """Send one control request to the ``vmr-host serve`` running with logs directory ``logs``
    (:func:`vmr_handler.core.control.request_at`) and return its reply.

    Raises:
        ControlError: no host runs with these logs (the message says which directory was
            looked in and how to name another), or it does not answer.
    """
    from vmr_handler.core.control import request_at
    from vmr_handler.core.errors import ControlError

    path = control_socket_path(logs)
    if not os.path.exists(path):
        raise ControlError(
            f"no vmr-host serve runs with the logs directory {os.path.abspath(logs)} (no {CONTROL_SOCKET} "
            "there): give the running host's --logs DIR, or set VMR_LOGS"
        )
    return request_at(path, payload)


def write_index(logs: str, specs: Mapping[str, DeliveredSchedule]) -> None:
    """Write ``<logs>/schedules.json``: VM -> ``{"path", "format", "sha256"}`` of the schedule
    this host delivers (read by ``vmr-host schedule show``).

    Raises:
        OSError: it cannot be written.
    """
    from vmr_handler.host.logs.store import atomic_write_json

    doc = {
        name: {"path": os.path.abspath(s.schedule_path), "format": s.format, "sha256": s.digest}
        for name, s in sorted(specs.items())
    }
    atomic_write_json(os.path.join(logs, INDEX_FILE), doc)
