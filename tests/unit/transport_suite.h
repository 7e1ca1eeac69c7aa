/*
 * transport_suite.h: the tests every data-plane backend that moves payloads by rendezvous must
 * pass (rdma.c, shm.c), included by their test files.  The includer defines, before including:
 *   SUITE_OPS                    the backend's function table
 *   suite_addr                   the IPv4 address servers listen on and clients connect to
 *   suite_server_opts(o)         fills a listener's backend options
 *   suite_client_opts(o)         fills a client's backend options
 *   SUITE_KILL_AFTER_MS          how long a 16 MiB reply is read before its server is killed
 *                                (0: killed before the client reads it)
 *   SUITE_VIEWS(bytes)           whether the backend shows the test server a push of `bytes`
 *                                from the client's (large) registered buffer in place
 *                                (view_payload) instead of having it copied
 *
 * A test server runs in a thread with its own net and serves as a partition server does: a
 * fetch is answered from its registered "pattern" buffer, a push is hashed where it lies when
 * the backend can show it in place (view_payload), else received into "stage" and hashed
 * there, and answered with the hash (and in the reply's chunk field, 1 when it was viewed).  The
 * client is the main thread.  No assertion depends on timing; deadlines are there so that a bug
 * fails instead of hanging.
 */
#ifndef ZS_TEST_TRANSPORT_SUITE_H
#define ZS_TEST_TRANSPORT_SUITE_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "test.h"
#include "transport/transport.h"

#define MIB ((size_t)1 << 20)
#define SERVE_BYTES (24 * MIB)
#define DEADLINE_MS 30000

static const zs_transport_ops *T = SUITE_OPS;

static uint8_t pattern_byte(size_t i, int version)
{
    return (uint8_t)((i * 131u) ^ (i >> 9) ^ (0x5a + 17 * version));
}

#define fnv zs_test_fnv

#define now_ms() ((int64_t)zs_now_ms())

/* ---------------------------------------------------------------------------------------- */
/* the test server */

typedef struct {
    zs_net *net;
    zs_listener *l;
    int port;
    uint8_t *pattern, *stage;
    zs_mr *pattern_mr, *stage_mr;
    int version;   /* the pattern's version: republished after each fetch reply completes */
    int republish; /* 1: bump the version once a fetch reply's send completed */
    zs_auth auth;
    int use_auth;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    /* hold_views: the server thread keeps a view open (viewing = 1) until the main thread sets
     * hold_views back to 0; view_refused counts recv_payload calls refused during a view */
    int hold_views, viewing, view_refused;
    int accepted, closed, refused, fetches, pushes_ok, pushes_failed, replies_done;
    int written;           /* ZS_EV_WRITTEN events (one-sided writes with notify) */
    zs_frame last_written; /* the last one's frame: address, bytes, immediate value */
    char last_closed[ZS_NET_REASON_MAX], last_refused[ZS_NET_REASON_MAX];
} server;

static const uint8_t good_token[ZS_TOKEN_BYTES] = {7, 7, 7};

static int token_of(void *ctx, uint32_t member, uint8_t token[ZS_TOKEN_BYTES], char *why)
{
    (void)ctx;
    if (member != 42) {
        snprintf(why, ZS_NET_REASON_MAX / 2, "member %u is not known", member);
        return -1;
    }
    memcpy(token, good_token, ZS_TOKEN_BYTES);
    return 0;
}

static void republish(server *s)
{
    s->version++;
    for (size_t i = 0; i < SERVE_BYTES; i++)
        s->pattern[i] = pattern_byte(i, s->version);
}

#define COOKIE_REPLY ((void *)1)

/* A push read where it lies, if the backend can show it: hashed there and answered (chunk 1)
 * once the view is released.  With hold_views, the view stays open until the main thread says
 * (a recv_payload tried meanwhile must be refused).  1: answered, 0: not viewable, -1: failed. */
static int view_push(server *s, zs_conn *c, const zs_frame *f)
{
    const void *data = NULL;
    if (T->view_payload(c, &data) != ZS_OK) {
        fprintf(stderr, "server: view_payload: %s\n", zs_last_error());
        return -1;
    }
    if (!data)
        return 0;
    uint64_t h = fnv(data, f->length);
    pthread_mutex_lock(&s->mu);
    if (s->hold_views) {
        s->viewing = 1;
        s->view_refused += T->recv_payload(c, s->stage_mr, 0, NULL, NULL) == ZS_ERR_INVALID;
        int64_t end = now_ms() + DEADLINE_MS;
        while (s->hold_views && now_ms() < end) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        s->viewing = 0;
    }
    s->pushes_ok++;
    pthread_mutex_unlock(&s->mu);
    if (T->view_release(c) != ZS_OK) {
        fprintf(stderr, "server: view_release: %s\n", zs_last_error());
        return -1;
    }
    zs_frame r = {.op = ZS_OP_PUSH_REPLY, .id = f->id, .step = h, .chunk = 1};
    T->isend(c, &r, NULL, 0, NULL, NULL);
    return 1;
}

