/*
 * test_fp16: the binary16 emulation (common/fp16.h): round to nearest even, subnormals,
 * overflow to inf, NaN, exact widening, and the gradient's scale-and-round.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/fp16.h"
#include "test.h"

#define CHECK_HALF(f, bits)                                                                        \
    do {                                                                                           \
        unsigned zs_got_ = zs_f32_to_f16(f), zs_want_ = (bits);                                    \
        zs_test_checks++;                                                                          \
        if (zs_got_ != zs_want_) {                                                                 \
            zs_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: zs_f32_to_f16(%a) = 0x%04x, expected 0x%04x\n", __FILE__,      \
                    __LINE__, (double)(f), zs_got_, zs_want_);                                     \
        }                                                                                          \
    } while (0)

static void test_cases(void)
{
    CHECK_HALF(0.0f, 0x0000);
    CHECK_HALF(-0.0f, 0x8000);
    CHECK_HALF(1.0f, 0x3c00);
    CHECK_HALF(-2.0f, 0xc000);
    CHECK_HALF(65504.0f, 0x7bff); /* the largest half */
    /* Ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
    CHECK_HALF(1.0f + ldexpf(1, -11), 0x3c00);
    CHECK_HALF(1.0f + 3 * ldexpf(1, -11), 0x3c02);
    CHECK_HALF(1.0f + ldexpf(1, -11) + ldexpf(1, -20), 0x3c01); /* above the tie: up */
    CHECK_HALF(2049.0f, 0x6800);                                /* 2048 */
    CHECK_HALF(2051.0f, 0x6802);                                /* 2052 */
    CHECK_HALF(2047.9f, 0x67ff + 1);                            /* carries into the exponent */
    /* Overflow: from the midpoint of 65504 and 2^16 on, inf of the same sign. */
    CHECK_HALF(65519.0f, 0x7bff);
    CHECK_HALF(65520.0f, 0x7c00);
    CHECK_HALF(-1e6f, 0xfc00);
    CHECK_HALF(INFINITY, 0x7c00);
    CHECK_HALF(-INFINITY, 0xfc00);
    /* Subnormals: 2^-24 is the smallest; 2^-25 is a tie that goes to 0 (even). */
    CHECK_HALF(ldexpf(1, -24), 0x0001);
    CHECK_HALF(ldexpf(1, -25), 0x0000);
    CHECK_HALF(-ldexpf(1, -25), 0x8000);
    CHECK_HALF(ldexpf(3, -26), 0x0001); /* 0.75 * 2^-24: up */
    CHECK_HALF(ldexpf(3, -25), 0x0002); /* 1.5 * 2^-24: a tie, to 2 (even) */
    CHECK_HALF(ldexpf(5, -25), 0x0002); /* 2.5 * 2^-24: a tie, to 2 (even) */
    CHECK_HALF(ldexpf(1, -30), 0x0000);
    CHECK_HALF(ldexpf(1, -14), 0x0400);                  /* the smallest normal */
    CHECK_HALF(ldexpf(1, -14) - ldexpf(1, -25), 0x0400); /* a tie at the top: to 0x400 */
    CHECK_HALF(ldexpf(1023, -24), 0x03ff);               /* the largest subnormal */
    /* NaN: a quiet NaN of the same sign. */
    uint16_t n = zs_f32_to_f16(NAN), m = zs_f32_to_f16(-NAN);
    CHECK((n & 0x7c00) == 0x7c00 && (n & 0x03ff) != 0 && !(n & 0x8000));
    CHECK((m & 0x7c00) == 0x7c00 && (m & 0x03ff) != 0 && (m & 0x8000));
    CHECK(isnan(zs_fp16_round(NAN)));
    CHECK(zs_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(zs_f16_to_f32(0x03ff) == ldexpf(1023, -24));
    CHECK(zs_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(isinf(zs_f16_to_f32(0xfc00)) && zs_f16_to_f32(0xfc00) < 0);
}

/* Every half widens exactly and rounds back to itself; where the compiler has _Float16, the
 * conversion is also checked against its (IEEE, ties-to-even) conversion on a sweep of floats. */
static void test_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = zs_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        bad += zs_f32_to_f16(f) != h;
    }
    CHECK_EQ_INT(bad, 0);
#ifdef __FLT16_MAX__
    bad = 0;
    /* Every 389th float bit pattern: all exponents, many mantissas, both signs. */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 389) {
        union {
            uint32_t u;
            float f;
        } x = {.u = (uint32_t)u};
        if (isnan(x.f))
            continue;
        _Float16 ref = (_Float16)x.f;
        uint16_t rb;
        memcpy(&rb, &ref, sizeof rb);
        if (zs_f32_to_f16(x.f) != rb && bad++ < 5)
            fprintf(stderr, "%a: 0x%04x, _Float16 gives 0x%04x\n", (double)x.f, zs_f32_to_f16(x.f),
                    rb);
    }
    CHECK_EQ_INT(bad, 0);
#endif
}

static void test_scale_grads(void)
{
    float g[6] = {1e-8f, 1.0f, 3000.0f, NAN, -0.5f, 2047.0f / 32};
    size_t bad = zs_fp16_scale_grads(g, 6, 32.0f);
    CHECK_EQ_INT(bad, 2);
    CHECK(g[0] == zs_fp16_round(3.2e-7f) && g[0] > 0);
    CHECK(g[1] == 32.0f);
    CHECK(isinf(g[2]) && g[2] > 0); /* 96000: beyond fp16 */
    CHECK(isnan(g[3]));
    CHECK(g[4] == -16.0f);
    CHECK(g[5] == 2047.0f);
    /* The narrowed form: the fp16 bits of the same results, at the buffer's front. */
    float n[6] = {1e-8f, 1.0f, 3000.0f, NAN, -0.5f, 2047.0f / 32};
    CHECK_EQ_INT(zs_fp16_scale_narrow(n, 6, 32.0f), 2);
    uint16_t h[6];
    memcpy(h, n, sizeof h);
    for (int i = 0; i < 6; i++) {
        float back = zs_f16_to_f32(h[i]);
        CHECK(memcmp(&back, &g[i], sizeof back) == 0 || (isnan(back) && isnan(g[i])));
    }
    float w[3] = {1.0f + ldexpf(1, -11), 70000.0f, -ldexpf(1, -26)};
    zs_fp16_round_array(w, w, 3, 2);
    CHECK(w[0] == 1.0f && isinf(w[1]) && w[2] == 0.0f && signbit(w[2]));
}

int main(void)
{
    test_cases();
    test_exhaustive();
    test_scale_grads();
    return zs_test_result("test_fp16");
}
