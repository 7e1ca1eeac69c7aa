#!/usr/bin/env bash
# Configures and builds zshard into build/ (release) or, with --asan, build-asan/
# (AddressSanitizer + UndefinedBehaviorSanitizer) or, with --fuzz, build-fuzz/ (clang, the
# libFuzzer targets only).  Prints the build directory on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build
flags=(-DCMAKE_BUILD_TYPE=Release)
targets=()
case "${1:-}" in
  --asan)
    dir=$root/build-asan
    flags=(-DCMAKE_BUILD_TYPE=Debug -DZS_SANITIZE=ON -DZS_BENCH=OFF) ;;
  --fuzz)
    # clang + libFuzzer; only the fuzz targets are built here.
    dir=$root/build-fuzz
    export CC=clang
    flags=(-DCMAKE_BUILD_TYPE=Debug -DZS_FUZZ=ON -DZS_BENCH=OFF)
    targets=(--target fuzz_all) ;;
esac
"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$dir" "${flags[@]}" >&2
cmake --build "$dir" -j "$(nproc)" "${targets[@]}" >&2
echo "$dir"
