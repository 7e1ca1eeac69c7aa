/*
 * layernorm: LayerNorm over the channels of each position (eps 1e-5, biased variance, as
 * torch.nn.LayerNorm), the residual add fused into it, and its backward.
 *
 * The forward is parallel over rows.  Row sums use LANES interleaved partial sums that are
 * combined in a fixed tree: a fixed order (so the bits do not depend on how the compiler
 * vectorizes the loop) that is still vectorizable and more accurate than one running sum.
 * The mean and the variance are two passes over the row (x - mean, then its square), which
 * avoids the cancellation of E[x^2] - E[x]^2; the row is in L1 by then.
 *
 * The backward has two parts with different shapes of parallelism: dinp needs sums along
 * each row (parallel over rows), dweight and dbias need sums down each column (threads own
 * blocks of columns and walk all rows in order), so they are two passes over dout.
 */
#include "kernels/kernels.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define LANES 8
#define COL_BLOCK 64

static float combine(const float acc[LANES])
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Mean and 1/sqrt(var + eps) of x[0, C). */
static void row_stats(const float *x, int C, float *mean, float *rstd)
{
    float acc[LANES] = {0};
    int c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int k = 0; k < LANES; k++)
            acc[k] += x[c + k];
    float s = combine(acc);
    for (; c < C; c++)
        s += x[c];
    float m = s / (float)C;

    float acc2[LANES] = {0};
    for (c = 0; c + LANES <= C; c += LANES)
        for (int k = 0; k < LANES; k++) {
            float d = x[c + k] - m;
            acc2[k] += d * d;
        }
    float v = combine(acc2);
    for (; c < C; c++) {
        float d = x[c] - m;
        v += d * d;
    }
    *mean = m;
    *rstd = 1.0f / sqrtf(v / (float)C + ZS_LAYERNORM_EPS);
}

static void row_normalize(float *out, const float *x, float m, float s, const float *weight,
                          const float *bias, int C)
{
    for (int c = 0; c < C; c++)
        out[c] = (x[c] - m) * s * weight[c] + bias[c];
}

void zs_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C, int threads)
{
    int nt = zs_kernel_threads(threads);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float m, s;
        row_stats(x, C, &m, &s);
        row_normalize(out + (size_t)i * C, x, m, s, weight, bias, C);
        mean[i] = m;
        rstd[i] = s;
    }
}

void zs_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                   const float *inp1, const float *inp2, const float *weight,
                                   const float *bias, int N, int C, int threads)
{
    int nt = zs_kernel_threads(threads);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++) {
        float *r = res + (size_t)i * C;
        const float *a = inp1 + (size_t)i * C, *b = inp2 + (size_t)i * C;
        for (int c = 0; c < C; c++)
            r[c] = a[c] + b[c];
        float m, s;
        row_stats(r, C, &m, &s);
        row_normalize(out + (size_t)i * C, r, m, s, weight, bias, C);
        mean[i] = m;
        rstd[i] = s;
    }
}

void zs_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C, int threads)
{
    int nt = zs_kernel_threads(threads);
    int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel num_threads(nt)
    {
/* dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = w * dout. */
#pragma omp for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
            float *dx = dinp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            float acc_d[LANES] = {0}, acc_dx[LANES] = {0};
            int c = 0;
            for (; c + LANES <= C; c += LANES)
                for (int k = 0; k < LANES; k++) {
                    float dn = weight[c + k] * d[c + k];
                    acc_d[k] += dn;
                    acc_dx[k] += dn * ((x[c + k] - m) * s);
                }
            float sd = combine(acc_d), sdx = combine(acc_dx);
            for (; c < C; c++) {
                float dn = weight[c] * d[c];
                sd += dn;
                sdx += dn * ((x[c] - m) * s);
            }
            float mean_d = sd / (float)C, mean_dx = sdx / (float)C;
            for (c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                float dn = weight[c] * d[c];
                dx[c] += (dn - mean_d - xhat * mean_dx) * s;
            }
        }
/* dweight = sum_i dout * xhat, dbias = sum_i dout: columns owned, rows in order. */
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int c0 = blk * COL_BLOCK;
            int nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
            float acc_w[COL_BLOCK] = {0}, acc_b[COL_BLOCK] = {0};
            for (int i = 0; i < N; i++) {
                const float *x = inp + (size_t)i * C + c0, *d = dout + (size_t)i * C + c0;
                float m = mean[i], s = rstd[i];
                for (int c = 0; c < nc; c++) {
                    acc_w[c] += d[c] * ((x[c] - m) * s);
                    acc_b[c] += d[c];
                }
            }
            memcpy(dweight + c0, acc_w, (size_t)nc * sizeof *acc_w);
            memcpy(dbias + c0, acc_b, (size_t)nc * sizeof *acc_b);
        }
    }
}
