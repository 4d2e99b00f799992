"""Benchmarks of the frozen agent in real TCG guests. Not a test: it prints figures
and never fails on slowness (pytest does not collect it: the name does not start with ``test``).

    .venv/bin/python qemu-test/bench_guest.py [--runs N] [--host-repeats N] [--json FILE]

Builds the frozen agent and the busybox guest twice (``guestlab.build_guest``, as the qemu tests
do): with the single file ``packaging/build.sh`` makes by default, and with the ``--onedir``
bundle. Every figure below is measured for both, side by side (runs alternate between them):

- **size** of the agent (bytes on disk, files, ``.tar.gz``) and of the guest initramfs;
- **``vmr-handler --version`` on the host**: warm, and cold (every file of the bundle evicted
  from the page cache with ``posix_fadvise(DONTNEED)`` before each run; glibc stays cached);
  baselines ``python -c pass`` (the interpreter the bundle was built from) and the package's
  own ``vmr-handler --version``;
- per run, one experiment: ``vmr-host serve`` with 2 TCG guests booted at once (``vm1``, and
  ``vm2`` with the ``vmr.timing`` kernel knob: its ``/init`` times ``--version`` cold and warm
  before it starts the agent) and, as the baseline, the same frozen bundle run on the host
  (``host``, connected over a unix socket). Schedule: a negative stage (``true``), ``true`` at
  +1 (spread), an RSS probe at +2 (walks up from its own shell to the ``vmr-handler`` process and
  prints its ``/proc/<pid>/status`` VmRSS/VmHWM), a break at +3 and ``true`` at +3.01. Figures:
  QEMU start -> ``/init`` starts the agent (host clock, when the console line appears: the bare
  busybox boot) and -> the host receives ``configured``; the entry at +1: per VM
  ``|spawned_at - scheduled|`` and the cross-VM spread of ``spawned_at`` (the agents'
  host-corrected clocks) and of the host's receive times; agent RSS; RESUME latency
  (``vmr-host resume --all`` issued -> ``spawned_at`` of the entry after the break).

At most 2 guests run at once. The machine is shared: read ranges, not single numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import guestlab as gl  # noqa: E402

from tests.hostenv import HostEnv  # noqa: E402

WAIT = 240.0
GUESTS = ("vm1", "vm2")
TIMING_VM = "vm2"  # booted with vmr.timing
HOST_VM = "host"  # the frozen bundle on the host, the baseline

# Walks up from the probe's shell to the agent (the executor runs `/bin/sh -c 'cd D && ...'`,
# so the agent is an ancestor) and prints the agent's memory figures on one line.
RSS_PROBE = (
    '-c \'p=$$; while [ "$p" -gt 1 ] && [ "$(cat /proc/$p/comm)" != vmr-handler ]; do '
    'p=$(sed -n "s/^PPid:[[:space:]]*//p" /proc/$p/status); done; '
    'echo agent $p $(grep -E "^(VmRSS|VmHWM|RssAnon|RssFile|Threads):" /proc/$p/status | tr -s " \\t" " ")\''
)


#: ``vmr-handler --version`` started this many times in a row by an entry of each guest (index 5)
VERSION_SERIES = 6
# Each run's start and end by the guest's /proc/uptime (10 ms steps), one output line per run.
VERSION_PROBE = (
    f'-c \'for i in $(seq {VERSION_SERIES}); do s=$(cut -d" " -f1 /proc/uptime); '
    "/usr/local/bin/vmr-handler --version >/dev/null; "
    'echo version-run $s $(cut -d" " -f1 /proc/uptime); done\''
)


def schedule(guest: bool = True) -> List[Dict[str, Any]]:
    """The one schedule every VM runs (see the module docstring); a ``guest`` also times
    :data:`VERSION_SERIES` starts of the agent's own executable (entry 5, after the RESUME)."""
    entries: List[Dict[str, Any]] = [
        {"start_time": -1, "executable": "true"},  # 0: one configuration stage
        {"start_time": 1, "executable": "true"},  # 1: the spread entry
        {"start_time": 2, "executable": "/bin/sh", "arguments": RSS_PROBE},  # 2: agent RSS
        {"start_time": 3, "pause": True, "pause_duration": float("inf")},  # 3: a break
        {"start_time": 3.01, "executable": "true"},  # 4: fires 10 ms after the RESUME
    ]
    if guest:
        entries.append({"start_time": 3.5, "executable": "/bin/sh", "arguments": VERSION_PROBE})  # 5
    return entries


