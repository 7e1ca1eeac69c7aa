# A partition server with nothing to do sleeps: its loop waits on the data plane's descriptor,
# the control socket and its threads' eventfd together (transport.h's wait_fd) instead of
# polling the data plane every few milliseconds.
#  - a server registered with a coordinator, its shards ready, waiting for a worker: its main
#    thread blocks (voluntary context switches in /proc) fewer than 80 times in 2 s.  Its loop
#    wakes at least every 50 ms for its timers (heartbeats, deadlines): some 40 times in 2 s.
#    The loop that polled the data plane every 2 ms did about 900.
#  - then a worker joins and the job runs to its end with zshard train's bits: the server's
#    and the worker's loops that sleep still see every message.
source "$(dirname "$0")/lib.sh"
trap kill_started EXIT
STEPS=6
sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 1000, "heartbeat_timeout_ms": 10000}, "checkpoint": {"interval_steps": 3}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
grep -q interval_steps "$WORK/job.json" || { fail "the config edit did not take"; finish; }
expect_ok "$ZSHARD" train --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/train"

start_coord "$WORK/coord.log" "$WORK/job.json" $STEPS "$WORK/job"
"$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/server.log" &
SERVER=$!
PIDS+=($SERVER)
checks=$((checks + 1))
wait_until 30 has_line "$WORK/coord.log" "all 1 servers are ready" ||
  fail "the server did not get ready: $(tail -n 3 "$WORK/coord.log" "$WORK/server.log")"

# switches PID: the times PID's main thread blocked so far (its voluntary context switches;
# the involuntary ones count preemption, which depends on the machine's load).
switches() {
  awk '/^voluntary_ctxt_switches/ { print $2 }' "/proc/$1/task/$1/status"
}
before=$(switches $SERVER)
sleep 2 # the window measured, not a wait for anything
after=$(switches $SERVER)
woken=$((after - before))
echo "idle_wakeups: the idle server's main thread was woken $woken times in 2 s"
checks=$((checks + 1))
[ "$woken" -lt 80 ] || fail "the idle server's main thread was woken $woken times in 2 s (fewer than 80 expected)"

"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/worker.log" &
PIDS+=($!)
checks=$((checks + 1))
wait_until 60 gone "$COORD" || fail "the job did not end: $(tail -n 3 "$WORK/coord.log")"
reap "$COORD"
checks=$((checks + 1))
[ "$RC" = 0 ] || fail "the coordinator exited $RC: $(tail -n 5 "$WORK/coord.log")"
same_bits job "$WORK/job" "$WORK/train"
finish
