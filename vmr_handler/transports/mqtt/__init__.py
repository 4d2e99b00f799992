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

The package holds what the agent and ``vmr-host`` share: ``topics`` (the topic tree, the
only place it is spelled), ``options`` (broker URL, names, client options), ``bridge`` (a paho
client bridged into asyncio), and the agent's ``guest`` :class:`MqttChannel`. paho-mqtt 2.x
does the MQTT protocol work, keep-alives and the network thread; nothing MQTT is written by hand.

Only ``topics`` is imported with the package: ``vmr-host``'s command line reads the topic tree
(``mqtt-config``'s ACL) and must start quickly, so the other modules (asyncio, ssl) are
imported when one of their names is first used (:func:`__getattr__`).
"""

import importlib
from typing import TYPE_CHECKING, Any, Dict

from vmr_handler.core.errors import MqttError
from vmr_handler.transports.mqtt.topics import Topics, vm_of

if TYPE_CHECKING:
    from vmr_handler.transports.mqtt.bridge import MAX_INFLIGHT, SESSION_EXPIRY, PahoBridge
    from vmr_handler.transports.mqtt.guest import MqttChannel, presence_payload
    from vmr_handler.transports.mqtt.options import (
        OPTION_KEYS,
        BrokerUrl,
        MqttOptions,
        check_name,
        options_from,
        parse_broker,
    )

#: The names imported on first use, and their module.
_LAZY: Dict[str, str] = {
    **dict.fromkeys(("MAX_INFLIGHT", "SESSION_EXPIRY", "PahoBridge"), "bridge"),
    **dict.fromkeys(("MqttChannel", "presence_payload"), "guest"),
    **dict.fromkeys(
        ("OPTION_KEYS", "BrokerUrl", "MqttOptions", "check_name", "options_from", "parse_broker"), "options"
    ),
}


def __getattr__(name: str) -> Any:
    """``from vmr_handler.transports.mqtt import PahoBridge`` etc.: the names of :data:`_LAZY`."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
