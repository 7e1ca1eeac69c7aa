# Partition servers lost while a job runs: the coordinator rolls every server back to the
# newest committed checkpoint (or the job's start), spreads the shards over the servers left
# and any spare, and the steps since run again.  Each run must end with zshard train's bits,
# metrics.jsonl must hold each step exactly once, and no process may be left.  The steps at
# which servers die are drawn from a seed (printed; ZS_TEST_SEED=N repeats it).
#  - a SIGKILL at a random step, of a random server (3 servers, 80 steps, checkpoints every 3);
#    zshard launch starts a replacement server, which the recovery takes in (3 servers again);
#  - a SIGKILL before the first checkpoint (back to the seed's initial weights);
#  - two servers killed at two steps (3 -> 1 server; --replacements 0 here and below, where the
#    servers left carry the job);
#  - a server stopped (SIGSTOP) past the heartbeat timeout, then continued: it is told it was
#    dropped and exits, the job goes on;
#  - a spare server started by hand takes the lost server's place;
#  - every server killed: the job ends naming the newest checkpoint, which resumes to the same
#    bits.
# With buddy replicas (checkpoint.replicas 1) a lost server is failed over to its replica
# instead: the job goes on from memory and no step runs twice (the launcher prints each step's
# line once).
#  - a SIGKILL at a random step, of a random server;
#  - two servers killed at two steps (the second failover uses a replica built after the first);
#  - a server stopped past the heartbeat timeout, then continued: dropped, it exits.
source "$(dirname "$0")/lib.sh"
STEPS=80
SEED=${ZS_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 1000000 ))}
echo "server_failures: seed $SEED (ZS_TEST_SEED=$SEED repeats it)"
RANDOM=$SEED

sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 1000}, "checkpoint": {"interval_steps": 3}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q interval_steps "$WORK/job.json" || { fail "the config edit did not take"; finish; }
# No checkpoint within the run, for a loss that surely comes before the first one: a step takes
# milliseconds, and a kill lands some 10 to 25 steps after the step it waited for (the step
# lines reach the launcher's log late, and the test polls for them), on a loaded machine more:
# with a first checkpoint at step 60, a kill waiting for step 1 once landed after it (ctest -j4
# on 2 cores).
sed 's/"interval_steps": 3/"interval_steps": 1000/' "$WORK/job.json" >"$WORK/late.json"
sed 's/"interval_steps": 3/"interval_steps": 10, "replicas": 1/' "$WORK/job.json" >"$WORK/rep.json"
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"

# wait_step ERRFILE K: waits (up to 60 s) until the launcher printed step K's progress line.
wait_step() {
  wait_until 60 has_line "$1" "^step $(printf '%5d' "$2")/"
}

# launch_bg NAME SERVERS [ARGS...]: a launch in its own process group, in the background; sets
# LPID (the launcher, also the group's id).  CONFIG (default job.json) names the config.
launch_bg() {
  local name=$1 servers=$2
  shift 2
  setsid "$ZSHARD" launch --config "$WORK/${CONFIG:-job.json}" --data "$DATA/tiny.txt" --steps $STEPS \
    --servers "$servers" --workers 2 --threads 1 --out "$WORK/$name" "$@" \
    2>"$WORK/$name.err" &
  LPID=$!
}

