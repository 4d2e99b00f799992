"""vmr_handler.firewheel without FIREWHEEL: the export's files, the QEMU wiring, the refusals.

The model component itself runs with the real release in tests/test_firewheel_repo.py; here
the modules it hands the graph's facts to, with schedules pickled as FIREWHEEL's schedule
plugin pickles them (tests/fwhelpers.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests import fwhelpers as fw
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
from vmr_handler.firewheel.wiring import qemu_arguments, socket_path, with_agent_port


def _vm(name: str, *records: Dict[str, Any]) -> VmExport:
    return VmExport(name, fw.firewheel_pickle(list(records)))


def _component(root: Path, name: str, files: Dict[str, bytes], patterns: List[str]) -> Any:
    folder = root / name
    for rel, body in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(body)
    return (str(folder), {"name": name, "vm_resources": patterns})


def test_resources_found_by_manifest_patterns_and_copied_with_their_mode(tmp_path: Path) -> None:
    mcs = [
        _component(
            tmp_path,
            "a",
            {"vm_resources/run.sh": b"#!/bin/sh\n", "vm_resources/sub/x.py": b"x"},
            ["vm_resources"],
        ),
        _component(tmp_path, "b", {"set_hostname.py": b"print(1)", "other.txt": b"no"}, ["set_hostname.py"]),
        _component(tmp_path, "c", {"deep/d1/d2/data.bin": b"d"}, ["deep/**"]),
    ]
    os.chmod(tmp_path / "a" / "vm_resources" / "run.sh", 0o755)
    index = resource_index(mcs)
    assert sorted(index) == ["data.bin", "run.sh", "set_hostname.py"]  # a directory: its files, not deeper
    vms = [
        _vm(
            "web1",
            fw.run_executable(-10, "run.sh", vm_resource=True),
            fw.drop_file(-5, "/opt/s.py", "set_hostname.py"),
        ),
        _vm(
            "web2",
            fw.drop_file(-5, "/opt/d", "data.bin", preload=False),
            fw.run_executable(5, "/bin/echo", "hi"),
        ),
    ]
    needs = needed_resources(vms)
    assert needs == {"run.sh": ["web1"], "set_hostname.py": ["web1"], "data.bin": ["web2"]}
    out = tmp_path / "out"
    result = write_export(str(out), vms, resolve_resources(needs, index))
    assert sorted(result.schedules) == ["web1", "web2"]
    for vm in vms:
        assert (out / "schedules" / f"{vm.name}.pkl").read_bytes() == vm.schedule
    assert (out / "resources" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "resources" / "set_hostname.py").stat().st_mode & 0o777 == 0o644
    assert (out / "resources" / "data.bin").read_bytes() == b"d"


def test_missing_and_conflicting_resources_are_refused_naming_them(tmp_path: Path) -> None:
    vms = [_vm(f"vm{i}", fw.drop_file(-5, "/x", "gone.tgz")) for i in range(5)]
    with pytest.raises(ExportError, match=r"gone.tgz \(dropped by vm0, vm1, vm2 and more\)"):
        resolve_resources(needed_resources(vms), {})
    mcs = [
        _component(tmp_path, "a", {"same.sh": b"one"}, ["same.sh"]),
        _component(tmp_path, "b", {"same.sh": b"two"}, ["same.sh"]),
        _component(tmp_path, "c", {"equal.sh": b"e"}, ["equal.sh"]),
        _component(tmp_path, "d", {"equal.sh": b"e"}, ["equal.sh"]),
    ]
    index = resource_index(mcs)
    assert resolve_resources({"equal.sh": ["vm0"]}, index)["equal.sh"].read_bytes() == b"e"
    with pytest.raises(
        ExportError, match=r"'same.sh' is shipped with different contents .*a/same.sh.*b/same.sh"
    ):
        resolve_resources({"same.sh": ["vm0"]}, index)


def test_a_schedule_the_agent_refuses_stops_the_export_naming_the_vm() -> None:
    windows = _vm("win7", fw.run_powershell(-10, "setup.ps1"))
    with pytest.raises(ExportError, match=r"VM win7: its schedule cannot be served by vmr-host: .*Windows"):
        needed_resources([_vm("ok", fw.run_executable(-1, "/bin/true")), windows])


def test_a_windows_vm_of_a_mixed_experiment_is_left_to_firewheel_the_others_served() -> None:
    linux = _vm("web", fw.run_executable(-1, "/bin/true"))
    windows = _vm("win7", fw.run_powershell(-10, "setup.ps1"))
    broken = VmExport("bad", b"not a pickle")
    keep, left = served([linux, windows, broken])
    assert [vm.name for vm in keep] == ["web", "bad"]  # the broken one is named by needed_resources
    assert list(left) == ["win7"] and "runs Windows PowerShell" in left["win7"]
    with pytest.raises(ExportError, match="VM bad: its schedule cannot be served"):
        needed_resources(keep)


def test_stale_schedules_of_an_earlier_export_are_removed_other_files_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_export(str(out), [_vm("old", fw.run_executable(-1, "/bin/true"))], {})
    (out / "schedules" / "notes.txt").write_text("mine")
    result = write_export(str(out), [_vm("new", fw.run_executable(-1, "/bin/true"))], {})
    assert sorted(p.name for p in (out / "schedules").iterdir()) == ["new.pkl", "notes.txt"]
    assert result.removed == (str(out / "schedules" / "old.pkl"),)
    with pytest.raises(ExportError, match="several VMs are named a"):
        write_export(str(out), [_vm("a", fw.run_executable(-1, "/bin/true"))] * 2, {})
    with pytest.raises(ExportError, match="not an absolute path"):
        write_export("relative/dir", [], {})


def test_the_agent_port_in_qemu_append() -> None:
    path = socket_path("/run/vmr", "host-1.acme.com")
    assert path == "/run/vmr/host-1.acme.com.sock"
    merged = with_agent_port({"bios": "/images/seabios.bin"}, path)
    rendered = " ".join(f"-{k} {v}" for k, v in merged.items())  # repo-base's _generate_qemu_append_str
    assert rendered == (
        "-bios /images/seabios.bin -chardev socket,id=vmrhandler0,path=/run/vmr/host-1.acme.com.sock,"
        "server=on,wait=off -device virtio-serial-pci,id=vmrserial0 -device virtserialport,"
        "bus=vmrserial0.0,chardev=vmrhandler0,name=org.vmr.handler.0"
    )
    assert with_agent_port(merged, path) == merged  # run twice: the same
    own = with_agent_port({"device": "usb-tablet"}, path)
    assert own["device"] == f"usb-tablet -device {qemu_arguments(path)['device']}"
    assert with_agent_port(own, path) == own
    with pytest.raises(ExportError, match="already wires vmrhandler0"):
        with_agent_port(merged, "/elsewhere/host-1.acme.com.sock")


@pytest.mark.parametrize(
    ("channels", "vm", "words"),
    [
        ("run/vmr", "vm1", "not an absolute path"),
        ("/run/vmr", "bad name", "rename the VM"),
        ("/" + "d" * 100, "vm1", "over the 107 a unix socket allows"),
    ],
)
def test_socket_paths_vmr_host_cannot_use_are_refused(channels: str, vm: str, words: str) -> None:
    with pytest.raises(ExportError, match=words):
        socket_path(channels, vm)


class _Schedule:
    def __init__(self) -> None:
        self.entries = ["e1"]

    def get_schedule(self) -> List[str]:
        return self.entries

    def get_serialized_schedule(self) -> str:
        return "serialized"


def test_a_handed_over_schedule_reads_empty_gives_its_entries_and_takes_no_more() -> None:
    handed = HandedOver(_Schedule(), "vm1")
    assert not handed  # repo-base: no QEMU guest agent port, no FIREWHEEL handler for the VM
    assert handed.get_schedule() == ["e1"]
    assert handed.get_serialized_schedule() == "serialized"
    with pytest.raises(ExportError, match=r"VM vm1: a schedule entry .* added after vmr_handler.export"):
        handed.add_vm_resource(object())
