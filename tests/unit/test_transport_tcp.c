/*
 * test_transport_tcp: the TCP backend over real sockets on 127.0.0.1.
 *
 * Two test servers run in threads, each with its own zs_net, serving the way a partition
 * server will: a fetch is answered from the server's registered "pattern" buffer without a
 * copy; a push is received straight into a "stage" buffer and, only once complete, copied
 * to "committed" (what a partition server would accumulate) and answered with a hash of the
 * bytes; an ERROR frame from a client is echoed (the 1-byte payload case); a request outside
 * the buffers gets an ERROR frame (BAD_RANGE) and its payload is discarded.  The main thread
 * is the client (its own zs_net), plus raw sockets that misbehave.  No assertion depends on
 * timing; waits have generous deadlines only so that a bug fails instead of hanging.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "test.h"
#include "transport/tcp.h"

#define MIB ((size_t)1 << 20)
#define SERVE_BYTES (40 * MIB) /* pattern, stage and committed, per server */
#define DEADLINE_MS 20000

static const zs_transport_ops *T = &zs_tcp_ops;

static uint8_t pattern_byte(size_t i)
{
    return (uint8_t)((i * 131u) ^ (i >> 9) ^ 0x5a);
}

static uint8_t source_byte(size_t i)
{
    return (uint8_t)((i * 7u + 3u) ^ (i >> 11));
}

#define fnv zs_test_fnv

#define now_ms() ((int64_t)zs_now_ms())

/* ---------------------------------------------------------------------------------------- */
/* the test server */

typedef struct {
    zs_net *net;
    zs_listener *l;
    int port;
    uint8_t *pattern, *stage, *committed, *echo;
    zs_mr *pattern_mr, *stage_mr, *echo_mr;
    pthread_t th;
    pthread_mutex_t mu; /* guards committed and everything below */
    int stop;
    int accepted, closed, closed_format, fetches, pushes_ok, pushes_failed, rejected;
    char last_closed[ZS_NET_REASON_MAX];
    char last_push_failure[ZS_NET_REASON_MAX];
} server;

typedef struct {
    zs_frame f; /* the push being received */
    int echo;   /* an ERROR to echo */
} push_ctx;

static void server_reject(server *s, zs_conn *c, const zs_frame *f, zs_frame_status st,
                          const char *why)
{
    zs_frame e = {.op = ZS_OP_ERROR,
                  .dtype = ZS_DTYPE_TEXT,
                  .status = st,
                  .id = f->id,
                  .offset = f->offset,
                  .count = f->count,
                  .length = strlen(why)};
    /* counted first: the client may see the reply before this thread runs again */
    pthread_mutex_lock(&s->mu);
    s->rejected++;
    pthread_mutex_unlock(&s->mu);
    if (T->isend_inline(c, &e, why, NULL, NULL) != ZS_OK)
        fprintf(stderr, "server: reject: %s\n", zs_last_error());
}

static void server_header(server *s, zs_conn *c, const zs_frame *f)
{
    size_t es = zs_frame_dtype_size((zs_frame_dtype)f->dtype);
    if (f->op == ZS_OP_FETCH) {
        uint64_t off = f->offset * es, bytes = f->count * es;
        if (f->offset > SERVE_BYTES || off + bytes > SERVE_BYTES) {
            server_reject(s, c, f, ZS_FS_BAD_RANGE, "fetch outside the served range");
            return;
        }
        zs_frame r = {.op = ZS_OP_FETCH_REPLY,
                      .dtype = f->dtype,
                      .id = f->id,
                      .step = f->step,
                      .offset = f->offset,
                      .count = f->count,
                      .length = bytes};
        if (T->isend(c, &r, bytes ? s->pattern_mr : NULL, off, NULL, NULL) != ZS_OK)
            fprintf(stderr, "server: reply: %s\n", zs_last_error());
        pthread_mutex_lock(&s->mu);
        s->fetches++;
        pthread_mutex_unlock(&s->mu);
    } else if (f->op == ZS_OP_PUSH) {
        uint64_t off = f->offset * es;
        if (f->offset > SERVE_BYTES || off + f->length > SERVE_BYTES) {
            server_reject(s, c, f, ZS_FS_BAD_RANGE, "push outside the served range");
            if (f->length)
                T->discard(c);
            return;
        }
        if (f->length == 0) {
            zs_frame r = {.op = ZS_OP_PUSH_REPLY, .id = f->id, .step = fnv(NULL, 0)};
            T->isend(c, &r, NULL, 0, NULL, NULL);
            return;
        }
        push_ctx *p = calloc(1, sizeof *p);
        p->f = *f;
        if (T->recv_payload(c, s->stage_mr, off, p, NULL) != ZS_OK) {
            free(p);
            /* A connection that failed since the header (its peer ended the stream short of
             * the payload) is closed by its ZS_EV_CLOSED, perhaps in this very batch. */
            if (!T->conn_closed(c)) {
                fprintf(stderr, "server: recv_payload: %s\n", zs_last_error());
                T->conn_close(c);
            }
        }
    } else if (f->op == ZS_OP_ERROR) {
        if (f->length == 0) {
            zs_frame r = *f;
            T->isend(c, &r, NULL, 0, NULL, NULL);
            return;
        }
        push_ctx *p = calloc(1, sizeof *p);
        p->f = *f;
        p->echo = 1;
        T->recv_payload(c, s->echo_mr, 0, p, NULL);
    } else if (f->length) {
        T->discard(c);
    }
}

static void server_recv_done(server *s, zs_event *ev)
{
    push_ctx *p = ev->user;
    if (ev->err != ZS_OK) {
        pthread_mutex_lock(&s->mu);
        if (!p->echo)
            s->pushes_failed++;
        snprintf(s->last_push_failure, sizeof s->last_push_failure, "%s", ev->reason);
        pthread_mutex_unlock(&s->mu);
    } else if (p->echo) {
        T->isend_inline(ev->conn, &p->f, s->echo, NULL, NULL);
    } else {
        uint64_t off = p->f.offset * zs_frame_dtype_size((zs_frame_dtype)p->f.dtype);
        pthread_mutex_lock(&s->mu);
        memcpy(s->committed + off, s->stage + off, p->f.length);
        s->pushes_ok++;
        pthread_mutex_unlock(&s->mu);
        zs_frame r = {
            .op = ZS_OP_PUSH_REPLY, .id = p->f.id, .step = fnv(s->stage + off, p->f.length)};
        if (ev->conn && !T->conn_closed(ev->conn))
            T->isend(ev->conn, &r, NULL, 0, NULL, NULL);
    }
    free(p);
}

static void *server_main(void *arg)
{
    server *s = arg;
    zs_event ev[32];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        int n;
        if (T->poll(s->net, ev, 32, 20, &n) != ZS_OK) {
            fprintf(stderr, "server: poll: %s\n", zs_last_error());
            break;
        }
        for (int i = 0; i < n; i++) {
            switch (ev[i].type) {
            case ZS_EV_ACCEPT:
                pthread_mutex_lock(&s->mu);
                s->accepted++;
                pthread_mutex_unlock(&s->mu);
                break;
            case ZS_EV_HEADER:
                server_header(s, ev[i].conn, &ev[i].frame);
                break;
            case ZS_EV_RECV:
                server_recv_done(s, &ev[i]);
                break;
            case ZS_EV_SEND:
            case ZS_EV_WRITTEN: /* counted by the one-sided tests' own server */
            case ZS_EV_REFUSED: /* no authentication here: never */
                break;
            case ZS_EV_CLOSED:
                pthread_mutex_lock(&s->mu);
                s->closed++;
                s->closed_format += ev[i].err == ZS_ERR_FORMAT;
                snprintf(s->last_closed, sizeof s->last_closed, "%s", ev[i].reason);
                pthread_mutex_unlock(&s->mu);
                T->conn_close(ev[i].conn);
                break;
            }
        }
    }
    return NULL;
}

