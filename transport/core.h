/*
 * core: what every data-plane backend (tcp.c, rdma.c, shm.c) needs and none should write again:
 * the event queue that poll() hands out, the table of registered regions, the requests (their
 * slab, their single outcome, the lists they wait on), the monotonic clock and deadlines of
 * blocking calls, and bounded message formatting.  Nothing here knows about sockets or verbs.
 *
 * The event queue keeps the order in which events were produced.  Forgetting a connection
 * (conn_close) leaves tombstones where its own events were (ACCEPT, HEADER, CLOSED) and keeps
 * request completions in place with the connection pointer cleared, so a request's single
 * outcome is never lost (transport.h, "Completions").
 *
 * A region (zs_region) is the first member of each backend's zs_mr, and a request (zs_rq) is
 * each backend's zs_req: what a backend keeps beyond them (an ibv_mr, a memfd, the socket a
 * request waits on) it keeps in its own struct or in zs_rq's backend fields.  A region counts
 * the requests that use it, from the call that starts them until their outcome, and cannot be
 * deregistered while any does.
 */
#ifndef ZS_TRANSPORT_CORE_H
#define ZS_TRANSPORT_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

typedef struct {
    zs_event *ring; /* cap entries; len of them from head, tombstones have type 0 */
    size_t head, len, cap;
    size_t live; /* entries that are not tombstones: what poll() would hand out */
} zs_evq;

/* Appends an event of `type` about conn (may be NULL) with every other field cleared, and
 * returns it for the caller to fill in; NULL when memory ran out (then the event is lost,
 * logged with `who`). */
zs_event *zs_evq_push(zs_evq *q, zs_ev_type type, zs_conn *conn, const char *who);
/* Tombstones the events about conn; request completions keep their place with conn NULL. */
void zs_evq_forget(zs_evq *q, const zs_conn *conn);
/* Takes the oldest live event into *out; 0 when there is none. */
int zs_evq_pop(zs_evq *q, zs_event *out);
/* Frees the ring; the queue is empty afterwards. */
void zs_evq_free(zs_evq *q);
/* Takes the oldest queued ZS_EV_ACCEPT of listener l out of the queue (accept()) and returns
 * its connection; NULL if there is none. */
zs_conn *zs_evq_take_accept(zs_evq *q, const zs_listener *l);
/* listener_close(): queued ACCEPT and REFUSED events of l stay, naming no listener. */
void zs_evq_forget_listener(zs_evq *q, const zs_listener *l);

/* A handle-less request's outcome as its one event (transport.h, "Completions"): ZS_EV_SEND
 * or ZS_EV_RECV on q with the frame, the cookie, the result and its message (err, "" on
 * success). */
void zs_evq_outcome(zs_evq *q, int is_send, zs_conn *conn, const zs_frame *f, void *user, zs_err st,
                    const char *err, const char *who);

/* The message of a request that failed because its connection went away:
 * "send of push id 7: REASON" or "receive of id 7: REASON". */
void zs_net_fail_text(char *out, size_t cap, int is_send, const zs_frame *f, const char *reason);

/* ---------------------------------------------------------------------------------------- */
/* registered regions */

typedef struct zs_region {
    const void *net; /* the backend net that registered it */
    uint8_t *base;
    size_t len;   /* bytes */
    int access;   /* ZS_MR_SEND | ZS_MR_RECV | ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE */
    uint32_t key; /* what its descriptor names it by (rdma: the rkey); 0 without remote access */
    long refs;    /* requests using the region: dereg refuses while > 0 */
    struct zs_region *prev, *next;
} zs_region;

/* Fills in m (refs 0) and puts it at the head of *table. */
void zs_region_add(zs_region **table, zs_region *m, const void *net, void *base, size_t len,
                   int access);
/* Takes m out of *table, or refuses (ZS_ERR_INVALID, "BACKEND dereg_mr: region of N bytes at
 * P: K requests still use it") while requests use it; m is not freed. */
