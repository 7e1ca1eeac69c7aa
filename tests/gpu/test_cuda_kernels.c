/*
 * test_cuda_kernels: each CUDA kernel of kernels/cuda against its CPU kernel (kernels/kernels.h)
 * on the same inputs, element by element, with the tolerance of the table below; and each run
 * twice on the GPU, which must give the same bits (no atomics: cuda_kernels.h).
 *
 * Exits 77 (skipped) where no CUDA device is present: the build machines compile and link this
 * but have no GPU.  tests/gpu/run.sh runs it where one is, and there 77 is a failure.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/adamw.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "tests/unit/test.h"

/*
 * Tolerances: |gpu - cpu| <= abs + rel * |cpu|, per output.  Why each is what it is:
 * - gelu forward: CUDA's expf (2 ulp) against zs_expf (1 ulp), then a division: a few ulp.
 * - gelu backward d: the same exponential feeds a longer formula: a few more ulp.
 * - gelu dbias: a sum of N terms in the same row order on both, each term off by the above.
 * - layernorm out, mean, rstd: the row sums run in another order (32 lanes + a butterfly on
 *   the GPU, 8 lanes + a tree on the CPU): O(C) ulp of the sum in the worst case, far less
 *   in practice; out inherits rstd's error.
 * - layernorm dinp: two such row sums, then a difference of terms of similar size.
 * - layernorm dweight, dbias: sums of N terms in row order on both sides, each term carrying
 *   xhat's error.
 * - linear forward and backward: dot products of K = C, OC or N terms, summed by BLIS's
 *   micro-kernels on the CPU and cuBLASLt's tiles on the GPU in other orders (fp32 on both:
 *   CUBLAS_COMPUTE_32F, no TF32): about sqrt(K) ulp of the sum of |terms| each, which for
 *   inputs in [-1, 1] and K <= 3072 stays under 1e-4 relative plus a small absolute term for
 *   results near 0.  dbias: row sums in the same order on both.
 * - attention att: dot products of hs terms (sequential on the GPU, BLIS's order on the CPU),
 *   then the softmax (CUDA's expf, a float sum against the CPU's double): a few ulp of each
 *   probability plus an absolute term for the tiny ones.  out, dqkv: sums over up to T
 *   positions of such terms, in index order on the GPU and BLIS's on the CPU.
 * - fused attention out, dqkv, against the CPU kernel and against the CUDA reference kernel:
 *   the same sums as "attention out, dqkv" in other orders (key tiles of 32, a lane's channels,
 *   fixed butterflies), plus the online softmax's rescaling by exp(m_old - m_new) (one rounding
 *   per key tile a row crosses) and the division by the row sum at the end instead of
 *   normalizing P first (one rounding): a few ulp more, well inside the same bound.  The
 *   backward recomputes P as exp(s - lse); lse carries an absolute error of a few ulp of
 *   |lse| (below), which is a relative error of P of the same size.
 * - fused attention lse: against log(sum_j exp(s_j)) computed in double from the same inputs:
 *   the score's dot product over hs terms in fp32 (|s| up to a few for inputs in [-1, 1]) and
 *   CUDA's expf and logf: a few ulp of values up to log(T) + max s, i.e. about 1e-6 absolute.
 * - encoder forward, dwte, dwpe: the same additions in the same order on both (dwte's grouped
 *   by token with a stable sort, each token's positions still in order): 0, bitwise.
 * - cross-entropy loss: the row's sum of exponentials in double on both, in another order,
 *   and CUDA's expf: a few ulp of the loss.
 * - cross-entropy dlogits: softmax * dloss (dloss = 1/N) carries expf's error and the sum's;
 *   the absolute term covers entries near 0.
 * The bf16 mode (bf16 operands, fp32 accumulation):
 * - bf16 linear and lm_head products, against the CPU's fp32 product of the same bf16-rounded
 *   inputs: a product of two bf16 values is exact in fp32 (8 + 8 significant bits), so what is
 *   left is fp32 accumulation over K terms in another order, in tensor-core steps whose
 *   internal additions NVIDIA does not document as rounding to nearest: a few times the fp32
 *   mode's bound.  Still far below what a wrongly rounded operand or output would cost (a bf16
 *   rounding is 2^-9 relative, 2e-3).
 * - bf16 cross-entropy dlogits: the fp32 values rounded once to bf16: 2^-8 relative of the CPU
 *   value plus the fp32 bound; and bitwise the bf16 rounding of the GPU's own fp32 kernel.
 * - GELU epilogue against the separate kernels: both store bf16 roundings of fp32 values that
 *   differ by the GEMM's summation order and by cuBLASLt's GELU code against gelu.cu's (the same
 *   tanh formula): one bf16 unit in the last place (2^-7 relative) where the two fp32 values fall
 *   on either side of a rounding boundary, plus an absolute term near 0.  dbias: N such values
 *   summed, a few of them one unit apart.
 */
typedef struct {
    const char *what;
    double abs, rel;
} tolerance;

static const tolerance TOL_GELU_OUT = {"gelu forward", 1e-6, 4e-6};
static const tolerance TOL_GELU_D = {"gelu backward d", 1e-6, 1e-5};
static const tolerance TOL_GELU_DBIAS = {"gelu backward dbias", 1e-4, 1e-4};
static const tolerance TOL_LN_OUT = {"layernorm out", 1e-5, 1e-5};
static const tolerance TOL_LN_STATS = {"layernorm mean, rstd", 1e-6, 1e-5};
static const tolerance TOL_LN_DINP = {"layernorm dinp", 1e-5, 1e-4};
static const tolerance TOL_LN_DPARAM = {"layernorm dweight, dbias", 1e-4, 1e-4};
static const tolerance TOL_LINEAR = {"linear and lm_head products", 2e-4, 1e-4};
static const tolerance TOL_LINEAR_DBIAS = {"linear dbias", 1e-5, 1e-5};
static const tolerance TOL_ATT = {"attention att", 1e-7, 1e-5};
static const tolerance TOL_ATT_OUT = {"attention out, dqkv", 1e-5, 1e-4};
static const tolerance TOL_FUSED = {"fused attention out, dqkv", 1e-5, 1e-4};
static const tolerance TOL_FUSED_LSE = {"fused attention lse", 1e-5, 1e-6};
static const tolerance TOL_ENCODER = {"encoder out, dwte, dwpe", 0, 0};
static const tolerance TOL_CE_LOSS = {"cross-entropy loss", 1e-6, 1e-6};
static const tolerance TOL_CE_DLOGITS = {"cross-entropy dlogits", 1e-10, 1e-5};
static const tolerance TOL_LINEAR_BF16 = {"bf16 linear and lm_head products", 1e-3, 5e-4};
static const tolerance TOL_CE_DLOGITS_BF16 = {"bf16 cross-entropy dlogits", 1e-10, 4e-3};
static const tolerance TOL_GELU_EPILOGUE = {"GELU epilogue against the kernels", 2e-3, 8e-3};
static const tolerance TOL_GELU_EPILOGUE_DBIAS = {"GELU epilogue dbias", 5e-2, 1e-2};

/* Random values in [-scale, scale), from a fixed seed. */
static void fill(float *v, size_t n, float scale, uint64_t *state)
{
    for (size_t i = 0; i < n; i++) {
        *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
        v[i] = scale * ((float)(*state >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
    }
}

static float *dev(const float *host, size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float) + 1) != cudaSuccess)
        return NULL;
    if (host)
        cudaMemcpy(p, host, n * sizeof(float), cudaMemcpyHostToDevice);
    return p;
}

static float *host_of(const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    if (h)
        cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
}

/* Logits' rows ldl >= V floats apart, as the model pads them: the columns from V on hold
 * PAD_BITS, which no kernel may touch. */
#define PAD_BITS 0x7fc0bad0u

