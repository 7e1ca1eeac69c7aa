/*
 * bench_auth: what authentication costs (docs/security.md), each figure against the same
 * thing without it, measured in the same run, in alternating rounds.
 *
 *   1. Data plane.  A server thread (its own zs_net) listens twice: with zs_conn_opts.auth
 *      (every stream runs the challenge-response handshake) and without.  The client holds a
 *      connection to each and measures, per round: 4 MiB fetches (window 4, `mib` MiB) as
 *      GB/s, 4 KiB fetch round trips (p50, p99), and the time to open a connection (connect,
 *      plus the handshake on the authenticated one), median of 50.  After the handshake a
 *      frame costs the same either way (nothing is computed per frame): the throughput and
 *      latency ratios should be 1 within the noise; the connect time shows the handshake.
 *   2. Control plane.  A ZeroMQ ROUTER and DEALER (proto/ctrl.h) with a job secret (CURVE:
 *      every message encrypted and authenticated) and insecure: the round trip of a Heartbeat
 *      envelope (DEALER -> ROUTER -> DEALER), p50 over `msgs` round trips per round.
 *   3. A job.  `zshard launch` on tests/data/tiny.json (1 server, 1 worker, 40 steps x 4 rounds
 *      each: small
 *      steps, so that the control plane's share is as large as it gets) with a secret and with
 *      --insecure; the median of metrics.jsonl's step_ms over steps 3..40 of all rounds.
 *
 * Which of the two goes first alternates from round to round.
 *
 * usage: bench_auth ZSHARD [rounds=5 [mib=256 [msgs=2000]]]   (run from the source tree: it
 * reads tests/data/tiny.json and tiny.txt)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/benchutil.h"
#include "common/clock.h"
#include "common/secret.h"
#include "proto/ctrl.h"
#include "transport/tcp.h"

#define MIB ((size_t)1 << 20)
#define SERVER_BYTES (16 * MIB)
#define WINDOW 4
#define CONNECTS 50

static const zs_transport_ops *T = &zs_tcp_ops;

__attribute__((noreturn)) static void die(const char *what)
{
    fprintf(stderr, "bench_auth: %s: %s\n", what, zs_last_error());
    exit(1);
}

/* ---- 1. the data plane ---- */

typedef struct {
    zs_net *net;
    zs_listener *plain, *authed;
    zs_auth auth;
    uint8_t key[ZS_TOKEN_BYTES];
    uint8_t *buf;
    zs_mr *mr;
    atomic_int stop;
    pthread_t th;
} server;

static int token_of(void *ctx, uint32_t member, uint8_t token[ZS_TOKEN_BYTES], char *why)
{
    server *s = ctx;
    (void)why;
    zs_token_of(s->key, member, token);
    return 0;
}

static void *server_main(void *arg)
{
    server *s = arg;
    zs_event ev[64];
    while (!atomic_load(&s->stop)) {
        int n;
        if (T->poll(s->net, ev, 64, 10, &n))
            die("server poll");
        for (int i = 0; i < n; i++) {
            zs_event *e = &ev[i];
            if (e->type == ZS_EV_HEADER && e->frame.op == ZS_OP_FETCH) {
                uint64_t bytes = e->frame.count * 4, off = e->frame.offset * 4;
                zs_frame r = {.op = ZS_OP_FETCH_REPLY,
                              .dtype = ZS_DTYPE_F32,
                              .id = e->frame.id,
                              .offset = e->frame.offset,
                              .count = e->frame.count,
                              .length = bytes};
                if (off + bytes > SERVER_BYTES || T->isend(e->conn, &r, s->mr, off, NULL, NULL))
                    die("server fetch reply");
            } else if (e->type == ZS_EV_CLOSED) {
                T->conn_close(e->conn);
            } else if (e->type == ZS_EV_REFUSED) {
                fprintf(stderr, "bench_auth: refused: %s\n", e->reason);
                exit(1);
            }
        }
    }
    return NULL;
}

typedef struct {
    zs_net *net;
    uint8_t *buf;
    zs_mr *mr;
    uint64_t next_id;
} client;

/* Takes the completions of the handle-less sends out of the client's event queue: a net whose
 * queue is full stops reading (transport.h), and the replies would never come. */
static void drain(client *cl)
{
    zs_event ev[64];
    int n = 64;
    while (n == 64)
        if (T->poll(cl->net, ev, 64, 0, &n))
            die("client poll");
}

