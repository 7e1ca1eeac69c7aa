# A real Prometheus scrapes a running job: zshard launch --metrics 127.0.0.1:0 (a coordinator,
# 2 servers and a worker, each on a free port) writes OUT/metrics-targets.json, Prometheus (Debian's
# prometheus, 1 s scrape interval) reads it through file_sd_configs, and its HTTP API
# (/api/v1/query) must show every target up, the expected series of the coordinator, of each
# server and of the worker, and the step, checkpoint, byte and chunk counters moving between
# scrapes.  The Grafana
# dashboard (deploy/grafana/zshard.json) is valid JSON and every series name its queries use
# exists in what Prometheus scraped.  Skipped (exit 77) only without a prometheus binary.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

PROMETHEUS=${ZS_PROMETHEUS:-prometheus}
if ! command -v "$PROMETHEUS" >/dev/null; then
  echo "metrics_prometheus: skipped: no prometheus binary (deploy/install-deps.sh --tests" \
    "installs Debian's prometheus package)"
  exit 77
fi

trap kill_started EXIT

# Prometheus first (it takes seconds to start on a busy machine), watching a targets file that
# does not exist yet; then the job, which runs only while the test looks at it.
OUT=$WORK/out
mkdir -p "$OUT"
cat >"$WORK/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: zshard
    file_sd_configs:
      - files: ['$OUT/metrics-targets.json']
        refresh_interval: 1s
YML

# A free port for Prometheus: chosen, then bound by Prometheus; if another process took it in
# between, Prometheus exits and the next try picks another.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
prom_ready() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://127.0.0.1:$PPORT/-/ready" 2>/dev/null; }
PPORT=
for try in 1 2 3; do
  PPORT=$(free_port)
  rm -rf "$WORK/tsdb"
  "$PROMETHEUS" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PPORT" --log.level=warn 2>"$WORK/prometheus.log" &
  PPID_=$!
  PIDS+=("$PPID_")
  prom_ready_or_gone() { prom_ready || ! alive "$PPID_"; }
  wait_until 60 prom_ready_or_gone || true
  prom_ready && break
  kill -KILL "$PPID_" 2>/dev/null || true
  PPORT=
done
[ -n "$PPORT" ] || { fail "prometheus did not start: $(tail -n 20 "$WORK/prometheus.log")"; finish; }
echo "prometheus on 127.0.0.1:$PPORT"

# Far more steps than the test lasts: it stops the job itself once the checks are done.
sed 's/"cluster": {"shard_size": 16384}/"cluster": {"shard_size": 16384}, "checkpoint": {"interval_steps": 10}/' \
  "$DATA/tiny.json" >"$WORK/job.json"
setsid "$ZSHARD" launch --config "$WORK/job.json" --data "$DATA/tiny.txt" --steps 1000000 \
  --servers 2 --workers 1 --threads 1 --out "$OUT" --metrics 127.0.0.1:0 2>"$WORK/launch.err" &
LPID=$!
PGIDS+=("$LPID")

targets_listed() { has_line "$OUT/metrics-targets.json" '"server-2"' && has_line "$OUT/metrics-targets.json" '"server-1"' && has_line "$OUT/metrics-targets.json" '"coord"' && has_line "$OUT/metrics-targets.json" '"zshard_role": "worker", "zshard_process": "worker-1"'; }
checks=$((checks + 1))
wait_until 30 targets_listed ||
  { fail "metrics-targets.json never listed coord, 2 servers and a worker: $(cat "$OUT/metrics-targets.json" "$WORK/launch.err" 2>&1 | tail -n 20)"; finish; }
echo "zshard targets: $(tr -d '\n ' <"$OUT/metrics-targets.json")"
checks=$((checks + 1))
python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); assert len(t) == 4 and all(len(e["targets"]) == 1 for e in t)' \
  "$OUT/metrics-targets.json" || fail "metrics-targets.json is not a file_sd list of 4 targets: $(cat "$OUT/metrics-targets.json")"

# query EXPR: prints "LABELS VALUE" per series of an instant query (labels as k=v,k=v sorted).
query() {
  python3 - "http://127.0.0.1:$PPORT/api/v1/query" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]})
r = json.load(urllib.request.urlopen(url, timeout=5))
if r.get("status") != "success":
    sys.exit("query failed: " + json.dumps(r))
for s in r["data"]["result"]:
    labels = ",".join("%s=%s" % kv for kv in sorted(s["metric"].items()))
    print(labels, s["value"][1])
PY
}

# value EXPR: the value of a query that gives exactly one series (empty otherwise).
value() {
  local out
  out=$(query "$1") || return 0
  [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] && printf '%s\n' "${out##* }"
}

