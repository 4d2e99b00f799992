"""The frozen guest agent: ``packaging/build.sh`` builds it once per session, then every test
runs the REAL single file (no Python on its path) against the same inputs as the package.
``build.sh --onedir`` (the directory bundle) is built and run too.

The build is bounded and a failure to build fails (never skips) the tests. SIGKILLs of the
bootloader and of the agent check that nothing is left behind and nothing runs twice.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import psutil
import pytest
import yaml

import vmr_handler

REPO = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT = 300.0
WAIT = 60.0
# the single file unpacks itself into a new $TMPDIR/_MEI* at every start (removed at exit);
# every run here gets its own TMPDIR, so what one test leaves is never another's
UNPACK_ROOT = Path(tempfile.mkdtemp(prefix="vmr-frozen-unpack."))
atexit.register(shutil.rmtree, UNPACK_ROOT, True)


def _unpack_dir() -> Path:
    return Path(tempfile.mkdtemp(dir=UNPACK_ROOT))


def _build(out: Path, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "VMR_BUILD_WORK": str(out / "work")}
    env.pop("VMR_PYI_MODE", None)
    for name in ("VMR_RUNTIME_TMPDIR", "VMR_PYI_COMPRESS", "VMR_PYI_SIGNATURES"):
        env.pop(name, None)
    try:
        res = subprocess.run(
            ["bash", str(REPO / "packaging" / "build.sh"), *options, str(out / "dist")],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            env=env,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"packaging/build.sh took more than {BUILD_TIMEOUT} s: {exc.stderr!r}")
    if res.returncode != 0:
        pytest.fail(f"packaging/build.sh failed ({res.returncode}):\n{res.stdout}\n{res.stderr[-4000:]}")
    return res


@pytest.fixture(scope="session")
def frozen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single file, as ``packaging/build.sh`` makes it by default."""
    out = tmp_path_factory.mktemp("frozen")
    res = _build(out)
    exe = out / "dist" / "vmr-handler"
    assert exe.is_file() and os.access(exe, os.X_OK), res.stdout
    return exe


@pytest.fixture(scope="session")
def onedir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory bundle of ``build.sh --onedir``, built into the same kind of place."""
    out = tmp_path_factory.mktemp("onedir")
    res = _build(out, "--onedir")
    exe = out / "dist" / "vmr-handler" / "vmr-handler"
    assert exe.is_file() and os.access(exe, os.X_OK), res.stdout
    return exe


@pytest.fixture(scope="session")
def unsigned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single file of ``build.sh --without-signatures``: no ``cryptography`` inside."""
    out = tmp_path_factory.mktemp("unsigned")
    res = _build(out, "--without-signatures")
    exe = out / "dist" / "vmr-handler"
    assert exe.is_file() and os.access(exe, os.X_OK), res.stdout
    return exe


def _run(
    exe: Path, *args: str, timeout: float = WAIT, locale: Optional[Dict[str, str]] = None, **kw: Any
) -> subprocess.CompletedProcess:
    """Run the frozen agent to its end, in an environment without the venv (the bundle must
    not need the host's Python) and with its own TMPDIR, which must be empty afterwards.
    ``locale``: variables that replace ``LANG=C.UTF-8`` (LANG, LC_ALL, LOCPATH)."""
    unpack = _unpack_dir()
    env = {"PATH": "/usr/bin:/bin", **(locale or {"LANG": "C.UTF-8"}), "TMPDIR": str(unpack)}
    res = subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO, **kw
    )
    assert list(unpack.iterdir()) == [], f"the frozen agent left {list(unpack.iterdir())} behind"
    return res


def test_pinned_pyinstaller_matches_test_extra() -> None:
    build = (REPO / "packaging" / "build.sh").read_text()
    pinned = re.search(r"^PYINSTALLER_VERSION=(\S+)", build, re.M)
    assert pinned, "build.sh pins no PyInstaller version"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"pyinstaller=={pinned.group(1)}"' in pyproject


def _archive(exe: Path) -> List[str]:
    """The names inside a single-file build (PyInstaller's own archive viewer)."""
    viewer = Path(sys.executable).parent / "pyi-archive_viewer"
    res = subprocess.run([str(viewer), "-r", "-b", str(exe)], capture_output=True, text=True, timeout=WAIT)
    assert res.returncode == 0, res.stderr
    return [line.strip() for line in res.stdout.splitlines()]


