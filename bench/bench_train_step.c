/*
 * bench_train_step: time of one `zshard train` step (forward + backward of every chunk,
 * accumulation, norm, AdamW) for GPT-2 124M (12 x 768, 12 heads, vocab 50257, B=4, T=64) and
 * a small model (6 x 384, 6 heads, vocab 256, B=8, T=256), on synthetic tokens.
 *
 * The figure is the step's achieved GFLOP/s (zs_gpt2_flops / best step time).  The limit,
 * measured in the same run right after the steps, is the sgemm peak: the best GFLOP/s of the
 * step's own products (its 15 distinct shapes, with their transposes: the layers' forward,
 * dinp and dweight products, lm_head's three) run alone through zs_sgemm on the same threads,
 * the same tiling and BLIS micro-kernels as the model's.  The same measurement gives the time
 * the step's products would take if each ran at its own best alone, printed as a share of the
 * step: the rest is the elementwise kernels, attention, the trainer's passes over the
 * gradient (accumulation, norm, AdamW) and the products' slowdown inside the step (weights
 * come from memory, not cache).  Then the step's pass over its parameters (gradient norm and
 * AdamW) is timed alone, and the ratio the step could reach with it is printed: with every
 * product at the peak, and with the products as fast as they run alone.  The targets: ratio
 * >= 0.9; 3x faster than llm.c's train_gpt2.c on this machine class (5,800 and 6,800 ms per step),
 * printed beside it.
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
#include "kernels/adamw.h"
#include "kernels/kernels.h"
#include "kernels/reduce.h"
#include "worker/trainer.h"

/* Seconds of the best of `reps` runs (after one warm-up) of one product through zs_sgemm on nt
 * threads: the same tiling and BLIS micro-kernels the model's products run. */
static double sgemm_best_s(int ta, int tb, int m, int n, int k, int nt, int reps)
{
    size_t sa = (size_t)m * k, sb = (size_t)k * n, sc = (size_t)m * n;
    float *a = malloc(sizeof(float) * sa), *b = malloc(sizeof(float) * sb);
    float *c = malloc(sizeof(float) * sc);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return 0;
    }
    for (size_t i = 0; i < sa; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < sb; i++)
        b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = zs_now_s();
        zs_sgemm(ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n, nt);
        double dt = zs_now_s() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/*
 * The limit: every distinct product of the model's step (N = B*T positions, C channels, V
 * vocabulary), with its transposes, timed alone through zs_sgemm on the same threads.
 * *peak is the best GFLOP/s among them, *alone_s the time all the step's products would take
 * at their own best (each shape's time times how often the step runs it).
 */
static void step_products(int N, int C, int V, int L, int nt, double *peak, const char **peak_name,
                          double *alone_s)
{
    const struct {
        const char *name;
        int ta, tb, m, n, k, count;
    } p[] = {
        {"qkv", 0, 0, N, 3 * C, C, L},
        {"attn proj", 0, 0, N, C, C, L},
        {"fc", 0, 0, N, 4 * C, C, L},
        {"fc proj", 0, 0, N, C, 4 * C, L},
        {"lm_head", 0, 1, N, V, C, 1},
        {"qkv dinp", 0, 1, N, C, 3 * C, L},
        {"attn proj dinp", 0, 1, N, C, C, L},
        {"fc dinp", 0, 1, N, C, 4 * C, L},
        {"fc proj dinp", 0, 1, N, 4 * C, C, L},
        {"qkv dweight", 1, 0, C, 3 * C, N, L},
        {"attn proj dweight", 1, 0, C, C, N, L},
        {"fc dweight", 1, 0, C, 4 * C, N, L},
        {"fc proj dweight", 1, 0, 4 * C, C, N, L},
        {"lm_head dinp", 0, 0, N, C, V, 1},
        {"lm_head dwte", 1, 0, V, C, N, 1},
    };
    *peak = 0;
    *alone_s = 0;
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) {
        double s =
            sgemm_best_s(p[i].ta, p[i].tb, p[i].m, p[i].n, p[i].k, nt, p[i].count > 1 ? 5 : 3);
        double g = 2.0 * p[i].m * p[i].n * p[i].k / s / 1e9;
        printf("  product %-18s %c%c m=%-6d n=%-6d k=%-6d x%-2d %7.1f GFLOP/s %7.2f ms\n",
               p[i].name, p[i].ta ? 'T' : 'N', p[i].tb ? 'T' : 'N', p[i].m, p[i].n, p[i].k,
               p[i].count, g, s * 1e3 * p[i].count);
        if (g > *peak) {
            *peak = g;
            *peak_name = p[i].name;
        }
        *alone_s += s * p[i].count;
    }
}

