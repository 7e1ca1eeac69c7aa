/*
 * adamw_avx2: zs_adamw_ref 8 floats at a time; the tail (n % 8 elements) runs through the
 * scalar reference, which performs the same operations.  No FMA: the reference rounds after
 * each multiply.  Loads and stores are unaligned, as the partition server's buffers may be.
 */
#include <immintrin.h>

#include "kernels/cpu/adamw_simd.h"

/* zs_f32_to_bf16 on 8 lanes, packed to 8 x uint16: round to nearest even by adding 0x7fff
 * plus the kept part's lowest bit, NaN to quiet NaN by setting bit 6 of the kept part. */
static inline __m128i to_bf16(__m256 p)
{
    __m256i u = _mm256_castps_si256(p);
    __m256i hi = _mm256_srli_epi32(u, 16);
    /* abs <= 0x7fffffff, so the signed compare is the unsigned one. */
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    /* Every lane is <= 0xffff, so the unsigned saturating pack is exact.  It packs within
     * 128-bit lanes (r0-3, r0-3, r4-7, r4-7 as 64-bit quarters); gather quarters 0 and 2. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
}

/* x with every NaN lane replaced by ZS_ADAMW_NAN_BITS. */
static inline __m256 canonical_nan(__m256 x)
{
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(ZS_ADAMW_NAN_BITS)), nan);
}

void zs_adamw_avx2(float *param, float *m, float *v, const float *grad, uint16_t *bf16, size_t n,
                   const zs_adamw_hparams *hp)
{
    const __m256 gs = _mm256_set1_ps(hp->grad_scale), df = _mm256_set1_ps(hp->decay_factor),
                 omb1 = _mm256_set1_ps(hp->one_minus_b1), b2 = _mm256_set1_ps(hp->beta2),
                 omb2 = _mm256_set1_ps(hp->one_minus_b2), bc2 = _mm256_set1_ps(hp->bc2_sqrt),
                 eps = _mm256_set1_ps(hp->eps), step = _mm256_set1_ps(hp->step_size);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(param + i), df);
        __m256 mi = _mm256_loadu_ps(m + i);
        __m256 vi = _mm256_loadu_ps(v + i);
        mi = _mm256_add_ps(mi, _mm256_mul_ps(omb1, _mm256_sub_ps(g, mi)));
        vi = _mm256_add_ps(_mm256_mul_ps(vi, b2), _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        p = canonical_nan(_mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(step, mi), denom)));
        _mm256_storeu_ps(param + i, p);
        _mm256_storeu_ps(m + i, canonical_nan(mi));
        _mm256_storeu_ps(v + i, canonical_nan(vi));
        if (bf16)
            _mm_storeu_si128((__m128i *)(bf16 + i), to_bf16(p));
    }
    if (i < n)
        zs_adamw_ref(param + i, m + i, v + i, grad + i, bf16 ? bf16 + i : NULL, n - i, hp);
}
