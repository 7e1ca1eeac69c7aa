/*
 * server: the partition server's event loop.  One thread drives everything: the data plane
 * (transport poll) and the control plane (ZeroMQ, read between data-plane turns), and AdamW
 * runs on `threads` OpenMP threads inside the same thread when a step completes.  Between
 * turns the thread sleeps (zs_server_wait) on the data plane's descriptor, the control socket
 * and an eventfd its checkpoint and replica threads write when they finish.
 *
 * Buffers: each shard's fp32 and 16-bit (bf16 or fp16) arrays are registered once and fetch replies
 * are sent straight from them.  A push is added into the accumulator straight from where its
 * payload lies when the transport can show it in place (view_payload: over shm, the worker's pages
 * mapped here), with no copy; otherwise it is received into a pool of registered scratch
 * buffers (one shard's worth each) and added from there.  A push whose header arrives while
 * it needs a scratch buffer and every one is busy stays pending in the transport (which then
 * reads nothing more from that stream) until one is free.  Before AdamW rewrites the weights, the
 * server waits for every send from them to complete.
 *
 * One turn of the loop (zs_server_turn): poll the data plane and handle its events
 * (on_data_event), close the connections doomed meanwhile, handle every control message
 * waiting (on_ctrl), send a heartbeat when one is due.  zs_server_feed hands on_ctrl bytes
 * that a test gives instead of the socket; every control message sent goes through send_ctrl,
 * where a test's hook sees it.
 */
#include "server/server.h"
#include "common/clock.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/log.h"
#include "common/memlimit.h"
#include "common/modelfile.h"
#include "common/shardmap.h"
#include "proto/ctrl.h"
#include "proto/shardmap_msg.h"
#include "server/replica.h"
#include "server/shardstore.h"
#include "transport/rdma.h"
#include "transport/tcp.h"
#include "transport/transport.h"

#include <zmq.h>

#define SCRATCH_BUFFERS 8
/* Heartbeats list the chunks received in full for jobs of at most this many chunks a step
 * (the list fits a small message); beyond it they list none and the coordinator takes the
 * workers' word. */
#define MAX_CHUNKS_IN 8192
/* Scratch buffers one member (all its streams together) may hold at once: one that sends
 * push headers and then no payload cannot take them all. */
#define SCRATCH_PER_MEMBER 2
/* A push payload must arrive within PAYLOAD_BASE_MS plus its length at PAYLOAD_MIN_RATE bytes
 * per ms (10 MB/s); a stream slower than that is closed and its buffer freed. */
#define PAYLOAD_BASE_MS 10000
#define PAYLOAD_MIN_RATE 10000
#define MAX_EVENTS 64
#define IDLE_MS 50     /* the longest the loop waits with nothing to do (heartbeats, deadlines) */
#define MAX_HELD 65536 /* fetches of the next version held at once */
#define MAX_HELD_PER_CONN 4096 /* of them from one connection (stream): no client can take all */
/* Streams one member may have open to a server at once (a worker uses ZS_TCP_CONNS of them,
 * at most 16, per client): one that opens stream after stream, each left waiting for a
 * payload, cannot take the server's descriptors. */
#define MAX_CONNS_PER_MEMBER 64

/* A connection's user pointer is a tag, not a pointer: CONN_DOOMED (odd) for a connection to
 * close at the end of this turn of the loop, else twice the number of fetches it has held. */
#define CONN_DOOMED ((void *)(uintptr_t)1)

/* Marks a send from shard memory in the event cookie (others carry a scratch slot + 1 or 0). */
#define COOKIE_STORE ((void *)(uintptr_t)-1)

typedef struct {
    zs_conn *conn;
    zs_frame frame;
} held_fetch;

/* Where a window slot's read is (the window's reader thread makes them; see window_reader). */
enum { LOAD_NONE = 0, LOAD_QUEUED, LOAD_READING, LOAD_DONE };

/* A window slot: one shard's published copy at one version, read from NVMe. */
typedef struct {
    int shard;     /* local index; -1: empty */
    long version;  /* the version it holds (or is being read at) */
    void *buf;     /* the largest shard in the job's fetch dtype (+1 16-bit pad), 4096-aligned */
    zs_mr *mr;     /* buf, registered for sends */
    long sends;    /* sends from it not completed: it is not reused before they are */
    uint64_t used; /* win_clock when last served from (least recently used goes first) */
    /* Its read: load (LOAD_*), under win_mu while not LOAD_NONE; the slot serves fetches only
     * at LOAD_NONE.  load_seq orders the reads; load_err and load_why are the outcome. */
    atomic_int load; /* the loop reads it without the lock (its own writes are under it) */
    uint64_t load_seq;
    zs_err load_err;
    char load_why[512];
} window_slot;

typedef struct {
    zs_conn *conn;
    zs_frame frame;
    uint64_t ctrl_epoch; /* the server's ctrl_epoch when the header arrived */
    uint64_t arrived_ms;
} waiting_push;

typedef struct {
    float *buf;
    zs_mr *mr;
    int busy;
    zs_conn *conn;     /* the push it is receiving */
    uint32_t member;   /* whose push */
    uint64_t since_ms; /* when its payload started */
    zs_frame frame;
} scratch;

struct zs_server {
    const zs_server_opts *opts;
    zs_server_hooks hooks;
    zs_msg_ctx ctx;              /* what control messages are checked against; grows with the job */
    const zs_transport_ops *ops; /* the backend served: tcp or rdma (opts->transport) */
    zs_rdma_conn_opts rdma;      /* its options when rdma */
    zs_conn_opts conn_opts;      /* ops, rdma: what a replica's load connects with */
    zs_net *net;
    zs_listener *listener;
    zs_ctrl *ctrl;
    char endpoint[128]; /* our data-plane HOST:PORT as registered */
    uint32_t id;
    /* The data plane's authentication (docs/security.md): the coordinator's data key (from
     * which any member's token is recomputed), whether we have it yet, and the members
     * declared gone (gone[id] != 0), who may not connect again. */
    uint8_t data_key[ZS_TOKEN_BYTES];
    int have_key;
    zs_auth auth;
    uint8_t *gone;
    uint32_t cap_gone;
    zs_log_limit refused_log;
    int told_to_stop; /* the coordinator ended, aborted or refused us: it knows why */

    zs_config cfg;
    zs_tensor_table tt;
    zs_msg_job job;
    int have_job;
    zs_shardmap map;
    int have_map;
    zs_store *store;
    zs_mr **mr_f32, **mr_half; /* per local shard */
    zs_mr **mr_m, **mr_v;      /* per local shard: the moments, for state fetches */
    zs_shard_range *local;     /* per local shard */
    int n_local;
    scratch pool[SCRATCH_BUFFERS];

    uint32_t *owner; /* [C] worker id assigned to each chunk of the current step, 0: none */
    int partials_sent;
    int verdict_pending;             /* a verdict arrived and waits for sends to drain */
    double verdict_clip, verdict_lr; /* fp16 jobs: verdict_clip is clip_factor / loss_scale */
    int verdict_skip;
    long verdict_skipped; /* fp16 jobs: steps skipped before this one (step - optimizer_step) */
    long store_sends;     /* sends from shard memory not completed */
    /* offload_param.device "nvme": the shards of the copy workers fetch that are on NVMe come
     * to RAM through this window of offload_param.buffer_count slots, least recently used out
     * first, read by a thread of their own (window_reader) with the next shard read ahead on
     * each miss; a fetch that finds its shard not ready waits in wwait for a read or a send to
     * finish. */
    window_slot *win;
    int n_win;
    uint64_t win_clock;
    /* The window's reader thread: reads queued slots in order, off the loop's thread, and
     * writes wake_fd when one is done.  win_loading: slots not at LOAD_NONE (an apply waits
     * for them: a read started at version v must finish at v). */
    pthread_t win_thread;
    int win_thread_started, win_quit, win_loading;
    pthread_mutex_t win_mu;
    pthread_cond_t win_cv;
    uint64_t win_seq;
    held_fetch *wwait;
    int n_wwait, cap_wwait;

    held_fetch *held;
    int n_held, cap_held;
    waiting_push *waiting; /* push headers pending until a scratch buffer frees */
    uint64_t ctrl_epoch;   /* counts the turns that read the control socket empty */
    zs_conn **doomed;      /* connections to close once this turn's events are handled */
    int n_doomed, cap_doomed;
    int n_waiting, cap_waiting;

    /* The checkpoint of version ckpt.step being written by a thread of its own while the next
     * step computes.  Nothing but the next zs_store_apply changes what it reads (the weights
     * and the moments), so that apply waits for it (maybe_apply) and nothing else does. */
    struct {
        pthread_t thread;
        int running;         /* started and not joined yet */
        atomic_int finished; /* set by the thread as its last act */
        zs_ckpt_info info;
        char step_dir[4096];
        zs_ckpt_shard *files; /* [n_local] */
        zs_err result;
        char error[1024];         /* the thread's error message */
        int other_fs_said;        /* the checkpoint directory is not on the NVMe tier's file system:
                                     logged once */
        atomic_int in_place_said; /* shard files completed in place: logged once (the thread) */
    } ckpt;

    zs_conn **conns; /* every open data-plane connection, to drop them all at a Restore */
    int n_conns, cap_conns;

    /* checkpoint.replicas: the replica this server holds (server/replica.h), NULL: none.  The
     * map's data-plane addresses are kept for the loads of a replica after a failover. */
    zs_replica *replica;
    char (*endpoints)[128]; /* [map.n_servers] */
    const char **endpoint_list;
    /* A Restore from memory: the stores of the old map, until the new map's are built from
     * them (setup_shards), and the version they are at. */
    int from_memory, rewrite_ckpt;
    long memory_version;
    zs_store *old_store, *old_replica;

    int wake_fd; /* an eventfd the checkpoint writer and the replica's threads write to when
                 they finish, so that the loop, waiting on it, reaps them at once */

    /* opts->prom's series (docs/observability.md); all NULL without a registry.  The data
     * plane's are atomic adds on its path; the rest change where the state they show does. */
    struct {
        zs_prom_series *version, *shards, *shard_bytes, *held;
        zs_prom_series *fetches, *fetch_bytes, *pushes, *push_bytes;
        zs_prom_series *apply, *apply_last, *replica, *replica_current;
        zs_prom_series *nvme_read, *nvme_written;
        zs_prom_series *refused[ZS_FS_BAD_KEY + 1]; /* by zs_frame_status (0, OK: unused) */
        uint64_t nvme_read_seen, nvme_written_seen; /* the tier's counts already added */
    } prom;

    uint64_t last_heartbeat_ms;
    uint64_t last_coord_ms; /* when anything last came from the coordinator */
    uint64_t last_turn_ms;  /* when the last turn began: a long gap is a pause of ours */
    int done;
    zs_err result;
};
typedef struct zs_server server;

static uint64_t now_ms(const server *sv)
{
    return sv->hooks.now_ms ? sv->hooks.now_ms(sv->hooks.user) : zs_now_ms();
}

static zs_err send_ctrl(server *sv, Zshard__Envelope *env)
{
    zs_ctrl_stamp(env, sv->id);
    if (sv->hooks.sent)
        sv->hooks.sent(sv->hooks.user, env);
    return sv->ctrl ? zs_ctrl_send(sv->ctrl, NULL, env) : ZS_OK;
}

/* An error reply for frame f on c; the payload is the reason, for the peer's logs. */
static void reply_error(server *sv, zs_conn *c, const zs_frame *f, zs_frame_status status,
                        const char *why)
{
    if ((unsigned)status < sizeof sv->prom.refused / sizeof sv->prom.refused[0])
        zs_prom_add(sv->prom.refused[status], 1);
    ZS_WARN("server %u: %s from %s (op %d, step %llu, chunk %u, offset %llu, count %llu): %s",
            sv->id, f->op == ZS_OP_PUSH ? "push" : "fetch", sv->ops->conn_peer(c), f->op,
            (unsigned long long)f->step, f->chunk, (unsigned long long)f->offset,
            (unsigned long long)f->count, why);
    size_t n = strlen(why);
    if (n > ZS_NET_INLINE_MAX)
        n = ZS_NET_INLINE_MAX;
    zs_frame e = {.op = ZS_OP_ERROR,
                  .dtype = ZS_DTYPE_TEXT,
                  .status = status,
                  .id = f->id,
                  .step = f->step,
                  .chunk = f->chunk,
                  .offset = f->offset,
                  .count = 0,
                  .length = n};
    if (sv->ops->isend_inline(c, &e, why, NULL, NULL) != ZS_OK)
        ZS_WARN("server %u: cannot answer %s: %s", sv->id, sv->ops->conn_peer(c), zs_last_error());
}

/* Fetches c holds (waiting for the next version); 0 for a doomed connection. */ static int
conn_held(const server *sv, const zs_conn *c)
{
    uintptr_t u = (uintptr_t)sv->ops->conn_user(c);
    return u & 1 ? 0 : (int)(u >> 1);
}

static void conn_held_add(server *sv, zs_conn *c, int delta)
{
    if (sv->ops->conn_user(c) != CONN_DOOMED)
        sv->ops->conn_set_user(c, (void *)(uintptr_t)((uintptr_t)(conn_held(sv, c) + delta) << 1));
}

/*
 * Schedules c to be closed after the current batch of events: closing at once would leave
 * pointers to it in the lists being walked (waiting pushes, held fetches) and in later events
 * of the same batch.
 */
static void doom(server *sv, zs_conn *c)
{
    if (sv->ops->conn_user(c) == CONN_DOOMED)
        return;
    if (sv->n_doomed == sv->cap_doomed) {
        int cap = sv->cap_doomed ? 2 * sv->cap_doomed : 16;
        zs_conn **d = realloc(sv->doomed, (size_t)cap * sizeof *d);
        if (!d)
            return; /* it stays open; the peer's next mistake tries again */
        sv->doomed = d;
        sv->cap_doomed = cap;
    }
    sv->ops->conn_set_user(c, CONN_DOOMED);
    sv->doomed[sv->n_doomed++] = c;
}

/* Skips a refused frame's payload; the connection is closed if that fails. */
static void skip_payload(server *sv, zs_conn *c, const zs_frame *f)
{
    if (f->length > 0 && sv->ops->discard(c) != ZS_OK)
        doom(sv, c);
}

/* The dtype of the 16-bit copy on the wire: F16 in an fp16 job, else BF16 (an fp32 job's
 * workers fetch F32, but the store keeps a bf16 copy all the same, and serves it). */
