"""The MQTT topic tree (``docs/mqtt.md``), spelled here and nowhere else.

* ``vmr/<experiment>/<vm>/<leaf>``: one VM's topics; the leaves and what the VM itself may
  do there are :data:`VM_TOPICS` (:class:`Topics` names them for one VM);
* ``vmr/<experiment>/_hosts/<leaf>``: host-to-host coordination (:data:`HOSTS_LEVEL`, never
  VMs: a VM name may not start with ``_``, so no VM can be named like it).

Used by the agent's and the host's MQTT clients, by ``vmr-host mqtt-config`` (the ACL) and by
the benchmark. It imports nothing of the package: ``vmr-host``'s command line reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

#: First level of every topic.
TOPIC_ROOT = "vmr"
#: The leaves of a VM's topics.
UP, DOWN, PRESENCE, START = "up", "down", "presence", "start"
#: Per-VM topic leaves under ``vmr/<experiment>/<vm>/`` and what the VM itself may do there
#: (mosquitto ACL access). The host users may read and write all of them.
VM_TOPICS: Tuple[Tuple[str, str], ...] = (
    (UP, "write"),  # agent -> host, QoS 1
    (DOWN, "read"),  # host -> agent, QoS 1
    (PRESENCE, "write"),  # retained online/offline, offline is the agent's last will
    (START, "read"),  # retained start-time message written by the host
)
#: Topic level below ``vmr/<experiment>/`` reserved for host-to-host coordination; VM names
#: may not start with ``_``, so no VM can ever be named like it.
HOSTS_LEVEL = "_hosts"
#: MQTT's single-level wildcard: in the VM's place, every VM.
EVERY_VM = "+"


def topic(experiment: str, vm: str, leaf: str) -> str:
    """The topic ``vmr/<experiment>/<vm>/<leaf>`` (``vm`` may be :data:`EVERY_VM`, or
    :data:`HOSTS_LEVEL` for the host-to-host topics)."""
    return f"{TOPIC_ROOT}/{experiment}/{vm}/{leaf}"


def hosts_topic(experiment: str, leaf: str) -> str:
    """``vmr/<experiment>/_hosts/<leaf>`` (host-to-host topics; VMs have no access)."""
    return topic(experiment, HOSTS_LEVEL, leaf)


def experiment_topics(experiment: str) -> str:
    """``vmr/<experiment>/#``: every topic of the experiment (what a host user may use)."""
    return f"{TOPIC_ROOT}/{experiment}/#"


@dataclass(frozen=True)
class Topics:
    """The topics of one VM of one experiment, ``vmr/<experiment>/<vm>/<leaf>``."""

    experiment: str
    vm: str

    @property
    def up(self) -> str:
        return topic(self.experiment, self.vm, UP)

    @property
    def down(self) -> str:
        return topic(self.experiment, self.vm, DOWN)

    @property
    def presence(self) -> str:
        return topic(self.experiment, self.vm, PRESENCE)

    @property
    def start(self) -> str:
        return topic(self.experiment, self.vm, START)


def vm_of(topic: str, experiment: str) -> Optional[Tuple[str, str]]:
    """``(vm, leaf)`` of ``vmr/<experiment>/<vm>/<leaf>``, or None for any other topic."""
    parts = topic.split("/")
    if len(parts) != 4 or parts[0] != TOPIC_ROOT or parts[1] != experiment:
        return None
    return parts[2], parts[3]
