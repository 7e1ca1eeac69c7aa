/*
 * adamw: every SIMD variant and thread count gives bitwise the reference's p, m, v and bf16,
 * over sizes around the vector widths and the thread split, misaligned buffers, several
 * consecutive steps, and values that stress IEEE corners (zeros of both signs, denormals,
 * huge magnitudes, overflow to inf, NaNs with various signs and payloads, also meeting each
 * other in one operation); the SIMD variants also from every offset of bf16 within a cache
 * line, which moves their aligned head and their streamed part; the reference itself agrees with
 * the formula evaluated in double; and zs_f32_to_bf16 rounds as IEEE does.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/fp16.h"
#include "kernels/adamw.h"
#include "kernels/cpu/adamw_simd.h"
#include "tests/unit/test.h"

static uint64_t rng_state = 0x12345678abcdefull;

/* xorshift64: the same inputs on every run. */
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

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A value from a mix of regimes: mostly ordinary values of magnitude up to scale, with zeros,
 * denormals, huge values (whose squares overflow v to inf), infinities and, when nan is set,
 * NaNs of both signs, quiet and signalling, with different payloads. */
static float value(float scale, int nan)
{
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffa5a5a5u,
                                    0x7fc12345u};
    switch (next_u64() % 26) {
    case 0:
        return 0.0f;
    case 1:
        return -0.0f;
    case 2:
        return uniform(-1e-40f, 1e-40f);
    case 3:
        return uniform(-1e30f, 1e30f);
    case 4:
        return (next_u64() & 1) ? 3e38f : -3e38f;
    case 5:
        return (next_u64() & 1) ? INFINITY : -INFINITY;
    case 24: /* fp16's subnormals (an fp16 job's copy) */
        return uniform(-1e-5f, 1e-5f);
    case 25: /* around fp16's largest finite value, 65504 */
        return uniform(-7e4f, 7e4f);
    case 6:
    case 7:
        if (nan)
            return from_bits(nans[next_u64() % (sizeof nans / sizeof *nans)]);
        return uniform(-scale, scale);
    default:
        return uniform(-scale, scale);
    }
}

/* One optimizer state.  Buffers hold n + 1 elements, so that a state can be used from
 * element 1: the kernels must take pointers of any 4-byte alignment (bf16: 2-byte). */
typedef struct {
    float *p, *m, *v, *g;
    uint16_t *b;
} state;

static int alloc_state(state *s, size_t n)
{
    s->p = malloc((n + 1) * 4);
    s->m = malloc((n + 1) * 4);
    s->v = malloc((n + 1) * 4);
    s->g = malloc((n + 1) * 4);
    s->b = malloc((n + 1) * 2);
    return s->p && s->m && s->v && s->g && s->b;
}

static void free_state(state *s)
{
    free(s->p);
    free(s->m);
    free(s->v);
    free(s->g);
    free(s->b);
}

static state offset_state(const state *s, size_t k)
{
    return (state){s->p + k, s->m + k, s->v + k, s->g + k, s->b + k};
}

static void fill(state *s, size_t n, int nan)
{
    for (size_t i = 0; i < n; i++) {
        s->p[i] = value(1.0f, nan);
        s->m[i] = value(0.1f, nan);
        float v = value(0.01f, nan);
        s->v[i] = isnan(v) ? v : fabsf(v); /* v >= 0 unless NaN, as the optimizer keeps it */
        s->g[i] = value(1.0f, nan);
    }
}

static void copy_state(state *d, const state *s, size_t n)
{
    memcpy(d->p, s->p, n * 4);
    memcpy(d->m, s->m, n * 4);
    memcpy(d->v, s->v, n * 4);
    memcpy(d->g, s->g, n * 4);
    memset(d->b, 0xab, n * 2);
}

/* First index where two arrays' bits differ, or n. */
static size_t first_diff(const void *a, const void *b, size_t n, size_t elem)
{
    if (memcmp(a, b, n * elem) == 0)
        return n;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem) != 0)
            return i;
    return n;
}

/* Bitwise comparison of p, m, v and (when with_bf16) bf16; prints the first mismatch of each
 * array with both values in hex. */
static void compare(const char *what, const state *ref, const state *got, size_t n, int with_bf16)
{
    const char *names[4] = {"param", "m", "v", "bf16"};
    const void *r[4] = {ref->p, ref->m, ref->v, ref->b}, *o[4] = {got->p, got->m, got->v, got->b};
    const size_t sz[4] = {4, 4, 4, 2};
    for (int k = 0; k < (with_bf16 ? 4 : 3); k++) {
        size_t i = first_diff(r[k], o[k], n, sz[k]);
        zs_test_checks++;
        if (i < n) {
            zs_test_failures++;
            uint32_t a = 0, b = 0;
            memcpy(&a, (const char *)r[k] + i * sz[k], sz[k]);
            memcpy(&b, (const char *)o[k] + i * sz[k], sz[k]);
            fprintf(stderr, "%s n=%zu: %s[%zu] ref 0x%0*x got 0x%0*x\n", what, n, names[k], i,
                    (int)sz[k] * 2, a, (int)sz[k] * 2, b);
        }
    }
}

