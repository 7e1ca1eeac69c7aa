#!/usr/bin/env bash
# Installs the Debian packages zshard builds with, when some are missing.  Idempotent: with
# everything present it only checks (dpkg-query), so the README's commands stay fast.
#
# Everything this script and the programs it runs print goes to stderr.  deploy/build.sh
# runs it, and callers capture build.sh's stdout as the build directory
# (`build=$(deploy/build.sh)` in deploy/main.sh and tests/run.sh); apt-get's progress lines
# on stdout once became part of that path ("build/zshard: File name too long").
exec 1>&2
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libblis-openmp-dev   # sgemm whose bits do not depend on the thread count
  libjansson-dev       # JSON: config files and safetensors headers
  libprotobuf-c-dev protobuf-c-compiler   # control-plane messages
  libzmq3-dev          # control-plane transport (ROUTER/DEALER)
  libxxhash-dev        # XXH3 checksums of checkpoint files
  libsodium-dev        # job secrets, key derivation, the data plane's challenge-response
  liburing-dev         # io_uring: the partition servers' NVMe tier (server/nvme.h)
  clang libomp-dev     # the libFuzzer targets
  clang-format         # CI's format check (tests/format.sh); the code is formatted with 14
  python3              # the integration tests' file edits and JSON checks (nonfinite.sh, checkpoint_*.sh)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "zshard: installing ${missing[*]}" >&2
# sudo only when we are not root already: containers often run as root and have no sudo.
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "zshard: missing packages ${missing[*]}; run this as root or install sudo" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi
# `env` passes DEBIAN_FRONTEND through sudo, whose env_reset would otherwise drop it.
if ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q; then
  echo "zshard: apt-get update failed (no network, or a broken /etc/apt/sources.list?);" \
    "cannot install ${missing[*]}" >&2
  exit 1
fi
if ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; then
  echo "zshard: apt-get install ${missing[*]} failed" >&2
  exit 1
fi
