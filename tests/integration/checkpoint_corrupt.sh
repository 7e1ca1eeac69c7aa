# Damaged checkpoints are refused by name, and a checkpoint directory whose newest checkpoint
# is damaged falls back to the previous valid one.  A run of 12 steps with a checkpoint every 3
# (3, 6, 9, 12); then, on a copy of its checkpoint directory, step 12 gets one of: a flipped
# byte in a shard file's data, a flipped byte in a shard file's header (the length, the JSON or
# its padding), a truncated shard file, a missing shard file, the manifest of another run's
# step 12 (same config and data, another run id), a flipped byte in the manifest.  For each:
#  - `zshard export STEPDIR` fails naming the file, and writes no model.safetensors;
#  - `zshard launch --resume STEPDIR` is refused naming the file, and writes no model;
#  - `zshard launch --resume CKPTDIR` warns naming the file, resumes from step 9, and ends
#    with zshard train's bits (metrics.jsonl: steps 1..12 once each, train's less timings);
#  - `zshard export CKPTDIR` warns the same way and exports step 9: zshard train's 9-step model.
# Also: steps 12 and 9 damaged (back to 6, two warnings), and every checkpoint damaged (refused,
# naming why the newest failed).  The shard file and the byte are drawn from a seed (printed;
# ZS_TEST_SEED=N repeats it).
source "$(dirname "$0")/lib.sh"
STEPS=12
SEED=${ZS_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 1000000 ))}
echo "checkpoint_corrupt: seed $SEED (ZS_TEST_SEED=$SEED repeats it)"
RANDOM=$SEED

sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384}, "checkpoint": {"interval_steps": 3, "keep": 10}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q interval_steps "$WORK/job.json" || { fail "the config edit did not take"; finish; }
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps 9 \
  --threads 1 --out "$WORK/train9"

scenario() { echo "checkpoint_corrupt: $*"; }

# run_launch NAME SERVERS [ARGS...]: zshard launch with 1 worker in the foreground (SIGINT
# after 120 s), out in $WORK/NAME, stderr in $WORK/NAME.err.  Sets RC; checks that none of the
# processes it printed is left.
run_launch() {
  local name=$1 servers=$2
  shift 2
  launch_fg "$name" --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
    --servers "$servers" --workers 1 --threads 1 --out "$WORK/$name" "$@"
}

# check_same NAME: the launch exited 0 with zshard train's model and metrics.
check_same() {
  local name=$1 steps
  checks=$((checks + 4))
  [ "$RC" -eq 0 ] || fail "$name: exit $RC, expected 0: $(tail -n 8 "$WORK/$name.err")"
  cmp "$WORK/train/model.safetensors" "$WORK/$name/model.safetensors" ||
    fail "$name: model.safetensors differs from zshard train's"
  steps=$(step_list "$WORK/$name/metrics.jsonl")
  [ "$steps" = "$(seq -s ' ' 1 $STEPS) " ] ||
    fail "$name: metrics.jsonl has steps '$steps', expected 1..$STEPS once each, in order"
  diff <(metrics_compared "$WORK/train/metrics.jsonl") \
    <(metrics_compared "$WORK/$name/metrics.jsonl") >/dev/null ||
    fail "$name: metrics.jsonl differs from zshard train's beyond timings"
}

# refused NAME NEEDLE: the launch failed, naming NEEDLE, and wrote no model.
refused() {
  checks=$((checks + 2))
  [ "$RC" -ne 0 ] || fail "$1: exit 0, expected a refusal naming $2"
  has "$1" "$WORK/$1.err" "$2"
  [ ! -e "$WORK/$1/model.safetensors" ] || fail "$1: a refused resume wrote a model"
}

# export_fails NAME CKPT NEEDLE: zshard export CKPT fails naming NEEDLE and leaves no model.
export_fails() {
  expect_fail "$3" "$ZSHARD" export "$2" --out "$WORK/$1-export"
  checks=$((checks + 1))
  [ ! -e "$WORK/$1-export/model.safetensors" ] && [ ! -e "$WORK/$1-export/model.safetensors.tmp" ] ||
    fail "$1: a failed export left $(ls "$WORK/$1-export")"
}

# flip FILE REGION SEED: xors one byte of FILE with 0xff, at an offset drawn from SEED in
# REGION: "header" (one of, with equal odds, the 8 length bytes, the JSON text, the padding
# after it), "data" (after the header) or "all".  Prints the offset and, for a header, the
# part.  (SEED comes from the caller: $RANDOM in a command substitution is not the test's.)
flip() {
  python3 - "$1" "$2" "$3" <<'EOF'
import random, struct, sys
path, region, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
b = bytearray(open(path, "rb").read())
part = ""
if region == "all":
    lo, hi = 0, len(b)
else:
    start = 8 + struct.unpack("<Q", b[:8])[0]
    text_end = 8 + len(bytes(b[8:start]).rstrip(b" "))
    if region == "data":
        lo, hi = start, len(b)
    else:
        part, lo, hi = rng.choice([(" (length)", 0, 8), (" (JSON)", 8, text_end),
                                   (" (padding)", text_end, start)])
off = rng.randrange(lo, hi)
b[off] ^= 0xFF
open(path, "wb").write(b)
print(f"{off}{part}")
EOF
}