def test_single_file_without_host_python_or_host_code(frozen: Path) -> None:
    assert not (frozen.parent / "_internal").exists(), "one file, nothing next to it"
    names = _archive(frozen)
    assert any(n.startswith("libpython3") for n in names), "libpython is bundled"
    assert "vmr_handler.agent.machine.bundle" in names and "vmr_handler.agent.cli.commandline" in names
    assert not [n for n in names if n.startswith("vmr_handler.host")], "vmr-host is not part of the agent"
    host_only = ("aiohttp", "prometheus_client", "multidict", "yarl", "selenium")
    assert not [n for n in names if n.split(".")[0] in host_only], "the console's libraries stay on the host"


def _base_library(exe: Path) -> List[str]:
    """The modules in a single file's ``base_library.zip`` (dotted names, no ``.pyc``)."""
    from PyInstaller.archive.readers import CArchiveReader

    with zipfile.ZipFile(io.BytesIO(CArchiveReader(str(exe)).extract("base_library.zip"))) as zf:
        return [n[: -len(".pyc")].replace("/", ".") for n in zf.namelist() if n.endswith(".pyc")]


def test_single_file_unpacks_nothing_the_guest_never_uses(frozen: Path) -> None:
    """Every start unpacks every binary and data file of the single file: the spec leaves out
    the process pools, the decimal/statistics stack, libuuid and the East Asian codecs,
    and the runtime hooks that imported multiprocessing and pkgutil at every start."""
    names = _archive(frozen) + _base_library(frozen)
    unused = (
        "multiprocessing", "_multiprocessing", "_posixshmem", "pyi_rth_multiprocessing", "pyi_rth_pkgutil",
        "statistics", "fractions", "decimal", "_decimal", "_pydecimal", "_uuid", "libuuid",
        "_multibytecodec", "_codecs_jp", "_codecs_cn", "encodings.shift_jis", "encodings.gb18030",
    )  # fmt: skip

    def module(name: str) -> str:  # ".../lib-dynload/_decimal.cpython-311-x86_64-linux-gnu.so" -> "_decimal"
        return name.rsplit("/", 1)[-1].split(".cpython-")[0].split(".so")[0]

    carried = sorted({n for n in names for u in unused if n == u or n.startswith(u + ".") or module(n) == u})
    assert carried == [], f"the single file still carries {carried}"
    assert "vmr_handler.core.wire.clockanswers" in names and "encodings.utf_8" in names


