/*
 * test_kernels: every CPU kernel of kernels/kernels.h against an independent double-precision
 * reference (tests/unit/reference.h, shared with test_gpt2).
 *
 * For each kernel:
 *   - the forward against the double reference, run on the same (float) inputs;
 *   - the backward against central finite differences of the double reference forward of a
 *     scalar loss (sum of the outputs weighted by a fixed random "upstream gradient", so the
 *     kernel's dout is exactly those weights);
 *   - the documented write semantics: "=" outputs are prefilled with NaN (a kernel that read
 *     them would propagate it), "+=" outputs with known values;
 *   - bitwise identical results for 1, 2 and 3 threads on shapes large enough that every
 *     parallel split (rows, column blocks, (b, h) pairs, BLIS's m/n partitions, attention's
 *     causal blocks) has several parts.
 *
 * Gradient tolerance.  The finite differences use h = 1e-4 on a double forward: truncation
 * error ~h^2/6 * f''' ~ 1e-9 and rounding ~1e-16/h ~ 1e-12, far below what we check, so the
 * FD is the exact gradient for our purposes.  The analytic gradient is float: each element is
 * a float sum of at most K ~ 100 products (plus float activations saved by the forward), whose
 * error is bounded by ~K * 2^-24 ~ 6e-6 of the sum of the magnitudes of its terms, and that
 * sum is at most of the order of the largest gradient of the tensor.  So we accept
 *   |g - fd| <= 1e-4 |fd| + 2e-5 max|fd|,
 * a few times that bound, and far below what a wrong formula gives (errors of O(|fd|)).
 * ZS_TEST_VERBOSE=1 prints every check's worst |error| / tolerance.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp16.h"
#include "common/rng.h"
#include "kernels/kernels.h"
#include "kernels/reduce.h"
#include "tests/unit/reference.h"
#include "tests/unit/test.h"

#define FD_H 1e-4
#define GRAD_RTOL 1e-4
#define GRAD_ATOL 2e-5

static uint64_t stream_counter = 1;

/* ---- helpers ---------------------------------------------------------------------------- */

static float *randn(size_t n, double std)
{
    uint64_t s = stream_counter++;
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(std * zs_rng_normal(12345, s, i));
    return p;
}

static float *filled(size_t n, float v)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = v;
    return p;
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static float *copy_f(const float *x, size_t n)
{
    float *p = malloc(n * sizeof *p);
    memcpy(p, x, n * sizeof *p);
    return p;
}

static int32_t *rand_tokens(size_t n, int V)
{
    uint64_t s = stream_counter++;
    int32_t *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = (int32_t)(zs_rng_u64(777, s, i) % (uint64_t)V);
    return p;
}

static double maxabs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/*
 * got[i] ~ want[i] within rtol |want[i]| + atol * max|want|; one check per array, which on
 * failure names the array and prints the worst element.
 */
static void check_close(const char *name, const float *got, const double *want, size_t n,
                        double rtol, double atol)
{
    double scale = maxabs(want, n);
    double worst = -1;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = rtol * fabs(want[i]) + atol * scale + 1e-30;
        double r = fabs((double)got[i] - want[i]) / tol;
        if (!(r <= worst) || isnan(r)) { /* NaN counts as the worst */
            worst = isnan(r) ? INFINITY : r;
            wi = i;
        }
    }
    zs_test_checks++;
    if (getenv("ZS_TEST_VERBOSE"))
        printf("  %-40s worst |err|/tol %.3g\n", name, worst);
    if (!(worst <= 1.0)) {
        zs_test_failures++;
        fprintf(stderr, "%s: element %zu of %zu: got %.9g, want %.9g (tol %.3g, max|want| %.3g)\n",
                name, wi, n, (double)got[wi], want[wi], rtol * fabs(want[wi]) + atol * scale,
                scale);
    }
}

static void check_grad(const char *name, const float *g, const double *fd, size_t n)
{
    check_close(name, g, fd, n, GRAD_RTOL, GRAD_ATOL);
}

static void check_bits(const char *name, const float *a, const float *b, size_t n)
{
    zs_test_checks++;
    if (memcmp(a, b, n * sizeof *a) != 0) {
        size_t i = 0;
        while (i < n && memcmp(a + i, b + i, sizeof *a) == 0)
            i++;
        zs_test_failures++;
        fprintf(stderr, "%s: not bitwise identical at element %zu of %zu: %.9g vs %.9g\n", name, i,
                n, (double)a[i], (double)b[i]);
    }
}

typedef double (*objective)(void *ctx);

/* fd[j] = central difference of f in p[j], for every j < n. */
static void fd_grad(double *p, size_t n, objective f, void *ctx, double *fd)
{
    for (size_t j = 0; j < n; j++) {
        double save = p[j];
        p[j] = save + FD_H;
        double fp = f(ctx);
        p[j] = save - FD_H;
        double fm = f(ctx);
        p[j] = save;
        fd[j] = (fp - fm) / (2 * FD_H);
    }
}

/* Like fd_grad, for the indices idx[0, m) only; fd and the returned g are compacted. */
static void fd_grad_subset(double *p, const size_t *idx, size_t m, objective f, void *ctx,
                           double *fd)
{
    for (size_t i = 0; i < m; i++) {
        size_t j = idx[i];
        double save = p[j];
        p[j] = save + FD_H;
        double fp = f(ctx);
        p[j] = save - FD_H;
        double fm = f(ctx);
        p[j] = save;
        fd[i] = (fp - fm) / (2 * FD_H);
    }
}

static double weighted_sum(const double *y, const double *w, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += y[i] * w[i];
    return s;
}

/* ---- sgemm ------------------------------------------------------------------------------ */

/* C = alpha op(A) op(B) + beta C against double, with the rigorous float bound
 * |err| <= (k + 2) 2^-24 (sum |alpha a b| + |beta c|) per element (plus a tiny slack). */
