"""The open-files limit ``vmr-host serve`` needs, raised by the host itself.

What holds descriptors, per VM: its ``<vm>.jsonl``, open for the whole run (the readable
``<vm>.log`` files of all VMs share :data:`~vmr_handler.host.logs.appendfiles.READABLE_OPEN` open
files, counted in :data:`BASE`), plus its channel: listen mode a listening unix socket
and the connection (2), connect mode the connection (1), MQTT none (every VM shares the one
broker socket; the *broker* holds a socket per VM and has its own limit). Passing: a resource
file being streamed, an uploaded file being written (counted as one more per VM). Whole
process: stdio, the lock file, the event loop, the control socket and its clients, the broker
socket, atomic writes, worker threads (:data:`BASE`), and with ``--http`` its connections.

:func:`ensure_fd_limit` raises the soft ``RLIMIT_NOFILE`` to what is *wanted* (steady +
passing), up to the hard limit; when the hard limit is below what is *required* (steady
state) it tries to raise the hard limit too (works with ``CAP_SYS_RESOURCE``, e.g. as root)
and otherwise refuses to start with :class:`~vmr_handler.core.errors.HostSetupError` naming
the limit, the number needed and how to raise it, instead of failing later with ``EMFILE``.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from typing import Optional, Tuple

from vmr_handler.core.errors import HostSetupError, InvalidArgument
from vmr_handler.host.logs.appendfiles import READABLE_OPEN

log = logging.getLogger("vmr_handler.host")

#: Descriptors of the whole process, whatever the number of VMs (with the readable logs').
BASE = 64 + READABLE_OPEN
#: Channel descriptors per VM, by channel mode (``host.channels.channel_mode``).
CHANNEL_FDS = {"listen": 2, "connect": 1, "mqtt": 0}
#: Log files per VM, open for the whole run.
LOG_FDS = 1
#: Passing descriptors per VM (a resource file streamed, an upload being written).
PASSING_FDS = 1

__all__ = ["BASE", "FdNeeds", "ensure_fd_limit", "fd_needs", "readable_pool"]


@dataclass(frozen=True)
class FdNeeds:
    """Descriptors ``vmr-host serve`` needs: ``required`` for the steady state (below it, it
    cannot open every VM's logs and channel), ``wanted`` with room for passing files;
    ``why`` in words for messages."""

    required: int
    wanted: int
    why: str


def fd_needs(vms: int, mode: str, http_per_vm: int = 0) -> FdNeeds:
    """What ``vms`` VMs in channel ``mode`` (``listen``, ``connect``, ``mqtt``) need, with
    ``http_per_vm`` concurrent connections per VM to the HTTP resource server (0 without it;
    passing, so counted in ``wanted`` only).

    Raises:
        InvalidArgument: an unknown ``mode`` or a negative count.
    """
    if mode not in CHANNEL_FDS:
        raise InvalidArgument(f"unknown channel mode {mode!r} (expected one of {sorted(CHANNEL_FDS)})")
    if vms < 0 or http_per_vm < 0:
        raise InvalidArgument(f"counts must be >= 0, got vms={vms}, http_per_vm={http_per_vm}")
    required = BASE + (LOG_FDS + CHANNEL_FDS[mode]) * vms
    channel = {"listen": " + socket and connection", "connect": " + connection", "mqtt": ""}[mode]
    why = f"{vms} VMs over {mode}: its .jsonl{channel} per VM + {BASE}"
    # wanted: room for a passing file per VM and for every VM's readable log to stay open
    return FdNeeds(required, required + (PASSING_FDS + http_per_vm + 1) * vms, why)


def readable_pool(soft: int, needs: FdNeeds, vms: int) -> int:
    """How many readable logs to keep open under the soft limit ``soft`` (``-1``: unlimited):
    one per VM when the limit leaves room for them (no re-opening), else what it leaves, at
    least :data:`~vmr_handler.host.logs.appendfiles.READABLE_OPEN` (counted in ``required``)."""
    if soft == resource.RLIM_INFINITY:
        return max(vms, 1)
    room = soft - (needs.wanted - vms)  # what is left beside everything else wanted
    return max(READABLE_OPEN, min(vms, room))


def ensure_fd_limit(needs: FdNeeds) -> Tuple[int, int]:
    """Raise this process's ``RLIMIT_NOFILE`` for ``needs``; returns the (soft, hard) limit
    in force after it (``resource.RLIM_INFINITY`` is -1).

    Raises:
        HostSetupError: (exit 1) the soft limit cannot reach ``needs.required``; the message
            names the limit, the number needed and what to do (``ulimit -n``, systemd
            ``LimitNOFILE=``).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if _covers(soft, needs.wanted):
        return soft, hard
    target = needs.wanted if _covers(hard, needs.wanted) else hard
    if not _covers(hard, needs.required):  # try the hard limit too (privileged processes may)
        error = _set(resource.RLIMIT_NOFILE, needs.wanted, needs.wanted)
        if error is None:
            log.info("open-files limit raised to %d (soft and hard) for %s", needs.wanted, needs.why)
            return needs.wanted, needs.wanted
        raise HostSetupError(
            f"the open-files limit is too low: vmr-host needs about {needs.required} file descriptors "
            f"({needs.why}) but RLIMIT_NOFILE is soft {_text(soft)} / hard {_text(hard)}, and raising "
            f"the hard limit was refused ({error}). Start vmr-host with a higher limit: "
            f"`ulimit -n {needs.wanted}` in its shell (raising the hard limit needs root, "
            f"CAP_SYS_RESOURCE), `LimitNOFILE={needs.wanted}` in its systemd unit, or a nofile "
            "line in /etc/security/limits.conf; or serve fewer VMs per host"
        )
    error = _set(resource.RLIMIT_NOFILE, target, hard)
    if error is not None:  # cannot happen below the hard limit; say it and go on if it is enough
        if not _covers(soft, needs.required):
            raise HostSetupError(
                f"the open-files limit is too low: vmr-host needs about {needs.required} file "
                f"descriptors ({needs.why}) but RLIMIT_NOFILE is soft {_text(soft)}, and raising it "
                f"to {target} failed ({error}). Start it with `ulimit -n {needs.wanted}` or "
                f"`LimitNOFILE={needs.wanted}` in its systemd unit"
            )
        log.warning("cannot raise the open-files limit to %d: %s", target, error)
        return soft, hard
    if target < needs.wanted:
        log.warning(
            "open-files limit raised to its hard limit %d: enough for %s (%d), short of the %d "
            "that leave room for a resource download or upload per VM at once and every VM's "
            "readable log open (they share fewer open files, re-opened in turn)",
            target,
            needs.why,
            needs.required,
            needs.wanted,
        )
    return target, hard


def _covers(limit: int, n: int) -> bool:
    return limit == resource.RLIM_INFINITY or limit >= n


def _set(which: int, soft: int, hard: int) -> Optional[str]:
    """Set a limit; the error in words, or None."""
    try:
        resource.setrlimit(which, (soft, hard))
    except (ValueError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _text(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