/* Every NaN the reference stored in p, m, v is the canonical one (and its bf16 0x7fc0); and
 * there are NaNs, so that the bitwise comparison covered them. */
static void check_nans(const state *s, size_t n, zs_half_format fmt)
{
    uint16_t nan16 = fmt == ZS_HALF_F16 ? 0x7e00 : 0x7fc0;
    size_t count = 0, bad = 0;
    const float *arr[3] = {s->p, s->m, s->v};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &arr[k][i], 4);
            if (isnan(arr[k][i])) {
                count++;
                bad += u != ZS_ADAMW_NAN_BITS || (k == 0 && s->b[i] != nan16);
            }
        }
    CHECK_EQ_INT(bad, 0);
    if (n >= 4096)
        CHECK(count > 0);
}

/* The implementations under test, each on its own misaligned copy of the state. */
enum { IMPL_AVX2, IMPL_AVX512, IMPL_T1, IMPL_T2, IMPL_T3, IMPL_NOBF16, IMPL_COUNT };
static const char *impl_names[IMPL_COUNT] = {"avx2",
                                             "avx512",
                                             "zs_adamw 1 thread",
                                             "zs_adamw 2 threads",
                                             "zs_adamw 3 threads",
                                             "zs_adamw 2 threads, no bf16"};

static void run_impl(int impl, const state *s, size_t n, const zs_adamw_hparams *hp)
{
    switch (impl) {
    case IMPL_AVX2:
        zs_adamw_avx2(s->p, s->m, s->v, s->g, s->b, n, hp);
        break;
    case IMPL_AVX512:
        zs_adamw_avx512(s->p, s->m, s->v, s->g, s->b, n, hp);
        break;
    case IMPL_T1:
        zs_adamw(s->p, s->m, s->v, s->g, s->b, n, hp, 1);
        break;
    case IMPL_T2:
        zs_adamw(s->p, s->m, s->v, s->g, s->b, n, hp, 2);
        break;
    case IMPL_T3:
        zs_adamw(s->p, s->m, s->v, s->g, s->b, n, hp, 3);
        break;
    case IMPL_NOBF16:
        zs_adamw(s->p, s->m, s->v, s->g, NULL, n, hp, 2);
        break;
    }
}