static zs_frame_dtype half_dtype(const server *sv)
{
    return sv->cfg.fp16.enabled ? ZS_DTYPE_F16 : ZS_DTYPE_BF16;
}

/* The copy workers fetch in this job. */
static zs_store_copy fetched_copy(const server *sv)
{
    return zs_store_fetched_copy(&sv->cfg);
}

/* The window's reader thread: takes the queued slot read first, reads the shard's published
 * copy into it through the store (the NVMe tier serializes its callers), records the outcome
 * and wakes the loop, until told to quit with nothing queued. */
static void *window_reader(void *arg)
{
    server *sv = arg;
    pthread_mutex_lock(&sv->win_mu);
    for (;;) {
        int k = -1;
        for (int j = 0; j < sv->n_win; j++)
            if (sv->win[j].load == LOAD_QUEUED &&
                (k < 0 || sv->win[j].load_seq < sv->win[k].load_seq))
                k = j;
        if (k < 0) {
            if (sv->win_quit)
                break;
            pthread_cond_wait(&sv->win_cv, &sv->win_mu);
            continue;
        }
        window_slot *w = &sv->win[k];
        w->load = LOAD_READING;
        int shard = w->shard;
        pthread_mutex_unlock(&sv->win_mu);
        zs_err e = zs_store_read_published(sv->store, shard, fetched_copy(sv), w->buf);
        pthread_mutex_lock(&sv->win_mu);
        w->load_err = e;
        snprintf(w->load_why, sizeof w->load_why, "%s", e != ZS_OK ? zs_last_error() : "");
        w->load = LOAD_DONE;
        uint64_t one = 1;
        if (write(sv->wake_fd, &one, sizeof one) < 0)
            ZS_DEBUG("server %u: waking the loop: %s", sv->id, strerror(errno));
    }
    pthread_mutex_unlock(&sv->win_mu);
    return NULL;
}

/* Starts the reader thread (the window exists). */
static zs_err window_reader_start(server *sv)
{
    pthread_mutex_init(&sv->win_mu, NULL);
    pthread_cond_init(&sv->win_cv, NULL);
    sv->win_quit = 0;
    if (pthread_create(&sv->win_thread, NULL, window_reader, sv) != 0) {
        pthread_cond_destroy(&sv->win_cv);
        pthread_mutex_destroy(&sv->win_mu);
        return zs_error(ZS_ERR_IO, "server %u: cannot start the NVMe window's reader", sv->id);
    }
    sv->win_thread_started = 1;
    return ZS_OK;
}

/* Stops it, after the read it is making (before the window or the store goes). */
static void window_reader_stop(server *sv)
{
    if (!sv->win_thread_started)
        return;
    pthread_mutex_lock(&sv->win_mu);
    sv->win_quit = 1;
    for (int k = 0; k < sv->n_win; k++)
        if (sv->win[k].load == LOAD_QUEUED) /* never started: dropped */
            sv->win[k].load = LOAD_NONE;
    pthread_cond_signal(&sv->win_cv);
    pthread_mutex_unlock(&sv->win_mu);
    pthread_join(sv->win_thread, NULL);
    pthread_cond_destroy(&sv->win_cv);
    pthread_mutex_destroy(&sv->win_mu);
    sv->win_thread_started = 0;
    sv->win_loading = 0;
}

/* Queues the read of local shard i's published copy at the current version into slot k. */
static void window_queue(server *sv, int k, int i)
{
    window_slot *w = &sv->win[k];
    pthread_mutex_lock(&sv->win_mu);
    w->shard = i;
    w->version = zs_store_version(sv->store);
    w->load = LOAD_QUEUED;
    w->load_seq = ++sv->win_seq;
    pthread_cond_signal(&sv->win_cv);
    pthread_mutex_unlock(&sv->win_mu);
    sv->win_loading++;
}

/* The idle slot (no send from it in flight, no read) used least recently, other than `not`;
 * -1: none. */
static int window_victim(const server *sv, int not )
{
    int victim = -1;
    for (int k = 0; k < sv->n_win; k++)
        if (k != not &&sv->win[k].sends == 0 && sv->win[k].load == LOAD_NONE &&
            (victim < 0 || sv->win[k].used < sv->win[victim].used))
            victim = k;
    return victim;
}

/* The slot that holds shard i at the current version (ready), or is reading it (*loading);
 * -1: none. */
static int window_find(const server *sv, int i, int *loading)
{
    for (int k = 0; k < sv->n_win; k++)
        if (sv->win[k].shard == i && sv->win[k].version == zs_store_version(sv->store)) {
            if (loading)
                *loading = sv->win[k].load != LOAD_NONE;
            return k;
        }
    return -1;
}

/* Queues the read of shard i into an idle slot other than `not`, unless it is in the window or
 * being read already, or it is not on NVMe (then there is nothing to read), or no slot is idle.
 * Returns whether shard i is in the window or on its way. */
static int window_fill(server *sv, int i, int not )
{
    const void *d;
    if (i < 0 || i >= sv->n_local)
        return 0;
    if (window_find(sv, i, NULL) >= 0)
        return 1;
    if (zs_store_locate(sv->store, sv->local[i].begin, 1, fetched_copy(sv), &d) != ZS_STORE_ON_NVME)
        return 0;
    int k = window_victim(sv, not );
    if (k < 0)
        return 0;
    window_queue(sv, k, i);
    return 1;
}

/* The window slot that holds local shard i's published copy at the current version, ready to
 * send from; -1: not yet (its read was queued now, or runs, or every slot is busy: the fetch
 * waits in wwait and is tried again when a read or a send finishes).  A miss also queues the
 * read of shard i + 1: workers fetch in layer order, which is shard order. */
static int window_get(server *sv, int i)
{
    int loading = 0, k = window_find(sv, i, &loading);
    if (k >= 0 && !loading) {
        sv->win[k].used = ++sv->win_clock;
        return k;
    }
    if (k < 0 && window_fill(sv, i, -1)) {
        int next = window_find(sv, i, NULL);
        window_fill(sv, i + 1, next);
    }
    return -1;
}

static void serve_fetch(server *sv, zs_conn *c, const zs_frame *f);
static void window_retry(server *sv);
static void maybe_apply(server *sv);

/* Takes the reads the reader finished: a slot read is ready (the fetches that waited are tried
 * again); one that failed (a block that fails its checksum, EIO) stops the server with the
 * reason -- the copy it publishes is damaged, and the coordinator goes back to the newest
 * checkpoint -- and the fetches that waited are told so. */
static void window_reap(server *sv)
{
    if (sv->win_loading == 0)
        return;
    int finished = 0;
    zs_err failed = ZS_OK;
    char why[512] = "";
    pthread_mutex_lock(&sv->win_mu);
    for (int k = 0; k < sv->n_win; k++) {
        window_slot *w = &sv->win[k];
        if (w->load != LOAD_DONE)
            continue;
        w->load = LOAD_NONE;
        sv->win_loading--;
        finished++;
        if (w->load_err != ZS_OK) {
            if (failed == ZS_OK) {
                failed = w->load_err;
                snprintf(why, sizeof why, "%s", w->load_why);
            }
            w->shard = -1;
        } else {
            w->used = ++sv->win_clock;
        }
    }
    pthread_mutex_unlock(&sv->win_mu);
    if (failed != ZS_OK) {
        sv->result = zs_error(failed, "%s", why);
        ZS_ERROR("server %u: %s", sv->id, why);
        sv->done = 1;
        for (int j = 0; j < sv->n_wwait; j++)
            reply_error(sv, sv->wwait[j].conn, &sv->wwait[j].frame, ZS_FS_SHUTDOWN,
                        "this server's copy of the weights on NVMe failed a read; it stops");
        sv->n_wwait = 0;
        return;
    }
    if (finished) {
        window_retry(sv);
        maybe_apply(sv);
    }
}

/* Appends (c, f) to a list of fetches that wait (held, wwait), growing it; 0, or -1 out of
 * memory (nothing changed). */
static int held_append(held_fetch **list, int *n, int *cap, zs_conn *c, const zs_frame *f)
{
    if (*n == *cap) {
        int grown = *cap ? 2 * *cap : 64;
        held_fetch *h = realloc(*list, (size_t)grown * sizeof *h);
        if (!h)
            return -1;
        *list = h;
        *cap = grown;
    }
    (*list)[(*n)++] = (held_fetch){c, *f};
    return 0;
}

/* A fetch whose shard is not ready in the window (being read, or every slot busy) waits for a
 * read or a send to finish (bounded as held fetches are). */
static void window_wait(server *sv, zs_conn *c, const zs_frame *f)
{
    if (sv->n_wwait >= MAX_HELD)
        reply_error(sv, c, f, ZS_FS_STALE, "too many fetches wait for this server's NVMe window");
    else if (held_append(&sv->wwait, &sv->n_wwait, &sv->cap_wwait, c, f) != 0)
        reply_error(sv, c, f, ZS_FS_SHUTDOWN, "out of memory for waiting fetches");
}

/* A window slot finished sending or reading: the fetches that waited are tried again, in
 * order. */
static void window_retry(server *sv)
{
    int n = sv->n_wwait;
    if (n == 0)
        return;
    held_fetch *w = malloc((size_t)n * sizeof *w);
    if (!w)
        return; /* tried again at the next completion */
    memcpy(w, sv->wwait, (size_t)n * sizeof *w);
    sv->n_wwait = 0;
    for (int k = 0; k < n; k++)
        serve_fetch(sv, w[k].conn, &w[k].frame);
    free(w);
}

/* Serves a fetch of the current version: of the published weights in the frame's dtype, or
 * (state flag) of the fp32 weights or a moment. */
static void serve_fetch(server *sv, zs_conn *c, const zs_frame *f)
{
    const void *data;
    zs_store_copy copy = f->dtype == ZS_DTYPE_F32 ? ZS_STORE_F32 : ZS_STORE_HALF;
    zs_store_result where = zs_store_locate(sv->store, f->offset, f->count, copy, &data);
    int i = 0;
    while (i < sv->n_local && !(f->offset >= sv->local[i].begin && f->offset < sv->local[i].end))
        i++;
    int slot = -1;
    if (where == ZS_STORE_ON_NVME && sv->n_win > 0 && copy == fetched_copy(sv) &&
        !(f->flags & ZS_FRAME_FLAG_STATE)) {
        if (sv->done) {
            reply_error(sv, c, f, ZS_FS_SHUTDOWN, "this server is stopping");
            return;
        }
        if ((slot = window_get(sv, i)) < 0) {
            window_wait(sv, c, f);
            return;
        }
        where = ZS_STORE_OK;
    }
    if (where != ZS_STORE_OK) {
        reply_error(sv, c, f, ZS_FS_BAD_RANGE,
                    where == ZS_STORE_ON_NVME
                        ? "that copy of this shard is on NVMe, and this server serves only the "
                          "copy this job's workers fetch from there"
                        : "range is not inside one shard of this server");
        return;
    }
    size_t esz = zs_frame_dtype_size((zs_frame_dtype)f->dtype);
    zs_frame r = {.op = ZS_OP_FETCH_REPLY,
                  .dtype = f->dtype,
                  .id = f->id,
                  .step = (uint64_t)zs_store_version(sv->store),
                  .offset = f->offset,
                  .count = f->count,
                  .length = f->count * esz};
    zs_mr *mr = slot >= 0                                            ? sv->win[slot].mr
                : f->dtype != ZS_DTYPE_F32                           ? sv->mr_half[i]
                : !(f->flags & ZS_FRAME_FLAG_STATE) || f->chunk == 0 ? sv->mr_f32[i]
                : f->chunk == 1                                      ? sv->mr_m[i]
                                                                     : sv->mr_v[i];
    if (!mr) {
        reply_error(
            sv, c, f, ZS_FS_BAD_RANGE,
            "the moments of this shard are on NVMe: state fetches serve moments in RAM only");
        return;
    }
    size_t off = (f->offset - sv->local[i].begin) * esz;
    if (sv->ops->isend(c, &r, mr, off, slot >= 0 ? (void *)&sv->win[slot] : COOKIE_STORE, NULL) !=
        ZS_OK) {
        ZS_WARN("server %u: fetch reply to %s: %s", sv->id, sv->ops->conn_peer(c), zs_last_error());
        return;
    }
    if (slot >= 0)
        sv->win[slot].sends++;
    else
        sv->store_sends++;
    zs_prom_add(sv->prom.fetches, 1);
    zs_prom_add(sv->prom.fetch_bytes, r.length);
}

/* A fetch of the optimizer state (a replica being built after a failover): only of exactly the
 * version the store is at, never held. */
static void on_fetch_state(server *sv, zs_conn *c, const zs_frame *f)
{
    long v = zs_store_version(sv->store);
    if ((long)f->step != v || sv->verdict_pending) {
        char why[160];
        snprintf(why, sizeof why, "the state of version %llu is not held (this server is at %ld%s)",
                 (unsigned long long)f->step, v, sv->verdict_pending ? ", applying" : "");
        reply_error(sv, c, f, ZS_FS_STALE, why);
        return;
    }
    serve_fetch(sv, c, f);
}

static void on_fetch(server *sv, zs_conn *c, const zs_frame *f)
{
    if (f->flags & ZS_FRAME_FLAG_STATE) {
        on_fetch_state(sv, c, f);
        return;
    }
    long v = zs_store_version(sv->store);
    if (f->dtype != ZS_DTYPE_F32 && f->dtype != half_dtype(sv)) {
        reply_error(sv, c, f, ZS_FS_BAD_RANGE,
                    sv->cfg.fp16.enabled
                        ? "fetch dtype must be F32 or F16 (this is an fp16 job)"
                        : "fetch dtype must be F32 or BF16 (F16 only in fp16 jobs)");
    } else if ((long)f->step < v || (sv->verdict_pending && (long)f->step == v)) {
        reply_error(sv, c, f, ZS_FS_STALE, "version is no longer held");
    } else if (f->step > (uint64_t)v + 1) {
        /* Only the next version is worth waiting for; anything further is a peer's mistake
         * (and would grow without bound). */
        reply_error(sv, c, f, ZS_FS_STALE, "fetch of a version beyond the next one");
    } else if ((long)f->step > v &&
               (sv->n_held >= MAX_HELD || conn_held(sv, c) >= MAX_HELD_PER_CONN)) {
        /* More waiting requests than any job makes: refused, so that memory stays bounded
         * and one connection cannot take every place. */
        reply_error(sv, c, f, ZS_FS_STALE,
                    sv->n_held >= MAX_HELD ? "too many fetches wait for the next version"
                                           : "too many fetches from this connection wait for "
                                             "the next version");
    } else if ((long)f->step > v) {
        /* The next version: hold the request until it is published. */
        if (held_append(&sv->held, &sv->n_held, &sv->cap_held, c, f) != 0) {
            reply_error(sv, c, f, ZS_FS_SHUTDOWN, "out of memory for held fetches");
            return;
        }
        conn_held_add(sv, c, 1);
    } else {
        serve_fetch(sv, c, f);
    }
}