static void test_sgemm_case(int ta, int tb, int m, int n, int k, float alpha, float beta)
{
    int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5; /* padded leading dims */
    size_t asz = (size_t)(ta ? k : m) * lda, bsz = (size_t)(tb ? n : k) * ldb;
    size_t csz = (size_t)m * ldc;
    float *a = randn(asz, 1), *b = randn(bsz, 1);
    float *c = beta == 0.0f ? filled(csz, NAN) : randn(csz, 1);
    float *c0 = copy_f(c, csz);
    zs_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 2);
    int bad = 0;
    for (int i = 0; i < m && !bad; i++)
        for (int j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                double av = ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
                double bv = tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
                s += av * bv;
                mag += fabs(av * bv);
            }
            double want = alpha * s, bound = fabs(alpha) * mag;
            if (beta != 0.0f) {
                want += beta * (double)c0[(size_t)i * ldc + j];
                bound += fabs(beta * (double)c0[(size_t)i * ldc + j]);
            }
            bound = (k + 2) * 0x1p-24 * bound + 1e-30;
            double got = c[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= bound)) {
                fprintf(stderr,
                        "sgemm ta %d tb %d (%d, %d, %d) beta %g: C[%d,%d] = %.9g, want "
                        "%.9g (bound %.3g)\n",
                        ta, tb, m, n, k, (double)beta, i, j, got, want, bound);
                bad = 1;
                break;
            }
        }
    zs_test_checks++;
    zs_test_failures += bad;
    /* The padding of C beyond n columns is untouched. */
    int pad_ok = 1;
    for (int i = 0; i < m; i++)
        for (int j = n; j < ldc; j++)
            if (memcmp(&c[(size_t)i * ldc + j], &c0[(size_t)i * ldc + j], sizeof(float)) != 0)
                pad_ok = 0;
    CHECK(pad_ok);
    free(a);
    free(b);
    free(c);
    free(c0);
}

static void test_sgemm(void)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_sgemm_case(ta, tb, 37, 29, 41, 0.7f, 0.0f);
            test_sgemm_case(ta, tb, 5, 70, 3, 1.0f, 0.5f);
        }
    /* Thread-count independence on shapes of the model (GPT-2 small rows, odd edges). */
    const int shapes[][3] = {{256, 2304, 768}, {768, 3072, 256}, {300, 1000, 130}, {64, 64, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                int lda = ta ? m : k, ldb = tb ? k : n;
                float *a = randn((size_t)m * k, 1), *b = randn((size_t)k * n, 1);
                float *c1 = filled((size_t)m * n, NAN), *c2 = filled((size_t)m * n, NAN);
                float *c3 = filled((size_t)m * n, NAN);
                zs_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c1, n, 1);
                zs_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c2, n, 2);
                zs_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c3, n, 3);
                char name[96];
                snprintf(name, sizeof name, "sgemm %dx%dx%d ta %d tb %d, 1 vs 2 threads", m, n, k,
                         ta, tb);
                check_bits(name, c1, c2, (size_t)m * n);
                snprintf(name, sizeof name, "sgemm %dx%dx%d ta %d tb %d, 1 vs 3 threads", m, n, k,
                         ta, tb);
                check_bits(name, c1, c3, (size_t)m * n);
                free(a);
                free(b);
                free(c1);
                free(c2);
                free(c3);
            }
}

/* Our driver around BLIS's micro-kernel (where zs_sgemm_driver says "zshard") against BLIS
 * driving, bit for bit: every transpose, shapes with edges in every dimension, k across KC's
 * blocks (384, with a last block of up to 480) and past NC and MC, alpha and beta not 1, and a
 * C with a leading dimension wider than n.  On a machine where BLIS drives, both are BLIS. */
static void test_sgemm_driver(void)
{
    printf("test_kernels: sgemm driver %s\n", zs_sgemm_driver());
    const int shapes[][3] = {{256, 2304, 768}, {256, 768, 3072}, {37, 29, 41},   {1, 1, 1},
                             {33, 13, 865},    {500, 130, 481},  {97, 3100, 20}, {64, 64, 64},
                             {3, 50, 1000},    {3100, 50, 420}};
    const float ab[][2] = {{1.0f, 0.0f}, {0.7f, 0.5f}, {1.0f, 1.0f}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], ldc = n + 3;
                int lda = ta ? m : k, ldb = tb ? k : n;
                float *a = randn((size_t)m * k, 2), *b = randn((size_t)k * n, 3);
                float *c0 = randn((size_t)m * ldc, 4);
                float *want = malloc((size_t)m * ldc * sizeof *want);
                float *got = malloc((size_t)m * ldc * sizeof *got);
                size_t v = s % (sizeof ab / sizeof ab[0]);
                memcpy(want, c0, (size_t)m * ldc * sizeof *want);
                memcpy(got, c0, (size_t)m * ldc * sizeof *got);
                zs_sgemm_blis(ta, tb, m, n, k, ab[v][0], a, lda, b, ldb, ab[v][1], want, ldc);
                zs_sgemm(ta, tb, m, n, k, ab[v][0], a, lda, b, ldb, ab[v][1], got, ldc, 1);
                char name[112];
                snprintf(name, sizeof name, "sgemm driver %dx%dx%d ta %d tb %d alpha %g beta %g", m,
                         n, k, ta, tb, ab[v][0], ab[v][1]);
                check_bits(name, want, got, (size_t)m * ldc);
                free(a), free(b), free(c0), free(want), free(got);
            }
}

/* zs_sgemm_many: a batch with a bias (C's rows start at it, beta taken as 1) on shapes cut
 * along m (m > n) and along n, against one single-threaded product per member. */
