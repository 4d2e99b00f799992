"""The single-file agent's own run time (vmr_handler/agent/machine/bundle.py), without building it.

Real directories, real ``flock`` held by real processes, real ``prctl``: which unpacked copies
are removed (only this program's, only dead ones), what entries inherit, the parent watch.
The frozen build itself is exercised in tests/test_frozen.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from vmr_handler.agent.machine import bundle

HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)


def _copy(root: Path, name: str, *, ours: bool = True, lock: bool = True, age: float = 0.0) -> Path:
    """An unpacked copy as the bootloader leaves it: some files, our metadata, the agent's lock."""
    path = root / name
    (path / "psutil").mkdir(parents=True)
    (path / "libpython3.11.so.1.0").write_bytes(b"\x7fELF" + b"\0" * 1000)
    if ours:
        (path / "vmr_handler-0.1.0.dist-info").mkdir()
        (path / "vmr_handler-0.1.0.dist-info" / "METADATA").write_text("Name: vmr-handler\n")
    else:
        (path / "other_app-2.0.dist-info").mkdir()
    if lock:
        (path / bundle.LOCK_NAME).touch()
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


@pytest.fixture
def holders() -> Iterator[List[subprocess.Popen]]:
    procs: List[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _hold(lock: Path, holders: List[subprocess.Popen]) -> None:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    holders.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"


def test_removes_only_dead_copies_of_this_program(tmp_path: Path, holders: List[subprocess.Popen]) -> None:
    own = _copy(tmp_path, "_MEI0001own")
    dead = _copy(tmp_path, "_MEI0002dead")
    live = _copy(tmp_path, "_MEI0003live")
    _hold(live / bundle.LOCK_NAME, holders)
    foreign = _copy(tmp_path, "_MEI0004foreign", ours=False, lock=False, age=3600)
    starting = _copy(tmp_path, "_MEI0005starting", lock=False)  # unpacked, not yet locked
    killed_early = _copy(tmp_path, "_MEI0006early", lock=False, age=bundle.STALE_AFTER + 60)
    not_mei = _copy(tmp_path, "vmr-state", age=3600)

    report = bundle.remove_stale_unpacks(str(own))

    assert sorted(p for p, _ in report.removed) == sorted([str(dead), str(killed_early)])
    assert all(size > 1000 for _, size in report.removed)
    assert report.failed == []
    for kept in (own, live, foreign, starting, not_mei):
        assert kept.is_dir(), kept
    assert not dead.exists() and not killed_early.exists()
    text = "\n".join(report.messages())
    assert f"removed the unpacked copy of a killed instance: {dead} (0.0 MB)" in text


def test_a_link_or_another_users_copy_is_never_followed_or_removed(tmp_path: Path) -> None:
    own = _copy(tmp_path, "_MEI0001own")
    target = _copy(tmp_path / "elsewhere", "_MEItarget")
    (tmp_path / "_MEI0002link").symlink_to(target)
    theirs = _copy(tmp_path, "_MEI0003theirs")
    os.chown(theirs, 12345, 12345)  # the tests run as root (CI does); skip the check otherwise
    report = bundle.remove_stale_unpacks(str(own))
    assert report.removed == [] and target.is_dir() and (tmp_path / "_MEI0002link").is_symlink()
    if os.geteuid() == 0:
        assert theirs.is_dir()


def test_claimed_copy_is_live_for_others(tmp_path: Path, holders: List[subprocess.Popen]) -> None:
    first = _copy(tmp_path, "_MEI0001first", lock=False)
    fd = bundle.claim_unpack_dir(str(first))
    try:
        second = _copy(tmp_path, "_MEI0002second", lock=False)
        assert bundle.remove_stale_unpacks(str(second)).removed == []
        assert first.is_dir()
        assert os.get_inheritable(fd) is False  # entries never inherit the lock
    finally:
        os.close(fd)
    assert [p for p, _ in bundle.remove_stale_unpacks(str(second)).removed] == [str(first)]


def test_unreadable_temp_root_is_reported_not_raised(tmp_path: Path) -> None:
    report = bundle.remove_stale_unpacks(str(tmp_path / "gone" / "_MEI0001"))
    assert report.removed == [] and report.failed and "gone" in report.failed[0][0]
    assert "remove it by hand" in report.messages()[0]


def test_package_and_onedir_do_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert bundle.unpack_home() is None and bundle.startup() == bundle.Startup()
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle" / "_internal"), raising=False)
    assert bundle.unpack_home() is None  # onedir: nothing was unpacked


def test_entries_get_the_environment_from_before_the_bootloader(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "unpack" / "_MEI00001234abcdef"
    home.mkdir(parents=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(home),
        "LD_LIBRARY_PATH_ORIG": "/opt/guest-libs",
        "_PYI_ARCHIVE_FILE": "/usr/local/bin/vmr-handler",
        "_PYI_APPLICATION_HOME_DIR": str(home),
        "_PYI_PARENT_PROCESS_LEVEL": "0",
        "TMPDIR": str(tmp_path / "unpack"),
        "HOME": "/root",
    }
    assert bundle.child_environment(dict(env)) == dict(env)  # the package: untouched
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(home), raising=False)
    assert bundle.child_environment(dict(env)) == {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/opt/guest-libs",
        "HOME": "/root",
    }
    own_tmp = {**env, "TMPDIR": "/var/tmp/mine"}
    del own_tmp["LD_LIBRARY_PATH_ORIG"]
    kept = {"PATH": "/usr/bin:/bin", "TMPDIR": "/var/tmp/mine", "HOME": "/root"}
    assert bundle.child_environment(own_tmp) == kept


WATCH = (
    "import os, signal, sys, time\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from vmr_handler.agent.machine import bundle\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('SIGTERM', flush=True), os._exit(0)))\n"
    "print('watched' if bundle.watch_bootloader() else 'not watched', flush=True)\n"
    "time.sleep(30)\n"
)


def test_parent_watch_only_for_the_same_executable(tmp_path: Path) -> None:
    """The parent is "our bootloader" only when it runs the same file as we do. A parent that
    exec's nothing (the shell's fork) runs the same file as the python child: the watch is set
    and its death delivers SIGTERM; a different parent executable gets no watch."""
    repo = str(Path(__file__).resolve().parent.parent)
    out = tmp_path / "out"
    # a python parent that forks a python child running WATCH, then dies by SIGKILL
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], stdout=open(sys.argv[3], 'w'))\n"
         "time.sleep(30)\n",
         WATCH, repo, str(out)],
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while "watched" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    while "SIGTERM" not in out.read_text():
        assert time.monotonic() < deadline + 10, f"no SIGTERM after the parent died: {out.read_text()!r}"
        time.sleep(0.05)
    assert out.read_text().splitlines() == ["watched", "SIGTERM"]
    # a parent that is another program (bash) is not a bootloader
    res = subprocess.run(
        ["bash", "-c", f"{sys.executable} -c \"$0\" {repo} & wait", WATCH.replace("time.sleep(30)", "pass")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.stdout.splitlines() == ["not watched"], res.stderr
