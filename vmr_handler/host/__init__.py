"""``vmr-host``: the host controller. One process serves every VM of an experiment on one
asyncio event loop; the other commands read its logs or talk to its control socket.

General layout (import rule: ``cli > console > report | serve > model > logs``)::

    cli/        vmr-host's commands: vmr_host (the console script, lean path first),
                commandline, control_client, statustext, logs, schedule/ (show, add),
                live/ (push, pull, exec), mqtt_config/, _offline, _waiting, _keygen
    console/    the operators' console of ``serve --console`` (web page, REST, metrics)
    report/     the experiment timeline as one HTML file (``vmr-host report``)
    serve/      the ``vmr-host serve`` process: server, config, specs, control_api,
                experiment/, session/, channels/, http/, files/
    model/      what the host knows of the experiment (vmstate)
    logs/       what the host keeps on disk and reads back: store, seenids, jsonlread,
                appendfiles, text, writespell
    __main__    ``python -m vmr_handler.host`` is ``vmr-host``

May import: ``core`` and ``transports``; never ``agent``. The wire protocol is
``docs/protocol.md``; the operator guide is ``docs/host.md``.
"""
