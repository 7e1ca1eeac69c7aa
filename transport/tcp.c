/*
 * tcp: the TCP backend of the transport (interface in transport.h, choices in tcp.h).
 *
 * One zs_net is one epoll instance.  Listening sockets are registered level-triggered; data
 * sockets edge-triggered for EPOLLIN | EPOLLOUT | EPOLLRDHUP once, at creation.  Because the
 * registration is edge-triggered, each socket remembers whether it may still be readable
 * (rd_ready) or writable (wr_ready): an epoll event sets the flag, EAGAIN (or a short read)
 * clears it.  A socket that stopped for a reason of its own -- its turn's byte budget ran
 * out, or the caller just supplied a destination for a payload waiting in the kernel -- is
 * put on the net's dirty list, and the next turn of the loop resumes it without an event.
 *
 * Each socket runs two small state machines:
 *   receive: RS_HDR (64 header bytes into s->hdr) -> decode -> one of
 *            RS_BODY    payload straight into the destination of an irecv/recv_payload,
 *            RS_SKIP    payload into the scratch buffer (discard, oversized, cancelled),
 *            RS_PENDING header reported (ZS_EV_HEADER), waiting for the caller's decision,
 *            RS_PARKED  a header is already pending on another socket of the connection;
 *                       this one is reported when that one is resolved,
 *            and back to RS_HDR when the payload is complete.
 *   send:    a FIFO of requests; each turn writes as many of them as one sendmsg() takes,
 *            header and payload as separate iovecs, s->sq_off bytes into the head.
 * A connection fails as a whole (all its sockets) on the first error; conn_fail() completes
 * every request on it with the reason before it queues ZS_EV_CLOSED.
 *
 * One-sided operations (transport.h, iread/iwrite) are frames too (frame.h, ZS_OP_RMA_*): the
 * initiator expects the reply by an id of its own range (from ZS_RMA_ID_BASE) and sends the
 * request; the target's net serves it in sock_on_header, before any caller sees it, from its
 * region table: an RMA_DATA reply straight from the region, or the payload read straight into
 * it and an RMA_ACK after it.  The target replies only after it has taken in the whole
 * request, refusals included, so a write's reply always comes after the initiator's send of
 * its payload completed and the initiator's buffer is free when the operation completes.
 *
 * Requests come from a free list refilled in slabs of 64, so the hot path does not malloc
 * (except isend_inline's copy).  Events wait in a ring buffer until poll() hands them out;
 * conn_close() turns events that name the closed connection into tombstones.
 */
#include "transport/tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "transport/core.h"

#define TCP_HDR ZS_FRAME_HEADER_BYTES
/* Bytes one socket moves in one direction per turn of the loop before the others get theirs;
 * large enough that a 4 MiB payload does not stop midway, small enough to stay fair. */
#define TCP_TURN_BUDGET ((uint64_t)16 << 20)
/* A recv() is capped at this many bytes (Linux caps reads near 2 GiB anyway). */
#define TCP_RECV_MAX ((size_t)1 << 30)
/* Frames one socket takes in per turn, for the same reason. */
#define TCP_TURN_FRAMES 64
/* With this many events queued the net stops taking in new frames (TCP's flow control then
 * slows the peers down) until poll() has handed out all but TCP_EVQ_LOW of them. */
#define TCP_EVQ_HIGH 4096
#define TCP_EVQ_LOW 1024
#define TCP_IOV_MAX 64
#define TCP_SCRATCH_BYTES ((size_t)64 << 10)
/* Bytes read and dropped before closing a connection that sent a bad frame. */
#define TCP_DRAIN_BYTES ((size_t)256 << 10)
#define TCP_EPOLL_BATCH 64
#define TCP_ACCEPT_BATCH 64
#define TCP_BACKLOG 1024
#define TCP_PEER_MAX 80
/* Replies to a peer's one-sided operations one connection may have queued; beyond, the net
 * reads no further frame from that connection until some are written, so a peer that asks and
 * never reads holds this many requests here, not an unbounded queue. */
#define TCP_RMA_MAX_OUT 64

/* SO_SNDBUF of a stream whose peer is on this host, unless ZS_TCP_SNDBUF or the options say
 * otherwise: with autotuning the kernel lets a sender run up to 4 MiB (tcp_wmem) ahead, the
 * bytes it copied into socket buffers are out of the cache by the time the reader copies them
 * out, and 4 MiB fetches over loopback ran at 2.2 GB/s; with 512 KiB they ran at 3.3-3.6
 * (bench_data_plane, docs/transport.md).  Between hosts autotuning stays: a fixed buffer would
 * cap a stream at buffer / RTT. */
#define TCP_LOCAL_SNDBUF (512 << 10)

/* Defaults of the tunables (tcp.h). */
#define TCP_DEFAULT_CONNS 1
#define TCP_DEFAULT_CONNECT_TIMEOUT_MS 10000
#define TCP_DEFAULT_HANDSHAKE_MS 5000

/*
 * The handshake of an authenticated stream (transport.h), little-endian:
 *   client -> server  HELLO      "ZSA1", version u16 (1), flags u16 (0), member u32, 0 u32,
 *                                client nonce [32]                                   48 bytes
 *   server -> client  CHALLENGE  "ZSA1", status u32, server nonce [32], server proof [32]  72
 *   client -> server  PROOF      client proof [32]                                       32
 *   server -> client  RESULT     "ZSA1", status u32                                       8
 * The proofs are zs_token_proof("server" / "client") over both nonces and the member id.  A
 * status other than 0 ends the exchange (the rest of that message is zeros).
 */
#define HS_MAGIC 0x3141535au /* "ZSA1" read as little-endian u32 */
#define HS_VERSION 1
#define HS_HELLO 48
#define HS_CHALLENGE 72
#define HS_PROOF 32
#define HS_RESULT 8
enum { HS_OK = 0, HS_UNKNOWN_MEMBER = 1, HS_BAD_HELLO = 2, HS_BAD_PROOF = 3, HS_NOT_READY = 4 };
/* A client told HS_NOT_READY tries again this much later (within its connect timeout). */
#define HS_RETRY_MS 20
/* Handshakes one net runs at once; a stream accepted beyond them is closed at once, so a
 * flood of silent streams holds at most this many descriptors, each for the handshake
 * timeout. */
#define TCP_MAX_HANDSHAKES 64
/* A listener that cannot accept for want of descriptors or memory rests this long. */
#define TCP_ACCEPT_BACKOFF_MS 100

enum { K_LISTENER = 1, K_SOCK = 2, K_HS = 3 };
enum { HS_READ_HELLO, HS_WRITE_CHALLENGE, HS_READ_PROOF, HS_WRITE_RESULT, HS_WRITE_REFUSAL };
enum { RS_HDR, RS_BODY, RS_SKIP, RS_PENDING, RS_PARKED };

typedef struct tcp_net tcp_net;
typedef struct tcp_conn tcp_conn;
typedef struct tcp_sock tcp_sock;
/* Requests and regions are core's (core.h): a request on a socket's send queue or being read
 * from one has that socket in r->at (ZS_RQ_QUEUED, ZS_RQ_ACTIVE). */
typedef zs_rq tcp_req;
typedef zs_region tcp_mr;
typedef struct tcp_listener tcp_listener;
typedef struct tcp_hs tcp_hs;

struct tcp_sock {
    int kind; /* K_SOCK: first, so that an epoll pointer tells listener from socket */
    int fd;   /* -1 once the connection failed */
    tcp_conn *conn;
    int index; /* in conn->sock */
    int rd_ready, wr_ready;
    int hup; /* epoll reported the peer's end (or an error): read on until recv says so */
    int dirty;
    tcp_sock *dirty_next;
    int throttled; /* waits on the net's throttle list for the event queue to drain */
    tcp_sock *throttle_next;
    /* receive */
    int rstate;
    uint8_t hdr[TCP_HDR];
    size_t hdr_got;
    zs_frame frame; /* the header of the frame being received */
    tcp_req *rreq;  /* RS_BODY, RS_SKIP: the request being completed, or NULL */
    uint8_t *rdst;  /* RS_BODY: where the next payload byte goes */
    uint64_t rleft; /* payload bytes still to read */
    uint64_t rgot;  /* payload bytes read */
    /* send */
    tcp_req *sq_head, *sq_tail;
    uint64_t sq_off;   /* bytes of sq_head already written */
    uint64_t sq_bytes; /* bytes on the queue not yet written */
};

struct tcp_conn {
    tcp_net *net;
    char peer[TCP_PEER_MAX];
    int nsock;
    int rr; /* the next socket in round-robin order */
    tcp_sock *sock[ZS_NET_MAX_CONNS];
    int closed;
    char reason[ZS_NET_REASON_MAX]; /* why it closed */
    uint32_t member;                /* the member id proved in the handshake (0: none) */
    tcp_sock *pending; /* the socket whose reported header awaits recv_payload/discard */
    tcp_req *expect;   /* posted irecvs, a doubly linked list */
    int rma_out;       /* replies to the peer's one-sided operations not yet written */
    int rma_blocked;   /* reading stopped at TCP_RMA_MAX_OUT: resume when they drain */
    void *user;
    tcp_conn *prev, *next;
};

struct tcp_listener {
    int kind; /* K_LISTENER */
    int fd;
    tcp_net *net;
    int port;
    char addr[TCP_PEER_MAX];
    int has_auth; /* accepted streams must pass the handshake with auth */
    zs_auth auth;
    int handshake_ms;  /* how long one may take */
    int sndbuf;        /* the resolved send-buffer option (0: tune_sndbuf decides) */
    int64_t resume_at; /* > 0: accepting rests (out of descriptors) until then */
    zs_log_limit accept_log;
    tcp_listener *prev, *next;
};

/* An accepted stream in its handshake (server side), before it becomes a connection. */
struct tcp_hs {
    int kind; /* K_HS */
    int fd;
    tcp_listener *l;
    char peer[TCP_PEER_MAX];
    int state;
    uint8_t in[HS_HELLO]; /* the message being read */
    size_t got;
    uint8_t out[HS_CHALLENGE]; /* the message being written */
    size_t out_len, out_off;
    uint32_t member;
    uint8_t token[ZS_TOKEN_BYTES];
    uint8_t nonce_c[ZS_NONCE_BYTES], nonce_s[ZS_NONCE_BYTES];
    char why[ZS_NET_REASON_MAX]; /* HS_WRITE_REFUSAL: the reason reported once it is out */
    int64_t deadline;
    tcp_hs *prev, *next;
};

struct tcp_net {
    int epfd;
    zs_evq evq;
    tcp_sock *dirty_head, *dirty_tail;
    tcp_sock *throttle_head;
    tcp_conn *conns;
    tcp_listener *listeners;
    tcp_hs *handshakes; /* accepted streams in their handshake */
    int n_handshakes;
    zs_region *mrs;
    zs_rq_pool reqs;
    uint8_t *scratch;     /* TCP_SCRATCH_BYTES */
    int batch_sends;      /* zs_net_opts.batch_sends resolved: sends wait for the next turn */
    int poll_skipped;     /* the last poll() handed out queued events without a turn of I/O */
    uint64_t rma_next_id; /* the next one-sided operation's id, above ZS_RMA_ID_BASE */
};

static int hs_unlink(tcp_hs *hs);
static void hs_progress(tcp_hs *hs);
static int run_timers(tcp_net *n);

