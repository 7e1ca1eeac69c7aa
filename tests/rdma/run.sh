#!/usr/bin/env bash
# tests/rdma/run.sh BUILD_DIR [-- CMD ARGS...]: runs CMD on real RDMA verbs, on a machine
# without RDMA hardware.  It boots a stock Debian kernel in qemu (TCG, unless KVM with real
# VMX/SVM works), whose rdma_rxe module makes two soft-RoCE devices, rxe0 and rxe1, on the
# two ends of a veth pair (tests/rdma/fabric.sh).  CMD runs as root in the host's own root
# file system, seen read-only through 9p with a tmpfs overlay on top, from the repository's
# root, with ZS_RDMA_GUEST=1: binaries built on the host run there unchanged.  The default
# CMD is `bash tests/rdma/guest.sh BUILD_DIR`, the RDMA test suite.
#
# CMD's output comes out on the guest's serial console, which is this script's stdout; the
# kernel's own messages are silenced unless ZS_RDMA_VERBOSE=1.  The exit status is CMD's.
#
# The guest (kernel, initramfs) is built once per kernel version under ZS_RDMA_CACHE
# (default BUILD_DIR/rdma-guest) and reused: the kernel package is the one linux-image-amd64
# depends on, fetched with apt-get download.  Besides the cache, the run leaves nothing: its
# scratch files live in a temporary folder it removes.  Environment (docs/testing.md):
#   ZS_RDMA_TIMEOUT    seconds for the boot and CMD together, default 450; qemu is killed then
#   ZS_RDMA_CACHE      where prepared guests are kept
#   ZS_RDMA_VERBOSE=1  the kernel's console messages and the guest init's steps too
#   ZS_RDMA_ACCEL      kvm or tcg, to override the choice
#   ZS_RDMA_KERNEL_PKG a linux-image-* package other than linux-image-amd64's
# Every ZS_* variable of this environment is passed on to CMD.
set -euo pipefail

usage() {
  echo "usage: tests/rdma/run.sh BUILD_DIR [-- CMD ARGS...]" >&2
  exit 2
}
die() {
  echo "tests/rdma/run.sh: $*" >&2
  exit 1
}

