"""The guest agent, ``vmr-handler``: plays one VM's schedule, alone or under ``vmr-host``.

General layout (import rule: ``cli > connected > engine > state | machine``)::

    cli/        vmr-handler's commands: commandline (argparse front end), control_client
                (the lean status/resume), _planout (plan --json), _localrun (run --local)
    connected/  the agent under vmr-host: agent (ConnectedAgent, run_connected), link
                (HostLink), _stamps, resources, transfers, httpfetch
    engine/     the engine and its parts: engine, shared, config, status, entries, stages, holds,
                arming, appends, placement, hostcalls, ports, _stageplay, _reminders
    state/      what survives a crash or a lost host: journal, outbox, reporthold
    machine/    the machine it runs on: executor, bundle (the frozen run time), kpi

May import: ``core`` and ``transports``; never ``host`` (the frozen agent carries no host code).
"""
