/*
 * rdma: the RDMA backend of the data-plane transport (rdma.h has the protocol).
 *
 * Shape of the file: a net owns a TCP net (set-up streams), one device context, protection
 * domain, completion channel and completion queue shared by all its queue pairs, and an epoll
 * descriptor over the three things that can wake it (the TCP net, the channel, async events).
 * Every progress function runs net_turn(): TCP events, then completions, then async events,
 * then each connection's deferred work (frames waiting behind a reported header, sends waiting
 * for credits or send slots, READs waiting for room on the QP, DONE and CREDIT messages), then
 * timers.
 *
 * Work request ids: conn id (24 bits) << 40 | kind (4 bits) << 36 | value (36 bits), where the
 * value is a receive slot's index or a send-queue sequence number.
 *
 * One-sided operations (transport.h, iread/iwrite) are RDMA READ and RDMA WRITE posted straight
 * against the descriptor's address and rkey, each signaled (WR_RMA); the NIC of the region's
 * owner checks the key.  A notifying write is followed on the same queue pair by an eager
 * RMA_ACK frame with the notify flag, carrying the address, the bytes and the immediate value:
 * RC delivers it after the WRITE's bytes are placed, and unlike WRITE_WITH_IMM's 32 bits it can
 * say where they went.  It takes a credit like any frame.  Connections are found by
 * id, so a completion that arrives after its connection was closed is recognised and dropped.
 */
#include "transport/rdma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "transport/core.h"
#include "transport/setup.h"
#include "transport/tcp.h"

/* Our message header on the QP, little-endian, 32 bytes:
 *   0 u32 magic "ZSR1"   4 u8 kind   5 u8 0   6 u16 credits returned
 *   8 u32 status (DONE: 0 read, 1 skipped)   12 u32 rkey (RNDV)
 *  16 u64 token (RNDV, DONE)   24 u64 address (RNDV)
 * then, for EAGER and RNDV, the 64-byte frame header, and for EAGER the payload. */
#define RD_MAGIC 0x3152535au /* "ZSR1" */
#define RD_HDR 32
#define RD_EAGER_MAX ZS_NET_INLINE_MAX
#define RD_SLOT (RD_HDR + ZS_FRAME_HEADER_BYTES + RD_EAGER_MAX)
#define RD_CREDITS 16
#define RD_RECV_SLOTS (2 * RD_CREDITS)
#define RD_SEND_SLOTS 48
#define RD_SIGNAL_EVERY (RD_SEND_SLOTS / 4)
#define RD_MAX_READS_CAP 16
#define RD_SQ_DEPTH (RD_SEND_SLOTS + RD_MAX_READS_CAP + 8)
#define RD_READ_CHUNK ((uint64_t)4 << 20)
#define RD_CQ_DEPTH 4096
#define RD_HELLO_BYTES 64
#define RD_HELLO_MAGIC 0x4852535au /* "ZSRH" */
#define RD_HELLO_ID 1
#define RD_DRAIN_MS 2000
#define RD_CANCEL_MS 1000

/* The locked-memory limit below which RDMA is not offered: registering a worker's layer slots
 * or a server's shards needs far more. */
#define RD_MIN_MEMLOCK ((rlim_t)1 << 30)

#define RD_DEFAULT_SEND_TIMEOUT_MS 120000
#define RD_DEFAULT_SETUP_MS 5000

enum { MSG_EAGER = 1, MSG_RNDV = 2, MSG_DONE = 3, MSG_CREDIT = 4 };
enum { WR_RECV = 1, WR_SEND = 2, WR_READ = 3, WR_RMA = 4 };

typedef struct rd_net rd_net;
typedef struct rd_conn rd_conn;
/* Requests are core's (core.h): a receive in its READ phase is ZS_RQ_ACTIVE. */
typedef zs_rq rd_req;
typedef struct rd_mr rd_mr;
typedef struct rd_listener rd_listener;

/* A region: core's table entry, and its registration with the device.  A dma-buf region
 * (reg_dmabuf_mr: device memory) is never touched by the CPU: its payloads go by rendezvous
 * however small, and an inline payload that arrives for it is placed by the caller's copy. */
struct rd_mr {
    zs_region reg; /* first: the table links these */
    struct ibv_mr *mr;
    int device; /* registered from a dma-buf */
    int (*copy)(void *ctx, void *dst, const void *src, size_t n, int to_region);
    void *copy_ctx;
};

typedef struct {
    uint64_t token;
    uint32_t status;
} rd_done;

struct rd_conn {
    zs_setup_conn s; /* first: the set-up stream, the state every connection has (ready: the QP
                        is in RTS and the caller knows the connection) */
    uint32_t id;
    struct ibv_qp *qp;
    uint8_t *slots; /* RD_RECV_SLOTS receive slots, then RD_SEND_SLOTS send slots */
    struct ibv_mr *slot_mr;
    int max_reads; /* READs in flight at once */
    /* sending */
    int credits;        /* frames the peer can still take */
    int owed;           /* slots we freed and have not told the peer about */
    uint64_t sq_posted; /* send-queue work requests posted (their sequence numbers) */
    uint64_t sq_done;   /* ... completed: all up to this one */
    int since_signal;   /* unsignaled sends since the last signaled one */
    int ring_head, ring_used;
    uint64_t ring_seq[RD_SEND_SLOTS];
    rd_req *sendq, *sendq_tail; /* frames waiting for a credit or a send slot */
    rd_done *ctl;               /* DONE messages waiting for a send slot */
    int n_ctl, cap_ctl;
    int bad_key; /* test hook */
    /* receiving */
    int backlog[RD_RECV_SLOTS], bl_head, bl_len; /* frames behind a reported header */
    int pending;                                 /* the slot of the reported header, or -1 */
    int viewing; /* the pending header's inline payload is read in place (view_payload) */
    rd_req *reading, *reading_tail; /* receives in their READ phase, in posting order */
    /* one-sided operations */
    rd_req *rmaq, *rmaq_tail;   /* waiting for room on the QP (or for a READ slot) */
    rd_req *rma_out, *rma_tail; /* posted, in posting order (r->token: the sequence number) */
    int rma_reads;              /* READs of them in flight */
    /* failure */
    int closing; /* failed, and ZS_EV_CLOSED waits for the QP to flush */
    zs_err close_err;
    int64_t drain_deadline;
};

/* cluster.rdma resolved: the device, its port, the GID index (-1: chosen by address). */
typedef struct {
    char device[64];
    int port;
    int gid_index;
} rd_opts;

struct rd_listener {
    zs_setup_listener s; /* first */
    rd_opts opts;        /* what its accepted connections use */
};

struct rd_net {
    zs_setup_net s; /* first: the TCP net, epoll, events, connections, regions, requests */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    int cq_armed;
    unsigned cq_events; /* completion events not yet acknowledged */
    int port;
    char dev_name[64];
    struct ibv_port_attr port_attr;
    int max_rd_atomic;
    uint32_t next_conn_id;
    zs_log_limit log;
};

/* ---------------------------------------------------------------------------------------- */
/* helpers */

static rd_net *net_of(const rd_conn *c)
{
    return (rd_net *)c->s.net;
}

static uint64_t wr_id(const rd_conn *c, int kind, uint64_t v)
{
    return (uint64_t)c->id << 40 | (uint64_t)kind << 36 | (v & ((1ull << 36) - 1));
}

static rd_conn *conn_by_id(rd_net *n, uint32_t id)
{
    for (rd_conn *c = (rd_conn *)n->s.conns; c; c = (rd_conn *)c->s.next)
        if (c->id == id)
            return c;
    return NULL;
}

static uint8_t *recv_slot(rd_conn *c, int i)
{
    return c->slots + (size_t)i * RD_SLOT;
}
static uint8_t *send_slot(rd_conn *c, int i)
{
    return c->slots + (size_t)(RD_RECV_SLOTS + i) * RD_SLOT;
}

/* ---------------------------------------------------------------------------------------- */
/* device */

static int ipv4_of_gid(const union ibv_gid *g, uint32_t *ip)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(g->raw, prefix, 12) != 0)
        return 0;
    memcpy(ip, g->raw + 12, 4);
    return 1;
}

/* The index of the RoCE v2 GID of IPv4 address ip on ctx's port (ip 0: the first IPv4 one),
 * or -1. */
static int find_gid(struct ibv_context *ctx, int port, int table_len, uint32_t ip)
{
    for (int i = 0; i < table_len; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(ctx, (uint32_t)port, (uint32_t)i, &e, 0) != 0)
            continue;
        uint32_t a;
        if (e.gid_type != IBV_GID_TYPE_ROCE_V2 || !ipv4_of_gid(&e.gid, &a))
            continue;
        if (!ip || a == ip)
            return i;
    }
    return -1;
}

/* ZS_RDMA_DISABLE=1: this process acts as if it had no RDMA device (forces TCP under "auto"). */
static int rdma_disabled(void)
{
    const char *d = getenv("ZS_RDMA_DISABLE");
    return d && *d && strcmp(d, "0") != 0;
}

int zs_rdma_available(char *why, size_t cap)
{
    if (rdma_disabled()) {
        if (why)
            zs_net_fmt(why, cap, "RDMA disabled by ZS_RDMA_DISABLE");
        return 0;
    }
    int num = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list || num == 0) {
        if (why)
            zs_net_fmt(why, cap, "no RDMA device (libibverbs lists none%s%s)", list ? "" : ": ",
                       list ? "" : strerror(errno));
        if (list)
            ibv_free_device_list(list);
        return 0;
    }
    int ok = 0;
    for (int i = 0; i < num && !ok; i++) {
        struct ibv_context *ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        struct ibv_port_attr pa;
        ok = ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    if (!ok && why)
        zs_net_fmt(why, cap, "no RDMA device with an active port 1 (%d device%s listed)", num,
                   num == 1 ? "" : "s");
    /* Registration pins memory: under a small locked-memory limit (a non-root default of
     * 64 KiB or 8 MiB) a server could not register its shards, so "auto" should not choose
     * RDMA.  root has CAP_IPC_LOCK, which lifts the limit. */
    struct rlimit rl;
    if (ok && geteuid() != 0 && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
        rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < RD_MIN_MEMLOCK) {
        if (why)
            zs_net_fmt(why, cap,
                       "the locked-memory limit is %llu KiB, too small to register buffers with "
                       "the RDMA device (raise ulimit -l, e.g. LimitMEMLOCK=infinity)",
                       (unsigned long long)rl.rlim_cur / 1024);
        ok = 0;
    }
    return ok;
}