typedef struct {
    const char *name;
    zs_model_config model;
    int b, t;
    double llmc_ms; /* llm.c train_gpt2.c on this machine class, from the issue */
} bench_case;

/* Runs the case; returns achieved GFLOP/s and sets *best_ms. */
static int run_case(const bench_case *bc, int threads, int steps, double *gflops, double *best_ms,
                    double *peak)
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
    const char *peak_name = "?";
    double alone_s;
    step_products(bc->b * bc->t, bc->model.n_embd, bc->model.vocab_size, bc->model.n_layer, threads,
                  peak, &peak_name, &alone_s);
    printf("%s: sgemm peak (BLIS %s kernels, %d threads, the step's own product shapes): "
           "%.1f GFLOP/s (%s); the step's products alone %.0f ms, %.0f%% of the step\n",
           bc->name, zs_sgemm_config(), threads, *peak, peak_name, alone_s * 1e3,
           100 * alone_s / best);
    /* The ratio a step could reach with these kernels if everything but its products took no
     * time: the step's flops over the products' own time, against the peak. */
    printf("%s: with everything but the products free, the ratio would be %.2f (the products "
           "alone run at %.1f GFLOP/s)\n",
           bc->name, flops / alone_s / 1e9 / *peak, flops / alone_s / 1e9);
    /* The step's pass over the parameters, timed alone on the trainer's own buffers after its
     * steps (best of 3): the gradient's sum of squares and AdamW, as zs_trainer_step runs
     * them.  It is memory-bound (AdamW reads p, m, v, g and writes p, m, v: 28 bytes a
     * parameter), so no product speed shortens it; with every product at the peak and this
     * pass as measured, the step's ratio could reach at most the bound printed. */
    size_t n = tr.tt.total;
    double opt_s = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = zs_now_s();
        double ss = zs_sumsq_sharded(tr.acc, n, cfg.cluster.shard_bytes / sizeof(float), threads);
        zs_adamw_tensors(&tr.tt, 0, n, tr.params, tr.m, tr.v, tr.acc, NULL, ZS_HALF_BF16, 1e-9,
                         cfg.adamw.beta1, cfg.adamw.beta2, cfg.adamw.eps, cfg.adamw.weight_decay,
                         tr.step + 1 + r, (float)(1.0 / (1.0 + ss)), threads);
        double dt = zs_now_s() - t0;
        if (dt < opt_s)
            opt_s = dt;
    }
    double bound = flops / (flops / (*peak * 1e9) + opt_s) / 1e9 / *peak;
    printf("%s: the optimizer's pass (gradient norm + AdamW over %zu floats, memory-bound) %.0f "
           "ms alone, %.0f%% of the step; with every product at the peak and that pass, the "
           "ratio could reach at most %.2f; with the products as fast as alone and that pass, "
           "%.2f\n",
           bc->name, n, opt_s * 1e3, 100 * opt_s / best, bound,
           flops / (alone_s + opt_s) / 1e9 / *peak);
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
    bench_case cases[] = {
        {"gpt2-124m",
         {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257},
         4,
         64,
         5800},
        {"small", {.n_layer = 6, .n_head = 6, .n_embd = 384, .vocab_size = 256}, 8, 256, 6800},
    };
    double g[2] = {0}, ms[2] = {0}, pk[2] = {0};
    for (int i = 0; i < 2; i++) {
        if (strcmp(which, "all") != 0 && strcmp(which, i == 0 ? "124m" : "small") != 0)
            continue;
        if (run_case(&cases[i], threads, steps, &g[i], &ms[i], &pk[i]) != 0)
            return 1;
        printf("bench_train_step %s: %.1f GFLOP/s, sgemm peak %.1f GFLOP/s, ratio %.2f\n",
               cases[i].name, g[i], pk[i], g[i] / pk[i]);
    }
    int last = strcmp(which, "small") == 0 ? 1 : 0;
    if (strcmp(which, "all") == 0)
        last = 0;
    printf("bench_train_step: %.1f GFLOP/s (%s, %.0f ms/step), sgemm peak %.1f GFLOP/s, "
           "ratio %.2f (target 0.9)\n",
           g[last], cases[last].name, ms[last], pk[last], g[last] / pk[last]);
    return 0;
}