static int server_start(server *s, int batch_sends)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->pattern = malloc(SERVE_BYTES);
    s->stage = calloc(1, SERVE_BYTES);
    s->committed = calloc(1, SERVE_BYTES);
    s->echo = malloc(ZS_FRAME_MAX_ERROR_TEXT);
    for (size_t i = 0; i < SERVE_BYTES; i++)
        s->pattern[i] = pattern_byte(i);
    zs_net_opts no = {.batch_sends = batch_sends};
    if (T->open(&s->net) || T->set_opts(s->net, &no) ||
        T->listen(s->net, "127.0.0.1:0", NULL, &s->l) ||
        T->reg_mr(s->net, s->pattern, SERVE_BYTES, ZS_MR_SEND, &s->pattern_mr) ||
        T->reg_mr(s->net, s->stage, SERVE_BYTES, ZS_MR_RECV, &s->stage_mr) ||
        T->reg_mr(s->net, s->echo, ZS_FRAME_MAX_ERROR_TEXT, ZS_MR_RECV, &s->echo_mr)) {
        fprintf(stderr, "server_start: %s\n", zs_last_error());
        return -1;
    }
    s->port = T->listener_port(s->l);
    return pthread_create(&s->th, NULL, server_main, s);
}

static void server_stop(server *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    T->close(s->net);
    free(s->pattern);
    free(s->stage);
    free(s->committed);
    free(s->echo);
    pthread_mutex_destroy(&s->mu);
}

/* Reads one of the server's counters under its lock. */
static int server_get(server *s, const int *field)
{
    pthread_mutex_lock(&s->mu);
    int v = *field;
    pthread_mutex_unlock(&s->mu);
    return v;
}

/* Waits (generously) until the counter reaches at least want. */
static int server_wait(server *s, const int *field, int want)
{
    int64_t end = now_ms() + DEADLINE_MS;
    while (server_get(s, field) < want && now_ms() < end)
        usleep(1000);
    return server_get(s, field);
}

/* ---------------------------------------------------------------------------------------- */
/* client helpers */

static char addr_buf[64];
static const char *addr_of(const server *s)
{
    snprintf(addr_buf, sizeof addr_buf, "127.0.0.1:%d", s->port);
    return addr_buf;
}

static uint64_t next_id = 1;

/* Posts the reply receive, then sends the fetch; *rr is the reply's handle, *sr the send's. */
static zs_err start_fetch(zs_conn *c, uint64_t id, uint64_t offset, uint64_t count,
                          zs_frame_dtype dt, zs_mr *dst, size_t dst_off, zs_req **rr, zs_req **sr)
{
    size_t cap = count * zs_frame_dtype_size(dt);
    ZS_CHECK(T->irecv(c, id, cap ? dst : NULL, dst_off, cap, NULL, rr));
    zs_frame f = {
        .op = ZS_OP_FETCH, .dtype = dt, .id = id, .step = 1, .offset = offset, .count = count};
    return T->isend(c, &f, NULL, 0, NULL, sr);
}

static zs_err start_push(zs_conn *c, uint64_t id, uint64_t offset, uint64_t count, zs_mr *src,
                         size_t src_off, zs_mr *reply_mr, size_t reply_off, zs_req **rr,
                         zs_req **sr)
{
    ZS_CHECK(T->irecv(c, id, reply_mr, reply_off, ZS_FRAME_MAX_ERROR_TEXT, NULL, rr));
    zs_frame f = {.op = ZS_OP_PUSH,
                  .dtype = ZS_DTYPE_F32,
                  .id = id,
                  .step = 1,
                  .chunk = 0,
                  .sender = 1,
                  .offset = offset,
                  .count = count,
                  .length = count * 4};
    return T->isend(c, &f, count ? src : NULL, src_off, NULL, sr);
}

static zs_err wait_req(zs_req *r, zs_frame *f)
{
    int done = 0;
    zs_err e = T->wait(r, DEADLINE_MS, &done, f);
    if (e == ZS_OK && !done)
        return zs_error(ZS_ERR_IO, "request did not finish within %d ms", DEADLINE_MS);
    return e;
}

/* A blocking raw socket to the server, with receive timeouts so that a bug cannot hang. */
static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = DEADLINE_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, (uint8_t *)buf + got, n - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* tests */

typedef struct {
    zs_net *net;
    uint8_t *dst, *src, *reply;
    zs_mr *dst_mr, *src_mr, *reply_mr;
} client;

#define CLIENT_BYTES (40 * MIB)
#define REPLY_SLOTS 1024

static void client_open(client *cl, int batch_sends)
{
    memset(cl, 0, sizeof *cl);
    cl->dst = calloc(1, CLIENT_BYTES);
    cl->src = malloc(CLIENT_BYTES);
    cl->reply = calloc(REPLY_SLOTS, ZS_FRAME_MAX_ERROR_TEXT);
    for (size_t i = 0; i < CLIENT_BYTES; i++)
        cl->src[i] = source_byte(i);
    zs_net_opts no = {.batch_sends = batch_sends};
    CHECK_OK(T->open(&cl->net));
    CHECK_OK(T->set_opts(cl->net, &no));
    CHECK_OK(T->reg_mr(cl->net, cl->dst, CLIENT_BYTES, ZS_MR_RECV, &cl->dst_mr));
    CHECK_OK(T->reg_mr(cl->net, cl->src, CLIENT_BYTES, ZS_MR_SEND, &cl->src_mr));
    CHECK_OK(T->reg_mr(cl->net, cl->reply, (size_t)REPLY_SLOTS * ZS_FRAME_MAX_ERROR_TEXT,
                       ZS_MR_RECV | ZS_MR_SEND, &cl->reply_mr));
}

static void client_close(client *cl)
{
    T->close(cl->net);
    free(cl->dst);
    free(cl->src);
    free(cl->reply);
}

/* One fetch of `bytes` (f32, or bf16 when bytes is not a multiple of 4) and a check of the
 * bytes that landed. */
static void fetch_check(client *cl, zs_conn *c, size_t bytes, size_t at)
{
    zs_frame_dtype dt = bytes % 4 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32;
    size_t es = zs_frame_dtype_size(dt);
    uint64_t offset = at / es, count = bytes / es;
    zs_req *rr, *sr;
    zs_frame f;
    uint64_t id = next_id++;
    memset(cl->dst, 0xEE, bytes + 16);
    CHECK_OK(start_fetch(c, id, offset, count, dt, cl->dst_mr, 0, &rr, &sr));
    CHECK_OK(wait_req(sr, NULL));
    CHECK_OK(wait_req(rr, &f));
    CHECK_EQ_INT(f.op, ZS_OP_FETCH_REPLY);
    CHECK_EQ_INT(f.id, id);
    CHECK_EQ_INT(f.length, bytes);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++)
        bad += cl->dst[i] != pattern_byte(offset * es + i);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(cl->dst[bytes], 0xEE); /* nothing written past the payload */
}

static void push_check(client *cl, server *s, zs_conn *c, size_t bytes, size_t at)
{
    uint64_t offset = at / 4, count = bytes / 4;
    zs_req *rr, *sr;
    zs_frame f;
    uint64_t id = next_id++;
    CHECK_OK(start_push(c, id, offset, count, cl->src_mr, at, cl->reply_mr, 0, &rr, &sr));
    CHECK_OK(wait_req(sr, NULL));
    CHECK_OK(wait_req(rr, &f));
    CHECK_EQ_INT(f.op, ZS_OP_PUSH_REPLY);
    CHECK_EQ_INT(f.id, id);
    CHECK(f.step == fnv(cl->src + at, bytes));
    pthread_mutex_lock(&s->mu);
    CHECK(memcmp(s->committed + at, cl->src + at, bytes) == 0);
    pthread_mutex_unlock(&s->mu);
}