def test_utf8_mode_whatever_the_locale(frozen: Path, tmp_path: Path) -> None:
    """The interpreter runs in UTF-8 mode (the spec's OPTIONS) in a guest whose locale is EUC-JP,
    a codec the bundle leaves out: it starts, and a UTF-8 file name reaches the file system intact
    (without UTF-8 mode, encoding that name for the locale raised UnicodeEncodeError)."""
    localedef = shutil.which("localedef")
    assert localedef, "this test needs glibc's localedef (Debian: libc-bin) to make an EUC-JP locale"
    locales = tmp_path / "locales"
    locales.mkdir()
    made = subprocess.run(
        [localedef, "-i", "ja_JP", "-f", "EUC-JP", str(locales / "ja_JP.EUC-JP")],
        capture_output=True,
        text=True,
    )
    assert (locales / "ja_JP.EUC-JP").is_dir(), f"localedef failed ({made.returncode}): {made.stderr}"
    sched = tmp_path / "schédule-日本.yaml"
    sched.write_text("- {start_time: 1, executable: /bin/true}\n", encoding="utf-8")
    res = _run(frozen, "check", str(sched), locale={"LC_ALL": "ja_JP.EUC-JP", "LOCPATH": str(locales)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"{sched}: OK" in res.stdout


def test_onedir_bundle_runs_without_unpacking(onedir: Path, tmp_path: Path) -> None:
    internal = onedir.parent / "_internal"
    assert (internal / "base_library.zip").is_file()
    assert not list(internal.rglob("vmr_handler/host*")), "vmr-host is not part of the agent"
    unpack = tmp_path / "tmp"
    unpack.mkdir()
    res = subprocess.run(
        [str(onedir), "run", "--local", "examples/demo.yaml", "--start-buffer", "0.5", "--launch-dir",
         str(tmp_path / "l"), "--state-dir", str(tmp_path / "s"), "--report", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=90, cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(unpack)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "schedule_complete" in (tmp_path / "r").read_text()
    assert list(unpack.iterdir()) == [], "onedir unpacks nothing"


def test_version_reports_package_version(frozen: Path) -> None:
    res = _run(frozen, "--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"vmr-handler {vmr_handler.__version__}",
        "signature checks: built in (Ed25519, cryptography)",
    ]


def test_without_signatures_carries_no_cryptography(frozen: Path, unsigned: Path) -> None:
    """``build.sh --without-signatures`` leaves out cryptography's Rust library, its modules and
    metadata, the cffi backend only it imports and its runtime hook; the default build keeps them."""
    gone = ("cryptography", "_cffi_backend", "cffi", "pyi_rth_cryptography_openssl")

    def carried(exe: Path) -> List[str]:
        names = _archive(exe) + _base_library(exe)
        return sorted(n for n in names for g in gone if re.match(rf"{g}([./_-]|$)", n))

    kept = carried(frozen)
    assert (
        "cryptography/hazmat/bindings/_rust.abi3.so" in kept
        and "cryptography.hazmat.primitives.asymmetric.ed25519" in kept
    )
    assert any(n.startswith("_cffi_backend.") for n in kept), kept
    assert carried(unsigned) == [], f"the --without-signatures build still carries {carried(unsigned)}"
    assert unsigned.stat().st_size < frozen.stat().st_size - 10_000_000, "11 MB of Rust library less"
    res = _run(unsigned, "--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"vmr-handler {vmr_handler.__version__}",
        "signature checks: not built in (built with packaging/build.sh --without-signatures);"
        " a public_key is refused",
    ]


@pytest.mark.parametrize("where", ["--public-key", "config", "fw_cfg"])
def test_without_signatures_refuses_a_public_key_at_once(unsigned: Path, tmp_path: Path, where: str) -> None:
    """With a key set by the flag, the config file or the fw_cfg blob, the agent built without
    signature checks stops before it touches its state dir or its channel (which does not exist:
    going on, it would retry it forever) with one error naming the setting and the way out."""
    from vmr_handler.core.wire.signing import generate_keypair

    _private, public = generate_keypair()
    key = tmp_path / "host.pub"
    key.write_bytes(public)
    config, fw_cfg = tmp_path / "config.yaml", tmp_path / "fw_cfg.yaml"
    config.write_text("vm_name: vm1\n" + (f"public_key: {key}\n" if where == "config" else ""))
    fw_cfg.write_text("transport: virtio-serial\n" + (f"public_key: {key}\n" if where == "fw_cfg" else ""))
    args = ["run", "--config", str(config), "--fw-cfg", str(fw_cfg), "--port", f"unix:{tmp_path}/none.sock",
            "--state-dir", str(tmp_path / "st"), "--launch-dir", str(tmp_path / "la")]  # fmt: skip
    if where == "--public-key":
        args += ["--public-key", str(key)]
    res = _run(unsigned, *args)
    setting = {
        "--public-key": "--public-key",
        "config": f"public_key in {config}",
        "fw_cfg": f"public_key in {fw_cfg}",
    }
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.splitlines() == [
        f"vmr-handler: error: {setting[where]} is set, but this vmr-handler was built without signature "
        "checks (packaging/build.sh --without-signatures), so it cannot verify the host's signed schedules, "
        "start times and RESUMEs, and it never runs unsigned ones when a key is set. To go on: rebuild the "
        "agent with packaging/build.sh without --without-signatures, or remove that setting to run unsigned"
    ]
    assert not (tmp_path / "st").exists() and not (tmp_path / "la").exists(), "nothing started"


def test_completion_script(frozen: Path) -> None:
    res = _run(frozen, "completion", "bash")
    assert res.returncode == 0, res.stderr
    assert "complete " in res.stdout and "vmr-handler" in res.stdout


def test_plan_json_equals_package(frozen: Path) -> None:
    args = ["plan", "--json", "examples/demo.yaml", "--resume", "5"]
    ref = subprocess.run(
        [sys.executable, "-m", "vmr_handler", *args], capture_output=True, text=True, cwd=REPO, timeout=WAIT
    )
    assert ref.returncode == 0, ref.stderr
    res = _run(frozen, *args)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == json.loads(ref.stdout)
    assert res.stdout == ref.stdout


def test_check_accepts_demo_pickle(frozen: Path) -> None:
    res = _run(frozen, "check", "examples/demo.pkl")
    assert res.returncode == 0, res.stdout + res.stderr


class _Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_check_refuses_hostile_pickle(frozen: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps([_Hostile(marker)], protocol=2))
    res = _run(frozen, "check", str(evil))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "system" in res.stdout + res.stderr
    assert not marker.exists()


def _report(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_run_local_demo(frozen: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    res = _run(
        frozen,
        "run",
        "--local",
        "examples/demo.yaml",
        "--start-buffer",
        "1",
        "--launch-dir",
        str(tmp_path / "launch"),
        "--state-dir",
        str(tmp_path / "state"),
        "--report",
        str(report),
        timeout=90,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    types = [ev["type"] for ev in _report(report)]
    assert "schedule_complete" in types, types
    assert types.count("entry_started") >= 7
    assert (tmp_path / "launch").is_dir()


@pytest.mark.parametrize("original", [None, "/opt/guest-libs"])
def test_entries_see_the_guests_environment_and_run_firewheel_lines(
    frozen: Path, tmp_path: Path, original: Optional[str]
) -> None:
    """Entries must not inherit the bootloader's LD_LIBRARY_PATH (the bundle's libssl would
    shadow the guest's), its ``_PYI_*`` variables, nor the TMPDIR that only placed the unpack;
    an entry can run the same file again (``vmr-handler --version``) without touching the
    agent's copy; a reference pickle with a cd builtin and a missing program runs."""
    from tests import fwhelpers as fw

    schedule = tmp_path / "s.pkl"
    probe = "/; echo LD=${LD_LIBRARY_PATH-unset} PYI=${_PYI_ARCHIVE_FILE-unset} TMP=${TMPDIR-unset} in $PWD"
    schedule.write_bytes(
        fw.firewheel_pickle(
            [
                fw.run_executable(-2, "cd", probe),
                fw.run_executable(-1.5, str(frozen), "--version"),
                fw.run_executable(-1, "no-such-program-xyz"),
                fw.run_executable(0.1, "/bin/echo", "fired"),
            ]
        )
    )
    report = tmp_path / "report.jsonl"
    unpack = tmp_path / "unpack"
    unpack.mkdir()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(unpack)}
    if original is not None:
        env["LD_LIBRARY_PATH"] = original
    args = ["run", "--local", str(schedule), "--start-buffer", "0.2", "--launch-dir", str(tmp_path / "l")]
    args += ["--state-dir", str(tmp_path / "s"), "--report", str(report)]
    res = subprocess.run([str(frozen), *args], capture_output=True, text=True, timeout=WAIT, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    events = _report(report)
    lines = [
        e["data"].get("line") for e in events if e["type"] == "output" and e["data"]["stream"] == "stdout"
    ]
    assert lines == [
        f"LD={original or 'unset'} PYI=unset TMP=unset in /",
        f"vmr-handler {vmr_handler.__version__}",
        "signature checks: built in (Ed25519, cryptography)",
        "fired",
    ]
    exited = {e["data"]["index"]: e["data"] for e in events if e["type"] == "entry_exited"}
    assert exited[1]["exit_code"] == 0
    assert exited[2]["exit_code"] == 127 and "'no-such-program-xyz' was not found" in exited[2]["details"]
    assert list(unpack.iterdir()) == [], "the agent's unpacked copy is removed when it ends"


def _wait(pred: Any, what: str, procs: List[subprocess.Popen], logs: List[Path]) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if pred():
            return
        for p in procs:
            if p.poll() is not None:
                break
        else:
            time.sleep(0.1)
            continue
        break
    raise AssertionError(f"{what}:\n" + "\n".join(f"--- {lg}\n{lg.read_text()[-2000:]}" for lg in logs))


@pytest.fixture
def lab() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="vf"))  # short: unix socket paths < 108 bytes
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("build", ["frozen", "unsigned"])
def test_connected_to_real_host(build: str, request: pytest.FixtureRequest, lab: Path) -> None:
    """The single file (and the one built ``--without-signatures``, with no key) plays its
    schedule under a real ``vmr-host serve`` over a unix socket."""
    frozen = request.getfixturevalue(build)
    d, logs, ch = lab / "D", lab / "L", lab / "C"
    unpack = _unpack_dir()
    for p in (d, logs, ch):
        p.mkdir()
    (d / "vm1.yaml").write_text(
        yaml.safe_dump([{"start_time": 0.5, "executable": "/bin/echo", "arguments": "frozen agent"}])
    )
    host_out, agent_out = lab / "host.out", lab / "agent.out"
    procs: List[subprocess.Popen] = []
    try:
        with host_out.open("wb") as ho:
            host = subprocess.Popen(
                [sys.executable, "-m", "vmr_handler.host", "serve", "--schedules", str(d), "--logs",
                 str(logs), "--channels", str(ch), "--start-buffer", "0.5"],
                stdout=ho, stderr=ho, cwd=REPO,
            )  # fmt: skip
        procs.append(host)
        _wait(lambda: (ch / "vm1.sock").exists(), "host channel socket", procs, [host_out])
        with agent_out.open("wb") as ao:
            agent = subprocess.Popen(
                [str(frozen), "run", "--port", f"unix:{ch}/vm1.sock", "--vm-name", "vm1",
                 "--state-dir", str(lab / "st"), "--launch-dir", str(lab / "la")],
                stdout=ao, stderr=ao, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(unpack)},
            )  # fmt: skip
        procs.append(agent)
        log = logs / "vm1.jsonl"

        def complete() -> bool:
            if not log.exists():
                return False
            return any(
                json.loads(line)["event"]["type"] == "schedule_complete"
                for line in log.read_text().splitlines()
                if line.endswith("}")
            )

        _wait(complete, "schedule_complete in the host's vm1 log", procs, [host_out, agent_out])
        text = log.read_text()
        assert "frozen agent" in text  # the entry's output was streamed to the host
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert agent.returncode == 0, agent_out.read_text()[-2000:]
    assert list(unpack.iterdir()) == [], "the frozen agent left its unpacked copy behind"


def test_frozen_agent_over_mqtts_with_signed_control(frozen: Path, lab: Path) -> None:
    """The bundle carries ssl (mqtts) and cryptography (signature checks): a frozen agent with
    only its fw_cfg blob and the host's public key plays a signed schedule over TLS."""
    import getpass

    from tests.broker import Broker, free_port

    d, logs, mq, keys = lab / "D", lab / "L", lab / "mq", lab / "keys"
    d.mkdir()
    (d / "vm1.yaml").write_text(
        yaml.safe_dump([{"start_time": 0.5, "executable": "/bin/echo", "arguments": "frozen, signed, tls"}])
    )
    port = free_port()
    for args in (
        ["mqtt-config", "--experiment", "fz", "--vms", "vm1", "--out", str(mq), "--tls", "--tls-port",
         str(port), "--user", getpass.getuser()],
        ["keygen", "--out", str(keys)],
    ):  # fmt: skip
        cmd = [sys.executable, "-m", "vmr_handler.host", *args]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    broker = Broker(root=mq, config=mq / "mosquitto.conf", port=port).start()
    host_out, agent_out = lab / "host.out", lab / "agent.out"
    procs: List[subprocess.Popen] = []
    try:
        host_cmd = [
            sys.executable, "-m", "vmr_handler.host", "serve", "--schedules", str(d), "--logs", str(logs),
            "--start-buffer", "0.5", "--transport", "mqtt",
            "--credentials", str(mq / "host" / "vmr-host.yaml"), "--signing-key", str(keys / "host.key"),
        ]  # fmt: skip
        agent_cmd = [
            str(frozen), "run", "--fw-cfg", str(mq / "vms" / "vm1.yaml"),
            "--public-key", str(keys / "host.pub"),
            "--state-dir", str(lab / "st"), "--launch-dir", str(lab / "la"),
        ]  # fmt: skip
        with host_out.open("wb") as ho:
            procs.append(subprocess.Popen(host_cmd, stdout=ho, stderr=ho, cwd=REPO))
        with agent_out.open("wb") as ao:
            env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(_unpack_dir())}
            procs.append(subprocess.Popen(agent_cmd, stdout=ao, stderr=ao, env=env))
        log = logs / "vm1.jsonl"

        def complete() -> bool:
            return log.exists() and '"schedule_complete"' in log.read_text()

        _wait(complete, "schedule_complete over mqtts", procs, [host_out, agent_out])
        text = log.read_text()
        assert "frozen, signed, tls" in text and "control_refused" not in text
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        broker.close()


def _ended(proc: psutil.Process) -> bool:
    """Gone, or a zombie waiting for its new parent to reap it (it runs nothing any more)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class _Killable:
    """A single-file agent playing a long entry, with its own temp root for the unpack."""

    def __init__(self, exe: Path, root: Path) -> None:
        self.exe, self.root = exe, root
        self.unpack = root / "tmp"
        self.unpack.mkdir(parents=True, exist_ok=True)
        self.schedule = root / "s.yaml"
        self.schedule.write_text(
            yaml.safe_dump(
                [
                    {"start_time": -5, "executable": "/bin/echo", "arguments": "once"},
                    {"start_time": -4, "executable": "/bin/sleep", "arguments": "300"},
                ]
            )
        )

    def copies(self) -> List[str]:
        return sorted(p.name for p in self.unpack.glob("_MEI*"))

    def start(self, report: Path) -> subprocess.Popen:
        cmd = [str(self.exe), "run", "--local", str(self.schedule), "--state-dir", str(self.root / "st"),
               "--launch-dir", str(self.root / "la"), "--report", str(report), "--quiet"]  # fmt: skip
        proc = subprocess.Popen(
            cmd, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(self.unpack)}, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + WAIT
        while '"index": 1' not in (report.read_text() if report.exists() else "") or "entry_started" not in (
            report.read_text()
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "the agent never started entry 1"
            time.sleep(0.02)
        return proc


def test_killed_bootloader_ends_the_agent_and_ten_kills_leave_one_copy(frozen: Path, lab: Path) -> None:
    """SIGKILL of the bootloader parent (a service manager's ``kill -9 <main pid>``): the agent
    gets SIGTERM from the kernel and ends cleanly (entry interrupted, journal flushed), and the
    next start removes the copy the dead bootloader could not. Ten times in a row, then one
    start that proves the journal intact (the finished entry 0 is not run again)."""
    agent = _Killable(frozen, lab)
    ended_ms: List[float] = []
    for round_ in range(10):
        report = lab / f"r{round_}.jsonl"
        boot = agent.start(report)
        children = psutil.Process(boot.pid).children()
        assert len(children) == 1, "the single file runs as bootloader + agent"
        os.kill(boot.pid, signal.SIGKILL)
        killed = time.monotonic()
        boot.wait()
        while not _ended(children[0]):
            assert time.monotonic() - killed < 10, f"round {round_}: the agent outlived its bootloader"
            time.sleep(0.005)
        ended_ms.append((time.monotonic() - killed) * 1000)
        events = _report(report)
        last = events[-1]
        assert last["type"] == "agent_stopped" and last["data"]["reason"] == "signal SIGTERM", last
        assert any(e["type"] == "entry_interrupted" and e["data"]["index"] == 1 for e in events)
        assert len(agent.copies()) <= 1, f"round {round_}: {agent.copies()}"
        stderr = boot.stderr.read().decode() if boot.stderr else ""
        if round_:
            assert "removed the unpacked copy of a killed instance" in stderr, stderr
    print(f"agent ended after its bootloader's SIGKILL: {min(ended_ms):.0f}-{max(ended_ms):.0f} ms")
    final = lab / "final.jsonl"
    boot = agent.start(final)
    started = [e["data"]["index"] for e in _report(final) if e["type"] == "entry_started"]
    assert started == [1], "the finished entry 0 ran again: the journal was not intact"
    boot.send_signal(signal.SIGTERM)  # forwarded by the bootloader; it removes the copy at exit
    assert boot.wait(timeout=WAIT) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    assert agent.copies() == [], "a clean stop leaves nothing behind"


def test_killed_agent_copy_removed_by_its_bootloader(frozen: Path, lab: Path) -> None:
    """SIGKILL of the agent itself (the OOM killer's choice): the bootloader sees its child die,
    removes the unpacked copy and exits; no orphan, nothing left."""
    agent = _Killable(frozen, lab)
    boot = agent.start(lab / "r.jsonl")
    (child,) = psutil.Process(boot.pid).children()
    assert len(agent.copies()) == 1
    child.kill()
    boot.wait(timeout=WAIT)
    assert agent.copies() == []
    # the entry's sleep outlives a SIGKILLed agent (as with the package); end it here
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.cwd().startswith(str(lab)):
                proc.kill()
