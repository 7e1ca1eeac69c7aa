/*
 * bench_data_plane: fetch and push throughput, and 4 KiB fetch latency, through a real
 * `zshard server` process, against a plain loopback TCP copy measured in the same run.
 *
 * It starts `zshard coord` and one `zshard server` on loopback (a 12 x 512 model, 4 MiB
 * shards, 64 chunks a step), joins as a worker through worker/session, and then, while it
 * holds step 0's chunks, fetches the whole vector at version 0 (every 4 MiB shard in flight at
 * once) and pushes a gradient for the whole vector, each time for the next chunk it holds, so
 * that every timed push is added into the server's accumulator as in training (the first
 * chunk, whose push is a plain copy into it, is pushed once before timing; a repeated chunk
 * would be dropped as a duplicate, which costs shm nothing at all).  64 KiB figures use
 * 64 KiB ranges, 32 in flight.  Each is measured over the session's client (the worker's: 1 stream
 * per server unless ZS_TCP_CONNS says otherwise) and over a second client with 2 streams per
 * server.
 *
 * The limit is a plain loopback TCP copy (one thread writes, the main thread reads) of the
 * same number of bytes in the same message sizes, from and into buffers as large as the
 * vector, as the transport's are: a copy that reuses one 4 MiB buffer runs from the cache and
 * would measure the cache rather than the loopback path.  The wire's speed as iperf3 measures
 * it is also printed, and the 4 MiB figures' ratios to it (target >= 0.9): iperf3 -l 1M where
 * it is installed, else the same loop with 1 MiB writes from one buffer and reads into one,
 * which is what iperf3 does.  The plain copies use the send buffer the transport uses towards
 * a peer on this host (512 KiB, tcp.c).  The runs alternate (the worker's client, 2 streams,
 * shm, plain copies, iperf3), and each figure is the best of `reps`.  The 4 MiB fetch is
 * measured twice in a row, right after the pause the other runs make and then again: the
 * second is the figure (a steady stream, as iperf3's is), the first is printed beside it.
 *
 * The same job runs a second time with cluster.transport "shm" (transport/shm.h: a fetch is
 * copied straight out of the server's memory, a push is added into the accumulator straight
 * from the worker's pages), measured in the same loop, and its figures are printed as multiples
 * of the worker's TCP client's (target >= 2x).  Their limits, measured in the same loop: a
 * copy of the vector (non-temporal stores, as shm copies: common/ntcopy.h) in 4 MiB pieces (by 1
 * and 2 threads, as shm splits a fetch) for fetches, and the addition a push makes (acc += g over
 * the vector, on the server's threads, as it adds) for pushes.
 *
 * The servers add pushes on SERVER_THREADS threads (`zshard server --threads`; 2 by default,
 * this machine class's cores).
 *
 * usage: bench_data_plane ZSHARD [reps=5] [SERVER_THREADS=2]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/benchutil.h"
#include "common/clock.h"
#include "common/ntcopy.h"
#include "worker/session.h"

/* ---- the plain copy: one writer thread, the main thread reads ---- */

typedef struct {
    int fd;
    const char *src; /* total bytes, written msg at a time */
    size_t msg, total;
    int reuse; /* every write from src's first msg bytes (as iperf3 does) */
} writer_args;

static void *writer(void *p)
{
    writer_args *w = p;
    for (int pass = 0; pass < 2; pass++)
        for (size_t done = 0; done < w->total; done += w->msg) {
            size_t len = w->total - done < w->msg ? w->total - done : w->msg;
            size_t off = 0;
            const char *from = w->src + (w->reuse ? 0 : done);
            while (off < len) {
                ssize_t n = write(w->fd, from + off, len - off);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n <= 0)
                    return NULL;
                off += (size_t)n;
            }
        }
    return NULL;
}

/* Reads total bytes from fd into dst, msg bytes per read() at the most (with reuse, into
 * dst's first msg bytes over and over).  Non-blocking reads, each after poll() says there is
 * data: how iperf3's server reads, and how the transport does (through epoll). */