static void test_round_trips(server *s)
{
    static const size_t sizes[] = {0, 4096, 65536, 4 * MIB, 33 * MIB};
    for (int conns = 1; conns <= 2; conns++) {
        client cl;
        client_open(&cl, conns == 2 ? 1 : -1); /* batched sends with 2 streams */
        zs_conn *c;
        zs_conn_opts o = {.conns = conns};
        CHECK_OK(T->connect(cl.net, addr_of(s), &o, &c));
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            /* an odd element offset, so the range is not page aligned at the server */
            fetch_check(&cl, c, sizes[k], 4 * 1001);
            push_check(&cl, s, c, sizes[k], 4 * (1000 + 3 * (size_t)conns));
        }
        fetch_check(&cl, c, 2, 2 * 7); /* one bf16 element */

        /* 1 byte: an error text, echoed by the server. */
        zs_req *rr, *sr;
        zs_frame f, e = {.op = ZS_OP_ERROR,
                         .dtype = ZS_DTYPE_TEXT,
                         .status = ZS_FS_STALE,
                         .id = next_id++,
                         .length = 1};
        cl.reply[0] = 0;
        CHECK_OK(T->irecv(c, e.id, cl.reply_mr, 0, 16, NULL, &rr));
        CHECK_OK(T->isend_inline(c, &e, "!", NULL, &sr));
        CHECK_OK(wait_req(sr, NULL));
        CHECK_OK(wait_req(rr, &f));
        CHECK_EQ_INT(f.op, ZS_OP_ERROR);
        CHECK_EQ_INT(f.length, 1);
        CHECK_EQ_INT(f.status, ZS_FS_STALE);
        CHECK_EQ_INT(cl.reply[0], '!');
        client_close(&cl);
    }
}

/* Many requests in flight at once, to two servers, over two streams each, some as handles
 * and some reported as events. */
static void test_concurrent(server *s1, server *s2)
{
    enum { N = 400 };
    client cl;
    client_open(&cl, 1);
    zs_conn *c[2];
    zs_tcp_conn_opts bufs = {.sndbuf_bytes = 1 << 20, .rcvbuf_bytes = 1 << 20};
    zs_conn_opts o = {.conns = 2, .backend = &bufs, .backend_name = "tcp"};
    CHECK_OK(T->connect(cl.net, addr_of(s1), &o, &c[0]));
    CHECK_OK(T->connect(cl.net, addr_of(s2), &o, &c[1]));
    server *srv[2] = {s1, s2};
    struct {
        int push, srv;
        size_t at, bytes;
        uint64_t id;
        zs_req *rr, *sr;
        int done;
    } q[N];
    uint64_t x = 12345;
    size_t slot = 64 * 1024; /* each request owns a 64 KiB slot of dst or of the server range */
    int events_wanted = 0;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        q[i].push = (int)((x >> 33) & 1);
        q[i].srv = (int)((x >> 34) & 1);
        q[i].bytes = 4 * (((x >> 40) % (slot / 4)) + 1);
        q[i].at = (size_t)i * slot;
        q[i].id = next_id++;
        q[i].done = 0;
        int as_event = i % 4 == 3;
        zs_req **rr = as_event ? NULL : &q[i].rr;
        if (q[i].push) {
            CHECK_OK(T->irecv(c[q[i].srv], q[i].id, cl.reply_mr,
                              (size_t)(i % REPLY_SLOTS) * ZS_FRAME_MAX_ERROR_TEXT, 64, &q[i], rr));
            zs_frame f = {.op = ZS_OP_PUSH,
                          .dtype = ZS_DTYPE_F32,
                          .id = q[i].id,
                          .offset = q[i].at / 4,
                          .count = q[i].bytes / 4,
                          .length = q[i].bytes};
            CHECK_OK(T->isend(c[q[i].srv], &f, cl.src_mr, q[i].at, NULL, &q[i].sr));
        } else {
            CHECK_OK(T->irecv(c[q[i].srv], q[i].id, cl.dst_mr, q[i].at, q[i].bytes, &q[i], rr));
            zs_frame f = {.op = ZS_OP_FETCH,
                          .dtype = ZS_DTYPE_F32,
                          .id = q[i].id,
                          .offset = q[i].at / 4 + 17,
                          .count = q[i].bytes / 4};
            CHECK_OK(T->isend(c[q[i].srv], &f, NULL, 0, NULL, &q[i].sr));
        }
        events_wanted += as_event;
    }
    for (int i = 0; i < N; i++) {
        zs_frame f;
        CHECK_OK(wait_req(q[i].sr, NULL));
        if (i % 4 == 3)
            continue;
        CHECK_OK(wait_req(q[i].rr, &f));
        CHECK_EQ_INT(f.id, q[i].id);
        CHECK_EQ_INT(f.op, q[i].push ? ZS_OP_PUSH_REPLY : ZS_OP_FETCH_REPLY);
        if (q[i].push)
            CHECK(f.step == fnv(cl.src + q[i].at, q[i].bytes));
        q[i].done = 1;
    }
    /* the rest come as events */
    int64_t end = now_ms() + DEADLINE_MS;
    while (events_wanted > 0 && now_ms() < end) {
        zs_event ev[16];
        int n;
        CHECK_OK(T->poll(cl.net, ev, 16, 100, &n));
        for (int k = 0; k < n; k++) {
            if (ev[k].type != ZS_EV_RECV)
                continue;
            CHECK_EQ_INT(ev[k].err, ZS_OK);
            int i = (int)((char *)ev[k].user - (char *)&q[0]) / (int)sizeof q[0];
            CHECK(i >= 0 && i < N && i % 4 == 3 && !q[i].done);
            if (i < 0 || i >= N)
                continue;
            CHECK_EQ_INT(ev[k].frame.id, q[i].id);
            if (q[i].push)
                CHECK(ev[k].frame.step == fnv(cl.src + q[i].at, q[i].bytes));
            q[i].done = 1;
            events_wanted--;
        }
    }
    CHECK_EQ_INT(events_wanted, 0);
    size_t bad = 0;
    for (int i = 0; i < N; i++) {
        if (q[i].push) {
            pthread_mutex_lock(&srv[q[i].srv]->mu);
            bad += memcmp(srv[q[i].srv]->committed + q[i].at, cl.src + q[i].at, q[i].bytes) != 0;
            pthread_mutex_unlock(&srv[q[i].srv]->mu);
        } else {
            for (size_t b = 0; b < q[i].bytes; b++)
                bad += cl.dst[q[i].at + b] != pattern_byte(q[i].at + 17 * 4 + b);
        }
    }
    CHECK_EQ_INT(bad, 0);
    client_close(&cl);
}

/* A client that does not post receives sees replies header first, one pending at a time per
 * connection even with two streams, and places each payload itself. */