# Two runs of the same job: A's checkpoints get damaged; B lends a manifest of another run.
scenario "two runs of $STEPS steps with checkpoints at 3, 6, 9, 12"
run_launch A 2
check_same A
run_launch B 1
check_same B
run_id() { sed -nE 's/.*"run_id": *"([0-9a-f]+)".*/\1/p' "$1" | head -n 1; }
checks=$((checks + 1))
[ "$(run_id "$WORK/A/checkpoints/step-00000012/manifest.json")" != \
  "$(run_id "$WORK/B/checkpoints/step-00000012/manifest.json")" ] ||
  fail "runs A and B have the same run id: $(run_id "$WORK/A/checkpoints/step-00000012/manifest.json")"
mapfile -t SHARDS < <(cd "$WORK/A/checkpoints/step-00000012" && ls shard-*.safetensors)
checks=$((checks + 1))
[ ${#SHARDS[@]} -ge 2 ] || fail "step 12 has ${#SHARDS[@]} shard files, expected several"

for c in data header truncated missing foreign-manifest manifest; do
  ck=$WORK/ck-$c
  cp -a "$WORK/A/checkpoints" "$ck"
  dir=$ck/step-00000012
  f=${SHARDS[RANDOM % ${#SHARDS[@]}]}
  bad=$dir/$f
  r=$RANDOM
  case $c in
  data) why="byte $(flip "$bad" data $r) of $f flipped" ;;
  header) why="byte $(flip "$bad" header $r) of $f flipped" ;;
  truncated)
    size=$(stat -c %s "$bad")
    cut=$((RANDOM % size))
    truncate -s $cut "$bad"
    why="$f cut to $cut of $size bytes"
    ;;
  missing)
    rm "$bad"
    why="$f removed"
    ;;
  foreign-manifest)
    cp "$WORK/B/checkpoints/step-00000012/manifest.json" "$dir/manifest.json"
    # The shard files do not belong to that manifest: the first one read is named.
    bad=$dir/shard-
    why="manifest.json of run B"
    ;;
  manifest)
    bad=$dir/manifest.json
    why="byte $(flip "$bad" all $r) of manifest.json flipped"
    ;;
  esac
  scenario "$c: step 12: $why"

  export_fails "$c" "$dir" "$bad"
  [ $c != foreign-manifest ] || has "$c" "$WORK/err.txt" "(a file of another run)"

  run_launch "$c-exact" 2 --resume "$dir"
  refused "$c-exact" "$bad"

  mkdir -p "$WORK/$c-dir"
  cp "$WORK/A/metrics.jsonl" "$WORK/$c-dir/"
  run_launch "$c-dir" $((1 + RANDOM % 3)) --resume "$ck"
  check_same "$c-dir"
  has "$c-dir" "$WORK/$c-dir.err" "WARN checkpoint: $ck/latest names step-00000012: $bad"
  has "$c-dir" "$WORK/$c-dir.err" "resuming from $ck/step-00000009, the newest valid checkpoint"

  expect_ok "$ZSHARD" export "$ck" --out "$WORK/$c-dir-export"
  has "$c-dir" "$WORK/err.txt" "$ck/latest names step-00000012: $bad"
  checks=$((checks + 1))
  cmp "$WORK/train9/model.safetensors" "$WORK/$c-dir-export/model.safetensors" ||
    fail "$c: the export of $ck (step 9) differs from zshard train's 9-step model"
done

# Two damaged: back to step 6, with a warning for each.
ck=$WORK/ck-two
cp -a "$WORK/A/checkpoints" "$ck"
f12=${SHARDS[RANDOM % ${#SHARDS[@]}]}
f9=${SHARDS[RANDOM % ${#SHARDS[@]}]}
r=$RANDOM
o12=$(flip "$ck/step-00000012/$f12" data $r)
rm "$ck/step-00000009/$f9"
scenario "two: step 12: byte $o12 of $f12 flipped; step 9: $f9 removed"
mkdir -p "$WORK/two"
cp "$WORK/A/metrics.jsonl" "$WORK/two/"
run_launch two 2 --resume "$ck"
check_same two
has two "$WORK/two.err" "$ck/latest names step-00000012: $ck/step-00000012/$f12"
has two "$WORK/two.err" "WARN checkpoint: $ck/step-00000009/$f9"
has two "$WORK/two.err" "resuming from $ck/step-00000006, the newest valid checkpoint"

# Every checkpoint damaged: nothing to resume from; the message says why the newest failed.
ck=$WORK/ck-all
cp -a "$WORK/A/checkpoints" "$ck"
f=${SHARDS[RANDOM % ${#SHARDS[@]}]}
for s in 3 6 9 12; do truncate -s 100 "$ck/step-$(printf %08d $s)/$f"; done
scenario "all: $f cut to 100 bytes in every checkpoint"
run_launch all 1 --resume "$ck"
refused all "$ck: no valid checkpoint; the newest failed: $ck/latest names step-00000012: $ck/step-00000012/$f: 100 bytes"
export_fails all "$ck" "$ck: no valid checkpoint"

[ $failures -eq 0 ] || echo "checkpoint_corrupt: to repeat: ZS_TEST_SEED=$SEED" >&2
finish