static void on_header(server *s, zs_conn *c, const zs_frame *f)
{
    int view;
    if (f->op == ZS_OP_FETCH) {
        uint64_t bytes = f->count * 4;
        zs_frame r = {.op = ZS_OP_FETCH_REPLY,
                      .dtype = ZS_DTYPE_F32,
                      .id = f->id,
                      .step = (uint64_t)s->version,
                      .offset = f->offset,
                      .count = f->count,
                      .length = bytes};
        if (f->offset * 4 + bytes > SERVE_BYTES ||
            T->isend(c, &r, s->pattern_mr, f->offset * 4, COOKIE_REPLY, NULL) != ZS_OK)
            fprintf(stderr, "server: fetch reply: %s\n", zs_last_error());
        pthread_mutex_lock(&s->mu);
        s->fetches++;
        pthread_mutex_unlock(&s->mu);
    } else if (f->op == ZS_OP_PUSH && f->length == 0) {
        zs_frame r = {.op = ZS_OP_PUSH_REPLY, .id = f->id, .step = fnv(NULL, 0)};
        T->isend(c, &r, NULL, 0, NULL, NULL);
    } else if (f->op == ZS_OP_PUSH && (view = view_push(s, c, f)) != 0) {
        if (view < 0)
            T->discard(c);
    } else if (f->op == ZS_OP_PUSH) {
        zs_frame *keep = malloc(sizeof *keep);
        *keep = *f;
        if (f->offset * 4 + f->length > SERVE_BYTES ||
            T->recv_payload(c, s->stage_mr, f->offset * 4, keep, NULL) != ZS_OK) {
            fprintf(stderr, "server: recv_payload: %s\n", zs_last_error());
            free(keep);
            T->discard(c);
        }
    } else if (f->length) {
        T->discard(c);
    }
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
        if (T->poll(s->net, ev, 32, 20, &n) != ZS_OK)
            break;
        for (int i = 0; i < n; i++) {
            zs_event *e = &ev[i];
            pthread_mutex_lock(&s->mu);
            switch (e->type) {
            case ZS_EV_ACCEPT:
                s->accepted++;
                break;
            case ZS_EV_WRITTEN:
                s->written++;
                s->last_written = e->frame;
                break;
            case ZS_EV_REFUSED:
                s->refused++;
                snprintf(s->last_refused, sizeof s->last_refused, "%s", e->reason);
                break;
            case ZS_EV_CLOSED:
                s->closed++;
                snprintf(s->last_closed, sizeof s->last_closed, "%s", e->reason);
                T->conn_close(e->conn);
                break;
            case ZS_EV_HEADER:
                pthread_mutex_unlock(&s->mu);
                on_header(s, e->conn, &e->frame);
                pthread_mutex_lock(&s->mu);
                break;
            case ZS_EV_SEND:
                if (e->user == COOKIE_REPLY && e->err == ZS_OK) {
                    s->replies_done++;
                    if (s->republish)
                        republish(s); /* safe only because the reader has all of it */
                }
                break;
            case ZS_EV_RECV: {
                zs_frame *f = e->user;
                if (e->err != ZS_OK) {
                    s->pushes_failed++;
                } else {
                    s->pushes_ok++;
                    zs_frame r = {.op = ZS_OP_PUSH_REPLY,
                                  .id = f->id,
                                  .step = fnv(s->stage + f->offset * 4, f->length)};
                    if (e->conn)
                        T->isend(e->conn, &r, NULL, 0, NULL, NULL);
                }
                free(f);
                break;
            }
            }
            pthread_mutex_unlock(&s->mu);
        }
    }
    return NULL;
}