static void test_header_first_client(server *s)
{
    client cl;
    client_open(&cl, -1);
    zs_conn *c;
    zs_conn_opts o = {.conns = 2};
    CHECK_OK(T->connect(cl.net, addr_of(s), &o, &c));
    enum { N = 6 };
    for (int i = 0; i < N; i++) {
        zs_frame f = {.op = ZS_OP_FETCH,
                      .dtype = ZS_DTYPE_F32,
                      .id = 1000 + (uint64_t)i,
                      .offset = (uint64_t)i * 1024,
                      .count = 1024};
        CHECK_OK(T->isend(c, &f, NULL, 0, NULL, NULL));
    }
    int got = 0, sends = 0;
    unsigned headers = 0;
    int64_t end = now_ms() + DEADLINE_MS;
    while ((got < N || sends < N) && now_ms() < end) {
        zs_event ev[8];
        int n;
        CHECK_OK(T->poll(cl.net, ev, 8, 100, &n));
        for (int k = 0; k < n; k++) {
            if (ev[k].type == ZS_EV_SEND) {
                sends++;
            } else if (ev[k].type == ZS_EV_HEADER) {
                CHECK(ev[k].conn == c);
                uint64_t i = ev[k].frame.id - 1000;
                CHECK(i < N);
                if (i >= N)
                    continue;
                CHECK(!(headers & (1u << i))); /* each header reported once */
                headers |= 1u << i;
                CHECK_EQ_INT(ev[k].frame.length, 4096);
                CHECK_OK(T->recv_payload(c, cl.dst_mr, (size_t)i * 4096, NULL, NULL));
            } else if (ev[k].type == ZS_EV_RECV) {
                CHECK_EQ_INT(ev[k].err, ZS_OK);
                got++;
            }
        }
    }
    CHECK_EQ_INT(got, N);
    CHECK_EQ_INT(sends, N);
    size_t bad = 0;
    for (size_t b = 0; b < N * 4096; b++)
        bad += cl.dst[b] != pattern_byte(b);
    CHECK_EQ_INT(bad, 0);
    client_close(&cl);
}

/* A rejected request (ERROR frame) and an oversized reply leave the connection usable. */
static void test_rejects_keep_connection(server *s)
{
    client cl;
    client_open(&cl, -1);
    zs_conn *c;
    zs_req *rr, *sr;
    zs_frame f;
    CHECK_OK(T->connect(cl.net, addr_of(s), NULL, &c));
    int rejected = server_get(s, &s->rejected);

    /* A push outside the server's range: error frame back, payload skipped by the server. */
    uint64_t id = next_id++;
    CHECK_OK(start_push(c, id, SERVE_BYTES / 4 + 1, 65536, cl.src_mr, 0, cl.reply_mr, 0, &rr, &sr));
    CHECK_OK(wait_req(sr, NULL));
    CHECK_OK(wait_req(rr, &f));
    CHECK_EQ_INT(f.op, ZS_OP_ERROR);
    CHECK_EQ_INT(f.status, ZS_FS_BAD_RANGE);
    CHECK(f.length > 0 && memcmp(cl.reply, "push outside", 12) == 0);
    CHECK_EQ_INT(server_get(s, &s->rejected), rejected + 1);
    fetch_check(&cl, c, 65536, 0);

    /* A reply longer than the posted buffer fails that receive only. */
    id = next_id++;
    CHECK_OK(T->irecv(c, id, cl.dst_mr, 0, 100, NULL, &rr));
    zs_frame q = {.op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = id, .count = 1024};
    CHECK_OK(T->isend(c, &q, NULL, 0, NULL, NULL));
    CHECK_FAILS_WITH(wait_req(rr, NULL), "4096 bytes exceeds the 100 bytes posted");
    fetch_check(&cl, c, 4096, 8);

    /* A cancelled receive: its late reply is skipped without a trace, and the connection
     * goes on without the client having to poll. */
    id = next_id++;
    memset(cl.dst, 0x11, 8192);
    CHECK_OK(T->irecv(c, id, cl.dst_mr, 0, 8192, NULL, &rr));
    CHECK_OK(T->cancel(rr));
    q = (zs_frame){.op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = id, .count = 2048};
    CHECK_OK(T->isend(c, &q, NULL, 0, NULL, NULL));
    fetch_check(&cl, c, 4096, 4096 * 3); /* answered after the cancelled one, same stream */
    CHECK_EQ_INT(cl.dst[5000], 0x11);    /* the cancelled reply did not land */
    zs_event ev[8];
    int n, headers = 0;
    do {
        CHECK_OK(T->poll(cl.net, ev, 8, 0, &n));
        for (int k = 0; k < n; k++)
            headers += ev[k].type == ZS_EV_HEADER;
    } while (n > 0);
    CHECK_EQ_INT(headers, 0);
    fetch_check(&cl, c, 64, 0);
    client_close(&cl);
}

/* Bad magic, version and op: the sender gets an ERROR frame (BAD_FRAME) naming the field,
 * then end of stream; the server logs the reason and serves the others. */
static void test_bad_headers(server *s)
{
    client cl;
    client_open(&cl, -1);
    zs_conn *good;
    CHECK_OK(T->connect(cl.net, addr_of(s), NULL, &good));
    struct {
        int off, n;
        uint64_t v;
        const char *needle;
    } cases[] = {
        {0, 4, 0xdeadbeef, "magic 0xdeadbeef"},  {4, 2, 2, "version 2 is not 1"},
        {6, 2, 11, "op 11 is not a known op"},   {9, 1, 4, "flags 0x04"},
        {56, 8, 5, "length 5 for op 1 (fetch)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int closed = server_get(s, &s->closed_format);
        int fd = raw_connect(s->port);
        CHECK(fd >= 0);
        zs_frame f = {.op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = 77, .count = 4};
        uint8_t hdr[ZS_FRAME_HEADER_BYTES], back[ZS_FRAME_HEADER_BYTES];
        zs_frame_encode(&f, hdr);
        for (int i = 0; i < cases[k].n; i++)
            hdr[cases[k].off + i] = (uint8_t)(cases[k].v >> (8 * i));
        CHECK(send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) == (ssize_t)sizeof hdr);
        CHECK(read_full(fd, back, sizeof back) == 0);
        zs_frame e;
        CHECK_OK(zs_frame_decode(back, &e));
        CHECK_EQ_INT(e.op, ZS_OP_ERROR);
        CHECK_EQ_INT(e.status, ZS_FS_BAD_FRAME);
        CHECK_EQ_INT(e.id, 77);
        char text[ZS_FRAME_MAX_ERROR_TEXT + 1] = {0};
        CHECK(e.length > 0 && e.length <= ZS_FRAME_MAX_ERROR_TEXT);
        CHECK(read_full(fd, text, e.length) == 0);
        if (!strstr(text, cases[k].needle)) {
            fprintf(stderr, "error text \"%s\" lacks \"%s\"\n", text, cases[k].needle);
            CHECK(0);
        }
        char one;
        CHECK(recv(fd, &one, 1, 0) == 0); /* then the end of the stream */
        close(fd);
        CHECK_EQ_INT(server_wait(s, &s->closed_format, closed + 1), closed + 1);
        pthread_mutex_lock(&s->mu);
        CHECK(strstr(s->last_closed, cases[k].needle) != NULL);
        CHECK(strstr(s->last_closed, "tcp 127.0.0.1:") != NULL);
        pthread_mutex_unlock(&s->mu);
        fetch_check(&cl, good, 4096, 4 * k);
    }
    client_close(&cl);
}