/* A device (N, ldl) matrix of host's (N, V) rows, its padding PAD_BITS. */
static float *dev_rows(const float *host, int N, int V, int ldl)
{
    float *d = dev(NULL, (size_t)N * ldl);
    if (!d)
        return NULL;
    float *h = malloc((size_t)N * ldl * sizeof *h);
    if (!h) {
        cudaFree(d);
        return NULL;
    }
    uint32_t pad = PAD_BITS;
    for (size_t i = 0; i < (size_t)N * ldl; i++)
        memcpy(&h[i], &pad, 4);
    for (int i = 0; host && i < N; i++)
        memcpy(h + (size_t)i * ldl, host + (size_t)i * V, (size_t)V * 4);
    cudaMemcpy(d, h, (size_t)N * ldl * 4, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

/* The (N, V) rows of a device (N, ldl) matrix, compact; checks (one check) that its padding
 * still holds PAD_BITS. */
static float *host_rows(const float *d, int N, int V, int ldl)
{
    float *h = host_of(d, (size_t)N * ldl), *out = malloc((size_t)N * V * sizeof *out);
    if (!h || !out) {
        free(h);
        free(out);
        return NULL;
    }
    size_t touched = 0;
    for (int i = 0; i < N; i++) {
        memcpy(out + (size_t)i * V, h + (size_t)i * ldl, (size_t)V * 4);
        for (int j = V; j < ldl; j++) {
            uint32_t bits;
            memcpy(&bits, &h[(size_t)i * ldl + j], 4);
            touched += bits != PAD_BITS;
        }
    }
    zs_test_checks++;
    if (touched) {
        zs_test_failures++;
        fprintf(stderr, "logits rows %d apart: %zu padding elements of %zu were written\n", ldl,
                touched, (size_t)N * (ldl - V));
    }
    free(h);
    return out;
}

/* Compares n values; prints the worst one and counts one check. */
static void compare(const tolerance *t, const float *gpu, const float *cpu, size_t n)
{
    size_t worst = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < n; i++) {
        double bound = t->abs + t->rel * fabs((double)cpu[i]);
        double excess = fabs((double)gpu[i] - (double)cpu[i]) - bound;
        if (excess > worst_excess || gpu[i] != gpu[i])
            worst_excess = gpu[i] != gpu[i] ? INFINITY : excess, worst = i;
    }
    zs_test_checks++;
    if (worst_excess > 0) {
        zs_test_failures++;
        fprintf(stderr, "%s: element %zu: gpu %.9g, cpu %.9g, beyond %g + %g |cpu|\n", t->what,
                worst, gpu[worst], cpu[worst], t->abs, t->rel);
    }
}

/* The GPU gives the same bits twice. */
static void same_bits(const char *what, const float *a, const float *b, size_t n)
{
    zs_test_checks++;
    if (memcmp(a, b, n * sizeof(float)) != 0) {
        zs_test_failures++;
        fprintf(stderr, "%s: two GPU runs differ\n", what);
    }
}

/* Pre-activations in [-scale, scale) plus a bias in [-0.5, 0.5). */
static void test_gelu(int N, int C, float scale)
{
    size_t n = (size_t)N * C;
    uint64_t st = 0x9e3779b97f4a7c15ull;
    float *pre = malloc(n * 4), *bias = malloc((size_t)C * 4), *d = malloc(n * 4);
    float *pre_cpu = malloc(n * 4), *out_cpu = malloc(n * 4), *dbias_cpu = malloc((size_t)C * 4);
    fill(pre, n, scale, &st);
    fill(bias, (size_t)C, 0.5f, &st);
    fill(d, n, 1.0f, &st);
    memcpy(pre_cpu, pre, n * 4);
    zs_bias_gelu_forward(pre_cpu, out_cpu, bias, N, C, 1);

    float *results[2][3] = {{0}};
    for (int run = 0; run < 2; run++) {
        float *g_pre = dev(pre, n), *g_out = dev(NULL, n), *g_bias = dev(bias, (size_t)C);
        float *g_d = dev(d, n), *g_dbias = dev(NULL, (size_t)C);
        CHECK(g_pre && g_out && g_bias && g_d && g_dbias);
        CHECK_OK(zs_cuda_bias_gelu_forward(g_pre, g_out, g_bias, N, C, NULL));
        CHECK_OK(zs_cuda_bias_gelu_backward(g_d, g_dbias, g_pre, N, C, NULL));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        results[run][0] = host_of(g_out, n);
        results[run][1] = host_of(g_d, n);
        results[run][2] = host_of(g_dbias, (size_t)C);
        cudaFree(g_pre), cudaFree(g_out), cudaFree(g_bias), cudaFree(g_d), cudaFree(g_dbias);
    }
    float *d_cpu = malloc(n * 4);
    memcpy(d_cpu, d, n * 4);
    zs_bias_gelu_backward(d_cpu, dbias_cpu, pre_cpu, N, C, 1);
    compare(&TOL_GELU_OUT, results[0][0], out_cpu, n);
    compare(&TOL_GELU_D, results[0][1], d_cpu, n);
    compare(&TOL_GELU_DBIAS, results[0][2], dbias_cpu, (size_t)C);
    same_bits("gelu forward", results[0][0], results[1][0], n);
    same_bits("gelu backward d", results[0][1], results[1][1], n);
    same_bits("gelu backward dbias", results[0][2], results[1][2], (size_t)C);
    for (int run = 0; run < 2; run++)
        for (int k = 0; k < 3; k++)
            free(results[run][k]);
    free(pre), free(bias), free(d), free(pre_cpu), free(out_cpu), free(dbias_cpu), free(d_cpu);
}

static void test_layernorm(int N, int C)
{
    size_t n = (size_t)N * C;
    uint64_t st = 0x2545f4914f6cdd1dull;
    float *a = malloc(n * 4), *b = malloc(n * 4), *w = malloc((size_t)C * 4);
    float *bi = malloc((size_t)C * 4), *dout = malloc(n * 4), *dinp0 = malloc(n * 4);
    fill(a, n, 2.0f, &st);
    fill(b, n, 2.0f, &st);
    fill(w, (size_t)C, 1.0f, &st);
    fill(bi, (size_t)C, 0.5f, &st);
    fill(dout, n, 1.0f, &st);
    fill(dinp0, n, 0.1f, &st); /* dinp is +=: start from something */

    /* CPU: the fused residual forward, then the backward. */
    float *res = malloc(n * 4), *out = malloc(n * 4), *mean = malloc((size_t)N * 4);
    float *rstd = malloc((size_t)N * 4), *dinp = malloc(n * 4), *dw = malloc((size_t)C * 4);
    float *db = malloc((size_t)C * 4);
    zs_residual_layernorm_forward(res, out, mean, rstd, a, b, w, bi, N, C, 1);
    memcpy(dinp, dinp0, n * 4);
    zs_layernorm_backward(dinp, dw, db, dout, res, w, mean, rstd, N, C, 1);

    float *r[2][6] = {{0}};
    for (int run = 0; run < 2; run++) {
        float *g_a = dev(a, n), *g_b = dev(b, n), *g_w = dev(w, (size_t)C);
        float *g_bi = dev(bi, (size_t)C), *g_out = dev(NULL, n), *g_mean = dev(NULL, (size_t)N);
        float *g_rstd = dev(NULL, (size_t)N), *g_dout = dev(dout, n), *g_dinp = dev(dinp0, n);
        float *g_dw = dev(NULL, (size_t)C), *g_db = dev(NULL, (size_t)C);
        CHECK(g_a && g_b && g_w && g_bi && g_out && g_mean && g_rstd && g_dout && g_dinp && g_dw &&
              g_db);
        /* res aliases inp1, as the model calls it. */
        CHECK_OK(zs_cuda_residual_layernorm_forward(g_a, g_out, g_mean, g_rstd, g_a, g_b, g_w, g_bi,
                                                    N, C, NULL));
        CHECK_OK(zs_cuda_layernorm_backward(g_dinp, g_dw, g_db, g_dout, g_a, g_w, g_mean, g_rstd, N,
                                            C, NULL));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        r[run][0] = host_of(g_out, n);
        r[run][1] = host_of(g_mean, (size_t)N);
        r[run][2] = host_of(g_rstd, (size_t)N);
        r[run][3] = host_of(g_dinp, n);
        r[run][4] = host_of(g_dw, (size_t)C);
        r[run][5] = host_of(g_db, (size_t)C);
        cudaFree(g_a), cudaFree(g_b), cudaFree(g_w), cudaFree(g_bi), cudaFree(g_out);
        cudaFree(g_mean), cudaFree(g_rstd), cudaFree(g_dout), cudaFree(g_dinp), cudaFree(g_dw);
        cudaFree(g_db);
    }
    compare(&TOL_LN_OUT, r[0][0], out, n);
    compare(&TOL_LN_STATS, r[0][1], mean, (size_t)N);
    compare(&TOL_LN_STATS, r[0][2], rstd, (size_t)N);
    compare(&TOL_LN_DINP, r[0][3], dinp, n);
    compare(&TOL_LN_DPARAM, r[0][4], dw, (size_t)C);
    compare(&TOL_LN_DPARAM, r[0][5], db, (size_t)C);
    static const char *names[6] = {"layernorm out",  "layernorm mean",    "layernorm rstd",
                                   "layernorm dinp", "layernorm dweight", "layernorm dbias"};
    size_t sizes[6] = {n, (size_t)N, (size_t)N, n, (size_t)C, (size_t)C};
    for (int k = 0; k < 6; k++) {
        same_bits(names[k], r[0][k], r[1][k], sizes[k]);
        free(r[0][k]), free(r[1][k]);
    }
    free(a), free(b), free(w), free(bi), free(dout), free(dinp0), free(res), free(out);
    free(mean), free(rstd), free(dinp), free(dw), free(db);
}

static int32_t *dev_ids(const int32_t *host, size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(int32_t) + 1) != cudaSuccess)
        return NULL;
    cudaMemcpy(p, host, n * sizeof(int32_t), cudaMemcpyHostToDevice);
    return p;
}

