"""MQTT transport: the same protocol as virtio-serial, carried by a broker (issue 6, SPEC §6).

Topic tree (``docs/mqtt.md``), experiment ``E``, VM ``V`` (the VM's broker username):

========================  =============  ======================================================
topic                     written by     what
========================  =============  ======================================================
``vmr/E/V/up``            agent          protocol frames agent -> host (QoS 1)
``vmr/E/V/down``          host           protocol frames host -> agent (QoS 1)
``vmr/E/V/presence``      agent          retained ``{"state": "online"|"offline", ...}``;
                                         ``offline`` is the agent's last will
``vmr/E/V/start``         host           retained ``start_time`` frame: a late or rebooted VM
                                         learns the experiment start at once
``vmr/E/_hosts/...``      hosts          host-to-host coordination (never VMs)
========================  =============  ======================================================

Payloads are the newline-framed JSON messages of ``docs/protocol.md`` (one or more whole
frames per MQTT message), so the session layers of both sides are the same code for both
transports. Every client uses MQTT v5 with ``clean_start=False`` and a session expiry, so
QoS 1 messages published while one side is away are delivered when it comes back.

The package holds what the agent and ``vmr-host`` share: ``options`` (broker URL, names,
topic tree, client options), ``bridge`` (a paho client bridged into asyncio), and the agent's
``guest`` :class:`MqttChannel`. paho-mqtt 2.x does the
MQTT protocol work, keep-alives and the network thread; nothing MQTT is written by hand.
"""

from vmr_handler.core.errors import MqttError
from vmr_handler.transports.mqtt.bridge import MAX_INFLIGHT, SESSION_EXPIRY, PahoBridge
from vmr_handler.transports.mqtt.guest import MqttChannel, presence_payload
from vmr_handler.transports.mqtt.options import (
    OPTION_KEYS,
    BrokerUrl,
    MqttOptions,
    Topics,
    check_name,
    options_from,
    parse_broker,
    vm_of,
)

__all__ = [
    "MAX_INFLIGHT",
    "OPTION_KEYS",
    "SESSION_EXPIRY",
    "BrokerUrl",
    "MqttChannel",
    "MqttError",
    "MqttOptions",
    "PahoBridge",
    "Topics",
    "check_name",
    "options_from",
    "parse_broker",
    "presence_payload",
    "vm_of",
]