static void test_bitwise(void)
{
    /* Around the vector widths (8, 16), and around the thread split: zs_adamw gives a thread
     * at least 16384 elements and cuts at multiples of 64, so 3 * 16384 + 2 leaves a short
     * last range and 1048579 a tail in the last of three. */
    const size_t sizes[] = {1, 7, 8, 9, 15, 16, 17, 4096, 2 * 16384 + 1, 3 * 16384 + 2, 1048579};
    const long steps[] = {1, 2, 1000};
    const struct {
        double wd;
        float grad_scale;
        int nan;
    } configs[] = {{0.1, 1.0f, 0}, {0.0, 0.25f, 0}, {0.1, 0.25f, 1}, {0.0, 1.0f, 1}};
    __builtin_cpu_init();
    int have[IMPL_COUNT] = {1, 1, 1, 1, 1, 1};
    have[IMPL_AVX512] = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    have[IMPL_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    printf("test_adamw: CPU has avx2 %d, avx512 %d; zs_adamw uses %s\n", have[IMPL_AVX2],
           have[IMPL_AVX512], zs_adamw_isa());
    fflush(stdout);
    for (size_t si = 0; si < 2 * sizeof sizes / sizeof *sizes; si++) {
        /* Each size twice: the copy in bf16, then in fp16. */
        size_t n = sizes[si / 2];
        zs_half_format fmt = si % 2 ? ZS_HALF_F16 : ZS_HALF_BF16;
        state base, ref, buf[IMPL_COUNT];
        int ok = alloc_state(&base, n) & alloc_state(&ref, n);
        for (int k = 0; k < IMPL_COUNT; k++)
            ok &= alloc_state(&buf[k], n);
        CHECK(ok);
        for (size_t ci = 0; ok && ci < sizeof configs / sizeof *configs; ci++) {
            fill(&base, n, configs[ci].nan);
            copy_state(&ref, &base, n);
            state got[IMPL_COUNT];
            for (int k = 0; k < IMPL_COUNT; k++) {
                got[k] = offset_state(&buf[k], 1);
                copy_state(&got[k], &base, n);
            }
            /* Consecutive steps on the same state: later steps start from the infs and NaNs
             * that earlier ones left in m and v. */
            for (size_t ti = 0; ti < sizeof steps / sizeof *steps; ti++) {
                zs_adamw_hparams hp = zs_adamw_hparams_make(1e-3, 0.9, 0.999, 1e-8, configs[ci].wd,
                                                            steps[ti], configs[ci].grad_scale);
                hp.half = fmt;
                zs_adamw_ref(ref.p, ref.m, ref.v, ref.g, ref.b, n, &hp);
                for (int k = 0; k < IMPL_COUNT; k++) {
                    if (!have[k])
                        continue;
                    run_impl(k, &got[k], n, &hp);
                    char what[128];
                    snprintf(what, sizeof what, "%s, %s copy, config %zu, t=%ld", impl_names[k],
                             fmt == ZS_HALF_F16 ? "fp16" : "bf16", ci, steps[ti]);
                    compare(what, &ref, &got[k], n, k != IMPL_NOBF16);
                }
            }
            check_nans(&ref, n, fmt);
        }
        free_state(&base);
        free_state(&ref);
        for (int k = 0; k < IMPL_COUNT; k++)
            free_state(&buf[k]);
    }
}

/* The SIMD variants run a head up to the next cache line of the 16-bit copy, whole lines with
 * streaming stores of the copy and software prefetch (clamped near the end), and a tail: every
 * start offset within a line (the float arrays move with it), in both formats of the copy, with
 * sizes that end in the head, just past it, and past the prefetch distance. */
static void test_offsets(void)
{
    const size_t sizes[] = {5, 40, 100, 2000};
    int have_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    int have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    enum { MAXN = 2000 + 64 };
    state base, ref, got;
    int ok = alloc_state(&base, MAXN) & alloc_state(&ref, MAXN) & alloc_state(&got, MAXN);
    CHECK(ok);
    for (size_t si = 0; ok && si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        for (int f16 = 0; f16 < 2; f16++) /* the copy in bf16, then in fp16 */
            for (size_t k = 0; k < 64; k++) {
                fill(&base, n + k, 1);
                zs_adamw_hparams hp = zs_adamw_hparams_make(1e-3, 0.9, 0.999, 1e-8, 0.1, 3, 0.5f);
                hp.half = f16 ? ZS_HALF_F16 : ZS_HALF_BF16;
                state r = offset_state(&ref, k), o = offset_state(&got, k),
                      b = offset_state(&base, k);
                copy_state(&r, &b, n);
                zs_adamw_ref(r.p, r.m, r.v, r.g, r.b, n, &hp);
                for (int isa = 0; isa < 2; isa++) {
                    if (!(isa ? have_avx512 : have_avx2))
                        continue;
                    copy_state(&o, &b, n);
                    if (isa)
                        zs_adamw_avx512(o.p, o.m, o.v, o.g, o.b, n, &hp);
                    else
                        zs_adamw_avx2(o.p, o.m, o.v, o.g, o.b, n, &hp);
                    char what[96];
                    snprintf(what, sizeof what, "%s, %s copy, offset %zu", isa ? "avx512" : "avx2",
                             f16 ? "fp16" : "bf16", k);
                    compare(what, &r, &o, n, 1);
                }
            }
    }
    free_state(&base);
    free_state(&ref);
    free_state(&got);
}

static double rel_err(double got, double want)
{
    return fabs(got - want) / fabs(want);
}

/* The reference against the formula in double, on ordinary values, over a few steps. */
static void test_formula(void)
{
    enum { N = 1000 };
    static float p[N], m[N], v[N], g[N];
    static double pd[N], md[N], vd[N];
    for (int i = 0; i < N; i++) {
        p[i] = uniform(-1, 1);
        m[i] = uniform(-0.01f, 0.01f);
        v[i] = uniform(1e-6f, 1e-4f);
        pd[i] = p[i], md[i] = m[i], vd[i] = v[i];
    }
    const double lr = 3e-4, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    double worst_p = 0, worst_m = 0, worst_v = 0;
    for (long t = 1; t <= 5; t++) {
        for (int i = 0; i < N; i++)
            g[i] = uniform(-0.1f, 0.1f);
        zs_adamw_hparams hp = zs_adamw_hparams_make(lr, b1, b2, eps, wd, t, (float)gs);
        zs_adamw_ref(p, m, v, g, NULL, N, &hp);
        for (int i = 0; i < N; i++) {
            double gg = g[i] * gs;
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * gg;
            vd[i] = b2 * vd[i] + (1 - b2) * gg * gg;
            double mhat = md[i] / (1 - pow(b1, (double)t)), vhat = vd[i] / (1 - pow(b2, (double)t));
            pd[i] -= lr * mhat / (sqrt(vhat) + eps);
            double ep = rel_err(p[i], pd[i]), em = rel_err(m[i], md[i]), ev = rel_err(v[i], vd[i]);
            worst_p = ep > worst_p ? ep : worst_p;
            worst_m = em > worst_m ? em : worst_m;
            worst_v = ev > worst_v ? ev : worst_v;
        }
    }
    /* p moves by ~lr per step, so its float rounding is a few ulps of p; m and v are sums of a
     * few rounded terms, but m = m + (1-b1)(g-m) can cancel, hence the looser bound. */
    CHECK_NEAR(worst_p, 0, 1e-5);
    CHECK_NEAR(worst_m, 0, 1e-3);
    CHECK_NEAR(worst_v, 0, 1e-5);
}

/* The fp16 copy is zs_f32_to_f16 of the new weight in every variant, on a sweep of the float
 * bit patterns (every 4093rd, both signs: fp16's normals, subnormals, the rounding to inf at
 * 65520 and the ties) and on the patterns next to fp16's boundaries.  With lr 0 and no decay
 * the step leaves each weight as it is (a NaN canonical), so the copy is that of the input. */
static void test_f16_copy(void)
{
    enum { N = 1 << 20 };
    static const uint32_t edges[] = {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,
                                     0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
                                     0x32ffffffu, 0x33800000u, 0x387fe000u, 0x387ff000u};
    state s, o;
    int ok = alloc_state(&s, N) & alloc_state(&o, N);
    CHECK(ok);
    size_t n = 0;
    for (uint64_t u = 0; ok && u < 0x100000000ull && n + 2 * 12 < N; u += 4093)
        s.p[n++] = from_bits((uint32_t)u);
    for (size_t i = 0; ok && i < sizeof edges / sizeof *edges; i++) {
        s.p[n++] = from_bits(edges[i]);
        s.p[n++] = from_bits(edges[i] | 0x80000000u);
    }
    for (size_t i = 0; ok && i < n; i++)
        s.m[i] = s.v[i] = s.g[i] = 0.0f;
    zs_adamw_hparams hp = zs_adamw_hparams_make(0.0, 0.9, 0.999, 1e-8, 0.0, 1, 1.0f);
    hp.half = ZS_HALF_F16;
    int have[3] = {1, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
                   __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")};
    const char *names[3] = {"scalar", "avx2", "avx512"};
    for (int k = 0; ok && k < 3; k++) {
        if (!have[k])
            continue;
        copy_state(&o, &s, n);
        if (k == 0)
            zs_adamw_ref(o.p, o.m, o.v, o.g, o.b, n, &hp);
        else if (k == 1)
            zs_adamw_avx2(o.p, o.m, o.v, o.g, o.b, n, &hp);
        else
            zs_adamw_avx512(o.p, o.m, o.v, o.g, o.b, n, &hp);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float want_p = isnan(s.p[i]) ? from_bits(ZS_ADAMW_NAN_BITS) : s.p[i];
            uint16_t want = zs_f32_to_f16(want_p);
            if (o.b[i] != want || memcmp(&o.p[i], &want_p, 4) != 0) {
                if (bad++ == 0) {
                    uint32_t in;
                    memcpy(&in, &s.p[i], 4);
                    fprintf(stderr, "test_f16_copy %s: weight 0x%08x: copy 0x%04x, want 0x%04x\n",
                            names[k], in, o.b[i], want);
                }
            }
        }
        CHECK_EQ_INT(bad, 0);
    }
    free_state(&s);
    free_state(&o);
}

static void test_bf16(void)
{
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0x3f808000u)), 0x3f80); /* tie, even below: down */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie, odd below: up */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0x3f808001u)), 0x3f81); /* above the tie: up */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80); /* below the tie: down */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0xbf818000u)), 0xbf82); /* negative tie: to even */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0x00018000u)), 0x0002); /* denormal tie: to even */
    CHECK_EQ_INT(zs_f32_to_bf16(-0.0f), 0x8000);
    CHECK_EQ_INT(zs_f32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(zs_f32_to_bf16(-INFINITY), 0xff80);
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0x7f800001u)), 0x7fc0); /* sNaN stays (quiet) NaN */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0xffffffffu)), 0xffff); /* no rounding into the sign */
    CHECK_EQ_INT(zs_f32_to_bf16(from_bits(0xffc00000u)), 0xffc0);
    CHECK(zs_bf16_to_f32(0x3f80) == 1.0f);
}

int main(void)
{
    test_bitwise();
    test_formula();
    test_offsets();
    test_f16_copy();
    test_bf16();
    return zs_test_result("test_adamw");
}