static void resolve_opts(const zs_conn_opts *o, rd_opts *t)
{
    const zs_rdma_conn_opts *b = NULL;
    if (o && o->backend && o->backend_name && strcmp(o->backend_name, "rdma") == 0)
        b = o->backend;
    const char *dev = b && b->device && *b->device ? b->device : getenv("ZS_RDMA_DEVICE");
    zs_net_copy_str(t->device, sizeof t->device, dev ? dev : "");
    t->port = b && b->port > 0 ? b->port : zs_setup_env_int("rdma", "ZS_RDMA_PORT", 1, 1, 255);
    t->gid_index = b && b->gid_index >= 0
                       ? b->gid_index
                       : zs_setup_env_int("rdma", "ZS_RDMA_GID_INDEX", -1, -1, 1 << 20);
}

/* Opens the net's device once: named, else holding ip (network order, 0: any), else the first
 * with an active port. */
static zs_err open_device(rd_net *n, const rd_opts *t, uint32_t ip)
{
    if (n->ctx)
        return ZS_OK;
    if (rdma_disabled())
        return zs_error(ZS_ERR_NOTFOUND, "rdma: disabled by ZS_RDMA_DISABLE");
    int num = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list || num == 0) {
        if (list)
            ibv_free_device_list(list);
        return zs_error(ZS_ERR_NOTFOUND,
                        "rdma: no RDMA device on this host (libibverbs lists none); use "
                        "cluster.transport \"tcp\", or load a provider (rdma_rxe for soft-RoCE)");
    }
    struct ibv_context *pick = NULL;
    int fallback = -1;
    for (int i = 0; i < num && !pick; i++) {
        const char *name = ibv_get_device_name(list[i]);
        if (*t->device && strcmp(name, t->device) != 0)
            continue;
        struct ibv_context *ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        struct ibv_port_attr pa;
        int active = ibv_query_port(ctx, (uint8_t)t->port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
        if (active && (*t->device || (ip && find_gid(ctx, t->port, pa.gid_tbl_len, ip) >= 0))) {
            pick = ctx;
            break;
        }
        if (active && fallback < 0)
            fallback = i;
        ibv_close_device(ctx);
    }
    if (!pick && fallback >= 0 && !*t->device)
        pick = ibv_open_device(list[fallback]);
    ibv_free_device_list(list);
    if (!pick) {
        if (*t->device)
            return zs_error(ZS_ERR_NOTFOUND,
                            "rdma: device %s (cluster.rdma.device) not found or port %d not "
                            "active",
                            t->device, t->port);
        return zs_error(ZS_ERR_NOTFOUND, "rdma: no RDMA device with an active port %d", t->port);
    }
    n->ctx = pick;
    n->port = t->port;
    zs_net_copy_str(n->dev_name, sizeof n->dev_name, ibv_get_device_name(pick->device));
    struct ibv_device_attr da;
    zs_err res = ZS_OK;
    if (ibv_query_port(pick, (uint8_t)n->port, &n->port_attr) != 0 ||
        ibv_query_device(pick, &da) != 0) {
        res = zs_error(ZS_ERR_IO, "rdma: %s: cannot query the device: %s", n->dev_name,
                       strerror(errno));
        goto fail;
    }
    n->max_rd_atomic = da.max_qp_rd_atom < RD_MAX_READS_CAP ? da.max_qp_rd_atom : RD_MAX_READS_CAP;
    if (n->max_rd_atomic < 1)
        n->max_rd_atomic = 1;
    n->pd = ibv_alloc_pd(pick);
    if (!n->pd) {
        res = zs_error(ZS_ERR_IO, "rdma: %s: ibv_alloc_pd: %s", n->dev_name, strerror(errno));
        goto fail;
    }
    n->chan = ibv_create_comp_channel(pick);
    if (!n->chan) {
        res = zs_error(ZS_ERR_IO, "rdma: %s: ibv_create_comp_channel: %s", n->dev_name,
                       strerror(errno));
        goto fail_pd;
    }
    n->cq = ibv_create_cq(pick, RD_CQ_DEPTH, NULL, n->chan, 0);
    if (!n->cq) {
        res = zs_error(ZS_ERR_IO, "rdma: %s: ibv_create_cq(%d): %s", n->dev_name, RD_CQ_DEPTH,
                       strerror(errno));
        goto fail_chan;
    }
    int fds[2] = {n->chan->fd, pick->async_fd};
    for (int i = 0; i < 2; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 1 + i};
        if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) < 0 ||
            epoll_ctl(n->s.epfd, EPOLL_CTL_ADD, fds[i], &ev) < 0) {
            res = zs_error(ZS_ERR_IO, "rdma: %s: cannot watch its descriptors: %s", n->dev_name,
                           strerror(errno));
            goto fail_cq;
        }
    }
    if (ibv_req_notify_cq(n->cq, 0) == 0)
        n->cq_armed = 1;
    ZS_DEBUG("rdma: opened %s port %d", n->dev_name, n->port);
    return ZS_OK;
fail_cq:
    epoll_ctl(n->s.epfd, EPOLL_CTL_DEL, n->chan->fd, NULL);
    ibv_destroy_cq(n->cq);
    n->cq = NULL;
fail_chan:
    ibv_destroy_comp_channel(n->chan);
    n->chan = NULL;
fail_pd:
    ibv_dealloc_pd(n->pd);
    n->pd = NULL;
fail:
    ibv_close_device(pick);
    n->ctx = NULL;
    return res;
}

/* ---------------------------------------------------------------------------------------- */
/* posting */

static zs_err post_recv(rd_conn *c, int slot)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)recv_slot(c, slot), .length = RD_SLOT, .lkey = c->slot_mr->lkey};
    struct ibv_recv_wr wr = {
        .wr_id = wr_id(c, WR_RECV, (uint64_t)slot), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad;
    int rc = ibv_post_recv(c->qp, &wr, &bad);
    if (rc)
        return zs_error(ZS_ERR_IO, "rdma %s: ibv_post_recv: %s", c->s.peer, strerror(rc));
    return ZS_OK;
}

static int sq_room(const rd_conn *c)
{
    return (int)(RD_SQ_DEPTH - 1 - (c->sq_posted - c->sq_done));
}

static void conn_fail(rd_conn *c, zs_err err, const char *why, ...)
    __attribute__((format(printf, 3, 4)));

/* Posts a SEND of len bytes from send slot `slot`; signaled when the ring or the queue would
 * otherwise fill with unsignaled work. */
static int post_send_slot(rd_conn *c, int slot, size_t len)
{
    uint64_t seq = ++c->sq_posted;
    c->ring_seq[slot] = seq;
    int signal = ++c->since_signal >= RD_SIGNAL_EVERY || c->ring_used >= RD_SEND_SLOTS - 2;
    if (signal)
        c->since_signal = 0;
    struct ibv_sge sge = {
        .addr = (uintptr_t)send_slot(c, slot), .length = (uint32_t)len, .lkey = c->slot_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id(c, WR_SEND, seq),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = signal ? IBV_SEND_SIGNALED : 0};
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(c->qp, &wr, &bad);
    if (rc) {
        c->sq_posted--;
        conn_fail(c, ZS_ERR_IO, "ibv_post_send: %s", strerror(rc));
        return -1;
    }
    return 0;
}

/* A free send slot (the caller fills and posts it), or -1 when the ring or the queue is full. */
static int take_slot(rd_conn *c)
{
    if (c->ring_used >= RD_SEND_SLOTS || sq_room(c) < 1)
        return -1;
    int s = c->ring_head;
    c->ring_head = (c->ring_head + 1) % RD_SEND_SLOTS;
    c->ring_used++;
    return s;
}

static void msg_header(rd_conn *c, uint8_t *p, int kind, uint32_t status, uint32_t rkey,
                       uint64_t token, uint64_t addr)
{
    int give = c->owed > 0xffff ? 0xffff : c->owed;
    c->owed -= give;
    zs_le_put32(p, RD_MAGIC);
    p[4] = (uint8_t)kind;
    p[5] = 0;
    zs_le_put16(p + 6, (uint16_t)give);
    zs_le_put32(p + 8, status);
    zs_le_put32(p + 12, rkey);
    zs_le_put64(p + 16, token);
    zs_le_put64(p + 24, addr);
}

/* Sends the DONE messages that wait for a slot, then a CREDIT message if many are owed. */
static void send_control(rd_conn *c)
{
    while (c->n_ctl > 0 && !c->s.closed) {
        int s = take_slot(c);
        if (s < 0)
            return;
        rd_done d = c->ctl[0];
        memmove(c->ctl, c->ctl + 1, (size_t)(c->n_ctl - 1) * sizeof *c->ctl);
        c->n_ctl--;
        msg_header(c, send_slot(c, s), MSG_DONE, d.status, 0, d.token, 0);
        if (post_send_slot(c, s, RD_HDR) < 0)
            return;
    }
    if (c->owed >= RD_CREDITS / 2 && !c->s.closed) {
        int s = take_slot(c);
        if (s < 0)
            return;
        msg_header(c, send_slot(c, s), MSG_CREDIT, 0, 0, 0, 0);
        post_send_slot(c, s, RD_HDR);
    }
}

