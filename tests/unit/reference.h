/*
 * reference.h: the independent double-precision references of the GPT-2 pieces that the
 * kernel tests (test_kernels.c) and the model tests (test_gpt2.c) compare against: written
 * straight from the formulas, in double, sharing no code with kernels/.  A test runs them on
 * the same (float) inputs as the code under test, and takes finite differences of them for
 * the gradients.
 *
 * Layouts are those of kernels/kernels.h: row-major, weights (C, OC), qkv (B, T, 3C) as
 * q | k | v, attention probabilities (B, NH, T, T).  Optional outputs may be NULL.
 *
 * static inline: each test uses only some of them, and -Wunused-function is an error.
 */
#ifndef ZS_TESTS_UNIT_REFERENCE_H
#define ZS_TESTS_UNIT_REFERENCE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* out (B,T,C) = wte[tok] + wpe[position]. */
static inline void ref_encoder(double *out, const int32_t *tok, const double *wte,
                               const double *wpe, int B, int T, int C)
{
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++)
            out[(size_t)bt * C + c] = wte[(size_t)tok[bt] * C + c] + wpe[(size_t)(bt % T) * C + c];
}

/* y (N,OC) = x (N,C) w (C,OC) + b; b may be NULL (no bias). */
static inline void ref_linear(double *y, const double *x, const double *w, const double *b, int N,
                              int C, int OC)
{
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int c = 0; c < C; c++)
                s += x[(size_t)i * C + c] * w[(size_t)c * OC + o];
            y[(size_t)i * OC + o] = s;
        }
}

/* LayerNorm over rows of C, eps 1e-5; mean and rstd (N) may be NULL. */
static inline void ref_layernorm(double *y, double *mean, double *rstd, const double *x,
                                 const double *w, const double *b, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const double *r = x + (size_t)i * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += r[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (r[c] - m) * (r[c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++)
            y[(size_t)i * C + c] = (r[c] - m) * s * w[c] + b[c];
        if (mean)
            mean[i] = m;
        if (rstd)
            rstd[i] = s;
    }
}

/* GELU, the tanh approximation of GPT-2. */
static inline double ref_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Causal self-attention: out (B,T,C), att (B,NH,T,T) (may be NULL; 0 above the diagonal),
 * from qkv (B,T,3C). */
static inline void ref_attention(double *out, double *att, const double *qkv, int B, int T, int C,
                                 int NH)
{
    int hs = C / NH;
    double *row = malloc((size_t)T * sizeof *row);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * 3 * C + h * hs;
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double s = 0;
                    for (int d = 0; d < hs; d++)
                        s += q[d] * k[d];
                    row[j] = s / sqrt((double)hs);
                    mx = row[j] > mx ? row[j] : mx;
                }
                double sum = 0;
                for (int j = 0; j <= i; j++) {
                    row[j] = exp(row[j] - mx);
                    sum += row[j];
                }
                double *o = out + ((size_t)b * T + i) * C + h * hs;
                for (int d = 0; d < hs; d++)
                    o[d] = 0;
                for (int j = 0; j < T; j++) {
                    double p = j <= i ? row[j] / sum : 0.0;
                    if (att)
                        att[(((size_t)b * NH + h) * T + i) * T + j] = p;
                    if (j <= i) {
                        const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
                        for (int d = 0; d < hs; d++)
                            o[d] += p * v[d];
                    }
                }
            }
    free(row);
}

/* Tied-embedding classifier: logits (N,V) = x (N,C) wte (V,C)^T. */
static inline void ref_lm_head(double *logits, const double *x, const double *wte, int N, int C,
                               int V)
{
    for (int i = 0; i < N; i++)
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int c = 0; c < C; c++)
                s += x[(size_t)i * C + c] * wte[(size_t)v * C + c];
            logits[(size_t)i * V + v] = s;
        }
}

/* Mean softmax cross-entropy of logits (N,V) against targets; losses (N) may be NULL. */
static inline double ref_crossentropy(double *losses, const double *logits, const int32_t *targets,
                                      int N, int V)
{
    double total = 0;
    for (int i = 0; i < N; i++) {
        const double *x = logits + (size_t)i * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            mx = x[j] > mx ? x[j] : mx;
        for (int j = 0; j < V; j++)
            s += exp(x[j] - mx);
        double l = log(s) + mx - x[targets[i]];
        if (losses)
            losses[i] = l;
        total += l;
    }
    return total / N;
}

#endif