/* Fetches count ranges of bytes each over c, window in flight; returns GB/s. */
static double fetch_gbps(client *cl, zs_conn *c, size_t bytes, int count)
{
    zs_req *rq[WINDOW];
    int issued = 0, done_n = 0;
    double t0 = zs_now_s();
    while (done_n < count) {
        while (issued < count && issued - done_n < WINDOW) {
            int slot = issued % WINDOW;
            zs_frame f = {.op = ZS_OP_FETCH,
                          .dtype = ZS_DTYPE_F32,
                          .id = cl->next_id++,
                          .offset = 0,
                          .count = bytes / 4};
            if (T->irecv(c, f.id, cl->mr, (size_t)slot * bytes, bytes, NULL, &rq[slot]) ||
                T->isend(c, &f, NULL, 0, NULL, NULL))
                die("fetch");
            issued++;
        }
        int done = 0, slot = done_n % WINDOW;
        if (T->wait(rq[slot], 30000, &done, NULL) || !done)
            die("fetch wait");
        done_n++;
        drain(cl);
    }
    return (double)bytes * count / (zs_now_s() - t0) / 1e9;
}

/* iters 4 KiB fetch round trips over c into lat[]. */
static void fetch_latency(client *cl, zs_conn *c, int iters, double *lat)
{
    for (int i = 0; i < iters; i++) {
        zs_req *rq;
        zs_frame f = {.op = ZS_OP_FETCH, .dtype = ZS_DTYPE_F32, .id = cl->next_id++, .count = 1024};
        double t0 = zs_now_s();
        int done = 0;
        if (T->irecv(c, f.id, cl->mr, 0, 4096, NULL, &rq) || T->isend(c, &f, NULL, 0, NULL, NULL))
            die("latency request");
        zs_err e = T->wait(rq, 30000, &done, NULL);
        if (e != ZS_OK || !done) {
            fprintf(stderr, "bench_auth: 4 KiB fetch %d: %s\n", i,
                    e != ZS_OK ? zs_last_error() : "no reply within 30 s");
            exit(1);
        }
        lat[i] = zs_now_s() - t0;
        drain(cl);
    }
}

/* The median time of n connects (and closes) to addr with opts. */
static double connect_time(zs_net *net, const char *addr, const zs_conn_opts *o, int n)
{
    double *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < n; i++) {
        zs_conn *c;
        double t0 = zs_now_s();
        if (T->connect(net, addr, o, &c))
            die("connect");
        t[i] = zs_now_s() - t0;
        T->conn_close(c);
    }
    double m = zs_bench_median(t, n);
    free(t);
    return m;
}

static double pct(double *v, int n, int p)
{
    qsort(v, (size_t)n, sizeof *v, zs_bench_cmp_double);
    return v[(size_t)n * (size_t)p / 100 < (size_t)n ? (size_t)n * (size_t)p / 100 : (size_t)n - 1];
}

