# The systemd units of deploy/systemd, checked three ways:
#  1. `systemd-analyze verify` accepts each (the templates as instance 0), saying nothing: it
#     exits 0 even for unknown keys and bad values, which it only prints, so any output fails.
#     A copy with a misspelt key must make it print (the check can fail).
#  2. Every option each ExecStart= passes exists in that command's --help.
#  3. The units' own command lines, with their ${VAR}s filled from the example environment
#     files (paths and the coordinator's endpoint changed to this test's) and the secret
#     handed over as systemd's LoadCredential= does ($ZSHARD_SECRET_FILE in a credentials
#     directory), run a job: a coordinator, 2 servers (zshard-server@0, @1) and a worker.  The
#     coordinator is killed after a checkpoint, as a crash would, and everything is started
#     again with the same lines (Restart=on-failure); the result is zshard train's, bitwise.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
UNITS=$ROOT/deploy/systemd
STEPS=24
trap kill_started EXIT

if ! command -v systemd-analyze >/dev/null; then
  echo "systemd_units: SKIP: systemd-analyze is not installed (Debian's systemd package)"
  exit 77
fi

# ---- 1. systemd-analyze verify ---------------------------------------------------------------
mkdir -p "$WORK/units"
for f in "$UNITS"/*.service; do
  name=$(basename "$f")
  name=${name/@./@0.} # a template is verified as its instance 0
  # verify checks that ExecStart's program exists: this build's zshard stands in for the
  # installed one.
  sed "s#/usr/local/bin/zshard#$ZSHARD#g" "$f" >"$WORK/units/$name"
done
verify() { (cd "$WORK/units" && systemd-analyze verify --man=no "$@" 2>&1); }
units=$(cd "$WORK/units" && ls -- *.service)
[ "$(echo "$units" | wc -l)" -ge 3 ] || fail "expected 3 units in deploy/systemd, found: $units"
for u in $units; do
  checks=$((checks + 1))
  out=$(verify "./$u") || fail "systemd-analyze verify $u: exit $?: $out"
  [ -z "$out" ] || fail "systemd-analyze verify $u says: $out"
done
sed 's/^Restart=/Restrat=/' "$WORK/units/zshard-coord.service" >"$WORK/units/misspelt.service"
checks=$((checks + 1))
out=$(verify ./misspelt.service) || true
grep -q "Restrat" <<<"$out" ||
  fail "systemd-analyze verify did not report a misspelt key; this check cannot fail: '$out'"
rm "$WORK/units/misspelt.service"

# ---- 2. the options of each ExecStart ---------------------------------------------------------
# exec_line UNIT: its ExecStart= value.
exec_line() { sed -n 's/^ExecStart=//p' "$UNITS/$1"; }
for u in zshard-coord.service zshard-server@.service zshard-worker@.service; do
  line=$(exec_line "$u")
  read -r -a words <<<"$line"
  checks=$((checks + 1))
  [ "${words[0]}" = /usr/local/bin/zshard ] || fail "$u: ExecStart runs ${words[0]}"
  options_in_help "$u" "${words[1]}" "${words[@]:2}"
done

# ---- 3. the units' command lines run a job ------------------------------------------------------
sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 1000, "coordinator_timeout_ms": 2000}, "checkpoint": {"interval_steps": 2}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q coordinator_timeout_ms "$WORK/job.json" || {
  fail "the config edit did not take"
  finish
}
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"

# The credentials directory systemd makes for LoadCredential=secret:/etc/zshard/secret.
mkdir -p "$WORK/credentials"
cp "$WORK/secret" "$WORK/credentials/secret"
chmod 0400 "$WORK/credentials/secret"

# The example environment files, as an operator edits them: this test's paths, loopback, a
# coordinator port of its own choosing, one AdamW and one kernel thread.
OUT=$WORK/out
{
  grep -v '^#' "$UNITS/job.env.example" | grep -v '^$' |
    sed -e "s#^ZSHARD_COORD_LISTEN=.*#ZSHARD_COORD_LISTEN=tcp://127.0.0.1:*#" \
      -e "s#^ZSHARD_CONFIG=.*#ZSHARD_CONFIG=$WORK/job.json#" \
      -e "s#^ZSHARD_DATA=.*#ZSHARD_DATA=$DATA/tiny.txt#" \
      -e "s#^ZSHARD_STEPS=.*#ZSHARD_STEPS=$STEPS#" \
      -e "s#^ZSHARD_OUT=.*#ZSHARD_OUT=$OUT#" \
      -e "s#^ZSHARD_CHECKPOINTS=.*#ZSHARD_CHECKPOINTS=$OUT/checkpoints#" \
      -e "s#^ZSHARD_COORD_METRICS=.*#ZSHARD_COORD_METRICS=127.0.0.1:0#"
} >"$WORK/job.env"
sed -e 's#^ZSHARD_LISTEN=.*#ZSHARD_LISTEN=127.0.0.1:0#' -e 's#^ZSHARD_THREADS=.*#ZSHARD_THREADS=1#' \
  -e 's#^ZSHARD_METRICS=.*#ZSHARD_METRICS=127.0.0.1:0#' \
  -e 's#^ZSHARD_TRANSPORT=.*#ZSHARD_TRANSPORT=tcp#' "$UNITS/server.env.example" >"$WORK/server.env"
sed -e 's#^ZSHARD_WORKER_THREADS=.*#ZSHARD_WORKER_THREADS=1#' \
  -e 's#^ZSHARD_WORKER_METRICS=.*#ZSHARD_WORKER_METRICS=127.0.0.1:0#' "$UNITS/worker.env.example" \
  >"$WORK/worker.env"
for k in ZSHARD_COORD ZSHARD_COORD_LISTEN ZSHARD_CONFIG ZSHARD_DATA ZSHARD_SERVERS ZSHARD_STEPS \
  ZSHARD_OUT ZSHARD_CHECKPOINTS ZSHARD_COORD_METRICS; do
  checks=$((checks + 1))
  grep -q "^$k=" "$WORK/job.env" || fail "job.env.example lacks $k"
done
checks=$((checks + 1))
grep -q '^ZSHARD_SERVERS=2$' "$WORK/job.env" || fail "job.env.example: expected ZSHARD_SERVERS=2"

# unit_bg UNIT NAME ENV...: runs UNIT's ExecStart in the background as systemd would: the
# variables from the environment files ENV... (later ones win, as with several
# EnvironmentFile= lines), each ${VAR} replaced by its value as one word, ZSHARD_SECRET_FILE
# from Environment=%d/secret; stderr in $WORK/NAME.log, the pid in UPID and PIDS.
unit_bg() {
  local unit=$1 name=$2 line w var
  shift 2
  line=$(exec_line "$unit")
  local -a args=()
  read -r -a words <<<"$line"
  for w in "${words[@]}"; do
    while [[ $w =~ \$\{([A-Z_]+)\} ]]; do
      var=${BASH_REMATCH[1]}
      local val
      val=$(cat "$@" | sed -n "s/^$var=//p" | tail -n 1)
      [ -n "$val" ] || fail "$unit: \${$var} is in no environment file"
      w=${w/"\${$var}"/$val}
    done
    args+=("$w")
  done
  args[0]=$ZSHARD
  ZSHARD_SECRET_FILE=$WORK/credentials/secret "${args[@]}" 2>"$WORK/$name.log" &
  UPID=$!
  PIDS+=("$UPID")
}

# start_all ROUND: the coordinator unit, then (its endpoint known) 2 servers and a worker.
MEMBERS=()
start_all() {
  unit_bg zshard-coord.service "coord-$1" "$WORK/job.env"
  COORD_PID=$UPID
  wait_endpoint "$WORK/coord-$1.log" 20 "$COORD_PID" || {
    fail "coord-$1: never said where it listens: $(tail -n 3 "$WORK/coord-$1.log")"
    finish
  }
  # What the operator writes into job.env once the coordinator's address is known.
  sed -i "s#^ZSHARD_COORD=.*#ZSHARD_COORD=$EP#" "$WORK/job.env"
  MEMBERS=()
  for i in 0 1; do
    unit_bg zshard-server@.service "server$i-$1" "$WORK/job.env" "$WORK/server.env"
    MEMBERS+=("$UPID")
  done
  unit_bg zshard-worker@.service "worker0-$1" "$WORK/job.env" "$WORK/worker.env"
  MEMBERS+=("$UPID")
}

start_all 1
checks=$((checks + 2))
grep -qF 'holds no checkpoint yet: a fresh start' "$WORK/coord-1.log" ||
  fail "coord-1: --resume-if-any on no checkpoints did not start fresh: $(tail -n 3 "$WORK/coord-1.log")"
wait_until 60 ckpt_at_least "$OUT/checkpoints" 4 || fail "no checkpoint of step 4 came"
kill -KILL "$COORD_PID"
reap "$COORD_PID"
# The members find their coordinator gone and exit non-zero: Restart=on-failure restarts them.
for p in "${MEMBERS[@]}"; do
  checks=$((checks + 1))
  wait_until 20 gone "$p" || fail "member $p still runs 20 s after its coordinator died"
  reap "$p"
  [ "$RC" -ne 0 ] || fail "member $p exited 0 after its coordinator died: Restart=on-failure would not restart it"
done

# Each serves its Prometheus metrics where the environment file says (docs/observability.md).
for log in coord-1 server0-1 server1-1 worker0-1; do
  checks=$((checks + 1))
  url=$(sed -nE 's#.*metrics: (http://127\.0\.0\.1:[0-9]+/metrics).*#\1#p' "$WORK/$log.log" | head -n 1)
  [ -n "$url" ] || fail "$log: no 'metrics: http://...' line: $(tail -n 3 "$WORK/$log.log")"
done
start_all 2
checks=$((checks + 1))
grep -q "resuming run" "$WORK/coord-2.log" ||
  fail "coord-2: did not resume from the checkpoint: $(tail -n 3 "$WORK/coord-2.log")"
checks=$((checks + 1))
wait_until 120 gone "$COORD_PID" || fail "the restarted job did not end in 120 s"
reap "$COORD_PID"
[ "$RC" -eq 0 ] || fail "coord-2: exit $RC: $(tail -n 5 "$WORK/coord-2.log")"
for p in "${MEMBERS[@]}"; do
  checks=$((checks + 1))
  wait_until 20 gone "$p" || fail "member $p still runs after the job ended"
  reap "$p"
  [ "$RC" -eq 0 ] || fail "member $p exited $RC at the end of the job: Restart=on-failure would restart it"
done
checks=$((checks + 1))
cmp "$WORK/train/model.safetensors" "$OUT/model.safetensors" ||
  fail "the units' job gave a model other than zshard train's"
none_started_left
finish
