# A member that fails tells the coordinator why.  A server whose memory cannot hold its shards
# says so before allocating anything ("server 1: 73 shards (...) need 327 GiB, but MemAvailable
# leaves ..."), exits 1, and the coordinator logs that reason and shows it in `zshard status` as
# the server's, instead of a missing heartbeat.  (A model too large for any machine, rather
# than a ulimit -v, which AddressSanitizer's shadow memory cannot live under.)
source "$(dirname "$0")/lib.sh"
trap kill_started EXIT # kills PIDS

# 96 x 4096: 19.5 G parameters, about 327 GiB of state on its one server; shards of 1 GiB.
printf '{"train_batch_size": 2, "model": {"n_layer": 96, "n_head": 32, "n_embd": 4096, "vocab_size": 50257, "block_size": 64}, "cluster": {"shard_size": 1073741824}}\n' \
  >"$WORK/big.json"
"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$WORK/big.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps 2 --out "$WORK/out" 2>"$WORK/coord.log" &
COORD=$!
PIDS+=($COORD)
wait_endpoint "$WORK/coord.log" 15 || true
[ -n "$EP" ] || { fail "the coordinator did not say where it listens: $(cat "$WORK/coord.log")"; finish; }
RC=0
"$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/server.log" || RC=$?
checks=$((checks + 1))
[ "$RC" = 1 ] || fail "the server exited $RC, expected 1: $(tail -n 3 "$WORK/server.log")"
expect_log server "$WORK/server.log" \
  'zshard server: server 1: [0-9]+ shards \(weights, moments, gradients\) need [0-9.]+ GiB, but (RLIMIT_AS|MemAvailable|cgroup memory.max) leaves [0-9.]+ GiB'
checks=$((checks + 1))
wait_until 15 has_line "$WORK/coord.log" 'coord: server 1 left: server 1: [0-9]+ shards .* need [0-9.]+ GiB' ||
  fail "the coordinator did not log the server's reason: $(tail -n 3 "$WORK/coord.log")"
expect_ok "$ZSHARD" status --coord "$EP" --json
expect_log status "$WORK/out.txt" '"role":"server","state":"gone",.*"reason":"server 1: [0-9]+ shards \(weights, moments, gradients\) need'
kill "$COORD"
reap "$COORD"

# A worker that fails after it registered (its copy of the data is a FIFO) says why too.
"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$DATA/tiny.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps 2 --out "$WORK/out2" 2>"$WORK/coord2.log" &
COORD=$!
PIDS+=($COORD)
wait_endpoint "$WORK/coord2.log" 15 || true
[ -n "$EP" ] || { fail "the second coordinator did not say where it listens"; finish; }
"$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/server2.log" &
PIDS+=($!)
mkfifo "$WORK/fifo"
RC=0
timeout 60 "$ZSHARD" worker --coord "$EP" --threads 1 --data "$WORK/fifo" 2>"$WORK/worker.log" || RC=$?
checks=$((checks + 1))
[ "$RC" = 1 ] || fail "the worker exited $RC, expected 1: $(tail -n 3 "$WORK/worker.log")"
checks=$((checks + 1))
wait_until 15 has_line "$WORK/coord2.log" "coord: worker [0-9]+ left before it joined: worker [0-9]+: .*fifo: is a FIFO" ||
  fail "the coordinator did not log the worker's reason: $(tail -n 3 "$WORK/coord2.log")"
kill "$COORD"
reap "$COORD"
finish
