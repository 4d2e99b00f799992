#!/usr/bin/env bash
# Build a fast busybox-initramfs guest that runs the frozen vmr-handler agent.
#
#   qemu-test/build-guest.sh [CACHE_DIR] [AGENT]
#
# CACHE_DIR  default <repo>/qemu-test/.cache (git-ignored). Holds the Debian cloud kernel and
#            its virtio modules, cached by kernel version, and the built guest.
# AGENT      the frozen agent built by packaging/build.sh: the single executable file
#            (DIST/vmr-handler, the default build), or a `build.sh --onedir` bundle directory
#            (DIST/vmr-handler) or its executable (DIST/vmr-handler/vmr-handler).
#            Default: $VMR_AGENT, else <repo>/dist/vmr-handler.
# PYTHON     a Python with PyInstaller (default <repo>/.venv/bin/python): reads the libraries
#            inside the single file, to copy the glibc parts they need into the guest.
#
# Output (paths printed on the last two lines as KERNEL=... and INITRD=...):
#   CACHE_DIR/guest/vmlinuz         the cloud kernel
#   CACHE_DIR/guest/initramfs.img   busybox + glibc libs + virtio modules + the agent + /init
# $VMR_GUEST_OUT overrides CACHE_DIR/guest.
#
# Installs qemu-system-x86, busybox-static and cpio with apt-get when they are missing
# (needs root, as .ci/run has). Nothing else is installed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
cache=${1:-$here/.cache}
agent=${2:-${VMR_AGENT:-$repo/dist/vmr-handler}}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
out=${VMR_GUEST_OUT:-$cache/guest}
t0=$(date +%s%N)

log() { echo "build-guest: $*" >&2; }

# ------------------------------------------------------------------ host tools
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -x insmod >/dev/null || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
    log "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    }
fi
# busybox-static installs /bin/busybox (a static binary: needs no libraries in the guest)
busybox=/bin/busybox
if ldd "$busybox" >/dev/null 2>&1; then
    log "warning: $busybox is not static; install busybox-static"
fi

# ------------------------------------------------------------------ the agent
# kind=file: one executable (installed as /usr/local/bin/vmr-handler); kind=dir: an onedir
# bundle (installed as /opt/vmr-handler, linked from /usr/local/bin)
if [ -f "$agent" ] && [ -x "$agent" ] && [ -d "$(dirname "$agent")/_internal" ]; then
    agent=$(dirname "$agent")
fi
if [ -f "$agent" ]; then
    [ -x "$agent" ] || { log "$agent is not executable"; exit 1; }
    kind="file"
    agent=$(cd "$(dirname "$agent")" && pwd)/$(basename "$agent")
elif [ -d "$agent" ]; then
    kind="dir"
    agent=$(cd "$agent" && pwd)
    [ -x "$agent/vmr-handler" ] || { log "no frozen agent in $agent (run packaging/build.sh first)"; exit 1; }
    [ -d "$agent/_internal" ] || log "warning: $agent has no _internal/ (not an onedir bundle?)"
else
    log "no frozen agent at $agent (run packaging/build.sh first)"; exit 1
fi
log "agent: $agent ($kind)"

# ------------------------------------------------------------------ kernel (cached by version)
kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null \
       | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | sed -n 1p)
if [ -z "$kpkg" ]; then
    apt-get update -qq
    kpkg=$(apt-cache depends linux-image-cloud-amd64 \
           | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | sed -n 1p)
fi
[ -n "$kpkg" ] || { log "cannot resolve linux-image-cloud-amd64 to a kernel package"; exit 1; }
kver=${kpkg#linux-image-}
kdir=$cache/kernel/$kver
# the module chain for virtio-serial (+ virtio_blk for the optional state disk, virtio_net with
# failover/net_failover for an optional NIC, qemu_fw_cfg for the per-VM fw_cfg blob under
# /sys/firmware/qemu_fw_cfg); each module's own dependencies are read from the .ko. Always all
# of them: a guest without a NIC or a blob loads them and nothing changes for it.
want_modules=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console virtio_blk
              failover net_failover virtio_net qemu_fw_cfg)
