/*
 * matmul: BLIS sgemm behind a row-major interface, and the linear layers built on it.
 *
 * Almost all of a training step's flops go through zs_sgemm.  BLIS takes a row and a column
 * stride for every operand, so a transposed operand is the same memory read with its strides
 * swapped and nothing is ever copied.
 *
 * Threads.  BLIS is always called on one thread.  A product on several threads is cut into
 * tiles, slices of C's rows or columns (whichever dimension is longer), and one OpenMP loop
 * hands the tiles to the threads as they come free (schedule dynamic); zs_sgemm_many puts
 * the tiles of several independent products (a linear layer's dinp and dweight) in the same
 * loop.  BLIS's own threading synchronizes its threads several times per 384-deep slice of
 * k (shared packed panels); on a machine whose cores are shared with other processes every
 * such barrier waits for a descheduled thread, and the products ran 2-5x slower than alone
 * (measured with a compile job on the 2 cores).  Tiles need one barrier per loop, and a
 * thread that lost its core only delays the tiles it holds.  The price is that each tile
 * packs the operand it shares with the other tiles again (TILES_PER_THREAD below).
 *
 * Determinism: a tile is the same BLIS algorithm on a sub-matrix: the k loop, its blocking
 * (which depends on k only) and the micro-kernel's order are those of the whole product, so
 * an element's value does not depend on the tiling, on which thread computed it, or on the
 * thread count (the tests check 1, 2 and 3 threads bitwise, and the bits are those of BLIS's
 * own threading).
 *
 * Micro-kernel choice.  BLIS 0.9 decides between its AVX-512 ("skx") and AVX2 ("haswell")
 * kernels by counting the CPU's FMA units from the Xeon SKU in the brand string.  Virtual
 * machines often report a bare "Intel(R) Xeon(R) Processor"; BLIS then falls back to haswell
 * and runs at half speed (measured: ~110 vs ~200 GFLOP/s on 2 cores for GPT-2's shapes).  So
 * when BLIS chose haswell on a CPU with the AVX-512 subset the skx kernels use, and the
 * library exposes its skx context, we pass that context to every call.  Only the static
 * libblis.a exposes it: the shared library hides bli_gks_lookup_id, which is therefore
 * declared weak here and is NULL there, leaving BLIS's own choice.  ZS_SGEMM_CONFIG=blis in
 * the environment keeps BLIS's choice regardless.  Each choice is deterministic; different
 * choices give different bits (different blockings), so every process of one job must make
 * the same one: the same binary on the same kind of CPU does.
 */
#include "kernels/kernels.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* blis.h defines hundreds of unused static functions with unused parameters.  CMake adds its
 * directory as a system one, which silences them; a plain -I (a hand-written compile line)
 * does not, so quiet them here as well. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wtype-limits"
#include <blis.h>
#pragma GCC diagnostic pop

/* Internal to BLIS: exported by libblis.a, hidden in libblis.so (weak: NULL there). */
extern cntx_t **bli_gks_lookup_id(arch_t id) __attribute__((weak));

/* Columns per block when summing over rows: a thread owns whole blocks. */
#define COL_BLOCK 64

/* Tiling of a product over threads (tiling_make): TILES_PER_THREAD tiles per thread along
 * the longer of C's two dimensions, each a multiple of TILE_ALIGN (the micro-kernel's 32
 * rows) and at least TILE_MIN wide.  Each extra tile packs the operand the tiles share once
 * more: the step's 15 product shapes, timed alone and interleaved on 2 threads (best of 8),
 * took 720 ms with 1 tile per thread, 752 ms with 2 and 736 ms with BLIS's own threads; with
 * another process on the cores, 1857, 1803, 1762 (4 per thread) and 5148 ms. */
#define TILES_PER_THREAD 1
#define TILE_ALIGN 32
#define TILE_MIN 64
#define MAX_BATCH 4

static cntx_t *sgemm_cntx; /* NULL: BLIS's own choice */
static const char *sgemm_config_name = "?";
static pthread_once_t sgemm_once = PTHREAD_ONCE_INIT;

static int cpu_has_skx_isa(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static void sgemm_choose(void)
{
    bli_init();
    arch_t id = bli_arch_query_id();
    sgemm_config_name = bli_arch_string(id);
    const char *env = getenv("ZS_SGEMM_CONFIG");
    if (env && strcmp(env, "blis") == 0)
        return;
    if (id == BLIS_ARCH_HASWELL && bli_gks_lookup_id && cpu_has_skx_isa()) {
        cntx_t **skx = bli_gks_lookup_id(BLIS_ARCH_SKX);
        if (skx && skx[BLIS_NAT]) {
            sgemm_cntx = skx[BLIS_NAT];
            sgemm_config_name = bli_arch_string(BLIS_ARCH_SKX);
        }
    }
}

const char *zs_sgemm_config(void)
{
    pthread_once(&sgemm_once, sgemm_choose);
    return sgemm_config_name;
}

int zs_kernel_threads(int threads)
{
    return threads > 0 ? threads : omp_get_max_threads();
}

/* One BLIS call on one thread: zs_sgemm's arguments, BLIS's strides. */
static void sgemm_blis(const zs_gemm *g, int threads)
{
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(threads, &rntm);
    /* Row-major A [m, lda]: row stride lda, column stride 1; A^T of A stored [k, lda]: the
     * other way round.  The same for B. */
    inc_t rs_a = g->trans_a ? 1 : g->lda, cs_a = g->trans_a ? g->lda : 1;
    inc_t rs_b = g->trans_b ? 1 : g->ldb, cs_b = g->trans_b ? g->ldb : 1;
    float alpha = g->alpha, beta = g->beta;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g->m, g->n, g->k, &alpha, (float *)g->a,
                 rs_a, cs_a, (float *)g->b, rs_b, cs_b, &beta, g->c, g->ldc, 1, sgemm_cntx, &rntm);
}

