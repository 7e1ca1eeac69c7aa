#!/usr/bin/env bash
# tests/slurm/run.sh BUILD_DIR: the tests of deploy/slurm/ against a real Slurm that this
# script starts (tests/slurm/cluster.sh: slurmctld and three slurmd on loopback) and stops.
#   (a) `sbatch --wait deploy/slurm/zshard.sbatch --config CFG --data PATH --steps N --out DIR`
#       gives zshard train's model, bit for bit; also with --ntasks-per-node=2 on sbatch's
#       command line (2 servers, 2 workers); no process is left once the job has ended.
#   (a') a configuration with an unknown key fails the job, and its output names the key.
#   (b) worker jobs (zshard-worker.sbatch) attach to a running elastic job: one is cancelled
#       with scancel after it computed chunks, which changes no bit of the result;
#   (c) the other one joins, computes chunks and ends with the job (exit 0).
#   (d) a job requeued (scontrol requeue) after a checkpoint resumes from it when Slurm runs
#       it again: the same bits again.
#   (e) a job whose coordinator is killed (SIGKILL) after a checkpoint requeues itself
#       (--requeue-on-failure 1) and resumes: the same bits again.
# Installs Slurm's Debian packages first (deploy/install-deps.sh --slurm); if they cannot be
# installed, says so and exits 0 (skipped).  The exit status is 1 if a check failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." >/dev/null && pwd)
[ $# -eq 1 ] && [ -x "$1/zshard" ] || {
  echo "usage: tests/slurm/run.sh BUILD_DIR (with BUILD_DIR/zshard)" >&2
  exit 2
}
zshard=$(cd "$1" >/dev/null && pwd)/zshard
if ! "$root/deploy/install-deps.sh" --slurm; then
  echo "tests/slurm/run.sh: SKIPPED: Slurm's packages (slurmctld slurmd slurm-client) could" \
    "not be installed" >&2
  exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zs-slurm.XXXXXX")
# lib.sh: fail, finish, metrics_compared, now_ms, wait_until, alive; it makes $tmp/t.
# shellcheck source=tests/integration/lib.sh
source "$root/tests/integration/lib.sh" "$zshard" "$tmp/t"
# The jobs make and use their own secret (DIR/secret), as a user's would.
unset ZSHARD_SECRET_FILE
export ZSHARD=$zshard SLURM_CONF=$tmp/cluster/etc/slurm.conf
cluster_up=0

# leftovers: the pids of processes whose command line names $tmp (every role of every job
# here gets paths under it), other than this script and its children that are not zshard.
leftovers() { pgrep -f -- "zshard .*$tmp" || true; }

