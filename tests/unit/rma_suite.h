/*
 * rma_suite.h: the one-sided operations of transport.h (mr_export, iread, iwrite, ZS_EV_WRITTEN)
 * as every backend must carry them out, included by each backend's test file.  The includer
 * defines, before including:
 *   RMA_OPS                  the backend's function table
 *   RMA_NIC                  1 where a NIC checks the key (rdma): a refused operation also
 *                            fails the connection (a remote access error), 0 where the peer's
 *                            net does (the connection goes on)
 *   rma_addr                 the IPv4 address the target listens on
 *   rma_server_opts(o)       fills a listener's backend options
 *   rma_client_opts(o)       fills a client's backend options
 * (without the three: 127.0.0.1 and no backend options), and calls rma_suite().  Where the
 * backend's bytes pass through the CPU (tcp, shm), it also defines RMA_NO_DEVICE_MEMORY as its
 * name: the suite then checks that it refuses to register device memory (a dma-buf).
 *
 * The target runs in a thread that only drives its net (poll()) and counts ZS_EV_WRITTEN: its
 * application takes no part in the operations, which is what one-sided means.  It shares this
 * process's memory, so the tests look at its regions directly once an operation completed.  No
 * assertion depends on timing; deadlines are there so that a bug fails instead of hanging.
 */
#ifndef ZS_TEST_RMA_SUITE_H
#define ZS_TEST_RMA_SUITE_H

#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "test.h"
#include "transport/transport.h"

#define RMA_DEADLINE_MS 30000
#define RMA_BIG (((size_t)8 << 20) + 123) /* the open region: not a whole number of pages */
#define RMA_RO ((size_t)1 << 20)          /* a region open to remote reads only */
#define RMA_LOCAL ((size_t)16 << 20)

static const zs_transport_ops *const RT = RMA_OPS;

#ifndef rma_addr
static const char *rma_addr = "127.0.0.1";
static void rma_server_opts(zs_conn_opts *o)
{
    (void)o;
}
static void rma_client_opts(zs_conn_opts *o)
{
    (void)o;
}
#endif

typedef struct {
    zs_net *net;
    zs_listener *l;
    int port;
    uint8_t *big, *ro, *plain;
    zs_mr *big_mr, *ro_mr, *plain_mr;
    pthread_t th;
    pthread_mutex_t mu;
    int stop, written, closed;
    zs_frame last_written;
} rma_target;

static uint8_t rma_byte(size_t i, int salt)
{
    return (uint8_t)(i * 7u + (i >> 11) + 31u * (unsigned)salt);
}

static void *rma_target_main(void *arg)
{
    rma_target *t = arg;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        int stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (stop)
            return NULL;
        zs_event ev[16];
        int n = 0;
        if (RT->poll(t->net, ev, 16, 20, &n) != ZS_OK)
            return NULL;
        pthread_mutex_lock(&t->mu);
        for (int i = 0; i < n; i++) {
            if (ev[i].type == ZS_EV_WRITTEN) {
                t->written++;
                t->last_written = ev[i].frame;
            } else if (ev[i].type == ZS_EV_CLOSED) {
                t->closed++;
                RT->conn_close(ev[i].conn);
            } else if (ev[i].type == ZS_EV_HEADER && ev[i].frame.length > 0) {
                RT->conn_close(ev[i].conn); /* nobody sends it frames: never */
            }
        }
        pthread_mutex_unlock(&t->mu);
    }
}

static int rma_target_open(rma_target *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    t->big = malloc(RMA_BIG);
    t->ro = malloc(RMA_RO);
    t->plain = calloc(1, 4096);
    if (!t->big || !t->ro || !t->plain)
        return -1;
    for (size_t i = 0; i < RMA_BIG; i++)
        t->big[i] = rma_byte(i, 1);
    for (size_t i = 0; i < RMA_RO; i++)
        t->ro[i] = rma_byte(i, 2);
    zs_conn_opts o = {0};
    rma_server_opts(&o);
    char addr[64];
    snprintf(addr, sizeof addr, "%s:0", rma_addr);
    if (RT->open(&t->net) != ZS_OK || RT->listen(t->net, addr, &o, &t->l) != ZS_OK ||
        RT->reg_mr(t->net, t->big, RMA_BIG, ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE, &t->big_mr) !=
            ZS_OK ||
        RT->reg_mr(t->net, t->ro, RMA_RO, ZS_MR_SEND | ZS_MR_REMOTE_READ, &t->ro_mr) != ZS_OK ||
        RT->reg_mr(t->net, t->plain, 4096, ZS_MR_SEND | ZS_MR_RECV, &t->plain_mr) != ZS_OK) {
        fprintf(stderr, "rma target: %s\n", zs_last_error());
        return -1;
    }
    t->port = RT->listener_port(t->l);
    pthread_create(&t->th, NULL, rma_target_main, t);
    return 0;
}