# the cache is valid for this exact module list (ok holds it)
if [ "$(cat "$kdir/ok" 2>/dev/null)" != "${want_modules[*]}" ]; then
    log "fetching $kpkg"
    rm -rf "$kdir"
    mkdir -p "$kdir/dl" "$kdir/x" "$kdir/modules"
    (cd "$kdir/dl" && apt-get download -qq "$kpkg" 2>&1 >/dev/null | grep -v "unsandboxed" >&2 || true)
    dpkg-deb -x "$kdir"/dl/*.deb "$kdir/x"
    cp "$kdir"/x/boot/vmlinuz-* "$kdir/vmlinuz"
    cp "$kdir"/x/boot/config-* "$kdir/config" 2>/dev/null || true
    mdir=$(echo "$kdir"/x/lib/modules/*/kernel)
    [ -d "$mdir" ] || mdir=$(echo "$kdir"/x/usr/lib/modules/*/kernel)
    # resolve dependencies (depth first, dependencies before dependants)
    order=()
    declare -A seen=()
    ko_depends() {
        if command -v modinfo >/dev/null; then
            modinfo -F depends "$1"
        else
            tr '\0' '\n' <"$1" | sed -n 's/^depends=//p' | sed -n 1p
        fi
    }
    add_module() {
        local name=$1 ko dep
        [ -n "${seen[$name]:-}" ] && return 0
        seen[$name]=1
        ko=$(find "$mdir" -name "$name.ko" -o -name "${name//_/-}.ko" | sed -n 1p)
        if [ -z "$ko" ]; then
            if grep -q "^CONFIG_${name^^}=y" "$kdir/config" 2>/dev/null; then return 0; fi
            log "module $name not found in $kpkg"; return 1
        fi
        for dep in $(ko_depends "$ko" | tr ',' ' '); do add_module "$dep"; done
        cp "$ko" "$kdir/modules/$name.ko"
        order+=("$name")
    }
    for m in "${want_modules[@]}"; do add_module "$m"; done
    printf '%s\n' "${order[@]}" >"$kdir/modules/order"
    rm -rf "$kdir/dl" "$kdir/x"
    echo "${want_modules[*]}" >"$kdir/ok"
fi
log "kernel $kver, modules: $(tr '\n' ' ' <"$kdir/modules/order")"

# ------------------------------------------------------------------ initramfs tree
root=$(mktemp -d "${TMPDIR:-/tmp}/vmr-guest.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,run,etc,lib/modules,lib64,opt,usr/local/bin,var/lib/vmr-handler,var/launch}
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
# init must find these in /sbin too
for applet in poweroff reboot halt insmod; do ln -sf ../bin/busybox "$root/sbin/$applet"; done
# device nodes the kernel does not make for an initramfs before devtmpfs is mounted
if [ "$(id -u)" = 0 ]; then
    mknod -m 600 "$root/dev/console" c 5 1
    mknod -m 666 "$root/dev/null" c 1 3
    devnodes=""
else
    devnodes=yes  # non-root: cpio gets the nodes from a gen_init_cpio-like list below
fi

if [ "$kind" = file ]; then
    cp "$agent" "$root/usr/local/bin/vmr-handler"
    # the libraries inside the single file, to ask ldd what they need from the guest
    inner=$(mktemp -d "${TMPDIR:-/tmp}/vmr-agent-libs.XXXXXX")
    trap 'rm -rf "$root" "$inner"' EXIT
    python=${PYTHON:-$repo/.venv/bin/python}
    "$python" - "$agent" "$inner" <<'PY' || log "warning: cannot list the libraries inside $agent; copying the usual glibc set only"
import os, sys
from PyInstaller.archive.readers import CArchiveReader
archive, out = CArchiveReader(sys.argv[1]), sys.argv[2]
for name, entry in archive.toc.items():
    if entry[-1] == "b" and ".so" in name:  # typecode b: a shared library
        path = os.path.join(out, os.path.basename(name))
        with open(path, "wb") as f:
            f.write(archive.extract(name))
PY
    lib_sources=("$root/usr/local/bin/vmr-handler" "$inner")
    bundled=$inner
else
    cp -a "$agent" "$root/opt/vmr-handler"
    ln -s /opt/vmr-handler/vmr-handler "$root/usr/local/bin/vmr-handler"
    lib_sources=("$agent/vmr-handler" "$agent")
    bundled=$agent
fi

# glibc and friends from this machine: what ldd says the agent needs + the lab notes' list
libs=$( { ldd "${lib_sources[0]}"
          find "${lib_sources[1]}" -name '*.so*' -type f -exec ldd {} \; 2>/dev/null
        } | awk '/=> \//{print $3} /^\t\/lib64\//{print $1}' | sort -u)
for name in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 libz.so.1; do
    p=$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ && !f {print $NF; f = 1}')
    [ -n "$p" ] && libs+=$'\n'$p
done
for lib in $(echo "$libs" | sort -u); do
    case $lib in "$bundled"/*) continue ;; esac   # bundled by PyInstaller already
    real=$(readlink -f "$lib")
    case $lib in
        */ld-linux-x86-64.so.2) cp "$real" "$root/lib64/ld-linux-x86-64.so.2" ;;
        *) cp "$real" "$root/lib/$(basename "$lib")" ;;
    esac
