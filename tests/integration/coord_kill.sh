# A coordinator killed outright (SIGKILL) while a job runs, and one restarted under its members.
#  1. Processes started by hand (coord, 2 servers, 1 worker): once a checkpoint is committed
#     the coordinator is killed; the servers and the worker each exit on their own, non-zero,
#     within cluster.coordinator_timeout_ms (3 s here) plus a margin, saying they heard
#     nothing from the coordinator.  Both coordinators run the same command line, with
#     --resume-if-any OUT/checkpoints, as a service restarted by systemd would: the first
#     starts fresh (nothing there yet), and the second, with 3 servers and a worker, resumes
#     from the newest checkpoint and finishes the job: zshard train's bits, and metrics.jsonl
#     holds each step exactly once.
#  2. The same under zshard launch: the launcher stops everything and exits 1 naming the
#     coordinator and the signal; zshard launch --resume-if-any OUT/checkpoints (as a requeued
#     batch job runs it) then finishes the job
#     with zshard train's bits.
#  3. A coordinator killed and a fresh one (no --resume) started on the same port while its
#     server and worker are stopped (SIGSTOP, so that the restart surely lands within their
#     coordinator timeout); continued, each is answered NOT_REGISTERED and exits, saying the
#     coordinator does not know it, instead of hanging.
# The checkpoint after which each kill comes is drawn from a seed (printed; ZS_TEST_SEED=N
# repeats it).  No process is left behind.
source "$(dirname "$0")/lib.sh"
STEPS=80
SEED=${ZS_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 1000000 ))}
echo "coord_kill: seed $SEED (ZS_TEST_SEED=$SEED repeats it)"
RANDOM=$SEED
T0=$SECONDS

sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 1000, "coordinator_timeout_ms": 3000}, "checkpoint": {"interval_steps": 2}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q coordinator_timeout_ms "$WORK/job.json" || { fail "the config edit did not take"; finish; }
COORD_TIMEOUT_S=3
# A member must be gone within its coordinator timeout plus this.
MARGIN_S=5

# Every process this test starts (PIDS; PGIDS: launchers, each the leader of its own process
# group), killed on the way out whatever happened.
trap kill_started EXIT

expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"

# coord_bg NAME ENDPOINT ARGS...: a coordinator in the background, stderr in $WORK/NAME.log;
# sets CPID and EP (where it listens, once it says so).
coord_bg() {
  local name=$1 ep=$2
  shift 2
  "$ZSHARD" coord --listen "$ep" --config "$WORK/job.json" --data "$DATA/tiny.txt" \
    --steps $STEPS "$@" 2>"$WORK/$name.log" &
  CPID=$!
  PIDS+=("$CPID")
  wait_endpoint "$WORK/$name.log" 20 ||
    fail "$name: the coordinator did not say where it listens: $(cat "$WORK/$name.log")"
}

# member_bg NAME server|worker: a server or a worker of the coordinator at $EP, stderr in
# $WORK/NAME.log; appends its pid to MEMBERS.
member_bg() {
  if [ "$2" = server ]; then
    "$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/$1.log" &
  else
    "$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/$1.log" &
  fi
  PIDS+=($!)
  MEMBERS+=($!)
}

# check_bits NAME OUT: OUT has zshard train's model, and metrics.jsonl zshard train's lines
# (less timings), each step exactly once.
check_bits() {
  local name=$1 out=$2 steps
  checks=$((checks + 3))
  cmp "$WORK/train/model.safetensors" "$out/model.safetensors" ||
    fail "$name: model.safetensors differs from zshard train's"
  steps=$(step_list "$out/metrics.jsonl")
  [ "$steps" = "$(seq -s ' ' 1 $STEPS) " ] ||
    fail "$name: metrics.jsonl has steps '$steps', expected 1..$STEPS once each"
  diff <(metrics_compared "$WORK/train/metrics.jsonl") <(metrics_compared "$out/metrics.jsonl") ||
    fail "$name: metrics.jsonl differs from zshard train's beyond timings and worker counts"
}

