#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds the release and the sanitizer
# builds, checks the C sources' formatting (tests/format.sh) and the shell scripts' pipes
# (tests/shell_lint.sh), runs every CTest test in both
# builds, then runs each libFuzzer target for a bounded time (ZS_FUZZ_SECONDS, default 20) in
# a clang build, then the RDMA tests in a qemu guest with soft-RoCE (tests/rdma/run.sh; the
# sanitizer build's test_transport_rdma too), then, in a second boot of that guest, whose
# kernel has netem, the emulated multi-host run over lossy links (tests/rdma/multihost_netem.sh),
# then deploy/slurm's scripts against a private Slurm (tests/slurm/run.sh).  Exit status 0
# only if all passed.
set -euo pipefail
# cd prints the directory it went to when CDPATH resolves it; that would leak into $root.
root=$(cd "$(dirname "$0")/.." >/dev/null && pwd)
jobs=$(nproc)

# build_dir [FLAG]: runs deploy/build.sh and prints the build directory it printed, the only
# thing captured; the installer and compiler output go to stderr.  Anything else on that
# stdout would otherwise surface later as a baffling `cd` error.
build_dir() {
  local dir
  dir=$("$root/deploy/build.sh" "$@") || return
  if [ ! -d "$dir" ]; then
    echo "tests/run.sh: deploy/build.sh${*:+ $*} printed '$dir', not a build directory" >&2
    return 1
  fi
  printf '%s\n' "$dir"
}

# The tools only tests use (systemd-analyze, the Kubernetes schema check's modules).
"$root/deploy/install-deps.sh" --tests
release=$(build_dir)
asan=$(build_dir --asan)
status=0
# The format check runs after the builds because build.sh's installer brings clang-format.
echo "== format check (clang-format --dry-run -Werror over the tracked *.c *.h *.cu)"
"$root/tests/format.sh" || status=1
echo "== shell lint (no pipe into grep -q or -m: it fails under pipefail when grep stops early)"
"$root/tests/shell_lint.sh" || status=1
echo "== release build: $release"
(cd "$release" && ctest --output-on-failure -j "$jobs" --timeout 900) || status=1
echo "== sanitizer build (ASan + UBSan): $asan"
(cd "$asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" --timeout 1800) || status=1
if ls "$root"/tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
  fuzz=$(build_dir --fuzz)
  echo "== fuzz targets (clang, libFuzzer): $fuzz"
  (cd "$fuzz" && cmake -DZS_FUZZ_SECONDS="${ZS_FUZZ_SECONDS:-20}" . >/dev/null &&
     ctest --output-on-failure -L fuzz --timeout 600) || status=1
fi
echo "== RDMA data plane (qemu + soft-RoCE guest): tests/rdma/run.sh"
ZS_RDMA_ASAN_BUILD=$asan "$root/tests/rdma/run.sh" "$release" || status=1
echo "== multi-host emulation over links with 50 us of delay and 1% loss (netem, in the same guest"
echo "   kernel: the host's has no sch_netem): tests/rdma/multihost_netem.sh"
ZS_RDMA_TIMEOUT=${ZS_NETEM_TIMEOUT:-300} "$root/tests/rdma/run.sh" "$release" -- \
  bash tests/rdma/multihost_netem.sh "$release" /tmp/zs-multihost-netem || status=1
echo "== Slurm batch scripts (a private slurmctld + 3 slurmd on loopback): tests/slurm/run.sh"
"$root/tests/slurm/run.sh" "$release" || status=1
exit $status
