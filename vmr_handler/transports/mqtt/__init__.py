"""MQTT transport: the same protocol as virtio-serial, carried by a broker (SPEC §6).

Topic tree (``docs/mqtt.md``), experiment ``E``, VM ``V`` (the VM's broker username):

========================  =============  ======================================================
topic                     written by     what
========================  =============  ======================================================
``vmr/E/V/up``            agent          protocol frames agent -> host (QoS 1)
``vmr/E/V/down``          host           protocol frames host -> agent (QoS 1)
``vmr/E/V/presence``      agent          retained ``{"state": "online"|"offline", ...}``;
                                         ``offline`` is the agent's last will
``vmr/E/V/start``         host           retained ``start_time`` frame, for a VM whose agent
                                         does not read the next topic
``vmr/E/_hosts/H/start``  host ``H``     retained ``start_time`` frame for all of ``H``'s VMs
                                         (read by every VM of ``E``): a late or rebooted VM
                                         learns the experiment start at once (if of its
                                         host's run, ``vmr_handler.core.wire.runs``)
``vmr/E/_hosts/...``      hosts          the rest: host-to-host coordination (never VMs)
========================  =============  ======================================================

Payloads are the newline-framed JSON messages of ``docs/protocol.md`` (one or more whole
frames per MQTT message), so the session layers of both sides are the same code for both
transports. Every client uses MQTT v5 with ``clean_start=False`` and a session expiry, so
QoS 1 messages published while one side is away are delivered when it comes back.

The package holds what the agent and ``vmr-host`` share: ``topics`` (the topic tree, the
only place it is spelled), ``options`` (broker URL, names, client options), ``bridge`` (a paho
client bridged into asyncio), and the agent's ``guest`` :class:`MqttChannel`. paho-mqtt 2.x
does the MQTT protocol work, keep-alives and the network thread; nothing MQTT is written by hand.

The package imports nothing itself: import from its modules (``topics`` is cheap, so
``vmr-host``'s quick commands read the topic tree without loading asyncio or ssl)::

    topics.py   the topic tree: Topics, vm_of, the leaves, the hosts level, wildcards
    options.py  broker URL, names, MqttOptions, options_from (a config mapping)
    bridge.py   PahoBridge: a paho-mqtt client driven by the asyncio loop (both sides)
    guest.py    the agent's MqttChannel and MqttOpener
    host.py     the host's per-VM channel, fed by its one bridge (VmTopicsChannel)

May import: ``transports.base``, ``core``; nothing of ``agent`` or ``host``.
"""
