/*
 * bench_data_plane: fetch and push throughput, and 4 KiB fetch latency, through a real
 * `zshard server` process, against a plain loopback TCP copy measured in the same run.
 *
 * It starts `zshard coord` and one `zshard server` on loopback (a 12 x 512 model, 4 MiB
 * shards), joins as a worker through worker/session, and then, while it holds step 0's
 * chunk, fetches the whole vector at version 0 (every 4 MiB shard in flight at once) and
 * pushes its gradient for (step 0, chunk 0) over and over (the first push accumulates, the
 * repeats are received whole and dropped as duplicates).  64 KiB figures use 64 KiB ranges,
 * 32 in flight.  The limit is a plain loopback TCP copy of the same message sizes (one thread
 * writes, the main thread reads), run between the transport's runs.
 *
 * usage: bench_data_plane ZSHARD [reps=5]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "worker/session.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- the plain copy: one writer thread, the main thread reads ---- */

typedef struct {
    int fd;
    size_t msg, total;
} writer_args;

static void *writer(void *p)
{
    writer_args *w = p;
    char *buf = calloc(1, w->msg);
    for (size_t done = 0; done < w->total; done += w->msg) {
        size_t off = 0;
        while (off < w->msg) {
            ssize_t n = write(w->fd, buf + off, w->msg - off);
            if (n <= 0)
                goto out;
            off += (size_t)n;
        }
    }
out:
    free(buf);
    return NULL;
}

static double plain_copy(size_t msg, size_t total)
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
    writer_args w = {.fd = ss, .msg = msg, .total = total};
    char *buf = malloc(msg);
    double t0 = zs_now_s();
    pthread_t th;
    pthread_create(&th, NULL, writer, &w);
    for (size_t got = 0; got < total;) {
        ssize_t n = read(cs, buf, msg);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    double dt = zs_now_s() - t0;
    pthread_join(th, NULL);
    free(buf);
    close(cs);
    close(ss);
    close(ls);
    return (double)total / dt / 1e9;
}