static void queue_done(rd_conn *c, uint64_t token, uint32_t status)
{
    if (c->s.closed)
        return;
    if (c->n_ctl == c->cap_ctl) {
        int cap = c->cap_ctl ? 2 * c->cap_ctl : 16;
        rd_done *q = realloc(c->ctl, (size_t)cap * sizeof *q);
        if (!q) {
            conn_fail(c, ZS_ERR_NOMEM, "out of memory for a DONE message");
            return;
        }
        c->ctl = q;
        c->cap_ctl = cap;
    }
    c->ctl[c->n_ctl++] = (rd_done){token, status};
    c->s.dirty = 1;
}

/* Sends the frames queued on c while credits and slots last. */
static void send_frames(rd_conn *c)
{
    while (c->sendq && !c->s.closed && c->credits > 0) {
        rd_req *r = c->sendq;
        int s = take_slot(c);
        if (s < 0)
            return;
        zs_rq_fifo_pop(&c->sendq, &c->sendq_tail);
        c->credits--;
        uint8_t *p = send_slot(c, s);
        const uint8_t *src = r->inline_buf ? r->inline_buf : r->buf;
        /* Device memory is the NIC's to read, not the CPU's: no copy into the slot. */
        int eager = r->frame.length <= RD_EAGER_MAX && !(r->mr && ((rd_mr *)r->mr)->device);
        size_t len = RD_HDR + ZS_FRAME_HEADER_BYTES;
        if (eager) {
            msg_header(c, p, MSG_EAGER, 0, 0, 0, 0);
            if (r->frame.length)
                memcpy(p + len, src, r->frame.length);
            len += r->frame.length;
        } else {
            r->token = ++c->s.next_token;
            uint32_t rkey = ((rd_mr *)r->mr)->mr->rkey + (c->bad_key ? 1 : 0);
            c->bad_key = 0;
            msg_header(c, p, MSG_RNDV, 0, rkey, r->token, (uintptr_t)r->buf);
        }
        zs_frame_encode(&r->frame, p + RD_HDR);
        if (post_send_slot(c, s, len) < 0) {
            zs_rq_fail_conn(r, c->s.reason);
            return;
        }
        if (eager) {
            zs_rq_finish(r, ZS_OK, NULL);
        } else {
            r->state = ZS_RQ_AWAIT;
            r->deadline = zs_net_now_ms() + c->s.net->send_timeout_ms;
            zs_rq_list_add(&c->s.await, r);
        }
    }
}

/* Posts the READs of receives in their READ phase, in order, while the QP has room. */
static void issue_reads(rd_conn *c)
{
    int inflight = c->rma_reads;
    for (rd_req *r = c->reading; r; r = r->next)
        inflight += r->reads_out;
    for (rd_req *r = c->reading; r && !c->s.closed; r = r->next) {
        while (r->read_off < r->len && inflight < c->max_reads && sq_room(c) > 0) {
            uint64_t n = r->len - r->read_off;
            if (n > RD_READ_CHUNK)
                n = RD_READ_CHUNK;
            struct ibv_sge sge = {.addr = (uintptr_t)(r->buf + r->read_off),
                                  .length = (uint32_t)n,
                                  .lkey = ((rd_mr *)r->mr)->mr->lkey};
            uint64_t seq = ++c->sq_posted;
            struct ibv_send_wr wr = {
                .wr_id = wr_id(c, WR_READ, seq),
                .sg_list = &sge,
                .num_sge = 1,
                .opcode = IBV_WR_RDMA_READ,
                .send_flags = IBV_SEND_SIGNALED,
                .wr.rdma = {.remote_addr = r->raddr + r->read_off, .rkey = r->rkey}};
            struct ibv_send_wr *bad;
            int rc = ibv_post_send(c->qp, &wr, &bad);
            if (rc) {
                c->sq_posted--;
                conn_fail(c, ZS_ERR_IO, "ibv_post_send(RDMA READ): %s", strerror(rc));
                return;
            }
            c->since_signal = 0;
            r->read_off += n;
            r->reads_out++;
            inflight++;
        }
        if (r->read_off < r->len)
            return; /* later receives wait: completions come back in posting order */
    }
}

/* Posts the one-sided operations waiting on c, in order, while the QP has room (and, for
 * READs, while fewer than max_reads READs are in flight); queues a notifying write's RMA_ACK
 * right behind its WRITE. */
static void issue_rma(rd_conn *c)
{
    while (c->rmaq && !c->s.closed && sq_room(c) > 0) {
        rd_req *r = c->rmaq;
        int read = r->rma == ZS_RMA_READ;
        if (read) {
            int inflight = c->rma_reads;
            for (rd_req *q = c->reading; q; q = q->next)
                inflight += q->reads_out;
            if (inflight >= c->max_reads)
                return;
        }
        rd_req *note = NULL;
        if (r->frame.flags & ZS_FRAME_FLAG_NOTIFY) {
            note = zs_rq_new(&c->s.net->reqs, c->s.net, ZS_RQ_SEND, c, NULL, 0);
            if (!note) {
                conn_fail(c, ZS_ERR_NOMEM, "out of memory for a write notification");
                return;
            }
            note->silent = 1;
            note->frame = r->frame;
            note->frame.op = ZS_OP_RMA_ACK;
            note->frame.length = 0;
        }
        struct ibv_sge sge = {.addr = (uintptr_t)r->buf,
                              .length = (uint32_t)r->len,
                              .lkey = ((rd_mr *)r->mr)->mr->lkey};
        uint64_t seq = ++c->sq_posted;
        struct ibv_send_wr wr = {.wr_id = wr_id(c, WR_RMA, seq),
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
                                 .send_flags = IBV_SEND_SIGNALED,
                                 .wr.rdma = {.remote_addr = r->raddr, .rkey = r->rkey}};
        struct ibv_send_wr *bad;
        int rc = ibv_post_send(c->qp, &wr, &bad);
        if (rc) {
            c->sq_posted--;
            if (note)
                zs_rq_release(note);
            conn_fail(c, ZS_ERR_IO, "ibv_post_send(RDMA %s): %s", read ? "READ" : "WRITE",
                      strerror(rc));
            return;
        }
        c->since_signal = 0;
        zs_rq_fifo_pop(&c->rmaq, &c->rmaq_tail);
        r->token = seq;
        r->state = ZS_RQ_ACTIVE;
        zs_rq_fifo_push(&c->rma_out, &c->rma_tail, r);
        c->rma_reads += read;
        if (note) {
            note->state = ZS_RQ_QUEUED;
            zs_rq_fifo_push(&c->sendq, &c->sendq_tail, note);
            c->s.dirty = 1;
        }
    }
}

/* The oldest posted one-sided operation completed (ok) or failed with status st; v is the
 * completion's sequence number. */
static void on_rma_done(rd_conn *c, uint64_t v, int ok, enum ibv_wc_status st, const char *why)
{
    rd_req *r = c->rma_out;
    if (!r || r->token != v) {
        if (!c->s.closed)
            conn_fail(c, ZS_ERR_IO, "a one-sided completion (%llu) that no operation waits for",
                      (unsigned long long)v);
        return;
    }
    zs_rq_fifo_pop(&c->rma_out, &c->rma_tail);
    c->rma_reads -= r->rma == ZS_RMA_READ;
    if (ok) {
        zs_rq_finish(r, ZS_OK, NULL);
    } else {
        char msg[ZS_NET_REASON_MAX];
        zs_net_fmt(msg, sizeof msg,
                   "rdma %s %s: %llu bytes at 0x%llx of the peer's region with key 0x%llx: %s",
                   r->rma == ZS_RMA_READ ? "iread" : "iwrite", c->s.peer,
                   (unsigned long long)r->frame.count, (unsigned long long)r->frame.offset,
                   (unsigned long long)r->frame.step,
                   st == IBV_WC_REM_ACCESS_ERR
                       ? "the peer's NIC refused it: bad key (no such region, bytes outside it, "
                         "or not open to this access)"
                       : why);
        zs_rq_finish(r, ZS_ERR_INVALID, msg);
        if (!c->s.closed)
            conn_fail(c, ZS_ERR_IO, "%s", msg);
    }
    c->s.dirty = 1; /* room on the QP for what waits */
}

/* ---------------------------------------------------------------------------------------- */
/* connections */

static void conn_emit_closed(rd_conn *c)
{
    c->closing = 0;
    zs_setup_emit_closed(&c->s, c->close_err);
}

/* Fails every request of c that no NIC work refers to; the ones with READs in flight fail as
 * their flushed completions come back. */
static void fail_requests(rd_conn *c)
{
    rd_req *r;
    while ((r = zs_rq_fifo_pop(&c->rmaq, &c->rmaq_tail)))
        zs_rq_fail_conn(r, c->s.reason);
    while ((r = zs_rq_fifo_pop(&c->sendq, &c->sendq_tail)))
        zs_rq_fail_conn(r, c->s.reason);
    while ((r = c->s.await)) {
        zs_rq_list_del(&c->s.await, r);
        zs_rq_fail_conn(r, c->s.reason);
    }
    while ((r = c->s.expect)) {
        zs_rq_list_del(&c->s.expect, r);
        zs_rq_fail_conn(r, c->s.reason);
    }
    rd_req *keep = NULL, *keep_tail = NULL;
    while ((r = zs_rq_fifo_pop(&c->reading, &c->reading_tail))) {
        if (r->reads_out > 0)
            zs_rq_fifo_push(&keep, &keep_tail, r);
        else
            zs_rq_fail_conn(r, c->s.reason);
    }
    c->reading = keep;
    c->reading_tail = keep_tail;
}

