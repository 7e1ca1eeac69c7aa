# zshard train's checkpoints and --resume (docs/checkpoints.md, "zshard train"): the same
# format as a distributed job's, so either resumes the other, with the bits of an uninterrupted
# run.  tiny.json with a checkpoint every 4 steps.
#  - ref: 12 steps: checkpoints 4, 8 and 12 (the last always), `latest` at 12, each named in its
#    step's metrics line and no other line naming one.
#  - split: 6 steps, then --resume of its checkpoint directory to 12 into the same --out: ref's
#    model and metrics (steps 1..12 once each).
#  - older: --resume of ref's step-00000004 into a new --out holding a copy of ref's metrics
#    (the later lines are dropped and written again).
#  - from launch: zshard launch on 2 servers to step 8, then zshard train --resume to 12; and the
#    other way, zshard launch on 3 servers --resume of a zshard train checkpoint: ref's bits.
#  - bf16 and fp16 (the first steps overflow; the loss scaler's state is in the checkpoint):
#    6 steps + a resume to 12 give the uninterrupted run's bits.
#  - interrupted: SIGINT during a run of a larger model stops it after that step with a
#    checkpoint of that step (exit 130); a resume finishes it with an uninterrupted run's bits.
#  - a checkpoint that cannot be written (checkpoint.dir under a regular file): logged, named in
#    the step's metrics line as checkpoint_error, training goes on, exit 0, ref's model.
#  - refused, naming the reason and writing nothing (no --out made): --init with --resume, a
#    path that does not exist, another config, a finished run; --resume-if-any on a directory
#    without checkpoints is a fresh start.
source "$(dirname "$0")/lib.sh"
STEPS=12

sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384}, "checkpoint": {"interval_steps": 4, "keep": 10}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q '"interval_steps": 4' "$WORK/job.json" || { fail "the config edit did not take"; finish; }

trap kill_started EXIT

# train NAME CONFIG STEPS [ARGS...]: zshard train into $WORK/NAME, stderr in $WORK/NAME.err;
# sets RC.
train() {
  local name=$1 config=$2 steps=$3
  shift 3
  RC=0
  "$ZSHARD" train --config "$config" --data "$DATA/tiny.txt" --steps "$steps" --threads 1 \
    --out "$WORK/$name" "$@" 2>"$WORK/$name.err" || RC=$?
}

# ok NAME: the last command exited 0.
ok() {
  checks=$((checks + 1))
  [ "$RC" = 0 ] || fail "$1: exit $RC: $(tail -n 5 "$WORK/$1.err")"
}

# full NAME OUT REF: OUT holds REF's model bits, and metrics with steps 1..STEPS once each,
# REF's less timings and checkpoint outcomes.
full() {
  same_bits "$1" "$2" "$3"
  checks=$((checks + 1))
  [ "$(step_list "$2/metrics.jsonl")" = "$(step_list "$3/metrics.jsonl")" ] ||
    fail "$1: steps in metrics.jsonl: $(step_list "$2/metrics.jsonl")"
}

# refused NAME NEEDLE: the last command failed, its stderr has NEEDLE, and it made no --out.
refused() {
  checks=$((checks + 2))
  [ "$RC" != 0 ] && grep -qF -- "$2" "$WORK/$1.err" ||
    fail "$1: exit $RC, expected a refusal naming '$2': $(tail -n 3 "$WORK/$1.err")"
  [ ! -e "$WORK/$1" ] || fail "$1: a refused run made its --out"
}

