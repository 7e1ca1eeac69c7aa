# A network partition in the emulated multi-host setup (tests/multihost/netns.sh: a namespace
# per role, 2 servers and 2 workers on 1 Gbit/s links).  Mid-run, one member's link is cut (its
# bridge port down: every frame lost, its TCP connections stay open) for longer than
# cluster.heartbeat_timeout_ms (1 s here), then healed.  What docs/architecture.md promises,
# asserted:
# 1. A worker's link ("Death and hangs"):
#   - the coordinator declares that worker dead for want of heartbeats ("worker N left: no
#     heartbeat ..."), no sooner than the timeout after the cut, and the job goes on with the
#     other worker (steps with 1 worker in metrics.jsonl);
#   - the cut worker, still running when the link comes back, learns it was dropped (Shutdown
#     ABORT: "worker N was dropped from the job (...)") and exits while the job runs;
#   - the job ends (exit 0) with zshard train's bits, model and metrics; no process is left.
# 2. A server's link ("Losing a server"; no replicas, checkpoints every 3 steps):
#   - the coordinator declares the server gone, every server goes back to the newest
#     checkpoint and the job recovers on the one server left ("recovered: 1 servers");
#   - the cut server, still running when its link comes back, is told it was dropped and
#     exits;
#   - the job ends with zshard train's bits, each step once in metrics.jsonl.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../multihost/netns.sh"
why=$(mh_can 2>&1) || { echo "multihost_partition: skipped: $why"; exit 77; }
trap 'mh_kill_all; mh_down' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
STEPS=60
TIMEOUT_MS=1000

# Steps of some tens of ms (4 x 96, 2 chunks of 4 x 128 tokens), so that the job still runs
# well after the link is healed; heartbeats every 100 ms; a checkpoint every 3 steps.
sed -e 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": '$TIMEOUT_MS', "coordinator_timeout_ms": 10000}, "checkpoint": {"interval_steps": 3}/' \
  -e 's/"model": {[^}]*}/"model": {"n_layer": 4, "n_head": 4, "n_embd": 96, "vocab_size": 256, "block_size": 128}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q '"heartbeat_timeout_ms": 1000' "$WORK/job.json" && grep -q '"n_embd": 96' "$WORK/job.json" &&
  grep -q '"interval_steps": 3' "$WORK/job.json" ||
  { fail "the config edit did not take: $(cat "$WORK/job.json")"; finish; }
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"

mh_up 2 2 1gbit 2>"$WORK/up.err" || { fail "mh_up: $(cat "$WORK/up.err")"; finish; }
OUT=$WORK/out
LOGS=$WORK/logs
mh_job_start "$ZSHARD" "$WORK/job.json" "$DATA/tiny.txt" $STEPS "$OUT" "$LOGS" 2 2 ||
  { fail "the job did not start"; finish; }
COORD=$MH_COORD
W2=${MH_PIDS[4]} # coordinator, s1, s2, w1, w2

# Cut once step 3 is in metrics.jsonl.
checks=$((checks + 1))
wait_until 60 has_line "$OUT/metrics.jsonl" '^\{"step": 3,' ||
  { fail "step 3 did not come: $(tail -n 5 "$LOGS/coord.log")"; finish; }
label=$(sed -nE 's/.* INFO worker ([0-9]+): data .*/\1/p' "$LOGS/w2.log" | head -n 1)
[ -n "$label" ] || { fail "w2's worker does not say its id: $(cat "$LOGS/w2.log")"; finish; }
mh_cut w2
cut_ms=$(now_ms)
echo "multihost_partition: cut worker $label's link (w2) after step 3"

checks=$((checks + 1))
if wait_until 20 has_line "$LOGS/coord.log" "coord: worker $label left: .*no heartbeat"; then
  dead_ms=$(now_ms)
  echo "multihost_partition: worker $label declared dead $((dead_ms - cut_ms)) ms after the cut"
  # Its last heartbeat left at most one interval before the cut.
  checks=$((checks + 1))
  [ $((dead_ms - cut_ms)) -ge $((TIMEOUT_MS - 100)) ] ||
    fail "worker $label was declared dead $((dead_ms - cut_ms)) ms after the cut, before the timeout"
else
  fail "the coordinator did not declare worker $label dead: $(grep -E 'WARN|ERROR' "$LOGS/coord.log" | tail -n 5)"
fi
checks=$((checks + 1))
alive "$W2" || fail "worker $label exited while its link was cut: $(tail -n 3 "$LOGS/w2.log")"
mh_heal w2

checks=$((checks + 1))
wait_until 30 gone "$W2" || fail "worker $label still runs 30 s after its link came back"
checks=$((checks + 1))
alive "$COORD" || fail "the job had ended before worker $label exited: the test's steps are too short"
expect_log w2 "$LOGS/w2.log" "worker $label was dropped from the job \\(no heartbeat"