zs_err zs_region_remove(zs_region **table, zs_region *m, const char *backend);
/* The access bits reg_mr() takes; ZS_ERR_INVALID naming the backend for anything else. */
zs_err zs_region_check_access(const char *backend, int access);
/* A random key no region of table has, never 0: the key of a region with remote access on a
 * backend without a NIC to issue one (tcp, shm).  Random, so that a descriptor of a region
 * deregistered since does not name a new one by chance, and so that a peer cannot guess the
 * key of a region it was not given. */
uint32_t zs_region_new_key(const zs_region *table);
/* mr_export(): m's descriptor, or ZS_ERR_INVALID when m has no remote access. */
zs_err zs_region_export(const char *backend, const zs_region *m, zs_mr_desc *out);
/* The region of table that a peer's one-sided operation names -- key, and the bytes
 * [addr, addr + len) inside it, registered for `access` (ZS_MR_REMOTE_READ or
 * ZS_MR_REMOTE_WRITE) -- or NULL with the reason in why[cap]. */
zs_region *zs_region_lookup(zs_region *table, uint64_t key, uint64_t addr, uint64_t len, int access,
                            char *why, size_t cap);
/* Checks the arguments of iread() (write 0) or iwrite() (write 1) before anything starts: len
 * bytes at off of the local region m, and at remote_off of the peer's region rd, inside both
 * and within one frame's payload, each registered for the access the operation needs. */
zs_err zs_rma_check(const char *backend, int write, const char *peer, const void *net,
                    const zs_region *m, size_t off, const zs_mr_desc *rd, uint64_t remote_off,
                    size_t len);

struct zs_rq;

/* The request frame of a one-sided operation (write 0: a read) of len bytes at remote_off of
 * the peer's region rd, under frame id `id` (tcp, shm send it; rdma keeps it as the request's
 * record). */
zs_frame zs_rma_request(int write, uint64_t id, const zs_mr_desc *rd, uint64_t remote_off,
                        size_t len, int notify, uint32_t imm);
/* The owner's answer to the peer's request f: op RMA_DATA (carrying the bytes) or RMA_ACK, or
 * ZS_OP_ERROR with status bad_key and text_len bytes of text. */
zs_frame zs_rma_answer(const zs_frame *f, int op, size_t text_len);
/* Checks the answer f to our one-sided operation r (its request in r->frame): ZS_OK when f
 * answers it (RMA_DATA for a read, RMA_ACK for a write, the same address and bytes);
 * ZS_ERR_INVALID when the owner refused it; ZS_ERR_FORMAT when f answers something else (a
 * confused peer: its connection should fail).  msg[cap] says why, naming backend and peer. */
zs_err zs_rma_check_answer(const char *backend, const char *peer, const struct zs_rq *r,
                           const zs_frame *f, char *msg, size_t cap);

/* Checks that [off, off + len) of m (NULL: no region was given) may be used for `access`
 * (ZS_MR_SEND or ZS_MR_RECV) by `what` ("send", "receive") on the connection to peer of net.
 * The message starts with "BACKEND WHAT PEER: ".  len 0 needs no region. */
zs_err zs_region_check(const char *backend, const char *what, const char *peer, const void *net,
                       const zs_region *m, size_t off, uint64_t len, int access);

/* ---------------------------------------------------------------------------------------- */
/* requests */

enum { ZS_RQ_SEND = 1, ZS_RQ_RECV = 2 };
/* zs_rq.rma: the initiator's iread and iwrite, and the target's part in a peer's (the reply a
 * tcp net sends, the payload it receives), which no caller sees. */
enum { ZS_RMA_READ = 1, ZS_RMA_WRITE = 2, ZS_RMA_SERVE = 3 };
/* Frame ids from here up are the backends' own, for the frames of one-sided operations
 * (tcp.c); irecv() refuses them, so a caller's ids never meet them. */
#define ZS_RMA_ID_BASE ((uint64_t)1 << 63)
/* A request's state.  Each backend uses the ones its protocol has. */
enum {
    ZS_RQ_IDLE,     /* on the free list: not a live handle */
    ZS_RQ_QUEUED,   /* a send on the backend's send queue, nothing of it out yet (tcp: on a
                       socket's queue, maybe partly written) */
    ZS_RQ_EXPECTED, /* an irecv posted, its frame not arrived */
    ZS_RQ_AWAIT,    /* a rendezvous send out, waiting for the peer's DONE */
    ZS_RQ_ACTIVE,   /* a receive whose payload is moving (tcp: read from the socket; rdma: its
                       READs posted) */
    ZS_RQ_DONE,     /* finished: a handle keeps its outcome for test()/wait() */
};

