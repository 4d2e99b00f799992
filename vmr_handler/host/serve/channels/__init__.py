"""How the VMs' channels reach their sessions, whatever the transport.

General layout::

    factory       the channels chosen once from the configuration (open_channels)
    links         ChannelLink, SessionReader, serve_channel: any ByteChannel to a session
    streams       unix stream sockets, listen or connect
    mqtt          every VM's session over one broker connection
    mqtt_options  the MQTT flags of ``vmr-host serve``
    _waits        their waits on the host's clock: pacing pauses, the reconnect back-off

May import: ``host.serve.experiment``, ``host.serve.session``, ``host.serve.config``,
``transports``, ``core``.
"""
