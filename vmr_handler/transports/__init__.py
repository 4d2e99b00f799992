"""Transports: one byte-channel contract, one module per way of carrying it.

General layout::

    base           the contract: ByteChannel (read, write, write_ephemeral, close), Opener
    memory         an in-memory pair (tests of everything above)
    stream         unix stream sockets (``--port unix:PATH``)
    virtio_serial  a virtio-serial port, or a pty standing in
    mqtt/          the MQTT broker: topics, options, bridge, guest (agent), host (one VM's channel)
    local          local mode's report file (JSON lines) and readable log

May import: ``core``; nothing of ``agent`` or ``host``.
"""