/* How a product is cut into tiles: `tiles` slices of `width` rows (split_m) or columns of C. */
typedef struct {
    int split_m, width, tiles;
} gemm_tiling;

static gemm_tiling tiling_make(const zs_gemm *g, int nt)
{
    gemm_tiling tl = {.split_m = g->m > g->n, .width = 0, .tiles = 1};
    int d = tl.split_m ? g->m : g->n;
    tl.width = d;
    if (nt <= 1 || d < 2 * TILE_MIN)
        return tl;
    int want = TILES_PER_THREAD * nt;
    int w = (d + want - 1) / want;
    w = (w + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
    tl.width = w < TILE_MIN ? TILE_MIN : w;
    tl.tiles = (d + tl.width - 1) / tl.width;
    return tl;
}

/* Tile t of g on the calling thread: the same product restricted to a slice of C's rows (A's
 * rows) or columns (B's columns), each of its elements computed exactly as in the whole. */
static void tile_run(const zs_gemm *g, const gemm_tiling *tl, int t)
{
    zs_gemm s = *g;
    int lo = t * tl->width, d = tl->split_m ? g->m : g->n;
    int len = d - lo < tl->width ? d - lo : tl->width;
    if (tl->split_m) {
        s.m = len;
        s.a = g->trans_a ? g->a + lo : g->a + (size_t)lo * g->lda;
        s.c = g->c + (size_t)lo * g->ldc;
        if (g->bias)
            for (int i = 0; i < len; i++)
                memcpy(s.c + (size_t)i * g->ldc, g->bias, (size_t)g->n * sizeof *g->bias);
    } else {
        s.n = len;
        s.b = g->trans_b ? g->b + (size_t)lo * g->ldb : g->b + lo;
        s.c = g->c + lo;
        if (g->bias)
            for (int i = 0; i < g->m; i++)
                memcpy(s.c + (size_t)i * g->ldc, g->bias + lo, (size_t)len * sizeof *g->bias);
    }
    if (g->bias)
        s.beta = 1.0f;
    sgemm_blis(&s, 1);
}

void zs_sgemm_many(const zs_gemm *g, int count, int threads)
{
    pthread_once(&sgemm_once, sgemm_choose);
    for (; count > MAX_BATCH; count -= MAX_BATCH, g += MAX_BATCH)
        zs_sgemm_many(g, MAX_BATCH, threads);
    int nt = zs_kernel_threads(threads);
    gemm_tiling tl[MAX_BATCH];
    int first[MAX_BATCH + 1];
    first[0] = 0;
    for (int i = 0; i < count; i++) {
        tl[i] = tiling_make(&g[i], nt);
        first[i + 1] = first[i] + tl[i].tiles;
    }
    int total = first[count];
    if (total == 1) { /* no OpenMP region: attention calls this ~300 times per layer */
        tile_run(&g[0], &tl[0], 0);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int t = 0; t < total; t++) {
        int i = 0;
        while (t >= first[i + 1])
            i++;
        tile_run(&g[i], &tl[i], t - first[i]);
    }
}

void zs_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc, int threads)
{
    zs_gemm g = {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL};
    zs_sgemm_many(&g, 1, threads);
}

void zs_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC, int threads)
{
    /* With a bias, each tile starts its rows of out at the bias and lets sgemm add into it
     * (beta 1): one write of the tile, just before the product reads it back from cache. */
    zs_gemm g = {0, 0, N, OC, C, 1.0f, inp, C, weight, OC, 0.0f, out, OC, bias};
    zs_sgemm_many(&g, 1, threads);
}

void zs_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC, int threads)
{
    zs_gemm g[2];
    int n = 0;
    if (dinp) /* (N, OC) x (OC, C): weight (C, OC) read transposed */
        g[n++] = (zs_gemm){0, 1, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C, NULL};
    /* (C, N) x (N, OC): inp (N, C) read transposed */
    g[n++] = (zs_gemm){1, 0, C, OC, N, 1.0f, inp, C, dout, OC, 0.0f, dweight, OC, NULL};
    zs_sgemm_many(g, n, threads);
    if (dbias)
        zs_bias_backward(dbias, dout, N, OC, threads);
}

void zs_bias_backward(float *dbias, const float *dout, int N, int OC, int threads)
{
    int nt = zs_kernel_threads(threads);
    int nblocks = (OC + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COL_BLOCK;
        int nc = OC - c0 < COL_BLOCK ? OC - c0 : COL_BLOCK;
        float acc[COL_BLOCK] = {0};
        for (int i = 0; i < N; i++) {
            const float *row = dout + (size_t)i * OC + c0;
            for (int c = 0; c < nc; c++)
                acc[c] += row[c];
        }
        memcpy(dbias + c0, acc, (size_t)nc * sizeof *acc);
    }
}