static void test_sgemm_many(void)
{
    const int shapes[][3] = {{300, 130, 70}, {96, 1000, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int threads = 1; threads <= 3; threads++) {
            int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            float *a = randn((size_t)m * k, 1), *b = randn((size_t)k * n, 1);
            float *bias = randn((size_t)n, 1);
            float *want1 = filled((size_t)m * n, NAN), *want2 = filled((size_t)k * n, NAN);
            float *got1 = filled((size_t)m * n, NAN), *got2 = filled((size_t)k * n, NAN);
            for (int i = 0; i < m; i++)
                memcpy(want1 + (size_t)i * n, bias, (size_t)n * sizeof *bias);
            zs_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 1.0f, want1, n, 1);
            zs_sgemm(1, 0, k, n, m, 0.5f, a, k, want1, n, 0.0f, want2, n, 1);
            zs_gemm g[2] = {
                {0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, got1, n, bias},
                {1, 0, k, n, m, 0.5f, a, k, want1, n, 0.0f, got2, n, NULL},
            };
            zs_sgemm_many(g, 2, threads);
            char name[96];
            snprintf(name, sizeof name, "sgemm_many %dx%dx%d + bias, %d threads", m, n, k, threads);
            check_bits(name, want1, got1, (size_t)m * n);
            snprintf(name, sizeof name, "sgemm_many %dx%dx%d ta 1, %d threads", k, n, m, threads);
            check_bits(name, want2, got2, (size_t)k * n);
            free(a);
            free(b);
            free(bias);
            free(want1);
            free(want2);
            free(got1);
            free(got2);
        }
}

/* ---- linear ----------------------------------------------------------------------------- */

typedef struct {
    double *x, *w, *b, *r, *y;
    int N, C, OC;
} linear_ctx;

static double linear_obj(void *p)
{
    linear_ctx *c = p;
    ref_linear(c->y, c->x, c->w, c->b, c->N, c->C, c->OC);
    return weighted_sum(c->y, c->r, (size_t)c->N * c->OC);
}

static void test_linear(void)
{
    const int N = 10, C = 8, OC = 12;
    float *x = randn((size_t)N * C, 1), *w = randn((size_t)C * OC, 0.5), *b = randn(OC, 0.5);
    float *r = randn((size_t)N * OC, 1);
    float *y = filled((size_t)N * OC, NAN);
    zs_linear_forward(y, x, w, b, N, C, OC, 2);
    linear_ctx c = {to_double(x, (size_t)N * C),
                    to_double(w, (size_t)C * OC),
                    to_double(b, OC),
                    to_double(r, (size_t)N * OC),
                    malloc((size_t)N * OC * sizeof(double)),
                    N,
                    C,
                    OC};
    linear_obj(&c);
    check_close("linear forward", y, c.y, (size_t)N * OC, 1e-5, 1e-6);
    float *y2 = filled((size_t)N * OC, NAN);
    zs_linear_forward(y2, x, w, NULL, N, C, OC, 2);
    double *yd = malloc((size_t)N * OC * sizeof *yd);
    ref_linear(yd, c.x, c.w, NULL, N, C, OC);
    check_close("linear forward, no bias", y2, yd, (size_t)N * OC, 1e-5, 1e-6);

    float *dx = filled((size_t)N * C, NAN), *dw = filled((size_t)C * OC, NAN);
    float *db = filled(OC, NAN);
    zs_linear_backward(dx, dw, db, r, x, w, N, C, OC, 2);
    double *fd = malloc((size_t)C * OC * sizeof *fd);
    fd_grad(c.x, (size_t)N * C, linear_obj, &c, fd);
    check_grad("linear dinp", dx, fd, (size_t)N * C);
    fd_grad(c.w, (size_t)C * OC, linear_obj, &c, fd);
    check_grad("linear dweight", dw, fd, (size_t)C * OC);
    fd_grad(c.b, OC, linear_obj, &c, fd);
    check_grad("linear dbias", db, fd, OC);

    /* bias_backward alone: column sums. */
    float *db2 = filled(OC, NAN);
    zs_bias_backward(db2, r, N, OC, 1);
    check_bits("bias_backward == linear dbias", db, db2, OC);
    free(x), free(w), free(b), free(r), free(y), free(y2), free(yd), free(dx), free(dw), free(db);
    free(db2), free(fd), free(c.x), free(c.w), free(c.b), free(c.r), free(c.y);
}

/* ---- encoder ---------------------------------------------------------------------------- */

typedef struct {
    double *wte, *wpe, *r, *out;
    const int32_t *tok;
    int B, T, C;
} encoder_ctx;

