/*
 * gelu: the MLP's bias add fused with GELU in the tanh approximation (HF "gelu_new"),
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3),
 * and its backward fused with the bias gradient.
 *
 * We evaluate it through the identity 0.5 (1 + tanh(u)) = 1 / (1 + e) = s with e = exp(-2u):
 * one exp (zs_vexp, vectorized) instead of tanhf, no cancellation in 1 + tanh(u) for negative
 * x, and for very negative x the clamped exp (e^88 at most) gives x / (1 + e) ~ 0 without
 * overflow.  The value agrees with the tanh form to a few ulp.  The derivative is
 *   gelu'(x) = s + x * 2 s (1 - s) * du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2),
 * with 1 - s = e s, which keeps its relative accuracy for large x, where 1 - s would cancel
 * (and is finite because e is).
 *
 * Work goes in chunks of at most COL_BLOCK values: the exp arguments are computed into a
 * stack buffer, exponentiated in one zs_vexp call, and the chunk is finished from there, all
 * in L1.  The forward is parallel over rows.  The backward sums the new gradient down each
 * column for the bias, so threads own blocks of columns and walk the rows in order (see
 * kernels.h).
 */
#include "kernels/kernels.h"

#include <stddef.h>
#include <string.h>

/* At -O1 (the sanitizer build) clang does not vectorize and warns about every omp simd. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wunknown-warning-option"
#pragma GCC diagnostic ignored "-Wpass-failed"

/* As in vmath.c: static clones, called from plain functions of this file. */
#define VEC_CLONES static __attribute__((target_clones("avx512f", "avx2", "default")))

#define COL_BLOCK 64
#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* e[c] = exp(-2 u(x[c])) for c < n. */
VEC_CLONES void gelu_exp(float *e, const float *x, int n)
{
#pragma omp simd
    for (int c = 0; c < n; c++) {
        float v = x[c];
        e[c] = -2.0f * (GELU_K0 * (v + GELU_K1 * v * v * v));
    }
    zs_vexp(e, e, n);
}

/* One chunk of a row: x += b (b may be NULL), then o = gelu(x).  Compiled for AVX-512, AVX2
 * and the baseline like vmath.c's loops (static clones, see there): the same IEEE operations
 * per element whatever the width, so the same bits. */
VEC_CLONES void forward_chunk(float *x, float *o, const float *b, int n)
{
    float e[COL_BLOCK];
    if (b) {
#pragma omp simd
        for (int c = 0; c < n; c++)
            x[c] += b[c];
    }
    gelu_exp(e, x, n);
#pragma omp simd
    for (int c = 0; c < n; c++)
        o[c] = x[c] / (1.0f + e[c]);
}

/* One block of n <= COL_BLOCK columns of d and pre, whose rows are C apart, over N rows:
 * d *= gelu'(pre), acc (n) = the new d summed down each column in row order. */
VEC_CLONES void backward_block(float *d, const float *pre, float *acc, int N, int C, int n)
{
    for (int c = 0; c < n; c++)
        acc[c] = 0.0f;
    for (int i = 0; i < N; i++) {
        float *dr = d + (size_t)i * C;
        const float *x = pre + (size_t)i * C;
        float e[COL_BLOCK];
        gelu_exp(e, x, n);
#pragma omp simd
        for (int c = 0; c < n; c++) {
            float v = x[c];
            float s = 1.0f / (1.0f + e[c]);
            float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * v * v);
            float g = s + v * 2.0f * s * (e[c] * s) * du;
            dr[c] = dr[c] * g;
            acc[c] += dr[c];
        }
    }
}

void zs_bias_gelu_forward(float *pre, float *out, const float *bias, int N, int C, int threads)
{
    int nt = zs_kernel_threads(threads);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16)
    for (int i = 0; i < N; i++)
        for (int c0 = 0; c0 < C; c0 += COL_BLOCK)
            forward_chunk(pre + (size_t)i * C + c0, out + (size_t)i * C + c0,
                          bias ? bias + c0 : NULL, C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK);
}

void zs_bias_gelu_backward(float *d, float *dbias, const float *pre, int N, int C, int threads)
{
    int nt = zs_kernel_threads(threads);
    int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COL_BLOCK;
        int n = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
        float acc[COL_BLOCK];
        backward_block(d + c0, pre + c0, acc, N, C, n);
        if (dbias)
            memcpy(dbias + c0, acc, (size_t)n * sizeof *acc);
    }
}
