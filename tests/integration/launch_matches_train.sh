# zshard launch with (servers, workers) = (1, 1), (2, 2) and (3, 2) writes the same bits as
# zshard train: model.safetensors identical, metrics.jsonl identical less the timings and the
# worker count, config.json identical.  Also with bf16.enabled (workers fetch bf16 weights and
# compute with them widened, as zshard train computes with its weights rounded to bf16); the
# worker's log must say it fetches bf16.
source "$(dirname "$0")/lib.sh"
STEPS=4

expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"

for sw in 1,1 2,2 3,2; do
  s=${sw%,*}
  w=${sw#*,}
  out="$WORK/launch-$s-$w"
  expect_ok "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
    --servers "$s" --workers "$w" --out "$out"
  [ -f "$out/model.safetensors" ] || { fail "S=$s W=$w: no model: $(tail -n 5 "$WORK/err.txt")"; continue; }
  checks=$((checks + 3))
  cmp "$WORK/train/model.safetensors" "$out/model.safetensors" ||
    fail "S=$s W=$w: model.safetensors differs from zshard train's"
  diff <(metrics_compared "$WORK/train/metrics.jsonl") <(metrics_compared "$out/metrics.jsonl") ||
    fail "S=$s W=$w: metrics.jsonl differs from zshard train's"
  cmp "$WORK/train/config.json" "$out/config.json" ||
    fail "S=$s W=$w: config.json differs from zshard train's"
  [ "$(grep -c '^step ' "$WORK/err.txt")" -eq $STEPS ] ||
    fail "S=$s W=$w: expected $STEPS progress lines: $(cat "$WORK/err.txt")"
  grep -q "zshard launch: done: $STEPS steps, final loss" "$WORK/err.txt" ||
    fail "S=$s W=$w: no summary: $(tail -n 5 "$WORK/err.txt")"
  for f in coord server-1 worker-1; do
    [ -s "$out/logs/$f.log" ] || fail "S=$s W=$w: no $out/logs/$f.log"
  done
done

# bf16: the same bits as zshard train with the same config, over 2 servers and 2 workers.
sed 's/"gradient_clipping"/"bf16": {"enabled": true}, "gradient_clipping"/' "$DATA/tiny.json" \
  > "$WORK/bf16.json"
expect_ok "$ZSHARD" train --config "$WORK/bf16.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train-bf16"
checks=$((checks + 1))
cmp -s "$WORK/train/model.safetensors" "$WORK/train-bf16/model.safetensors" &&
  fail "bf16: zshard train gave the fp32 run's bits; the config change did not take"
expect_ok "$ZSHARD" launch --config "$WORK/bf16.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 2 --workers 2 --log-level info --out "$WORK/launch-bf16"
checks=$((checks + 3))
cmp "$WORK/train-bf16/model.safetensors" "$WORK/launch-bf16/model.safetensors" ||
  fail "bf16: model.safetensors differs from zshard train's"
diff <(metrics_compared "$WORK/train-bf16/metrics.jsonl") \
  <(metrics_compared "$WORK/launch-bf16/metrics.jsonl") ||
  fail "bf16: metrics.jsonl differs from zshard train's"
# Any worker: on a loaded machine one may still be registering when the 4 steps are done.
# grep reads the files itself: `cat | grep -q` fails under pipefail when grep's early exit
# leaves cat a closed pipe (SIGPIPE, 141), which made this check fail about 1 run in 7.
grep -q "bf16 weights" "$WORK/launch-bf16/logs/"worker-*.log ||
  fail "bf16: no worker says it fetches bf16: $(cat "$WORK/launch-bf16/logs/"worker-*.log)"
finish
