/*
 * shm: the shared-memory backend of the data-plane transport (shm.h has the protocol).
 *
 * A net owns a TCP net (set-up streams) and an epoll descriptor over it, the Unix listeners
 * and every connection's Unix socket (level-triggered; EPOLLOUT only while packets wait to be
 * written, EPOLLIN off while a connection's backlog is full).  Progress functions run
 * net_turn(): TCP events, then the sockets that epoll reports, then deferred work, then timers.
 * An RNDV payload is copied synchronously inside the turn that handles it (process_vm_readv
 * of at most ZS_FRAME_MAX_PAYLOAD bytes: a 4 MiB shard is about a millisecond).
 */
#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "common/log.h"
#include "common/ntcopy.h"
#include "transport/core.h"
#include "transport/setup.h"
#include "transport/tcp.h"

/* A packet: our 32-byte header, then for EAGER and RNDV the 64-byte frame header, and for
 * EAGER the payload.  Header, little-endian:
 *   0 u32 magic "ZSH1"   4 u8 kind   5..7 0   8 u32 status (DONE: 0 read, 1 skipped)
 *  12 u32 region id (RNDV, REGION; 0: none)   16 u64 token (RNDV, DONE), or the region's
 *  length (REGION)   24 u64 address (RNDV: the payload's; REGION: the region's first byte)
 * A REGION packet carries the region's memfd (SCM_RIGHTS). */
#define SH_MAGIC 0x3148535au
#define SH_HDR 32
#define SH_EAGER_MAX ZS_NET_INLINE_MAX
#define SH_PKT (SH_HDR + ZS_FRAME_HEADER_BYTES + SH_EAGER_MAX)
#define SH_BACKLOG 64
#define SH_KEY 16
#define SH_COOKIE 32
#define SH_HELLO_MAGIC 0x4853535au /* "ZSSH" */
#define SH_HELLO_BYTES 256
#define SH_HELLO_ID 1
/* Regions smaller than this are read with process_vm_readv: moving them into a memfd is not
 * worth a mapping per peer, and small blocks share pages with others. */
#define SH_SHARE_MIN ((size_t)1 << 20)
/* Rendezvous replies to a peer's one-sided reads one connection may have awaiting the peer's
 * DONE; beyond, its next packets wait in the backlog (and reading stops when that is full)
 * until some are done: a peer that asks and never reads holds this many here. */
#define SH_RMA_MAX_OUT 64
/* Payloads of this size or more are copied by several threads at once (copy_split): one thread
 * copied 6 GB/s from memory to memory here, two 12 GB/s.  Below it the hand-off costs more
 * than it saves. */
#define SH_SPLIT_MIN ((uint64_t)1 << 20)
/* Smaller rendezvous payloads that arrive in one read of a connection's socket are copied
 * together, up to this many, by the helpers and this thread: 64 KiB fetches (32 in flight) ran
 * below TCP's with one thread copying each in turn. */
#define SH_BATCH 32
/* Helper threads per net at most (ZS_SHM_COPY_THREADS, default: online CPUs - 1, capped). */
#define SH_MAX_HELPERS 7
#define SH_DEFAULT_SEND_TIMEOUT_MS 120000
#define SH_DEFAULT_SETUP_MS 5000

enum { MSG_EAGER = 1, MSG_RNDV = 2, MSG_DONE = 3, MSG_KEY = 4, MSG_REGION = 5 };
enum { K_CONN = 1, K_LISTENER = 2, K_STRAY = 3 };

typedef struct sh_net sh_net;
typedef struct sh_conn sh_conn;
/* Requests are core's (core.h); a rendezvous send awaits DONE in ZS_RQ_AWAIT. */
typedef zs_rq sh_req;
typedef struct sh_mr sh_mr;
typedef struct sh_listener sh_listener;

typedef struct sh_pkt {
    struct sh_pkt *next;
    int fd; /* a descriptor that goes with it (REGION), or -1 */
    size_t len;
    uint8_t b[];
} sh_pkt;

struct sh_mr {
    zs_region reg; /* first: the table links these */
    /* A region registered for sending whose pages were moved into a sealed memfd, which
     * peers map: id > 0, the memfd, and the page span it covers.  id 0: its payloads are
     * read with process_vm_readv instead. */
    uint32_t id;
    int memfd;
    uintptr_t span;
    size_t span_len;
};

/* A peer's region mapped here (read-only): where it lies in the peer, and our mapping. */
typedef struct {
    uint32_t id;
    uintptr_t base;
    size_t len;
    const uint8_t *map;
} sh_peer_region;

/* A copy of part of a payload: memcpy out of a mapped region (pid 0), or process_vm_readv
 * out of process pid. */
typedef struct {
    pid_t pid;
    uint8_t *dst;
    const uint8_t *src; /* pid 0: our mapping; else the address in the peer */
    uint64_t len;
    int stream; /* pid 0: may use non-temporal stores (zs_copy_nt) */
    int err;    /* the errno of a failed read */
} sh_part;

struct sh_conn {
    zs_setup_conn s; /* first: the set-up stream, the state every connection has */
    int kind;        /* K_CONN: what epoll's pointer points at */
    int fd;          /* the Unix socket, -1 before it is joined */
    pid_t pid;       /* the peer's, proved by reading its cookie */
    uint8_t key[SH_KEY];
    sh_pkt *out, *out_tail; /* packets the socket did not take yet */
    int epoll_events;
    sh_pkt *pending; /* the reported header's packet */
    sh_pkt *backlog, *backlog_tail;
    int n_backlog;
    sh_peer_region *regions; /* the peer's regions mapped here */
    int n_regions, cap_regions;
    uint32_t *sent; /* ids of our regions this peer was given */
    int n_sent, cap_sent;
    int rma_out; /* rendezvous replies to the peer's one-sided reads awaiting its DONE */
    int viewing; /* the pending header's payload is read in place (view_payload) */
    /* Payloads taken while reading the socket, copied together at the end of the read
     * (flush_batch): the copies, their receives and their senders' tokens. */
    int batching;
    int n_batch;
    sh_part batch[SH_BATCH];
    sh_req *batch_rq[SH_BATCH];
    uint64_t batch_token[SH_BATCH];
};

struct sh_listener {
    zs_setup_listener s; /* first */
    int kind;            /* K_LISTENER: what epoll's pointer points at */
    int ufd;
    char name[64]; /* the abstract socket's name, after its leading NUL */
};

/* An accepted Unix socket that has not sent its key yet. */
typedef struct sh_stray {
    int kind; /* K_STRAY */
    int fd;
    sh_listener *l;
    int64_t deadline;
    struct sh_stray *prev, *next;
} sh_stray;

/* A thread that copies one part at a time for the net's thread (copy_split). */
typedef struct {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sh_part *parts; /* the run of parts it copies */
    int n_parts;
    int spin;        /* poll for the next run before sleeping (after a large payload's share) */
    atomic_int busy; /* parts are its to copy; 0 once copied (set and cleared under mu) */
    int stop;
} sh_helper;

struct sh_net {
    zs_setup_net s; /* first: the TCP net, epoll, events, connections, regions, requests */
    sh_helper helpers[SH_MAX_HELPERS];
    int n_helpers;    /* running */
    int want_helpers; /* -1: not decided yet */
    sh_stray *strays;
    uint32_t next_region;
    uint64_t rma_next_id;      /* the next one-sided operation's id, above ZS_RMA_ID_BASE */
    uint8_t cookie[SH_COOKIE]; /* read by peers to prove we share a host */
    uint8_t rbuf[SH_PKT];
};

/* The struct that holds the member `m` at p (epoll's pointer to a kind). */
#define SH_OF(p, type, m) ((type *)((char *)(p)-offsetof(type, m)))

static sh_net *net_of(const sh_conn *c)
{
    return (sh_net *)c->s.net;
}

/* ---------------------------------------------------------------------------------------- */
/* connections */