/* Stops the target's thread (the net is the caller's until rma_target_resume). */
static void rma_target_pause(rma_target *t)
{
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
}

static void rma_target_resume(rma_target *t)
{
    t->stop = 0;
    pthread_create(&t->th, NULL, rma_target_main, t);
}

static void rma_target_close(rma_target *t)
{
    rma_target_pause(t);
    RT->close(t->net);
    free(t->big);
    free(t->ro);
    free(t->plain);
}

static int rma_get(rma_target *t, const int *field)
{
    pthread_mutex_lock(&t->mu);
    int v = *field;
    pthread_mutex_unlock(&t->mu);
    return v;
}

/* Waits for the target's counter *field to reach want (its thread changes it). */
static int rma_wait_count(rma_target *t, const int *field, int want)
{
    int64_t end = (int64_t)zs_now_ms() + RMA_DEADLINE_MS;
    while (rma_get(t, field) < want && (int64_t)zs_now_ms() < end)
        poll(NULL, 0, 2);
    return rma_get(t, field) >= want;
}

typedef struct {
    zs_net *net;
    zs_conn *c;
    uint8_t *buf;
    zs_mr *mr;
} rma_client;

static zs_err rma_connect(rma_client *cl, int port)
{
    zs_conn_opts o = {.connect_timeout_ms = RMA_DEADLINE_MS};
    rma_client_opts(&o);
    char addr[64];
    snprintf(addr, sizeof addr, "%s:%d", rma_addr, port);
    return RT->connect(cl->net, addr, &o, &cl->c);
}

static zs_err rma_client_open(rma_client *cl, int port)
{
    memset(cl, 0, sizeof *cl);
    cl->buf = calloc(1, RMA_LOCAL);
    ZS_CHECK(RT->open(&cl->net));
    ZS_CHECK(RT->reg_mr(cl->net, cl->buf, RMA_LOCAL, ZS_MR_SEND | ZS_MR_RECV, &cl->mr));
    return rma_connect(cl, port);
}

/* Waits for a request; its outcome. */
static zs_err rma_finish(zs_req *r)
{
    int done = 0;
    zs_err e = RT->wait(r, RMA_DEADLINE_MS, &done, NULL);
    if (e == ZS_OK && !done)
        return zs_error(ZS_ERR_IO, "no outcome within %d ms", RMA_DEADLINE_MS);
    return e;
}

static zs_err rma_read(rma_client *cl, size_t off, const zs_mr_desc *d, uint64_t roff, size_t len)
{
    zs_req *r;
    ZS_CHECK(RT->iread(cl->c, cl->mr, off, d, roff, len, NULL, &r));
    return rma_finish(r);
}

static zs_err rma_write(rma_client *cl, size_t off, const zs_mr_desc *d, uint64_t roff, size_t len,
                        int notify, uint32_t imm)
{
    zs_req *r;
    ZS_CHECK(RT->iwrite(cl->c, cl->mr, off, d, roff, len, notify, imm, NULL, &r));
    return rma_finish(r);
}

/* After a refused operation: the connection goes on where the peer's net checks keys, and is
 * failed where a NIC does (then a new one replaces it). */
static void rma_after_refusal(rma_client *cl, int port)
{
    if (!RMA_NIC) {
        CHECK(!RT->conn_closed(cl->c));
        return;
    }
    int64_t end = (int64_t)zs_now_ms() + RMA_DEADLINE_MS;
    while (!RT->conn_closed(cl->c) && (int64_t)zs_now_ms() < end) {
        zs_event ev[4];
        int n;
        RT->poll(cl->net, ev, 4, 10, &n);
    }
    CHECK(RT->conn_closed(cl->c));
    RT->conn_close(cl->c);
    CHECK_OK(rma_connect(cl, port));
}

