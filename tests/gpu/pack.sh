#!/usr/bin/env bash
# tests/gpu/pack.sh [BUILD=build-gpu] [TARBALL=.gpu/build.tar.xz]: what a lent GPU machine needs
# to run tests/gpu/run.sh, made here (docs/testing.md, "A lent GPU machine").  The machine has
# the CUDA toolkit and driver but none of this project's Debian packages and no network, and a
# build there would cost its minutes.  So this builds the release build with the CUDA kernels
# (-DZS_CUDA=ON, sm_80 and sm_90) in BUILD, and packs the programs run.sh runs, stripped, with
# lib/: the shared libraries they load that are neither glibc's, the compiler runtime's
# (libstdc++, libgcc_s: the GPU image's are newer) nor cuBLAS's (the image has CUDA 13's, too
# large to carry), into TARBALL, a tar.xz of about 15 MB, and the small model's corpus beside
# it (corpus.txt).  `run.sh TARBALL` then runs it there.  Prints TARBALL's path; the build's
# output goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." >/dev/null && pwd)
build=${1:-$root/build-gpu}
tarball=${2:-$root/.gpu/build.tar.xz}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DZS_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=80;90" >&2
cmake --build "$build" -j "$(nproc)" --target zshard test_cuda_kernels test_gpu_step test_model \
  bench_gpu_step bench_attention >&2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/bench" "$stage/lib"
cp "$build/zshard" "$stage/"
cp "$build/tests/test_cuda_kernels" "$build/tests/test_gpu_step" "$build/tests/test_model" \
  "$stage/tests/"
cp "$build/bench/bench_gpu_step" "$build/bench/bench_attention" "$stage/bench/"
strip "$stage/zshard" "$stage"/tests/* "$stage"/bench/*
ldd "$stage/zshard" "$stage"/tests/* "$stage"/bench/* | awk '/=> \//{print $3}' | sort -u |
  while read -r lib; do
    case $(basename "$lib") in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libresolv.so* | ld-linux*) ;;
    libstdc++* | libgcc_s* | libcublas*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
    esac
  done
mkdir -p "$(dirname "$tarball")"
tar -cJf "$tarball" -C "$stage" .
# The small model's corpus for tests/gpu/jobs.sh, beside it: the GPU image may have too little
# text under /usr/share/doc for deploy/corpus.sh.  run.sh takes it from there.
ZS_CORPUS_BYTES=2000000 bash "$root/deploy/corpus.sh" "$(dirname "$tarball")/corpus.txt"
echo "$tarball"