/* Random bytes close that connection only, while another client is being served. */
static void test_random_bytes(server *s)
{
    client cl;
    client_open(&cl, -1);
    zs_conn *good;
    CHECK_OK(T->connect(cl.net, addr_of(s), NULL, &good));
    for (int round = 0; round < 3; round++) {
        int closed = server_get(s, &s->closed_format);
        int fd = raw_connect(s->port);
        CHECK(fd >= 0);
        uint8_t junk[64 * 1024];
        uint64_t x = 0x1234567ull + (uint64_t)round;
        for (size_t i = 0; i < sizeof junk; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            junk[i] = (uint8_t)x;
        }
        /* may fail part way: the server can close before it read everything */
        (void)send(fd, junk, sizeof junk, MSG_NOSIGNAL);
        fetch_check(&cl, good, 65536, 4 * (size_t)round);
        CHECK_EQ_INT(server_wait(s, &s->closed_format, closed + 1), closed + 1);
        /* The misbehaving peer ends with end of stream or a reset; never a hang. */
        uint8_t buf[4096];
        ssize_t k;
        while ((k = recv(fd, buf, sizeof buf, 0)) > 0)
            ;
        CHECK(k == 0 || (k < 0 && (errno == ECONNRESET || errno == EPIPE)));
        close(fd);
        fetch_check(&cl, good, 4096, 4 * (size_t)round);
    }
    client_close(&cl);
}

/* A peer that leaves mid-frame: the server's receive fails ("mid-payload"), nothing is
 * committed, the other connections go on. */
static void test_disconnect_mid_frame(server *s)
{
    client cl;
    client_open(&cl, -1);
    zs_conn *good;
    CHECK_OK(T->connect(cl.net, addr_of(s), NULL, &good));
    size_t at = 20 * MIB, bytes = 1 * MIB;

    uint8_t *before = malloc(bytes);
    pthread_mutex_lock(&s->mu);
    memcpy(before, s->committed + at, bytes);
    pthread_mutex_unlock(&s->mu);
    int failed = server_get(s, &s->pushes_failed), ok = server_get(s, &s->pushes_ok);
    int fd = raw_connect(s->port);
    CHECK(fd >= 0);
    zs_frame f = {.op = ZS_OP_PUSH,
                  .dtype = ZS_DTYPE_F32,
                  .id = 5,
                  .step = 1,
                  .offset = at / 4,
                  .count = bytes / 4,
                  .length = bytes};
    uint8_t hdr[ZS_FRAME_HEADER_BYTES];
    zs_frame_encode(&f, hdr);
    CHECK(send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) == (ssize_t)sizeof hdr);
    CHECK(send(fd, cl.src, 100 * 1024, MSG_NOSIGNAL) == 100 * 1024);
    close(fd);
    CHECK_EQ_INT(server_wait(s, &s->pushes_failed, failed + 1), failed + 1);
    CHECK_EQ_INT(server_get(s, &s->pushes_ok), ok);
    pthread_mutex_lock(&s->mu);
    CHECK(strstr(s->last_push_failure, "mid-payload (102400 of 1048576 bytes of push id 5)"));
    CHECK(memcmp(before, s->committed + at, bytes) == 0);  /* nothing of it committed */
    CHECK(memcmp(s->stage + at, cl.src, 100 * 1024) == 0); /* though it was received */
    pthread_mutex_unlock(&s->mu);
    free(before);
    fetch_check(&cl, good, 65536, 0);

    /* Mid-header. */
    int closed = server_get(s, &s->closed);
    fd = raw_connect(s->port);
    CHECK(fd >= 0);
    CHECK(send(fd, hdr, 30, MSG_NOSIGNAL) == 30);
    close(fd);
    CHECK(server_wait(s, &s->closed, closed + 1) >= closed + 1);
    pthread_mutex_lock(&s->mu);
    CHECK(strstr(s->last_closed, "mid-header (30 of 64 bytes)") != NULL);
    pthread_mutex_unlock(&s->mu);

    /* The client's own view when the server goes away with a reply half sent is tested in
     * test_local_pair; here the good connection still works. */
    push_check(&cl, s, good, 4096, at);
    client_close(&cl);
}

/* Both ends in one thread and one net: accept(), header-first receive on the server side,
 * the client seeing its peer close mid-payload, and API misuse. */