# ---- 1. Hand-started processes; the coordinator killed after checkpoint K -------------------
K=$((2 * (1 + RANDOM % 6))) # 2, 4, ..., 12
OUT=$WORK/hand
MEMBERS=()
coord_bg hand-coord 'tcp://127.0.0.1:*' --servers 2 --out "$OUT" --resume-if-any "$OUT/checkpoints"
if [ -n "$EP" ]; then
  member_bg hand-server-1 server
  member_bg hand-server-2 server
  member_bg hand-worker worker
  checks=$((checks + 1))
  if ! wait_until 30 ckpt_at_least "$OUT/checkpoints" $K; then
    fail "hand: checkpoint $K never came: $(tail -n 5 "$WORK/hand-coord.log")"
  fi
  checks=$((checks + 1))
  grep -qF 'holds no checkpoint yet: a fresh start' "$WORK/hand-coord.log" ||
    fail "hand: --resume-if-any on an empty directory did not say it starts fresh"
  kill -KILL "$CPID"
  killed_ms=$(now_ms)
  reap "$CPID"
  at=$(latest_step "$OUT/checkpoints")
  echo "hand: SIGKILL to the coordinator once checkpoint $K was committed; latest is step $at"
  checks=$((checks + 1))
  [ "$at" -lt $STEPS ] && [ ! -e "$OUT/model.safetensors" ] ||
    fail "hand: the run had ended before the kill (latest step $at of $STEPS)"
  # Each member exits by itself, non-zero, within the timeout plus the margin, and says why.
  names=(hand-server-1 hand-server-2 hand-worker)
  for i in 0 1 2; do
    p=${MEMBERS[$i]}
    n=${names[$i]}
    checks=$((checks + 3))
    if ! until_ms $((killed_ms + (COORD_TIMEOUT_S + MARGIN_S) * 1000)) gone "$p"; then
      fail "$n: still running $(($(now_ms) - killed_ms)) ms after the coordinator was killed" \
        "(coordinator_timeout_ms 3000): $(tail -n 3 "$WORK/$n.log")"
      kill -9 "$p" 2>/dev/null || true
    fi
    reap "$p"
    echo "$n: exited $RC, seen $(($(now_ms) - killed_ms)) ms after the kill"
    [ $RC -ne 0 ] || fail "$n: exit 0 after its coordinator was killed, expected non-zero"
    [ $RC -lt 128 ] || fail "$n: exit $RC (a signal), expected an exit of its own"
    grep -qF 'nothing from the coordinator' "$WORK/$n.log" ||
      fail "$n: its log lacks 'nothing from the coordinator': $(tail -n 3 "$WORK/$n.log")"
  done

  # The resume: a new coordinator (another port), 3 servers, a worker.
  MEMBERS=()
  coord_bg hand-resume 'tcp://127.0.0.1:*' --servers 3 --out "$OUT" --resume-if-any "$OUT/checkpoints"
  if [ -n "$EP" ]; then
    checks=$((checks + 1))
    grep -qF "resuming run" "$WORK/hand-resume.log" ||
      fail "hand: --resume-if-any with checkpoints did not resume: $(tail -n 3 "$WORK/hand-resume.log")"
    member_bg hand-resume-server-1 server
    member_bg hand-resume-server-2 server
    member_bg hand-resume-server-3 server
    member_bg hand-resume-worker worker
    checks=$((checks + 2))
    if ! wait_until 60 gone "$CPID"; then
      fail "hand-resume: the coordinator still runs 60 s later:" \
        "$(tail -n 5 "$WORK/hand-resume.log")"
      kill -9 "$CPID" 2>/dev/null || true
    fi
    reap "$CPID"
    [ $RC -eq 0 ] ||
      fail "hand-resume: the coordinator exited $RC: $(tail -n 5 "$WORK/hand-resume.log")"
    grep -qE "coord: resuming run [0-9a-f]+ from .*step-0*$at" "$WORK/hand-resume.log" ||
      fail "hand-resume: the coordinator did not resume from step $at:" \
        "$(grep -E 'resum|WARN' "$WORK/hand-resume.log")"
    i=0
    for n in hand-resume-server-1 hand-resume-server-2 hand-resume-server-3 hand-resume-worker; do
      p=${MEMBERS[$i]}
      i=$((i + 1))
      checks=$((checks + 1))
      if ! wait_until 10 gone "$p"; then
        fail "$n: still running 10 s after the coordinator exited"
        kill -9 "$p" 2>/dev/null || true
      fi
      reap "$p"
      [ $RC -eq 0 ] || fail "$n: exited $RC: $(tail -n 3 "$WORK/$n.log")"
    done
    check_bits hand-resume "$OUT"
  fi
fi
echo "coord_kill: part 1 done at $((SECONDS - T0)) s"

# ---- 2. zshard launch; the coordinator killed after checkpoint K ----------------------------
K=$((2 * (1 + RANDOM % 6)))
OUT=$WORK/launch
# launch_bg NAME SERVERS [ARGS...]: zshard launch with 2 workers in its own process group, in
# the background; sets LPID (the launcher, the group's id).
launch_bg() {
  local name=$1 servers=$2
  shift 2
  setsid "$ZSHARD" launch --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
    --servers "$servers" --workers 2 --threads 1 --out "$OUT" "$@" 2>"$WORK/$name.err" &
  LPID=$!
  PGIDS+=("$LPID")
}

# launch_end NAME: waits (up to 60 s) for the launcher; sets RC; checks that no process of
# its group is left.
launch_end() {
  local name=$1
  checks=$((checks + 1))
  if ! wait_until 60 gone "$LPID"; then
    fail "$name: the launcher still runs 60 s later: $(tail -n 5 "$WORK/$name.err")"
    kill -INT "$LPID" 2>/dev/null || true
    wait_until 20 gone "$LPID" || kill -9 -- -"$LPID" 2>/dev/null || true
  fi
  reap "$LPID"
  if ! wait_until 10 eval '! pgrep -g $LPID >/dev/null'; then
    fail "$name: processes left: $(pgrep -a -g "$LPID")"
    kill -9 -- -"$LPID" 2>/dev/null || true
  fi
}

