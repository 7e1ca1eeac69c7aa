# GPUDirect RDMA's choice (worker --gpudirect, docs/gpu.md) where it can be checked without a GPU
# or a NIC: a bad value is refused by both commands that take it, naming it; `on` with a worker
# that computes on the CPU fails at start, saying that GPUDirect needs a device; `auto` (the
# default) on the CPU changes nothing: no log line about it, the bits of a plain run.  The
# fallback lines on a GPU (not rdma, bf16/fp16, no dma-buf, the NIC's refusal) need a GPU, and
# the device path an RDMA-capable GPU host: neither is in tests/gpu (no NIC there).
source "$(dirname "$0")/lib.sh"
STEPS=2

expect_fail 'gpudirect "maybe": expected auto, on or off' "$ZSHARD" worker \
  --coord tcp://127.0.0.1:1 --gpudirect maybe
expect_fail 'gpudirect "maybe": expected auto, on or off' "$ZSHARD" launch --gpudirect maybe \
  --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 1 --servers 1 --workers 1 \
  --out "$WORK/bad"

expect_fail "--gpudirect on: the model computes on the host (cpu), not on a device" \
  "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 1 --workers 1 --device cpu --gpudirect on --out "$WORK/on"
checks=$((checks + 1))
[ ! -e "$WORK/on/model.safetensors" ] || fail "--gpudirect on on the CPU wrote a model"

expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/plain"
expect_ok "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 1 --workers 1 --device cpu --gpudirect auto --log-level info --out "$WORK/auto"
checks=$((checks + 2))
cmp "$WORK/plain/model.safetensors" "$WORK/auto/model.safetensors" ||
  fail "zshard launch --gpudirect auto on the CPU: model.safetensors differs from zshard train's"
! grep -q GPUDirect "$WORK/auto/logs/"worker-*.log ||
  fail "a CPU worker speaks of GPUDirect: $(grep GPUDirect "$WORK/auto/logs/"worker-*.log)"
finish
