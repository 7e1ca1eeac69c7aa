# zshard train is deterministic to the bit: the same run twice, and 1 thread against 2, give
# the same metrics (less wall-clock fields) and the same model file.  Also: --init from a
# saved model reproduces it, and eval gives the same loss on any thread count.
source "$(dirname "$0")/lib.sh"

run() { # run NAME THREADS [extra...]
  local name=$1 threads=$2
  shift 2
  expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 6 \
    --out "$WORK/$name" --threads "$threads" --log-level warn "$@"
}
run a 2
run b 2
run c 1
for x in b c; do
  checks=$((checks + 1))
  cmp -s "$WORK/a/model.safetensors" "$WORK/$x/model.safetensors" ||
    fail "model.safetensors of run a and run $x differ"
  checks=$((checks + 1))
  diff <(metrics_without_timing "$WORK/a/metrics.jsonl") <(metrics_without_timing "$WORK/$x/metrics.jsonl") >/dev/null ||
    fail "metrics of run a and run $x differ"
done
checks=$((checks + 1))
[ "$(wc -l < "$WORK/a/metrics.jsonl")" -eq 6 ] || fail "metrics.jsonl has $(wc -l < "$WORK/a/metrics.jsonl") lines, expected 6"
for key in step loss lr grad_norm tokens_per_sec; do
  checks=$((checks + 1))
  grep -q "\"$key\": " "$WORK/a/metrics.jsonl" || fail "metrics.jsonl lacks \"$key\""
done
checks=$((checks + 1))
grep -q '"GPT2LMHeadModel"' "$WORK/a/config.json" || fail "config.json is not an HF GPT-2 config"

# A different seed must change the result (the comparison above can fail).
sed 's/"seed": 5/"seed": 6/' "$DATA/tiny.json" > "$WORK/seed6.json"
expect_ok "$ZSHARD" train --config "$WORK/seed6.json" --data "$DATA/tiny.txt" --steps 6 --out "$WORK/d" --log-level warn
checks=$((checks + 1))
cmp -s "$WORK/a/model.safetensors" "$WORK/d/model.safetensors" && fail "seed 5 and seed 6 gave the same model"

# --init: zero steps from a saved model writes the same model back.
expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 0 --out "$WORK/e" --init "$WORK/a" --log-level warn
checks=$((checks + 1))
cmp -s "$WORK/a/model.safetensors" "$WORK/e/model.safetensors" || fail "--init round trip changed the model"
# Continuing from a model differs from starting fresh.
expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 1 --out "$WORK/f" --init "$WORK/a" --log-level warn
checks=$((checks + 1))
[ "$(head -n1 "$WORK/f/metrics.jsonl" | sed -E 's/.*"loss": ([^,]*),.*/\1/')" != "$(head -n1 "$WORK/a/metrics.jsonl" | sed -E 's/.*"loss": ([^,]*),.*/\1/')" ] ||
  fail "--init did not change the first loss"

expect_ok "$ZSHARD" eval --model "$WORK/a" --data "$DATA/tiny.txt" --threads 1
l1=$(cat "$WORK/out.txt")
expect_ok "$ZSHARD" eval --model "$WORK/a" --data "$DATA/tiny.txt" --threads 2
l2=$(cat "$WORK/out.txt")
checks=$((checks + 1))
[ "$l1" = "$l2" ] || fail "eval with 1 and 2 threads: '$l1' vs '$l2'"
checks=$((checks + 1))
grep -qE '^loss [0-9]+\.[0-9]{6}$' <<<"$l1" || fail "eval printed '$l1'"
expect_fail '--seqs 100000, but' "$ZSHARD" eval --model "$WORK/a" --data "$DATA/tiny.txt" --seqs 100000
expect_fail 'exceeds the model' "$ZSHARD" eval --model "$WORK/a" --data "$DATA/tiny.txt" --seq-len 33
# A corrupt model file is refused with a message naming it.
cp -r "$WORK/a" "$WORK/bad"
head -c 100 "$WORK/a/model.safetensors" > "$WORK/bad/model.safetensors"
expect_fail "$WORK/bad/model.safetensors" "$ZSHARD" eval --model "$WORK/bad" --data "$DATA/tiny.txt"
finish
