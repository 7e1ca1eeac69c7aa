/*
 * matmul: BLIS sgemm behind a row-major interface, and the linear layers built on it.
 *
 * Almost all of a training step's flops go through zs_sgemm.  BLIS takes a row and a column
 * stride for every operand, so a transposed operand is the same memory read with its strides
 * swapped and nothing is ever copied.  Each call gets its own rntm_t with the thread count
 * the caller asked for: the model's threads for the big layer products, 1 for the small
 * per-(batch, head) products that attention issues from inside its own OpenMP loop.
 *
 * Determinism: BLIS parallelizes the m and n loops of its algorithm and never the k loop,
 * and its micro-kernel computes every element of a tile the same way, so an element's value
 * does not depend on which thread computed it; the tests check 1 vs 2 threads bitwise.
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

void zs_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc, int threads)
{
    pthread_once(&sgemm_once, sgemm_choose);
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(zs_kernel_threads(threads), &rntm);
    /* Row-major A [m, lda]: row stride lda, column stride 1; A^T of A stored [k, lda]: the
     * other way round.  The same for B. */
    inc_t rs_a = trans_a ? 1 : lda, cs_a = trans_a ? lda : 1;
    inc_t rs_b = trans_b ? 1 : ldb, cs_b = trans_b ? ldb : 1;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, (float *)a, rs_a, cs_a,
                 (float *)b, rs_b, cs_b, &beta, c, ldc, 1, sgemm_cntx, &rntm);
}

void zs_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC, int threads)
{
    int nt = zs_kernel_threads(threads);
    float beta = 0.0f;
    if (bias) {
/* Start every row at the bias and let sgemm add into it (beta 1): one streaming write
 * instead of a read-modify-write pass after the product. */
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int i = 0; i < N; i++)
            memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof *bias);
        beta = 1.0f;
    }
    zs_sgemm(0, 0, N, OC, C, 1.0f, inp, C, weight, OC, beta, out, OC, nt);
}

void zs_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC, int threads)
{
    int nt = zs_kernel_threads(threads);
    if (dinp) /* (N, OC) x (OC, C): weight (C, OC) read transposed */
        zs_sgemm(0, 1, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C, nt);
    /* (C, N) x (N, OC): inp (N, C) read transposed */
    zs_sgemm(1, 0, C, OC, N, 1.0f, inp, C, dout, OC, 0.0f, dweight, OC, nt);
    if (dbias)
        zs_bias_backward(dbias, dout, N, OC, nt);
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