static double encoder_obj(void *p)
{
    encoder_ctx *c = p;
    ref_encoder(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return weighted_sum(c->out, c->r, (size_t)c->B * c->T * c->C);
}

static void test_encoder(void)
{
    const int B = 2, T = 5, C = 8, V = 11, maxT = 7;
    int32_t tok[10] = {3, 1, 3, 10, 0, 3, 7, 7, 1, 5}; /* repeats: rows hit more than once */
    float *wte = randn((size_t)V * C, 1), *wpe = randn((size_t)maxT * C, 1);
    float *r = randn((size_t)B * T * C, 1), *out = filled((size_t)B * T * C, NAN);
    zs_encoder_forward(out, tok, wte, wpe, B, T, C, 2);
    encoder_ctx c = {to_double(wte, (size_t)V * C),
                     to_double(wpe, (size_t)maxT * C),
                     to_double(r, (size_t)B * T * C),
                     malloc((size_t)B * T * C * sizeof(double)),
                     tok,
                     B,
                     T,
                     C};
    encoder_obj(&c);
    check_close("encoder forward", out, c.out, (size_t)B * T * C, 1e-7, 0);

    /* dwte += (prefilled with base), dwpe = for rows < T, rows >= T untouched. */
    float *base = randn((size_t)V * C, 1), *dwte = copy_f(base, (size_t)V * C);
    float *dwpe = filled((size_t)maxT * C, NAN);
    for (size_t i = (size_t)T * C; i < (size_t)maxT * C; i++)
        dwpe[i] = 42.0f;
    zs_encoder_backward(dwte, dwpe, r, tok, B, T, C, 2);
    double *fd = malloc((size_t)V * C * sizeof *fd);
    fd_grad(c.wte, (size_t)V * C, encoder_obj, &c, fd);
    float *added = malloc((size_t)V * C * sizeof *added);
    for (size_t i = 0; i < (size_t)V * C; i++)
        added[i] = dwte[i] - base[i];
    check_grad("encoder dwte (+=)", added, fd, (size_t)V * C);
    fd_grad(c.wpe, (size_t)maxT * C, encoder_obj, &c, fd);
    check_grad("encoder dwpe", dwpe, fd, (size_t)T * C);
    int untouched = 1;
    for (size_t i = (size_t)T * C; i < (size_t)maxT * C; i++)
        untouched &= dwpe[i] == 42.0f;
    CHECK(untouched);
    free(wte), free(wpe), free(r), free(out), free(base), free(dwte), free(dwpe), free(fd);
    free(added), free(c.wte), free(c.wpe), free(c.r), free(c.out);
}

/* ---- layernorm -------------------------------------------------------------------------- */

typedef struct {
    double *a, *b2, *w, *b, *r, *r2, *y, *res;
    int N, C;
    int residual; /* loss = sum(y r) + sum(res r2) with res = a + b2; else y = LN(a) */
} ln_ctx;

static double ln_obj(void *p)
{
    ln_ctx *c = p;
    size_t n = (size_t)c->N * c->C;
    const double *in = c->a;
    if (c->residual) {
        for (size_t i = 0; i < n; i++)
            c->res[i] = c->a[i] + c->b2[i];
        in = c->res;
    }
    ref_layernorm(c->y, NULL, NULL, in, c->w, c->b, c->N, c->C);
    double s = weighted_sum(c->y, c->r, n);
    if (c->residual)
        s += weighted_sum(c->res, c->r2, n);
    return s;
}

static void test_layernorm(void)
{
    const int N = 10, C = 8;
    const size_t n = (size_t)N * C;
    float *x = randn(n, 2), *w = randn(C, 1), *b = randn(C, 1), *r = randn(n, 1);
    for (size_t i = 0; i < n; i++)
        x[i] += 0.5f; /* a nonzero mean */
    float *y = filled(n, NAN), *mean = filled(N, NAN), *rstd = filled(N, NAN);
    zs_layernorm_forward(y, mean, rstd, x, w, b, N, C, 2);
    ln_ctx c = {to_double(x, n),
                NULL,
                to_double(w, C),
                to_double(b, C),
                to_double(r, n),
                NULL,
                malloc(n * sizeof(double)),
                NULL,
                N,
                C,
                0};
    double *md = malloc(N * sizeof *md), *sd = malloc(N * sizeof *sd);
    ref_layernorm(c.y, md, sd, c.a, c.w, c.b, N, C);
    check_close("layernorm forward", y, c.y, n, 1e-5, 1e-6);
    check_close("layernorm mean", mean, md, N, 1e-6, 1e-7);
    check_close("layernorm rstd", rstd, sd, N, 1e-5, 0);

    /* dinp += onto a prefilled base; dweight, dbias =. */
    float *base = randn(n, 1), *dx = copy_f(base, n), *dw = filled(C, NAN), *db = filled(C, NAN);
    zs_layernorm_backward(dx, dw, db, r, x, w, mean, rstd, N, C, 2);
    double *fd = malloc(n * sizeof *fd);
    float *added = malloc(n * sizeof *added);
    for (size_t i = 0; i < n; i++)
        added[i] = dx[i] - base[i];
    fd_grad(c.a, n, ln_obj, &c, fd);
    check_grad("layernorm dinp (+=)", added, fd, n);
    fd_grad(c.w, C, ln_obj, &c, fd);
    check_grad("layernorm dweight", dw, fd, C);
    fd_grad(c.b, C, ln_obj, &c, fd);
    check_grad("layernorm dbias", db, fd, C);

    /* Fused residual + LayerNorm: forward values, and the backward the model uses: dres starts
     * as res's own upstream gradient r2 and layernorm_backward adds the LN branch; both inputs
     * of the add then have that gradient. */
    float *x2 = randn(n, 1), *r2 = randn(n, 1);
    float *res = filled(n, NAN), *y2 = filled(n, NAN);
    zs_residual_layernorm_forward(res, y2, mean, rstd, x, x2, w, b, N, C, 2);
    ln_ctx c2 = {to_double(x, n),
                 to_double(x2, n),
                 c.w,
                 c.b,
                 c.r,
                 to_double(r2, n),
                 malloc(n * sizeof(double)),
                 malloc(n * sizeof(double)),
                 N,
                 C,
                 1};
    ln_obj(&c2);
    check_close("residual_layernorm res", res, c2.res, n, 1e-7, 1e-7);
    check_close("residual_layernorm out", y2, c2.y, n, 1e-5, 1e-6);
    float *dres = copy_f(r2, n);
    zs_layernorm_backward(dres, dw, db, r, res, w, mean, rstd, N, C, 2);
    fd_grad(c2.a, n, ln_obj, &c2, fd);
    check_grad("residual_layernorm d inp1", dres, fd, n);
    fd_grad(c2.b2, n, ln_obj, &c2, fd);
    check_grad("residual_layernorm d inp2", dres, fd, n);
    /* In place: res may alias inp1. */
    float *inplace = copy_f(x, n), *y3 = filled(n, NAN);
    zs_residual_layernorm_forward(inplace, y3, mean, rstd, inplace, x2, w, b, N, C, 1);
    check_bits("residual_layernorm in place res", inplace, res, n);
    check_bits("residual_layernorm in place out", y3, y2, n);
    free(x), free(w), free(b), free(r), free(y), free(mean), free(rstd), free(base), free(dx);
    free(dw), free(db), free(fd), free(added), free(x2), free(r2), free(res), free(y2), free(dres);
    free(inplace), free(y3), free(md), free(sd), free(c.a), free(c.w), free(c.b), free(c.r);
    free(c.y), free(c2.a), free(c2.b2), free(c2.r2), free(c2.y), free(c2.res);
}

/* ---- bias + GELU ------------------------------------------------------------------------ */

typedef struct {
    double *x, *b, *r, *y;
    int N, C;
} gelu_ctx;

static double gelu_obj(void *p)
{
    gelu_ctx *c = p;
    for (int i = 0; i < c->N; i++)
        for (int k = 0; k < c->C; k++)
            c->y[(size_t)i * c->C + k] = ref_gelu(c->x[(size_t)i * c->C + k] + c->b[k]);
    return weighted_sum(c->y, c->r, (size_t)c->N * c->C);
}

static void test_gelu(void)
{
    const int N = 7, C = 70; /* C > the kernel's 64-column chunks: a full one and a tail */
    const size_t n = (size_t)N * C;
    float *x = randn(n, 2), *b = randn(C, 0.5), *r = randn(n, 1);
    x[0] = -30.0f; /* far tails: exp clamps, gelu -> 0 and x */
    x[1] = 30.0f;
    x[2] = 0.0f;
    float *pre = copy_f(x, n), *y = filled(n, NAN);
    zs_bias_gelu_forward(pre, y, b, N, C, 2);
    gelu_ctx c = {
        to_double(x, n), to_double(b, C), to_double(r, n), malloc(n * sizeof(double)), N, C};
    gelu_obj(&c);
    double *pre_want = malloc(n * sizeof *pre_want);
    for (size_t i = 0; i < n; i++)
        pre_want[i] = (double)(x[i] + b[i % C]); /* the float add the kernel does */
    check_close("bias_gelu pre += bias", pre, pre_want, n, 0, 0);
    /* The sigmoid form agrees with the tanh form to a few ulp. */
    check_close("bias_gelu forward", y, c.y, n, 1e-6, 1e-7);

    float *d = copy_f(r, n), *db = filled(C, NAN);
    zs_bias_gelu_backward(d, db, pre, N, C, 2);
    double *fd = malloc(n * sizeof *fd);
    fd_grad(c.x, n, gelu_obj, &c, fd);
    check_grad("bias_gelu d pre", d, fd, n);
    fd_grad(c.b, C, gelu_obj, &c, fd);
    check_grad("bias_gelu dbias", db, fd, C);
    /* Without bias: forward leaves pre alone; backward without dbias. */
    float *pre2 = copy_f(x, n), *y2 = filled(n, NAN), *d2 = copy_f(r, n);
    zs_bias_gelu_forward(pre2, y2, NULL, N, C, 1);
    check_bits("bias_gelu no bias keeps pre", pre2, x, n);
    zs_bias_gelu_backward(d2, NULL, pre, N, C, 1);
    check_bits("bias_gelu backward without dbias", d2, d, n);
    free(x), free(b), free(r), free(pre), free(y), free(pre_want), free(d), free(db), free(fd);
    free(pre2), free(y2), free(d2), free(c.x), free(c.b), free(c.r), free(c.y);
}

/* ---- attention -------------------------------------------------------------------------- */

typedef struct {
    double *qkv, *r, *out;
    int B, T, C, NH;
} attn_ctx;

static double attn_obj(void *p)
{
    attn_ctx *c = p;
    ref_attention(c->out, NULL, c->qkv, c->B, c->T, c->C, c->NH);
    return weighted_sum(c->out, c->r, (size_t)c->B * c->T * c->C);
}

/* full: FD of every qkv entry; else of 150 random ones. */
static void attention_case(int B, int T, int C, int NH, int full)
{
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = randn(nq, 1.5), *r = randn(no, 1);
    float *out = filled(no, NAN), *att = filled(na, NAN);
    zs_attention_forward(out, att, qkv, B, T, C, NH, 2);
    attn_ctx c = {to_double(qkv, nq), to_double(r, no), malloc(no * sizeof(double)), B, T, C, NH};
    double *att_want = malloc(na * sizeof *att_want);
    ref_attention(c.out, att_want, c.qkv, B, T, C, NH);
    char name[80];
    snprintf(name, sizeof name, "attention forward T=%d", T);
    check_close(name, out, c.out, no, 1e-5, 1e-6);
    snprintf(name, sizeof name, "attention probabilities T=%d", T);
    check_close(name, att, att_want, na, 1e-5, 1e-7);
    int masked_zero = 1;
    for (int bh = 0; bh < B * NH; bh++)
        for (int i = 0; i < T; i++)
            for (int j = i + 1; j < T; j++)
                masked_zero &= att[((size_t)bh * T + i) * T + j] == 0.0f;
    CHECK(masked_zero);

    float *dqkv = filled(nq, NAN), *datt = filled(na, NAN);
    zs_attention_backward(dqkv, datt, r, qkv, att, B, T, C, NH, 2);
    snprintf(name, sizeof name, "attention dqkv T=%d", T);
    if (full) {
        double *fd = malloc(nq * sizeof *fd);
        fd_grad(c.qkv, nq, attn_obj, &c, fd);
        check_grad(name, dqkv, fd, nq);
        free(fd);
    } else {
        enum { M = 150 };
        size_t idx[M];
        float g[M];
        double fd[M];
        for (int i = 0; i < M; i++) {
            idx[i] = zs_rng_u64(99, 1, (uint64_t)i) % nq;
            g[i] = dqkv[idx[i]];
        }
        fd_grad_subset(c.qkv, idx, M, attn_obj, &c, fd);
        check_grad(name, g, fd, M);
    }
    free(qkv), free(r), free(out), free(att), free(att_want), free(dqkv), free(datt);
    free(c.qkv), free(c.r), free(c.out);
}

static void test_attention(void)
{
    attention_case(2, 5, 8, 2, 1);
    /* Longer than ZS_ATTN_BLOCK: several causal blocks and a partial last one. */
    attention_case(1, ZS_ATTN_BLOCK + 6, 8, 2, 0);
    /* A last block of one row, and a single position. */
    attention_case(2, ZS_ATTN_BLOCK + 1, 8, 2, 0);
    attention_case(2, 1, 8, 2, 1);
}

/* ---- classifier ------------------------------------------------------------------------- */

typedef struct {
    double *x, *wte, *r, *logits;
    int N, C, V;
} lm_ctx;

static double lm_obj(void *p)
{
    lm_ctx *c = p;
    ref_lm_head(c->logits, c->x, c->wte, c->N, c->C, c->V);
    return weighted_sum(c->logits, c->r, (size_t)c->N * c->V);
}

typedef struct {
    double *logits;
    const int32_t *targets;
    int N, V;
} ce_ctx;

static double ce_obj(void *p)
{
    ce_ctx *c = p;
    return ref_crossentropy(NULL, c->logits, c->targets, c->N, c->V);
}

static void test_classifier(void)
{
    const int N = 10, C = 8, V = 11;
    float *x = randn((size_t)N * C, 1), *wte = randn((size_t)V * C, 1);
    float *r = randn((size_t)N * V, 1), *logits = filled((size_t)N * V, NAN);
    zs_lm_head_forward(logits, x, wte, N, C, V, 2);
    lm_ctx c = {to_double(x, (size_t)N * C),
                to_double(wte, (size_t)V * C),
                to_double(r, (size_t)N * V),
                malloc((size_t)N * V * sizeof(double)),
                N,
                C,
                V};
    lm_obj(&c);
    check_close("lm_head forward", logits, c.logits, (size_t)N * V, 1e-5, 1e-6);
    float *dx = filled((size_t)N * C, NAN), *dwte = filled((size_t)V * C, NAN);
    zs_lm_head_backward(dx, dwte, r, x, wte, N, C, V, 2);
    double *fd = malloc((size_t)V * C * sizeof *fd);
    fd_grad(c.x, (size_t)N * C, lm_obj, &c, fd);
    check_grad("lm_head dinp", dx, fd, (size_t)N * C);
    fd_grad(c.wte, (size_t)V * C, lm_obj, &c, fd);
    check_grad("lm_head dwte", dwte, fd, (size_t)V * C);

    /* Softmax + cross-entropy, with a spread of logits wide enough to matter. */
    int32_t *tg = rand_tokens(N, V);
    float *lg = randn((size_t)N * V, 4), *losses = filled(N, NAN);
    ce_ctx ce = {to_double(lg, (size_t)N * V), tg, N, V};
    double *lw = malloc(N * sizeof *lw);
    ref_crossentropy(lw, ce.logits, tg, N, V);
    zs_crossentropy_fused(lg, losses, tg, N, V, 1.0f / N, 2);
    check_close("crossentropy losses", losses, lw, N, 1e-6, 1e-7);
    double *fdl = malloc((size_t)N * V * sizeof *fdl);
    fd_grad(ce.logits, (size_t)N * V, ce_obj, &ce, fdl);
    check_grad("crossentropy dlogits (in place)", lg, fdl, (size_t)N * V);
    free(x), free(wte), free(r), free(logits), free(dx), free(dwte), free(fd), free(tg), free(lg);
    free(losses), free(lw), free(fdl), free(c.x), free(c.wte), free(c.r), free(c.logits);
    free(ce.logits);
}

/* ---- vmath ------------------------------------------------------------------------------ */

static void test_vmath(void)
{
    /* zs_expf within 2 ulp (relative 2 * 2^-24) of exp over [-87, 88] on a dense grid. */
    double worst = 0, worst_x = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + 175.0f * (float)i / 2000000.0f;
        double want = exp((double)x);
        double rel = fabs((double)zs_expf(x) - want) / want;
        if (rel > worst) {
            worst = rel;
            worst_x = x;
        }
    }
    if (!(worst <= 2 * 0x1p-24))
        fprintf(stderr, "zs_expf: relative error %.3g at %.9g\n", worst, worst_x);
    CHECK(worst <= 2 * 0x1p-24);
    CHECK(zs_expf(-100.0f) == 0.0f);
    CHECK(zs_expf(-INFINITY) == 0.0f);
    CHECK(isfinite(zs_expf(1000.0f)) && zs_expf(1000.0f) > 1e38f);
    CHECK(isnan(zs_expf(NAN)));
    CHECK(zs_expf(0.0f) == 1.0f);

    /* The vector paths (every length, so every tail) give the scalar bits. */
    float *x = randn(100, 5), *y = filled(100, NAN), *z = malloc(100 * sizeof *z);
    int same = 1;
    for (int n = 0; n <= 100; n++) {
        zs_vexp(y, x, n);
        for (int i = 0; i < n; i++)
            same &= memcmp(&y[i], &(float){zs_expf(x[i])}, sizeof(float)) == 0;
        memcpy(z, x, 100 * sizeof *z);
        double s = zs_vexp_sum(z, n, 0.5f), want = 0;
        for (int i = 0; i < n; i++) {
            same &= memcmp(&z[i], &(float){zs_expf(x[i] - 0.5f)}, sizeof(float)) == 0;
            want += exp((double)x[i] - 0.5);
        }
        same &= fabs(s - want) <= 1e-6 * want + 1e-30;
        float mx = -INFINITY, dot = 0;
        for (int i = 0; i < n; i++)
            mx = x[i] > mx ? x[i] : mx;
        same &= zs_vmax(x, n) == mx;
        double dw = 0, mag = 0;
        for (int i = 0; i < n; i++) {
            dw += (double)x[i] * z[i];
            mag += fabs((double)x[i] * z[i]);
        }
        dot = zs_vdot(x, z, n);
        same &= fabs(dot - dw) <= 1e-6 * mag + 1e-30;
    }
    CHECK(same);
    free(x), free(y), free(z);
}