/* Token ids in [0, V), many repeated (the backward's scatter must sum them in order). */
static void fill_ids(int32_t *ids, size_t n, int V, uint64_t *state)
{
    for (size_t i = 0; i < n; i++) {
        *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
        ids[i] = (int32_t)(*state % (uint64_t)(V < 16 ? V : 16));
    }
}

static void test_encoder(int B, int T, int C, int V)
{
    size_t n = (size_t)B * T * C, nbt = (size_t)B * T;
    uint64_t st = 0x853c49e6748fea9bull;
    int32_t *ids = malloc(nbt * sizeof *ids);
    float *wte = malloc((size_t)V * C * 4), *wpe = malloc((size_t)T * C * 4);
    float *dout = malloc(n * 4), *dwte0 = malloc((size_t)V * C * 4);
    fill_ids(ids, nbt, V, &st);
    fill(wte, (size_t)V * C, 1.0f, &st);
    fill(wpe, (size_t)T * C, 1.0f, &st);
    fill(dout, n, 1.0f, &st);
    fill(dwte0, (size_t)V * C, 0.5f, &st); /* dwte is +=: lm_head's part first */
    float *out = malloc(n * 4), *dwte = malloc((size_t)V * C * 4),
          *dwpe = malloc((size_t)T * C * 4);
    zs_encoder_forward(out, ids, wte, wpe, B, T, C, 1);
    memcpy(dwte, dwte0, (size_t)V * C * 4);
    zs_encoder_backward(dwte, dwpe, dout, ids, B, T, C, 1);

    int32_t *g_ids = dev_ids(ids, nbt);
    float *g_wte = dev(wte, (size_t)V * C), *g_wpe = dev(wpe, (size_t)T * C), *g_out = dev(NULL, n);
    float *g_dout = dev(dout, n), *g_dwte = dev(dwte0, (size_t)V * C);
    float *g_dwpe = dev(NULL, (size_t)T * C);
    CHECK(g_ids && g_wte && g_wpe && g_out && g_dout && g_dwte && g_dwpe);
    CHECK_OK(zs_cuda_encoder_forward(g_out, g_ids, g_wte, g_wpe, B, T, C, NULL));
    CHECK_OK(zs_cuda_encoder_backward(g_dwte, g_dwpe, g_dout, g_ids, B, T, C, NULL));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    float *h_out = host_of(g_out, n), *h_dwte = host_of(g_dwte, (size_t)V * C);
    float *h_dwpe = host_of(g_dwpe, (size_t)T * C);
    compare(&TOL_ENCODER, h_out, out, n);
    compare(&TOL_ENCODER, h_dwte, dwte, (size_t)V * C);
    compare(&TOL_ENCODER, h_dwpe, dwpe, (size_t)T * C);
    cudaFree(g_ids), cudaFree(g_wte), cudaFree(g_wpe), cudaFree(g_out), cudaFree(g_dout);
    cudaFree(g_dwte), cudaFree(g_dwpe);
    free(ids), free(wte), free(wpe), free(dout), free(dwte0), free(out), free(dwte), free(dwpe);
    free(h_out), free(h_dwte), free(h_dwpe);
}

/* ldl: the logits' row stride on the GPU (>= V). */
static void test_crossentropy(int N, int V, int ldl)
{
    size_t n = (size_t)N * V;
    uint64_t st = 0xda942042e4dd58b5ull;
    float *logits = malloc(n * 4), *cpu = malloc(n * 4), *losses = malloc((size_t)N * 4);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    fill(logits, n, 8.0f, &st);
    for (int i = 0; i < N; i++)
        targets[i] = (int32_t)((size_t)i * 7919 % (size_t)V);
    memcpy(cpu, logits, n * 4);
    zs_crossentropy_fused(cpu, losses, targets, N, V, 1.0f / (float)N, 1);

    float *r[2][2] = {{0}};
    for (int run = 0; run < 2; run++) {
        float *g_logits = dev_rows(logits, N, V, ldl), *g_losses = dev(NULL, (size_t)N);
        int32_t *g_targets = dev_ids(targets, (size_t)N);
        CHECK(g_logits && g_losses && g_targets);
        CHECK_OK(zs_cuda_crossentropy_fused(g_logits, ldl, g_losses, g_targets, N, V,
                                            1.0f / (float)N, NULL));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        r[run][0] = host_of(g_losses, (size_t)N);
        r[run][1] = host_rows(g_logits, N, V, ldl);
        cudaFree(g_logits), cudaFree(g_losses), cudaFree(g_targets);
    }
    compare(&TOL_CE_LOSS, r[0][0], losses, (size_t)N);
    compare(&TOL_CE_DLOGITS, r[0][1], cpu, n);
    same_bits("cross-entropy loss", r[0][0], r[1][0], (size_t)N);
    same_bits("cross-entropy dlogits", r[0][1], r[1][1], n);
    for (int run = 0; run < 2; run++)
        free(r[run][0]), free(r[run][1]);
    free(logits), free(cpu), free(losses), free(targets);
}

