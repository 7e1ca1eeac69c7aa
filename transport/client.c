/*
 * client: see client.h.  An operation is an array of pieces, each with its receive request
 * (the reply) and its send request (the frame); both are driven by the transport's wait.
 */
#include "transport/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define REPLY_BYTES (ZS_FRAME_MAX_ERROR_TEXT + 64) /* a push reply, or an error's text */

typedef struct {
    void *base;
    size_t bytes;
    zs_mr *mr;
    /* device memory (a dma-buf): the CPU reads it only through copy */
    int (*copy)(void *ctx, void *dst, const void *src, size_t n, int to_region);
    void *copy_ctx;
} region;

/* Room for the replies of a push's sends, registered once and reused: an operation takes an
 * area with room for its sends from the client's free list (or makes one, of at least
 * MIN_REPLIES) and gives it back when it ends, so that no push registers memory. */
typedef struct reply_area {
    char *buf;
    int cap; /* replies it holds */
    zs_mr *mr;
    struct reply_area *next; /* free list; all areas: `all` */
    struct reply_area *all;
} reply_area;
#define MIN_REPLIES 64

struct zs_client {
    const zs_transport_ops *ops;
    zs_net *net;
    const zs_shardmap *map;
    uint32_t sender;
    zs_auth auth;    /* who we prove to be on every stream (its token) */
    int push_copies; /* 2 when the map gives some server a replica (pushes go there too), else 1 */
    zs_conn **conn;  /* [n_servers] */
    char (*endpoint)[128];
    region *regions;
    int n_regions, cap_regions;
    uint64_t next_id;
    reply_area *free_areas; /* reply areas no operation holds */
    reply_area *areas;      /* every reply area, for close */
};

typedef struct {
    zs_shard_piece piece;
    const char *reply_at; /* where an error reply's text lands */
    zs_req *recv, *send;
    int recv_done, send_done;
} op_piece;

struct zs_client_op {
    int is_push;
    int n;
    op_piece *pieces;
    reply_area *area; /* push: room for its replies */
    long version;
};

zs_err zs_client_open(const zs_shardmap *map, const char *const *endpoints, const zs_auth *auth,
                      const zs_conn_opts *opts, zs_client **out)
{
    *out = NULL;
    zs_client *cl = calloc(1, sizeof *cl);
    if (!cl)
        return zs_error(ZS_ERR_NOMEM, "client: out of memory");
    cl->ops = opts && opts->ops ? opts->ops : &zs_tcp_ops;
    cl->map = map;
    cl->auth = *auth;
    cl->sender = auth->member;
    cl->push_copies = 1;
    for (int s = 0; s < map->n_servers; s++)
        if (zs_shardmap_replica(map, s) >= 0)
            cl->push_copies = 2;
    cl->conn = calloc((size_t)map->n_servers, sizeof *cl->conn);
    cl->endpoint = calloc((size_t)map->n_servers, sizeof *cl->endpoint);
    zs_err res;
    if (!cl->conn || !cl->endpoint) {
        res = zs_error(ZS_ERR_NOMEM, "client: out of memory");
        goto fail;
    }
    ZS_CHECK_GOTO(cl->ops->open(&cl->net), res, fail);
    zs_conn_opts o = opts ? *opts : (zs_conn_opts){0};
    o.auth = &cl->auth;
    for (int s = 0; s < map->n_servers; s++) {
        snprintf(cl->endpoint[s], sizeof cl->endpoint[s], "%s", endpoints[s]);
        ZS_CHECK_GOTO(cl->ops->connect(cl->net, endpoints[s], &o, &cl->conn[s]), res, fail);
    }
    *out = cl;
    return ZS_OK;
fail:
    zs_client_close(cl);
    return res;
}

void zs_client_close(zs_client *cl)
{
    if (!cl)
        return;
    if (cl->net)
        cl->ops->close(cl->net); /* deregisters the reply areas too */
    for (reply_area *a = cl->areas, *nx; a; a = nx) {
        nx = a->all;
        free(a->buf);
        free(a);
    }
    free(cl->conn);
    free(cl->endpoint);
    free(cl->regions);
    zs_wipe(cl->auth.token, sizeof cl->auth.token);
    free(cl);
}

