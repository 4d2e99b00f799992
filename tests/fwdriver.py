"""Run FIREWHEEL 3.1.0's model components the way ``firewheel experiment`` does, without a
testbed: run by the Python of a venv holding firewheel and its repositories (tests/test_firewheel_repo.py).

``python fwdriver.py WORKDIR SPEC.json``: SPEC is ``{"components": [[name, {arg: value}], ...]}``
(with ``"order_only": true`` only the order FIREWHEEL runs them in, or why it cannot).
The dependency graph is built and every plugin run by FIREWHEEL's own
``ModelComponentManager``. What needs minimega, absent here, is replaced, and only that: the
file stores (``ImageStore`` is made by repo-base's ``resolve_vm_images``; ``upload_files`` puts
VM resources and images into minimega's store) and the two databases of repo-base's
``vm_resource.schedule`` (its ``ScheduleDb`` and ``VMMapping``: here they keep what the plugin
stores). Prints one JSON object: per VM endpoint the bytes ``vm_resource.schedule`` stored (hex),
and the minimega configuration repo-base builds for it (``qemu_append_str``, whether FIREWHEEL's
handler is launched).
"""

import json
import sys
from pathlib import Path

from firewheel.config import config

WORK = Path(sys.argv[1])
config["system"]["default_output_dir"] = str(WORK / "firewheel")
config["logging"]["root_dir"] = str(WORK / "logs")

import firewheel.control.image_store as image_store  # noqa: E402
import firewheel.vm_resource_manager.schedule_db as schedule_db  # noqa: E402
import firewheel.vm_resource_manager.vm_mapping as vm_mapping  # noqa: E402
from firewheel.control.dependency_graph import UnsatisfiableDependenciesError  # noqa: E402
from firewheel.control.model_component import ModelComponent  # noqa: E402
from firewheel.control.model_component_manager import ModelComponentManager  # noqa: E402
from firewheel.control.repository_db import RepositoryDb  # noqa: E402

STORED = {}


class KeptImages:
    """The image store's two names resolve_vm_images reads (``cache``, ``store``)."""

    def __init__(self, store="images", decompress=True):
        self.store = store
        self.cache = str(WORK / "images")


class KeptSchedules:
    """``ScheduleDb.batch_put`` as vm_resource.schedule calls it: keeps each VM's text."""

    def batch_put(self, items):
        for item in items:
            STORED[item["server_name"]] = item["text"]


class KeptMapping:
    def batch_put(self, items):
        pass


image_store.ImageStore = KeptImages
schedule_db.ScheduleDb = KeptSchedules
vm_mapping.VMMapping = KeptMapping
ModelComponent.upload_files = lambda self: None


def main():
    spec = json.loads(Path(sys.argv[2]).read_text())
    db = RepositoryDb(db_basepath=str(WORK / "firewheel"))
    components = [
        ModelComponent(name=name, repository_db=db, arguments={"plugin": args}, install=False)
        for name, args in spec["components"]
    ]
    manager = ModelComponentManager(repository_db=db)
    try:
        manager.build_dependency_graph(components, install_mcs=False)
    except UnsatisfiableDependenciesError as exc:
        print(json.dumps({"unsatisfiable": str(exc)}))
        return
    order = manager.get_ordered_model_component_list()
    if spec.get("order_only"):
        print(json.dumps({"order": [mc.name for mc in order]}))
        return
    graph = None
    for mc in order:
        failed, graph = manager.process_model_component(mc, graph)
        if failed:
            raise SystemExit(f"model component {mc.name} failed (see {WORK / 'logs'})")
    from base_objects import VMEndpoint

    vms = {}
    for vert in graph.get_vertices():
        if vert.is_decorated_by(VMEndpoint):
            conf = vert.generate_minimega_config()
            vms[vert.name] = {
                "stored": STORED[vert.name].hex(),
                "qemu_append_str": conf["aux"].get("qemu_append_str", ""),
                "handler_process": "handler_process" in conf["aux"],
            }
    print(json.dumps({"order": [mc.name for mc in order], "vms": vms}))


main()