/* ldl: the logits' row stride on the GPU (>= V). */
static void test_lm_head(int N, int C, int V, int ldl)
{
    size_t nin = (size_t)N * C, nw = (size_t)V * C, nl = (size_t)N * V;
    uint64_t st = 0x3c6ef372fe94f82bull;
    float *inp = malloc(nin * 4), *wte = malloc(nw * 4), *dl = malloc(nl * 4);
    fill(inp, nin, 1.0f, &st);
    fill(wte, nw, 0.1f, &st);
    fill(dl, nl, 0.01f, &st);
    float *logits = malloc(nl * 4), *dinp = malloc(nin * 4), *dwte = malloc(nw * 4);
    zs_lm_head_forward(logits, inp, wte, N, C, V, 1);
    zs_lm_head_backward(dinp, dwte, dl, inp, wte, N, C, V, 1);
    zs_cuda_blas *blas = NULL;
    CHECK_OK(zs_cuda_blas_open(NULL, &blas));
    if (blas) {
        float *g_inp = dev(inp, nin), *g_wte = dev(wte, nw), *g_dl = dev_rows(dl, N, V, ldl);
        float *g_logits = dev_rows(NULL, N, V, ldl), *g_dinp = dev(NULL, nin);
        float *g_dwte = dev(NULL, nw);
        CHECK(g_inp && g_wte && g_dl && g_logits && g_dinp && g_dwte);
        CHECK_OK(zs_cuda_lm_head_forward(blas, g_logits, ldl, g_inp, g_wte, N, C, V));
        CHECK_OK(zs_cuda_lm_head_backward(blas, g_dinp, g_dwte, g_dl, ldl, g_inp, g_wte, N, C, V));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        float *h_logits = host_rows(g_logits, N, V, ldl), *h_dinp = host_of(g_dinp, nin);
        float *h_dwte = host_of(g_dwte, nw);
        compare(&TOL_LINEAR, h_logits, logits, nl);
        compare(&TOL_LINEAR, h_dinp, dinp, nin);
        compare(&TOL_LINEAR, h_dwte, dwte, nw);
        /* Three shapes (the forward, the backward's two), each asked of the heuristic once: the
         * same products again add none, and run the same algorithms, so the same bits. */
        CHECK(zs_cuda_blas_shapes(blas) == 3);
        CHECK(cudaMemset2D(g_logits, (size_t)ldl * 4, 0xff, (size_t)V * 4, (size_t)N) ==
              cudaSuccess);
        CHECK_OK(zs_cuda_lm_head_forward(blas, g_logits, ldl, g_inp, g_wte, N, C, V));
        CHECK_OK(zs_cuda_lm_head_backward(blas, g_dinp, g_dwte, g_dl, ldl, g_inp, g_wte, N, C, V));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        CHECK(zs_cuda_blas_shapes(blas) == 3);
        float *again = host_rows(g_logits, N, V, ldl), *dinp2 = host_of(g_dinp, nin);
        float *dwte2 = host_of(g_dwte, nw);
        CHECK(again && memcmp(again, h_logits, nl * 4) == 0);
        CHECK(dinp2 && memcmp(dinp2, h_dinp, nin * 4) == 0);
        CHECK(dwte2 && memcmp(dwte2, h_dwte, nw * 4) == 0);
        free(again), free(dinp2), free(dwte2);
        free(h_logits), free(h_dinp), free(h_dwte);
        cudaFree(g_inp), cudaFree(g_wte), cudaFree(g_dl), cudaFree(g_logits), cudaFree(g_dinp);
        cudaFree(g_dwte);
    }
    zs_cuda_blas_close(blas);
    free(inp), free(wte), free(dl), free(logits), free(dinp), free(dwte);
}

static void test_linear(int N, int C, int OC)
{
    size_t nin = (size_t)N * C, nw = (size_t)C * OC, nout = (size_t)N * OC;
    uint64_t st = 0x94d049bb133111ebull;
    float *inp = malloc(nin * 4), *w = malloc(nw * 4), *bias = malloc((size_t)OC * 4);
    float *dout = malloc(nout * 4);
    fill(inp, nin, 1.0f, &st);
    fill(w, nw, 1.0f, &st);
    fill(bias, (size_t)OC, 1.0f, &st);
    fill(dout, nout, 1.0f, &st);
    float *out = malloc(nout * 4), *dinp = malloc(nin * 4), *dw = malloc(nw * 4);
    float *db = malloc((size_t)OC * 4);
    zs_linear_forward(out, inp, w, bias, N, C, OC, 1);
    zs_linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, 1);

    zs_cuda_blas *blas = NULL;
    CHECK_OK(zs_cuda_blas_open(NULL, &blas));
    float *r[2][4] = {{0}};
    for (int run = 0; blas && run < 2; run++) {
        float *g_inp = dev(inp, nin), *g_w = dev(w, nw), *g_bias = dev(bias, (size_t)OC);
        float *g_dout = dev(dout, nout), *g_out = dev(NULL, nout), *g_dinp = dev(NULL, nin);
        float *g_dw = dev(NULL, nw), *g_db = dev(NULL, (size_t)OC);
        CHECK(g_inp && g_w && g_bias && g_dout && g_out && g_dinp && g_dw && g_db);
        CHECK_OK(zs_cuda_linear_forward(blas, g_out, g_inp, g_w, g_bias, N, C, OC));
        CHECK_OK(zs_cuda_linear_backward(blas, g_dinp, g_dw, g_db, g_dout, g_inp, g_w, N, C, OC));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        r[run][0] = host_of(g_out, nout);
        r[run][1] = host_of(g_dinp, nin);
        r[run][2] = host_of(g_dw, nw);
        r[run][3] = host_of(g_db, (size_t)OC);
        cudaFree(g_inp), cudaFree(g_w), cudaFree(g_bias), cudaFree(g_dout), cudaFree(g_out);
        cudaFree(g_dinp), cudaFree(g_dw), cudaFree(g_db);
    }
    if (blas) {
        compare(&TOL_LINEAR, r[0][0], out, nout);
        compare(&TOL_LINEAR, r[0][1], dinp, nin);
        compare(&TOL_LINEAR, r[0][2], dw, nw);
        compare(&TOL_LINEAR_DBIAS, r[0][3], db, (size_t)OC);
        static const char *names[4] = {"linear out", "linear dinp", "linear dweight",
                                       "linear dbias"};
        size_t sizes[4] = {nout, nin, nw, (size_t)OC};
        for (int k = 0; k < 4; k++) {
            same_bits(names[k], r[0][k], r[1][k], sizes[k]);
            free(r[0][k]), free(r[1][k]);
        }
    }
    zs_cuda_blas_close(blas);
    free(inp), free(w), free(bias), free(dout), free(out), free(dinp), free(dw), free(db);
}

static void test_attention(int B, int T, int C, int NH)
{
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    uint64_t st = 0xbf58476d1ce4e5b9ull;
    float *qkv = malloc(nq * 4), *dout = malloc(no * 4);
    fill(qkv, nq, 1.0f, &st);
    fill(dout, no, 1.0f, &st);
    float *out = malloc(no * 4), *att = malloc(na * 4), *datt = malloc(na * 4);
    float *dqkv = malloc(nq * 4);
    zs_attention_forward(out, att, qkv, B, T, C, NH, 1);
    zs_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, 1);

    float *r[2][3] = {{0}};
    for (int run = 0; run < 2; run++) {
        float *g_qkv = dev(qkv, nq), *g_dout = dev(dout, no), *g_out = dev(NULL, no);
        float *g_att = dev(NULL, na), *g_datt = dev(NULL, na), *g_dqkv = dev(NULL, nq);
        CHECK(g_qkv && g_dout && g_out && g_att && g_datt && g_dqkv);
        /* Each run's outputs start as other garbage: an element a kernel skips shows. */
        cudaMemset(g_out, run ? 0x7f : 0xff, no * 4);
        cudaMemset(g_att, run ? 0x7f : 0xff, na * 4);
        cudaMemset(g_datt, run ? 0x7f : 0xff, na * 4);
        cudaMemset(g_dqkv, run ? 0x7f : 0xff, nq * 4);
        CHECK_OK(zs_cuda_attention_forward(g_out, g_att, g_qkv, B, T, C, NH, NULL));
        CHECK_OK(
            zs_cuda_attention_backward(g_dqkv, g_datt, g_dout, g_qkv, g_att, B, T, C, NH, NULL));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        r[run][0] = host_of(g_out, no);
        r[run][1] = host_of(g_att, na);
        r[run][2] = host_of(g_dqkv, nq);
        cudaFree(g_qkv), cudaFree(g_dout), cudaFree(g_out), cudaFree(g_att), cudaFree(g_datt);
        cudaFree(g_dqkv);
    }
    compare(&TOL_ATT_OUT, r[0][0], out, no);
    compare(&TOL_ATT, r[0][1], att, na);
    compare(&TOL_ATT_OUT, r[0][2], dqkv, nq);
    static const char *names[3] = {"attention out", "attention att", "attention dqkv"};
    size_t sizes[3] = {no, na, nq};
    for (int k = 0; k < 3; k++) {
        same_bits(names[k], r[0][k], r[1][k], sizes[k]);
        free(r[0][k]), free(r[1][k]);
    }
    free(qkv), free(dout), free(out), free(att), free(datt), free(dqkv);
}