/* Room for one more region in cl->regions. */
static zs_err grow_regions(zs_client *cl)
{
    if (cl->n_regions == cl->cap_regions) {
        int cap = cl->cap_regions ? 2 * cl->cap_regions : 8;
        region *r = realloc(cl->regions, (size_t)cap * sizeof *r);
        if (!r)
            return zs_error(ZS_ERR_NOMEM, "client: out of memory for regions");
        cl->regions = r;
        cl->cap_regions = cap;
    }
    return ZS_OK;
}

static zs_err register_region(zs_client *cl, void *base, size_t bytes, int access)
{
    ZS_CHECK(grow_regions(cl));
    region *r = &cl->regions[cl->n_regions];
    *r = (region){.base = base, .bytes = bytes};
    ZS_CHECK(cl->ops->reg_mr(cl->net, base, bytes, access, &r->mr));
    cl->n_regions++;
    return ZS_OK;
}

zs_err zs_client_register(zs_client *cl, void *base, size_t bytes)
{
    return register_region(cl, base, bytes, ZS_MR_SEND | ZS_MR_RECV);
}

zs_err zs_client_register_pinned(zs_client *cl, void *base, size_t bytes)
{
    return register_region(cl, base, bytes, ZS_MR_SEND | ZS_MR_RECV | ZS_MR_PINNED);
}

zs_err zs_client_register_dmabuf(zs_client *cl, const zs_dmabuf *buf)
{
    if (cl->ops->version < 6 || !cl->ops->reg_dmabuf_mr) /* a table from before dma-bufs */
        return zs_error(ZS_ERR_UNSUPPORTED,
                        "%s (transport ops version %d) cannot register a dma-buf", cl->ops->name,
                        cl->ops->version);
    ZS_CHECK(grow_regions(cl));
    region *r = &cl->regions[cl->n_regions];
    *r = (region){.base = buf->addr, .bytes = buf->len, .copy = buf->copy, .copy_ctx = buf->ctx};
    ZS_CHECK(cl->ops->reg_dmabuf_mr(cl->net, buf, ZS_MR_SEND | ZS_MR_RECV, &r->mr));
    cl->n_regions++;
    return ZS_OK;
}

const char *zs_client_transport(const zs_client *cl)
{
    return cl->ops->name;
}

/* The registered region holding [p, p + bytes), or NULL. */
static const region *region_of(const zs_client *cl, const void *p, size_t bytes)
{
    const char *c = p;
    for (int i = 0; i < cl->n_regions; i++) {
        const char *b = cl->regions[i].base;
        if (c >= b && c + bytes <= b + cl->regions[i].bytes)
            return &cl->regions[i];
    }
    return NULL;
}

/* The registered region holding [p, p + bytes), and p's offset in it. */
static zs_err find_region(const zs_client *cl, const void *p, size_t bytes, zs_mr **mr, size_t *off)
{
    const region *r = region_of(cl, p, bytes);
    if (r) {
        *mr = r->mr;
        *off = (size_t)((const char *)p - (const char *)r->base);
        return ZS_OK;
    }
    return zs_error(ZS_ERR_INVALID, "client: buffer %p of %zu bytes is not in registered memory", p,
                    bytes);
}

int zs_client_pieces(const zs_client *cl, size_t begin, size_t end)
{
    return zs_shardmap_count_pieces(cl->map, begin, end);
}

static void op_free(zs_client *cl, zs_client_op *op)
{
    if (!op)
        return;
    for (int i = 0; i < op->n; i++) {
        if (op->pieces[i].recv && !op->pieces[i].recv_done)
            cl->ops->cancel(op->pieces[i].recv);
        if (op->pieces[i].send && !op->pieces[i].send_done)
            cl->ops->cancel(op->pieces[i].send);
    }
    if (op->area) { /* its requests are done or cancelled: nothing writes to it any more */
        op->area->next = cl->free_areas;
        cl->free_areas = op->area;
    }
    free(op->pieces);
    free(op);
}