static void test_local_pair(void)
{
    zs_net *net;
    zs_listener *l;
    zs_conn *cli, *srv;
    CHECK_OK(T->open(&net));
    zs_tcp_conn_opts small_bufs = {.sndbuf_bytes = 64 * 1024, .rcvbuf_bytes = 64 * 1024};
    zs_conn_opts small = {.backend = &small_bufs, .backend_name = "tcp"};
    CHECK_OK(T->listen(net, "127.0.0.1:0", &small, &l));
    int port = T->listener_port(l);
    CHECK(port > 0);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    CHECK_OK(T->connect(net, addr, &small, &cli));
    CHECK_OK(T->accept(l, DEADLINE_MS, &srv));
    CHECK(srv != NULL);
    if (!srv)
        return;
    CHECK(strncmp(T->conn_peer(srv), "127.0.0.1:", 10) == 0);
    CHECK(!strcmp(T->conn_peer(cli), addr));
    T->conn_set_user(srv, &port);
    CHECK(T->conn_user(srv) == &port);
    zs_conn *none;
    CHECK_OK(T->accept(l, 0, &none));
    CHECK(none == NULL);

    size_t len = 8 * MIB;
    uint8_t *a = malloc(len), *b = calloc(1, len);
    for (size_t i = 0; i < len; i++)
        a[i] = source_byte(i);
    zs_mr *ma, *mb, *mro;
    CHECK_OK(T->reg_mr(net, a, len, ZS_MR_SEND, &ma));
    CHECK_OK(T->reg_mr(net, b, len, ZS_MR_RECV, &mb));
    CHECK_OK(T->reg_mr(net, b, 64, ZS_MR_SEND, &mro));

    /* API misuse is refused with a message and starts nothing. */
    zs_frame bad = {.op = 11};
    CHECK_FAILS_WITH(T->isend(cli, &bad, NULL, 0, NULL, NULL), "op 11 is not a known op");
    zs_frame push = {
        .op = ZS_OP_PUSH, .dtype = ZS_DTYPE_F32, .id = 1, .count = len / 4 + 1, .length = len + 4};
    CHECK_FAILS_WITH(T->isend(cli, &push, ma, 0, NULL, NULL), "outside the region");
    CHECK_FAILS_WITH(T->isend(cli, &push, NULL, 0, NULL, NULL), "no registered region");
    push.count = 4;
    push.length = 16;
    CHECK_FAILS_WITH(T->isend(cli, &push, mb, 0, NULL, NULL), "not registered for ZS_MR_SEND");
    CHECK_FAILS_WITH(T->irecv(cli, 1, mro, 0, 16, NULL, NULL), "not registered for ZS_MR_RECV");
    CHECK_FAILS_WITH(T->recv_payload(srv, mb, 0, NULL, NULL), "no header with a payload");
    const void *view = &view;
    CHECK_FAILS_WITH(T->view_payload(srv, &view), "no header with a payload");
    CHECK(view == NULL);
    zs_req *r1;
    CHECK_OK(T->irecv(cli, 42, mb, 0, 16, NULL, &r1));
    CHECK_FAILS_WITH(T->irecv(cli, 42, mb, 0, 16, NULL, NULL), "id 42 is already expected");
    CHECK_FAILS_WITH(T->dereg_mr(mb), "still use it");
    CHECK_OK(T->cancel(r1));
    zs_frame txt = {.op = ZS_OP_ERROR, .dtype = ZS_DTYPE_TEXT, .length = 5000};
    CHECK_FAILS_WITH(T->isend_inline(cli, &txt, a, NULL, NULL), "exceed the inline limit");

    /* Header first on the server side, payload into the destination it picks, via test(). */
    push.count = len / 4;
    push.length = len;
    push.id = 7;
    zs_req *sr, *rr = NULL;
    CHECK_OK(T->isend(cli, &push, ma, 0, NULL, &sr));
    int sent = 0, recvd = 0;
    int64_t end = now_ms() + DEADLINE_MS;
    while ((!sent || !recvd) && now_ms() < end) {
        zs_event ev[4];
        int n, done;
        if (!sent) {
            CHECK_OK(T->test(sr, &done, NULL));
            sent = done;
        }
        if (rr) {
            zs_frame f;
            CHECK_OK(T->test(rr, &done, &f));
            if (done) {
                CHECK_EQ_INT(f.id, 7);
                recvd = 1;
                rr = NULL;
            }
        }
        CHECK_OK(T->poll(net, ev, 4, 0, &n));
        for (int k = 0; k < n; k++) {
            if (ev[k].type == ZS_EV_HEADER) {
                CHECK(ev[k].conn == srv);
                CHECK_EQ_INT(ev[k].frame.length, len);
                CHECK_FAILS_WITH(T->recv_payload(srv, mb, 1, NULL, &rr), "outside the region");
                /* A payload in the socket is never shown in place: the header stays. */
                view = &view;
                CHECK_OK(T->view_payload(srv, &view));
                CHECK(view == NULL);
                CHECK_FAILS_WITH(T->view_release(srv), "tcp views no payload");
                CHECK_OK(T->recv_payload(srv, mb, 0, NULL, &rr));
            }
        }
    }
    CHECK(sent && recvd);
    CHECK(memcmp(a, b, len) == 0);
    CHECK_OK(T->dereg_mr(mro));

    /* A flood of small frames, more than the event queue's high-water mark: reading pauses
     * and resumes as poll() drains the queue; every frame arrives once, in order. */
    enum { FLOOD = 10000 };
    for (int i = 0; i < FLOOD; i++) {
        zs_frame fl = {
            .op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = 100000 + (uint64_t)i, .count = 1};
        CHECK_OK(T->isend(cli, &fl, NULL, 0, NULL, NULL));
    }
    int headers = 0, sends = 0, in_order = 1;
    end = now_ms() + DEADLINE_MS;
    while ((headers < FLOOD || sends < FLOOD) && now_ms() < end) {
        zs_event ev[64];
        int n;
        CHECK_OK(T->poll(net, ev, 64, 100, &n));
        for (int k = 0; k < n; k++) {
            if (ev[k].type == ZS_EV_SEND)
                sends++;
            if (ev[k].type == ZS_EV_HEADER) {
                in_order &= ev[k].frame.id == 100000 + (uint64_t)headers;
                headers++;
            }
        }
    }
    CHECK_EQ_INT(headers, FLOOD);
    CHECK_EQ_INT(sends, FLOOD);
    CHECK(in_order);

    /* The server goes away with a reply half written: the client's receive fails as
     * mid-payload, then the connection reports closed. */
    zs_req *cr;
    memset(b, 0, len);
    CHECK_OK(T->irecv(cli, 99, mb, 0, len, NULL, &cr));
    zs_frame hdr = {
        .op = ZS_OP_FETCH_REPLY, .dtype = ZS_DTYPE_F32, .id = 99, .count = len / 4, .length = len};
    /* Small socket buffers (set above) keep most of the 8 MiB in the request when the
     * server side is closed under it. */
    zs_req *half;
    CHECK_OK(T->isend(srv, &hdr, ma, 0, NULL, &half));
    int done;
    CHECK_OK(T->test(half, &done, NULL));
    if (!done) {
        CHECK_FAILS_WITH(T->cancel(half), "partly written");
        T->conn_close(srv); /* the handle now reports the failure */
        CHECK_FAILS_WITH(T->wait(half, 0, &done, NULL), "closed locally");
        CHECK(done);
        CHECK_FAILS_WITH(wait_req(cr, NULL), "mid-payload");
    } else {
        /* The kernel took all 8 MiB at once (large buffers): no partial state to test. */
        T->conn_close(srv);
        CHECK_OK(wait_req(cr, NULL));
    }
    zs_event ev[4];
    int n, closed = 0;
    end = now_ms() + DEADLINE_MS;
    while (!closed && now_ms() < end) {
        CHECK_OK(T->poll(net, ev, 4, 100, &n));
        for (int k = 0; k < n; k++)
            if (ev[k].type == ZS_EV_CLOSED) {
                CHECK(ev[k].conn == cli);
                CHECK(T->conn_closed(cli));
                closed = 1;
            }
    }
    CHECK(closed);
    CHECK_FAILS_WITH(T->isend(cli, &hdr, ma, 0, NULL, NULL), "connection closed");
    T->conn_close(cli);
    T->listener_close(l);
    CHECK_OK(T->dereg_mr(ma));
    CHECK_OK(T->dereg_mr(mb));
    T->close(net);
    free(a);
    free(b);
}

/* A net that batches sends writes nothing until a turn of the loop or flush(). */
static void test_batch_flush(void)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0 &&
          getsockname(l, (struct sockaddr *)&a, &al) == 0);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    zs_net *net;
    zs_conn *c;
    zs_net_opts no = {.batch_sends = 1};
    CHECK_OK(T->open(&net));
    CHECK_OK(T->set_opts(net, &no));
    CHECK_OK(T->connect(net, addr, NULL, &c));
    int fd = accept(l, NULL, NULL);
    CHECK(fd >= 0);
    struct timeval tv = {.tv_sec = DEADLINE_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    zs_req *sr;
    uint8_t got[2 * ZS_FRAME_HEADER_BYTES];
    for (int i = 0; i < 2; i++) {
        zs_frame f = {
            .op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = 500 + (uint64_t)i, .count = 1};
        CHECK_OK(T->isend(c, &f, NULL, 0, NULL, i ? &sr : NULL));
    }
    CHECK(recv(fd, got, sizeof got, MSG_DONTWAIT) < 0 && errno == EAGAIN); /* not yet */
    CHECK_OK(T->flush(net));
    CHECK(read_full(fd, got, sizeof got) == 0); /* both frames, from one flush */
    zs_frame f;
    CHECK_OK(zs_frame_decode(got + ZS_FRAME_HEADER_BYTES, &f));
    CHECK_EQ_INT(f.id, 501);
    CHECK_OK(wait_req(sr, NULL));
    close(fd);
    close(l);
    T->close(net);
    setenv("ZS_TCP_BATCH_SENDS", "2", 1);
    CHECK_FAILS_WITH(T->open(&net), "ZS_TCP_BATCH_SENDS=\"2\" is not an integer in -1..1");
    unsetenv("ZS_TCP_BATCH_SENDS");
}

/* The send buffer a stream gets: 512 KiB towards a peer on this host unless asked otherwise
 * (the kernel reports twice what was set), autotuning with -1, what was asked for otherwise;
 * on both ends. */
static void test_sndbuf(void)
{
    const struct {
        int ask, want;
    } cases[] = {{0, 2 * 512 * 1024}, {-1, 0}, {64 * 1024, 2 * 64 * 1024}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        zs_net *net;
        zs_listener *l;
        zs_conn *cli = NULL, *srv = NULL;
        zs_tcp_conn_opts bufs = {.sndbuf_bytes = cases[k].ask};
        zs_conn_opts o = {.backend = &bufs, .backend_name = "tcp"};
        CHECK_OK(T->open(&net));
        CHECK_OK(T->listen(net, "127.0.0.1:0", &o, &l));
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", T->listener_port(l));
        CHECK_OK(T->connect(net, addr, &o, &cli));
        CHECK_OK(T->accept(l, DEADLINE_MS, &srv));
        int c = cli ? zs_tcp_conn_sndbuf(cli) : -1, s = srv ? zs_tcp_conn_sndbuf(srv) : -1;
        if (cases[k].want) {
            CHECK_EQ_INT(c, cases[k].want);
            CHECK_EQ_INT(s, cases[k].want);
        } else { /* autotuning: whatever the kernel chose (4 MiB on loopback here), not ours */
            CHECK(c > 0 && c != 2 * 512 * 1024);
            CHECK(s > 0 && s != 2 * 512 * 1024);
        }
        T->close(net);
    }
}