/* lse (B, NH, T) of the causal scaled scores of qkv, in double. */
static void lse_double(float *lse, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *s = malloc((size_t)T * sizeof *s);
    for (int b = 0; s && b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * 3 * C + (size_t)h * hs;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                    double d = 0;
                    for (int c = 0; c < hs; c++)
                        d += (double)q[c] * k[c];
                    s[j] = d * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= i; j++)
                    sum += exp(s[j] - mx);
                lse[((size_t)b * NH + h) * T + i] = (float)(mx + log(sum));
            }
    free(s);
}

/*
 * The fused attention against the CPU kernel, against the CUDA reference kernel (on the same
 * device), lse against a double evaluation, and run twice for the same bits.
 */
/* qscale: the inputs' range, [-qscale, qscale): 1 gives nearly uniform softmax rows; 3 sharp
 * ones, whose running maximum jumps between key tiles (the online rescaling at work). */
static void test_attention_fused(int B, int T, int C, int NH, float qscale)
{
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    size_t nr = (size_t)B * NH * T;
    uint64_t st = 0x6a09e667f3bcc909ull ^ (uint64_t)(T * 131 + C);
    float *qkv = malloc(nq * 4), *dout = malloc(no * 4), *out = malloc(no * 4);
    float *att = malloc(na * 4), *datt = malloc(na * 4), *dqkv = malloc(nq * 4);
    float *lse = malloc(nr * 4);
    CHECK(qkv && dout && out && att && datt && dqkv && lse);
    fill(qkv, nq, qscale, &st);
    fill(dout, no, 1.0f, &st);
    zs_attention_forward(out, att, qkv, B, T, C, NH, 1);
    zs_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, 1);
    lse_double(lse, qkv, B, T, C, NH);

    float *g_qkv = dev(qkv, nq), *g_dout = dev(dout, no);
    float *g_att = dev(NULL, na), *g_datt = dev(NULL, na);
    float *ref_out = NULL, *ref_dqkv = NULL, *r[2][3] = {{0}};
    CHECK(g_qkv && g_dout && g_att && g_datt);
    {
        float *g_out = dev(NULL, no), *g_dqkv = dev(NULL, nq);
        CHECK(g_out && g_dqkv);
        CHECK_OK(zs_cuda_attention_forward(g_out, g_att, g_qkv, B, T, C, NH, NULL));
        CHECK_OK(
            zs_cuda_attention_backward(g_dqkv, g_datt, g_dout, g_qkv, g_att, B, T, C, NH, NULL));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        ref_out = host_of(g_out, no);
        ref_dqkv = host_of(g_dqkv, nq);
        cudaFree(g_out), cudaFree(g_dqkv);
    }
    for (int run = 0; run < 2; run++) {
        /* Fresh buffers each run, so that a value the kernels fail to write shows as a
         * difference between the runs (or as garbage against the CPU). */
        float *g_out = dev(NULL, no), *g_lse = dev(NULL, nr), *g_delta = dev(NULL, nr);
        float *g_dqkv = dev(NULL, nq);
        CHECK(g_out && g_lse && g_delta && g_dqkv);
        cudaMemset(g_out, run ? 0x7f : 0xff, no * 4);
        cudaMemset(g_lse, run ? 0x7f : 0xff, nr * 4);
        cudaMemset(g_delta, run ? 0x7f : 0xff, nr * 4);
        cudaMemset(g_dqkv, run ? 0x7f : 0xff, nq * 4);
        CHECK_OK(zs_cuda_attention_fused_forward(g_out, g_lse, g_qkv, B, T, C, NH, NULL));
        CHECK_OK(zs_cuda_attention_fused_backward(g_dqkv, g_delta, g_dout, g_qkv, g_out, g_lse, B,
                                                  T, C, NH, NULL));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        r[run][0] = host_of(g_out, no);
        r[run][1] = host_of(g_lse, nr);
        r[run][2] = host_of(g_dqkv, nq);
        cudaFree(g_out), cudaFree(g_lse), cudaFree(g_delta), cudaFree(g_dqkv);
    }
    printf("test_cuda_kernels: fused attention B %d, T %d, C %d, NH %d (hs %d)\n", B, T, C, NH,
           C / NH);
    compare(&TOL_FUSED, r[0][0], out, no);
    compare(&TOL_FUSED, r[0][2], dqkv, nq);
    compare(&TOL_FUSED, r[0][0], ref_out, no);
    compare(&TOL_FUSED, r[0][2], ref_dqkv, nq);
    compare(&TOL_FUSED_LSE, r[0][1], lse, nr);
    static const char *names[3] = {"fused attention out", "fused attention lse",
                                   "fused attention dqkv"};
    size_t sizes[3] = {no, nr, nq};
    for (int k = 0; k < 3; k++) {
        same_bits(names[k], r[0][k], r[1][k], sizes[k]);
        free(r[0][k]), free(r[1][k]);
    }
    cudaFree(g_qkv), cudaFree(g_dout), cudaFree(g_att), cudaFree(g_datt);
    free(ref_out), free(ref_dqkv);
    free(qkv), free(dout), free(out), free(att), free(datt), free(dqkv), free(lse);
}

/* Head sizes the fused attention does not take are refused by name, before any launch. */
static void test_attention_fused_refuses(void)
{
    CHECK(zs_cuda_attention_fused_supports(64));
    CHECK(!zs_cuda_attention_fused_supports(16));
    CHECK(!zs_cuda_attention_fused_supports(80));
    CHECK_FAILS_WITH(zs_cuda_attention_fused_forward(NULL, NULL, NULL, 1, 8, 48, 3, NULL),
                     "head size 16");
    CHECK_FAILS_WITH(
        zs_cuda_attention_fused_backward(NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 160, 2, NULL),
        "head size 80");
    /* No work (T 0) is no excuse: the head size is still refused. */
    CHECK_FAILS_WITH(zs_cuda_attention_fused_forward(NULL, NULL, NULL, 1, 0, 160, 2, NULL),
                     "head size 80");
}

/* ---- bf16 mode ---------------------------------------------------------------------------- */

/* v's bits in 16-bit format h (to nearest even), and back (exact). */
static zs_half16 to16(zs_half_format h, float v)
{
    return h == ZS_HALF_F16 ? zs_f32_to_f16(v) : zs_f32_to_bf16(v);
}

static float from16(zs_half_format h, zs_half16 bits)
{
    return h == ZS_HALF_F16 ? zs_f16_to_f32(bits) : zs_bf16_to_f32(bits);
}

/* v rounded to format h in place (what the 16-bit modes' operands hold), its bits into bits. */
static void round_half(zs_half_format h, float *v, zs_half16 *bits, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bits[i] = to16(h, v[i]);
        v[i] = from16(h, bits[i]);
    }
}

static zs_half16 *dev16(const zs_half16 *host, size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(zs_half16) + 2) != cudaSuccess)
        return NULL;
    if (host)
        cudaMemcpy(p, host, n * sizeof(zs_half16), cudaMemcpyHostToDevice);
    return p;
}

/* n 16-bit values (format fmt) of device memory d, widened. */
static float *host_of16(zs_half_format fmt, const zs_half16 *d, size_t n)
{
    zs_half16 *h = malloc(n * sizeof *h);
    float *f = malloc(n * sizeof *f);
    if (h && f) {
        cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < n; i++)
            f[i] = from16(fmt, h[i]);
    }
    free(h);
    return f;
}

/* bf16 linear forward and backward against the CPU's fp32 product of the rounded inputs; the
 * bias gradient through the cast-and-sum kernel (from the fp32 dout, as the model does). */
