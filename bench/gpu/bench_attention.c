/*
 * bench_attention: the CUDA attention kernels alone, at GPT-2 124M's attention shapes (NH = 12,
 * hs = 64, T = 1024, B = 4, 8, 16): the fused kernel (zs_cuda_attention_fused_*, what the model
 * uses) against the reference kernel (zs_cuda_attention_*, the T x T softmax stored), forward and
 * backward, each timed with CUDA events, best of `reps` after one warm-up.
 *
 * The figure is the fused forward + backward's time; the limit measured in the same run is the
 * reference kernel's time on the same inputs (ratio: how many times faster the fused one is),
 * and, as a compute bound, the time the attention's products would take at the fp32 GEMM peak
 * of cuBLASLt on this GPU (4096^3, best of 5): the usual count of 4 B NH T^2 hs flops forward and
 * twice that backward, halved for the causal mask (the backward's recomputation of the scores
 * not counted).  The last line: the fused time at B = 4, the reference's, their ratio.
 *
 * usage: bench_attention [DEVICE=0] [reps=3]
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/gpu/gpubench.h"
#include "common/clock.h"
#include "kernels/cuda/cuda_kernels.h"

enum { T = 1024, NH = 12, HS = 64, C = NH * HS };

typedef struct {
    int B;
    float *qkv, *dout, *out, *dqkv, *lse, *delta, *att, *datt;
} bufs;

/* Which pass: 0 fused forward, 1 fused backward, 2 reference forward, 3 reference backward. */
static zs_err pass(const bufs *b, int which)
{
    switch (which) {
    case 0:
        return zs_cuda_attention_fused_forward(b->out, b->lse, b->qkv, b->B, T, C, NH, NULL);
    case 1:
        return zs_cuda_attention_fused_backward(b->dqkv, b->delta, b->dout, b->qkv, b->out, b->lse,
                                                b->B, T, C, NH, NULL);
    case 2:
        return zs_cuda_attention_forward(b->out, b->att, b->qkv, b->B, T, C, NH, NULL);
    default:
        return zs_cuda_attention_backward(b->dqkv, b->datt, b->dout, b->qkv, b->att, b->B, T, C, NH,
                                          NULL);
    }
}

/* Best time in ms of `which` over reps runs after one warm-up (each backward after its own
 * forward, so that it reads that forward's saved values; only the pass itself is timed), or -1. */
static double time_ms(const bufs *b, int which, int reps)
{
    cudaEvent_t e0, e1;
    double best = -1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        return -1;
    for (int r = 0; r <= reps; r++) {
        if (which % 2 == 1 && pass(b, which - 1) != ZS_OK)
            goto fail;
        cudaEventRecord(e0, NULL);
        if (pass(b, which) != ZS_OK)
            goto fail;
        cudaEventRecord(e1, NULL);
        float ms = 0;
        if (cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            goto fail;
        if (r > 0 && (best < 0 || ms < best))
            best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
fail:
    fprintf(stderr, "bench_attention: pass %d at B %d: %s\n", which, b->B, zs_last_error());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return -1;
}

static float *dev_random(size_t n, uint64_t seed)
{
    float *h = malloc(n * sizeof *h), *d = NULL;
    if (!h)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        h[i] = (float)((seed >> 40) / (double)(1u << 24) * 2.0 - 1.0);
    }
    if (cudaMalloc((void **)&d, n * sizeof *d) != cudaSuccess ||
        cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        d = NULL;
    }
    free(h);
    return d;
}

static float *dev_zero(size_t n)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * sizeof *d) != cudaSuccess)
        return NULL;
    cudaMemset(d, 0, n * sizeof *d);
    return d;
}

int main(int argc, char **argv)
{
    int dev = zs_bench_device("bench_attention", argc, argv), reps = argc > 2 ? atoi(argv[2]) : 3;
    if (dev < 0)
        return 1;
    if (reps < 1)
        reps = 1;
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    double peak = zs_bench_gemm_peak(dev, 4096, 0);
    printf("GPU %d: %s (sm_%d%d); fp32 GEMM peak through cuBLASLt (4096^3): %.1f TFLOP/s\n", dev,
           prop.name, prop.major, prop.minor, peak);
    const int Bs[] = {4, 8, 16};
    double first_fused = -1, first_ref = -1;
    for (size_t k = 0; k < sizeof Bs / sizeof *Bs; k++) {
        bufs b = {.B = Bs[k]};
        size_t nq = (size_t)b.B * T * 3 * C, no = (size_t)b.B * T * C, nr = (size_t)b.B * NH * T;
        size_t na = nr * T;
        b.qkv = dev_random(nq, 0x9e3779b97f4a7c15ull);
        b.dout = dev_random(no, 0xbf58476d1ce4e5b9ull);
        b.out = dev_zero(no), b.dqkv = dev_zero(nq), b.lse = dev_zero(nr), b.delta = dev_zero(nr);
        b.att = dev_zero(na), b.datt = dev_zero(na);
        if (!b.qkv || !b.dout || !b.out || !b.dqkv || !b.lse || !b.delta || !b.att || !b.datt) {
            fprintf(stderr,
                    "bench_attention: B %d: out of device memory (the reference's att and "
                    "datt take %zu MiB each)\n",
                    b.B, na * sizeof(float) >> 20);
            return 1;
        }
        double ms[4];
        for (int w = 0; w < 4; w++)
            if ((ms[w] = time_ms(&b, w, reps)) < 0)
                return 1;
        double fused = ms[0] + ms[1], ref = ms[2] + ms[3];
        /* Causal: half of 4 B NH T^2 hs forward, of 8 B NH T^2 hs backward. */
        double flops = 6.0 * b.B * NH * (double)T * T * HS;
        double bound = peak > 0 ? flops / (peak * 1e12) * 1e3 : 0;
        printf("B=%2d T=%d NH=%d hs=%d: fused forward %.3f ms, backward %.3f ms; reference forward "
               "%.3f ms, backward %.3f ms; fused %.2fx faster; fused %.2f TFLOP/s, %.3f ms at the "
               "fp32 GEMM peak (%.2f of it)\n",
               b.B, T, NH, HS, ms[0], ms[1], ms[2], ms[3], ref / fused, flops / fused / 1e9, bound,
               bound / fused);
        if (k == 0)
            first_fused = fused, first_ref = ref;
        cudaFree(b.qkv), cudaFree(b.dout), cudaFree(b.out), cudaFree(b.dqkv), cudaFree(b.lse);
        cudaFree(b.delta), cudaFree(b.att), cudaFree(b.datt);
    }
    printf("bench_attention: fused %.3f ms (B=4, forward+backward), reference %.3f ms, ratio "
           "%.2f\n",
           first_fused, first_ref, first_ref / first_fused);
    return 0;
}
