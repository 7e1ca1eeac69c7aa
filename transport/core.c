/*
 * core: the backend-neutral parts of the data plane (core.h).
 */
#include "transport/core.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

zs_event *zs_evq_push(zs_evq *q, zs_ev_type type, zs_conn *conn, const char *who)
{
    if (q->len == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 64;
        zs_event *ring = malloc(cap * sizeof *ring);
        if (!ring) {
            /* Nothing sensible remains; the event is lost, which the log says. */
            ZS_ERROR("%s: out of memory for the event queue; an event of type %d is lost", who,
                     type);
            return NULL;
        }
        for (size_t i = 0; i < q->len; i++)
            ring[i] = q->ring[(q->head + i) % q->cap];
        free(q->ring);
        q->ring = ring;
        q->cap = cap;
        q->head = 0;
    }
    zs_event *e = &q->ring[(q->head + q->len) % q->cap];
    q->len++;
    q->live++;
    e->type = type;
    e->conn = conn;
    e->listener = NULL;
    memset(&e->frame, 0, sizeof e->frame);
    e->user = NULL;
    e->err = ZS_OK;
    e->reason[0] = '\0';
    return e;
}

void zs_evq_forget(zs_evq *q, const zs_conn *conn)
{
    for (size_t i = 0; i < q->len; i++) {
        zs_event *e = &q->ring[(q->head + i) % q->cap];
        if (e->type == 0 || e->conn != conn)
            continue;
        if (e->type == ZS_EV_SEND || e->type == ZS_EV_RECV) {
            e->conn = NULL;
        } else {
            e->type = 0;
            q->live--;
        }
    }
}

int zs_evq_pop(zs_evq *q, zs_event *out)
{
    while (q->len) {
        zs_event *e = &q->ring[q->head];
        q->head = (q->head + 1) % q->cap;
        q->len--;
        if (e->type == 0)
            continue;
        q->live--;
        *out = *e;
        return 1;
    }
    return 0;
}

void zs_evq_free(zs_evq *q)
{
    free(q->ring);
    *q = (zs_evq){0};
}

int64_t zs_net_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t zs_net_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : zs_net_now_ms() + timeout_ms;
}

int zs_net_remaining_ms(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - zs_net_now_ms();
    if (left <= 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

void zs_net_copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

void zs_net_fmt(char *dst, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    vsnprintf(dst, cap, f, ap);
    va_end(ap);
}
