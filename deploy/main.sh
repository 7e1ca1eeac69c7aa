#!/usr/bin/env bash
# The main job: builds zshard, writes the default corpus (text already on this machine), and
# trains the small GPT (6 layers x 384, byte-level) on it with `zshard launch`: a local
# cluster of a coordinator, 2 partition servers and 2 workers on loopback; then prints a
# summary.  The result is bitwise what `zshard train` gives for the same config and data.
#   deploy/main.sh [STEPS] [OUT]        (defaults: 60 steps, out/main)
set -euo pipefail
# cd prints the directory it went to when CDPATH resolves it; that would leak into $root.
root=$(cd "$(dirname "$0")/.." >/dev/null && pwd)
steps=${1:-60}
out=${2:-$root/out/main}
# Only build.sh's stdout, the build directory, is captured; its progress goes to stderr.
build=$("$root/deploy/build.sh")
# Anything else on that stdout would otherwise surface later as a baffling path error.
if [ ! -x "$build/zshard" ]; then
  echo "zshard: deploy/build.sh printed '$build', not a build directory holding zshard" >&2
  exit 1
fi
mkdir -p "$out"
corpus=$out/corpus.txt
[ -s "$corpus" ] || "$root/deploy/corpus.sh" "$corpus"
echo "zshard: training on $corpus ($(stat -c %s "$corpus") bytes) for $steps steps:" \
  "coordinator, 2 partition servers and 2 workers on loopback" >&2
start=$(date +%s)
"$build/zshard" launch --config "$root/deploy/configs/small-gpt.json" --data "$corpus" \
  --steps "$steps" --servers 2 --workers 2 --out "$out"
end=$(date +%s)
first=$(head -n 1 "$out/metrics.jsonl" | sed -E 's/.*"loss": ([^,]*),.*/\1/')
last=$(tail -n 1 "$out/metrics.jsonl" | sed -E 's/.*"loss": ([^,]*),.*/\1/')
tps=$(awk -F'"tokens_per_sec": ' '{split($2, a, ","); s += a[1]; n++} END {printf "%.0f", s / n}' \
  "$out/metrics.jsonl")
cat <<TXT

zshard main job done in $((end - start)) s
  loss:     $first (step 1) -> $last (step $steps)   [nats per byte; ln 256 = 5.545 is chance]
  speed:    $tps tokens/s (mean over steps; 2 servers, 2 workers)
  model:    $out/model.safetensors, $out/config.json (Hugging Face GPT-2 format)
  metrics:  $out/metrics.jsonl
  checkpoint: $out/checkpoints/$(cat "$out/checkpoints/latest" 2>/dev/null) (the final one; export it
            with \`zshard export\`, or continue the run with \`zshard launch ... --resume\`)
  logs:     $out/logs/ (coordinator, servers, workers)
  evaluate: $build/zshard eval --model $out --data $corpus --seqs 32
TXT