/* ---------------------------------------------------------------------------------------- */
/* helpers */

static void format_sockaddr(const struct sockaddr *sa, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        zs_net_fmt(out, cap, "%s:%u", host, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        zs_net_fmt(out, cap, "[%s]:%u", host, ntohs(in6->sin6_port));
    } else {
        zs_net_fmt(out, cap, "%s", sa->sa_family == AF_UNIX ? "unix" : "?");
    }
}

/* Splits "HOST:PORT" (HOST may be "[v6]") into host and port; port in [min_port, 65535]. */
static zs_err parse_addr(const char *what, const char *addr, char *host, size_t hcap, char *port,
                         size_t pcap, int min_port)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon)
        return zs_error(ZS_ERR_INVALID, "tcp %s \"%s\": expected HOST:PORT", what,
                        addr ? addr : "(null)");
    size_t hl = (size_t)(colon - addr);
    const char *h = addr;
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    const char *p = colon + 1;
    size_t pl = strlen(p);
    int ok = pl > 0 && pl <= 5;
    long pv = 0;
    for (size_t i = 0; ok && i < pl; i++) {
        if (p[i] < '0' || p[i] > '9')
            ok = 0;
        else
            pv = pv * 10 + (p[i] - '0');
    }
    if (!ok || pv < min_port || pv > 65535)
        return zs_error(ZS_ERR_INVALID, "tcp %s \"%s\": port \"%s\" is not a number in %d..65535",
                        what, addr, p, min_port);
    if (hl >= hcap)
        return zs_error(ZS_ERR_INVALID, "tcp %s \"%s\": host name too long", what, addr);
    memcpy(host, h, hl);
    host[hl] = '\0';
    zs_net_fmt(port, pcap, "%ld", pv);
    return ZS_OK;
}

/* An integer tunable: the option if non-zero, else environment variable env, else dflt. */
static zs_err tunable(int opt, const char *env, int dflt, int lo, int hi, int *out)
{
    if (opt != 0) {
        *out = opt;
    } else {
        const char *s = getenv(env);
        if (!s || !*s) {
            *out = dflt;
            return ZS_OK;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || *end || v < lo || v > hi)
            return zs_error(ZS_ERR_INVALID, "tcp: %s=\"%s\" is not an integer in %d..%d", env, s,
                            lo, hi);
        *out = (int)v;
        return ZS_OK;
    }
    if (*out < lo || *out > hi)
        return zs_error(ZS_ERR_INVALID, "tcp: option for %s is %d, not in %d..%d", env, *out, lo,
                        hi);
    return ZS_OK;
}

typedef struct {
    int conns, sndbuf, rcvbuf, timeout_ms;
    int handshake_ms; /* listen: how long an accepted stream's handshake may take */
} tcp_opts;

static zs_err resolve_opts(const zs_conn_opts *o, tcp_opts *t)
{
    zs_conn_opts z = {0};
    if (!o)
        o = &z;
    ZS_CHECK(tunable(o->conns, "ZS_TCP_CONNS", TCP_DEFAULT_CONNS, 1, ZS_NET_MAX_CONNS, &t->conns));
    zs_tcp_conn_opts own = {0};
    if (o->backend && o->backend_name && strcmp(o->backend_name, "tcp") == 0)
        own = *(const zs_tcp_conn_opts *)o->backend;
    ZS_CHECK(tunable(own.sndbuf_bytes, "ZS_TCP_SNDBUF", 0, -1, INT_MAX, &t->sndbuf));
    ZS_CHECK(tunable(own.rcvbuf_bytes, "ZS_TCP_RCVBUF", 0, -1, INT_MAX, &t->rcvbuf));
    ZS_CHECK(tunable(o->connect_timeout_ms, "ZS_TCP_CONNECT_TIMEOUT_MS",
                     TCP_DEFAULT_CONNECT_TIMEOUT_MS, 1, INT_MAX, &t->timeout_ms));
    ZS_CHECK(
        tunable(0, "ZS_TCP_HANDSHAKE_MS", TCP_DEFAULT_HANDSHAKE_MS, 1, INT_MAX, &t->handshake_ms));
    return ZS_OK;
}

/* Socket buffer sizes (when asked for: > 0), set before connect/listen. */
static zs_err set_bufs(int fd, const tcp_opts *t, const char *addr)
{
    if (t->sndbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &t->sndbuf, sizeof t->sndbuf))
        return zs_error(ZS_ERR_IO, "tcp %s: setsockopt SO_SNDBUF %d: %s", addr, t->sndbuf,
                        strerror(errno));
    if (t->rcvbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &t->rcvbuf, sizeof t->rcvbuf))
        return zs_error(ZS_ERR_IO, "tcp %s: setsockopt SO_RCVBUF %d: %s", addr, t->rcvbuf,
                        strerror(errno));
    return ZS_OK;
}

/* 1 when fd's peer is on this host: a loopback address, or the socket's own address. */
static int peer_is_local(int fd)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) || me.ss_family != peer.ss_family)
        return 0;
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)&me, *b = (const void *)&peer;
        return (ntohl(b->sin_addr.s_addr) >> 24) == 127 || a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)&me, *b = (const void *)&peer;
        return IN6_IS_ADDR_LOOPBACK(&b->sin6_addr) ||
               (IN6_IS_ADDR_V4MAPPED(&b->sin6_addr) && b->sin6_addr.s6_addr[12] == 127) ||
               !memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr);
    }
    return 0;
}

/* A connected stream's send buffer when nothing was asked for (sndbuf 0): TCP_LOCAL_SNDBUF for
 * a peer on this host, autotuning otherwise.  Best effort: a failure leaves autotuning. */
static void tune_sndbuf(int fd, int sndbuf)
{
    int v = TCP_LOCAL_SNDBUF;
    if (sndbuf == 0 && peer_is_local(fd))
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
}

static void set_nodelay(int fd)
{
    int one = 1;
    /* Fails harmlessly on a non-TCP stream (an AF_UNIX socketpair in tests). */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---------------------------------------------------------------------------------------- */
/* events */

static zs_event *evq_push(tcp_net *n, zs_ev_type type, tcp_conn *c)
{
    return zs_evq_push(&n->evq, type, (zs_conn *)c, "tcp");
}

/* ---------------------------------------------------------------------------------------- */
/* requests */

/* ---------------------------------------------------------------------------------------- */
/* connections */

static void sock_mark_dirty(tcp_sock *s)
{
    tcp_net *n = s->conn->net;
    if (s->dirty)
        return;
    s->dirty = 1;
    s->dirty_next = NULL;
    if (n->dirty_tail)
        n->dirty_tail->dirty_next = s;
    else
        n->dirty_head = s;
    n->dirty_tail = s;
}

static void sock_unmark_dirty(tcp_sock *s)
{
    tcp_net *n = s->conn->net;
    if (!s->dirty)
        return;
    tcp_sock *prev = NULL;
    for (tcp_sock *x = n->dirty_head; x; prev = x, x = x->dirty_next) {
        if (x != s)
            continue;
        if (prev)
            prev->dirty_next = x->dirty_next;
        else
            n->dirty_head = x->dirty_next;
        if (n->dirty_tail == x)
            n->dirty_tail = prev;
        break;
    }
    s->dirty = 0;
    s->dirty_next = NULL;
}

static void sock_throttle(tcp_sock *s)
{
    tcp_net *n = s->conn->net;
    if (s->throttled)
        return;
    s->throttled = 1;
    s->throttle_next = n->throttle_head;
    n->throttle_head = s;
}

static void sock_unthrottle(tcp_sock *s)
{
    tcp_net *n = s->conn->net;
    if (!s->throttled)
        return;
    for (tcp_sock **pp = &n->throttle_head; *pp; pp = &(*pp)->throttle_next)
        if (*pp == s) {
            *pp = s->throttle_next;
            break;
        }
    s->throttled = 0;
    s->throttle_next = NULL;
}

/* Fails the connection: closes its sockets, completes every request on it (failed) and,
 * when notify, queues ZS_EV_CLOSED.  The structure stays until conn_close(). */
static void conn_fail(tcp_conn *c, zs_err err, int notify, const char *why, ...)
    __attribute__((format(printf, 4, 5)));
static void conn_fail(tcp_conn *c, zs_err err, int notify, const char *why, ...)
{
    if (c->closed)
        return;
    c->closed = 1;
    char what[ZS_NET_REASON_MAX];
    va_list ap;
    va_start(ap, why);
    vsnprintf(what, sizeof what, why, ap);
    va_end(ap);
    zs_net_fmt(c->reason, sizeof c->reason, "tcp %s: %s", c->peer, what);
    for (int i = 0; i < c->nsock; i++) {
        tcp_sock *s = c->sock[i];
        if (s->fd >= 0) {
            /* Explicitly: close() alone leaves the registration if a forked child still
             * holds the socket, and epoll would then report a freed pointer. */
            epoll_ctl(c->net->epfd, EPOLL_CTL_DEL, s->fd, NULL);
            close(s->fd);
            s->fd = -1;
        }
        s->rd_ready = s->wr_ready = 0;
        while (s->sq_head) {
            tcp_req *r = s->sq_head;
            s->sq_head = r->next;
            zs_rq_fail_conn(r, c->reason);
        }
        s->sq_tail = NULL;
        s->sq_off = s->sq_bytes = 0;
        if (s->rreq) {
            tcp_req *r = s->rreq;
            s->rreq = NULL;
            zs_rq_fail_conn(r, c->reason);
        }
        s->rstate = RS_HDR;
    }
    while (c->expect) {
        tcp_req *r = c->expect;
        zs_rq_list_del(&c->expect, r);
        zs_rq_fail_conn(r, c->reason);
    }
    c->pending = NULL;
    if (notify) {
        zs_event *e = evq_push(c->net, ZS_EV_CLOSED, c);
        if (e) {
            e->err = err;
            zs_net_copy_str(e->reason, sizeof e->reason, c->reason);
        }
    }
}

/* A connection of the connected stream sockets fds[0..nfd); the fds are the caller's again if
 * this fails. */
static zs_err conn_new(tcp_net *n, const int *fds, int nfd, const char *peer, tcp_conn **out)
{
    zs_err res = ZS_OK;
    int added = 0;
    tcp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return zs_error(ZS_ERR_NOMEM, "tcp %s: out of memory for a connection", peer);
    c->net = n;
    zs_net_copy_str(c->peer, sizeof c->peer, peer);
    for (c->nsock = 0; c->nsock < nfd; c->nsock++) {
        tcp_sock *s = calloc(1, sizeof *s);
        if (!s) {
            res = zs_error(ZS_ERR_NOMEM, "tcp %s: out of memory for a socket", peer);
            goto fail;
        }
        s->kind = K_SOCK;
        s->fd = fds[c->nsock];
        s->conn = c;
        s->index = c->nsock;
        s->wr_ready = 1;
        s->rstate = RS_HDR;
        c->sock[c->nsock] = s;
    }
    for (; added < nfd; added++) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                 .data.ptr = c->sock[added]};
        if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, fds[added], &ev)) {
            res = zs_error(ZS_ERR_IO, "tcp %s: epoll_ctl add: %s", peer, strerror(errno));
            goto fail;
        }
    }
    c->next = n->conns;
    if (n->conns)
        n->conns->prev = c;
    n->conns = c;
    *out = c;
    return ZS_OK;
