"""This package as a FIREWHEEL model-component repository, with the real pip-installed release.

FIREWHEEL 3.1.0 and the repositories the acme tutorial needs (repo-base, -linux, -vyos,
-tutorials) are installed once into a venv outside the repository, ``~/.cache/vmr-handler/
fw-3.1.0`` (``VMR_FW_VENV`` overrides; kept between runs); this package is installed into it
from a copy of the tree (``pip install``, not editable: the model component must be in the
wheel). The acme tutorial's graph is built by FIREWHEEL's own ModelComponentManager with every
plugin of the experiment (``tests/fwdriver.py`` says the only parts replaced: minimega's file
stores and the schedule database, absent here), ``vmr_handler.export`` writes its export, and
``vmr-host`` serves it to real agents over unix sockets (vmr-host listening: there is no QEMU
here to listen as the exported ``qemu_append`` makes it). The agents run the acme schedules'
real programs (set_hostname.sh, netplan, tar...), so each runs in its own mount, UTS and
network namespace (``SANDBOX``): the root file system, /proc/sys and /sys read-only but for the
experiment's directory, a private /run, its own hostname, no network.

Skipped only when the package registry cannot be reached; any other failure fails.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.hostenv import HostEnv
from vmr_handler.core.schedule.unpickler import unpickle_entries

REPO = Path(__file__).resolve().parent.parent
PINS = [
    "firewheel==3.1.0",
    "firewheel-repo-base==2.9.0",
    "firewheel-repo-linux==3.0.1",
    "firewheel-repo-vyos==3.0.0",
    "firewheel-repo-tutorials==2.7.0",
]
VENV = Path(os.environ.get("VMR_FW_VENV", Path.home() / ".cache" / "vmr-handler" / "fw-3.1.0"))
#: What pip says when it cannot reach the registry (and only then is the test skipped).
UNREACHABLE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Failed to establish a new connection",
    "ConnectTimeoutError",
    "ProxyError",
)
#: Each agent in its own mount, UTS and network namespace: the root file system read-only but
#: for the experiment's directory ($0), /proc/sys and /sys read-only, a private /run (no systemd
#: or D-Bus to talk to), its own hostname and no network.
SANDBOX_SCRIPT = (
    'mount --rbind / / && mount --bind "$0" "$0" && mount -o remount,bind,ro / '
    "&& mount -t tmpfs tmpfs /run && mount --bind /proc/sys /proc/sys "
    '&& mount -o remount,bind,ro /proc/sys && mount -o remount,bind,ro /sys && exec "$@"'
)
SANDBOX = ["unshare", "--mount", "--uts", "--net", "--propagation", "private", "sh", "-c", SANDBOX_SCRIPT]

pytestmark = pytest.mark.timeout(900)


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV / "bin" / "python"), "-m", "pip", *args], capture_output=True, text=True, timeout=1200
    )


def _install_release() -> float:
    """The venv with the pinned release, made once; the seconds it took (0 when it was there)."""
    marker = VENV / ".vmr-complete"
    if marker.exists() and json.loads(marker.read_text()).get("pins") == PINS:
        return 0.0
    started = time.monotonic()
    shutil.rmtree(VENV, ignore_errors=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
    res = _pip("install", "-q", *PINS)
    if res.returncode != 0:
        out = res.stdout + res.stderr
        if any(word in out for word in UNREACHABLE):
            pytest.skip(f"the package registry cannot be reached to install {' '.join(PINS)}: {out[-400:]}")
        pytest.fail(f"pip install {' '.join(PINS)} failed (exit {res.returncode}):\n{out[-3000:]}")
    _build_combined_profiles()
    seconds = time.monotonic() - started
    marker.write_text(json.dumps({"pins": PINS, "install_seconds": round(seconds, 1)}))
    return seconds


def _site_packages() -> Path:
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _build_combined_profiles() -> None:
    """``combined_profiles.tgz``: linux.base_objects' INSTALL (an ansible playbook that downloads
    dot files from the internet) makes it in its ``vm_resources``; every Linux VM drops it. A
    small one made here stands in for what that playbook makes."""
    target = _site_packages() / "firewheel_repo_linux" / "linux" / "vm_resources" / "combined_profiles.tgz"
    body = b"export VMR_PROFILE=1\n"
    with tarfile.open(target, "w:gz") as tar:
        info = tarfile.TarInfo("root/.profile")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))


def _install_this_package(tmp: Path) -> None:
    """This tree, copied and pip-installed (not editable: the wheel must carry the model component)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "vmr_handler", src / "vmr_handler", ignore=shutil.ignore_patterns("__pycache__"))
    res = _pip("install", "-q", "--no-build-isolation", str(src))  # its dependencies, the first time
    if res.returncode == 0:
        res = _pip("install", "-q", "--no-deps", "--force-reinstall", "--no-build-isolation", str(src))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]


