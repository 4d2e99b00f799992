#!/usr/bin/env bash
# Build the frozen guest agent for an older glibc floor: the same bundle as build.sh, built
# inside a debootstrap'd Debian 11 "bullseye" chroot (glibc 2.31, python3 3.9 with the shared
# libpython3.9), then report the glibc floor of the result.
#
#   packaging/build-old-glibc.sh [--onedir] [DIST_DIR]   (default DIST_DIR: <repo>/dist/bullseye)
#
# Result: DIST_DIR/vmr-handler, one executable file as build.sh makes it (with --onedir: the
# bundle DIST_DIR/vmr-handler/vmr-handler). Needs root (debootstrap, chroot,
# mounts), debootstrap, objdump (binutils) on this machine, and network access to the Debian
# mirror and PyPI.
#
# Environment:
#   VMR_CHROOT   the chroot directory, kept between runs (default /var/cache/vmr-handler/bullseye);
#                made with debootstrap the first time (marker file .vmr-chroot-ok inside)
#   VMR_SUITE    Debian suite (default bullseye)
#   VMR_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   PIP_*, http(s)_proxy  passed into the chroot; a CA bundle named by PIP_CERT / SSL_CERT_FILE
#                is copied in (a TLS-inspecting proxy's CA is not in the chroot's ca-certificates)
#
# What it does: debootstrap --variant=minbase with python3-venv, python3-dev (libpython3.9),
# binutils (objdump/strip for PyInstaller) and ca-certificates; copies the working tree (the
# files git knows or does not ignore) to /src in the chroot; in a fresh venv there
# `pip install /src` (the project, not editable) and packaging/build.sh, which pins
# pyinstaller==6.22.3 like every other build; DIST_DIR is bind-mounted at /out. Then
# `--version` runs in the chroot (glibc 2.31) and the highest GLIBC_ symbol version any file
# of the bundle references is printed (the loop of packaging/README.md, "glibc floor"; for the
# single file, over the libraries inside it, read with PyInstaller's archive reader).
set -euo pipefail

mode=onefile
if [ "${1:-}" = --onedir ]; then mode=onedir; shift; fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
dist=${1:-$repo/dist/bullseye}
root=${VMR_CHROOT:-/var/cache/vmr-handler/bullseye}
suite=${VMR_SUITE:-bullseye}
mirror=${VMR_MIRROR:-http://deb.debian.org/debian}
pip_pin=24.3.1                      # a pip that builds PEP 621 projects (bullseye's is 20.3)

die() { echo "build-old-glibc.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, bind mounts)"
command -v debootstrap >/dev/null || die "needs debootstrap (apt-get install debootstrap)"
command -v objdump >/dev/null || die "needs objdump (apt-get install binutils)"

t_start=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------------ the chroot (once)
if [ ! -e "$root/.vmr-chroot-ok" ]; then
    echo "== debootstrap $suite into $root"
    rm -rf "$root"
    mkdir -p "$root"
    t=$(date +%s.%N)
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-dev,binutils,ca-certificates \
        "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 \
        || { tail -20 "$root.debootstrap.log" >&2; die "debootstrap failed (log: $root.debootstrap.log)"; }
    touch "$root/.vmr-chroot-ok"
    echo "debootstrap: $(since "$t") s"
fi
echo "chroot: $(chroot "$root" ldd --version | sed -n 1p); $(chroot "$root" python3 --version)"

# ------------------------------------------------------------------ mounts (always undone)
mounted=()
cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -l "${mounted[i]}" 2>/dev/null || true
    done
}
trap cleanup EXIT
bind() { mkdir -p "$2"; mount --bind "$1" "$2"; mounted+=("$2"); }

mkdir -p "$dist"
dist=$(cd "$dist" && pwd)
mount -t proc proc "$root/proc"; mounted+=("$root/proc")
bind /dev "$root/dev"
bind "$dist" "$root/out"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# the working tree as build.sh would see it: tracked + untracked-not-ignored files that exist
rm -rf "$root/src"
mkdir -p "$root/src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf -) | tar -xf - -C "$root/src"

envs=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
      PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-180}"
      PIP_CONFIG_FILE=/dev/null)
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL; do
    [ -n "${!v:-}" ] && envs+=("$v=${!v}")
