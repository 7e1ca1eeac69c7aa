#!/usr/bin/env bash
# Configures and builds zshard into build/ (release) or, with --asan, build-asan/
# (AddressSanitizer + UndefinedBehaviorSanitizer).  Prints the build directory on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build
flags=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--asan" ]; then
  dir=$root/build-asan
  flags=(-DCMAKE_BUILD_TYPE=Debug -DZS_SANITIZE=ON -DZS_BENCH=OFF)
fi
"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$dir" "${flags[@]}" >&2
cmake --build "$dir" -j "$(nproc)" >&2
echo "$dir"
