/*
 * core: the backend-neutral parts of the data plane (core.h).
 */
#include "transport/core.h"

#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
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

zs_conn *zs_evq_take_accept(zs_evq *q, const zs_listener *l)
{
    for (size_t i = 0; i < q->len; i++) {
        zs_event *e = &q->ring[(q->head + i) % q->cap];
        if (e->type == ZS_EV_ACCEPT && e->listener == l) {
            e->type = 0;
            q->live--;
            return e->conn;
        }
    }
    return NULL;
}

void zs_evq_forget_listener(zs_evq *q, const zs_listener *l)
{
    for (size_t i = 0; i < q->len; i++) {
        zs_event *e = &q->ring[(q->head + i) % q->cap];
        if ((e->type == ZS_EV_ACCEPT || e->type == ZS_EV_REFUSED) && e->listener == l)
            e->listener = NULL;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* registered regions */

void zs_region_add(zs_region **table, zs_region *m, const void *net, void *base, size_t len,
                   int access)
{
    m->net = net;
    m->base = base;
    m->len = len;
    m->access = access;
    m->key = access & (ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE) ? zs_region_new_key(*table) : 0;
    m->refs = 0;
    m->prev = NULL;
    m->next = *table;
    if (*table)
        (*table)->prev = m;
    *table = m;
}

zs_err zs_region_remove(zs_region **table, zs_region *m, const char *backend)
{
    if (m->refs)
        return zs_error(ZS_ERR_INVALID,
                        "%s dereg_mr: region of %zu bytes at %p: %ld requests still use it",
                        backend, m->len, (void *)m->base, m->refs);
    if (m->prev)
        m->prev->next = m->next;
    else
        *table = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->prev = m->next = NULL;
    return ZS_OK;
}

zs_err zs_region_check_access(const char *backend, int access)
{
    const int all = ZS_MR_SEND | ZS_MR_RECV | ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE;
    if ((access & all) == 0 || (access & ~(all | ZS_MR_PINNED)))
        return zs_error(ZS_ERR_INVALID,
                        "%s reg_mr: access %d is not a combination of ZS_MR_SEND, ZS_MR_RECV, "
                        "ZS_MR_REMOTE_READ and ZS_MR_REMOTE_WRITE (and ZS_MR_PINNED)",
                        backend, access);
    return ZS_OK;
}

uint32_t zs_region_new_key(const zs_region *table)
{
    for (;;) {
        uint32_t k = 0;
        if (getrandom(&k, sizeof k, 0) != (ssize_t)sizeof k) {
            /* No entropy to be had (a very early boot): a counter mixed with the clock still
             * gives distinct keys, if guessable ones. */
            static uint32_t n;
            k = (uint32_t)zs_net_now_ms() * 2654435761u + ++n;
        }
        int taken = k == 0;
        for (const zs_region *m = table; m && !taken; m = m->next)
            taken = m->key == k;
        if (!taken)
            return k;
    }
}

zs_err zs_region_export(const char *backend, const zs_region *m, zs_mr_desc *out)
{
    const int remote = ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE;
    if (!m)
        return zs_error(ZS_ERR_INVALID, "%s mr_export: no region", backend);
    if (!(m->access & remote))
        return zs_error(ZS_ERR_INVALID,
                        "%s mr_export: the region of %zu bytes at %p is registered for neither "
                        "ZS_MR_REMOTE_READ nor ZS_MR_REMOTE_WRITE",
                        backend, m->len, (void *)m->base);
    *out = (zs_mr_desc){.addr = (uint64_t)(uintptr_t)m->base,
                        .len = m->len,
                        .key = m->key,
                        .access = (uint32_t)(m->access & remote)};
    return ZS_OK;
}

zs_region *zs_region_lookup(zs_region *table, uint64_t key, uint64_t addr, uint64_t len, int access,
                            char *why, size_t cap)
{
    const char *what = access == ZS_MR_REMOTE_WRITE ? "write" : "read";
    zs_region *m = table;
    while (m && (key == 0 || m->key != key))
        m = m->next;
    if (!m) {
        zs_net_fmt(why, cap, "bad key: no region with key 0x%llx (deregistered, or never given)",
                   (unsigned long long)key);
        return NULL;
    }
    uint64_t base = (uint64_t)(uintptr_t)m->base;
    if (addr < base || addr - base > m->len || len > m->len - (addr - base)) {
        zs_net_fmt(why, cap,
                   "bad key: %llu bytes at 0x%llx are outside the region with key 0x%llx "
                   "(%zu bytes at 0x%llx)",
                   (unsigned long long)len, (unsigned long long)addr, (unsigned long long)key,
                   m->len, (unsigned long long)base);
        return NULL;
    }
    if (!(m->access & access)) {
        zs_net_fmt(why, cap, "bad key: the region with key 0x%llx is not open to remote %ss",
                   (unsigned long long)key, what);
        return NULL;
    }
    return m;
}

zs_frame zs_rma_request(int write, uint64_t id, const zs_mr_desc *rd, uint64_t remote_off,
                        size_t len, int notify, uint32_t imm)
{
    return (zs_frame){.version = ZS_FRAME_VERSION,
                      .op = write ? ZS_OP_RMA_WRITE : ZS_OP_RMA_READ,
                      .dtype = ZS_DTYPE_BYTES,
                      .flags = write && notify ? ZS_FRAME_FLAG_NOTIFY : 0,
                      .id = id,
                      .step = rd->key,
                      .chunk = write ? imm : 0,
                      .offset = rd->addr + remote_off,
                      .count = len,
                      .length = write ? len : 0};
}

zs_err zs_rma_expect(zs_rq_pool *p, void *net, void *conn, const char *peer, zs_rq **expect,
                     uint64_t *next_id, int write, zs_region *m, size_t off, const zs_mr_desc *rd,
                     uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                     int handle, zs_rq **out)
{
    ZS_CHECK(zs_rma_check(p->who, write, peer, net, m, off, rd, remote_off, len));
    uint64_t id = ZS_RMA_ID_BASE | ((*next_id)++ & (ZS_RMA_ID_BASE - 1));
    zs_frame f = zs_rma_request(write, id, rd, remote_off, len, notify, imm), back;
    uint8_t hdr[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(&f, hdr);
    if (zs_frame_decode(hdr, &back) != ZS_OK) /* the address and bytes wrap */
        return zs_error_context(ZS_ERR_INVALID, "%s %s %s", p->who, write ? "iwrite" : "iread",
                                peer);
    zs_req *ur;
    ZS_CHECK(zs_rq_expect_any(p, net, conn, peer, expect, id, write ? NULL : m, write ? 0 : off,
                              write ? 0 : len, user, &ur));
    zs_rq *r = (zs_rq *)ur;
    r->handle = handle;
    r->kind = write ? ZS_RQ_SEND : ZS_RQ_RECV; /* completes as ZS_EV_SEND or ZS_EV_RECV */
    r->rma = write ? ZS_RMA_WRITE : ZS_RMA_READ;
    r->frame = f;
    *out = r;
    return ZS_OK;
}

zs_frame zs_rma_answer(const zs_frame *f, int op, size_t text_len)
{
    if (op == ZS_OP_ERROR)
        return (zs_frame){.version = ZS_FRAME_VERSION,
                          .op = ZS_OP_ERROR,
                          .dtype = ZS_DTYPE_TEXT,
                          .status = ZS_FS_BAD_KEY,
                          .id = f->id,
                          .offset = f->offset,
                          .count = f->count,
                          .length = text_len};
    return (zs_frame){.version = ZS_FRAME_VERSION,
                      .op = (uint16_t)op,
                      .dtype = ZS_DTYPE_BYTES,
                      .id = f->id,
                      .step = f->step,
                      .offset = f->offset,
                      .count = f->count,
                      .length = op == ZS_OP_RMA_DATA ? f->count : 0};
}

zs_err zs_rma_check_answer(const char *backend, const char *peer, const struct zs_rq *r,
                           const zs_frame *f, char *msg, size_t cap)
{
    const zs_frame *q = &r->frame;
    int write = r->rma == ZS_RMA_WRITE;
    if (f->op == ZS_OP_ERROR) {
        zs_net_fmt(msg, cap,
                   "%s %s %s: the peer refused %llu bytes at 0x%llx of its region with key "
                   "0x%llx: %s",
                   backend, write ? "iwrite" : "iread", peer, (unsigned long long)q->count,
                   (unsigned long long)q->offset, (unsigned long long)q->step,
                   f->status == ZS_FS_BAD_KEY
                       ? "bad key (no such region, bytes outside it, or not open to this access)"
                       : zs_frame_status_name(f->status));
        return ZS_ERR_INVALID;
    }
    if (f->op != (write ? ZS_OP_RMA_ACK : ZS_OP_RMA_DATA) || f->offset != q->offset ||
        f->count != q->count) {
        zs_net_fmt(msg, cap,
                   "%s id %llu (%llu bytes at 0x%llx) does not answer our %s of %llu bytes at "
                   "0x%llx",
                   zs_frame_op_name(f->op), (unsigned long long)f->id, (unsigned long long)f->count,
                   (unsigned long long)f->offset, zs_frame_op_name(q->op),
                   (unsigned long long)q->count, (unsigned long long)q->offset);
        return ZS_ERR_FORMAT;
    }
    return ZS_OK;
}

zs_err zs_rma_check(const char *backend, int write, const char *peer, const void *net,
                    const zs_region *m, size_t off, const zs_mr_desc *rd, uint64_t remote_off,
                    size_t len)
{
    const char *what = write ? "iwrite" : "iread";
    if (!rd)
        return zs_error(ZS_ERR_INVALID, "%s %s %s: no descriptor of the peer's region", backend,
                        what, peer);
    if (len == 0 || len > ZS_FRAME_MAX_PAYLOAD)
        return zs_error(ZS_ERR_INVALID, "%s %s %s: %zu bytes; one operation moves 1 to %llu",
                        backend, what, peer, len, (unsigned long long)ZS_FRAME_MAX_PAYLOAD);
    ZS_CHECK(
        zs_region_check(backend, what, peer, net, m, off, len, write ? ZS_MR_SEND : ZS_MR_RECV));
    uint32_t need = write ? ZS_MR_REMOTE_WRITE : ZS_MR_REMOTE_READ;
    if (!(rd->access & need))
        return zs_error(ZS_ERR_INVALID,
                        "%s %s %s: the peer's region (key 0x%x) is not open to "
                        "remote %ss",
                        backend, what, peer, rd->key, write ? "write" : "read");
    if (remote_off > rd->len || len > rd->len - remote_off)
        return zs_error(ZS_ERR_INVALID,
                        "%s %s %s: %zu bytes at offset %llu are outside the peer's region of %llu "
                        "bytes",
                        backend, what, peer, len, (unsigned long long)remote_off,
                        (unsigned long long)rd->len);
    return ZS_OK;
}

zs_err zs_region_check(const char *backend, const char *what, const char *peer, const void *net,
                       const zs_region *m, size_t off, uint64_t len, int access)
{
    if (len == 0)
        return ZS_OK;
    if (!m)
        return zs_error(ZS_ERR_INVALID, "%s %s %s: %llu payload bytes but no registered region",
                        backend, what, peer, (unsigned long long)len);
    if (m->net != net)
        return zs_error(ZS_ERR_INVALID, "%s %s %s: the region belongs to another net", backend,
                        what, peer);
    if (!(m->access & access))
        return zs_error(ZS_ERR_INVALID, "%s %s %s: the region is not registered for %s", backend,
                        what, peer, access == ZS_MR_SEND ? "ZS_MR_SEND" : "ZS_MR_RECV");
    /* remote access is checked by zs_region_lookup */
    if (off > m->len || len > m->len - off)
        return zs_error(ZS_ERR_INVALID,
                        "%s %s %s: %llu bytes at offset %zu are outside the region of %zu bytes",
                        backend, what, peer, (unsigned long long)len, off, m->len);
    return ZS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* requests */

#define ZS_RQ_SLAB 64

struct zs_rq_slab {
    struct zs_rq_slab *next;
    zs_rq reqs[ZS_RQ_SLAB];
};

zs_rq *zs_rq_new(zs_rq_pool *p, void *net, int kind, void *conn, void *user, int handle)
{
    if (!p->free) {
        struct zs_rq_slab *sl = calloc(1, sizeof *sl);
        if (!sl)
            return NULL;
        sl->next = p->slabs;
        p->slabs = sl;
        for (int i = 0; i < ZS_RQ_SLAB; i++) {
            sl->reqs[i].next = p->free;
            p->free = &sl->reqs[i];
        }
    }
    zs_rq *r = p->free;
    p->free = r->next;
    memset(r, 0, offsetof(zs_rq, err));
    r->err[0] = '\0';
    r->pool = p;
    r->net = net;
    r->kind = kind;
    r->conn = conn;
    r->user = user;
    r->handle = handle;
    return r;
}

void zs_rq_release(zs_rq *r)
{
    zs_rq_pool *p = r->pool;
    if (r->mr) {
        r->mr->refs--;
        r->mr = NULL;
    }
    free(r->inline_buf);
    r->inline_buf = NULL;
    r->state = ZS_RQ_IDLE;
    r->handle = 0;
    r->prev = NULL;
    r->next = p->free;
    p->free = r;
}

void zs_rq_pool_free(zs_rq_pool *p)
{
    while (p->slabs) {
        struct zs_rq_slab *sl = p->slabs;
        p->slabs = sl->next;
        for (int i = 0; i < ZS_RQ_SLAB; i++)
            free(sl->reqs[i].inline_buf);
        free(sl);
    }
    p->free = NULL;
}

void zs_rq_use(zs_rq *r, zs_region *m, size_t off)
{
    r->mr = m;
    m->refs++;
    r->buf = m->base + off;
}

void zs_rq_finish(zs_rq *r, zs_err st, const char *msg)
{
    if (r->mr) {
        r->mr->refs--;
        r->mr = NULL;
    }
    r->status = st;
    if (st == ZS_OK)
        r->err[0] = '\0';
    else if (msg != r->err)
        zs_net_copy_str(r->err, sizeof r->err, msg);
    r->state = ZS_RQ_DONE;
    r->at = NULL;
    r->prev = r->next = NULL;
    if (r->silent) {
        zs_rq_release(r);
        return;
    }
    if (r->handle) {
        r->conn = NULL;
        return;
    }
    zs_rq_pool *p = r->pool;
    zs_conn *c = p->event_conn ? p->event_conn(r->conn) : r->conn;
    zs_evq_outcome(p->evq, r->kind == ZS_RQ_SEND, c, &r->frame, r->user, st, r->err, p->who);
    zs_rq_release(r);
}

void zs_rq_fail_conn(zs_rq *r, const char *reason)
{
    char msg[ZS_NET_REASON_MAX];
    zs_net_fail_text(msg, sizeof msg, r->kind == ZS_RQ_SEND, &r->frame, reason);
    zs_rq_finish(r, ZS_ERR_IO, msg);
}

void zs_rq_orphan(zs_rq *r)
{
    if (r->mr) {
        r->mr->refs--;
        r->mr = NULL;
    }
    r->buf = NULL;
    r->len = 0;
    r->handle = 0;
    r->silent = 1;
}

zs_err zs_rq_check_handle(const zs_rq *r, const char *what)
{
    if (!r || !r->handle || r->state == ZS_RQ_IDLE)
        return zs_error(ZS_ERR_INVALID, "%s %s: not a live request handle",
                        r && r->pool ? r->pool->who : "transport", what);
    return ZS_OK;
}

static int rq_done(void *arg)
{
    return ((zs_rq *)arg)->state == ZS_RQ_DONE;
}

zs_err zs_rq_wait(zs_rq *r, int timeout_ms, int *done, zs_frame *f, const char *what)
{
    *done = 0;
    ZS_CHECK(zs_rq_check_handle(r, what));
    if (r->state != ZS_RQ_DONE)
        ZS_CHECK(r->pool->run(r->net, zs_net_deadline(timeout_ms), rq_done, r));
    if (r->state != ZS_RQ_DONE)
        return ZS_OK;
    *done = 1;
    if (f)
        *f = r->frame;
    zs_err st = r->status;
    if (st != ZS_OK)
        zs_error(st, "%s", r->err);
    zs_rq_release(r);
    return st;
}

zs_err zs_rq_expect(zs_rq_pool *p, void *net, void *conn, const char *peer, zs_rq **expect,
                    uint64_t id, zs_region *m, size_t off, size_t cap, void *user, zs_req **out)
{
    if (out)
        *out = NULL;
    if (id >= ZS_RMA_ID_BASE)
        return zs_error(ZS_ERR_INVALID,
                        "%s irecv %s: id %llu is in the range the transport keeps for one-sided "
                        "operations (from 2^63)",
                        p->who, peer, (unsigned long long)id);
    return zs_rq_expect_any(p, net, conn, peer, expect, id, m, off, cap, user, out);
}

zs_err zs_rq_expect_any(zs_rq_pool *p, void *net, void *conn, const char *peer, zs_rq **expect,
                        uint64_t id, zs_region *m, size_t off, size_t cap, void *user, zs_req **out)
{
    if (out)
        *out = NULL;
    ZS_CHECK(zs_region_check(p->who, "irecv", peer, net, m, off, cap, ZS_MR_RECV));
    if (zs_rq_list_find(*expect, id))
        return zs_error(ZS_ERR_INVALID, "%s irecv %s: id %llu is already expected", p->who, peer,
                        (unsigned long long)id);
    zs_rq *r = zs_rq_new(p, net, ZS_RQ_RECV, conn, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "%s irecv %s: out of memory", p->who, peer);
    r->id = id;
    r->frame.id = id;
    r->len = cap;
    if (cap)
        zs_rq_use(r, m, off);
    r->state = ZS_RQ_EXPECTED;
    zs_rq_list_add(expect, r);
    if (out)
        *out = (zs_req *)r;
    return ZS_OK;
}

void zs_rq_list_add(zs_rq **head, zs_rq *r)
{
    r->prev = NULL;
    r->next = *head;
    if (*head)
        (*head)->prev = r;
    *head = r;
}

void zs_rq_list_del(zs_rq **head, zs_rq *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        *head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

zs_rq *zs_rq_list_find(zs_rq *head, uint64_t id)
{
    for (zs_rq *r = head; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

zs_rq *zs_rq_list_token(zs_rq *head, uint64_t token)
{
    for (zs_rq *r = head; r; r = r->next)
        if (r->token == token)
            return r;
    return NULL;
}

void zs_rq_fifo_push(zs_rq **head, zs_rq **tail, zs_rq *r)
{
    r->next = NULL;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

zs_rq *zs_rq_fifo_pop(zs_rq **head, zs_rq **tail)
{
    zs_rq *r = *head;
    if (r) {
        *head = r->next;
        if (!*head)
            *tail = NULL;
        r->next = NULL;
    }
    return r;
}

int zs_rq_fifo_remove(zs_rq **head, zs_rq **tail, zs_rq *r)
{
    zs_rq *prev = NULL;
    for (zs_rq *q = *head; q; prev = q, q = q->next) {
        if (q != r)
            continue;
        if (prev)
            prev->next = q->next;
        else
            *head = q->next;
        if (*tail == q)
            *tail = prev;
        q->next = NULL;
        return 1;
    }
    return 0;
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