fail:
    for (int i = 0; i < added; i++)
        epoll_ctl(n->epfd, EPOLL_CTL_DEL, fds[i], NULL);
    for (int i = 0; i < c->nsock; i++)
        free(c->sock[i]);
    free(c);
    return res;
}

/* The socket of c a new frame goes on: the fewest unsent bytes, ties round-robin. */
static tcp_sock *conn_pick(tcp_conn *c)
{
    if (c->nsock == 1)
        return c->sock[0];
    int best = c->rr;
    for (int k = 1; k < c->nsock; k++) {
        int i = (c->rr + k) % c->nsock;
        if (c->sock[i]->sq_bytes < c->sock[best]->sq_bytes)
            best = i;
    }
    c->rr = (best + 1) % c->nsock;
    return c->sock[best];
}

/* ---------------------------------------------------------------------------------------- */
/* sending */

static void rma_reply_written(tcp_conn *c);

static void sock_write(tcp_sock *s)
{
    tcp_conn *c = s->conn;
    uint64_t budget = TCP_TURN_BUDGET;
    while (s->wr_ready && s->sq_head && !c->closed) {
        struct iovec iov[TCP_IOV_MAX];
        int niov = 0;
        uint64_t skip = s->sq_off;
        for (tcp_req *r = s->sq_head; r && niov + 2 <= TCP_IOV_MAX; r = r->next) {
            if (skip < TCP_HDR) {
                iov[niov++] = (struct iovec){r->hdr + skip, TCP_HDR - skip};
                if (r->len)
                    iov[niov++] = (struct iovec){r->buf, r->len};
            } else {
                iov[niov++] = (struct iovec){r->buf + (skip - TCP_HDR), r->len - (skip - TCP_HDR)};
            }
            skip = 0;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t w = sendmsg(s->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                s->wr_ready = 0;
                break;
            }
            conn_fail(c, ZS_ERR_IO, 1, "send: %s", strerror(errno));
            return;
        }
        uint64_t adv = (uint64_t)w;
        s->sq_bytes -= adv;
        while (s->sq_head) {
            tcp_req *r = s->sq_head;
            uint64_t rest = TCP_HDR + r->len - s->sq_off;
            if (adv < rest) {
                s->sq_off += adv;
                break;
            }
            adv -= rest;
            s->sq_off = 0;
            s->sq_head = r->next;
            if (!s->sq_head)
                s->sq_tail = NULL;
            if (r->rma == ZS_RMA_SERVE)
                rma_reply_written(c);
            zs_rq_finish(r, ZS_OK, NULL);
        }
        if ((uint64_t)w >= budget) {
            if (s->sq_head)
                sock_mark_dirty(s);
            break;
        }
        budget -= (uint64_t)w;
    }
}

/* Queues r on a socket of c and writes right away if the socket can take it, or, when the
 * net batches sends, leaves it for the next turn. */
static void send_enqueue(tcp_conn *c, tcp_req *r)
{
    tcp_sock *s = conn_pick(c);
    r->at = s;
    r->state = ZS_RQ_QUEUED;
    r->next = NULL;
    if (s->sq_tail)
        s->sq_tail->next = r;
    else
        s->sq_head = r;
    s->sq_tail = r;
    s->sq_bytes += TCP_HDR + r->len;
    if (!s->wr_ready)
        return; /* the out edge resumes it */
    if (c->net->batch_sends)
        sock_mark_dirty(s);
    else
        sock_write(s);
}

/* ---------------------------------------------------------------------------------------- */
/* receiving */

static void ev_header(tcp_conn *c, const zs_frame *f)
{
    zs_event *e = evq_push(c->net, ZS_EV_HEADER, c);
    if (e)
        e->frame = *f;
}

/* Starts reading s's payload into dst (NULL: into the scratch buffer) for r (may be NULL). */
static void sock_start_body(tcp_sock *s, uint8_t *dst, tcp_req *r)
{
    s->rstate = dst ? RS_BODY : RS_SKIP;
    s->rdst = dst;
    s->rreq = r;
    s->rleft = s->frame.length;
    s->rgot = 0;
    if (r) {
        r->state = ZS_RQ_ACTIVE;
        r->at = s;
    }
}

/* The pending header of c was resolved: report a parked one, if any, starting after s. */
static void promote_parked(tcp_conn *c, tcp_sock *s)
{
    for (int k = 1; k <= c->nsock; k++) {
        tcp_sock *x = c->sock[(s->index + k) % c->nsock];
        if (x->rstate == RS_PARKED) {
            x->rstate = RS_PENDING;
            c->pending = x;
            ev_header(c, &x->frame);
            return;
        }
    }
}