static int server_open(server *s, int use_auth)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->pattern = malloc(SERVE_BYTES);
    s->stage = calloc(1, SERVE_BYTES);
    if (!s->pattern || !s->stage)
        return -1;
    s->version = -1;
    republish(s);
    s->auth = (zs_auth){.token_of = token_of};
    zs_conn_opts o = {.auth = use_auth ? &s->auth : NULL};
    suite_server_opts(&o);
    char addr[64];
    snprintf(addr, sizeof addr, "%s:0", suite_addr);
    if (T->open(&s->net) != ZS_OK || T->listen(s->net, addr, &o, &s->l) != ZS_OK ||
        T->reg_mr(s->net, s->pattern, SERVE_BYTES, ZS_MR_SEND, &s->pattern_mr) != ZS_OK ||
        T->reg_mr(s->net, s->stage, SERVE_BYTES, ZS_MR_RECV, &s->stage_mr) != ZS_OK) {
        fprintf(stderr, "server: %s\n", zs_last_error());
        return -1;
    }
    s->port = T->listener_port(s->l);
    /* The endpoint the backend names for peers: the address it listens on (the set-up
     * stream's listener). */
    char ep[128], want[128];
    snprintf(want, sizeof want, "%s:%d", suite_addr, s->port);
    if (T->listener_endpoint(s->l, NULL, ep, sizeof ep) != ZS_OK || strcmp(ep, want) != 0) {
        fprintf(stderr, "server: endpoint \"%s\", expected \"%s\"\n", ep, want);
        return -1;
    }
    return 0;
}

static void server_start(server *s)
{
    pthread_create(&s->th, NULL, server_main, s);
}

static void server_close(server *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_mutex_unlock(&s->mu);
    if (s->th)
        pthread_join(s->th, NULL);
    T->close(s->net);
    free(s->pattern);
    free(s->stage);
}

static int server_get(server *s, const int *field)
{
    pthread_mutex_lock(&s->mu);
    int v = *field;
    pthread_mutex_unlock(&s->mu);
    return v;
}

/* Waits (polling the server's counters, which its thread changes) until *field >= want. */
static int server_wait(server *s, const int *field, int want)
{
    int64_t end = now_ms() + DEADLINE_MS;
    while (server_get(s, field) < want && now_ms() < end)
        poll(NULL, 0, 5);
    return server_get(s, field) >= want;
}

/* ---------------------------------------------------------------------------------------- */
/* the client */

typedef struct {
    zs_net *net;
    zs_conn *c;
    uint8_t *buf; /* fetch destinations, then push sources */
    zs_mr *mr;
} client;

static zs_err client_open(client *cl, int port, const zs_auth *auth)
{
    memset(cl, 0, sizeof *cl);
    zs_conn_opts o = {.auth = auth, .connect_timeout_ms = DEADLINE_MS};
    suite_client_opts(&o);
    char addr[64];
    snprintf(addr, sizeof addr, "%s:%d", suite_addr, port);
    ZS_CHECK(T->open(&cl->net));
    zs_err e = T->connect(cl->net, addr, &o, &cl->c);
    if (e != ZS_OK)
        return e;
    cl->buf = calloc(1, 2 * SERVE_BYTES);
    return T->reg_mr(cl->net, cl->buf, 2 * SERVE_BYTES, ZS_MR_SEND | ZS_MR_RECV, &cl->mr);
}

static void client_close(client *cl)
{
    T->close(cl->net);
    free(cl->buf);
}

static uint64_t next_id = 100;
static int last_push_viewed; /* whether the server read the last push() in place */

/* Fetches bytes at `at` into buf[dst..]; returns the reply's outcome and header. */
static zs_err fetch(client *cl, size_t at, size_t bytes, size_t dst, zs_frame *got)
{
    uint64_t id = next_id++;
    zs_req *rr, *sr;
    ZS_CHECK(T->irecv(cl->c, id, cl->mr, dst, bytes, NULL, &rr));
    zs_frame f = {
        .op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = id, .offset = at / 4, .count = bytes / 4};
    ZS_CHECK(T->isend(cl->c, &f, NULL, 0, NULL, &sr));
    int done = 0;
    zs_err e = T->wait(sr, DEADLINE_MS, &done, NULL);
    if (e != ZS_OK || !done) {
        T->cancel(rr);
        return e != ZS_OK ? e : zs_error(ZS_ERR_IO, "fetch send timed out");
    }
    e = T->wait(rr, DEADLINE_MS, &done, got);
    if (e == ZS_OK && !done) {
        T->cancel(rr);
        return zs_error(ZS_ERR_IO, "fetch reply timed out");
    }
    return e;
}

