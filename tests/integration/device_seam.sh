# The compute seam on the CPU (kernels/model.h): `--device cpu` is the default path itself, so
# zshard train and a zshard launch whose workers say --device cpu write the bits of a plain
# zshard train, and zshard eval --device cpu prints the default's loss; a bad device name is refused by every command that takes one, naming it; and
# where no GPU can be used (these build machines), --device cuda fails at start with a message
# that names the device, instead of training on the CPU.  (tests/gpu/jobs.sh runs the GPU side
# on a machine with one.)
source "$(dirname "$0")/lib.sh"
STEPS=3

expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --out "$WORK/plain"
expect_ok "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --threads 1 --device cpu --out "$WORK/cpu"
grep -q "forward and backward on cpu" "$WORK/err.txt" ||
  fail "zshard train --device cpu does not say where it computes: $(cat "$WORK/err.txt")"
checks=$((checks + 1))
cmp "$WORK/plain/model.safetensors" "$WORK/cpu/model.safetensors" ||
  fail "zshard train --device cpu: model.safetensors differs from the default's"

expect_ok "$ZSHARD" eval --model "$WORK/plain" --data "$DATA/tiny.txt" --threads 1
cp "$WORK/out.txt" "$WORK/eval-plain.txt"
expect_ok "$ZSHARD" eval --model "$WORK/plain" --data "$DATA/tiny.txt" --threads 1 --device cpu
checks=$((checks + 1))
grep -q '^loss [0-9]' "$WORK/out.txt" && cmp -s "$WORK/out.txt" "$WORK/eval-plain.txt" ||
  fail "zshard eval --device cpu: '$(cat "$WORK/out.txt")', the default gives '$(cat "$WORK/eval-plain.txt")'"

expect_ok "$ZSHARD" launch --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps $STEPS \
  --servers 2 --workers 2 --device cpu --log-level info --out "$WORK/launch"
checks=$((checks + 2))
cmp "$WORK/plain/model.safetensors" "$WORK/launch/model.safetensors" ||
  fail "zshard launch --device cpu: model.safetensors differs from zshard train's"
# Any worker: on a loaded machine one may still be registering when the 3 steps are done (seen
# under ctest -j4 on 2 cores: "stopped while registering").
grep -q "compute on cpu" "$WORK/launch/logs/"worker-*.log ||
  fail "no worker says where it computes: $(cat "$WORK/launch/logs/"worker-*.log)"

expect_fail 'device "gpu": expected cpu, cuda or cuda:N' "$ZSHARD" train --device gpu \
  --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 1 --out "$WORK/bad"
expect_fail 'device "gpu": expected cpu, cuda or cuda:N' "$ZSHARD" launch --device gpu \
  --config "$DATA/tiny.json" --data "$DATA/tiny.txt" --steps 1 --servers 1 --workers 1 \
  --out "$WORK/bad"
expect_fail 'device "cuda:x"' "$ZSHARD" worker --coord tcp://127.0.0.1:1 --device cuda:x

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "device_seam: a GPU is here; the no-GPU refusal is not checked (tests/gpu/jobs.sh)" >&2
else
  expect_fail "cuda:0" "$ZSHARD" train --config "$DATA/tiny.json" --data "$DATA/tiny.txt" \
    --steps 1 --out "$WORK/nogpu" --device cuda
  checks=$((checks + 1))
  [ ! -e "$WORK/nogpu/model.safetensors" ] || fail "--device cuda without a GPU wrote a model"
  expect_fail "cuda:1" "$ZSHARD" eval --model "$WORK/plain" --data "$DATA/tiny.txt" --device cuda:1
fi
finish
