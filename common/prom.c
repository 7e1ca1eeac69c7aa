/*
 * prom: the registry and the exposition writer.  See prom.h.
 *
 * A gauge's double and a histogram's sum live in an atomic uint64_t as their bit pattern
 * (C11 has no atomic add for double); counters and bucket counts are plain atomic integers.
 * A histogram's buckets are kept per interval, not cumulative, so an observation is one add
 * to its bucket, one to the count and one CAS on the sum; the writer sums them up.  The
 * count it prints is that sum too, so that le="+Inf" and _count always agree in one scrape.
 */
#include "common/prom.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } kind;

typedef struct {
    char *name, *help;
    kind kind;
} family;

struct zs_prom_series {
    kind kind;
    int family;
    char *labels; /* rendered and escaped, without braces: `role="server",state="live"`; "" */
    _Atomic uint64_t value; /* counter: the count; gauge: the double's bits; histogram: count */
    _Atomic uint64_t sum;   /* histogram: the sum's bits */
    int n_bounds;
    double bounds[ZS_PROM_MAX_BUCKETS];
    _Atomic uint64_t buckets[ZS_PROM_MAX_BUCKETS + 1]; /* per interval; the last is +Inf */
};

struct zs_prom {
    pthread_mutex_t mu; /* registration and writing; never an update */
    family *fams;
    int n_fams, cap_fams;
    zs_prom_series **series;
    int n_series, cap_series;
};