/* A free scratch buffer for a push by member, or -1 (none free, or the member holds its
 * share). */
static int free_scratch(server *sv, uint32_t member)
{
    int free_slot = -1, held = 0;
    for (int i = 0; i < SCRATCH_BUFFERS; i++) {
        if (!sv->pool[i].busy && free_slot < 0)
            free_slot = i;
        held += sv->pool[i].busy && sv->pool[i].member == member;
    }
    return held < SCRATCH_PER_MEMBER ? free_slot : -1;
}

/* Closes the streams whose push payload is overdue (their buffers come back when the failed
 * receive is reported). */
static void expire_payloads(server *sv)
{
    uint64_t now = now_ms(sv);
    for (int i = 0; i < SCRATCH_BUFFERS; i++) {
        scratch *s = &sv->pool[i];
        uint64_t limit = PAYLOAD_BASE_MS + s->frame.length / PAYLOAD_MIN_RATE;
        if (!s->busy || !s->conn || now - s->since_ms <= limit)
            continue;
        zs_log_limited(&sv->refused_log, ZS_LOG_WARN,
                       "server %u: push from %s (member %u): %llu payload bytes not in after "
                       "%llu ms; connection closed",
                       sv->id, sv->ops->conn_peer(s->conn), s->member,
                       (unsigned long long)s->frame.length, (unsigned long long)limit);
        doom(sv, s->conn);
        s->conn = NULL;
    }
}

/* Whether a push header can be taken now: PUSH_TAKE, PUSH_DEFER (its chunk has no owner here
 * yet: the step's assignment is still on its way over the control plane), or PUSH_REFUSED
 * (answered, payload discarded). */
enum { PUSH_TAKE, PUSH_DEFER, PUSH_REFUSED };

/* How long a push from a sender that is not the chunk's owner here waits for a reassignment
 * before it is refused (and at least until the control socket has been read empty once
 * after it arrived).  The coordinator sends a reassignment to the servers before the new
 * owner, but the server reads its control socket only between data-plane turns. */
#define OWNER_GRACE_MS 100

/* The store a push lands in: the server's own, its replica's, or NULL (neither holds it). */
static zs_store *push_target(const server *sv, const zs_frame *f)
{
    if (zs_store_holds(sv->store, f->offset, f->count))
        return sv->store;
    if (sv->replica && zs_store_holds(zs_replica_store(sv->replica), f->offset, f->count))
        return zs_replica_store(sv->replica);
    return NULL;
}

static int push_check(server *sv, const waiting_push *w)
{
    zs_conn *c = w->conn;
    const zs_frame *f = &w->frame;
    /* Who pushes is who proved it in the connection's handshake; the frame's sender field is
     * the peer's to fill in, and is not believed. */
    uint32_t sender = sv->ops->conn_member(c);
    int owner_may_change =
        w->ctrl_epoch == sv->ctrl_epoch || now_ms(sv) - w->arrived_ms < OWNER_GRACE_MS;
    const char *why = NULL;
    zs_frame_status st = ZS_FS_OK;
    zs_store *target = push_target(sv, f);
    if (f->dtype != ZS_DTYPE_F32 && !(f->dtype == ZS_DTYPE_F16 && sv->cfg.fp16.enabled))
        st = ZS_FS_BAD_RANGE, why = sv->cfg.fp16.enabled ? "push payload must be F32 or F16"
                                                         : "push payload must be F32 (F16 only "
                                                           "in fp16 jobs)";
    else if ((long)f->step != zs_store_version(sv->store) || sv->verdict_pending)
        st = ZS_FS_STALE, why = "push for a step that is not current";
    else if (f->chunk >= (uint32_t)sv->cfg.chunks || sender == 0)
        st = ZS_FS_NOT_ASSIGNED, why = ZS_NOT_ASSIGNED_TEXT;
    else if (sv->owner[f->chunk] == 0)
        return PUSH_DEFER;
    else if (sv->owner[f->chunk] != sender && owner_may_change)
        return PUSH_DEFER; /* the chunk may have been reassigned to the sender */
    else if (sv->owner[f->chunk] != sender)
        st = ZS_FS_NOT_ASSIGNED, why = ZS_NOT_ASSIGNED_TEXT;
    else if (!target)
        st = ZS_FS_BAD_RANGE, why = "range is not inside one shard of this server or its replica";
    else if (target != sv->store && zs_replica_applying(sv->replica))
        return PUSH_DEFER; /* the replica is still applying the previous step */
    if (st == ZS_FS_OK)
        return PUSH_TAKE;
    reply_error(sv, c, f, st, why);
    skip_payload(sv, c, f);
    return PUSH_REFUSED;
}

static void start_push(server *sv, zs_conn *c, const zs_frame *f, int slot)
{
    scratch *s = &sv->pool[slot];
    if (sv->ops->recv_payload(c, s->mr, 0, (void *)(uintptr_t)(slot + 1), NULL) != ZS_OK) {
        ZS_WARN("server %u: push from %s: %s", sv->id, sv->ops->conn_peer(c), zs_last_error());
        doom(sv, c);
        return;
    }
    s->busy = 1;
    s->conn = c;
    s->member = sv->ops->conn_member(c);
    s->since_ms = now_ms(sv);
    s->frame = *f;
}

static zs_store_result add_push(server *sv, const zs_frame *f, const void *grad, const char **why);
static void answer_push(server *sv, zs_conn *c, const zs_frame *f, zs_store_result res,
                        const char *why);

/* Takes an acceptable push: added to the gradient straight from where its payload lies when
 * the transport can show it in place (shm: the worker's pages mapped here), else received
 * into a free scratch buffer first.  0, or -1 when it needs a buffer and none is free. */
static int take_push(server *sv, const waiting_push *w)
{
    const void *data = NULL;
    if (sv->ops->view_payload(w->conn, &data) != ZS_OK) {
        ZS_WARN("server %u: push from %s: %s", sv->id, sv->ops->conn_peer(w->conn),
                zs_last_error());
        doom(sv, w->conn);
        return 0;
    }
    if (data) {
        const char *why = "";
        zs_store_result res = add_push(sv, &w->frame, data, &why);
        if (sv->ops->view_release(w->conn) != ZS_OK) {
            ZS_WARN("server %u: push from %s: %s", sv->id, sv->ops->conn_peer(w->conn),
                    zs_last_error());
            doom(sv, w->conn);
        }
        answer_push(sv, w->conn, &w->frame, res, why);
        return 0;
    }
    int slot = free_scratch(sv, sv->ops->conn_member(w->conn));
    if (slot < 0)
        return -1;
    start_push(sv, w->conn, &w->frame, slot);
    return 0;
}

/* Takes the waiting push headers that can go now, oldest first: refused ones are answered,
 * acceptable ones are added in place or get a free scratch buffer (when none is free they
 * wait), deferred ones stay. */
static void drain_waiting(server *sv)
{
    int j = 0;
    for (int i = 0; i < sv->n_waiting; i++) {
        waiting_push w = sv->waiting[i];
        int verdict = push_check(sv, &w);
        if (verdict == PUSH_TAKE && take_push(sv, &w) != 0)
            verdict = PUSH_DEFER;
        if (verdict == PUSH_DEFER) {
            ZS_DEBUG("server %u: push of step %llu chunk %u waits (%s)", sv->id,
                     (unsigned long long)w.frame.step, w.frame.chunk,
                     free_scratch(sv, sv->ops->conn_member(w.conn)) < 0
                         ? "no free buffer"
                         : "its chunk's owner here is not the sender yet");
            sv->waiting[j++] = w;
        }
    }
    sv->n_waiting = j;
}

static void on_push_header(server *sv, zs_conn *c, const zs_frame *f)
{
    /* The header stays pending in the transport (nothing more is read from that stream)
     * until a scratch buffer is free and the chunk's owner is known. */
    if (sv->n_waiting == sv->cap_waiting) {
        int cap = sv->cap_waiting ? 2 * sv->cap_waiting : 16;
        waiting_push *w = realloc(sv->waiting, (size_t)cap * sizeof *w);
        if (!w) {
            doom(sv, c);
            return;
        }
        sv->waiting = w;
        sv->cap_waiting = cap;
    }
    sv->waiting[sv->n_waiting++] = (waiting_push){c, *f, sv->ctrl_epoch, now_ms(sv)};
    drain_waiting(sv);
}

static zs_err send_partials(server *sv)
{
    int n = zs_store_shard_count(sv->store);
    int *idx = malloc((size_t)n * sizeof *idx);
    double *sum = malloc((size_t)n * sizeof *sum);
    Zshard__ShardSumsq *items = calloc((size_t)n, sizeof *items);
    Zshard__ShardSumsq **ptrs = calloc((size_t)n, sizeof *ptrs);
    zs_err res = ZS_OK;
    if (!idx || !sum || !items || !ptrs) {
        res = zs_error(ZS_ERR_NOMEM, "server: out of memory for partials");
        goto out;
    }
    zs_store_partials(sv->store, idx, sum);
    int nonfinite = 0;
    for (int i = 0; i < n; i++) {
        zshard__shard_sumsq__init(&items[i]);
        items[i].has_shard = items[i].has_sumsq = 1;
        items[i].shard = (uint32_t)idx[i];
        items[i].sumsq = sum[i];
        nonfinite |= !isfinite(sum[i]);
        ptrs[i] = &items[i];
    }
    Zshard__GradNormPartial p = ZSHARD__GRAD_NORM_PARTIAL__INIT;
    p.has_step = p.has_server = p.has_has_nonfinite = 1;
    p.step = (uint64_t)zs_store_version(sv->store);
    p.server = sv->id;
    p.n_partials = (size_t)n;
    p.partials = ptrs;
    p.has_nonfinite = nonfinite;
    p.has_replicas_current = 1;
    p.replicas_current = sv->replica && !zs_replica_lost(sv->replica);
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL;
    env.grad_norm_partial = &p;
    res = send_ctrl(sv, &env);
out:
    free(idx);
    free(sum);
    free(items);
    free(ptrs);
    return res;
}

/* The wire status a push's result is answered with.  Out of memory is the server's trouble,
 * not the peer's mistake: it is logged here as an error, and the peer is told the server
 * cannot take the push (SHUTDOWN, with the reason in the text) so that it stops retrying. */
static zs_frame_status wire_status(zs_store_result r)
{
    switch (r) {
    case ZS_STORE_OK:
        return ZS_FS_OK;
    case ZS_STORE_DUPLICATE:
        return ZS_FS_DUPLICATE;
    case ZS_STORE_STALE:
        return ZS_FS_STALE;
    case ZS_STORE_BAD_RANGE:
    case ZS_STORE_ON_NVME: /* a push never asks where the fp32 weights are */
        return ZS_FS_BAD_RANGE;
    case ZS_STORE_BAD_CHUNK:
        return ZS_FS_NOT_ASSIGNED;
    case ZS_STORE_NOMEM:
        return ZS_FS_SHUTDOWN;
    }
    return ZS_FS_BAD_FRAME;
}

/* Once every chunk of the step is in, here and in the replica held here (unless it was given
 * up): the step's partial sums to the coordinator. */
static void maybe_send_partials(server *sv)
{
    if (sv->partials_sent || !sv->store || !zs_store_complete(sv->store))
        return;
    if (sv->replica && !zs_replica_lost(sv->replica) && !zs_replica_complete(sv->replica))
        return;
    if (send_partials(sv) != ZS_OK)
        ZS_ERROR("server %u: %s", sv->id, zs_last_error());
    sv->partials_sent = 1;
    ZS_DEBUG("server %u: step %ld complete, partials sent", sv->id, zs_store_version(sv->store));
}

/* Adds a received push (F32, or F16 in an fp16 job: push_check let nothing else in) to the store
 * it lands in (the server's own or the replica's). */
static zs_store_result add_push(server *sv, const zs_frame *f, const void *grad, const char **why)
{
    zs_prom_add(sv->prom.pushes, 1);
    zs_prom_add(sv->prom.push_bytes, f->length);
    zs_store *target = push_target(sv, f);
    if (target && target != sv->store && zs_replica_lost(sv->replica))
        return ZS_STORE_OK; /* a replica given up: its pushes are dropped */
    if (!target)
        return ZS_STORE_BAD_RANGE;
    if (f->dtype == ZS_DTYPE_F16)
        return zs_store_push_f16(target, (long)f->step, (int)f->chunk, f->offset, f->count, grad,
                                 why);
    return zs_store_push(target, (long)f->step, (int)f->chunk, f->offset, f->count, grad, why);
}

/* Answers a push that add_push took (c may be NULL or closed: then nobody is told), and sends
 * the step's partials once it completed. */
static void answer_push(server *sv, zs_conn *c, const zs_frame *f, zs_store_result res,
                        const char *why)
{
    zs_frame_status st = wire_status(res);
    if (res == ZS_STORE_NOMEM)
        ZS_ERROR("server %u: push of step %llu chunk %u refused: %s", sv->id,
                 (unsigned long long)f->step, f->chunk, why);
    int open = c && !sv->ops->conn_closed(c);
    if (st == ZS_FS_OK || st == ZS_FS_DUPLICATE) {
        zs_frame r = {.op = ZS_OP_PUSH_REPLY,
                      .dtype = ZS_DTYPE_F32,
                      .status = st,
                      .id = f->id,
                      .step = f->step,
                      .chunk = f->chunk,
                      .offset = f->offset,
                      .count = 0,
                      .length = 0};
        if (open)
            sv->ops->isend(c, &r, NULL, 0, NULL, NULL);
        if (st == ZS_FS_DUPLICATE) {
            zs_prom_add(sv->prom.refused[ZS_FS_DUPLICATE], 1);
            ZS_DEBUG("server %u: duplicate push dropped (step %llu chunk %u)", sv->id,
                     (unsigned long long)f->step, f->chunk);
        }
    } else if (open) {
        reply_error(sv, c, f, st, why);
    }
    maybe_send_partials(sv);
}