/* The endpoint a listener names for its peers: its own address, or for one bound to all of
 * them the address on the route to `toward`, else the host name; connect() takes it. */
static void test_endpoint(void)
{
    zs_net *net;
    zs_listener *l1, *l2;
    CHECK_OK(T->open(&net));
    CHECK_OK(T->listen(net, "127.0.0.1:0", NULL, &l1));
    CHECK_OK(T->listen(net, "0.0.0.0:0", NULL, &l2));
    char ep[128], want[192], host[64];
    CHECK_OK(T->listener_endpoint(l1, "192.0.2.1", ep, sizeof ep));
    snprintf(want, sizeof want, "127.0.0.1:%d", T->listener_port(l1));
    CHECK(!strcmp(ep, want));
    CHECK_OK(T->listener_endpoint(l2, "127.0.0.1", ep, sizeof ep));
    snprintf(want, sizeof want, "127.0.0.1:%d", T->listener_port(l2));
    CHECK(!strcmp(ep, want));
    zs_conn *c = NULL, *s = NULL;
    CHECK_OK(T->connect(net, ep, NULL, &c));
    CHECK_OK(T->accept(l2, DEADLINE_MS, &s));
    CHECK(c && s);
    CHECK_OK(T->listener_endpoint(l2, NULL, ep, sizeof ep));
    CHECK(gethostname(host, sizeof host) == 0);
    snprintf(want, sizeof want, "%s:%d", host, T->listener_port(l2));
    CHECK(!strcmp(ep, want));
    CHECK_FAILS_WITH(T->listener_endpoint(l1, NULL, ep, 8), "does not fit");
    zs_listener *l6;
    if (T->listen(net, "[::1]:0", NULL, &l6) == ZS_OK) { /* where the host has IPv6 */
        CHECK_OK(T->listener_endpoint(l6, NULL, ep, sizeof ep));
        snprintf(want, sizeof want, "[::1]:%d", T->listener_port(l6));
        CHECK(!strcmp(ep, want));
    }
    T->close(net);
}

static void test_connect_errors(void)
{
    zs_net *net;
    zs_listener *l;
    zs_conn *c;
    CHECK_OK(T->open(&net));
    CHECK_FAILS_WITH(T->listen(net, "bogus", NULL, &l), "expected HOST:PORT");
    CHECK_FAILS_WITH(T->listen(net, "127.0.0.1:99999", NULL, &l), "port \"99999\"");
    CHECK_FAILS_WITH(T->connect(net, "127.0.0.1:0", NULL, &c), "not a number in 1..65535");
    /* a port nobody listens on: bind one, close it */
    CHECK_OK(T->listen(net, "127.0.0.1:0", NULL, &l));
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", T->listener_port(l));
    T->listener_close(l);
    CHECK_FAILS_WITH(T->connect(net, addr, NULL, &c), "Connection refused");
    CHECK_FAILS_WITH(T->connect(net, addr, NULL, &c), addr);
    setenv("ZS_TCP_CONNS", "many", 1);
    CHECK_FAILS_WITH(T->connect(net, addr, NULL, &c), "ZS_TCP_CONNS=\"many\"");
    unsetenv("ZS_TCP_CONNS");
    zs_conn_opts o = {.conns = ZS_NET_MAX_CONNS + 1};
    CHECK_FAILS_WITH(T->connect(net, addr, &o, &c), "not in 1..16");
    CHECK(zs_transport_find("tcp") == &zs_tcp_ops);
    CHECK(zs_transport_find("rdma") == &zs_rdma_ops);
    CHECK(zs_transport_find("shm") == &zs_shm_ops);
    CHECK(zs_transport_find("udp") == NULL);
    CHECK_EQ_INT(zs_tcp_ops.version, ZS_TRANSPORT_OPS_VERSION);
    T->close(net);
}

/* ---- authentication (transport.h): a listener with zs_auth in a thread of its own ---- */

typedef struct {
    zs_net *net;
    zs_listener *l;
    zs_auth auth;
    uint8_t key[ZS_TOKEN_BYTES];
    pthread_t thread;
    pthread_mutex_t mu;
    int stop;
    int accepted, refused, at_once;
    uint32_t last_member;
    char last_refusal[ZS_NET_REASON_MAX];
} auth_server;

/* Members 1..10 are known, 7 is gone. */
static int test_token_of(void *ctx, uint32_t member, uint8_t token[ZS_TOKEN_BYTES], char *why)
{
    auth_server *a = ctx;
    if (member < 1 || member > 10 || member == 7) {
        snprintf(why, ZS_NET_REASON_MAX / 2, "%s", member == 7 ? "declared gone" : "unknown");
        return -1;
    }
    zs_token_of(a->key, member, token);
    return 0;
}

static void *auth_main(void *arg)
{
    auth_server *a = arg;
    zs_event ev[16];
    for (;;) {
        pthread_mutex_lock(&a->mu);
        int stop = a->stop;
        pthread_mutex_unlock(&a->mu);
        int n = 0;
        if (stop || T->poll(a->net, ev, 16, 20, &n) != ZS_OK)
            return NULL;
        pthread_mutex_lock(&a->mu);
        for (int i = 0; i < n; i++) {
            if (ev[i].type == ZS_EV_ACCEPT) {
                a->accepted++;
                a->last_member = T->conn_member(ev[i].conn);
            } else if (ev[i].type == ZS_EV_REFUSED) {
                a->refused++;
                a->at_once += strstr(ev[i].reason, "closed at once") != NULL;
                snprintf(a->last_refusal, sizeof a->last_refusal, "%s", ev[i].reason);
            } else if (ev[i].type == ZS_EV_HEADER && ev[i].frame.length) {
                T->discard(ev[i].conn);
            }
        }
        pthread_mutex_unlock(&a->mu);
    }
}