static pid_t spawn(char *const argv[])
{
    pid_t p = fork();
    if (p == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_data_plane ZSHARD [reps]\n");
        return 2;
    }
    const char *zshard = argv[1];
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/zs_bench_dp_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cfg[256], data[256], out[256], ep[64];
    snprintf(cfg, sizeof cfg, "%s/cfg.json", dir);
    snprintf(data, sizeof data, "%s/data.txt", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "{\"train_batch_size\": 1, \"model\": {\"n_layer\": 12, \"n_head\": 8, \"n_embd\": "
               "512, \"vocab_size\": 256, \"block_size\": 64}}\n");
    fclose(f);
    f = fopen(data, "w");
    for (int i = 0; i < 20000; i++)
        fputc('a' + i % 26, f);
    fclose(f);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    char *cargv[] = {(char *)zshard, "coord", "--listen", ep, "--config", cfg, "--servers", "1",
                     "--data", data, "--steps", "1", "--out", out, "--log-level", "error", NULL};
    char *sargv[] = {(char *)zshard, "server", "--coord", ep, "--listen", "127.0.0.1:0",
                     "--threads", "1", "--log-level", "error", NULL};
    pid_t coord = spawn(cargv), server = spawn(sargv);
    int rc = 1;
    zs_session *s = NULL;
    if (zs_session_open(ep, NULL, 30000, &s) != ZS_OK) {
        fprintf(stderr, "bench_data_plane: %s\n", zs_last_error());
        goto out;
    }
    zs_assignment as;
    int got = 0, ended = 0;
    while (!got && !ended)
        zs_session_next(s, 100, &as, &got, &ended);
    zs_client *cl = zs_session_client(s);
    size_t N = zs_session_tensors(s)->total;
    float *buf = malloc(N * 4);
    memset(buf, 0, N * 4);
    zs_client_register(cl, buf, N * 4);
    double fetch4 = 0, push4 = 0, fetch64 = 0, push64 = 0, plain4 = 0, plain64 = 0;
    for (int r = 0; r < reps; r++) {
        zs_client_op *op;
        int done;
        double t0 = zs_now_s();
        zs_client_fetch(cl, 0, N, 0, ZS_DTYPE_F32, buf, &op);
        zs_client_wait(cl, op, 60000, &done);
        double g = (double)N * 4 / (zs_now_s() - t0) / 1e9;
        fetch4 = g > fetch4 ? g : fetch4;
        zs_session_heartbeat(s);
        t0 = zs_now_s();
        zs_client_push(cl, 0, N, 0, as.chunks[0], buf, &op);
        zs_client_wait(cl, op, 60000, &done);
        g = (double)N * 4 / (zs_now_s() - t0) / 1e9;
        push4 = g > push4 ? g : push4;
        /* 64 KiB ranges, 32 in flight. */
        const size_t R = 16384;
        size_t n64 = N / R;
        zs_client_op *ops[32];
        t0 = zs_now_s();
        for (size_t i = 0; i < n64; i += 32) {
            int k = 0;
            for (size_t j = i; j < n64 && k < 32; j++, k++)
                zs_client_fetch(cl, j * R, (j + 1) * R, 0, ZS_DTYPE_F32, buf + j * R, &ops[k]);
            for (int q = 0; q < k; q++)
                zs_client_wait(cl, ops[q], 60000, &done);
        }
        g = (double)(n64 * R * 4) / (zs_now_s() - t0) / 1e9;
        fetch64 = g > fetch64 ? g : fetch64;
        t0 = zs_now_s();
        for (size_t i = 0; i < n64; i += 32) {
            int k = 0;
            for (size_t j = i; j < n64 && k < 32; j++, k++)
                zs_client_push(cl, j * R, (j + 1) * R, 0, as.chunks[0], buf + j * R, &ops[k]);
            for (int q = 0; q < k; q++)
                zs_client_wait(cl, ops[q], 60000, &done);
        }
        g = (double)(n64 * R * 4) / (zs_now_s() - t0) / 1e9;
        push64 = g > push64 ? g : push64;
        zs_session_heartbeat(s);
        g = plain_copy(4u << 20, N * 4);
        plain4 = g > plain4 ? g : plain4;
        g = plain_copy(64u << 10, N * 4);
        plain64 = g > plain64 ? g : plain64;
    }
    enum { LAT = 2000 };
    double *lat = malloc(LAT * sizeof *lat);
    for (int i = 0; i < LAT; i++) {
        zs_client_op *op;
        int done;
        double t0 = zs_now_s();
        zs_client_fetch(cl, 4096, 4096 + 1024, 0, ZS_DTYPE_F32, buf, &op);
        zs_client_wait(cl, op, 60000, &done);
        lat[i] = (zs_now_s() - t0) * 1e6;
        if (i % 200 == 0)
            zs_session_heartbeat(s);
    }
    qsort(lat, LAT, sizeof *lat, cmp_double);
    printf("model vector %zu floats (%.0f MiB), 1 server, 1 stream, best of %d\n", N,
           N * 4.0 / 1048576, reps);
    printf("fetch 4 MiB shards: %.2f GB/s, plain socket %.2f GB/s, ratio %.2f\n", fetch4, plain4,
           fetch4 / plain4);
    printf("push 4 MiB shards:  %.2f GB/s, plain socket %.2f GB/s, ratio %.2f\n", push4, plain4,
           push4 / plain4);
    printf("fetch 64 KiB:       %.2f GB/s, plain socket %.2f GB/s, ratio %.2f\n", fetch64,
           plain64, fetch64 / plain64);
    printf("push 64 KiB:        %.2f GB/s, plain socket %.2f GB/s, ratio %.2f\n", push64,
           plain64, push64 / plain64);
    printf("4 KiB fetch latency over %d: p50 %.1f us, p99 %.1f us\n", LAT, lat[LAT / 2],
           lat[LAT * 99 / 100]);
    printf("bench_data_plane: %.2f GB/s (4 MiB fetch), plain socket %.2f GB/s, ratio %.2f\n",
           fetch4, plain4, fetch4 / plain4);
    free(lat);
    free(buf);
    rc = 0;
out:
    kill(coord, SIGKILL);
    kill(server, SIGKILL);
    waitpid(coord, NULL, 0);
    waitpid(server, NULL, 0);
    zs_session_close(s);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        rc = 1;
    return rc;
}
