# Helpers for the integration tests: each test is `bash TEST.sh ZSHARD WORKDIR`.
set -euo pipefail
ZSHARD=$1
WORK=$2
DATA=$(cd "$(dirname "${BASH_SOURCE[0]}")/../data" && pwd)
rm -rf "$WORK"
mkdir -p "$WORK"
# Every process a test starts proves this job secret (docs/security.md): the roles read
# ZSHARD_SECRET_FILE, and zshard launch passes it on to its children.
"$ZSHARD" keygen "$WORK/secret" 2>/dev/null
export ZSHARD_SECRET_FILE=$WORK/secret
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
# checkpoint outcomes (a line says which checkpoint its step committed, and a distributed run
# and zshard train may checkpoint at other steps: Ctrl-C, a resume).
metrics_without_timing() {
  sed -E -e 's/, "(tokens_per_sec|step_ms|compute_ms|fetch_wait_ms|push_wait_ms)": [^,}]*//g' \
    -e 's/, "checkpoint(_error)?": "([^"\\]|\\.)*"//g' "$1"
}

# alive PID: the process exists and is not a zombie.
alive() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# gone PID: the process has exited (or is a zombie).
gone() {
  ! alive "$1"
}

# now_ms: the wall clock in milliseconds.
now_ms() {
  echo $(($(date +%s%N) / 1000000))
}

# until_ms END CMD...: polls CMD every 20 ms until it succeeds; 1 if it did not by END (ms).
until_ms() {
  local end=$1
  shift
  until "$@"; do
    [ "$(now_ms)" -lt "$end" ] || return 1
    sleep 0.02
  done
}

# wait_until SECONDS CMD...: until_ms, SECONDS from now.
wait_until() {
  local end=$(($(now_ms) + $1 * 1000))
  shift
  until_ms $end "$@"
}

