/*
 * bench_adamw: AdamW (zs_adamw, the fast path) in parameters/s and bytes/s against a
 * STREAM-style triad (a = b + s*c on doubles) measured in the same run on the same threads.
 *
 * AdamW's traffic is counted as 30 bytes per parameter: reads of p, m, v, g (16) and writes
 * of p, m, v (12) and the bf16 copy (2).  The triad counts 24 bytes per element, as STREAM
 * does (it does not count the read-for-ownership of a), over arrays moving as many counted
 * bytes as AdamW's.  The ratio can exceed 1: AdamW's writes go to lines it has just read,
 * while every triad store first reads its line (write-allocate), so per line fetched AdamW
 * moves ~107 counted bytes and the triad 64; where a core's outstanding misses, not DRAM,
 * limit bandwidth (few cores), the ratio approaches 107/64.  Each figure is the best of several
 * timed repeats after a warm-up run. Every array is first touched by the thread that later works on
 * it, with zs_adamw's split, so pages sit near their thread where memory is NUMA.  Pin threads from
 * the environment (OMP_PROC_BIND=close OMP_PLACES=cores) for stable figures.
 *
 * usage: bench_adamw [threads [Mi-params [repeats]]]   (default 2 threads, 64 Mi, 10)
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "kernels/adamw.h"

/* This thread's range of [0, n) in zs_adamw's split: blocks of 64 elements, dealt out in
 * equal contiguous runs. */
static void thread_range(size_t n, size_t *lo, size_t *hi)
{
    size_t team = (size_t)omp_get_num_threads();
    size_t per = ((n + 63) / 64 + team - 1) / team * 64;
    *lo = (size_t)omp_get_thread_num() * per;
    *hi = *lo + per < n ? *lo + per : n;
    if (*lo > n)
        *lo = n;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double mi = argc > 2 ? atof(argv[2]) : 64;
    int reps = argc > 3 ? atoi(argv[3]) : 10;
    size_t n = (size_t)(mi * 1048576.0);
    if (threads < 1 || n < 65536 || reps < 1) {
        fprintf(stderr, "usage: bench_adamw [threads [Mi-params (>= 0.0625) [repeats]]]\n");
        return 2;
    }
    size_t nt = n * 30 / 24; /* triad elements moving as many counted bytes as AdamW */
    float *p = aligned_alloc(64, n * 4), *m = aligned_alloc(64, n * 4),
          *v = aligned_alloc(64, n * 4), *g = aligned_alloc(64, n * 4);
    uint16_t *b = aligned_alloc(64, n * 2);
    double *ta = aligned_alloc(64, nt * 8), *tb = aligned_alloc(64, nt * 8),
           *tc = aligned_alloc(64, nt * 8);
    if (!p || !m || !v || !g || !b || !ta || !tb || !tc) {
        fprintf(stderr, "bench_adamw: out of memory for %zu parameters\n", n);
        return 1;
    }
#pragma omp parallel num_threads(threads)
    {
        size_t lo, hi;
        thread_range(n, &lo, &hi);
        for (size_t i = lo; i < hi; i++) {
            p[i] = 0.01f * (float)(i % 100);
            m[i] = 0.0f;
            v[i] = 0.0f;
            g[i] = 0.001f * (float)(i % 37) - 0.018f;
            b[i] = 0;
        }
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < nt; i++) {
        ta[i] = 0;
        tb[i] = 1.0 + (double)(i % 10);
        tc[i] = 2.0;
    }
    /* Interleaved, so that both see the same machine state; repeat 0 is the warm-up. */
    double best_adamw = 1e30, best_triad = 1e30;
    for (int r = 0; r <= reps; r++) {
        zs_adamw_hparams hp = zs_adamw_hparams_make(1e-3, 0.9, 0.999, 1e-8, 0.01, r + 1, 1.0f);
        double t0 = zs_now_s();
        zs_adamw(p, m, v, g, b, n, &hp, threads);
        double dt = zs_now_s() - t0;
        if (r > 0 && dt < best_adamw)
            best_adamw = dt;
        double s = 3.0 + r;
        t0 = zs_now_s();
#pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = 0; i < nt; i++)
            ta[i] = tb[i] + s * tc[i];
        dt = zs_now_s() - t0;
        if (r > 0 && dt < best_triad)
            best_triad = dt;
    }
    double adamw_gbs = 30.0 * (double)n / best_adamw / 1e9;
    double triad_gbs = 24.0 * (double)nt / best_triad / 1e9;
    /* Use the results, so that nothing is optimized away. */
    volatile double sink = (double)p[n / 2] + ta[nt / 3] + b[n / 5];
    (void)sink;
    printf("adamw: %s, %d threads, %zu params (%.2f GiB), best of %d: %.2f ms\n", zs_adamw_isa(),
           threads, n, 18.0 * (double)n / 1073741824.0, reps, best_adamw * 1e3);
    printf("triad: %d threads, %zu doubles x 3 (%.2f GiB), best of %d: %.2f ms\n", threads, nt,
           24.0 * (double)nt / 1073741824.0, reps, best_triad * 1e3);
    printf("bench_adamw: %.3g params/s\n", (double)n / best_adamw);
    printf("bench_adamw: %.2f GB/s, triad %.2f GB/s, ratio %.2f\n", adamw_gbs, triad_gbs,
           adamw_gbs / triad_gbs);
    free(p), free(m), free(v), free(g), free(b), free(ta), free(tb), free(tc);
    return 0;
}
