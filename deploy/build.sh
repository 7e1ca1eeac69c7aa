#!/usr/bin/env bash
# Configures and builds zshard into build/ (release) or, with --asan, build-asan/
# (AddressSanitizer + UndefinedBehaviorSanitizer) or, with --fuzz, build-fuzz/ (clang, the
# libFuzzer targets only).
#
# Prints exactly one line on stdout, the build directory, because callers capture it
# (`build=$(deploy/build.sh)`).  Every other command's output therefore goes to stderr,
# including the installer's, even though install-deps.sh already sends its own there.
set -euo pipefail
# cd prints the directory it went to when CDPATH resolves it; that would leak into $root.
root=$(cd "$(dirname "$0")/.." >/dev/null && pwd)
dir=$root/build
flags=(-DCMAKE_BUILD_TYPE=Release)
targets=()
case "${1:-}" in
  '') ;;
  --asan)
    dir=$root/build-asan
    # The CUDA kernels are built (and their GPU test compiled) by the release build only.
    flags=(-DCMAKE_BUILD_TYPE=Debug -DZS_SANITIZE=ON -DZS_BENCH=OFF -DZS_CUDA=OFF) ;;
  --fuzz)
    # clang + libFuzzer; only the fuzz targets are built here.
    dir=$root/build-fuzz
    export CC=clang
    flags=(-DCMAKE_BUILD_TYPE=Debug -DZS_FUZZ=ON -DZS_BENCH=OFF -DZS_CUDA=OFF)
    targets=(--target fuzz_all) ;;
  *)
    # A typo must not silently give a release build in the wrong directory.
    echo "usage: deploy/build.sh [--asan | --fuzz]; got '$1'" >&2
    exit 2 ;;
esac
"$root/deploy/install-deps.sh" >&2
cmake -S "$root" -B "$dir" "${flags[@]}" >&2
cmake --build "$dir" -j "$(nproc)" "${targets[@]}" >&2
printf '%s\n' "$dir"
