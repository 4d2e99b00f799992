"""``vmr-host``'s commands: parsing, printing, talking to the running host; no serving.

General layout::

    vmr_host        the ``vmr-host`` console script: its one command table (help, completion,
                    dispatch), each command's module imported only when it runs
    serve           ``vmr-host serve``: its arguments and the HostConfig they make
    check           ``vmr-host check DIR``
    control_client  ``status|resume|release``: the lean commands (no logging, no host config)
    options         ``--logs`` and its default, for every command
    statustext      the human form of ``status``; _offline: status rebuilt from the logs
    _waiting        ``wait`` and ``status --watch``
    logs            ``vmr-host logs`` (and ``report``'s arguments)
    schedule/       ``vmr-host schedule show|add``
    live/           ``vmr-host push|pull|exec``
    mqtt_config/    ``vmr-host mqtt-config``
    _keygen         ``vmr-host keygen``

May import: ``host.console``, ``host.report``, ``host.serve``, ``host.model``, ``host.logs``,
``transports``, ``core``. Nothing under ``host`` but ``cli`` imports it (two names
``serve.server`` takes from here are to move).
"""
