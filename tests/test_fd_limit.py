"""The open-files limit of ``vmr-host serve``: a real host started under a low
``RLIMIT_NOFILE`` (set in the child before exec).

* hard limit too low, and the host may not raise it (``CAP_SYS_RESOURCE`` dropped from the
  bounding set when the test runs as root): it refuses to start at once, exit 1, with one
  error naming the limit, the number needed and what to do, before opening any log;
* soft limit low, hard limit enough: it raises its soft limit itself and serves;
* with CAP_SYS_RESOURCE and a low hard limit: it raises the hard limit too (the decision,
  with the syscalls faked: this machine's root may not raise a hard limit).
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List

import psutil
import pytest
import yaml

from tests.hostenv import WAIT
from vmr_handler.core.errors import InvalidArgument
from vmr_handler.host.serve._fdlimit import fd_needs

pytestmark = pytest.mark.faults

VMS = 100
PR_CAPBSET_DROP = 24
CAP_SYS_RESOURCE = 24


def _setup(root: Path) -> List[str]:
    """``vmr-host serve`` of VMS VMs (listen mode) in ``root``."""
    schedules = root / "sch"
    for d in ("sch", "res", "logs", "ch"):
        (root / d).mkdir()
    for i in range(VMS):
        (schedules / f"vm{i:03d}.yaml").write_text(
            yaml.safe_dump([{"start_time": 1, "executable": "/bin/true"}])
        )
    return [
        sys.executable, "-m", "vmr_handler.host", "serve",
        "--schedules", str(schedules), "--resources", str(root / "res"),
        "--logs", str(root / "logs"), "--channels", str(root / "ch"), "--start-buffer", "60",
    ]  # fmt: skip


def _limited(soft: int, hard: int, drop_privilege: bool) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if drop_privilege and os.geteuid() == 0:  # root could raise its hard limit: not here
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE)")

    return preexec


def test_a_hard_limit_too_low_is_a_clear_error_at_start(tmp_path: Path) -> None:
    needs = fd_needs(VMS, "listen")
    assert needs.required == 64 + 256 + 3 * VMS
    res = subprocess.run(
        _setup(tmp_path),
        capture_output=True,
        text=True,
        timeout=WAIT,
        preexec_fn=_limited(200, 200, drop_privilege=True),
    )
    assert res.returncode == 1, res.stderr
    err = res.stderr
    assert "open-files limit is too low" in err, err
    assert f"needs about {needs.required} file descriptors" in err, err
    assert f"{VMS} VMs over listen" in err and "soft 200 / hard 200" in err, err
    assert f"ulimit -n {needs.wanted}" in err and f"LimitNOFILE={needs.wanted}" in err, err
    assert "Traceback" not in err and "EMFILE" not in err and "Too many open files" not in err, err
    assert not list((tmp_path / "logs").glob("*.jsonl"))  # refused before any log was opened


def _serve_and_read_limit(root: Path, soft: int, hard: int) -> tuple:
    """Start the host under (soft, hard), wait until it serves, return its limit then."""
    out = open(root / "host.out", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        _setup(root), stdout=out, stderr=subprocess.STDOUT, preexec_fn=_limited(soft, hard, False)
    )
    try:
        sock = root / "logs" / "vmr-host.sock"
        deadline = time.monotonic() + WAIT
        while not sock.exists():
            assert proc.poll() is None, (root / "host.out").read_text()
            assert time.monotonic() < deadline, "the host never opened its control socket"
            time.sleep(0.05)
        return psutil.Process(proc.pid).rlimit(psutil.RLIMIT_NOFILE), (root / "host.out").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=WAIT)
        out.close()


def test_a_low_soft_limit_is_raised_by_the_host_itself(tmp_path: Path) -> None:
    needs = fd_needs(VMS, "listen")
    (soft, hard), output = _serve_and_read_limit(tmp_path, 200, 4096)
    assert (soft, hard) == (needs.wanted, 4096), output
    assert "open-files limit" not in output  # raised quietly: enough, with room to spare


def test_a_host_that_may_raise_its_hard_limit_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # root with CAP_SYS_RESOURCE (not this machine's containers): the hard limit is raised too.
    # The syscalls are faked: this is the pure decision of ensure_fd_limit.
    from vmr_handler.host.serve import _fdlimit as fdlimit

    limits = {"now": (200, 200)}

    def setrlimit(which: int, value: tuple) -> None:
        limits["now"] = value

    monkeypatch.setattr(fdlimit.resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(fdlimit.resource, "setrlimit", setrlimit)
    needs = fd_needs(VMS, "listen")
    assert fdlimit.ensure_fd_limit(needs) == (needs.wanted, needs.wanted)
    assert limits["now"] == (needs.wanted, needs.wanted)


def test_fd_needs_by_mode() -> None:
    base = 64 + 256  # the process, and the readable logs open at once (host/logs/appendfiles.py)
    assert fd_needs(10_000, "mqtt").required == base + 10_000
    assert fd_needs(10_000, "mqtt").wanted == base + 3 * 10_000  # + a passing file + its .log
    assert fd_needs(10, "connect").required == base + 2 * 10
    assert fd_needs(10, "listen", http_per_vm=2).wanted == base + 3 * 10 + 4 * 10
    from vmr_handler.host.serve._fdlimit import readable_pool

    needs = fd_needs(5_000, "mqtt")  # soft enough for everything: every readable log stays open
    assert readable_pool(needs.wanted, needs, 5_000) == 5_000
    assert readable_pool(needs.wanted - 4_000, needs, 5_000) == 1_000
    assert readable_pool(needs.required, needs, 5_000) == 256  # the shared files counted in BASE
    assert readable_pool(-1, needs, 5_000) == 5_000
    with pytest.raises(InvalidArgument, match="unknown channel mode 'tcp'"):
        fd_needs(1, "tcp")