typedef struct zs_rq_pool zs_rq_pool;

typedef struct zs_rq {
    zs_rq_pool *pool;    /* where it came from and goes back */
    void *net;           /* the backend's net */
    void *conn;          /* the backend's connection; NULL once done, for a handle */
    void *at;            /* the backend's: where it waits (tcp: the socket reading or sending it) */
    int kind;            /* ZS_RQ_SEND, ZS_RQ_RECV */
    int state;           /* ZS_RQ_* */
    int handle;          /* the caller holds a zs_req: no event */
    int silent;          /* a cancelled irecv kept to skip its late reply: no outcome at all */
    int rma;             /* a one-sided operation: ZS_RMA_* (0: a send or receive) */
    zs_err status;       /* the outcome, once done */
    void *user;          /* the caller's cookie */
    zs_frame frame;      /* send: the frame sent; recv: the frame received (id only until then) */
    zs_region *mr;       /* the region buf lies in, referenced until done; NULL for inline */
    uint8_t *buf;        /* send: payload source; recv: destination */
    uint64_t len;        /* send: payload bytes; recv: capacity of buf, then the payload's bytes */
    uint8_t *inline_buf; /* isend_inline's copy of the payload (owned) */
    uint64_t id;         /* irecv: the id expected */
    uint8_t hdr[ZS_FRAME_HEADER_BYTES]; /* send: the encoded header (tcp writes it from here) */
    /* rendezvous (rdma, shm): the payload stays at the sender until the receiver has read it */
    uint64_t token;            /* send awaiting DONE: its token; recv: the peer's token to answer */
    int64_t deadline;          /* send awaiting DONE: when the peer is given up on */
    uint64_t raddr;            /* recv: the payload's address at the peer */
    uint32_t rkey;             /* recv: the key of the peer's region (rdma) */
    uint64_t read_off;         /* recv: bytes for which READs were posted */
    int reads_out;             /* recv: READs posted and not completed */
    struct zs_rq *prev, *next; /* the backend's lists and queues, or the free list */
    char err[ZS_NET_REASON_MAX];
} zs_rq;

struct zs_rq_slab;

/* A net's requests: allocated in slabs, reused through a free list, all freed with the net. */
struct zs_rq_pool {
    const char *who; /* "tcp": the backend, for messages */
    zs_evq *evq;     /* where handle-less outcomes go: the net's queue */
    /* The connection a handle-less outcome's event names (NULL: none, the connection was
     * closed locally); NULL here: the request's own. */
    zs_conn *(*event_conn)(void *conn);
    /* Drives the net until ready(arg) or the deadline (-1: none; now: one turn without
     * blocking); fails only if the event loop itself does. */
    zs_err (*run)(void *net, int64_t deadline, int (*ready)(void *), void *arg);
    zs_rq *free;
    struct zs_rq_slab *slabs;
};

/* A cleared request from pool p, or NULL when memory ran out. */
zs_rq *zs_rq_new(zs_rq_pool *p, void *net, int kind, void *conn, void *user, int handle);
/* Gives r back (dropping its region reference and inline copy); r is no longer a handle. */
void zs_rq_release(zs_rq *r);
/* Frees every slab; requests still out are gone with them. */
void zs_rq_pool_free(zs_rq_pool *p);
/* Makes r use m[off, ...): a reference on m until r's outcome. */
void zs_rq_use(zs_rq *r, zs_region *m, size_t off);

/* Completes r with status st (message msg when st fails): a handle keeps the outcome for
 * test()/wait(); a silent request is released; otherwise it becomes one event on the pool's queue
 * and the request is released. */
void zs_rq_finish(zs_rq *r, zs_err st, const char *msg);
/* Fails r because its connection went away: "send of push id 7: REASON". */
void zs_rq_fail_conn(zs_rq *r, const char *reason);