# ---------------------------------------------------------------------------- small helpers
def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def fmt(values: Sequence[float], unit: str, scale: float = 1.0, digits: int = 1) -> str:
    """``p50 X (min-max, n)`` of ``values`` times ``scale``."""
    if not values:
        return "n/a"
    v = [x * scale for x in values]
    if len(v) == 1:
        return f"{v[0]:.{digits}f} {unit} (n=1)"
    return f"p50 {pct(v, 50):.{digits}f} {unit} ({min(v):.{digits}f}-{max(v):.{digits}f}, n={len(v)})"


def data(env: HostEnv, vm: str, type_: str, **match: Any) -> List[Dict[str, Any]]:
    """``data`` of the VM's logged events of ``type_`` whose fields equal ``match``."""
    return [
        r["event"]["data"]
        for r in env.events(vm, type_)
        if all(r["event"]["data"].get(k) == v for k, v in match.items())
    ]


def received(env: HostEnv, vm: str, type_: str, **match: Any) -> Optional[float]:
    """Host receive time (epoch s) of the VM's first event of ``type_`` matching ``match``."""
    for r in env.events(vm, type_):
        if all(r["event"]["data"].get(k) == v for k, v in match.items()):
            return gl.utc(r["host_received"])
    return None


def evict(root: Path) -> None:
    """Drop every file under ``root`` from the page cache (clean pages only; nothing else)."""
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(cmd: Sequence[str], repeats: int, before: Optional[Callable[[], None]] = None) -> List[float]:
    """Wall time (s) of ``repeats`` runs of ``cmd`` (output discarded); ``before`` runs first each time."""
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=60)
        out.append(time.perf_counter() - t0)
    return out


def du(root: Path) -> Dict[str, int]:
    """Bytes (apparent), 512-byte blocks on disk, files, and the ``.tar.gz`` size of ``root``
    (a directory, or one file)."""
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    with tempfile.TemporaryDirectory(prefix="vhb") as tmp:
        tgz = Path(tmp) / "b.tar.gz"
        with tarfile.open(tgz, "w:gz") as tar:
            tar.add(root, arcname=root.name)
        tgz_size = tgz.stat().st_size
    return {
        "bytes": sum(p.stat().st_size for p in files),
        "disk": sum(p.stat().st_blocks * 512 for p in files),
        "files": len(files),
        "tgz": tgz_size,
    }