# Every target up.
all_up() { [ "$(value 'sum(up{job="zshard"})')" = 4 ]; }
checks=$((checks + 1))
wait_until 30 all_up || fail "not all 4 targets are up: $(query 'up')"

# The series each process must export, present in Prometheus for that process.
C='zshard_role="coord"'
coord_series=(zshard_step zshard_steps zshard_loss zshard_learning_rate zshard_grad_norm
  zshard_tokens_per_second zshard_workers_live zshard_steps_finished_total
  zshard_skipped_steps_total zshard_checkpoints_committed_total zshard_checkpoints_failed_total
  zshard_checkpoint_last_step zshard_checkpoint_age_seconds zshard_recoveries_total
  zshard_failovers_total zshard_replicas_current zshard_step_duration_seconds_bucket zshard_step_duration_seconds_sum
  zshard_step_duration_seconds_count zshard_build_info process_start_time_seconds)
server_series=(zshard_server_version zshard_server_shards zshard_server_shard_bytes
  zshard_server_held_fetches zshard_server_fetches_total zshard_server_fetched_bytes_total
  zshard_server_pushes_total zshard_server_pushed_bytes_total zshard_server_apply_last_seconds
  zshard_server_apply_seconds_bucket zshard_server_apply_seconds_count zshard_server_replica
  zshard_server_replica_current zshard_server_refused_total zshard_server_nvme_read_bytes_total
  zshard_server_nvme_written_bytes_total zshard_build_info process_start_time_seconds)
worker_series=(zshard_worker_chunks_total zshard_worker_fetched_bytes_total
  zshard_worker_pushed_bytes_total zshard_worker_member zshard_worker_step
  zshard_worker_buffer_bytes zshard_worker_compute_seconds_bucket
  zshard_worker_compute_seconds_sum zshard_worker_compute_seconds_count
  zshard_worker_fetch_wait_seconds_count zshard_worker_push_wait_seconds_count
  zshard_worker_step_wait_seconds_count zshard_build_info process_start_time_seconds)
# One query for all of them: which series names each process has.
query 'count by (__name__, zshard_process) ({job="zshard"})' |
  sed -E 's/^__name__=([^,]*),zshard_process=([^ ]*) .*/\2 \1/' | sort -u >"$WORK/have.txt"
for s in "${coord_series[@]}"; do
  checks=$((checks + 1))
  grep -qx "coord $s" "$WORK/have.txt" || fail "coord: no series $s in Prometheus"
done
for p in server-1 server-2; do
  for s in "${server_series[@]}"; do
    checks=$((checks + 1))
    grep -qx "$p $s" "$WORK/have.txt" || fail "$p: no series $s in Prometheus"
  done
done
for s in "${worker_series[@]}"; do
  checks=$((checks + 1))
  grep -qx "worker-1 $s" "$WORK/have.txt" || fail "worker-1: no series $s in Prometheus"
done
checks=$((checks + 2))
[ "$(query "zshard_members{$C}" | wc -l)" -eq 6 ] || fail "zshard_members: not 6 role/state series: $(query "zshard_members{$C}")"
[ "$(query 'zshard_server_refused_total{zshard_process="server-1"}' | wc -l)" -eq 7 ] ||
  fail "zshard_server_refused_total: not 7 reasons: $(query 'zshard_server_refused_total')"