static void test_linear_half(zs_half_format h, int N, int C, int OC)
{
    size_t nin = (size_t)N * C, nw = (size_t)C * OC, nout = (size_t)N * OC;
    uint64_t st = 0x6a09e667f3bcc909ull;
    float *inp = malloc(nin * 4), *w = malloc(nw * 4), *bias = malloc((size_t)OC * 4);
    float *dout = malloc(nout * 4);
    zs_half16 *inp16 = malloc(nin * 2), *w16 = malloc(nw * 2), *dout16 = malloc(nout * 2);
    fill(inp, nin, 1.0f, &st);
    fill(w, nw, 1.0f, &st);
    fill(bias, (size_t)OC, 1.0f, &st);
    fill(dout, nout, 1.0f, &st);
    float *dout32 = malloc(nout * 4); /* the fp32 gradient the bias sum reads */
    memcpy(dout32, dout, nout * 4);
    round_half(h, inp, inp16, nin);
    round_half(h, w, w16, nw);
    round_half(h, dout, dout16, nout);
    float *out = malloc(nout * 4), *dinp = malloc(nin * 4), *dw = malloc(nw * 4);
    float *db = malloc((size_t)OC * 4), *db32 = calloc((size_t)OC, 4);
    zs_linear_forward(out, inp, w, bias, N, C, OC, 1);
    zs_linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, 1);
    for (int i = 0; i < N; i++) /* the bias gradient of the fp32 dout, rows in order */
        for (int c = 0; c < OC; c++)
            db32[c] += dout32[(size_t)i * OC + c];

    zs_cuda_blas *blas = NULL;
    CHECK_OK(zs_cuda_blas_open(NULL, &blas));
    float *r[2][5] = {{0}};
    for (int run = 0; blas && run < 2; run++) {
        zs_half16 *g_inp = dev16(inp16, nin), *g_w = dev16(w16, nw), *g_dout16 = dev16(NULL, nout);
        float *g_bias = dev(bias, (size_t)OC), *g_dout = dev(dout32, nout),
              *g_out = dev(NULL, nout);
        float *g_dinp = dev(NULL, nin), *g_dw = dev(NULL, nw), *g_db = dev(NULL, (size_t)OC);
        CHECK(g_inp && g_w && g_dout16 && g_bias && g_dout && g_out && g_dinp && g_dw && g_db);
        CHECK_OK(zs_cuda_linear_forward_half(h, blas, g_out, g_inp, g_w, g_bias, N, C, OC));
        CHECK_OK(zs_cuda_bias_backward_half(h, g_db, g_dout16, g_dout, N, OC, NULL));
        CHECK_OK(
            zs_cuda_linear_backward_half(h, blas, g_dinp, g_dw, g_dout16, g_inp, g_w, N, C, OC));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        r[run][0] = host_of(g_out, nout);
        r[run][1] = host_of(g_dinp, nin);
        r[run][2] = host_of(g_dw, nw);
        r[run][3] = host_of(g_db, (size_t)OC);
        r[run][4] = host_of16(h, g_dout16, nout);
        cudaFree(g_inp), cudaFree(g_w), cudaFree(g_dout16), cudaFree(g_bias), cudaFree(g_dout);
        cudaFree(g_out), cudaFree(g_dinp), cudaFree(g_dw), cudaFree(g_db);
    }
    if (blas) {
        compare(&TOL_LINEAR_BF16, r[0][0], out, nout);
        compare(&TOL_LINEAR_BF16, r[0][1], dinp, nin);
        compare(&TOL_LINEAR_BF16, r[0][2], dw, nw);
        compare(&TOL_LINEAR_DBIAS, r[0][3], db32, (size_t)OC);
        compare(&TOL_ENCODER, r[0][4], dout, nout); /* the cast: bitwise the host's rounding */
        static const char *names[5] = {"bf16 linear out", "bf16 linear dinp", "bf16 linear dweight",
                                       "bf16 dbias", "bf16 cast"};
        size_t sizes[5] = {nout, nin, nw, (size_t)OC, nout};
        for (int k = 0; k < 5; k++) {
            same_bits(names[k], r[0][k], r[1][k], sizes[k]);
            free(r[0][k]), free(r[1][k]);
        }
    }
    zs_cuda_blas_close(blas);
    free(inp), free(w), free(bias), free(dout), free(inp16), free(w16), free(dout16), free(dout32);
    free(out), free(dinp), free(dw), free(db), free(db32);
}

/* bf16 cross-entropy (dlogits in place, rows 2 ldl bf16 apart) and the lm_head on it: the losses
 * as the fp32 kernel's, dlogits the bf16 rounding of the fp32 kernel's bit for bit, and the
 * lm_head's products against the CPU's of the rounded inputs. */
static void test_lm_head_half(zs_half_format h, int N, int C, int V, int ldl)
{
    size_t nin = (size_t)N * C, nw = (size_t)V * C, nl = (size_t)N * V;
    uint64_t st = 0xbb67ae8584caa73bull;
    /* fp16 carries a loss scale in dlogits, as the model does (zs_model_loss_scale): unscaled,
     * (softmax - onehot) / N of GPT-2's vocabulary is ~1e-7, below fp16's normal range (6e-5),
     * where the rounding keeps few bits (what loss scaling is for); 2^16 lifts it into range. */
    const float dloss = 1.0f / (float)N * (h == ZS_HALF_F16 ? 65536.0f : 1.0f);
    float *inp = malloc(nin * 4), *wte = malloc(nw * 4), *logits = malloc(nl * 4);
    zs_half16 *inp16 = malloc(nin * 2), *wte16 = malloc(nw * 2);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    fill(inp, nin, 1.0f, &st);
    fill(wte, nw, 0.1f, &st);
    fill(logits, nl, 8.0f, &st);
    for (int i = 0; i < N; i++)
        targets[i] = (int32_t)((size_t)i * 7919 % (size_t)V);
    round_half(h, inp, inp16, nin);
    round_half(h, wte, wte16, nw);
    float *ref = malloc(nl * 4), *losses = malloc((size_t)N * 4);
    memcpy(ref, logits, nl * 4);
    zs_crossentropy_fused(ref, losses, targets, N, V, dloss, 1);
    float *h_logits = malloc(nl * 4), *h_dl = malloc(nl * 4);
    float *dinp = malloc(nin * 4), *dwte = malloc(nw * 4), *lg = malloc(nl * 4);

    zs_cuda_blas *blas = NULL;
    CHECK_OK(zs_cuda_blas_open(NULL, &blas));
    float *g_l32 = dev_rows(logits, N, V, ldl), *g_l16 = dev_rows(logits, N, V, ldl);
    float *g_losses = dev(NULL, (size_t)N);
    float *g_losses32 = dev(NULL, (size_t)N), *g_dinp = dev(NULL, nin), *g_dwte = dev(NULL, nw);
    float *g_lg = dev_rows(NULL, N, V, ldl);
    zs_half16 *g_inp = dev16(inp16, nin), *g_wte = dev16(wte16, nw);
    int32_t *g_t = dev_ids(targets, (size_t)N);
    CHECK(blas && g_l32 && g_l16 && g_losses && g_losses32 && g_dinp && g_dwte && g_lg && g_inp &&
          g_wte && g_t);
    if (blas) {
        CHECK_OK(zs_cuda_lm_head_forward_half(h, blas, g_lg, ldl, g_inp, g_wte, N, C, V));
        CHECK_OK(zs_cuda_crossentropy_fused(g_l32, ldl, g_losses32, g_t, N, V, dloss, NULL));
        CHECK_OK(zs_cuda_crossentropy_fused_half(h, g_l16, ldl, g_losses, g_t, N, V, dloss, NULL));
        CHECK_OK(zs_cuda_lm_head_backward_half(h, blas, g_dinp, g_dwte, (const zs_half16 *)g_l16,
                                               2 * ldl, g_inp, g_wte, N, C, V));
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        float *h_losses = host_of(g_losses, (size_t)N),
              *h_losses32 = host_of(g_losses32, (size_t)N);
        float *h_l32 = host_rows(g_l32, N, V, ldl), *h_dinp = host_of(g_dinp, nin);
        float *h_dwte = host_of(g_dwte, nw), *h_lg = host_rows(g_lg, N, V, ldl);
        /* The 16-bit rows fill each row's first 2V bytes: the rest, PAD_BITS from V on. */
        float *h_l16 = host_rows(g_l16, N, V, ldl);
        free(h_l16);
        zs_half16 *rows = malloc((size_t)N * ldl * 2 * sizeof *rows);
        cudaMemcpy(rows, g_l16, (size_t)N * ldl * sizeof(float), cudaMemcpyDeviceToHost);
        size_t wrong = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < V; j++) {
                size_t k = (size_t)i * V + j;
                zs_half16 bits = rows[(size_t)i * 2 * ldl + j];
                h_dl[k] = from16(h, bits);
                wrong += bits != to16(h, h_l32[k]);
            }
        zs_test_checks++;
        if (wrong) {
            zs_test_failures++;
            fprintf(stderr, "bf16 dlogits: %zu of %zu differ from the fp32 kernel's, rounded\n",
                    wrong, nl);
        }
        compare(&TOL_CE_LOSS, h_losses, losses, (size_t)N);
        same_bits("bf16 cross-entropy loss against fp32's", h_losses, h_losses32, (size_t)N);
        compare(&TOL_CE_DLOGITS_BF16, h_dl, ref, nl);
        /* The CPU's lm_head on the same bf16 values. */
        zs_lm_head_forward(lg, inp, wte, N, C, V, 1);
        zs_lm_head_backward(dinp, dwte, h_dl, inp, wte, N, C, V, 1);
        compare(&TOL_LINEAR_BF16, h_lg, lg, nl);
        compare(&TOL_LINEAR_BF16, h_dinp, dinp, nin);
        compare(&TOL_LINEAR_BF16, h_dwte, dwte, nw);
        free(h_losses), free(h_losses32), free(h_l32), free(h_dinp), free(h_dwte), free(h_lg);
        free(rows);
    }
    cudaFree(g_l32), cudaFree(g_l16), cudaFree(g_losses), cudaFree(g_losses32), cudaFree(g_dinp);
    cudaFree(g_dwte), cudaFree(g_lg), cudaFree(g_inp), cudaFree(g_wte), cudaFree(g_t);
    zs_cuda_blas_close(blas);
    free(inp), free(wte), free(logits), free(inp16), free(wte16), free(targets), free(ref);
    free(losses), free(h_logits), free(h_dl), free(dinp), free(dwte), free(lg);
}