done
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$ca" ] && [ -f "$ca" ]; then
    cp "$ca" "$root/etc/vmr-build-ca.crt"
    envs+=(PIP_CERT=/etc/vmr-build-ca.crt SSL_CERT_FILE=/etc/vmr-build-ca.crt)
fi
# SOURCE_DATE_EPOCH from this repository (the copy in the chroot has no .git)
sde=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 1700000000)}

# ------------------------------------------------------------------ build in the chroot
echo "== build in the chroot"
t=$(date +%s.%N)
chroot "$root" env -i "${envs[@]}" SOURCE_DATE_EPOCH="$sde" bash -euo pipefail -c "
    rm -rf /opt/venv /tmp/pyi-work
    python3 -m venv /opt/venv
    /opt/venv/bin/pip install -q 'pip==$pip_pin'
    /opt/venv/bin/pip install -q /src
    rm -rf /out/vmr-handler
    PYTHON=/opt/venv/bin/python VMR_BUILD_WORK=/tmp/pyi-work PYINSTALLER_CONFIG_DIR=/tmp/pyi-config \
        VMR_PYI_MODE=$mode bash /src/packaging/build.sh /out
"
echo "build in the chroot: $(since "$t") s"

# ------------------------------------------------------------------ it runs on the old glibc
if [ -f "$dist/vmr-handler" ]; then exe=/out/vmr-handler; else exe=/out/vmr-handler/vmr-handler; fi
echo "== --version in the chroot (its own glibc): $(chroot "$root" "$exe" --version)"

# ------------------------------------------------------------------ the glibc floor
echo "== highest GLIBC_ symbol versions referenced (packaging/README.md, \"glibc floor\")"
scan=$dist/vmr-handler
if [ -f "$dist/vmr-handler" ]; then  # the single file: its bootloader + the libraries inside it
    scan=$(mktemp -d)
    trap 'rm -rf "$scan"; cleanup' EXIT
    cp "$dist/vmr-handler" "$scan/vmr-handler"
    chroot "$root" /opt/venv/bin/python -c "
import os, sys
from PyInstaller.archive.readers import CArchiveReader
archive = CArchiveReader('/out/vmr-handler')
for name, entry in archive.toc.items():
    if entry[-1] == 'b':
        sys.stdout.buffer.write(name.encode() + b'\\0')
" | while IFS= read -r -d '' name; do
        mkdir -p "$scan/$(dirname "$name")"
        chroot "$root" /opt/venv/bin/python -c "
import sys
from PyInstaller.archive.readers import CArchiveReader
sys.stdout.buffer.write(CArchiveReader('/out/vmr-handler').extract(sys.argv[1]))
" "$name" >"$scan/$name"
    done
fi
floor=$(cd "$scan" && find . -type f \( -name '*.so*' -o -name vmr-handler \) -print0 \
    | while IFS= read -r -d '' f; do
        v=$(objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_2\.[0-9.]*' | sort -uV | tail -1 || true)
        if [ -n "$v" ]; then echo "$v ${f#./}"; fi
    done | sort -V)
echo "$floor" | tail -3
top=$(echo "$floor" | tail -1 | cut -d' ' -f1)
echo "size: $(du -sb "$dist/vmr-handler" | cut -f1) bytes, $(find "$dist/vmr-handler" -type f | wc -l) file(s)"
echo "glibc floor: ${top#GLIBC_} (built against $(chroot "$root" ldd --version | sed -n 1p | grep -o '[0-9.]*$'))"
echo "total: $(since "$t_start") s"
echo "built $dist${exe#/out}"
