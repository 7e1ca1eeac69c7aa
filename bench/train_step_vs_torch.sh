#!/usr/bin/env bash
# train_step_vs_torch.sh: `zshard train`'s GPT-2 124M step (bench_train_step) and PyTorch's
# with torch.compile (bench/peers/torch_train_step.py), side by side in one run.
#
# The same step for both: B=4, T=64, fp32, forward + backward + gradient norm + AdamW, on
# THREADS threads.  The torch process compiles once (a minute or more) and then waits; the
# rounds alternate a fresh bench_train_step run of STEPS steps with STEPS steps of torch, so
# that both see the same load on the machine.  Each round prints both best step times and the
# ratio torch/zshard (above 1: zshard is faster; the issue's target is 1.5); the last line
# gives the best of each over all rounds and their ratio.
#
# For a person running benchmarks by hand; never run by CI (torch is a multi-GB download).
#
# usage: bench/train_step_vs_torch.sh [BUILD=build] [THREADS=2] [STEPS=3] [ROUNDS=3]
#        ZS_PEERS_PYTHON picks the Python that has torch (default: the venv of
#        bench/peers/make_venv.sh, $HOME/.cache/zshard-peers-venv/bin/python).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." >/dev/null && pwd)
build=${1:-$root/build}
threads=${2:-2}
steps=${3:-3}
rounds=${4:-3}
python=${ZS_PEERS_PYTHON:-$HOME/.cache/zshard-peers-venv/bin/python}
bench=$build/bench/bench_train_step

if [ ! -x "$bench" ]; then
  echo "train_step_vs_torch.sh: $bench not found (build first: deploy/build.sh)" >&2
  exit 2
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "train_step_vs_torch.sh: $python cannot import torch (make it: bench/peers/make_venv.sh," \
    "or set ZS_PEERS_PYTHON)" >&2
  exit 2
fi

# The torch peer as a coprocess: compile once, then one line "N" per round.
coproc TORCH { exec "$python" "$root/bench/peers/torch_train_step.py" --serve "$threads" 2>/dev/null; }
read -r line <&"${TORCH[0]}"
if [ "$line" != ready ]; then
  echo "train_step_vs_torch.sh: torch peer did not start: $line" >&2
  exit 1
fi

best_z=999999
best_t=999999
for r in $(seq 1 "$rounds"); do
  out=$("$bench" "$threads" "$steps" 124m)
  # "gpt2-124m: ... step 1063 ms (mean ...": the best step of this run.
  zms=$(printf '%s\n' "$out" | sed -n 's/^gpt2-124m:.* step \([0-9.]*\) ms (mean.*/\1/p')
  ratio_line=$(printf '%s\n' "$out" | grep '^bench_train_step gpt2-124m:')
  echo "$steps" >&"${TORCH[1]}"
  read -r line <&"${TORCH[0]}"
  tms=${line#torch_ms=}
  printf 'round %d: zshard %s ms/step (%s), torch.compile %s ms/step, torch/zshard %.2f\n' \
    "$r" "$zms" "$ratio_line" "$tms" "$(echo "$tms / $zms" | bc -l)"
  best_z=$(echo "if ($zms < $best_z) $zms else $best_z" | bc -l)
  best_t=$(echo "if ($tms < $best_t) $tms else $best_t" | bc -l)
done
exec {TORCH[1]}>&-
wait "$TORCH_PID" 2>/dev/null || true
printf 'train_step_vs_torch: zshard %.0f ms/step, torch.compile %.0f ms/step (best of %d rounds x %d steps, %d threads), torch/zshard %.2f (target >= 1.5)\n' \
  "$best_z" "$best_t" "$rounds" "$steps" "$threads" "$(echo "$best_t / $best_z" | bc -l)"
