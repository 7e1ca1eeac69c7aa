# Helpers for the elastic tests (elastic_*.sh), which source this file instead of lib.sh: a
# config for elastic runs, zshard train's reference run, zshard launch with an elastic script
# (every pid it started collected), the same-bits check and the no-process-left check.
#
# CTest runs every *.sh here but lib.sh as a test, this one too: run by itself, it checks that
# `zshard launch --elastic-script` refuses bad scripts (file:line and the reason, exit 2, before
# anything starts), and that a config with "elasticity": {"enabled": true} alone makes a
# worker's death an event: one killed by hand, the job goes on to the same bits.
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

# alive PID: the process exists and is not a zombie.
alive() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
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

# metrics_compared FILE: the metrics without timings and without "workers".
metrics_compared() {
  metrics_without_timing "$1" | sed -E 's/, "workers": [^,}]*//'
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

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

# ---- Run by itself: bad scripts, and elasticity from the config alone. ----

# refused NEEDLE SCRIPT_TEXT [WORKERS]: the script is refused (exit 2) with NEEDLE, and nothing
# was started (no output directory).
refused() {
  local needle=$1 text=$2 workers=${3:-1} rc=0
  checks=$((checks + 1))
  printf '%s\n' "$text" >"$WORK/bad.txt"
  rm -rf "$WORK/bad"
  "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 5 --servers 1 \
    --workers "$workers" --out "$WORK/bad" --elastic-script "$WORK/bad.txt" \
    >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  [ $rc -eq 2 ] || fail "script '$text': exit $rc, expected 2: $(cat "$WORK/err.txt")"
  grep -qF -- "$needle" "$WORK/err.txt" ||
    fail "script '$text': stderr lacks '$needle': $(cat "$WORK/err.txt")"
  [ ! -e "$WORK/bad" ] || fail "script '$text': $WORK/bad was created"
}
B=$WORK/bad.txt
refused "$B:2: \"kil\": the action is start, kill, term, stop or cont" $'step 1 start\nstep 2 kil 1'
refused "$B:1: step \"6\": not a step of this job (1 to 5, from --steps)" 'step 6 start'
refused "$B:1: step \"0\"" 'step 0 start'
refused "$B:3: after \"-5\": not a number of milliseconds" $'# c\n\nafter -5 start'
refused "$B:1: \"at\": a line is \"step K ACTION [TARGET]\" or \"after MS ACTION [TARGET]\"" \
  'at 3 start'
refused "$B:1: no action after \"step ...\"" 'step 2'
refused "$B:1: unexpected \"now\" after the target" 'step 2 kill 1 now'
refused "$B:1: kill \"first\": the target is a worker number, any or all" 'step 2 kill first'
refused "$B:1: start \"0\": not a number of workers" 'step 2 start 0'
refused "$B:2: term 3: there is no worker 3 when this line fires (2 by then: 1 from --workers, 1 started by the lines above)" \
  $'step 2 start\nstep 3 term 3'
refused "$B:1: stop 1: there is no worker 1 when this line fires (0 by then" 'step 1 stop 1' 0
checks=$((checks + 1))
rc=0
"$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 5 --servers 1 \
  --workers 1 --out "$WORK/bad" --elastic-script "$WORK/none.txt" 2>"$WORK/err.txt" || rc=$?
[ $rc -eq 2 ] && grep -qF -- "--elastic-script $WORK/none.txt: No such file" "$WORK/err.txt" ||
  fail "a missing script: exit $rc: $(cat "$WORK/err.txt")"
expect_ok "$ZSHARD" launch --help
for want in '--elastic-script FILE' 'step K ACTION [TARGET]' 'after MS ACTION [TARGET]' \
  'kill (SIGKILL)'; do
  grep -qF -- "$want" "$WORK/out.txt" || fail "launch --help lacks '$want'"
done

# Elastic by the config alone: worker 1 killed by hand at step 3, worker 2 finishes the job.
elastic_config "$WORK/elastic.json" "$MEDIUM"
train_reference "$WORK/elastic.json" 8
"$ZSHARD" launch --config "$WORK/elastic.json" --data "$DATA/tiny.txt" --steps 8 --servers 1 \
  --workers 2 --threads 1 --out "$WORK/byhand" 2>"$WORK/byhand.err" &
LPID=$!
end=$((SECONDS + 60))
until grep -q '^step  *2/8' "$WORK/byhand.err" 2>/dev/null || [ $SECONDS -ge $end ]; do
  sleep 0.02
done
W1=$(sed -n 's/.* worker 1 (pid \([0-9]*\)).*/\1/p' "$WORK/byhand.err" | head -n 1)
[ -n "$W1" ] && kill -KILL "$W1" || fail "byhand: no pid for worker 1: $(cat "$WORK/byhand.err")"
end=$((SECONDS + 60))
while alive "$LPID" && [ $SECONDS -lt $end ]; do sleep 0.1; done
alive "$LPID" && { fail "byhand: still running 60 s later"; kill -INT "$LPID"; }
RC=0
wait "$LPID" || RC=$?
{ grep -o '(pid [0-9]*)' "$WORK/byhand.err" || true; } | tr -dc '0-9\n' >"$WORK/byhand.pids"
check_same byhand 8
expect_line byhand "^zshard launch: worker 1 \\(pid $W1\\) was killed by signal 9 .*; the job goes on: the coordinator gives its chunks to the others" \
  "the death of worker 1 is not an event"
check_none_left byhand
finish