static void on_push_done(server *sv, int slot, zs_err err)
{
    scratch *s = &sv->pool[slot];
    s->busy = 0;
    if (err == ZS_OK) {
        const char *why = "";
        zs_store_result res = add_push(sv, &s->frame, s->buf, &why);
        answer_push(sv, s->conn, &s->frame, res, why);
    } else {
        /* The peer went away mid-payload: the scratch contents are simply not used. */
        ZS_WARN("server %u: push payload lost: %s", sv->id, zs_last_error());
    }
    s->conn = NULL;
    drain_waiting(sv);
}

/* Adds c to the list of open connections (a connection that cannot be listed is closed: a
 * Restore must be able to drop every one). */
/* zs_auth.token_of of our listener: the token of a member that is neither unknown nor gone. */
static int token_of(void *ctx, uint32_t member, uint8_t token[ZS_TOKEN_BYTES], char *why)
{
    server *sv = ctx;
    if (!sv->have_key) { /* the client tries again: our RegisterReply is on its way */
        snprintf(why, ZS_NET_REASON_MAX / 2,
                 "this server is not registered with its coordinator yet");
        return -2;
    }
    if (member == 0) {
        snprintf(why, ZS_NET_REASON_MAX / 2, "member 0 is nobody");
        return -1;
    }
    if (member < sv->cap_gone && sv->gone[member]) {
        snprintf(why, ZS_NET_REASON_MAX / 2, "member %u was declared gone", member);
        return -1;
    }
    zs_token_of(sv->data_key, member, token);
    return 0;
}

/* The coordinator declared member gone: its connections close, and it may not connect again.
 * Without memory for the record, the connections still close (it could reconnect). */
static void member_gone(server *sv, uint32_t member)
{
    if (member >= sv->cap_gone) {
        uint32_t cap = sv->cap_gone ? sv->cap_gone : 64;
        while (cap <= member)
            cap *= 2;
        uint8_t *g = realloc(sv->gone, cap);
        if (g) {
            memset(g + sv->cap_gone, 0, cap - sv->cap_gone);
            sv->gone = g;
            sv->cap_gone = cap;
        }
    }
    if (member < sv->cap_gone)
        sv->gone[member] = 1;
    int n = 0;
    for (int i = 0; i < sv->n_conns; i++)
        if (sv->ops->conn_member(sv->conns[i]) == member) {
            doom(sv, sv->conns[i]);
            n++;
        }
    ZS_INFO("server %u: member %u is gone (the coordinator says); %d connections closed", sv->id,
            member, n);
}

static void track_conn(server *sv, zs_conn *c)
{
    uint32_t member = sv->ops->conn_member(c);
    int same = 0;
    for (int i = 0; member != 0 && i < sv->n_conns; i++)
        same += sv->ops->conn_member(sv->conns[i]) == member;
    if (same >= MAX_CONNS_PER_MEMBER) {
        zs_log_limited(&sv->refused_log, ZS_LOG_WARN,
                       "server %u: member %u (%s) has %d streams open here already, the most "
                       "one member may; the new one is closed",
                       sv->id, member, sv->ops->conn_peer(c), same);
        doom(sv, c);
        return;
    }
    if (sv->n_conns == sv->cap_conns) {
        int cap = sv->cap_conns ? 2 * sv->cap_conns : 16;
        zs_conn **l = realloc(sv->conns, (size_t)cap * sizeof *l);
        if (!l) {
            doom(sv, c);
            return;
        }
        sv->conns = l;
        sv->cap_conns = cap;
    }
    sv->conns[sv->n_conns++] = c;
}

/* Forgets a connection that closed: held fetches, waiting pushes, scratch owners. */
static void forget_conn(server *sv, zs_conn *c)
{
    for (int i = 0; i < sv->n_conns; i++)
        if (sv->conns[i] == c) {
            sv->conns[i] = sv->conns[--sv->n_conns];
            break;
        }
    int j = 0;
    for (int i = 0; i < sv->n_held; i++)
        if (sv->held[i].conn != c)
            sv->held[j++] = sv->held[i];
    sv->n_held = j;
    j = 0;
    for (int i = 0; i < sv->n_wwait; i++)
        if (sv->wwait[i].conn != c)
            sv->wwait[j++] = sv->wwait[i];
    sv->n_wwait = j;
    j = 0;
    for (int i = 0; i < sv->n_waiting; i++)
        if (sv->waiting[i].conn != c)
            sv->waiting[j++] = sv->waiting[i];
    sv->n_waiting = j;
    for (int i = 0; i < SCRATCH_BUFFERS; i++)
        if (sv->pool[i].conn == c)
            sv->pool[i].conn = NULL;
}

static void on_header(server *sv, zs_conn *c, const zs_frame *f)
{
    if (!sv->store) {
        reply_error(sv, c, f, ZS_FS_SHUTDOWN, "server is not set up yet");
        skip_payload(sv, c, f);
        return;
    }
    switch (f->op) {
    case ZS_OP_FETCH:
        on_fetch(sv, c, f);
        break;
    case ZS_OP_PUSH:
        on_push_header(sv, c, f);
        break;
    default:
        /* Replies and errors are not requests: the peer is confused, drop it. */
        reply_error(sv, c, f, ZS_FS_BAD_FRAME, "a server takes only FETCH and PUSH");
        doom(sv, c);
        break;
    }
}

/* ---- checkpoints ---- */

static void maybe_apply(server *sv);

/* Removes the files this server wrote for a checkpoint that failed: the coordinator abandons
 * it, and a half-written checkpoint must not take the disk space the next one needs.  Shard
 * files the NVMe tier wrote the step into go too: the tier holds them open until the next
 * apply has read them (server/nvme.h). */
static void ckpt_unlink_files(server *sv, int n)
{
    char path[4096 + 80];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", sv->ckpt.step_dir, sv->ckpt.files[i].file);
        if (unlink(path) != 0)
            ZS_DEBUG("server %u: %s: %s", sv->id, path, strerror(errno));
    }
}

/* The writer thread: every local shard's weights and moments, one file each.  A shard whose
 * state the NVMe tier wrote into its file of this checkpoint already (zs_store_apply_into) is
 * only completed: its header, its weights if they are in RAM, an fsync. */
static void *ckpt_main(void *arg)
{
    server *sv = arg;
    zs_err res = ZS_OK;
    int i = 0;
    uint64_t sums[ZS_CKPT_ARRAYS];
    int param_in_file = 0, in_place = 0;
    /* Arrays read back from the NVMe tier, one shard at a time; aligned, as the writer uses
     * O_DIRECT.  Shards are at most cluster.shard_size bytes, so one size fits all. */
    float *buf[3] = {NULL, NULL, NULL};
    size_t cap[3] = {0, 0, 0};
    for (; i < sv->n_local && res == ZS_OK; i++) {
        zs_shard_range r;
        float *a[3];
        zs_store_state(sv->store, i, &r, &a[0], &a[1], &a[2]);
        if (zs_store_in_ckpt(sv->store, i, sv->ckpt.step_dir, sums, &param_in_file)) {
            res = zs_ckpt_finish_shard(sv->ckpt.step_dir, &sv->ckpt.info, r.index, r.begin, r.end,
                                       param_in_file ? NULL : a[0], sums, &sv->ckpt.files[i]);
            in_place++;
            continue;
        }
        size_t bytes = (r.end - r.begin) * sizeof(float);
        for (int k = 0; k < 3 && res == ZS_OK; k++) {
            if (a[k])
                continue;
            if (bytes > cap[k]) {
                free(buf[k]);
                cap[k] = 0;
                if (posix_memalign((void **)&buf[k], 4096, bytes) != 0) {
                    buf[k] = NULL;
                    res = zs_error(ZS_ERR_NOMEM, "server %u: out of memory for shard %d's state",
                                   sv->id, r.index);
                    break;
                }
                cap[k] = bytes;
            }
            a[k] = buf[k];
        }
        if (res == ZS_OK && a[0] == buf[0])
            res = zs_store_read_params(sv->store, i, a[0]);
        if (res == ZS_OK && a[1] == buf[1])
            res = zs_store_read_moments(sv->store, i, a[1], a[2]);
        if (res == ZS_OK)
            res = zs_ckpt_write_shard(sv->ckpt.step_dir, &sv->ckpt.info, r.index, r.begin, r.end,
                                      a[0], a[1], a[2], &sv->ckpt.files[i]);
    }
    for (int k = 0; k < 3; k++)
        free(buf[k]);
    if (res == ZS_OK && in_place)
        ZS_DEBUG("server %u: checkpoint %ld: %d of %d shard files completed where the NVMe tier "
                 "wrote their state",
                 sv->id, sv->ckpt.info.step, in_place, sv->n_local);
    if (res == ZS_OK && in_place && !atomic_exchange(&sv->ckpt.in_place_said, 1))
        ZS_INFO("server %u: checkpoint %ld: the NVMe tier writes the state of its shards straight "
                "into their checkpoint files (%d of %d here): it is not written twice",
                sv->id, sv->ckpt.info.step, in_place, sv->n_local);
    if (res != ZS_OK) {
        snprintf(sv->ckpt.error, sizeof sv->ckpt.error, "%s", zs_last_error());
        ckpt_unlink_files(sv, i - 1);
    }
    sv->ckpt.result = res;
    atomic_store(&sv->ckpt.finished, 1);
    uint64_t one = 1;
    if (write(sv->wake_fd, &one, sizeof one) < 0)
        ZS_DEBUG("server %u: waking the loop: %s", sv->id, strerror(errno));
    return NULL;
}

/* Whether version v is checkpointed: every interval_steps, and the last one always. */
static int ckpt_due(const server *sv, long v)
{
    int every = sv->cfg.checkpoint.interval_steps;
    return sv->cfg.checkpoint.dir[0] && (v == (long)sv->job.steps || (every > 0 && v % every == 0));
}

/* Tells the coordinator how the checkpoint went: the files, or why there are none. */
static void ckpt_report(server *sv)
{
    int n = sv->ckpt.result == ZS_OK ? sv->n_local : 0;
    Zshard__ShardFile *items = calloc((size_t)(n ? n : 1), sizeof *items);
    Zshard__ShardFile **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    uint64_t *sums = calloc((size_t)(n ? n : 1) * ZS_CKPT_ARRAYS, sizeof *sums);
    Zshard__CheckpointWritten cw = ZSHARD__CHECKPOINT_WRITTEN__INIT;
    cw.has_step = cw.has_server = 1;
    cw.step = (uint64_t)sv->ckpt.info.step;
    cw.server = sv->id;
    if (!items || !ptrs || !sums) {
        n = 0;
        cw.error = (char *)"out of memory for the report";
    } else if (sv->ckpt.result != ZS_OK) {
        cw.error = sv->ckpt.error;
    }
    for (int i = 0; i < n; i++) {
        const zs_ckpt_shard *f = &sv->ckpt.files[i];
        zshard__shard_file__init(&items[i]);
        items[i].has_shard = items[i].has_bytes = items[i].has_header_xxh3 = 1;
        items[i].shard = (uint32_t)f->index;
        items[i].file = (char *)f->file;
        items[i].bytes = f->bytes;
        items[i].header_xxh3 = f->header_xxh3;
        items[i].n_xxh3 = ZS_CKPT_ARRAYS;
        items[i].xxh3 = &sums[(size_t)i * ZS_CKPT_ARRAYS];
        memcpy(items[i].xxh3, f->xxh3, sizeof f->xxh3);
        ptrs[i] = &items[i];
    }
    cw.n_files = (size_t)n;
    cw.files = ptrs;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_CHECKPOINT_WRITTEN;
    env.checkpoint_written = &cw;
    if (send_ctrl(sv, &env) != ZS_OK)
        ZS_ERROR("server %u: reporting checkpoint %ld: %s", sv->id, sv->ckpt.info.step,
                 zs_last_error());
    free(items);
    free(ptrs);
    free(sums);
}

/* Starts writing version v (just published) on the writer thread.  A checkpoint that cannot
 * start is reported as failed: training goes on, the previous checkpoint stays. */
static void ckpt_start(server *sv, long v)
{
    sv->ckpt.info = (zs_ckpt_info){.step = v,
                                   .steps_total = (long)sv->job.steps,
                                   .run_id = sv->job.run_id,
                                   .config_fingerprint = sv->job.config_fingerprint,
                                   .data_fingerprint = sv->job.data_fingerprint,
                                   .data_ntokens = sv->job.data_ntokens,
                                   .model = sv->cfg.model,
                                   .total_floats = sv->tt.total,
                                   .shard_floats = sv->map.shard_floats};
    sv->ckpt.result = ZS_OK;
    sv->ckpt.error[0] = '\0';
    atomic_store(&sv->ckpt.finished, 0);
    zs_err e =
        zs_ckpt_step_dir(sv->cfg.checkpoint.dir, v, 1, sv->ckpt.step_dir, sizeof sv->ckpt.step_dir);
    if (e == ZS_OK && pthread_create(&sv->ckpt.thread, NULL, ckpt_main, sv) != 0)
        e = zs_error(ZS_ERR_IO, "server %u: cannot start the checkpoint writer: %s", sv->id,
                     strerror(errno));
    if (e != ZS_OK) {
        ZS_ERROR("server %u: checkpoint %ld: %s", sv->id, v, zs_last_error());
        sv->ckpt.result = e;
        snprintf(sv->ckpt.error, sizeof sv->ckpt.error, "%s", zs_last_error());
        ckpt_report(sv);
        return;
    }
    sv->ckpt.running = 1;
    ZS_DEBUG("server %u: writing checkpoint %ld to %s", sv->id, v, sv->ckpt.step_dir);
}

/* Joins a finished writer (wait: even one still writing) and reports it. */
static void ckpt_reap(server *sv, int wait)
{
    if (!sv->ckpt.running || (!wait && !atomic_load(&sv->ckpt.finished)))
        return;
    pthread_join(sv->ckpt.thread, NULL);
    sv->ckpt.running = 0;
    if (sv->ckpt.result != ZS_OK)
        ZS_ERROR("server %u: checkpoint %ld failed: %s", sv->id, sv->ckpt.info.step,
                 sv->ckpt.error);
    else
        ZS_DEBUG("server %u: checkpoint %ld written", sv->id, sv->ckpt.info.step);
    ckpt_report(sv);
    maybe_apply(sv);
}

/*
 * Where the NVMe tier writes the state of version v, if v is checkpointed: straight into its
 * step directory (made here) when that is on the tier's file system, so that the checkpoint
 * does not write those bytes again; NULL otherwise (no tier, not due, another file system --
 * said once -- or a directory that cannot be made: the checkpoint then writes the usual way,
 * and reports what failed).
 */
