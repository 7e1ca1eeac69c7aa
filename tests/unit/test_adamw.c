/*
 * adamw: every SIMD variant and thread count gives bitwise the reference's p, m, v and bf16,
 * over sizes around the vector widths and values that stress IEEE corners (zeros of both
 * signs, denormals, huge magnitudes, overflow to inf, NaN); and the reference itself agrees
 * with the formula evaluated in double.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/adamw.h"
#include "kernels/cpu/adamw_simd.h"
#include "tests/unit/test.h"

static uint64_t rng_state = 0x12345678abcdefull;

static uint64_t next_u64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((next_u64() >> 40) * 0x1.0p-24);
}

/* A value from a mix of regimes; i picks special cases at fixed positions. */
static float value(size_t i, float scale)
{
    switch (next_u64() % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return uniform(-1e-40f, 1e-40f); /* denormal */
    case 3: return uniform(-1e30f, 1e30f);
    case 4: return (i & 1) ? 3e38f : -3e38f;
    default: return uniform(-scale, scale);
    }
}

typedef struct {
    float *p, *m, *v, *g;
    uint16_t *b;
} state;

static void fill(state *s, size_t n, int with_nan)
{
    for (size_t i = 0; i < n; i++) {
        s->p[i] = value(i, 1.0f);
        s->m[i] = value(i, 0.1f);
        s->v[i] = fabsf(value(i, 0.01f));
        s->g[i] = value(i, 1.0f);
        if (with_nan && i % 97 == 5)
            s->g[i] = NAN;
        if (with_nan && i % 89 == 3)
            s->p[i] = -NAN;
    }
}

static state alloc_state(size_t n)
{
    state s = {malloc(n * 4), malloc(n * 4), malloc(n * 4), malloc(n * 4), malloc(n * 2)};
    return s;
}

static void copy_state(state *d, const state *s, size_t n)
{
    memcpy(d->p, s->p, n * 4);
    memcpy(d->m, s->m, n * 4);
    memcpy(d->v, s->v, n * 4);
    memcpy(d->g, s->g, n * 4);
    memset(d->b, 0xAB, n * 2);
}

static void free_state(state *s)
{
    free(s->p);
    free(s->m);
    free(s->v);
    free(s->g);
    free(s->b);
}

/* First index where two arrays' bits differ, or n. */
static size_t first_diff(const void *a, const void *b, size_t n, size_t elem)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem) != 0)
            return i;
    return n;
}

static void compare(const char *what, const state *ref, const state *got, size_t n)
{
    const char *names[4] = {"param", "m", "v", "bf16"};
    const void *r[4] = {ref->p, ref->m, ref->v, ref->b}, *o[4] = {got->p, got->m, got->v, got->b};
    size_t sz[4] = {4, 4, 4, 2};
    for (int k = 0; k < 4; k++) {
        size_t i = first_diff(r[k], o[k], n, sz[k]);
        zs_test_checks++;
        if (i < n) {
            zs_test_failures++;
            uint32_t a = 0, b = 0;
            memcpy(&a, (const char *)r[k] + i * sz[k], sz[k]);
            memcpy(&b, (const char *)o[k] + i * sz[k], sz[k]);
            fprintf(stderr, "%s n=%zu: %s[%zu] ref 0x%08x got 0x%08x\n", what, n, names[k], i, a,
                    b);
        }
    }
}

