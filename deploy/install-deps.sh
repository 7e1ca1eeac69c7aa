#!/usr/bin/env bash
# Installs the Debian packages zshard builds with, when some are missing.  Idempotent: with
# everything present it only checks (dpkg-query), so the README's commands stay fast.
#
# With --rdma-guest it also installs what tests/rdma/run.sh needs to boot a Debian kernel in
# qemu with soft-RoCE devices (docs/testing.md); those come without apt's recommended
# packages, which for qemu would pull in a desktop's worth of GUI libraries.
# With --tests, the tools only the test suite uses (tests/run.sh passes it), also without them.
# With --slurm, what tests/slurm/run.sh needs to run a private Slurm cluster (docs/slurm.md),
# also without them.
#
# Everything this script and the programs it runs print goes to stderr.  deploy/build.sh
# runs it, and callers capture build.sh's stdout as the build directory
# (`build=$(deploy/build.sh)` in deploy/main.sh and tests/run.sh); apt-get's progress lines
# on stdout once became part of that path ("build/zshard: File name too long").
exec 1>&2
set -euo pipefail

rdma_guest=0
tests=0
slurm=0
for arg in "$@"; do
  case $arg in
    --rdma-guest) rdma_guest=1 ;;
    --tests) tests=1 ;;
    --slurm) slurm=1 ;;
    *)
      echo "zshard: install-deps.sh: unknown option '$arg' (they are --rdma-guest, --tests and --slurm)" >&2
      exit 2
      ;;
  esac
done

packages=(
  build-essential cmake pkg-config
  libblis-openmp-dev   # sgemm whose bits do not depend on the thread count
  libjansson-dev       # JSON: config files and safetensors headers
  libprotobuf-c-dev protobuf-c-compiler   # control-plane messages
  libzmq3-dev          # control-plane transport (ROUTER/DEALER)
  libxxhash-dev        # XXH3 checksums of checkpoint files
  libsodium-dev        # job secrets, key derivation, the data plane's challenge-response
  liburing-dev         # io_uring: the partition servers' NVMe tier (server/nvme.h)
  libmicrohttpd-dev    # the Prometheus /metrics endpoint (server/metrics_http.h)
  libibverbs-dev ibverbs-providers   # the RDMA data plane (transport/rdma.c): libibverbs and its soft-RoCE provider
  clang libomp-dev     # the libFuzzer targets
  clang-format         # CI's format check (tests/format.sh); the code is formatted with 14
  python3              # the integration tests' file edits and JSON checks (nonfinite.sh, checkpoint_*.sh)
  iproute2             # ip and tc: the emulated multi-host tests' namespaces, bridge and shaping
)

# The test guest of tests/rdma/run.sh: a stock kernel booted by qemu from a busybox initramfs,
# which then runs the host's own binaries through a 9p view of its root file system.
guest_packages=(
  qemu-system-x86      # the guest machine (TCG where the host has no usable KVM)
  busybox-static       # the initramfs's only program: its init, insmod, mount, chroot
  kmod                 # depmod and modprobe --show-depends on the downloaded kernel
  cpio xz-utils zstd   # packing the initramfs; unpacking .ko.xz / .ko.zst modules
  iproute2             # ip (veth pair) and rdma (soft-RoCE links) inside the guest
  rdma-core ibverbs-utils ibverbs-providers   # ibv_devinfo, ibv_rc_pingpong, the rxe provider
  rdmacm-utils         # rping, for tests of the rdma_cm connection path
)

# Tools only the test suite runs (tests/run.sh asks for them with --tests), without apt's
# recommended packages.
test_packages=(
  systemd              # systemd-analyze verify of deploy/systemd (tests/integration/systemd_units.sh)
  python3-kubernetes python3-yaml   # the offline schema check of deploy/k8s (k8s_manifests.sh)
  prometheus           # scrapes a running job (metrics_prometheus.sh); without recommends: no node exporter daemon
)

# tests/slurm/run.sh: slurmctld and slurmd for a private cluster on loopback, sbatch and the other
# commands (munge comes as a dependency; the test cluster does not use it).
slurm_packages=(slurmctld slurmd slurm-client)

# missing_of PACKAGE...: sets missing to those not installed (one dpkg-query each).
missing_of() {
  missing=()
  local p
  for p in "$@"; do
    if ! grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)"; then
      missing+=("$p")
    fi
  done
}

# The groups installed without recommended packages: the guest's, the tests' tools, Slurm's.
lean=()
[ $rdma_guest -eq 0 ] || lean+=("${guest_packages[@]}")
[ $tests -eq 0 ] || lean+=("${test_packages[@]}")
[ $slurm -eq 0 ] || lean+=("${slurm_packages[@]}")
guest_missing=()
if [ ${#lean[@]} -gt 0 ]; then
  missing_of "${lean[@]}"
  guest_missing=("${missing[@]}")
fi
missing_of "${packages[@]}"
if [ ${#missing[@]} -eq 0 ] && [ ${#guest_missing[@]} -eq 0 ]; then
  exit 0
fi
all_missing=("${missing[@]}" "${guest_missing[@]}")

echo "zshard: installing ${all_missing[*]}" >&2
# sudo only when we are not root already: containers often run as root and have no sudo.
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "zshard: missing packages ${all_missing[*]}; run this as root or install sudo" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi
# `env` passes DEBIAN_FRONTEND through sudo, whose env_reset would otherwise drop it.  Every
# apt-get holds /tmp/zs-apt.lock (flock, util-linux: essential), which the project's shared
# machines use so that concurrent installs queue instead of failing on apt's own lock.
sudo_cmd+=(flock /tmp/zs-apt.lock)
if ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q; then
  echo "zshard: apt-get update failed (no network, or a broken /etc/apt/sources.list?);" \
    "cannot install ${all_missing[*]}" >&2
  exit 1
fi
if [ ${#missing[@]} -gt 0 ] &&
  ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; then
  echo "zshard: apt-get install ${missing[*]} failed" >&2
  exit 1
fi
if [ ${#guest_missing[@]} -gt 0 ] &&
  ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "${guest_missing[@]}"; then
  echo "zshard: apt-get install ${guest_missing[*]} failed" >&2
  exit 1
fi