static int same_as_pattern(const uint8_t *p, size_t at, size_t bytes, int version)
{
    for (size_t i = 0; i < bytes; i++)
        if (p[i] != pattern_byte(at + i, version)) {
            fprintf(stderr, "byte %zu of %zu: 0x%02x, version %d has 0x%02x\n", i, bytes, p[i],
                    version, pattern_byte(at + i, version));
            return 0;
        }
    return 1;
}

/* Pushes buf[src.. src+bytes) to `at`; returns the outcome and the reply's hash in *hash. */
static zs_err push(client *cl, size_t at, size_t bytes, size_t src, uint64_t *hash)
{
    uint64_t id = next_id++;
    zs_req *rr, *sr;
    ZS_CHECK(T->irecv(cl->c, id, NULL, 0, 0, NULL, &rr));
    zs_frame f = {.op = ZS_OP_PUSH,
                  .dtype = ZS_DTYPE_F32,
                  .id = id,
                  .offset = at / 4,
                  .count = bytes / 4,
                  .length = bytes};
    zs_err e = T->isend(cl->c, &f, cl->mr, src, NULL, &sr);
    if (e != ZS_OK) {
        T->cancel(rr);
        return e;
    }
    int done = 0;
    e = T->wait(sr, DEADLINE_MS, &done, NULL);
    if (e != ZS_OK || !done) {
        T->cancel(rr);
        return e != ZS_OK ? e : zs_error(ZS_ERR_IO, "push send timed out");
    }
    zs_frame got;
    e = T->wait(rr, DEADLINE_MS, &done, &got);
    if (e == ZS_OK && !done)
        return zs_error(ZS_ERR_IO, "push reply timed out");
    if (e == ZS_OK) {
        *hash = got.step;
        last_push_viewed = (int)got.chunk;
    }
    return e;
}

/* ---------------------------------------------------------------------------------------- */
/* tests */

/* Every size class: empty, eager (up to the inline limit), rendezvous (one READ, several). */
static void test_round_trips(server *s)
{
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    CHECK(server_wait(s, &s->accepted, 1));
    size_t sizes[] = {0, 4, 4096, 4100, 65536, MIB, 9 * MIB + 12};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t at = (k * 4096 + 8) % MIB;
        zs_frame got;
        memset(cl.buf, 0, sizes[k] + 16);
        CHECK_OK(fetch(&cl, at, sizes[k], 0, &got));
        CHECK_EQ_INT(got.length, sizes[k]);
        CHECK(same_as_pattern(cl.buf, at, sizes[k], 0));
        CHECK_EQ_INT(cl.buf[sizes[k]], 0); /* nothing past the payload */
        for (size_t i = 0; i < sizes[k]; i++)
            cl.buf[SERVE_BYTES + i] = (uint8_t)(i * 7 + k);
        uint64_t h = 0;
        CHECK_OK(push(&cl, at, sizes[k], SERVE_BYTES, &h));
        CHECK_EQ_INT(h, fnv(cl.buf + SERVE_BYTES, sizes[k]));
        CHECK_EQ_INT(last_push_viewed, sizes[k] > 0 && SUITE_VIEWS(sizes[k]));
    }
    /* More frames in flight than credits: 40 fetches posted before any is waited for. */
    enum { N = 40 };
    zs_req *rr[N], *sr[N];
    for (int i = 0; i < N; i++) {
        uint64_t id = next_id++;
        CHECK_OK(T->irecv(cl.c, id, cl.mr, (size_t)i * 65536, 65536, NULL, &rr[i]));
        zs_frame f = {.op = ZS_OP_FETCH,
                      .dtype = ZS_DTYPE_F32,
                      .id = id,
                      .offset = (uint64_t)i * 16384,
                      .count = 16384};
        CHECK_OK(T->isend(cl.c, &f, NULL, 0, NULL, &sr[i]));
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        int d1 = 0, d2 = 0;
        zs_err e1 = T->wait(sr[i], DEADLINE_MS, &d1, NULL);
        zs_err e2 = T->wait(rr[i], DEADLINE_MS, &d2, NULL);
        ok += e1 == ZS_OK && e2 == ZS_OK && d1 && d2;
    }
    CHECK_EQ_INT(ok, N);
    CHECK(same_as_pattern(cl.buf, 0, N * 65536, 0));
    CHECK_EQ_INT(T->conn_member(cl.c), 0);
    client_close(&cl);
    CHECK(server_wait(s, &s->closed, 1));
}

/* A server republishes its buffer the moment a fetch reply's send completes.  The reader
 * must never see bytes of the next version: the send completes only once the READ is done. */