#ifdef RMA_NO_DEVICE_MEMORY
/* Device memory (a dma-buf): refused with ZS_ERR_UNSUPPORTED, the backend named. */
static void rma_dmabuf_refused(void)
{
    zs_net *net;
    CHECK_OK(RT->open(&net));
    zs_dmabuf b = {.fd = 0, .len = 4096, .addr = (void *)(uintptr_t)0x10000};
    zs_mr *mr = NULL;
    CHECK_EQ_INT(RT->reg_dmabuf_mr(net, &b, ZS_MR_SEND | ZS_MR_RECV, &mr), ZS_ERR_UNSUPPORTED);
    CHECK_FAILS_WITH(RT->reg_dmabuf_mr(net, &b, ZS_MR_SEND | ZS_MR_RECV, &mr),
                     RMA_NO_DEVICE_MEMORY " cannot read or write device memory");
    CHECK(mr == NULL);
    RT->close(net);
}
#endif

static void rma_suite(void)
{
#ifdef RMA_NO_DEVICE_MEMORY
    rma_dmabuf_refused();
#endif
    rma_target t;
    CHECK(rma_target_open(&t) == 0);
    zs_mr_desc big, ro, none;
    CHECK_OK(RT->mr_export(t.big_mr, &big));
    CHECK_OK(RT->mr_export(t.ro_mr, &ro));
    CHECK(big.addr == (uint64_t)(uintptr_t)t.big && big.len == RMA_BIG &&
          big.access == (ZS_MR_REMOTE_READ | ZS_MR_REMOTE_WRITE));
    CHECK(ro.len == RMA_RO && ro.access == ZS_MR_REMOTE_READ);
    CHECK_FAILS_WITH(RT->mr_export(t.plain_mr, &none), "neither ZS_MR_REMOTE_READ nor");
    /* A descriptor survives the wire. */
    uint8_t wire[ZS_MR_DESC_BYTES];
    zs_mr_desc back;
    zs_mr_desc_encode(&big, wire);
    CHECK_OK(zs_mr_desc_decode(wire, &back));
    CHECK(back.addr == big.addr && back.key == big.key && back.len == big.len);

    rma_client cl;
    CHECK_OK(rma_client_open(&cl, t.port));

    /* Reads of every size class, at odd offsets on both sides. */
    const size_t sizes[] = {1, 4095, 4096, 65536 + 7, (size_t)1 << 20, RMA_BIG};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t len = sizes[k], roff = len == RMA_BIG ? 0 : 4096 * k + k, off = 3 * k;
        memset(cl.buf, 0, len + off);
        CHECK_OK(rma_read(&cl, off, &big, roff, len));
        CHECK(!memcmp(cl.buf + off, t.big + roff, len));
    }
    CHECK_OK(rma_read(&cl, 0, &ro, RMA_RO - 10, 10));
    CHECK(!memcmp(cl.buf, t.ro + RMA_RO - 10, 10));

    /* 64 reads in flight without handles: one ZS_EV_RECV each, naming the operation. */
    memset(cl.buf, 0, 64 * 65536);
    for (int i = 0; i < 64; i++)
        CHECK_OK(RT->iread(cl.c, cl.mr, (size_t)i * 65536, &big, (uint64_t)i * 70000, 65536,
                           (void *)(uintptr_t)(i + 1), NULL));
    int got = 0, bad = 0;
    int64_t end = (int64_t)zs_now_ms() + RMA_DEADLINE_MS;
    while (got < 64 && (int64_t)zs_now_ms() < end) {
        zs_event ev[16];
        int n = 0;
        CHECK_OK(RT->poll(cl.net, ev, 16, 100, &n));
        for (int i = 0; i < n; i++) {
            int ok = ev[i].type == ZS_EV_RECV && ev[i].err == ZS_OK &&
                     ev[i].frame.op == ZS_OP_RMA_READ && ev[i].frame.count == 65536;
            size_t j = (size_t)(uintptr_t)ev[i].user - 1;
            ok = ok && j < 64 && ev[i].frame.offset == big.addr + j * 70000 &&
                 !memcmp(cl.buf + j * 65536, t.big + j * 70000, 65536);
            bad += !ok;
            got++;
        }
    }
    CHECK_EQ_INT(got, 64);
    CHECK_EQ_INT(bad, 0);

    /* A notifying write: the bytes are in place when it completes, and the target's net
     * reports exactly where and with which immediate value. */
    for (size_t i = 0; i < 3 * ((size_t)1 << 20) + 5; i++)
        cl.buf[i] = rma_byte(i, 9);
    CHECK_OK(rma_write(&cl, 0, &big, 17, 3 * ((size_t)1 << 20) + 5, 1, 0xabcu));
    CHECK(!memcmp(t.big + 17, cl.buf, 3 * ((size_t)1 << 20) + 5));
    CHECK(rma_wait_count(&t, &t.written, 1));
    pthread_mutex_lock(&t.mu);
    CHECK(t.last_written.offset == big.addr + 17 &&
          t.last_written.count == 3 * ((size_t)1 << 20) + 5 && t.last_written.chunk == 0xabcu);
    pthread_mutex_unlock(&t.mu);
    /* A plain write makes no event: the next notifying write's event is the only one. */
    memset(cl.buf, 0x5c, 4096);
    CHECK_OK(rma_write(&cl, 0, &big, RMA_BIG - 4096, 4096, 0, 0));
    CHECK(t.big[RMA_BIG - 1] == 0x5c && t.big[RMA_BIG - 4096] == 0x5c);
    CHECK_OK(rma_write(&cl, 0, &big, 0, 1, 1, 7));
    CHECK(rma_wait_count(&t, &t.written, 2));
    CHECK_EQ_INT(rma_get(&t, &t.written), 2);
    pthread_mutex_lock(&t.mu);
    CHECK_EQ_INT(t.last_written.chunk, 7);
    pthread_mutex_unlock(&t.mu);

    /* What the initiator can tell by itself is refused before anything starts. */
    CHECK_FAILS_WITH(RT->iread(cl.c, cl.mr, 0, &big, 0, 0, NULL, NULL), "1 to");
    CHECK_FAILS_WITH(RT->iread(cl.c, cl.mr, 0, &big, RMA_BIG - 10, 11, NULL, NULL),
                     "outside the peer's region");
    CHECK_FAILS_WITH(RT->iwrite(cl.c, cl.mr, 0, &ro, 0, 8, 0, 0, NULL, NULL),
                     "not open to remote writes");
    CHECK_FAILS_WITH(RT->iread(cl.c, cl.mr, RMA_LOCAL - 4, &big, 0, 8, NULL, NULL),
                     "outside the region");
    CHECK_FAILS_WITH(RT->irecv(cl.c, (uint64_t)1 << 63, cl.mr, 0, 8, NULL, NULL),
                     "one-sided operations");

    /* What only the target can tell: a forged key, a forged length, forged access, a region
     * deregistered since.  Each fails its request, and the target's memory is untouched. */
    zs_mr_desc forged = big;
    forged.key ^= 0x5a5a;
    CHECK_FAILS_WITH(rma_read(&cl, 0, &forged, 0, 64), "key");
    rma_after_refusal(&cl, t.port);
    forged = ro;
    forged.len = RMA_RO + 4096;
    CHECK(rma_read(&cl, 0, &forged, RMA_RO, 4096) != ZS_OK);
    rma_after_refusal(&cl, t.port);
    forged = ro;
    forged.access |= ZS_MR_REMOTE_WRITE;
    memset(cl.buf, 0xee, 64);
    CHECK(rma_write(&cl, 0, &forged, 0, 64, 1, 1) != ZS_OK);
    CHECK(t.ro[0] == rma_byte(0, 2) && t.ro[63] == rma_byte(63, 2));
    rma_after_refusal(&cl, t.port);
    CHECK_EQ_INT(rma_get(&t, &t.written), 2);
    /* A descriptor of a region deregistered since names nothing.  (The target's thread is
     * stopped meanwhile: a net is driven by one thread at a time.) */
    rma_target_pause(&t);
    uint8_t *gone = malloc(8192);
    zs_mr *gone_mr;
    zs_mr_desc gd;
    CHECK_OK(RT->reg_mr(t.net, gone, 8192, ZS_MR_REMOTE_READ, &gone_mr));
    CHECK_OK(RT->mr_export(gone_mr, &gd));
    CHECK_OK(RT->dereg_mr(gone_mr));
    rma_target_resume(&t);
    CHECK(rma_read(&cl, 0, &gd, 0, 8192) != ZS_OK);
    rma_after_refusal(&cl, t.port);
    free(gone);
    /* The connection (or its replacement) still works. */
    CHECK_OK(rma_read(&cl, 0, &big, 100, 5000));
    CHECK(!memcmp(cl.buf, t.big + 100, 5000));

    /* A read in flight cannot be recalled; it still completes. */
    zs_req *r;
    CHECK_OK(RT->iread(cl.c, cl.mr, 0, &big, 0, (size_t)1 << 20, NULL, &r));
    CHECK_FAILS_WITH(RT->cancel(r), "cannot be recalled");
    CHECK_OK(rma_finish(r));
    CHECK(!memcmp(cl.buf, t.big, (size_t)1 << 20));

    RT->close(cl.net);
    free(cl.buf);
    rma_target_close(&t);
}

#endif
