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
# glibc and CUDA's), which then goes first on LD_LIBRARY_PATH.  BUILD may also be the tar.xz
# that tests/gpu/pack.sh makes, unpacked here first (with its corpus.txt beside it for
# jobs.sh: ZS_GPU_CORPUS).  Where the programs find no cuBLASLt, the
# CUDA toolkit's lib64 and the Python wheels' nvidia/cublas/lib are searched for it.
#
# Each step runs under a time limit (ZS_GPU_STEP_TIMEOUT seconds, 300 by default; a step that
# hangs in the driver gets SIGKILL 10 s after SIGTERM), so that one hung kernel costs one
# step, not the machine's whole lease; with ZS_GPU_LOGS=DIR each step's output is also kept in
# DIR/STEP.log (tests/gpu/jobs.sh's work folder is BUILD/tests/gpu-jobs.work; with a tarball,
# its loss tables and outputs are kept as DIR/jobs.tgz before the unpacked build is removed).
# ZS_GPU_STEPS picks steps: kernels, step, model, jobs, bench (all by default), e.g.
# ZS_GPU_STEPS=kernels for a first short check on a machine not yet seen; sanitize (only when
# named) runs test_cuda_kernels under compute-sanitizer's memcheck and racecheck.
set -uo pipefail
keep_jobs() {
  local w=$build/tests/gpu-jobs.work
  [ -n "$logs" ] && [ -d "$w" ] || return 0
  (cd "$w" && find . -maxdepth 1 -name '*.txt' ! -name corpus.txt -print0 |
    xargs -0r tar -czf "$logs/jobs.tgz") || true
}
root=$(cd "$(dirname "$0")/../.." >/dev/null && pwd)
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "tests/gpu/run.sh: no nvidia-smi" >&2
limit=${ZS_GPU_STEP_TIMEOUT:-300}
logs=${ZS_GPU_LOGS:-}
steps=" ${ZS_GPU_STEPS:-kernels step model jobs bench} "
[ -n "$logs" ] && mkdir -p "$logs"
if [ $# -ge 1 ] && [ -f "$1" ]; then
  build=$(mktemp -d)
  # The unpacked build goes at exit; jobs.sh's loss tables and outputs (its *.txt but the
  # corpus) go to the logs first, as one jobs.tgz (a lent machine returns at most 8 files).
  trap 'keep_jobs; rm -rf "$build"' EXIT
  tar -xJf "$1" -C "$build" || exit 1
  corpus=$(dirname "$1")/corpus.txt
  if [ -z "${ZS_GPU_CORPUS:-}" ] && [ -f "$corpus" ]; then
    export ZS_GPU_CORPUS=$(cd "$(dirname "$corpus")" && pwd)/corpus.txt
  fi
elif [ $# -ge 1 ]; then
  build=$(cd "$1" >/dev/null && pwd) || exit 1
fi
if [ $# -ge 1 ]; then
  if [ -d "$build/lib" ]; then
    export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  # ldd's whole output first: `| grep -q` may close the pipe early, and pipefail then says no.
  if grep -q 'libcublas.*not found' <<<"$(ldd "$build/zshard" 2>&1)"; then
    wheel=$(python3 -c 'import nvidia.cublas as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null || true)
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $wheel; do
      if ls "$d"/libcublasLt.so.* >/dev/null 2>&1; then
        export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
        break
      fi
    done
  fi
  ldd "$build/zshard" | grep -E 'not found|libcublasLt|libcudart'
else
  build=$("$root/deploy/build.sh") || exit 1
  cmake -S "$root" -B "$build" -DZS_CUDA=ON >&2 || exit 1
  cmake --build "$build" -j "$(nproc)" --target test_cuda_kernels test_gpu_step test_model \
    zshard bench_gpu_step bench_attention >&2 || exit 1
fi
status=0
# step NAME CMD...: CMD under the time limit, its output also in $logs/NAME.log.
step() {
  local name=$1 rc=0
  shift
  echo "== $name ($(date -u +%T))"
  if [ -n "$logs" ]; then
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
    rc=${PIPESTATUS[0]}
  else
    timeout -k 10 "$limit" "$@" || rc=$?
  fi
  case $rc in
  0) ;;
  77) echo "tests/gpu/run.sh: $name found no CUDA device: this script needs a GPU" >&2 ;;
  124 | 137) echo "tests/gpu/run.sh: $name ran past ${limit} s and was stopped" >&2 ;;
  *) echo "tests/gpu/run.sh: $name failed (exit $rc)" >&2 ;;
  esac
  [ $rc -eq 0 ] || status=1
}
want() { [[ $steps == *" $1 "* ]]; }
want kernels && step test_cuda_kernels "$build/tests/test_cuda_kernels"
want step && step test_gpu_step "$build/tests/test_gpu_step"
want model && step test_model "$build/tests/test_model"
want jobs && step jobs bash "$root/tests/gpu/jobs.sh" "$build/zshard" "$build/tests/gpu-jobs.work"
# The GPU benchmarks: their figures go in the note; each fails only if it cannot run.
want bench && step bench_gpu_step "$build/bench/bench_gpu_step" 0 5
want bench && step bench_attention "$build/bench/bench_attention" 0 3
# Not by default (minutes: every kernel runs instrumented): test_cuda_kernels under
# compute-sanitizer, whose memcheck sees a read or write past an allocation that the test's
# comparisons cannot (a partial tile's), and racecheck a shared-memory race.
if want sanitize; then
  if command -v compute-sanitizer >/dev/null; then
    step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/test_cuda_kernels"
    step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$build/tests/test_cuda_kernels"
  else
    echo "tests/gpu/run.sh: sanitize: no compute-sanitizer on PATH" >&2
    status=1
  fi
fi
exit $status
