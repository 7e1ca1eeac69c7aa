# Job secrets (docs/security.md): zshard keygen; the checks on a secret file; what a role does
# without one; and against a running job, peers without the secret: a status request and a
# worker with another job's secret, and an --insecure worker and server, get nothing through
# (the coordinator logs the refusals at a bounded rate), while the job's own members finish it
# with the bits of zshard train.  Then zshard launch: the secret it makes, and --insecure in
# every log.
source "$(dirname "$0")/lib.sh"
trap kill_started EXIT # kills PIDS

# ---- keygen and the file's rules ----
expect_ok "$ZSHARD" keygen "$WORK/k1"
checks=$((checks + 1))
[ "$(stat -c %a "$WORK/k1")" = 600 ] || fail "keygen made mode $(stat -c %a "$WORK/k1"), not 600"
checks=$((checks + 1))
grep -qxE '[0-9a-f]{64}' "$WORK/k1" && [ "$(wc -c <"$WORK/k1")" = 65 ] ||
  fail "keygen wrote $(wc -c <"$WORK/k1") bytes, not 64 hex digits and a newline"
cp "$WORK/k1" "$WORK/k1.before"
expect_fail 'exists; a secret file is never overwritten' "$ZSHARD" keygen "$WORK/k1"
checks=$((checks + 1))
cmp -s "$WORK/k1" "$WORK/k1.before" || fail "keygen changed an existing secret"
expect_fail 'missing FILE' "$ZSHARD" keygen

cp "$WORK/k1" "$WORK/open"
chmod 644 "$WORK/open"
expect_fail "secret file $WORK/open: mode 644 lets others than its owner read or change it; run chmod 600" \
  "$ZSHARD" status --coord tcp://127.0.0.1:1 --secret "$WORK/open"
printf 'not a secret\n' >"$WORK/bad"
chmod 600 "$WORK/bad"
expect_fail "secret file $WORK/bad: not a zshard secret" \
  "$ZSHARD" worker --coord tcp://127.0.0.1:1 --secret "$WORK/bad"
mkdir -p "$WORK/adir"
chmod 700 "$WORK/adir"
expect_fail "secret file $WORK/adir: not a regular file" \
  "$ZSHARD" server --coord tcp://127.0.0.1:1 --listen 127.0.0.1:0 --secret "$WORK/adir"
expect_fail "secret file $WORK/none: cannot open" \
  "$ZSHARD" coord --listen tcp://127.0.0.1:0 --config "$DATA/tiny.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps 1 --out "$WORK/c" --secret "$WORK/none"
expect_fail 'choose one' "$ZSHARD" status --coord tcp://127.0.0.1:1 --secret "$WORK/k1" --insecure
expect_fail 'no job secret: give --secret FILE' \
  env -u ZSHARD_SECRET_FILE "$ZSHARD" worker --coord tcp://127.0.0.1:1

# ---- strangers against a running job ----
expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 3 \
  --out "$WORK/train" --threads 1
"$ZSHARD" keygen "$WORK/other" 2>/dev/null
"$ZSHARD" coord --listen 'tcp://127.0.0.1:*' --config "$DATA/tiny.json" --servers 1 \
  --data "$DATA/tiny.txt" --steps 3 --out "$WORK/out" 2>"$WORK/coord.log" &
COORD=$!
PIDS+=($COORD)
wait_endpoint "$WORK/coord.log" 15 || true
[ -n "$EP" ] || { fail "the coordinator did not say where it listens: $(cat "$WORK/coord.log")"; finish; }
"$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --threads 1 2>"$WORK/server.log" &
SERVER=$!
PIDS+=($SERVER)
checks=$((checks + 1))
wait_until 15 "$ZSHARD" status --coord "$EP" --json >"$WORK/status.json" 2>/dev/null ||
  fail "a member's status request got no answer"

# An --insecure server and worker: CURVE never completes, so neither registers (the worker
# gives up at its join timeout; the server is stopped here once the rest is checked).
"$ZSHARD" server --coord "$EP" --listen 127.0.0.1:0 --insecure 2>"$WORK/insecure_server.log" &
ISERVER=$!
PIDS+=($ISERVER)
"$ZSHARD" worker --coord "$EP" --insecure 2>"$WORK/insecure_worker.log" &
IWORKER=$!
PIDS+=($IWORKER)
# Status requests with another job's secret and with none: no answer, named.
expect_fail "no answer from $EP within 300 ms (is the coordinator running, and with this job's secret?)" \
  "$ZSHARD" status --coord "$EP" --timeout-ms 300 --secret "$WORK/other"