static const char *ckpt_in_place(server *sv, long v, char *dir, size_t n)
{
    if (!zs_store_nvme(sv->store) || !ckpt_due(sv, v) || sv->verdict_skip)
        return NULL;
    struct stat a, b;
    if (zs_ckpt_step_dir(sv->cfg.checkpoint.dir, v, 1, dir, n) != ZS_OK ||
        stat(sv->cfg.zero.nvme_path, &a) != 0 || stat(dir, &b) != 0)
        return NULL;
    if (a.st_dev != b.st_dev) {
        if (!sv->ckpt.other_fs_said)
            ZS_INFO("server %u: checkpoint.dir %s is not on the file system of nvme_path %s: "
                    "a checkpoint reads the state back from NVMe and writes it again",
                    sv->id, sv->cfg.checkpoint.dir, sv->cfg.zero.nvme_path);
        sv->ckpt.other_fs_said = 1;
        return NULL;
    }
    return dir;
}

/* The series that show the state after an apply or a new map: the version, the fetches held
 * for the next one, the replica, and what the NVMe tier read and wrote since last time. */
static void prom_state(server *sv)
{
    if (!sv->opts->prom)
        return;
    zs_prom_set(sv->prom.version, sv->store ? (double)zs_store_version(sv->store) : -1);
    zs_prom_set(sv->prom.held, sv->n_held);
    zs_prom_set(sv->prom.replica, sv->replica != NULL);
    zs_prom_set(sv->prom.replica_current, sv->replica && !zs_replica_lost(sv->replica));
    zs_nvme *nv = sv->store ? zs_store_nvme(sv->store) : NULL;
    if (nv) {
        zs_nvme_stats ns = zs_nvme_get_stats(nv);
        /* A new store (a restore) starts its counts again: count it from its zero. */
        if (ns.bytes_read < sv->prom.nvme_read_seen ||
            ns.bytes_written < sv->prom.nvme_written_seen)
            sv->prom.nvme_read_seen = sv->prom.nvme_written_seen = 0;
        zs_prom_add(sv->prom.nvme_read, ns.bytes_read - sv->prom.nvme_read_seen);
        zs_prom_add(sv->prom.nvme_written, ns.bytes_written - sv->prom.nvme_written_seen);
        sv->prom.nvme_read_seen = ns.bytes_read;
        sv->prom.nvme_written_seen = ns.bytes_written;
    }
}

/* Applies a pending verdict once no send reads the weights any more, then publishes. */
static void maybe_apply(server *sv)
{
    /* Fetches waiting for the NVMe window are for this version: served first. */
    if (!sv->verdict_pending || sv->store_sends > 0 || sv->ckpt.running || sv->n_wwait > 0 ||
        sv->win_loading > 0)
        return;
    char into[4096];
    double t0 = zs_now_s();
    zs_store_set_skipped(sv->store, sv->verdict_skipped);
    zs_err e =
        zs_store_apply_into(sv->store, sv->verdict_lr, sv->verdict_clip, sv->verdict_skip,
                            ckpt_in_place(sv, zs_store_version(sv->store) + 1, into, sizeof into));
    double dt = zs_now_s() - t0;
    zs_prom_observe(sv->prom.apply, dt);
    zs_prom_set(sv->prom.apply_last, dt);
    if (e != ZS_OK) {
        ZS_ERROR("server %u: %s", sv->id, zs_last_error());
        sv->result = e;
        sv->done = 1;
        return;
    }
    sv->verdict_pending = 0;
    sv->partials_sent = 0;
    for (int c = 0; c < sv->cfg.chunks; c++)
        sv->owner[c] = 0;
    long v = zs_store_version(sv->store);
    Zshard__VersionPublished vp = ZSHARD__VERSION_PUBLISHED__INIT;
    vp.has_server = vp.has_version = 1;
    vp.server = sv->id;
    vp.version = (uint64_t)v;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED;
    env.version_published = &vp;
    if (send_ctrl(sv, &env) != ZS_OK)
        ZS_ERROR("server %u: %s", sv->id, zs_last_error());
    ZS_DEBUG("server %u: published version %ld", sv->id, v);
    prom_state(sv);
    if (sv->replica && !zs_replica_lost(sv->replica))
        zs_store_set_skipped(zs_replica_store(sv->replica), sv->verdict_skipped);
    if (sv->replica && !zs_replica_lost(sv->replica) &&
        zs_replica_apply(sv->replica, sv->verdict_lr, sv->verdict_clip, sv->verdict_skip) != ZS_OK)
        zs_replica_lose(sv->replica, zs_last_error());
    if (ckpt_due(sv, v))
        ckpt_start(sv, v);
    /* Serve the fetches that waited for this version, keep the later ones. */
    int j = 0;
    for (int i = 0; i < sv->n_held; i++) {
        held_fetch h = sv->held[i];
        if ((long)h.frame.step == v) {
            conn_held_add(sv, h.conn, -1);
            serve_fetch(sv, h.conn, &h.frame);
        } else
            sv->held[j++] = h;
    }
    sv->n_held = j;
    /* Pushes that arrived ahead of this step's assignment can be judged once it comes. */
    drain_waiting(sv);
}

static void on_data_event(server *sv, const zs_event *ev)
{
    switch (ev->type) {
    case ZS_EV_REFUSED:
        /* Before our RegisterReply came, members are refused as "not registered yet" and try
         * again: a normal start (a worker can be told its servers first), not a warning. */
        zs_log_limited(&sv->refused_log, sv->have_key ? ZS_LOG_WARN : ZS_LOG_DEBUG,
                       "server %u: refused a connection: %s", sv->id, ev->reason);
        break;
    case ZS_EV_ACCEPT:
        ZS_DEBUG("server %u: connection from %s", sv->id, sv->ops->conn_peer(ev->conn));
        track_conn(sv, ev->conn);
        break;
    case ZS_EV_HEADER:
        if (sv->ops->conn_user(ev->conn) != CONN_DOOMED)
            on_header(sv, ev->conn, &ev->frame);
        break;
    case ZS_EV_RECV: {
        int slot = (int)(uintptr_t)ev->user - 1;
        if (slot >= 0 && slot < SCRATCH_BUFFERS) {
            if (ev->err != ZS_OK)
                zs_error(ev->err, "%s", ev->reason);
            on_push_done(sv, slot, ev->err);
        }
        break;
    }
    case ZS_EV_SEND:
        if (ev->user == COOKIE_STORE && sv->store_sends > 0) {
            sv->store_sends--;
            maybe_apply(sv);
        } else if (sv->n_win > 0 && (window_slot *)ev->user >= sv->win &&
                   (window_slot *)ev->user < sv->win + sv->n_win) {
            window_slot *w = ev->user;
            if (w->sends > 0)
                w->sends--;
            window_retry(sv);
            maybe_apply(sv);
        }
        break;
    case ZS_EV_WRITTEN: /* no region of a server's is open to remote writes: never */
        break;
    case ZS_EV_CLOSED:
        /* A peer that closes between frames is a worker leaving (every job ends so);
         * anything else -- a cut frame, a reset, a malformed header -- is worth a warning. */
        if (ev->err != ZS_OK && strstr(ev->reason, "closed by peer") &&
            !strstr(ev->reason, "closed by peer mid-"))
            ZS_INFO("server %u: %s", sv->id, ev->reason);
        else if (ev->err != ZS_OK)
            ZS_WARN("server %u: %s", sv->id, ev->reason);
        doom(sv, ev->conn);
        break;
    }
}

static void heartbeat_if_due(server *sv);

/*
 * Loads this server's ranges of the weights and moments from the checkpoint the job resumes
 * from (any boundaries: the checkpoint may have been written by another number of servers),
 * verifying every byte against the manifest's checksums, and moves the store to its version.
 */
static zs_err restore_store(server *sv, zs_store *st)
{
    zs_ckpt ck;
    ZS_CHECK(zs_ckpt_open(sv->job.resume_dir, &ck));
    zs_err res = ZS_OK;
    if (ck.info.run_id != sv->job.run_id || ck.info.step != sv->job.resume_step ||
        ck.info.config_fingerprint != sv->job.config_fingerprint ||
        ck.info.total_floats != sv->tt.total) {
        res = zs_error(ZS_ERR_FORMAT,
                       "server %u: checkpoint %s is run %016llx step %ld, the job resumes run "
                       "%016llx from step %ld (or its config or vector size differ)",
                       sv->id, sv->job.resume_dir, (unsigned long long)ck.info.run_id, ck.info.step,
                       (unsigned long long)sv->job.run_id, sv->job.resume_step);
        goto out;
    }
    for (int i = 0; i < zs_store_local_count(st) && res == ZS_OK; i++) {
        zs_shard_range r;
        float *a[ZS_CKPT_ARRAYS];
        zs_store_state(st, i, &r, &a[ZS_CKPT_PARAM], &a[ZS_CKPT_EXP_AVG], &a[ZS_CKPT_EXP_AVG_SQ]);
        /* A shard on NVMe (its moments there, and perhaps its weights) is read into RAM here and
         * written to the tier at once. */
        size_t len = r.end - r.begin;
        int tiered = !a[ZS_CKPT_EXP_AVG];
        float *tmp = tiered ? malloc(3 * len * sizeof *tmp) : NULL;
        if (tiered && !tmp) {
            res = zs_error(ZS_ERR_NOMEM, "server %u: out of memory for shard %d's state", sv->id,
                           r.index);
            break;
        }
        for (int k = 0; tiered && k < ZS_CKPT_ARRAYS; k++)
            if (!a[k])
                a[k] = tmp + (size_t)k * len;
        for (int k = 0; k < ZS_CKPT_ARRAYS && res == ZS_OK; k++)
            res = zs_ckpt_read(&ck, (zs_ckpt_array)k, r.begin, r.end, a[k]);
        if (res == ZS_OK && tiered)
            res = zs_store_write_state(st, i, a[ZS_CKPT_PARAM], a[ZS_CKPT_EXP_AVG],
                                       a[ZS_CKPT_EXP_AVG_SQ]);
        free(tmp);
        heartbeat_if_due(sv);
    }
    if (res == ZS_OK) {
        zs_store_restored(st, sv->job.resume_step);
        ZS_INFO("server %u: restored %d %sshards from %s (step %ld)", sv->id,
                zs_store_local_count(st), st == sv->store ? "" : "replica ", sv->job.resume_dir,
                sv->job.resume_step);
    }
out:
    zs_ckpt_close(&ck);
    return res;
}

/*
 * Drops the shards and all that refers to them -- every data-plane connection (their
 * requests were for the old map), held fetches, waiting pushes, registrations, the stores --
 * so that setup_shards can build them again from a new map.  A checkpoint being written is
 * finished first and not reported: the coordinator abandoned it.  With keep (a Restore from
 * memory) the store and the replica's (once its apply finished; not a replica given up) are
 * kept as old_store and old_replica for setup_shards to build the new ones from.
 */
static void teardown_shards(server *sv, int keep)
{
    if (sv->ckpt.running) {
        pthread_join(sv->ckpt.thread, NULL);
        sv->ckpt.running = 0;
    }
    if (keep) {
        zs_store_free(sv->old_store);
        zs_store_free(sv->old_replica);
        sv->old_store = sv->store;
        sv->store = NULL;
        sv->old_replica = zs_replica_release(sv->replica);
    } else {
        zs_replica_free(sv->replica);
    }
    sv->replica = NULL;
    while (sv->n_conns > 0) {
        zs_conn *c = sv->conns[sv->n_conns - 1];
        forget_conn(sv, c);
        sv->ops->conn_close(c);
    }
    sv->n_doomed = 0;
    sv->n_held = 0;
    sv->n_waiting = 0;
    sv->store_sends = 0;
    sv->verdict_pending = 0;
    sv->partials_sent = 0;
    for (int i = 0; i < SCRATCH_BUFFERS; i++) {
        if (sv->pool[i].mr)
            sv->ops->dereg_mr(sv->pool[i].mr);
        free(sv->pool[i].buf);
        sv->pool[i] = (scratch){0};
    }
    window_reader_stop(sv);
    for (int k = 0; k < sv->n_win; k++) {
        if (sv->win[k].mr)
            sv->ops->dereg_mr(sv->win[k].mr);
        free(sv->win[k].buf);
    }
    free(sv->win);
    sv->win = NULL;
    sv->n_win = 0;
    sv->n_wwait = 0;
    zs_mr **mrs[] = {sv->mr_f32, sv->mr_half, sv->mr_m, sv->mr_v};
    for (int k = 0; k < 4; k++) {
        for (int i = 0; mrs[k] && i < sv->n_local; i++)
            if (mrs[k][i])
                sv->ops->dereg_mr(mrs[k][i]);
        free(mrs[k]);
    }
    zs_store_free(sv->store);
    sv->store = NULL;
    free(sv->local);
    free(sv->owner);
    free(sv->ckpt.files);
    sv->local = NULL;
    sv->mr_f32 = sv->mr_half = sv->mr_m = sv->mr_v = NULL;
    sv->owner = NULL;
    sv->ckpt.files = NULL;
    sv->n_local = 0;
    if (sv->have_map)
        zs_shardmap_free(&sv->map);
    sv->have_map = 0;
}

/* Initializes a new store as the job starts: from the checkpoint it resumes from, the --init
 * weights (full), or the seed, shard by shard with heartbeats in between (a server with many or
 * large shards may take longer than the heartbeat timeout to initialize them all). */
static zs_err init_store(server *sv, zs_store *st, const float *full)
{
    if (sv->job.resume_step > 0)
        return restore_store(sv, st);
    if (full)
        return zs_store_load(st, full);
    for (int i = 0; i < zs_store_local_count(st); i++) {
        ZS_CHECK(zs_store_init_seed_shard(st, i, sv->cfg.seed));
        heartbeat_if_due(sv);
    }
    return ZS_OK;
}

/*
 * A store of the given shards at memory_version, assembled from the old store and the old
 * replica (a Restore from memory).  A shard in neither gets zeroed arrays and its index in
 * todo[*n_todo] (todo NULL: that is an error, every shard must be here).
 */
