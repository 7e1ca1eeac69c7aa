/*
 * gpubench: what the GPU benchmarks share: the GEMM peak they hold their figures against,
 * measured in the same run on the same device.
 */
#ifndef ZS_BENCH_GPUBENCH_H
#define ZS_BENCH_GPUBENCH_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "kernels/cuda/cuda_kernels.h"

/* The device a benchmark was asked for (argv[1], 0 by default), made current; -1, said on stderr,
 * when there is no such CUDA device here. */
static inline int zs_bench_device(const char *name, int argc, char **argv)
{
    int dev = argc > 1 ? atoi(argv[1]) : 0, count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || dev < 0 || dev >= count) {
        fprintf(stderr, "%s: no CUDA device %d here\n", name, dev);
        return -1;
    }
    cudaSetDevice(dev);
    return dev;
}

/* TFLOP/s of out (n, n) = a (n, n) b (n, n) through cuBLASLt's fp32 path (bf16: bf16 operands,
 * fp32 accumulation), best of 5 after one warm-up; 0 when it cannot run. */
static inline double zs_bench_gemm_peak(int dev, int n, int bf16)
{
    cudaSetDevice(dev);
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess)
        return 0;
    zs_cuda_blas *blas = NULL;
    float *a = NULL, *b = NULL, *c = NULL;
    size_t bytes = (size_t)n * n * sizeof(float);
    double best = 0;
    if (zs_cuda_blas_open(s, &blas) != ZS_OK || cudaMalloc((void **)&a, bytes) != cudaSuccess ||
        cudaMalloc((void **)&b, bytes) != cudaSuccess ||
        cudaMalloc((void **)&c, bytes) != cudaSuccess)
        goto out;
    cudaMemsetAsync(a, 0, bytes, s);
    cudaMemsetAsync(b, 0, bytes, s);
    for (int r = 0; r < 6; r++) {
        cudaStreamSynchronize(s);
        double t0 = zs_now_s();
        zs_err e =
            bf16 ? zs_cuda_linear_forward_half(ZS_HALF_BF16, blas, c, (const zs_half16 *)(void *)a,
                                               (const zs_half16 *)(void *)b, NULL, n, n, n)
                 : zs_cuda_linear_forward(blas, c, a, b, NULL, n, n, n);
        if (e != ZS_OK)
            goto out;
        if (cudaStreamSynchronize(s) != cudaSuccess)
            goto out;
        double tf = 2.0 * n * n * (double)n / (zs_now_s() - t0) / 1e12;
        if (r > 0 && tf > best)
            best = tf;
    }
out:
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    if (blas)
        zs_cuda_blas_close(blas);
    cudaStreamDestroy(s);
    return best;
}

#endif