# ---- ref ----
train ref "$WORK/job.json" $STEPS
ok ref
checks=$((checks + 3))
[ "$(ls "$WORK/ref/checkpoints")" = "latest
step-00000004
step-00000008
step-00000012" ] || fail "ref: checkpoints: $(ls "$WORK/ref/checkpoints" | tr '\n' ' ')"
[ "$(cat "$WORK/ref/checkpoints/latest")" = step-00000012 ] ||
  fail "ref: latest says $(cat "$WORK/ref/checkpoints/latest")"
[ "$(grep -o '"step": [0-9]*,.*"checkpoint": "[^"]*"' "$WORK/ref/metrics.jsonl" |
  sed -E 's/"step": ([0-9]+),.*"checkpoint": "([^"]*)"/\1 \2/' | tr '\n' ' ')" = \
  "4 step-00000004 8 step-00000008 12 step-00000012 " ] ||
  fail "ref: the metrics lines naming a checkpoint: $(grep checkpoint "$WORK/ref/metrics.jsonl")"

# ---- split ----
train split "$WORK/job.json" 6
ok split
train split "$WORK/job.json" $STEPS --resume "$WORK/split/checkpoints"
ok split
expect_log split "$WORK/split.err" "resuming run [0-9a-f]{16} from .*step-00000006 \\(step 6 of 12\\)"
full split "$WORK/split" "$WORK/ref"

# ---- older ----
mkdir "$WORK/older"
cp "$WORK/ref/metrics.jsonl" "$WORK/older/"
train older "$WORK/job.json" $STEPS --resume "$WORK/ref/checkpoints/step-00000004"
ok older
full older "$WORK/older" "$WORK/ref"

# ---- from and to zshard launch ----
launch_fg launch8 --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps 8 --servers 2 \
  --workers 2 --threads 1 --out "$WORK/launch8"
checks=$((checks + 1))
[ "$RC" = 0 ] || fail "launch8: exit $RC: $(tail -n 5 "$WORK/launch8.err")"
train launch8 "$WORK/job.json" $STEPS --resume "$WORK/launch8/checkpoints"
ok launch8
full "train after launch" "$WORK/launch8" "$WORK/ref"
mkdir "$WORK/relaunch"
cp "$WORK/ref/metrics.jsonl" "$WORK/relaunch/"
launch_fg relaunch --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 3 --workers 1 --threads 1 --out "$WORK/relaunch" \
  --resume "$WORK/ref/checkpoints/step-00000008"
checks=$((checks + 1))
[ "$RC" = 0 ] || fail "relaunch: exit $RC: $(tail -n 5 "$WORK/relaunch.err")"
[ -f "$WORK/relaunch/model.safetensors" ] && same_bits "launch after train" "$WORK/relaunch" "$WORK/ref"

# ---- bf16 and fp16 ----
python3 - "$WORK/job.json" "$WORK" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
json.dump(dict(c, bf16={"enabled": True}), open(sys.argv[2] + "/bf16.json", "w"))
json.dump(dict(c, fp16={"enabled": True, "initial_scale_power": 20, "loss_scale_window": 3,
                        "hysteresis": 2, "min_loss_scale": 1}), open(sys.argv[2] + "/fp16.json", "w"))
PY
for p in bf16 fp16; do
  train "${p}ref" "$WORK/$p.json" $STEPS
  ok "${p}ref"
  train "$p" "$WORK/$p.json" 6
  ok "$p"
  train "$p" "$WORK/$p.json" $STEPS --resume "$WORK/$p/checkpoints"
  ok "$p"
  full "$p" "$WORK/$p" "$WORK/${p}ref"
done
checks=$((checks + 1))
grep -q '"overflow": true' "$WORK/fp16ref/metrics.jsonl" ||
  fail "fp16: no step overflowed, so the scaler's state was not put to the test"

# ---- interrupted ----
# 4 layers x 96 wide, 128 tokens: steps of some tens of ms, so that SIGINT lands mid-run.
sed -e 's/"model": {[^}]*}/"model": {"n_layer": 4, "n_head": 4, "n_embd": 96, "vocab_size": 256, "block_size": 128}/' \
  "$WORK/job.json" >"$WORK/big.json"
grep -q '"n_embd": 96' "$WORK/big.json" || { fail "the model edit did not take"; finish; }
BIG=60
train bigref "$WORK/big.json" $BIG
ok bigref
"$ZSHARD" train --config "$WORK/big.json" --data "$DATA/tiny.txt" --steps $BIG --threads 1 \
  --out "$WORK/big" 2>"$WORK/big.err" &
PID=$!
PIDS+=("$PID")
checks=$((checks + 1))
wait_until 60 has_line "$WORK/big/metrics.jsonl" '^\{"step": 5,' ||
  fail "interrupted: step 5 did not come: $(tail -n 3 "$WORK/big.err")"
kill -INT "$PID"
RC=0
wait "$PID" || RC=$?
checks=$((checks + 2))
[ "$RC" = 130 ] || fail "interrupted: exit $RC, expected 130: $(tail -n 3 "$WORK/big.err")"
last=$(tail -n 1 "$WORK/big/metrics.jsonl")
stopped=$(sed -E 's/^\{"step": ([0-9]+),.*/\1/' <<<"$last")
name=$(printf 'step-%08d' "$stopped")
[ "$stopped" -lt $BIG ] && grep -qF "\"checkpoint\": \"$name\"" <<<"$last" &&
  [ "$(cat "$WORK/big/checkpoints/latest")" = "$name" ] ||
  fail "interrupted: the last step ($last) has no checkpoint, or latest is not it"
echo "train_resume: interrupted after step $stopped of $BIG"
train big "$WORK/big.json" $BIG --resume "$WORK/big/checkpoints"
ok big
full interrupted "$WORK/big" "$WORK/bigref"

# ---- a checkpoint that cannot be written ----
touch "$WORK/afile"
sed "s|\"interval_steps\": 4|\"interval_steps\": 4, \"dir\": \"$WORK/afile/ck\"|" "$WORK/job.json" \
  >"$WORK/nodir.json"
train nodir "$WORK/nodir.json" $STEPS
ok nodir
same_bits nodir "$WORK/nodir" "$WORK/ref"
checks=$((checks + 2))
[ "$(grep -c '"checkpoint_error": ".*afile' "$WORK/nodir/metrics.jsonl")" = 3 ] ||
  fail "nodir: expected 3 lines with a checkpoint_error naming the path: $(grep -c checkpoint "$WORK/nodir/metrics.jsonl")"
grep -q "checkpoint 4 failed: .*afile" "$WORK/nodir.err" ||
  fail "nodir: the failure is not logged: $(tail -n 3 "$WORK/nodir.err")"

# ---- refusals ----
train both "$WORK/job.json" $STEPS --init "$WORK/ref" --resume "$WORK/ref/checkpoints"
refused both "--init and --resume exclude each other"
train nowhere "$WORK/job.json" $STEPS --resume "$WORK/nowhere"
refused nowhere "$WORK/nowhere"
sed 's/"lr": [0-9.e-]*/"lr": 0.00123/' "$WORK/job.json" >"$WORK/otherlr.json"
checks=$((checks + 1))
cmp -s "$WORK/job.json" "$WORK/otherlr.json" && fail "the lr edit did not take"
train otherlr "$WORK/otherlr.json" $STEPS --resume "$WORK/ref/checkpoints"
refused otherlr "config"
train finished "$WORK/job.json" $STEPS --resume "$WORK/ref/checkpoints"
refused finished "step-00000012"
mkdir "$WORK/empty"
train ifany "$WORK/job.json" $STEPS --resume-if-any "$WORK/empty"
ok ifany
expect_log ifany "$WORK/ifany.err" "holds no checkpoint yet: a fresh start"
full ifany "$WORK/ifany" "$WORK/ref"
finish