static zs_err assemble(server *sv, const zs_shard_range *r, int n, int *todo, int *n_todo,
                       zs_store **out)
{
    ZS_CHECK(zs_store_create_empty(&sv->tt, &sv->cfg, r, n, sv->opts->threads, out));
    zs_store *from[2] = {sv->old_store, sv->old_replica};
    zs_err res = ZS_OK;
    for (int i = 0; i < n && res == ZS_OK; i++) {
        zs_store *src = NULL;
        int j = -1;
        for (int k = 0; k < 2 && !src; k++)
            if (from[k] && (j = zs_store_find(from[k], r[i].index)) >= 0)
                src = from[k];
        if (src && zs_store_version(src) != sv->memory_version)
            res = zs_error(ZS_ERR_INTERNAL,
                           "server %u: restore from memory at version %ld, but the %s here is at "
                           "version %ld",
                           sv->id, sv->memory_version, src == sv->old_replica ? "replica" : "state",
                           zs_store_version(src));
        else if (src)
            res = zs_store_move(*out, i, src, j);
        else if (todo) {
            todo[(*n_todo)++] = i;
            res = zs_store_alloc(*out, i);
        } else
            res = zs_error(ZS_ERR_INTERNAL,
                           "server %u: restore from memory: shard %d is neither here nor in the "
                           "replica here",
                           sv->id, r[i].index);
    }
    zs_store_set_version(*out, sv->memory_version);
    if (res != ZS_OK) {
        zs_store_free(*out);
        *out = NULL;
    }
    return res;
}

/* The shards of the map whose replica this server holds (*n of them, none: *n 0). */
static zs_err replica_ranges(server *sv, zs_shard_range **out, int *n)
{
    *out = NULL;
    *n = 0;
    int me = zs_shardmap_server_index(&sv->map, sv->id);
    int count = 0;
    for (int p = 0; p < sv->map.n_servers; p++)
        if (zs_shardmap_replica(&sv->map, p) == me && p != me)
            count += sv->map.server_first[p + 1] - sv->map.server_first[p];
    if (count == 0)
        return ZS_OK;
    zs_shard_range *r = calloc((size_t)count, sizeof *r);
    if (!r)
        return zs_error(ZS_ERR_NOMEM, "server %u: out of memory", sv->id);
    /* In vector order, as a store wants them. */
    for (int i = 0, k = 0; i < sv->map.n_shards; i++) {
        int p = sv->map.shards[i].server;
        if (zs_shardmap_replica(&sv->map, p) == me && p != me)
            r[k++] = (zs_shard_range){i, sv->map.shards[i].begin, sv->map.shards[i].end};
    }
    *out = r;
    *n = count;
    return ZS_OK;
}

/* How long a replica load may take: its servers are rebuilding their own stores meanwhile. */
static int replica_load_ms(const server *sv)
{
    int t = 4 * sv->cfg.cluster.heartbeat_timeout_ms;
    return t > 10000 ? t : 10000;
}

/*
 * The replica this server holds in the map, if any: as the job starts, initialized like its
 * original (full: the --init weights); after a failover, made of what this server holds
 * already and the rest fetched from the shards' servers by a load.
 */
static zs_err setup_replica(server *sv, const float *full)
{
    zs_shard_range *r;
    int n;
    ZS_CHECK(replica_ranges(sv, &r, &n));
    if (n == 0)
        return ZS_OK;
    zs_store *st = NULL;
    int *todo = NULL, n_todo = 0;
    zs_err res;
    if (!sv->from_memory) {
        res = zs_store_create(&sv->tt, &sv->cfg, r, n, sv->opts->threads, &st);
        if (res == ZS_OK)
            res = init_store(sv, st, full);
    } else {
        todo = malloc((size_t)n * sizeof *todo);
        res = todo ? assemble(sv, r, n, todo, &n_todo, &st)
                   : zs_error(ZS_ERR_NOMEM, "server %u: out of memory", sv->id);
    }
    if (res == ZS_OK)
        res = zs_replica_new(st, &sv->replica);
    if (res == ZS_OK) {
        zs_replica_set_wake(sv->replica, sv->wake_fd);
        zs_replica_set_transport(sv->replica, &sv->conn_opts);
    }
    if (res != ZS_OK) {
        zs_store_free(st);
    } else if (n_todo > 0) {
        ZS_INFO("server %u: replica of %d shards, %d of them to fetch at version %ld", sv->id, n,
                n_todo, sv->memory_version);
        zs_auth self = {.member = sv->id};
        zs_token_of(sv->data_key, sv->id, self.token);
        zs_err le = zs_replica_load(sv->replica, &sv->map, sv->endpoint_list, &self,
                                    sv->memory_version, todo, n_todo, replica_load_ms(sv));
        zs_wipe(self.token, sizeof self.token);
        if (le != ZS_OK)
            zs_replica_lose(sv->replica, zs_last_error());
    } else {
        ZS_INFO("server %u: replica of %d shards", sv->id, n);
    }
    free(todo);
    free(r);
    return res;
}

/*
 * Creates the store of the local shards, saying so before allocating anything if they cannot
 * fit.  In RAM: fp32 weights, both moments, the accumulator and the 16-bit copy (18 bytes a
 * float), as much again for a replica (shards are balanced), and the --init vector while it is
 * read.  With offload_optimizer.device "nvme", the weights, accumulator and 16-bit copy (10 bytes
 * a float) and the tier's slots must fit the memory budget (cluster.server_memory_bytes, else
 * what the limits leave); the moments of the first shards stay in RAM as far as the rest of the
 * budget goes, and the others' live on NVMe.
 */
static zs_err create_store(server *sv, int count)
{
    uint64_t floats = 0, biggest = 0;
    for (int i = 0; i < count; i++) {
        uint64_t len = sv->local[i].end - sv->local[i].begin;
        floats += len;
        biggest = len > biggest ? len : biggest;
    }
    uint64_t init = sv->job.resume_step == 0 && sv->opts->init_dir ? sv->tt.total * 4 : 0;
    uint64_t budget = sv->cfg.cluster.server_memory_bytes;
    char who[32], what[160], source[64] = "cluster.server_memory_bytes";
    snprintf(who, sizeof who, "server %u", sv->id);
    if (!budget)
        zs_mem_available(&budget, source, sizeof source);
    char t1[32], t2[32];
    if (sv->cfg.zero.optimizer != ZS_OFFLOAD_NVME) {
        uint64_t need = floats * 18 * (sv->cfg.checkpoint.replicas > 0 ? 2 : 1) + init;
        snprintf(what, sizeof what, "%d shards (weights, moments, gradients%s)", count,
                 sv->cfg.checkpoint.replicas > 0 ? " and a replica" : "");
        if (sv->cfg.cluster.server_memory_bytes && need > budget)
            return zs_error(ZS_ERR_NOMEM,
                            "%s: %s need %s, more than cluster.server_memory_bytes %s; "
                            "zero_optimization.offload_optimizer.device \"nvme\" keeps the "
                            "moments that do not fit on a local disk",
                            who, what, zs_mem_text(need, t1, sizeof t1),
                            zs_mem_text(budget, t2, sizeof t2));
        ZS_CHECK(zs_mem_check(who, what, need));
        return zs_store_create(&sv->tt, &sv->cfg, sv->local, count, sv->opts->threads, &sv->store);
    }
    /* The directory is checked even when every moment fits in RAM: a mistake in it should not
     * wait for the first job that needs it. */
    struct stat dst;
    if (stat(sv->cfg.zero.nvme_path, &dst) != 0 || !S_ISDIR(dst.st_mode))
        return zs_error(ZS_ERR_INVALID, "%s: zero_optimization.offload_optimizer.nvme_path %s: %s",
                        who, sv->cfg.zero.nvme_path,
                        access(sv->cfg.zero.nvme_path, F_OK) != 0 ? strerror(errno)
                                                                  : "not a directory");
    /* Workers that fetch the 16-bit copy never read the fp32 master weights, which then go to
     * NVMe with the moments: 6 bytes a float stay in RAM instead of 10.  With offload_param the
     * copy workers fetch goes there too (the weights themselves in an fp32 job), and 4 bytes a
     * float stay: the gradients. */
    int published = sv->cfg.zero.param == ZS_OFFLOAD_NVME;
    int half = fetched_copy(sv) == ZS_STORE_HALF;
    int master = half || published;
    uint64_t slots = zs_store_tier_ram(
        sv->local, count, ZS_STORE_TIER_MASTER * master | ZS_STORE_TIER_PUBLISHED * published,
        half);
    if (published) /* the window's slots */
        slots += (uint64_t)sv->cfg.zero.param_buffers * (biggest + 1) * (half ? 2 : 4);
    uint64_t fixed = 4 + (master ? 0 : 4) + (published ? 0 : 2); /* bytes a float, every shard */
    uint64_t per_resident = 8 + (master ? 4 : 0) + (published ? 2 : 0);
    uint64_t base = floats * fixed + slots + init;
    const char *on_nvme = published ? "moments, fp32 weights and published copy"
                          : master  ? "moments and fp32 weights"
                                    : "moments";
    if (base > budget)
        return zs_error(ZS_ERR_NOMEM,
                        "%s: %d shards need %s of RAM even with their %s on NVMe (%s and the "
                        "NVMe slots), but %s gives %s",
                        who, count, zs_mem_text(base, t1, sizeof t1), on_nvme,
                        published ? "gradients"
                        : master  ? "gradients, the 16-bit copy"
                                  : "weights, gradients, the 16-bit copy",
                        source, zs_mem_text(budget, t2, sizeof t2));
    uint64_t kept = 0;
    int resident = 0;
    while (resident < count) {
        uint64_t m = (sv->local[resident].end - sv->local[resident].begin) * per_resident;
        if (kept + m > budget - base)
            break;
        kept += m;
        resident++;
    }
    snprintf(what, sizeof what, "%d shards (weights, gradients, the moments of %d of them)", count,
             resident);
    ZS_CHECK(zs_mem_check(who, what, base + kept));
    if (budget == UINT64_MAX)
        snprintf(source, sizeof source, "no limit known");
    ZS_INFO("%s: AdamW moments%s of %d of %d shards on NVMe in %s (%s), %d in RAM; RAM budget %s "
            "(%s)",
            who,
            published ? ", fp32 master weights and the copy workers fetch"
            : master  ? " and fp32 master weights"
                      : "",
            count - resident, count, sv->cfg.zero.nvme_path,
            zs_mem_text(floats * per_resident - kept, t1, sizeof t1), resident,
            budget == UINT64_MAX ? "unlimited" : zs_mem_text(budget, t2, sizeof t2), source);
    zs_nvme_opts o = {.dir = sv->cfg.zero.nvme_path,
                      .block_bytes = sv->cfg.aio.block_size,
                      .queue_depth = sv->cfg.aio.queue_depth,
                      .owner = who,
                      .threads = sv->opts->threads};
    return zs_store_create_tiered(&sv->tt, &sv->cfg, sv->local, count, sv->opts->threads, resident,
                                  published ? ZS_STORE_TIER_PUBLISHED
                                  : master  ? ZS_STORE_TIER_MASTER
                                            : 0,
                                  &o, &sv->store);
}

/* Sets up the shards of this server once both the job spec and the shard map are in. */
static zs_err setup_shards(server *sv)
{
    int s = zs_shardmap_server_index(&sv->map, sv->id);
    int count = 0;
    const int *mine = zs_shardmap_server_shards(&sv->map, s, &count);
    if (s < 0 || count == 0)
        return zs_error(ZS_ERR_INVALID, "server %u: the shard map gives this server no shard",
                        sv->id);
    if (sv->map.total != sv->tt.total)
        return zs_error(ZS_ERR_INVALID,
                        "server %u: the shard map covers %zu floats, the job's "
                        "vector has %zu",
                        sv->id, sv->map.total, sv->tt.total);
    sv->n_local = count;
    sv->local = calloc((size_t)count, sizeof *sv->local);
    sv->mr_f32 = calloc((size_t)count, sizeof *sv->mr_f32);
    sv->mr_half = calloc((size_t)count, sizeof *sv->mr_half);
    sv->mr_m = calloc((size_t)count, sizeof *sv->mr_m);
    sv->mr_v = calloc((size_t)count, sizeof *sv->mr_v);
    sv->owner = calloc((size_t)sv->cfg.chunks, sizeof *sv->owner);
    sv->ckpt.files = calloc((size_t)count, sizeof *sv->ckpt.files);
    if (!sv->local || !sv->mr_f32 || !sv->mr_half || !sv->mr_m || !sv->mr_v || !sv->owner ||
        !sv->ckpt.files)
        return zs_error(ZS_ERR_NOMEM, "server %u: out of memory", sv->id);
    for (int i = 0; i < count; i++) {
        const zs_shard *sh = &sv->map.shards[mine[i]];
        sv->local[i] = (zs_shard_range){mine[i], sh->begin, sh->end};
    }
    if (sv->from_memory) {
        ZS_CHECK(assemble(sv, sv->local, count, NULL, NULL, &sv->store));
        ZS_CHECK(setup_replica(sv, NULL));
        zs_store_free(sv->old_store);
        zs_store_free(sv->old_replica);
        sv->old_store = sv->old_replica = NULL;
        ZS_INFO("server %u: restored from memory at version %ld", sv->id, sv->memory_version);
    } else {
        ZS_CHECK(create_store(sv, count));
        float *full = NULL;
        if (sv->job.resume_step == 0 && sv->opts->init_dir) {
            full = malloc(sv->tt.total * sizeof *full);
            if (!full)
                return zs_error(ZS_ERR_NOMEM, "server %u: out of memory for the checkpoint",
                                sv->id);
            char path[4096];
            snprintf(path, sizeof path, "%s/model.safetensors", sv->opts->init_dir);
            zs_err e = zs_modelfile_load_weights(&sv->tt, path, full);
            if (e != ZS_OK) {
                free(full);
                return e;
            }
        }
        zs_err e = init_store(sv, sv->store, full);
        if (e == ZS_OK)
            e = setup_replica(sv, full);
        free(full);
        ZS_CHECK(e);
    }
    size_t biggest = 0;
    for (int i = 0; i < count; i++) {
        size_t len = sv->local[i].end - sv->local[i].begin;
        zs_shard_range r;
        float *param, *m, *v;
        const void *half;
        zs_store_state(sv->store, i, &r, &param, &m, &v);
        if (param) /* weights on NVMe: fetches are served from the window, or refused */
            ZS_CHECK(sv->ops->reg_mr(sv->net, param, len * 4, ZS_MR_SEND, &sv->mr_f32[i]));
        if (zs_store_locate(sv->store, sv->local[i].begin, len, ZS_STORE_HALF, &half) ==
            ZS_STORE_OK)
            ZS_CHECK(sv->ops->reg_mr(sv->net, (void *)half, len * 2, ZS_MR_SEND, &sv->mr_half[i]));
        if (m) { /* moments on NVMe are not served to peers (replicas need them in RAM) */
            ZS_CHECK(sv->ops->reg_mr(sv->net, m, len * 4, ZS_MR_SEND, &sv->mr_m[i]));
            ZS_CHECK(sv->ops->reg_mr(sv->net, v, len * 4, ZS_MR_SEND, &sv->mr_v[i]));
        }
        biggest = len > biggest ? len : biggest;
    }
    if (sv->replica) {
        zs_store *rs = zs_replica_store(sv->replica);
        for (int i = 0; i < zs_store_local_count(rs); i++) {
            zs_shard_range r;
            zs_store_params(rs, i, &r);
            biggest = r.end - r.begin > biggest ? r.end - r.begin : biggest;
        }
    }
    if (sv->cfg.zero.param == ZS_OFFLOAD_NVME) {
        /* The window: slots of the largest shard in the fetched dtype (a 16-bit copy is read in
         * whole pairs, so one element more). */
        size_t bytes = (biggest + 1) * (fetched_copy(sv) == ZS_STORE_HALF ? 2 : 4);
        sv->win = calloc((size_t)sv->cfg.zero.param_buffers, sizeof *sv->win);
        if (!sv->win)
            return zs_error(ZS_ERR_NOMEM, "server %u: out of memory for the NVMe window", sv->id);
        sv->n_win = sv->cfg.zero.param_buffers;
        for (int k = 0; k < sv->n_win; k++) {
            sv->win[k].shard = -1;
            if (posix_memalign(&sv->win[k].buf, 4096, bytes) != 0) {
                sv->win[k].buf = NULL;
                return zs_error(ZS_ERR_NOMEM, "server %u: out of memory for the NVMe window",
                                sv->id);
            }
            ZS_CHECK(sv->ops->reg_mr(sv->net, sv->win[k].buf, bytes, ZS_MR_SEND, &sv->win[k].mr));
        }
        ZS_CHECK(window_reader_start(sv));
    }
    for (int i = 0; i < SCRATCH_BUFFERS; i++) {
        if (!(sv->pool[i].buf = malloc(biggest * sizeof(float))))
            return zs_error(ZS_ERR_NOMEM, "server %u: out of memory for push buffers", sv->id);
        ZS_CHECK(sv->ops->reg_mr(sv->net, sv->pool[i].buf, biggest * sizeof(float), ZS_MR_RECV,
                                 &sv->pool[i].mr));
    }
    ZS_INFO("server %u: %d shards, %zu floats, at %s", sv->id, count, sv->map.server_floats[s],
            sv->endpoint);
    zs_prom_set(sv->prom.shards, count);
    zs_prom_set(sv->prom.shard_bytes, (double)sv->map.server_floats[s] * sizeof(float));
    prom_state(sv);
    Zshard__Ready r = ZSHARD__READY__INIT;
    r.what_case = ZSHARD__READY__WHAT_VERSION;
    r.version = (uint64_t)zs_store_version(sv->store);
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_READY;
    env.ready = &r;
    ZS_CHECK(send_ctrl(sv, &env));
    if (sv->from_memory && sv->rewrite_ckpt) {
        /* The lost server never wrote its part of this version's checkpoint: all write it
         * again (the same bytes where a file exists already). */
        ckpt_start(sv, sv->memory_version);
    }
    sv->from_memory = sv->rewrite_ckpt = 0;
    return ZS_OK;
}

