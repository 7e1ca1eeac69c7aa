#!/usr/bin/env bash
# bench_multihost: the step time of a job whose coordinator, partition servers and workers
# each run in a network namespace of their own (tests/multihost/netns.sh: veth pairs to a
# bridge, every link shaped with tbf in both directions), at a few (S, W, rate) points, against
# a model of the step (docs/scaling.md) whose inputs are measured in the same run:
#
#   c      compute per chunk: the run's compute_ms / C (median over steps 2..N)
#   F, G   bytes fetched and pushed per chunk: the workers' own counts (their last log line)
#   A      AdamW parameters/s on 1 thread: bench_adamw 1 4 3, run first
#   B      the link rate (each host's NIC, both directions), o = 1514/1448: a full TCP segment
#          of 1448 payload bytes is a 1514-byte frame on the shaped link
#   k = ceil(C/W) chunks per worker per step
#   T_net  = o/B * max(k (F + G), C F / S, C G / S)  worker in+out, server out, server in:
#            a worker's fetches and pushes to a server share one connection, whose frames the
#            server serves in order (a fetch behind a push waits for the push's payload), so
#            a worker's ingress and egress add up; a server's connections run side by side
#   T_cmp  = k c
#   T_exp  = o/B * (E + B1 + E) + (N/S)/A: what cannot overlap: the first fetch of a step
#            (embeddings and block 1, only after the version is published), the last push (the
#            embeddings' gradient, after the backward pass), the servers' AdamW
#   model  = max(T_cmp, T_net) + T_exp          (no overlap at all: T_cmp + T_net + T_exp)
#
# The latency term (round trips x RTT) is not measured here: netem (delay, loss) is not in
# every kernel (not in this project's CI host's), and a veth RTT is some tens of us, under 1%
# of these steps.  The figure is the median step_ms of steps 2..N (metrics.jsonl); each line
# prints it, the model's prediction and their ratio.  The final line: "bench_multihost: ..."
# with the largest |ratio - 1|.  Needs root.  Takes about 1-2 minutes.
#
# usage: bench/bench_multihost.sh BUILD_DIR [steps=6]
#
# With --latency (where the kernel has sch_netem: in the qemu guest of tests/rdma/run.sh,
#   tests/rdma/run.sh build -- bench/bench_multihost.sh build --latency [steps=8]):
# the round trips on a step's critical path, measured.  1 server, 1 worker, the test model
# (tests/data/tiny.json: 2 layers, 2 chunks), unshaped, then with a one-way delay D on every
# link in both directions (D at each end of a link: a round trip between two hosts is 4 D).
# R = (step(D) - step(0)) / 4D, D = 20 and 50 ms (large: the guest is slow and noisy), beside
# the model's count: where a layer's compute takes longer than a round trip (the guest: the
# layers' fetches hide behind it), what is left is the step's first fetch, its last push's
# answer and about 4 control-plane messages at the step boundary: about 6.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." >/dev/null && pwd)
BUILD=$(cd "${1:?usage: bench_multihost.sh BUILD_DIR [--latency] [steps]}" && pwd)
LATENCY=0
if [ "${2:-}" = --latency ]; then
  LATENCY=1
  shift
fi
STEPS=${2:-6}
ZSHARD=$BUILD/zshard
source "$root/tests/multihost/netns.sh"
why=$(mh_can 2>&1) || { echo "bench_multihost: cannot run: $why" >&2; exit 1; }
WORK=$(mktemp -d /tmp/bench_multihost.XXXXXX)
trap 'mh_kill_all; mh_down; rm -rf "$WORK"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
"$ZSHARD" keygen "$WORK/secret" 2>/dev/null
export ZSHARD_SECRET_FILE=$WORK/secret
DATA=$root/tests/data/tiny.txt

# 4 x 256, byte vocabulary, 4 chunks of 2 x 128 tokens: 3.3 M parameters, 13 MB of fp32.
L=4 D=256 V=256 T=128 C=4
cat >"$WORK/job.json" <<JSON
{"seed": 7, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}},
 "gradient_clipping": 1.0,
 "model": {"n_layer": $L, "n_head": 4, "n_embd": $D, "vocab_size": $V, "block_size": $T}}
JSON

# latency_point D: median step (ms) of steps 2..N with one-way delay D (ms; 0: no netem).
latency_point() {
  local d=$1 name="lat-$1ms"
  if [ "$d" = 0 ]; then mh_up 1 1; else mh_up 1 1 "" "${d}ms"; fi ||
    { echo "bench_multihost: mh_up failed" >&2; exit 1; }
  MH_PIDS=()
  mh_job_start "$ZSHARD" "$root/tests/data/tiny.json" "$DATA" "$STEPS" "$WORK/$name" "$WORK/$name.logs" 1 1 ||
    exit 1
  mh_job_wait 600 || true
  [ "$MH_RC" = 0 ] || { echo "bench_multihost: $name: coordinator exited $MH_RC" >&2; exit 1; }
  mh_down
  python3 -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print(statistics.median(r["step_ms"] for r in rows))' "$WORK/$name/metrics.jsonl"
}

