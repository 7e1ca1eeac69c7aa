# tests/gpu/jobs.sh ZSHARD WORKDIR: the GPU jobs, on a machine with a GPU (tests/gpu/run.sh runs
# it).  Uses the integration tests' helpers (tests/integration/lib.sh).
#   - `zshard train --device cuda` twice gives the same bits (one GPU model: the reference);
#   - its loss curve stays within a band of the CPU run's: the same model and data, fp32 on both,
#     only the summation orders differ (kernels/cuda/cuda_kernels.h), so each step's loss must be
#     within 2% of the CPU's over 30 steps of the tiny model (the gradients differ in the last
#     bits from the first step on, and the runs drift apart slowly);
#   - the small model for 200 steps: the GPU run's loss curve within 3% of the CPU run's, per
#     window of 20 steps, and so the GPU run's with ZS_CUDA_ATTENTION=reference;
#   - fp16 with a loss scale that overflows at first: skipped steps, a falling scale, then
#     training, and a launch with GPU workers in the same bits;
#   - bf16 (bf16.enabled: bf16 storage with fp32 accumulation on the GPU, docs/gpu.md): train
#     --device cuda twice the same bits, its loss curve within 5% of the CPU bf16 run's at every
#     step (the CPU computes in fp32 on the same bf16 weights; the GPU also rounds every GEMM
#     operand, about 2e-3 each, so it drifts faster than fp32 does from the CPU), and a launch
#     with GPU workers bitwise train's;
#   - `zshard launch --device cuda` with 2 servers and 2 workers gives bitwise the weights and
#     the metrics of `zshard train --device cuda` (the worker copies each layer to the GPU and
#     each gradient back; the optimizer runs on the servers, as it runs on the host in train);
#     its workers say GPUDirect is off because the transport is tcp, and `--gpudirect on` over
#     tcp fails at start with that reason.  GPUDirect RDMA itself (slots in device memory the
#     NIC fills and reads, docs/gpu.md) needs an RDMA-capable GPU host: the GPU machine has no
#     RDMA NIC, so its end-to-end check is not here.
#   - the same two bitwise promises with the fused attention: the tiny model's heads (hs 16) take
#     the reference attention (kernels/cuda/model_cuda.c), so a one-head variant (hs 32) runs
#     with ZS_CUDA_ATTENTION=fused, which fails rather than fall back.
source "$(dirname "$0")/../integration/lib.sh"
STEPS=30
run_train() { # DEVICE OUT
  expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
    --threads 2 --device "$1" --out "$2"
}
run_train cuda "$WORK/gpu-a"
run_train cuda "$WORK/gpu-b"
run_train cpu "$WORK/cpu"
checks=$((checks + 2))
cmp "$WORK/gpu-a/model.safetensors" "$WORK/gpu-b/model.safetensors" ||
  fail "zshard train --device cuda: two runs differ"
cmp -s "$WORK/gpu-a/model.safetensors" "$WORK/cpu/model.safetensors" &&
  fail "the cuda run wrote the CPU run's bits: it did not compute on the GPU"

# Per-step losses: CPU against GPU, relative difference at most 0.02.
checks=$((checks + 1))
paste <(grep -o '"loss": [0-9.e+-]*' "$WORK/cpu/metrics.jsonl" | cut -d' ' -f2) \
  <(grep -o '"loss": [0-9.e+-]*' "$WORK/gpu-a/metrics.jsonl" | cut -d' ' -f2) |
  awk -v steps=$STEPS '{ n++; d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d;
                         printf "step %d: cpu %s gpu %s (%.2e)\n", n, $1, $2, d }
       END { if (n != steps || worst > 0.02) { print "worst " worst " over " n " steps"; exit 1 } }' \
  >"$WORK/losses.txt" || fail "GPU loss outside 2% of the CPU's: $(tail -n 3 "$WORK/losses.txt")"
tail -n 1 "$WORK/losses.txt"

# zshard eval on the GPU: the CPU's loss within 1e-4 (one forward of a trained model).
expect_ok "$ZSHARD" eval --model "$WORK/cpu" --data "$DATA/tiny.txt" --device cpu
cpu_eval=$(cut -d' ' -f2 "$WORK/out.txt")
expect_ok "$ZSHARD" eval --model "$WORK/cpu" --data "$DATA/tiny.txt" --device cuda
gpu_eval=$(cut -d' ' -f2 "$WORK/out.txt")
checks=$((checks + 1))
awk -v c="$cpu_eval" -v g="$gpu_eval" 'BEGIN { d = (c - g) / c; if (d < 0) d = -d; exit !(d <= 1e-4) }' ||
  fail "zshard eval --device cuda: loss $gpu_eval, the CPU's $cpu_eval"

