#!/usr/bin/env bash
# Installs the Debian packages zshard builds with, when some are missing.  Idempotent: with
# everything present it only checks (dpkg-query), so the README's commands stay fast.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libblis-openmp-dev   # sgemm whose bits do not depend on the thread count
  libjansson-dev       # JSON: config files and safetensors headers
  libprotobuf-c-dev protobuf-c-compiler   # control-plane messages
  libzmq3-dev          # control-plane transport (ROUTER/DEALER)
  clang libomp-dev     # the libFuzzer targets
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "zshard: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi
