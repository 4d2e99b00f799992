"""``vmr-host``'s commands: parsing, printing, talking to the running host; no serving.

General layout::

    vmr_host        the ``vmr-host`` console script: the lean path first, then commandline
    commandline     the full argparse front end: every command
    control_client  ``status|resume|release``: the lean path (no argparse, no logging)
    statustext      the human form of ``status``; _offline: status rebuilt from the logs
    _waiting        ``wait`` and ``status --watch``
    logs            ``vmr-host logs``
    schedule/       ``vmr-host schedule show|add``
    live/           ``vmr-host push|pull|exec``
    mqtt_config/    ``vmr-host mqtt-config``
    _keygen         ``vmr-host keygen``

May import: ``host.console``, ``host.report``, ``host.serve``, ``host.model``, ``host.logs``,
``transports``, ``core``. Nothing under ``host`` but ``cli`` imports it (two names
``serve.server`` takes from here are to move).
"""