static void set_events(sh_conn *c)
{
    if (c->fd < 0)
        return;
    int want = (c->n_backlog < SH_BACKLOG ? EPOLLIN : 0) | (c->out ? EPOLLOUT : 0);
    if (want == c->epoll_events)
        return;
    struct epoll_event ev = {.events = (uint32_t)want, .data.ptr = &c->kind};
    epoll_ctl(c->s.net->epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->epoll_events = want;
}

static void free_pkts(sh_pkt *p)
{
    while (p) {
        sh_pkt *next = p->next;
        if (p->fd >= 0)
            close(p->fd);
        free(p);
        p = next;
    }
}

static void conn_fail(sh_conn *c, zs_err err, const char *why, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_fail(sh_conn *c, zs_err err, const char *why, ...)
{
    va_list ap;
    va_start(ap, why);
    int first = zs_setup_conn_fail(&c->s, why, ap);
    va_end(ap);
    if (!first)
        return;
    /* Payloads batched and not copied yet fail with the rest (the mappings go below). */
    for (int i = 0; i < c->n_batch; i++)
        zs_rq_list_add(&c->s.expect, c->batch_rq[i]);
    c->n_batch = 0;
    if (c->fd >= 0) {
        epoll_ctl(c->s.net->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
    }
    sh_req *r;
    while ((r = c->s.await)) {
        zs_rq_list_del(&c->s.await, r);
        zs_rq_fail_conn(r, c->s.reason);
    }
    while ((r = c->s.expect)) {
        zs_rq_list_del(&c->s.expect, r);
        zs_rq_fail_conn(r, c->s.reason);
    }
    free_pkts(c->out);
    free_pkts(c->backlog);
    free(c->pending);
    c->viewing = 0;
    for (int i = 0; i < c->n_regions; i++)
        munmap((void *)c->regions[i].map, c->regions[i].len);
    c->n_regions = 0;
    c->out = c->out_tail = c->backlog = c->backlog_tail = c->pending = NULL;
    c->n_backlog = 0;
    zs_setup_emit_closed(&c->s, err);
}

static void conn_free(sh_conn *c)
{
    if (!c->s.closed)
        c->s.ready = 0;
    conn_fail(c, ZS_ERR_IO, "connection closed locally");
    zs_setup_conn_release(&c->s);
    free(c->regions);
    free(c->sent);
    free(c);
}

static zs_err conn_new(sh_net *n, zs_conn *tcp, sh_conn **out)
{
    sh_conn *c = calloc(1, sizeof *c);
    if (!c)
        return zs_error(ZS_ERR_NOMEM, "shm: out of memory");
    c->kind = K_CONN;
    c->fd = -1;
    zs_err e = zs_setup_conn_init(&n->s, &c->s, tcp);
    if (e != ZS_OK) {
        free(c);
        return e;
    }
    *out = c;
    return ZS_OK;
}

/* Joins c to its Unix socket fd (non-blocking), watched for input. */
static zs_err conn_attach(sh_conn *c, int fd)
{
    c->fd = fd;
    c->epoll_events = EPOLLIN;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->kind};
    if (epoll_ctl(c->s.net->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        c->fd = -1;
        close(fd);
        return zs_error(ZS_ERR_IO, "shm %s: epoll_ctl: %s", c->s.peer, strerror(errno));
    }
    return ZS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* packets */

/* One packet (and fd, or -1) to the socket; the send's result, or -EAGAIN. */
static ssize_t put_pkt(int sock, const uint8_t *b, size_t len, int fd)
{
    struct iovec iov = {.iov_base = (void *)b, .iov_len = len};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof u.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    ssize_t k;
    do
        k = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS))
        return -EAGAIN;
    return k < 0 ? -errno : k;
}

/* Sends a packet, with a descriptor (REGION; -1: none) that the call does not take. */
static void send_pkt_fd(sh_conn *c, const uint8_t *b, size_t len, int fd)
{
    if (c->s.closed)
        return;
    if (!c->out) {
        ssize_t k = put_pkt(c->fd, b, len, fd);
        if (k == (ssize_t)len)
            return;
        if (k != -EAGAIN) {
            conn_fail(c, ZS_ERR_IO, "send: %s", k >= 0 ? "cut short" : strerror((int)-k));
            return;
        }
    }
    sh_pkt *p = malloc(sizeof *p + len);
    if (!p || (fd >= 0 && (fd = dup(fd)) < 0)) {
        free(p);
        conn_fail(c, ZS_ERR_NOMEM, "out of memory for a packet");
        return;
    }
    p->next = NULL;
    p->fd = fd;
    p->len = len;
    memcpy(p->b, b, len);
    if (c->out_tail)
        c->out_tail->next = p;
    else
        c->out = p;
    c->out_tail = p;
    set_events(c);
}

static void send_pkt(sh_conn *c, const uint8_t *b, size_t len)
{
    send_pkt_fd(c, b, len, -1);
}

static void flush_out(sh_conn *c)
{
    while (c->out && !c->s.closed) {
        sh_pkt *p = c->out;
        ssize_t k = put_pkt(c->fd, p->b, p->len, p->fd);
        if (k == -EAGAIN)
            break;
        if (k != (ssize_t)p->len) {
            conn_fail(c, ZS_ERR_IO, "send: %s", k >= 0 ? "cut short" : strerror((int)-k));
            return;
        }
        c->out = p->next;
        if (!c->out)
            c->out_tail = NULL;
        if (p->fd >= 0)
            close(p->fd);
        free(p);
    }
    set_events(c);
}

static void header(uint8_t *p, int kind, uint32_t status, uint64_t token, uint64_t addr)
{
    memset(p, 0, SH_HDR);
    zs_le_put32(p, SH_MAGIC);
    p[4] = (uint8_t)kind;
    zs_le_put32(p + 8, status);
    zs_le_put64(p + 16, token);
    zs_le_put64(p + 24, addr);
}

/* Gives the peer region m (its memfd) once, before the first payload it names. */
static void offer_region(sh_conn *c, const sh_mr *m)
{
    for (int i = 0; i < c->n_sent; i++)
        if (c->sent[i] == m->id)
            return;
    if (c->n_sent == c->cap_sent) {
        int cap = c->cap_sent ? 2 * c->cap_sent : 8;
        uint32_t *q = realloc(c->sent, (size_t)cap * sizeof *q);
        if (!q) {
            conn_fail(c, ZS_ERR_NOMEM, "out of memory for a region");
            return;
        }
        c->sent = q;
        c->cap_sent = cap;
    }
    c->sent[c->n_sent++] = m->id;
    uint8_t p[SH_HDR];
    header(p, MSG_REGION, 0, m->span_len, m->span);
    zs_le_put32(p + 12, m->id);
    send_pkt_fd(c, p, sizeof p, m->memfd);
}

static void send_done(sh_conn *c, uint64_t token, uint32_t status)
{
    uint8_t p[SH_HDR];
    header(p, MSG_DONE, status, token, 0);
    send_pkt(c, p, sizeof p);
}

/* Copies one part: from our mapping of the peer's region, or with process_vm_readv from the
 * peer's memory (one copy, by the kernel).  Sets p->err to 0 or an errno. */
static void copy_part(sh_part *p)
{
    p->err = 0;
    if (!p->pid) {
        if (p->stream)
            zs_copy_nt(p->dst, p->src, p->len);
        else
            memcpy(p->dst, p->src, p->len);
        return;
    }
    uint64_t done = 0;
    while (done < p->len) {
        struct iovec l = {.iov_base = p->dst + done, .iov_len = p->len - done};
        struct iovec r = {.iov_base = (void *)(p->src + done), .iov_len = p->len - done};
        ssize_t k = process_vm_readv(p->pid, &l, 1, &r, 1, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            p->err = k < 0 ? errno : EFAULT;
            return;
        }
        done += (uint64_t)k;
    }
}

/* Copies len bytes at the peer's address raddr into dst with process_vm_readv.  Returns 0 or
 * an errno. */
static int pull(pid_t pid, uint8_t *dst, uint64_t raddr, uint64_t len)
{
    sh_part p = {.pid = pid, .dst = dst, .src = (const uint8_t *)(uintptr_t)raddr, .len = len};
    copy_part(&p);
    return p.err;
}

/* How long a helper, and the net's thread waiting for one, poll before they sleep, after a
 * share of a large payload: such payloads come back to back (a fetch of many shards), and
 * waking a sleeping thread each time cost 4 MiB fetches about an eighth of their speed here
 * (12.3-12.7 GB/s against 14.3-14.5 polling).  Not after a batch of small payloads, whose
 * next batch waits for the peer's process, which a polling thread would slow on a small
 * machine. */
#define SH_SPIN_NS 100000

/* Polls until *flag == want or SH_SPIN_NS pass (then the caller sleeps on its condition). */
static void spin_for(const atomic_int *flag, int want)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; atomic_load_explicit(flag, memory_order_acquire) != want; i++) {
#if defined(__SSE2__)
        _mm_pause();
#endif
        if (i % 64 == 63) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > SH_SPIN_NS)
                return;
        }
    }
}