@pytest.fixture(scope="module")
def firewheel_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    seconds = _install_release()
    if seconds:
        print(f"FIREWHEEL 3.1.0 and its repositories installed into {VENV} in {seconds:.0f} s")
    _install_this_package(tmp_path_factory.mktemp("pkg"))
    return VENV / "bin" / "python"


def _experiment(python: Path, work: Path, components: List[Any], order_only: bool = False) -> Dict[str, Any]:
    (work / "logs").mkdir(parents=True, exist_ok=True)
    spec = work / "spec.json"
    spec.write_text(json.dumps({"components": components, "order_only": order_only}))
    res = subprocess.run(
        [str(python), str(REPO / "tests" / "fwdriver.py"), str(work), str(spec)],
        capture_output=True,
        text=True,
        cwd=work,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_acme_experiment_exported_served_and_run_by_agents(firewheel_python: Path) -> None:
    env = HostEnv({}, start_buffer=1.0)
    try:
        out, channels = env.root / "export", env.root / "ch"
        result = _experiment(
            firewheel_python,
            env.root / "fw",
            [
                ["acme.run", {}],
                ["vmr_handler.export", {"out": str(out), "channels": str(channels)}],
                ["vm_resource.schedule", {}],
            ],
        )
        vms = result["vms"]
        assert len(vms) == 14  # the acme topology's VM endpoints
        # each schedule: the very bytes repo-base's vm_resource.schedule stored for the VM
        assert sorted(p.stem for p in (out / "schedules").iterdir()) == sorted(vms)
        for vm, facts in vms.items():
            assert (out / "schedules" / f"{vm}.pkl").read_bytes() == bytes.fromhex(facts["stored"])
            # the agent's port in the VM's minimega configuration, FIREWHEEL's handler not launched
            sock = channels / f"{vm}.sock"
            assert (
                f"-chardev socket,id=vmrhandler0,path={sock},server=on,wait=off" in facts["qemu_append_str"]
            )
            assert "chardev=vmrhandler0,name=org.vmr.handler.0" in facts["qemu_append_str"]
            assert facts["handler_process"] is False
        _check_resources(out)
        _serve_and_run(env, out, vms)
    finally:
        env.close()


def _check_resources(out: Path) -> None:
    """Every file the schedules drop is in ``resources``, byte for byte and with the mode of
    the file its model component ships."""
    site = _site_packages()
    needed = set()
    for pkl in (out / "schedules").iterdir():
        raw = pkl.read_bytes()
        # the names the schedule plugin collects (``data_entry["filename"]``)
        needed |= {d["filename"] for e in _entries(raw) for d in e.get("data") or [] if "filename" in d}
    assert needed == {p.name for p in (out / "resources").iterdir()}
    assert {"set_hostname.sh", "combined_profiles.tgz", "interface_remap.py"} <= needed
    for name in needed:
        copied = out / "resources" / name
        shipped = [p for p in site.glob(f"firewheel_repo_*/**/{name}") if _sha(p) == _sha(copied)]
        assert shipped, f"{name}: no model component ships these bytes"
        assert copied.stat().st_mode & 0o777 == shipped[0].stat().st_mode & 0o777, name


def _entries(raw: bytes) -> List[Dict[str, Any]]:
    """The entries' ``__dict__`` of a schedule pickle, read with this package's own restricted
    unpickler (no FIREWHEEL class needed here)."""
    return [e.state for e in unpickle_entries(raw)]


def _sandbox_works(root: Path) -> None:
    """The sandbox itself, tried once: a clear failure here rather than agents that never start."""
    res = subprocess.run(
        [*SANDBOX, str(root), "touch", str(root / "sandbox-ok")], capture_output=True, text=True
    )
    assert res.returncode == 0 and (root / "sandbox-ok").exists(), (
        "the agents run the acme schedules' programs (hostname, netplan, tar...) in a private mount, "
        "UTS and network namespace: run this test as root with util-linux's unshare "
        f"(exit {res.returncode}: {res.stderr.strip()})"
    )


def _serve_and_run(env: HostEnv, out: Path, vms: Dict[str, Any]) -> None:
    _sandbox_works(env.root)
    env.schedules, env.resources = out / "schedules", out / "resources"
    env.start_host()
    for vm in vms:
        env.start_agent(vm, prefix=[*SANDBOX, str(env.root)])
    for vm in vms:
        loaded = env.wait_event(vm, "schedule_loaded")
        pkl = out / "schedules" / f"{vm}.pkl"
        assert loaded["event"]["data"]["digest"] == _sha(pkl)
        assert loaded["event"]["data"]["entries"] == len(_entries(pkl.read_bytes()))
    for vm in vms:
        env.wait_event(vm, "schedule_complete")
        _check_what_ran(env, out, vm)
    states = {v["vm"]: v["state"] for v in env.status()["vms"]}
    assert states == dict.fromkeys(vms, "complete"), states


def _check_what_ran(env: HostEnv, out: Path, vm: str) -> None:
    """Every entry of the exported schedule that runs a program started, with its executable;
    every VM resource it drops was placed with the exported file's bytes."""
    entries = _entries((out / "schedules" / f"{vm}.pkl").read_bytes())
    started = {e["event"]["data"]["index"]: e["event"]["data"] for e in env.events(vm, "entry_started")}
    placed = [e["event"]["data"] for e in env.events(vm, "data_placed")]
    runs = {i: e["executable"] for i, e in enumerate(entries) if e.get("executable")}
    assert {i: started[i]["executable"] for i in started} == runs
    for i, entry in enumerate(entries):
        for item in entry.get("data") or []:
            if "filename" in item:
                want = _sha(out / "resources" / item["filename"])
                assert any(p["index"] == i and p["sha256"] == want for p in placed), (vm, i, item)


def test_the_export_runs_before_firewheel_stores_the_schedules_or_the_experiment_is_refused(
    firewheel_python: Path, tmp_path: Path
) -> None:
    """Named before ``minimega.launch``, the export runs before vm_resource.schedule and the
    minimega parsing that wires the VMs (its MANIFEST precedes ``vm_resource_schedule_database``);
    named after it, FIREWHEEL refuses the experiment (a circular dependency naming the export)
    rather than launch VMs without the agent's port and with FIREWHEEL's handler."""
    names = ["acme.run", "vmr_handler.export", "minimega.launch"]
    order = _experiment(firewheel_python, tmp_path / "a", [[n, {}] for n in names], order_only=True)["order"]
    for later in ("vm_resource.schedule", "minimega.parse_experiment_graph", "minimega.launch"):
        assert (
            order.index("minimega.schedules_ready") < order.index("vmr_handler.export") < order.index(later)
        )
    names = ["acme.run", "minimega.launch", "vmr_handler.export"]
    refused = _experiment(firewheel_python, tmp_path / "b", [[n, {}] for n in names], order_only=True)
    assert (
        "Circular dependency" in refused["unsatisfiable"] and "vmr_handler.export" in refused["unsatisfiable"]
    )
