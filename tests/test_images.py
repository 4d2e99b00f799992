"""images/bake installs the agent, its config, the systemd unit, the udev rule and init scripts
into a guest root filesystem directory; the unit passes ``systemd-analyze verify`` there."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BAKE = ROOT / "images" / "bake"


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "vmr-handler"  # stands in for dist/vmr-handler: bake only copies it
    path.write_text("#!/bin/sh\necho agent\n")
    path.chmod(0o755)
    return path


def _bake(binary: Path, target: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BAKE), "--binary", str(binary), *extra, str(target)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _systemd_root(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    units = root / "lib" / "systemd" / "system"
    units.mkdir(parents=True)
    for target in Path("/lib/systemd/system").glob("*.target"):  # what the unit is ordered after
        shutil.copy(target, units / target.name, follow_symlinks=True)
    (root / "bin").mkdir()
    shutil.copy("/bin/mkdir", root / "bin" / "mkdir")
    return root


def test_bake_systemd_rootfs_installs_and_enables(tmp_path, binary):
    root = _systemd_root(tmp_path)
    res = _bake(binary, root)
    assert res.returncode == 0, res.stderr
    agent = root / "usr/local/bin/vmr-handler"
    assert agent.read_bytes() == binary.read_bytes() and stat.S_IMODE(agent.stat().st_mode) == 0o755
    unit = root / "etc/systemd/system/vmr-handler.service"
    link = root / "etc/systemd/system/multi-user.target.wants/vmr-handler.service"
    assert link.is_symlink() and os.readlink(link) == "../vmr-handler.service"
    assert stat.S_IMODE((root / "var/lib/vmr-handler").stat().st_mode) == 0o700
    # where the single file unpacks: the unit's TMPDIR, made by bake too
    assert stat.S_IMODE((root / "var/lib/vmr-handler/tmp").stat().st_mode) == 0o700
    assert "Environment=TMPDIR=/var/lib/vmr-handler/tmp" in unit.read_text()
    rule = (root / "etc/udev/rules.d/90-vmr-handler.rules").read_text()
    assert 'ATTR{name}=="org.vmr.handler.0"' in rule and 'ENV{SYSTEMD_WANTS}+="vmr-handler.service"' in rule
    text = unit.read_text()
    assert "Restart=on-failure" in text and "After=dev-virtio\\x2dports-org.vmr.handler.0.device" in text
    verify = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "vmr-handler.service"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    config = root / "etc/vmr-handler/config.yaml"
    config.write_text("port: unix:/run/custom.sock\n")
    assert _bake(binary, root).returncode == 0
    assert config.read_text() == "port: unix:/run/custom.sock\n"  # an operator's config is kept


def test_baked_config_template_is_accepted_by_the_agent(tmp_path):
    from vmr_handler.agent.cli.commandline import load_config

    conf = load_config(str(ROOT / "images" / "config.yaml"))
    assert conf["port"] == "/dev/virtio-ports/org.vmr.handler.0"
    assert "vm_name" not in conf  # identity never baked into a shared image


@pytest.mark.parametrize("kind", ["openrc", "sysv"])
def test_bake_non_systemd_rootfs_installs_an_init_script(tmp_path, binary, kind):
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    if kind == "openrc":
        (root / "etc/runlevels").mkdir()
    res = _bake(binary, root)
    assert res.returncode == 0, res.stderr
    script = root / "etc/init.d/vmr-handler"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["sh", "-n", str(script)], timeout=30).returncode == 0
    if kind == "openrc":
        assert (root / "etc/runlevels/default/vmr-handler").is_symlink()
        assert script.read_text().startswith("#!/sbin/openrc-run")
    else:
        assert os.readlink(root / "etc/rc3.d/S90vmr-handler") == "../init.d/vmr-handler"
    assert not (root / "etc/systemd").exists()


def test_bake_refuses_clearly(tmp_path, binary):
    res = _bake(tmp_path / "missing", tmp_path)
    assert res.returncode == 1 and "no agent executable" in res.stderr
    res = _bake(binary, tmp_path / "nowhere")
    assert res.returncode == 1 and "neither a directory nor a disk image" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = _bake(binary, empty)
    assert res.returncode == 1 and "does not look like a root filesystem" in res.stderr
    image = tmp_path / "disk.qcow2"
    image.write_bytes(b"QFI\xfb")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    if shutil.which("virt-customize", path=env["PATH"]) is None:
        res = subprocess.run([str(BAKE), "--binary", str(binary), str(image)],
                             capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
        assert res.returncode == 1 and "virt-customize" in res.stderr


def test_bake_onedir_bundle_links_the_agent(tmp_path):
    bundle = tmp_path / "dist" / "vmr-handler"  # the shape packaging/build.sh produces
    (bundle / "_internal").mkdir(parents=True)
    (bundle / "_internal" / "libpython.so").write_bytes(b"\x7fELF")
    agent = bundle / "vmr-handler"
    agent.write_text("#!/bin/sh\necho agent\n")
    agent.chmod(0o755)
    root = _systemd_root(tmp_path)
    for _ in range(2):  # baking again replaces the bundle
        res = _bake(bundle, root)
        assert res.returncode == 0, res.stderr
    link = root / "usr/local/bin/vmr-handler"
    assert link.is_symlink() and os.readlink(link) == "/opt/vmr-handler/vmr-handler"
    assert (root / "opt/vmr-handler/_internal/libpython.so").read_bytes() == b"\x7fELF"
    assert not (root / "opt/vmr-handler.new").exists()


def test_bake_single_file_replaces_an_earlier_onedir_bundle(tmp_path, binary):
    bundle = tmp_path / "dist" / "vmr-handler"
    (bundle / "_internal").mkdir(parents=True)
    (bundle / "vmr-handler").write_text("#!/bin/sh\necho old\n")
    (bundle / "vmr-handler").chmod(0o755)
    root = _systemd_root(tmp_path)
    assert _bake(bundle, root).returncode == 0
    assert (root / "usr/local/bin/vmr-handler").is_symlink()
    res = _bake(binary, root)
    assert res.returncode == 0, res.stderr
    installed = root / "usr/local/bin/vmr-handler"
    assert not installed.is_symlink() and installed.read_bytes() == binary.read_bytes()
    assert not (root / "opt/vmr-handler").exists(), "the old bundle is removed"
