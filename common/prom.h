/*
 * prom: a registry of Prometheus metrics and its text exposition format (version 0.0.4), with
 * no dependency: the process's loop updates series, another thread (server/metrics_http.h)
 * writes them out for a scrape.
 *
 * A series is one name with a fixed set of labels, registered once, before or while the
 * registry is read: counters (integers that only go up), gauges (a double set or added to)
 * and histograms (fixed upper bounds, counts and a sum).  Updates are C11 atomics -- a relaxed
 * add or store, never a lock -- so the hot paths of a server pay an atomic add; registration
 * and zs_prom_write take the registry's mutex, which no update touches.  A scrape therefore
 * sees each value as it was at some instant during the write, not one instant for all.
 *
 * Every update takes a NULL series and does nothing, so that code with metrics turned off
 * (no registry) calls the same functions.  Names must be Prometheus names
 * ([a-zA-Z_:][a-zA-Z0-9_:]*), label names too (without the ':'); label values are any
 * UTF-8 and are escaped on output.  Series of one name must agree on type and help.
 */
#ifndef ZS_PROM_H
#define ZS_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct zs_prom zs_prom;
typedef struct zs_prom_series zs_prom_series;

/* The most labels one series has, and the most buckets of a histogram (+Inf not counted). */
#define ZS_PROM_MAX_LABELS 4
#define ZS_PROM_MAX_BUCKETS 24

zs_err zs_prom_open(zs_prom **out);
/* Frees the registry and every series; nothing may update or write them any more. */
void zs_prom_free(zs_prom *r);

/*
 * Registers a series.  labels: "k1", "v1", "k2", "v2", ..., NULL (NULL alone: no labels).
 * Returns the series, or NULL after recording why (zs_last_error): a bad name, a name
 * registered with another type or help, the same name and labels twice, out of memory.
 */
zs_prom_series *zs_prom_counter(zs_prom *r, const char *name, const char *help,
                                const char *const *labels);
zs_prom_series *zs_prom_gauge(zs_prom *r, const char *name, const char *help,
                              const char *const *labels);
/* bounds: n increasing finite upper bounds (the +Inf bucket is implicit), n <= MAX_BUCKETS. */
zs_prom_series *zs_prom_histogram(zs_prom *r, const char *name, const char *help,
                                  const char *const *labels, const double *bounds, int n);

/* One unlabelled counter or gauge for zs_prom_register: where its series goes, and its name
 * and help. */
typedef struct {
    zs_prom_series **out;
    int gauge; /* 0: a counter */
    const char *name, *help;
} zs_prom_def;

/* Registers defs[0..n) in order (zs_prom_counter or zs_prom_gauge, no labels), setting each
 * *out; fails at the first one refused, naming it. */
zs_err zs_prom_register(zs_prom *r, const zs_prom_def *defs, int n);

/* Counter: adds n. */
void zs_prom_add(zs_prom_series *s, uint64_t n);
/* Gauge: sets, or adds d (a compare-and-swap loop: for gauges that one thread writes). */
void zs_prom_set(zs_prom_series *s, double v);
void zs_prom_gauge_add(zs_prom_series *s, double d);
/* Histogram: one observation. */
void zs_prom_observe(zs_prom_series *s, double v);

/* The value now: a counter's count, a gauge's value, a histogram's observation count. */
double zs_prom_value(const zs_prom_series *s);

/*
 * The exposition text of every series, grouped by name in registration order of the names,
 * each name with its # HELP and # TYPE lines: a malloc'd NUL-terminated buffer the caller
 * frees, and its length.  Fails only for want of memory.
 */
zs_err zs_prom_write(zs_prom *r, char **text, size_t *len);

/*
 * Registers what every zshard process exports: zshard_build_info{version,role} (1) and
 * process_start_time_seconds (the wall clock now: the Unix time the process started, as
 * client libraries report it).
 */
zs_err zs_prom_add_process(zs_prom *r, const char *role);

#endif
