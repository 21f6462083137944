#!/bin/sh
# canal-vm guest init: PID 1 of the initramfs built by crates/canal-vm (docs/vm.md).
#
# It loads the virtio modules listed in /modules.list, mounts the host root (9p tag
# "hostroot", read-only) at /newroot with fresh /proc /sys /dev /tmp /run inside, mounts the
# run directory (9p tag "canalrun") at /newroot/run/canal-vm, configures whatever devices
# QEMU gave it (virtio-net -> 10.0.2.15/24 via 10.0.2.2; ivshmem 1af4:1110 -> enabled, or
# for ivshmem-doorbell bound to vfio-pci, and exported as CANAL_IVSHMEM_DEVICE,
# CANAL_REGION_SIZE [, CANAL_IVSHMEM_VFIO_GROUP]), says READY on the control port, runs
# /run/canal-vm/cmd.sh chrooted into the host root with stdout/stderr on their own
# virtio-serial ports, reports "EXIT <status>" and powers off.
#
# Control port protocol (one line each, host <- guest): "READY <uptime>", "EXIT <status>",
# "FAIL <reason>". Waiting for a device to appear is bounded polling inside the guest; the
# host never sleeps a fixed time, it waits for these lines.

/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

log() { echo "canal-vm-init: $*" >/dev/console; }
CTL=
fail() {
    log "FAIL $*"
    [ -n "$CTL" ] && echo "FAIL $*" >"$CTL"
    poweroff -f
    exit 1
}

for m in $(cat /modules.list); do
    insmod "/modules/$m" || log "insmod $m failed"
done

# virtio-serial ports are announced by the host after the driver is ready: wait for them
# (bounded: 2000 x 5 ms).
OUT=
ERR=
i=0
while [ $i -lt 2000 ]; do
    for p in /sys/class/virtio-ports/*; do
        [ -e "$p/name" ] || continue
        case "$(cat "$p/name")" in
        canal.ctl) CTL=/dev/${p##*/} ;;
        canal.stdout) OUT=/dev/${p##*/} ;;
        canal.stderr) ERR=/dev/${p##*/} ;;
        esac
    done
    [ -n "$CTL" ] && [ -n "$OUT" ] && [ -n "$ERR" ] && [ -c "$CTL" ] && [ -c "$OUT" ] && [ -c "$ERR" ] && break
    usleep 5000
    i=$((i + 1))
done
[ -c "$CTL" ] || fail "no control port"
[ -c "$OUT" ] && [ -c "$ERR" ] || fail "no stdout/stderr ports"

mkdir -p /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /newroot ||
    fail "cannot mount host root over 9p"
for d in proc sys dev tmp run; do
    [ -d "/newroot/$d" ] || fail "host root has no /$d to mount over"
done
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mkdir -p /newroot/run/canal-vm
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=none canalrun /newroot/run/canal-vm ||
    fail "cannot mount the run directory over 9p"
[ -r /newroot/run/canal-vm/cmd.sh ] || fail "no cmd.sh in the run directory"

hostname canal-vm
ip link set lo up

# virtio-net (present only with --virtio): QEMU user networking's fixed addresses.
for n in /sys/class/net/*; do
    n=${n##*/}
    [ "$n" = lo ] && continue
    ip link set "$n" up || fail "cannot bring up $n"
    ip addr add 10.0.2.15/24 dev "$n"
    ip route add default via 10.0.2.2 dev "$n"
    echo "nameserver 10.0.2.3" >/newroot/run/canal-vm-resolv.conf
    [ -f /newroot/etc/resolv.conf ] && [ ! -L /newroot/etc/resolv.conf ] &&
        mount --bind /newroot/run/canal-vm-resolv.conf /newroot/etc/resolv.conf
    break
done

# The canal device (present only with --canal / --doorbell): PCI 1af4:1110, BAR 2 is the
# region. ivshmem-plain has BARs 0 and 2; ivshmem-doorbell also has BAR 1 (MSI-X table),
# and is bound to vfio-pci so the program can take its interrupts on an eventfd.
IVSHMEM=
VFIO_GROUP=
REGION_SIZE=
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor")" = 0x1af4 ] && [ "$(cat "$d/device")" = 0x1110 ] || continue
    [ -e "$d/resource2" ] || fail "ivshmem device $d has no resource2"
    REGION_SIZE=$(stat -c %s "$d/resource2")
    if [ -e "$d/resource1" ]; then
        [ -s /modules-doorbell.list ] || fail "doorbell device but the kernel has no vfio-pci"
        for m in $(cat /modules-doorbell.list); do
            insmod "/modules/$m" || log "insmod $m failed"
        done
        [ -e "$d/iommu_group" ] || fail "doorbell device $d has no IOMMU group (no IOMMU?)"
        # Memory decoding stays on whoever opens or closes the device through VFIO:
        # every process maps BARs 0 and 2 through sysfs (libcanal, protocol §9.5).
        echo 1 >"$d/enable" 2>/dev/null
        echo vfio-pci >"$d/driver_override"
        echo "${d##*/}" >/sys/bus/pci/drivers_probe
        VFIO_GROUP=/dev/vfio/$(basename "$(readlink "$d/iommu_group")")
        [ -c "$VFIO_GROUP" ] || fail "vfio-pci did not bind ${d##*/} ($VFIO_GROUP missing)"
    else
        echo 1 >"$d/enable" 2>/dev/null
    fi
    IVSHMEM=$d
    break
done

exec 3>"$CTL"
echo "READY $(cut -d' ' -f1 /proc/uptime)" >&3
echo "canal-vm: ready" >/dev/console

env -i ${IVSHMEM:+CANAL_IVSHMEM_DEVICE=$IVSHMEM} ${REGION_SIZE:+CANAL_REGION_SIZE=$REGION_SIZE} \
    ${VFIO_GROUP:+CANAL_IVSHMEM_VFIO_GROUP=$VFIO_GROUP} \
    /bin/chroot /newroot /bin/sh /run/canal-vm/cmd.sh </dev/null >"$OUT" 2>"$ERR" 3>&-
rc=$?
echo "EXIT $rc" >&3
exec 3>&-
poweroff -f
