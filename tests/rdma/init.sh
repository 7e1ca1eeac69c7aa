#!/bin/busybox sh
# shellcheck shell=dash
# PID 1 of the RDMA test guest (tests/rdma/run.sh packs it into the initramfs as /init).
#
# It loads the kernel modules listed in /modules/order, then builds the root the test runs
# in: the host's / (9p tag zs_root, read-only) under an overlay whose upper layer is a tmpfs,
# so the host's programs, libraries and build tree run unchanged and whatever the test
# writes stays in the guest.  The host's control folder (9p tag zs_ctl, read-write) appears
# there as /run/zs-rdma-guest: it holds `job`, the script to run, and receives `status`, the
# job's exit status, which is how the host learns the result.  Then the machine powers off.
#
# Only busybox is here; everything after the chroot (ip, rdma, bash, the tests) is the
# host's.  The kernel's own messages are silenced (loglevel=1 on the command line, and
# printk below) so that the console carries the test's output; zs.verbose=1 on the command
# line (ZS_RDMA_VERBOSE=1 on the host) keeps them and narrates each step.
#
# Changing this file changes the initramfs: run.sh hashes it into the cache key.

/bin/busybox mkdir -p /bin /proc /sys /dev /lower /upper /host
/bin/busybox --install -s /bin
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The kernel opens the console before /init runs; if the initramfs had no /dev/console then,
# fds 0-2 are closed.  Reopen them on the real console to be sure the output gets out.
exec </dev/console >/dev/console 2>&1

verbose=0
case " $(cat /proc/cmdline) " in *" zs.verbose=1 "*) verbose=1 ;; esac
[ $verbose -eq 1 ] || echo 1 >/proc/sys/kernel/printk

say() {
  [ $verbose -eq 0 ] || echo "rdma guest init: $*"
}

# die MESSAGE: reports a setup failure with the kernel's last words and powers off without
# a status file; the host then says that the guest failed before the job ran.
die() {
  echo "rdma guest init: $*"
  dmesg | tail -n 25
  poweroff -f
  sleep 60 # PID 1 must not exit while the power-off is under way
}

say "kernel $(uname -r) up at $(cut -d' ' -f1 /proc/uptime) s"
while read -r ko; do
  insmod "/modules/$ko" || die "insmod $ko failed"
done </modules/order
say "modules loaded at $(cut -d' ' -f1 /proc/uptime) s"

# virtio-pci probes its devices as the module loads, but give the 9p transport a moment to
# register the tags before calling the first mount a failure.  The host's root is mounted
# with cache=loose (the guest keeps what it read): the host leaves those files alone while
# the short-lived guest runs, and it saves a second of 9p round trips per run.
opts=trans=virtio,version=9p2000.L,msize=262144
tries=0
until mount -t 9p -o "$opts,ro,cache=loose" zs_root /lower 2>/dev/null; do
  tries=$((tries + 1))
  [ $tries -lt 50 ] || die "cannot mount the host's root (9p tag zs_root)"
  sleep 0.1
done
mount -t tmpfs -o mode=0755 upper /upper || die "tmpfs for the overlay's upper layer"
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /host ||
  die "overlay of the host's root over tmpfs failed"
mount -t proc proc /host/proc || die "proc in the new root"
mount -t sysfs sysfs /host/sys || die "sysfs in the new root"
mount -t devtmpfs devtmpfs /host/dev || die "devtmpfs in the new root"
mkdir -p /host/dev/shm /host/dev/pts
mount -t tmpfs -o mode=1777 shm /host/dev/shm || die "tmpfs on /dev/shm"
mount -t devpts devpts /host/dev/pts || die "devpts"
# What udev would make: bash's process substitution reads /dev/fd/N.
ln -sf /proc/self/fd /host/dev/fd
ln -sf /proc/self/fd/0 /host/dev/stdin
ln -sf /proc/self/fd/1 /host/dev/stdout
ln -sf /proc/self/fd/2 /host/dev/stderr
# A fresh /run, as on a booted system: the host's runtime files mean nothing here.
mount -t tmpfs -o mode=0755 run /host/run || die "tmpfs on /run"
mkdir -p /host/run/zs-rdma-guest
mount -t 9p -o "$opts" zs_ctl /host/run/zs-rdma-guest ||
  die "cannot mount the control folder (9p tag zs_ctl)"
[ -f /host/run/zs-rdma-guest/job ] || die "the control folder has no job"
say "root ready at $(cut -d' ' -f1 /proc/uptime) s; running the job"

# The job gets a clean environment: what it needs it exports itself (run.sh writes it).
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  TERM=dumb LANG=C.UTF-8 chroot /host /bin/bash /run/zs-rdma-guest/job </dev/null
status=$?
say "job exited $status at $(cut -d' ' -f1 /proc/uptime) s"
echo "$status" >/host/run/zs-rdma-guest/status
sync
# Even at loglevel 1 the kernel announces the power-off; after the job, nothing it says
# matters unless it was asked to speak.
[ $verbose -eq 1 ] || echo 0 >/proc/sys/kernel/printk
poweroff -f
sleep 60