# ---------------------------------------------------------------------------- one experiment
class Run:
    """One experiment: vmr-host, 2 guests and the frozen agent on the host; figures in ``fig``."""

    def __init__(self, guest: Dict[str, Any], exe: Path, vmr_host: str) -> None:
        """Nothing starts yet (:meth:`go`). ``exe``: the frozen agent (single file or onedir executable)."""
        self.guest = guest
        self.exe = exe
        self.vmr_host = vmr_host
        self.env = HostEnv(
            {**{vm: schedule() for vm in GUESTS}, HOST_VM: schedule(guest=False)}, start_buffer=2.0
        )
        self.qemus: Dict[str, gl.Qemu] = {}
        self.agent: Optional[subprocess.Popen] = None
        self.fig: Dict[str, Any] = {}

    def _wait(self, pred: Callable[[], Any], what: str, on_tick: Optional[Callable[[], None]] = None) -> None:
        def check() -> Any:
            for q in self.qemus.values():
                if q.proc.poll() is not None:
                    raise RuntimeError(f"QEMU {q.vm} exited {q.proc.returncode}\n{q.tail()}")
            if on_tick is not None:
                on_tick()
            return pred()

        try:
            self.env.wait_for(check, what, timeout=WAIT)
        except AssertionError as exc:
            tails = "\n".join(q.tail() for q in self.qemus.values())
            raise RuntimeError(f"{exc}\n{tails}") from None

    def go(self) -> Dict[str, Any]:
        """Boot, run to the break, RESUME, run to the end; return the figures."""
        env = self.env
        env.start_host()
        for vm in GUESTS:
            if vm == TIMING_VM:
                self.qemus[vm] = gl.QemuAppend(
                    env, vm, self.guest["kernel"], self.guest["initrd"], "vmr.timing"
                )
            else:
                self.qemus[vm] = gl.Qemu(env, vm, self.guest["kernel"], self.guest["initrd"])
        base = env.root / HOST_VM
        t_agent = time.time()
        with open(env.root / "host-agent.out", "wb") as log:
            self.agent = subprocess.Popen(
                [
                    str(self.exe),
                    "run",
                    "--quiet",
                    "--port",
                    f"unix:{env.sock(HOST_VM)}",
                    "--vm-name",
                    HOST_VM,
                    "--state-dir",
                    str(base / "state"),
                    "--launch-dir",
                    str(base / "launch"),
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        init_seen: Dict[str, float] = {}

        def watch_consoles() -> None:
            for vm, q in self.qemus.items():
                if (
                    vm not in init_seen
                    and q.console.exists()
                    and "starting vmr-handler" in q.console.read_text(errors="replace")
                ):
                    init_seen[vm] = time.time()

        vms = (*GUESTS, HOST_VM)
        self._wait(
            lambda: all(
                data(env, vm, "break_started") and data(env, vm, "entry_exited", index=2) for vm in vms
            ),
            "every VM at the break, RSS probe done",
            watch_consoles,
        )
        time.sleep(0.5)
        t_cli = time.time()
        res = subprocess.run(
            [self.vmr_host, "resume", "--all", "--logs", str(env.logs)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        t_cli_done = time.time()
        if res.returncode != 0:
            raise RuntimeError(f"vmr-host resume failed: {res.stdout}{res.stderr}")
        self._wait(
            lambda: all(data(env, vm, "entry_started", index=4) for vm in vms), "the entry after the break"
        )
        self._wait(
            lambda: all(data(env, vm, "entry_exited", index=5) for vm in GUESTS), "the --version series"
        )

        fig: Dict[str, Any] = {
            "boot_init": {},
            "boot_configured": {},
            "lateness": {},
            "rss": {},
            "resume": {},
        }
        for vm, q in self.qemus.items():
            if vm in init_seen:
                fig["boot_init"][vm] = init_seen[vm] - q.started
            text = q.console.read_text(errors="replace")
            ups = re.findall(r"uptime ([0-9.]+) s, starting vmr-handler", text)
            if ups:
                fig.setdefault("uptime_init", {})[vm] = float(ups[0])
            if vm == TIMING_VM:
                real = re.findall(r"--version (cold|warm):.*?real\s+(\d+)m\s*([0-9.]+)s", text, re.S)
                fig["guest_version"] = {run: int(m) * 60 + float(s) for run, m, s in real}
        for vm in vms:
            t0 = self.qemus[vm].started if vm in self.qemus else t_agent
            t_conf = received(env, vm, "configured")
            if t_conf is not None:
                fig["boot_configured"][vm] = t_conf - t0
            ent = data(env, vm, "entry_started", index=1)[0]
            fig["lateness"][vm] = ent["spawned_at"] - ent["scheduled"]
            fig.setdefault("spawned", {})[vm] = ent["spawned_at"]
            fig.setdefault("rx", {})[vm] = received(env, vm, "entry_started", index=1)
            line = self._lines(vm, 2)
            m = re.search(r"VmRSS: (\d+) kB", line)
            h = re.search(r"VmHWM: (\d+) kB", line)
            if m:
                fig["rss"][vm] = {
                    "rss_kb": int(m.group(1)),
                    "hwm_kb": int(h.group(1)) if h else None,
                    "line": line,
                }
            fig["resume"][vm] = data(env, vm, "entry_started", index=4)[0]["spawned_at"] - t_cli
        fig["version_series"] = {
            vm: [
                float(b) - float(a)
                for a, b in re.findall(r"version-run ([0-9.]+) ([0-9.]+)", self._lines(vm, 5))
            ]
            for vm in GUESTS
        }
        fig["resume_cli"] = t_cli_done - t_cli
        sp = [fig["spawned"][vm] for vm in GUESTS]
        rx = [fig["rx"][vm] for vm in GUESTS if fig["rx"][vm] is not None]
        fig["spread"] = max(sp) - min(sp)
        fig["spread_rx"] = max(rx) - min(rx) if len(rx) == len(GUESTS) else None
        return fig

    def _lines(self, vm: str, index: int) -> str:
        """The output lines of entry ``index`` on ``vm``, joined with spaces."""
        return " ".join(d.get("line", "") for d in data(self.env, vm, "output", index=index))

    def close(self) -> None:
        """Kill QEMU by PID, stop the host agent (SIGTERM, then SIGKILL) and vmr-host."""
        for q in self.qemus.values():
            q.kill()
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
        self.env.close()


# ---------------------------------------------------------------------------- main
KINDS = ("onefile", "onedir")
LABEL = {"onefile": "single file", "onedir": "onedir"}


#: PyInstaller's archive typecodes of what a single file writes to its ``_MEI*`` directory at every
#: start: binaries, extension modules, data files, symlinks (the PYZ, the scripts, the bootstrap
#: modules and the options are read from the file in place)
UNPACKED_TYPECODES = frozenset("bxl")


def unpacked(exe: Path) -> Dict[str, int]:
    """What the single file ``exe`` unpacks at each start: ``{"files", "bytes"}`` (bytes as
    written, uncompressed), from its archive's table of contents; ``{}`` for an onedir executable."""
    from PyInstaller.archive.readers import CArchiveReader, NotAnArchiveError

    if (exe.parent / "_internal").is_dir():
        return {}
    try:
        toc = CArchiveReader(str(exe)).toc
    except NotAnArchiveError:
        return {}
    # each entry: (offset, compressed length, uncompressed length, compressed?, typecode)
    parts = [entry[2] for entry in toc.values() if entry[4] in UNPACKED_TYPECODES]
    return {"files": len(parts), "bytes": sum(parts)}


def measure_host(exe: Path, repeats: int) -> Dict[str, Any]:
    """Size, what it unpacks, and ``--version`` warm/cold on the host for one kind of build."""
    root = exe.parent if (exe.parent / "_internal").is_dir() else exe  # the bundle dir, or the file
    cmd = [str(exe), "--version"]
    timed(cmd, 2)  # warm the cache
    return {
        "size": du(root),
        "unpacked": unpacked(exe),
        "host_warm": timed(cmd, repeats),
        "host_cold": timed(cmd, max(3, repeats // 2), before=lambda: evict(root)),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Build both kinds, measure, print the table (and ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="experiments per kind (2 guests each), default 2")
    ap.add_argument("--host-repeats", type=int, default=20, help="host --version runs per figure, default 20")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    args = ap.parse_args(argv)

    t_all = time.monotonic()
    builders = {kind: gl.build_guest(onedir=kind == "onedir") for kind in KINDS}
    vmr_host = str(Path(sys.executable).parent / "vmr-host")
    out: Dict[str, Any] = {"runs": 0}
    try:
        guests = {kind: next(builder) for kind, builder in builders.items()}
        for kind, guest in guests.items():
            exe = Path(guest["agent"])
            if not exe.is_file():
                raise SystemExit(f"no frozen agent at {exe}")
            fig = measure_host(exe, args.host_repeats)
            fig.update(build=guest["timings"], initrd_bytes=Path(guest["initrd"]).stat().st_size, runs=[])
            out[kind] = fig
            print(f"{LABEL[kind]}: --version on the host warm {fmt(fig['host_warm'], 'ms', 1000)}, "
                  f"cold {fmt(fig['host_cold'], 'ms', 1000)}", file=sys.stderr, flush=True)  # fmt: skip
        out["host_python_pass"] = timed([sys.executable, "-c", "pass"], args.host_repeats)
        out["host_package_version"] = timed(
            [str(Path(sys.executable).parent / "vmr-handler"), "--version"], args.host_repeats
        )
        for i in range(args.runs):
            for kind in KINDS:  # alternate, so that the machine's load falls on both alike
                one_run(out[kind], guests[kind], vmr_host, f"run {i + 1}/{args.runs} {LABEL[kind]}")
        out["runs"] = args.runs
    finally:
        for builder in builders.values():
            for _ in builder:  # removes the build directory
                pass
    out["wall"] = time.monotonic() - t_all
    print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


def one_run(into: Dict[str, Any], guest: Dict[str, Any], vmr_host: str, label: str) -> None:
    """One experiment with ``guest``; its figures (or its error) appended to ``into["runs"]``."""
    run = Run(guest, Path(guest["agent"]), vmr_host)
    t0 = time.monotonic()
    try:
        fig = run.go()
    except Exception as exc:  # one broken run is reported, the others still count
        print(f"{label}: FAILED: {exc}", file=sys.stderr, flush=True)
        into["runs"].append({"error": str(exc)[:2000]})
        return
    finally:
        run.close()
    fig["wall"] = time.monotonic() - t0
    into["runs"].append(fig)
    print(
        f"{label}: {fig['wall']:.1f} s; configured "
        + ", ".join(f"{vm} {v:.1f} s" for vm, v in fig["boot_configured"].items())
        + f"; spread {fig['spread'] * 1000:.1f} ms; RESUME "
        + ", ".join(f"{vm} {v * 1000:.0f} ms" for vm, v in fig["resume"].items()),
        file=sys.stderr,
        flush=True,
    )


COLD = "`--version` on the host, cold (agent evicted from the page cache)"


def kind_rows(k: Dict[str, Any]) -> List[tuple]:
    """(what, value) rows for one kind of build (its ``out[kind]``)."""
    runs = [r for r in k["runs"] if "error" not in r]
    sz = k["size"]

    def col(key: str, vm: str) -> List[float]:
        return [r[key][vm] for r in runs if vm in r.get(key, {})]

    rows = [
        ("agent size", f"{sz['bytes'] / 1e6:.1f} MB, {sz['files']} file(s); "
                       f".tar.gz {sz['tgz'] / 1e6:.1f} MB"),
        ("initramfs with it", f"{k['initrd_bytes'] / 1e6:.1f} MB"),
        ("unpacked at each start (to a new `_MEI*` directory)",
         f"{k['unpacked']['bytes'] / 1e6:.1f} MB, {k['unpacked']['files']} files" if k.get("unpacked")
         else "nothing: runs in place"),
        ("`--version` on the host, warm", fmt(k["host_warm"], "ms", 1000, 0)),
        (COLD, fmt(k["host_cold"], "ms", 1000, 0)),
        ("`--version` in a TCG guest, cold (first run after boot)",
         fmt([r["guest_version"]["cold"] for r in runs if "cold" in r.get("guest_version", {})], "s", 1, 2)),
        ("`--version` in a TCG guest, warm",
         fmt([r["guest_version"]["warm"] for r in runs if "warm" in r.get("guest_version", {})], "s", 1, 2)),
        (f"`--version` in a TCG guest, {VERSION_SERIES} in a row by an entry (agent idle; both guests)",
         fmt([t for r in runs for vm in GUESTS for t in r.get("version_series", {}).get(vm, [])], "s", 1, 2)),
    ]  # fmt: skip
    for vm in GUESTS:
        note = " (+`vmr.timing`: 2 x `--version` first)" if vm == TIMING_VM else ""
        rows.append((f"QEMU start → host receives `configured`, {vm}{note}",
                     fmt(col("boot_configured", vm), "s")))  # fmt: skip
        rows.append((f"QEMU start → `/init` starts the agent, {vm}", fmt(col("boot_init", vm), "s")))
    rows.append(("agent on the host: process start → host receives `configured`",
                 fmt(col("boot_configured", HOST_VM), "s", 1, 2)))  # fmt: skip
    late = [abs(r["lateness"][vm]) for r in runs for vm in GUESTS]
    rows.append(("entry at +1: `\\|spawned_at - scheduled\\|` per guest", fmt(late, "ms", 1000)))
    spread = [r["spread"] for r in runs]
    rows.append(("entry at +1: spread of `spawned_at` across the 2 guests", fmt(spread, "ms", 1000)))
    rss = [r["rss"][vm]["rss_kb"] / 1024 for r in runs for vm in GUESTS if vm in r["rss"]]
    hwm = [r["rss"][vm]["hwm_kb"] / 1024 for r in runs for vm in GUESTS if r["rss"].get(vm, {}).get("hwm_kb")]
    rows.append(("agent RSS in the guest (VmRSS at +2 s; peak VmHWM)",
                 fmt(rss, "MiB") + "; peak " + fmt(hwm, "MiB")))  # fmt: skip
    rows.append(("RESUME: `vmr-host resume --all` issued → guest entry forked",
                 fmt([r["resume"][vm] for r in runs for vm in GUESTS], "ms", 1000, 0)))  # fmt: skip
    return rows


def print_table(out: Dict[str, Any]) -> None:
    """The figures as a markdown table: single file | onedir | baseline."""
    baseline = {
        "`--version` on the host, warm": "`python -c pass` " + fmt(out["host_python_pass"], "ms", 1000, 0),
        COLD: "package `vmr-handler --version` warm " + fmt(out["host_package_version"], "ms", 1000, 0),
    }  # fmt: skip
    columns = {kind: dict(kind_rows(out[kind])) for kind in KINDS}
    print()
    failed = {kind: sum(1 for r in out[kind]["runs"] if "error" in r) for kind in KINDS}
    print(
        f"{out['runs']} runs per kind"
        + "".join(f" ({n} {LABEL[kind]} runs failed)" for kind, n in failed.items() if n)
        + f", {out['wall']:.0f} s in all; builds: "
        + ", ".join(
            f"{LABEL[kind]} agent {out[kind]['build'].get('agent_build', 0):.1f} s + guest "
            f"{out[kind]['build'].get('guest_build', 0):.1f} s"
            for kind in KINDS
        )
    )
    print()
    print(f"| what | {LABEL['onefile']} | {LABEL['onedir']} | baseline |")
    print("| --- | --- | --- | --- |")
    for what in columns["onefile"]:
        one, dir_ = columns["onefile"][what], columns["onedir"].get(what, "")
        print(f"| {what} | {one} | {dir_} | {baseline.get(what, '')} |")


if __name__ == "__main__":
    if shutil.which("qemu-system-x86_64") is None and shutil.which("apt-get") is None:
        raise SystemExit("needs qemu-system-x86_64")
    sys.exit(main())