/* Waits (up to 10 s) until the server counted want refusals; returns the count. */
static int refusals_reach(auth_server *a, int want)
{
    int got = 0;
    for (int t = 0; t < 1000; t++) {
        pthread_mutex_lock(&a->mu);
        got = a->refused;
        pthread_mutex_unlock(&a->mu);
        if (got >= want)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return got;
}

static void test_handshake(void)
{
    auth_server a = {0};
    pthread_mutex_init(&a.mu, NULL);
    zs_random_bytes(a.key, sizeof a.key);
    a.auth = (zs_auth){.token_of = test_token_of, .ctx = &a};
    setenv("ZS_TCP_HANDSHAKE_MS", "300", 1);
    CHECK_OK(T->open(&a.net));
    zs_conn_opts lo = {.auth = &a.auth};
    CHECK_OK(T->listen(a.net, "127.0.0.1:0", &lo, &a.l));
    unsetenv("ZS_TCP_HANDSHAKE_MS");
    int port = T->listener_port(a.l);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    pthread_create(&a.thread, NULL, auth_main, &a);

    zs_net *net;
    CHECK_OK(T->open(&net));
    zs_conn *c = NULL;
    /* A member with its token: a connection of that member on both sides, on every stream. */
    zs_auth me = {.member = 3};
    zs_token_of(a.key, 3, me.token);
    zs_conn_opts o = {.auth = &me, .conns = 2};
    CHECK_OK(T->connect(net, addr, &o, &c));
    CHECK(c && T->conn_member(c) == 3);
    for (int t = 0; t < 500; t++) {
        pthread_mutex_lock(&a.mu);
        int n = a.accepted;
        pthread_mutex_unlock(&a.mu);
        if (n == 2)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&a.mu);
    CHECK_EQ_INT(a.accepted, 2);
    CHECK_EQ_INT((int)a.last_member, 3);
    pthread_mutex_unlock(&a.mu);
    T->conn_close(c);

    /* Another job's token: the server's proof does not check out, the client gives up. */
    zs_auth other = {.member = 3};
    zs_token_of((const uint8_t *)"a key of another job, 32 bytes..", 3, other.token);
    o = (zs_conn_opts){.auth = &other};
    CHECK_FAILS_WITH(T->connect(net, addr, &o, &c), "did not prove it belongs to this job");
    CHECK(refusals_reach(&a, 1) >= 1);
    /* A member the server refuses (gone), and one it does not know. */
    zs_auth gone = {.member = 7};
    o.auth = &gone;
    CHECK_FAILS_WITH(T->connect(net, addr, &o, &c), "refused member 7");
    CHECK(refusals_reach(&a, 2) >= 2);
    pthread_mutex_lock(&a.mu);
    CHECK(strstr(a.last_refusal, "member 7 refused: declared gone") != NULL);
    pthread_mutex_unlock(&a.mu);
    /* A client that knows a member's id and the server's answer but not the token: it sends
     * a made-up proof, and is refused. */
    int fd = raw_connect(port);
    uint8_t hello[48] = {'Z', 'S', 'A', '1', 1, 0, 0, 0, 3}, ch[72], proof[32] = {1}, res[8];
    CHECK(write(fd, hello, sizeof hello) == (ssize_t)sizeof hello);
    CHECK(read(fd, ch, sizeof ch) == (ssize_t)sizeof ch);
    CHECK(write(fd, proof, sizeof proof) == (ssize_t)sizeof proof);
    CHECK(read(fd, res, sizeof res) == (ssize_t)sizeof res && res[4] == 3); /* HS_BAD_PROOF */
    close(fd);
    CHECK(refusals_reach(&a, 3) >= 3);
    pthread_mutex_lock(&a.mu);
    CHECK(strstr(a.last_refusal, "member 3 did not prove its token") != NULL);
    pthread_mutex_unlock(&a.mu);
    /* Frames without a handshake are not one. */
    fd = raw_connect(port);
    uint8_t junk[64] = {'Z', 'S', 'F', '1'};
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    CHECK(refusals_reach(&a, 4) >= 4);
    pthread_mutex_lock(&a.mu);
    CHECK(strstr(a.last_refusal, "not a zshard handshake") != NULL);
    pthread_mutex_unlock(&a.mu);
    close(fd);
    /* Streams that say nothing: at most 64 wait at once (the rest are closed at once), each at
     * most the handshake timeout; then a member gets in again. */
    int silent[80];
    for (int i = 0; i < 80; i++)
        silent[i] = raw_connect(port);
    CHECK(refusals_reach(&a, 4 + 80) >= 4 + 80);
    pthread_mutex_lock(&a.mu);
    CHECK(a.at_once >= 80 - 64);
    CHECK(strstr(a.last_refusal, "not finished within 300 ms") != NULL);
    pthread_mutex_unlock(&a.mu);
    for (int i = 0; i < 80; i++)
        close(silent[i]);
    o = (zs_conn_opts){.auth = &me};
    CHECK_OK(T->connect(net, addr, &o, &c));
    if (c)
        T->conn_close(c);
    T->close(net);
    pthread_mutex_lock(&a.mu);
    a.stop = 1;
    pthread_mutex_unlock(&a.mu);
    pthread_join(a.thread, NULL);
    T->close(a.net);
    pthread_mutex_destroy(&a.mu);
}

static int refuse_all(void *ctx, uint32_t member, uint8_t token[ZS_TOKEN_BYTES], char *why)
{
    (void)ctx;
    (void)member;
    (void)token;
    snprintf(why, ZS_NET_REASON_MAX / 2, "nobody is a member here");
    return -1;
}

/* wait_fd: an idle net has no timer (-1) and its descriptor does not poll readable; streams
 * arriving make it readable; events left queued by a poll() make the timeout 0 until they are
 * handed out; a stream in its handshake gives a timer no longer than the handshake's limit. */
static void test_wait_fd(void)
{
    zs_net *net;
    zs_listener *l, *la;
    CHECK_OK(T->open(&net));
    CHECK_OK(T->listen(net, "127.0.0.1:0", NULL, &l));
    int t = 7;
    int fd = T->wait_fd(net, &t);
    CHECK(fd >= 0);
    CHECK_EQ_INT(t, -1);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    CHECK_EQ_INT(poll(&p, 1, 0), 0);
    int r1 = raw_connect(T->listener_port(l)), r2 = raw_connect(T->listener_port(l));
    CHECK(r1 >= 0 && r2 >= 0);
    CHECK_EQ_INT(poll(&p, 1, DEADLINE_MS), 1);
    zs_event ev[4];
    int n = 0;
    CHECK_OK(T->poll(net, ev, 1, DEADLINE_MS, &n)); /* both accepted, one handed out */
    CHECK(n == 1 && ev[0].type == ZS_EV_ACCEPT);
    zs_conn *c1 = n == 1 ? ev[0].conn : NULL;
    T->wait_fd(net, &t);
    CHECK_EQ_INT(t, 0);
    CHECK_OK(T->poll(net, ev, 4, DEADLINE_MS, &n));
    CHECK(n == 1 && ev[0].type == ZS_EV_ACCEPT);
    zs_conn *c2 = n == 1 ? ev[0].conn : NULL;
    T->wait_fd(net, &t);
    CHECK_EQ_INT(t, -1);
    /* A listener with authentication: a stream that never speaks waits in its handshake. */
    zs_auth auth = {.token_of = refuse_all};
    zs_conn_opts ao = {.auth = &auth};
    setenv("ZS_TCP_HANDSHAKE_MS", "3000", 1);
    CHECK_OK(T->listen(net, "127.0.0.1:0", &ao, &la));
    unsetenv("ZS_TCP_HANDSHAKE_MS");
    int r3 = raw_connect(T->listener_port(la));
    CHECK(r3 >= 0);
    CHECK_EQ_INT(poll(&p, 1, DEADLINE_MS), 1);
    CHECK_OK(T->poll(net, ev, 4, 0, &n)); /* the turn that takes it into its handshake */
    CHECK_EQ_INT(n, 0);
    T->wait_fd(net, &t);
    CHECK(t > 0 && t <= 3000);
    close(r1);
    close(r2);
    close(r3);
    if (c1)
        T->conn_close(c1);
    if (c2)
        T->conn_close(c2);
    T->close(net);
}

/* The one-sided operations, served by the peer's net (rma_suite.h). */
#define RMA_OPS (&zs_tcp_ops)
#define RMA_NIC 0
#define RMA_NO_DEVICE_MEMORY "tcp" /* a socket's bytes pass through the CPU */
#include "rma_suite.h"

int main(void)
{
    server s1, s2;
    /* s1 batches its sends (as a partition server would), s2 writes each at once */
    if (server_start(&s1, 1) || server_start(&s2, -1)) {
        fprintf(stderr, "test_transport_tcp: cannot start the servers\n");
        return 1;
    }
    test_connect_errors();
    test_sndbuf();
    test_endpoint();
    test_handshake();
    test_batch_flush();
    test_local_pair();
    test_wait_fd();
    test_round_trips(&s1);
    test_concurrent(&s1, &s2);
    test_header_first_client(&s2);
    test_rejects_keep_connection(&s1);
    test_bad_headers(&s1);
    test_random_bytes(&s2);
    test_disconnect_mid_frame(&s1);
    rma_suite();
    server_stop(&s1);
    server_stop(&s2);
    return zs_test_result("test_transport_tcp");
}
