"""vmr-handler: the agent that plays one VM's part of an emulation-testbed experiment, and
``vmr-host``, the controller that serves every VM of it.

General layout (``docs/architecture.md``), four layers, each importing only those below it,
and ``firewheel/`` above them on ``core`` alone::

    agent/        the guest agent, ``vmr-handler`` (frozen into one executable)
    host/         the host controller, ``vmr-host``
    transports/   one byte-channel contract, one module per transport
    core/         what both sides share: errors, events, schedules, the timeline, the wire
    firewheel/    a FIREWHEEL model-component repository (``vmr_handler.export``), on core only

``agent`` and ``host`` never import each other: the frozen agent carries no host code.
``__main__``: ``python -m vmr_handler`` is ``vmr-handler``.

May import: nothing of its own (``__version__`` only).
"""

__version__ = "0.1.0"
