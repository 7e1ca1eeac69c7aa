/*
 * test_transport_shm: the shared-memory backend (transport/shm.h) between threads and between
 * processes of this host.
 *
 * The tests every rendezvous backend passes are in transport_suite.h (a server thread and the
 * main thread as client: round trips of every size class, more frames than fit in flight, a
 * republish racing the reader, wait_fd, authentication, a server process killed while its
 * reply is read, garbage on the set-up port).  Here besides: a server in another process (the
 * copies cross address spaces, as in a job), and a client process SIGKILLed while the server
 * reads its push, after which the server serves others.
 */
#include <sys/mman.h>
#include <sys/prctl.h>

#include "transport/shm.h"

static const char *suite_addr = "127.0.0.1";

static void suite_server_opts(zs_conn_opts *o)
{
    (void)o;
}

static void suite_client_opts(zs_conn_opts *o)
{
    (void)o;
}

#define SUITE_OPS (&zs_shm_ops)
#define SUITE_KILL_AFTER_MS 0
/* Every payload from a region of 1 MiB or more is in pages mapped here, and small ones travel
 * inline. */
#define SUITE_VIEWS(bytes) 1
#include "transport_suite.h"

/* A server process: fetches and pushes cross address spaces. */
static void test_other_process(void)
{
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphan if the test dies */
        close(pipefd[0]);
        server s;
        if (server_open(&s, 0) != 0)
            _exit(2);
        if (write(pipefd[1], &s.port, sizeof s.port) != sizeof s.port)
            _exit(2);
        server_start(&s);
        char b;
        while (read(pipefd[1], &b, 1) != 0 && errno == EINTR)
            ;
        pause(); /* until the parent kills it */
        _exit(0);
    }
    close(pipefd[1]);
    int port = 0;
    CHECK(read(pipefd[0], &port, sizeof port) == sizeof port);
    client cl;
    CHECK_OK(client_open(&cl, port, NULL));
    zs_frame got;
    CHECK_OK(fetch(&cl, 4096, 9 * MIB, 0, &got));
    CHECK(same_as_pattern(cl.buf, 4096, 9 * MIB, 0));
    for (size_t i = 0; i < 3 * MIB; i++)
        cl.buf[SERVE_BYTES + i] = (uint8_t)(i * 13);
    uint64_t h = 0;
    CHECK_OK(push(&cl, 0, 3 * MIB, SERVE_BYTES, &h));
    CHECK_EQ_INT(h, fnv(cl.buf + SERVE_BYTES, 3 * MIB));
    client_close(&cl);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(pipefd[0]);
}

/* A client process pushes 16 MiB and is SIGKILLed while the server may be reading it: the
 * server's receive fails or completes, never crashes, and it serves the next client. */
static void test_client_killed(server *s)
{
    int closed0 = server_get(s, &s->closed);
    pid_t pid = fork();
    if (pid == 0) {
        client cl;
        if (client_open(&cl, s->port, NULL) != ZS_OK)
            _exit(2);
        for (;;) {
            uint64_t h;
            if (push(&cl, 0, 16 * MIB, SERVE_BYTES, &h) != ZS_OK)
                _exit(3);
        }
    }
    int pushes0 = server_get(s, &s->pushes_ok) + server_get(s, &s->pushes_failed);
    CHECK(server_wait(s, &s->pushes_ok, pushes0 > 0 ? pushes0 + 1 : 1));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK(server_wait(s, &s->closed, closed0 + 1));
    pthread_mutex_lock(&s->mu);
    fprintf(stderr, "client killed: the server closed it: %s\n", s->last_closed);
    pthread_mutex_unlock(&s->mu);
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    zs_frame got;
    CHECK_OK(fetch(&cl, 0, MIB, 0, &got));
    CHECK(same_as_pattern(cl.buf, 0, MIB, s->version));
    client_close(&cl);
}

/* Whether the page at p is mapped from our shared-memory memfd (a region moved at reg_mr). */
static int moved_to_memfd(const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int moved = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && (uintptr_t)p >= a && (uintptr_t)p < b)
            moved = strstr(line, "/memfd:zshard-shm") != NULL;
    }
    if (f)
        fclose(f);
    return moved;
}

/* A region registered with ZS_MR_PINNED (a GPU's page-locked buffer) keeps its pages where
 * they are, and its payloads are read from the sender's memory (not viewed in place); the same
 * region without the flag is moved into the shared memfd and its pushes are viewed. */
