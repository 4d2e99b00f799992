"""The ``vmr_handler.export`` model component: the experiment's schedules for vmr-host.

Run after the topology and every component that adds schedule entries (it depends on what
repo-base's ``vm_resource.schedule`` depends on: ``topology``, ``schedules_ready``) and before
``vm_resource.schedule`` (its MANIFEST precedes ``vm_resource_schedule_database``), so before
minimega's parsing and launch; named after ``minimega.launch`` FIREWHEEL refuses the
experiment (a circular dependency)::

    firewheel experiment acme.run vmr_handler.export:out=/srv/vmr minimega.launch

Arguments (FIREWHEEL passes them as text):
    out: absolute directory; ``<out>/schedules`` and ``<out>/resources`` are written for
        ``vmr-host serve --schedules <out>/schedules --resources <out>/resources``.
    channels: absolute directory of the VMs' sockets on the host running the VMs (default
        ``<out>/channels``), for ``vmr-host serve --channels <channels> --connect``.

Raises ``vmr_handler.core.errors.ExportError`` naming what is wrong (docs/firewheel.md, "Using
vmr-handler in a FIREWHEEL experiment").
"""

from __future__ import annotations

import os
import pickle
from typing import Any, List, Tuple

from base_objects import VMEndpoint
from firewheel.control.experiment_graph import AbstractPlugin
from firewheel.control.model_component_iterator import ModelComponentIterator
from firewheel.control.repository_db import RepositoryDb

from vmr_handler.core.errors import ExportError
from vmr_handler.firewheel.export import (
    HandedOver,
    VmExport,
    needed_resources,
    resolve_resources,
    resource_index,
    served,
    write_export,
)
from vmr_handler.firewheel.wiring import socket_path, with_agent_port


class Plugin(AbstractPlugin):  # type: ignore[misc]
    """Write each VM endpoint's schedule and the VM resources they name, give each VM the
    agent's virtio-serial port, and hand the schedules over from FIREWHEEL's own handler."""

    def _endpoints(self) -> List[Tuple[Any, Any]]:
        """``(vertex, its schedule)`` of every VM endpoint that has a schedule."""
        found = []
        for vert in self.g.get_vertices():
            if not vert.is_decorated_by(VMEndpoint):
                continue
            schedule = getattr(vert, "vm_resource_schedule", None)
            if isinstance(schedule, HandedOver):
                schedule = schedule.schedule
            if schedule is None:
                self.log.warning("VM %s has no vm_resource_schedule: not exported", vert.name)
                continue
            found.append((vert, schedule))
        return found

    def _installed_components(self) -> List[Tuple[str, Any]]:
        """``(folder, MANIFEST)`` of every installed model component (FIREWHEEL's own listing)."""
        repos = RepositoryDb().list_repositories()
        return [(str(mc.path), mc.manifest) for mc in ModelComponentIterator(repos)]

    def run(self, out: str = "", channels: str = "") -> None:
        """Export into ``out`` (module docstring); ``channels`` defaults to ``<out>/channels``."""
        if not out:
            raise ExportError(
                "vmr_handler.export needs out=DIR, the absolute directory to write the schedules "
                "and VM resources to: vmr_handler.export:out=/srv/vmr"
            )
        channels = channels or os.path.join(out, "channels")
        endpoints = self._endpoints()
        vms, windows = served([VmExport(v.name, pickle.dumps(list(s.get_schedule()))) for v, s in endpoints])
        for name, why in sorted(windows.items()):
            self.log.warning("VM %s is left to FIREWHEEL's own handler: %s", name, why)
        endpoints = [(v, s) for v, s in endpoints if v.name not in windows]
        sockets = {v.name: socket_path(channels, v.name) for v, _ in endpoints}
        resources = resolve_resources(needed_resources(vms), resource_index(self._installed_components()))
        result = write_export(out, vms, resources)
        for vert, schedule in endpoints:
            vert.vm["qemu_append"] = with_agent_port(vert.vm.get("qemu_append") or {}, sockets[vert.name])
            vert.vm_resource_schedule = HandedOver(schedule, vert.name)
        for old in result.removed:
            self.log.info("removed %s: its VM is not in this experiment", old)
        self.log.info(
            "exported %d schedules and %d VM resources to %s; serve them with: vmr-host serve "
            "--schedules %s/schedules --resources %s/resources --channels %s --connect",
            len(result.schedules),
            len(result.resources),
            out,
            out,
            out,
            channels,
        )
