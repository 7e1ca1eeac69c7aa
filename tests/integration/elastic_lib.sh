# Helpers for the elastic tests (elastic_*.sh), which source this file instead of lib.sh: a
# config for elastic runs, zshard train's reference run, zshard launch with an elastic script
# (every pid it started collected), the same-bits check and the no-process-left check.
# (tests/CMakeLists.txt runs every *.sh here as a test except the *lib.sh helper files.)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Steps of roughly 150-400 ms with one worker on 2 cores; SMALL is a few ms.
MEDIUM='{"n_layer": 4, "n_head": 4, "n_embd": 96, "vocab_size": 256, "block_size": 128}'
SMALL='{"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "block_size": 32}'

# elastic_config FILE MODEL: an elastic job (8 chunks per step) whose dead workers are found
# within 2 s.  Not less: a server sends no heartbeat while it initializes its shards, which
# took 1.6 s under ctest -j2 (and longer under the sanitizers), and a server declared dead
# ends the job.  Shards of 16384 floats make that initialization shorter than the default's
# small shards would.
elastic_config() {
  cat >"$1" <<EOF
{
  "seed": 5,
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "gradient_clipping": 1.0,
  "model": $2,
  "cluster": {"shard_size": 65536, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 2000},
  "elasticity": {"enabled": true}
}
EOF
}

# train_reference CFG STEPS: zshard train's run, in $WORK/train.
train_reference() {
  expect_ok "$ZSHARD" train --config "$1" --data "$DATA/tiny.txt" --steps "$2" --threads 1 \
    --out "$WORK/train"
}

# launch_elastic NAME CFG STEPS SERVERS WORKERS [LAUNCH ARGS...]: zshard launch in the
# background, out in $WORK/NAME, stderr in $WORK/NAME.err; waits for it (at most 90 s, then
# SIGINT).  Sets RC.  Every pid it started goes to $WORK/NAME.pids: its children, looked up
# in /proc every 50 ms while it runs, and every "(pid N)" it printed.
launch_elastic() {
  local name=$1 cfg=$2 steps=$3 servers=$4 workers=$5
  shift 5
  "$ZSHARD" launch --config "$cfg" --data "$DATA/tiny.txt" --steps "$steps" \
    --servers "$servers" --workers "$workers" --threads 1 --out "$WORK/$name" "$@" \
    2>"$WORK/$name.err" &
  local lpid=$! end=$((SECONDS + 90)) kids
  : >"$WORK/$name.pids"
  while alive "$lpid"; do
    if read -r kids 2>/dev/null <"/proc/$lpid/task/$lpid/children" && [ -n "$kids" ]; then
      printf '%s\n' $kids >>"$WORK/$name.pids"
    fi
    if [ $SECONDS -ge $end ]; then
      fail "$name: still running after 90 s: $(tail -n 5 "$WORK/$name.err")"
      kill -INT "$lpid" 2>/dev/null || true
      end=$((SECONDS + 30))
    fi
    sleep 0.05
  done
  RC=0
  wait "$lpid" || RC=$?
  { grep -o '(pid [0-9]*)' "$WORK/$name.err" || true; } | tr -dc '0-9\n' >>"$WORK/$name.pids"
  sort -u -o "$WORK/$name.pids" "$WORK/$name.pids"
  echo "$name: zshard launch exited $RC; $(wc -l <"$WORK/$name.pids") processes" \
    "($(grep -c '^step ' "$WORK/$name.err") progress lines)"
}

# check_same NAME STEPS: the launch exited 0 with its summary, and wrote zshard train's bits
# ($WORK/train): model.safetensors identical, metrics.jsonl identical less timings and
# "workers".
check_same() {
  local name=$1 steps=$2 out=$WORK/$1
  checks=$((checks + 4))
  [ "$RC" -eq 0 ] || fail "$name: zshard launch exited $RC: $(tail -n 8 "$WORK/$name.err")"
  grep -q "zshard launch: done: $steps steps" "$WORK/$name.err" ||
    fail "$name: no summary for $steps steps: $(tail -n 5 "$WORK/$name.err")"
  cmp "$WORK/train/model.safetensors" "$out/model.safetensors" ||
    fail "$name: model.safetensors differs from zshard train's"
  diff <(metrics_compared "$WORK/train/metrics.jsonl") <(metrics_compared "$out/metrics.jsonl") ||
    fail "$name: metrics.jsonl differs from zshard train's"
}

# check_none_left NAME: none of the pids of the launch is alive (a live pid counts only if its
# command line names this launch's output or its coordinator: pids are reused).
check_none_left() {
  local name=$1 ep p cmd
  checks=$((checks + 1))
  ep=$(sed -n 's/.* listening on \(tcp:[^ ]*\).*/\1/p' "$WORK/$name.err" | head -n 1)
  [ -s "$WORK/$name.pids" ] || fail "$name: no pids collected"
  while read -r p; do
    alive "$p" || continue
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in
    *"$WORK/$name "* | *"${ep:-no endpoint} "*)
      fail "$name: process $p ($cmd) outlived the launcher"
      kill -9 "$p" 2>/dev/null || true
      ;;
    esac
  done <"$WORK/$name.pids"
}

# expect_line NAME PATTERN WHY: the launcher's stderr has a line matching PATTERN (grep -E).
expect_line() {
  checks=$((checks + 1))
  grep -qE -- "$2" "$WORK/$1.err" || fail "$1: $3: no line matching '$2': $(cat "$WORK/$1.err")"
}
