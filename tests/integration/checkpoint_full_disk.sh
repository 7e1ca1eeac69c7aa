# Full disks, on small tmpfs filesystems mounted in a private mount namespace (needs root:
# skipped with exit 77 otherwise).  Sizes come from the size of a real checkpoint.
#  - checkpoints: the checkpoint directory holds 1.5 checkpoints, keep 1, a checkpoint every 2
#    of 6 steps.  Checkpoint 2 fits; 4 and 6 do not while 2 is still there: each fails with
#    "No space left on device" (coordinator log, metrics.jsonl's "checkpoint_error"), leaves
#    nothing behind, and training goes on; the final one failing ends the job with a message
#    that says so.  Step 2 stays valid: its export is zshard train's 2-step model, and a resume
#    from the directory (into another --out, checkpoints on a disk with room) gives train's
#    6-step bits.
#  - zshard train's checkpoints on the same small disk: the same failures, training goes on to
#    train's model, and a resume from the step that fitted gives train's bits.
#  - export: zshard export into a tmpfs too small for the model fails with "No space left on
#    device" and leaves no model.safetensors (nor its .tmp).
#  - metrics: the coordinator's --out on a tmpfs with one free page (checkpoints elsewhere,
#    one per step): metrics.jsonl fills up mid-run; the coordinator ends the job naming
#    metrics.jsonl and "No space left on device", its servers and workers exit, the file holds
#    only complete JSON lines (steps 1..m, train's less timings), and the resume the message
#    advises gives train's bits with every step once in metrics.jsonl.
if [ -z "${ZS_FULL_DISK_NS:-}" ]; then
  if ! unshare --mount --propagation private true 2>/dev/null; then
    echo "checkpoint_full_disk: skipped: needs root for a private tmpfs"
    exit 77
  fi
  ZS_FULL_DISK_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"

