/*
 * metrics_http: the Prometheus endpoint of a coordinator or a partition server, served by
 * libmicrohttpd on a thread of its own: GET (or HEAD) /metrics answers the exposition text of
 * a registry (common/prom.h), built afresh for each scrape.
 *
 * The port is reachable by strangers, so it serves nothing else and holds little: other
 * paths get 404, other methods 405 (with Allow: GET, HEAD), at most 32 connections at once
 * and 4 from one address, each closed after 10 s without progress (a client that connects
 * and says nothing), and a request's headers must fit 16 KiB.  What a client sends never
 * stops the endpoint or the process; the problems it causes are logged, rate-limited.
 */
#ifndef ZS_METRICS_HTTP_H
#define ZS_METRICS_HTTP_H

#include "common/err.h"
#include "common/prom.h"

typedef struct zs_metrics_http zs_metrics_http;

/*
 * Binds addr ("HOST:PORT", "[V6]:PORT" or "*:PORT" for every address; port 0: a free port)
 * and starts serving reg, which must outlive the endpoint.  Fails with a message naming the
 * address (unparsable, unresolvable, cannot bind).
 */
zs_err zs_metrics_http_start(const char *addr, zs_prom *reg, zs_metrics_http **out);

/* The port bound (the kernel's choice for port 0). */
int zs_metrics_http_port(const zs_metrics_http *h);

/* "HOST:PORT" as a scraper would name it: the host given (a wildcard gives 127.0.0.1). */
const char *zs_metrics_http_target(const zs_metrics_http *h);

/* Stops the thread, closes every connection and the socket; NULL is fine. */
void zs_metrics_http_stop(zs_metrics_http *h);

#endif