static void data_plane(int rounds, double mib)
{
    server s = {0};
    zs_random_bytes(s.key, sizeof s.key);
    s.auth = (zs_auth){.token_of = token_of, .ctx = &s};
    s.buf = aligned_alloc(4096, SERVER_BYTES);
    memset(s.buf, 7, SERVER_BYTES);
    zs_net_opts no = {.batch_sends = 1};
    zs_conn_opts lo = {.auth = &s.auth};
    if (T->open(&s.net) || T->set_opts(s.net, &no) ||
        T->listen(s.net, "127.0.0.1:0", NULL, &s.plain) ||
        T->listen(s.net, "127.0.0.1:0", &lo, &s.authed) ||
        T->reg_mr(s.net, s.buf, SERVER_BYTES, ZS_MR_SEND, &s.mr))
        die("server");
    pthread_create(&s.th, NULL, server_main, &s);

    client cl = {.next_id = 1};
    cl.buf = aligned_alloc(4096, WINDOW * 4 * MIB);
    memset(cl.buf, 0, WINDOW * 4 * MIB);
    if (T->open(&cl.net) || T->set_opts(cl.net, &no) ||
        T->reg_mr(cl.net, cl.buf, WINDOW * 4 * MIB, ZS_MR_RECV, &cl.mr))
        die("client");
    char plain_addr[32], authed_addr[32];
    snprintf(plain_addr, sizeof plain_addr, "127.0.0.1:%d", T->listener_port(s.plain));
    snprintf(authed_addr, sizeof authed_addr, "127.0.0.1:%d", T->listener_port(s.authed));
    zs_auth me = {.member = 42};
    zs_token_of(s.key, 42, me.token);
    zs_conn_opts ao = {.auth = &me};
    zs_conn *cp, *ca;
    if (T->connect(cl.net, plain_addr, NULL, &cp) || T->connect(cl.net, authed_addr, &ao, &ca))
        die("connect");

    int count = (int)(mib / 4), lat_n = 2000;
    double *gb[2], *cn[2], *lat[2];
    for (int k = 0; k < 2; k++) {
        gb[k] = calloc((size_t)rounds, sizeof(double));
        cn[k] = calloc((size_t)rounds, sizeof(double));
        lat[k] = calloc((size_t)rounds * (size_t)lat_n, sizeof(double));
    }
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < 2; j++) { /* k 0: with authentication, 1: without; turns alternate */
            int k = (j + r) % 2;
            zs_conn *c = k ? cp : ca;
            gb[k][r] = fetch_gbps(&cl, c, 4 * MIB, count);
            fetch_latency(&cl, c, lat_n, lat[k] + (size_t)r * (size_t)lat_n);
            cn[k][r] = connect_time(cl.net, k ? plain_addr : authed_addr, k ? NULL : &ao, CONNECTS);
        }
    double g[2], p50[2], p99[2], ct[2];
    for (int k = 0; k < 2; k++) {
        g[k] = zs_bench_median(gb[k], rounds);
        ct[k] = zs_bench_median(cn[k], rounds);
        p50[k] = pct(lat[k], rounds * lat_n, 50);
        p99[k] = pct(lat[k], rounds * lat_n, 99);
    }
    printf("1. data plane (loopback, medians of %d alternating rounds):\n", rounds);
    printf("   4 MiB fetches (window %d, %.0f MiB a round): %.2f GB/s authenticated, %.2f GB/s "
           "not, ratio %.2f\n",
           WINDOW, mib, g[0], g[1], g[0] / g[1]);
    printf("   4 KiB fetch round trip: p50 %.1f us / %.1f us, ratio %.2f; p99 %.1f us / %.1f us, "
           "ratio %.2f\n",
           p50[0] * 1e6, p50[1] * 1e6, p50[0] / p50[1], p99[0] * 1e6, p99[1] * 1e6,
           p99[0] / p99[1]);
    printf("   opening a connection (median of %d): %.0f us with the handshake, %.0f us "
           "without, ratio %.2f\n",
           CONNECTS, ct[0] * 1e6, ct[1] * 1e6, ct[0] / ct[1]);
    printf("bench_auth data plane: 4 MiB fetch %.2f GB/s, without authentication %.2f GB/s, "
           "ratio %.2f\n",
           g[0], g[1], g[0] / g[1]);
    T->conn_close(cp);
    T->conn_close(ca);
    T->close(cl.net);
    atomic_store(&s.stop, 1);
    pthread_join(s.th, NULL);
    T->close(s.net);
    for (int k = 0; k < 2; k++)
        free(gb[k]), free(cn[k]), free(lat[k]);
    free(cl.buf);
    free(s.buf);
}

/* ---- 2. the control plane ---- */

/* n Heartbeat round trips DEALER -> ROUTER -> DEALER over a socket pair made with secret; the
 * p50 in seconds. */
static double ctrl_round_trip(const zs_secret *secret, int n)
{
    zs_ctrl *router, *dealer;
    if (zs_ctrl_bind("tcp://127.0.0.1:*", secret, &router) ||
        zs_ctrl_connect(zs_ctrl_endpoint(router), secret, &dealer))
        die("control sockets");
    zs_msg_ctx at_router = {.self = ZS_MSG_COORDINATOR}, at_dealer = {.self = ZS_MSG_WORKER};
    double *t = malloc((size_t)n * sizeof *t);
    for (int i = -20; i < n; i++) { /* 20 to warm up (the CURVE handshake among them) */
        Zshard__Heartbeat hb = ZSHARD__HEARTBEAT__INIT;
        hb.has_sender = hb.has_step = 1;
        hb.sender = 3;
        hb.step = (uint64_t)(i + 20);
        Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
        env.body_case = ZSHARD__ENVELOPE__BODY_HEARTBEAT;
        env.heartbeat = &hb;
        double t0 = zs_now_s();
        if (zs_ctrl_send_as(dealer, NULL, 3, &env))
            die("dealer send");
        Zshard__Envelope *got = NULL;
        zs_ctrl_peer from;
        while (!got)
            if (zs_ctrl_recv(router, 10000, &at_router, &from, &got))
                die("router recv");
        zs_msg_free(got);
        hb.sender = 0;
        if (zs_ctrl_send_as(router, &from, 0, &env))
            die("router send");
        got = NULL;
        while (!got)
            if (zs_ctrl_recv(dealer, 10000, &at_dealer, NULL, &got))
                die("dealer recv");
        zs_msg_free(got);
        if (i >= 0)
            t[i] = zs_now_s() - t0;
    }
    double m = zs_bench_median(t, n);
    free(t);
    zs_ctrl_close(dealer);
    zs_ctrl_close(router);
    return m;
}