static void *helper_main(void *arg)
{
    sh_helper *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        if (!h->busy && !h->stop && h->spin) {
            pthread_mutex_unlock(&h->mu);
            spin_for(&h->busy, 1);
            pthread_mutex_lock(&h->mu);
        }
        while (!h->busy && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->stop)
            break;
        pthread_mutex_unlock(&h->mu);
        for (int i = 0; i < h->n_parts; i++)
            copy_part(&h->parts[i]);
        pthread_mutex_lock(&h->mu);
        h->busy = 0;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Starts the net's copy helpers the first time a large payload comes: ZS_SHM_COPY_THREADS of
 * them, by default one fewer than the online CPUs (at most SH_MAX_HELPERS).  A helper that
 * cannot start is simply not there: copies then use fewer threads. */
static void start_helpers(sh_net *n)
{
    if (n->want_helpers >= 0)
        return;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int dflt = cpus > 1 ? (int)(cpus - 1) : 0;
    if (dflt > SH_MAX_HELPERS)
        dflt = SH_MAX_HELPERS;
    n->want_helpers = zs_setup_env_int("shm", "ZS_SHM_COPY_THREADS", dflt, 0, SH_MAX_HELPERS);
    for (int i = 0; i < n->want_helpers; i++) {
        sh_helper *h = &n->helpers[n->n_helpers];
        memset(h, 0, sizeof *h);
        pthread_mutex_init(&h->mu, NULL);
        pthread_cond_init(&h->cv, NULL);
        if (pthread_create(&h->th, NULL, helper_main, h) != 0) {
            pthread_mutex_destroy(&h->mu);
            pthread_cond_destroy(&h->cv);
            break;
        }
        n->n_helpers++;
    }
}

static void stop_helpers(sh_net *n)
{
    for (int i = 0; i < n->n_helpers; i++) {
        sh_helper *h = &n->helpers[i];
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->th, NULL);
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
    }
    n->n_helpers = 0;
}

/* Copies parts[0..count): the net's helpers and this thread each take a run of consecutive
 * parts of about equal bytes.  Each part's err says how its copy went. */
static void copy_parts(sh_net *n, sh_part *parts, int count, int spin)
{
    uint64_t total = 0;
    for (int i = 0; i < count; i++)
        total += parts[i].len;
    int workers = n->n_helpers + 1 < count ? n->n_helpers + 1 : count;
    int given = 0, at = 0;
    uint64_t share = workers > 1 ? total / (uint64_t)workers : total;
    /* Runs for helpers first; this thread takes what is left. */
    while (given < workers - 1 && at < count) {
        int start = at;
        uint64_t bytes = 0;
        while (at < count && (at == start || bytes + parts[at].len <= share) &&
               count - at > workers - 1 - given)
            bytes += parts[at++].len;
        sh_helper *h = &n->helpers[given++];
        pthread_mutex_lock(&h->mu);
        h->parts = parts + start;
        h->n_parts = at - start;
        h->spin = spin;
        h->busy = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
    for (int i = at; i < count; i++)
        copy_part(&parts[i]);
    for (int i = 0; i < given; i++) {
        sh_helper *h = &n->helpers[i];
        if (spin)
            spin_for(&h->busy, 0);
        pthread_mutex_lock(&h->mu);
        while (h->busy)
            pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
    }
}

/* Copies len bytes from src (our mapping when pid is 0, else an address in process pid) to
 * dst, split over the net's helpers and this thread when it is large.  Returns 0 or the errno
 * of a failed read. */
static int copy_split(sh_net *n, pid_t pid, uint8_t *dst, const uint8_t *src, uint64_t len,
                      int stream)
{
    if (len >= SH_SPLIT_MIN)
        start_helpers(n);
    sh_part parts[SH_MAX_HELPERS + 1];
    int count = len >= SH_SPLIT_MIN ? n->n_helpers + 1 : 1;
    uint64_t each = (len / (uint64_t)count + 63) & ~(uint64_t)63;
    int k = 0;
    for (uint64_t at = 0; at < len && k < count; at += each, k++)
        parts[k] = (sh_part){.pid = pid,
                             .stream = stream,
                             .dst = dst + at,
                             .src = src + at,
                             .len = k == count - 1 || len - at < each ? len - at : each};
    copy_parts(n, parts, k, count > 1);
    for (int i = 0; i < k; i++)
        if (parts[i].err)
            return parts[i].err;
    return 0;
}

/* Completes receive r of the frame in packet p (its length checked by the caller) on c, which
 * is open.  r's outcome comes before anything that fails c: a failure puts r among c's
 * expected receives first, so that conn_fail fails it before it queues ZS_EV_CLOSED, and a
 * successful read completes r before the DONE that may find the peer gone (transport.h:
 * "all its requests were completed (failed) before this event"). */
static int flush_batch(sh_conn *c, sh_req *also);

/* Where the RNDV payload of len bytes in packet p lies: *src in our mapping of the sender's
 * region (*pid 0), or at an address in process *pid that process_vm_readv reads.  -1 when it
 * is not inside the mapped region the packet names (payload_outside fails c). */
static int payload_source(const sh_conn *c, const uint8_t *p, uint64_t len, const uint8_t **src,
                          pid_t *pid)
{
    uint32_t id = zs_le_get32(p + 12);
    uint64_t addr = zs_le_get64(p + 24);
    *src = (const uint8_t *)(uintptr_t)addr; /* in the peer, read by pid */
    *pid = c->pid;
    if (!id)
        return 0;
    const sh_peer_region *g = NULL;
    for (int i = 0; i < c->n_regions && !g; i++)
        if (c->regions[i].id == id)
            g = &c->regions[i];
    if (!g || addr < g->base || len > g->len || addr - g->base > g->len - len)
        return -1;
    *src = g->map + (addr - g->base); /* our mapping */
    *pid = 0;
    return 0;
}

static void payload_outside(sh_conn *c, const uint8_t *p, uint64_t len)
{
    conn_fail(c, ZS_ERR_FORMAT, "a payload of %llu bytes at 0x%llx outside region %u",
              (unsigned long long)len, (unsigned long long)zs_le_get64(p + 24),
              zs_le_get32(p + 12));
}

/* stream: the destination is read later, if at all (an expected reply's): copy with
 * non-temporal stores; 0 for one the caller reads at once and over again (recv_payload: a
 * server's scratch buffer, accumulated right after), which the cache keeps. */
static void take_payload(sh_conn *c, const uint8_t *p, sh_req *r, int stream)
{
    uint64_t len = r->frame.length;
    if (p[4] == MSG_EAGER || len == 0) {
        if (len)
            memcpy(r->buf, p + SH_HDR + ZS_FRAME_HEADER_BYTES, len);
        zs_rq_finish(r, ZS_OK, NULL);
        return;
    }
    const uint8_t *src;
    pid_t pid;
    if (payload_source(c, p, len, &src, &pid) != 0) {
        zs_rq_list_add(&c->s.expect, r);
        payload_outside(c, p, len);
        return;
    }
    /* Inside a read of the socket, a smaller payload joins the batch; not one the net answers
     * itself (a one-sided write), whose answer must follow the copy. */
    if (c->batching && len < SH_SPLIT_MIN && r->rma != ZS_RMA_SERVE) {
        start_helpers(net_of(c));
        if (net_of(c)->n_helpers > 0) {
            if (c->n_batch == SH_BATCH && flush_batch(c, r) < 0)
                return;
            int k = c->n_batch++;
            c->batch[k] =
                (sh_part){.pid = pid, .stream = stream, .dst = r->buf, .src = src, .len = len};
            c->batch_rq[k] = r;
            c->batch_token[k] = zs_le_get64(p + 16);
            return;
        }
    }
    if (c->n_batch && flush_batch(c, r) < 0) /* DONEs go out in the order payloads came */
        return;
    int err = copy_split(net_of(c), pid, r->buf, src, len, stream);
    if (err) {
        zs_rq_list_add(&c->s.expect, r);
        conn_fail(c, ZS_ERR_IO, "reading a %llu-byte payload from the peer's memory: %s%s",
                  (unsigned long long)len, strerror(err),
                  err == ESRCH ? " (the peer is gone; mid-payload)" : " (mid-payload)");
        return;
    }
    zs_rq_finish(r, ZS_OK, NULL);
    send_done(c, zs_le_get64(p + 16), 0);
}

/* Copies the batched payloads (helpers and this thread together), completes their receives
 * in order and then sends their DONEs.  On a failed copy that receive, the ones after it and
 * `also` (a receive the caller holds, or NULL) join the expected ones and the connection
 * fails, so all of them fail before its ZS_EV_CLOSED; returns -1 then. */
static int flush_batch(sh_conn *c, sh_req *also)
{
    int count = c->n_batch;
    if (count == 0)
        return 0;
    sh_part parts[SH_BATCH];
    sh_req *rq[SH_BATCH];
    uint64_t token[SH_BATCH];
    memcpy(parts, c->batch, (size_t)count * sizeof *parts);
    memcpy(rq, c->batch_rq, (size_t)count * sizeof *rq);
    memcpy(token, c->batch_token, (size_t)count * sizeof *token);
    c->n_batch = 0;
    copy_parts(net_of(c), parts, count, 0);
    int bad = 0;
    while (bad < count && !parts[bad].err)
        bad++;
    for (int i = 0; i < bad; i++)
        zs_rq_finish(rq[i], ZS_OK, NULL);
    if (bad < count) {
        for (int i = bad; i < count; i++)
            zs_rq_list_add(&c->s.expect, rq[i]);
        if (also)
            zs_rq_list_add(&c->s.expect, also);
        int err = parts[bad].err;
        conn_fail(c, ZS_ERR_IO, "reading a %llu-byte payload from the peer's memory: %s%s",
                  (unsigned long long)parts[bad].len, strerror(err),
                  err == ESRCH ? " (the peer is gone; mid-payload)" : " (mid-payload)");
        return -1;
    }
    for (int i = 0; i < count && !c->s.closed; i++)
        send_done(c, token[i], 0);
    return 0;
}

static void skip_payload(sh_conn *c, const uint8_t *p)
{
    if (p[4] == MSG_RNDV)
        send_done(c, zs_le_get64(p + 16), 1);
}

static void rma_serve(sh_conn *c, const uint8_t *p, const zs_frame *f);
static void rma_reply(sh_conn *c, const uint8_t *p, sh_req *r, const zs_frame *f);

/* Hands the frame in packet p (len bytes) to an irecv or to the caller; keeps a copy as the
 * pending header when it has a payload nobody expected. */
static void deliver(sh_conn *c, const uint8_t *p, size_t len)
{
    zs_frame f;
    zs_frame_decode(p + SH_HDR, &f); /* checked on arrival */
    if (f.op == ZS_OP_RMA_READ || f.op == ZS_OP_RMA_WRITE) {
        rma_serve(c, p, &f);
        return;
    }
    sh_req *x = zs_rq_list_find(c->s.expect, f.id);
    if (x && x->rma) {
        zs_rq_list_del(&c->s.expect, x);
        rma_reply(c, p, x, &f);
        return;
    }
    if (!x && (f.op == ZS_OP_RMA_DATA || f.op == ZS_OP_RMA_ACK)) {
        skip_payload(c, p);
        conn_fail(c, ZS_ERR_FORMAT, "%s id %llu answers no one-sided operation of ours",
                  zs_frame_op_name(f.op), (unsigned long long)f.id);
        return;
    }
    int skip;
    sh_req *r = zs_setup_expected(&c->s, &f, &skip);
    if (r)
        take_payload(c, p, r, 1);
    else if (skip)
        skip_payload(c, p);
    if (r || skip)
        return;
    zs_event *e = zs_evq_push(&c->s.net->evq, ZS_EV_HEADER, (zs_conn *)c, "shm");
    if (e)
        e->frame = f;
    if (f.length == 0)
        return;
    sh_pkt *k = malloc(sizeof *k + len);
    if (!k) {
        conn_fail(c, ZS_ERR_NOMEM, "out of memory for a pending header");
        return;
    }
    k->next = NULL;
    k->fd = -1;
    k->len = len;
    memcpy(k->b, p, len);
    c->pending = k;
}

static void deliver_backlog(sh_conn *c)
{
    while (!c->s.closed && !c->pending && c->backlog && c->rma_out < SH_RMA_MAX_OUT) {
        sh_pkt *p = c->backlog;
        c->backlog = p->next;
        if (!c->backlog)
            c->backlog_tail = NULL;
        c->n_backlog--;
        deliver(c, p->b, p->len);
        free(p);
    }
    set_events(c);
}

/* A REGION packet with its memfd: checks the seals that keep it from shrinking under us (a
 * mapping of a shrunk file would fault), maps it read-only and records it. */
static void on_region(sh_conn *c, const uint8_t *p, size_t len, int fd)
{
    uint32_t id = zs_le_get32(p + 12);
    uint64_t bytes = zs_le_get64(p + 16), base = zs_le_get64(p + 24);
    struct stat st;
    int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
    if (len != SH_HDR || fd < 0 || id == 0 || seals < 0 || !(seals & F_SEAL_SHRINK) ||
        fstat(fd, &st) != 0 || (uint64_t)st.st_size < bytes || bytes == 0) {
        conn_fail(c, ZS_ERR_FORMAT, "region %u: %s", id,
                  fd < 0 ? "no memfd came with it"
                  : seals < 0 || !(seals & F_SEAL_SHRINK)
                      ? "its memfd is not sealed against shrinking"
                      : "its length does not match its memfd");
        if (fd >= 0)
            close(fd);
        return;
    }
    void *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        conn_fail(c, ZS_ERR_IO, "mapping region %u of %llu bytes: %s", id,
                  (unsigned long long)bytes, strerror(errno));
        return;
    }
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer does not clear its shadow for a new mapping: in a process forked after
     * its parent freed a large block, the range the mapping lands in may still read as freed
     * heap, and a view of a payload in it (view_payload) would be reported. */
    ASAN_UNPOISON_MEMORY_REGION(map, bytes);
#endif
    if (c->n_regions == c->cap_regions) {
        int cap = c->cap_regions ? 2 * c->cap_regions : 8;
        sh_peer_region *q = realloc(c->regions, (size_t)cap * sizeof *q);
        if (!q) {
            munmap(map, bytes);
            conn_fail(c, ZS_ERR_NOMEM, "out of memory for a region");
            return;
        }
        c->regions = q;
        c->cap_regions = cap;
    }
    c->regions[c->n_regions++] = (sh_peer_region){.id = id, .base = base, .len = bytes, .map = map};
}