/* A header that did not decode: tell the peer, drop the connection. */
static void reject_bad_frame(tcp_sock *s, const char *why)
{
    tcp_conn *c = s->conn;
    char text[ZS_NET_REASON_MAX];
    zs_net_copy_str(text, sizeof text, why);
    /* Only at a frame boundary of our own sending: an error frame in the middle of a reply
     * would garble it. */
    if (s->sq_off == 0) {
        zs_frame e = {.op = ZS_OP_ERROR,
                      .dtype = ZS_DTYPE_TEXT,
                      .status = ZS_FS_BAD_FRAME,
                      .id = zs_le_get64(s->hdr + 16),
                      .length = strlen(text)};
        uint8_t hdr[TCP_HDR];
        zs_frame_encode(&e, hdr);
        struct iovec iov[2] = {{hdr, TCP_HDR}, {text, e.length}};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
        (void)sendmsg(s->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    /* Closing with unread bytes makes the kernel send a reset, which may destroy the error
     * frame before the peer reads it; read a bounded amount of what is already here. */
    size_t drained = 0;
    while (drained < TCP_DRAIN_BYTES) {
        ssize_t k = recv(s->fd, c->net->scratch, TCP_SCRATCH_BYTES, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        drained += (size_t)k;
    }
    ZS_DEBUG("tcp %s: %s; closing the connection", c->peer, text);
    conn_fail(c, ZS_ERR_FORMAT, 1, "%s", text);
}

/* ---- one-sided operations, the target's side ---- */

static void rma_written(tcp_conn *c, tcp_req *r, int ok);

/* Queues a reply to the peer's one-sided operation f: the frame `op` with the same id, key,
 * address and bytes, carrying m's bytes at off when m is given (RMA_DATA), or a refusal
 * (ZS_OP_ERROR, ZS_FS_BAD_KEY) with the reason why as its text. */
static void rma_send_reply(tcp_conn *c, const zs_frame *f, int op, zs_region *m, size_t off,
                           const char *why)
{
    tcp_net *n = c->net;
    size_t wl = op == ZS_OP_ERROR ? strlen(why) : 0;
    zs_frame rf = zs_rma_answer(f, op, wl);
    tcp_req *r = zs_rq_new(&n->reqs, n, ZS_RQ_SEND, c, NULL, 0);
    uint8_t *text = wl ? malloc(wl) : NULL;
    if (!r || (wl && !text)) {
        free(text);
        if (r)
            zs_rq_release(r);
        conn_fail(c, ZS_ERR_NOMEM, 1, "out of memory answering a one-sided %s",
                  zs_frame_op_name(f->op));
        return;
    }
    r->silent = 1; /* nobody waits for it here */
    r->rma = ZS_RMA_SERVE;
    r->frame = rf;
    r->frame.version = ZS_FRAME_VERSION;
    zs_frame_encode(&rf, r->hdr);
    r->len = rf.length;
    if (m) {
        zs_rq_use(r, m, off);
    } else if (wl) {
        memcpy(text, why, wl);
        r->inline_buf = r->buf = text;
    }
    c->rma_out++;
    send_enqueue(c, r);
}

/* A reply to the peer's one-sided operation was written: a net that stopped reading at
 * TCP_RMA_MAX_OUT resumes. */
static void rma_reply_written(tcp_conn *c)
{
    c->rma_out--;
    if (c->rma_blocked && c->rma_out < TCP_RMA_MAX_OUT) {
        c->rma_blocked = 0;
        for (int i = 0; i < c->nsock; i++)
            sock_mark_dirty(c->sock[i]);
    }
}

/* The peer's RMA_READ or RMA_WRITE f arrived on s: checked against this net's regions and
 * served without the caller.  A refused write's payload is skipped first, so that even a
 * refusal follows the whole request. */
static void rma_serve(tcp_sock *s, const zs_frame *f)
{
    tcp_conn *c = s->conn;
    tcp_net *n = c->net;
    int write = f->op == ZS_OP_RMA_WRITE;
    char why[ZS_NET_REASON_MAX];
    zs_region *m =
        zs_region_lookup(n->mrs, f->step, f->offset, f->count,
                         write ? ZS_MR_REMOTE_WRITE : ZS_MR_REMOTE_READ, why, sizeof why);
    size_t off = m ? (size_t)(f->offset - (uint64_t)(uintptr_t)m->base) : 0;
    if (!write) {
        if (m)
            rma_send_reply(c, f, ZS_OP_RMA_DATA, m, off, NULL);
        else
            rma_send_reply(c, f, ZS_OP_ERROR, NULL, 0, why);
        return;
    }
    tcp_req *r = zs_rq_new(&n->reqs, n, ZS_RQ_RECV, c, NULL, 0);
    if (!r) {
        conn_fail(c, ZS_ERR_NOMEM, 1, "out of memory serving a one-sided write");
        return;
    }
    r->silent = 1;
    r->rma = ZS_RMA_SERVE;
    r->frame = *f;
    r->len = f->length;
    if (!m) {
        r->status = ZS_ERR_INVALID;
        zs_net_copy_str(r->err, sizeof r->err, why);
    } else if (f->length) {
        zs_rq_use(r, m, off);
    }
    if (f->length == 0) {
        rma_written(c, r, m != NULL);
        return;
    }
    sock_start_body(s, m ? r->buf : NULL, r);
}

/* The payload of the peer's RMA_WRITE r is in its region (ok) or was skipped (refused, or the
 * stream failed): acknowledge or refuse, and report a notifying write. */
static void rma_written(tcp_conn *c, tcp_req *r, int ok)
{
    zs_frame f = r->frame;
    char why[ZS_NET_REASON_MAX];
    zs_net_copy_str(why, sizeof why, r->status != ZS_OK ? r->err : "");
    ok = ok && r->status == ZS_OK;
    zs_rq_finish(r, ZS_OK, NULL); /* silent: released */
    if (c->closed)
        return;
    if (!ok) {
        rma_send_reply(c, &f, ZS_OP_ERROR, NULL, 0, why);
        return;
    }
    rma_send_reply(c, &f, ZS_OP_RMA_ACK, NULL, 0, NULL);
    if (f.flags & ZS_FRAME_FLAG_NOTIFY) {
        zs_event *e = evq_push(c->net, ZS_EV_WRITTEN, c);
        if (e)
            e->frame = f;
    }
}

/* ---- one-sided operations, the initiator's side ---- */

static zs_err check_open(const tcp_conn *c, const char *what);

/* The reply f to our one-sided operation r arrived on s (r is off the expect list). */
static void rma_reply(tcp_sock *s, tcp_req *r, const zs_frame *f)
{
    zs_err e = zs_rma_check_answer("tcp", s->conn->peer, r, f, r->err, sizeof r->err);
    if (e == ZS_ERR_INVALID) { /* refused */
        r->status = e;
        if (f->length) {
            sock_start_body(s, NULL, r); /* the text is skipped; the request fails after it */
            return;
        }
        zs_rq_finish(r, e, r->err);
        return;
    }
    if (e != ZS_OK) {
        char why[ZS_NET_REASON_MAX];
        zs_net_copy_str(why, sizeof why, r->err);
        zs_rq_finish(r, e, why);
        reject_bad_frame(s, why);
        return;
    }
    if (f->length == 0)
        zs_rq_finish(r, ZS_OK, NULL);
    else
        sock_start_body(s, r->buf, r);
}

/* iread (write 0) and iwrite: the reply expected under a fresh id of the backend's range,
 * then the request sent (a request of the net's own, without an outcome of its own). */
static zs_err rma_start(zs_conn *cc, int write, zs_mr *mm, size_t off, const zs_mr_desc *rd,
                        uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                        zs_req **out)
{
    tcp_conn *c = (tcp_conn *)cc;
    tcp_net *n = c->net;
    tcp_mr *m = (tcp_mr *)mm;
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, write ? "iwrite" : "iread"));
    tcp_req *sr = zs_rq_new(&n->reqs, n, ZS_RQ_SEND, c, NULL, 0);
    if (!sr)
        return zs_error(ZS_ERR_NOMEM, "tcp %s: out of memory", c->peer);
    tcp_req *r;
    zs_err e = zs_rma_expect(&n->reqs, n, c, c->peer, &c->expect, &n->rma_next_id, write, m, off,
                             rd, remote_off, len, notify, imm, user, out != NULL, &r);
    if (e != ZS_OK) {
        zs_rq_release(sr);
        return e;
    }
    sr->silent = 1;
    sr->frame = r->frame;
    zs_frame_encode(&sr->frame, sr->hdr);
    sr->len = r->frame.length;
    if (write)
        zs_rq_use(sr, m, off);
    if (out)
        *out = (zs_req *)r;
    send_enqueue(c, sr);
    return ZS_OK;
}

zs_err zs_tcp_iread(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                    uint64_t remote_off, size_t len, void *user, zs_req **req)
{
    return rma_start(c, 0, mr, off, remote, remote_off, len, 0, 0, user, req);
}

zs_err zs_tcp_iwrite(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                     uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                     zs_req **req)
{
    return rma_start(c, 1, mr, off, remote, remote_off, len, notify, imm, user, req);
}

zs_err zs_tcp_mr_export(zs_mr *mr, zs_mr_desc *out)
{
    return zs_region_export("tcp", (const zs_region *)mr, out);
}

/* The 64 header bytes of s are in: decode, and decide where the payload goes. */
static void sock_on_header(tcp_sock *s)
{
    tcp_conn *c = s->conn;
    zs_frame f;
    if (zs_frame_decode(s->hdr, &f) != ZS_OK) {
        reject_bad_frame(s, zs_last_error());
        return;
    }
    s->frame = f;
    if (f.op == ZS_OP_RMA_READ || f.op == ZS_OP_RMA_WRITE) {
        rma_serve(s, &f);
        return;
    }
    tcp_req *r = zs_rq_list_find(c->expect, f.id);
    if (r && r->rma) {
        zs_rq_list_del(&c->expect, r);
        rma_reply(s, r, &f);
        return;
    }
    if (!r && (f.op == ZS_OP_RMA_DATA || f.op == ZS_OP_RMA_ACK)) {
        char why[ZS_NET_REASON_MAX];
        zs_net_fmt(why, sizeof why, "%s id %llu answers no one-sided operation of ours",
                   zs_frame_op_name(f.op), (unsigned long long)f.id);
        reject_bad_frame(s, why);
        return;
    }
    if (r) {
        zs_rq_list_del(&c->expect, r);
        r->frame = f;
        if (f.length > r->len) {
            r->status = ZS_ERR_FORMAT;
            zs_net_fmt(r->err, sizeof r->err,
                       "receive of id %llu: tcp %s: %s payload of %llu bytes exceeds the %llu "
                       "bytes posted",
                       (unsigned long long)f.id, c->peer, zs_frame_op_name(f.op),
                       (unsigned long long)f.length, (unsigned long long)r->len);
            sock_start_body(s, NULL, r);
        } else if (f.length == 0) {
            zs_rq_finish(r, ZS_OK, NULL);
        } else {
            sock_start_body(s, r->buf, r);
        }
        return;
    }
    if (f.length == 0) {
        ev_header(c, &f);
        return;
    }
    if (c->pending) {
        s->rstate = RS_PARKED;
        return;
    }
    c->pending = s;
    s->rstate = RS_PENDING;
    ev_header(c, &f);
}

static void sock_on_body_done(tcp_sock *s)
{
    tcp_req *r = s->rreq;
    int was = s->rstate;
    s->rstate = RS_HDR;
    s->rreq = NULL;
    s->rdst = NULL;
    if (r && r->rma == ZS_RMA_SERVE) {
        rma_written(s->conn, r, was == RS_BODY);
        return;
    }
    if (r) {
        if (was == RS_BODY)
            zs_rq_finish(r, ZS_OK, NULL);
        else
            zs_rq_finish(r, r->status, r->err);
    }
}

static void sock_on_eof(tcp_sock *s)
{
    tcp_conn *c = s->conn;
    if (s->rstate == RS_HDR && s->hdr_got == 0)
        conn_fail(c, ZS_ERR_IO, 1, "closed by peer");
    else if (s->rstate == RS_HDR)
        conn_fail(c, ZS_ERR_IO, 1, "closed by peer mid-header (%zu of %d bytes)", s->hdr_got,
                  TCP_HDR);
    else
        conn_fail(c, ZS_ERR_IO, 1, "closed by peer mid-payload (%llu of %llu bytes of %s id %llu)",
                  (unsigned long long)s->rgot, (unsigned long long)s->frame.length,
                  zs_frame_op_name(s->frame.op), (unsigned long long)s->frame.id);
}

static void sock_read(tcp_sock *s)
{
    tcp_conn *c = s->conn;
    uint64_t budget = TCP_TURN_BUDGET;
    int frames = 0;
    while (s->rd_ready && !c->closed) {
        uint8_t *dst;
        size_t want;
        if (s->rstate == RS_HDR && s->hdr_got == 0) {
            if (c->net->evq.live >= TCP_EVQ_HIGH) {
                sock_throttle(s); /* poll() resumes it */
                return;
            }
            if (frames++ == TCP_TURN_FRAMES) {
                sock_mark_dirty(s);
                return;
            }
            if (c->rma_out >= TCP_RMA_MAX_OUT) {
                c->rma_blocked = 1; /* rma_reply_written() resumes it */
                return;
            }
        }
        if (s->rstate == RS_HDR) {
            dst = s->hdr + s->hdr_got;
            want = TCP_HDR - s->hdr_got;
        } else if (s->rstate == RS_BODY) {
            dst = s->rdst + s->rgot;
            want = s->rleft < TCP_RECV_MAX ? (size_t)s->rleft : TCP_RECV_MAX;
        } else if (s->rstate == RS_SKIP) {
            dst = c->net->scratch;
            want = s->rleft < TCP_SCRATCH_BYTES ? (size_t)s->rleft : TCP_SCRATCH_BYTES;
        } else {
            return; /* a header waits for the caller */
        }
        ssize_t k = recv(s->fd, dst, want, MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                s->rd_ready = 0;
                return;
            }
            conn_fail(c, ZS_ERR_IO, 1, "recv: %s", strerror(errno));
            return;
        }
        if (k == 0) {
            sock_on_eof(s);
            return;
        }
        /* A short read emptied the socket: the next byte to arrive raises a new edge.  Not
         * so for the end of the stream, which came with the edge already seen: then only a
         * recv() of 0 (or an error) ends the reading. */
        if ((size_t)k < want && !s->hup)
            s->rd_ready = 0;
        if (s->rstate == RS_HDR) {
            s->hdr_got += (size_t)k;
            if (s->hdr_got == TCP_HDR) {
                s->hdr_got = 0;
                sock_on_header(s);
            }
        } else {
            s->rgot += (uint64_t)k;
            s->rleft -= (uint64_t)k;
            if (s->rleft == 0)
                sock_on_body_done(s);
        }
        if ((uint64_t)k >= budget) {
            if (s->rd_ready)
                sock_mark_dirty(s);
            return;
        }
        budget -= (uint64_t)k;
    }
}

static void sock_progress(tcp_sock *s)
{
    if (s->conn->closed)
        return;
    if (s->wr_ready && s->sq_head)
        sock_write(s);
    if (!s->conn->closed && s->rd_ready)
        sock_read(s);
}

/* ---------------------------------------------------------------------------------------- */
/* the loop */

static void listener_accept(tcp_listener *l);

static void run_dirty(tcp_net *n)
{
    tcp_sock *s = n->dirty_head;
    n->dirty_head = n->dirty_tail = NULL;
    while (s) {
        tcp_sock *next = s->dirty_next;
        s->dirty = 0;
        s->dirty_next = NULL;
        sock_progress(s);
        s = next;
    }
}

/* One turn: resumes dirty sockets, then waits up to timeout_ms for epoll (not at all if
 * ready(arg) already holds or sockets are still dirty) and serves what it reports. */
static zs_err net_turn(tcp_net *n, int timeout_ms, int (*ready)(void *), void *arg)
{
    run_dirty(n);
    /* Timers first: a handshake they fail queues an event that must end this wait. */
    int timer = run_timers(n);
    if (n->dirty_head || (ready && ready(arg)))
        timeout_ms = 0;
    if (timer >= 0 && (timeout_ms < 0 || timer < timeout_ms))
        timeout_ms = timer;
    struct epoll_event evs[TCP_EPOLL_BATCH];
    int k = epoll_wait(n->epfd, evs, TCP_EPOLL_BATCH, timeout_ms);
    if (k < 0) {
        if (errno == EINTR)
            return ZS_OK;
        return zs_error(ZS_ERR_IO, "tcp: epoll_wait: %s", strerror(errno));
    }
    for (int i = 0; i < k; i++) {
        /* A handshake frees itself only while handling its own event (one per fd per batch)
         * or in run_timers, before the wait: no later entry points to a freed one. */
        int kind = *(int *)evs[i].data.ptr;
        if (kind == K_LISTENER) {
            listener_accept(evs[i].data.ptr);
            continue;
        }
        if (kind == K_HS) {
            hs_progress(evs[i].data.ptr);
            continue;
        }
        tcp_sock *s = evs[i].data.ptr;
        if (s->conn->closed)
            continue;
        uint32_t e = evs[i].events;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            s->rd_ready = 1;
        if (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            s->hup = 1;
        if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR))
            s->wr_ready = 1;
        sock_progress(s);
    }
    return ZS_OK;
}