/* The bf16 LayerNorm: bitwise the fp32 kernel's output, rounded (the same arithmetic). */
static void test_layernorm_half(zs_half_format h, int N, int C)
{
    size_t n = (size_t)N * C;
    uint64_t st = 0x3c6ef372fe94f82bull;
    float *a = malloc(n * 4), *b = malloc(n * 4), *w = malloc((size_t)C * 4);
    float *bi = malloc((size_t)C * 4);
    fill(a, n, 2.0f, &st);
    fill(b, n, 2.0f, &st);
    fill(w, (size_t)C, 1.0f, &st);
    fill(bi, (size_t)C, 0.5f, &st);
    float *g_a = dev(a, n), *g_b = dev(b, n), *g_w = dev(w, (size_t)C), *g_bi = dev(bi, (size_t)C);
    float *g_res = dev(NULL, n), *g_out = dev(NULL, n), *g_m = dev(NULL, (size_t)N);
    float *g_r = dev(NULL, (size_t)N);
    zs_half16 *g_o16 = dev16(NULL, n);
    CHECK(g_a && g_b && g_w && g_bi && g_res && g_out && g_m && g_r && g_o16);
    CHECK_OK(zs_cuda_residual_layernorm_forward(g_res, g_out, g_m, g_r, g_a, g_b, g_w, g_bi, N, C,
                                                NULL));
    CHECK_OK(
        zs_cuda_layernorm_forward_half(h, g_res, g_o16, g_m, g_r, g_a, g_b, g_w, g_bi, N, C, NULL));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    float *h32 = host_of(g_out, n), *h16 = host_of16(h, g_o16, n);
    for (size_t i = 0; i < n; i++)
        h32[i] = from16(h, to16(h, h32[i]));
    compare(&TOL_ENCODER, h16, h32, n); /* 0, 0: bitwise */
    free(h32), free(h16);
    cudaFree(g_a), cudaFree(g_b), cudaFree(g_w), cudaFree(g_bi), cudaFree(g_res), cudaFree(g_out);
    cudaFree(g_m), cudaFree(g_r), cudaFree(g_o16);
    free(a), free(b), free(w), free(bi);
}