launch_bg launch 2
checks=$((checks + 1))
wait_until 30 ckpt_at_least "$OUT/checkpoints" $K ||
  fail "launch: checkpoint $K never came: $(tail -n 5 "$WORK/launch.err")"
COORD=$(pid_of "$WORK/launch.err" coord)
at=0
checks=$((checks + 4))
if [ -z "$COORD" ]; then
  fail "launch: no 'coord (pid N)' line: $(cat "$WORK/launch.err")"
else
  kill -KILL "$COORD"
  at=$(latest_step "$OUT/checkpoints")
  echo "launch: SIGKILL to the coordinator (pid $COORD) once checkpoint $K was committed;" \
    "latest is step $at"
fi
launch_end launch
[ $RC -eq 1 ] ||
  fail "launch: exit $RC after its coordinator was killed, expected 1:" \
    "$(tail -n 8 "$WORK/launch.err")"
grep -qF "coord (pid $COORD) was killed by signal 9" "$WORK/launch.err" ||
  fail "launch: stderr does not name the killed coordinator: $(tail -n 8 "$WORK/launch.err")"
[ ! -e "$OUT/model.safetensors" ] && [ "$at" -lt $STEPS ] ||
  fail "launch: the run had ended before the kill (latest step $at of $STEPS)"
launch_bg launch-resume 3 --resume-if-any "$OUT/checkpoints"
launch_end launch-resume
checks=$((checks + 2))
[ $RC -eq 0 ] || fail "launch-resume: exit $RC: $(tail -n 8 "$WORK/launch-resume.err")"
grep -q "zshard launch: done: $STEPS steps" "$WORK/launch-resume.err" ||
  fail "launch-resume: no summary for $STEPS steps: $(tail -n 5 "$WORK/launch-resume.err")"
check_bits launch-resume "$OUT"
echo "coord_kill: part 2 done at $((SECONDS - T0)) s"

# ---- 3. A fresh coordinator on the same port: the old members are not known to it -----------
OUT=$WORK/restart
MEMBERS=()
coord_bg restart-coord 'tcp://127.0.0.1:*' --servers 1 --out "$OUT"
if [ -n "$EP" ]; then
  member_bg restart-server server
  member_bg restart-worker worker
  checks=$((checks + 1))
  wait_until 30 ckpt_at_least "$OUT/checkpoints" 2 ||
    fail "restart: no checkpoint came: $(tail -n 5 "$WORK/restart-coord.log")"
  # Stopped, the members cannot time out the coordinator while it is replaced.
  kill -STOP "${MEMBERS[@]}"
  kill -KILL "$CPID"
  reap "$CPID"
  OLD=$EP
  coord_bg restart-fresh "$OLD" --servers 1 --out "$WORK/restart-fresh"
  checks=$((checks + 1))
  [ "$EP" = "$OLD" ] || fail "restart: the fresh coordinator listens on '$EP', not $OLD"
  kill -CONT "${MEMBERS[@]}"
  cont_ms=$(now_ms)
  names=(restart-server restart-worker)
  needles=('does not know this server' 'does not know this worker')
  for i in 0 1; do
    p=${MEMBERS[$i]}
    n=${names[$i]}
    checks=$((checks + 3))
    # Well within the coordinator timeout: the first heartbeat gets the answer.
    if ! until_ms $((cont_ms + COORD_TIMEOUT_S * 1000)) gone "$p"; then
      fail "$n: still running $(($(now_ms) - cont_ms)) ms after SIGCONT with a fresh coordinator" \
        "on its port: $(tail -n 3 "$WORK/$n.log")"
      kill -9 "$p" 2>/dev/null || true
    fi
    reap "$p"
    echo "$n: exited $RC, seen $(($(now_ms) - cont_ms)) ms after SIGCONT"
    [ $RC -ne 0 ] && [ $RC -lt 128 ] || fail "$n: exit $RC, expected an error exit of its own"
    grep -qF -- "${needles[$i]}" "$WORK/$n.log" ||
      fail "$n: its log lacks '${needles[$i]}': $(tail -n 3 "$WORK/$n.log")"
  done
  # The fresh coordinator goes on waiting for servers of its own; SIGTERM ends it.
  checks=$((checks + 1))
  alive "$CPID" ||
    fail "restart: the fresh coordinator exited: $(tail -n 3 "$WORK/restart-fresh.log")"
  kill -TERM "$CPID"
  wait_until 10 gone "$CPID" || fail "restart: the fresh coordinator ignored SIGTERM"
  reap "$CPID"
fi
echo "coord_kill: part 3 done at $((SECONDS - T0)) s"

# Nothing this test started is left (the trap would kill it, but it must not be needed).
none_started_left
[ $failures -eq 0 ] || echo "coord_kill: to repeat: ZS_TEST_SEED=$SEED" >&2
finish
