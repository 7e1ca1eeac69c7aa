/*
 * adamw_avx512: zs_adamw_ref 16 floats at a time.  No FMA: the reference rounds after each
 * multiply.  Loads and stores are unaligned, as the partition server's buffers may be.
 *
 * The update is bound by memory, not by its two divisions and square root (replacing them by
 * multiplies leaves the time unchanged), so the loop is shaped around the traffic:
 *   - software prefetch ADAMW_AHEAD elements ahead in p, m, v and g.  With four read streams
 *     the hardware prefetchers do not keep enough misses in flight; the explicit prefetches
 *     cut the time per element by ~20% on two threads and ~30% on one (Sapphire Rapids class,
 *     bench_adamw);
 *   - the 16-bit copy (bf16, or fp16 in an fp16 job), which is written and never read, goes
 *     out with streaming stores of whole cache lines (32 elements), which skip the read for
 *     ownership of each line; ~5%.
 *     p, m and v are not streamed: their lines were just read, and streaming them was slower.
 * A head of up to 31 elements brings the copy to a line boundary, the tail (what is left of 32)
 * runs with masked loads and stores; masked-off lanes compute on zeros, which raises nothing
 * and is never stored.
 */
#include <immintrin.h>

#include "kernels/cpu/adamw_simd.h"

/* Prefetch distance in elements: 3 KiB ahead in each stream.  512 to 1024 measured alike;
 * 2048 was slower. */
#define ADAMW_AHEAD 768

/* zs_f32_to_bf16 on 16 lanes with integer operations: round to nearest even by adding
 * 0x7fff plus the kept part's lowest bit, NaN to quiet NaN by setting bit 6 of the kept
 * part.  (AVX512_BF16's vcvtneps2bf16 is not used: the integer form is the reference's,
 * exactly, on every input.) */
static inline __m256i to_bf16(__m512 p)
{
    __m512i u = _mm512_castps_si512(p);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

/* The copy of 16 lanes in hp->half's format.  fp16: vcvtps2ph with round to nearest even,
 * which is zs_f32_to_f16 on every input (common/fp16.h says why; test_adamw checks it). */
static inline __m256i to_half(__m512 p, int f16)
{
    return f16 ? _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) : to_bf16(p);
}

/* x with every NaN lane replaced by ZS_ADAMW_NAN_BITS. */
static inline __m512 canonical_nan(__m512 x)
{
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(nan, x, _mm512_castsi512_ps(_mm512_set1_epi32(ZS_ADAMW_NAN_BITS)));
}

typedef struct {
    __m512 gs, df, omb1, b2, omb2, bc2, eps, step;
    int f16; /* the copy is fp16 (else bf16) */
} consts;

/* p, m and v of elements [i, i+16), lanes selected by k; returns the new p. */
static inline __m512 update16(float *param, float *m, float *v, const float *grad, size_t i,
                              __mmask16 k, const consts *c)
{
    __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, grad + i), c->gs);
    __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, param + i), c->df);
    __m512 mi = _mm512_maskz_loadu_ps(k, m + i);
    __m512 vi = _mm512_maskz_loadu_ps(k, v + i);
    mi = _mm512_add_ps(mi, _mm512_mul_ps(c->omb1, _mm512_sub_ps(g, mi)));
    vi = _mm512_add_ps(_mm512_mul_ps(vi, c->b2), _mm512_mul_ps(_mm512_mul_ps(c->omb2, g), g));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), c->bc2), c->eps);
    p = canonical_nan(_mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(c->step, mi), denom)));
    _mm512_mask_storeu_ps(param + i, k, p);
    _mm512_mask_storeu_ps(m + i, k, canonical_nan(mi));
    _mm512_mask_storeu_ps(v + i, k, canonical_nan(vi));
    return p;
}

/* Elements [i, i+len), len <= 16, with ordinary (masked) stores of the copy. */
static inline void update_part(float *param, float *m, float *v, const float *grad, uint16_t *half,
                               size_t i, size_t len, const consts *c)
{
    __mmask16 k = (__mmask16)((1u << len) - 1);
    __m512 p = update16(param, m, v, grad, i, k, c);
    if (half)
        _mm256_mask_storeu_epi16(half + i, k, to_half(p, c->f16));
}

void zs_adamw_avx512(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
                     const zs_adamw_hparams *hp)
{
    const consts c = {
        .gs = _mm512_set1_ps(hp->grad_scale),
        .df = _mm512_set1_ps(hp->decay_factor),
        .omb1 = _mm512_set1_ps(hp->one_minus_b1),
        .b2 = _mm512_set1_ps(hp->beta2),
        .omb2 = _mm512_set1_ps(hp->one_minus_b2),
        .bc2 = _mm512_set1_ps(hp->bc2_sqrt),
        .eps = _mm512_set1_ps(hp->eps),
        .step = _mm512_set1_ps(hp->step_size),
        .f16 = hp->half == ZS_HALF_F16,
    };
    size_t head = zs_adamw_half_head(half, n), i = 0;
    while (i < head) {
        size_t len = head - i < 16 ? head - i : 16;
        update_part(param, m, v, grad, half, i, len, &c);
        i += len;
    }
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
        __m512 p0 = update16(param, m, v, grad, i, (__mmask16)0xffff, &c);
        __m512 p1 = update16(param, m, v, grad, i + 16, (__mmask16)0xffff, &c);
        if (half)
            _mm512_stream_si512((void *)(half + i),
                                _mm512_inserti64x4(_mm512_castsi256_si512(to_half(p0, c.f16)),
                                                   to_half(p1, c.f16), 1));
    }
    while (i < n) {
        size_t len = n - i < 16 ? n - i : 16;
        update_part(param, m, v, grad, half, i, len, &c);
        i += len;
    }
    /* Streaming stores are weakly ordered: make them visible before the caller hands the copy
     * to another thread. */
    if (half)
        _mm_sfence();
}