done
cp "$kdir"/modules/*.ko "$kdir/modules/order" "$root/lib/modules/"
echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"
echo "vmr-guest" >"$root/etc/hostname"

cat >"$root/init" <<'EOF'
#!/bin/sh
# vmr-handler test guest: load virtio modules, make the port link, mount the state disk if one
# is attached, run the agent, power off.
export PATH=/usr/local/bin:/bin:/sbin LD_LIBRARY_PATH=/lib LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs -o mode=1777 tmp /tmp
hostname -F /etc/hostname
echo "vmr-guest: uptime $(cut -d' ' -f1 /proc/uptime) s, loading modules"
for m in $(cat /lib/modules/order); do
    insmod /lib/modules/$m.ko || echo "vmr-guest: insmod $m failed"
done
# State: a virtio disk (virtio device id 2, /dev/vda) is the persistent state disk: ext2 (made on
# the host, or here with busybox mke2fs when it has no filesystem), mounted on /mnt/state with
# state/ bound to /var/lib/vmr-handler and launch/ to /var/launch (the journal, the outbox and
# the entries' working dirs survive a reboot). No disk: both on tmpfs, lost at power-off.
disk=
for d in /sys/bus/virtio/devices/*; do
    [ "$(cat "$d/device" 2>/dev/null)" = 0x0002 ] && disk=yes
done
if [ -n "$disk" ]; then
    i=0
    while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
    mkdir -p /mnt/state
    if ! mount -t ext4 /dev/vda /mnt/state 2>/dev/null; then
        echo "vmr-guest: /dev/vda has no filesystem, formatting ext2"
        mke2fs -q /dev/vda && mount -t ext4 /dev/vda /mnt/state
    fi
fi
if grep -q ' /mnt/state ' /proc/mounts; then
    mkdir -p /mnt/state/state /mnt/state/launch
    chmod 755 /mnt/state/state
    mount -o bind /mnt/state/state /var/lib/vmr-handler
    mount -o bind /mnt/state/launch /var/launch
    echo "vmr-guest: state on /dev/vda ($(ls /var/lib/vmr-handler | tr '\n' ' '))"
else
    [ -n "$disk" ] && echo "vmr-guest: state disk unusable, state on tmpfs"
    mount -t tmpfs -o mode=755 state /var/lib/vmr-handler
    mount -t tmpfs -o mode=755 launch /var/launch
fi
# The per-VM settings blob (QEMU -fw_cfg name=opt/org.vmr/config,file=...; module qemu_fw_cfg):
# when it is there, the agent takes its name, transport, broker and credentials from it.
fw_cfg=/sys/firmware/qemu_fw_cfg/by_name/opt/org.vmr/config/raw
[ -e "$fw_cfg" ] && echo "vmr-guest: fw_cfg blob opt/org.vmr/config present ($(wc -c <"$fw_cfg") bytes)"
# A NIC (virtio-net, QEMU user networking): eth0 gets vmr.ip=ADDR/LEN from the kernel command
# line, default 10.0.2.15/24 (the slirp network; a guestfwd address such as 10.0.2.100 is on it).
if [ -e /sys/class/net/eth0 ]; then
    ip_addr=10.0.2.15/24
    for w in $(cat /proc/cmdline); do
        case $w in vmr.ip=*) ip_addr=${w#vmr.ip=} ;; esac
    done
    ip link set lo up
    ip addr add "$ip_addr" dev eth0 && ip link set eth0 up && echo "vmr-guest: eth0 $ip_addr up"
fi
# the port link, when a virtio console device (virtio device id 3) is attached
console_dev=
for d in /sys/bus/virtio/devices/*; do
    [ "$(cat "$d/device" 2>/dev/null)" = 0x0003 ] && console_dev=yes
done
mkdir -p /dev/virtio-ports
i=0
[ -n "$console_dev" ] || i=100
while [ $i -lt 100 ]; do
    found=
    for p in /sys/class/virtio-ports/vport*; do
        [ -e "$p/name" ] || continue
        name=$(cat "$p/name")
        dev=$(basename "$p")
        [ -n "$name" ] && [ -e "/dev/$dev" ] && ln -sf "/dev/$dev" "/dev/virtio-ports/$name" && found=1
    done
    [ -n "$found" ] && break
    i=$((i + 1)); sleep 0.1
done
ls -l /dev/virtio-ports/
# vmr.name=NAME on the kernel command line names the agent (only for its logs), unless the
# fw_cfg blob is there: then the blob alone names it (a command-line name would win over it)
# vmr.launch=DIR puts the entries' working dirs in DIR (e.g. /tmp/launch: the tmpfs, emptied by
# a reboot) instead of /var/launch
name_arg=
launch_arg=
for w in $(cat /proc/cmdline); do
    case $w in
        vmr.name=*) [ -e "$fw_cfg" ] || name_arg="--vm-name ${w#vmr.name=}" ;;
        vmr.launch=*) launch_arg="--launch-dir ${w#vmr.launch=}" ;;
        vmr.timing) for run in cold warm; do   # measure the agent's start-up in this guest
                        echo "vmr-guest: --version $run:"; time /usr/local/bin/vmr-handler --version
                    done ;;
    esac
done
echo "vmr-guest: uptime $(cut -d' ' -f1 /proc/uptime) s, starting vmr-handler"
# reboot requests: busybox `reboot -f` (syncs, then restarts the kernel; no init to ask).
# QEMU without -no-reboot boots the guest again; with -no-reboot QEMU exits.
/usr/local/bin/vmr-handler run --quiet $name_arg $launch_arg --reboot-command 'sync; reboot -f'
echo "vmr-guest: vmr-handler exited $?, powering off"
poweroff -f
EOF
chmod 755 "$root/init"

# ------------------------------------------------------------------ pack
compress="gzip -1"
suffix=gzip
if command -v zstd >/dev/null && grep -q '^CONFIG_RD_ZSTD=y' "$kdir/config" 2>/dev/null; then
    compress="zstd -q -3 -T0"
    suffix=zstd
fi
mkdir -p "$out"
tmp_img=$out/initramfs.img.tmp
if [ -n "$devnodes" ]; then
    log "not root: /dev/console cannot be created; the guest will have no early console"
fi
(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0 | $compress) >"$tmp_img"
mv "$tmp_img" "$out/initramfs.img"
cp "$kdir/vmlinuz" "$out/vmlinuz"
log "initramfs $(du -h "$out/initramfs.img" | cut -f1) ($suffix), built in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
echo "KERNEL=$out/vmlinuz"
echo "INITRD=$out/initramfs.img"