/* ---- thread-count independence ---------------------------------------------------------- */

/* Runs every kernel, forward and backward, on larger shapes with `threads`; writes all
 * outputs into out (concatenated). */
enum { DB = 3, DT = ZS_ATTN_BLOCK + 36, DC = 192, DNH = 4, DV = 1000, DOC = 600 };
#define DN (DB * DT)

typedef struct {
    float *x, *x2, *w, *wb, *lnw, *lnb, *wte, *wpe, *qkv, *r, *rq, *ro, *rv;
    int32_t *tok, *tg;
} det_inputs;

static float *take(float *out, size_t *at, size_t n)
{
    *at += n;
    return out + *at - n;
}

static size_t det_run(const det_inputs *in, int threads, float *out)
{
    size_t at = 0;
#define TAKE(name, n) float *name = take(out, &at, (n))
    TAKE(y, (size_t)DN * DOC);
    TAKE(dlx, (size_t)DN * DC);
    TAKE(dlw, (size_t)DC * DOC);
    TAKE(dlb, DOC);
    zs_linear_forward(y, in->x, in->w, in->wb, DN, DC, DOC, threads);
    zs_linear_backward(dlx, dlw, dlb, in->ro, in->x, in->w, DN, DC, DOC, threads);

    TAKE(enc, (size_t)DN * DC);
    TAKE(dwte, (size_t)DV * DC);
    TAKE(dwpe, (size_t)DT * DC);
    zs_encoder_forward(enc, in->tok, in->wte, in->wpe, DB, DT, DC, threads);
    memset(dwte, 0, (size_t)DV * DC * sizeof *dwte);
    zs_encoder_backward(dwte, dwpe, in->r, in->tok, DB, DT, DC, threads);

    TAKE(mean, DN);
    TAKE(rstd, DN);
    TAKE(ln, (size_t)DN * DC);
    TAKE(res, (size_t)DN * DC);
    TAKE(ln2, (size_t)DN * DC);
    TAKE(mean2, DN);
    TAKE(rstd2, DN);
    TAKE(dx, (size_t)DN * DC);
    TAKE(dlnw, DC);
    TAKE(dlnb, DC);
    zs_layernorm_forward(ln, mean, rstd, in->x, in->lnw, in->lnb, DN, DC, threads);
    zs_residual_layernorm_forward(res, ln2, mean2, rstd2, in->x, in->x2, in->lnw, in->lnb, DN, DC,
                                  threads);
    memcpy(dx, in->x2, (size_t)DN * DC * sizeof *dx);
    zs_layernorm_backward(dx, dlnw, dlnb, in->r, in->x, in->lnw, mean, rstd, DN, DC, threads);

    TAKE(pre, (size_t)DN * DOC);
    TAKE(gl, (size_t)DN * DOC);
    TAKE(dg, (size_t)DN * DOC);
    TAKE(dgb, DOC);
    memcpy(pre, in->ro, (size_t)DN * DOC * sizeof *pre);
    zs_bias_gelu_forward(pre, gl, in->wb, DN, DOC, threads);
    memcpy(dg, in->rv, (size_t)DN * DOC * sizeof *dg);
    zs_bias_gelu_backward(dg, dgb, pre, DN, DOC, threads);

    TAKE(att, (size_t)DB * DNH * DT * DT);
    TAKE(ay, (size_t)DN * DC);
    TAKE(dqkv, (size_t)DN * 3 * DC);
    TAKE(datt, (size_t)DB * DNH * DT * DT);
    zs_attention_forward(ay, att, in->qkv, DB, DT, DC, DNH, threads);
    zs_attention_backward(dqkv, datt, in->r, in->qkv, att, DB, DT, DC, DNH, threads);

    TAKE(logits, (size_t)DN * DV);
    TAKE(losses, DN);
    TAKE(dhx, (size_t)DN * DC);
    TAKE(dhw, (size_t)DV * DC);
    TAKE(db, DOC);
    zs_lm_head_forward(logits, in->x, in->wte, DN, DC, DV, threads);
    zs_crossentropy_fused(logits, losses, in->tg, DN, DV, 1.0f / DN, threads);
    zs_lm_head_backward(dhx, dhw, logits, in->x, in->wte, DN, DC, DV, threads);
    zs_bias_backward(db, in->ro, DN, DOC, threads);
#undef TAKE
    return at;
}