static void conn_fail(rd_conn *c, zs_err err, const char *why, ...)
{
    va_list ap;
    va_start(ap, why);
    int first = zs_setup_conn_fail(&c->s, why, ap); /* closes the set-up stream */
    va_end(ap);
    if (!first)
        return;
    c->close_err = err;
    if (c->qp) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        ibv_modify_qp(c->qp, &a, IBV_QP_STATE);
    }
    fail_requests(c);
    if (c->qp && (c->sq_posted > c->sq_done || c->reading)) {
        c->closing = 1;
        c->drain_deadline = zs_net_now_ms() + RD_DRAIN_MS;
    } else {
        conn_emit_closed(c);
    }
}

static void conn_free(rd_conn *c)
{
    zs_setup_conn_release(&c->s);
    if (c->qp)
        ibv_destroy_qp(c->qp); /* no NIC access to our memory after this */
    c->qp = NULL;
    if (!c->s.closed)
        zs_net_copy_str(c->s.reason, sizeof c->s.reason, "connection closed locally");
    c->s.closed = 1;
    fail_requests(c);
    rd_req *r;
    while ((r = zs_rq_fifo_pop(&c->reading, &c->reading_tail)))
        zs_rq_fail_conn(r, c->s.reason);
    while ((r = zs_rq_fifo_pop(&c->rma_out, &c->rma_tail)))
        zs_rq_fail_conn(r, c->s.reason);
    if (c->slot_mr)
        ibv_dereg_mr(c->slot_mr);
    free(c->slots);
    free(c->ctl);
    free(c);
}

static zs_err conn_new(rd_net *n, zs_conn *tcp, rd_conn **out)
{
    rd_conn *c = calloc(1, sizeof *c);
    if (!c)
        return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
    c->id = ++n->next_conn_id & 0xffffff;
    if (c->id == 0)
        c->id = ++n->next_conn_id & 0xffffff;
    c->pending = -1;
    zs_err res = zs_setup_conn_init(&n->s, &c->s, tcp);
    if (res != ZS_OK) {
        free(c);
        return res;
    }
    *out = c;
    return ZS_OK;
}

