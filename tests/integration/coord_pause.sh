# A coordinator that does not run, or never answers.
#  1. Under zshard launch (2 servers, 2 workers), the coordinator is stopped (SIGSTOP) mid-run
#     for longer than cluster.heartbeat_timeout_ms (1 s) but less than
#     cluster.coordinator_timeout_ms (4 s), then continued: it logs that it did not run for
#     that long and gives every member a whole timeout again instead of declaring them dead,
#     no member gives up on it, and the job ends with zshard train's bits (model and metrics,
#     each step once), exit 0, no process left.
#  2. A worker pointed at a loopback port where nothing listens: it obeys SIGTERM within a
#     couple of seconds while it waits to register, and, left alone, gives up by itself saying
#     that nothing came from the coordinator (before it has a job it waits 15 s).
# The step at which the coordinator is stopped and how long are drawn from a seed (printed;
# ZS_TEST_SEED=N repeats it).
source "$(dirname "$0")/lib.sh"
STEPS=60
SEED=${ZS_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 1000000 ))}
echo "coord_pause: seed $SEED (ZS_TEST_SEED=$SEED repeats it)"
RANDOM=$SEED
T0=$SECONDS

sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 1000, "coordinator_timeout_ms": 4000}, "checkpoint": {"interval_steps": 2}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q coordinator_timeout_ms "$WORK/job.json" || { fail "the config edit did not take"; finish; }
# Before a worker has a job (and its config), it gives up on a silent coordinator after this.
REGISTER_TIMEOUT_S=15

# Every process this test starts (PIDS; PGIDS: launchers, each the leader of its own process
# group), killed on the way out whatever happened.
trap kill_started EXIT

# catches_sigterm PID: the process runs zshard and has its SIGTERM handler installed (SigCgt
# bit 15).  Before the exec, the forked shell's own handlers show there.
catches_sigterm() {
  local mask
  [ "$(readlink -f "/proc/$1/exe" 2>/dev/null)" = "$(readlink -f "$ZSHARD")" ] || return 1
  mask=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null)
  [ -n "$mask" ] && [ $((0x$mask & (1 << 14))) -ne 0 ]
}

# ---- 2 starts first: a port where nothing listens, and two workers pointed at it -----------
# The port of a coordinator that has exited: nothing listens there any more.
"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$WORK/job.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps 1 --out "$WORK/gone" 2>"$WORK/gone.log" &
p=$!
PIDS+=("$p")
wait_endpoint "$WORK/gone.log" 20 ||
  fail "the coordinator did not say where it listens: $(cat "$WORK/gone.log")"