static void on_packet(sh_conn *c, const uint8_t *p, size_t len, int fd)
{
    if (len < SH_HDR || zs_le_get32(p) != SH_MAGIC) {
        if (fd >= 0)
            close(fd);
        conn_fail(c, ZS_ERR_FORMAT, "a packet of %zu bytes that is not ours", len);
        return;
    }
    int kind = p[4];
    if (kind == MSG_REGION) {
        on_region(c, p, len, fd);
        return;
    }
    if (fd >= 0) {
        close(fd);
        conn_fail(c, ZS_ERR_FORMAT, "a descriptor came with a packet of kind %d", kind);
        return;
    }
    if (kind == MSG_DONE) {
        uint64_t token = zs_le_get64(p + 16);
        sh_req *r = zs_rq_list_token(c->s.await, token);
        if (!r) {
            conn_fail(c, ZS_ERR_FORMAT, "DONE for token %llu, which no send awaits",
                      (unsigned long long)token);
            return;
        }
        zs_rq_list_del(&c->s.await, r);
        if (r->rma == ZS_RMA_SERVE && c->rma_out-- == SH_RMA_MAX_OUT)
            c->s.dirty = 1; /* the backlog moves again (resume) */
        zs_rq_finish(r, ZS_OK, NULL);
        return;
    }
    zs_frame f;
    if ((kind != MSG_EAGER && kind != MSG_RNDV) || len < SH_HDR + ZS_FRAME_HEADER_BYTES ||
        zs_frame_decode(p + SH_HDR, &f) != ZS_OK) {
        conn_fail(c, ZS_ERR_FORMAT, "malformed packet (kind %d, %zu bytes): %s", kind, len,
                  kind == MSG_EAGER || kind == MSG_RNDV ? zs_last_error() : "unknown kind");
        return;
    }
    if (kind == MSG_EAGER
            ? (f.length > SH_EAGER_MAX || len != SH_HDR + ZS_FRAME_HEADER_BYTES + f.length)
            : (len != SH_HDR + ZS_FRAME_HEADER_BYTES || f.length == 0) || f.op == ZS_OP_HELLO) {
        conn_fail(c, ZS_ERR_FORMAT, "%s packet of %zu bytes for a %s frame of %llu bytes",
                  kind == MSG_EAGER ? "eager" : "rendezvous", len, zs_frame_op_name(f.op),
                  (unsigned long long)f.length);
        return;
    }
    if (c->pending || c->backlog || c->rma_out >= SH_RMA_MAX_OUT) {
        sh_pkt *k = malloc(sizeof *k + len);
        if (!k) {
            conn_fail(c, ZS_ERR_NOMEM, "out of memory for the backlog");
            return;
        }
        k->next = NULL;
        k->fd = -1;
        k->len = len;
        memcpy(k->b, p, len);
        if (c->backlog_tail)
            c->backlog_tail->next = k;
        else
            c->backlog = k;
        c->backlog_tail = k;
        c->n_backlog++;
        set_events(c);
        return;
    }
    deliver(c, p, len);
}

static void conn_read_packets(sh_conn *c)
{
    while (!c->s.closed && c->n_backlog < SH_BACKLOG) {
        struct iovec iov = {.iov_base = net_of(c)->rbuf, .iov_len = sizeof net_of(c)->rbuf};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
        ssize_t k = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
        int fd = -1;
        if (k > 0 && mh.msg_controllen > 0) {
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
                cm->cmsg_len == CMSG_LEN(sizeof(int)))
                memcpy(&fd, CMSG_DATA(cm), sizeof fd);
            if (mh.msg_flags & MSG_CTRUNC) {
                if (fd >= 0)
                    close(fd);
                conn_fail(c, ZS_ERR_FORMAT, "a packet with more descriptors than one");
                return;
            }
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (k <= 0) {
            conn_fail(c, ZS_ERR_IO, "%s", k == 0 ? "closed by peer" : strerror(errno));
            return;
        }
        if ((size_t)k > sizeof net_of(c)->rbuf) {
            if (fd >= 0)
                close(fd);
            conn_fail(c, ZS_ERR_FORMAT, "a packet of %zd bytes, more than %d", k, SH_PKT);
            return;
        }
        on_packet(c, net_of(c)->rbuf, (size_t)k, fd);
    }
}