# The small model (deploy/configs/small-gpt.json, 6 x 384, 2 chunks of 8 x 256 tokens) for 200
# steps on the default corpus, GPU against CPU: after 200 steps of chaotic divergence the two
# runs are different trainings of the same model, so the band is on the curve, not on a step:
# each window of 20 steps' mean loss within 3% of the CPU run's.
# ZS_GPU_CORPUS=FILE: that text instead (a GPU machine's image may have too little under
# /usr/share/doc for deploy/corpus.sh).
if [ -n "${ZS_GPU_CORPUS:-}" ]; then
  cp "$ZS_GPU_CORPUS" "$WORK/corpus.txt"
else
  ZS_CORPUS_BYTES=2000000 bash "$(dirname "$0")/../../deploy/corpus.sh" "$WORK/corpus.txt"
fi
sed 's/"total_num_steps": 60/"total_num_steps": 200/' \
  "$(dirname "$0")/../../deploy/configs/small-gpt.json" >"$WORK/small.json"
# Its heads (hs 64) take the fused attention; a third run takes the reference one.
for dev in cpu cuda; do
  expect_ok "$ZSHARD" train --config "$WORK/small.json" --data "$WORK/corpus.txt" --steps 200 \
    --device $dev --out "$WORK/small-$dev"
done
expect_ok env ZS_CUDA_ATTENTION=reference "$ZSHARD" train --config "$WORK/small.json" \
  --data "$WORK/corpus.txt" --steps 200 --device cuda --out "$WORK/small-cuda-reference"
for gpu in cuda cuda-reference; do
  checks=$((checks + 1))
  paste <(grep -o '"loss": [0-9.e+-]*' "$WORK/small-cpu/metrics.jsonl" | cut -d' ' -f2) \
    <(grep -o '"loss": [0-9.e+-]*' "$WORK/small-$gpu/metrics.jsonl" | cut -d' ' -f2) |
    awk '{ c += $1; g += $2; n++
           if (n % 20 == 0) { d = (c - g) / c; if (d < 0) d = -d; if (d > worst) worst = d
                              printf "steps %d-%d: cpu %.4f gpu %.4f (%.2e)\n", n - 19, n, c / 20, g / 20, d
                              c = 0; g = 0 } }
         END { if (n != 200 || worst > 0.03) { print "worst " worst " over " n " steps"; exit 1 } }' \
    >"$WORK/small-losses-$gpu.txt" || fail "small model: $gpu loss curve outside 3% of the CPU's: $(cat "$WORK/small-losses-$gpu.txt")"
  echo "small model, $gpu:"
  cat "$WORK/small-losses-$gpu.txt"
done

# fp16 on the GPU (docs/precision.md: fp16 storage with fp32 accumulation, the weights rounded to
# fp16 and the loss scale carried by the backward, each chunk's gradient rounded before it is
# pushed): initial_scale_power 20 makes the first steps overflow and skip, the scale falls,
# then it trains; a launch with GPU workers gives the same bits.
python3 - "$DATA/tiny.json" "$WORK/fp16.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["fp16"] = {"enabled": True, "initial_scale_power": 20, "loss_scale_window": 3,
             "hysteresis": 2, "min_loss_scale": 1}
json.dump(c, open(sys.argv[2], "w"))
PY
expect_ok "$ZSHARD" train --config "$WORK/fp16.json" --data "$DATA/tiny.txt" --steps 10 \
  --device cuda --out "$WORK/fp16-train"
checks=$((checks + 1))
python3 - "$WORK/fp16-train/metrics.jsonl" <<'PY' || fail "fp16 on the GPU: no overflow and recovery (above)"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
flags = [l.get("overflow") for l in lines]
scales = [l.get("loss_scale") for l in lines]
print("fp16 on the GPU: overflow flags %s, scales %s" % (flags, scales))
ok = flags[0] is True and False in flags and scales[-1] < scales[0] and lines[-1]["loss"] < lines[0]["loss"]
sys.exit(0 if ok else 1)
PY
expect_ok "$ZSHARD" launch --config "$WORK/fp16.json" --data "$DATA/tiny.txt" --steps 10 \
  --servers 2 --workers 2 --device cuda --out "$WORK/fp16-launch"
checks=$((checks + 1))
cmp "$WORK/fp16-train/model.safetensors" "$WORK/fp16-launch/model.safetensors" ||
  fail "fp16: zshard launch --device cuda differs from zshard train --device cuda"

# bf16: the GPU's bf16 mode against itself, against the CPU's bf16 run, and in a launch.
python3 - "$DATA/tiny.json" "$WORK/bf16.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["bf16"] = {"enabled": True}
json.dump(c, open(sys.argv[2], "w"))
PY
for run in gpu-a gpu-b; do
  expect_ok "$ZSHARD" train --config "$WORK/bf16.json" --data "$DATA/tiny.txt" --steps $STEPS \
    --threads 2 --device cuda --out "$WORK/bf16-$run"
