# fp16 mixed precision with DeepSpeed's dynamic loss scaling (issue 14; docs/precision.md).
# tiny.json with fp16 (initial_scale_power 20: the first steps overflow; loss_scale_window 3:
# the scale grows again soon), a linear WarmupLR and a checkpoint every 3 steps:
#  - zshard train: steps 1..4 overflow and are skipped, then it trains (the loss falls);
#    every line's loss_scale and overflow follow DeepSpeed's update_scale replayed from the
#    overflow flags, and every line's lr is the schedule's at the number of updates applied
#    before it (DeepSpeed does not step the LR scheduler on an overflow);
#  - zshard launch, 2 servers and 2 workers: cmp-equal weights, equal metrics (loss, lr,
#    loss_scale, overflow, ...), the coordinator's warning and the progress line of a skipped
#    step name the scale;
#  - the launch resumed from its checkpoint of step 3 (in the middle of the overflows: the
#    scaler's hysteresis and skip count are in flight) and of step 6: zshard train's bits.
source "$(dirname "$0")/lib.sh"
trap kill_started EXIT
STEPS=10

python3 - "$DATA/tiny.json" "$WORK/fp16.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["fp16"] = {"enabled": True, "initial_scale_power": 20, "loss_scale_window": 3,
             "hysteresis": 2, "min_loss_scale": 1}
c["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.003,
                                                 "warmup_num_steps": 8, "warmup_type": "linear"}}
c["checkpoint"] = {"interval_steps": 3, "keep": 10}
json.dump(c, open(sys.argv[2], "w"))
PY

# check_scaler FILE: every line's loss_scale, overflow and lr as DeepSpeed computes them from
# the overflow flags; steps 1..4 overflow, 5 does not, and the loss of the last line is below
# the first's.  Prints what is wrong and exits 1.
check_scaler() {
  python3 - "$1" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
# DeepSpeed's DynamicLossScaler: init 2^20, window 3, hysteresis 2, min 1, not consecutive.
scale, hyst, last, it, applied = 2.0 ** 20, 2, -1, 0, 0
bad = []
for o in lines:
    s = o["step"]
    lr = 0.001 + (0.003 - 0.001) * min(applied, 8) / 8 if applied < 8 else 0.003
    if o.get("loss_scale") != scale:
        bad.append("step %d: loss_scale %r, DeepSpeed's is %r" % (s, o.get("loss_scale"), scale))
    if abs(o["lr"] - lr) > 1e-12:
        bad.append("step %d: lr %r, expected %r (%d updates applied before it)" % (s, o["lr"], lr, applied))
    ov = o.get("overflow")
    if ov is not (o.get("skipped") is True):
        bad.append("step %d: overflow %r but skipped %r" % (s, ov, o.get("skipped")))
    if ov:
        if hyst == 1:
            scale = max(scale / 2, 1)
        else:
            hyst -= 1
        last = it
    else:
        applied += 1
        if (it - last) % 3 == 0:
            hyst = 2
            scale *= 2
    it += 1
flags = [l.get("overflow") for l in lines]
if flags[:5] != [True, True, True, True, False]:
    bad.append("overflow flags of steps 1..5: %r, expected 4 overflows then an update" % flags[:5])
if not lines[-1]["loss"] < lines[0]["loss"] - 0.3:
    bad.append("the loss went from %r to %r: no training" % (lines[0]["loss"], lines[-1]["loss"]))
if len(lines) != 10:
    bad.append("%d lines, expected 10" % len(lines))
if bad:
    sys.exit("\n".join(bad))
PY
}

expect_ok "$ZSHARD" train --config "$WORK/fp16.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"
checks=$((checks + 2))
check_scaler "$WORK/train/metrics.jsonl" || fail "zshard train: the loss scaler (above)"
grep -q "step     1/$STEPS .* | loss scale 1048576, overflow: skipped" "$WORK/err.txt" ||
  fail "zshard train: no progress line with the scale for skipped step 1: $(head -n 4 "$WORK/err.txt")"

launch_fg launch --config "$WORK/fp16.json" --data "$DATA/tiny.txt" --steps $STEPS --servers 2 \
  --workers 2 --threads 1 --log-level info --out "$WORK/launch"
checks=$((checks + 6))
[ "$RC" -eq 0 ] || fail "launch: exit $RC: $(tail -n 8 "$WORK/launch.err")"
cmp "$WORK/train/model.safetensors" "$WORK/launch/model.safetensors" ||
  fail "launch: model.safetensors differs from zshard train's"
diff <(metrics_compared "$WORK/train/metrics.jsonl") <(metrics_compared "$WORK/launch/metrics.jsonl") ||
  fail "launch: metrics.jsonl differs from zshard train's beyond timings"
check_scaler "$WORK/launch/metrics.jsonl" || fail "launch: the loss scaler (above)"
grep -q "coord: step 1: the gradient overflowed at loss scale 1048576; the update is skipped" \
  "$WORK/launch.err" || fail "launch: no coordinator warning naming the scale of step 1"
# grep reads the logs itself (no `cat |`: see launch_matches_train.sh).
grep -q "fp16 weights" "$WORK/launch/logs/"worker-*.log ||
  fail "launch: no worker says it computes with fp16 weights"

# Resumed from step 3 (hysteresis spent, 3 steps skipped) and from step 6: a new --out with the
# run's metrics.jsonl, whose later lines the coordinator drops and writes again.
for k in 3 6; do
  name=resume-$k
  dir=$WORK/launch/checkpoints/$(printf 'step-%08d' $k)
  checks=$((checks + 4))
  grep -q '"loss_scaler"' "$dir/manifest.json" || fail "$name: the manifest has no loss_scaler"
  mkdir -p "$WORK/$name"
  cp "$WORK/launch/metrics.jsonl" "$WORK/$name/metrics.jsonl"
  launch_fg "$name" --config "$WORK/fp16.json" --data "$DATA/tiny.txt" --steps $STEPS \
    --servers 2 --workers 1 --threads 1 --resume "$dir" --out "$WORK/$name"
  [ "$RC" -eq 0 ] || fail "$name: exit $RC: $(tail -n 8 "$WORK/$name.err")"
  cmp "$WORK/train/model.safetensors" "$WORK/$name/model.safetensors" ||
    fail "$name: model.safetensors differs from zshard train's"
  diff <(metrics_compared "$WORK/train/metrics.jsonl") <(metrics_compared "$WORK/$name/metrics.jsonl") ||
    fail "$name: metrics.jsonl differs from zshard train's beyond timings"
done
finish
