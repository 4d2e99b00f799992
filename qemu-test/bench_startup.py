"""Start-up of several frozen agents side by side in ONE TCG guest. Not a test: it prints figures
(pytest does not collect it: the name does not start with ``test``).

    .venv/bin/python qemu-test/bench_startup.py [--rounds N] [--agent LABEL=PATH ...] [--json FILE]

``bench_guest.py`` compares the single file with onedir across separate guest boots, where the
shared machine's load differs from boot to boot. This boots one guest and times
``vmr-handler --version`` of every agent in turn, round after round (the order rotates each
round), so that the load falls on all of them alike. The agents: this tree's single file
(``file``), its single file built ``--without-signatures`` (``file-nosig``: no ``cryptography``)
and its ``--onedir`` bundle (``dir``), all built with ``packaging/build.sh``, and any
``--agent LABEL=PATH`` given (a single file or an onedir executable built elsewhere, e.g. from
another commit).

The guest is ``qemu-test/build-guest.sh``'s busybox initramfs with one more cpio archive appended
(the kernel unpacks concatenated archives in turn): the agents under ``/ab/<label>/`` and
``/ab.sh`` as the init (``rdinit=/ab.sh``), which mounts proc, devtmpfs and a tmpfs on ``/tmp`` (where a
single file unpacks), runs the rounds, prints each run's start and end by ``/proc/uptime`` (10 ms
steps) and powers off. The first round is a warm-up and is not counted. Figures per agent: p50
(min-max, n) of the wall time of one ``--version``; its difference from onedir's in the same
round (p50 and range: the load changes between rounds more than within one); for a single file,
what it unpacks at each start (``bench_guest.unpacked``). The machine's load average (1 min)
before and after the guest is printed with them: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import bench_guest as bg  # noqa: E402
import guestlab as gl  # noqa: E402

WAIT = 1800.0  # the whole guest, all rounds (about 2 s per run under TCG)

AB_INIT = """#!/bin/sh
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev  # /dev/urandom: Python seeds its hash from it this early in boot
mount -t tmpfs -o mode=1777 tmpfs /tmp
echo "ab: uptime $(cut -d' ' -f1 /proc/uptime) s, {rounds} rounds of: {labels}"
r=0
while [ "$r" -lt {rounds} ]; do
    r=$((r + 1))
    order="{labels}"
    i=0
    while [ "$i" -lt $(( (r - 1) % {count} )) ]; do  # rotate the order each round
        set -- $order; first=$1; shift; order="$* $first"; i=$((i + 1))
    done
    for label in $order; do
        s=$(cut -d' ' -f1 /proc/uptime)
        /ab/$label/vmr-handler --version >/dev/null || echo "ab: $label failed"
        echo "ab-run $r $label $s $(cut -d' ' -f1 /proc/uptime)"
        if [ -f /ab/$label/unpack-blocks ]; then  # a single file: as many bytes as its start writes
            s=$(cut -d' ' -f1 /proc/uptime)
            n=$(cat /ab/$label/unpack-blocks)
            dd if=/ab/$label/vmr-handler of=/tmp/ab.copy bs=65536 count="$n" 2>/dev/null
            echo "ab-copy $r $label $s $(cut -d' ' -f1 /proc/uptime)"
            rm -f /tmp/ab.copy
        fi
    done
