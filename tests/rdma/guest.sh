#!/usr/bin/env bash
# tests/rdma/guest.sh BUILD_DIR: the RDMA test suite, run inside the guest of
# tests/rdma/run.sh (which runs it by default).
#
# First the fabric: rxe0 and rxe1 must be there with port 1 active (ibv_devinfo), or nothing
# else runs.  Then BUILD_DIR/tests/test_transport_rdma, if it was built, the way CTest runs
# a unit test (from tests/, with ZSHARD set); then each tests/rdma/*.test.sh in name order,
# as `bash SCRIPT BUILD_DIR WORKDIR` with a fresh WORKDIR under /tmp.  Each test gets
# ZS_RDMA_TEST_TIMEOUT seconds (default 300) before it is killed and failed.  Exit 77 (no
# RDMA device found) is a failure here, not a skip: this guest has two.  Exit status 0 only
# if every test that ran passed.
set -uo pipefail
here=$(cd "$(dirname "$0")" >/dev/null && pwd)
root=$(cd "$here/../.." >/dev/null && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

if [ $# -ne 1 ]; then
  echo "usage: tests/rdma/guest.sh BUILD_DIR (inside the guest of tests/rdma/run.sh)" >&2
  exit 2
fi
if [ "${ZS_RDMA_GUEST:-}" != 1 ]; then
  echo "guest.sh: runs inside the RDMA test guest; use tests/rdma/run.sh $1" >&2
  exit 2
fi
build=$(cd "$1" >/dev/null && pwd) || {
  echo "guest.sh: build directory '$1' does not exist" >&2
  exit 2
}
per_test=${ZS_RDMA_TEST_TIMEOUT:-300}

# ---- the fabric ----
echo "guest.sh: RDMA devices (ibv_devinfo -l): $(ibv_devinfo -l 2>&1 | tail -n +2 | xargs)"
for dev in "$ZS_RDMA_DEV0" "$ZS_RDMA_DEV1"; do
  if ! info=$(ibv_devinfo -d "$dev" 2>&1); then
    echo "guest.sh: FAIL: no RDMA device $dev (ibv_devinfo -d $dev: $info)" >&2
    exit 1
  fi
  state=$(awk '$1 == "state:" { print $2; exit }' <<<"$info")
  layer=$(awk '$1 == "link_layer:" { print $2; exit }' <<<"$info")
  mtu=$(awk '$1 == "active_mtu:" { print $2; exit }' <<<"$info")
  echo "guest.sh: $dev: port 1 ${state:-no state}, link layer ${layer:-?}, active mtu ${mtu:-?}"
  if [ "$state" != PORT_ACTIVE ]; then
    echo "guest.sh: FAIL: $dev port 1 is ${state:-not listed}, expected PORT_ACTIVE" >&2
    exit 1
  fi
done

# ---- the tests ----
passed=() failed=() skipped=()

# run_test NAME DIR CMD...: runs CMD from DIR under the per-test limit; records the result.
run_test() {
  local name=$1 dir=$2
  shift 2
  echo "== $name"
  local start rc=0
  start=$(now_ms)
  (cd "$dir" && exec timeout -k 5 "$per_test" "$@") || rc=$?
  local ms=$(($(now_ms) - start))
  local took="$((ms / 1000)).$((ms % 1000 / 100)) s"
  case $rc in
    0)
      echo "-- PASS $name ($took)"
      passed+=("$name")
      return
      ;;
    124 | 137) echo "-- FAIL $name: killed after $per_test s (ZS_RDMA_TEST_TIMEOUT)" ;;
    77) echo "-- FAIL $name: exit 77, it found no RDMA device, but $ZS_RDMA_DEV0 and $ZS_RDMA_DEV1 are up" ;;
    *) echo "-- FAIL $name: exit $rc ($took)" ;;
  esac
  failed+=("$name")
}

unit=$build/tests/test_transport_rdma
if [ -x "$unit" ]; then
  run_test test_transport_rdma "$root/tests" env ZSHARD="$build/zshard" "$unit"
else
  echo "== test_transport_rdma: not built in $build; skipped"
  skipped+=(test_transport_rdma)
fi

# The sanitizer build's test too, when tests/run.sh names it: the backend's failure paths under
# ASan and UBSan, on real verbs.
asan_unit=${ZS_RDMA_ASAN_BUILD:+$ZS_RDMA_ASAN_BUILD/tests/test_transport_rdma}
if [ -n "$asan_unit" ] && [ -x "$asan_unit" ]; then
  run_test "test_transport_rdma (ASan + UBSan)" "$root/tests" env ZSHARD="$build/zshard" \
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$asan_unit"
fi

for script in "$here"/*.test.sh; do
  [ -f "$script" ] || continue
  name=$(basename "$script" .test.sh)
  work=$(mktemp -d "/tmp/zs-rdma-$name.XXXXXX")
  run_test "$name" "$root" bash "$script" "$build" "$work"
done

summary="guest.sh: ${#passed[@]} passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
[ ${#failed[@]} -eq 0 ] || summary+="; failed: ${failed[*]}"
echo "$summary"
[ ${#failed[@]} -eq 0 ]