/* Creates c's QP in INIT with its receive slots posted. */
static zs_err conn_make_qp(rd_conn *c)
{
    rd_net *n = net_of(c);
    size_t bytes = (size_t)(RD_RECV_SLOTS + RD_SEND_SLOTS) * RD_SLOT;
    if (posix_memalign((void **)&c->slots, 4096, bytes) != 0)
        return zs_error(ZS_ERR_NOMEM, "rdma %s: out of memory for %zu bytes of slots", c->s.peer,
                        bytes);
    memset(c->slots, 0, bytes);
    c->slot_mr = ibv_reg_mr(n->pd, c->slots, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!c->slot_mr)
        return zs_error(ZS_ERR_IO, "rdma %s: ibv_reg_mr of %zu bytes of slots: %s", c->s.peer,
                        bytes, strerror(errno));
    struct ibv_qp_init_attr ia = {
        .send_cq = n->cq,
        .recv_cq = n->cq,
        .cap = {.max_send_wr = RD_SQ_DEPTH,
                .max_recv_wr = RD_RECV_SLOTS,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    c->qp = ibv_create_qp(n->pd, &ia);
    if (!c->qp)
        return zs_error(ZS_ERR_IO, "rdma %s: ibv_create_qp on %s: %s", c->s.peer, n->dev_name,
                        strerror(errno));
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .pkey_index = 0,
                            .port_num = (uint8_t)n->port,
                            .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
    int rc = ibv_modify_qp(c->qp, &a,
                           IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc)
        return zs_error(ZS_ERR_IO, "rdma %s: QP to INIT: %s", c->s.peer, strerror(rc));
    for (int i = 0; i < RD_RECV_SLOTS; i++)
        ZS_CHECK(post_recv(c, i));
    return ZS_OK;
}

/* The GID index for c: configured, else the one of the stream's local IPv4 address, else the
 * port's first IPv4 RoCE v2 GID, else 0. */
static int conn_gid_index(rd_conn *c, const rd_opts *t)
{
    rd_net *n = net_of(c);
    if (t->gid_index >= 0)
        return t->gid_index;
    struct sockaddr_storage ss;
    uint32_t ip = 0;
    if (zs_tcp_conn_local(c->s.tcp, &ss) == 0 && ss.ss_family == AF_INET)
        ip = ((struct sockaddr_in *)&ss)->sin_addr.s_addr;
    int g = ip ? find_gid(n->ctx, n->port, n->port_attr.gid_tbl_len, ip) : -1;
    if (g < 0)
        g = find_gid(n->ctx, n->port, n->port_attr.gid_tbl_len, 0);
    return g < 0 ? 0 : g;
}

typedef struct {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t mtu;
    uint8_t gid_index;
    uint8_t gid[16];
    uint32_t credits, max_reads, slot_bytes;
} rd_hello;

static void hello_encode(const rd_hello *h, uint8_t *p)
{
    memset(p, 0, RD_HELLO_BYTES);
    zs_le_put32(p, RD_HELLO_MAGIC);
    zs_le_put16(p + 4, 1);
    zs_le_put32(p + 8, h->qpn);
    zs_le_put32(p + 12, h->psn);
    zs_le_put16(p + 16, h->lid);
    p[18] = h->mtu;
    p[19] = h->gid_index;
    memcpy(p + 20, h->gid, 16);
    zs_le_put32(p + 36, h->credits);
    zs_le_put32(p + 40, h->max_reads);
    zs_le_put32(p + 44, h->slot_bytes);
}

static zs_err hello_decode(const uint8_t *p, size_t len, rd_hello *h, const char *peer)
{
    if (len != RD_HELLO_BYTES || zs_le_get32(p) != RD_HELLO_MAGIC || zs_le_get16(p + 4) != 1)
        return zs_error(ZS_ERR_FORMAT,
                        "rdma %s: set-up message of %zu bytes is not a version 1 hello", peer, len);
    h->qpn = zs_le_get32(p + 8) & 0xffffff;
    h->psn = zs_le_get32(p + 12) & 0xffffff;
    h->lid = zs_le_get16(p + 16);
    h->mtu = p[18];
    h->gid_index = p[19];
    memcpy(h->gid, p + 20, 16);
    h->credits = zs_le_get32(p + 36);
    h->max_reads = zs_le_get32(p + 40);
    h->slot_bytes = zs_le_get32(p + 44);
    if (h->mtu < IBV_MTU_256 || h->mtu > IBV_MTU_4096 || h->credits < 1 ||
        h->credits > RD_CREDITS || h->max_reads < 1 || h->slot_bytes != RD_SLOT)
        return zs_error(ZS_ERR_FORMAT,
                        "rdma %s: hello with mtu %u, credits %u, reads %u, slots of %u bytes "
                        "(expected %d)",
                        peer, h->mtu, h->credits, h->max_reads, h->slot_bytes, RD_SLOT);
    return ZS_OK;
}

static zs_err local_hello(rd_conn *c, const rd_opts *t, rd_hello *h)
{
    rd_net *n = net_of(c);
    memset(h, 0, sizeof *h);
    int g = conn_gid_index(c, t);
    union ibv_gid gid;
    if (ibv_query_gid(n->ctx, (uint8_t)n->port, g, &gid) != 0)
        return zs_error(ZS_ERR_INVALID, "rdma %s: %s port %d has no GID index %d", c->s.peer,
                        n->dev_name, n->port, g);
    uint32_t psn;
    if (getrandom(&psn, sizeof psn, 0) != (ssize_t)sizeof psn)
        psn = (uint32_t)zs_net_now_ms();
    h->qpn = c->qp->qp_num;
    h->psn = psn & 0xffffff;
    h->lid = n->port_attr.lid;
    h->mtu = (uint8_t)n->port_attr.active_mtu;
    h->gid_index = (uint8_t)g;
    memcpy(h->gid, gid.raw, 16);
    h->credits = RD_CREDITS;
    h->max_reads = (uint32_t)n->max_rd_atomic;
    h->slot_bytes = RD_SLOT;
    return ZS_OK;
}

/* Moves c's QP to RTR and RTS towards the peer described by r. */
static zs_err conn_connect_qp(rd_conn *c, const rd_hello *l, const rd_hello *r)
{
    enum ibv_mtu mtu = (enum ibv_mtu)(l->mtu < r->mtu ? l->mtu : r->mtu);
    c->max_reads =
        net_of(c)->max_rd_atomic < (int)r->max_reads ? net_of(c)->max_rd_atomic : (int)r->max_reads;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu,
        .dest_qp_num = r->qpn,
        .rq_psn = r->psn,
        .max_dest_rd_atomic = (uint8_t)net_of(c)->max_rd_atomic,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1,
                    .dlid = r->lid,
                    .sl = 0,
                    .src_path_bits = 0,
                    .port_num = (uint8_t)net_of(c)->port,
                    .grh = {.hop_limit = 64, .sgid_index = l->gid_index}},
    };
    memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
    int rc = ibv_modify_qp(c->qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return zs_error(ZS_ERR_IO, "rdma %s: QP to RTR (peer qpn %u, mtu %d): %s", c->s.peer,
                        r->qpn, 128 << mtu, strerror(rc));
    struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS,
                            .timeout = 14,
                            .retry_cnt = 7,
                            .rnr_retry = 7,
                            .sq_psn = l->psn,
                            .max_rd_atomic = (uint8_t)c->max_reads};
    rc = ibv_modify_qp(c->qp, &s,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc)
        return zs_error(ZS_ERR_IO, "rdma %s: QP to RTS: %s", c->s.peer, strerror(rc));
    c->credits = (int)r->credits;
    return ZS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* receiving */

/* Gives slot back to the NIC: one more credit owed to the peer. */
static void release_slot(rd_conn *c, int slot)
{
    if (c->s.closed)
        return;
    if (post_recv(c, slot) != ZS_OK) {
        conn_fail(c, ZS_ERR_IO, "%s", zs_last_error());
        return;
    }
    c->owed++;
    c->s.dirty = 1;
}

/* Starts a receive of the frame in slot into r's buffer (length checked by the caller). */
static void start_payload(rd_conn *c, int slot, rd_req *r)
{
    const uint8_t *p = recv_slot(c, slot);
    r->len = r->frame.length;
    if (p[4] == MSG_EAGER || r->len == 0) {
        const rd_mr *m = (const rd_mr *)r->mr;
        const uint8_t *src = p + RD_HDR + ZS_FRAME_HEADER_BYTES;
        if (r->len && m && m->device) {
            /* A short payload (or an error's text) for device memory: the caller places it. */
            int rc = m->copy ? m->copy(m->copy_ctx, r->buf, src, r->len, 1) : -ENOSYS;
            if (rc != 0) {
                char msg[ZS_NET_REASON_MAX];
                snprintf(msg, sizeof msg,
                         "rdma %s: placing an inline payload of %llu bytes in device memory at "
                         "%p: %s",
                         c->s.peer, (unsigned long long)r->len, (void *)r->buf,
                         m->copy ? strerror(-rc) : "the dma-buf region has no copy function");
                zs_rq_finish(r, ZS_ERR_IO, msg);
                return;
            }
        } else if (r->len) {
            memcpy(r->buf, src, r->len);
        }
        zs_rq_finish(r, ZS_OK, NULL);
        return;
    }
    r->raddr = zs_le_get64(p + 24);
    r->rkey = zs_le_get32(p + 12);
    r->token = zs_le_get64(p + 16);
    r->read_off = 0;
    r->reads_out = 0;
    r->state = ZS_RQ_ACTIVE;
    zs_rq_fifo_push(&c->reading, &c->reading_tail, r);
    c->s.dirty = 1;
}

/* Skips the payload of the frame in slot: an RNDV sender is told it can reuse its buffer. */
static void skip_payload(rd_conn *c, int slot)
{
    const uint8_t *p = recv_slot(c, slot);
    if (p[4] == MSG_RNDV)
        queue_done(c, zs_le_get64(p + 16), 1);
}

/* Hands the frame in slot to an irecv or to the caller; 0 when it was consumed, 1 when it
 * is now the reported header that holds its slot. */
static int deliver(rd_conn *c, int slot)
{
    zs_frame f;
    zs_frame_decode(recv_slot(c, slot) + RD_HDR, &f); /* checked on arrival */
    if (f.op >= ZS_OP_RMA_READ) {
        /* The peer's NIC wrote into one of our regions and says so: report it, once we know
         * the bytes are in a region open to remote writes.  Other one-sided frames are tcp's
         * and shm's, never ours. */
        char why[ZS_NET_REASON_MAX] = "";
        int ok = f.op == ZS_OP_RMA_ACK && (f.flags & ZS_FRAME_FLAG_NOTIFY) &&
                 zs_region_lookup(c->s.net->mrs, f.step, f.offset, f.count, ZS_MR_REMOTE_WRITE, why,
                                  sizeof why) != NULL;
        if (!ok) {
            conn_fail(c, ZS_ERR_FORMAT, "a %s frame that does not report a write of ours%s%s",
                      zs_frame_op_name(f.op), *why ? ": " : "", why);
            return 0;
        }
        zs_event *e = zs_evq_push(&c->s.net->evq, ZS_EV_WRITTEN, (zs_conn *)c, "rdma");
        if (e) {
            e->frame = f;
            e->frame.op = ZS_OP_RMA_WRITE;
        }
        release_slot(c, slot);
        return 0;
    }
    int skip;
    rd_req *r = zs_setup_expected(&c->s, &f, &skip);
    if (r)
        start_payload(c, slot, r);
    else if (skip)
        skip_payload(c, slot);
    if (r || skip) {
        release_slot(c, slot);
        return 0;
    }
    zs_event *e = zs_evq_push(&c->s.net->evq, ZS_EV_HEADER, (zs_conn *)c, "rdma");
    if (e)
        e->frame = f;
    if (f.length == 0) {
        release_slot(c, slot);
        return 0;
    }
    c->pending = slot;
    return 1;
}

static void deliver_backlog(rd_conn *c)
{
    while (!c->s.closed && c->pending < 0 && c->bl_len > 0) {
        int slot = c->backlog[c->bl_head];
        c->bl_head = (c->bl_head + 1) % RD_RECV_SLOTS;
        c->bl_len--;
        deliver(c, slot);
    }
}

static void on_recv(rd_conn *c, int slot, uint32_t bytes)
{
    const uint8_t *p = recv_slot(c, slot);
    if (bytes < RD_HDR || zs_le_get32(p) != RD_MAGIC) {
        conn_fail(c, ZS_ERR_FORMAT, "a message of %u bytes that is not ours", bytes);
        return;
    }
    c->credits += zs_le_get16(p + 6);
    if (c->credits > RD_CREDITS) {
        conn_fail(c, ZS_ERR_FORMAT, "peer returned %d credits, more than the %d it has", c->credits,
                  RD_CREDITS);
        return;
    }
    int kind = p[4];
    if (kind == MSG_DONE || kind == MSG_CREDIT) {
        if (kind == MSG_DONE) {
            uint64_t token = zs_le_get64(p + 16);
            rd_req *r = zs_rq_list_token(c->s.await, token);
            if (!r) {
                conn_fail(c, ZS_ERR_FORMAT, "DONE for token %llu, which no send awaits",
                          (unsigned long long)token);
                return;
            }
            zs_rq_list_del(&c->s.await, r);
            zs_rq_finish(r, ZS_OK, NULL);
        }
        if (post_recv(c, slot) != ZS_OK)
            conn_fail(c, ZS_ERR_IO, "%s", zs_last_error());
        c->s.dirty = 1;
        return;
    }
    if (kind != MSG_EAGER && kind != MSG_RNDV) {
        conn_fail(c, ZS_ERR_FORMAT, "message kind %d is not known", kind);
        return;
    }
    zs_frame f;
    if (bytes < RD_HDR + ZS_FRAME_HEADER_BYTES || zs_frame_decode(p + RD_HDR, &f) != ZS_OK) {
        conn_fail(c, ZS_ERR_FORMAT, "malformed frame: %s",
                  bytes < RD_HDR + ZS_FRAME_HEADER_BYTES ? "cut short" : zs_last_error());
        return;
    }
    if (kind == MSG_EAGER
            ? (f.length > RD_EAGER_MAX || bytes != RD_HDR + ZS_FRAME_HEADER_BYTES + f.length)
            : bytes != RD_HDR + ZS_FRAME_HEADER_BYTES || f.length == 0) {
        conn_fail(c, ZS_ERR_FORMAT, "%s message of %u bytes for a payload of %llu",
                  kind == MSG_EAGER ? "eager" : "rendezvous", bytes, (unsigned long long)f.length);
        return;
    }
    if (f.op == ZS_OP_HELLO) {
        conn_fail(c, ZS_ERR_FORMAT, "a hello frame on an established connection");
        return;
    }
    if (c->pending >= 0 || c->bl_len > 0) {
        c->backlog[(c->bl_head + c->bl_len) % RD_RECV_SLOTS] = slot;
        c->bl_len++;
        return;
    }
    deliver(c, slot);
}

/* A READ of the oldest receive in its READ phase completed (or was flushed). */
static void on_read_done(rd_conn *c, int ok, const char *why)
{
    rd_req *r = c->reading;
    if (!r || r->reads_out < 1) {
        if (ok)
            conn_fail(c, ZS_ERR_IO, "a READ completion no receive waits for");
        return;
    }
    /* Failed before the count drops, so that the connection's failure keeps this request for
     * the code below instead of freeing it. */
    if (!ok && !c->s.closed)
        conn_fail(c, ZS_ERR_IO, "RDMA READ of %llu bytes from the peer: %s (mid-payload)",
                  (unsigned long long)r->len, why);
    r->reads_out--;
    if (r->reads_out > 0)
        return;
    if (c->s.closed) {
        zs_rq_fifo_pop(&c->reading, &c->reading_tail);
        zs_rq_fail_conn(r, c->s.reason);
        return;
    }
    if (r->read_off < r->len)
        return;
    zs_rq_fifo_pop(&c->reading, &c->reading_tail);
    queue_done(c, r->token, 0);
    zs_rq_finish(r, ZS_OK, NULL);
}

static void on_wc(rd_net *n, const struct ibv_wc *wc)
{
    rd_conn *c = conn_by_id(n, (uint32_t)(wc->wr_id >> 40));
    if (!c)
        return; /* its connection is gone */
    int kind = (int)(wc->wr_id >> 36 & 0xf);
    uint64_t v = wc->wr_id & ((1ull << 36) - 1);
    int ok = wc->status == IBV_WC_SUCCESS;
    if (kind == WR_SEND || kind == WR_READ || kind == WR_RMA) {
        /* Send-queue work completes in order: everything up to v is done. */
        if (v > c->sq_done)
            c->sq_done = v;
        while (c->ring_used > 0) {
            int tail = (c->ring_head - c->ring_used + RD_SEND_SLOTS) % RD_SEND_SLOTS;
            if (c->ring_seq[tail] > c->sq_done)
                break;
            c->ring_used--;
        }
        c->s.dirty = 1;
    }
    char why[160];
    if (!ok)
        zs_net_fmt(why, sizeof why, "%s (vendor error 0x%x)", ibv_wc_status_str(wc->status),
                   wc->vendor_err);
    if (kind == WR_RMA) {
        on_rma_done(c, v, ok, wc->status, why);
    } else if (kind == WR_READ) {
        on_read_done(c, ok, ok ? NULL : why);
    } else if (!ok) {
        if (!c->s.closed && wc->status == IBV_WC_WR_FLUSH_ERR)
            conn_fail(c, ZS_ERR_IO,
                      "the queue pair went to the error state (a bad access on either side, a "
                      "lost peer, or the NIC)");
        else if (!c->s.closed)
            conn_fail(c, ZS_ERR_IO, "%s failed: %s", kind == WR_RECV ? "receive" : "send", why);
    } else if (kind == WR_RECV && !c->s.closed) {
        on_recv(c, (int)v, wc->byte_len);
    }
    if (c->closing && c->sq_done >= c->sq_posted && !c->reading)
        conn_emit_closed(c);
}

static void drain_cq(rd_net *n)
{
    if (!n->cq)
        return;
    struct ibv_cq *cq;
    void *cq_ctx;
    while (ibv_get_cq_event(n->chan, &cq, &cq_ctx) == 0) {
        n->cq_events++;
        n->cq_armed = 0;
    }
    if (n->cq_events >= 64) {
        ibv_ack_cq_events(n->cq, n->cq_events);
        n->cq_events = 0;
    }
    struct ibv_wc wc[32];
    for (;;) {
        int k = ibv_poll_cq(n->cq, 32, wc);
        if (k < 0) {
            zs_log_limited(&n->log, ZS_LOG_ERROR, "rdma: %s: ibv_poll_cq failed", n->dev_name);
            return;
        }
        for (int i = 0; i < k; i++)
            on_wc(n, &wc[i]);
        if (k > 0)
            continue;
        if (n->cq_armed)
            return;
        if (ibv_req_notify_cq(n->cq, 0) != 0)
            return;
        n->cq_armed = 1; /* poll once more: a completion may have come before the arming */
    }
}

static void drain_async(rd_net *n)
{
    if (!n->ctx)
        return;
    struct ibv_async_event ae;
    while (ibv_get_async_event(n->ctx, &ae) == 0) {
        switch (ae.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
            for (rd_conn *c = (rd_conn *)n->s.conns; c; c = (rd_conn *)c->s.next)
                if (c->qp == ae.element.qp)
                    conn_fail(c, ZS_ERR_IO, "queue pair error: %s",
                              ibv_event_type_str(ae.event_type));
            break;
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_DEVICE_FATAL:
            zs_log_limited(&n->log, ZS_LOG_WARN, "rdma: %s: %s", n->dev_name,
                           ibv_event_type_str(ae.event_type));
            break;
        default:
            break;
        }
        ibv_ack_async_event(&ae);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* set-up over the TCP stream */

static void setup_refuse(rd_conn *c, const char *why)
{
    zs_setup_conn_refuse(&c->s, why);
}

/* An accepted stream's hello arrived in c->s.hello: answer it and make the connection. */
static void setup_answer(zs_setup_conn *sc, uint64_t len)
{
    rd_conn *c = (rd_conn *)sc;
    rd_hello peer, self;
    if (!c->s.l) {
        setup_refuse(c, "its listener was closed");
        return;
    }
    rd_opts t = ((rd_listener *)c->s.l)->opts;
    zs_err e = hello_decode(c->s.hello, len, &peer, c->s.peer);
    if (e == ZS_OK)
        e = conn_make_qp(c);
    if (e == ZS_OK)
        e = local_hello(c, &t, &self);
    if (e == ZS_OK)
        e = conn_connect_qp(c, &self, &peer);
    if (e != ZS_OK) {
        setup_refuse(c, zs_last_error());
        return;
    }
    hello_encode(&self, c->s.hello);
    if (zs_setup_answer(&c->s) == ZS_OK)
        zs_setup_conn_accepted(&c->s);
}

/* ---------------------------------------------------------------------------------------- */
/* the loop: zs_setup_ops */

static void io(zs_setup_net *sn, const struct epoll_event *ev, int k)
{
    (void)ev, (void)k; /* the channel and the async queue are drained whether they woke us */
    drain_cq((rd_net *)sn);
    drain_async((rd_net *)sn);
}

static void resume(zs_setup_conn *sc)
{
    rd_conn *c = (rd_conn *)sc;
    deliver_backlog(c);
    issue_reads(c);
    issue_rma(c);
    send_control(c);
    send_frames(c);
}

static void expire(zs_setup_net *sn, int64_t now)
{
    rd_conn *next;
    for (rd_conn *c = (rd_conn *)sn->conns; c; c = next) {
        next = (rd_conn *)c->s.next;
        if (!c->closing || now < c->drain_deadline)
            continue;
        /* The NIC did not flush in time: destroying the QP stops it for sure. */
        ibv_destroy_qp(c->qp);
        c->qp = NULL;
        rd_req *r;
        while ((r = zs_rq_fifo_pop(&c->reading, &c->reading_tail)))
            zs_rq_fail_conn(r, c->s.reason);
        while ((r = zs_rq_fifo_pop(&c->rma_out, &c->rma_tail)))
            zs_rq_fail_conn(r, c->s.reason);
        c->rma_reads = 0;
        conn_emit_closed(c);
    }
}

static int64_t next_timer(zs_setup_net *sn)
{
    int64_t next = -1;
    for (rd_conn *c = (rd_conn *)sn->conns; c; c = (rd_conn *)c->s.next)
        if (c->closing && (next < 0 || c->drain_deadline < next))
            next = c->drain_deadline;
    return next;
}

static zs_err conn_new_cb(zs_setup_net *n, zs_conn *tcp, zs_setup_conn **out)
{
    return conn_new((rd_net *)n, tcp, (rd_conn **)out);
}

static void conn_free_cb(zs_setup_conn *c)
{
    conn_free((rd_conn *)c);
}

static void fail_cb(zs_setup_conn *c, zs_err err, const char *msg)
{
    conn_fail((rd_conn *)c, err, "%s", msg);
}

static const zs_setup_ops rd_setup_ops = {
    .name = "rdma",
    .hello_id = RD_HELLO_ID,
    .hello_bytes = RD_HELLO_BYTES,
    .conn_new = conn_new_cb,
    .conn_free = conn_free_cb,
    .answer = setup_answer,
    .fail = fail_cb,
    .io = io,
    .resume = resume,
    .expire = expire,
    .next_timer = next_timer,
};

/* ---------------------------------------------------------------------------------------- */
/* the interface */

static zs_err rd_open(zs_net **out)
{
    *out = NULL;
    rd_net *n = calloc(1, sizeof *n);
    if (!n)
        return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
    zs_err res = zs_setup_net_open(&n->s, &rd_setup_ops);
    if (res != ZS_OK) {
        free(n);
        return res;
    }
    n->s.send_timeout_ms = zs_setup_env_int("rdma", "ZS_RDMA_SEND_TIMEOUT_MS",
                                            RD_DEFAULT_SEND_TIMEOUT_MS, 10, INT_MAX / 2);
    n->log = (zs_log_limit){0};
    *out = (zs_net *)n;
    return ZS_OK;
}

static zs_err rd_set_opts(zs_net *net, const zs_net_opts *opts)
{
    (void)net, (void)opts; /* batching buys nothing when posting is a doorbell */
    return ZS_OK;
}

static void rd_close(zs_net *nn)
{
    rd_net *n = (rd_net *)nn;
    if (!n)
        return;
    zs_setup_net_close_conns(&n->s);
    while (n->s.listeners) {
        rd_listener *l = (rd_listener *)n->s.listeners;
        n->s.listeners = l->s.next;
        free(l);
    }
    while (n->s.mrs) {
        rd_mr *m = (rd_mr *)n->s.mrs;
        n->s.mrs = m->reg.next;
        ibv_dereg_mr(m->mr);
        free(m);
    }
    if (n->cq) {
        if (n->cq_events)
            ibv_ack_cq_events(n->cq, n->cq_events);
        ibv_destroy_cq(n->cq);
    }
    if (n->chan)
        ibv_destroy_comp_channel(n->chan);
    if (n->pd)
        ibv_dealloc_pd(n->pd);
    if (n->ctx)
        ibv_close_device(n->ctx);
    zs_setup_net_close(&n->s);
    free(n);
}

/* The IPv4 address (network order) HOST of "HOST:PORT" names literally, else 0. */
static uint32_t literal_ipv4(const char *addr)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    size_t len = colon ? (size_t)(colon - addr) : strlen(addr);
    if (len == 0 || len >= sizeof host)
        return 0;
    memcpy(host, addr, len);
    host[len] = '\0';
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 ? a.s_addr : 0;
}

static zs_err rd_listen(zs_net *nn, const char *addr, const zs_conn_opts *opts, zs_listener **out)
{
    rd_net *n = (rd_net *)nn;
    *out = NULL;
    rd_opts t;
    resolve_opts(opts, &t);
    ZS_CHECK(open_device(n, &t, literal_ipv4(addr)));
    rd_listener *l = calloc(1, sizeof *l);
    if (!l)
        return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
    l->opts = t;
    zs_err e = zs_setup_listen(&n->s, &l->s, addr, opts, "ZS_RDMA_SETUP_MS", RD_DEFAULT_SETUP_MS);
    if (e != ZS_OK) {
        free(l);
        return e;
    }
    *out = (zs_listener *)l;
    return ZS_OK;
}

static void rd_listener_close(zs_listener *l)
{
    zs_setup_listener_drop((zs_setup_listener *)l);
    free(l);
}

static zs_err rd_connect(zs_net *nn, const char *addr, const zs_conn_opts *opts, zs_conn **out)
{
    rd_net *n = (rd_net *)nn;
    *out = NULL;
    rd_opts t;
    resolve_opts(opts, &t);
    int timeout = opts && opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 10000;
    int64_t deadline = zs_net_now_ms() + timeout;
    zs_conn_opts to = zs_setup_tcp_opts(opts, timeout);
    zs_conn *tc;
    ZS_CHECK(zs_tcp_connect(n->s.tcp, addr, &to, &tc));
    struct sockaddr_storage ss;
    uint32_t ip = 0;
    if (zs_tcp_conn_local(tc, &ss) == 0 && ss.ss_family == AF_INET)
        ip = ((struct sockaddr_in *)&ss)->sin_addr.s_addr;
    zs_err res = open_device(n, &t, ip);
    if (res != ZS_OK) {
        zs_tcp_conn_close(tc);
        return res;
    }
    rd_conn *c;
    res = conn_new(n, tc, &c);
    if (res != ZS_OK) {
        zs_tcp_conn_close(tc);
        return res;
    }
    zs_net_fmt(c->s.peer, sizeof c->s.peer, "%s", addr);
    rd_hello self, peer;
    ZS_CHECK_GOTO(conn_make_qp(c), res, fail);
    ZS_CHECK_GOTO(local_hello(c, &t, &self), res, fail);
    hello_encode(&self, c->s.hello);
    uint64_t got;
    ZS_CHECK_GOTO(zs_setup_exchange(tc, c->s.hello_mr, c->s.hello, RD_HELLO_BYTES, RD_HELLO_ID,
                                    "rdma", addr, timeout, deadline, &got),
                  res, fail);
    ZS_CHECK_GOTO(hello_decode(c->s.hello, got, &peer, c->s.peer), res, fail);
    ZS_CHECK_GOTO(conn_connect_qp(c, &self, &peer), res, fail);
    c->s.ready = 1;
    *out = (zs_conn *)c;
    return ZS_OK;
fail:
    conn_free(c);
    return res;
}

/* The verbs access flags of zshard's access bits. */
static int verbs_access(int access)
{
    int flags = 0;
    if (access & (ZS_MR_RECV | ZS_MR_REMOTE_WRITE))
        flags |= IBV_ACCESS_LOCAL_WRITE; /* verbs wants it beside remote write */
    if (access & (ZS_MR_SEND | ZS_MR_REMOTE_READ))
        flags |= IBV_ACCESS_REMOTE_READ;
    if (access & ZS_MR_REMOTE_WRITE)
        flags |= IBV_ACCESS_REMOTE_WRITE;
    return flags;
}

/* Opens the default device for a net that registers memory before it connects. */
static zs_err ensure_device(rd_net *n)
{
    if (n->ctx)
        return ZS_OK;
    rd_opts t;
    resolve_opts(NULL, &t);
    return open_device(n, &t, 0);
}

/* Puts the registration m->mr of [base, base + len) in the net's table. */
static void add_region(rd_net *n, rd_mr *m, void *base, size_t len, int access, zs_mr **out)
{
    zs_region_add(&n->s.mrs, &m->reg, n, base, len, access);
    if (access & (ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE))
        m->reg.key = m->mr->rkey; /* what peers' NICs name it by */
    *out = (zs_mr *)m;
}

static zs_err rd_reg_mr(zs_net *nn, void *base, size_t len, int access, zs_mr **out)
{
    rd_net *n = (rd_net *)nn;
    *out = NULL;
    ZS_CHECK(ensure_device(n));
    ZS_CHECK(zs_region_check_access("rdma", access));
    rd_mr *m = calloc(1, sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
    m->mr = ibv_reg_mr(n->pd, base, len, verbs_access(access));
    if (!m->mr) {
        int err = errno;
        free(m);
        return zs_error(err == ENOMEM ? ZS_ERR_NOMEM : ZS_ERR_IO,
                        "rdma: %s: ibv_reg_mr of %zu bytes: %s%s", n->dev_name, len, strerror(err),
                        err == ENOMEM ? " (raise the locked-memory limit: ulimit -l)" : "");
    }
    add_region(n, m, base, len, access, out);
    return ZS_OK;
}

/* ibv_reg_dmabuf_mr, or NULL with errno ENOSYS where rdma-core is older than v34 (the build
 * looked for it: ZS_HAVE_IBV_REG_DMABUF_MR). */
static struct ibv_mr *reg_dmabuf(struct ibv_pd *pd, const zs_dmabuf *b, int flags)
{
#ifdef ZS_HAVE_IBV_REG_DMABUF_MR
    return ibv_reg_dmabuf_mr(pd, b->offset, b->len, (uint64_t)(uintptr_t)b->addr, b->fd, flags);
#else
    (void)pd, (void)b, (void)flags;
    errno = ENOSYS;
    return NULL;
#endif
}

static zs_err rd_reg_dmabuf_mr(zs_net *nn, const zs_dmabuf *buf, int access, zs_mr **out)
{
    rd_net *n = (rd_net *)nn;
    *out = NULL;
    if (!buf || buf->fd < 0 || !buf->addr || buf->len == 0)
        return zs_error(ZS_ERR_INVALID, "rdma reg_dmabuf_mr: no dma-buf (fd %d, %zu bytes at %p)",
                        buf ? buf->fd : -1, buf ? buf->len : 0, buf ? buf->addr : NULL);
    ZS_CHECK(ensure_device(n));
    ZS_CHECK(zs_region_check_access("rdma", access));
    rd_mr *m = calloc(1, sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
    /* The iova is the caller's address, so that work requests name the region's bytes by the
     * addresses the caller uses, as for host memory.  The kernel holds the dma-buf from here
     * until the region is deregistered. */
    m->mr = reg_dmabuf(n->pd, buf, verbs_access(access));
    if (!m->mr) {
        int err = errno;
        free(m);
        int unsupported =
            err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS || err == EPROTONOSUPPORT;
        return zs_error(unsupported     ? ZS_ERR_UNSUPPORTED
                        : err == ENOMEM ? ZS_ERR_NOMEM
                                        : ZS_ERR_IO,
                        "rdma: %s: ibv_reg_dmabuf_mr of %zu bytes (dma-buf fd %d, offset %llu) "
                        "failed with errno %d: %s%s",
                        n->dev_name, buf->len, buf->fd, (unsigned long long)buf->offset, err,
                        strerror(err),
                        err == ENOSYS ? " (this build's rdma-core has no ibv_reg_dmabuf_mr)"
                        : unsupported ? " (the device or its driver cannot register a dma-buf)"
                                      : "");
    }
    m->device = 1;
    m->copy = buf->copy;
    m->copy_ctx = buf->ctx;
    add_region(n, m, buf->addr, buf->len, access | ZS_MR_PINNED, out);
    return ZS_OK;
}

void zs_rdma_test_as_device(zs_mr *mm,
                            int (*copy)(void *ctx, void *dst, const void *src, size_t n,
                                        int to_region),
                            void *ctx)
{
    rd_mr *m = (rd_mr *)mm;
    m->device = 1;
    m->copy = copy;
    m->copy_ctx = ctx;
}

static zs_err rd_dereg_mr(zs_mr *mm)
{
    rd_mr *m = (rd_mr *)mm;
    if (!m)
        return ZS_OK;
    rd_net *n = (rd_net *)m->reg.net;
    ZS_CHECK(zs_region_remove(&n->s.mrs, &m->reg, "rdma"));
    ibv_dereg_mr(m->mr);
    free(m);
    return ZS_OK;
}

static zs_err check_region(const rd_conn *c, const char *what, const rd_mr *m, size_t off,
                           uint64_t len, int access)
{
    return zs_region_check("rdma", what, c->s.peer, c->s.net, m ? &m->reg : NULL, off, len, access);
}

static zs_err check_open(const rd_conn *c, const char *what)
{
    return zs_setup_check_open(&c->s, what);
}

static zs_err make_send(rd_conn *c, const zs_frame *f, zs_req **out, void *user, rd_req **rq)
{
    ZS_CHECK(check_open(c, "send"));
    uint8_t hdr[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(f, hdr);
    zs_frame g;
    if (zs_frame_decode(hdr, &g) != ZS_OK)
        return zs_error(ZS_ERR_INVALID, "rdma %s: send of a bad frame: %s", c->s.peer,
                        zs_last_error());
    rd_req *r = zs_rq_new(&c->s.net->reqs, c->s.net, ZS_RQ_SEND, c, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
    r->frame = g;
    *rq = r;
    return ZS_OK;
}

static void send_start(rd_conn *c, rd_req *r, zs_req **out)
{
    r->state = ZS_RQ_QUEUED;
    zs_rq_fifo_push(&c->sendq, &c->sendq_tail, r);
    if (out)
        *out = (zs_req *)r;
    send_frames(c);
}

static zs_err rd_isend(zs_conn *cc, const zs_frame *f, zs_mr *mm, size_t off, void *user,
                       zs_req **out)
{
    rd_conn *c = (rd_conn *)cc;
    rd_mr *m = (rd_mr *)mm;
    if (out)
        *out = NULL;
    ZS_CHECK(check_region(c, "send", m, off, f->length, ZS_MR_SEND));
    rd_req *r;
    ZS_CHECK(make_send(c, f, out, user, &r));
    if (f->length)
        zs_rq_use(r, &m->reg, off);
    send_start(c, r, out);
    return ZS_OK;
}

static zs_err rd_isend_inline(zs_conn *cc, const zs_frame *f, const void *data, void *user,
                              zs_req **out)
{
    rd_conn *c = (rd_conn *)cc;
    if (out)
        *out = NULL;
    if (f->length > ZS_NET_INLINE_MAX)
        return zs_error(ZS_ERR_INVALID, "rdma %s: inline send of %llu bytes, at most %d", c->s.peer,
                        (unsigned long long)f->length, ZS_NET_INLINE_MAX);
    rd_req *r;
    ZS_CHECK(make_send(c, f, out, user, &r));
    if (f->length) {
        r->inline_buf = malloc(f->length);
        if (!r->inline_buf) {
            zs_rq_release(r);
            return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
        }
        memcpy(r->inline_buf, data, f->length);
    }
    send_start(c, r, out);
    return ZS_OK;
}

static zs_err pending_frame(rd_conn *c, const char *what, zs_frame *f)
{
    ZS_CHECK(check_open(c, what));
    if (c->pending < 0)
        return zs_error(ZS_ERR_INVALID, "rdma %s: %s without a pending header", c->s.peer, what);
    zs_frame_decode(recv_slot(c, c->pending) + RD_HDR, f);
    return ZS_OK;
}

static void pending_done(rd_conn *c)
{
    int slot = c->pending;
    c->pending = -1;
    release_slot(c, slot);
    c->s.dirty = 1;
}

static zs_err rd_recv_payload(zs_conn *cc, zs_mr *mm, size_t off, void *user, zs_req **out)
{
    rd_conn *c = (rd_conn *)cc;
    rd_mr *m = (rd_mr *)mm;
    if (out)
        *out = NULL;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "recv_payload", &f));
    if (c->viewing)
        return zs_error(ZS_ERR_INVALID, "rdma recv_payload %s: the payload is viewed in place",
                        c->s.peer);
    ZS_CHECK(check_region(c, "receive", m, off, f.length, ZS_MR_RECV));
    rd_req *r = zs_rq_new(&c->s.net->reqs, c->s.net, ZS_RQ_RECV, c, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "rdma: out of memory");
    r->frame = f;
    r->id = f.id;
    zs_rq_use(r, &m->reg, off);
    if (out)
        *out = (zs_req *)r;
    start_payload(c, c->pending, r);
    pending_done(c);
    return ZS_OK;
}

static zs_err rd_discard(zs_conn *cc)
{
    rd_conn *c = (rd_conn *)cc;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "discard", &f));
    skip_payload(c, c->pending);
    c->viewing = 0;
    pending_done(c);
    return ZS_OK;
}

/* Only an inline payload is here to be read in place (in its receive slot); a rendezvous one is
 * in the peer's memory until an RDMA READ brings it. */
static zs_err rd_view_payload(zs_conn *cc, const void **data)
{
    rd_conn *c = (rd_conn *)cc;
    *data = NULL;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "view_payload", &f));
    const uint8_t *p = recv_slot(c, c->pending);
    if (p[4] == MSG_EAGER || f.length == 0) {
        c->viewing = 1;
        *data = p + RD_HDR + ZS_FRAME_HEADER_BYTES;
    }
    return ZS_OK;
}

