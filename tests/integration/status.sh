# zshard status against a running job: the phase while the job waits for workers, a worker
# that joins (active, chunks, heartbeat age), the newest checkpoint and why a later one failed,
# a worker killed with SIGKILL (gone, with the reason: its connection closed, long before the
# heartbeat timeout) and the job that goes on without it; --json and the table; no answer once
# the coordinator is gone (exit 1, named); buddy replicas (which server holds whose, current,
# before and after a failover); usage errors.
source "$(dirname "$0")/lib.sh"

# The heartbeat timeout (60 s) is far beyond any wait below: a member declared gone here was
# seen to go (its connection closed), never merely late (a worker the machine starved of CPU
# for a moment), so that the reason the test expects is the only one it can get.
sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 60000}, "elasticity": {"enabled": true}, "checkpoint": {"interval_steps": 5}/' \
  "$DATA/tiny.json" > "$WORK/cfg.json"
# Checkpoint 5 commits; a file in the way of each later step directory makes every later
# checkpoint fail, so that status reports both the newest checkpoint and a failure.  The job is
# far longer than the test (which kills it): on a fast machine 400 steps of this model ended
# before the checks below had run.
STEPS=20000
mkdir -p "$WORK/out/checkpoints"
for s in $(seq 10 5 $STEPS); do : >"$WORK/out/checkpoints/$(printf step-%08d "$s")"; done
trap kill_started EXIT # kills PIDS

"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$WORK/cfg.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps $STEPS --out "$WORK/out" 2>"$WORK/coord.log" &
COORD=$!
PIDS+=($COORD)
# The port ZeroMQ chose, from the coordinator's log.
wait_endpoint "$WORK/coord.log" 15 || true
[ -n "$EP" ] || { fail "the coordinator did not say where it listens: $(cat "$WORK/coord.log")"; finish; }
"$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/server.log" &
PIDS+=($!)

# status_until PATTERN: polls `zshard status --json` (up to 10 s) until its output matches.
status_until() {
  checks=$((checks + 1))
  for _ in $(seq 100); do
    if "$ZSHARD" status --coord "$EP" --json >"$WORK/status.json" 2>"$WORK/status.err" &&
      grep -qE -- "$1" "$WORK/status.json"; then
      return 0
    fi
    sleep 0.1
  done
  fail "status never matched '$1': $(cat "$WORK/status.json" "$WORK/status.err")"
}

status_until '"phase":"waiting for workers".*"role":"server","state":"active"'
grep -q '"live_workers":0' "$WORK/status.json" || fail "live_workers is not 0: $(cat "$WORK/status.json")"

"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/w1.log" &
W1=$!
PIDS+=($W1)
status_until "\"role\":\"worker\",\"state\":\"active\",[^}]*\"pid\":$W1,[^}]*\"chunks_done\":[1-9]"
grep -q '"live_workers":1' "$WORK/status.json" || fail "live_workers is not 1: $(cat "$WORK/status.json")"
grep -qE "\"steps\":$STEPS" "$WORK/status.json" || fail "steps is not $STEPS: $(cat "$WORK/status.json")"

# The checkpoint fields: step 5 in OUT/checkpoints, the failure of a later one with its reason.
status_until '"last_checkpoint":5,"checkpoint_dir":"[^"]*/out/checkpoints","checkpoint_error":"checkpoint [0-9]+: server [0-9]+: [^"]*/out/checkpoints/step-[0-9]{8}: exists and is not a directory"'
expect_ok "$ZSHARD" status --coord "$EP"
grep -qE '^checkpoint: step 5 in /.*/out/checkpoints \(latest\)$' "$WORK/out.txt" ||
  fail "the table lacks the checkpoint line: $(head -n 3 "$WORK/out.txt")"
grep -qE '^checkpoint failed: checkpoint [0-9]+: server [0-9]+: .*/step-[0-9]{8}: exists and is not a directory$' \
  "$WORK/out.txt" || fail "the table lacks the checkpoint failure: $(head -n 3 "$WORK/out.txt")"

# The table names the same members.
expect_ok "$ZSHARD" status --coord "$EP"
grep -qE "^ +[0-9]+ +worker +active .* $W1 " "$WORK/out.txt" ||
  fail "the table lacks worker pid $W1: $(cat "$WORK/out.txt")"
grep -qE "^step [0-9]+ of $STEPS, (computing|gradient norm|optimizer step|waiting for workers)" \
  "$WORK/out.txt" || fail "the table's first line: $(head -n 1 "$WORK/out.txt")"

# A second worker, then the first one killed: it is declared gone with the reason, and the
# job goes on with the second.  Both are active in the last status before the kill, so the
# "gone" that follows is the kill's.
"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/w2.log" &
W2=$!
PIDS+=($W2)
status_until "\"state\":\"active\",[^}]*\"pid\":$W1,.*\"state\":\"active\",[^}]*\"pid\":$W2,[^}]*\"chunks_done\":[1-9]"
kill -9 "$W1"
status_until "\"state\":\"gone\",[^}]*\"pid\":$W1,"
# Its connection closed with it: the coordinator saw that and did not wait for the timeout.
grep -qE "\"state\":\"gone\",\"host\":\"[^\"]*\",\"endpoint\":\"\",\"pid\":$W1,\"reason\":\"its connection closed and no heartbeat for [0-9]+ ms\"" \
  "$WORK/status.json" || fail "the killed worker's reason: $(cat "$WORK/status.json")"