/* The data-plane addresses of the map's servers, by map index (replica loads connect to them). */
static zs_err keep_endpoints(server *sv, const Zshard__ShardMap *m)
{
    free(sv->endpoints);
    free(sv->endpoint_list);
    sv->endpoints = calloc(m->n_servers, sizeof *sv->endpoints);
    sv->endpoint_list = calloc(m->n_servers, sizeof *sv->endpoint_list);
    if (!sv->endpoints || !sv->endpoint_list)
        return zs_error(ZS_ERR_NOMEM, "server %u: out of memory", sv->id);
    for (size_t s = 0; s < m->n_servers; s++) {
        snprintf(sv->endpoints[s], sizeof sv->endpoints[s], "%s", m->servers[s]->endpoint);
        sv->endpoint_list[s] = sv->endpoints[s];
    }
    return ZS_OK;
}

static void on_ctrl(server *sv, const Zshard__Envelope *env)
{
    zs_err e = ZS_OK;
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY: {
        const Zshard__RegisterReply *r = env->registration_reply;
        if (r->outcome_case != ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID) {
            sv->told_to_stop = 1;
            sv->result = zs_error(ZS_ERR_INVALID,
                                  "server: the coordinator refused "
                                  "registration: %s",
                                  r->refusal);
            sv->done = 1;
            return;
        }
        /* A new coordinator (restarted) has a new data key: the connections made under the
         * old one belong to ids it no longer knows. */
        if (sv->have_key && !zs_bytes_equal(sv->data_key, r->data_key.data, ZS_TOKEN_BYTES))
            for (int i = 0; i < sv->n_conns; i++)
                doom(sv, sv->conns[i]);
        memcpy(sv->data_key, r->data_key.data, ZS_TOKEN_BYTES);
        sv->have_key = 1;
        sv->id = r->assigned_id;
        ZS_INFO("server: registered as %u", sv->id);
        return;
    }
    case ZSHARD__ENVELOPE__BODY_MEMBER_GONE:
        member_gone(sv, env->member_gone->member);
        return;
    case ZSHARD__ENVELOPE__BODY_JOB_SPEC:
        if (sv->have_job)
            return;
        e = zs_msg_jobspec_to_config(env->job_spec, &sv->cfg, &sv->tt, &sv->job);
        sv->have_job = e == ZS_OK;
        break;
    case ZSHARD__ENVELOPE__BODY_RESTORE: {
        /* The next ShardMap (set up below once it is in) loads this version. */
        const Zshard__Restore *rs = env->restore;
        if (!sv->have_job)
            return;
        if (rs->has_from_memory && rs->from_memory) {
            ZS_WARN("server %u: restore from memory at version %llu, a new shard map follows",
                    sv->id, (unsigned long long)rs->version);
            if (!sv->store || sv->verdict_pending ||
                zs_store_version(sv->store) != (long)rs->version) {
                e = zs_error(ZS_ERR_INVALID,
                             "server %u: cannot restore from memory at version %llu: this "
                             "server is %s",
                             sv->id, (unsigned long long)rs->version,
                             !sv->store            ? "not set up"
                             : sv->verdict_pending ? "applying a step"
                                                   : "at another version");
                break;
            }
            teardown_shards(sv, 1);
            sv->from_memory = 1;
            sv->rewrite_ckpt = rs->has_checkpoint && rs->checkpoint;
            sv->memory_version = (long)rs->version;
            return;
        }
        ZS_WARN("server %u: restore: back to version %llu (%s), a new shard map follows", sv->id,
                (unsigned long long)rs->version,
                rs->step_dir[0] ? rs->step_dir : "the job's start");
        teardown_shards(sv, 0);
        sv->from_memory = 0;
        sv->job.resume_step = (long)rs->version;
        snprintf(sv->job.resume_dir, sizeof sv->job.resume_dir, "%s", rs->step_dir);
        return;
    }
    case ZSHARD__ENVELOPE__BODY_SHARD_MAP:
        if (sv->have_map)
            return;
        e = zs_shardmap_from_msg(env->shard_map, &sv->map);
        sv->have_map = e == ZS_OK;
        if (e == ZS_OK)
            e = keep_endpoints(sv, env->shard_map);
        break;
    case ZSHARD__ENVELOPE__BODY_STEP_ASSIGN: {
        const Zshard__StepAssign *a = env->step_assign;
        if (!sv->store || (long)a->step != zs_store_version(sv->store))
            return;
        for (size_t i = 0; i < a->n_chunks; i++)
            if (a->chunks[i] < (uint32_t)sv->cfg.chunks)
                sv->owner[a->chunks[i]] = a->worker;
        drain_waiting(sv);
        return;
    }
    case ZSHARD__ENVELOPE__BODY_CLIP_VERDICT: {
        const Zshard__ClipVerdict *v = env->clip_verdict;
        if (!sv->store || (long)v->step != zs_store_version(sv->store) || !sv->partials_sent)
            return;
        sv->verdict_pending = 1;
        /* fp16 jobs: the gradient is divided by the step's loss scale inside AdamW's factor,
         * (clip / scale) / C, as zshard train computes it; the learning rate and AdamW's t
         * follow the optimizer step (skipped steps do not advance them, as in DeepSpeed). */
        long opt = v->has_optimizer_step ? (long)v->optimizer_step : (long)v->step;
        sv->verdict_clip = v->clip_factor / (v->has_loss_scale ? v->loss_scale : 1.0);
        sv->verdict_skip = v->skip;
        sv->verdict_lr = zs_config_lr(&sv->cfg, (int)opt);
        sv->verdict_skipped = (long)v->step - opt;
        ZS_DEBUG("server %u: verdict for step %llu (clip %g); %ld sends in flight", sv->id,
                 (unsigned long long)v->step, v->clip_factor, sv->store_sends);
        maybe_apply(sv);
        return;
    }
    case ZSHARD__ENVELOPE__BODY_SHUTDOWN:
        sv->told_to_stop = 1;
        ZS_INFO("server %u: shutdown: %s", sv->id,
                env->shutdown->reason ? env->shutdown->reason : "");
        if (env->shutdown->kind == ZSHARD__SHUTDOWN_KIND__SHUTDOWN_ABORT)
            sv->result = zs_error(ZS_ERR_INVALID, "server %u: the job was aborted: %s", sv->id,
                                  env->shutdown->reason ? env->shutdown->reason : "");
        sv->done = 1;
        return;
    case ZSHARD__ENVELOPE__BODY_ERROR:
        ZS_WARN("server %u: coordinator error: %s", sv->id, env->error->text);
        if (sv->id && env->error->code == ZSHARD__ERROR_CODE__ERROR_NOT_REGISTERED) {
            /* A coordinator that does not know our id is not the one we joined: it was
             * restarted, and its job has other servers (or will restore from a checkpoint). */
            sv->told_to_stop = 1;
            sv->result = zs_error(ZS_ERR_INVALID,
                                  "server %u: the coordinator does not know this server (it "
                                  "was restarted?): %s",
                                  sv->id, env->error->text);
            sv->done = 1;
        }
        return;
    case ZSHARD__ENVELOPE__BODY_HEARTBEAT:
        return; /* the coordinator lives (last_coord_ms) */
    default:
        ZS_WARN("server %u: unexpected %s from the coordinator", sv->id,
                zs_msg_body_name(env->body_case));
        return;
    }
    if (e == ZS_OK && sv->have_job && sv->have_map && !sv->store)
        e = setup_shards(sv);
    if (e != ZS_OK) {
        ZS_ERROR("server: %s", zs_last_error());
        sv->result = e;
        sv->done = 1;
    }
}

static void send_heartbeat(server *sv);

/* Sends a heartbeat if the interval has passed since the last one. */
static void heartbeat_if_due(server *sv)
{
    uint64_t t = now_ms(sv);
    uint64_t every = sv->have_job ? (uint64_t)sv->cfg.cluster.heartbeat_interval_ms : 500;
    if (sv->id && t - sv->last_heartbeat_ms >= every) {
        send_heartbeat(sv);
        sv->last_heartbeat_ms = t;
    }
}

static void send_heartbeat(server *sv)
{
    Zshard__Heartbeat h = ZSHARD__HEARTBEAT__INIT;
    h.has_sender = h.has_step = 1;
    h.sender = sv->id;
    h.step = sv->store ? (uint64_t)zs_store_version(sv->store) : 0;
    /* The chunks of the step in hand we hold in full (and in the replica we keep). */
    uint32_t *in =
        sv->store ? malloc((size_t)(sv->cfg.chunks > 0 ? sv->cfg.chunks : 1) * sizeof *in) : NULL;
    size_t n_in = 0;
    const zs_store *rep =
        sv->replica && !zs_replica_lost(sv->replica) ? zs_replica_store(sv->replica) : NULL;
    for (int c = 0;
         in && !sv->verdict_pending && sv->cfg.chunks <= MAX_CHUNKS_IN && c < sv->cfg.chunks; c++)
        if (zs_store_chunk_complete(sv->store, c) && (!rep || zs_store_chunk_complete(rep, c)))
            in[n_in++] = (uint32_t)c;
    h.n_chunks_in = n_in;
    h.chunks_in = in;
    h.has_chunks_listed = 1;
    h.chunks_listed = in && !sv->verdict_pending && sv->cfg.chunks <= MAX_CHUNKS_IN;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &h;
    if (send_ctrl(sv, &env) != ZS_OK)
        ZS_WARN("server %u: heartbeat: %s", sv->id, zs_last_error());
    free(in);
}

void zs_server_close(zs_server *sv)
{
    if (!sv)
        return;
    /* A checkpoint being written is finished (its files are complete or removed), not cut. */
    if (sv->ckpt.running) {
        pthread_join(sv->ckpt.thread, NULL);
        sv->ckpt.running = 0;
    }
    free(sv->ckpt.files);
    window_reader_stop(sv);       /* before the window and the store go */
    zs_replica_free(sv->replica); /* waits for its thread */
    zs_store_free(sv->old_store);
    zs_store_free(sv->old_replica);
    if (sv->net)
        sv->ops->close(sv->net); /* frees listener, connections and registrations */
    for (int i = 0; i < SCRATCH_BUFFERS; i++)
        free(sv->pool[i].buf);
    for (int k = 0; k < sv->n_win; k++) /* their registrations went with the net */
        free(sv->win[k].buf);
    free(sv->win);
    zs_store_free(sv->store);
    if (sv->have_map)
        zs_shardmap_free(&sv->map);
    if (sv->have_job)
        zs_tensors_free(&sv->tt);
    zs_ctrl_close(sv->ctrl);
    if (sv->wake_fd >= 0)
        close(sv->wake_fd);
    free(sv->local);
    free(sv->mr_f32);
    free(sv->mr_half);
    free(sv->mr_m);
    free(sv->mr_v);
    free(sv->endpoints);
    free(sv->endpoint_list);
    free(sv->owner);
    free(sv->held);
    free(sv->wwait);
    free(sv->waiting);
    free(sv->doomed);
    free(sv->conns);
    free(sv->gone);
    zs_wipe(sv->data_key, sizeof sv->data_key);
    free(sv);
}