/* A reply area with room for n replies: a free one, or a new one registered now. */
static zs_err take_area(zs_client *cl, int n, reply_area **out)
{
    for (reply_area **p = &cl->free_areas; *p; p = &(*p)->next)
        if ((*p)->cap >= n) {
            *out = *p;
            *p = (*p)->next;
            return ZS_OK;
        }
    reply_area *a = calloc(1, sizeof *a);
    int cap = n > MIN_REPLIES ? n : MIN_REPLIES;
    if (a)
        a->buf = malloc((size_t)cap * REPLY_BYTES);
    if (!a || !a->buf) {
        free(a);
        return zs_error(ZS_ERR_NOMEM, "client: out of memory for push replies");
    }
    zs_err e = cl->ops->reg_mr(cl->net, a->buf, (size_t)cap * REPLY_BYTES, ZS_MR_RECV, &a->mr);
    if (e != ZS_OK) {
        free(a->buf);
        free(a);
        return e;
    }
    a->cap = cap;
    a->all = cl->areas;
    cl->areas = a;
    *out = a;
    return ZS_OK;
}

int zs_client_reply_areas(const zs_client *cl)
{
    int n = 0;
    for (const reply_area *a = cl->areas; a; a = a->all)
        n++;
    return n;
}

/* Splits [begin, end) and allocates the operation. */
static zs_err op_new(zs_client *cl, size_t begin, size_t end, int is_push, zs_client_op **out)
{
    int n = zs_shardmap_count_pieces(cl->map, begin, end);
    if (n <= 0)
        return zs_error(ZS_ERR_INVALID,
                        "client: range [%zu, %zu) is empty or outside the vector "
                        "of %zu floats",
                        begin, end, cl->map->total);
    zs_client_op *op = calloc(1, sizeof *op);
    zs_shard_piece *pieces = malloc((size_t)n * sizeof *pieces);
    if (!op || !pieces) {
        free(op);
        free(pieces);
        return zs_error(ZS_ERR_NOMEM, "client: out of memory for %d pieces", n);
    }
    op->is_push = is_push;
    int sends = is_push ? cl->push_copies * n : n;
    op->pieces = calloc((size_t)sends, sizeof *op->pieces);
    int got = 0;
    zs_err res = op->pieces ? zs_shardmap_split(cl->map, begin, end, pieces, n, &got)
                            : zs_error(ZS_ERR_NOMEM, "client: out of memory");
    if (res == ZS_OK && is_push)
        res = take_area(cl, sends, &op->area);
    if (res != ZS_OK) {
        free(pieces);
        op_free(cl, op);
        return res;
    }
    for (int i = 0; i < got; i++)
        op->pieces[i].piece = pieces[i];
    op->n = got;
    /* A push goes to the replica of each piece's server too (after the originals). */
    for (int i = 0; is_push && i < got; i++) {
        int r = zs_shardmap_replica(cl->map, pieces[i].server);
        if (r >= 0) {
            op->pieces[op->n].piece = pieces[i];
            op->pieces[op->n++].piece.server = r;
        }
    }
    free(pieces);
    *out = op;
    return ZS_OK;
}

