"""``vmr-host mqtt-config``: a mosquitto configuration for one experiment (``docs/mqtt.md``).

General layout::

    command  the command: the files written, owners and modes
    layout   what it generates: paths, names, its arguments
    _files   the broker's files as text; _tls: the certificates of ``--tls``
    bridges  two brokers bridged: the bridge user's ACL and credentials, the bridge section

May import: ``host.serve`` (specs), ``transports`` (mqtt topics), ``core``.
"""