# latest_step DIR: the step of DIR/latest ("step-00000012" -> 12), or 0.
latest_step() {
  local name=
  read -r name 2>/dev/null <"$1/latest" || true
  name=${name#step-}
  echo $((10#${name:-0}))
}

# ckpt_at_least DIR K: a checkpoint of step >= K is committed in DIR.
ckpt_at_least() {
  [ "$(latest_step "$1")" -ge "$2" ]
}

# options_in_help WHERE COMMAND ARG...: checks that every --option among ARGs is one that
# `zshard COMMAND --help` lists (a deployment file's command line against the binary).
options_in_help() {
  local where=$1 cmd=$2 help w
  shift 2
  checks=$((checks + 1))
  help=$("$ZSHARD" "$cmd" --help) || fail "$where: zshard $cmd --help failed"
  for w in "$@"; do
    case $w in
      --*)
        checks=$((checks + 1))
        grep -qe "$w " <<<"$help" || fail "$where: zshard $cmd has no option $w"
        ;;
    esac
  done
}

# has_line FILE PATTERN: FILE has a line matching PATTERN (grep -E); no check counted.
has_line() {
  grep -qE -- "$2" "$1" 2>/dev/null
}

# reap PID: waits for PID (which has exited or will) and sets RC to its status.
reap() {
  # Never unbounded: a process that outlives ZS_REAP_SECONDS (600 by default; a coordinator
  # whose worker died waits for a new one) is killed, and RC is 124.
  local limit=${ZS_REAP_SECONDS:-600}
  RC=0
  if ! until_ms $(($(now_ms) + limit * 1000)) gone "$1"; then
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    RC=124
    fail "process $1 did not exit within $limit s; killed"
    return
  fi
  wait "$1" 2>/dev/null || RC=$?
}

# has NAME FILE NEEDLE: a check that FILE contains NEEDLE (grep -F).
has() {
  checks=$((checks + 1))
  grep -qF -- "$3" "$2" || fail "$1: $2 lacks '$3': $(tail -n 8 "$2")"
}

# expect_log NAME FILE REGEX: a check that FILE has a line matching REGEX (grep -E).
expect_log() {
  checks=$((checks + 1))
  grep -qE -- "$3" "$2" || fail "$1: $2 has no line matching '$3': $(tail -n 8 "$2")"
}

# pid_of ERRFILE NAME: the pid the launcher first printed as "NAME (pid N)" ("server 2", "coord").
pid_of() {
  sed -n "/$2 (pid /{s/.*$2 (pid \\([0-9]*\\)).*/\\1/p;q}" "$1"
}

# pids_of ERRFILE: every "(pid N)" the launcher printed.
pids_of() { { grep -o '(pid [0-9]*)' "$1" || true; } | tr -dc '0-9\n' | sort -u; }

# wait_endpoint LOG SECONDS [PID]: sets EP to where the coordinator logging to LOG listens,
# polled until it says so; 1 (EP empty) after SECONDS, or once PID has exited.
wait_endpoint() {
  local end=$(($(now_ms) + $2 * 1000))
  EP=
  while :; do
    EP=$(sed -nE 's/.*coord: listening on (tcp:\/\/127\.0\.0\.1:[0-9]+).*/\1/p' "$1" 2>/dev/null) || EP=
    [ -z "$EP" ] || return 0
    [ "$(now_ms)" -lt $end ] || return 1
    [ -z "${3:-}" ] || alive "$3" || return 1
    sleep 0.05
  done
}

# same_bits NAME OUT REF: checks that OUT's model.safetensors is REF's, bitwise, and its
# metrics.jsonl too, less timings, checkpoint outcomes and worker counts.
same_bits() {
  checks=$((checks + 2))
  cmp -s "$3/model.safetensors" "$2/model.safetensors" ||
    fail "$1: model.safetensors differs from $3's"
  diff <(metrics_compared "$3/metrics.jsonl") <(metrics_compared "$2/metrics.jsonl") >/dev/null ||
    fail "$1: metrics.jsonl differs from $3's beyond timings"
}

# start_coord LOG CONFIG STEPS OUT: `zshard coord` on a loopback port of its choosing for
# SERVERS servers (default 1) and DATAFILE (default tiny.txt), stderr in LOG; sets COORD (in
# PIDS) and EP, or fails the test and finishes when it does not say where it listens in 15 s.
start_coord() {
  "$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$2" --servers "${SERVERS:-1}" \
    --data "${DATAFILE:-$DATA/tiny.txt}" --steps "$3" --out "$4" 2>"$1" &
  COORD=$!
  PIDS+=($COORD)
  wait_endpoint "$1" 15 "$COORD" ||
    { fail "the coordinator did not say where it listens: $(cat "$1")"; finish; }
}

# none_left NAME PID...: a check that within 10 s none of the pids is alive (one whose command
# line names neither $WORK nor a loopback endpoint is another process that got a reused pid).
none_left() {
  local name=$1 p cmd end=$((SECONDS + 10))
  shift
  checks=$((checks + 1))
  for p in "$@"; do
    while alive "$p" && [ $SECONDS -lt $end ]; do sleep 0.02; done
    alive "$p" || continue
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in
    *"$WORK"* | *"tcp://127.0.0.1:"*)
      fail "$name: process $p ($cmd) is still alive 10 s after the job ended"
      kill -KILL "$p" 2>/dev/null || true
      ;;
    esac
  done
}

# launch_fg NAME ARGS...: `zshard launch ARGS` in the foreground (SIGINT after 120 s), stderr in
# $WORK/NAME.err; sets RC and checks that none of the processes it printed is left.
launch_fg() {
  local name=$1
  shift
  RC=0
  timeout -s INT -k 30 120 "$ZSHARD" launch "$@" 2>"$WORK/$name.err" || RC=$?
  # shellcheck disable=SC2046
  none_left "$name" $(pids_of "$WORK/$name.err")
}

# step_list FILE: the "step" of each line of a metrics file, space-separated.
step_list() { { sed -E 's/^\{"step": ([0-9]+),.*/\1/' "$1" || true; } | tr '\n' ' '; }

# metrics_compared FILE: the metrics without timings, checkpoint outcomes and "workers".
metrics_compared() { metrics_without_timing "$1" | sed -E 's/, "workers": [0-9]+//'; }

# Processes a test starts (PIDS) and process groups (PGIDS, by leader): kill_started, the EXIT
# trap of the tests that use them, kills them all.
PIDS=()
PGIDS=()
kill_started() {
  local p
  for p in "${PGIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}

# none_started_left: a check that no process in PIDS and no process of a group in PGIDS runs.
none_started_left() {
  local p
  checks=$((checks + 1))
  for p in "${PIDS[@]}"; do
    if alive "$p"; then
      fail "process $p ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)) is still running"
    fi
  done
  for p in "${PGIDS[@]}"; do
    if pgrep -g "$p" >/dev/null; then
      fail "processes of launch group $p are still running: $(pgrep -a -g "$p")"
    fi
  done
}

finish() {
  if [ $failures -gt 0 ]; then
    echo "$(basename "$0"): $failures of $checks checks failed" >&2
    exit 1
  fi
  echo "$(basename "$0"): $checks checks passed"
}