MOUNTS=()
cleanup() {
  local i
  kill_started
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

# mount_tmpfs DIR BYTES: a tmpfs of BYTES (a multiple of 4096) at DIR, in this namespace only.
mount_tmpfs() {
  mkdir -p "$1"
  mount -t tmpfs -o "size=$2" tmpfs "$1" || return 1
  MOUNTS+=("$1")
}
if ! mount_tmpfs "$WORK/probe" 65536 2>"$WORK/probe.err"; then
  echo "checkpoint_full_disk: skipped: cannot mount a tmpfs: $(cat "$WORK/probe.err")"
  exit 77
fi

scenario() { echo "checkpoint_full_disk: $*"; }

# avail DIR: the bytes free in DIR's filesystem.
avail() { df -B1 --output=avail "$1" | tail -n 1 | tr -d ' '; }

# config FILE CKPT_DIR INTERVAL KEEP: tiny.json with a checkpoint block.
config() {
  local block="\"checkpoint\": {\"dir\": \"$2\", \"interval_steps\": $3, \"keep\": $4}"
  sed "s#\"cluster\": {\"shard_size\": 16384}#\"cluster\": {\"shard_size\": 16384}, $block#" \
    "$DATA/tiny.json" >"$1"
  grep -q "\"dir\": \"$2\"" "$1" || fail "the config edit of $1 did not take"
}

# run_launch NAME CFG STEPS SERVERS [ARGS...]: zshard launch with 1 worker in the foreground
# (SIGINT after 120 s), out in $WORK/NAME, stderr in $WORK/NAME.err.  Sets RC; checks that none
# of the processes it printed is left.
run_launch() {
  local name=$1 cfg=$2 steps=$3 servers=$4
  shift 4
  launch_fg "$name" --config "$cfg" --data "$DATA/tiny.txt" --steps "$steps" \
    --servers "$servers" --workers 1 --threads 1 --out "$WORK/$name" "$@"
}

# check_same NAME OUT TRAIN STEPS: exit 0, TRAIN's model, metrics with steps 1..STEPS once
# each and in order, equal to TRAIN's less timings.
check_same() {
  local name=$1 out=$2 train=$3 steps=$4 got
  checks=$((checks + 4))
  [ "$RC" -eq 0 ] || fail "$name: exit $RC, expected 0: $(tail -n 8 "$WORK/$name.err")"
  cmp "$train/model.safetensors" "$out/model.safetensors" ||
    fail "$name: model.safetensors differs from zshard train's"
  got=$(step_list "$out/metrics.jsonl")
  [ "$got" = "$(seq -s ' ' 1 "$steps") " ] ||
    fail "$name: metrics.jsonl has steps '$got', expected 1..$steps once each, in order"
  diff <(metrics_compared "$train/metrics.jsonl") <(metrics_compared "$out/metrics.jsonl") \
    >/dev/null || fail "$name: metrics.jsonl differs from zshard train's beyond timings"
}

# train STEPS: zshard train's run of STEPS steps, in $WORK/train-STEPS.
train() {
  expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps "$1" \
    --threads 1 --out "$WORK/train-$1"
}
train 2
train 6
train 30

# A checkpoint's size on a disk with room: 6 steps, the final checkpoint kept.
config "$WORK/ref.json" "$WORK/ref-ck" 2 1
run_launch ref "$WORK/ref.json" 6 2
check_same ref "$WORK/ref" "$WORK/train-6" 6
# Pages it takes on a tmpfs: each file rounded up to 4096 bytes.
PAGES=$(python3 -c '
import os, sys
d = sys.argv[1]
print(sum(-(-os.path.getsize(os.path.join(d, f)) // 4096) for f in os.listdir(d)))' \
  "$WORK/ref-ck/step-00000006")
echo "checkpoint_full_disk: a checkpoint takes $PAGES pages of 4096 bytes" \
  "($(du -sb "$WORK/ref-ck/step-00000006" | cut -f1) bytes)"

# 1. The checkpoint directory fills up.
SMALL=$WORK/small-ck
mount_tmpfs "$SMALL" $((PAGES * 3 / 2 * 4096)) || fail "cannot mount a tmpfs at $SMALL"
scenario "checkpoints: $(avail "$SMALL") bytes for checkpoints of $((PAGES * 4096)), keep 1, every 2 of 6 steps"
config "$WORK/small.json" "$SMALL" 2 1
run_launch small "$WORK/small.json" 6 2
checks=$((checks + 2))
[ "$RC" -ne 0 ] || fail "small: exit 0, expected a failure: the final checkpoint cannot fit"
[ ! -e "$WORK/small/model.safetensors" ] || fail "small: a model was exported without a final checkpoint"
has small "$WORK/small.err" "the final checkpoint (step 6) failed"
has small "$WORK/small.err" "$SMALL/step-00000006/"
has small "$WORK/small.err" "No space left on device"
has small "$WORK/small/logs/coord.log" "coord: checkpoint 4 failed: server"
grep -F "checkpoint 4 failed" "$WORK/small/logs/coord.log" >"$WORK/small-4.txt" || true
has small "$WORK/small-4.txt" "No space left on device"
# metrics.jsonl: every step, with the checkpoints' outcomes.
checks=$((checks + 5))
[ "$(step_list "$WORK/small/metrics.jsonl")" = "1 2 3 4 5 6 " ] ||
  fail "small: metrics.jsonl has steps '$(step_list "$WORK/small/metrics.jsonl")', expected 1..6"
diff <(metrics_compared "$WORK/train-6/metrics.jsonl") <(metrics_compared "$WORK/small/metrics.jsonl") \
  >/dev/null || fail "small: metrics.jsonl differs from zshard train's beyond timings"
grep -q '^{"step": 2,.*"checkpoint": "step-00000002"}$' "$WORK/small/metrics.jsonl" ||
  fail "small: step 2's line does not name its checkpoint: $(sed -n 2p "$WORK/small/metrics.jsonl")"
for s in 4 6; do
  grep -q "^{\"step\": $s,.*\"checkpoint_error\": \"[^\"]*No space left on device\"}\$" \
    "$WORK/small/metrics.jsonl" ||
    fail "small: step $s's line has no checkpoint_error with ENOSPC:" \
      "$(sed -n ${s}p "$WORK/small/metrics.jsonl")"
done
# The failed checkpoints left nothing; step 2 is the newest and is whole.
checks=$((checks + 2))
[ "$(cat "$SMALL/latest" 2>/dev/null)" = step-00000002 ] ||
  fail "small: latest names '$(cat "$SMALL/latest" 2>/dev/null)', expected step-00000002"
left=$(cd "$SMALL" && ls -A | tr '\n' ' ')
[ "$left" = "latest step-00000002 " ] ||
  fail "small: $SMALL holds '$left', expected only latest and step-00000002"
expect_ok "$ZSHARD" export "$SMALL/step-00000002" --out "$WORK/small-export"
checks=$((checks + 1))
cmp "$WORK/train-2/model.safetensors" "$WORK/small-export/model.safetensors" ||
  fail "small: the export of step 2 differs from zshard train's 2-step model"
# The resume, into another --out with checkpoints on a disk with room (a second config).
scenario "checkpoints: resume from $SMALL (step 2) on 3 servers, checkpoints on a disk with room"
config "$WORK/big.json" "$WORK/big-ck" 2 1
mkdir -p "$WORK/resumed"
cp "$WORK/small/metrics.jsonl" "$WORK/resumed/"
run_launch resumed "$WORK/big.json" 6 3 --resume "$SMALL"
check_same resumed "$WORK/resumed" "$WORK/train-6" 6
has resumed "$WORK/resumed/logs/coord.log" "from $SMALL/step-00000002 (step 2 of 6)"

# 1b. The same for zshard train's own checkpoints: 2 fits, 4 and 6 fail with ENOSPC (logged,
# named in their metrics lines, nothing left behind) and training goes on to train's 6-step
# model (exit 0: the model is written from memory); a resume from the full disk's step 2 (into
# another --out, checkpoints on a disk with room) gives train's bits.
SMALL_T=$WORK/small-train-ck
mount_tmpfs "$SMALL_T" $((PAGES * 3 / 2 * 4096)) || fail "cannot mount a tmpfs at $SMALL_T"
scenario "zshard train: $(avail "$SMALL_T") bytes for checkpoints of $((PAGES * 4096)), keep 1, every 2 of 6 steps"
config "$WORK/small-train.json" "$SMALL_T" 2 1
expect_ok "$ZSHARD" train --config "$WORK/small-train.json" --data "$DATA/tiny.txt" --steps 6 \
  --threads 1 --out "$WORK/small-train"
cp "$WORK/err.txt" "$WORK/small-train.err"
checks=$((checks + 4))
cmp "$WORK/train-6/model.safetensors" "$WORK/small-train/model.safetensors" ||
  fail "zshard train: the model differs from the run with room for its checkpoints"
for s in 4 6; do
  grep -q "^{\"step\": $s,.*\"checkpoint_error\": \"[^\"]*No space left on device\"}\$" \
    "$WORK/small-train/metrics.jsonl" ||
    fail "zshard train: step $s's line has no checkpoint_error with ENOSPC: $(sed -n ${s}p "$WORK/small-train/metrics.jsonl")"
done
[ "$(cat "$SMALL_T/latest" 2>/dev/null)" = step-00000002 ] &&
  [ "$(cd "$SMALL_T" && ls -A | tr '\n' ' ')" = "latest step-00000002 " ] ||
  fail "zshard train: $SMALL_T holds '$(cd "$SMALL_T" && ls -A | tr '\n' ' ')', latest '$(cat "$SMALL_T/latest" 2>/dev/null)'"
has "zshard train" "$WORK/small-train.err" "train: checkpoint 4 failed: "
config "$WORK/big-train.json" "$WORK/big-train-ck" 2 1
mkdir -p "$WORK/train-resumed"
head -n 2 "$WORK/small-train/metrics.jsonl" >"$WORK/train-resumed/metrics.jsonl"
expect_ok "$ZSHARD" train --config "$WORK/big-train.json" --data "$DATA/tiny.txt" --steps 6 \
  --threads 1 --out "$WORK/train-resumed" --resume "$SMALL_T"
RC=0
check_same train-resumed "$WORK/train-resumed" "$WORK/train-6" 6

# 2. zshard export into a disk too small for the model.
TINY=$WORK/tiny-out
mount_tmpfs "$TINY" 65536 || fail "cannot mount a tmpfs at $TINY"
scenario "export: a model of $(stat -c %s "$WORK/train-6/model.safetensors") bytes into $(avail "$TINY") bytes"
expect_fail "No space left on device" "$ZSHARD" export "$WORK/ref-ck/step-00000006" --out "$TINY/model"
has export "$WORK/err.txt" "$TINY/model/model.safetensors"
checks=$((checks + 2))
[ ! -e "$TINY/model/model.safetensors" ] ||
  fail "export: a failed export left $TINY/model/model.safetensors"
[ ! -e "$TINY/model/model.safetensors.tmp" ] ||
  fail "export: a failed export left $TINY/model/model.safetensors.tmp" \
    "($(stat -c %s "$TINY/model/model.safetensors.tmp") bytes)"
# The same export with room: the model of step 6.
expect_ok "$ZSHARD" export "$WORK/ref-ck/step-00000006" --out "$WORK/ref-export"
checks=$((checks + 1))
cmp "$WORK/train-6/model.safetensors" "$WORK/ref-export/model.safetensors" ||
  fail "export: the export of step 6 differs from zshard train's model"

# 3. metrics.jsonl fills its disk: the coordinator's --out on a tmpfs with one page free, the
# checkpoints (one per step) elsewhere; a coordinator, a server and a worker started by hand,
# their logs elsewhere too.
OUT=$WORK/small-out
mount_tmpfs "$OUT" 8192 || fail "cannot mount a tmpfs at $OUT"
dd if=/dev/zero of="$OUT/filler" bs=4096 count=1 status=none || fail "cannot fill $OUT"
scenario "metrics: --out with $(avail "$OUT") bytes free, 30 steps, a checkpoint every step"
config "$WORK/metrics.json" "$WORK/metrics-ck" 1 2
"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$WORK/metrics.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps 30 --out "$OUT" 2>"$WORK/metrics-coord.err" &
COORD=$!
PIDS+=("$COORD")
wait_endpoint "$WORK/metrics-coord.err" 30 $COORD || true
if [ -z "$EP" ]; then
  fail "metrics: the coordinator did not say where it listens: $(tail -n 5 "$WORK/metrics-coord.err")"
else
  "$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/metrics-server.err" &
  SERVER=$!
  "$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/metrics-worker.err" &
  WORKER=$!
  PIDS+=("$SERVER" "$WORKER")
  for p in $COORD $SERVER $WORKER; do
    end=$((SECONDS + 60))
    while alive $p && [ $SECONDS -lt $end ]; do sleep 0.05; done
    checks=$((checks + 1))
    rc=0
    if alive $p; then
      fail "metrics: process $p still runs 60 s later"
    else
      wait $p || rc=$?
      [ $rc -ne 0 ] || fail "metrics: process $p exited 0 from a job that could not write its metrics"
    fi
  done
  has metrics "$WORK/metrics-coord.err" "metrics $OUT/metrics.jsonl: writing a line of"
  has metrics "$WORK/metrics-coord.err" "No space left on device"
  has metrics "$WORK/metrics-worker.err" "the job was aborted: metrics $OUT/metrics.jsonl"
  # Only complete, valid JSON lines; the steps 1..m, as zshard train wrote them.
  checks=$((checks + 3))
  python3 -c '
import json, sys
data = open(sys.argv[1], "rb").read()
if data and not data.endswith(b"\n"):
    sys.exit("the last line is not complete: %r" % data[-60:])
for i, line in enumerate(data.splitlines(), 1):
    try:
        json.loads(line)
    except ValueError as e:
        sys.exit("line %d is not JSON (%s): %r" % (i, e, line))' "$OUT/metrics.jsonl" ||
    fail "metrics: $OUT/metrics.jsonl holds a broken line"
  m=$(wc -l <"$OUT/metrics.jsonl")
  [ "$(step_list "$OUT/metrics.jsonl")" = "$(seq -s ' ' 1 "$m") " ] && [ "$m" -ge 1 ] &&
    [ "$m" -lt 30 ] || fail "metrics: metrics.jsonl has steps" \
    "'$(step_list "$OUT/metrics.jsonl")', expected 1..m with 0 < m < 30"
  diff <(metrics_compared "$WORK/train-30/metrics.jsonl" | head -n "$m") \
    <(metrics_compared "$OUT/metrics.jsonl") >/dev/null ||
    fail "metrics: the lines written differ from zshard train's beyond timings"
  newest=$({ sed -nE 's/.*the newest checkpoint is step ([0-9]+) in .*/\1/p' \
    "$WORK/metrics-coord.err" || true; } | head -n 1)
  echo "checkpoint_full_disk: metrics.jsonl full after $m lines" \
    "($(stat -c %s "$OUT/metrics.jsonl") bytes); the coordinator names checkpoint ${newest:-none}"
  has metrics "$WORK/metrics-coord.err" "continue with --resume $WORK/metrics-ck"
  # The advised resume, with room for the metrics: every step once, train's bits.
  scenario "metrics: resume with --resume $WORK/metrics-ck into an --out with room"
  mkdir -p "$WORK/metrics-resumed"
  cp "$OUT/metrics.jsonl" "$WORK/metrics-resumed/"
  run_launch metrics-resumed "$WORK/metrics.json" 30 2 --resume "$WORK/metrics-ck"
  check_same metrics-resumed "$WORK/metrics-resumed" "$WORK/train-30" 30
  if [ -n "$newest" ] && ! grep -q "^{\"step\": $newest," "$WORK/metrics-resumed/metrics.jsonl"; then
    echo "checkpoint_full_disk: step $newest's line is lost: its checkpoint was committed" \
      "before the line failed, and the resume continues after it" >&2
  fi
fi

finish
