#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds the release and the sanitizer
# builds and runs every CTest test in both, then runs each libFuzzer target for a bounded
# time (ZS_FUZZ_SECONDS, default 20) in a clang build.  Exit status 0 only if all passed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
release=$("$root/deploy/build.sh")
asan=$("$root/deploy/build.sh" --asan)
status=0
echo "== release build: $release"
(cd "$release" && ctest --output-on-failure -j "$jobs" --timeout 900) || status=1
echo "== sanitizer build (ASan + UBSan): $asan"
(cd "$asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" --timeout 1800) || status=1
if ls "$root"/tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
  fuzz=$("$root/deploy/build.sh" --fuzz)
  echo "== fuzz targets (clang, libFuzzer): $fuzz"
  (cd "$fuzz" && cmake -DZS_FUZZ_SECONDS="${ZS_FUZZ_SECONDS:-20}" . >/dev/null &&
     ctest --output-on-failure -L fuzz --timeout 600) || status=1
fi
exit $status