static uint64_t bits_of(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double double_of(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

zs_err zs_prom_open(zs_prom **out)
{
    zs_prom *r = calloc(1, sizeof *r);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "metrics registry: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return ZS_OK;
}

void zs_prom_free(zs_prom *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_series; i++) {
        free(r->series[i]->labels);
        free(r->series[i]);
    }
    for (int i = 0; i < r->n_fams; i++) {
        free(r->fams[i].name);
        free(r->fams[i].help);
    }
    free(r->series);
    free(r->fams);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* A growing text buffer; failed is set once an allocation fails, and later appends do nothing. */
typedef struct {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_reserve(sbuf *b, size_t more)
{
    if (b->failed || b->len + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t n)
{
    sb_reserve(b, n);
    if (b->failed)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    sb_reserve(b, (size_t)n);
    if (b->failed)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* A label value or help text, escaped: backslash and newline always, the double quote in
 * label values (the format's rules; HELP keeps its quotes). */
static void sb_escaped(sbuf *b, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            sb_put(b, "\\\\", 2);
        else if (*s == '\n')
            sb_put(b, "\\n", 2);
        else if (*s == '"' && quote)
            sb_put(b, "\\\"", 2);
        else
            sb_put(b, s, 1);
    }
}

/* The shortest of %.15g / %.17g that reads back as v; NaN and the infinities as the format
 * spells them. */
static void sb_double(sbuf *b, double v)
{
    if (isnan(v)) {
        sb_put(b, "NaN", 3);
        return;
    }
    if (isinf(v)) {
        sb_put(b, v > 0 ? "+Inf" : "-Inf", 4);
        return;
    }
    char tmp[40];
    snprintf(tmp, sizeof tmp, "%.15g", v);
    if (strtod(tmp, NULL) != v)
        snprintf(tmp, sizeof tmp, "%.17g", v);
    sb_put(b, tmp, strlen(tmp));
}

static int valid_name(const char *s, int colon)
{
    if (!s || !*s)
        return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int alpha =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
        if (!alpha && !(p > s && c >= '0' && c <= '9'))
            return 0;
    }
    return 1;
}

static zs_prom_series *add_series(zs_prom *r, kind k, const char *name, const char *help,
                                  const char *const *labels, const double *bounds, int n_bounds)
{
    static const char *const none[] = {NULL};
    zs_prom_series *s = NULL;
    sbuf lb = {0};
    if (!labels)
        labels = none;
    if (!valid_name(name, 1)) {
        zs_error(ZS_ERR_INVALID, "metrics: \"%s\" is not a metric name", name ? name : "(null)");
        return NULL;
    }
    if (!help) {
        zs_error(ZS_ERR_INVALID, "metrics: %s has no help text", name);
        return NULL;
    }
    int n_labels = 0;
    while (n_labels <= ZS_PROM_MAX_LABELS && labels[2 * n_labels])
        n_labels++;
    if (n_labels > ZS_PROM_MAX_LABELS) {
        zs_error(ZS_ERR_INVALID, "metrics: %s: more than %d labels", name, ZS_PROM_MAX_LABELS);
        return NULL;
    }
    if (k == KIND_HISTOGRAM && (n_bounds < 0 || n_bounds > ZS_PROM_MAX_BUCKETS)) {
        zs_error(ZS_ERR_INVALID, "metrics: %s: %d buckets, at most %d", name, n_bounds,
                 ZS_PROM_MAX_BUCKETS);
        return NULL;
    }
    for (int i = 0; k == KIND_HISTOGRAM && i < n_bounds; i++)
        if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
            zs_error(ZS_ERR_INVALID, "metrics: %s: bucket bounds must be finite and increasing",
                     name);
            return NULL;
        }
    for (int i = 0; i < n_labels; i++) {
        const char *key = labels[2 * i], *v = labels[2 * i + 1];
        /* "le" is the histogram's own label; "__" names are Prometheus's. */
        if (!valid_name(key, 0) || strncmp(key, "__", 2) == 0 ||
            (k == KIND_HISTOGRAM && strcmp(key, "le") == 0)) {
            zs_error(ZS_ERR_INVALID, "metrics: %s: \"%s\" is not a label name here", name, key);
            goto fail;
        }
        if (!v) {
            zs_error(ZS_ERR_INVALID, "metrics: %s: label %s has no value", name, key);
            goto fail;
        }
        sb_printf(&lb, "%s%s=\"", i ? "," : "", key);
        sb_escaped(&lb, v, 1);
        sb_put(&lb, "\"", 1);
    }
    sb_put(&lb, "", 0);
    if (lb.failed || !lb.p)
        goto nomem;

    pthread_mutex_lock(&r->mu);
    int f = 0;
    while (f < r->n_fams && strcmp(r->fams[f].name, name) != 0)
        f++;
    if (f < r->n_fams) {
        if (r->fams[f].kind != k || strcmp(r->fams[f].help, help) != 0) {
            pthread_mutex_unlock(&r->mu);
            zs_error(ZS_ERR_INVALID, "metrics: %s registered again with another type or help",
                     name);
            goto fail;
        }
        for (int i = 0; i < r->n_series; i++)
            if (r->series[i]->family == f && strcmp(r->series[i]->labels, lb.p) == 0) {
                pthread_mutex_unlock(&r->mu);
                zs_error(ZS_ERR_INVALID, "metrics: %s{%s} registered twice", name, lb.p);
                goto fail;
            }
    }
    if (r->n_series == r->cap_series) {
        int cap = r->cap_series ? 2 * r->cap_series : 32;
        zs_prom_series **p = realloc(r->series, (size_t)cap * sizeof *p);
        if (!p)
            goto nomem_locked;
        r->series = p;
        r->cap_series = cap;
    }
    if (f == r->n_fams) {
        if (r->n_fams == r->cap_fams) {
            int cap = r->cap_fams ? 2 * r->cap_fams : 16;
            family *p = realloc(r->fams, (size_t)cap * sizeof *p);
            if (!p)
                goto nomem_locked;
            r->fams = p;
            r->cap_fams = cap;
        }
        family fam = {strdup(name), strdup(help), k};
        if (!fam.name || !fam.help) {
            free(fam.name);
            free(fam.help);
            goto nomem_locked;
        }
        r->fams[r->n_fams++] = fam;
    }
    s = calloc(1, sizeof *s);
    if (!s)
        goto nomem_locked;
    s->kind = k;
    s->family = f;
    s->labels = lb.p;
    s->n_bounds = k == KIND_HISTOGRAM ? n_bounds : 0;
    for (int i = 0; i < s->n_bounds; i++)
        s->bounds[i] = bounds[i];
    atomic_init(&s->value, 0);
    atomic_init(&s->sum, bits_of(0.0));
    for (int i = 0; i <= ZS_PROM_MAX_BUCKETS; i++)
        atomic_init(&s->buckets[i], 0);
    r->series[r->n_series++] = s;
    pthread_mutex_unlock(&r->mu);
    return s;

nomem_locked:
    pthread_mutex_unlock(&r->mu);
nomem:
    zs_error(ZS_ERR_NOMEM, "metrics: out of memory registering %s", name);
fail:
    free(lb.p);
    return NULL;
}

zs_prom_series *zs_prom_counter(zs_prom *r, const char *name, const char *help,
                                const char *const *labels)
{
    return add_series(r, KIND_COUNTER, name, help, labels, NULL, 0);
}

zs_err zs_prom_register(zs_prom *r, const zs_prom_def *defs, int n)
{
    for (int i = 0; i < n; i++) {
        *defs[i].out = defs[i].gauge ? zs_prom_gauge(r, defs[i].name, defs[i].help, NULL)
                                     : zs_prom_counter(r, defs[i].name, defs[i].help, NULL);
        if (!*defs[i].out)
            return ZS_ERR_INVALID; /* why: recorded by the registration */
    }
    return ZS_OK;
}

zs_prom_series *zs_prom_gauge(zs_prom *r, const char *name, const char *help,
                              const char *const *labels)
{
    return add_series(r, KIND_GAUGE, name, help, labels, NULL, 0);
}

zs_prom_series *zs_prom_histogram(zs_prom *r, const char *name, const char *help,
                                  const char *const *labels, const double *bounds, int n)
{
    return add_series(r, KIND_HISTOGRAM, name, help, labels, bounds, n);
}

void zs_prom_add(zs_prom_series *s, uint64_t n)
{
    if (s && s->kind == KIND_COUNTER)
        atomic_fetch_add_explicit(&s->value, n, memory_order_relaxed);
}

void zs_prom_set(zs_prom_series *s, double v)
{
    if (s && s->kind == KIND_GAUGE)
        atomic_store_explicit(&s->value, bits_of(v), memory_order_relaxed);
}

/* *u += d for a double held as bits. */
static void add_double(_Atomic uint64_t *u, double d)
{
    uint64_t old = atomic_load_explicit(u, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(u, &old, bits_of(double_of(old) + d),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void zs_prom_gauge_add(zs_prom_series *s, double d)
{
    if (s && s->kind == KIND_GAUGE)
        add_double(&s->value, d);
}

void zs_prom_observe(zs_prom_series *s, double v)
{
    if (!s || s->kind != KIND_HISTOGRAM)
        return;
    int i = 0;
    while (i < s->n_bounds && !(v <= s->bounds[i]))
        i++;
    atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
    add_double(&s->sum, v);
    atomic_fetch_add_explicit(&s->value, 1, memory_order_relaxed);
}

double zs_prom_value(const zs_prom_series *s)
{
    if (!s)
        return NAN;
    uint64_t u = atomic_load_explicit(&s->value, memory_order_relaxed);
    return s->kind == KIND_GAUGE ? double_of(u) : (double)u;
}

/* name{labels} or name{labels,extra} or name, then a space. */
static void sb_series_name(sbuf *b, const char *name, const char *suffix, const char *labels,
                           const char *extra)
{
    sb_printf(b, "%s%s", name, suffix);
    int has = labels[0] != '\0';
    if (has || extra) {
        sb_put(b, "{", 1);
        sb_put(b, labels, strlen(labels));
        if (extra) {
            if (has)
                sb_put(b, ",", 1);
            sb_put(b, extra, strlen(extra));
        }
        sb_put(b, "}", 1);
    }
    sb_put(b, " ", 1);
}

static void write_series(sbuf *b, const char *name, const zs_prom_series *s)
{
    if (s->kind != KIND_HISTOGRAM) {
        sb_series_name(b, name, "", s->labels, NULL);
        uint64_t u = atomic_load_explicit(&s->value, memory_order_relaxed);
        if (s->kind == KIND_COUNTER)
            sb_printf(b, "%llu", (unsigned long long)u);
        else
            sb_double(b, double_of(u));
        sb_put(b, "\n", 1);
        return;
    }
    uint64_t cum = 0;
    for (int i = 0; i <= s->n_bounds; i++) {
        cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
        sbuf le = {0};
        sb_put(&le, "le=\"", 4);
        if (i < s->n_bounds)
            sb_double(&le, s->bounds[i]);
        else
            sb_put(&le, "+Inf", 4);
        sb_put(&le, "\"", 1);
        if (le.failed) {
            b->failed = 1;
            free(le.p);
            return;
        }
        sb_series_name(b, name, "_bucket", s->labels, le.p);
        free(le.p);
        sb_printf(b, "%llu\n", (unsigned long long)cum);
    }
    sb_series_name(b, name, "_sum", s->labels, NULL);
    sb_double(b, double_of(atomic_load_explicit(&s->sum, memory_order_relaxed)));
    sb_put(b, "\n", 1);
    sb_series_name(b, name, "_count", s->labels, NULL);
    sb_printf(b, "%llu\n", (unsigned long long)cum);
}

zs_err zs_prom_write(zs_prom *r, char **text, size_t *len)
{
    static const char *const type_name[] = {"counter", "gauge", "histogram"};
    sbuf b = {0};
    *text = NULL;
    *len = 0;
    sb_reserve(&b, 4096);
    pthread_mutex_lock(&r->mu);
    for (int f = 0; f < r->n_fams && !b.failed; f++) {
        const family *fam = &r->fams[f];
        sb_printf(&b, "# HELP %s ", fam->name);
        sb_escaped(&b, fam->help, 0);
        sb_printf(&b, "\n# TYPE %s %s\n", fam->name, type_name[fam->kind]);
        for (int i = 0; i < r->n_series; i++)
            if (r->series[i]->family == f)
                write_series(&b, fam->name, r->series[i]);
    }
    pthread_mutex_unlock(&r->mu);
    if (b.failed || !b.p) {
        free(b.p);
        return zs_error(ZS_ERR_NOMEM, "metrics: out of memory writing the exposition");
    }
    *text = b.p;
    *len = b.len;
    return ZS_OK;
}

zs_err zs_prom_add_process(zs_prom *r, const char *role)
{
    const char *info[] = {"version", ZS_VERSION, "role", role, NULL};
    zs_prom_series *bi =
        zs_prom_gauge(r, "zshard_build_info", "zshard's version and this process's role", info);
    zs_prom_series *st =
        zs_prom_gauge(r, "process_start_time_seconds",
                      "Start time of the process since unix epoch in seconds.", NULL);
    if (!bi || !st)
        return ZS_ERR_INVALID; /* the message is recorded */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    zs_prom_set(bi, 1);
    zs_prom_set(st, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    return ZS_OK;
}
