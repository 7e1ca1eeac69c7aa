/*
 * bench_train_step: time of one `zshard train` step (forward + backward of every chunk,
 * accumulation, norm, AdamW) for GPT-2 124M (12 x 768, 12 heads, vocab 50257, B=4, T=64) and
 * a small model (6 x 384, 6 heads, vocab 256, B=8, T=256), on synthetic tokens.
 *
 * The limit measured in the same run is the peak sgemm rate of zs_sgemm (the same BLIS
 * micro-kernels) on the same threads (best of 1024^3 and 2048 x 768 x 768 products); the figure is
 * the step's achieved GFLOP/s (zs_gpt2_flops / step time).  The target, 3x faster than
 * llm.c's train_gpt2.c on this machine class (5,800 and 6,800 ms per step), is printed beside it.
 *
 * usage: bench_train_step [threads] [steps] [which: all|124m|small]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/data.h"
#include "common/rng.h"
#include "kernels/kernels.h"
#include "worker/trainer.h"

/* Best GFLOP/s of C = A B over a few repeats, m x k times k x n, on nt threads, through
 * zs_sgemm: the same BLIS micro-kernels the model's matmuls run. */
static double sgemm_gflops(int m, int n, int k, int nt)
{
    float *a = malloc(sizeof(float) * (size_t)m * (size_t)k);
    float *b = malloc(sizeof(float) * (size_t)k * (size_t)n);
    float *c = malloc(sizeof(float) * (size_t)m * (size_t)n);
    for (size_t i = 0; i < (size_t)m * (size_t)k; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)k * (size_t)n; i++)
        b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double t0 = zs_now_s();
        zs_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n, nt);
        double dt = zs_now_s() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * (double)m * (double)n * (double)k / best / 1e9;
}

typedef struct {
    const char *name;
    zs_model_config model;
    int b, t;
    double llmc_ms; /* llm.c train_gpt2.c on this machine class, from the issue */
} bench_case;

/* Runs the case; returns achieved GFLOP/s and sets *best_ms. */
static int run_case(const bench_case *bc, int threads, int steps, double *gflops, double *best_ms)
{
    zs_config cfg;
    zs_config_defaults(&cfg);
    cfg.model = bc->model;
    cfg.model.block_size = bc->t;
    cfg.micro_batch = bc->b;
    cfg.train_batch_size = bc->b;
    cfg.chunks = 1;
    zs_dataset ds = {0};
    ds.ntokens = 1 << 20;
    ds.tokens = malloc(ds.ntokens * sizeof *ds.tokens);
    for (size_t i = 0; i < ds.ntokens; i++)
        ds.tokens[i] = (uint16_t)(zs_rng_u64(1, 2, i) % (uint64_t)bc->model.vocab_size);
    ds.max_token = bc->model.vocab_size - 1;
    zs_trainer tr;
    if (zs_trainer_init(&tr, &cfg, &ds, threads, NULL) != ZS_OK) {
        fprintf(stderr, "bench_train_step: %s\n", zs_last_error());
        free(ds.tokens);
        return 1;
    }
    double best = 1e30, sum = 0;
    for (int s = 0; s <= steps; s++) {
        zs_step_stats st;
        if (zs_trainer_step(&tr, &st) != ZS_OK) {
            fprintf(stderr, "bench_train_step: %s\n", zs_last_error());
            zs_trainer_free(&tr);
            free(ds.tokens);
            return 1;
        }
        if (s == 0)
            continue; /* warm-up: first touch of the buffers */
        sum += st.seconds;
        if (st.seconds < best)
            best = st.seconds;
    }
    double flops = zs_gpt2_flops(&cfg.model, bc->b, bc->t);
    *gflops = flops / best / 1e9;
    *best_ms = best * 1e3;
    printf("%s: %zu params, B=%d T=%d, %d threads: step %.0f ms (mean %.0f ms over %d), "
           "%.1f GFLOP/s; llm.c reference %.0f ms, target <= %.0f ms, speedup %.2fx\n",
           bc->name, tr.tt.n_params, bc->b, bc->t, threads, best * 1e3, sum / steps * 1e3, steps,
           *gflops, bc->llmc_ms, bc->llmc_ms / 3.0, bc->llmc_ms / (best * 1e3));
    zs_trainer_free(&tr);
    free(ds.tokens);
    return 0;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int steps = argc > 2 ? atoi(argv[2]) : 5;
    const char *which = argc > 3 ? argv[3] : "all";
    if (threads < 1 || steps < 1) {
        fprintf(stderr, "usage: bench_train_step [threads] [steps] [all|124m|small]\n");
        return 2;
    }
    double p1 = sgemm_gflops(1024, 1024, 1024, threads);
    double p2 = sgemm_gflops(2048, 768, 768, threads);
    double peak = p1 > p2 ? p1 : p2;
    printf("sgemm peak (BLIS %s kernels, %d threads): 1024^3 %.1f GFLOP/s, 2048x768x768 %.1f "
           "GFLOP/s\n",
           zs_sgemm_config(), threads, p1, p2);
    bench_case cases[] = {
        {"gpt2-124m",
         {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257},
         4,
         64,
         5800},
        {"small", {.n_layer = 6, .n_head = 6, .n_embd = 384, .vocab_size = 256}, 8, 256, 6800},
    };
    double g[2] = {0}, ms[2] = {0};
    for (int i = 0; i < 2; i++) {
        if (strcmp(which, "all") != 0 && strcmp(which, i == 0 ? "124m" : "small") != 0)
            continue;
        if (run_case(&cases[i], threads, steps, &g[i], &ms[i]) != 0)
            return 1;
        printf("bench_train_step %s: %.1f GFLOP/s, sgemm peak %.1f GFLOP/s, ratio %.2f\n",
               cases[i].name, g[i], peak, g[i] / peak);
    }
    int last = strcmp(which, "small") == 0 ? 1 : 0;
    if (strcmp(which, "all") == 0)
        last = 0;
    printf("bench_train_step: %.1f GFLOP/s (%s, %.0f ms/step), sgemm peak %.1f GFLOP/s, "
           "ratio %.2f\n",
           g[last], cases[last].name, ms[last], peak, g[last] / peak);
    return 0;
}