/* A fetch of the published copy in dtype (array < 0) or of optimizer-state array `array`. */
static zs_err fetch(zs_client *cl, size_t begin, size_t end, long version, zs_frame_dtype dtype,
                    int array, void *dst, zs_client_op **out)
{
    *out = NULL;
    size_t esz = zs_frame_dtype_size(dtype);
    zs_mr *mr;
    size_t base_off;
    ZS_CHECK(find_region(cl, dst, (end - begin) * esz, &mr, &base_off));
    zs_client_op *op;
    ZS_CHECK(op_new(cl, begin, end, 0, &op));
    op->version = version;
    for (int i = 0; i < op->n; i++) {
        op_piece *p = &op->pieces[i];
        size_t count = p->piece.end - p->piece.begin;
        zs_frame f = {.op = ZS_OP_FETCH,
                      .dtype = dtype,
                      .flags = array >= 0 ? ZS_FRAME_FLAG_STATE : 0,
                      .id = ++cl->next_id,
                      .step = (uint64_t)version,
                      .chunk = array >= 0 ? (uint32_t)array : 0,
                      .offset = p->piece.begin,
                      .count = count};
        zs_conn *c = cl->conn[p->piece.server];
        size_t off = base_off + (p->piece.begin - begin) * esz;
        p->reply_at = (const char *)dst + (p->piece.begin - begin) * esz;
        zs_err e = cl->ops->irecv(c, f.id, mr, off, count * esz, NULL, &p->recv);
        if (e == ZS_OK)
            e = cl->ops->isend(c, &f, NULL, 0, NULL, &p->send);
        if (e != ZS_OK) {
            /* p lies inside op: name the piece before op goes. */
            int shard = p->piece.shard, server = p->piece.server;
            op_free(cl, op);
            return zs_error_context(e, "fetch of shard %d from %s", shard, cl->endpoint[server]);
        }
    }
    *out = op;
    return ZS_OK;
}

zs_err zs_client_fetch(zs_client *cl, size_t begin, size_t end, long version, zs_frame_dtype dtype,
                       void *dst, zs_client_op **op)
{
    return fetch(cl, begin, end, version, dtype, -1, dst, op);
}

zs_err zs_client_fetch_state(zs_client *cl, size_t begin, size_t end, long version, int array,
                             float *dst, zs_client_op **op)
{
    if (array < 0 || array >= ZS_FRAME_STATE_ARRAYS)
        return zs_error(ZS_ERR_INVALID, "client: state array %d, expected 0..%d", array,
                        ZS_FRAME_STATE_ARRAYS - 1);
    return fetch(cl, begin, end, version, ZS_DTYPE_F32, array, dst, op);
}

/* A push of src (esz = the dtype's bytes an element) in its pieces. */
static zs_err push(zs_client *cl, size_t begin, size_t end, long step, int chunk,
                   zs_frame_dtype dtype, const void *src, zs_client_op **out)
{
    *out = NULL;
    zs_mr *mr;
    size_t base_off, esz = zs_frame_dtype_size(dtype);
    ZS_CHECK(find_region(cl, src, (end - begin) * esz, &mr, &base_off));
    zs_client_op *op;
    ZS_CHECK(op_new(cl, begin, end, 1, &op));
    for (int i = 0; i < op->n; i++) {
        op_piece *p = &op->pieces[i];
        size_t count = p->piece.end - p->piece.begin;
        zs_frame f = {.op = ZS_OP_PUSH,
                      .dtype = dtype,
                      .id = ++cl->next_id,
                      .step = (uint64_t)step,
                      .chunk = (uint32_t)chunk,
                      .sender = cl->sender,
                      .offset = p->piece.begin,
                      .count = count,
                      .length = count * esz};
        zs_conn *c = cl->conn[p->piece.server];
        p->reply_at = op->area->buf + (size_t)i * REPLY_BYTES;
        zs_err e = cl->ops->irecv(c, f.id, op->area->mr, (size_t)i * REPLY_BYTES, REPLY_BYTES, NULL,
                                  &p->recv);
        if (e == ZS_OK)
            e = cl->ops->isend(c, &f, mr, base_off + (p->piece.begin - begin) * esz, NULL,
                               &p->send);
        if (e != ZS_OK) {
            /* p lies inside op: name the piece before op goes. */
            int shard = p->piece.shard, server = p->piece.server;
            op_free(cl, op);
            return zs_error_context(e, "push of shard %d to %s", shard, cl->endpoint[server]);
        }
    }
    *out = op;
    return ZS_OK;
}

zs_err zs_client_push(zs_client *cl, size_t begin, size_t end, long step, int chunk,
                      const float *src, zs_client_op **out)
{
    return push(cl, begin, end, step, chunk, ZS_DTYPE_F32, src, out);
}

zs_err zs_client_push_f16(zs_client *cl, size_t begin, size_t end, long step, int chunk,
                          const uint16_t *src, zs_client_op **out)
{
    return push(cl, begin, end, step, chunk, ZS_DTYPE_F16, src, out);
}