/* GELU: the tanh approximation (gelu_new) and the exact erf form, in double. */
static double gelu_tanh(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double gelu_erf(double x)
{
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

/*
 * The GELU epilogue against the separate path, for an MLP of C -> H -> C on N rows: forward
 * (GELU_AUX_BIAS against a GEMM + zs_cuda_bias_gelu_forward_bf16) and backward (DGELU + the
 * dbias kernel against a GEMM + zs_cuda_bias_gelu_backward_bf16), each twice for the same bits.
 * Which GELU cuBLASLt computes: the root mean square of out - gelu(pre) over all elements, for
 * the tanh form and the erf form; both carry the bf16 roundings (zero-mean noise), only the
 * wrong formula adds its systematic difference (up to 4e-4 around |x| = 2), so the tanh form
 * must come out smaller.  With GPT-2's MLP (786k elements) the difference of the two sums is
 * about 50 standard deviations of its noise; with a small shape it is not, so formula is 0
 * there.  Returns 0 when cuBLASLt has no algorithm (said, not failed).
 */
static int test_gelu_epilogue(zs_half_format h, int N, int C, int H, int formula)
{
    size_t nin = (size_t)N * C, nw = (size_t)C * H, nh = (size_t)N * H;
    uint64_t st = 0x510e527fade682d1ull;
    float *inp = malloc(nin * 4), *w = malloc(nw * 4), *bias = malloc((size_t)H * 4);
    float *wp = malloc(nw * 4), *dout = malloc(nin * 4);
    zs_half16 *inp16 = malloc(nin * 2), *w16 = malloc(nw * 2), *b16 = malloc((size_t)H * 2);
    zs_half16 *wp16 = malloc(nw * 2), *dout16 = malloc(nin * 2);
    fill(inp, nin, 1.0f, &st);
    fill(w, nw, 0.1f, &st); /* pre-activations of a few units: GELU's curved part */
    fill(bias, (size_t)H, 0.5f, &st);
    fill(wp, nw, 0.1f, &st);
    fill(dout, nin, 1.0f, &st);
    round_half(h, inp, inp16, nin);
    round_half(h, w, w16, nw);
    round_half(h, bias, b16, (size_t)H);
    round_half(h, wp, wp16, nw);
    round_half(h, dout, dout16, nin);
    zs_cuda_blas *blas = NULL;
    CHECK_OK(zs_cuda_blas_open(NULL, &blas));
    int ok = blas != NULL;
    float *r[2][2][3] = {{{0}}}; /* [run][fused][pre, out, dpre] */
    float *dbias[2][2] = {{0}};
    for (int run = 0; ok && run < 2; run++) {
        zs_half16 *g_inp = dev16(inp16, nin), *g_w = dev16(w16, nw), *g_b16 = dev16(b16, (size_t)H);
        zs_half16 *g_wp = dev16(wp16, nw), *g_dout = dev16(dout16, nin);
        zs_half16 *g_pre = dev16(NULL, nh), *g_out = dev16(NULL, nh), *g_dpre = dev16(NULL, nh);
        float *g_b32 = dev(bias, (size_t)H), *g_prod = dev(NULL, nh), *g_db = dev(NULL, (size_t)H);
        CHECK(g_inp && g_w && g_b16 && g_wp && g_dout && g_pre && g_out && g_dpre && g_b32 &&
              g_prod && g_db);
        for (int fused = 0; fused < 2; fused++) {
            if (fused) {
                int f1 = 0, f2 = 0;
                CHECK_OK(zs_cuda_linear_gelu_forward_half(h, blas, g_pre, g_out, g_inp, g_w, g_b16,
                                                          N, C, H, &f1));
                if (f1)
                    CHECK_OK(zs_cuda_linear_backward_dgelu_half(h, blas, g_dpre, g_dout, g_wp,
                                                                g_pre, N, H, C, &f2));
                if (f2)
                    CHECK_OK(zs_cuda_bias_backward_of_half(h, g_db, g_dpre, N, H, NULL));
                if (!f1 || !f2) {
                    printf("test_cuda_kernels: cuBLASLt has no algorithm for the GELU epilogue "
                           "(%s, N %d, C %d, H %d): the model falls back to the kernels\n",
                           f1 ? "DGELU" : "GELU_AUX_BIAS", N, C, H);
                    ok = 0;
                }
            } else {
                CHECK_OK(zs_cuda_linear_forward_half(h, blas, g_prod, g_inp, g_w, NULL, N, C, H));
                CHECK_OK(
                    zs_cuda_bias_gelu_forward_half(h, g_pre, g_out, g_prod, g_b32, N, H, NULL));
                CHECK_OK(zs_cuda_linear_backward_half(h, blas, g_prod, NULL, g_dout, NULL, g_wp, N,
                                                      H, C));
                CHECK_OK(
                    zs_cuda_bias_gelu_backward_half(h, g_dpre, g_db, g_prod, g_pre, N, H, NULL));
            }
            CHECK(cudaDeviceSynchronize() == cudaSuccess);
            r[run][fused][0] = host_of16(h, g_pre, nh);
            r[run][fused][1] = host_of16(h, g_out, nh);
            r[run][fused][2] = host_of16(h, g_dpre, nh);
            dbias[run][fused] = host_of(g_db, (size_t)H);
        }
        cudaFree(g_inp), cudaFree(g_w), cudaFree(g_b16), cudaFree(g_wp), cudaFree(g_dout);
        cudaFree(g_pre), cudaFree(g_out), cudaFree(g_dpre), cudaFree(g_b32), cudaFree(g_prod);
        cudaFree(g_db);
    }
    if (ok) {
        compare(&TOL_GELU_EPILOGUE, r[0][1][0], r[0][0][0], nh);
        compare(&TOL_GELU_EPILOGUE, r[0][1][1], r[0][0][1], nh);
        compare(&TOL_GELU_EPILOGUE, r[0][1][2], r[0][0][2], nh);
        compare(&TOL_GELU_EPILOGUE_DBIAS, dbias[0][1], dbias[0][0], (size_t)H);
        for (int f = 0; f < 2; f++)
            for (int k = 0; k < 3; k++)
                same_bits(f ? "GELU epilogue" : "GELU kernels (bf16)", r[0][f][k], r[1][f][k], nh);
        same_bits("GELU epilogue dbias", dbias[0][1], dbias[1][1], (size_t)H);
        double se_tanh = 0, se_erf = 0;
        for (size_t i = 0; i < nh; i++) {
            double x = r[0][1][0][i], y = r[0][1][1][i];
            se_tanh += (y - gelu_tanh(x)) * (y - gelu_tanh(x));
            se_erf += (y - gelu_erf(x)) * (y - gelu_erf(x));
        }
        printf("test_cuda_kernels: cuBLASLt's GELU against gelu(pre): rms %.3e (tanh form), "
               "%.3e (erf form)\n",
               sqrt(se_tanh / nh), sqrt(se_erf / nh));
        zs_test_checks += formula;
        if (formula && !(se_tanh < se_erf)) {
            zs_test_failures++;
            fprintf(stderr, "cuBLASLt's GELU is closer to the erf form than to gelu_new's tanh "
                            "form: the epilogue must not be used (docs/gpu.md)\n");
        }
    }
    for (int run = 0; run < 2; run++)
        for (int f = 0; f < 2; f++) {
            for (int k = 0; k < 3; k++)
                free(r[run][f][k]);
            free(dbias[run][f]);
        }
    zs_cuda_blas_close(blas);
    free(inp), free(w), free(bias), free(wp), free(dout), free(inp16), free(w16), free(b16);
    free(wp16), free(dout16);
    return ok;
}

int main(void)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("test_cuda_kernels: skipped: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("test_cuda_kernels: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    /* GPT-2 124M's shapes at B*T = 256, and odd ones (C not a multiple of 32, one row). */
    test_gelu(256, 3072, 4.0f);
    test_gelu(7, 97, 4.0f);
    /* Below -10.1 gelu's exponential passes 88.7, where an unclamped expf is inf and the
     * gradient NaN: the clamp at 88 (zs_vexp's) must keep both finite and the CPU's. */
    test_gelu(16, 97, 30.0f);
    /* 130 rows: the column sums (bias and LayerNorm gradients) in three chunks of 64 rows, the
     * last one short (launch.cuh, zs_colsum_begin); 256 rows above are four whole ones. */
    test_gelu(130, 97, 4.0f);
    test_layernorm(130, 33);
    test_linear(130, 33, 7);
    test_layernorm(256, 768);
    test_layernorm(5, 33);
    test_layernorm(1, 1600);
    test_linear(256, 768, 2304); /* c_attn */
    test_linear(256, 3072, 768); /* c_proj of the MLP */
    test_linear(5, 33, 7);
    /* Rows V apart, and padded as the model pads them (V rounded up to 128). */
    test_lm_head(64, 768, 50257, 50257);
    test_lm_head(64, 768, 50257, 50304);
    test_lm_head(3, 17, 11, 11);
    test_lm_head(3, 17, 11, 128);
    test_attention(4, 64, 768, 12); /* GPT-2 124M's heads at T = 64 */
    test_attention(2, 37, 96, 3);
    /* The fused attention: GPT-2's hs = 64 at T = 64 (two tiles) and T = 300 (not a multiple of
     * the tile of 32), T = 1, and hs 32, 96, 128 with partial tiles. */
    test_attention_fused(4, 64, 768, 12, 1.0f);
    test_attention_fused(1, 300, 128, 2, 1.0f);
    test_attention_fused(2, 1, 768, 12, 1.0f);
    test_attention_fused(2, 37, 96, 3, 1.0f);
    test_attention_fused(1, 75, 288, 3, 1.0f);
    test_attention_fused(2, 100, 256, 2, 1.0f);
    test_attention_fused(1, 75, 288, 3, 3.0f); /* peaked rows */
    test_attention_fused(1, 300, 128, 2, 3.0f);
    test_attention_fused_refuses();
    test_encoder(4, 64, 768, 50257);
    test_encoder(3, 5, 33, 7);
    /* 8192 positions of 16 tokens: the token sort's multi-pass path, runs of hundreds. */
    test_encoder(8, 1024, 64, 50257);
    test_crossentropy(64, 50257, 50257);
    test_crossentropy(64, 50257, 50304);
    test_crossentropy(3, 17, 17);
    test_crossentropy(3, 17, 128);
    /* The 16-bit modes: bf16, then fp16 (the same kernels in the other format, checked with
     * bf16's tolerances, which hold a fortiori: fp16's rounding unit, 2^-11, is 8 times bf16's
     * within its range, and the tests' values are in it). */
    for (int f = 0; f < 2; f++) {
        zs_half_format h = f ? ZS_HALF_F16 : ZS_HALF_BF16;
        printf("test_cuda_kernels: %s storage\n", zs_half_name(h));
        test_linear_half(h, 256, 768, 2304);
        test_linear_half(h, 256, 3072, 768);
        test_linear_half(h, 5, 33, 7);
        test_lm_head_half(h, 64, 768, 50257, 50257);
        test_lm_head_half(h, 64, 768, 50257, 50304);
        test_lm_head_half(h, 3, 17, 11, 11);
        test_lm_head_half(h, 3, 17, 11, 128);
        test_layernorm_half(h, 256, 768);
        test_layernorm_half(h, 5, 33);
        test_gelu_epilogue(h, 256, 768, 3072, 1); /* GPT-2 124M's MLP */
        test_gelu_epilogue(h, 16, 64, 256, 0);
    }
    return zs_test_result("test_cuda_kernels");
}