static void test_threads(void)
{
    det_inputs in = {
        .x = randn((size_t)DN * DC, 1),
        .x2 = randn((size_t)DN * DC, 1),
        .w = randn((size_t)DC * DOC, 0.1),
        .wb = randn(DOC, 0.1),
        .lnw = randn(DC, 1),
        .lnb = randn(DC, 1),
        .wte = randn((size_t)DV * DC, 0.1),
        .wpe = randn((size_t)DT * DC, 0.1),
        .qkv = randn((size_t)DN * 3 * DC, 1),
        .r = randn((size_t)DN * DC, 1),
        .ro = randn((size_t)DN * DOC, 1),
        .rv = randn((size_t)DN * DOC, 1),
        .tok = rand_tokens(DN, DV),
        .tg = rand_tokens(DN, DV),
    };
    size_t cap = (size_t)64 << 20;
    float *o1 = filled(cap / sizeof(float), 0), *o2 = filled(cap / sizeof(float), 0);
    float *o3 = filled(cap / sizeof(float), 0);
    size_t n1 = det_run(&in, 1, o1);
    size_t n2 = det_run(&in, 2, o2);
    size_t n3 = det_run(&in, 3, o3);
    CHECK(n1 * sizeof(float) <= cap);
    CHECK_EQ_INT(n1, n2);
    CHECK_EQ_INT(n1, n3);
    check_bits("all kernels, 1 vs 2 threads", o1, o2, n1);
    check_bits("all kernels, 1 vs 3 threads", o1, o3, n1);
    /* And the same run twice gives the same bits. */
    det_run(&in, 2, o3);
    check_bits("all kernels, 2 threads twice", o2, o3, n1);
    free(o1), free(o2), free(o3);
    free(in.x), free(in.x2), free(in.w), free(in.wb), free(in.lnw), free(in.lnb), free(in.wte);
    free(in.wpe), free(in.qkv), free(in.r), free(in.ro), free(in.rv), free(in.tok), free(in.tg);
}