/* The backend served: opts->transport, where "auto" is rdma on a host with an RDMA device. */
static zs_err choose_transport(server *sv)
{
    const char *t = sv->opts->transport ? sv->opts->transport : "auto";
    char why[160] = "";
    if (strcmp(t, "auto") == 0) {
        sv->ops = zs_rdma_available(why, sizeof why) ? &zs_rdma_ops : &zs_tcp_ops;
        if (sv->ops == &zs_tcp_ops)
            ZS_DEBUG("server: data plane over tcp (%s)", why);
    } else if (!(sv->ops = zs_transport_find(t))) {
        return zs_error(ZS_ERR_INVALID, "server: transport \"%s\" is not tcp, rdma, shm or auto",
                        t);
    }
    sv->rdma =
        (zs_rdma_conn_opts){.device = sv->opts->rdma_device,
                            .port = sv->opts->rdma_port,
                            .gid_index = sv->opts->rdma_gid_set ? sv->opts->rdma_gid_index : -1};
    sv->conn_opts = (zs_conn_opts){.ops = sv->ops};
    if (sv->ops == &zs_rdma_ops) {
        sv->conn_opts.backend = &sv->rdma;
        sv->conn_opts.backend_name = "rdma";
    }
    ZS_INFO("server: data plane over %s", sv->ops->name);
    return ZS_OK;
}

/* Registers the server's series in opts->prom (docs/observability.md lists them). */
static zs_err prom_setup(server *sv)
{
    zs_prom *r = sv->opts->prom;
    if (!r)
        return ZS_OK;
    const zs_prom_def defs[] = {
        {&sv->prom.version, 1, "zshard_server_version",
         "Version (step) of the parameters published (-1: none yet)"},
        {&sv->prom.shards, 1, "zshard_server_shards", "Shards of the flat parameter vector held"},
        {&sv->prom.shard_bytes, 1, "zshard_server_shard_bytes",
         "Bytes of fp32 parameters held (shards' size)"},
        {&sv->prom.held, 1, "zshard_server_held_fetches",
         "Fetches held for the next version, after the last apply"},
        {&sv->prom.fetches, 0, "zshard_server_fetches_total",
         "Fetch replies sent (parameters served)"},
        {&sv->prom.fetch_bytes, 0, "zshard_server_fetched_bytes_total",
         "Payload bytes of the fetch replies sent"},
        {&sv->prom.pushes, 0, "zshard_server_pushes_total", "Gradient pushes received whole"},
        {&sv->prom.push_bytes, 0, "zshard_server_pushed_bytes_total",
         "Payload bytes of the gradient pushes received"},
        {&sv->prom.apply_last, 1, "zshard_server_apply_last_seconds",
         "Duration of the last optimizer apply (AdamW)"},
        {&sv->prom.replica, 1, "zshard_server_replica",
         "1 if this server holds another server's replica"},
        {&sv->prom.replica_current, 1, "zshard_server_replica_current",
         "1 if the replica held here is current (not given up)"},
        {&sv->prom.nvme_read, 0, "zshard_server_nvme_read_bytes_total", "Bytes the NVMe tier read"},
        {&sv->prom.nvme_written, 0, "zshard_server_nvme_written_bytes_total",
         "Bytes the NVMe tier wrote"},
    };
    ZS_CHECK(zs_prom_register(r, defs, (int)(sizeof defs / sizeof defs[0])));
    static const double apply_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                          0.1,    0.25,  0.5,    1,     2.5,  5,     10};
    sv->prom.apply =
        zs_prom_histogram(r, "zshard_server_apply_seconds",
                          "Duration of an optimizer apply (AdamW over the shards held)", NULL,
                          apply_bounds, (int)(sizeof apply_bounds / sizeof apply_bounds[0]));
    if (!sv->prom.apply)
        return ZS_ERR_INVALID;
    /* The reasons a data-plane request is refused, as the wire names them (transport/frame.h). */
    for (unsigned st = ZS_FS_DUPLICATE; st <= ZS_FS_BAD_KEY; st++) {
        const char *l[] = {"reason", zs_frame_status_name(st), NULL};
        sv->prom.refused[st] =
            zs_prom_counter(r, "zshard_server_refused_total",
                            "Data-plane requests answered with an error (duplicate pushes "
                            "included: dropped, not an error), by reason",
                            l);
        if (!sv->prom.refused[st])
            return ZS_ERR_INVALID;
    }
    zs_prom_set(sv->prom.version, -1);
    return ZS_OK;
}

static zs_err server_setup(server *sv)
{
    ZS_CHECK(prom_setup(sv));
    ZS_CHECK(choose_transport(sv));
    ZS_CHECK(sv->ops->open(&sv->net));
    /* Replies queue up during a turn of the loop and go out in one sendmsg per socket. */
    zs_net_opts nopts = {.batch_sends = 1};
    ZS_CHECK(sv->ops->set_opts(sv->net, &nopts));
    if (sv->opts->listen) {
        sv->auth = (zs_auth){.token_of = token_of, .ctx = sv};
        zs_conn_opts lo = sv->conn_opts;
        lo.auth = &sv->auth;
        ZS_CHECK(sv->ops->listen(sv->net, sv->opts->listen, &lo, &sv->listener));
        /* Register the endpoint the backend names for the listener: the address it is bound
         * to, or, bound to all of them, this host's address on the route to the coordinator
         * (which the workers reach too). */
        char toward[256] = "";
        const char *c = sv->opts->coord ? strstr(sv->opts->coord, "://") : NULL;
        if (c) {
            snprintf(toward, sizeof toward, "%s", c + 3);
            char *colon = strrchr(toward, ':');
            if (colon)
                *colon = '\0';
            if (toward[0] == '[') { /* [v6] */
                memmove(toward, toward + 1, strlen(toward));
                char *end = strchr(toward, ']');
                if (end)
                    *end = '\0';
            }
        }
        ZS_CHECK(sv->ops->listener_endpoint(sv->listener, *toward ? toward : NULL, sv->endpoint,
                                            sizeof sv->endpoint));
    }
    sv->ctx = (zs_msg_ctx){.self = ZS_MSG_SERVER};
    if (sv->opts->coord) {
        ZS_CHECK(zs_ctrl_connect(sv->opts->coord, sv->opts->secret, &sv->ctrl));
        uint32_t cap = sv->ops == &zs_rdma_ops  ? ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA
                       : sv->ops == &zs_shm_ops ? ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM
                                                : ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP;
        ZS_CHECK(zs_ctrl_register(sv->ctrl, ZSHARD__ROLE__ROLE_SERVER, sv->endpoint, cap));
    }
    return ZS_OK;
}

zs_err zs_server_open(const zs_server_opts *opts, zs_server **out)
{
    *out = NULL;
    server *sv = calloc(1, sizeof *sv);
    if (!sv)
        return zs_error(ZS_ERR_NOMEM, "server: out of memory");
    sv->opts = opts;
    sv->ops = &zs_tcp_ops;
    sv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (sv->wake_fd < 0) {
        zs_err e = zs_error(ZS_ERR_IO, "server: eventfd: %s", strerror(errno));
        free(sv);
        return e;
    }
    zs_err res = server_setup(sv);
    if (res != ZS_OK) {
        zs_server_close(sv);
        return res;
    }
    *out = sv;
    return ZS_OK;
}

void zs_server_set_hooks(zs_server *sv, const zs_server_hooks *hooks)
{
    sv->hooks = *hooks;
}

/* A control message: refused (logged) or handled. */
static void on_ctrl_bytes(server *sv, zs_err decoded, Zshard__Envelope *env)
{
    sv->last_coord_ms = now_ms(sv);
    if (decoded != ZS_OK) {
        ZS_WARN("server %u: refused a control message: %s", sv->id, zs_last_error());
        return;
    }
    if (sv->have_job)
        sv->ctx.chunks = (uint32_t)sv->cfg.chunks;
    on_ctrl(sv, env);
    zs_msg_free(env);
}

/*
 * Gives up on a coordinator that has said nothing for cluster.coordinator_timeout_ms (it
 * sends a heartbeat every interval): it is gone or hung, and the job cannot go on without it.
 * A gap in our own turns (this process was stopped) restarts the count, as the coordinator's
 * messages of that time are still unread.
 */
static void coord_alive_check(server *sv)
{
    uint64_t now = now_ms(sv);
    uint64_t limit = sv->have_job ? (uint64_t)sv->cfg.cluster.coordinator_timeout_ms : 15000;
    if (sv->last_turn_ms && now - sv->last_turn_ms > limit / 4)
        sv->last_coord_ms = now;
    sv->last_turn_ms = now;
    if (!sv->last_coord_ms) {
        sv->last_coord_ms = now;
        return;
    }
    if (sv->done || !sv->ctrl || now - sv->last_coord_ms <= limit)
        return;
    sv->result = zs_error(ZS_ERR_IO,
                          "server %u: nothing from the coordinator at %s for %llu ms "
                          "(cluster.coordinator_timeout_ms %llu): it is gone or hung; exiting "
                          "(a coordinator restarted with --resume continues from the newest "
                          "checkpoint)",
                          sv->id, sv->opts->coord, (unsigned long long)(now - sv->last_coord_ms),
                          (unsigned long long)limit);
    ZS_ERROR("%s", zs_last_error());
    sv->done = 1;
}

zs_err zs_server_turn(zs_server *sv, int timeout_ms)
{
    zs_event evs[MAX_EVENTS];
    int n = 0;
    ZS_CHECK(sv->ops->poll(sv->net, evs, MAX_EVENTS, timeout_ms, &n));
    for (int i = 0; i < n; i++)
        on_data_event(sv, &evs[i]);
    expire_payloads(sv);
    for (int i = 0; i < sv->n_doomed; i++) {
        forget_conn(sv, sv->doomed[i]);
        sv->ops->conn_close(sv->doomed[i]);
    }
    sv->n_doomed = 0;
    while (sv->ctrl) {
        Zshard__Envelope *env = NULL;
        zs_err e = zs_ctrl_recv(sv->ctrl, 0, &sv->ctx, NULL, &env);
        if (e == ZS_OK && !env)
            break;
        on_ctrl_bytes(sv, e, env);
    }
    /* Pushes that waited for a reassignment are judged again now that the control socket
     * was read. */
    sv->ctrl_epoch++;
    if (sv->n_waiting > 0 && sv->store)
        drain_waiting(sv);
    ckpt_reap(sv, 0);
    window_reap(sv);
    if (sv->replica && zs_replica_poll(sv->replica)) {
        /* An apply finished (pushes for the replica deferred meanwhile may go) or a load did
         * (the step's partial sums may be due). */
        drain_waiting(sv);
        maybe_send_partials(sv);
    }
    heartbeat_if_due(sv);
    coord_alive_check(sv);
    return ZS_OK;
}

zs_err zs_server_wait(zs_server *sv, int max_ms)
{
    int net_ms;
    int fd = sv->ops->wait_fd(sv->net, &net_ms);
    int t = net_ms >= 0 && (max_ms < 0 || net_ms < max_ms) ? net_ms : max_ms;
    if (t == 0)
        return ZS_OK;
    zmq_pollitem_t it[3] = {{.fd = fd, .events = ZMQ_POLLIN},
                            {.fd = sv->wake_fd, .events = ZMQ_POLLIN}};
    int n = 2;
    if (sv->ctrl)
        it[n++] = (zmq_pollitem_t){.socket = zs_ctrl_socket(sv->ctrl), .events = ZMQ_POLLIN};
    if (zmq_poll(it, n, t) < 0 && zmq_errno() != EINTR)
        return zs_error(ZS_ERR_IO, "server %u: zmq_poll: %s", sv->id, zmq_strerror(zmq_errno()));
    uint64_t count;
    if (it[1].revents && read(sv->wake_fd, &count, sizeof count) < 0)
        ZS_DEBUG("server %u: reading its wake-up: %s", sv->id, strerror(errno));
    return ZS_OK;
}

void zs_server_feed(zs_server *sv, const void *bytes, size_t len)
{
    /* ZeroMQ drops a message over ZS_MSG_MAX_BYTES (ZMQ_MAXMSGSIZE) before a turn sees it. */
    if (sv->done || len > ZS_MSG_MAX_BYTES)
        return;
    Zshard__Envelope *env = NULL;
    zs_err e = zs_msg_decode(bytes, len, &sv->ctx, &env);
    on_ctrl_bytes(sv, e, env);
}

zs_err zs_server_adopt(zs_server *sv, int fd, const char *peer, uint32_t member)
{
    /* The data plane is TCP (sv->ops), whose connections can be made of any stream socket. */
    zs_conn *c = NULL;
    zs_err e = zs_tcp_adopt(sv->net, fd, peer, member, &c);
    if (e != ZS_OK)
        close(fd);
    else
        track_conn(sv, c);
    return e;
}

int zs_server_done(const zs_server *sv, zs_err *result)
{
    if (result)
        *result = sv->result;
    return sv->done;
}

long zs_server_version(const zs_server *sv)
{
    return sv->store ? zs_store_version(sv->store) : -1;
}

/* Tells the coordinator that this server leaves, and why (a signal, or the failure that ends
 * it: the coordinator's log and `zshard status` then show the reason instead of a silence). */
static void send_leaving(server *sv, const char *why)
{
    Zshard__Shutdown s = ZSHARD__SHUTDOWN__INIT;
    char reason[1024];
    /* Most failures name this server already ("server 2: ..."). */
    char self[32];
    int n = snprintf(self, sizeof self, "server %u:", sv->id);
    snprintf(reason, sizeof reason, "%s%s%s", strncmp(why, self, (size_t)n) ? self : "",
             strncmp(why, self, (size_t)n) ? " " : "", why);
    s.has_kind = 1;
    s.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_LEAVING;
    s.reason = reason;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
    env.shutdown = &s;
    send_ctrl(sv, &env);
}

zs_err zs_server_run(const zs_server_opts *opts, volatile int *stop_flag)
{
    server *sv = NULL;
    zs_err res;
    ZS_CHECK(zs_server_open(opts, &sv));
    while (!sv->done && !(stop_flag && *stop_flag)) {
        ZS_CHECK_GOTO(zs_server_wait(sv, IDLE_MS), res, out);
        ZS_CHECK_GOTO(zs_server_turn(sv, 0), res, out);
    }
    res = sv->result;
    if (stop_flag && *stop_flag && sv->id)
        send_leaving(sv, "stopped by a signal");
out:
    /* A failure of our own (not the coordinator ending or refusing the job) is told to it. */
    if (res != ZS_OK && sv->id && !sv->told_to_stop) {
        char why[900];
        snprintf(why, sizeof why, "%s", zs_last_error());
        send_leaving(sv, why);
        zs_error(res, "%s", why);
    }
    zs_server_close(sv);
    return res;
}