static zs_err rd_view_release(zs_conn *cc)
{
    rd_conn *c = (rd_conn *)cc;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "view_release", &f));
    if (!c->viewing)
        return zs_error(ZS_ERR_INVALID, "rdma view_release %s: the pending payload is not viewed",
                        c->s.peer);
    c->viewing = 0;
    pending_done(c);
    return ZS_OK;
}

static int read_idle(void *arg)
{
    rd_req *r = arg;
    return r->state == ZS_RQ_DONE || r->reads_out == 0;
}

static zs_err rd_cancel(zs_req *rq)
{
    rd_req *r = (rd_req *)rq;
    ZS_CHECK(zs_rq_check_handle(r, "cancel"));
    rd_conn *c = r->conn;
    if (r->rma && r->state != ZS_RQ_DONE)
        return zs_error(ZS_ERR_INVALID,
                        "rdma cancel %s: a one-sided %s cannot be recalled (its bytes may "
                        "still move); wait for it",
                        c->s.peer, r->rma == ZS_RMA_WRITE ? "write" : "read");
    switch (r->state) {
    case ZS_RQ_DONE:
        zs_rq_release(r);
        return ZS_OK;
    case ZS_RQ_QUEUED:
        zs_rq_fifo_remove(&c->sendq, &c->sendq_tail, r);
        zs_rq_release(r);
        return ZS_OK;
    case ZS_RQ_EXPECTED:
        zs_rq_orphan(r);
        return ZS_OK;
    case ZS_RQ_AWAIT:
        return zs_error(ZS_ERR_INVALID,
                        "rdma %s: send of %s id %llu is being read by the peer; it cannot be "
                        "recalled",
                        c->s.peer, zs_frame_op_name(r->frame.op), (unsigned long long)r->frame.id);
    case ZS_RQ_ACTIVE: {
        /* The NIC writes into the destination until its READs complete: wait for them, and
         * stop them by failing the connection if they do not. */
        r->handle = 0;
        r->silent = 1;
        if (!zs_setup_run(r->net, zs_net_now_ms() + RD_CANCEL_MS, read_idle, r) &&
            r->state != ZS_RQ_DONE)
            conn_fail(c, ZS_ERR_IO, "a cancelled receive's READ did not finish in %d ms",
                      RD_CANCEL_MS);
        if (r->state != ZS_RQ_DONE && r->reads_out > 0 && c->qp) {
            ibv_destroy_qp(c->qp);
            c->qp = NULL;
            rd_req *q;
            while ((q = zs_rq_fifo_pop(&c->reading, &c->reading_tail)))
                zs_rq_fail_conn(q, c->s.reason); /* silent ones are freed */
            if (c->closing)
                conn_emit_closed(c);
            return ZS_OK;
        }
        if (r->state != ZS_RQ_DONE) {
            /* Its bytes are read; only the bookkeeping remains: finish it silently. */
            zs_rq_fifo_remove(&c->reading, &c->reading_tail, r);
            queue_done(c, r->token, 0);
            zs_rq_release(r);
        }
        return ZS_OK;
    }
    }
    return zs_error(ZS_ERR_INVALID, "rdma: cancel of a request in state %d", r->state);
}