mh_job_wait 120 || fail "processes of the job had to be killed: $(tail -n 3 "$LOGS/coord.log")"
checks=$((checks + 1))
[ "$MH_RC" = 0 ] || fail "the coordinator exited $MH_RC: $(tail -n 5 "$LOGS/coord.log")"
[ -f "$OUT/model.safetensors" ] && same_bits partition "$OUT" "$WORK/train"
checks=$((checks + 1))
grep -q '"workers": 1' <(sed -n '4,$p' "$OUT/metrics.jsonl") ||
  fail "no step after the cut ran with 1 worker: $(cat "$OUT/metrics.jsonl")"
checks=$((checks + 1))
[ "$(step_list "$OUT/metrics.jsonl")" = "$(step_list "$WORK/train/metrics.jsonl")" ] ||
  fail "steps in metrics.jsonl: $(step_list "$OUT/metrics.jsonl")"
mh_kill_all
mh_down

# ---- 2. a server's link ----
mh_up 2 2 1gbit 2>"$WORK/up2.err" || { fail "mh_up: $(cat "$WORK/up2.err")"; finish; }
OUT=$WORK/out2
LOGS=$WORK/logs2
MH_PIDS=()
mh_job_start "$ZSHARD" "$WORK/job.json" "$DATA/tiny.txt" $STEPS "$OUT" "$LOGS" 2 2 ||
  { fail "the second job did not start"; finish; }
COORD=$MH_COORD
S2=${MH_PIDS[2]} # coordinator, s1, s2, w1, w2

# Cut once step 4 is in metrics.jsonl (checkpoint 3 is committed by then: a step's line waits
# for its checkpoint's outcome).
checks=$((checks + 1))
wait_until 60 has_line "$OUT/metrics.jsonl" '^\{"step": 4,' ||
  { fail "step 4 did not come: $(tail -n 5 "$LOGS/coord.log")"; finish; }
label=$(sed -nE 's/.* INFO server: registered as ([0-9]+)$/\1/p' "$LOGS/s2.log" | head -n 1)
[ -n "$label" ] || { fail "s2's server does not say its id: $(cat "$LOGS/s2.log")"; finish; }
mh_cut s2
cut_ms=$(now_ms)
echo "multihost_partition: cut server $label's link (s2) after step 4"

checks=$((checks + 1))
if wait_until 20 has_line "$LOGS/coord.log" "coord: server $label is gone \(.*no heartbeat"; then
  dead_ms=$(now_ms)
  echo "multihost_partition: server $label declared gone $((dead_ms - cut_ms)) ms after the cut"
  checks=$((checks + 1))
  [ $((dead_ms - cut_ms)) -ge $((TIMEOUT_MS - 100)) ] ||
    fail "server $label was declared gone $((dead_ms - cut_ms)) ms after the cut, before the timeout"
else
  fail "the coordinator did not declare server $label gone: $(grep -E 'WARN|ERROR' "$LOGS/coord.log" | tail -n 5)"
fi
expect_log server "$LOGS/coord.log" "coord: server $label is gone .*: every server goes back to checkpoint [0-9]+"
checks=$((checks + 1))
wait_until 30 has_line "$LOGS/coord.log" "coord: recovered: 1 servers" ||
  fail "the job did not recover on the server left: $(grep -E 'WARN|ERROR' "$LOGS/coord.log" | tail -n 5)"
checks=$((checks + 1))
alive "$S2" || fail "server $label exited while its link was cut: $(tail -n 3 "$LOGS/s2.log")"
mh_heal s2

checks=$((checks + 1))
wait_until 30 gone "$S2" || fail "server $label still runs 30 s after its link came back"
checks=$((checks + 1))
alive "$COORD" || fail "the job had ended before server $label exited: the test's steps are too short"
expect_log s2 "$LOGS/s2.log" "server $label was dropped from the job"

mh_job_wait 120 || fail "processes of the second job had to be killed: $(tail -n 3 "$LOGS/coord.log")"
checks=$((checks + 1))
[ "$MH_RC" = 0 ] || fail "the second coordinator exited $MH_RC: $(tail -n 5 "$LOGS/coord.log")"
[ -f "$OUT/model.safetensors" ] && same_bits server-partition "$OUT" "$WORK/train"
checks=$((checks + 1))
[ "$(step_list "$OUT/metrics.jsonl")" = "$(step_list "$WORK/train/metrics.jsonl")" ] ||
  fail "server partition: steps in metrics.jsonl: $(step_list "$OUT/metrics.jsonl")"
finish