done
echo "ab: done"
poweroff -f
"""


def build_unsigned(out: Path) -> Path:
    """This tree's single file built by ``packaging/build.sh --without-signatures`` into ``out``
    (with a private PyInstaller cache, as ``guestlab.build_guest``); the executable's path.

    Raises:
        RuntimeError: the build failed (its output's tail).
    """
    env = {**os.environ, "PYTHON": sys.executable, "VMR_BUILD_WORK": str(out / "pyi")}
    env["PYINSTALLER_CONFIG_DIR"] = str(out / "pyi-config")
    for name in ("VMR_PYI_MODE", "VMR_PYI_COMPRESS", "VMR_PYI_SIGNATURES", "VMR_RUNTIME_TMPDIR"):
        env.pop(name, None)
    build = [str(REPO / "packaging" / "build.sh"), "--without-signatures", str(out / "dist")]
    res = subprocess.run(
        ["bash", *build], capture_output=True, text=True, timeout=gl.BUILD_TIMEOUT, env=env, cwd=REPO
    )
    if res.returncode != 0:
        raise RuntimeError(f"build.sh --without-signatures failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return out / "dist" / "vmr-handler"


def agent_root(path: Path) -> Path:
    """The file or the onedir bundle directory to copy for the agent executable ``path``."""
    return path.parent if (path.parent / "_internal").is_dir() else path


def extra_initrd(agents: Dict[str, Path], rounds: int, out: Path, unpacks: Dict[str, Dict[str, int]]) -> None:
    """Write the appended cpio archive (newc, uncompressed) with the agents and ``/ab.sh``; a single
    file's ``unpack-blocks`` (64 KiB) beside it (``unpacks``: :func:`bench_guest.unpacked` per label)."""
    with tempfile.TemporaryDirectory(prefix="vhab") as tmp:
        root = Path(tmp)
        for label, exe in agents.items():
            src, dest = agent_root(exe), root / "ab" / label
            if src.is_dir():
                shutil.copytree(src, dest, symlinks=True)
            else:
                dest.mkdir(parents=True)
                shutil.copy2(src, dest / "vmr-handler")
            if unpacks.get(label):
                (dest / "unpack-blocks").write_text(str(-(-unpacks[label]["bytes"] // 65536)))
        init = root / "ab.sh"
        init.write_text(AB_INIT.format(rounds=rounds, labels=" ".join(agents), count=len(agents)))
        init.chmod(0o755)
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        with out.open("wb") as fh:
            subprocess.run(
                ["cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"],
                input="\n".join(names).encode(),
                stdout=fh,
                cwd=root,
                check=True,
            )


def boot(kernel: str, initrds: Sequence[Path], console: Path, icount: Optional[int] = None) -> float:
    """Boot the guest until it powers off; the wall time, s. The initrds are concatenated, each
    padded with zeros to 4 bytes (an uncompressed cpio after a compressed one must start aligned).
    ``icount``: run QEMU with ``-icount shift=N,sleep=off``: the guest's clock then counts its
    instructions (2**N ns each) instead of following the host's, so its times do not depend on
    the machine's load (QEMU's "icount" docs)."""
    initrd = console.with_name("initrd.img")
    with initrd.open("wb") as fh:
        for part in initrds:
            fh.write(part.read_bytes())
            fh.write(b"\0" * (-fh.tell() % 4))
    argv = [
        "qemu-system-x86_64", "-accel", "tcg", "-m", "1024", "-smp", "1", "-nographic", "-no-reboot",
        "-nic", "none", "-monitor", "none", "-serial", f"file:{console}", "-kernel", kernel,
        "-initrd", str(initrd), "-append", "console=ttyS0 panic=-1 quiet rdinit=/ab.sh",
        *(["-icount", f"shift={icount},sleep=off"] if icount is not None else []),
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the guest did not power off within {WAIT:.0f} s; console: {console}") from None
    if "ab: done" not in console.read_text(errors="replace"):
        tail = console.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the guest stopped early (QEMU exit {proc.returncode}, {err!r}):\n{tail}")
    return time.monotonic() - t0


def parse(console: Path, tag: str = "ab-run") -> Dict[str, List[float]]:
    """Wall times (s) per agent label in round order, the warm-up round left out: of ``--version``
    (``tag`` ``ab-run``), or of copying a single file's unpacked bytes to tmpfs (``ab-copy``)."""
    times: Dict[str, List[float]] = {}
    for rnd, label, start, end in re.findall(rf"{tag} (\d+) (\S+) ([0-9.]+) ([0-9.]+)", console.read_text()):
        if int(rnd) > 1:
            times.setdefault(label, []).append(float(end) - float(start))
    return times


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Build this tree's three agents and the guest, boot it once, print the table (and ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=11, help="rounds, the first one a warm-up (default 11)")
    ap.add_argument("--agent", action="append", default=[], metavar="LABEL=PATH", help="one more agent")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument(
        "--icount",
        type=int,
        metavar="SHIFT",
        help="time by guest instructions (QEMU -icount shift=SHIFT: 2**SHIFT ns each), not wall time",
    )
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the first one is a warm-up)")
    extra: Dict[str, Path] = {}
    for spec in args.agent:
        label, sep, path = spec.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", label) or not Path(path).is_file():
            ap.error(
                f"--agent {spec!r}: give LABEL=PATH, a label of letters, digits, '._-' and an existing file"
            )
        extra[label] = Path(path).resolve()
    builders = {"onefile": gl.build_guest(), "onedir": gl.build_guest(onedir=True)}
    try:
        guests = {kind: next(builder) for kind, builder in builders.items()}
        with tempfile.TemporaryDirectory(prefix="vhab") as tmp:
            agents = {
                "file": Path(guests["onefile"]["agent"]),
                "file-nosig": build_unsigned(Path(tmp) / "nosig"),
                "dir": Path(guests["onedir"]["agent"]),
                **extra,
            }
            unpacks = {label: bg.unpacked(exe) for label, exe in agents.items()}  # before the builds go
            console, appended = Path(tmp) / "console.log", Path(tmp) / "ab.cpio"
            extra_initrd(agents, args.rounds, appended, unpacks)
            load = [os.getloadavg()[0]]
            initrds = [Path(guests["onefile"]["initrd"]), appended]
            wall = boot(guests["onefile"]["kernel"], initrds, console, args.icount)
            load.append(os.getloadavg()[0])
            times, copies = parse(console), parse(console, "ab-copy")
    finally:
        for builder in builders.values():
            for _ in builder:  # removes the build directory
                pass
    clock = "wall time" if args.icount is None else f"instruction count (-icount shift={args.icount})"
    what = f"{args.rounds - 1} rounds (+1 warm-up), {wall:.0f} s, the guest's clock: {clock}"
    report(agents, times, unpacks, what, load, copies)
    out = {
        label: {"version": times.get(label, []), "copy": copies.get(label, []), "unpacked": unpacks[label],
                "exe": str(exe)}
        for label, exe in agents.items()
    }  # fmt: skip
    if args.json:
        doc = {"rounds": args.rounds, "wall": wall, "load1": load, "icount": args.icount, "agents": out}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


def report(
    agents: Dict[str, Path],
    times: Dict[str, List[float]],
    unpacks: Dict[str, Dict[str, int]],
    what: str,
    load: List[float],
    copies: Dict[str, List[float]],
) -> None:
    """Print the table: per agent, ``--version`` p50 (min-max, n) in s; minus onedir's (``dir``),
    paired by round (the agents of one round ran back to back, under one load): p50 (min-max)
    of the differences; and what it unpacks at each start. ``times``: per label, one value per
    round in round order. ``load``: the 1-min load average before and after the guest.
    ``copies``: per single file, the time to copy the bytes its start unpacks (s, per round)."""
    print(f"\none TCG guest, {what}; machine load (1 min) {load[0]:.1f} before, {load[-1]:.1f} after\n")
    print(
        "| agent | `--version` in the guest | minus onedir's, paired by round | unpacked at each start "
        "| copying those bytes in the guest |"
    )
    print("| --- | --- | --- | --- | --- |")
    base = times.get("dir", [])
    for label in agents:
        up, mine = unpacks[label], times.get(label, [])
        what = f"{up['bytes'] / 1e6:.1f} MB, {up['files']} files" if up else "nothing: runs in place"
        diff = [a - b for a, b in zip(mine, base)] if len(mine) == len(base) and label != "dir" else []
        gap = "-"
        if diff:
            gap = f"{bg.pct(diff, 50):+.2f} s ({min(diff):+.2f} to {max(diff):+.2f}, n={len(diff)})"
        copy = bg.fmt(copies.get(label, []), "s", 1, 2) if copies.get(label) else "-"
        print(f"| {label} | {bg.fmt(mine, 's', 1, 2)} | {gap} | {what} | {copy} |")


if __name__ == "__main__":
    sys.exit(main())