# finish_run NAME WANT_RC: the launcher exits (within 120 s) with WANT_RC and leaves no process
# of its group; with WANT_RC 0 the model is train's and each step is in metrics.jsonl once.
finish_run() {
  local name=$1 want=$2 rc=0 end=$((SECONDS + 120))
  while alive "$LPID" && [ $SECONDS -lt $end ]; do sleep 0.05; done
  checks=$((checks + 2))
  if alive "$LPID"; then
    fail "$name: the launcher still runs 120 s later"
    kill -KILL -- -"$LPID" 2>/dev/null || true
  fi
  wait "$LPID" || rc=$?
  [ $rc -eq "$want" ] || fail "$name: exit $rc, expected $want: $(tail -n 15 "$WORK/$name.err")"
  end=$((SECONDS + 10))
  while pgrep -g "$LPID" >/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
  if pgrep -g "$LPID" >/dev/null; then
    fail "$name: processes left: $(pgrep -a -g "$LPID")"
    kill -KILL -- -"$LPID" 2>/dev/null || true
  fi
  [ "$want" -eq 0 ] || return 0
  checks=$((checks + 2))
  cmp -s "$WORK/train/model.safetensors" "$WORK/$name/model.safetensors" ||
    fail "$name: model.safetensors differs from zshard train's"
  local steps
  steps=$(step_list "$WORK/$name/metrics.jsonl")
  [ "$steps" = "$(seq -s ' ' 1 $STEPS) " ] ||
    fail "$name: metrics.jsonl has steps '$steps', expected 1..$STEPS once each"
  diff <(metrics_compared "$WORK/train/metrics.jsonl") \
    <(metrics_compared "$WORK/$name/metrics.jsonl") >/dev/null || fail "$name: metrics.jsonl differs from zshard train's beyond timings"
}

# kill_at NAME K SIG SERVER: sends SIG to server SERVER once step K is reported.  A step of the
# tiny model takes milliseconds and the kill lands some 10 to 25 steps after K, so K stays at
# least 40 steps before the end (STEPS): the kill must land while the job runs, also on a
# loaded machine.
kill_at() {
  if ! wait_step "$WORK/$1.err" "$2"; then
    fail "$1: step $2 never came: $(tail -n 5 "$WORK/$1.err")"
    return
  fi
  local p
  p=$(pid_of "$WORK/$1.err" "server $4")
  if [ -z "$p" ]; then
    fail "$1: no pid for server $4"
    return
  fi
  echo "$1: SIG$3 to server $4 (pid $p) after step $2"
  kill -"$3" "$p" 2>/dev/null || fail "$1: server $4 (pid $p) was gone before SIG$3 after step $2: $(tail -n 2 "$WORK/$1.err")"
}

# 1. A random server killed at a random step after the first checkpoint.
k=$((4 + RANDOM % 16))
s=$((1 + RANDOM % 3))
launch_bg one 3
kill_at one $k KILL $s
finish_run one 0
has one "$WORK/one/logs/coord.log" "every server goes back to checkpoint"
has one "$WORK/one.err" "1 server was lost on the way; the coordinator recovered"
expect_log one "$WORK/one.err" "started server $s\.1 \(pid [0-9]+\) in place of server $s"
has one "$WORK/one/logs/coord.log" "recovered: 3 servers"

# 2. Before the first checkpoint: back to the job's start.
CONFIG=late.json launch_bg early 3 --replacements 0
kill_at early 1 KILL $((1 + RANDOM % 3))
finish_run early 0
has early "$WORK/early/logs/coord.log" "every server goes back to the job's start"

# 3. Two servers at two steps: the last one carries the job.
k1=$((4 + RANDOM % 6))
k2=$((k1 + 3 + RANDOM % 8))
launch_bg two 3 --replacements 0
kill_at two $k1 KILL 1
kill_at two $k2 KILL 3
finish_run two 0
has two "$WORK/two/logs/coord.log" "recovered: 1 servers"

# 4. A server hung past the heartbeat timeout (1 s), then continued.
launch_bg hang 3
kill_at hang $((4 + RANDOM % 15)) STOP 2
p=$(pid_of "$WORK/hang.err" "server 2")
wait_until 30 has_line "$WORK/hang/logs/coord.log" "recovered:" || true
[ -n "$p" ] && kill -CONT "$p"
finish_run hang 0
has hang "$WORK/hang/logs/server-2.log" "was dropped from the job"

# 5. A spare started by hand takes the place of a lost server.
launch_bg spare 2 --replacements 0
wait_until 30 has_line "$WORK/spare.err" "listening on tcp://" || true
ep=$(sed -n 's/.*listening on \(tcp:[^ ]*\).*/\1/p' "$WORK/spare.err" | head -n 1)
# After the launcher's servers are in, so that the hand-started one is the spare.
wait_until 30 has_line "$WORK/spare/logs/coord.log" "all 2 servers are ready" || true
setsid "$ZSHARD" server --coord "$ep" --listen 127.0.0.1:0 --threads 1 \
  2>"$WORK/spare-server.err" &
