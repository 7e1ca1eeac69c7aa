/*
 * vmath: the vectorized exp, max and sums that the softmax (attention, cross-entropy) and
 * GELU kernels spend their non-sgemm time in.
 *
 * glibc's expf costs about 4 ns a call and does not vectorize without -ffast-math; these
 * loops do, with `#pragma omp simd`, and each is compiled for AVX-512, AVX2 and the x86-64
 * baseline (target_clones), chosen at load time.  That choice cannot change a result: every
 * element goes through the same IEEE single operations in the same order (no FMA: the build
 * has -ffp-contract=off), and sums use ZS_VLANES interleaved partial sums combined in a fixed
 * order, whatever the vector width.  Selects are written as integer bit masks because a
 * float ?: in the loop stops GCC from vectorizing it for AVX2 and SSE under -ftrapping-math.
 *
 * exp: Cody-Waite reduction x = n ln2 + r, a degree-7 polynomial for e^r (Cephes' expf
 * coefficients) and 2^n from the exponent bits; at most ~1.4 ulp from the true value on
 * [-87, 88], 0 below -87 (where expf is subnormal or 0), e^88 above 88 (no overflow to inf),
 * NaN for NaN.
 */
#include "kernels/kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The clones are static, called through plain exported wrappers: clang 14 gives the
 * dispatcher of an exported clone a different symbol name than other files call. */
#define VEC_CLONES static __attribute__((target_clones("avx512f", "avx2", "default")))

/* At -O1 (the sanitizer build) clang does not vectorize and warns about every omp simd. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wunknown-warning-option"
#pragma GCC diagnostic ignored "-Wpass-failed"

static inline int32_t bits_of(float f)
{
    union {
        float f;
        int32_t i;
    } u = {.f = f};
    return u.i;
}

static inline float float_of(int32_t i)
{
    union {
        int32_t i;
        float f;
    } u = {.i = i};
    return u.f;
}

/* m is 0 or -1: m ? a : b, bitwise. */
static inline float select_mask(int32_t m, float a, float b)
{
    return float_of((bits_of(a) & m) | (bits_of(b) & ~m));
}

static inline float exp_elem(float x)
{
    int32_t lo = -(int32_t)(x < -87.0f);
    int32_t hi = -(int32_t)(x > 88.0f);
    int32_t nan = -(int32_t)(x != x);
    float xc = select_mask(lo, -87.0f, select_mask(hi, 88.0f, select_mask(nan, 0.0f, x)));
    float n = xc * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: rounds to an integer */
    n = n - 12582912.0f;
    float r = xc - n * 0.693359375f; /* ln 2 in two parts; n * hi is exact */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    y = y * float_of(((int32_t)n + 127) << 23);
    return select_mask(lo, 0.0f, select_mask(nan, x, y));
}

VEC_CLONES void vexp(float *y, const float *x, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++)
        y[i] = exp_elem(x[i]);
}

VEC_CLONES double vexp_sum(float *x, int n, float shift)
{
    float acc[ZS_VLANES] = {0};
    int i = 0;
    for (; i + ZS_VLANES <= n; i += ZS_VLANES) {
        float *v = x + i;
#pragma omp simd
        for (int k = 0; k < ZS_VLANES; k++) {
            float e = exp_elem(v[k] - shift);
            v[k] = e;
            acc[k] += e;
        }
    }
    if (i < n) { /* the tail, padded with -inf (exp 0), through the same lanes */
        float v[ZS_VLANES];
        for (int k = 0; k < ZS_VLANES; k++)
            v[k] = i + k < n ? x[i + k] : -INFINITY;
#pragma omp simd
        for (int k = 0; k < ZS_VLANES; k++) {
            float e = exp_elem(v[k] - shift);
            v[k] = e;
            acc[k] += e;
        }
        memcpy(x + i, v, (size_t)(n - i) * sizeof *v);
    }
    double sum = 0.0;
    for (int k = 0; k < ZS_VLANES; k++)
        sum += acc[k];
    return sum;
}

VEC_CLONES float vmax(const float *x, int n)
{
    float m[ZS_VLANES];
    for (int k = 0; k < ZS_VLANES; k++)
        m[k] = -INFINITY;
    int i = 0;
    for (; i + ZS_VLANES <= n; i += ZS_VLANES) {
        const float *v = x + i;
#pragma omp simd
        for (int k = 0; k < ZS_VLANES; k++)
            m[k] = select_mask(-(int32_t)(v[k] > m[k]), v[k], m[k]);
    }
    float r = -INFINITY;
    for (int k = 0; k < ZS_VLANES; k++)
        r = m[k] > r ? m[k] : r;
    for (; i < n; i++)
        r = x[i] > r ? x[i] : r;
    return r;
}

VEC_CLONES float vdot(const float *a, const float *b, int n)
{
    float acc[ZS_VLANES] = {0};
    int i = 0;
    for (; i + ZS_VLANES <= n; i += ZS_VLANES) {
#pragma omp simd
        for (int k = 0; k < ZS_VLANES; k++)
            acc[k] += a[i + k] * b[i + k];
    }
    for (int k = 0; i < n; i++, k++)
        acc[k] += a[i] * b[i];
    float s = 0.0f;
    for (int k = 0; k < ZS_VLANES; k++)
        s += acc[k];
    return s;
}

void zs_vexp(float *y, const float *x, int n)
{
    vexp(y, x, n);
}

double zs_vexp_sum(float *x, int n, float shift)
{
    return vexp_sum(x, n, shift);
}

float zs_vmax(const float *x, int n)
{
    return vmax(x, n);
}

float zs_vdot(const float *a, const float *b, int n)
{
    return vdot(a, b, n);
}

float zs_expf(float x)
{
    return exp_elem(x);
}
