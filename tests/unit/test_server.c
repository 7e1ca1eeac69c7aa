/*
 * server: real `zshard server` processes on loopback (1, 2 and 3 of them), with this test as
 * the coordinator (a ROUTER) and as workers (transport/client.h for the traffic, raw frames and
 * raw sockets for the bad input).  Checks:
 *  - fetches of the initial weights equal the seed's init; a fetch of a future version waits
 *    until it is published;
 *  - every step's weights (and the gradient norm the servers' partial sums give) are bitwise
 *    those of `zshard train` on the same gradients.  The trainer adds chunks 0..C-1 in order,
 *    so this is also equality with in-order arrival.  Each step delivers its chunks differently:
 *      step 0: one client pushes the 4 chunks in random order, split by shard, with duplicates;
 *      step 1: each chunk has its own worker id (one StepAssign per worker) and its own
 *        sender thread with its own client, which waits a seeded 2-40 ms, then pushes its
 *        chunk shard by shard (some shards cut in two) in a seeded order with seeded pauses
 *        of 0-8 ms (one of 15-40 ms), re-pushing one piece at once; so pieces of all chunks
 *        interleave at the servers.  One sender pushes its whole chunk again after every
 *        other sender is done (a late duplicate);
 *      step 2: before the owner pushes, raw streams that pass the handshake as the chunk's
 *        owner send the start of a valid PUSH frame and go away mid-frame: cut inside the
 *        64-byte header, right after it, or inside a payload of huge values; with a FIN or a
 *        RST, before and after the step's assignment reached the servers.  Every server must
 *        keep serving and none of those bytes may reach the accumulator.  With one server,
 *        chunk 0's owner then leaves 24 duplicate pushes without payload open (header-only
 *        pushes): the other chunks' pushes still go through and the step is applied, the 2 of
 *        them that took push buffers are closed once their payload is overdue, and the rest
 *        are refused as stale;
 *  - stale pushes, pushes of chunks not assigned to the sender, ranges outside the server's
 *    shards and random bytes are refused and leave the server serving; one member's 65th
 *    open stream is closed;
 *  - Shutdown ends every server with exit status 0.
 * The schedules come from one seed, printed at the start; ZS_TEST_SEED=<seed> repeats them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/data.h"
#include "common/rng.h"
#include "common/secret.h"
#include "common/shardmap.h"
#include "kernels/adamw.h"
#include "kernels/gpt2.h"
#include "kernels/reduce.h"
#include "proto/ctrl.h"
#include "proto/shardmap_msg.h"
#include "tests/unit/netutil.h"
#include "tests/unit/test.h"
#include "transport/client.h"
#include "transport/transport.h"
#include "worker/trainer.h"

enum { MAXS = 3, C = 4, STEPS = 3, WORKER = 100 };

/* Header-only pushes (run with S = 1, at step 2): chunk 0 belongs to member HOSTILE, which
 * leaves this many pushes without their payload. */
enum { HOSTILE = WORKER + 20, HEADERS_ONLY = 24 };

/* How a step's chunks reach the servers (step % 3; see the top comment). */
enum { MODE_ONE_CLIENT, MODE_CONCURRENT, MODE_CUT };

/* The seed of every schedule below (printed; ZS_TEST_SEED overrides it). */
static uint64_t test_seed;

static const zs_transport_ops *ops = &zs_tcp_ops;

typedef struct {
    zs_ctrl *ctrl;
    zs_ctrl_peer peer[MAXS];
    char endpoint[MAXS][128];
    pid_t pid[MAXS];     /* in start order */
    pid_t reg_pid[MAXS]; /* of server index s (registration order), as it said */
    int lost;            /* the index of the server killed (failover), -1: none */
    zs_conn *conn[MAXS];
    int S;
    zs_shardmap map;
    zs_net *net;
    uint64_t next_id;
} rig;

static Zshard__Envelope *recv_body(rig *r, Zshard__Envelope__BodyCase want, zs_ctrl_peer *from)
{
    for (int tries = 0; tries < 300; tries++) {
        Zshard__Envelope *env = NULL;
        zs_msg_ctx ctx = {.self = ZS_MSG_COORDINATOR};
        if (zs_ctrl_recv(r->ctrl, 100, &ctx, from, &env) != ZS_OK) {
            fprintf(stderr, "recv: %s\n", zs_last_error());
            continue;
        }
        if (!env)
            continue;
        if (env->body_case == want)
            return env;
        zs_msg_free(env); /* heartbeats and the like */
    }
    fprintf(stderr, "test_server: no %s within 30 s\n", zs_msg_body_name(want));
    return NULL;
}

static int server_of(const rig *r, const zs_ctrl_peer *p)
{
    for (int s = 0; s < r->S; s++)
        if (r->peer[s].len == p->len && memcmp(r->peer[s].id, p->id, p->len) == 0)
            return s;
    return -1;
}

/* The data key this test hands its servers as their coordinator, and a member's identity
 * under it (what RegisterReply gives a worker). */
static uint8_t data_key[ZS_TOKEN_BYTES];

static zs_auth auth_of(uint32_t member)
{
    zs_auth a = {.member = member};
    zs_token_of(data_key, member, a.token);
    return a;
}

static void send_to(rig *r, int s, Zshard__Envelope *env)
{
    env->has_protocol_version = 1;
    env->protocol_version = ZS_PROTOCOL_VERSION;
    env->has_sender = 1;
    env->sender = 0;
    CHECK_OK(zs_ctrl_send(r->ctrl, &r->peer[s], env));
}

/* A request and its reply; returns the reply's header (op ERROR carries status). */
static zs_frame request(rig *r, int s, zs_frame f, zs_mr *send_mr, size_t send_off, zs_mr *recv_mr,
                        size_t recv_off, size_t cap)
{
    f.id = ++r->next_id;
    zs_req *rq = NULL, *sq = NULL;
    zs_frame reply = {0};
    CHECK_OK(ops->irecv(r->conn[s], f.id, recv_mr, recv_off, cap, NULL, &rq));
    CHECK_OK(ops->isend(r->conn[s], &f, send_mr, send_off, NULL, &sq));
    int done = 0;
    CHECK_OK(ops->wait(sq, 10000, &done, NULL));
    CHECK(done);
    done = 0;
    zs_err e = ops->wait(rq, 20000, &done, &reply);
    CHECK(done);
    if (e != ZS_OK)
        fprintf(stderr, "request: %s\n", zs_last_error());
    return reply;
}

/* request() on a connection of its own that proved member (what a push's sender is). */
static zs_frame request_as(rig *r, int s, uint32_t member, zs_frame f, zs_mr *send_mr,
                           size_t send_off, zs_mr *recv_mr, size_t recv_off, size_t cap)
{
    zs_auth a = auth_of(member);
    zs_conn_opts o = {.auth = &a};
    zs_conn *mine = r->conn[s], *c = NULL;
    zs_frame rep = {0};
    CHECK_OK(ops->connect(r->net, r->endpoint[s], &o, &c));
    if (c) {
        r->conn[s] = c;
        rep = request(r, s, f, send_mr, send_off, recv_mr, recv_off, cap);
        ops->conn_close(c);
        r->conn[s] = mine;
    }
    return rep;
}

/* A stream of seeded random numbers: zs_rng_u64(test_seed, stream, 0, 1, ...). */
typedef struct {
    uint64_t stream, index;
} sched;

static uint64_t sched_next(sched *g)
{
    return zs_rng_u64(test_seed, g->stream, g->index++);
}

