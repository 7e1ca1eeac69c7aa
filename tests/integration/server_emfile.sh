# A partition server out of file descriptors (issue 10): zshard coord, one zshard server and
# one zshard worker run a job; mid-run the server's RLIMIT_NOFILE is lowered (prlimit) to the
# lowest descriptor it has free, so that it can open nothing more, and a stranger opens
# connections to its data port.  The server's listener fails with EMFILE on each of them for
# as long as that lasts.  Checks:
#  - the job goes on meanwhile: the worker's connections are served and steps keep coming;
#  - the server logs the failure, at a bounded rate: at most 5 lines per started 10 s of the
#    flood (zs_log_limited), where a listener that retried every 100 ms without a limit would
#    log 10 per second (and one that spun, millions);
#  - once the limit is back, the listener accepts again: a flood connection that sends 48 bytes
#    that are not a handshake is closed by the server;
#  - when the stranger has gone, the job ends as zshard train's does (model and metrics
#    bitwise), and every process exits 0.
source "$(dirname "$0")/lib.sh"
trap kill_started EXIT
STEPS=1000
FLOOD=20           # connections the stranger opens
MIN_FLOOD_MS=2000 # the flood lasts at least this long (20 listener retries, unlimited)

expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --out "$WORK/train" --threads 1 --log-level warn

start_coord "$WORK/coord.log" "$DATA/tiny.json" $STEPS "$WORK/out"
"$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/server.log" &
SERVER=$!
PIDS+=($SERVER)
"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/worker.log" &
WORKER=$!
PIDS+=($WORKER)

# steps_done: the lines of the coordinator's metrics so far.
steps_done() { wc -l <"$WORK/out/metrics.jsonl" 2>/dev/null || echo 0; }
steps_past() { [ "$(steps_done)" -ge "$1" ]; }

wait_until 30 steps_past 10 ||
  { fail "the job did not reach step 10: $(tail -n 3 "$WORK/coord.log")"; finish; }
PORT=$(sed -nE 's/.*server [0-9]+: [0-9]+ shards, [0-9]+ floats, at 127\.0\.0\.1:([0-9]+).*/\1/p' \
  "$WORK/server.log")
[ -n "$PORT" ] || { fail "the server did not say where it listens: $(cat "$WORK/server.log")"; finish; }

# The lowest descriptor number the server has free: with the soft limit there, its next
# accept() fails with EMFILE.  (The hard limit stays, so the soft one can be raised again.)
lowest_free_fd() {
  local fd=0
  while [ -e "/proc/$SERVER/fd/$fd" ]; do fd=$((fd + 1)); done
  echo $fd
}
read -r SOFT HARD < <(prlimit --pid $SERVER --nofile --noheadings --raw --output SOFT,HARD)
prlimit --pid $SERVER --nofile="$(lowest_free_fd):$HARD"
emfile_lines() { grep -c 'accept: Too many open files' "$WORK/server.log" || true; }
before_lines=$(emfile_lines)
flood_start=$(now_ms)
steps_at_flood=$(steps_done)
fds=()
for ((i = 0; i < FLOOD; i++)); do
  exec {fd}<>"/dev/tcp/127.0.0.1/$PORT" || { fail "connection $i to the server's port failed"; break; }
  fds+=($fd)
done

# The flood lasts until the server has said it cannot accept, the job has done 100 steps
# since it began, and MIN_FLOOD_MS have passed.
flood_seen() {
  [ "$(emfile_lines)" -gt "$before_lines" ] && steps_past $((steps_at_flood + 100)) &&
    [ $(($(now_ms) - flood_start)) -ge $MIN_FLOOD_MS ]
}
checks=$((checks + 1))
wait_until 60 flood_seen ||
  fail "during the flood: $(($(emfile_lines) - before_lines)) EMFILE lines, $(($(steps_done) - steps_at_flood)) steps: $(tail -n 3 "$WORK/server.log")"
flood_ms=$(($(now_ms) - flood_start))
lines=$(($(emfile_lines) - before_lines))
bound=$((5 * (flood_ms / 10000 + 1)))
echo "server_emfile: ${flood_ms} ms out of descriptors: $lines log lines (bound $bound), $(($(steps_done) - steps_at_flood)) steps meanwhile"
checks=$((checks + 1))
[ "$lines" -le "$bound" ] || fail "$lines EMFILE lines in $flood_ms ms, more than $bound: $(grep -m 8 'accept:' "$WORK/server.log")"

prlimit --pid $SERVER --nofile="$SOFT:$HARD"
checks=$((checks + 1))
if [ ${#fds[@]} -gt 0 ]; then
  fd=${fds[0]}
  printf '%048d' 0 >&$fd
  timeout 15 cat <&$fd >/dev/null ||
    fail "the server did not close a connection that sent no handshake once it had descriptors again"
fi
for fd in "${fds[@]}"; do exec {fd}>&-; done

checks=$((checks + 1))
wait_until 120 gone $COORD || fail "the job did not end: $(tail -n 3 "$WORK/coord.log")"
for p in $COORD $SERVER $WORKER; do
  wait_until 30 gone $p || fail "process $p did not exit"
  reap $p
  checks=$((checks + 1))
  [ "$RC" = 0 ] || fail "process $p exited $RC"
done
same_bits job "$WORK/out" "$WORK/train"
finish
