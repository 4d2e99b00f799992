"""``vmr-host serve``: one asyncio event loop serving every VM's channel.

General layout (import rule: ``server > channels | control_api | http > experiment > session
> files > config : specs : _fdlimit``)::

    server       HostServer: opens logs, control socket and channels; runs the experiment
    config       HostConfig, Limits; specs: the ``--schedules`` directory
    control_api  the control socket's commands (a table from command to handler)
    _fdlimit     the open-files limit, raised before anything is opened
    experiment/  the barrier, start time, RESUMEs, appended batches, on_host entries
    session/     one VM's side of the protocol
    channels/    how the VMs' channels reach their sessions (unix sockets, MQTT)
    http/        VM-resource files and transfers over HTTP(S)
    files/       resources in, transfers out: confined, hashed

May import: ``host.model``, ``host.logs``, ``host.control``, ``transports``, ``core``. What
runs alongside (the console of ``--console``) is handed to ``server`` by the command
(``host.cli.serve``) as a ``Companion``.
"""
