/*
 * bench_adamw: AdamW (zs_adamw, the fast path) in parameters/s and bytes/s against a
 * STREAM-style triad (a = b + s*c on doubles) measured in the same run on the same threads.
 * AdamW's traffic is counted as 30 bytes per parameter: reads of p, m, v, g (16) and writes
 * of p, m, v (12) and the bf16 copy (2).  The triad counts 24 bytes per element, as STREAM.
 * Both arrays are initialized by the threads that later use them (first touch).
 *
 * usage: bench_adamw [threads] [million-params]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/adamw.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t n = (size_t)(argc > 2 ? atof(argv[2]) : 32) * 1000000;
    if (threads < 1 || n < 1000) {
        fprintf(stderr, "usage: bench_adamw [threads] [million-params]\n");
        return 2;
    }
    float *p = aligned_alloc(64, n * 4), *m = aligned_alloc(64, n * 4),
          *v = aligned_alloc(64, n * 4), *g = aligned_alloc(64, n * 4);
    uint16_t *b = aligned_alloc(64, n * 2);
    size_t nt = n * 30 / 24; /* triad elements moving as many bytes as AdamW */
    double *ta = aligned_alloc(64, nt * 8), *tb = aligned_alloc(64, nt * 8),
           *tc = aligned_alloc(64, nt * 8);
    if (!p || !m || !v || !g || !b || !ta || !tb || !tc) {
        fprintf(stderr, "bench_adamw: out of memory for %zu parameters\n", n);
        return 1;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        p[i] = 0.01f * (float)(i % 100);
        m[i] = 0.0f;
        v[i] = 0.0f;
        g[i] = 0.001f * (float)(i % 37) - 0.018f;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < nt; i++) {
        ta[i] = 0;
        tb[i] = 1.0 + (double)(i % 10);
        tc[i] = 2.0;
    }
    const int reps = 8;
    double best_adamw = 1e30, best_triad = 1e30;
    for (int r = 0; r < reps; r++) {
        zs_adamw_hparams hp = zs_adamw_hparams_make(1e-3, 0.9, 0.999, 1e-8, 0.01, r + 1, 1.0f);
        double t0 = now_s();
        zs_adamw(p, m, v, g, b, n, &hp, threads);
        double dt = now_s() - t0;
        if (r > 0 && dt < best_adamw)
            best_adamw = dt;
        double s = 3.0 + r;
        t0 = now_s();
#pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = 0; i < nt; i++)
            ta[i] = tb[i] + s * tc[i];
        dt = now_s() - t0;
        if (r > 0 && dt < best_triad)
            best_triad = dt;
    }
    double adamw_gbs = 30.0 * (double)n / best_adamw / 1e9;
    double triad_gbs = 24.0 * (double)nt / best_triad / 1e9;
    /* Keep the results alive so that nothing is optimized away. */
    volatile double sink = (double)p[n / 2] + ta[nt / 3] + b[n / 5];
    (void)sink;
    printf("adamw (%s, %d threads, %zu params): %.1f ms, %.3g params/s, %.2f GB/s\n",
           zs_adamw_isa(), threads, n, best_adamw * 1e3, (double)n / best_adamw, adamw_gbs);
    printf("triad (%d threads, %zu doubles): %.1f ms, %.2f GB/s\n", threads, nt, best_triad * 1e3,
           triad_gbs);
    printf("bench_adamw: %.2f GB/s, triad %.2f GB/s, ratio %.2f\n", adamw_gbs, triad_gbs,
           adamw_gbs / triad_gbs);
    free(p), free(m), free(v), free(g), free(b), free(ta), free(tb), free(tc);
    return 0;
}