/* A number in [lo, hi]. */
static int sched_int(sched *g, int lo, int hi)
{
    return lo + (int)(sched_next(g) % (uint64_t)(hi - lo + 1));
}

static void shuffle(sched *g, int *v, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(sched_next(g) % (uint64_t)(i + 1)), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* A seeded pause of MODE_CONCURRENT's schedule (what makes pieces of the chunks interleave at
 * the servers).  Never a wait for something to happen: no check depends on its length. */
static void sleep_ms(int ms)
{
    if (ms > 0)
        usleep((useconds_t)ms * 1000);
}

/* The first element where a and b differ bitwise; n if none. */
static size_t first_diff(const float *a, const float *b, size_t n)
{
    size_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], sizeof *a) == 0)
        i++;
    return i;
}

/*
 * One sender of MODE_CONCURRENT: a worker id, a chunk, and a client of its own (a client is
 * driven by one thread).  It runs in its own thread, so it records failures here instead of
 * using CHECK; the main thread checks them after the join.
 */
typedef struct {
    const zs_shardmap *map;
    const char *const *eps;
    uint32_t sender;
    long step;
    int chunk;
    const float *grad; /* [N]: the chunk's gradient */
    size_t N;
    sched rng;              /* this sender's own stream */
    int late_duplicate;     /* 1: push the whole chunk again once the others are done */
    atomic_int *first_done; /* senders past their first pass (or failed) */
    int n_senders;
    int failures;    /* out: pushes that failed */
    int pushes;      /* out: pushes that succeeded */
    char error[512]; /* out: the first failure */
} sender_job;

static void sender_push(sender_job *j, zs_client *cl, size_t b, size_t e)
{
    zs_client_op *op = NULL;
    int done = 0;
    zs_err err = zs_client_push(cl, b, e, j->step, j->chunk, j->grad + b, &op);
    if (err == ZS_OK)
        err = zs_client_wait(cl, op, 20000, &done);
    if (err == ZS_OK && done) {
        j->pushes++;
        return;
    }
    if (j->failures++ == 0)
        snprintf(j->error, sizeof j->error, "worker %u chunk %d: push of [%zu, %zu): %s", j->sender,
                 j->chunk, b, e, err != ZS_OK ? zs_last_error() : "timed out");
}

static void *sender_main(void *arg)
{
    sender_job *j = arg;
    const zs_shardmap *map = j->map;
    zs_client *cl = NULL;
    int *order = malloc((size_t)map->n_shards * sizeof *order);
    int counted = 0;
    zs_auth auth = auth_of(j->sender);
    if (!order || zs_client_open(map, j->eps, &auth, NULL, &cl) != ZS_OK ||
        zs_client_register(cl, (void *)j->grad, j->N * sizeof *j->grad) != ZS_OK) {
        j->failures++;
        snprintf(j->error, sizeof j->error, "worker %u: client: %s", j->sender,
                 order ? zs_last_error() : "out of memory");
        goto out;
    }
    for (int k = 0; k < map->n_shards; k++)
        order[k] = k;
    shuffle(&j->rng, order, map->n_shards);
    int stall = sched_int(&j->rng, 0, map->n_shards - 1); /* where the long pause goes */
    int again = sched_int(&j->rng, 0, map->n_shards - 1); /* the piece pushed twice */
    sleep_ms(sched_int(&j->rng, 2, 40));
    for (int k = 0; k < map->n_shards; k++) {
        const zs_shard *sh = &map->shards[order[k]];
        size_t b = sh->begin, e = sh->end;
        if (e - b > 1 && sched_next(&j->rng) % 2) {
            /* Two pieces of one shard, in a seeded order, with a pause between them. */
            size_t cut = b + 1 + (size_t)(sched_next(&j->rng) % (e - b - 1));
            int high_first = (int)(sched_next(&j->rng) % 2);
            sender_push(j, cl, high_first ? cut : b, high_first ? e : cut);
            sleep_ms(sched_int(&j->rng, 0, 8));
            sender_push(j, cl, high_first ? b : cut, high_first ? cut : e);
        } else {
            sender_push(j, cl, b, e);
        }
        if (k == again)
            sender_push(j, cl, b, e); /* a duplicate, at once */
        sleep_ms(k == stall ? sched_int(&j->rng, 15, 40) : sched_int(&j->rng, 0, 8));
    }
    atomic_fetch_add(j->first_done, 1);
    counted = 1;
    if (j->late_duplicate) {
        /* After every other sender's last piece: all of this chunk again, every piece a
         * duplicate the servers must drop. */
        uint64_t until = zs_now_ms() + 20000;
        while (atomic_load(j->first_done) < j->n_senders && zs_now_ms() < until)
            usleep(1000);
        if (atomic_load(j->first_done) < j->n_senders) {
            if (j->failures++ == 0)
                snprintf(j->error, sizeof j->error,
                         "worker %u chunk %d: the other senders were not done within 20 s "
                         "(%d of %d)",
                         j->sender, j->chunk, atomic_load(j->first_done), j->n_senders);
            goto out;
        }
        sleep_ms(sched_int(&j->rng, 2, 10));
        sender_push(j, cl, 0, j->N);
    }
out:
    if (!counted)
        atomic_fetch_add(j->first_done, 1);
    zs_client_close(cl);
    free(order);
    return NULL;
}

/* Pushes the C chunks of `step`, chunk c from worker owner[c], each from its own thread. */
static void push_concurrently(rig *r, const char *const *eps, long step, float **grads, size_t N,
                              const uint32_t *owner)
{
    sender_job jobs[C];
    pthread_t th[C];
    int started[C] = {0};
    atomic_int first_done = 0;
    sched g = {.stream = 1000 + (uint64_t)(r->S * STEPS + step)};
    int late = sched_int(&g, 0, C - 1);
    for (int c = 0; c < C; c++) {
        jobs[c] = (sender_job){.map = &r->map,
                               .eps = eps,
                               .sender = owner[c],
                               .step = step,
                               .chunk = c,
                               .grad = grads[c],
                               .N = N,
                               .rng = {.stream = 2000 + (uint64_t)((r->S * STEPS + step) * C + c)},
                               .late_duplicate = c == late,
                               .first_done = &first_done,
                               .n_senders = C};
        started[c] = pthread_create(&th[c], NULL, sender_main, &jobs[c]) == 0;
        CHECK(started[c]);
        if (!started[c])
            atomic_fetch_add(&first_done, 1);
    }
    for (int c = 0; c < C; c++) {
        if (!started[c])
            continue;
        pthread_join(th[c], NULL);
        if (jobs[c].failures)
            fprintf(stderr, "test_server: S=%d step %ld: %s\n", r->S, step, jobs[c].error);
        CHECK_EQ_INT(jobs[c].failures, 0);
        CHECK(jobs[c].pushes > r->map.n_shards); /* every shard, plus the duplicates */
    }
}

/*
 * The server's end of our connection fd to the server listening on port, as /proc/net/tcp
 * shows it, polled every millisecond until the server has accepted it (its socket has an
 * inode) or has closed it already, and with `taken_in` until it has also read every byte sent
 * so far but `unread`.  Returns 1 once it is so, with *inode the server's socket (0: the
 * server closed it already), or 0 after 10 s (said on stderr).
 */
