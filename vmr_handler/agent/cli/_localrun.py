"""Local mode: ``vmr-handler run --local SCHEDULE`` plays a schedule with no host.

:func:`run_local` wires the :class:`~vmr_handler.agent.engine.engine.Engine` to a
:class:`~vmr_handler.transports.local.LocalReporter` (the ``--report`` file and the readable
log on stderr), the control socket (``vmr-handler status``/``resume``), SIGTERM/SIGINT and the
KPI sampler (``--kpi-interval``, :mod:`vmr_handler.agent.machine.kpi`). Moved out of
:mod:`vmr_handler.agent.cli.commandline`, which is the argparse front end only.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TYPE_CHECKING, Optional

from vmr_handler.core.errors import VmrError

if TYPE_CHECKING:
    from vmr_handler.agent.engine.engine import EngineConfig
    from vmr_handler.core.schedule import Schedule


async def run_local(
    schedule: Schedule,
    config: EngineConfig,
    report: Optional[str],
    quiet: bool,
    kpi_interval: float = 0.0,
) -> int:
    """Run ``schedule`` on this machine until it is complete, failed or stopped by a signal.

    Args:
        schedule: the loaded schedule.
        config: the engine's settings (its ``state_dir`` also holds the control socket and is
            the file system whose use the KPI samples report).
        report: the JSON-lines file every event is appended to, or None.
        quiet: no readable log on stderr.
        kpi_interval: seconds between two ``kpi`` samples while the schedule runs; 0 = none.

    Returns:
        the engine's exit code (0 complete, 1 the VM failed).

    Raises:
        VmrError: the report file cannot be opened; UsageError: a bad ``kpi_interval``;
            JournalError: the state directory cannot be used.
    """
    from vmr_handler.agent.cli.control_client import forget_last_run, save_last_run
    from vmr_handler.agent.engine.engine import open_engine
    from vmr_handler.agent.machine.executor import install_child_watcher
    from vmr_handler.agent.machine.kpi import KpiSampler, check_interval
    from vmr_handler.core.control import ControlServer
    from vmr_handler.transports.local import LocalReporter

    check_interval(kpi_interval, "--kpi-interval")
    install_child_watcher()
    try:
        reporter = LocalReporter(report, None if quiet else sys.stderr)
    except OSError as exc:
        raise VmrError(f"cannot open report file {report}: {exc.strerror or exc}") from exc
    try:
        engine = open_engine(schedule, config, reporter)
        control = ControlServer(
            config.state_dir,
            {
                "status": lambda _req: engine.status(),
                "resume": lambda _req: engine.resume(),
            },
        )
        forget_last_run(config.state_dir)
        await control.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, engine.stop, f"signal {signal.Signals(sig).name}")

        # KPI samples are reports like any other, but not worth holding while the report file
        # cannot be written (a full disk): skipped meanwhile
        def reports_held() -> bool:
            return len(engine.reports) > 0

        kpi = KpiSampler(engine.emit, engine.clock, kpi_interval, path=config.state_dir, skip=reports_held)
        kpi.start()
        try:
            code = await engine.run()
            save_last_run(config.state_dir, engine.status(), code)  # status --wait, once it has ended
            return code
        finally:
            await kpi.close()
            await control.close()
    finally:
        reporter.close()