/* ---- 3. a job ---- */

/* Runs `zshard launch` on the tiny model for steps steps into out, with the secret file or
 * insecure; appends step_ms of steps 3.. to ms[*n].  Returns 0 or -1. */
static int launch_job(const char *zshard, const char *out, const char *secret_path, int steps,
                      double *ms, int *n)
{
    char steps_s[16];
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    char *argv[] = {(char *)zshard,
                    "launch",
                    "--config",
                    "tests/data/tiny.json",
                    "--data",
                    "tests/data/tiny.txt",
                    "--steps",
                    steps_s,
                    "--servers",
                    "1",
                    "--workers",
                    "1",
                    "--threads",
                    "1",
                    "--out",
                    (char *)out,
                    secret_path ? "--secret" : "--insecure",
                    (char *)secret_path,
                    NULL};
    return zs_bench_launch(argv, out, 3, ms, n);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_auth ZSHARD [rounds=5 [mib=256 [msgs=2000]]]\n");
        return 2;
    }
    const char *zshard = argv[1];
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    double mib = argc > 3 ? atof(argv[3]) : 256;
    int msgs = argc > 4 ? atoi(argv[4]) : 2000;
    if (rounds < 1 || mib < 16 || msgs < 100 || zs_sodium_init() != ZS_OK) {
        fprintf(stderr, "usage: bench_auth ZSHARD [rounds>=1 [mib>=16 [msgs>=100]]]\n");
        return 2;
    }
    char dir[] = "/tmp/zs_bench_auth_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char secret_path[128];
    snprintf(secret_path, sizeof secret_path, "%s/secret", dir);
    zs_secret secret, insecure = {.insecure = 1};
    if (zs_secret_generate(secret_path) != ZS_OK || zs_secret_load(secret_path, &secret) != ZS_OK)
        die("secret");

    data_plane(rounds, mib);

    double *rt[2];
    for (int k = 0; k < 2; k++)
        rt[k] = calloc((size_t)rounds, sizeof(double));
    for (int r = 0; r < rounds; r++) /* which goes first alternates too */
        for (int j = 0; j < 2; j++) {
            int k = (j + r) % 2;
            rt[k][r] = ctrl_round_trip(k ? &insecure : &secret, msgs);
        }
    double c0 = zs_bench_median(rt[0], rounds), c1 = zs_bench_median(rt[1], rounds);
    printf("2. control plane: Heartbeat round trip (p50 of %d, median of %d rounds): %.1f us "
           "with CURVE, %.1f us plain, ratio %.2f\n",
           msgs, rounds, c0 * 1e6, c1 * 1e6, c0 / c1);

    enum { STEPS = 40, JOB_ROUNDS = 4 };
    double *ms[2];
    int n[2] = {0, 0};
    int rc = 0;
    for (int k = 0; k < 2; k++)
        ms[k] = calloc(JOB_ROUNDS * STEPS, sizeof(double));
    for (int r = 0; r < JOB_ROUNDS && rc == 0; r++)
        for (int j = 0; j < 2 && rc == 0; j++) {
            int k = (j + r) % 2;
            char out[256];
            snprintf(out, sizeof out, "%s/job-%d-%s", dir, r, k ? "insecure" : "secret");
            rc = launch_job(zshard, out, k ? NULL : secret_path, STEPS, ms[k], &n[k]);
        }
    if (rc == 0 && n[0] > 0 && n[1] > 0) {
        double j0 = zs_bench_median(ms[0], n[0]), j1 = zs_bench_median(ms[1], n[1]);
        printf("3. a job (zshard launch, tests/data/tiny.json, 1 server, 1 worker, %d steps x %d "
               "rounds each, alternating): median step_ms %.2f with a secret, %.2f insecure, "
               "ratio %.2f\n",
               STEPS, JOB_ROUNDS, j0, j1, j0 / j1);
        printf("bench_auth: data plane and control plane above; a step %.2f ms authenticated, "
               "%.2f ms not, ratio %.2f\n",
               j0, j1, j0 / j1);
    }
    for (int k = 0; k < 2; k++)
        free(rt[k]), free(ms[k]);
    zs_secret_wipe(&secret);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (rc == 0 && system(cmd) != 0)
        rc = 1;
    return rc == 0 ? 0 : 1;
}