# cd prints the directory it went to when CDPATH resolves it; that would leak into $root.
root=$(cd "$(dirname "$0")/../.." >/dev/null && pwd)
here=$root/tests/rdma
[ $# -ge 1 ] || usage
[ -d "$1" ] || die "build directory '$1' does not exist"
build=$(cd "$1" >/dev/null && pwd)
shift
if [ $# -gt 0 ]; then
  [ "$1" = -- ] || usage
  shift
fi
if [ $# -gt 0 ]; then
  cmd=("$@")
else
  cmd=(bash tests/rdma/guest.sh "$build")
fi

timeout_s=${ZS_RDMA_TIMEOUT:-450}
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "ZS_RDMA_TIMEOUT='$timeout_s' is not a positive whole number of seconds"
cache=${ZS_RDMA_CACHE:-$build/rdma-guest}
verbose=${ZS_RDMA_VERBOSE:-0}

arch=$(dpkg --print-architecture 2>/dev/null || true)
[ "$arch" = amd64 ] || die "the guest is an amd64 Debian kernel; this host is '${arch:-not Debian}'"
"$root/deploy/install-deps.sh" --rdma-guest || die "could not install the guest's packages"

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zs-rdma.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the guest: kernel and initramfs, cached per kernel version ----

# The modules the initramfs loads (with what they depend on, in order).  virtio_pci and the
# 9p ones reach the host's files; overlay puts a writable layer on them; veth and rdma_rxe
# make the fabric; rdma_ucm is rdma_cm's user interface, for tests that connect through it.
# rdma_rxe needs a "crc32" hash, which only crc32_generic provides in Debian's kernels, and
# nothing pulls it in, so it is named first.  bridge, sch_tbf and sch_netem are for the
# emulated multi-host tests (tests/multihost/netns.sh: links with delay and loss).
modules=(crc32_generic virtio_pci 9pnet_virtio 9p overlay veth rdma_rxe rdma_ucm bridge sch_tbf sch_netem)
# The guest's layout as built below; bump it when build_guest changes what it writes, so
# that cached guests are rebuilt.
layout=4
recipe=$({
  echo "layout $layout modules ${modules[*]}"
  sha256sum <"$here/init.sh"
  sha256sum </bin/busybox
} | sha256sum | cut -c1-16)

# kernel_package: prints the linux-image-VERSION package linux-image-amd64 depends on, or
# nothing if apt does not know (no package lists yet).
kernel_package() {
  if [ -n "${ZS_RDMA_KERNEL_PKG:-}" ]; then
    echo "$ZS_RDMA_KERNEL_PKG"
    return
  fi
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

# build_guest DIR KPKG KVER: downloads KPKG into DIR (unless it is there already), unpacks
# it in the scratch folder, and writes DIR/kernel and DIR/initrd.cpio: busybox, the modules
# (uncompressed: busybox's insmod reads plain .ko only) and tests/rdma/init.sh as /init.
build_guest() {
  local dir=$1 kpkg=$2 kver=$3
  local debs=("$dir/${kpkg}"_*.deb)
  if [ ! -f "${debs[0]}" ]; then
    echo "tests/rdma/run.sh: downloading $kpkg" >&2
    # As root, apt would try to hand the download to its _apt user, who cannot write here.
    (cd "$dir" && apt-get download -q -o APT::Sandbox::User="$(id -un)" "$kpkg") >&2 ||
      die "apt-get download $kpkg failed"
    debs=("$dir/${kpkg}"_*.deb)
  fi
  local kroot=$tmp/kernel staging=$tmp/initramfs
  rm -rf "$kroot" "$staging"
  dpkg-deb -x "${debs[0]}" "$kroot" || die "cannot unpack ${debs[0]}"
  [ -f "$kroot/boot/vmlinuz-$kver" ] || die "${debs[0]} has no boot/vmlinuz-$kver"
  depmod -b "$kroot" "$kver" || die "depmod of $kver failed"

  mkdir -p "$staging/bin" "$staging/modules"
  if ldd /bin/busybox >/dev/null 2>&1; then
    die "/bin/busybox is linked dynamically; the initramfs needs busybox-static's"
  fi
  cp /bin/busybox "$staging/bin/busybox"
  local m deps kind ko name
  : >"$staging/modules/order"
  for m in "${modules[@]}"; do
    # -C /dev/null: the host's modprobe.d (blacklists, options) is not the guest's business.
    deps=$(modprobe -C /dev/null -d "$kroot" -S "$kver" --show-depends "$m" 2>&1) ||
      die "kernel $kver has no module $m: $deps"
    while read -r kind ko _; do
      [ "$kind" = insmod ] || continue # "builtin NAME": nothing to load
      name=${ko##*/}
      name=${name%.xz}
      name=${name%.zst}
      ! grep -qxF "$name" "$staging/modules/order" || continue
      case $ko in
        *.xz) xz -dc "$ko" >"$staging/modules/$name" ;;
        *.zst) zstd -qdc "$ko" >"$staging/modules/$name" ;;
        *) cp "$ko" "$staging/modules/$name" ;;
      esac
      echo "$name" >>"$staging/modules/order"
    done <<<"$deps"
  done
  cp "$here/init.sh" "$staging/init"
  chmod 755 "$staging/init" "$staging/bin/busybox"
  # Uncompressed: unpacking it is the guest kernel's work, and emulated work is slow.
  (cd "$staging" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) \
    >"$dir/initrd.cpio" || die "packing the initramfs failed"
  unpacked_kernel "$kroot/boot/vmlinuz-$kver" "$dir/kernel" ||
    cp "$kroot/boot/vmlinuz-$kver" "$dir/kernel"
  echo "$recipe" >"$dir/recipe"
  rm -rf "$kroot" "$staging"
}

# unpacked_kernel BZIMAGE OUT: writes to OUT the ELF kernel inside BZIMAGE if it is
# xz-compressed and can start at its PVH entry point (a Xen PHYS32_ENTRY note, type 0x12);
# qemu then loads it as it is.  Under TCG, the bzImage's own decompressor takes ~3.5 s of
# every boot.  Returns 1 (and writes nothing) otherwise.
unpacked_kernel() {
  local bzimage=$1 out=$2 offset
  offset=$(LC_ALL=C grep -m 1 -aboP '\xfd7zXZ\x00' "$bzimage" | cut -d: -f1)
  [ -n "$offset" ] || return 1
  # xz stops at the end of its stream; a pipe from tail would then fail with SIGPIPE.
  if xz -dc --single-stream < <(tail -c +$((offset + 1)) "$bzimage") >"$out.new" 2>/dev/null &&
    [ "$(head -c 4 "$out.new" | od -An -c | tr -d ' ')" = 177ELF ] &&
    grep -q 'Xen .*(0x00000012)' <<<"$(readelf -n "$out.new" 2>/dev/null)"; then
    mv "$out.new" "$out"
    return 0
  fi
  rm -f "$out.new"
  return 1
}

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 900 9 || die "another run has held $cache/.lock for 15 minutes"
kpkg=$(kernel_package)
if [ -z "$kpkg" ]; then
  echo "tests/rdma/run.sh: apt does not know linux-image-amd64 yet; running apt-get update" >&2
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || true
  kpkg=$(kernel_package)
fi
if [ -z "$kpkg" ]; then
  # Offline, with a guest already prepared: use it rather than fail.
  cached=("$cache"/*/recipe)
  if [ ${#cached[@]} -ne 1 ] || [ ! -f "${cached[0]}" ]; then
    die "cannot tell which kernel linux-image-amd64 means (apt-cache depends), and no single cached guest in $cache"
  fi
  kpkg=linux-image-$(basename "$(dirname "${cached[0]}")")
  echo "tests/rdma/run.sh: apt knows no linux-image-amd64; using the cached $kpkg" >&2
fi
kver=${kpkg#linux-image-}
guest=$cache/$kver
if [ -f "$guest/kernel" ] && [ -f "$guest/initrd.cpio" ] &&
  [ "$(cat "$guest/recipe" 2>/dev/null)" = "$recipe" ]; then
  [ "$verbose" != 1 ] || echo "tests/rdma/run.sh: cached guest $guest" >&2
else
  echo "tests/rdma/run.sh: preparing the guest for kernel $kver in $guest (once per kernel)" >&2
  prep_start=$SECONDS
  mkdir -p "$guest"
  # All but the downloaded package goes: the recipe first, so a half-built guest is not used.
  rm -f "$guest/recipe"
  find "$guest" -mindepth 1 -maxdepth 1 ! -name "${kpkg}_*.deb" -exec rm -rf {} +
  touch "$guest/.zs-rdma-guest"
  build_guest "$guest" "$kpkg" "$kver"
  echo "tests/rdma/run.sh: guest prepared in $((SECONDS - prep_start)) s" >&2
fi
# Guests of other kernels are stale now; only folders this script made are removed.
for old in "$cache"/*/.zs-rdma-guest; do
  old=$(dirname "$old")
  [ "$old" = "$guest" ] || [ ! -d "$old" ] || rm -rf "$old"
done
exec 9>&-

# ---- the run ----

accel=${ZS_RDMA_ACCEL:-}
if [ -z "$accel" ]; then
  # KVM only where the CPU has VMX/SVM: a paravirtual /dev/kvm (kvm_pvm) cannot boot a stock
  # kernel.  TCG is slow (tens of MB/s over RoCE) but exact.
  accel=tcg
  if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && [ ! -d /sys/module/kvm_pvm ]; then
    accel=kvm
  fi
fi
case $accel in
  kvm) accel_args=(-accel kvm -cpu host) ;;
  tcg) accel_args=(-accel "tcg,thread=multi" -cpu max) ;;
  *) die "ZS_RDMA_ACCEL='$accel': expected kvm or tcg" ;;
