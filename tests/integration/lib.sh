# Helpers for the integration tests: each test is `bash TEST.sh ZSHARD WORKDIR`.
set -euo pipefail
ZSHARD=$1
WORK=$2
DATA=$(cd "$(dirname "${BASH_SOURCE[0]}")/../data" && pwd)
rm -rf "$WORK"
mkdir -p "$WORK"
failures=0
checks=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_fail NEEDLE CMD...: CMD exits non-zero and its stderr contains NEEDLE.
expect_fail() {
  local needle=$1
  shift
  checks=$((checks + 1))
  local rc=0
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  if [ $rc -eq 0 ]; then
    fail "'$*' succeeded, expected failure with '$needle'"
  elif ! grep -qF -- "$needle" "$WORK/err.txt"; then
    fail "'$*' (exit $rc): stderr lacks '$needle': $(cat "$WORK/err.txt")"
  fi
}

# expect_ok CMD...: CMD exits 0.
expect_ok() {
  checks=$((checks + 1))
  if ! "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"; then
    fail "'$*' failed: $(tail -n 5 "$WORK/err.txt")"
  fi
}

# metrics_without_timing FILE: the metrics with the wall-clock fields removed, and the
# checkpoint outcomes (a distributed run's lines say which checkpoint their step committed;
# zshard train writes none).
metrics_without_timing() {
  sed -E -e 's/, "(tokens_per_sec|step_ms|compute_ms|fetch_wait_ms|push_wait_ms)": [^,}]*//g' \
    -e 's/, "checkpoint(_error)?": "([^"\\]|\\.)*"//g' "$1"
}

finish() {
  if [ $failures -gt 0 ]; then
    echo "$(basename "$0"): $failures of $checks checks failed" >&2
    exit 1
  fi
  echo "$(basename "$0"): $checks checks passed"
}
