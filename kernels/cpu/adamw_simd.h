/*
 * adamw_simd: the SIMD variants of zs_adamw_ref, one file per ISA, compiled with that ISA's
 * flags and called only when the CPU has it (kernels/adamw.c chooses).  Same arguments and
 * same bits as zs_adamw_ref: each performs the reference's float operations in its order,
 * without FMA, and stores NaNs as ZS_ADAMW_NAN_BITS.  Any pointer alignment of 4 (half: 2).
 */
#ifndef ZS_ADAMW_SIMD_H
#define ZS_ADAMW_SIMD_H

#include "kernels/adamw.h"

/* The one NaN stored in p, m and v (see adamw.h): the positive default quiet NaN. */
#define ZS_ADAMW_NAN_BITS 0x7fc00000u

/* Elements before the first whose 16-bit copy starts a 64-byte line (at most n; 0 without a
 * copy): the variants do those one at a time, so that their streaming stores of the copy are
 * of whole lines.  The copy is 2-byte aligned, so a whole number of elements reaches the line. */
static inline size_t zs_adamw_half_head(const uint16_t *half, size_t n)
{
    size_t head = half ? ((64 - ((uintptr_t)half & 63)) & 63) / 2 : 0;
    return head < n ? head : n;
}

void zs_adamw_avx2(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
                   const zs_adamw_hparams *hp);
void zs_adamw_avx512(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
                     const zs_adamw_hparams *hp);

#endif
