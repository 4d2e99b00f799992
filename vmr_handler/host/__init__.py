"""``vmr-host``: the host controller. One process serves every VM of an experiment on one
asyncio event loop; the other commands read its logs or talk to its control socket.

General layout (import rule: ``cli > console > report | serve > model > logs | control``)::

    cli/        vmr-host's commands: vmr_host (the console script and its command table),
                serve, check, control_client, options, statustext, logs, schedule/ (show,
                add), live/ (push, pull, exec), mqtt_config/, _offline, _waiting, _keygen
    console/    the operators' console of ``serve --console`` (web page, REST, metrics)
    report/     the experiment timeline as one HTML file (``vmr-host report``)
    serve/      the ``vmr-host serve`` process: server, config, specs, control_api,
                experiment/, session/, channels/, http/, files/
    model/      what the host knows of the experiment (vmstate)
    logs/       what the host keeps on disk and reads back: store, seenids, jsonlread,
                appendfiles, text, writespell
    control/    the control commands, each declared once (commands): the socket, the CLI,
                the console's REST routes and OpenAPI document are derived from them
    __main__    ``python -m vmr_handler.host`` is ``vmr-host``

May import: ``core`` and ``transports``; never ``agent``. The wire protocol is
``docs/protocol.md``; the operator guide is ``docs/host.md``.
"""