grep -q '"live_workers":1' "$WORK/status.json" || fail "live_workers after the kill: $(cat "$WORK/status.json")"
# steps_done: the count in the last status.json.
steps_done() { sed -E 's/.*"steps_done":([0-9]+).*/\1/' "$WORK/status.json"; }
before=$(steps_done)
checks=$((checks + 1))
for _ in $(seq 100); do
  "$ZSHARD" status --coord "$EP" --json >"$WORK/status.json" 2>/dev/null || true
  [ "$(steps_done)" -gt "$before" ] 2>/dev/null && break
  sleep 0.1
done
[ "$(steps_done)" -gt "$before" ] 2>/dev/null || fail "no step finished after the kill: $(cat "$WORK/status.json")"

# Without a coordinator there is no answer: exit 1, naming the endpoint.
kill -9 "$COORD"
wait "$COORD" 2>/dev/null || true
expect_fail "no answer from $EP within 300 ms" "$ZSHARD" status --coord "$EP" --timeout-ms 300

# Buddy replicas (checkpoint.replicas 1), 3 servers: each server of the map names the server
# whose replica it holds, the replica is current, and the three form a ring; the coordinator's
# zshard_replicas_current counts 3.  A server killed: its buddy takes over, and the two left
# hold each other's replicas (2).
sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384, "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 2000}, "checkpoint": {"interval_steps": 1000, "replicas": 1}/' \
  "$DATA/tiny.json" >"$WORK/rep.json"
grep -q '"replicas": 1' "$WORK/rep.json" || { fail "the replica config edit did not take"; finish; }
setsid "$ZSHARD" launch --config "$WORK/rep.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 3 --workers 1 --threads 1 --replacements 0 --out "$WORK/rep" \
  --metrics 127.0.0.1:0 2>"$WORK/rep.err" &
LPID=$!
PGIDS+=("$LPID")
checks=$((checks + 1))
wait_until 30 has_line "$WORK/rep.err" "listening on tcp://127.0.0.1:" ||
  { fail "the replica job's coordinator did not start: $(tail -n 5 "$WORK/rep.err")"; finish; }
EP=$(sed -nE '/listening on tcp:/{s/.*listening on (tcp:\/\/127\.0\.0\.1:[0-9]+).*/\1/p;q}' "$WORK/rep.err")
# ring N: the last status.json has N active servers, each holding a current replica of another
# active one, no two of the same.
ring() {
  python3 - "$WORK/status.json" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
servers = [m for m in d["members"] if m["role"] == "server" and m["state"] == "active"]
ids = {m["id"] for m in servers}
held = [m.get("replica_of") for m in servers]
ok = (len(servers) == int(sys.argv[2]) and all(m.get("replica_current") is True for m in servers)
      and set(held) == ids and all(m["replica_of"] != m["id"] for m in servers))
sys.exit(0 if ok else 1)
PY
}
# ring_until N: polls status (up to 20 s) until ring N holds.
ring_until() {
  checks=$((checks + 1))
  for _ in $(seq 200); do
    "$ZSHARD" status --coord "$EP" --json >"$WORK/status.json" 2>"$WORK/status.err" && ring "$1" &&
      return 0
    sleep 0.1
  done
  fail "no ring of $1 servers with current replicas: $(cat "$WORK/status.json" "$WORK/status.err")"
}
# replicas_gauge: the coordinator's zshard_replicas_current.
replicas_gauge() {
  python3 - "$WORK/rep/metrics-targets.json" <<'PY'
import json, sys, urllib.request
t = [e["targets"][0] for e in json.load(open(sys.argv[1])) if e["labels"]["zshard_role"] == "coord"]
for line in urllib.request.urlopen("http://%s/metrics" % t[0], timeout=5).read().decode().splitlines():
    if line.startswith("zshard_replicas_current "):
        print(line.split()[1])
PY
}
ring_until 3
expect_ok "$ZSHARD" status --coord "$EP"
checks=$((checks + 1))
[ "$(grep -cE '^ +[0-9]+ +server +active .*\(replica of [0-9]+: current\)$' "$WORK/out.txt")" = 3 ] ||
  fail "the table does not show 3 servers with current replicas: $(cat "$WORK/out.txt")"
gauge_is() { [ "$(replicas_gauge 2>/dev/null)" = "$1" ]; }
checks=$((checks + 1))
wait_until 10 gauge_is 3 || fail "zshard_replicas_current is $(replicas_gauge), expected 3"
S2=$(pid_of "$WORK/rep.err" "server 2")
kill -KILL "$S2"
ring_until 2
checks=$((checks + 1))
wait_until 10 gauge_is 2 || fail "zshard_replicas_current is $(replicas_gauge) after the failover, expected 2"
checks=$((checks + 1))
grep -q '"state":"gone",[^}]*"pid":'"$S2"',' "$WORK/status.json" ||
  fail "the killed server is not gone: $(cat "$WORK/status.json")"
kill -TERM "$LPID" 2>/dev/null || true
reap "$LPID"

expect_fail 'missing --coord' "$ZSHARD" status
expect_fail '--timeout-ms: "0" is not an integer' "$ZSHARD" status --coord "$EP" --timeout-ms 0
expect_ok "$ZSHARD" status --help
grep -q -- '--json' "$WORK/out.txt" || fail "status --help lacks --json"
finish
