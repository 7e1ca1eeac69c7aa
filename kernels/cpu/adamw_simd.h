/*
 * adamw_simd: the SIMD variants of zs_adamw_ref, one file per ISA, compiled with that ISA's
 * flags and called only when the CPU has it (kernels/adamw.c chooses).  Same arguments and
 * same bits as zs_adamw_ref.
 */
#ifndef ZS_ADAMW_SIMD_H
#define ZS_ADAMW_SIMD_H

#include "kernels/adamw.h"

void zs_adamw_avx2(float *param, float *m, float *v, const float *grad, uint16_t *bf16, size_t n,
                   const zs_adamw_hparams *hp);
void zs_adamw_avx512(float *param, float *m, float *v, const float *grad, uint16_t *bf16,
                     size_t n, const zs_adamw_hparams *hp);

#endif