/* Reads c's packets; the smaller payloads among them are copied together at the end. */
static void conn_read(sh_conn *c)
{
    c->batching = 1;
    conn_read_packets(c);
    c->batching = 0;
    flush_batch(c, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* set-up */

/* HELLO, little-endian: "ZSSH", version u16 1, 0 u16, pid u32, 0 u32, cookie address u64,
 * cookie [32], key [16], socket name (NUL-terminated, server only). */
static void hello_encode(const sh_net *n, uint8_t *p, const uint8_t *key, const char *name)
{
    memset(p, 0, SH_HELLO_BYTES);
    zs_le_put32(p, SH_HELLO_MAGIC);
    zs_le_put16(p + 4, 1);
    zs_le_put32(p + 8, (uint32_t)getpid());
    zs_le_put64(p + 16, (uintptr_t)n->cookie);
    memcpy(p + 24, n->cookie, SH_COOKIE);
    if (key)
        memcpy(p + 56, key, SH_KEY);
    if (name)
        zs_net_copy_str((char *)p + 72, SH_HELLO_BYTES - 72, name);
}

/* Checks a peer's hello: reads its cookie out of its memory and compares it with the one it
 * sent.  Returns ZS_OK with *pid set. */
static zs_err hello_check(const uint8_t *p, uint64_t len, const char *peer, pid_t *pid)
{
    if (len != SH_HELLO_BYTES || zs_le_get32(p) != SH_HELLO_MAGIC || zs_le_get16(p + 4) != 1)
        return zs_error(ZS_ERR_FORMAT,
                        "shm %s: set-up message of %llu bytes is not a version 1 "
                        "hello",
                        peer, (unsigned long long)len);
    *pid = (pid_t)zs_le_get32(p + 8);
    uint8_t seen[SH_COOKIE];
    int err = *pid > 0 ? pull(*pid, seen, zs_le_get64(p + 16), SH_COOKIE) : ESRCH;
    if (err || memcmp(seen, p + 24, SH_COOKIE) != 0)
        return zs_error(ZS_ERR_IO,
                        "shm %s: the peer (pid %d) is not a process on this host whose memory we "
                        "may read (%s); shared memory needs both on one host, as the same user, "
                        "with ptrace allowed between them",
                        peer, (int)*pid, err ? strerror(err) : "its cookie differs");
    return ZS_OK;
}

static void setup_refuse(sh_conn *c, const char *why)
{
    zs_setup_conn_refuse(&c->s, why);
}

/* An accepted stream's hello arrived: prove the peer, answer with our socket and a key. */
static void setup_answer(zs_setup_conn *sc, uint64_t len)
{
    sh_conn *c = (sh_conn *)sc;
    sh_listener *l = (sh_listener *)c->s.l;
    if (hello_check(c->s.hello, len, c->s.peer, &c->pid) != ZS_OK || !l) {
        setup_refuse(c, l ? zs_last_error() : "its listener was closed");
        return;
    }
    if (getrandom(c->key, SH_KEY, 0) != SH_KEY) {
        setup_refuse(c, "no random bytes for a key");
        return;
    }
    hello_encode(net_of(c), c->s.hello, c->key, l->name);
    zs_setup_answer(&c->s); /* ready once the peer joins our socket with the key */
}

static void stray_free(sh_net *n, sh_stray *s, int close_fd)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        n->strays = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (close_fd) {
        epoll_ctl(n->s.epfd, EPOLL_CTL_DEL, s->fd, NULL);
        close(s->fd);
    }
    free(s);
}

static void listener_accept(sh_listener *l)
{
    sh_net *n = (sh_net *)l->s.net;
    for (;;) {
        int fd = accept4(l->ufd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        sh_stray *s = calloc(1, sizeof *s);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
        if (!s || epoll_ctl(n->s.epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            free(s);
            close(fd);
            continue;
        }
        s->kind = K_STRAY;
        s->fd = fd;
        s->l = l;
        s->deadline = zs_net_now_ms() + l->s.setup_ms;
        s->next = n->strays;
        if (n->strays)
            n->strays->prev = s;
        n->strays = s;
    }
}

/* A joined socket sent its key: it becomes the connection whose set-up gave that key. */
static void stray_key(sh_net *n, sh_stray *s)
{
    uint8_t p[SH_HDR + SH_KEY + 1];
    ssize_t k = recv(s->fd, p, sizeof p, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    sh_conn *c = NULL;
    if (k == SH_HDR + SH_KEY && zs_le_get32(p) == SH_MAGIC && p[4] == MSG_KEY) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        int have_cred = getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0;
        for (c = (sh_conn *)n->s.conns; c; c = (sh_conn *)c->s.next)
            if (!c->s.ready && c->pid && c->fd < 0 && !c->s.closed &&
                sodium_memcmp(c->key, p + SH_HDR, SH_KEY) == 0 && have_cred && cr.pid == c->pid)
                break;
    }
    epoll_ctl(n->s.epfd, EPOLL_CTL_DEL, s->fd, NULL);
    int fd = s->fd;
    stray_free(n, s, 0);
    if (!c) {
        close(fd);
        return;
    }
    if (conn_attach(c, fd) != ZS_OK) {
        setup_refuse(c, zs_last_error());
        return;
    }
    zs_setup_conn_accepted(&c->s);
}

/* ---------------------------------------------------------------------------------------- */
/* the loop: zs_setup_ops */

static void io(zs_setup_net *sn, const struct epoll_event *evs, int k)
{
    sh_net *n = (sh_net *)sn;
    for (int i = 0; i < k; i++) {
        int *kind = evs[i].data.ptr;
        if (!kind)
            continue; /* the TCP net: driven already */
        if (*kind == K_LISTENER) {
            listener_accept(SH_OF(kind, sh_listener, kind));
        } else if (*kind == K_STRAY) {
            stray_key(n, (sh_stray *)kind);
        } else {
            sh_conn *c = SH_OF(kind, sh_conn, kind);
            if (evs[i].events & EPOLLOUT)
                flush_out(c);
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                conn_read(c);
        }
    }
}

static void resume(zs_setup_conn *sc)
{
    sh_conn *c = (sh_conn *)sc;
    deliver_backlog(c);
    if (!c->s.closed && c->n_backlog < SH_BACKLOG)
        conn_read(c);
}

static void expire(zs_setup_net *sn, int64_t now)
{
    sh_net *n = (sh_net *)sn;
    sh_stray *next;
    for (sh_stray *s = n->strays; s; s = next) {
        next = s->next;
        if (now >= s->deadline)
            stray_free(n, s, 1);
    }
}

static int64_t next_timer(zs_setup_net *sn)
{
    int64_t next = -1;
    for (sh_stray *s = ((sh_net *)sn)->strays; s; s = s->next)
        if (next < 0 || s->deadline < next)
            next = s->deadline;
    return next;
}

static zs_err conn_new_cb(zs_setup_net *n, zs_conn *tcp, zs_setup_conn **out)
{
    return conn_new((sh_net *)n, tcp, (sh_conn **)out);
}

static void conn_free_cb(zs_setup_conn *c)
{
    conn_free((sh_conn *)c);
}

static void fail_cb(zs_setup_conn *c, zs_err err, const char *msg)
{
    conn_fail((sh_conn *)c, err, "%s", msg);
}

static const zs_setup_ops sh_setup_ops = {
    .name = "shm",
    .hello_id = SH_HELLO_ID,
    .hello_bytes = SH_HELLO_BYTES,
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

static zs_err sh_open(zs_net **out)
{
    *out = NULL;
    sh_net *n = calloc(1, sizeof *n);
    if (!n)
        return zs_error(ZS_ERR_NOMEM, "shm: out of memory");
    zs_err res = zs_setup_net_open(&n->s, &sh_setup_ops);
    if (res != ZS_OK) {
        free(n);
        return res;
    }
    if (getrandom(n->cookie, SH_COOKIE, 0) != SH_COOKIE) {
        res = zs_error(ZS_ERR_IO, "shm: getrandom: %s", strerror(errno));
        zs_setup_net_close(&n->s);
        free(n);
        return res;
    }
    /* Under Yama's ptrace_scope 1 a sibling could not read our memory; let any process of
     * this user do so (without Yama the call fails, and nothing needs lifting). */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    n->want_helpers = -1;
    n->s.send_timeout_ms = zs_setup_env_int("shm", "ZS_SHM_SEND_TIMEOUT_MS",
                                            SH_DEFAULT_SEND_TIMEOUT_MS, 10, INT_MAX / 2);
    *out = (zs_net *)n;
    return ZS_OK;
}

static zs_err sh_set_opts(zs_net *net, const zs_net_opts *opts)
{
    (void)net, (void)opts;
    return ZS_OK;
}

static void sh_close(zs_net *nn)
{
    sh_net *n = (sh_net *)nn;
    if (!n)
        return;
    zs_setup_net_close_conns(&n->s);
    stop_helpers(n);
    while (n->strays)
        stray_free(n, n->strays, 1);
    while (n->s.listeners) {
        sh_listener *l = (sh_listener *)n->s.listeners;
        n->s.listeners = l->s.next;
        close(l->ufd);
        free(l);
    }
    while (n->s.mrs) {
        sh_mr *m = (sh_mr *)n->s.mrs;
        n->s.mrs = m->reg.next;
        if (m->memfd >= 0)
            close(m->memfd);
        free(m);
    }
    zs_setup_net_close(&n->s);
    free(n);
}

static zs_err sh_listen(zs_net *nn, const char *addr, const zs_conn_opts *opts, zs_listener **out)
{
    sh_net *n = (sh_net *)nn;
    *out = NULL;
    sh_listener *l = calloc(1, sizeof *l);
    if (!l)
        return zs_error(ZS_ERR_NOMEM, "shm: out of memory");
    l->kind = K_LISTENER;
    zs_err e = zs_setup_listen(&n->s, &l->s, addr, opts, "ZS_SHM_SETUP_MS", SH_DEFAULT_SETUP_MS);
    if (e != ZS_OK) {
        free(l);
        return e;
    }
    uint8_t rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd)
        memset(rnd, 0, sizeof rnd);
    zs_net_fmt(l->name, sizeof l->name, "zshard-shm/%d/%d/%02x%02x%02x%02x", (int)getpid(),
               zs_tcp_listener_port(l->s.tcp), rnd[0], rnd[1], rnd[2], rnd[3]);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t nl = strlen(l->name);
    memcpy(sa.sun_path + 1, l->name, nl); /* abstract: sun_path[0] is NUL */
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    l->ufd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &l->kind};
    if (l->ufd < 0 || bind(l->ufd, (struct sockaddr *)&sa, sl) < 0 || listen(l->ufd, 256) < 0 ||
        epoll_ctl(n->s.epfd, EPOLL_CTL_ADD, l->ufd, &ev) < 0) {
        e = zs_error(ZS_ERR_IO, "shm: Unix socket @%s: %s", l->name, strerror(errno));
        if (l->ufd >= 0)
            close(l->ufd);
        zs_setup_listener_drop(&l->s);
        free(l);
        return e;
    }
    *out = (zs_listener *)l;
    return ZS_OK;
}

static void sh_listener_close(zs_listener *ll)
{
    sh_listener *l = (sh_listener *)ll;
    sh_net *n = (sh_net *)l->s.net;
    sh_stray *sn;
    for (sh_stray *s = n->strays; s; s = sn) {
        sn = s->next;
        if (s->l == l)
            stray_free(n, s, 1);
    }
    epoll_ctl(n->s.epfd, EPOLL_CTL_DEL, l->ufd, NULL);
    close(l->ufd);
    zs_setup_listener_drop(&l->s);
    free(l);
}

static zs_err sh_connect(zs_net *nn, const char *addr, const zs_conn_opts *opts, zs_conn **out)
{
    sh_net *n = (sh_net *)nn;
    *out = NULL;
    int timeout = opts && opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 10000;
    int64_t deadline = zs_net_now_ms() + timeout;
    zs_conn_opts to = zs_setup_tcp_opts(opts, timeout);
    zs_conn *tc;
    ZS_CHECK(zs_tcp_connect(n->s.tcp, addr, &to, &tc));
    sh_conn *c = NULL;
    zs_err res = conn_new(n, tc, &c);
    if (res != ZS_OK) {
        zs_tcp_conn_close(tc);
        return res;
    }
    zs_net_fmt(c->s.peer, sizeof c->s.peer, "%s", addr);
    hello_encode(n, c->s.hello, NULL, NULL);
    uint64_t got;
    ZS_CHECK_GOTO(zs_setup_exchange(tc, c->s.hello_mr, c->s.hello, SH_HELLO_BYTES, SH_HELLO_ID,
                                    "shm", addr, timeout, deadline, &got),
                  res, fail);
    ZS_CHECK_GOTO(hello_check(c->s.hello, got, c->s.peer, &c->pid), res, fail);
    memcpy(c->key, c->s.hello + 56, SH_KEY);
    char name[SH_HELLO_BYTES];
    zs_net_copy_str(name, sizeof name, (const char *)c->s.hello + 72);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t nl = strnlen(name, sizeof sa.sun_path - 1);
    memcpy(sa.sun_path + 1, name, nl);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)) < 0) {
        res = zs_error(ZS_ERR_IO,
                       "shm %s: cannot reach the server's socket @%s: %s (another network "
                       "namespace?)",
                       addr, name, strerror(errno));
        if (fd >= 0)
            close(fd);
        goto fail;
    }
    uint8_t kp[SH_HDR + SH_KEY];
    header(kp, MSG_KEY, 0, 0, 0);
    memcpy(kp + SH_HDR, c->key, SH_KEY);
    if (send(fd, kp, sizeof kp, MSG_NOSIGNAL) != (ssize_t)sizeof kp) {
        res = zs_error(ZS_ERR_IO, "shm %s: sending the key: %s", addr, strerror(errno));
        close(fd);
        goto fail;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        res = zs_error(ZS_ERR_IO, "shm %s: fcntl: %s", addr, strerror(errno));
        close(fd);
        goto fail;
    }
    ZS_CHECK_GOTO(conn_attach(c, fd), res, fail);
    c->s.ready = 1;
    *out = (zs_conn *)c;
    return ZS_OK;
