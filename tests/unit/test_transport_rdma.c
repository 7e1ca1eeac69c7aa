/*
 * test_transport_rdma: the RDMA backend (transport/rdma.h) over real verbs.
 *
 * It needs two RDMA devices with IPv4 RoCE v2 GIDs, as the guest of tests/rdma/run.sh has
 * (soft-RoCE rxe0 on 10.0.0.1 and rxe1 on 10.0.0.2; ZS_RDMA_DEV0/1 and ZS_RDMA_ADDR0 name
 * them).  Without a device it says so and exits 77 (CTest: skipped); the guest counts that as
 * a failure.
 *
 * The tests every rendezvous backend passes are in transport_suite.h; the server there runs
 * on DEV0 and the client on DEV1, so every byte crosses between the two devices.  Failures are made
 * for real: a bad rkey, a QP moved to the error state, a server process killed while its reply is
 * being read, garbage on the set-up port, an unknown member.  The one-sided operations run
 * rma_suite.h, as tcp's and shm's do.  No assertion depends on timing;
 * deadlines are there so that a bug fails instead of hanging.
 */
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
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "transport/rdma.h"

static const char *dev0 = "rxe0", *dev1 = "rxe1", *suite_addr = "10.0.0.1";
static zs_rdma_conn_opts server_ro, client_ro;

static void suite_server_opts(zs_conn_opts *o)
{
    server_ro = (zs_rdma_conn_opts){.device = dev0, .gid_index = -1};
    o->backend = &server_ro;
    o->backend_name = "rdma";
}

static void suite_client_opts(zs_conn_opts *o)
{
    client_ro = (zs_rdma_conn_opts){.device = dev1, .gid_index = -1};
    o->backend = &client_ro;
    o->backend_name = "rdma";
}

#define SUITE_OPS (&zs_rdma_ops)
#define SUITE_KILL_AFTER_MS 50
/* Only inline payloads are here to read in place; others are in the peer's memory. */
#define SUITE_VIEWS(bytes) ((bytes) <= ZS_NET_INLINE_MAX)
#include "transport_suite.h"

/* A frame naming a bad rkey: the reader's READ fails, both ends fail that connection with the
 * verbs status, the server goes on serving others. */
static void test_bad_key(server *s)
{
    int closed0 = server_get(s, &s->closed), failed0 = server_get(s, &s->pushes_failed);
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    zs_rdma_test_bad_key(cl.c);
    uint64_t h;
    zs_err e = push(&cl, 0, MIB, SERVE_BYTES, &h);
    CHECK(e != ZS_OK);
    fprintf(stderr, "bad key, client: %s\n", zs_last_error());
    CHECK(server_wait(s, &s->pushes_failed, failed0 + 1));
    CHECK(server_wait(s, &s->closed, closed0 + 1));
    pthread_mutex_lock(&s->mu);
    fprintf(stderr, "bad key, server: %s\n", s->last_closed);
    CHECK(strstr(s->last_closed, "RDMA READ") != NULL);
    pthread_mutex_unlock(&s->mu);
    CHECK(T->conn_closed(cl.c));
    client_close(&cl);
    /* the server still serves */
    CHECK_OK(client_open(&cl, s->port, NULL));
    zs_frame got;
    CHECK_OK(fetch(&cl, 0, MIB, 0, &got));
    CHECK(same_as_pattern(cl.buf, 0, MIB, s->version));
    client_close(&cl);
}

/* A QP moved to the error state (as a failing NIC would): the next operation fails with a
 * reason, and the server sees the connection closed rather than hanging on it. */
static void test_broken_qp(server *s)
{
    int closed0 = server_get(s, &s->closed);
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    CHECK_OK(zs_rdma_test_break_qp(cl.c));
    zs_frame got;
    zs_err e = fetch(&cl, 0, MIB, 0, &got);
    CHECK(e != ZS_OK);
    fprintf(stderr, "broken QP: %s\n", zs_last_error());
    CHECK(T->conn_closed(cl.c));
    CHECK(server_wait(s, &s->closed, closed0 + 1));
    client_close(&cl);
}

/* Device memory.  A dma-buf registration is refused with the reason: here with the provider's
 * errno (rxe has no dma-buf registration), and a memfd is no dma-buf for a device that has one.
 * Then what a dma-buf region does differently runs on host memory the backend is told is device
 * memory: a short fetch reply (sent inline) arrives through the region's copy function, a short
 * push goes by rendezvous (the server cannot read it in place), a long fetch by READ, all
 * byte-exact. */
