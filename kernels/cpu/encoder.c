/*
 * encoder: GPT-2's input embedding, token embedding (wte) plus learned position embedding
 * (wpe), and its backward.
 *
 * The forward is a gather, parallel over positions.  The backward scatters each position's
 * gradient into its token's row of dwte; two positions with the same token hit the same row,
 * so splitting positions among threads would make the sum order depend on timing.  Instead
 * threads own blocks of channels and each walks all positions in order: every element of
 * dwte then receives its additions in position order, whatever the thread count.
 */
#include "kernels/kernels.h"

#include <stddef.h>

/* Channels per block in the backward: a thread owns whole blocks. */
#define COL_BLOCK 64

void zs_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C, int threads)
{
    int nt = zs_kernel_threads(threads);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        const float *te = wte + (size_t)inp[bt] * C;
        const float *pe = wpe + (size_t)(bt % T) * C;
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
    }
}

void zs_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                         int T, int C, int threads)
{
    int nt = zs_kernel_threads(threads);
    int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel num_threads(nt)
    {
/* dwte +=: channel blocks, positions in order within each. */
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int c0 = blk * COL_BLOCK;
            int c1 = C - c0 < COL_BLOCK ? C : c0 + COL_BLOCK;
            for (int bt = 0; bt < B * T; bt++) {
                float *dte = dwte + (size_t)inp[bt] * C;
                const float *d = dout + (size_t)bt * C;
                for (int c = c0; c < c1; c++)
                    dte[c] += d[c];
            }
        }
/* dwpe =: each position's row is its own, summed over b in order. */
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            float *dpe = dwpe + (size_t)t * C;
            const float *d = dout + (size_t)t * C;
            for (int c = 0; c < C; c++)
                dpe[c] = d[c];
            for (int b = 1; b < B; b++) {
                d = dout + ((size_t)b * T + t) * C;
                for (int c = 0; c < C; c++)
                    dpe[c] += d[c];
            }
        }
    }
}