fail:
    conn_free(c);
    return res;
}

/* 1 if every mapping of [lo, hi) is private anonymous read-write memory outside the brk heap
 * (an mmap, which is what malloc gives for large blocks), so that its pages may be moved into a
 * memfd; /proc/self/maps says.  Heap pages are left alone: the main arena's bookkeeping lives
 * on them, and a child forked later would share them. */
static int plain_anonymous(uintptr_t lo, uintptr_t hi)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    char line[512];
    uintptr_t covered = lo;
    int ok = 1;
    while (ok && fgets(line, sizeof line, f)) {
        unsigned long a, b, off;
        char perms[8], path[256] = "";
        unsigned dmaj, dmin;
        unsigned long ino;
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %255s", &a, &b, perms, &off, &dmaj, &dmin, &ino,
                   path) < 7)
            continue;
        if (b <= lo || a >= hi)
            continue;
        if (a > covered || strcmp(perms, "rw-p") != 0 || ino != 0 || path[0])
            ok = 0;
        covered = b;
    }
    fclose(f);
    return ok && covered >= hi;
}

/* Moves the pages under a region registered for sending (or remote reads) into a sealed memfd
 * mapped at the same address (MAP_FIXED over a copy of their bytes), so that peers can map them and
 * read payloads with one memcpy.  Only for regions of SH_SHARE_MIN or more on private anonymous
 * mmap pages that no other region of ours covers; otherwise the region stays as it is and
 * peers read it with process_vm_readv.  The caller must not write the region during
 * registration (it is registered before use), and a child forked later does not get these
 * pages (MADV_DONTFORK). */
