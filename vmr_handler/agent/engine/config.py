"""How and where the engine works (:class:`EngineConfig`), given to
:class:`vmr_handler.agent.engine.engine.Engine`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Mapping, Optional

from vmr_handler.agent.state.reporthold import HoldLimits

DEFAULT_REBOOT_COMMAND = "systemctl reboot || reboot"


@dataclass
class EngineConfig:
    """Where and how the engine works.

    Attributes:
        launch_dir: root of the per-entry working dirs (reference ``/var/launch``).
        state_dir: journal and control socket directory.
        resources_dir: where ``filename`` drops are read from.
        start_buffer: seconds between *configured* and the experiment start (local mode).
        local_start: see below.
        reboot_command: shell command run when a negative stage requests a reboot.
        env: environment for entries (None = the agent's own).
        shell: the shell that runs command lines (None = bash when the machine has it, else
            ``/bin/sh``; SPEC section 5).
        report_hold: how many reports a failing sink may leave held in memory before entries
            wait (:class:`~vmr_handler.agent.state.reporthold.HoldLimits`).
    """

    launch_dir: str = "/var/launch"
    state_dir: str = "/var/lib/vmr-handler"
    resources_dir: str = "."
    start_buffer: float = 60.0
    reboot_command: str = DEFAULT_REBOOT_COMMAND
    env: Optional[Dict[str, str]] = None
    shell: Optional[str] = None
    #: True: start = configured + start_buffer (local mode). False: wait for the host's
    #: experiment start time (:meth:`Engine.set_start_time`).
    local_start: bool = True
    report_hold: HoldLimits = field(default_factory=HoldLimits)
    #: True (the connected agent): the engine stays after its schedule completes, for batches
    #: appended later (:meth:`Engine.append`), until it is stopped.
    stay: bool = False
    #: Seconds a program entry without a ``timeout`` of its own may run before its tree is
    #: ended (``ended_by: timeout``); None: no bound (``--default-timeout``).
    default_timeout: Optional[float] = None
    #: ``ask(index, scheduled)``: has the host run an on_host entry (the connected agent's
    #: :class:`~vmr_handler.agent.engine.hostcalls.LinkAsker`); None: on_host entries are reported
    #: skipped (local mode).
    host_ask: Optional[Callable[[int, Optional[float]], Awaitable[Mapping[str, Any]]]] = None