/* Turns until ready(arg) or the deadline: the driver of core's test() and wait(). */
static zs_err net_run(void *nn, int64_t deadline, int (*ready)(void *), void *arg)
{
    for (;;) {
        int left = zs_net_remaining_ms(deadline);
        ZS_CHECK(net_turn(nn, left, ready, arg));
        if (ready(arg) || left == 0)
            return ZS_OK;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* the interface */

zs_err zs_tcp_set_opts(zs_net *nn, const zs_net_opts *opts)
{
    tcp_net *n = (tcp_net *)nn;
    int batch;
    ZS_CHECK(tunable(opts ? opts->batch_sends : 0, "ZS_TCP_BATCH_SENDS", 0, -1, 1, &batch));
    n->batch_sends = batch == 1;
    return ZS_OK;
}

zs_err zs_tcp_open(zs_net **out)
{
    int batch;
    ZS_CHECK(tunable(0, "ZS_TCP_BATCH_SENDS", 0, -1, 1, &batch));
    tcp_net *n = calloc(1, sizeof *n);
    if (!n)
        return zs_error(ZS_ERR_NOMEM, "tcp: out of memory for a net");
    n->batch_sends = batch == 1;
    n->reqs = (zs_rq_pool){.who = "tcp", .evq = &n->evq, .run = net_run};
    n->scratch = malloc(TCP_SCRATCH_BYTES);
    if (!n->scratch)
        goto fail_scratch;
    n->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (n->epfd < 0)
        goto fail_epoll;
    *out = (zs_net *)n;
    return ZS_OK;
fail_epoll:
    free(n->scratch);
    free(n);
    return zs_error(ZS_ERR_IO, "tcp: epoll_create1: %s", strerror(errno));
fail_scratch:
    free(n);
    return zs_error(ZS_ERR_NOMEM, "tcp: out of memory for a net");
}

void zs_tcp_close(zs_net *nn)
{
    tcp_net *n = (tcp_net *)nn;
    if (!n)
        return;
    while (n->conns)
        zs_tcp_conn_close((zs_conn *)n->conns);
    while (n->listeners)
        zs_tcp_listener_close((zs_listener *)n->listeners);
    while (n->mrs) {
        tcp_mr *m = n->mrs;
        n->mrs = m->next;
        free(m);
    }
    zs_rq_pool_free(&n->reqs);
    zs_evq_free(&n->evq);
    free(n->scratch);
    close(n->epfd);
    free(n);
}

zs_err zs_tcp_listen(zs_net *nn, const char *addr, const zs_conn_opts *opts, zs_listener **out)
{
    tcp_net *n = (tcp_net *)nn;
    char host[256], port[8];
    tcp_opts t;
    zs_err res;
    ZS_CHECK(parse_addr("listen", addr, host, sizeof host, port, sizeof port, 0));
    ZS_CHECK(resolve_opts(opts, &t));
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo((!host[0] || !strcmp(host, "*")) ? NULL : host, port, &hints, &ai);
    if (gai)
        return zs_error(ZS_ERR_IO, "tcp listen \"%s\": %s", addr, gai_strerror(gai));
    int fd = -1, one = 1;
    res = zs_error(ZS_ERR_IO, "tcp listen \"%s\": no address to bind", addr);
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            res = zs_error(ZS_ERR_IO, "tcp listen \"%s\": socket: %s", addr, strerror(errno));
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        set_nodelay(fd); /* inherited by accepted sockets; set again there regardless */
        res = set_bufs(fd, &t, addr);
        if (res == ZS_OK && bind(fd, a->ai_addr, a->ai_addrlen))
            res = zs_error(ZS_ERR_IO, "tcp listen \"%s\": bind: %s", addr, strerror(errno));
        if (res == ZS_OK && listen(fd, TCP_BACKLOG))
            res = zs_error(ZS_ERR_IO, "tcp listen \"%s\": listen: %s", addr, strerror(errno));
        if (res == ZS_OK)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return res;

    tcp_listener *l = calloc(1, sizeof *l);
    if (!l) {
        res = zs_error(ZS_ERR_NOMEM, "tcp listen \"%s\": out of memory", addr);
        goto fail_alloc;
    }
    l->kind = K_LISTENER;
    l->fd = fd;
    l->sndbuf = t.sndbuf;
    l->net = n;
    l->handshake_ms = t.handshake_ms;
    if (opts && opts->auth) {
        if (!opts->auth->token_of) {
            res = zs_error(ZS_ERR_INVALID, "tcp listen \"%s\": auth without token_of", addr);
            goto fail_name;
        }
        l->has_auth = 1;
        l->auth = *opts->auth;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl)) {
        res = zs_error(ZS_ERR_IO, "tcp listen \"%s\": getsockname: %s", addr, strerror(errno));
        goto fail_name;
    }
    format_sockaddr((struct sockaddr *)&ss, l->addr, sizeof l->addr);
    l->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = l};
    if (epoll_ctl(n->epfd, EPOLL_CTL_ADD, fd, &ev)) {
        res = zs_error(ZS_ERR_IO, "tcp listen \"%s\": epoll_ctl: %s", addr, strerror(errno));
        goto fail_name;
    }
    l->next = n->listeners;
    if (n->listeners)
        n->listeners->prev = l;
    n->listeners = l;
    *out = (zs_listener *)l;
    return ZS_OK;
fail_name:
    free(l);
fail_alloc:
    close(fd);
    return res;
}

/* The local address the route to `toward` leaves from, of family fam: a UDP socket connected
 * to it (which sends nothing) and getsockname.  0, or -1. */
static int route_source(const char *toward, int fam, struct sockaddr_storage *out)
{
    struct addrinfo hints = {.ai_family = fam, .ai_socktype = SOCK_DGRAM};
    struct addrinfo *ai = NULL;
    if (!toward || !*toward || getaddrinfo(toward, "9", &hints, &ai) != 0)
        return -1;
    int ok = -1;
    for (struct addrinfo *a = ai; a && ok < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        socklen_t len = sizeof *out;
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)out, &len) == 0)
            ok = 0;
        if (fd >= 0)
            close(fd);
    }
    freeaddrinfo(ai);
    return ok;
}

zs_err zs_tcp_listener_endpoint(const zs_listener *ll, const char *toward, char *out, size_t cap)
{
    const tcp_listener *l = (const tcp_listener *)ll;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0)
        return zs_error(ZS_ERR_IO, "tcp listener %s: getsockname: %s", l->addr, strerror(errno));
    int any = ss.ss_family == AF_INET6
                  ? IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&ss)->sin6_addr)
                  : ((struct sockaddr_in *)&ss)->sin_addr.s_addr == htonl(INADDR_ANY);
    char name[TCP_PEER_MAX + 256];
    int named = 0; /* name holds the host's name */
    if (any) {
        struct sockaddr_storage src;
        if (route_source(toward, ss.ss_family == AF_INET6 ? AF_UNSPEC : AF_INET, &src) == 0) {
            int port = l->port;
            ss = src;
            if (ss.ss_family == AF_INET6)
                ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
            else
                ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
        } else {
            char host[256];
            if (gethostname(host, sizeof host) != 0)
                return zs_error(ZS_ERR_IO, "tcp listener %s: gethostname: %s", l->addr,
                                strerror(errno));
            host[sizeof host - 1] = '\0';
            zs_net_fmt(name, sizeof name, "%s:%d", host, l->port);
            named = 1;
        }
    }
    if (!named)
        format_sockaddr((struct sockaddr *)&ss, name, sizeof name);
    if (strlen(name) + 1 > cap)
        return zs_error(ZS_ERR_INVALID, "tcp listener %s: endpoint %s does not fit %zu bytes",
                        l->addr, name, cap);
    zs_net_copy_str(out, cap, name);
    return ZS_OK;
}

int zs_tcp_listener_port(const zs_listener *l)
{
    return ((const tcp_listener *)l)->port;
}

void zs_tcp_listener_close(zs_listener *ll)
{
    tcp_listener *l = (tcp_listener *)ll;
    if (!l)
        return;
    tcp_net *n = l->net;
    /* Queued ZS_EV_ACCEPT events keep their connections but lose the listener pointer. */
    zs_evq_forget_listener(&n->evq, ll);
    /* Its streams still in their handshake go with it, unreported. */
    for (tcp_hs *hs = n->handshakes, *nx; hs; hs = nx) {
        nx = hs->next;
        if (hs->l != l)
            continue;
        close(hs_unlink(hs));
        zs_wipe(hs->token, sizeof hs->token);
        free(hs);
    }
    epoll_ctl(n->epfd, EPOLL_CTL_DEL, l->fd, NULL);
    close(l->fd);
    if (l->prev)
        l->prev->next = l->next;
    else
        n->listeners = l->next;
    if (l->next)
        l->next->prev = l->prev;
    free(l);
}

/* ---------------------------------------------------------------------------------------- */
/* the handshake, server side */

/* Takes hs out of the net (epoll and the list); returns its descriptor, still open. */
static int hs_unlink(tcp_hs *hs)
{
    tcp_net *n = hs->l->net;
    epoll_ctl(n->epfd, EPOLL_CTL_DEL, hs->fd, NULL);
    if (hs->prev)
        hs->prev->next = hs->next;
    else
        n->handshakes = hs->next;
    if (hs->next)
        hs->next->prev = hs->prev;
    n->n_handshakes--;
    return hs->fd;
}

/* Ends hs: closes its stream and reports why (ZS_EV_REFUSED on its listener). */
static void hs_fail(tcp_hs *hs, const char *why, ...) __attribute__((format(printf, 2, 3)));
static void hs_fail(tcp_hs *hs, const char *why, ...)
{
    tcp_net *n = hs->l->net;
    zs_event *e = evq_push(n, ZS_EV_REFUSED, NULL);
    if (e) {
        char text[ZS_NET_REASON_MAX];
        va_list ap;
        va_start(ap, why);
        vsnprintf(text, sizeof text, why, ap);
        va_end(ap);
        e->listener = (zs_listener *)hs->l;
        e->err = ZS_ERR_INVALID;
        zs_net_fmt(e->reason, sizeof e->reason, "%s: handshake: %s", hs->peer, text);
    }
    close(hs_unlink(hs));
    zs_wipe(hs->token, sizeof hs->token);
    free(hs);
}

/* hs passed: its stream becomes a connection of the member it proved (ZS_EV_ACCEPT). */
static void hs_done(tcp_hs *hs)
{
    tcp_net *n = hs->l->net;
    tcp_listener *l = hs->l;
    int fd = hs_unlink(hs);
    tcp_conn *c;
    if (conn_new(n, &fd, 1, hs->peer, &c) != ZS_OK) {
        zs_event *e = evq_push(n, ZS_EV_REFUSED, NULL);
        if (e) {
            e->listener = (zs_listener *)l;
            e->err = ZS_ERR_NOMEM;
            zs_net_copy_str(e->reason, sizeof e->reason, zs_last_error());
        }
        close(fd);
    } else {
        c->member = hs->member;
        zs_event *e = evq_push(n, ZS_EV_ACCEPT, c);
        if (e)
            e->listener = (zs_listener *)l;
    }
    zs_wipe(hs->token, sizeof hs->token);
    free(hs);
}

/* Reads into hs->in until want bytes are there: 1 done, 0 wait (EAGAIN), -1 failed (hs is
 * gone). */