zs_err zs_client_wait(zs_client *cl, zs_client_op *op, int timeout_ms, int *done)
{
    *done = 0;
    zs_err res = ZS_OK;
    for (int i = 0; i < op->n && res == ZS_OK; i++) {
        op_piece *p = &op->pieces[i];
        const char *server = cl->endpoint[p->piece.server];
        if (!p->send_done) {
            int d = 0;
            zs_err e = cl->ops->wait(p->send, timeout_ms, &d, NULL);
            if (!d)
                return ZS_OK; /* timed out: op stays */
            p->send_done = 1;
            if (e != ZS_OK)
                res = zs_error_context(e, "%s shard %d to %s", op->is_push ? "push" : "fetch",
                                       p->piece.shard, server);
        }
        if (res == ZS_OK && !p->recv_done) {
            int d = 0;
            zs_frame f;
            zs_err e = cl->ops->wait(p->recv, timeout_ms, &d, &f);
            if (!d)
                return ZS_OK;
            p->recv_done = 1;
            if (e != ZS_OK) {
                res = zs_error_context(e, "%s shard %d from %s", op->is_push ? "push" : "fetch",
                                       p->piece.shard, server);
            } else if (f.op == ZS_OP_ERROR) {
                /* The error text is in the reply buffer (fetch: the destination, which may be
                 * device memory: then it is copied out). */
                int len = f.length < 300 ? (int)f.length : 300;
                char text[300];
                const region *r = region_of(cl, p->reply_at, (size_t)len);
                if (r && r->copy) {
                    if (r->copy(r->copy_ctx, text, p->reply_at, (size_t)len, 0) != 0)
                        len = snprintf(text, sizeof text, "(its text is in device memory)");
                } else {
                    memcpy(text, p->reply_at, (size_t)len);
                }
                res = zs_error(ZS_ERR_INVALID,
                               "%s of [%zu, %zu) (shard %d) refused by %s "
                               "(status %u): %.*s",
                               op->is_push ? "push" : "fetch", p->piece.begin, p->piece.end,
                               p->piece.shard, server, f.status, len, text);
            }
        }
    }
    *done = 1;
    op_free(cl, op);
    return res;
}

int zs_client_wait_fd(zs_client *cl, int *timeout_ms)
{
    /* The client learns every outcome from its requests' handles, and nothing else reads its
     * net's events: a connection's failure (ZS_EV_CLOSED, its requests already failed) or a
     * frame no request expects would stay queued, and a net with events queued asks for a
     * turn now (timeout 0), so the caller would never sleep.  They are dropped here; an
     * unexpected frame's payload is skipped, so that its stream goes on. */
    int fd = cl->ops->wait_fd(cl->net, timeout_ms);
    if (*timeout_ms != 0)
        return fd; /* nothing queued: the usual case, no turn spent */
    zs_event ev[16];
    int n = 0;
    while (cl->ops->poll(cl->net, ev, 16, 0, &n) == ZS_OK && n > 0)
        for (int i = 0; i < n; i++)
            if (ev[i].type == ZS_EV_HEADER && ev[i].frame.length > 0 &&
                cl->ops->discard(ev[i].conn) != ZS_OK)
                ZS_DEBUG("client: skipping an unexpected frame from %s: %s",
                         cl->ops->conn_peer(ev[i].conn), zs_last_error());
    return cl->ops->wait_fd(cl->net, timeout_ms);
}

void zs_client_cancel(zs_client *cl, zs_client_op *op, int timeout_ms)
{
    if (!op)
        return;
    for (int i = 0; i < op->n; i++) {
        op_piece *p = &op->pieces[i];
        if (p->send && !p->send_done && cl->ops->cancel(p->send) != ZS_OK) {
            /* Partly written: finish it (a send handle that still times out is the net's
             * to free at close). */
            int d = 0;
            cl->ops->wait(p->send, timeout_ms, &d, NULL);
        }
        p->send_done = 1;
    }
    op_free(cl, op);
}