if [ $LATENCY = 1 ]; then
  mh_has_netem || { echo "bench_multihost: --latency needs netem (sch_netem), which this kernel lacks" >&2; exit 1; }
  base=$(latency_point 0)
  echo "no delay: step $base ms"
  for d in 20 50; do
    t=$(latency_point $d)
    python3 -c 'import sys
base, t, d = map(float, sys.argv[1:])
rtt = 4 * d
print(f"one-way delay {d:g} ms a link end (RTT {rtt:g} ms): step {t:.1f} ms, +{t - base:.1f} ms: "
      f"R = {(t - base) / rtt:.1f} round trips a step (model: about 6)")' "$base" "$t" "$d"
  done
  exit 0
fi

A=$("$BUILD/bench/bench_adamw" 1 4 3 2>/dev/null | sed -nE 's/^bench_adamw: ([0-9.e+]+) params\/s$/\1/p')
[ -n "$A" ] || { echo "bench_multihost: bench_adamw gave no params/s" >&2; exit 1; }
echo "AdamW on 1 thread: $A params/s (bench_adamw 1 4 3)"

# Tensor sizes of the model (bytes of fp32): embeddings (wte, wpe), one block.
E=$(((V + T) * D * 4))
B1=$(((12 * D * D + 13 * D) * 4))
N=$(((V + T) * D + L * (12 * D * D + 13 * D) + 2 * D))
echo "model: $N parameters, embeddings $E B, a block $B1 B (fp32); $C chunks a step"

# point S W RATE: one job, its median step against the model.
worst=0
point() {
  local S=$1 W=$2 rate=$3 name="s$1w$2-$3" i
  mh_up "$S" "$W" "$rate" || { echo "bench_multihost: mh_up failed" >&2; exit 1; }
  MH_PIDS=()
  mh_job_start "$ZSHARD" "$WORK/job.json" "$DATA" "$STEPS" "$WORK/$name" "$WORK/$name.logs" "$S" "$W" ||
    exit 1
  mh_job_wait 600 || true
  [ "$MH_RC" = 0 ] || { echo "bench_multihost: $name: coordinator exited $MH_RC" >&2; tail -n 5 "$WORK/$name.logs/coord.log" >&2; exit 1; }
  mh_down
  local bits
  bits=$(mh_rate_bits "$rate")
  # Workers' totals: chunks, fetched MB, pushed MB.
  local tot
  tot=$(cat "$WORK/$name.logs"/w*.log | sed -nE 's/.*: ([0-9]+) chunks over .* fetched ([0-9.]+) MB, pushed ([0-9.]+) MB.*/\1 \2 \3/p' |
    awk '{c += $1; f += $2; g += $3} END {print c, f, g}')
  python3 - "$WORK/$name/metrics.jsonl" "$S" "$W" "$bits" "$C" "$A" "$N" "$E" "$B1" $tot "$name" <<'PY'
import json, math, statistics, sys
path, S, W, bits, C, A, N, E, B1, chunks, fmb, gmb, name = sys.argv[1:]
S, W, C, N, E, B1, chunks = map(int, (S, W, C, N, E, B1, chunks))
bits, A, fmb, gmb = map(float, (bits, A, fmb, gmb))
rows = [json.loads(l) for l in open(path)][1:]
step = statistics.median(r["step_ms"] for r in rows) / 1e3
c = statistics.median(r["compute_ms"] for r in rows) / 1e3 / C
F, G = fmb * 1e6 / chunks, gmb * 1e6 / chunks
o = 1514 / 1448
Bps = bits / 8 / o
k = math.ceil(C / W)
terms = {"worker in+out": k * (F + G), "server out": C * F / S, "server in": C * G / S}
bind = max(terms, key=terms.get)
t_net = terms[bind] / Bps
t_cmp = k * c
t_exp = (E + B1 + E) / Bps + (N / S) / A
model = max(t_cmp, t_net) + t_exp
serial = t_cmp + t_net + t_exp
r = step / model
print(f"{name}: step {step*1e3:.0f} ms; model {model*1e3:.0f} ms = max(compute {t_cmp*1e3:.0f}, "
      f"net {t_net*1e3:.0f} [{bind}]) + exposed {t_exp*1e3:.0f}; ratio {r:.2f} "
      f"(no-overlap model {serial*1e3:.0f} ms, ratio {step/serial:.2f}); "
      f"per chunk F {F/1e6:.1f} MB G {G/1e6:.1f} MB, c {c*1e3:.0f} ms")
with open(path + ".ratio", "w") as f:
    f.write(f"{r}\n")
PY
  local r
  r=$(cat "$WORK/$name/metrics.jsonl.ratio")
  worst=$(python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(b if abs(b - 1) > abs(a - 1) else a)" "$worst" "$r")
}

worst=1
point 1 1 1gbit
point 2 2 1gbit
point 2 2 200mbit
point 1 2 200mbit
point 2 2 10gbit
echo "bench_multihost: 5 points, median step / model's prediction, worst ratio $(printf %.2f "$worst")"