static int hs_read(tcp_hs *hs, size_t want)
{
    while (hs->got < want) {
        ssize_t r = recv(hs->fd, hs->in + hs->got, want - hs->got, 0);
        if (r > 0) {
            hs->got += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        hs_fail(hs, "%s after %zu of %zu bytes", r == 0 ? "closed" : strerror(errno), hs->got,
                want);
        return -1;
    }
    return 1;
}

/* Writes the rest of hs->out: 1 done, 0 wait, -1 failed (hs is gone). */
static int hs_write(tcp_hs *hs)
{
    while (hs->out_off < hs->out_len) {
        ssize_t w = send(hs->fd, hs->out + hs->out_off, hs->out_len - hs->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            hs->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        hs_fail(hs, "send: %s", w == 0 ? "nothing written" : strerror(errno));
        return -1;
    }
    return 1;
}

/* Queues a message of len bytes that starts with the magic and status (the rest zero unless
 * the caller fills it). */
static void hs_out(tcp_hs *hs, size_t len, uint32_t status)
{
    memset(hs->out, 0, sizeof hs->out);
    zs_le_put32(hs->out, HS_MAGIC);
    zs_le_put32(hs->out + 4, status);
    hs->out_len = len;
    hs->out_off = 0;
}

/* Runs hs as far as its stream allows. */
static void hs_progress(tcp_hs *hs)
{
    for (;;) {
        int r;
        switch (hs->state) {
        case HS_READ_HELLO:
            if ((r = hs_read(hs, HS_HELLO)) <= 0)
                return;
            if (zs_le_get32(hs->in) != HS_MAGIC || (hs->in[4] | hs->in[5] << 8) != HS_VERSION ||
                hs->in[6] != 0 || hs->in[7] != 0 || zs_le_get32(hs->in + 12) != 0) {
                hs_out(hs, HS_CHALLENGE, HS_BAD_HELLO);
                snprintf(hs->why, sizeof hs->why, "not a zshard handshake (or another version)");
                hs->state = HS_WRITE_REFUSAL;
                break;
            }
            hs->member = zs_le_get32(hs->in + 8);
            memcpy(hs->nonce_c, hs->in + 16, ZS_NONCE_BYTES);
            char why[ZS_NET_REASON_MAX / 2] = "";
            int known = hs->l->auth.token_of(hs->l->auth.ctx, hs->member, hs->token, why);
            if (known != 0) {
                hs_out(hs, HS_CHALLENGE, known == -2 ? HS_NOT_READY : HS_UNKNOWN_MEMBER);
                zs_net_fmt(hs->why, sizeof hs->why, "member %u refused: %.120s", hs->member,
                           why[0] ? why : "unknown");
                hs->state = HS_WRITE_REFUSAL;
                break;
            }
            zs_random_bytes(hs->nonce_s, ZS_NONCE_BYTES);
            hs_out(hs, HS_CHALLENGE, HS_OK);
            memcpy(hs->out + 8, hs->nonce_s, ZS_NONCE_BYTES);
            zs_token_proof(hs->token, "server", hs->nonce_c, hs->nonce_s, hs->member,
                           hs->out + 8 + ZS_NONCE_BYTES);
            hs->state = HS_WRITE_CHALLENGE;
            break;
        case HS_WRITE_CHALLENGE:
            if ((r = hs_write(hs)) <= 0)
                return;
            hs->got = 0;
            hs->state = HS_READ_PROOF;
            break;
        case HS_READ_PROOF: {
            if ((r = hs_read(hs, HS_PROOF)) <= 0)
                return;
            uint8_t want[ZS_TOKEN_BYTES];
            zs_token_proof(hs->token, "client", hs->nonce_c, hs->nonce_s, hs->member, want);
            if (!zs_bytes_equal(want, hs->in, ZS_TOKEN_BYTES)) {
                hs_out(hs, HS_RESULT, HS_BAD_PROOF);
                snprintf(hs->why, sizeof hs->why,
                         "member %u did not prove its token (another job's, or forged)",
                         hs->member);
                hs->state = HS_WRITE_REFUSAL;
                break;
            }
            hs_out(hs, HS_RESULT, HS_OK);
            hs->state = HS_WRITE_RESULT;
            break;
        }
        case HS_WRITE_RESULT:
            if ((r = hs_write(hs)) <= 0)
                return;
            hs_done(hs);
            return;
        case HS_WRITE_REFUSAL: {
            /* The peer learns why, as far as the socket takes it at once; then it is closed,
             * reported with the refusal's reason whether or not that write went out. */
            ssize_t w = send(hs->fd, hs->out + hs->out_off, hs->out_len - hs->out_off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
            hs_fail(hs, "%s", hs->why);
            return;
        }
        }
    }
}

/* Starts the handshake of a stream accepted on l (fd is the handshake's from here on). */
static void hs_start(tcp_listener *l, int fd, const char *peer)
{
    tcp_net *n = l->net;
    if (n->n_handshakes >= TCP_MAX_HANDSHAKES) {
        close(fd);
        zs_event *e = evq_push(n, ZS_EV_REFUSED, NULL);
        if (e) {
            e->listener = (zs_listener *)l;
            e->err = ZS_ERR_IO;
            zs_net_fmt(e->reason, sizeof e->reason, "%s: closed at once: %d handshakes in progress",
                       peer, TCP_MAX_HANDSHAKES);
        }
        return;
    }
    tcp_hs *hs = calloc(1, sizeof *hs);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = hs};
    if (!hs || epoll_ctl(n->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        zs_log_limited(&l->accept_log, ZS_LOG_WARN, "tcp listener %s: %s: %s; connection dropped",
                       l->addr, peer, hs ? strerror(errno) : "out of memory");
        free(hs);
        close(fd);
        return;
    }
    hs->kind = K_HS;
    hs->fd = fd;
    hs->l = l;
    zs_net_copy_str(hs->peer, sizeof hs->peer, peer);
    hs->state = HS_READ_HELLO;
    hs->deadline = zs_net_now_ms() + l->handshake_ms;
    hs->next = n->handshakes;
    if (n->handshakes)
        n->handshakes->prev = hs;
    n->handshakes = hs;
    n->n_handshakes++;
    hs_progress(hs);
}

/* Handshakes past their deadline fail; listeners whose rest is over accept again.  Returns
 * the ms until the next of these is due (-1: none). */
/* Milliseconds from now to the next of the net's timers (handshake deadlines, listeners that
 * rest), 0 if one is due, -1 if there is none; nothing is run. */
static int next_timer_ms(const tcp_net *n)
{
    int64_t next = -1;
    for (const tcp_hs *hs = n->handshakes; hs; hs = hs->next)
        if (next < 0 || hs->deadline < next)
            next = hs->deadline;
    for (const tcp_listener *l = n->listeners; l; l = l->next)
        if (l->resume_at && (next < 0 || l->resume_at < next))
            next = l->resume_at;
    return zs_net_remaining_ms(next);
}

static int run_timers(tcp_net *n)
{
    int64_t now = zs_net_now_ms(), next = -1;
    for (tcp_hs *hs = n->handshakes, *nx; hs; hs = nx) {
        nx = hs->next;
        if (hs->deadline <= now)
            hs_fail(hs, "not finished within %d ms", hs->l->handshake_ms);
        else if (next < 0 || hs->deadline < next)
            next = hs->deadline;
    }
    for (tcp_listener *l = n->listeners; l; l = l->next) {
        if (!l->resume_at)
            continue;
        if (l->resume_at <= now) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = l};
            if (epoll_ctl(n->epfd, EPOLL_CTL_MOD, l->fd, &ev) == 0)
                l->resume_at = 0;
            else
                l->resume_at = now + TCP_ACCEPT_BACKOFF_MS;
        }
        if (l->resume_at && (next < 0 || l->resume_at < next))
            next = l->resume_at;
    }
    if (next < 0)
        return -1;
    return next - now > INT_MAX ? INT_MAX : (int)(next - now);
}

static void listener_accept(tcp_listener *l)
{
    for (int i = 0; i < TCP_ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) or worse: the
             * pending connection stays queued, so a level-triggered listener would wake at
             * once, forever; it rests instead, and the log says so at a bounded rate. */
            zs_log_limited(&l->accept_log, ZS_LOG_WARN,
                           "tcp listener %s: accept: %s; not accepting for %d ms", l->addr,
                           strerror(errno), TCP_ACCEPT_BACKOFF_MS);
            struct epoll_event ev = {.events = 0, .data.ptr = l};
            epoll_ctl(l->net->epfd, EPOLL_CTL_MOD, l->fd, &ev);
            l->resume_at = zs_net_now_ms() + TCP_ACCEPT_BACKOFF_MS;
            return;
        }
        set_nodelay(fd);
        tune_sndbuf(fd, l->sndbuf);
        char peer[TCP_PEER_MAX];
        format_sockaddr((struct sockaddr *)&ss, peer, sizeof peer);
        if (l->has_auth) {
            hs_start(l, fd, peer);
            continue;
        }
        tcp_conn *c;
        if (conn_new(l->net, &fd, 1, peer, &c) != ZS_OK) {
            zs_log_limited(&l->accept_log, ZS_LOG_WARN, "tcp listener %s: %s; connection dropped",
                           l->addr, zs_last_error());
            close(fd);
            continue;
        }
        zs_event *e = evq_push(l->net, ZS_EV_ACCEPT, c);
        if (e)
            e->listener = (zs_listener *)l;
    }
}

typedef struct {
    tcp_net *net;
    zs_listener *l;
} accept_arg;

static int accept_ready(void *arg)
{
    accept_arg *a = arg;
    tcp_net *n = a->net;
    for (size_t i = 0; i < n->evq.len; i++) {
        zs_event *e = &n->evq.ring[(n->evq.head + i) % n->evq.cap];
        if (e->type == ZS_EV_ACCEPT && e->listener == a->l)
            return 1;
    }
    return 0;
}

zs_err zs_tcp_accept(zs_listener *ll, int timeout_ms, zs_conn **out)
{
    tcp_listener *l = (tcp_listener *)ll;
    accept_arg a = {l->net, ll};
    int64_t deadline = zs_net_deadline(timeout_ms);
    *out = NULL;
    for (;;) {
        zs_conn *c = zs_evq_take_accept(&a.net->evq, ll);
        if (c) {
            *out = c;
            return ZS_OK;
        }
        int left = zs_net_remaining_ms(deadline);
        if (left == 0 && timeout_ms >= 0) {
            /* one last non-blocking turn so that timeout 0 still accepts what is waiting */
            ZS_CHECK(net_turn(l->net, 0, accept_ready, &a));
            *out = zs_evq_take_accept(&a.net->evq, ll);
            return ZS_OK;
        }
        ZS_CHECK(net_turn(l->net, left, accept_ready, &a));
    }
}

/* Connects one socket to a, before deadline. */
static zs_err connect_one(const struct addrinfo *a, const tcp_opts *t, int64_t deadline,
                          const char *addr, int *out)
{
    zs_err res;
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return zs_error(ZS_ERR_IO, "tcp connect %s: socket: %s", addr, strerror(errno));
    ZS_CHECK_GOTO(set_bufs(fd, t, addr), res, fail);
    set_nodelay(fd);
    if (connect(fd, a->ai_addr, a->ai_addrlen) && errno != EINPROGRESS) {
        res = zs_error(ZS_ERR_IO, "tcp connect %s: %s", addr, strerror(errno));
        goto fail;
    }
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int left = zs_net_remaining_ms(deadline);
        int k = poll(&p, 1, left);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            res = zs_error(ZS_ERR_IO, "tcp connect %s: poll: %s", addr, strerror(errno));
            goto fail;
        }
        if (k == 0) {
            res = zs_error(ZS_ERR_IO, "tcp connect %s: timed out after %d ms", addr, t->timeout_ms);
            goto fail;
        }
        break;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr) {
        res = zs_error(ZS_ERR_IO, "tcp connect %s: %s", addr, strerror(soerr ? soerr : errno));
        goto fail;
    }
    tune_sndbuf(fd, t->sndbuf);
    *out = fd;
    return ZS_OK;
fail:
    close(fd);
    return res;
}

