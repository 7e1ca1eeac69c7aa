/*
 * adamw_avx512: zs_adamw_ref 16 floats at a time; the tail runs through masked loads and
 * stores, so every element takes the same instruction sequence.  No FMA: the reference
 * rounds after each multiply.
 */
#include <immintrin.h>

#include "kernels/cpu/adamw_simd.h"

/* zs_f32_to_bf16 on 16 lanes: round to nearest even, NaN to quiet NaN. */
static inline __m256i to_bf16(__m512 p)
{
    __m512i u = _mm512_castps_si512(p);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

void zs_adamw_avx512(float *param, float *m, float *v, const float *grad, uint16_t *bf16,
                     size_t n, const zs_adamw_hparams *hp)
{
    const __m512 gs = _mm512_set1_ps(hp->grad_scale), df = _mm512_set1_ps(hp->decay_factor),
                 omb1 = _mm512_set1_ps(hp->one_minus_b1), b2 = _mm512_set1_ps(hp->beta2),
                 omb2 = _mm512_set1_ps(hp->one_minus_b2), bc2 = _mm512_set1_ps(hp->bc2_sqrt),
                 eps = _mm512_set1_ps(hp->eps), step = _mm512_set1_ps(hp->step_size);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, grad + i), gs);
        __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, param + i), df);
        __m512 mi = _mm512_maskz_loadu_ps(k, m + i);
        __m512 vi = _mm512_maskz_loadu_ps(k, v + i);
        mi = _mm512_add_ps(mi, _mm512_mul_ps(omb1, _mm512_sub_ps(g, mi)));
        vi = _mm512_add_ps(_mm512_mul_ps(vi, b2), _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
        p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(step, mi), denom));
        _mm512_mask_storeu_ps(param + i, k, p);
        _mm512_mask_storeu_ps(m + i, k, mi);
        _mm512_mask_storeu_ps(v + i, k, vi);
        if (bf16)
            _mm256_mask_storeu_epi16(bf16 + i, k, to_bf16(p));
    }
}
