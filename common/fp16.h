/*
 * fp16: IEEE 754 binary16 ("half") emulated on the CPU, for fp16.enabled (docs/precision.md).
 *
 * zshard's CPU kernels compute in fp32.  An fp16 job rounds what fp16 hardware would hold in
 * fp16 through these functions, with fixed rules, so that every run (`zshard train` and a
 * `zshard launch` job of any shape) produces the same bits:
 *  - the weights the model computes with: fp32 master weights rounded to fp16 and widened back
 *    (zs_fp16_round_array);
 *  - a chunk's gradient: multiplied by the loss scale, then rounded to fp16
 *    (zs_fp16_scale_grads), an |x| beyond fp16's range becoming inf, i.e. an overflow.
 *
 * Invariant: zs_f32_to_f16 rounds to nearest, ties to even, exactly as IEEE conversion (and
 * x86 F16C's vcvtps2ph with round-to-nearest) does: fp16 subnormals are produced (2^-24 is the
 * smallest), values at or beyond 65520 (the midpoint of 65504 and 2^16) become inf of the
 * same sign, a NaN stays a quiet NaN of the same sign.  Widening is exact.
 */
#ifndef ZS_FP16_H
#define ZS_FP16_H

#include <stddef.h>
#include <stdint.h>

#include "common/half_format.h"

/* float -> binary16 bits, round to nearest even (see the invariant above). */
static inline uint16_t zs_f32_to_f16(float f)
{
    union {
        float f;
        uint32_t u;
    } x = {.f = f};
    uint32_t sign = (x.u >> 16) & 0x8000u;
    uint32_t a = x.u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, keep the top of the payload */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x01ffu));
    if (a >= 0x477ff000u) /* >= 65520 (inf included): rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* >= 2^-14: a normal half */
        /* Rebias the exponent (127 -> 15) and drop 13 mantissa bits, rounding to nearest even:
         * a carry out of the mantissa moves into the exponent, which is what rounding up a
         * value like 2047.99 to 2048 needs. */
        uint32_t r = a - 0x38000000u;
        r += 0x0fffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) /* < 2^-25 (half the smallest subnormal): rounds to zero */
        return (uint16_t)sign;
    /* A subnormal half: the value in units of 2^-24, from the fp32 significand with its
     * implicit bit, shifted right by 126 - 24 - 23 + 1 - exponent bits, ties to even. */
    uint32_t e = a >> 23; /* 102..112 */
    uint32_t m = (a & 0x007fffffu) | 0x00800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++; /* may carry into the smallest normal, 0x0400: still the right bits */
    return (uint16_t)(sign | q);
}

/* binary16 bits -> float, exact. */
static inline float zs_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x03ffu;
    uint32_t u;
    if (e == 0x1fu) {
        u = sign | 0x7f800000u | (m << 13); /* inf, NaN */
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        u = sign;
    } else { /* subnormal: m * 2^-24, normal in fp32 */
        int k = 0;
        while (!(m & 0x0400u)) {
            m <<= 1;
            k++;
        }
        u = sign | ((uint32_t)(113 - k) << 23) | ((m & 0x03ffu) << 13);
    }
    union {
        uint32_t u;
        float f;
    } x = {.u = u};
    return x.f;
}

/* f rounded to the nearest fp16 value, as a float. */
static inline float zs_fp16_round(float f)
{
    return zs_f16_to_f32(zs_f32_to_f16(f));
}

/* dst[i] = zs_fp16_round(src[i]) for i < n (dst may be src); threads > 1 splits the range with
 * OpenMP (elementwise: the same bits with any split). */
void zs_fp16_round_array(float *dst, const float *src, size_t n, int threads);

/*
 * A chunk's gradient as fp16 hardware would push it: g[i] = zs_fp16_round(g[i] * scale) for
 * i < n, in place.  scale is the step's loss scale (a power of two, so the product is exact
 * unless it overflows fp32, which rounds to inf as well).  Returns the number of elements that
 * are not finite afterwards: an overflow (|g * scale| >= 65520) or a NaN/inf the backward
 * produced.  The servers see them as the non-finite gradient that skips the step.
 */
size_t zs_fp16_scale_grads(float *g, size_t n, float scale);

/* The same, with the result as fp16 bits: element i's goes to bytes [2i, 2i + 2) of g, the front
 * half of the buffer (an F16 push's payload); element i's float is read before any byte of it is
 * written.  Widening element i gives zs_fp16_scale_grads's g[i], bit for bit. */
size_t zs_fp16_scale_narrow(float *g, size_t n, float scale);

#endif
