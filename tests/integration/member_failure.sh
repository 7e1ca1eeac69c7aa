# A member that fails tells the coordinator why: a server whose address space cannot hold its
# shards (ulimit -v) says so before allocating anything ("server 1: 118 shards (...) need 2.07
# GiB, but RLIMIT_AS leaves ..."), exits 1, and the coordinator logs that reason and shows it in
# `zshard status` as the server's, instead of a missing heartbeat.
source "$(dirname "$0")/lib.sh"
trap kill_started EXIT # kills PIDS

# GPT-2 124M: its state needs about 2 GiB on one server; the server gets 1.4 GiB of address
# space.
printf '{"train_batch_size": 2, "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "block_size": 64}}\n' \
  >"$WORK/big.json"
"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$WORK/big.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps 2 --out "$WORK/out" 2>"$WORK/coord.log" &
COORD=$!
PIDS+=($COORD)
wait_endpoint "$WORK/coord.log" 15 || true
[ -n "$EP" ] || { fail "the coordinator did not say where it listens: $(cat "$WORK/coord.log")"; finish; }
RC=0
(ulimit -v 1500000 && exec "$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1) \
  2>"$WORK/server.log" || RC=$?
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
finish