static int read_all(int fd, char *dst, size_t msg, size_t total, int reuse)
{
    for (size_t got = 0; got < total;) {
        size_t want = total - got < msg ? total - got : msg;
        ssize_t n = read(fd, dst + (reuse ? got % msg : got), reuse ? msg - got % msg : want);
        if (n < 0 && errno == EINTR)
            continue; /* a child (iperf3's server) ended: SIGCHLD */
        if (n < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            int k = poll(&p, 1, 10000);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                return -1;
            continue;
        }
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* GB/s of a plain loopback TCP copy of `total` bytes from src into dst, msg bytes per
 * write() and read(): the same bytes between buffers as large as the transport's (a copy
 * that reuses one small buffer stays in the cache and measures something else).  With reuse,
 * every write is from src's first msg bytes and every read into dst's, as iperf3 does: the
 * limit the issue names (iperf3 with 1 MiB writes).  The bytes go over twice and only the
 * second pass is timed: the transport's connections are long-lived, and a new connection's
 * first hundred MiB measure TCP's start (slow start, buffer autotuning) instead. */
static double plain_copy(const char *src, char *dst, size_t msg, size_t total, int reuse)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(ls, (struct sockaddr *)&a, sizeof a);
    getsockname(ls, (struct sockaddr *)&a, &len);
    listen(ls, 1);
    int cs = socket(AF_INET, SOCK_STREAM, 0);
    connect(cs, (struct sockaddr *)&a, sizeof a);
    int ss = accept(ls, NULL, NULL);
    setsockopt(cs, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(ss, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* The send buffer the transport gives a stream to a peer on this host (tcp.c): with the
     * kernel's autotuning this copy ran at about half the speed. */
    int sndbuf = 512 << 10;
    setsockopt(ss, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    fcntl(cs, F_SETFL, fcntl(cs, F_GETFL) | O_NONBLOCK);
    writer_args w = {.fd = ss, .src = src, .msg = msg, .total = total, .reuse = reuse};
    pthread_t th;
    pthread_create(&th, NULL, writer, &w);
    double gbs = 0;
    if (read_all(cs, dst, msg, total, reuse) == 0) {
        double t0 = zs_now_s();
        if (read_all(cs, dst, msg, total, reuse) == 0)
            gbs = (double)total / (zs_now_s() - t0) / 1e9;
    }
    shutdown(cs, SHUT_RDWR); /* a writer stuck on a failed read ends too */
    pthread_join(th, NULL);
    close(cs);
    close(ss);
    close(ls);
    return gbs;
}

/* ---- the memory's limit: what shm's copies can reach ---- */

typedef struct {
    const char *src;
    char *dst;
    size_t total, piece;
    int part, parts; /* this thread takes part of every piece's `parts` equal parts */
    int add;         /* 0: memcpy; 1: dst += src as floats (parts cut at whole floats) */
} copy_args;

static void *copy_parts(void *p)
{
    const copy_args *a = p;
    for (size_t at = 0; at < a->total; at += a->piece) {
        size_t n = a->total - at < a->piece ? a->total - at : a->piece;
        size_t lo = n * (size_t)a->part / (size_t)a->parts & ~(size_t)63;
        size_t hi = a->part + 1 == a->parts
                        ? n
                        : n * (size_t)(a->part + 1) / (size_t)a->parts & ~(size_t)63;
        if (!a->add) {
            zs_copy_nt(a->dst + at + lo, a->src + at + lo, hi - lo);
            continue;
        }
        float *d = (float *)(void *)(a->dst + at + lo);
        const float *g = (const float *)(const void *)(a->src + at + lo);
        for (size_t i = 0; i < (hi - lo) / sizeof(float); i++)
            d[i] += g[i];
    }
    return NULL;
}

/* GB/s of a copy from src (zs_copy_nt, as shm copies a payload) into dst (add 0), or of dst += src
 * as floats (add 1), over total bytes in 4 MiB pieces, each split over `threads` threads (as shm
 * splits a payload: transport/shm.c, copy_split; as a server adds a push: kernels/reduce.h,
 * zs_accumulate), the second of two passes.  The shared-memory transport moves a fetch with one
 * such copy, and TCP over loopback with two (into the kernel and out of it, on the two ends'
 * threads), so on a machine with two cores the copy with two threads bounds shm's fetch, and shm /
 * TCP can reach at most this figure over TCP's.  A push over shm is added from where it lies, with
 * no copy: the addition on the server's threads bounds it. */
static double memory_pass(const char *src, char *dst, size_t total, int threads, int add)
{
    enum { MAXT = 8 };
    threads = threads < 1 ? 1 : threads > MAXT ? MAXT : threads;
    double gbs = 0;
    for (int pass = 0; pass < 2; pass++) {
        copy_args a[MAXT];
        pthread_t th[MAXT];
        int started = 1; /* threads 1..started-1 run; a failed start ends the figure */
        double t0 = zs_now_s();
        for (int t = 0; t < threads; t++) {
            a[t] = (copy_args){src, dst, total, 4u << 20, t, threads, add};
            if (t > 0 && started == t && pthread_create(&th[t], NULL, copy_parts, &a[t]) == 0)
                started++;
        }
        copy_parts(&a[0]);
        for (int t = 1; t < started; t++)
            pthread_join(th[t], NULL);
        if (started < threads)
            return 0;
        gbs = (double)total / (zs_now_s() - t0) / 1e9;
    }
    return gbs;
}

/* GB/s of iperf3 itself over loopback (1 MiB writes, 2 s), where it is installed; 0 where not.
 * Its JSON's end.sum_received.bits_per_second. */
static double iperf3(void)
{
    if (system("command -v iperf3 >/dev/null 2>&1") != 0)
        return 0;
    int port = zs_bench_free_port();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "iperf3 -s -1 -p %d >/dev/null 2>&1 &", port);
    if (port < 0 || system(cmd) != 0)
        return 0;
    double bps = 0;
    for (int tries = 0; tries < 50 && bps == 0; tries++) {
        snprintf(cmd, sizeof cmd, "iperf3 -c 127.0.0.1 -p %d -l 1M -t 2 -J 2>/dev/null", port);
        FILE *p = popen(cmd, "r");
        char line[512];
        int in_received = 0;
        while (p && fgets(line, sizeof line, p)) {
            in_received |= strstr(line, "\"sum_received\"") != NULL;
            const char *b = strstr(line, "\"bits_per_second\":");
            if (in_received && b && bps == 0)
                bps = atof(b + 18);
        }
        if (p)
            pclose(p);
        if (bps == 0)
            usleep(20000); /* the server is not listening yet: try again */
    }
    return bps / 8 / 1e9;
}

typedef struct {
    double fetch4, push4, fetch64, push64; /* GB/s, best of the repetitions */
    double dup4;   /* the 4 MiB push repeated: received whole, dropped as a duplicate */
    double first4; /* the 4 MiB fetch right after a pause (the other runs), best of them */
} figures;

static void keep_best(double *best, double g)
{
    *best = g > *best ? g : *best;
}

/* Waits for *op to finish (a pointer: the caller's call that sets it is an argument too, and
 * C leaves the order of evaluating arguments open); 0 when it did and succeeded, -1 (with the
 * reason on stderr) when issuing it (e: its result) or the wait failed: a measurement of failed
 * operations would be wrong, and a bench that goes on after one measures nothing. */
static int finish(zs_client *cl, zs_err e, zs_client_op **op)
{
    int done = 0;
    if (e == ZS_OK)
        e = zs_client_wait(cl, *op, 60000, &done);
    if (e != ZS_OK || !done) {
        fprintf(stderr, "bench_data_plane: %s\n",
                e != ZS_OK ? zs_last_error() : "an operation took over 60 s");
        return -1;
    }
    return 0;
}

/* A job to measure: a coordinator and one server with `transport`, and a session holding
 * step 0's chunks as a worker; pushes take them in order (next). */
typedef struct {
    pid_t coord, server;
    zs_session *s;
    zs_client *cl;
    int chunks[ZS_SESSION_MAX_CHUNKS];
    int n_chunks, next;
} job;

/* The job's next chunk not pushed yet, or -1 (with the reason on stderr) when none is left. */
static int fresh_chunk(job *j)
{
    if (j->next < j->n_chunks)
        return j->chunks[j->next++];
    fprintf(stderr, "bench_data_plane: all %d chunks of the step are pushed (fewer reps)\n",
            j->n_chunks);
    return -1;
}

/* One repetition of the four transfers over cl: the whole vector in 4 MiB shards (all in
 * flight), then in 64 KiB ranges (32 in flight); fetches of version 0, pushes of (0, a chunk
 * not pushed before). */
static int measure(job *j, zs_client *cl, size_t N, float *buf, figures *fig)
{
    zs_session *s = j->s;
    zs_client_op *op;
    int chunk = fresh_chunk(j);
    if (chunk < 0)
        return -1;
    /* The first fetch follows a pause (iperf3, the plain copies, the other client's turn) and
     * ran at about half the speed of the one right after it, whichever client it was: both are
     * reported, the second as the figure (a steady stream, as iperf3 measures it). */
    double t0 = zs_now_s();
    if (finish(cl, zs_client_fetch(cl, 0, N, 0, ZS_DTYPE_F32, buf, &op), &op))
        return -1;
    keep_best(&fig->first4, (double)N * 4 / (zs_now_s() - t0) / 1e9);
    t0 = zs_now_s();
    if (finish(cl, zs_client_fetch(cl, 0, N, 0, ZS_DTYPE_F32, buf, &op), &op))
        return -1;
    keep_best(&fig->fetch4, (double)N * 4 / (zs_now_s() - t0) / 1e9);
    zs_session_heartbeat(s);
    t0 = zs_now_s();
    if (finish(cl, zs_client_push(cl, 0, N, 0, chunk, buf, &op), &op))
        return -1;
    keep_best(&fig->push4, (double)N * 4 / (zs_now_s() - t0) / 1e9);
    t0 = zs_now_s();
    if (finish(cl, zs_client_push(cl, 0, N, 0, chunk, buf, &op), &op))
        return -1;
    keep_best(&fig->dup4, (double)N * 4 / (zs_now_s() - t0) / 1e9);
    const size_t R = 16384;
    size_t n64 = N / R;
    zs_client_op *ops[32];
    for (int push = 0; push < 2; push++) {
        if (push && (chunk = fresh_chunk(j)) < 0)
            return -1;
        t0 = zs_now_s();
        for (size_t i = 0; i < n64; i += 32) {
            int k = 0, bad = 0;
            for (size_t j = i; j < n64 && k < 32 && !bad; j++) {
                zs_err e =
                    push ? zs_client_push(cl, j * R, (j + 1) * R, 0, chunk, buf + j * R, &ops[k])
                         : zs_client_fetch(cl, j * R, (j + 1) * R, 0, ZS_DTYPE_F32, buf + j * R,
                                           &ops[k]);
                if (e == ZS_OK)
                    k++;
                else
                    bad = finish(cl, e, NULL);
            }
            for (int q = 0; q < k; q++)
                bad |= finish(cl, ZS_OK, &ops[q]);
            if (bad)
                return -1;
            /* A member whose heartbeats stop is dropped, and its connections with it: on a
             * slow machine a pass takes longer than the timeout.  Cheap (the session sends one
             * only when the interval has passed). */
            zs_session_heartbeat(s);
        }
        keep_best(push ? &fig->push64 : &fig->fetch64,
                  (double)(n64 * R * 4) / (zs_now_s() - t0) / 1e9);
    }
    return 0;
}

static int job_start(job *j, const char *zshard, const char *dir, const char *transport,
                     int threads, const zs_secret *secret)
{
    char nthreads[16];
    snprintf(nthreads, sizeof nthreads, "%d", threads);
    char cfg[256], data[256], out[256], ep[64];
    snprintf(cfg, sizeof cfg, "%s/%s-%d.json", dir, transport, threads);
    snprintf(data, sizeof data, "%s/data.txt", dir);
    snprintf(out, sizeof out, "%s/out-%s-%d", dir, transport, threads);
    FILE *f = fopen(cfg, "w");
    if (!f)
        return -1;
    /* The session can send no heartbeat while this program runs the plain copies and iperf3
     * (seconds on a busy machine): a long timeout keeps it a member meanwhile. */
    fprintf(f,
            "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 1, \"model\": "
            "{\"n_layer\": 12, \"n_head\": 8, \"n_embd\": "
            "512, \"vocab_size\": 256, \"block_size\": 64}, \"cluster\": {\"transport\": "
            "\"%s\", \"heartbeat_timeout_ms\": 120000}}\n",
            transport);
    fclose(f);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", zs_bench_free_port());
    char *cargv[] = {(char *)zshard, "coord", "--listen",    ep,      "--config", cfg,
                     "--servers",    "1",     "--data",      data,    "--steps",  "1",
                     "--out",        out,     "--log-level", "error", NULL};
    char *sargv[] = {(char *)zshard,
                     "server",
                     "--coord",
                     ep,
                     "--listen",
                     "127.0.0.1:0",
                     "--threads",
                     nthreads,
                     "--log-level",
                     "error",
                     "--transport",
                     (char *)transport,
                     NULL};
    j->coord = zs_bench_spawn(cargv, NULL);
    j->server = zs_bench_spawn(sargv, NULL);
    if (zs_session_open(ep, secret, NULL, 30000, NULL, &j->s) != ZS_OK) {
        fprintf(stderr, "bench_data_plane: %s job: %s\n", transport, zs_last_error());
        return -1;
    }
    zs_assignment as;
    int got = 0, ended = 0;
    while (!got && !ended)
        zs_session_next(j->s, 100, &as, &got, &ended);
    if (!got)
        return -1;
    j->cl = zs_session_client(j->s);
    memcpy(j->chunks, as.chunks, (size_t)as.n * sizeof *as.chunks);
    j->n_chunks = as.n;
    return 0;
}

static void job_stop(job *j)
{
    if (j->coord > 0)
        kill(j->coord, SIGKILL);
    if (j->server > 0)
        kill(j->server, SIGKILL);
    if (j->coord > 0)
        waitpid(j->coord, NULL, 0);
    if (j->server > 0)
        waitpid(j->server, NULL, 0);
    zs_session_close(j->s);
}

/* n 4 KiB fetch round trips over cl, in us, sorted into lat (n entries); -1 when one
 * failed. */
static int latency(job *j, float *buf, double *lat, int n)
{
    for (int i = 0; i < n; i++) {
        zs_client_op *op;
        double t0 = zs_now_s();
        if (finish(j->cl, zs_client_fetch(j->cl, 4096, 4096 + 1024, 0, ZS_DTYPE_F32, buf, &op),
                   &op))
            return -1;
        lat[i] = (zs_now_s() - t0) * 1e6;
        if (i % 200 == 0)
            zs_session_heartbeat(j->s);
    }
    qsort(lat, (size_t)n, sizeof *lat, zs_bench_cmp_double);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_data_plane ZSHARD [reps] [SERVER_THREADS]\n");
        return 2;
    }
    const char *zshard = argv[1];
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    int server_threads = argc > 3 ? atoi(argv[3]) : 2;
    if (server_threads < 1 || server_threads > 8) {
        fprintf(stderr, "bench_data_plane: server threads must be 1..8\n");
        return 2;
    }
    /* The TCP job pushes 4 chunks a repetition (2 clients, 4 MiB and 64 KiB) of its 64, after
     * the untimed first. */
    if (reps < 1 || reps > 15) {
        fprintf(stderr, "bench_data_plane: reps must be 1..15 (a step has 64 chunks)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/zs_bench_dp_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char data[256];
    zs_secret secret; /* the job's, for the processes started here and this one */
    if (zs_bench_job_secret(dir, &secret) != 0)
        return 1;
    snprintf(data, sizeof data, "%s/data.txt", dir);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 20000; i++)
        fputc('a' + i % 26, f);
    fclose(f);
    int rc = 1;
    /* The same job over TCP and over shared memory (both servers on this host), and over TCP
     * with a server on 1 thread: on a machine this small a second thread that adds pushes takes
     * the core the worker's side of TCP needs, and shm is held against TCP's better figure. */
    job tj = {0}, sj = {0}, t1 = {0};
    zs_client *cl2 = NULL;
    float *buf = NULL;
    char *src = NULL, *dst = NULL;
    if (job_start(&tj, zshard, dir, "tcp", server_threads, &secret) != 0 ||
        job_start(&sj, zshard, dir, "shm", server_threads, &secret) != 0 ||
        (server_threads > 1 && job_start(&t1, zshard, dir, "tcp", 1, &secret) != 0))
        goto out;
    zs_client *cl = tj.cl;
    if (zs_session_open_client(tj.s, 2, &cl2) != ZS_OK) {
        fprintf(stderr, "bench_data_plane: %s\n", zs_last_error());
        goto out;
    }
    size_t N = zs_session_tensors(tj.s)->total;
    buf = malloc(N * 4);
    src = malloc(N * 4);
    dst = malloc(N * 4);
    memset(buf, 0, N * 4);
    memset(src, 1, N * 4);
    memset(dst, 0, N * 4);
    zs_client_register(cl, buf, N * 4);
    zs_client_register(cl2, buf, N * 4);
    zs_client_register(sj.cl, buf, N * 4);
    if (t1.s)
        zs_client_register(t1.cl, buf, N * 4);
    /* The runs alternate (the worker's client, 2 streams, shared memory, plain copies, iperf3) so
     * that a slow spell of the machine hits all alike. */
    figures one = {0}, two = {0}, shm = {0}, tcp1 = {0};
    double plain4 = 0, plain64 = 0, reused1 = 0, ip3 = 0, mem1 = 0, mem2 = 0, addn = 0;
    /* Each job's first chunk, whose push is a plain copy into the accumulator, goes untimed. */
    job *jobs[3] = {&tj, &sj, &t1};
    for (int k = 0; k < (t1.s ? 3 : 2); k++) {
        zs_client_op *op;
        int chunk = fresh_chunk(jobs[k]);
        if (chunk < 0 ||
            finish(jobs[k]->cl, zs_client_push(jobs[k]->cl, 0, N, 0, chunk, buf, &op), &op))
            goto out;
    }
    for (int r = 0; r < reps; r++) {
        if (measure(&tj, cl, N, buf, &one))
            goto out;
        zs_session_heartbeat(tj.s);
        if (measure(&tj, cl2, N, buf, &two))
            goto out;
        zs_session_heartbeat(tj.s);
        if (measure(&sj, sj.cl, N, buf, &shm))
            goto out;
        if (t1.s && measure(&t1, t1.cl, N, buf, &tcp1))
            goto out;
        if (t1.s)
            zs_session_heartbeat(t1.s);
        zs_session_heartbeat(sj.s);
        zs_session_heartbeat(tj.s);
        keep_best(&plain4, plain_copy(src, dst, 4u << 20, N * 4, 0));
        keep_best(&plain64, plain_copy(src, dst, 64u << 10, N * 4, 0));
        keep_best(&reused1, plain_copy(src, dst, 1u << 20, N * 4, 1));
        keep_best(&mem1, memory_pass(src, dst, N * 4, 1, 0));
        keep_best(&mem2, memory_pass(src, dst, N * 4, 2, 0));
        keep_best(&addn, memory_pass(src, dst, N * 4, server_threads, 1));
        zs_session_heartbeat(tj.s);
        zs_session_heartbeat(sj.s);
        keep_best(&ip3, iperf3());
        zs_session_heartbeat(tj.s);
        zs_session_heartbeat(sj.s);
    }
    enum { LAT = 2000 };
    double lat[LAT], slat[LAT];
    if (latency(&tj, buf, lat, LAT) || latency(&sj, buf, slat, LAT))
        goto out;
    printf("model vector %zu floats (%.0f MiB), 1 server, best of %d; limit: a plain loopback "
           "TCP copy of the same bytes between buffers of the same size\n",
           N, N * 4.0 / 1048576, reps);
    const figures *fig[2] = {&one, &two};
    const char *streams =
        getenv("ZS_TCP_CONNS") && *getenv("ZS_TCP_CONNS") ? getenv("ZS_TCP_CONNS") : "1";
    for (int k = 0; k < 2; k++) {
        printf("%s%s%s: fetch 4 MiB %.2f GB/s (ratio %.2f; right after a pause %.2f GB/s), push "
               "4 MiB %.2f GB/s (%.2f; repeated, dropped as a duplicate: %.2f GB/s); fetch 64 KiB "
               "%.2f GB/s (%.2f), push 64 KiB %.2f GB/s (%.2f)\n",
               k ? "2 streams per server" : "worker's client (", k ? "" : streams,
               k ? "" : " stream(s) per server)", fig[k]->fetch4, fig[k]->fetch4 / plain4,
               fig[k]->first4, fig[k]->push4, fig[k]->push4 / plain4, fig[k]->dup4, fig[k]->fetch64,
               fig[k]->fetch64 / plain64, fig[k]->push64, fig[k]->push64 / plain64);
    }
    printf("plain socket: 4 MiB writes %.2f GB/s, 64 KiB writes %.2f GB/s; 1 MiB writes from "
           "and into one buffer (as iperf3 does) %.2f GB/s; iperf3 -l 1M %s\n",
           plain4, plain64, reused1, ip3 > 0 ? "" : "not installed");
    if (ip3 > 0)
        printf("iperf3 -l 1M: %.2f GB/s\n", ip3);
    double wire = ip3 > 0 ? ip3 : reused1;
    const char *wire_name = ip3 > 0 ? "iperf3 -l 1M" : "1 MiB writes from one buffer";
    /* The transport's own speed: a duplicate push is received whole and dropped, so the
     * server's addition (memory work iperf3 does not do) stays out of it. */
    printf("against %s: fetch 4 MiB %.2f, push 4 MiB received %.2f (worker's client); %.2f, %.2f "
           "(2 streams); target >= 0.9; a fetch right after a pause %.2f, %.2f; a push added into "
           "the gradient %.2f, %.2f\n",
           wire_name, one.fetch4 / wire, one.dup4 / wire, two.fetch4 / wire, two.dup4 / wire,
           one.first4 / wire, two.first4 / wire, one.push4 / wire, two.push4 / wire);
    printf("shared memory (cluster.transport \"shm\"): fetch 4 MiB %.2f GB/s (%.2fx the worker's "
           "TCP client's), push 4 MiB added %.2f GB/s (%.2fx); fetch 64 KiB %.2f GB/s (%.2fx), "
           "push 64 KiB %.2f GB/s (%.2fx); target >= 2x; a duplicate push, dropped unread, "
           "%.2f GB/s\n",
           shm.fetch4, shm.fetch4 / one.fetch4, shm.push4, shm.push4 / one.push4, shm.fetch64,
           shm.fetch64 / one.fetch64, shm.push64, shm.push64 / one.push64, shm.dup4);
    /* TCP's better 4 MiB figures over the two servers (server_threads, and 1 thread). */
    double tf = t1.s && tcp1.fetch4 > one.fetch4 ? tcp1.fetch4 : one.fetch4;
    double tp = t1.s && tcp1.push4 > one.push4 ? tcp1.push4 : one.push4;
    if (t1.s)
        printf("TCP with the server on 1 thread (the worker's client): fetch 4 MiB %.2f GB/s, "
               "push 4 MiB added %.2f GB/s; shm over TCP's better figure (%d or 1 server "
               "threads): fetch 4 MiB %.2fx, push 4 MiB added %.2fx\n",
               tcp1.fetch4, tcp1.push4, server_threads, shm.fetch4 / tf, shm.push4 / tp);
    printf("memory (the vector in 4 MiB pieces): copy (non-temporal stores) 1 thread %.2f GB/s, 2 "
           "threads %.2f "
           "GB/s; acc += g on the server's %d thread(s) %.2f GB/s; shm fetch 4 MiB at %.2f of "
           "the 2-thread copy, shm push 4 MiB at %.2f of the addition; shm / TCP can reach at "
           "most %.2fx for fetches (that copy over TCP's better fetch) and %.2fx for pushes (the "
           "addition over TCP's better added push) here\n",
           mem1, mem2, server_threads, addn, shm.fetch4 / mem2, shm.push4 / addn, mem2 / tf,
           addn / tp);
    printf("4 KiB fetch latency over %d: tcp p50 %.1f us, p99 %.1f us; shm p50 %.1f us, p99 "
           "%.1f us\n",
           LAT, lat[LAT / 2], lat[LAT * 99 / 100], slat[LAT / 2], slat[LAT * 99 / 100]);
    double worst4 = one.fetch4 < one.dup4 ? one.fetch4 : one.dup4;
    double sratio = shm.fetch4 / tf < shm.push4 / tp ? shm.fetch4 / tf : shm.push4 / tp;
    printf("bench_data_plane: %.2f GB/s (4 MiB, the worker's client, the slower of fetch and "
           "received push), plain socket %.2f GB/s, ratio %.2f; %s %.2f GB/s, ratio %.2f; shm / "
           "TCP at 4 MiB, the lower of fetch and added push (each against TCP's better figure): "
           "%.2fx\n",
           worst4, plain4, worst4 / plain4, wire_name, wire, worst4 / wire, sratio);
    rc = 0;
out:
    free(buf);
    free(src);
    free(dst);
    if (cl2)
        zs_client_close(cl2);
    job_stop(&tj);
    job_stop(&sj);
    if (t1.s || t1.coord > 0)
        job_stop(&t1);
    if (zs_bench_rmtree(dir) != 0)
        rc = 1;
    return rc;
}
