"""The MQTT topic tree (``docs/mqtt.md``), spelled here and nowhere else.

* ``vmr/<experiment>/<vm>/<leaf>``: one VM's topics; the leaves and what the VM itself may
  do there are :data:`VM_TOPICS` (:class:`Topics` names them for one VM);
* ``vmr/<experiment>/_hosts/<leaf>``: host-to-host coordination (:data:`HOSTS_LEVEL`; a VM
  name may not start with ``_``, so no VM can be named like it). VMs reach none of it but
  ``_hosts/<host>/start`` (:func:`host_start_topic`): each host's start, retained, one message
  for all its VMs, which they may read (:func:`vm_shared_topics`).

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
#: Last level of a host's start topic ``vmr/<experiment>/_hosts/<host>/start``.
HOST_START = "start"
#: QoS an agent subscribes the host start topics with (so the broker delivers them at it):
#: 0, since they are retained and re-subscribed at every connect, so a delivery lost with a
#: connection is made good at the next one; the broker then keeps no acknowledgement state
#: for thousands of copies of one message, and the agents send no PUBACK.
HOST_START_QOS = 0
#: Member of an agent's presence (``{"state": ..., "host_start": true}``) saying that its
#: agent reads the host start topics (:func:`host_starts`): the host then sends it the start
#: on no topic of its own. Agents without it get it on ``down`` and ``start``.
READS_HOST_START = "host_start"


def topic(experiment: str, vm: str, leaf: str) -> str:
    """The topic ``vmr/<experiment>/<vm>/<leaf>`` (``vm`` may be :data:`EVERY_VM`, or
    :data:`HOSTS_LEVEL` for the host-to-host topics)."""
    return f"{TOPIC_ROOT}/{experiment}/{vm}/{leaf}"


def hosts_topic(experiment: str, leaf: str) -> str:
    """``vmr/<experiment>/_hosts/<leaf>`` (host-to-host topics; VMs have no access)."""
    return topic(experiment, HOSTS_LEVEL, leaf)


def host_start_topic(experiment: str, host: str) -> str:
    """``vmr/<experiment>/_hosts/<host>/start``: the retained start of ``host``'s run, written
    by that host only, read by every VM of the experiment (one message for all)."""
    return hosts_topic(experiment, f"{host}/{HOST_START}")


def host_sync_topic(experiment: str, host: str) -> str:
    """``vmr/<experiment>/_hosts/<host>/sync``: a host's own echo (it publishes and reads it):
    its message comes back after every retained message its subscriptions brought at connect."""
    return hosts_topic(experiment, f"{host}/sync")


def host_starts(experiment: str) -> str:
    """``vmr/<experiment>/_hosts/+/start``: the filter of every host's start topic (an agent
    does not know which host serves it; it takes only its host's run's start,
    :class:`vmr_handler.core.wire.runs.StartGate`)."""
    return host_start_topic(experiment, EVERY_VM)


#: Leaf under ``_hosts`` of the coordinator's run and start (:func:`coordinator_topic`).
COORDINATOR_START = "_start"
#: Last level of a member host's announcement ``vmr/<experiment>/_hosts/<host>/state``.
HOST_STATE = "state"


def coordinator_topic(experiment: str) -> str:
    """``vmr/<experiment>/_hosts/_start``: the coordinator's run and, once decided, the start
    for every host (retained; written by the coordinator, read by the members)."""
    return hosts_topic(experiment, COORDINATOR_START)


def host_state_topic(experiment: str, host: str) -> str:
    """``vmr/<experiment>/_hosts/<host>/state``: member ``host``'s announcement of its VMs
    (retained; written by that member, read by the coordinator; ``host`` may be
    :data:`EVERY_VM`, i.e. every member)."""
    return hosts_topic(experiment, f"{host}/{HOST_STATE}")


def bridged_topics(experiment: str, member: str) -> Tuple[Tuple[str, str], ...]:
    """What a broker bridge between member host ``member``'s broker and the coordinator's must
    carry, with the direction seen from the member's broker (mosquitto's ``in``: from the
    coordinator's broker, ``out``: to it): the coordinator's run and start in, the member's
    announcement out. Nothing else crosses: each host serves its own VMs through its own
    broker, so no VM topic and no host's own start topic needs the other broker."""
    return ((coordinator_topic(experiment), "in"), (host_state_topic(experiment, member), "out"))


def is_host_start(topic: str, experiment: str) -> bool:
    """Whether ``topic`` is a host's start topic of ``experiment`` (:func:`host_start_topic`)."""
    parts = topic.split("/")
    return len(parts) == 5 and parts[:3] == [TOPIC_ROOT, experiment, HOSTS_LEVEL] and parts[4] == HOST_START


def vm_shared_topics(experiment: str) -> Tuple[Tuple[str, str], ...]:
    """Topic filters beyond :data:`VM_TOPICS` that every VM of ``experiment`` may use, with the
    access (mosquitto ACL): read only, written by the hosts alone."""
    return ((host_starts(experiment), "read"),)


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

    @property
    def host_starts(self) -> str:
        """Every host's start topic (:func:`host_starts`), which the VM may read."""
        return host_starts(self.experiment)


def vm_of(topic: str, experiment: str) -> Optional[Tuple[str, str]]:
    """``(vm, leaf)`` of ``vmr/<experiment>/<vm>/<leaf>``, or None for any other topic."""
    parts = topic.split("/")
    if len(parts) != 4 or parts[0] != TOPIC_ROOT or parts[1] != experiment:
        return None
    return parts[2], parts[3]
