#!/usr/bin/env bash
# tests/gpu/run.sh: everything that needs a GPU, in one script for a machine that has one
# (docs/testing.md).  It builds the release build with the CUDA kernels required
# (-DZS_CUDA=ON, sm_80 and sm_90) and runs the GPU tests, where a skip (exit 77: no device) is
# a failure.  What it runs today: test_cuda_kernels (each CUDA kernel against its CPU kernel,
# with the tolerance table in tests/gpu/test_cuda_kernels.c, and twice for the same bits; the
# bf16 mode's GEMMs and the GELU epilogue likewise), test_gpu_step (a whole GPT-2 124M step
# against the CPU's, with the fused and with the reference attention, and in bf16 against the
# fp32 GPU step), test_model (the compute seam's CUDA model), tests/gpu/jobs.sh (zshard train
# --device cuda against itself and against the CPU, zshard launch --device cuda against it, in
# fp32, fp16 and bf16), then bench_gpu_step (fp32 and bf16) and bench_attention.
# Exit status 0 only if all passed.
#
# tests/gpu/run.sh [BUILD]: with BUILD, a release build with CUDA made on another machine, nothing
# is built: a lent GPU machine may have neither this project's Debian packages nor a network to
# fetch them (install-deps.sh, which deploy/build.sh runs, then fails before any test), and a
# build there would take minutes of its time.  BUILD needs zshard, tests/test_cuda_kernels,
# tests/test_gpu_step, tests/test_model, bench/bench_gpu_step and bench/bench_attention, and may
# hold lib/, the shared libraries they need that the GPU machine lacks (what ldd lists beside
# glibc and CUDA's), which then goes first on LD_LIBRARY_PATH.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." >/dev/null && pwd)
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "tests/gpu/run.sh: no nvidia-smi" >&2
if [ $# -ge 1 ]; then
  build=$(cd "$1" >/dev/null && pwd)
  if [ -d "$build/lib" ]; then
    export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
else
  build=$("$root/deploy/build.sh")
  cmake -S "$root" -B "$build" -DZS_CUDA=ON >&2
  cmake --build "$build" -j "$(nproc)" --target test_cuda_kernels test_gpu_step test_model zshard bench_gpu_step bench_attention >&2
fi
status=0
for t in test_cuda_kernels test_gpu_step test_model; do
  echo "== $t"
  rc=0
  "$build/tests/$t" || rc=$?
  if [ $rc -eq 77 ]; then
    echo "tests/gpu/run.sh: $t found no CUDA device: this script needs a GPU" >&2
    status=1
  elif [ $rc -ne 0 ]; then
    status=1
  fi
done
echo "== jobs.sh"
bash "$root/tests/gpu/jobs.sh" "$build/zshard" "$build/tests/gpu-jobs.work" || status=1
# The GPU benchmarks: their figures go in the note; each fails only if it cannot run.
echo "== bench_gpu_step"
"$build/bench/bench_gpu_step" 0 5 || status=1
echo "== bench_attention"
"$build/bench/bench_attention" 0 3 || status=1
exit $status
