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

void zs_evq_outcome(zs_evq *q, int is_send, zs_conn *conn, const zs_frame *f, void *user, zs_err st,
                    const char *err, const char *who)
{
    zs_event *e = zs_evq_push(q, is_send ? ZS_EV_SEND : ZS_EV_RECV, conn, who);
    if (!e)
        return;
    e->frame = *f;
    e->user = user;
    e->err = st;
    zs_net_copy_str(e->reason, sizeof e->reason, err);
}

void zs_net_fail_text(char *out, size_t cap, int is_send, const zs_frame *f, const char *reason)
{
    if (is_send)
        zs_net_fmt(out, cap, "send of %s id %llu: %s", zs_frame_op_name(f->op),
                   (unsigned long long)f->id, reason);
    else
        zs_net_fmt(out, cap, "receive of id %llu: %s", (unsigned long long)f->id, reason);
}

zs_err zs_net_check_region(const char *backend, const char *what, const char *peer, int has_region,
                           size_t region_len, int region_access, size_t off, uint64_t len,
                           int access)
{
    if (len == 0)
        return ZS_OK;
    if (!has_region)
        return zs_error(ZS_ERR_INVALID, "%s %s %s: %llu payload bytes but no registered region",
                        backend, what, peer, (unsigned long long)len);
    if (!(region_access & access))
        return zs_error(ZS_ERR_INVALID, "%s %s %s: the region is not registered for %s", backend,
                        what, peer, access == ZS_MR_SEND ? "ZS_MR_SEND" : "ZS_MR_RECV");
    if (off > region_len || len > region_len - off)
        return zs_error(ZS_ERR_INVALID,
                        "%s %s %s: %llu bytes at offset %zu are outside the region of %zu bytes",
                        backend, what, peer, (unsigned long long)len, off, region_len);
    return ZS_OK;
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