static int wait_server_end(int port, int fd, int taken_in, unsigned long unread,
                           unsigned long *inode)
{
    int mine = zs_test_local_port(fd);
    uint64_t until = zs_now_ms() + 10000;
    *inode = 0;
    for (;;) {
        zs_test_tcp_end e = zs_test_tcp_lookup(port, mine);
        if (!zs_test_tcp_open(&e))
            return 1; /* closed by the server */
        if (e.inode && (!taken_in || e.rx <= unread)) {
            *inode = e.inode;
            return 1;
        }
        if (zs_now_ms() >= until) {
            fprintf(stderr,
                    "test_server: server port %d: the connection from port %d is %s after 10 s "
                    "(state %d, %lu bytes unread)\n",
                    port, mine, e.inode ? "still not read" : "still not accepted", e.state, e.rx);
            return 0;
        }
        usleep(1000);
    }
}

/*
 * A member that goes away mid-frame: on a raw stream that has passed the handshake as
 * `sender`, sends the first `cut` bytes (cut < 64 + payload) of a valid PUSH of
 * [b, b + count) for (step, chunk), whose payload is huge values that would show in any
 * weight they reached; then, once the server has accepted the stream (and, with `taken_in`,
 * read those bytes: all of them, or with `deferred` the header only, which is all a server
 * reads of a push whose chunk has no owner there yet), closes with a FIN, or a RST if
 * `reset`.  Returns 1 if the bytes went out and the server took the stream, with *inode the
 * server's socket for it (0 if the server closed it already).
 */