static void test_read_vs_republish(server *s)
{
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    pthread_mutex_lock(&s->mu);
    s->republish = 1;
    int v0 = s->version;
    pthread_mutex_unlock(&s->mu);
    for (int round = 0; round < 4; round++) {
        zs_frame got;
        CHECK_OK(fetch(&cl, 0, 8 * MIB, 0, &got));
        CHECK_EQ_INT((int)got.step, v0 + round);
        CHECK(same_as_pattern(cl.buf, 0, 8 * MIB, v0 + round));
        CHECK(server_wait(s, &s->version, v0 + round + 1));
    }
    pthread_mutex_lock(&s->mu);
    s->republish = 0;
    pthread_mutex_unlock(&s->mu);
    client_close(&cl);
}

/* A push read in place (view_payload): while the server holds the view, the client's send
 * has not completed (its buffer is still the server's to read) and recv_payload is refused;
 * once released, the send completes and the hash is the bytes'.  Backends that copy every
 * payload of this size have nothing to show here. */
static void test_view_holds_send(server *s)
{
    const size_t bytes = 2 * MIB;
    if (!SUITE_VIEWS(bytes))
        return;
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    for (size_t i = 0; i < bytes; i++)
        cl.buf[i] = (uint8_t)(i * 31 + 5);
    pthread_mutex_lock(&s->mu);
    s->hold_views = 1;
    int refused0 = s->view_refused;
    pthread_mutex_unlock(&s->mu);
    uint64_t id = next_id++;
    zs_req *rr, *sr;
    CHECK_OK(T->irecv(cl.c, id, NULL, 0, 0, NULL, &rr));
    zs_frame f = {.op = ZS_OP_PUSH,
                  .dtype = ZS_DTYPE_F32,
                  .id = id,
                  .offset = 0,
                  .count = bytes / 4,
                  .length = bytes};
    CHECK_OK(T->isend(cl.c, &f, cl.mr, 0, NULL, &sr));
    int send_done = 0, reply_done = 0;
    int64_t end = now_ms() + DEADLINE_MS;
    /* Drive the client's net until the server holds the view. */
    while (!server_get(s, &s->viewing) && now_ms() < end && !send_done)
        CHECK_OK(T->test(sr, &send_done, NULL));
    CHECK_EQ_INT(server_get(s, &s->viewing), 1);
    CHECK_EQ_INT(send_done, 0);
    CHECK_OK(T->test(sr, &send_done, NULL));
    CHECK_EQ_INT(send_done, 0); /* the server still reads the client's pages */
    CHECK_EQ_INT(server_get(s, &s->view_refused), refused0 + 1);
    pthread_mutex_lock(&s->mu);
    s->hold_views = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!send_done)
        CHECK_OK(T->wait(sr, DEADLINE_MS, &send_done, NULL));
    CHECK_EQ_INT(send_done, 1);
    zs_frame got;
    CHECK_OK(T->wait(rr, DEADLINE_MS, &reply_done, &got));
    CHECK_EQ_INT(reply_done, 1);
    CHECK_EQ_INT(got.chunk, 1);
    CHECK_EQ_INT(got.step, fnv(cl.buf, bytes));
    client_close(&cl);
}

/* Every connection proves its member as over TCP: an unknown one is refused, named. */
static void test_auth(void)
{
    server s;
    CHECK(server_open(&s, 1) == 0);
    server_start(&s);
    zs_auth good = {.member = 42}, bad = {.member = 9};
    memcpy(good.token, good_token, ZS_TOKEN_BYTES);
    client cl;
    CHECK_OK(client_open(&cl, s.port, &good));
    zs_frame got;
    CHECK_OK(fetch(&cl, 0, 4096, 0, &got));
    CHECK_EQ_INT(T->conn_member(cl.c), 42);
    client_close(&cl);
    client c2;
    CHECK_FAILS_WITH(client_open(&c2, s.port, &bad), "refused member 9");
    client_close(&c2);
    server_close(&s);
}

/* A server process killed while the client READs its 16 MiB reply: the fetch fails (the
 * destination is not to be used), within the deadline, naming the connection. */