/* A push added into the accumulator (zs_accumulate): the bits of the plain loop, whatever the
 * threads, for a range long enough to be split, with a tail that is not a whole cache line. */
static void test_accumulate(void)
{
    size_t n = 3 * ZS_ACCUMULATE_SPLIT + 13;
    float *g = randn(n, 1), *base = randn(n, 3), *want = malloc(n * sizeof *want);
    float *got = malloc(n * sizeof *got);
    for (size_t i = 0; i < n; i++)
        want[i] = base[i] + g[i];
    int threads[] = {1, 2, 3, 7};
    for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
        memcpy(got, base, n * sizeof *got);
        zs_accumulate(got, g, n, threads[k]);
        char name[64];
        snprintf(name, sizeof name, "zs_accumulate, %d threads", threads[k]);
        check_bits(name, want, got, n);
    }
    memcpy(got, base, n * sizeof *got);
    zs_accumulate(got + 5, g + 5, 100, 2); /* short: one thread, the rest untouched */
    CHECK_EQ_INT(memcmp(got, base, 5 * sizeof *got), 0);
    check_bits("zs_accumulate, a short range", want + 5, got + 5, 100);
    CHECK_EQ_INT(memcmp(got + 105, base + 105, (n - 105) * sizeof *got), 0);
    free(g), free(base), free(want), free(got);
}