static void test_bitwise(void)
{
    const size_t sizes[] = {1, 7, 8, 9, 15, 16, 17, 4096, 1048579};
    const long steps[] = {1, 2, 1000};
    int have512 = !!__builtin_cpu_supports("avx512f") && !!__builtin_cpu_supports("avx512bw");
    int have2 = !!__builtin_cpu_supports("avx2");
    printf("test_adamw: CPU has avx2 %d, avx512 %d; zs_adamw uses %s\n", have2, have512,
           zs_adamw_isa());
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        state base = alloc_state(n), ref = alloc_state(n), got = alloc_state(n);
        for (int variant = 0; variant < 6; variant++) {
            long t = steps[variant % 3];
            double wd = variant < 3 ? 0.1 : 0.0;
            float gs = variant % 2 ? 0.25f : 1.0f;
            zs_adamw_hparams hp = zs_adamw_hparams_make(1e-3, 0.9, 0.999, 1e-8, wd, t, gs);
            fill(&base, n, variant >= 4);
            copy_state(&ref, &base, n);
            zs_adamw_ref(ref.p, ref.m, ref.v, ref.g, ref.b, n, &hp);
            char what[64];
            if (have2) {
                copy_state(&got, &base, n);
                zs_adamw_avx2(got.p, got.m, got.v, got.g, got.b, n, &hp);
                snprintf(what, sizeof what, "avx2 t=%ld", t);
                compare(what, &ref, &got, n);
            }
            if (have512) {
                copy_state(&got, &base, n);
                zs_adamw_avx512(got.p, got.m, got.v, got.g, got.b, n, &hp);
                snprintf(what, sizeof what, "avx512 t=%ld", t);
                compare(what, &ref, &got, n);
            }
            for (int threads = 1; threads <= 3; threads++) {
                copy_state(&got, &base, n);
                zs_adamw(got.p, got.m, got.v, got.g, got.b, n, &hp, threads);
                snprintf(what, sizeof what, "zs_adamw %d threads t=%ld", threads, t);
                compare(what, &ref, &got, n);
            }
            /* bf16 output is optional. */
            copy_state(&got, &base, n);
            zs_adamw(got.p, got.m, got.v, got.g, NULL, n, &hp, 2);
            CHECK(first_diff(got.p, ref.p, n, 4) == n);
        }
        free_state(&base);
        free_state(&ref);
        free_state(&got);
    }
}

/* The reference against the formula in double, on ordinary values. */
static void test_formula(void)
{
    enum { N = 1000 };
    float p[N], m[N], v[N], g[N];
    double pd[N], md[N], vd[N];
    for (int i = 0; i < N; i++) {
        p[i] = uniform(-1, 1);
        m[i] = uniform(-0.01f, 0.01f);
        v[i] = uniform(0, 1e-4f);
        g[i] = uniform(-0.1f, 0.1f);
        pd[i] = p[i], md[i] = m[i], vd[i] = v[i];
    }
    double lr = 3e-4, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    long t = 7;
    zs_adamw_hparams hp = zs_adamw_hparams_make(lr, b1, b2, eps, wd, t, (float)gs);
    zs_adamw_ref(p, m, v, g, NULL, N, &hp);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double gg = g[i] * gs;
        pd[i] *= 1 - lr * wd;
        md[i] = b1 * md[i] + (1 - b1) * gg;
        vd[i] = b2 * vd[i] + (1 - b2) * gg * gg;
        double mhat = md[i] / (1 - pow(b1, t)), vhat = vd[i] / (1 - pow(b2, t));
        pd[i] -= lr * mhat / (sqrt(vhat) + eps);
        double e = fabs(p[i] - pd[i]) / (fabs(pd[i]) + 1e-3);
        worst = e > worst ? e : worst;
    }
    /* fp32 rounding of a handful of operations: a few ulps of the weight. */
    CHECK_NEAR(worst, 0, 1e-6);
}

static void test_bf16(void)
{
    union {
        uint32_t u;
        float f;
    } x;
    x.u = 0x3F808000; /* tie, even below: rounds down */
    CHECK_EQ_INT(zs_f32_to_bf16(x.f), 0x3F80);
    x.u = 0x3F818000; /* tie, odd below: rounds up */
    CHECK_EQ_INT(zs_f32_to_bf16(x.f), 0x3F82);
    x.u = 0x3F808001; /* above the tie */
    CHECK_EQ_INT(zs_f32_to_bf16(x.f), 0x3F81);
    CHECK_EQ_INT(zs_f32_to_bf16(INFINITY), 0x7F80);
    CHECK_EQ_INT(zs_f32_to_bf16(-INFINITY), 0xFF80);
    x.u = 0x7F7FFFFF; /* FLT_MAX rounds to inf, as IEEE round-to-nearest does */
    CHECK_EQ_INT(zs_f32_to_bf16(x.f), 0x7F80);
    x.u = 0x7F800001; /* signalling NaN with a low payload stays NaN */
    CHECK_EQ_INT(zs_f32_to_bf16(x.f), 0x7FC0);
    x.u = 0xFFC00000;
    CHECK_EQ_INT(zs_f32_to_bf16(x.f), 0xFFC0);
    CHECK(zs_bf16_to_f32(0x3F80) == 1.0f);
}

int main(void)
{
    test_bitwise();
    test_formula();
    test_bf16();
    return zs_test_result("test_adamw");
}