/* Moves n bytes over the non-blocking fd (sending, or receiving into buf) before deadline. */
static zs_err hs_io(int fd, void *buf, size_t n, int sending, int64_t deadline, const char *addr,
                    const char *what)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = sending ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, n - done, 0);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r == 0 && !sending)
            return zs_error(ZS_ERR_IO,
                            "tcp connect %s: the server closed the connection during the "
                            "handshake (%s; a server of another version or job?)",
                            addr, what);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return zs_error(ZS_ERR_IO, "tcp connect %s: handshake (%s): %s", addr, what,
                            strerror(errno));
        struct pollfd p = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        int left = zs_net_remaining_ms(deadline);
        if (left == 0 || poll(&p, 1, left) == 0)
            return zs_error(ZS_ERR_IO, "tcp connect %s: the handshake timed out (%s)", addr, what);
    }
    return ZS_OK;
}

/* The client side of the handshake on a connected stream: proves auth->member with its token
 * and checks the server's proof, before deadline.  *retry: the server cannot check members
 * yet (it is starting); the stream is useless then, and a new one may try again. */
static zs_err hs_client(int fd, const zs_auth *auth, int64_t deadline, const char *addr, int *retry)
{
    *retry = 0;
    uint8_t hello[HS_HELLO] = {0}, ch[HS_CHALLENGE], proof[HS_PROOF], result[HS_RESULT];
    uint8_t nonce_c[ZS_NONCE_BYTES], want[ZS_TOKEN_BYTES];
    zs_random_bytes(nonce_c, sizeof nonce_c);
    zs_le_put32(hello, HS_MAGIC);
    hello[4] = HS_VERSION;
    zs_le_put32(hello + 8, auth->member);
    memcpy(hello + 16, nonce_c, sizeof nonce_c);
    ZS_CHECK(hs_io(fd, hello, sizeof hello, 1, deadline, addr, "hello"));
    ZS_CHECK(hs_io(fd, ch, sizeof ch, 0, deadline, addr, "challenge"));
    uint32_t status = zs_le_get32(ch + 4);
    if (zs_le_get32(ch) != HS_MAGIC)
        return zs_error(ZS_ERR_FORMAT,
                        "tcp connect %s: the answer to the handshake is not "
                        "zshard's (not a partition server?)",
                        addr);
    if (status == HS_NOT_READY) {
        *retry = 1;
        return zs_error(ZS_ERR_IO,
                        "tcp connect %s: the server could not check member %u yet "
                        "(still starting) until the connect timeout",
                        addr, auth->member);
    }
    if (status == HS_UNKNOWN_MEMBER)
        return zs_error(ZS_ERR_INVALID,
                        "tcp connect %s: the server refused member %u (not a member of its "
                        "job, or declared gone)",
                        addr, auth->member);
    if (status != HS_OK)
        return zs_error(ZS_ERR_INVALID,
                        "tcp connect %s: the server refused the handshake "
                        "(status %u: another version?)",
                        addr, status);
    const uint8_t *nonce_s = ch + 8, *server_proof = ch + 8 + ZS_NONCE_BYTES;
    zs_token_proof(auth->token, "server", nonce_c, nonce_s, auth->member, want);
    if (!zs_bytes_equal(want, server_proof, ZS_TOKEN_BYTES))
        return zs_error(ZS_ERR_INVALID,
                        "tcp connect %s: the server did not prove it belongs to this job (its "
                        "proof for member %u is wrong: another job's server, or an impostor)",
                        addr, auth->member);
    zs_token_proof(auth->token, "client", nonce_c, nonce_s, auth->member, proof);
    ZS_CHECK(hs_io(fd, proof, sizeof proof, 1, deadline, addr, "proof"));
    ZS_CHECK(hs_io(fd, result, sizeof result, 0, deadline, addr, "result"));
    if (zs_le_get32(result) != HS_MAGIC || zs_le_get32(result + 4) != HS_OK)
        return zs_error(ZS_ERR_INVALID,
                        "tcp connect %s: the server did not accept our proof for member %u (a "
                        "token from another coordinator?)",
                        addr, auth->member);
    return ZS_OK;
}

zs_err zs_tcp_connect(zs_net *nn, const char *addr, const zs_conn_opts *opts, zs_conn **out)
{
    tcp_net *n = (tcp_net *)nn;
    char host[256], port[8];
    tcp_opts t;
    zs_err res = ZS_OK;
    int fds[ZS_NET_MAX_CONNS], nfd = 0;
    ZS_CHECK(parse_addr("connect", addr, host, sizeof host, port, sizeof port, 1));
    ZS_CHECK(resolve_opts(opts, &t));
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai)
        return zs_error(ZS_ERR_IO, "tcp connect %s: %s", addr, gai_strerror(gai));
    int64_t deadline = zs_net_now_ms() + t.timeout_ms;
    for (; nfd < t.conns; nfd++) {
        for (;;) {
            for (struct addrinfo *a = ai; a; a = a->ai_next) {
                res = connect_one(a, &t, deadline, addr, &fds[nfd]);
                if (res == ZS_OK)
                    break;
            }
            if (res != ZS_OK)
                goto fail;
            int retry = 0;
            if (opts && opts->auth)
                res = hs_client(fds[nfd], opts->auth, deadline, addr, &retry);
            if (res == ZS_OK)
                break;
            close(fds[nfd]);
            if (!retry || zs_net_remaining_ms(deadline) <= HS_RETRY_MS)
                goto fail;
            poll(NULL, 0, HS_RETRY_MS);
        }
    }
    char peer[TCP_PEER_MAX];
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fds[0], (struct sockaddr *)&ss, &sl) == 0)
        format_sockaddr((struct sockaddr *)&ss, peer, sizeof peer);
    else
        zs_net_copy_str(peer, sizeof peer, addr);
    tcp_conn *c;
    ZS_CHECK_GOTO(conn_new(n, fds, nfd, peer, &c), res, fail);
    c->member = opts && opts->auth ? opts->auth->member : 0;
    freeaddrinfo(ai);
    *out = (zs_conn *)c;
    return ZS_OK;
fail:
    for (int i = 0; i < nfd; i++)
        close(fds[i]);
    freeaddrinfo(ai);
    return res;
}

zs_err zs_tcp_adopt(zs_net *nn, int fd, const char *peer, uint32_t member, zs_conn **out)
{
    tcp_net *n = (tcp_net *)nn;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK))
        return zs_error(ZS_ERR_IO, "tcp %s: fcntl O_NONBLOCK: %s", peer, strerror(errno));
    set_nodelay(fd);
    tcp_conn *c;
    ZS_CHECK(conn_new(n, &fd, 1, peer, &c));
    c->member = member;
    *out = (zs_conn *)c;
    return ZS_OK;
}

int zs_tcp_conn_local(const zs_conn *cc, struct sockaddr_storage *out)
{
    const tcp_conn *c = (const tcp_conn *)cc;
    if (c->closed || c->nsock < 1 || c->sock[0]->fd < 0) {
        errno = ENOTCONN;
        return -1;
    }
    socklen_t len = sizeof *out;
    return getsockname(c->sock[0]->fd, (struct sockaddr *)out, &len);
}

int zs_tcp_conn_sndbuf(const zs_conn *cc)
{
    const tcp_conn *c = (const tcp_conn *)cc;
    int v = -1;
    socklen_t len = sizeof v;
    if (c->nsock < 1 || c->sock[0]->fd < 0 ||
        getsockopt(c->sock[0]->fd, SOL_SOCKET, SO_SNDBUF, &v, &len) != 0)
        return -1;
    return v;
}

uint32_t zs_tcp_conn_member(const zs_conn *c)
{
    return ((const tcp_conn *)c)->member;
}

const char *zs_tcp_conn_peer(const zs_conn *c)
{
    return ((const tcp_conn *)c)->peer;
}

void zs_tcp_conn_set_user(zs_conn *c, void *user)
{
    ((tcp_conn *)c)->user = user;
}

void *zs_tcp_conn_user(const zs_conn *c)
{
    return ((const tcp_conn *)c)->user;
}

int zs_tcp_conn_closed(const zs_conn *c)
{
    return ((const tcp_conn *)c)->closed;
}

void zs_tcp_conn_close(zs_conn *cc)
{
    tcp_conn *c = (tcp_conn *)cc;
    if (!c)
        return;
    tcp_net *n = c->net;
    conn_fail(c, ZS_ERR_IO, 0, "connection closed locally");
    zs_evq_forget(&n->evq, (zs_conn *)c);
    for (int i = 0; i < c->nsock; i++) {
        sock_unmark_dirty(c->sock[i]);
        sock_unthrottle(c->sock[i]);
        free(c->sock[i]);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        n->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

zs_err zs_tcp_reg_mr(zs_net *nn, void *base, size_t len, int access, zs_mr **out)
{
    tcp_net *n = (tcp_net *)nn;
    if (!base || len == 0)
        return zs_error(ZS_ERR_INVALID, "tcp reg_mr: empty region (base %p, %zu bytes)", base, len);
    ZS_CHECK(zs_region_check_access("tcp", access));
    tcp_mr *m = malloc(sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "tcp reg_mr: out of memory");
    zs_region_add(&n->mrs, m, n, base, len, access);
    *out = (zs_mr *)m;
    return ZS_OK;
}

zs_err zs_tcp_reg_dmabuf_mr(zs_net *nn, const zs_dmabuf *buf, int access, zs_mr **out)
{
    (void)nn, (void)access;
    *out = NULL;
    /* The bytes move through a socket, so the CPU would have to read and write them: device
     * memory is not this process's memory. */
    return zs_error(ZS_ERR_UNSUPPORTED,
                    "tcp cannot read or write device memory (dma-buf fd %d, %zu bytes at %p); "
                    "GPUDirect needs the rdma transport",
                    buf ? buf->fd : -1, buf ? buf->len : 0, buf ? buf->addr : NULL);
}

zs_err zs_tcp_dereg_mr(zs_mr *mm)
{
    tcp_mr *m = (tcp_mr *)mm;
    if (!m)
        return ZS_OK;
    tcp_net *n = (tcp_net *)m->net;
    ZS_CHECK(zs_region_remove(&n->mrs, m, "tcp"));
    free(m);
    return ZS_OK;
}

/* Checks that [off, off+len) of mr may be used for access; what names the call. */
static zs_err check_region(const tcp_conn *c, const char *what, const tcp_mr *mr, size_t off,
                           uint64_t len, int access)
{
    return zs_region_check("tcp", what, c->peer, c->net, mr, off, len, access);
}

static zs_err check_open(const tcp_conn *c, const char *what)
{
    if (c->closed)
        return zs_error(ZS_ERR_IO, "tcp %s: connection closed: %s", what, c->reason);
    return ZS_OK;
}

/* Validates f as the receiver will and encodes it into r's header. */
static zs_err encode_checked(const tcp_conn *c, const char *what, const zs_frame *f,
                             uint8_t hdr[TCP_HDR])
{
    zs_frame back;
    zs_frame_encode(f, hdr);
    if (zs_frame_decode(hdr, &back) != ZS_OK)
        return zs_error_context(ZS_ERR_INVALID, "tcp %s %s", what, c->peer);
    return ZS_OK;
}

zs_err zs_tcp_isend(zs_conn *cc, const zs_frame *f, zs_mr *mm, size_t off, void *user, zs_req **out)
{
    tcp_conn *c = (tcp_conn *)cc;
    tcp_mr *mr = (tcp_mr *)mm;
    uint8_t hdr[TCP_HDR];
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, "isend"));
    ZS_CHECK(encode_checked(c, "isend", f, hdr));
    ZS_CHECK(check_region(c, "isend", mr, off, f->length, ZS_MR_SEND));
    tcp_req *r = zs_rq_new(&c->net->reqs, c->net, ZS_RQ_SEND, c, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "tcp isend %s: out of memory", c->peer);
    r->frame = *f;
    r->frame.version = ZS_FRAME_VERSION;
    memcpy(r->hdr, hdr, TCP_HDR);
    r->len = f->length;
    if (f->length)
        zs_rq_use(r, mr, off);
    if (out)
        *out = (zs_req *)r;
    send_enqueue(c, r); /* r may be finished, and freed if it has no handle */
    return ZS_OK;
}