# The members as they are: 2 servers and 1 worker active; each server holds shards.
members_seen() {
  [ "$(value "zshard_members{$C,role=\"server\",state=\"active\"}")" = 2 ] &&
    [ "$(value "zshard_members{$C,role=\"worker\",state=\"active\"}")" = 1 ]
}
checks=$((checks + 1))
wait_until 20 members_seen || fail "members: $(query "zshard_members{$C}")"
checks=$((checks + 1))
[ "$(value 'count(zshard_server_shards > 0)')" = 2 ] || fail "shards: $(query zshard_server_shards)"

# The counters move between scrapes: the step, the checkpoints, each server's bytes and
# applies; the step's samples at two scrape times differ.
step1=$(value "zshard_step{$C}")
ckpt1=$(value "zshard_checkpoints_committed_total{$C}")
W='zshard_process="worker-1"'
chunks1=$(value "zshard_worker_chunks_total{$W}")
fetched1=$(query zshard_server_fetched_bytes_total)
pushed1=$(query zshard_server_pushed_bytes_total)
echo "first look: step $step1, checkpoints $ckpt1"
moved() {
  local step ckpt p
  step=$(value "zshard_step{$C}")
  ckpt=$(value "zshard_checkpoints_committed_total{$C}")
  awk -v a="$step1" -v b="$step" -v c="$ckpt1" -v d="$ckpt" 'BEGIN {exit !(b > a && d > c)}' || return 1
  awk -v a="$chunks1" -v b="$(value "zshard_worker_chunks_total{$W}")" 'BEGIN {exit !(a != "" && b > a)}' || return 1
  for p in server-1 server-2; do
    local f0 f1 p0 p1
    f0=$(printf '%s\n' "$fetched1" | grep "zshard_process=$p," | sed 's/.* //')
    p0=$(printf '%s\n' "$pushed1" | grep "zshard_process=$p," | sed 's/.* //')
    f1=$(value "zshard_server_fetched_bytes_total{zshard_process=\"$p\"}")
    p1=$(value "zshard_server_pushed_bytes_total{zshard_process=\"$p\"}")
    awk -v a="$f0" -v b="$f1" -v c="$p0" -v d="$p1" 'BEGIN {exit !(a != "" && c != "" && b > a && d > c)}' || return 1
  done
}
checks=$((checks + 1))
wait_until 30 moved ||
  fail "the counters did not move: step $step1 -> $(value "zshard_step{$C}"), checkpoints $ckpt1 -> $(value "zshard_checkpoints_committed_total{$C}"), fetched $fetched1 -> $(query zshard_server_fetched_bytes_total), pushed $pushed1 -> $(query zshard_server_pushed_bytes_total)"
echo "then: step $(value "zshard_step{$C}"), checkpoints $(value "zshard_checkpoints_committed_total{$C}")"
checks=$((checks + 3))
[ "$(value "count(changes(zshard_step{$C}[1m]) > 0)")" = 1 ] || fail "zshard_step did not change over the scrapes: $(query "zshard_step{$C}[1m]")"
[ "$(value 'count(increase(zshard_server_apply_seconds_count[1m]) > 0)')" = 2 ] ||
  fail "zshard_server_apply_seconds_count did not grow on both servers: $(query 'zshard_server_apply_seconds_count')"
awk -v l="$(value "zshard_loss{$C}")" 'BEGIN {exit !(l > 0 && l < 6)}' || fail "zshard_loss: $(query "zshard_loss{$C}")"
# The worker's figures hang together within one scrape: a chunk counted once and timed once
# (the scrape may fall between the two updates), bytes both ways, a member id and a step.
checks=$((checks + 3))
awk -v d="$(value "zshard_worker_chunks_total{$W} - zshard_worker_compute_seconds_count{$W}")" \
  'BEGIN {exit !(d != "" && d >= 0 && d <= 1)}' ||
  fail "worker: chunks_total and compute_seconds_count differ: $(query "zshard_worker_chunks_total") $(query "zshard_worker_compute_seconds_count")"
[ "$(value "count(zshard_worker_fetched_bytes_total{$W} > 0 and zshard_worker_pushed_bytes_total{$W} > 0)")" = 1 ] ||
  fail "worker: bytes: $(query zshard_worker_fetched_bytes_total) $(query zshard_worker_pushed_bytes_total)"
[ "$(value "count(zshard_worker_member{$W} > 0 and zshard_worker_step{$W} > 0)")" = 1 ] ||
  fail "worker: member $(query zshard_worker_member), step $(query zshard_worker_step)"

# The dashboard: valid JSON, and every series name in its queries is one Prometheus has.
query 'count by (__name__) ({job="zshard"})' | sed -E 's/^__name__=([^ ,]*).*/\1/' | sort -u >"$WORK/names.txt"
checks=$((checks + 1))
python3 - "$ROOT/deploy/grafana/zshard.json" "$WORK/names.txt" <<'PY' || fail "the dashboard refers to series that do not exist (above)"
import json, re, sys
dash = json.load(open(sys.argv[1]))
have = set(open(sys.argv[2]).read().split())
exprs = []
def walk(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "expr":
                exprs.append(v)
            walk(v)
    elif isinstance(x, list):
        for v in x:
            walk(v)
walk(dash)
used = {n for e in exprs for n in re.findall(r"\b(?:zshard_[a-z_]+|process_start_time_seconds)\b", e)}
missing = sorted(used - have)
print("dashboard: %d queries, %d series names, all scraped: %s" % (len(exprs), len(used), not missing))
if not exprs or missing:
    print("missing:", missing, file=sys.stderr)
    sys.exit(1)
PY

# The job is stopped (SIGTERM to the launcher, which stops its children); nothing is left.
kill -TERM "$LPID" 2>/dev/null || true
reap "$LPID"
checks=$((checks + 1))
[ "$RC" -eq 143 ] || fail "zshard launch exited $RC after SIGTERM, not 143: $(tail -n 5 "$WORK/launch.err")"
kill -TERM "$PPID_" 2>/dev/null || true
reap "$PPID_"
none_started_left
finish