zs_err zs_rdma_test_break_qp(zs_conn *cc)
{
    rd_conn *c = (rd_conn *)cc;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    int rc = c->qp ? ibv_modify_qp(c->qp, &a, IBV_QP_STATE) : EINVAL;
    if (rc)
        return zs_error(ZS_ERR_IO, "rdma %s: QP to ERR: %s", c->s.peer, strerror(rc));
    return ZS_OK;
}

void zs_rdma_test_bad_key(zs_conn *c)
{
    ((rd_conn *)c)->bad_key = 1;
}

/* iread (write 0) and iwrite: queued behind the ones before it and posted as the QP has room
 * (issue_rma). */
static zs_err rma_start(zs_conn *cc, int write, zs_mr *mm, size_t off, const zs_mr_desc *rd,
                        uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                        zs_req **out)
{
    rd_conn *c = (rd_conn *)cc;
    rd_mr *m = (rd_mr *)mm;
    const char *what = write ? "iwrite" : "iread";
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, what));
    ZS_CHECK(zs_rma_check("rdma", write, c->s.peer, c->s.net, m ? &m->reg : NULL, off, rd,
                          remote_off, len));
    rd_req *r =
        zs_rq_new(&c->s.net->reqs, c->s.net, write ? ZS_RQ_SEND : ZS_RQ_RECV, c, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "rdma %s %s: out of memory", what, c->s.peer);
    r->rma = write ? ZS_RMA_WRITE : ZS_RMA_READ;
    r->frame = zs_rma_request(write, 0, rd, remote_off, len, notify, imm);
    r->frame.length = 0; /* the NIC moves the bytes: no frame carries them */
    r->len = len;
    r->raddr = rd->addr + remote_off;
    r->rkey = rd->key;
    zs_rq_use(r, &m->reg, off);
    r->state = ZS_RQ_QUEUED;
    zs_rq_fifo_push(&c->rmaq, &c->rmaq_tail, r);
    if (out)
        *out = (zs_req *)r;
    issue_rma(c); /* a failure from here on fails r with the connection */
    return ZS_OK;
}

