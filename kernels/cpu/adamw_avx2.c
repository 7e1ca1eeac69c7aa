/*
 * adamw_avx2: zs_adamw_ref 8 floats at a time; the head and the tail run through the scalar
 * reference, which performs the same operations.  No FMA: the reference rounds after each
 * multiply.  Loads and stores are unaligned, as the partition server's buffers may be.
 *
 * The update is bound by memory, not by its divisions and square root, so the loop is shaped
 * around the traffic as in adamw_avx512.c (which says what each part buys): software prefetch
 * ADAMW_AHEAD elements ahead in p, m, v and g, and streaming stores of whole cache lines of
 * the 16-bit copy (bf16, or fp16 through F16C's vcvtps2ph in an fp16 job), 32 elements (4
 * vectors) per iteration.  The head, up to 31 elements, brings the copy to a line boundary.
 */
#include <immintrin.h>

#include "kernels/cpu/adamw_simd.h"

/* Prefetch distance in elements, as in adamw_avx512.c. */
#define ADAMW_AHEAD 768

/* zs_f32_to_bf16 on 8 lanes, as 8 x uint32 (each <= 0xffff): round to nearest even by adding
 * 0x7fff plus the kept part's lowest bit, NaN to quiet NaN by setting bit 6 of the kept
 * part. */
static inline __m256i to_bf16_32(__m256 p)
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
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

/* 16 bf16 from two vectors of 8: every lane is <= 0xffff, so the unsigned saturating pack is
 * exact.  It packs within 128-bit lanes (a0-3, b0-3, a4-7, b4-7 as 64-bit quarters); the
 * permute puts the quarters in order. */
static inline __m256i pack_bf16(__m256 a, __m256 b)
{
    __m256i packed = _mm256_packus_epi32(to_bf16_32(a), to_bf16_32(b));
    return _mm256_permute4x64_epi64(packed, 0xd8);
}

/* x with every NaN lane replaced by ZS_ADAMW_NAN_BITS. */
static inline __m256 canonical_nan(__m256 x)
{
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(ZS_ADAMW_NAN_BITS)), nan);
}

typedef struct {
    __m256 gs, df, omb1, b2, omb2, bc2, eps, step;
} consts;

/* p, m and v of elements [i, i+8); returns the new p. */
static inline __m256 update8(float *param, float *m, float *v, const float *grad, size_t i,
                             const consts *c)
{
    __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), c->gs);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(param + i), c->df);
    __m256 mi = _mm256_loadu_ps(m + i);
    __m256 vi = _mm256_loadu_ps(v + i);
    mi = _mm256_add_ps(mi, _mm256_mul_ps(c->omb1, _mm256_sub_ps(g, mi)));
    vi = _mm256_add_ps(_mm256_mul_ps(vi, c->b2), _mm256_mul_ps(_mm256_mul_ps(c->omb2, g), g));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), c->bc2), c->eps);
    p = canonical_nan(_mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(c->step, mi), denom)));
    _mm256_storeu_ps(param + i, p);
    _mm256_storeu_ps(m + i, canonical_nan(mi));
    _mm256_storeu_ps(v + i, canonical_nan(vi));
    return p;
}

/* 16 halves of hp->half's format from two vectors of 8.  fp16: vcvtps2ph with round to
 * nearest even, which is zs_f32_to_f16 on every input (common/fp16.h). */
static inline __m256i pack_half(__m256 a, __m256 b, int f16)
{
    if (!f16)
        return pack_bf16(a, b);
    __m128i lo = _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i hi = _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

void zs_adamw_avx2(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
                   const zs_adamw_hparams *hp)
{
    const consts c = {
        .gs = _mm256_set1_ps(hp->grad_scale),
        .df = _mm256_set1_ps(hp->decay_factor),
        .omb1 = _mm256_set1_ps(hp->one_minus_b1),
        .b2 = _mm256_set1_ps(hp->beta2),
        .omb2 = _mm256_set1_ps(hp->one_minus_b2),
        .bc2 = _mm256_set1_ps(hp->bc2_sqrt),
        .eps = _mm256_set1_ps(hp->eps),
        .step = _mm256_set1_ps(hp->step_size),
    };
    int f16 = hp->half == ZS_HALF_F16;
    size_t i = zs_adamw_half_head(half, n);
    if (i > 0)
        zs_adamw_ref(param, m, v, grad, half, i, hp);
    for (; i + 32 <= n; i += 32) {
        /* Near the end, prefetch the current lines again (already cached) rather than
         * form pointers past the arrays. */
        size_t a = i + ADAMW_AHEAD + 32 <= n ? i + ADAMW_AHEAD : i;
        _mm_prefetch((const char *)(grad + a), _MM_HINT_T0);
        _mm_prefetch((const char *)(grad + a + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(param + a), _MM_HINT_T0);
        _mm_prefetch((const char *)(param + a + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(m + a), _MM_HINT_T0);
        _mm_prefetch((const char *)(m + a + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(v + a), _MM_HINT_T0);
        _mm_prefetch((const char *)(v + a + 16), _MM_HINT_T0);
        __m256 p0 = update8(param, m, v, grad, i, &c);
        __m256 p1 = update8(param, m, v, grad, i + 8, &c);
        __m256 p2 = update8(param, m, v, grad, i + 16, &c);
        __m256 p3 = update8(param, m, v, grad, i + 24, &c);
        if (half) {
            _mm256_stream_si256((__m256i *)(half + i), pack_half(p0, p1, f16));
            _mm256_stream_si256((__m256i *)(half + i + 16), pack_half(p2, p3, f16));
        }
    }
    if (i < n)
        zs_adamw_ref(param + i, m + i, v + i, grad + i, half ? half + i : NULL, n - i, hp);
    /* Streaming stores are weakly ordered: make them visible before the caller hands the copy
     * to another thread. */
    if (half)
        _mm_sfence();
}