static void test_peer_killed(void)
{
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        server s;
        if (server_open(&s, 0) != 0)
            _exit(2);
        if (write(pipefd[1], &s.port, sizeof s.port) != sizeof s.port)
            _exit(2);
        zs_event ev[8];
        for (;;) {
            int n;
            T->poll(s.net, ev, 8, -1, &n);
            for (int i = 0; i < n; i++)
                if (ev[i].type == ZS_EV_HEADER) {
                    on_header(&s, ev[i].conn, &ev[i].frame);
                    T->flush(s.net);
                    char b = 1;
                    if (write(pipefd[1], &b, 1) != 1)
                        _exit(2);
                }
        }
    }
    close(pipefd[1]);
    int port = 0;
    CHECK(read(pipefd[0], &port, sizeof port) == sizeof port);
    client cl;
    CHECK_OK(client_open(&cl, port, NULL));
    uint64_t id = next_id++;
    zs_req *rr;
    CHECK_OK(T->irecv(cl.c, id, cl.mr, 0, 16 * MIB, NULL, &rr));
    zs_frame f = {.op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = id, .count = 4 * MIB};
    CHECK_OK(T->isend(cl.c, &f, NULL, 0, NULL, NULL));
    char b;
    CHECK(read(pipefd[0], &b, 1) == 1); /* the reply is out */
    int done = 0;
    zs_err e = ZS_OK;
    /* A backend whose copy takes a while (RDMA under emulation: ~0.5 s for 16 MiB) is killed
     * in the middle of it; one that copies at memory speed, before it starts. */
    if (SUITE_KILL_AFTER_MS > 0) {
        e = T->wait(rr, SUITE_KILL_AFTER_MS, &done, NULL);
        CHECK(!done || e != ZS_OK);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int64_t t0 = now_ms();
    if (!done)
        e = T->wait(rr, DEADLINE_MS, &done, NULL);
    CHECK(done);
    CHECK(e != ZS_OK);
    fprintf(stderr, "peer killed after %lld ms: %s\n", (long long)(now_ms() - t0), zs_last_error());
    CHECK(T->conn_closed(cl.c));
    client_close(&cl);
    close(pipefd[0]);
}

/* Bytes that are not a set-up on the listening port: refused, logged with a reason, and the
 * server goes on. */
static void test_garbage_setup(server *s)
{
    int refused0 = server_get(s, &s->refused);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, suite_addr, &sa.sin_addr);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    char junk[200];
    memset(junk, 'x', sizeof junk);
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    CHECK(server_wait(s, &s->refused, refused0 + 1));
    pthread_mutex_lock(&s->mu);
    fprintf(stderr, "garbage: %s\n", s->last_refused);
    CHECK(s->last_refused[0] != '\0');
    pthread_mutex_unlock(&s->mu);
    close(fd);
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    zs_frame got;
    CHECK_OK(fetch(&cl, 4096, 8192, 0, &got));
    client_close(&cl);
}

/* wait_fd: an idle connected net has no timer and is not readable; a reply makes it so. */
static void test_wait_fd(server *s)
{
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    zs_frame got;
    CHECK_OK(fetch(&cl, 0, 4096, 0, &got));
    int t = 0;
    int fd = T->wait_fd(cl.net, &t);
    CHECK(fd >= 0);
    CHECK_EQ_INT(t, -1);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    CHECK_EQ_INT(poll(&p, 1, 0), 0);
    uint64_t id = next_id++;
    zs_req *rr;
    CHECK_OK(T->irecv(cl.c, id, cl.mr, 0, 8192, NULL, &rr));
    zs_frame f = {.op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = id, .count = 2048};
    CHECK_OK(T->isend(cl.c, &f, NULL, 0, NULL, NULL));
    int done = 0;
    int64_t end = now_ms() + DEADLINE_MS;
    while (!done && now_ms() < end) {
        fd = T->wait_fd(cl.net, &t);
        poll(&p, 1, t < 0 || t > 1000 ? 1000 : t);
        CHECK_OK(T->test(rr, &done, NULL));
    }
    CHECK(done);
    client_close(&cl);
}

/* accept(): a listener's connection is taken by accept() as its set-up completes (a listener
 * whose events named no listener would never match). */
typedef struct {
    client cl;
    int port;
    zs_err res;
} connect_arg;

static void *connect_main(void *arg)
{
    connect_arg *a = arg;
    a->res = client_open(&a->cl, a->port, NULL);
    return NULL;
}

static void test_accept(void)
{
    server s;
    CHECK(server_open(&s, 0) == 0);
    connect_arg a = {.port = s.port};
    pthread_t th;
    pthread_create(&th, NULL, connect_main, &a);
    zs_conn *c = NULL;
    CHECK_OK(T->accept(s.l, DEADLINE_MS, &c));
    CHECK(c != NULL);
    pthread_join(th, NULL);
    CHECK_OK(a.res);
    if (c)
        CHECK(!T->conn_closed(c));
    client_close(&a.cl);
    server_close(&s);
}

#endif
