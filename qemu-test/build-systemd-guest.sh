#!/usr/bin/env bash
# Build a systemd guest: a debootstrap'd Debian 12 root filesystem with the frozen agent baked in
# by images/bake (systemd unit + udev rule), as an ext4 disk image booted with the Debian cloud
# kernel.
#
#   qemu-test/build-systemd-guest.sh [CACHE_DIR] [AGENT]
#
# CACHE_DIR  default <repo>/qemu-test/.cache (git-ignored). Holds, under systemd/, the .debs
#            debootstrap fetched and the base root filesystem (debootstrap + kernel modules +
#            guest settings, no agent), keyed by suite, package list, kernel package and recipe.
# AGENT      the frozen agent from packaging/build.sh: the single executable file (the default
#            build), or a `build.sh --onedir` bundle directory (DIST/vmr-handler) or its
#            executable. Default: $VMR_AGENT, else <repo>/dist/vmr-handler. images/bake installs it.
#
# Output ($VMR_GUEST_OUT, default CACHE_DIR/systemd-guest), printed on the last three lines as
# KERNEL=..., INITRD=..., DISK=...:
#   vmlinuz        the Debian cloud kernel (the rootfs has the same version's modules + depmod)
#   initramfs.img  busybox /init: loads virtio_pci + virtio_blk, mounts root=/dev/vda (ext4),
#                  switch_root to /sbin/init (systemd); virtio_console is NOT loaded there:
#                  udev in the real root loads it when it sees the virtio-serial device
#   rootfs.img     raw ext4 image made with mke2fs -d (no loop device, no mount)
#
# Installs debootstrap, e2fsprogs, qemu-system-x86, busybox-static, cpio with apt-get when they
# are missing (needs root, as .ci/run has; debootstrap and chroot need root anyway).
# Timings of every part are printed on stderr ("build-systemd-guest: ... s").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
cache=${1:-$here/.cache}
agent=${2:-${VMR_AGENT:-$repo/dist/vmr-handler}}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
out=${VMR_GUEST_OUT:-$cache/systemd-guest}
suite=bookworm
mirror=${VMR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# systemd-sysv gives /sbin/init; udev creates /dev/virtio-ports/<name> and runs 90-vmr-handler.rules;
# kmod gives depmod/modprobe (udev loads modules through libkmod and modules.dep)
packages=systemd,systemd-sysv,udev,kmod
recipe=3   # bump when the base root filesystem recipe below changes
t_all=$(date +%s%N)

log() { echo "build-systemd-guest: $*" >&2; }
since() { echo "$(( ($(date +%s%N) - $1) / 1000000 ))" | sed 's/...$/.&/; s/^\./0./'; }

[ "$(id -u)" = 0 ] || { log "needs root (debootstrap, chroot, device nodes)"; exit 1; }

# ------------------------------------------------------------------ host tools
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -x switch_root >/dev/null || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
    t=$(date +%s%N)
    log "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    }
    log "apt-get install: $(since "$t") s"
fi
busybox=/bin/busybox

# ------------------------------------------------------------------ the agent
if [ -f "$agent" ] && [ -x "$agent" ] && [ -d "$(dirname "$agent")/_internal" ]; then
    agent=$(dirname "$agent")   # the executable of an onedir bundle: bake the whole bundle
fi
if [ -f "$agent" ]; then
    [ -x "$agent" ] || { log "$agent is not executable"; exit 1; }
    agent=$(cd "$(dirname "$agent")" && pwd)/$(basename "$agent")
else
    agent=$(cd "$agent" && pwd)
    [ -x "$agent/vmr-handler" ] || { log "no frozen agent at $agent (run packaging/build.sh first)"; exit 1; }
fi

# ------------------------------------------------------------------ kernel package
resolve_kernel() {
    apt-cache depends linux-image-cloud-amd64 2>/dev/null \
        | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | sed -n 1p
}
kpkg=$(resolve_kernel)
if [ -z "$kpkg" ]; then
    apt-get update -qq
    kpkg=$(resolve_kernel)
fi
[ -n "$kpkg" ] || { log "cannot resolve linux-image-cloud-amd64 to a kernel package"; exit 1; }
kver=${kpkg#linux-image-}

# ------------------------------------------------------------------ base root filesystem (cached)
key="$suite $packages $kpkg recipe-$recipe"
base=$cache/systemd/base-$(echo "$key" | sha256sum | cut -c1-12)
debs=$cache/systemd/debs
mkdir -p "$cache/systemd"
# one builder at a time per cache (two test sessions on one machine share qemu-test/.cache)
exec 9>"$cache/systemd/lock"
flock 9
if [ "$(cat "$base/ok" 2>/dev/null)" != "$key" ]; then
    rm -rf "$cache"/systemd/base-*   # older recipes/kernels: one base at a time
    mkdir -p "$base" "$debs"
    rootfs=$base/rootfs

    t=$(date +%s%N)
    log "debootstrap --variant=minbase --include=$packages $suite ($mirror)"
    if ! debootstrap --variant=minbase --include="$packages" --cache-dir="$debs" \
            "$suite" "$rootfs" "$mirror" >"$base/debootstrap.log" 2>&1; then
        tail -20 "$base/debootstrap.log" >&2
        log "debootstrap failed (log: $base/debootstrap.log)"
        exit 1
    fi
    log "debootstrap: $(since "$t") s"

    # the kernel's modules, straight from its .deb (no postinst: no initramfs-tools in the guest)
    t=$(date +%s%N)
    kx=$base/kx
    mkdir -p "$kx"
    found=("$debs/$kpkg"_*.deb)
    if [ ! -f "${found[0]}" ]; then
        (cd "$debs" && { apt-get download -qq "$kpkg" 2>&1 | grep -v unsandboxed >&2 || true; })
        found=("$debs/$kpkg"_*.deb)
    fi
    deb=${found[0]}
    [ -f "$deb" ] || { log "apt-get download $kpkg failed"; exit 1; }
    dpkg-deb -x "$deb" "$kx"
    mdir=$kx/lib/modules/$kver
    [ -d "$mdir" ] || mdir=$kx/usr/lib/modules/$kver
    mkdir -p "$rootfs/usr/lib/modules"   # bookworm is merged-/usr: /lib -> usr/lib
    cp -a "$mdir" "$rootfs/usr/lib/modules/$kver"
    cp "$kx"/boot/vmlinuz-* "$base/vmlinuz"
    cp "$kx"/boot/config-* "$base/config"
    chroot "$rootfs" /sbin/depmod -a "$kver"
    rm -rf "$kx"
    log "kernel $kpkg: modules + depmod: $(since "$t") s"

    # guest settings: one image for every VM (no VM name anywhere), root on /dev/vda
    echo vmr-systemd >"$rootfs/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\tvmr-systemd\n' >"$rootfs/etc/hosts"
    # mounted rw by the initramfs; no fsck (e2fsprogs is not in minbase)
    printf '/dev/vda\t/\text4\trw,noatime\t0\t0\n' >"$rootfs/etc/fstab"
    chroot "$rootfs" passwd -d root >/dev/null   # console login as root for debugging by hand
    # a lean test VM boots faster under TCG: no network (-nic none), no periodic maintenance,
    # no gettys on the (absent) VGA consoles (the serial getty on ttyS0 stays), journal in RAM
    for u in systemd-networkd-wait-online.service systemd-timesyncd.service apt-daily.timer \
             apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
             dpkg-db-backup.timer getty-static.service getty@tty1.service; do
        ln -sfn /dev/null "$rootfs/etc/systemd/system/$u"
    done
    mkdir -p "$rootfs/etc/systemd/journald.conf.d"
    printf '[Journal]\nStorage=volatile\n' >"$rootfs/etc/systemd/journald.conf.d/volatile.conf"
    # a smaller image: package caches and lists are not needed to boot
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

    # initramfs: busybox + the modules for the root disk, /init mounts it and switches root
    t=$(date +%s%N)
    ird=$base/initramfs
    mkdir -p "$ird"/{bin,dev,proc,sys,newroot,lib/modules}
    cp "$busybox" "$ird/bin/busybox"
    for applet in sh mount umount insmod sleep cat switch_root mkdir echo cut ls; do
        ln -sf busybox "$ird/bin/$applet"
    done
    mknod -m 600 "$ird/dev/console" c 5 1
    mknod -m 666 "$ird/dev/null" c 1 3
    # load order from the rootfs' own modules.dep: virtio_pci (+ its dependencies), virtio_blk
    : >"$ird/lib/modules/order"
    for line in $(chroot "$rootfs" /sbin/modprobe -a -S "$kver" --show-depends virtio_pci virtio_blk \
                  | sed -n 's/^insmod \([^ ]*\).*/\1/p'); do
        name=$(basename "$line" .ko)
        grep -qx "$name" "$ird/lib/modules/order" && continue
        cp "$rootfs$line" "$ird/lib/modules/$name.ko"
        echo "$name" >>"$ird/lib/modules/order"
    done
    cat >"$ird/init" <<'EOF'
#!/bin/sh
# vmr systemd test guest: load what the root disk needs, mount it, hand over to systemd.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
root=/dev/vda
for w in $(cat /proc/cmdline); do case $w in root=/dev/*) root=${w#root=} ;; esac; done
echo "vmr-initramfs: uptime $(cut -d' ' -f1 /proc/uptime) s, loading $(cat /lib/modules/order)"
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m.ko || echo "vmr-initramfs: insmod $m failed"; done
i=0
while [ ! -b "$root" ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.1; done
if ! mount -t ext4 -o rw,noatime "$root" /newroot; then
    echo "vmr-initramfs: cannot mount $root"; ls /dev; sleep 5; echo o >/proc/sysrq-trigger
fi
echo "vmr-initramfs: uptime $(cut -d' ' -f1 /proc/uptime) s, switch_root to systemd on $root"
mount --move /dev /newroot/dev
mount --move /sys /newroot/sys
mount --move /proc /newroot/proc
exec switch_root /newroot /sbin/init
EOF
    chmod 755 "$ird/init"
    compress="gzip -1"
    if command -v zstd >/dev/null && grep -q '^CONFIG_RD_ZSTD=y' "$base/config"; then compress="zstd -q -3"; fi
    (cd "$ird" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0 | $compress) \
        >"$base/initramfs.img"
    log "initramfs ($(du -h "$base/initramfs.img" | cut -f1), modules: $(tr '\n' ' ' <"$ird/lib/modules/order")): $(since "$t") s"
    rm -rf "$ird"
    echo "$key" >"$base/ok"
else
    log "base root filesystem cached: $base ($key)"
fi

# ------------------------------------------------------------------ bake + disk image
t=$(date +%s%N)
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/vmr-sdguest.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -a "$base/rootfs" "$work/rootfs"
cp "$base/vmlinuz" "$base/initramfs.img" "$work/"
exec 9>&-   # the base is copied: release the cache
"$repo/images/bake" --binary "$agent" "$work/rootfs" >&2
log "copy + images/bake: $(since "$t") s"

t=$(date +%s%N)
used_mb=$(du -sm "$work/rootfs" | cut -f1)
size_mb=$(( used_mb * 13 / 10 + 128 ))   # room for the journal, state and entries' files
rm -f "$out/rootfs.img.tmp"
mke2fs -q -F -t ext4 -L vmr-root -d "$work/rootfs" "$out/rootfs.img.tmp" "${size_mb}M" >&2
mv "$out/rootfs.img.tmp" "$out/rootfs.img"
cp "$work/vmlinuz" "$out/vmlinuz"
cp "$work/initramfs.img" "$out/initramfs.img"
log "disk image: rootfs ${used_mb} MB in a ${size_mb} MB ext4 image ($(du -m "$out/rootfs.img" | cut -f1) MB allocated): $(since "$t") s"
log "kernel $kver; built in $(since "$t_all") s"
echo "KERNEL=$out/vmlinuz"
echo "INITRD=$out/initramfs.img"
echo "DISK=$out/rootfs.img"