zs_err zs_tcp_isend_inline(zs_conn *cc, const zs_frame *f, const void *data, void *user,
                           zs_req **out)
{
    tcp_conn *c = (tcp_conn *)cc;
    uint8_t hdr[TCP_HDR];
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, "isend_inline"));
    if (f->length > ZS_NET_INLINE_MAX)
        return zs_error(ZS_ERR_INVALID,
                        "tcp isend_inline %s: %llu bytes exceed the inline "
                        "limit %d",
                        c->peer, (unsigned long long)f->length, ZS_NET_INLINE_MAX);
    if (f->length && !data)
        return zs_error(ZS_ERR_INVALID, "tcp isend_inline %s: %llu bytes but no data", c->peer,
                        (unsigned long long)f->length);
    ZS_CHECK(encode_checked(c, "isend_inline", f, hdr));
    uint8_t *copy = NULL;
    if (f->length) {
        copy = malloc(f->length);
        if (!copy)
            return zs_error(ZS_ERR_NOMEM, "tcp isend_inline %s: out of memory", c->peer);
        memcpy(copy, data, f->length);
    }
    tcp_req *r = zs_rq_new(&c->net->reqs, c->net, ZS_RQ_SEND, c, user, out != NULL);
    if (!r) {
        free(copy);
        return zs_error(ZS_ERR_NOMEM, "tcp isend_inline %s: out of memory", c->peer);
    }
    r->frame = *f;
    r->frame.version = ZS_FRAME_VERSION;
    memcpy(r->hdr, hdr, TCP_HDR);
    r->len = f->length;
    r->inline_buf = copy;
    r->buf = copy;
    if (out)
        *out = (zs_req *)r;
    send_enqueue(c, r);
    return ZS_OK;
}

zs_err zs_tcp_irecv(zs_conn *cc, uint64_t id, zs_mr *mm, size_t off, size_t cap, void *user,
                    zs_req **out)
{
    tcp_conn *c = (tcp_conn *)cc;
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, "irecv"));
    return zs_rq_expect(&c->net->reqs, c->net, c, c->peer, &c->expect, id, (tcp_mr *)mm, off, cap,
                        user, out);
}

zs_err zs_tcp_recv_payload(zs_conn *cc, zs_mr *mm, size_t off, void *user, zs_req **out)
{
    tcp_conn *c = (tcp_conn *)cc;
    tcp_mr *mr = (tcp_mr *)mm;
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, "recv_payload"));
    tcp_sock *s = c->pending;
    if (!s)
        return zs_error(ZS_ERR_INVALID,
                        "tcp recv_payload %s: no header with a payload is "
                        "pending",
                        c->peer);
    ZS_CHECK(check_region(c, "recv_payload", mr, off, s->frame.length, ZS_MR_RECV));
    tcp_req *r = zs_rq_new(&c->net->reqs, c->net, ZS_RQ_RECV, c, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "tcp recv_payload %s: out of memory", c->peer);
    r->frame = s->frame;
    r->id = s->frame.id;
    r->len = s->frame.length;
    zs_rq_use(r, mr, off);
    c->pending = NULL;
    sock_start_body(s, r->buf, r);
    sock_mark_dirty(s);
    promote_parked(c, s);
    if (out)
        *out = (zs_req *)r;
    return ZS_OK;
}

zs_err zs_tcp_discard(zs_conn *cc)
{
    tcp_conn *c = (tcp_conn *)cc;
    ZS_CHECK(check_open(c, "discard"));
    tcp_sock *s = c->pending;
    if (!s)
        return zs_error(ZS_ERR_INVALID, "tcp discard %s: no header with a payload is pending",
                        c->peer);
    c->pending = NULL;
    sock_start_body(s, NULL, NULL);
    sock_mark_dirty(s);
    promote_parked(c, s);
    return ZS_OK;
}

/* A payload here is in the socket until recv_payload reads it: never in place. */
static zs_err tcp_view_payload(zs_conn *cc, const void **data)
{
    tcp_conn *c = (tcp_conn *)cc;
    *data = NULL;
    ZS_CHECK(check_open(c, "view_payload"));
    if (!c->pending)
        return zs_error(ZS_ERR_INVALID, "tcp view_payload %s: no header with a payload is pending",
                        c->peer);
    return ZS_OK;
}

static zs_err tcp_view_release(zs_conn *cc)
{
    return zs_error(ZS_ERR_INVALID, "tcp view_release %s: tcp views no payload",
                    ((tcp_conn *)cc)->peer);
}

zs_err zs_tcp_test(zs_req *rq, int *done, zs_frame *f)
{
    return zs_rq_wait((tcp_req *)rq, 0, done, f, "test");
}

zs_err zs_tcp_wait(zs_req *rq, int timeout_ms, int *done, zs_frame *f)
{
    return zs_rq_wait((tcp_req *)rq, timeout_ms, done, f, "wait");
}

zs_err zs_tcp_cancel(zs_req *rq)
{
    tcp_req *r = (tcp_req *)rq;
    ZS_CHECK(zs_rq_check_handle(r, "cancel"));
    if (r->rma && r->state != ZS_RQ_DONE)
        return zs_error(ZS_ERR_INVALID,
                        "tcp cancel %s: a one-sided %s cannot be recalled (its bytes may "
                        "still move); wait for it",
                        ((tcp_conn *)r->conn)->peer, r->rma == ZS_RMA_WRITE ? "write" : "read");
    switch (r->state) {
    case ZS_RQ_EXPECTED:
        zs_rq_orphan(r);
        return ZS_OK;
    case ZS_RQ_ACTIVE: {
        tcp_sock *s = r->at;
        s->rreq = NULL;
        if (s->rstate == RS_BODY) {
            s->rstate = RS_SKIP;
            s->rdst = NULL;
        }
        break;
    }
    case ZS_RQ_QUEUED: {
        tcp_sock *s = r->at;
        if (s->sq_head == r && s->sq_off > 0)
            return zs_error(ZS_ERR_INVALID,
                            "tcp cancel %s: the send of %s id %llu is partly "
                            "written (%llu of %llu bytes) and cannot be recalled",
                            ((tcp_conn *)r->conn)->peer, zs_frame_op_name(r->frame.op),
                            (unsigned long long)r->frame.id, (unsigned long long)s->sq_off,
                            (unsigned long long)(TCP_HDR + r->len));
        tcp_req *prev = NULL;
        for (tcp_req *x = s->sq_head; x && x != r; x = x->next)
            prev = x;
        if (prev)
            prev->next = r->next;
        else
            s->sq_head = r->next;
        if (s->sq_tail == r)
            s->sq_tail = prev;
        s->sq_bytes -= TCP_HDR + r->len;
        break;
    }
    default: /* ZS_RQ_DONE: the outcome is dropped */
        break;
    }
    zs_rq_release(r);
    return ZS_OK;
}

zs_err zs_tcp_flush(zs_net *nn)
{
    run_dirty((tcp_net *)nn);
    return ZS_OK;
}

static int events_ready(void *arg)
{
    return ((tcp_net *)arg)->evq.live > 0;
}

zs_err zs_tcp_poll(zs_net *nn, zs_event *ev, int max, int timeout_ms, int *n_out)
{
    tcp_net *n = (tcp_net *)nn;
    *n_out = 0;
    if (max <= 0)
        return zs_error(ZS_ERR_INVALID, "tcp poll: room for %d events", max);
    int64_t deadline = zs_net_deadline(timeout_ms);
    /* Events already queued (typically the completions of sends just written inline) are
     * handed out without an epoll_wait, but only every other call, so that I/O is never
     * starved by a caller whose every poll queues something new. */
    if (n->evq.live && !n->poll_skipped) {
        run_dirty(n);
        n->poll_skipped = 1;
    } else {
        n->poll_skipped = 0;
        for (;;) {
            int left = n->evq.live ? 0 : zs_net_remaining_ms(deadline);
            ZS_CHECK(net_turn(n, left, events_ready, n));
            if (n->evq.live || left == 0)
                break;
        }
    }
    int k = 0;
    while (k < max && zs_evq_pop(&n->evq, &ev[k]))
        k++;
    *n_out = k;
    if (n->throttle_head && n->evq.live <= TCP_EVQ_LOW) {
        while (n->throttle_head) {
            tcp_sock *x = n->throttle_head;
            sock_unthrottle(x);
            sock_mark_dirty(x);
        }
    }
    return ZS_OK;
}

int zs_tcp_wait_fd(zs_net *nn, int *timeout_ms)
{
    tcp_net *n = (tcp_net *)nn;
    /* Sockets registered edge-triggered: what an epoll_wait already reported and the net did
     * not finish is on the dirty list, so the descriptor polls readable only for new I/O. */
    *timeout_ms = n->evq.live || n->dirty_head ? 0 : next_timer_ms(n);
    return n->epfd;
}

const zs_transport_ops zs_tcp_ops = {
    .version = ZS_TRANSPORT_OPS_VERSION,
    .name = "tcp",
    .open = zs_tcp_open,
    .set_opts = zs_tcp_set_opts,
    .close = zs_tcp_close,
    .listen = zs_tcp_listen,
    .listener_port = zs_tcp_listener_port,
    .listener_endpoint = zs_tcp_listener_endpoint,
    .listener_close = zs_tcp_listener_close,
    .accept = zs_tcp_accept,
    .connect = zs_tcp_connect,
    .conn_peer = zs_tcp_conn_peer,
    .conn_set_user = zs_tcp_conn_set_user,
    .conn_user = zs_tcp_conn_user,
    .conn_member = zs_tcp_conn_member,
    .conn_closed = zs_tcp_conn_closed,
    .conn_close = zs_tcp_conn_close,
    .reg_mr = zs_tcp_reg_mr,
    .dereg_mr = zs_tcp_dereg_mr,
    .isend = zs_tcp_isend,
    .isend_inline = zs_tcp_isend_inline,
    .irecv = zs_tcp_irecv,
    .recv_payload = zs_tcp_recv_payload,
    .discard = zs_tcp_discard,
    .view_payload = tcp_view_payload,
    .view_release = tcp_view_release,
    .test = zs_tcp_test,
    .wait = zs_tcp_wait,
    .cancel = zs_tcp_cancel,
    .mr_export = zs_tcp_mr_export,
    .iread = zs_tcp_iread,
    .iwrite = zs_tcp_iwrite,
    .flush = zs_tcp_flush,
    .poll = zs_tcp_poll,
    .wait_fd = zs_tcp_wait_fd,
    .reg_dmabuf_mr = zs_tcp_reg_dmabuf_mr,
};