esac

# nohz=off: with a tickless kernel under TCG, two processes polling on two vCPUs wait up to
# a tick for each other and every round trip takes milliseconds.
append="console=ttyS0 panic=-1 nohz=off"
if [ "$verbose" = 1 ]; then
  append+=" loglevel=7 zs.verbose=1"
else
  append+=" loglevel=1"
fi

mkdir "$tmp/ctl"
{
  echo "# Written by tests/rdma/run.sh; the guest's init runs it in the host's root."
  printf 'cd %q || exit 1\n' "$root"
  echo "export ZS_RDMA_GUEST=1"
  while IFS= read -r name; do
    [ "$name" = ZS_RDMA_GUEST ] || printf 'export %s=%q\n' "$name" "${!name}"
  done < <(compgen -e | grep '^ZS_' || true)
  printf 'exec bash tests/rdma/fabric.sh'
  printf ' %q' "${cmd[@]}"
  echo
} >"$tmp/ctl/job"

qemu_args=(
  "${accel_args[@]}" -smp 2 -m 3G
  -kernel "$guest/kernel" -initrd "$guest/initrd.cpio" -append "$append"
  -nodefaults -no-user-config -display none -nic none -no-reboot -serial stdio
  # SeaBIOS would otherwise draw its banner, with terminal escapes, on the serial port.
  -fw_cfg "name=etc/sercon-port,string=0"
  # The host's /, read-only; multidevs=remap keeps inode numbers unique across its mounts.
  -virtfs "local,path=/,mount_tag=zs_root,security_model=none,readonly=on,multidevs=remap,id=zs_root"
  # (qemu reads a doubled comma as a comma in a value.)
  -virtfs "local,path=${tmp//,/,,}/ctl,mount_tag=zs_ctl,security_model=none,id=zs_ctl"
)
echo "tests/rdma/run.sh: booting kernel $kver ($accel), limit ${timeout_s} s: ${cmd[*]}" >&2
run_start=$SECONDS
# --foreground keeps qemu in this process group, so that ^C reaches it.  The console turns
# each newline into CR LF; sed takes the CRs off, line by line as they come, and drops
# qemu's warning that etc/sercon-port is not an opt/ name (SeaBIOS reads that name).
set +e
timeout --foreground -k 10 "$timeout_s" qemu-system-x86_64 "${qemu_args[@]}" </dev/null 2>&1 |
  sed -u -e 's/\r$//' -e '/etc\/sercon-port.*should be prefixed with "opt\/"/d'
qemu_rc=${PIPESTATUS[0]}
set -e
elapsed=$((SECONDS - run_start))
if [ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ]; then
  die "timed out: the guest had not finished after ${timeout_s} s (ZS_RDMA_TIMEOUT); qemu was killed"
fi
if [ ! -f "$tmp/ctl/status" ]; then
  die "the guest stopped after ${elapsed} s without the command's exit status (qemu exit $qemu_rc);" \
    "see the console above; ZS_RDMA_VERBOSE=1 shows the kernel's messages"
fi
status=$(cat "$tmp/ctl/status")
[[ $status =~ ^[0-9]+$ ]] || die "the guest reported the status '$status'"
echo "tests/rdma/run.sh: exit status $status after ${elapsed} s in the guest" >&2
exit "$status"
