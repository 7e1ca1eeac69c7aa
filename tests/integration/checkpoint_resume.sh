# Resuming from checkpoints gives zshard train's bits, and a resume that would not is refused.
# 12 steps, a checkpoint every 3; the seed (printed; ZS_TEST_SEED=N repeats it) draws the
# server counts, the worker count and the step at which the whole job is killed.
#  - kill: zshard launch on S servers, frozen at a random step (its elastic script stops every
#    worker when that step begins, so the kill surely comes before the end), then SIGKILL to
#    the launcher and all its children at once; nothing may be left.  `launch --resume
#    OUT/checkpoints` on S' != S servers into the same --out: train's model.safetensors, and
#    metrics.jsonl with steps 1..12 once each, equal to train's less timings.
#  - older: a finished run resumed from a step directory that is not the newest, into a new
#    --out holding a copy of its metrics.jsonl (the later lines are dropped and written again).
#  - refused: a config with another lr (the config fingerprint), other --data (the data
#    fingerprint), a finished run (nothing left to train), a path that does not exist; each
#    message names the manifest or the path, and no model is written.
#  - coord: `zshard coord --resume` with servers and a worker started by hand; a bad path and a
#    directory without checkpoints are refused, naming them.
source "$(dirname "$0")/lib.sh"
STEPS=12
SEED=${ZS_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 1000000 ))}
echo "checkpoint_resume: seed $SEED (ZS_TEST_SEED=$SEED repeats it)"
RANDOM=$SEED

sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384}, "checkpoint": {"interval_steps": 3, "keep": 10}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q interval_steps "$WORK/job.json" || { fail "the config edit did not take"; finish; }
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"

# Processes started by hand (PIDS), and process groups of launches in the background (PGIDS):
# killed if the test ends early.
trap kill_started EXIT

scenario() { echo "checkpoint_resume: $*"; }

# run_launch NAME SERVERS WORKERS [ARGS...]: zshard launch in the foreground (SIGINT after
# 120 s), out in $WORK/NAME, stderr in $WORK/NAME.err; CONFIG (default job.json) and DATAFILE
# choose the inputs.  Sets RC; checks that no process of it is left.  Resumed jobs get one
# worker: they are a few steps long, a second worker may not have registered when such a job
# ends, and zshard launch then fails waiting for it to exit (a launcher matter, not this test's).
run_launch() {
  local name=$1 servers=$2 workers=$3
  shift 3
  launch_fg "$name" --config "$WORK/${CONFIG:-job.json}" \
    --data "${DATAFILE:-$DATA/tiny.txt}" --steps $STEPS --servers "$servers" \
    --workers "$workers" --threads 1 --out "$WORK/$name" "$@"
}

# check_same NAME OUT: the job exited 0 and OUT holds zshard train's bits: model.safetensors
# identical, metrics.jsonl with steps 1..STEPS once each and in order, equal to train's less
# timings.
check_same() {
  local name=$1 out=$2
  checks=$((checks + 4))
  [ "$RC" -eq 0 ] || fail "$name: exit $RC, expected 0: $(tail -n 8 "$WORK/$name.err")"
  cmp "$WORK/train/model.safetensors" "$out/model.safetensors" ||
    fail "$name: model.safetensors differs from zshard train's"
  local steps
  steps=$(step_list "$out/metrics.jsonl")
  [ "$steps" = "$(seq -s ' ' 1 $STEPS) " ] ||
    fail "$name: metrics.jsonl has steps '$steps', expected 1..$STEPS once each, in order"
  diff <(metrics_compared "$WORK/train/metrics.jsonl") <(metrics_compared "$out/metrics.jsonl") ||
    fail "$name: metrics.jsonl differs from zshard train's beyond timings"
}

# expect_refused NAME NEEDLE...: the job exited non-zero, its stderr has every NEEDLE, and it
# wrote no model.
expect_refused() {
  local name=$1 needle
  shift
  checks=$((checks + 2))
  [ "$RC" -ne 0 ] || fail "$name: exit 0, expected a refusal"
  for needle in "$@"; do
    grep -qF -- "$needle" "$WORK/$name.err" ||
      fail "$name: stderr lacks '$needle': $(tail -n 6 "$WORK/$name.err")"
  done
  [ ! -e "$WORK/$name/model.safetensors" ] || fail "$name: a refused resume wrote a model"
}

# 1. kill: the whole job SIGKILLed at step K, resumed from its checkpoint directory.
S1=$((1 + RANDOM % 3))
S2=$((1 + (S1 + RANDOM % 2) % 3))
W=$((1 + RANDOM % 2))
K=$((5 + RANDOM % (STEPS - 5)))
scenario "kill: $S1 servers, $W workers, everything SIGKILLed when step $K begins; resume on $S2 servers"
printf 'step %d stop all\n' $K >"$WORK/freeze.txt"
setsid "$ZSHARD" launch --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers $S1 --workers $W --threads 1 --out "$WORK/kill" --elastic-script "$WORK/freeze.txt" \
  2>"$WORK/kill.err" &