static void share_region(sh_net *n, sh_mr *m)
{
    if (m->reg.len < SH_SHARE_MIN)
        return;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)m->reg.base & ~(uintptr_t)(pg - 1);
    uintptr_t hi = ((uintptr_t)m->reg.base + m->reg.len + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    for (sh_mr *o = (sh_mr *)n->s.mrs; o; o = (sh_mr *)o->reg.next)
        if (o->id && o->span < hi && lo < o->span + o->span_len)
            return;
    if (!plain_anonymous(lo, hi))
        return;
    int fd = memfd_create("zshard-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return;
    size_t span = hi - lo;
    int ok = ftruncate(fd, (off_t)span) == 0;
    for (size_t done = 0; ok && done < span;) {
        /* Whole pages, the bytes around the region included (malloc's header, a neighbour):
         * a raw system call, since a sanitizer's pwrite would call that an overflow. */
        ssize_t k = syscall(SYS_pwrite64, fd, (const char *)lo + done, span - done, (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        ok = k > 0;
        done += k > 0 ? (size_t)k : 0;
    }
    ok = ok && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
    if (!ok || mmap((void *)lo, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
                   MAP_FAILED) {
        ZS_DEBUG("shm: region of %zu bytes stays private (%s); peers read it with "
                 "process_vm_readv",
                 m->reg.len, strerror(errno));
        close(fd);
        return;
    }
    /* A child forked after this would otherwise share the pages with us, MAP_SHARED. */
    madvise((void *)lo, span, MADV_DONTFORK);
    m->memfd = fd;
    m->span = lo;
    m->span_len = span;
    m->id = ++n->next_region;
}

static zs_err sh_reg_mr(zs_net *nn, void *base, size_t len, int access, zs_mr **out)
{
    sh_net *n = (sh_net *)nn;
    *out = NULL;
    ZS_CHECK(zs_region_check_access("shm", access));
    sh_mr *m = calloc(1, sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "shm: out of memory");
    m->reg.base = base;
    m->reg.len = len;
    m->memfd = -1;
    if ((access & (ZS_MR_SEND | ZS_MR_REMOTE_READ)) && !(access & ZS_MR_PINNED) && len > 0)
        share_region(n, m);
    zs_region_add(&n->s.mrs, &m->reg, n, base, len, access);
    *out = (zs_mr *)m;
    return ZS_OK;
}

static zs_err sh_reg_dmabuf_mr(zs_net *nn, const zs_dmabuf *buf, int access, zs_mr **out)
{
    (void)nn, (void)access;
    *out = NULL;
    /* shm's peers read and write regions with the CPU (mapped pages, process_vm_readv): device
     * memory is neither. */
    return zs_error(ZS_ERR_UNSUPPORTED,
                    "shm cannot read or write device memory (dma-buf fd %d, %zu bytes at %p); "
                    "GPUDirect needs the rdma transport",
                    buf ? buf->fd : -1, buf ? buf->len : 0, buf ? buf->addr : NULL);
}

static zs_err sh_dereg_mr(zs_mr *mm)
{
    sh_mr *m = (sh_mr *)mm;
    if (!m)
        return ZS_OK;
    sh_net *n = (sh_net *)m->reg.net;
    ZS_CHECK(zs_region_remove(&n->s.mrs, &m->reg, "shm"));
    if (m->memfd >= 0)
        close(m->memfd); /* the pages stay mapped here; peers that mapped them keep theirs */
    free(m);
    return ZS_OK;
}

static zs_err check_region(const sh_conn *c, const char *what, const sh_mr *m, size_t off,
                           uint64_t len, int access)
{
    return zs_region_check("shm", what, c->s.peer, c->s.net, m ? &m->reg : NULL, off, len, access);
}

static zs_err check_open(const sh_conn *c, const char *what)
{
    return zs_setup_check_open(&c->s, what);
}

/* Sends frame f with its payload at src (len bytes), eager or by rendezvous; rma: ZS_RMA_SERVE
 * for a reply to the peer's one-sided operation, ZS_RMA_READ or ZS_RMA_WRITE for our own
 * operation's request, which then has no outcome of its own (silent); 0 for a caller's send. */
static zs_err send_frame_as(sh_conn *c, const zs_frame *fin, sh_mr *m, const uint8_t *src, int rma,
                            void *user, zs_req **out)
{
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, "send"));
    uint8_t pkt[SH_PKT];
    zs_frame_encode(fin, pkt + SH_HDR);
    zs_frame f;
    if (zs_frame_decode(pkt + SH_HDR, &f) != ZS_OK)
        return zs_error(ZS_ERR_INVALID, "shm %s: send of a bad frame: %s", c->s.peer,
                        zs_last_error());
    sh_req *r = zs_rq_new(&c->s.net->reqs, c->s.net, ZS_RQ_SEND, c, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "shm: out of memory");
    r->frame = f;
    r->rma = rma;
    r->silent = rma != 0;
    if (out)
        *out = (zs_req *)r;
    size_t len = SH_HDR + ZS_FRAME_HEADER_BYTES;
    if (f.length <= SH_EAGER_MAX) {
        header(pkt, MSG_EAGER, 0, 0, 0);
        if (f.length)
            memcpy(pkt + len, src, f.length);
        send_pkt(c, pkt, len + f.length);
        zs_rq_finish(r, c->s.closed ? ZS_ERR_IO : ZS_OK, c->s.reason);
        return ZS_OK;
    }
    r->token = ++c->s.next_token;
    r->mr = &m->reg;
    m->reg.refs++;
    r->state = ZS_RQ_AWAIT;
    r->deadline = zs_net_now_ms() + c->s.net->send_timeout_ms;
    zs_rq_list_add(&c->s.await, r);
    if (rma == ZS_RMA_SERVE)
        c->rma_out++;
    header(pkt, MSG_RNDV, 0, r->token, (uintptr_t)src);
    if (m->id) {
        offer_region(c, m);
        zs_le_put32(pkt + 12, m->id);
    }
    send_pkt(c, pkt, len); /* a failure fails r with the connection */
    return ZS_OK;
}

/* A caller's send. */
static zs_err send_frame(sh_conn *c, const zs_frame *fin, sh_mr *m, const uint8_t *src, void *user,
                         zs_req **out)
{
    return send_frame_as(c, fin, m, src, 0, user, out);
}

static zs_err sh_isend(zs_conn *cc, const zs_frame *f, zs_mr *mm, size_t off, void *user,
                       zs_req **out)
{
    sh_conn *c = (sh_conn *)cc;
    sh_mr *m = (sh_mr *)mm;
    if (out)
        *out = NULL;
    ZS_CHECK(check_region(c, "send", m, off, f->length, ZS_MR_SEND));
    return send_frame(c, f, m, m ? m->reg.base + off : NULL, user, out);
}

static zs_err sh_isend_inline(zs_conn *cc, const zs_frame *f, const void *data, void *user,
                              zs_req **out)
{
    sh_conn *c = (sh_conn *)cc;
    if (f->length > ZS_NET_INLINE_MAX) {
        if (out)
            *out = NULL;
        return zs_error(ZS_ERR_INVALID, "shm %s: inline send of %llu bytes, at most %d", c->s.peer,
                        (unsigned long long)f->length, ZS_NET_INLINE_MAX);
    }
    return send_frame(c, f, NULL, data, user, out);
}

static zs_err pending_frame(sh_conn *c, const char *what, zs_frame *f)
{
    ZS_CHECK(check_open(c, what));
    if (!c->pending)
        return zs_error(ZS_ERR_INVALID, "shm %s: %s without a pending header", c->s.peer, what);
    zs_frame_decode(c->pending->b + SH_HDR, f);
    return ZS_OK;
}

static void pending_done(sh_conn *c)
{
    free(c->pending);
    c->pending = NULL;
    c->s.dirty = 1;
}

static zs_err sh_recv_payload(zs_conn *cc, zs_mr *mm, size_t off, void *user, zs_req **out)
{
    sh_conn *c = (sh_conn *)cc;
    sh_mr *m = (sh_mr *)mm;
    if (out)
        *out = NULL;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "recv_payload", &f));
    if (c->viewing)
        return zs_error(ZS_ERR_INVALID, "shm recv_payload %s: the payload is viewed in place",
                        c->s.peer);
    ZS_CHECK(check_region(c, "receive", m, off, f.length, ZS_MR_RECV));
    sh_req *r = zs_rq_new(&c->s.net->reqs, c->s.net, ZS_RQ_RECV, c, user, out != NULL);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "shm: out of memory");
    r->frame = f;
    r->id = f.id;
    zs_rq_use(r, &m->reg, off);
    if (out)
        *out = (zs_req *)r;
    sh_pkt *p = c->pending;
    c->pending = NULL;
    take_payload(c, p->b, r, 0);
    free(p);
    c->s.dirty = 1;
    return ZS_OK;
}

static zs_err sh_discard(zs_conn *cc)
{
    sh_conn *c = (sh_conn *)cc;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "discard", &f));
    skip_payload(c, c->pending->b);
    c->viewing = 0;
    pending_done(c);
    return ZS_OK;
}

static zs_err sh_view_payload(zs_conn *cc, const void **data)
{
    sh_conn *c = (sh_conn *)cc;
    *data = NULL;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "view_payload", &f));
    const uint8_t *p = c->pending->b, *src = p + SH_HDR + ZS_FRAME_HEADER_BYTES;
    pid_t pid = 0;
    if (p[4] == MSG_RNDV && f.length > 0 && payload_source(c, p, f.length, &src, &pid) != 0) {
        payload_outside(c, p, f.length);
        return zs_error(ZS_ERR_FORMAT, "shm view_payload %s: %s", c->s.peer, c->s.reason);
    }
    if (pid != 0)
        return ZS_OK; /* in the peer's memory, not mapped here: recv_payload copies it */
    c->viewing = 1;
    *data = src;
    return ZS_OK;
}

static zs_err sh_view_release(zs_conn *cc)
{
    sh_conn *c = (sh_conn *)cc;
    zs_frame f;
    ZS_CHECK(pending_frame(c, "view_release", &f));
    if (!c->viewing)
        return zs_error(ZS_ERR_INVALID, "shm view_release %s: the pending payload is not viewed",
                        c->s.peer);
    c->viewing = 0;
    if (c->pending->b[4] == MSG_RNDV)
        send_done(c, zs_le_get64(c->pending->b + 16), 0);
    if (c->pending) /* a DONE that fails the connection frees it */
        pending_done(c);
    return ZS_OK;
}