static int dev_copies;
static int count_copy(void *ctx, void *dst, const void *src, size_t n, int to_region)
{
    (void)ctx, (void)to_region;
    dev_copies++;
    memcpy(dst, src, n);
    return 0;
}

static void test_dmabuf(server *s)
{
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    int fd = memfd_create("zs-not-a-dmabuf", MFD_CLOEXEC);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)(2 * MIB)) == 0);
    zs_dmabuf b = {
        .fd = fd, .len = 2 * MIB, .addr = (void *)(uintptr_t)0x7e0000000000ull, .copy = count_copy};
    zs_mr *mr = NULL;
    zs_err e = T->reg_dmabuf_mr(cl.net, &b, ZS_MR_SEND | ZS_MR_RECV, &mr);
    fprintf(stderr, "dma-buf registration on %s: %s (%s)\n", dev1,
            e == ZS_OK ? "accepted" : zs_last_error(), zs_err_name(e));
    CHECK(e != ZS_OK);
    CHECK(e != ZS_OK && strstr(zs_last_error(), "ibv_reg_dmabuf_mr") != NULL);
    if (e == ZS_OK)
        T->dereg_mr(mr);
    close(fd);

    zs_rdma_test_as_device(cl.mr, count_copy, NULL);
    zs_frame got;
    dev_copies = 0;
    CHECK_OK(fetch(&cl, 4096, 256, 512, &got));
    CHECK_EQ_INT(dev_copies, 1);
    CHECK(same_as_pattern(cl.buf + 512, 4096, 256, s->version));
    dev_copies = 0;
    CHECK_OK(fetch(&cl, MIB, MIB, 2 * MIB, &got));
    CHECK_EQ_INT(dev_copies, 0);
    CHECK(same_as_pattern(cl.buf + 2 * MIB, MIB, MIB, s->version));
    for (size_t i = 0; i < 256; i++)
        cl.buf[8 * MIB + i] = (uint8_t)(i * 7 + 3);
    uint64_t h = 0;
    last_push_viewed = -1;
    CHECK_OK(push(&cl, 0, 256, 8 * MIB, &h));
    CHECK_EQ_INT(last_push_viewed, 0);
    CHECK(h == fnv(cl.buf + 8 * MIB, 256));
    client_close(&cl);
}

static void test_no_device(void)
{
    zs_net *n;
    CHECK_OK(T->open(&n));
    zs_rdma_conn_opts ro = {.device = "nosuchdev0", .gid_index = -1};
    zs_conn_opts o = {.backend = &ro, .backend_name = "rdma"};
    zs_listener *l;
    CHECK_FAILS_WITH(T->listen(n, "127.0.0.1:0", &o, &l), "nosuchdev0");
    T->close(n);
}

/* The one-sided operations (rma_suite.h) as RDMA READ and WRITE between the two devices; the
 * owner's NIC checks the keys, and a refusal fails the connection (a remote access error). */
#define RMA_OPS (&zs_rdma_ops)
#define RMA_NIC 1
#define rma_addr suite_addr
#define rma_server_opts suite_server_opts
#define rma_client_opts suite_client_opts
#include "rma_suite.h"

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    char why[256];
    if (!zs_rdma_available(why, sizeof why)) {
        printf("test_transport_rdma: skipped: %s (tests/rdma/run.sh runs it in a guest with "
               "soft-RoCE)\n",
               why);
        return 77;
    }
    if (getenv("ZS_RDMA_DEV0"))
        dev0 = getenv("ZS_RDMA_DEV0");
    if (getenv("ZS_RDMA_DEV1"))
        dev1 = getenv("ZS_RDMA_DEV1");
    if (getenv("ZS_RDMA_ADDR0"))
        suite_addr = getenv("ZS_RDMA_ADDR0");
    test_no_device();
    server s;
    if (server_open(&s, 0) != 0)
        return 1;
    server_start(&s);
    test_round_trips(&s);
    test_read_vs_republish(&s);
    test_view_holds_send(&s);
    test_wait_fd(&s);
    test_bad_key(&s);
    test_broken_qp(&s);
    test_dmabuf(&s);
    test_garbage_setup(&s);
    server_close(&s);
    test_auth();
    test_accept();
    test_peer_killed();
    rma_suite();
    return zs_test_result("test_transport_rdma");
}