expect_fail "no answer from $EP within 300 ms" \
  "$ZSHARD" status --coord "$EP" --timeout-ms 300 --insecure
# A worker with another job's secret: the ZAP handler refuses it, and says so.
"$ZSHARD" worker --coord "$EP" --secret "$WORK/other" 2>"$WORK/other_worker.log" &
OWORKER=$!
PIDS+=($OWORKER)
checks=$((checks + 1))
wait_until 15 has_line "$WORK/coord.log" \
  'control tcp://127\.0\.0\.1:[0-9*]+: refused a connection.*: it did not prove the job secret' ||
  fail "the coordinator did not log the refusal: $(tail -n 5 "$WORK/coord.log")"
# A flood of them: the refusals are logged at most 5 times in 10 s.
for _ in $(seq 30); do
  "$ZSHARD" status --coord "$EP" --timeout-ms 50 --secret "$WORK/other" 2>/dev/null || true
done
checks=$((checks + 1))
# The limit is 5 lines a window of 10 s from the window's first line: the lines may span more
# than one window where starting 30 processes takes long (a sanitizer build), so the bound is
# 5 for each 10 s from the first refusal line to the last.
read -r n bound < <(grep 'refused a connection' "$WORK/coord.log" | awk '
  { split(substr($1, 12, 12), t, ":"); ms = (t[1] * 3600 + t[2] * 60 + t[3]) * 1000
    if (NR == 1) first = ms; last = ms }
  END { print NR + 0, 5 * (1 + int((last - first) / 10000)) }')
[ "$n" -le "$bound" ] || fail "$n refusal lines in the coordinator's log after 31 strangers (at most 5 in 10 s: $bound)"
# None of them became a member: one server, no worker.
expect_ok "$ZSHARD" status --coord "$EP" --json
checks=$((checks + 1))
members=$(grep -o '"role":"[a-z]*"' "$WORK/out.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
[ "$members" = ' 1 "role":"server";' ] || fail "members after the strangers: $members ($(cat "$WORK/out.txt"))"
kill "$OWORKER" "$ISERVER" "$IWORKER" 2>/dev/null || true

# The data plane: a stranger that writes a fetch frame to the server's port is refused at the
# handshake (it holds no member token), and the server says so.
DP=$(sed -nE 's/.*"role":"server","state":"active","host":"[^"]*","endpoint":"127\.0\.0\.1:([0-9]+)".*/\1/p' "$WORK/out.txt")
checks=$((checks + 1))
if [ -z "$DP" ]; then
  fail "no server data-plane port in the status: $(cat "$WORK/out.txt")"
else
  # A 64-byte fetch header ("ZSF1", version 1, op 1), as an unauthenticated peer would send.
  { printf 'ZSF1\001\000\001\000'; head -c 56 /dev/zero; } >/dev/tcp/127.0.0.1/"$DP" || true
  wait_until 15 has_line "$WORK/server.log" 'refused a connection: 127\.0\.0\.1:[0-9]+: handshake: not a zshard handshake' ||
    fail "the server did not refuse the stranger's fetch: $(tail -n 5 "$WORK/server.log")"
fi

# The job's own worker finishes the job: the same bits as zshard train.
"$ZSHARD" worker --coord "$EP" --threads 1 2>"$WORK/worker.log" &
PIDS+=($!)
reap "$COORD"
checks=$((checks + 1))
[ "$RC" = 0 ] || fail "the coordinator exited $RC: $(tail -n 5 "$WORK/coord.log")"
checks=$((checks + 1))
cmp -s "$WORK/out/model.safetensors" "$WORK/train/model.safetensors" ||
  fail "the model differs from zshard train's"

# ---- launch: the secret it makes, and --insecure said in every log ----
expect_ok env -u ZSHARD_SECRET_FILE "$ZSHARD" launch --config "$DATA/tiny.json" \
  --data "$DATA/tiny.txt" --steps 2 --servers 1 --workers 1 --out "$WORK/l1"
checks=$((checks + 1))
[ "$(stat -c %a "$WORK/l1/secret" 2>/dev/null)" = 600 ] || fail "launch made no DIR/secret of mode 600"
expect_ok env -u ZSHARD_SECRET_FILE "$ZSHARD" launch --config "$DATA/tiny.json" \
  --data "$DATA/tiny.txt" --steps 2 --servers 1 --workers 1 --out "$WORK/l3" --insecure
for log in "$WORK"/l3/logs/*.log; do
  has "insecure launch" "$log" 'running without authentication (--insecure)'
done
checks=$((checks + 1))
[ ! -e "$WORK/l3/secret" ] || fail "launch --insecure made a secret"
finish