SPARE=$!
wait_until 30 has_line "$WORK/spare/logs/coord.log" "is a spare" || true
has spare "$WORK/spare/logs/coord.log" "is a spare until a server is lost"
kill_at spare $((4 + RANDOM % 15)) KILL 1
finish_run spare 0
has spare "$WORK/spare/logs/coord.log" "recovered: 2 servers"
checks=$((checks + 1))
rc=0
wait "$SPARE" || rc=$?
[ $rc -eq 0 ] || fail "spare: the hand-started server exited $rc: $(tail -n 5 "$WORK/spare-server.err")"

# 6. Every server lost: the job ends and says where to resume from; the resume gives the bits.
launch_bg all 2 --replacements 0
kill_at all $((7 + RANDOM % 10)) KILL 1
wait_until 30 has_line "$WORK/all/logs/coord.log" "recovered:" || true
p=$(pid_of "$WORK/all.err" "server 2")
[ -n "$p" ] && kill -KILL "$p"
finish_run all 1
has all "$WORK/all.err" "every partition server is gone; the newest checkpoint is"
launch_bg all 3 --resume "$WORK/all/checkpoints"
finish_run all 0

# from_replica NAME FAILOVERS: the coordinator failed over FAILOVERS times and never went back
# to a checkpoint, and the launcher printed each step's line once (no step ran twice).
from_replica() {
  local log="$WORK/$1/logs/coord.log" n
  checks=$((checks + 3))
  n=$(grep -c "the job goes on from memory" "$log" || true)
  [ "$n" -eq "$2" ] || fail "$1: $n failovers in $log, expected $2: $(grep -E 'WARN|ERROR' "$log" | tail -n 5)"
  ! grep -q "every server goes back to" "$log" || fail "$1: went back to a checkpoint: $(grep 'goes back to' "$log")"
  n=$(grep -c '^step ' "$WORK/$1.err" || true)
  [ "$n" -eq $STEPS ] || fail "$1: $n step lines, expected $STEPS (a step ran twice)"
}

# 7. Replicas: a random server killed at a random step.
CONFIG=rep.json launch_bg rep 3
kill_at rep $((2 + RANDOM % 18)) KILL $((1 + RANDOM % 3))
finish_run rep 0
from_replica rep 1

# 8. Replicas: two servers at two steps; the second loss uses a replica loaded after the first,
# so it comes 4 steps or more after the version the first failover went on from.
k1=$((2 + RANDOM % 10))
CONFIG=rep.json launch_bg rep2 3
kill_at rep2 $k1 KILL 2
wait_until 30 has_line "$WORK/rep2/logs/coord.log" "failed over: .* from memory at version" ||
  fail "rep2: no failover after the first kill: $(tail -n 3 "$WORK/rep2/logs/coord.log")"
v=$(sed -n 's/.*failed over: .* from memory at version \([0-9]*\).*/\1/p' "$WORK/rep2/logs/coord.log" | head -n 1)
kill_at rep2 $((${v:-$k1} + 4 + RANDOM % 4)) KILL 3
finish_run rep2 0
from_replica rep2 2
has rep2 "$WORK/rep2/logs/coord.log" "failed over: 1 servers"

# 9. Replicas: a server hung past the heartbeat timeout, then continued.
CONFIG=rep.json launch_bg rephang 3
kill_at rephang $((2 + RANDOM % 15)) STOP 1
p=$(pid_of "$WORK/rephang.err" "server 1")
wait_until 30 has_line "$WORK/rephang/logs/coord.log" "failed over:" || true
[ -n "$p" ] && kill -CONT "$p"
finish_run rephang 0
from_replica rephang 1
# Told it was dropped, or (when the job finished before it woke) that the job is done.
expect_log rephang "$WORK/rephang/logs/server-1.log" "was dropped from the job|shutdown: the job is done"

finish
