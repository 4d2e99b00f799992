"""The agent's virtio-serial port on a FIREWHEEL VM, as QEMU arguments minimega passes on.

repo-base 2.9.0 gives every QEMU VM one virtio-serial port, ``org.qemu.guest_agent.0``
(``minimega/parse_experiment_graph/plugin.py`` L118), and passes the VM's
``vm["qemu_append"]`` mapping to minimega as ``qemu_append``, each key ``k`` with value ``v``
written ``-k v`` (``minimega/emulated_entities/model_component_objects.py``
``_generate_qemu_append_str``). The agent's port, ``org.vmr.handler.0`` (docs/host.md, "The two
QEMU wirings"), is added there: a chardev on a unix socket QEMU listens on, its own
virtio-serial controller, and the port; ``vmr-host serve --connect`` connects to the socket.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping

from vmr_handler.core.errors import ExportError
from vmr_handler.core.names import name_problem

#: The port name the agent opens (``/dev/virtio-ports/org.vmr.handler.0``).
AGENT_PORT = "org.vmr.handler.0"
#: QEMU ids of the chardev and the controller; distinct from minimega's own (``virtio-serial0``...).
CHARDEV_ID = "vmrhandler0"
CONTROLLER_ID = "vmrserial0"
#: A unix socket path must fit ``sockaddr_un.sun_path`` (108 bytes with its NUL).
MAX_SOCKET_PATH = 107


def socket_path(channels: str, vm: str) -> str:
    """The socket ``<channels>/<vm>.sock`` of one VM: where QEMU listens and ``vmr-host serve
    --channels CHANNELS --connect`` connects.

    Args:
        channels: absolute directory of the sockets on the host that runs the VMs.
        vm: the VM's name (the schedule's file name, ``<vm>.pkl``).

    Raises:
        ExportError: ``channels`` not absolute, a VM name vmr-host refuses
            (:func:`vmr_handler.core.names.name_problem`), or a path over 107 bytes.
    """
    if not os.path.isabs(channels):
        raise ExportError(f"channels={channels!r} is not an absolute path: give the directory of the sockets")
    problem = name_problem(vm)
    if problem is not None:
        raise ExportError(
            f"VM name {vm!r} {problem}: vmr-host cannot serve it; rename the VM in the topology"
        )
    path = os.path.join(channels, f"{vm}.sock")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ExportError(
            f"socket path {path!r} is {len(os.fsencode(path))} bytes, over the {MAX_SOCKET_PATH} a unix "
            "socket allows: give a shorter channels=DIR"
        )
    return path


def qemu_arguments(path: str) -> Dict[str, str]:
    """The agent's port as ``qemu_append`` items: ``{"chardev": ..., "device": ...}``, the
    ``device`` value holding both devices (``-device A -device B`` once rendered)."""
    return {
        "chardev": f"socket,id={CHARDEV_ID},path={path},server=on,wait=off",
        "device": (
            f"virtio-serial-pci,id={CONTROLLER_ID} -device virtserialport,bus={CONTROLLER_ID}.0,"
            f"chardev={CHARDEV_ID},name={AGENT_PORT}"
        ),
    }


def with_agent_port(qemu_append: Mapping[str, Any], path: str) -> Dict[str, Any]:
    """A VM's ``vm["qemu_append"]`` with the agent's port added: a key the VM already has keeps
    its value and gets the new option after it (``"A -device B"`` renders ``-device A -device B``);
    adding it again (the model component run twice) changes nothing.

    Raises:
        ExportError: the VM's mapping already wires another chardev or port under our ids.
    """
    merged = dict(qemu_append)
    for key, value in qemu_arguments(path).items():
        old = merged.get(key)
        if old is None or str(old) == value or str(old).endswith(f" -{key} {value}"):
            merged[key] = old if old is not None else value
            continue
        if CHARDEV_ID in str(old) or CONTROLLER_ID in str(old):
            raise ExportError(
                f"the VM's qemu_append {key!r} already wires {CHARDEV_ID}/{CONTROLLER_ID} differently "
                f"({old!r}): remove it, or export with the same channels=DIR"
            )
        merged[key] = f"{old} -{key} {value}"
    return merged