FREE=$EP
kill -TERM "$p"
wait_until 10 gone "$p" || fail "the coordinator on $FREE ignored SIGTERM"
reap "$p"
FREE=${FREE:-tcp://127.0.0.1:1}
echo "nothing listens on $FREE"

"$ZSHARD" worker --coord "$FREE" --threads 1 2>"$WORK/lonely.log" &
LONELY=$!
PIDS+=("$LONELY")
lonely_ms=$(now_ms)
"$ZSHARD" worker --coord "$FREE" --threads 1 2>"$WORK/term.log" &
TERMED=$!
PIDS+=("$TERMED")

# SIGTERM once the worker handles it (earlier, the default action would end it: no test).
checks=$((checks + 1))
if ! wait_until 10 catches_sigterm "$TERMED"; then
  fail "term: the worker never installed a SIGTERM handler: $(cat "$WORK/term.log")"
else
  kill -TERM "$TERMED"
  term_ms=$(now_ms)
  if ! until_ms $((term_ms + 3000)) gone "$TERMED"; then
    fail "term: a worker waiting for a coordinator that never answers was still running" \
      "$(($(now_ms) - term_ms)) ms after SIGTERM, expected it gone within 3 s:" \
      "$(tail -n 3 "$WORK/term.log")"
    kill -9 "$TERMED" 2>/dev/null || true
  fi
  reap "$TERMED"
  echo "term: the worker exited $RC, seen $(($(now_ms) - term_ms)) ms after SIGTERM:" \
    "$(tail -n 1 "$WORK/term.log")"
fi
echo "coord_pause: part 2a done at $((SECONDS - T0)) s"

# ---- 1. The coordinator stopped mid-run under zshard launch ---------------------------------
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"
# Stopped once step K's progress line came, for 1.5 to 2.5 s: longer than the heartbeat
# timeout, shorter than the members' coordinator timeout.
K=$((3 + RANDOM % 10))
PAUSE_MS=$((1500 + RANDOM % 1001))
OUT=$WORK/pause
setsid "$ZSHARD" launch --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 2 --workers 2 --threads 1 --out "$OUT" 2>"$WORK/pause.err" &
LPID=$!
PGIDS+=("$LPID")
checks=$((checks + 1))
COORD=
if ! wait_until 30 has_line "$WORK/pause.err" "^step +$K/$STEPS "; then
  fail "pause: step $K never came: $(tail -n 5 "$WORK/pause.err")"
elif ! COORD=$(pid_of "$WORK/pause.err" coord) ||
  [ -z "$COORD" ]; then
  fail "pause: no 'coord (pid N)' line: $(head -n 5 "$WORK/pause.err")"
else
  kill -STOP "$COORD"
  stop_ms=$(now_ms)
  last=$(grep -c '^step ' "$WORK/pause.err")
  # The pause is the event under test, not a wait for something.
  sleep "$(printf '%d.%03d' $((PAUSE_MS / 1000)) $((PAUSE_MS % 1000)))"
  kill -CONT "$COORD"
  echo "pause: coord (pid $COORD) stopped after step $K's line ($last progress lines)" \
    "for $(($(now_ms) - stop_ms)) ms"
  [ "$last" -lt $STEPS ] || fail "pause: the run had ended before the coordinator was stopped"
fi
checks=$((checks + 1))
if ! wait_until 60 gone "$LPID"; then
  fail "pause: the launcher still runs 60 s later: $(tail -n 5 "$WORK/pause.err")"
  kill -INT "$LPID" 2>/dev/null || true
  wait_until 20 gone "$LPID" || kill -9 -- -"$LPID" 2>/dev/null || true
fi
reap "$LPID"
wait_until 10 eval '! pgrep -g $LPID >/dev/null' ||
  fail "pause: processes left: $(pgrep -a -g "$LPID")"
checks=$((checks + 9))
[ $RC -eq 0 ] || fail "pause: zshard launch exited $RC: $(tail -n 8 "$WORK/pause.err")"
grep -q "zshard launch: done: $STEPS steps" "$WORK/pause.err" ||
  fail "pause: no summary for $STEPS steps: $(tail -n 5 "$WORK/pause.err")"
cmp "$WORK/train/model.safetensors" "$OUT/model.safetensors" ||
  fail "pause: model.safetensors differs from zshard train's"
steps=$(step_list "$OUT/metrics.jsonl")
[ "$steps" = "$(seq -s ' ' 1 $STEPS) " ] ||
  fail "pause: metrics.jsonl has steps '$steps', expected 1..$STEPS once each"
diff <(metrics_compared "$WORK/train/metrics.jsonl") <(metrics_compared "$OUT/metrics.jsonl") ||
  fail "pause: metrics.jsonl differs from zshard train's beyond timings and worker counts"
# It noticed its own pause, longer than the heartbeat timeout, while the job ran (steps came
# after it), and judged nobody by it.
LOG=$OUT/logs/coord.log
gap=$(sed -nE 's/.*coord: this process did not run for ([0-9]+) ms.*/\1/p' "$LOG" |
  sort -n | tail -n 1)
if [ "${gap:-0}" -lt 1000 ]; then
  fail "pause: coord.log lacks 'did not run for N ms' with N >= 1000 (the heartbeat timeout):" \
    "$(grep -E 'WARN|ERROR' "$LOG")"
elif ! awk '/did not run for/ { p = 1 } p && /^step / { f = 1 } END { exit !f }' "$LOG"; then
  fail "pause: no step finished after the pause: $(tail -n 5 "$LOG")"
fi
! grep -qE 'coord: (server|worker) [0-9]+ left|is gone|recover|no heartbeat' "$LOG" ||
  fail "pause: the coordinator declared a member dead: $(grep -E 'WARN|ERROR' "$LOG")"
! grep -lE 'nothing from the coordinator|dropped' "$OUT"/logs/server-*.log \
  "$OUT"/logs/worker-*.log ||
  fail "pause: a member gave up on the coordinator or was dropped (files above)"
echo "coord_pause: part 1 done at $((SECONDS - T0)) s (the coordinator did not run for $gap ms)"

# ---- 2b. The other worker gives up by itself, saying why ------------------------------------
checks=$((checks + 3))
if ! until_ms $((lonely_ms + (REGISTER_TIMEOUT_S + 10) * 1000)) gone "$LONELY"; then
  fail "lonely: a worker whose coordinator never answers still runs" \
    "$(($(now_ms) - lonely_ms)) ms after it started: $(tail -n 3 "$WORK/lonely.log")"
  kill -9 "$LONELY" 2>/dev/null || true
fi
reap "$LONELY"
echo "lonely: the worker exited $RC, seen $(($(now_ms) - lonely_ms)) ms after it started:" \
  "$(tail -n 1 "$WORK/lonely.log")"
[ $RC -ne 0 ] && [ $RC -lt 128 ] || fail "lonely: exit $RC, expected an error exit of its own"
grep -qF "nothing from the coordinator at $FREE" "$WORK/lonely.log" ||
  fail "lonely: its stderr does not say that nothing came from $FREE: $(cat "$WORK/lonely.log")"
echo "coord_pause: part 2b done at $((SECONDS - T0)) s"

# Nothing this test started is left (the trap would kill it, but it must not be needed).
none_started_left
[ $failures -eq 0 ] || echo "coord_pause: to repeat: ZS_TEST_SEED=$SEED" >&2
finish
