# elasticity.max_workers: a worker beyond it is told why and exits non-zero, and the job goes
# on with the others; elasticity.min_workers: no step begins until that many workers are live,
# then the job runs to its end.
source "$(dirname "$0")/lib.sh"

trap kill_started EXIT # kills PIDS

# start_coord NAME CONFIG STEPS: a coordinator and one server; sets EP and COORD.
start_coord() {
  "$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$2" --servers 1 --data "$DATA/tiny.txt" \
    --steps "$3" --out "$WORK/$1" 2>"$WORK/$1.coord.log" &
  COORD=$!
  PIDS+=($COORD)
  wait_endpoint "$WORK/$1.coord.log" 15 || true
  "$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/$1.server.log" &
  PIDS+=($!)
}

# With max_workers 1 the second worker is refused.
sed 's/"cluster"/"elasticity": {"enabled": true, "max_workers": 1}, "cluster"/' "$DATA/tiny.json" \
  > "$WORK/max.json"
start_coord max "$WORK/max.json" 100000
"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/w1.log" &
W1=$!
PIDS+=($W1)
checks=$((checks + 1))
wait_until 15 has_line "$WORK/max.coord.log" "worker [0-9]+ joined" ||
  fail "the first worker did not join within 15 s: $(tail -n 3 "$WORK/max.coord.log")"
checks=$((checks + 1))
rc=0
timeout 30 "$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/w2.log" || rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
  fail "the worker over max_workers exited $rc: $(cat "$WORK/w2.log")"
elif ! grep -q "elasticity.max_workers is 1" "$WORK/w2.log"; then
  fail "the refused worker does not say why: $(cat "$WORK/w2.log")"
fi
# The job goes on with the first worker: a step finishes after the refusal.
# more_lines FILE N: FILE has more than N lines.
more_lines() { [ "$(wc -l < "$1")" -gt "$2" ]; }
checks=$((checks + 1))
n0=$(wc -l < "$WORK/max/metrics.jsonl")
wait_until 30 more_lines "$WORK/max/metrics.jsonl" "$n0" || true
n1=$(wc -l < "$WORK/max/metrics.jsonl")
{ [ "$n1" -gt "$n0" ] && kill -0 "$W1" 2>/dev/null; } ||
  fail "after the refusal the job stopped ($n0 -> $n1 steps in 30 s): $(tail -n 3 "$WORK/max.coord.log")"
grep -q '"workers": 2' "$WORK/max/metrics.jsonl" && fail "a step ran with 2 workers"
kill_started
PIDS=()

# With min_workers 2 nothing happens with one worker; a second one starts the job.
sed 's/"cluster"/"elasticity": {"enabled": true, "min_workers": 2}, "cluster"/' "$DATA/tiny.json" \
  > "$WORK/min.json"
start_coord min "$WORK/min.json" 4
"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/m1.log" &
M1=$!
PIDS+=($M1)
# The coordinator has taken the worker in (it is active, one live worker) and, with it, decided
# whether a step may begin: the status says so, in one reply.
# min_waiting: the status shows worker M1 active, one live worker, and the phase.
min_waiting() {
  "$ZSHARD" status --coord "$EP" --json >"$WORK/min.status" 2>&1 &&
    has_line "$WORK/min.status" "\"live_workers\":1,.*\"role\":\"worker\",\"state\":\"active\",[^}]*\"pid\":$M1,"
}
checks=$((checks + 4))
wait_until 15 min_waiting ||
  fail "the first worker is not a live member within 15 s: $(cat "$WORK/min.status")"
[ -s "$WORK/min/metrics.jsonl" ] && fail "a step ran with 1 worker and min_workers 2: $(cat "$WORK/min/metrics.jsonl")"
grep -q '"phase":"waiting for workers"' "$WORK/min.status" ||
  fail "with 1 of 2 workers the phase is not waiting: $(cat "$WORK/min.status")"
"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/m2.log" &
PIDS+=($!)
wait "$COORD" || fail "min_workers: the coordinator failed: $(tail -n 3 "$WORK/min.coord.log")"
[ "$(wc -l < "$WORK/min/metrics.jsonl")" -eq 4 ] || fail "min_workers: expected 4 steps"
grep -qv '"workers": 2' "$WORK/min/metrics.jsonl" &&
  fail "min_workers: a step ran with other than 2 workers: $(cat "$WORK/min/metrics.jsonl")"
finish