static zs_err sh_cancel(zs_req *rq)
{
    sh_req *r = (sh_req *)rq;
    ZS_CHECK(zs_rq_check_handle(r, "cancel"));
    if (r->rma && r->state != ZS_RQ_DONE)
        return zs_error(ZS_ERR_INVALID,
                        "shm cancel %s: a one-sided %s cannot be recalled (its bytes may "
                        "still move); wait for it",
                        ((sh_conn *)r->conn)->s.peer, r->rma == ZS_RMA_WRITE ? "write" : "read");
    switch (r->state) {
    case ZS_RQ_EXPECTED:
        zs_rq_orphan(r);
        return ZS_OK;
    case ZS_RQ_AWAIT:
        return zs_error(ZS_ERR_INVALID,
                        "shm %s: send of %s id %llu is being read by the peer; it cannot be "
                        "recalled",
                        ((sh_conn *)r->conn)->s.peer, zs_frame_op_name(r->frame.op),
                        (unsigned long long)r->frame.id);
    default:
        zs_rq_release(r);
        return ZS_OK;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* one-sided operations: the tcp scheme (tcp.c) over our packets.  The owner's net checks each
 * against its regions and answers with frames; the bytes move as any payload does here, read
 * by the receiving side out of the sender's memory (the mapped memfd, or process_vm_readv). */

/* Answers the peer's one-sided operation f: frame `op` with the same id, key, address and
 * bytes, carrying m's bytes at off (RMA_DATA), or a refusal (ZS_OP_ERROR, ZS_FS_BAD_KEY) with
 * why as its text. */
static void rma_answer(sh_conn *c, const zs_frame *f, int op, sh_mr *m, size_t off, const char *why)
{
    size_t wl = op == ZS_OP_ERROR ? strlen(why) : 0;
    zs_frame rf = zs_rma_answer(f, op, wl < SH_EAGER_MAX ? wl : SH_EAGER_MAX);
    const uint8_t *src = m ? m->reg.base + off : (const uint8_t *)why;
    if (send_frame_as(c, &rf, m, src, ZS_RMA_SERVE, NULL, NULL) != ZS_OK && !c->s.closed)
        conn_fail(c, ZS_ERR_NOMEM, "answering a one-sided %s: %s", zs_frame_op_name(f->op),
                  zs_last_error());
}

/* The peer's RMA_READ or RMA_WRITE f in packet p: checked against this net's regions and
 * carried out without the caller.  A write's answer comes after its payload was taken (or
 * skipped), and so after the DONE that frees the peer's buffer. */
static void rma_serve(sh_conn *c, const uint8_t *p, const zs_frame *f)
{
    sh_net *n = net_of(c);
    int write = f->op == ZS_OP_RMA_WRITE;
    char why[ZS_NET_REASON_MAX];
    sh_mr *m =
        (sh_mr *)zs_region_lookup(n->s.mrs, f->step, f->offset, f->count,
                                  write ? ZS_MR_REMOTE_WRITE : ZS_MR_REMOTE_READ, why, sizeof why);
    size_t off = m ? (size_t)(f->offset - (uint64_t)(uintptr_t)m->reg.base) : 0;
    if (!write) {
        rma_answer(c, f, m ? ZS_OP_RMA_DATA : ZS_OP_ERROR, m, off, why);
        return;
    }
    if (!m) {
        skip_payload(c, p);
        rma_answer(c, f, ZS_OP_ERROR, NULL, 0, why);
        return;
    }
    sh_req *r = zs_rq_new(&n->s.reqs, n, ZS_RQ_RECV, c, NULL, 0);
    if (!r) {
        skip_payload(c, p);
        conn_fail(c, ZS_ERR_NOMEM, "out of memory serving a one-sided write");
        return;
    }
    r->silent = 1;
    r->rma = ZS_RMA_SERVE;
    r->frame = *f;
    r->len = f->length;
    zs_rq_use(r, &m->reg, off);
    take_payload(c, p, r, 0); /* done (released) or, on a failure, failed with the connection */
    if (c->s.closed)
        return;
    rma_answer(c, f, ZS_OP_RMA_ACK, NULL, 0, NULL);
    if (f->flags & ZS_FRAME_FLAG_NOTIFY) {
        zs_event *e = zs_evq_push(&n->s.evq, ZS_EV_WRITTEN, (zs_conn *)c, "shm");
        if (e)
            e->frame = *f;
    }
}

/* The answer f (in packet p) to our one-sided operation r, which is off the expect list. */
static void rma_reply(sh_conn *c, const uint8_t *p, sh_req *r, const zs_frame *f)
{
    char why[ZS_NET_REASON_MAX];
    zs_err e = zs_rma_check_answer("shm", c->s.peer, r, f, why, sizeof why);
    if (e != ZS_OK) {
        skip_payload(c, p);
        zs_rq_finish(r, e, why);
        if (e != ZS_ERR_INVALID) /* not a refusal: a confused peer */
            conn_fail(c, e, "%s", why);
        return;
    }
    r->frame.length = f->length; /* what take_payload copies; the op stays ours */
    take_payload(c, p, r, 1);
}

/* iread (write 0) and iwrite: the answer expected under a fresh id of the backend's range,
 * then the request sent (silent: the operation's outcome is the answer's). */
static zs_err rma_start(zs_conn *cc, int write, zs_mr *mm, size_t off, const zs_mr_desc *rd,
                        uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                        zs_req **out)
{
    sh_conn *c = (sh_conn *)cc;
    sh_net *n = net_of(c);
    sh_mr *m = (sh_mr *)mm;
    if (out)
        *out = NULL;
    ZS_CHECK(check_open(c, write ? "iwrite" : "iread"));
    sh_req *r;
    ZS_CHECK(zs_rma_expect(&n->s.reqs, n, c, c->s.peer, &c->s.expect, &n->rma_next_id, write,
                           m ? &m->reg : NULL, off, rd, remote_off, len, notify, imm, user,
                           out != NULL, &r));
    zs_err e = send_frame_as(c, &r->frame, write ? m : NULL, write ? m->reg.base + off : NULL,
                             r->rma, NULL, NULL);
    if (e != ZS_OK) {
        zs_rq_list_del(&c->s.expect, r);
        zs_rq_release(r);
        return e;
    }
    if (out)
        *out = (zs_req *)r;
    return ZS_OK;
}

static zs_err sh_mr_export(zs_mr *mr, zs_mr_desc *out)
{
    return zs_region_export("shm", mr ? &((sh_mr *)mr)->reg : NULL, out);
}

static zs_err sh_iread(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                       uint64_t remote_off, size_t len, void *user, zs_req **req)
{
    return rma_start(c, 0, mr, off, remote, remote_off, len, 0, 0, user, req);
}

static zs_err sh_iwrite(zs_conn *c, zs_mr *mr, size_t off, const zs_mr_desc *remote,
                        uint64_t remote_off, size_t len, int notify, uint32_t imm, void *user,
                        zs_req **req)
{
    return rma_start(c, 1, mr, off, remote, remote_off, len, notify, imm, user, req);
}

const zs_transport_ops zs_shm_ops = {
    .version = ZS_TRANSPORT_OPS_VERSION,
    .name = "shm",
    .open = sh_open,
    .set_opts = sh_set_opts,
    .close = sh_close,
    .listen = sh_listen,
    .listener_port = zs_setup_listener_port,
    .listener_endpoint = zs_setup_listener_endpoint,
    .listener_close = sh_listener_close,
    .accept = zs_setup_accept,
    .connect = sh_connect,
    .conn_peer = zs_setup_conn_peer,
    .conn_set_user = zs_setup_conn_set_user,
    .conn_user = zs_setup_conn_user,
    .conn_member = zs_setup_conn_member,
    .conn_closed = zs_setup_conn_closed,
    .conn_close = zs_setup_conn_close,
    .reg_mr = sh_reg_mr,
    .dereg_mr = sh_dereg_mr,
    .isend = sh_isend,
    .isend_inline = sh_isend_inline,
    .irecv = zs_setup_irecv,
    .recv_payload = sh_recv_payload,
    .discard = sh_discard,
    .view_payload = sh_view_payload,
    .view_release = sh_view_release,
    .test = zs_setup_test,
    .wait = zs_setup_wait,
    .cancel = sh_cancel,
    .mr_export = sh_mr_export,
    .iread = sh_iread,
    .iwrite = sh_iwrite,
    .flush = zs_setup_flush,
    .poll = zs_setup_poll,
    .wait_fd = zs_setup_wait_fd,
    .reg_dmabuf_mr = sh_reg_dmabuf_mr,
};