static zs_err rd_mr_export(zs_mr *mr, zs_mr_desc *out)
{
    return zs_region_export("rdma", mr ? &((rd_mr *)mr)->reg : NULL, out);
}

static zs_err rd_iread(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                       uint64_t remote_off, size_t len, void *user, zs_req **req)
{
    return rma_start(c, 0, mr, off, remote, remote_off, len, 0, 0, user, req);
}

static zs_err rd_iwrite(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                        uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                        zs_req **req)
{
    return rma_start(c, 1, mr, off, remote, remote_off, len, notify, imm, user, req);
}

const zs_transport_ops zs_rdma_ops = {
    .version = ZS_TRANSPORT_OPS_VERSION,
    .name = "rdma",
    .open = rd_open,
    .set_opts = rd_set_opts,
    .close = rd_close,
    .listen = rd_listen,
    .listener_port = zs_setup_listener_port,
    .listener_endpoint = zs_setup_listener_endpoint,
    .listener_close = rd_listener_close,
    .accept = zs_setup_accept,
    .connect = rd_connect,
    .conn_peer = zs_setup_conn_peer,
    .conn_set_user = zs_setup_conn_set_user,
    .conn_user = zs_setup_conn_user,
    .conn_member = zs_setup_conn_member,
    .conn_closed = zs_setup_conn_closed,
    .conn_close = zs_setup_conn_close,
    .reg_mr = rd_reg_mr,
    .dereg_mr = rd_dereg_mr,
    .isend = rd_isend,
    .isend_inline = rd_isend_inline,
    .irecv = zs_setup_irecv,
    .recv_payload = rd_recv_payload,
    .discard = rd_discard,
    .view_payload = rd_view_payload,
    .view_release = rd_view_release,
    .test = zs_setup_test,
    .wait = zs_setup_wait,
    .cancel = rd_cancel,
    .mr_export = rd_mr_export,
    .iread = rd_iread,
    .iwrite = rd_iwrite,
    .flush = zs_setup_flush,
    .poll = zs_setup_poll,
    .wait_fd = zs_setup_wait_fd,
    .reg_dmabuf_mr = rd_reg_dmabuf_mr,
};