cleanup() {
  local st=$? p
  # The timeouts around sbatch --wait pass SIGTERM on to it (SIGKILL would orphan it, polling
  # a controller that is gone).
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  if [ $cluster_up -eq 1 ]; then
    scancel --full --signal=KILL --user="$(id -un)" >/dev/null 2>&1 || true
    bash "$root/tests/slurm/cluster.sh" "$tmp/cluster" down || true
  fi
  for p in $(leftovers) $(pgrep -f -- "sbatch .*$tmp"); do kill -KILL "$p" 2>/dev/null || true; done
  kill_started
  rm -rf "$tmp"
  exit $st
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A run of this stage from another checkout on the same machine holds the default ports: take
# the first of a few port bases where nothing listens (ZS_SLURM_PORT, when set, decides).
if [ -z "${ZS_SLURM_PORT:-}" ] && command -v ss >/dev/null; then
  for base in 26817 27017 27217 27417 27617; do
    if [ -z "$(ss -Hltn "sport >= :$base and sport <= :$((base + 182))" 2>/dev/null)" ]; then
      export ZS_SLURM_PORT=$base
      break
    fi
  done
fi
t0=$(now_ms)
bash "$root/tests/slurm/cluster.sh" "$tmp/cluster" up || {
  echo "tests/slurm/run.sh: the test cluster did not start; its logs:" >&2
  tail -n 20 "$tmp"/cluster/log/* >&2 || true
  exit 1
}
cluster_up=1
echo "tests/slurm/run.sh: cluster up in $(($(now_ms) - t0)) ms: $(sinfo -h -o '%D nodes %t')," \
  "slurmctld on port ${ZS_SLURM_PORT:-26817}"

sbatch_script=$root/deploy/slurm/zshard.sbatch
worker_script=$root/deploy/slurm/zshard-worker.sbatch
data=$DATA/tiny.txt

none_running() { [ -z "$(leftovers)" ]; }

# poll SECONDS CMD...: runs CMD every 200 ms until it succeeds; 1 if SECONDS pass first.  For
# the checks that start programs (zshard status), which at lib.sh's 20 ms would take a core.
poll() {
  local end=$(($(now_ms) + $1 * 1000))
  shift
  until "$@"; do
    [ "$(now_ms)" -lt $end ] || return 1
    sleep 0.2
  done
}

# no_leftovers NAME: a check that within 10 s no process of the jobs is left.
no_leftovers() {
  checks=$((checks + 1))
  if ! wait_until 10 none_running; then
    fail "$1: processes left after the job ended: $(pgrep -a -f -- "zshard .*$tmp")"
  fi
}

# submit NAME SBATCH_ARGS...: sbatch --parsable, output in $tmp/NAME.out; sets JOB (empty, and
# a failed check, if sbatch refused).
submit() {
  local name=$1
  shift
  JOB=$(sbatch --parsable -o "$tmp/$name.out" "$@" 2>"$tmp/$name.sub") || JOB=
  JOB=${JOB%%;*}
  [ -n "$JOB" ] || fail "$name: sbatch refused: $(cat "$tmp/$name.sub")"
}

# job_wait ID SECONDS [RESTARTS]: polls every 200 ms until every component of job ID has ended
# after at least RESTARTS requeues (default 0); sets RC to its batch script's exit status
# (128 + the signal if a signal ended it).  1 (RC=124) if that did not happen in SECONDS.
# Not `sbatch --wait`: it polls at growing intervals (up to ~30 s late here).
job_wait() {
  local id=$1 end=$(($(now_ms) + $2 * 1000)) min=${3:-0} info code
  RC=124
  while :; do
    info=$(scontrol show job -o "$id" 2>/dev/null | head -n 1) || info=
    if [ -n "$info" ] && job_gone "$id" &&
      [ "$(sed -nE 's/.* Restarts=([0-9]+) .*/\1/p' <<<"$info")" -ge "$min" ]; then
      code=$(sed -nE 's/.* ExitCode=([0-9]+:[0-9]+) .*/\1/p' <<<"$info")
      RC=${code%:*}
      [ "${code#*:}" = 0 ] || RC=$((128 + ${code#*:}))
      return 0
    fi
    [ "$(now_ms)" -lt $end ] || return 1
    sleep 0.2
  done
}

# job_gone ID: every component of the job has ended (or its record is gone).
job_gone() {
  ! scontrol show job -o "$1" 2>/dev/null |
    grep -qE 'JobState=(PENDING|CONFIGURING|RUNNING|COMPLETING|SUSPENDED|REQUEUE|RESIZING)'
}

# last_step DIR: the step of DIR/metrics.jsonl's last line (0 if none).
last_step() {
  local l
  l=$(tail -n 1 "$1/metrics.jsonl" 2>/dev/null) || l=
  l=${l#\{\"step\": }
  echo "${l%%,*}" | grep -E '^[0-9]+$' || echo 0
}

# worker_id LOG: the worker number the coordinator gave the worker logging to LOG.
worker_id() { sed -nE 's/.* INFO worker ([0-9]+): data .*/\1/p' "$1" 2>/dev/null | head -n 1; }

# joined LOG: the worker logging to LOG has joined (it names its worker number).
joined() { [ -n "$(worker_id "$1")" ]; }

# has_chunks EP SECRET ID: member ID has done at least one chunk.
has_chunks() { [ "$(chunks_done "$@")" -gt 0 ]; }

# chunks_done EP SECRET ID: chunks the coordinator at EP counts for member ID so far.
chunks_done() {
  "$zshard" status --coord "$1" --secret "$2" --json 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(next((m.get("chunks_done", 0) for m in j["members"] if m["id"] == int(sys.argv[1])), 0))
' "$3" 2>/dev/null || echo 0
}

# ---- (a) sbatch --wait gives zshard train's bits ----
"$zshard" train --config "$DATA/tiny.json" --data "$data" --steps 4 --threads 1 \
  --out "$tmp/train4" 2>"$tmp/train4.err" || fail "zshard train: $(tail -n 3 "$tmp/train4.err")"
for shape in default:1 ntasks-per-node=2:2; do
  opt=${shape%:*} n=${shape#*:} out=$tmp/a-$n
  sbatch_opts=(--wait -o "$tmp/a-$n.out")
  [ "$opt" = default ] || sbatch_opts+=("--$opt")
  t0=$(now_ms)
  rc=0
  dev=()
  [ "$n" = 1 ] || dev=(--device cpu --log-level info) # the workers say where they compute
  (cd "$tmp" && timeout -k 10 120 sbatch "${sbatch_opts[@]}" "$sbatch_script" \
    --config "$DATA/tiny.json" --data "$data" --steps 4 --out "$out" "${dev[@]}") >/dev/null || rc=$?
  echo "(a) sbatch ${sbatch_opts[*]:3} zshard.sbatch --steps 4 ($n servers, $n workers):" \
    "exit $rc in $(($(now_ms) - t0)) ms"
  checks=$((checks + 1))
  [ $rc -eq 0 ] || { fail "(a) $opt: sbatch --wait exit $rc: $(tail -n 20 "$tmp/a-$n.out")"; continue; }
  same_bits "(a) $opt" "$out" "$tmp/train4"
  if [ "$n" = 2 ]; then
    checks=$((checks + 1))
    grep -qs "compute on cpu" "$out"/logs/slurm-*/worker-0.log ||
      fail "(a) $opt: --device cpu did not reach the workers: $(cat "$out"/logs/slurm-*/worker-0.log 2>&1 | tail -n 3)"
  fi
  expect_log "(a) $opt" "$tmp/a-$n.out" "coordinator on tcp://127\\.0\\.0\\.1:[0-9]+ .*; $n servers, $n workers"
  checks=$((checks + 2))
  [ "$(stat -c %a "$out/secret" 2>/dev/null)" = 600 ] || fail "(a) $opt: no $out/secret of mode 0600"
  [ ! -e "$out/coord.endpoint" ] || fail "(a) $opt: $out/coord.endpoint is still there after the job"
  no_leftovers "(a) $opt"
done

# ---- (a') a bad configuration: the job fails, naming the key, and leaves nothing ----
sed 's/"gradient_clipping"/"gradient_clippin": 1, "gradient_clipping"/' "$DATA/tiny.json" \
  >"$tmp/bad.json"
rc=0
timeout -k 10 120 sbatch --wait -o "$tmp/bad.out" "$sbatch_script" --config "$tmp/bad.json" \
  --data "$data" --steps 4 --out "$tmp/bad" >/dev/null || rc=$?
echo "(a') a configuration with an unknown key: exit $rc"
checks=$((checks + 1))
[ $rc -ne 0 ] || fail "(a') a job with an unknown configuration key exited 0"
expect_log "(a')" "$tmp/bad.out" 'the coordinator did not start'
expect_log "(a')" "$tmp/bad.out" 'unknown key "gradient_clippin"'
no_leftovers "(a')"

# ---- (b), (c): worker jobs attach to a running elastic job; one is cancelled ----
STEPS=3000
# 4 chunks a step (micro-batches of 2), so that each of 3 workers has work in every step.
sed -e 's/"gradient_clipping"/"elasticity": {"enabled": true}, "checkpoint": {"interval_steps": 500}, "gradient_clipping"/' \
  -e 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 2/' \
  "$DATA/tiny.json" >"$tmp/elastic.json"
"$zshard" train --config "$tmp/elastic.json" --data "$data" --steps $STEPS --threads 1 \
  --out "$tmp/train" 2>"$tmp/train.err" || fail "zshard train: $(tail -n 3 "$tmp/train.err")"
out=$tmp/b
t0=$(now_ms)
submit b "$sbatch_script" --config "$tmp/elastic.json" --data "$data" --steps $STEPS --out "$out"
main=$JOB
# Both worker jobs wait for DIR/coord.endpoint, so they may be submitted at once.
submit wa "$worker_script" --out "$out" --wait 60
wa=$JOB
submit wb "$worker_script" --out "$out" --wait 60
wb=$JOB
echo "(b) main job $main, worker jobs $wa (cancelled once it computed chunks) and $wb"
checks=$((checks + 1))
wait_until 30 test -s "$out/coord.endpoint" || fail "(b) no $out/coord.endpoint after 30 s"
ep=$(head -n 1 "$out/coord.endpoint" 2>/dev/null) || ep=
secret=$out/secret
# (c) each worker job's worker registered and computed chunks.
for j in "$wa" "$wb"; do
  log=$out/logs/slurm-$j/worker-0.log
  checks=$((checks + 1))
  if ! wait_until 30 joined "$log"; then
    fail "(c) worker job $j: its worker did not join in 30 s: $(tail -n 5 "$log" 2>&1)"
    continue
  fi
  id=$(worker_id "$log")
  checks=$((checks + 1))
  poll 30 has_chunks "$ep" "$secret" "$id" ||
    fail "(c) worker job $j (worker $id): no chunk done after 30 s"
done
at=$(last_step "$out")
scancel "$wa"
checks=$((checks + 1))
wait_until 30 job_gone "$wa" || fail "(b) worker job $wa still in squeue 30 s after scancel"
gone_at=$(last_step "$out")
echo "(b) worker job $wa cancelled at step $at; gone by step $gone_at of $STEPS"
checks=$((checks + 1))
[ "$gone_at" -lt $STEPS ] ||
  fail "(b) the run ended (step $gone_at) before the cancelled worker job was gone: make STEPS larger"
job_wait "$main" 240 || fail "(b) main job $main still running after 240 s"
rc=$RC
echo "(b) main job $main: exit $rc, $STEPS steps in $(($(now_ms) - t0)) ms"
checks=$((checks + 1))
[ $rc -eq 0 ] || fail "(b) main job exit $rc: $(tail -n 20 "$tmp/b.out")"
same_bits "(b)" "$out" "$tmp/train"
job_wait "$wb" 30 || fail "(c) worker job $wb still running 30 s after the main job ended"
rc=$RC
checks=$((checks + 1))
[ $rc -eq 0 ] || fail "(c) worker job $wb, which stayed to the end: exit $rc: $(tail -n 5 "$tmp/wb.out")"
checks=$((checks + 1))
grep -qE '"workers": 3[,}]' "$out/metrics.jsonl" ||
  fail "(c) no step had 3 workers (the job's own and both worker jobs')"
no_leftovers "(b)"

# resumed_to_the_end NAME JOB OUT T0 HOW: JOB, restarted once (HOW: how it came back, for
# messages), ends with exit 0, says it resumed from OUT's checkpoints, and its second run's
# coordinator resumed from a step directory (the bits alone would not tell a resume from a
# fresh start); the model is zshard train's and nothing is left running.
resumed_to_the_end() {
  local name=$1 job=$2 dir=$3 t0=$4 how=$5
  job_wait "$job" 240 1 || fail "$name job $job not ended after a restart within 240 s"
  local rc=$RC
  echo "$name job $job after $how: exit $rc; in all $(($(now_ms) - t0)) ms"
  checks=$((checks + 1))
  [ $rc -eq 0 ] || fail "$name exit $rc: $(tail -n 20 "$tmp/${name//[()]/}.out")"
  expect_log "$name" "$tmp/${name//[()]/}.out" "restart 1 of job $job: resuming from $dir/checkpoints"
  expect_log "$name" "$dir/logs/slurm-$job.1/coord.log" "coord: resuming run [0-9a-f]+ from .*step-0*[1-9][0-9]* \\(step [1-9][0-9]* of $STEPS\\)"
  same_bits "$name" "$dir" "$tmp/train"
}

# ---- (d) requeued after a checkpoint (scontrol requeue): resumes, same bits ----
out=$tmp/d
t0=$(now_ms)
submit d "$sbatch_script" --config "$tmp/elastic.json" --data "$data" --steps $STEPS \
  --out "$out" --log-level warn
d=$JOB
checks=$((checks + 1))
wait_until 60 test -s "$out/checkpoints/latest" || fail "(d) no checkpoint after 60 s"
scontrol requeue "$d"
requeued_at=$(last_step "$out")
echo "(d) job $d requeued at step $requeued_at, checkpoint $(cat "$out/checkpoints/latest" 2>&1)"
checks=$((checks + 1))
[ "$requeued_at" -lt $STEPS ] || fail "(d) the run had ended (step $requeued_at) before the requeue"
resumed_to_the_end "(d)" "$d" "$out" "$t0" "its requeue"
expect_log "(d)" "$tmp/d.out" "CANCELLED AT .* DUE TO JOB REQUEUE"
# --log-level warn reaches servers and workers; the coordinator still logs at info (the
# script reads its endpoint there).
checks=$((checks + 2))
! grep -q ' INFO ' "$out/logs/slurm-$d/server-0.log" "$out/logs/slurm-$d/worker-0.log" ||
  fail "(d) --log-level warn: INFO lines in the server's or worker's log"
grep -q ' INFO coord: listening on' "$out/logs/slurm-$d.1/coord.log" ||
  fail "(d) the restarted run's coordinator log lacks its endpoint: $(tail -n 5 "$out/logs/slurm-$d.1/coord.log")"
no_leftovers "(d)"
# ---- (e) the coordinator killed after a checkpoint: --requeue-on-failure requeues the job ----
out=$tmp/e
t0=$(now_ms)
submit e "$sbatch_script" --config "$tmp/elastic.json" --data "$data" --steps $STEPS \
  --out "$out" --requeue-on-failure 1
e=$JOB
checks=$((checks + 1))
wait_until 60 test -s "$out/checkpoints/latest" || fail "(e) no checkpoint after 60 s"
# The coordinator's pid, from its log's first line ("... zshard[PID] INFO coord: listening").
coord_pid=$(sed -nE '1s/.* zshard\[([0-9]+)\] .*/\1/p' "$out/logs/slurm-$e/coord.log")
checks=$((checks + 1))
if [ -n "$coord_pid" ] && kill -KILL "$coord_pid"; then
  echo "(e) job $e: coordinator (pid $coord_pid) killed at step $(last_step "$out")"
else
  fail "(e) no coordinator pid in $out/logs/slurm-$e/coord.log"
fi
resumed_to_the_end "(e)" "$e" "$out" "$t0" "requeueing itself"
expect_log "(e)" "$tmp/e.out" "the run failed \(exit [0-9]+\); requeueing job $e \(restart 1 of at most 1\)"
no_leftovers "(e)"
finish