done
expect_ok "$ZSHARD" train --config "$WORK/bf16.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 2 --device cpu --out "$WORK/bf16-cpu"
checks=$((checks + 5))
cmp "$WORK/bf16-gpu-a/model.safetensors" "$WORK/bf16-gpu-b/model.safetensors" ||
  fail "bf16: zshard train --device cuda: two runs differ"
cmp -s "$WORK/bf16-gpu-a/model.safetensors" "$WORK/gpu-a/model.safetensors" &&
  fail "bf16: the GPU run wrote the fp32 GPU run's bits: bf16.enabled did not reach the model"
paste <(grep -o '"loss": [0-9.e+-]*' "$WORK/bf16-cpu/metrics.jsonl" | cut -d' ' -f2) \
  <(grep -o '"loss": [0-9.e+-]*' "$WORK/bf16-gpu-a/metrics.jsonl" | cut -d' ' -f2) |
  awk -v steps=$STEPS '{ n++; d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d;
                         printf "bf16 step %d: cpu %s gpu %s (%.2e)\n", n, $1, $2, d }
       END { if (n != steps || worst > 0.05) { print "worst " worst " over " n " steps"; exit 1 } }' \
  >"$WORK/bf16-losses.txt" || fail "bf16: GPU loss outside 5% of the CPU's: $(tail -n 3 "$WORK/bf16-losses.txt")"
tail -n 1 "$WORK/bf16-losses.txt"
expect_ok "$ZSHARD" launch --config "$WORK/bf16.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 2 --workers 2 --device cuda --log-level info --out "$WORK/bf16-launch"
cmp "$WORK/bf16-gpu-a/model.safetensors" "$WORK/bf16-launch/model.safetensors" ||
  fail "bf16: zshard launch --device cuda differs from zshard train --device cuda"
grep -q "bf16 storage with fp32 accumulation" "$WORK/bf16-launch/logs/worker-1.log" ||
  fail "bf16: worker 1 does not say its model stores bf16"
grep "GELU epilogue\|DGELU epilogue" "$WORK/bf16-launch/logs/worker-1.log" || true

expect_ok "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 2 --workers 2 --device cuda --log-level info --out "$WORK/launch"
checks=$((checks + 3))
cmp "$WORK/gpu-a/model.safetensors" "$WORK/launch/model.safetensors" ||
  fail "zshard launch --device cuda: model.safetensors differs from zshard train --device cuda's"
diff <(metrics_compared "$WORK/gpu-a/metrics.jsonl") <(metrics_compared "$WORK/launch/metrics.jsonl") ||
  fail "zshard launch --device cuda: metrics.jsonl differs from zshard train --device cuda's"
grep -q "compute on cuda:0" "$WORK/launch/logs/worker-1.log" ||
  fail "worker 1 does not say it computes on cuda:0"
checks=$((checks + 1))
grep -q "GPUDirect off (the transport is tcp, not rdma)" "$WORK/launch/logs/worker-1.log" ||
  fail "worker 1 does not say why GPUDirect is off: $(grep -i gpudirect "$WORK/launch/logs/worker-1.log")"
expect_fail "--gpudirect on: the transport is tcp, not rdma" "$ZSHARD" launch \
  --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 1 --servers 1 --workers 1 \
  --device cuda --gpudirect on --out "$WORK/gpudirect-on"

# The fused attention in train and launch: tiny with one head of 32.
python3 - "$DATA/tiny.json" "$WORK/tiny-hs32.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["model"]["n_head"] = 1
json.dump(c, open(sys.argv[2], "w"))
PY
for run in a b; do
  expect_ok env ZS_CUDA_ATTENTION=fused "$ZSHARD" train --config "$WORK/tiny-hs32.json" \
    --data "$DATA/tiny.txt" --steps $STEPS --threads 2 --device cuda --out "$WORK/fused-$run"
done
expect_ok env ZS_CUDA_ATTENTION=fused "$ZSHARD" launch --config "$WORK/tiny-hs32.json" \
  --data "$DATA/tiny.txt" --steps $STEPS --servers 2 --workers 2 --device cuda \
  --out "$WORK/fused-launch"
checks=$((checks + 2))
cmp "$WORK/fused-a/model.safetensors" "$WORK/fused-b/model.safetensors" ||
  fail "fused attention: two runs of zshard train --device cuda differ"
cmp "$WORK/fused-a/model.safetensors" "$WORK/fused-launch/model.safetensors" ||
  fail "fused attention: zshard launch --device cuda differs from zshard train --device cuda"
finish