/* An fp16 push added (zs_accumulate_f16): the bits of zs_accumulate on the widened values (or of
 * the copy, for a first chunk), whatever the threads, with an F16C body and a scalar tail; the
 * values cover fp16's normals, subnormals, zeros of both signs and infinities. */
static void test_accumulate_f16(void)
{
    size_t n = 2 * ZS_ACCUMULATE_SPLIT + 13;
    uint16_t *h = malloc(n * sizeof *h);
    float *wide = malloc(n * sizeof *wide), *base = randn(n, 5);
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    for (size_t i = 0; i < n; i++) {
        h[i] = (uint16_t)(zs_rng_u64(11, 0, i) & 0xffff);
        if ((h[i] & 0x7c00u) == 0x7c00u && (h[i] & 0x03ffu)) /* NaN: widened NaN bits vary */
            h[i] = 0x7c00u;
        wide[i] = zs_f16_to_f32(h[i]);
    }
    for (int copy = 0; copy < 2; copy++) {
        memcpy(want, base, n * sizeof *want);
        if (copy)
            memcpy(want, wide, n * sizeof *want);
        else
            zs_accumulate(want, wide, n, 1);
        int threads[] = {1, 2, 3};
        for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
            memcpy(got, base, n * sizeof *got);
            zs_accumulate_f16(got, h, n, copy, threads[k]);
            char name[80];
            snprintf(name, sizeof name, "zs_accumulate_f16 (%s), %d threads", copy ? "copy" : "add",
                     threads[k]);
            check_bits(name, want, got, n);
        }
    }
    free(h), free(wide), free(base), free(want), free(got);
}

/* The gradient norm's sums of squares against the order reduce.h promises, written out plainly:
 * per block of 4096, four double accumulators (element i into i mod 4) combined as
 * (s0 + s1) + (s2 + s3); per shard, its blocks' sums in order (a one-block shard: that sum);
 * shards in order.  Bit for bit, for whole and partial blocks and shards, 1 to 3 threads. */
static double ref_block(const float *x, size_t n)
{
    double s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            s[j] += (double)x[i + j] * x[i + j];
    for (; i < n; i++)
        s[0] += (double)x[i] * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static double ref_shard(const float *x, size_t n)
{
    if (n <= ZS_REDUCE_BLOCK)
        return ref_block(x, n);
    double s = 0;
    for (size_t lo = 0; lo < n; lo += ZS_REDUCE_BLOCK)
        s += ref_block(x + lo, n - lo < ZS_REDUCE_BLOCK ? n - lo : ZS_REDUCE_BLOCK);
    return s;
}

static void test_sumsq(void)
{
    const size_t n = 37 * ZS_REDUCE_BLOCK + 1001;
    float *x = randn(n, 17);
    /* Magnitudes over 2^-12 .. 2^12, so that the order of the additions shows in the bits. */
    for (size_t i = 0; i < n; i++)
        x[i] = ldexpf(x[i], (int)(zs_rng_u64(19, 0, i) % 25) - 12);
    const size_t sizes[] = {1, 4095, 4096, 4097, 5 * 4096, 9 * 4096 + 3, n};
    const size_t shards[] = {4096, 3 * 4096, 10000, 4 * 4096 + 8, 100};
    for (int t = 1; t <= 3; t++)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            double want = ref_shard(x, sizes[k]), got = zs_sumsq(x, sizes[k], t);
            if (memcmp(&want, &got, sizeof got) != 0)
                fprintf(stderr, "zs_sumsq n=%zu, %d threads: %.17g, want %.17g\n", sizes[k], t, got,
                        want);
            CHECK(memcmp(&want, &got, sizeof got) == 0);
            for (size_t j = 0; j < sizeof shards / sizeof *shards; j++) {
                double w = 0;
                for (size_t lo = 0; lo < sizes[k]; lo += shards[j])
                    w += ref_shard(x + lo, sizes[k] - lo < shards[j] ? sizes[k] - lo : shards[j]);
                double g = zs_sumsq_sharded(x, sizes[k], shards[j], t);
                if (memcmp(&w, &g, sizeof g) != 0)
                    fprintf(stderr,
                            "zs_sumsq_sharded n=%zu, shards %zu, %d threads: %.17g, want "
                            "%.17g\n",
                            sizes[k], shards[j], t, g, w);
                CHECK(memcmp(&w, &g, sizeof g) == 0);
            }
        }
    free(x);
    /* Four blocks whose lanes sum to 2, 2^-52, 0, 2^-52: (2 + 2^-52) + (0 + 2^-52) is 2 (a tie,
     * to even), where pairing the lanes otherwise would give 2 + 2^-51.  So the combination
     * order shows exactly. */
    float *y = calloc(4 * ZS_REDUCE_BLOCK, sizeof *y);
    for (size_t b = 0; y && b < 4; b++) {
        float *blk = y + b * ZS_REDUCE_BLOCK;
        blk[0] = blk[4] = 1.0f;
        blk[1] = blk[3] = ldexpf(1.0f, -26);
    }
    double got = y ? zs_sumsq(y, 4 * ZS_REDUCE_BLOCK, 2) : 0;
    CHECK(got == 8.0);
    free(y);
}

int main(void)
{
    printf("test_kernels: sgemm micro-kernels %s\n", zs_sgemm_config());
    test_sgemm();
    test_sgemm_driver();
    test_sgemm_many();
    test_linear();
    test_encoder();
    test_layernorm();
    test_gelu();
    test_attention();
    test_classifier();
    test_vmath();
    test_threads();
    test_accumulate();
    test_accumulate_f16();
    test_sumsq();
    return zs_test_result("test_kernels");
}
