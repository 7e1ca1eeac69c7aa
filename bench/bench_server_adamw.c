/*
 * bench_server_adamw: a partition server's optimizer step (zs_store_apply: AdamW over every
 * shard, tensor by tensor, with the bf16 copy) in parameters/s and GB/s, against a STREAM
 * triad on doubles measured in the same run on the same threads.  The store holds all shards
 * of GPT-2 124M (4 MiB shards, as the default config), so this is what one server holding the
 * whole model does per step.  Traffic is counted as 30 bytes per parameter, as bench_adamw.
 *
 * usage: bench_server_adamw [threads=2]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/benchutil.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/tensors.h"
#include "server/shardstore.h"

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1) {
        fprintf(stderr, "usage: bench_server_adamw [threads]\n");
        return 2;
    }
    zs_config cfg;
    zs_config_defaults(&cfg);
    cfg.model = ZS_BENCH_GPT2_124M;
    cfg.chunks = 1;
    cfg.micro_batch = cfg.train_batch_size = 1;
    zs_tensor_table tt;
    if (zs_tensors_gpt2(&cfg.model, &tt) != ZS_OK) {
        fprintf(stderr, "bench_server_adamw: %s\n", zs_last_error());
        return 1;
    }
    size_t sf = cfg.cluster.shard_bytes / 4;
    int n;
    zs_shard_range *r = zs_bench_shards(tt.total, sf, &n);
    zs_store *st;
    if (zs_store_create(&tt, &cfg, r, n, threads, &st) != ZS_OK) {
        fprintf(stderr, "bench_server_adamw: %s\n", zs_last_error());
        return 1;
    }
    zs_store_init_seed(st, 1);
    float *g = malloc(sf * sizeof *g);
    for (size_t i = 0; i < sf; i++)
        g[i] = 1e-3f * (float)((int)(i % 101) - 50);
    double best = 1e30;
    const int reps = 6;
    for (int rep = 0; rep < reps; rep++) {
        for (int i = 0; i < n; i++) {
            const char *why;
            zs_store_push(st, zs_store_version(st), 0, r[i].begin, r[i].end - r[i].begin, g, &why);
        }
        double t0 = zs_now_s();
        zs_store_apply(st, 1e-4, 1.0, 0);
        double dt = zs_now_s() - t0;
        if (rep > 0 && dt < best)
            best = dt;
    }
    /* The triad over as many bytes. */
    size_t nt = tt.n_params * 30 / 24;
    double *a = malloc(nt * 8), *b = malloc(nt * 8), *c = malloc(nt * 8);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < nt; i++) {
        a[i] = 0;
        b[i] = 1.0 + (double)(i % 7);
        c[i] = 2.0;
    }
    double tbest = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double s = 3.0 + rep, t0 = zs_now_s();
#pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = 0; i < nt; i++)
            a[i] = b[i] + s * c[i];
        double dt = zs_now_s() - t0;
        if (rep > 0 && dt < tbest)
            tbest = dt;
    }
    double gbs = 30.0 * (double)tt.n_params / best / 1e9;
    double tgbs = 24.0 * (double)nt / tbest / 1e9;
    volatile double sink = a[nt / 2];
    (void)sink;
    printf("server AdamW step (%d shards of %zu floats, %zu params, %d threads): %.1f ms, "
           "%.3g params/s, %.2f GB/s\n",
           n, sf, tt.n_params, threads, best * 1e3, (double)tt.n_params / best, gbs);
    printf("triad (%d threads, %zu doubles): %.1f ms, %.2f GB/s\n", threads, nt, tbest * 1e3, tgbs);
    printf("bench_server_adamw: %.2f GB/s, triad %.2f GB/s, ratio %.2f\n", gbs, tgbs, gbs / tgbs);
    zs_store_free(st);
    zs_tensors_free(&tt);
    free(r);
    free(g);
    free(a);
    free(b);
    free(c);
    return 0;
}
