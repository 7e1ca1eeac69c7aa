/*
 * bench_reduce: the passes over a whole gradient that the step's optimizer waits for, at GPT-2
 * 124M's size (123,702,528 floats, 4 MiB shards): the norm's sums of squares
 * (zs_sumsq_sharded, what zshard train and every server's partials run) and the addition of a
 * chunk into the accumulator (zs_accumulate, fp32; zs_accumulate_f16, an fp16 job's F16 push).
 *
 * The limit, measured in the same run on the same threads, is the memory's speed for the same
 * traffic: a plain sum of the floats in float (one read of the array in the same pattern as the
 * sums of squares) and a plain a += b (read two arrays, write one).  The
 * ratio is the limit's time over the figure's: 1 means the pass runs at the memory's speed.
 *
 * usage: bench_reduce [threads=2] [reps=5]
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/fp16.h"
#include "kernels/reduce.h"

#define N ((size_t)123702528)
#define SHARD ((size_t)1 << 20)

/* Sum of x in float over nt threads: one read of the array at the memory's speed, in the
 * pattern the sums of squares read it (four consecutive 16 KiB blocks at once, each a stream
 * of its own), with AVX and two accumulators a stream. */
__attribute__((target("avx"))) static float plain_sum(const float *x, size_t n, int nt)
{
    const size_t group = 4 * ZS_REDUCE_BLOCK, groups = n / group;
    float total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
        __m256 s[8];
        for (int j = 0; j < 8; j++)
            s[j] = _mm256_setzero_ps();
#pragma omp for schedule(dynamic, 16)
        for (size_t g = 0; g < groups; g++)
            for (size_t i = 0; i < ZS_REDUCE_BLOCK; i += 16)
                for (int b = 0; b < 4; b++) {
                    const float *p = x + g * group + (size_t)b * ZS_REDUCE_BLOCK + i;
                    s[2 * b] = _mm256_add_ps(s[2 * b], _mm256_loadu_ps(p));
                    s[2 * b + 1] = _mm256_add_ps(s[2 * b + 1], _mm256_loadu_ps(p + 8));
                }
        for (int j = 1; j < 8; j++)
            s[0] = _mm256_add_ps(s[0], s[j]);
        float l[8];
        _mm256_storeu_ps(l, s[0]);
        for (int j = 0; j < 8; j++)
            total += l[j];
    }
    return total;
}

static void plain_add(float *restrict a, const float *restrict b, size_t n, int nt)
{
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

int main(int argc, char **argv)
{
    int nt = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    if (nt < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_reduce [threads=2] [reps=5]\n");
        return 2;
    }
    float *x = malloc(N * sizeof *x), *acc = malloc(N * sizeof *acc);
    uint16_t *h = malloc(N * sizeof *h);
    if (!x || !acc || !h) {
        fprintf(stderr, "bench_reduce: out of memory for %zu floats\n", N);
        return 1;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t i = 0; i < N; i++) {
        x[i] = (float)(i % 1000) * 1e-3f - 0.5f;
        acc[i] = 0;
        h[i] = zs_f32_to_f16(x[i]);
    }
    double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
    volatile double sink = 0;
    for (int r = 0; r <= reps; r++) { /* the first round warms up */
        double t[6];
        t[0] = zs_now_s();
        sink += zs_sumsq_sharded(x, N, SHARD, nt);
        t[1] = zs_now_s();
        sink += plain_sum(x, N, nt);
        t[2] = zs_now_s();
        zs_accumulate(acc, x, N, nt);
        t[3] = zs_now_s();
        zs_accumulate_f16(acc, h, N, 0, nt);
        t[4] = zs_now_s();
        plain_add(acc, x, N, nt);
        t[5] = zs_now_s();
        for (int k = 0; r > 0 && k < 5; k++)
            if (t[k + 1] - t[k] < best[k])
                best[k] = t[k + 1] - t[k];
    }
    const double gb = N * 4 / 1e9;
    printf("bench_reduce: %zu floats, %d threads, best of %d\n", N, nt, reps);
    printf("  sums of squares (zs_sumsq_sharded)  %7.1f ms  %5.1f GB/s; plain float sum %7.1f ms "
           "(%.1f GB/s): ratio %.2f\n",
           best[0] * 1e3, gb / best[0], best[1] * 1e3, gb / best[1], best[1] / best[0]);
    printf("  acc += g (zs_accumulate)            %7.1f ms  %5.1f GB/s; plain a += b   %7.1f ms "
           "(%.1f GB/s): ratio %.2f\n",
           best[2] * 1e3, 3 * gb / best[2], best[4] * 1e3, 3 * gb / best[4], best[4] / best[2]);
    printf("  acc += fp16 g (zs_accumulate_f16)   %7.1f ms  %5.1f GB/s of traffic (2.5 x 4 bytes "
           "a float): ratio to the fp32 plain a += b %.2f\n",
           best[3] * 1e3, 2.5 * gb / best[3], best[4] / best[3]);
    printf("bench_reduce: sums of squares %.1f ms, limit %.1f ms, ratio %.2f\n", best[0] * 1e3,
           best[1] * 1e3, best[1] / best[0]);
    free(x);
    free(acc);
    free(h);
    return 0;
}
