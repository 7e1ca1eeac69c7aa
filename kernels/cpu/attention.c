/*
 * attention: causal multi-head self-attention as Hugging Face's GPT2Attention computes it
 * (no dropout), forward and backward.
 *
 * For one sequence b and head h, with q, k, v the head's [T, hs] slices of the c_attn output
 * (row stride 3C, no copies):
 *   S = q k^T / sqrt(hs);  P = softmax(S) over keys j <= i (row max subtracted, fp32);
 *   y = P v, written into the head's channels of out.
 * The (b, h) pairs are independent, so one OpenMP loop runs over them and every product
 * inside is a single-threaded sgemm: each pair is computed the same way on any thread.
 *
 * The causal mask makes the upper triangle of S dead, so the products work on blocks of
 * ZS_ATTN_BLOCK rows: rows [i0, i1) need keys [0, i1) only.  That skips about half of the
 * score and value products for long sequences, and changes no result (the skipped terms are
 * exact zeros).  P is stored in full [T, T] with zeros above the diagonal, so the backward
 * can read any block of it.
 *
 * Backward, with dP = dy v^T and the softmax backward dS = P * (dP - rowsum(P * dP)):
 *   dq = dS k / sqrt(hs),  dk = dS^T q / sqrt(hs),  dv = P^T dy.
 * dq goes by row blocks like the forward; dk and dv by key blocks [j0, j1), which only
 * queries i >= j0 reach.
 */
#include "kernels/kernels.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* At -O1 (the sanitizer build) clang does not vectorize and warns about every omp simd. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wunknown-warning-option"
#pragma GCC diagnostic ignored "-Wpass-failed"

/* row[0..i] := softmax(row[0..i]); row[i+1..T) := 0. */
static void softmax_causal_row(float *row, int i, int T)
{
    int n = i + 1;
    float mx = zs_vmax(row, n);
    float inv = (float)(1.0 / zs_vexp_sum(row, n, mx));
#pragma omp simd
    for (int j = 0; j < n; j++)
        row[j] *= inv;
    memset(row + n, 0, (size_t)(T - n) * sizeof *row);
}

/* drow[0..i] := p * (drow - sum_j p_j drow_j) (d loss / d scores); drow(i, end) := 0. */
static void softmax_causal_row_backward(float *drow, const float *p, int i, int end)
{
    int n = i + 1;
    float dot = zs_vdot(p, drow, n);
#pragma omp simd
    for (int j = 0; j < n; j++)
        drow[j] = p[j] * (drow[j] - dot);
    memset(drow + n, 0, (size_t)(end - n) * sizeof *drow);
}

/* One (b, h): qkv, out at the head's first channel of position 0; att the pair's [T, T]. */
static void head_forward(float *out, float *att, const float *qkv, int T, int C, int hs,
                         float scale)
{
    const int C3 = 3 * C;
    const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
    for (int i0 = 0; i0 < T; i0 += ZS_ATTN_BLOCK) {
        int i1 = T - i0 < ZS_ATTN_BLOCK ? T : i0 + ZS_ATTN_BLOCK;
        int nr = i1 - i0;
        float *s = att + (size_t)i0 * T;
        zs_sgemm(0, 1, nr, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3, 0.0f, s, T, 1);
        for (int i = i0; i < i1; i++)
            softmax_causal_row(att + (size_t)i * T, i, T);
        zs_sgemm(0, 0, nr, hs, i1, 1.0f, s, T, v, C3, 0.0f, out + (size_t)i0 * C, C, 1);
    }
}

static void head_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                          const float *att, int T, int C, int hs, float scale)
{
    const int C3 = 3 * C;
    const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
    float *dq = dqkv, *dk = dqkv + C, *dv = dqkv + 2 * C;
    for (int i0 = 0; i0 < T; i0 += ZS_ATTN_BLOCK) {
        int i1 = T - i0 < ZS_ATTN_BLOCK ? T : i0 + ZS_ATTN_BLOCK;
        int nr = i1 - i0;
        float *ds = datt + (size_t)i0 * T;
        zs_sgemm(0, 1, nr, i1, hs, 1.0f, dout + (size_t)i0 * C, C, v, C3, 0.0f, ds, T, 1);
        for (int i = i0; i < i1; i++)
            softmax_causal_row_backward(datt + (size_t)i * T, att + (size_t)i * T, i, i1);
        zs_sgemm(0, 0, nr, hs, i1, scale, ds, T, k, C3, 0.0f, dq + (size_t)i0 * C3, C3, 1);
    }
    for (int j0 = 0; j0 < T; j0 += ZS_ATTN_BLOCK) {
        int j1 = T - j0 < ZS_ATTN_BLOCK ? T : j0 + ZS_ATTN_BLOCK;
        int nc = j1 - j0;
        size_t corner = (size_t)j0 * T + j0; /* rows i >= j0, columns [j0, j1) */
        zs_sgemm(1, 0, nc, hs, T - j0, scale, datt + corner, T, q + (size_t)j0 * C3, C3, 0.0f,
                 dk + (size_t)j0 * C3, C3, 1);
        zs_sgemm(1, 0, nc, hs, T - j0, 1.0f, att + corner, T, dout + (size_t)j0 * C, C, 0.0f,
                 dv + (size_t)j0 * C3, C3, 1);
    }
}

void zs_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                          int threads)
{
    int nt = zs_kernel_threads(threads);
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        head_forward(out + (size_t)b * T * C + (size_t)h * hs, att + (size_t)bh * T * T,
                     qkv + (size_t)b * T * 3 * C + (size_t)h * hs, T, C, hs, scale);
    }
}

void zs_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH, int threads)
{
    int nt = zs_kernel_threads(threads);
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t qoff = (size_t)b * T * 3 * C + (size_t)h * hs;
        head_backward(dqkv + qoff, datt + (size_t)bh * T * T,
                      dout + (size_t)b * T * C + (size_t)h * hs, qkv + qoff,
                      att + (size_t)bh * T * T, T, C, hs, scale);
    }
}