static void test_pinned_stays(server *s)
{
    const size_t bytes = 4 * MIB;
    uint8_t *pinned = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *plain = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pinned != MAP_FAILED && plain != MAP_FAILED);
    for (size_t i = 0; i < bytes; i++)
        pinned[i] = plain[i] = (uint8_t)(i * 17 + 3);
    client cl;
    CHECK_OK(client_open(&cl, s->port, NULL));
    zs_mr *mp, *mq, *own = cl.mr;
    CHECK_OK(T->reg_mr(cl.net, pinned, bytes, ZS_MR_SEND | ZS_MR_PINNED, &mp));
    CHECK_OK(T->reg_mr(cl.net, plain, bytes, ZS_MR_SEND, &mq));
    CHECK_EQ_INT(moved_to_memfd(pinned), 0);
    CHECK_EQ_INT(moved_to_memfd(plain), 1);
    uint64_t h = 0;
    cl.mr = mp; /* push() sends from cl.mr */
    CHECK_OK(push(&cl, 0, 2 * MIB, 0, &h));
    CHECK_EQ_INT(h, fnv(pinned, 2 * MIB));
    CHECK_EQ_INT(last_push_viewed, 0);
    cl.mr = mq;
    CHECK_OK(push(&cl, 0, 2 * MIB, 0, &h));
    CHECK_EQ_INT(h, fnv(plain, 2 * MIB));
    CHECK_EQ_INT(last_push_viewed, 1);
    CHECK_FAILS_WITH(T->reg_mr(cl.net, pinned, bytes, ZS_MR_PINNED, &mp), "not a combination");
    cl.mr = own;
    client_close(&cl);
    munmap(pinned, bytes);
    munmap(plain, bytes);
}

/* The one-sided operations (rma_suite.h). */
#define RMA_OPS (&zs_shm_ops)
#define RMA_NIC 0
#define RMA_NO_DEVICE_MEMORY "shm" /* its peers read regions with the CPU */
#include "rma_suite.h"

/* One-sided operations across address spaces, as in a job: the owner is another process
 * (its regions read through the memfd it hands over, or process_vm_readv). */
static void test_rma_other_process(void)
{
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(pipefd[0]);
        rma_target t;
        zs_mr_desc d;
        uint8_t msg[4 + ZS_MR_DESC_BYTES];
        if (rma_target_open(&t) != 0 || RT->mr_export(t.big_mr, &d) != ZS_OK)
            _exit(2);
        memcpy(msg, &t.port, 4);
        zs_mr_desc_encode(&d, msg + 4);
        if (write(pipefd[1], msg, sizeof msg) != (ssize_t)sizeof msg)
            _exit(2);
        pause(); /* until the parent kills it */
        _exit(0);
    }
    close(pipefd[1]);
    uint8_t msg[4 + ZS_MR_DESC_BYTES];
    CHECK(read(pipefd[0], msg, sizeof msg) == (ssize_t)sizeof msg);
    int port;
    zs_mr_desc d;
    memcpy(&port, msg, 4);
    CHECK_OK(zs_mr_desc_decode(msg + 4, &d));
    rma_client cl;
    CHECK_OK(rma_client_open(&cl, port));
    CHECK_OK(rma_read(&cl, 0, &d, 0, RMA_BIG));
    size_t bad = 0;
    for (size_t i = 0; i < RMA_BIG; i++)
        bad += cl.buf[i] != rma_byte(i, 1);
    CHECK_EQ_INT(bad, 0);
    const size_t n = (size_t)2 << 20;
    for (size_t i = 0; i < n; i++)
        cl.buf[i] = rma_byte(i, 5);
    CHECK_OK(rma_write(&cl, 0, &d, 1000, n, 1, 42));
    memset(cl.buf + n, 0, n);
    CHECK_OK(rma_read(&cl, n, &d, 1000, n));
    CHECK(!memcmp(cl.buf, cl.buf + n, n));
    RT->close(cl.net);
    free(cl.buf);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(pipefd[0]);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    /* First: a child forked after this process shared a region's pages with peers (shm.c,
     * share_region) lacks those pages (MADV_DONTFORK), and its allocator may hand them out
     * again (ASan's does). */
    test_rma_other_process();
    server s;
    if (server_open(&s, 0) != 0)
        return 1;
    server_start(&s);
    test_round_trips(&s);
    test_read_vs_republish(&s);
    test_view_holds_send(&s);
    test_pinned_stays(&s);
    test_wait_fd(&s);
    test_client_killed(&s);
    test_garbage_setup(&s);
    server_close(&s);
    test_auth();
    test_accept();
    test_other_process();
    test_peer_killed();
    rma_suite();
    return zs_test_result("test_transport_shm");
}