static int push_cut(const char *endpoint, long step, int chunk, uint32_t sender, size_t b,
                    size_t count, size_t cut, int taken_in, int deferred, int reset, uint64_t id,
                    unsigned long *inode)
{
    zs_frame f = {.op = ZS_OP_PUSH,
                  .dtype = ZS_DTYPE_F32,
                  .id = id,
                  .step = (uint64_t)step,
                  .chunk = (uint32_t)chunk,
                  .sender = sender,
                  .offset = b,
                  .count = count,
                  .length = count * sizeof(float)};
    size_t total = ZS_FRAME_HEADER_BYTES + f.length;
    uint8_t *buf = malloc(total);
    int fd = -1, ok = 0;
    if (!buf || cut >= total)
        goto out;
    zs_frame_encode(&f, buf);
    for (size_t i = 0; i < count; i++) {
        float v = (i % 3 == 0) ? 3.0e38f : (i % 3 == 1) ? -1.0e30f : 7.0e37f;
        memcpy(buf + ZS_FRAME_HEADER_BYTES + i * sizeof v, &v, sizeof v);
    }
    zs_auth a = auth_of(sender);
    if ((fd = zs_test_connect_member(zs_test_port_of(endpoint), sender, a.token)) < 0)
        goto out;
    size_t sent = 0;
    while (sent < cut) {
        ssize_t w = write(fd, buf + sent, cut - sent);
        if (w <= 0)
            goto out;
        sent += (size_t)w;
    }
    unsigned long unread =
        deferred && cut > ZS_FRAME_HEADER_BYTES ? cut - ZS_FRAME_HEADER_BYTES : 0;
    ok = wait_server_end(zs_test_port_of(endpoint), fd, taken_in, unread, inode);
    if (reset) {
        struct linger l = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return ok;
}

/* MODE_CUT's broken frames, sent: the server's socket of each stream and who holds it. */
enum { MAX_CUTS = 16 };
typedef struct {
    long step;
    int first, n;
    unsigned long inode[MAX_CUTS];
    pid_t holder[MAX_CUTS];
} cut_set;

/* MODE_CUT's broken frames: `n` of them, each for a seeded chunk and sub-range of a shard,
 * pushed as the chunk's owner, cut at a seeded place of the kind `i` names.  `deferred`: the
 * step's assignment has not been sent yet, so the servers hold each frame after its header
 * (and notice the stream's end only once the assignment came). */
static cut_set push_cuts(rig *r, long step, const uint32_t *owner, sched *g, int first, int n,
                         int deferred)
{
    cut_set set = {.step = step, .first = first, .n = n < MAX_CUTS ? n : MAX_CUTS};
    for (int i = first; i < first + set.n; i++) {
        const zs_shard *sh = &r->map.shards[sched_int(g, 0, r->map.n_shards - 1)];
        size_t len = sh->end - sh->begin;
        size_t lo = (size_t)(sched_next(g) % (len / 2 + 1)),
               hi = (size_t)(sched_next(g) % (len / 2 + 1));
        size_t b = sh->begin + lo, count = len - lo - hi;
        if (count == 0)
            count = 1;
        int chunk = i % 2 == 0 ? 0 : sched_int(g, 1, C - 1);
        size_t payload = count * sizeof(float), cut;
        switch (i % 5) {
        case 0: /* inside the header */
            cut = (size_t)sched_int(g, 1, ZS_FRAME_HEADER_BYTES - 1);
            break;
        case 1: /* the whole header, no payload */
            cut = ZS_FRAME_HEADER_BYTES;
            break;
        case 2: /* half the payload */
            cut = ZS_FRAME_HEADER_BYTES + payload / 2;
            break;
        case 3: /* all but the last byte: the last float is cut too */
            cut = ZS_FRAME_HEADER_BYTES + payload - 1;
            break;
        default: /* anywhere in the payload */
            cut = ZS_FRAME_HEADER_BYTES + (size_t)(sched_next(g) % payload);
            break;
        }
        int reset = (int)(sched_next(g) % 2), taken_in = sched_int(g, 0, 1);
        CHECK(push_cut(r->endpoint[sh->server], step, chunk, owner[chunk], b, count, cut, taken_in,
                       deferred, reset, 0xc070000u + (uint64_t)i, &set.inode[i - first]));
        set.holder[i - first] = r->reg_pid[sh->server];
    }
    return set;
}

/* The servers have seen every stream of `set` end: each has closed its socket, within 10 s,
 * and is still running. */
static void check_cuts_closed(rig *r, const cut_set *set)
{
    const unsigned long *inode = set->inode;
    const pid_t *holder = set->holder;
    long step = set->step;
    int first = set->first, n = set->n;
    for (int k = 0; k < n; k++) {
        uint64_t until = zs_now_ms() + 10000;
        while (inode[k] && zs_test_holds_socket(holder[k], inode[k]) && zs_now_ms() < until)
            usleep(1000);
        if (inode[k] && zs_test_holds_socket(holder[k], inode[k])) {
            fprintf(stderr,
                    "test_server: step %ld: server pid %d still holds the stream cut %d "
                    "(socket %lu) 10 s after it ended\n",
                    step, (int)holder[k], first + k, inode[k]);
            CHECK(0);
        }
    }
    for (int s = 0; s < r->S; s++)
        CHECK_EQ_INT(waitpid(r->pid[s], NULL, WNOHANG), 0); /* still running */
}

/*
 * Waits until every server has taken step's assignment (the StepAssign messages travel over the
 * control plane, the pushes over the data plane): the owner of each chunk pushes to each
 * server a range that crosses a shard boundary.  A server holds such a push while the chunk
 * has no owner there and refuses it as a bad range once the sender is the owner, so the answer
 * comes only after the assignment did; nothing reaches an accumulator.
 */
static void wait_assigned(rig *r, long step, const uint32_t *owner, zs_mr *send_mr, zs_mr *recv_mr)
{
    for (int s = 0; s < r->S; s++) {
        int k = 0;
        while (k < r->map.n_shards && r->map.shards[k].server != s)
            k++;
        if (k == r->map.n_shards) {
            fprintf(stderr, "test_server: server %d holds no shard\n", s);
            CHECK(0);
            continue;
        }
        const zs_shard *sh = &r->map.shards[k];
        size_t at = k + 1 < r->map.n_shards ? sh->end : sh->begin; /* a boundary inside N */
        for (int c = 0; c < C; c++) {
            zs_frame f = {.op = ZS_OP_PUSH,
                          .dtype = ZS_DTYPE_F32,
                          .step = (uint64_t)step,
                          .chunk = (uint32_t)c,
                          .sender = owner[c],
                          .offset = at - 4,
                          .count = 8,
                          .length = 32};
            zs_frame rep = request_as(r, s, owner[c], f, send_mr, 0, recv_mr, 0, 1 << 16);
            int taken = rep.op == ZS_OP_ERROR && rep.status == ZS_FS_BAD_RANGE;
            if (!taken)
                fprintf(stderr,
                        "test_server: S=%d step %ld: server %d has not taken the assignment of "
                        "chunk %d to worker %u (probe answered op %d status %d)\n",
                        r->S, step, s, c, owner[c], (int)rep.op, (int)rep.status);
            CHECK(taken);
        }
    }
}

/*
 * Buddy replicas: the last server is killed after the last step, and the others are told to go
 * on from memory with a map that gives its shards to the holder of its replica.  The weights and
 * both AdamW moments of the whole vector, fetched from the servers left (optimizer-state
 * fetches), are the trainer's, bit for bit; the replicas the new map gives them are loaded from
 * each other meanwhile.
 */
static void failover(rig *r, const zs_trainer *tr, size_t N, const char *const *eps)
{
    int S = r->S, x = S - 1, h = zs_shardmap_replica(&r->map, x);
    CHECK(h >= 0 && h != x);
    zs_client *old = NULL; /* connected to every server of the old map, x included */
    zs_auth oa = auth_of(WORKER);
    CHECK_OK(zs_client_open(&r->map, eps, &oa, NULL, &old));
    for (int k = 0; k < S; k++)
        if (r->pid[k] == r->reg_pid[x]) {
            kill(r->pid[k], SIGKILL);
            waitpid(r->pid[k], NULL, 0);
            r->pid[k] = 0;
        }
    r->lost = x;
    /* x's connection fails in old's net (the stream ended when x died) at the first turn a
     * fetch from another server drives, which leaves its event queued.  zs_client_wait_fd
     * takes that event out, which nothing else reads, so the timeout it gives is the net's
     * own (-1: no timer), not 0 for ever: a thread waiting on it sleeps. */
    float probe[16];
    int live = 0;
    while (live < r->map.n_shards && r->map.shards[live].server == x)
        live++;
    if (old && live < r->map.n_shards && zs_client_register(old, probe, sizeof probe) == ZS_OK) {
        zs_client_op *op;
        size_t b = r->map.shards[live].begin;
        CHECK_OK(zs_client_fetch(old, b, b + 16, STEPS, ZS_DTYPE_F32, probe, &op));
        int done = 0, t = 0;
        CHECK_OK(zs_client_wait(old, op, 20000, &done));
        CHECK(done);
        CHECK(zs_client_wait_fd(old, &t) >= 0);
        CHECK_EQ_INT(t, -1);
    }
    zs_client_close(old);
    int *assign = malloc((size_t)r->map.n_shards * sizeof *assign);
    for (int i = 0; i < r->map.n_shards; i++)
        assign[i] = r->map.shards[i].server == x ? h : r->map.shards[i].server;
    zs_shardmap m2;
    CHECK_OK(zs_shardmap_assemble(N, r->map.shard_floats, r->map.n_shards, S - 1, r->map.server_ids,
                                  assign, &m2));
    free(assign);
    zs_shardmap_set_replicas(&m2, 1);
    Zshard__ShardMap *sm = NULL;
    CHECK_OK(zs_shardmap_to_msg(&m2, eps, &sm));
    Zshard__Restore rs = ZSHARD__RESTORE__INIT;
    rs.has_version = rs.has_from_memory = 1;
    rs.version = STEPS;
    rs.from_memory = 1;
    rs.step_dir = (char *)"";
    for (int s = 0; s < S - 1; s++) {
        Zshard__Envelope out = ZSHARD__ENVELOPE__INIT;
        out.body_case = ZSHARD__ENVELOPE__BODY_RESTORE;
        out.restore = &rs;
        send_to(r, s, &out);
        out.body_case = ZSHARD__ENVELOPE__BODY_SHARD_MAP;
        out.shard_map = sm;
        send_to(r, s, &out);
    }
    for (int s = 0; s < S - 1; s++) {
        zs_ctrl_peer from;
        Zshard__Envelope *env = recv_body(r, ZSHARD__ENVELOPE__BODY_READY, &from);
        CHECK(env && env->ready->version == STEPS);
        zs_msg_free(env);
    }
    float *got = malloc(N * 4);
    const float *want[3] = {tr->params, tr->m, tr->v};
    zs_client *cl = NULL;
    zs_auth wa = auth_of(WORKER);
    CHECK_OK(zs_client_open(&m2, eps, &wa, NULL, &cl));
    if (cl)
        CHECK_OK(zs_client_register(cl, got, N * 4));
    for (int a = 0; a < 3 && cl; a++) {
        zs_client_op *op;
        memset(got, 0xff, N * 4);
        CHECK_OK(zs_client_fetch_state(cl, 0, N, STEPS, a, got, &op));
        int done = 0;
        CHECK_OK(zs_client_wait(cl, op, 20000, &done));
        CHECK(done);
        CHECK_EQ_INT(first_diff(got, want[a], N), N);
    }
    /* A state fetch of another version is refused, not held. */
    if (cl) {
        zs_client_op *op;
        CHECK_OK(zs_client_fetch_state(cl, 0, 64, STEPS - 1, 1, got, &op));
        int done = 0;
        CHECK_FAILS_WITH(zs_client_wait(cl, op, 20000, &done), "is not held");
    }
    zs_client_close(cl);
    free(got);
    zshard__shard_map__free_unpacked(sm, NULL);
    zs_shardmap_free(&m2);
}

/*
 * Header-only pushes: member HOSTILE, the owner of chunk 0, pushes its chunk in full through
 * hcl, then opens HEADERS_ONLY streams to the server of shard 0 and on each one sends the
 * header of a duplicate push of that shard, never its payload, and keeps them open.  Returns
 * once the server has read every header.  A member has at most 2 of a server's 8 push buffers,
 * so the other chunks' pushes that come next go through (check_headers_only sees the rest).
 */
static void push_headers_only(rig *r, long step, zs_client *hcl, const float *grad, size_t N,
                              int fd[HEADERS_ONLY])
{
    zs_client_op *op;
    int done = 0;
    CHECK_OK(zs_client_push(hcl, 0, N, step, 0, grad, &op));
    CHECK_OK(zs_client_wait(hcl, op, 20000, &done));
    CHECK(done);
    const zs_shard *sh = &r->map.shards[0];
    zs_auth a = auth_of(HOSTILE);
    int port = zs_test_port_of(r->endpoint[sh->server]);
    zs_frame f = {.op = ZS_OP_PUSH,
                  .dtype = ZS_DTYPE_F32,
                  .step = (uint64_t)step,
                  .chunk = 0,
                  .sender = HOSTILE,
                  .offset = sh->begin,
                  .count = sh->end - sh->begin,
                  .length = (sh->end - sh->begin) * sizeof(float)};
    for (int i = 0; i < HEADERS_ONLY; i++) {
        uint8_t header[ZS_FRAME_HEADER_BYTES];
        f.id = 0xd0000u + (uint64_t)i;
        zs_frame_encode(&f, header);
        fd[i] = zs_test_connect_member(port, HOSTILE, a.token);
        CHECK(fd[i] >= 0);
        unsigned long inode = 0;
        CHECK(fd[i] >= 0 && zs_test_io(fd[i], header, sizeof header, 1) &&
              wait_server_end(port, fd[i], 1, 0, &inode) && inode != 0);
    }
}

/*
 * What became of the header-only pushes, within 25 s of push_headers_only: the 2 that got push
 * buffers are closed by the server once their payload is overdue (10 s plus its length at
 * 10 MB/s: docs/security.md), which gives the buffers back; each of the others waited for one of
 * the member's 2 buffers, and is then refused as stale (its step was applied without it).
 */
static void check_headers_only(int fd[HEADERS_ONLY], uint64_t sent_ms)
{
    int closed = 0, refused = 0;
    for (int i = 0; i < HEADERS_ONLY; i++) {
        if (fd[i] < 0)
            continue;
        uint64_t now = zs_now_ms(), until = sent_ms + 25000;
        uint64_t left = until > now ? until - now : 1;
        struct timeval tv = {.tv_sec = (time_t)(left / 1000),
                             .tv_usec = (suseconds_t)(left % 1000 * 1000)};
        setsockopt(fd[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        uint8_t header[ZS_FRAME_HEADER_BYTES];
        ssize_t k = recv(fd[i], header, sizeof header, MSG_WAITALL);
        zs_frame f;
        if (k == 0 || (k < 0 && errno == ECONNRESET))
            closed++;
        else if (k == (ssize_t)sizeof header && zs_frame_decode(header, &f) == ZS_OK &&
                 f.op == ZS_OP_ERROR && f.status == ZS_FS_STALE)
            refused++;
        else
            fprintf(stderr, "test_server: header-only push %d: %zd bytes back (%s)\n", i, k,
                    k < 0 ? strerror(errno) : "not a stale refusal");
        close(fd[i]);
    }
    CHECK_EQ_INT(closed, 2);
    CHECK_EQ_INT(refused, HEADERS_ONLY - 2);
}

/* One member opens stream after stream to a server (each passes the handshake): the server
 * keeps 64 of them and closes the 65th. */
static void check_streams_per_member(rig *r)
{
    enum { MOST = 64, MEMBER = WORKER + 60 };
    zs_auth a = auth_of(MEMBER);
    int port = zs_test_port_of(r->endpoint[0]), fd[MOST + 1], open = 0;
    for (int i = 0; i <= MOST; i++) {
        fd[i] = zs_test_connect_member(port, MEMBER, a.token);
        CHECK(fd[i] >= 0);
    }
    char b;
    CHECK(fd[MOST] >= 0 && read(fd[MOST], &b, 1) == 0); /* closed (SO_RCVTIMEO: 10 s) */
    for (int i = 0; i < MOST; i++) {
        zs_test_tcp_end e = zs_test_tcp_lookup(port, zs_test_local_port(fd[i]));
        open += fd[i] >= 0 && zs_test_tcp_open(&e);
    }
    CHECK_EQ_INT(open, MOST);
    for (int i = 0; i <= MOST; i++)
        if (fd[i] >= 0)
            close(fd[i]);
}

/* Peers the data plane must refuse, each at connect, while the job goes on: a token made with
 * another data key (another job's), a member the coordinator declared gone (MemberGone), and
 * a peer that opens a stream and says nothing (closed after ZS_TCP_HANDSHAKE_MS, which main
 * sets low). */
static void check_strangers(rig *r, int S)
{
    zs_net *net = NULL;
    CHECK_OK(ops->open(&net));
    zs_auth wrong = {.member = WORKER};
    zs_token_of((const uint8_t *)"another job's data key, 32 bytes", WORKER, wrong.token);
    zs_conn_opts o = {.auth = &wrong};
    zs_conn *c = NULL;
    CHECK_FAILS_WITH(ops->connect(net, r->endpoint[0], &o, &c),
                     "the server did not prove it belongs to this job");
    /* Member WORKER + 50 leaves: the servers refuse it from then on. */
    Zshard__MemberGone mg = ZSHARD__MEMBER_GONE__INIT;
    mg.has_member = 1;
    mg.member = WORKER + 50;
    mg.reason = "left";
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_MEMBER_GONE;
    env.member_gone = &mg;
    for (int s = 0; s < S; s++)
        send_to(r, s, &env);
    zs_auth gone = auth_of(WORKER + 50);
    o.auth = &gone;
    int refused = 0;
    uint64_t until = zs_now_ms() + 10000;
    while (!refused && zs_now_ms() < until) { /* the MemberGone may still be on its way */
        c = NULL;
        if (ops->connect(net, r->endpoint[S - 1], &o, &c) != ZS_OK)
            refused = strstr(zs_last_error(), "refused member") != NULL;
        else
            ops->conn_close(c);
    }
    CHECK(refused);
    /* A silent stream is closed by the server within the handshake timeout. */
    int port = 0;
    sscanf(strrchr(r->endpoint[0], ':') + 1, "%d", &port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    CHECK_EQ_INT(poll(&p, 1, 10000), 1); /* readable: the server closed it (EOF) */
    char b;
    CHECK_EQ_INT((int)read(fd, &b, 1), 0);
    close(fd);
    ops->close(net);
    if (S == 1)
        check_streams_per_member(r);
}

/* The job secret the test (as coordinator) and its servers share; the servers find it in
 * ZSHARD_SECRET_FILE. */
static zs_secret job_secret;

static void run(const char *zshard, int S, int replicas)
{
    rig r = {.S = S, .lost = -1};
    CHECK_OK(zs_ctrl_bind("tcp://127.0.0.1:*", &job_secret, &r.ctrl));
    for (int s = 0; s < S; s++) {
        r.pid[s] = fork();
        if (r.pid[s] == 0) {
            execl(zshard, zshard, "server", "--coord", zs_ctrl_endpoint(r.ctrl), "--listen",
                  "127.0.0.1:0", "--threads", "1", "--log-level",
                  getenv("ZS_TEST_LOG") ? getenv("ZS_TEST_LOG") : "warn", (char *)NULL);
            _exit(127);
        }
    }
    /* Registration: ids 1..S in arrival order. */
    uint32_t ids[MAXS];
    const char *eps[MAXS];
    for (int s = 0; s < S; s++) {
        Zshard__Envelope *env = recv_body(&r, ZSHARD__ENVELOPE__BODY_REGISTRATION, &r.peer[s]);
        CHECK(env != NULL);
        if (!env)
            return;
        snprintf(r.endpoint[s], sizeof r.endpoint[s], "%s", env->registration->endpoints[0]);
        r.reg_pid[s] = (pid_t)env->registration->pid;
        zs_msg_free(env);
        Zshard__RegisterReply rr = ZSHARD__REGISTER_REPLY__INIT;
        rr.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID;
        rr.assigned_id = (uint32_t)(s + 1);
        zs_auth self = auth_of(rr.assigned_id);
        rr.has_data_token = rr.has_data_key = 1;
        rr.data_token = (ProtobufCBinaryData){.len = ZS_TOKEN_BYTES, .data = self.token};
        rr.data_key = (ProtobufCBinaryData){.len = ZS_TOKEN_BYTES, .data = data_key};
        Zshard__Envelope out = ZSHARD__ENVELOPE__INIT;
        out.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY;
        out.registration_reply = &rr;
        send_to(&r, s, &out);
        ids[s] = (uint32_t)(s + 1);
        eps[s] = r.endpoint[s];
    }
    /* The job: a tiny model whose tensors the shards split. */
    zs_config cfg;
    zs_config_defaults(&cfg);
    cfg.model = (zs_model_config){
        .n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 64, .block_size = 16};
    cfg.micro_batch = 2;
    cfg.chunks = C;
    cfg.train_batch_size = 2 * C;
    cfg.cluster.shard_bytes = 5376;
    cfg.gradient_clipping = 0.5;
    cfg.seed = 7;
    zs_dataset ds = {0};
    ds.ntokens = 4000;
    ds.tokens = malloc(ds.ntokens * 2);
    for (size_t i = 0; i < ds.ntokens; i++)
        ds.tokens[i] = (uint16_t)(zs_rng_u64(3, 0, i) % 64);
    ds.max_token = 63;
    zs_trainer tr;
    CHECK_OK(zs_trainer_init(&tr, &cfg, &ds, 1, NULL));
    size_t N = tr.tt.total;
    zs_msg_job job = {
        .data_fingerprint = ds.fingerprint, .data_ntokens = ds.ntokens, .steps = STEPS};
    snprintf(job.data_path, sizeof job.data_path, "/nonexistent/synthetic");
    Zshard__JobSpec *js = NULL;
    CHECK_OK(zs_msg_jobspec_from_config(&cfg, &tr.tt, &job, &js));
    CHECK_OK(zs_shardmap_build(N, cfg.cluster.shard_bytes, S, ids, &r.map));
    zs_shardmap_set_replicas(&r.map, replicas);
    Zshard__ShardMap *sm = NULL;
    CHECK_OK(zs_shardmap_to_msg(&r.map, eps, &sm));
    for (int s = 0; s < S; s++) {
        Zshard__Envelope out = ZSHARD__ENVELOPE__INIT;
        out.body_case = ZSHARD__ENVELOPE__BODY_JOB_SPEC;
        out.job_spec = js;
        send_to(&r, s, &out);
        out.body_case = ZSHARD__ENVELOPE__BODY_SHARD_MAP;
        out.shard_map = sm;
        send_to(&r, s, &out);
    }
    for (int s = 0; s < S; s++) {
        zs_ctrl_peer from;
        Zshard__Envelope *env = recv_body(&r, ZSHARD__ENVELOPE__BODY_READY, &from);
        CHECK(env && server_of(&r, &from) >= 0);
        zs_msg_free(env);
    }
    /* The worker side. */
    CHECK_OK(ops->open(&r.net));
    zs_auth wauth = auth_of(WORKER);
    zs_conn_opts wopts = {.auth = &wauth};
    for (int s = 0; s < S; s++)
        CHECK_OK(ops->connect(r.net, r.endpoint[s], &wopts, &r.conn[s]));
    check_strangers(&r, S);
    float *params = malloc(N * 4), *compute = malloc(N * 4), *grads[C];
    char *replies = malloc(1 << 16);
    zs_mr *params_mr, *grads_mr[C], *reply_mr;
    CHECK_OK(ops->reg_mr(r.net, params, N * 4, ZS_MR_RECV, &params_mr));
    CHECK_OK(ops->reg_mr(r.net, replies, 1 << 16, ZS_MR_RECV, &reply_mr));
    for (int c = 0; c < C; c++) {
        grads[c] = malloc(N * 4);
        CHECK_OK(ops->reg_mr(r.net, grads[c], N * 4, ZS_MR_SEND, &grads_mr[c]));
    }
    zs_client *cl;
    CHECK_OK(zs_client_open(&r.map, eps, &wauth, NULL, &cl));
    CHECK_OK(zs_client_register(cl, params, N * 4));
    for (int c = 0; c < C; c++)
        CHECK_OK(zs_client_register(cl, grads[c], N * 4));
    zs_gpt2 *model;
    CHECK_OK(zs_gpt2_create(&cfg.model, &tr.tt, 2, 16, 1, &model));
    int hostile = S == 1 && !replicas, headers_only[HEADERS_ONLY];
    uint64_t headers_sent_ms = 0;
    zs_auth hauth = auth_of(HOSTILE);
    zs_client *hcl = NULL;
    if (hostile) {
        CHECK_OK(zs_client_open(&r.map, eps, &hauth, NULL, &hcl));
        CHECK_OK(zs_client_register(hcl, grads[0], N * 4));
    }
    for (long step = 0; step < STEPS; step++) {
        int mode = (int)(step % 3);
        sched g = {.stream = 3000 + (uint64_t)(S * STEPS + step)};
        /* Fetch version `step` layer by layer (layer ranges cut across shards). */
        for (int l = 0; l < tr.tt.n_layers; l++) {
            zs_client_op *op;
            size_t b = tr.tt.layer_begin[l], e = tr.tt.layer_begin[l + 1];
            CHECK_OK(zs_client_fetch(cl, b, e, step, ZS_DTYPE_F32, params + b, &op));
            int done = 0;
            CHECK_OK(zs_client_wait(cl, op, 20000, &done));
            CHECK(done);
        }
        CHECK_EQ_INT(first_diff(params, tr.params, N), N);
        /* Who computes which chunk: one worker for all, or one per chunk. */
        uint32_t owner[C];
        for (int c = 0; c < C; c++)
            owner[c] = mode == MODE_CONCURRENT ? WORKER + 10 + (uint32_t)c : WORKER;
        if (mode == MODE_CUT && hostile)
            owner[0] = HOSTILE;
        cut_set early = {0};
        if (mode == MODE_CUT) /* broken frames whose chunk has no owner yet: held, then lost */
            early = push_cuts(&r, step, owner, &g, 0, 5, 1);
        /* Tell the servers, one StepAssign per worker. */
        for (int c = 0; c < C; c++) {
            uint32_t chunks[C];
            size_t n = 0;
            for (int d = 0; d < C; d++)
                if (owner[d] == owner[c])
                    chunks[n++] = (uint32_t)d;
            if (chunks[0] != (uint32_t)c)
                continue; /* that worker's chunks went out already */
            Zshard__StepAssign sa = ZSHARD__STEP_ASSIGN__INIT;
            sa.has_step = sa.has_worker = sa.has_lr = 1;
            sa.step = (uint64_t)step;
            sa.worker = owner[c];
            sa.n_chunks = n;
            sa.chunks = chunks;
            sa.lr = zs_config_lr(&cfg, (int)step);
            for (int s = 0; s < S; s++) {
                Zshard__Envelope out = ZSHARD__ENVELOPE__INIT;
                out.body_case = ZSHARD__ENVELOPE__BODY_STEP_ASSIGN;
                out.step_assign = &sa;
                send_to(&r, s, &out);
            }
        }
        /* The assignment travels on another socket than the pushes: wait until every server
         * has it. */
        wait_assigned(&r, step, owner, grads_mr[0], reply_mr);
        if (mode == MODE_CUT) { /* broken frames for owned chunks: their payload is lost */
            check_cuts_closed(&r, &early);
            cut_set late = push_cuts(&r, step, owner, &g, 5, 5, 0);
            check_cuts_closed(&r, &late);
        }
        memcpy(compute, params, N * 4);
        for (int c = 0; c < C; c++) {
            zs_gpt2_flat flat = {.params = compute, .grads = grads[c]};
            zs_gpt2_io io = zs_gpt2_flat_io(&flat);
            int32_t in[32], tg[32];
            zs_data_chunk(&ds, cfg.seed, step, c, 2, 16, in, tg);
            float loss;
            CHECK_OK(zs_gpt2_forward(model, &io, in, tg, 2, 16, &loss));
            CHECK_OK(zs_gpt2_backward(model, &io));
        }
        /* Refusals that change nothing. */
        const zs_shard *s0 = &r.map.shards[0];
        zs_frame bad = {.op = ZS_OP_PUSH,
                        .dtype = ZS_DTYPE_F32,
                        .step = (uint64_t)step + 1,
                        .chunk = 0,
                        .sender = WORKER,
                        .offset = s0->begin,
                        .count = 8,
                        .length = 32};
        zs_frame rep = request(&r, s0->server, bad, grads_mr[0], 0, reply_mr, 0, 1 << 16);
        CHECK(rep.op == ZS_OP_ERROR && rep.status == ZS_FS_STALE);
        bad.step = (uint64_t)step;
        /* A member pushes for a chunk of another and writes that one's id as the sender: the
         * server goes by the connection's proven member, and refuses it. */
        bad.sender = owner[0];
        rep = request_as(&r, s0->server, owner[0] == WORKER + 1 ? WORKER + 2 : WORKER + 1, bad,
                         grads_mr[0], 0, reply_mr, 0, 1 << 16);
        CHECK(rep.op == ZS_OP_ERROR && rep.status == ZS_FS_NOT_ASSIGNED);
        /* The owner's own malformed pushes: refused for what they are. */
        bad.count = 0; /* an empty push: refused, and the connection goes on */
        bad.length = 0;
        rep = request_as(&r, s0->server, owner[0], bad, NULL, 0, reply_mr, 0, 1 << 16);
        CHECK(rep.op == ZS_OP_ERROR && rep.status == ZS_FS_BAD_RANGE);
        bad.count = 8;
        bad.length = 32;
        bad.offset = s0->end - 4; /* crosses into the next shard */
        rep = request_as(&r, s0->server, owner[0], bad, grads_mr[0], 0, reply_mr, 0, 1 << 16);
        CHECK(rep.op == ZS_OP_ERROR && rep.status == ZS_FS_BAD_RANGE);
        /* A fetch of the next version, held by the server until it is published. */
        int last = r.map.n_shards - 1;
        const zs_shard *sl = &r.map.shards[last];
        zs_frame hf = {.op = ZS_OP_FETCH,
                       .dtype = ZS_DTYPE_BF16,
                       .step = (uint64_t)step + 1,
                       .id = 1000000 + (uint64_t)step,
                       .offset = sl->begin,
                       .count = sl->end - sl->begin};
        zs_req *held = NULL;
        CHECK_OK(ops->irecv(r.conn[sl->server], hf.id, reply_mr, 0, 1 << 16, NULL, &held));
        CHECK_OK(ops->isend(r.conn[sl->server], &hf, NULL, 0, NULL, NULL));
        if (step == 0) {
            /* One connection holds at most 4096 fetches of the next version: the next one is
             * refused with the reason, and the held fetch of the other connection stays. */
            zs_conn *flood = NULL;
            CHECK_OK(ops->connect(r.net, r.endpoint[sl->server], &wopts, &flood));
            enum { FLOOD = 4096 };
            zs_frame ff = hf;
            ff.dtype = ZS_DTYPE_F32;
            ff.count = 1;
            zs_event evs[64];
            for (int i = 0; flood && i < FLOOD; i++) {
                ff.id = 2000000 + (uint64_t)i;
                CHECK_OK(ops->isend(flood, &ff, NULL, 0, NULL, NULL));
                /* Take the sends' completions, so that the net's event queue never fills. */
                for (int got = 64; got == 64;)
                    CHECK_OK(ops->poll(r.net, evs, 64, 0, &got));
            }
            ff.id = 2000000 + FLOOD;
            zs_req *rq = NULL;
            zs_frame rep = {0};
            int done = 0;
            CHECK_OK(ops->irecv(flood, ff.id, reply_mr, 0, 1 << 16, NULL, &rq));
            CHECK_OK(ops->isend(flood, &ff, NULL, 0, NULL, NULL));
            CHECK_OK(ops->wait(rq, 20000, &done, &rep));
            CHECK(done && rep.op == ZS_OP_ERROR && rep.status == ZS_FS_STALE);
            CHECK(done && rep.length > 0 &&
                  memmem(replies, rep.length, "too many fetches from this connection", 37));
            ops->conn_close(flood);
            CHECK_OK(ops->test(held, &done, NULL));
            CHECK(!done); /* the other connection's fetch still waits */
        }
        /* Pushes.  MODE_CONCURRENT: one thread per chunk and worker, delayed and interleaved
         * (push_concurrently).  Otherwise one client: chunks in random order, each chunk's
         * layers in reverse (as backward produces them), split by shard and all in flight at
         * once; every second chunk pushed again whole, dropped as a duplicate. */
        if (mode == MODE_CONCURRENT) {
            push_concurrently(&r, eps, step, grads, N, owner);
            int done = 0;
            CHECK_OK(ops->test(held, &done, NULL));
            CHECK(!done); /* not published yet */
        }
        if (owner[0] == HOSTILE) {
            push_headers_only(&r, step, hcl, grads[0], N, headers_only);
            headers_sent_ms = zs_now_ms();
        }
        int order[C] = {0, 1, 2, 3};
        shuffle(&g, order, C);
        for (int k = 0; k < C && mode != MODE_CONCURRENT; k++) {
            int c = order[k];
            if (owner[c] != WORKER)
                continue; /* HOSTILE's, pushed above */
            zs_client_op *ops_[16];
            int n = 0;
            for (int l = tr.tt.n_layers - 1; l >= 0; l--) {
                size_t b = tr.tt.layer_begin[l], e = tr.tt.layer_begin[l + 1];
                CHECK_OK(zs_client_push(cl, b, e, step, c, grads[c] + b, &ops_[n]));
                n++;
            }
            if (k % 2 == 1) {
                CHECK_OK(zs_client_push(cl, 0, N, step, c, grads[c], &ops_[n]));
                n++;
            }
            for (int i = 0; i < n; i++) {
                int done = 0;
                CHECK_OK(zs_client_wait(cl, ops_[i], 20000, &done));
                CHECK(done);
            }
            int done = 0;
            CHECK_OK(ops->test(held, &done, NULL));
            CHECK(!done); /* not published yet */
        }
        /* Push replies land in areas registered once and reused: as many as pushes were in
         * flight at once (at most 16 here), however many steps and chunks went by. */
        if (mode != MODE_CONCURRENT)
            CHECK(zs_client_reply_areas(cl) >= 1 && zs_client_reply_areas(cl) <= 16);
        /* A push of a chunk assigned to someone else: refused, with the server's reason. */
        {
            zs_client *other;
            zs_auth oa = auth_of(WORKER + 7);
            CHECK_OK(zs_client_open(&r.map, eps, &oa, NULL, &other));
            CHECK_OK(zs_client_register(other, grads[0], N * 4));
            zs_client_op *op;
            CHECK_OK(zs_client_push(other, 0, 8, step, 0, grads[0], &op));
            int done = 0;
            CHECK_FAILS_WITH(zs_client_wait(other, op, 20000, &done),
                             "chunk is not assigned to the sender");
            zs_client_close(other);
        }
        /* The coordinator's part: partials in shard order, verdict, publication. */
        double *part = calloc((size_t)r.map.n_shards, sizeof *part);
        for (int s = 0; s < S; s++) {
            zs_ctrl_peer from;
            Zshard__Envelope *env = recv_body(&r, ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL, &from);
            CHECK(env != NULL);
            if (!env)
                break;
            /* Partials come only once the replica held there has the whole step too. */
            CHECK_EQ_INT(env->grad_norm_partial->replicas_current, replicas);
            for (size_t i = 0; i < env->grad_norm_partial->n_partials; i++)
                part[env->grad_norm_partial->partials[i]->shard] =
                    env->grad_norm_partial->partials[i]->sumsq;
            zs_msg_free(env);
        }
        double sum = 0;
        for (int k = 0; k < r.map.n_shards; k++)
            sum += part[k];
        free(part);
        double norm = zs_grad_norm(sum, C);
        Zshard__ClipVerdict v = ZSHARD__CLIP_VERDICT__INIT;
        v.has_step = v.has_clip_factor = v.has_skip = v.has_grad_norm = 1;
        v.step = (uint64_t)step;
        v.clip_factor = zs_clip_factor(norm, cfg.gradient_clipping);
        v.grad_norm = norm;
        for (int s = 0; s < S; s++) {
            Zshard__Envelope out = ZSHARD__ENVELOPE__INIT;
            out.body_case = ZSHARD__ENVELOPE__BODY_CLIP_VERDICT;
            out.clip_verdict = &v;
            send_to(&r, s, &out);
        }
        for (int s = 0; s < S; s++) {
            zs_ctrl_peer from;
            Zshard__Envelope *env = recv_body(&r, ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED, &from);
            CHECK(env && env->version_published->version == (uint64_t)step + 1);
            zs_msg_free(env);
        }
        if (owner[0] == HOSTILE) { /* applied without waiting for the overdue payloads */
            const zs_shard *sh = &r.map.shards[0];
            int port = zs_test_port_of(r.endpoint[sh->server]), open = 0;
            for (int i = 0; i < HEADERS_ONLY; i++) {
                zs_test_tcp_end e = zs_test_tcp_lookup(port, zs_test_local_port(headers_only[i]));
                open += zs_test_tcp_open(&e);
            }
            CHECK_EQ_INT(open, HEADERS_ONLY);
            printf("test_server: step %ld applied %llu ms after the header-only pushes\n", step,
                   (unsigned long long)(zs_now_ms() - headers_sent_ms));
        }
        zs_step_stats st;
        CHECK_OK(zs_trainer_step(&tr, &st));
        CHECK(st.grad_norm == norm);
        int done = 0;
        zs_frame hr;
        CHECK_OK(ops->wait(held, 10000, &done, &hr));
        CHECK(done && hr.op == ZS_OP_FETCH_REPLY);
        int same = 1;
        for (size_t i = 0; i < sl->end - sl->begin; i++)
            same &= ((uint16_t *)replies)[i] == zs_f32_to_bf16(tr.params[sl->begin + i]);
        CHECK(same);
    }
    /* Version STEPS, fetched whole: the trainer's weights, bit for bit. */
    {
        zs_client_op *op;
        CHECK_OK(zs_client_fetch(cl, 0, N, STEPS, ZS_DTYPE_F32, params, &op));
        int done = 0;
        CHECK_OK(zs_client_wait(cl, op, 20000, &done));
    }
    CHECK_EQ_INT(first_diff(params, tr.params, N), N);
    if (hostile)
        check_headers_only(headers_only, headers_sent_ms);
    zs_client_close(hcl);
    /* Random bytes to a server's port: the server closes that connection and goes on
     * serving everyone else. */
    CHECK_EQ_INT(zs_test_send_garbage(zs_test_port_of(r.endpoint[0]), 99, 10), 1);
    {
        const zs_shard *sh = &r.map.shards[0];
        zs_frame f = {.op = ZS_OP_FETCH,
                      .dtype = ZS_DTYPE_F32,
                      .step = STEPS,
                      .offset = sh->begin,
                      .count = 16};
        zs_frame rep = request(&r, sh->server, f, NULL, 0, params_mr, 0, 64);
        CHECK_EQ_INT(rep.op, ZS_OP_FETCH_REPLY);
    }
    if (replicas)
        failover(&r, &tr, N, eps);
    /* Shutdown: every server exits 0. */
    Zshard__Shutdown sd = ZSHARD__SHUTDOWN__INIT;
    sd.has_kind = 1;
    sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE;
    sd.reason = (char *)"test done";
    for (int s = 0; s < S; s++) {
        if (s == r.lost)
            continue;
        Zshard__Envelope out = ZSHARD__ENVELOPE__INIT;
        out.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
        out.shutdown = &sd;
        send_to(&r, s, &out);
    }
    for (int s = 0; s < S; s++) {
        if (r.pid[s] == 0)
            continue; /* killed (failover) */
        int status = -1;
        uint64_t until = zs_now_ms() + 10000;
        while (waitpid(r.pid[s], &status, WNOHANG) == 0 && zs_now_ms() < until)
            usleep(10000);
        if (status == -1)
            fprintf(stderr, "test_server: server pid %d did not exit within 10 s of Shutdown\n",
                    (int)r.pid[s]);
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            kill(r.pid[s], SIGKILL);
            waitpid(r.pid[s], &status, 0);
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    zs_gpt2_free(model);
    zs_client_close(cl);
    ops->close(r.net);
    for (int c = 0; c < C; c++)
        free(grads[c]);
    free(params);
    free(compute);
    free(replies);
    zshard__shard_map__free_unpacked(sm, NULL);
    zs_msg_jobspec_free(js);
    zs_shardmap_free(&r.map);
    zs_trainer_free(&tr);
    free(ds.tokens);
    zs_ctrl_close(r.ctrl);
}

int main(void)
{
    const char *zshard = getenv("ZSHARD");
    if (!zshard) {
        fprintf(stderr, "test_server: set ZSHARD to the zshard binary (CTest does)\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *seed = getenv("ZS_TEST_SEED");
    test_seed = seed ? strtoull(seed, NULL, 0) : zs_rng_mix(zs_now_ms() ^ (uint64_t)getpid() << 32);
    printf("test_server: seed %llu (ZS_TEST_SEED=%llu repeats the schedules)\n",
           (unsigned long long)test_seed, (unsigned long long)test_seed);
    fflush(stdout);
    char work[] = "/tmp/zs_test_server_XXXXXX", secret_path[64];
    CHECK(mkdtemp(work) != NULL);
    snprintf(secret_path, sizeof secret_path, "%s/secret", work);
    CHECK_OK(zs_secret_generate(secret_path));
    CHECK_OK(zs_secret_load(secret_path, &job_secret));
    setenv(ZS_SECRET_ENV, secret_path, 1);
    zs_random_bytes(data_key, sizeof data_key);
    /* The servers close a stream that stays silent this long (check_strangers waits for it). */
    setenv("ZS_TCP_HANDSHAKE_MS", "500", 1);
    for (int S = 1; S <= MAXS; S++)
        run(zshard, S, 0);
    run(zshard, MAXS, 1);
    unlink(secret_path);
    rmdir(work);
    return zs_test_result("test_server");
}
