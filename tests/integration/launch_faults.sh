# zshard launch when things go wrong: a child that dies, SIGINT or SIGTERM to the launcher, a
# stopped child (SIGSTOP), the launcher killed outright, a child that fails at start, bad
# flags.  Every case checks that no process of that launch is left, by the pids it started
# (other tests run in parallel, so never by name).
source "$(dirname "$0")/lib.sh"
CFG=$DATA/tiny.json
TXT=$DATA/tiny.txt

# children_of PID: the pids of the processes whose parent is PID.
children_of() {
  local s stat f
  for s in /proc/[0-9]*/stat; do
    read -r stat 2>/dev/null <"$s" || continue
    read -r -a f <<<"${stat##*) }"
    if [ "${f[1]}" = "$1" ]; then
      s=${s#/proc/}
      echo "${s%/stat}"
    fi
  done
}

# gone_within SECONDS PID...: until none of the PIDs is alive.
gone_within() {
  local end=$((SECONDS + $1)) p
  shift
  for p in "$@"; do
    while alive "$p"; do
      [ $SECONDS -lt $end ] || return 1
      sleep 0.1
    done
  done
}

# start NAME SERVERS: a launch with no workers in the background; sets LPID and KIDS (the
# coordinator and the servers, once all servers are ready).
start() {
  local name=$1 servers=$2
  "$ZSHARD" launch --config "$CFG" --data "$TXT" --steps 4 --servers "$servers" --workers 0 \
    --out "$WORK/$name" 2>"$WORK/$name.err" &
  LPID=$!
  if ! wait_until 30 has_line "$WORK/$name/logs/coord.log" "all $servers servers are ready"; then
    fail "$name: the servers did not come up: $(cat "$WORK/$name.err")"
  fi
  KIDS=$(children_of "$LPID" | tr "\n" " ")
  local n
  n=$(echo $KIDS | wc -w)
  [ "$n" -eq $((servers + 1)) ] || fail "$name: $n children, expected $((servers + 1)): $KIDS"
}

# finish_launch NAME WANT_RC NEEDLE: the launcher exits (within 20 s) with WANT_RC, its stderr
# has NEEDLE, and none of its children is left.
finish_launch() {
  local name=$1 want=$2 needle=$3 rc=0
  checks=$((checks + 1))
  if ! gone_within 20 "$LPID"; then
    fail "$name: the launcher is still running 20 s later"
    kill -9 "$LPID" $KIDS 2>/dev/null || true
  fi
  wait "$LPID" || rc=$?
  [ $rc -eq "$want" ] || fail "$name: exit $rc, expected $want: $(cat "$WORK/$name.err")"
  grep -qF -- "$needle" "$WORK/$name.err" ||
    fail "$name: stderr lacks '$needle': $(cat "$WORK/$name.err")"
  local p
  for p in $KIDS; do
    if alive "$p"; then
      fail "$name: child $p ($(tr '\0' ' ' <"/proc/$p/cmdline")) outlived the launcher"
      kill -9 "$p" 2>/dev/null || true
    fi
  done
}

# The coordinator killed by SIGKILL: the launcher stops the rest and names it and the signal.
# (A server's death is the coordinator's to recover from: tests/integration/server_failures.sh.)
start crash 2
COORD=$(pid_of "$WORK/crash.err" coord)
if [ -z "$COORD" ] || ! grep -q " $COORD " <<<" $KIDS "; then
  fail "crash: no pid for the coordinator among the children ($KIDS): $(cat "$WORK/crash.err")"
else
  kill -KILL "$COORD"
fi
finish_launch crash 1 "coord (pid $COORD) was killed by signal 9"
grep -q 'its last lines' "$WORK/crash.err" || fail "crash: no last lines: $(cat "$WORK/crash.err")"
[ -s "$WORK/crash/logs/coord.log" ] || fail "crash: no $WORK/crash/logs/coord.log"

# SIGINT to the launcher: everything stops, exit 130.
start sigint 1
kill -INT "$LPID"
finish_launch sigint 130 "interrupted by SIGINT"

# SIGTERM to the launcher while a server is stopped: SIGTERM alone would wait for a SIGCONT
# that never comes, so the launcher sends SIGCONT after it; the server exits without SIGKILL,
# exit 143.
start sigterm 2
STOPPED=
for p in $KIDS; do
  if grep -qa server "/proc/$p/cmdline"; then STOPPED=$p; fi
done
[ -n "$STOPPED" ] || fail "sigterm: no server among the children $KIDS"
kill -STOP "$STOPPED"
kill -TERM "$LPID"
finish_launch sigterm 143 "interrupted by SIGTERM"
! grep -qF "(pid $STOPPED) is still running; sending SIGKILL" "$WORK/sigterm.err" ||
  fail "sigterm: the stopped server $STOPPED needed SIGKILL: $(cat "$WORK/sigterm.err")"

# The launcher itself killed by SIGKILL: its children die with it (PR_SET_PDEATHSIG).
start pdeathsig 2
kill -KILL "$LPID"
wait "$LPID" 2>/dev/null || true
checks=$((checks + 1))
gone_within 10 $KIDS || fail "pdeathsig: children left 10 s after the launcher was killed:" \
  "$(for p in $KIDS; do alive "$p" && tr '\0' ' ' <"/proc/$p/cmdline" && echo; done)"
for p in $KIDS; do kill -9 "$p" 2>/dev/null || true; done

# A child that fails at start: its own error line is the launcher's.
expect_fail "coord (pid" "$ZSHARD" launch --config "$WORK/none.json" --data "$TXT" --steps 1 \
  --servers 1 --workers 0 --out "$WORK/nocfg"
grep -qF "exited with status 1: zshard coord:" "$WORK/err.txt" &&
  grep -qF "$WORK/none.json" "$WORK/err.txt" ||
  fail "nocfg: the coordinator's error is not shown: $(cat "$WORK/err.txt")"

# Flags: usage errors exit 2 and say what is wrong.
# expect_usage NEEDLE ARGS...: `zshard launch ARGS` exits 2 and its stderr has NEEDLE.
expect_usage() {
  local needle=$1 rc=0
  shift
  checks=$((checks + 1))
  "$ZSHARD" launch "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  [ $rc -eq 2 ] || fail "launch $*: exit $rc, expected 2: $(cat "$WORK/err.txt")"
  grep -qF -- "$needle" "$WORK/err.txt" ||
    fail "launch $*: stderr lacks '$needle': $(cat "$WORK/err.txt")"
}
ALL=(--config "$CFG" --data "$TXT" --steps 1 --out "$WORK/flags")
expect_usage 'missing --servers' "${ALL[@]}" --workers 1
expect_usage 'missing --workers' "${ALL[@]}" --servers 1
expect_usage 'missing --config' --data "$TXT" --steps 1 --servers 1 --workers 1 --out "$WORK/o"
expect_usage '--servers: "0" is not an integer in [1, 1024]' "${ALL[@]}" --servers 0 --workers 1
expect_usage '--workers: "-1" is not an integer' "${ALL[@]}" --servers 1 --workers -1
expect_usage '--threads: "x" is not an integer' "${ALL[@]}" --servers 1 --workers 1 --threads x
expect_usage 'unknown option "--wrokers"' "${ALL[@]}" --servers 1 --wrokers 1
expect_usage '--steps needs a value' --steps
expect_usage '--steps: "0" is not an integer in [1, 1073741824]' "${ALL[@]}" --servers 1 --workers 1 --steps 0
expect_usage '--bind: "0.0.0.0"' "${ALL[@]}" --servers 1 --workers 1 --bind 0.0.0.0
expect_usage '--log-level: unknown level "loud"' "${ALL[@]}" --servers 1 --workers 1 --log-level loud
expect_usage 'unexpected argument "extra"' "${ALL[@]}" --servers 1 --workers 1 extra
[ ! -e "$WORK/flags" ] || fail "a usage error created $WORK/flags"
expect_ok "$ZSHARD" launch --help
grep -q -- '--workers W' "$WORK/out.txt" || fail "launch --help lacks --workers"
expect_ok "$ZSHARD" --help
grep -q 'launch' "$WORK/out.txt" || fail "zshard --help does not list launch"
finish