LPID=$!
PGIDS+=("$LPID")
# Every worker stopped: the launcher said so once per worker.
end=$((SECONDS + 60))
until [ "$(grep -c "^zshard launch: step $K: SIGSTOP worker" "$WORK/kill.err")" -ge $W ] ||
  [ $SECONDS -ge $end ] || ! alive $LPID; do
  sleep 0.02
done
checks=$((checks + 1))
[ "$(grep -c "^zshard launch: step $K: SIGSTOP worker" "$WORK/kill.err")" -ge $W ] ||
  fail "kill: the launcher never stopped its $W workers at step $K: $(tail -n 8 "$WORK/kill.err")"
# shellcheck disable=SC2206,SC2207
kpids=($LPID $(pids_of "$WORK/kill.err") $(pgrep -g $LPID || true))
kill -KILL -- -$LPID 2>/dev/null || true
rc=0
wait $LPID || rc=$?
checks=$((checks + 1))
[ $rc -eq 137 ] || fail "kill: the launcher exited $rc, expected 137 (SIGKILL)"
none_left kill "${kpids[@]}"
checks=$((checks + 2))
[ ! -e "$WORK/kill/model.safetensors" ] || fail "kill: the run finished before the kill"
done_steps=$(step_list "$WORK/kill/metrics.jsonl")
last=${done_steps% }
last=${last##* }
# Step K-1 finished before the freeze; its line is written at once, unless K-1 is checkpointed
# (every 3 steps): then the line waits for every server's report of the checkpoint's files,
# and the SIGKILL may come first.
lowest=$((K - 1))
[ $(((K - 1) % 3)) -eq 0 ] && lowest=$((K - 2))
[ -n "$last" ] && [ "$last" -ge $lowest ] && [ "$last" -lt $STEPS ] ||
  fail "kill: metrics.jsonl ends with step '$last', expected $lowest..$((STEPS - 1))"
echo "checkpoint_resume: killed after step $last; latest names $(cat "$WORK/kill/checkpoints/latest" 2>/dev/null)"
run_launch kill $S2 1 --resume "$WORK/kill/checkpoints"
check_same kill "$WORK/kill"
expect_log kill "$WORK/kill/logs/coord.log" \
  "resuming run [0-9a-f]{16} from $WORK/kill/checkpoints/step-000000(0[3-9]|1[0-2]) "
from=$({ sed -nE 's/.*resuming run [0-9a-f]+ from .*step-0*([0-9]+) .*/\1/p' \
  "$WORK/kill/logs/coord.log" || true; } | head -n 1)
checks=$((checks + 1))
[ -n "$from" ] && [ $((from % 3)) -eq 0 ] && [ "$from" -le "${last:-0}" ] ||
  fail "kill: resumed from step '$from', expected a multiple of 3 no later than step $last"
expect_log kill "$WORK/kill/logs/coord.log" "resuming after step $from: kept $from lines"

# 2. A finished run, then a resume from an older step directory into a new --out.
scenario "full: 2 servers, 1 worker, checkpoints at 3, 6, 9, 12"
run_launch full 2 1
check_same full "$WORK/full"
for s in 3 6 9 12; do
  checks=$((checks + 1))
  [ -s "$WORK/full/checkpoints/step-$(printf %08d $s)/manifest.json" ] ||
    fail "full: no checkpoint of step $s: $(ls "$WORK/full/checkpoints")"
done
OLD=$((3 * (1 + RANDOM % 3)))
S3=$((1 + RANDOM % 3))
scenario "older: resume from step $OLD (not the newest) on $S3 servers into a new --out"
OLDDIR=$WORK/full/checkpoints/step-$(printf %08d $OLD)
mkdir -p "$WORK/older"
cp "$WORK/full/metrics.jsonl" "$WORK/older/"
run_launch older $S3 1 --resume "$OLDDIR"
check_same older "$WORK/older"
expect_log older "$WORK/older/logs/coord.log" "resuming run [0-9a-f]{16} from $OLDDIR "
expect_log older "$WORK/older/logs/coord.log" \
  "resuming after step $OLD: kept $OLD lines, dropped $((STEPS - OLD)) of later steps"
checks=$((checks + 1))
[ -s "$WORK/older/checkpoints/step-00000012/manifest.json" ] ||
  fail "older: the resumed run wrote no final checkpoint in its own checkpoint directory"

# 3. Resumes that would not give the bits of the run, and paths that hold no checkpoint.
scenario "refused: another lr"
sed 's/"lr": 0.003/"lr": 0.002/' "$WORK/job.json" >"$WORK/lr.json"
checks=$((checks + 1))
grep -q '"lr": 0.002' "$WORK/lr.json" || fail "the lr edit did not take"
CONFIG=lr.json run_launch lr 1 1 --resume "$WORK/full/checkpoints/step-00000006"
expect_refused lr "$WORK/full/checkpoints/step-00000006/manifest.json: config_fingerprint" \
  "the configuration changed"

scenario "refused: other --data"
cp "$DATA/tiny.txt" "$WORK/other.txt"
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[100] ^= 1; open(p, "wb").write(b)' \
  "$WORK/other.txt"
checks=$((checks + 1))
cmp -s "$DATA/tiny.txt" "$WORK/other.txt" && fail "the data edit did not take"
DATAFILE=$WORK/other.txt run_launch data 1 1 --resume "$WORK/full/checkpoints/step-00000006"
expect_refused data "$WORK/full/checkpoints/step-00000006/manifest.json: data_fingerprint" \
  "other training data"

scenario "refused: a finished run (its newest checkpoint is step $STEPS of $STEPS)"
run_launch finished 2 1 --resume "$WORK/full/checkpoints"
expect_refused finished "$WORK/full/checkpoints/step-00000012/manifest.json: step 12 is not before this run's steps_total 12" \
  "nothing left to train"
run_launch finished-step 2 1 --resume "$WORK/full/checkpoints/step-00000012"
expect_refused finished-step "step 12 is not before this run's steps_total 12"

scenario "refused: a path that does not exist"
run_launch missing 1 1 --resume "$WORK/no-such-dir"
expect_refused missing "$WORK/no-such-dir: No such file or directory"

# 4. zshard coord --resume directly, servers and a worker started by hand.
scenario "coord: zshard coord --resume, refused paths"
expect_fail "$WORK/no-such-dir: No such file or directory" "$ZSHARD" coord \
  --listen 'tcp://127.0.0.1:*' --config "$WORK/job.json" --servers 1 --data "$DATA/tiny.txt" \
  --steps $STEPS --out "$WORK/coord-bad" --resume "$WORK/no-such-dir"
mkdir -p "$WORK/empty"
expect_fail "$WORK/empty: no checkpoint" "$ZSHARD" coord \
  --listen 'tcp://127.0.0.1:*' --config "$WORK/job.json" --servers 1 --data "$DATA/tiny.txt" \
  --steps $STEPS --out "$WORK/coord-bad" --resume "$WORK/empty"

FROM=$WORK/full/checkpoints/step-00000009
scenario "coord: zshard coord --resume $FROM with 2 servers and 1 worker started by hand"
mkdir -p "$WORK/coord"
cp "$WORK/full/metrics.jsonl" "$WORK/coord/"
"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$WORK/job.json" --servers 2 \
  --data "$DATA/tiny.txt" --steps $STEPS --out "$WORK/coord" --resume "$FROM" \
  2>"$WORK/coord.err" &
COORD=$!
PIDS+=("$COORD")
wait_endpoint "$WORK/coord.err" 30 $COORD || true
if [ -z "$EP" ]; then
  fail "coord: the coordinator did not say where it listens: $(tail -n 5 "$WORK/coord.err")"
else
  hand=()
  for i in 1 2; do
    "$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/coord-server-$i.err" &
    hand+=($!)
  done
  "$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/coord-worker.err" &
  hand+=($!)
  PIDS+=("${hand[@]}")
  end=$((SECONDS + 60))
  while alive $COORD && [ $SECONDS -lt $end ]; do sleep 0.05; done
  alive $COORD && fail "coord: still running 60 s later: $(tail -n 5 "$WORK/coord.err")"
  RC=0
  wait $COORD || RC=$?
  cp "$WORK/coord.err" "$WORK/coord-job.err"
  check_same coord-job "$WORK/coord"
  expect_log coord "$WORK/coord.err" "resuming run [0-9a-f]{16} from $FROM \(step 9 of 12\)"
  for p in "${hand[@]}"; do
    checks=$((checks + 1))
    end=$((SECONDS + 10))
    while alive "$p" && [ $SECONDS -lt $end ]; do sleep 0.02; done
    rc=0
    if alive "$p"; then
      fail "coord: process $p still runs 10 s after the coordinator ended"
    else
      wait "$p" || rc=$?
      [ $rc -eq 0 ] || fail "coord: process $p exited $rc after a finished job"
    fi
  done
fi

[ $failures -eq 0 ] || echo "checkpoint_resume: to repeat: ZS_TEST_SEED=$SEED" >&2
finish