/* cancel() of a posted irecv: kept without a buffer or an owner, so that a late reply with
 * its id is skipped (and the stream stays in step) instead of surfacing as a header. */
void zs_rq_orphan(zs_rq *r);
/* test() and wait() of a handle: drives the net up to timeout_ms (0: one turn without
 * blocking) until r is done, then reports its outcome and releases it.  Refuses what is not a
 * live handle (`what` names the call). */
zs_err zs_rq_wait(zs_rq *r, int timeout_ms, int *done, zs_frame *f, const char *what);
/* Refuses what is not a live request handle, for `what` ("cancel"). */
zs_err zs_rq_check_handle(const zs_rq *r, const char *what);

/* Posts an irecv for frame `id` on conn into m[off, off + cap): checks the region (the
 * connection's state is the caller's), refuses an id already expected and the ids from
 * ZS_RMA_ID_BASE up, and puts the request
 * on *expect (ZS_RQ_EXPECTED). */
zs_err zs_rq_expect(zs_rq_pool *p, void *net, void *conn, const char *peer, zs_rq **expect,
                    uint64_t id, zs_region *m, size_t off, size_t cap, void *user, zs_req **out);
/* As zs_rq_expect, ids from ZS_RMA_ID_BASE allowed: a backend's own one-sided frames. */
zs_err zs_rq_expect_any(zs_rq_pool *p, void *net, void *conn, const char *peer, zs_rq **expect,
                        uint64_t id, zs_region *m, size_t off, size_t cap, void *user,
                        zs_req **out);
/* Starts a one-sided operation's bookkeeping for tcp and shm, which carry it in frames:
 * checks the arguments (zs_rma_check), takes the next id of the backend's range from
 * *next_id, and posts the receive of the owner's answer on *expect -- into m[off, off + len)
 * for a read, nothing for a write -- as the operation's request (a handle when `handle`),
 * whose frame is the request frame to send.  Nothing is started when it fails. */
zs_err zs_rma_expect(zs_rq_pool *p, void *net, void *conn, const char *peer, struct zs_rq **expect,
                     uint64_t *next_id, int write, zs_region *m, size_t off, const zs_mr_desc *rd,
                     uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                     int handle, struct zs_rq **out);

/* Doubly linked lists with a head pointer (expected receives, sends awaiting DONE). */
void zs_rq_list_add(zs_rq **head, zs_rq *r);
void zs_rq_list_del(zs_rq **head, zs_rq *r);
/* The request on list head expecting frame id, or NULL. */
zs_rq *zs_rq_list_find(zs_rq *head, uint64_t id);
/* The request on list head awaiting DONE for token, or NULL. */
zs_rq *zs_rq_list_token(zs_rq *head, uint64_t token);
/* Singly linked FIFO queues (sends waiting for room, receives reading). */
void zs_rq_fifo_push(zs_rq **head, zs_rq **tail, zs_rq *r);
zs_rq *zs_rq_fifo_pop(zs_rq **head, zs_rq **tail);
/* Takes r out of the queue; 0 if it was not on it. */
int zs_rq_fifo_remove(zs_rq **head, zs_rq **tail, zs_rq *r);

/* Little-endian fields of wire headers (frame.c, the handshake, rdma.c's messages). */
static inline void zs_le_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void zs_le_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void zs_le_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t zs_le_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t zs_le_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t zs_le_get64(const uint8_t *p)
{
    return (uint64_t)zs_le_get32(p) | (uint64_t)zs_le_get32(p + 4) << 32;
}

/* CLOCK_MONOTONIC in milliseconds. */
int64_t zs_net_now_ms(void);
/* The deadline of a timeout: -1 (none) for a negative timeout. */
int64_t zs_net_deadline(int timeout_ms);
/* Milliseconds left until deadline, for poll(2)-like calls: -1 for none, 0 when passed. */
int zs_net_remaining_ms(int64_t deadline);

/* Copies src (NULL: "") into dst[cap], cut short if needed and always terminated. */
void zs_net_copy_str(char *dst, size_t cap, const char *src);
/* snprintf for messages, where cutting a long one short is the right outcome. */
void zs_net_fmt(char *dst, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));

#endif
