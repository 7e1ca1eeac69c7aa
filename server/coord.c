/*
 * coord: the coordinator's loop.  Everything happens in one thread around one ROUTER socket:
 * each message is validated by zs_ctrl_recv, mapped from its sender to a member, and turned
 * into coordstate calls; state changes go out as messages.  Peers are known by their proto id
 * (1, 2, ... in registration order); coordstate has ids of its own for the members it tracks
 * (servers from registration, workers once their data matched).
 *
 * One turn of the loop (zs_coord_turn) takes one message from the socket, handles it
 * (on_message; a refused one is answered by on_refused), then advance()s the job: expired
 * members, the start of a step, the verdict, changed assignments.  zs_coord_feed is the same
 * turn with bytes that a test gives instead of the socket.  Every send goes through
 * send_env, where a test's hook sees it.
 */
#include "server/coord.h"
#include "common/clock.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/config.h"
#include "common/data.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/shardmap.h"
#include "proto/ctrl.h"
#include "proto/shardmap_msg.h"
#include "server/coordstate.h"

/* Peers registered and not gone at once; ids are never reused, and the table of every peer
 * that ever registered grows as needed (to MAX_IDS), so that a job that sees many workers come
 * and go over days, or a burst of registrations that went away, never refuses a new worker. */
#define MAX_PEERS 4096
#define MAX_IDS (1 << 20)

/* A checkpoint being written: the servers' reports, and its step's metrics line. */
typedef struct {
    long step;            /* the version checkpointed; 0: the slot is free */
    zs_ckpt_shard *files; /* [n_shards] as reported */
    uint8_t *have;        /* [n_shards] reported */
    uint8_t *reported;    /* [n_servers] by map index */
    int n_reported;
    int failed;
    char error[1024];
    int have_stats;         /* its step finished (every server published it) */
    zs_coord_step_stats st; /* its step's metrics line, written once the outcome is known */
    double tps, dt;
} ckpt_pend;

typedef struct {
    zs_ctrl_peer peer;
    Zshard__Role role;
    int cs_id; /* coordstate id, -1 until it is a member */
    int ready;
    int gone;
    char endpoint[128];
    char hostname[64];
    uint32_t pid;
    char gone_why[400];      /* why it is gone: "no heartbeat within 1000 ms", "worker leaving" */
    long sent_step;          /* the step of the last StepAssign sent to this worker, -1: none */
    uint64_t sent_sig;       /* a signature of its chunk list, to send only changes */
    uint64_t probed_ms;      /* when its assignment was last repeated (probe_workers) */
    uint64_t unreachable_ms; /* when a message to it first could not be routed, 0: it can */
    int rejoining;           /* a worker told to register again (a server was lost) */
    int has_job;             /* it was sent the job spec and a shard map */
    uint32_t transports;     /* the CAP_TRANSPORT_* bits it registered with */
} peer_entry;

struct zs_coord {
    const zs_coord_opts *opts;
    zs_coord_hooks hooks;
    zs_msg_ctx ctx; /* what received messages are checked against; grows with the job */
    zs_config cfg;
    zs_tensor_table tt;
    zs_dataset data;
    zs_ctrl *ctrl;
    /* The data plane's key (common/secret.h): random per coordinator, given to servers only;
     * every member's token derives from it.  All zero when the job runs insecure. */
    uint8_t data_key[ZS_TOKEN_BYTES];
    zs_coord_state *cs;
    zs_shardmap map;
    int have_map;
    Zshard__JobSpec *job;
    Zshard__ShardMap *map_msg;
    uint32_t transport; /* the CAP_TRANSPORT_* bit the job's servers serve; 0 until the first
                           server registered (cluster.transport, else the servers decide) */
    peer_entry *peers;  /* [cap_peers], index = proto id - 1 */
    int n_peers, cap_peers;
    zs_log_limit refused_log; /* registrations and messages refused: a peer may repeat them */
    zs_log_limit chunk_log;   /* chunks taken back or moved (a liar or a staller repeats) */
    int servers_registered, servers_ready;
    int assignment_dirty;
    uint64_t all_done_ms; /* when every chunk of the step was last seen reported done (0: not) */
    /* Chunk deadlines: since[c] is when chunk c got its present owner, seen[c] (the owner) */
    uint64_t *chunk_since;
    int *chunk_seen;
    long deadline_step;                /* the step they are about */
    const zs_coord_state *deadline_cs; /* and the step state (a recovery makes a new one) */
    char *chunk_timed;                 /* [C] its time is in the ring already */
    double chunk_ms[64];               /* the last chunk times seen here (assignment to done) */
    int n_chunk_ms, next_chunk_ms;
    double median_chunk_ms; /* of chunk_ms, kept as it changes (0: no chunk done yet) */
    zs_metrics *metrics;
    double step_start;
    double last_loss, last_tps; /* of the last finished step, for StatusReply */

    /* Checkpoints.  The servers write their shards of version s while step s + 1 runs and
     * report the files (CheckpointWritten); once every server has, the coordinator writes the
     * manifest, moves `latest` and prunes.  Step s's metrics line waits for that outcome,
     * which it carries ("checkpoint" or "checkpoint_error"). */
    char ckpt_dir[4096];   /* absolute */
    uint64_t run_id;       /* random at a fresh start, the checkpoint's at a resume */
    uint64_t config_fp;    /* zs_config_fingerprint(&cfg) */
    long start_step;       /* the version the job started from (0, or the resumed one) */
    long last_ckpt;        /* step of the newest committed checkpoint; 0: none */
    char ckpt_error[1100]; /* why the latest checkpoint failed; "" if it did not */
    /* At most two checkpoints are open at once: the servers may report version s + 1's files
     * (written after its verdict) before the last of them reported version s's. */
    ckpt_pend pend[2];
    char final_error[1024]; /* why the final checkpoint failed */
    /* Pruning deletes whole checkpoints (tens of ms of unlinks on a busy disk): a thread of
     * its own does it, off the loop that the step waits on.  It touches only checkpoints older
     * than the one just committed, which nothing else reads or writes. */
    struct {
        pthread_t thread;
        int running;
        atomic_int finished;
        long newest;
    } pruner;
    /* Losing a server: every server goes back to the newest checkpoint (or the start) and the
     * steps since are computed again, on the servers left and any that registered since. */
    char last_ckpt_dir[4096]; /* the step directory of last_ckpt ("" with last_ckpt 0) */
    int n_servers;            /* servers of the current map */
    int map_made;             /* the first map exists (servers registered later are spares) */
    int recovering;           /* waiting until recover_at to build the new map */
    int restoring;            /* the new map is out, its servers are not all ready: workers
                                 get it once they are (their connections would be dropped) */
    uint64_t recover_at;
    int recoveries;
    /* checkpoint.replicas: a lost server whose replica is current is failed over to it instead
     * -- the job goes on from memory at the step in hand, nothing computed again.
     * replica_current[s] (map index): the holder of server s's replica said it is current
     * (GradNormPartial.replicas_current) since this map was made.  A failover waits for the
     * step in hand to finish publishing (the replica applies the verdict too). */
    uint8_t *replica_current;
    /* fp16 jobs: the loss scaler's state after each version v in start..steps (ls_hist[v]):
     * what a checkpoint of v carries, and where a recovery to v starts the scaler again.
     * 40 bytes a step of the run. */
    zs_lossscale *ls_hist;
    /* Workers told to register again (a server lost): the next step waits for that many to be
     * back, at most a heartbeat timeout, rather than beginning with the first one and giving it
     * every chunk. */
    int rejoin_expected;
    uint64_t rejoin_until;
    int failover;    /* a failover waits (finish_failover) */
    int failover_pi; /* the lost server */
    int failovers;
    /* opts->prom's series (docs/observability.md); all NULL without a registry.  The
     * members' counts, heartbeat ages and the checkpoint's age are refreshed every
     * PROM_REFRESH_MS by the loop (prom_refresh), the rest as things happen. */
    struct {
        zs_prom_series *step, *steps, *loss, *lr, *grad_norm, *tps, *step_seconds;
        zs_prom_series *steps_finished, *skipped, *ckpt_committed, *ckpt_failed, *ckpt_step;
        zs_prom_series *ckpt_age, *recoveries, *failovers, *workers_live, *loss_scale;
        zs_prom_series *replicas_current;
        zs_prom_series *members[2][3]; /* [server, worker][joining, active, gone] */
        zs_prom_series *hb_age[2];     /* [server, worker]: the oldest heartbeat's age */
        double ckpt_at;                /* zs_now_s() of the last commit; 0: none yet */
        uint64_t refreshed_ms;
    } prom;
    uint64_t last_turn_ms;      /* when the last turn began: a long gap is a pause of ours */
    uint64_t last_heartbeat_ms; /* when we last told the members we live */
    int done;
    zs_err result;
};
typedef struct zs_coord coord;

static uint64_t now_ms(const coord *co)
{
    return co->hooks.now_ms ? co->hooks.now_ms(co->hooks.user) : zs_now_ms();
}

/* Sends env to a peer; quiet: a failure is expected (a peer declared dead, most likely gone)
 * and not worth a warning.  Fails when ZeroMQ cannot route it: the peer's connection is gone. */
static zs_err send_env_to(coord *co, const zs_ctrl_peer *to, Zshard__Envelope *env, int quiet)
{
    zs_ctrl_stamp(env, 0);
    if (co->hooks.sent)
        co->hooks.sent(co->hooks.user, to, env);
    zs_err e = co->ctrl ? zs_ctrl_send(co->ctrl, to, env) : ZS_OK;
    if (e != ZS_OK && !quiet)
        ZS_WARN("coord: %s", zs_last_error());
    return e;
}

static void send_env(coord *co, const zs_ctrl_peer *to, Zshard__Envelope *env)
{
    send_env_to(co, to, env, 0);
}

static void send_error(coord *co, const zs_ctrl_peer *to, Zshard__ErrorCode code, const char *text)
{
    Zshard__Error e = ZSHARD__ERROR__INIT;
    e.has_code = 1;
    e.code = code;
    e.text = (char *)text;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_ERROR;
    env.error = &e;
    send_env(co, to, &env);
}

static void send_shutdown_to(coord *co, const zs_ctrl_peer *to, Zshard__ShutdownKind kind,
                             const char *reason, int quiet)
{
    Zshard__Shutdown s = ZSHARD__SHUTDOWN__INIT;
    s.has_kind = 1;
    s.kind = kind;
    s.reason = (char *)reason;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
    env.shutdown = &s;
    send_env_to(co, to, &env, quiet);
}

static void send_shutdown(coord *co, const zs_ctrl_peer *to, Zshard__ShutdownKind kind,
                          const char *reason)
{
    send_shutdown_to(co, to, kind, reason, 0);
}

/* To every peer that ever registered: one declared dead may still be running (a hang that
 * ended), and must learn that the job is over too.  ZeroMQ drops what cannot be routed. */
static void broadcast_shutdown(coord *co, Zshard__ShutdownKind kind, const char *reason)
{
    for (int i = 0; i < co->n_peers; i++)
        send_shutdown_to(co, &co->peers[i].peer, kind, reason, co->peers[i].gone);
}

static void abort_job(coord *co, zs_err err)
{
    /* The sends below may record failures of their own (a peer that is gone): keep the
     * reason, which is what the caller reports. */
    char why[1024];
    snprintf(why, sizeof why, "%s", zs_last_error());
    ZS_ERROR("coord: aborting the job: %s", why);
    broadcast_shutdown(co, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_ABORT, why);
    co->result = zs_error(err, "%s", why);
    co->done = 1;
}

/* The job spec to peer pi and, with with_map, the current shard map (a spare server gets the
 * map only when a recovery takes it in). */
static void send_job(coord *co, int pi, int with_map)
{
    const zs_ctrl_peer *to = &co->peers[pi].peer;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_JOB_SPEC;
    env.job_spec = co->job;
    send_env(co, to, &env);
    if (!with_map)
        return;
    co->peers[pi].has_job = 1;
    env.body_case = ZSHARD__ENVELOPE__BODY_SHARD_MAP;
    env.shard_map = co->map_msg;
    send_env(co, to, &env);
}

/* Tells a server to go back to version (from step_dir, or from memory: step_dir NULL, and with
 * rewrite the checkpoint of that version written again); the new ShardMap follows. */
static void send_restore(coord *co, const zs_ctrl_peer *to, long version, const char *step_dir,
                         int rewrite)
{
    Zshard__Restore r = ZSHARD__RESTORE__INIT;
    r.has_version = 1;
    r.version = (uint64_t)version;
    r.step_dir = (char *)(step_dir ? step_dir : "");
    r.has_from_memory = r.from_memory = !step_dir;
    r.has_checkpoint = r.checkpoint = rewrite;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_RESTORE;
    env.restore = &r;
    send_env(co, to, &env);
    env.body_case = ZSHARD__ENVELOPE__BODY_SHARD_MAP;
    env.shard_map = co->map_msg;
    send_env(co, to, &env);
}

/*
 * The shard map over the servers that are in, its step state, and the job to everyone
 * registered: once all S servers registered (restore 0), or at the end of a recovery (restore
 * 1: the map's servers get a Restore and the map, workers registered meanwhile the job).
 */
static zs_err build_map(coord *co, int restore, uint32_t *ids, const char **eps)
{
    int n = 0;
    size_t sf = co->cfg.cluster.shard_bytes / sizeof(float);
    int max = (int)((co->tt.total + sf - 1) / sf); /* a server without a shard stays a spare */
    for (int i = 0; i < co->n_peers && n < max; i++)
        if (co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER && !co->peers[i].gone) {
            ids[n] = (uint32_t)(i + 1);
            eps[n++] = co->peers[i].endpoint;
        }
    ZS_CHECK(zs_shardmap_build(co->tt.total, co->cfg.cluster.shard_bytes, n, ids, &co->map));
    zs_shardmap_set_replicas(&co->map, co->cfg.checkpoint.replicas);
    if (co->cfg.checkpoint.replicas > 0 && n < 2)
        ZS_WARN("coord: checkpoint.replicas is 1 but there is only one server: no replica (a "
                "lost server costs the steps since the last checkpoint)");
    free(co->replica_current);
    co->replica_current = calloc((size_t)n, 1);
    if (!co->replica_current)
        return zs_error(ZS_ERR_NOMEM, "coord: out of memory");
    co->n_servers = n;
    co->map_made = 1;
    co->have_map = 1;
    ZS_CHECK(zs_shardmap_to_msg(&co->map, eps, &co->map_msg));
    co->map_msg->has_transport = 1;
    co->map_msg->transport = co->transport ? co->transport : ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP;
    ZS_INFO("coord: %d servers; %d shards of %zu floats over a vector of %zu", n, co->map.n_shards,
            co->map.shard_floats, co->tt.total);
    ZS_CHECK(zs_coord_state_create(&co->cfg, n, co->map.n_shards, co->opts->steps, &co->cs));
    long from = restore ? co->last_ckpt : co->start_step;
    if (from > 0)
        ZS_CHECK(zs_coord_state_start_at(co->cs, from));
    if (co->ls_hist)
        zs_coord_set_scaler(co->cs, &co->ls_hist[from]);
    for (int k = 0; k < 2; k++) {
        ckpt_pend *cp = &co->pend[k];
        *cp = (ckpt_pend){0};
        cp->files = calloc((size_t)co->map.n_shards, sizeof *cp->files);
        cp->have = calloc((size_t)co->map.n_shards, 1);
        cp->reported = calloc((size_t)n, 1);
        if (!cp->files || !cp->have || !cp->reported)
            return zs_error(ZS_ERR_NOMEM, "coord: out of memory for %d shards", co->map.n_shards);
    }
    for (int i = 0; i < co->n_peers; i++) {
        if (co->peers[i].gone)
            continue;
        if (co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER &&
            zs_shardmap_server_index(&co->map, (uint32_t)(i + 1)) < 0)
            continue; /* a spare */
        if (co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER) {
            zs_coord_join(co->cs, ZS_MEMBER_SERVER, i + 1, co->peers[i].endpoint, now_ms(co),
                          &co->peers[i].cs_id);
        }
        if (restore && co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER)
            send_restore(co, &co->peers[i].peer, co->last_ckpt, co->last_ckpt_dir, 0);
        else if (!co->peers[i].has_job && !restore)
            send_job(co, i, 1);
    }
    return ZS_OK;
}

/* build_map with room for every server's id and endpoint. */
static zs_err make_map(coord *co, int restore)
{
    size_t n = (size_t)(co->n_peers ? co->n_peers : 1);
    uint32_t *ids = malloc(n * sizeof *ids);
    const char **eps = malloc(n * sizeof *eps);
    zs_err res = ids && eps ? build_map(co, restore, ids, eps)
                            : zs_error(ZS_ERR_NOMEM, "coord: out of memory for the shard map");
    free(ids);
    free(eps);
    return res;
}

/* Whether peer pi is a server of the current map (not a spare, not gone). */
static int in_map(const coord *co, int pi)
{
    return co->peers[pi].role == ZSHARD__ROLE__ROLE_SERVER && !co->peers[pi].gone && co->have_map &&
           zs_shardmap_server_index(&co->map, (uint32_t)(pi + 1)) >= 0;
}

/* Servers registered and not gone: those of the map and the spares. */
static int live_servers(const coord *co)
{
    int n = 0;
    for (int i = 0; i < co->n_peers; i++)
        n += co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER && !co->peers[i].gone;
    return n;
}

/* Why a Register from `from` is refused (why[] may hold the text), or NULL, with room in the
 * peer table for it then. */
static const char *transport_name(uint32_t bit)
{
    return bit == ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA  ? "rdma"
           : bit == ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP ? "tcp"
                                                          : "shm";
}

/* The host of the job's first live server, for shm ("" when none). */
static const char *server_host(const coord *co)
{
    for (int i = 0; i < co->n_peers; i++)
        if (co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER && !co->peers[i].gone)
            return co->peers[i].hostname;
    return "";
}

/* Capability negotiation (docs/transport.md): a server serves exactly one backend, the one
 * cluster.transport names (or, with "auto", the one the job's first server serves); a worker
 * must offer the backend the servers serve; with shm, everyone is on the first server's host
 * (by the hostname each registered with; the set-up proves it again by reading memory). */
static const char *transport_refusal(coord *co, const Zshard__Register *r, char *why, size_t n)
{
    uint32_t caps = r->capabilities & ZS_MSG_CAPS_TRANSPORT;
    zs_transport_kind k = co->cfg.cluster.transport;
    uint32_t want = k == ZS_TRANSPORT_TCP    ? ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP
                    : k == ZS_TRANSPORT_RDMA ? ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA
                    : k == ZS_TRANSPORT_SHM  ? ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM
                                             : co->transport;
    if (r->role == ZSHARD__ROLE__ROLE_SERVER && caps != ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP &&
        caps != ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA &&
        caps != ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM) {
        snprintf(why, n,
                 "a server must serve exactly one data-plane backend (tcp, rdma or shm), it "
                 "offered 0x%x",
                 caps);
        return why;
    }
    if (r->role == ZSHARD__ROLE__ROLE_SERVER && want && caps != want) {
        snprintf(why, n,
                 "this server serves %s, but %s %s (start every server with --transport %s)",
                 transport_name(caps),
                 k != ZS_TRANSPORT_AUTO ? "cluster.transport is" : "the job's servers serve",
                 transport_name(want), transport_name(want));
        return why;
    }
    if (r->role != ZSHARD__ROLE__ROLE_SERVER && want && !(caps & want)) {
        snprintf(why, n, "the servers serve %s and this %s does not offer it%s",
                 transport_name(want), r->role == ZSHARD__ROLE__ROLE_WORKER ? "worker" : "client",
                 want == ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA
                     ? " (no usable RDMA device on its host; its log says why at debug level)"
                     : "");
        return why;
    }
    const char *host = server_host(co);
    if (want == ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM && *host &&
        strcmp(host, r->hostname ? r->hostname : "") != 0) {
        snprintf(why, n,
                 "the job's data plane is shared memory (shm) on host %s, and this %s runs on %s",
                 host, r->role == ZSHARD__ROLE__ROLE_SERVER ? "server" : "peer",
                 r->hostname ? r->hostname : "an unnamed host");
        return why;
    }
    return NULL;
}

static const char *registration_refusal(coord *co, const zs_ctrl_peer *from,
                                        const Zshard__Register *r, char *why, size_t n)
{
    /* One registration per connection: a peer that registers again on the same socket (a
     * flood, or a confused client) gets a refusal, not another entry. */
    int live = 0;
    for (int i = 0; i < co->n_peers; i++) {
        if (co->peers[i].gone)
            continue;
        live++;
        if (co->peers[i].peer.len == from->len &&
            memcmp(co->peers[i].peer.id, from->id, from->len) == 0) {
            snprintf(why, n, "this connection is registered already (as %d)", i + 1);
            return why;
        }
    }
    if (r->role == ZSHARD__ROLE__ROLE_SERVER && live_servers(co) >= 2 * co->opts->servers)
        return "all servers of this job and as many spares are registered";
    if (r->role == ZSHARD__ROLE__ROLE_SERVER && r->n_endpoints < 1)
        return "a server must give its data-plane endpoint";
    const char *tr = transport_refusal(co, r, why, n);
    if (tr)
        return tr;
    /* An fp16 job's workers fetch fp16 copies: a build that does not know them would refuse
     * every fetch (a server) or ask for another dtype (a worker). */
    if (co->cfg.fp16.enabled &&
        (r->role == ZSHARD__ROLE__ROLE_SERVER || r->role == ZSHARD__ROLE__ROLE_WORKER) &&
        !(r->capabilities & ZSHARD__CAPABILITY__CAP_FETCH_FP16)) {
        snprintf(why, n,
                 "this is an fp16 job, whose workers fetch fp16 copies of the weights, and this "
                 "%s (build %s) does not %s them",
                 r->role == ZSHARD__ROLE__ROLE_SERVER ? "server" : "worker",
                 r->build ? r->build : "?",
                 r->role == ZSHARD__ROLE__ROLE_SERVER ? "serve" : "fetch");
        return why;
    }
    if (live >= MAX_PEERS)
        return "too many peers at once";
    if (from->addr[0]) {
        int same = 0, cap = co->cfg.cluster.max_members_per_address;
        for (int i = 0; i < co->n_peers; i++)
            same += !co->peers[i].gone && strcmp(co->peers[i].peer.addr, from->addr) == 0;
        if (same >= cap) {
            snprintf(why, n,
                     "%d members from %s are registered already "
                     "(cluster.max_members_per_address)",
                     same, from->addr);
            return why;
        }
    }
    if (co->n_peers >= MAX_IDS)
        return "no member ids left in this job";
    if (co->n_peers == co->cap_peers) {
        int cap = 2 * co->cap_peers;
        peer_entry *grown = realloc(co->peers, (size_t)cap * sizeof *grown);
        if (!grown)
            return "the coordinator is out of memory for another peer";
        co->peers = grown;
        co->cap_peers = cap;
    }
    return NULL;
}

static void on_register(coord *co, const zs_ctrl_peer *from, const Zshard__Register *r)
{
    Zshard__RegisterReply rr = ZSHARD__REGISTER_REPLY__INIT;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY;
    env.registration_reply = &rr;
    char why[256];
    const char *refusal = registration_refusal(co, from, r, why, sizeof why);
    if (refusal) {
        rr.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_REFUSAL;
        rr.refusal = (char *)refusal;
        rr.has_code = 1;
        rr.code = ZSHARD__ERROR_CODE__ERROR_REFUSED;
        zs_log_limited(&co->refused_log, ZS_LOG_WARN, "coord: refused a %s: %s",
                       r->role == ZSHARD__ROLE__ROLE_SERVER ? "server" : "peer", refusal);
        send_env(co, from, &env);
        return;
    }
    peer_entry *p = &co->peers[co->n_peers++];
    memset(p, 0, sizeof *p);
    p->peer = *from;
    p->role = r->role;
    p->transports = r->capabilities & ZS_MSG_CAPS_TRANSPORT;
    if (r->role == ZSHARD__ROLE__ROLE_SERVER && !co->transport)
        co->transport = p->transports;
    p->cs_id = -1;
    p->sent_step = -1;
    if (r->n_endpoints > 0)
        snprintf(p->endpoint, sizeof p->endpoint, "%s", r->endpoints[0]);
    snprintf(p->hostname, sizeof p->hostname, "%s", r->hostname ? r->hostname : "");
    p->pid = r->pid;
    rr.outcome_case = ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID;
    rr.assigned_id = (uint32_t)co->n_peers;
    uint8_t token[ZS_TOKEN_BYTES];
    zs_token_of(co->data_key, rr.assigned_id, token);
    rr.has_data_token = 1;
    rr.data_token = (ProtobufCBinaryData){.len = sizeof token, .data = token};
    if (r->role == ZSHARD__ROLE__ROLE_SERVER) {
        rr.has_data_key = 1;
        rr.data_key = (ProtobufCBinaryData){.len = sizeof co->data_key, .data = co->data_key};
    }
    send_env(co, from, &env);
    zs_wipe(token, sizeof token);
    ZS_INFO("coord: %s %u registered (host %s, pid %u)%s%s",
            r->role == ZSHARD__ROLE__ROLE_SERVER ? "server" : "worker", rr.assigned_id,
            r->hostname ? r->hostname : "?", r->pid, *p->endpoint ? ", data plane " : "",
            p->endpoint);
    if (r->role == ZSHARD__ROLE__ROLE_SERVER) {
        co->servers_registered++;
        if (co->map_made) {
            /* A spare: it takes part from the next recovery on (a server lost). */
            ZS_INFO("coord: server %d is a spare until a server is lost", co->n_peers);
            send_job(co, co->n_peers - 1, 0);
        } else if (co->servers_registered == co->opts->servers) {
            zs_err e = make_map(co, 0);
            if (e != ZS_OK)
                abort_job(co, e);
        }
    } else if (co->have_map && !co->restoring) {
        send_job(co, co->n_peers - 1, 1);
    }
}

/*
 * Sends worker pi its n chunks of the current step (chunks[0..n), ascending), first to every
 * server when to_servers (a push may follow the worker's copy at once), then to the worker.
 * A worker that ZeroMQ cannot route to is marked unreachable (probe_workers); one it can is
 * not (any more).
 */
static void send_assignment(coord *co, int pi, uint32_t *chunks, int n, int to_servers)
{
    peer_entry *w = &co->peers[pi];
    long step = zs_coord_step(co->cs);
    Zshard__StepAssign sa = ZSHARD__STEP_ASSIGN__INIT;
    sa.has_step = sa.has_worker = sa.has_lr = 1;
    sa.step = (uint64_t)step;
    sa.worker = (uint32_t)(pi + 1);
    sa.n_chunks = (size_t)n;
    sa.chunks = chunks;
    sa.lr = zs_config_lr(&co->cfg, (int)zs_coord_opt_step(co->cs));
    if (co->cfg.fp16.enabled) {
        sa.has_loss_scale = 1;
        sa.loss_scale = zs_coord_loss_scale(co->cs);
    }
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_STEP_ASSIGN;
    env.step_assign = &sa;
    for (int j = 0; to_servers && j < co->n_peers; j++)
        if (in_map(co, j))
            send_env(co, &co->peers[j].peer, &env);
    uint64_t now = now_ms(co);
    w->probed_ms = now;
    if (send_env_to(co, &w->peer, &env, 1) == ZS_OK) {
        w->unreachable_ms = 0;
    } else if (!w->unreachable_ms) {
        ZS_DEBUG("coord: worker %d cannot be reached: %s", pi + 1, zs_last_error());
        w->unreachable_ms = now;
    }
}

/* Worker w's unfinished chunks of the current step into chunks[0..C) (tmp: scratch of C);
 * returns how many. */
static int worker_chunks(coord *co, const peer_entry *w, int *tmp, uint32_t *chunks)
{
    int n = zs_coord_assigned(co->cs, w->cs_id, tmp, co->cfg.chunks);
    for (int k = 0; k < n; k++)
        chunks[k] = (uint32_t)tmp[k];
    return n;
}

/* Sends the current step's assignment to every live worker whose list changed, and to every
 * server. */
static void broadcast_assignment(coord *co)
{
    long step = zs_coord_step(co->cs);
    int C = co->cfg.chunks;
    uint32_t *chunks = malloc((size_t)C * sizeof *chunks);
    int *tmp = malloc((size_t)C * sizeof *tmp);
    for (int i = 0; chunks && tmp && i < co->n_peers; i++) {
        peer_entry *w = &co->peers[i];
        if (w->role != ZSHARD__ROLE__ROLE_WORKER || w->cs_id < 0 || w->gone)
            continue;
        int n = worker_chunks(co, w, tmp, chunks);
        /* FNV-1a over the chunk list: send only changes.  A repeat would be harmless (a
         * worker takes each (step, chunk) once, the servers set the same owners), but it is
         * a message to every server. */
        uint64_t sig = 0xcbf29ce484222325ull;
        for (int k = 0; k < n; k++)
            sig = (sig ^ (uint64_t)chunks[k]) * 0x100000001b3ull;
        if (n == 0 || (w->sent_step == step && w->sent_sig == sig))
            continue;
        w->sent_step = step;
        w->sent_sig = sig;
        ZS_DEBUG("coord: step %ld: worker %d gets %d chunks", step + 1, i + 1, n);
        send_assignment(co, i, chunks, n, 1);
    }
    free(chunks);
    free(tmp);
}

/*
 * Finding dead workers sooner than the heartbeat timeout.  A killed worker's control
 * connection closes at once, and from then on ZeroMQ cannot route a message to it.  So while
 * a step computes, every heartbeat interval each worker that still has chunks of it is sent
 * its assignment again (to it alone; a repeat changes nothing: a worker takes each (step,
 * chunk) once).  A worker that cannot be reached, and has been silent for two heartbeat
 * intervals, is declared dead then (advance); one that can be reached is judged by the
 * timeout as before, so a slow or busy worker is never cut short.
 */
static void probe_workers(coord *co)
{
    uint64_t now = now_ms(co), every = (uint64_t)co->cfg.cluster.heartbeat_interval_ms;
    int C = co->cfg.chunks;
    uint32_t *chunks = malloc((size_t)C * sizeof *chunks);
    int *tmp = malloc((size_t)C * sizeof *tmp);
    for (int i = 0; chunks && tmp && i < co->n_peers; i++) {
        peer_entry *w = &co->peers[i];
        if (w->role != ZSHARD__ROLE__ROLE_WORKER || w->cs_id < 0 || w->gone ||
            now - w->probed_ms < every)
            continue;
        int n = worker_chunks(co, w, tmp, chunks);
        if (n > 0)
            send_assignment(co, i, chunks, n, 0);
    }
    free(chunks);
    free(tmp);
}

static void on_ready(coord *co, int pi, const Zshard__Ready *r)
{
    peer_entry *p = &co->peers[pi];
    if (p->ready)
        return;
    if (p->role == ZSHARD__ROLE__ROLE_SERVER) {
        p->ready = 1;
        co->servers_ready++;
        if (co->servers_ready == co->n_servers && co->restoring) {
            /* The servers are restored: now the workers (registered again) get the map. */
            co->restoring = 0;
            for (int i = 0; i < co->n_peers; i++)
                if (co->peers[i].role == ZSHARD__ROLE__ROLE_WORKER && !co->peers[i].gone &&
                    !co->peers[i].has_job)
                    send_job(co, i, 1);
        }
        if (co->servers_ready == co->n_servers)
            ZS_INFO("coord: all %d servers are ready", co->servers_ready);
        return;
    }
    if (p->role != ZSHARD__ROLE__ROLE_WORKER) {
        /* A client tool takes no chunks: joining it as a worker would assign it chunks that
         * no StepAssign ever tells it about, and the step would wait for them forever. */
        send_error(co, &p->peer, ZSHARD__ERROR_CODE__ERROR_OUT_OF_ORDER,
                   "a client tool takes no chunks: Ready is for servers and workers");
        return;
    }
    if (r->what_case != ZSHARD__READY__WHAT_DATA || r->data->fingerprint != co->data.fingerprint ||
        r->data->ntokens != co->data.ntokens) {
        char text[256];
        snprintf(text, sizeof text,
                 "worker %d: its data (fingerprint %016llx, %llu tokens) "
                 "differs from the job's (%016llx, %zu tokens)",
                 pi + 1,
                 r->what_case == ZSHARD__READY__WHAT_DATA ? (unsigned long long)r->data->fingerprint
                                                          : 0ull,
                 r->what_case == ZSHARD__READY__WHAT_DATA ? (unsigned long long)r->data->ntokens
                                                          : 0ull,
                 (unsigned long long)co->data.fingerprint, co->data.ntokens);
        ZS_WARN("coord: refused %s", text);
        send_error(co, &p->peer, ZSHARD__ERROR_CODE__ERROR_DATA_MISMATCH, text);
        send_shutdown(co, &p->peer, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_ABORT, text);
        p->gone = 1;
        return;
    }
    zs_err e = zs_coord_join(co->cs, ZS_MEMBER_WORKER, pi + 1, "", now_ms(co), &p->cs_id);
    if (e != ZS_OK) {
        send_error(co, &p->peer, ZSHARD__ERROR_CODE__ERROR_REFUSED, zs_last_error());
        send_shutdown(co, &p->peer, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_ABORT, zs_last_error());
        p->gone = 1;
        return;
    }
    p->ready = 1;
    co->assignment_dirty = 1;
}

static void on_partial(coord *co, int pi, const Zshard__GradNormPartial *g)
{
    peer_entry *p = &co->peers[pi];
    int n = (int)g->n_partials;
    int *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    double *sum = malloc((size_t)(n ? n : 1) * sizeof *sum);
    if (!idx || !sum) {
        free(idx);
        free(sum);
        abort_job(co, zs_error(ZS_ERR_NOMEM, "coord: out of memory"));
        return;
    }
    for (int i = 0; i < n; i++) {
        idx[i] = (int)g->partials[i]->shard;
        sum[i] = g->partials[i]->sumsq;
    }
    zs_err e = zs_coord_partials(co->cs, p->cs_id, (long)g->step, idx, sum, n);
    free(idx);
    free(sum);
    if (e != ZS_OK) {
        ZS_WARN("%s", zs_last_error());
        send_error(co, &p->peer, ZSHARD__ERROR_CODE__ERROR_OUT_OF_ORDER, zs_last_error());
        return;
    }
    /* Whose replicas this server holds, and whether they are current. */
    int h = zs_shardmap_server_index(&co->map, (uint32_t)(pi + 1));
    for (int s = 0; s < co->map.n_servers && h >= 0; s++)
        if (zs_shardmap_replica(&co->map, s) == h) {
            int now = g->has_replicas_current && g->replicas_current;
            if (co->replica_current[s] && !now)
                ZS_WARN("coord: server %d no longer holds a current replica of server %u: "
                        "losing that one now goes back to the last checkpoint",
                        pi + 1, co->map.server_ids[s]);
            co->replica_current[s] = (uint8_t)now;
        }
}

/* Once all chunks are done and all partials are in (whichever came last): the verdict. */
static void ckpt_open(coord *co, long version);

static void send_verdict(coord *co)
{
    double norm, lr;
    double clip = zs_coord_verdict(co->cs, &norm, &lr);
    /* From this verdict on, a server may publish the step's version and report its files. */
    ckpt_open(co, zs_coord_step(co->cs) + 1);
    Zshard__ClipVerdict v = ZSHARD__CLIP_VERDICT__INIT;
    v.has_step = v.has_clip_factor = v.has_skip = v.has_grad_norm = 1;
    v.step = (uint64_t)zs_coord_step(co->cs);
    v.skip = !isfinite(norm);
    v.clip_factor = v.skip ? 1.0 : clip;
    v.grad_norm = norm;
    if (co->cfg.fp16.enabled) {
        v.has_loss_scale = v.has_optimizer_step = 1;
        v.loss_scale = zs_coord_loss_scale(co->cs);
        v.optimizer_step = (uint64_t)zs_coord_opt_step(co->cs);
    }
    if (v.skip && co->cfg.fp16.enabled)
        ZS_WARN(
            "coord: step %ld: the gradient overflowed at loss scale %.17g; the update is skipped",
            zs_coord_step(co->cs) + 1, v.loss_scale);
    else if (v.skip)
        ZS_WARN("coord: step %ld: the gradient is not finite; the update is skipped",
                zs_coord_step(co->cs) + 1);
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_CLIP_VERDICT;
    env.clip_verdict = &v;
    for (int j = 0; j < co->n_peers; j++)
        if (in_map(co, j))
            send_env(co, &co->peers[j].peer, &env);
}

/* Step st's metrics line (its checkpoint's outcome with it, if one was taken).  A line that
 * cannot be written (a full disk) ends the job: the file never silently lacks a step, and the
 * newest checkpoint stays the place to resume from. */
static void write_metrics(coord *co, const zs_coord_step_stats *st, double tps, double dt,
                          const char *ckpt, const char *ckpt_error)
{
    zs_metrics *m = co->metrics;
    zs_metrics_begin(m);
    zs_metrics_int(m, "step", st->step);
    zs_metrics_num(m, "loss", st->loss, "%.9g");
    zs_metrics_num(m, "lr", st->lr, "%.9g");
    zs_metrics_num(m, "grad_norm", st->grad_norm, "%.9g");
    zs_metrics_num(m, "clip", st->clip, "%.9g");
    zs_metrics_num(m, "tokens_per_sec", tps, "%.1f");
    zs_metrics_num(m, "step_ms", dt * 1e3, "%.1f");
    zs_metrics_num(m, "compute_ms", st->compute_ms, "%.1f");
    zs_metrics_num(m, "fetch_wait_ms", st->fetch_wait_ms, "%.1f");
    zs_metrics_num(m, "push_wait_ms", st->push_wait_ms, "%.1f");
    zs_metrics_int(m, "workers", st->workers);
    if (st->skipped) /* where zshard train writes it: the lines compare equal */
        zs_metrics_bool(m, "skipped", 1);
    if (co->cfg.fp16.enabled) { /* as zshard train writes them (cli/train.c) */
        zs_metrics_num(m, "loss_scale", st->loss_scale, "%.17g");
        zs_metrics_bool(m, "overflow", st->skipped);
    }
    if (ckpt)
        zs_metrics_str(m, "checkpoint", ckpt);
    if (ckpt_error)
        zs_metrics_str(m, "checkpoint_error", ckpt_error);
    if (zs_metrics_end(m) != ZS_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", zs_last_error());
        if (co->last_ckpt > 0)
            abort_job(co, zs_error(ZS_ERR_IO,
                                   "%s; the newest checkpoint is step %ld in %s: free space and "
                                   "continue with --resume %s",
                                   why, co->last_ckpt, co->ckpt_dir, co->ckpt_dir));
        else
            abort_job(co, zs_error(ZS_ERR_IO, "%s (no checkpoint was committed yet)", why));
    }
}

/* Whether version v is checkpointed: every checkpoint.interval_steps, and the last always
 * (the servers apply the same rule; server.c ckpt_due). */
static int ckpt_due(const coord *co, long v)
{
    int every = co->cfg.checkpoint.interval_steps;
    return v == co->opts->steps || (every > 0 && v % every == 0);
}

/* Removes what a failed checkpoint left (shard files its servers wrote, temporary files) and
 * its directory: the previous checkpoint stays the newest, and the space is free again. */
static void ckpt_discard(coord *co, long step)
{
    zs_ckpt_discard(co->ckpt_dir, step);
}

static void export_and_finish(coord *co);

static void *prune_main(void *arg)
{
    coord *co = arg;
    zs_ckpt_prune(co->ckpt_dir, co->pruner.newest, co->cfg.checkpoint.keep);
    atomic_store(&co->pruner.finished, 1);
    return NULL;
}

/* Joins a pruner that finished (wait: also one still running). */
static void prune_reap(coord *co, int wait)
{
    if (co->pruner.running && (wait || atomic_load(&co->pruner.finished))) {
        pthread_join(co->pruner.thread, NULL);
        co->pruner.running = 0;
    }
}

/* Prunes below `newest` on the pruner thread; if the previous pruning still runs, this one is
 * left to the next commit (which prunes everything older than its own checkpoint anyway). */
static void prune_start(coord *co, long newest)
{
    prune_reap(co, 0);
    if (co->pruner.running)
        return;
    co->pruner.newest = newest;
    atomic_store(&co->pruner.finished, 0);
    if (pthread_create(&co->pruner.thread, NULL, prune_main, co) == 0)
        co->pruner.running = 1;
    else
        zs_ckpt_prune(co->ckpt_dir, newest, co->cfg.checkpoint.keep);
}

/* Frees both slots' arrays (a new map sizes them anew). */
static void ckpt_free_slots(coord *co)
{
    for (int k = 0; k < 2; k++) {
        free(co->pend[k].files);
        free(co->pend[k].have);
        free(co->pend[k].reported);
        co->pend[k] = (ckpt_pend){0};
    }
}

/* Frees a checkpoint slot for the next one (its arrays stay). */
static void ckpt_close_slot(ckpt_pend *cp)
{
    cp->step = 0;
}

/* Every server reported checkpoint cp->step and its step finished: commit it (manifest, the
 * step's metrics line, latest, pruning) or record why it failed; then, after the last step,
 * the export. */
static void ckpt_settle(coord *co, ckpt_pend *cp)
{
    double t0 = zs_now_s();
    long step = cp->step;
    char name[64], dir[4096];
    snprintf(name, sizeof name, "step-%08ld", step);
    zs_ckpt_step_dir(co->ckpt_dir, step, 0, dir, sizeof dir);
    ckpt_close_slot(cp);
    if (!cp->failed) {
        zs_ckpt_info info = {.step = step,
                             .steps_total = co->opts->steps,
                             .run_id = co->run_id,
                             .config_fingerprint = co->config_fp,
                             .data_fingerprint = co->data.fingerprint,
                             .data_ntokens = co->data.ntokens,
                             .model = co->cfg.model,
                             .total_floats = co->tt.total,
                             .shard_floats = co->map.shard_floats};
        if (co->ls_hist) {
            info.has_scaler = 1;
            info.scaler = co->ls_hist[step];
        }
        zs_err e = zs_ckpt_write_manifest(dir, &info, &co->tt, cp->files, co->map.n_shards);
        if (e == ZS_OK) {
            /* The step's metrics line before `latest` moves: a coordinator killed between the
             * two resumes from the previous checkpoint, which drops this line and runs the
             * step again; the other order could leave a committed step without its line.  A
             * line that cannot be written ends the job, and the checkpoint goes with it (its
             * step has no line: a resume from it would lack one). */
            write_metrics(co, &cp->st, cp->tps, cp->dt, name, NULL);
            if (co->done) {
                ckpt_discard(co, step);
                return;
            }
            e = zs_ckpt_set_latest(co->ckpt_dir, name);
            if (e != ZS_OK) {
                abort_job(co, zs_error(e, "checkpoint %ld: %s", step, zs_last_error()));
                return;
            }
            co->last_ckpt = step;
            co->prom.ckpt_at = zs_now_s();
            zs_prom_add(co->prom.ckpt_committed, 1);
            zs_prom_set(co->prom.ckpt_step, (double)step);
            zs_prom_set(co->prom.ckpt_age, 0);
            snprintf(co->last_ckpt_dir, sizeof co->last_ckpt_dir, "%s", dir);
            co->ckpt_error[0] = '\0';
            prune_start(co, step);
            ZS_INFO("coord: checkpoint %ld committed in %s (manifest, metrics line and latest took "
                    "%.1f ms)",
                    step, dir, (zs_now_s() - t0) * 1e3);
        } else {
            cp->failed = 1;
            snprintf(cp->error, sizeof cp->error, "%s", zs_last_error());
        }
    }
    if (cp->failed) {
        snprintf(co->ckpt_error, sizeof co->ckpt_error, "checkpoint %ld: %s", step, cp->error);
        zs_prom_add(co->prom.ckpt_failed, 1);
        ZS_ERROR("coord: checkpoint %ld failed: %s; %s", step, cp->error,
                 co->last_ckpt > 0 ? "the previous checkpoint stays the newest"
                                   : "there is no earlier checkpoint");
        ckpt_discard(co, step);
        if (step == co->opts->steps)
            snprintf(co->final_error, sizeof co->final_error, "%s", cp->error);
        write_metrics(co, &cp->st, cp->tps, cp->dt, NULL, cp->error);
    }
    if (!co->done && zs_coord_phase(co->cs) == ZS_PHASE_DONE)
        export_and_finish(co);
}

/* After the last step's checkpoint: the model out of it, then the end of the job. */
static void export_and_finish(coord *co)
{
    if (co->last_ckpt != co->opts->steps) {
        abort_job(co, zs_error(ZS_ERR_IO,
                               "the final checkpoint (step %ld) failed: %s; the weights of the "
                               "steps since the newest checkpoint are lost; %s%s",
                               co->opts->steps, co->final_error,
                               co->last_ckpt > 0 ? "resume from it with --resume "
                                                 : "there is no checkpoint to resume from",
                               co->last_ckpt > 0 ? co->last_ckpt_dir : ""));
        return;
    }
    char dir[4096];
    zs_ckpt ck;
    zs_err e = zs_ckpt_step_dir(co->ckpt_dir, co->last_ckpt, 0, dir, sizeof dir);
    if (e == ZS_OK)
        e = zs_ckpt_open(dir, &ck);
    if (e == ZS_OK) {
        e = zs_ckpt_export(&ck, co->opts->out_dir, NULL, NULL);
        zs_ckpt_close(&ck);
    }
    if (e != ZS_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", zs_last_error());
        abort_job(co, zs_error(e,
                               "exporting the model failed: %s; the training is complete in "
                               "checkpoint %s: export it later with `zshard export %s --out %s`",
                               why, dir, dir, co->opts->out_dir));
        return;
    }
    ZS_INFO("coord: wrote %s/model.safetensors and %s/config.json from %s", co->opts->out_dir,
            co->opts->out_dir, dir);
    broadcast_shutdown(co, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE, "the job is done");
    co->done = 1;
}

/* The open checkpoint of version step, or NULL. */
static ckpt_pend *ckpt_slot(coord *co, long step)
{
    for (int k = 0; k < 2; k++)
        if (co->pend[k].step == step && step > 0)
            return &co->pend[k];
    return NULL;
}

/* A server's report of its files of checkpoint cw->step. */
static void on_checkpoint_written(coord *co, int pi, const Zshard__CheckpointWritten *cw)
{
    peer_entry *p = &co->peers[pi];
    int s = zs_shardmap_server_index(&co->map, (uint32_t)(pi + 1));
    ckpt_pend *cp = ckpt_slot(co, (long)cw->step);
    if (s < 0 || !cp || cp->reported[s]) {
        send_error(co, &p->peer, ZSHARD__ERROR_CODE__ERROR_OUT_OF_ORDER,
                   "CheckpointWritten for a checkpoint that is not being written, or a repeat");
        return;
    }
    if (cw->error) {
        if (!cp->failed)
            snprintf(cp->error, sizeof cp->error, "server %d: %s", pi + 1, cw->error);
        cp->failed = 1;
    } else {
        int count = 0;
        const int *mine = zs_shardmap_server_shards(&co->map, s, &count);
        int ok = (int)cw->n_files == count;
        for (int i = 0; ok && i < count; i++)
            ok = (int)cw->files[i]->shard == mine[i];
        if (!ok) {
            snprintf(cp->error, sizeof cp->error,
                     "server %d reported %zu files, not one for each of its %d shards", pi + 1,
                     cw->n_files, count);
            cp->failed = 1;
            send_error(co, &p->peer, ZSHARD__ERROR_CODE__ERROR_OUT_OF_ORDER, cp->error);
        }
        for (int i = 0; ok && i < count; i++) {
            const Zshard__ShardFile *f = cw->files[i];
            const zs_shard *sh = &co->map.shards[f->shard];
            zs_ckpt_shard *d = &cp->files[f->shard];
            *d = (zs_ckpt_shard){.index = (int)f->shard,
                                 .begin = sh->begin,
                                 .end = sh->end,
                                 .bytes = f->bytes,
                                 .header_xxh3 = f->header_xxh3};
            snprintf(d->file, sizeof d->file, "%s", f->file);
            memcpy(d->xxh3, f->xxh3, sizeof d->xxh3);
            cp->have[f->shard] = 1;
        }
    }
    cp->reported[s] = 1;
    if (++cp->n_reported == co->map.n_servers && cp->have_stats)
        ckpt_settle(co, cp);
}

/*
 * When the verdict of a step goes out whose version is checkpointed: from now on a server
 * may have applied, published and written it, so its report may come before the step counts
 * as finished here.  Opens a slot for those reports.
 */
static void ckpt_open(coord *co, long version)
{
    if (!ckpt_due(co, version) || !co->pend[0].files || ckpt_slot(co, version))
        return;
    ckpt_pend *cp = co->pend[0].step == 0 ? &co->pend[0] : &co->pend[1];
    if (cp->step != 0) {
        /* Two open already (cannot happen: a server reports s before it publishes s + 1). */
        ZS_ERROR("coord: checkpoint %ld: two checkpoints are open already", version);
        return;
    }
    cp->step = version;
    cp->have_stats = 0;
    cp->n_reported = 0;
    cp->failed = 0;
    cp->error[0] = '\0';
    memset(cp->reported, 0, (size_t)co->map.n_servers);
    memset(cp->have, 0, (size_t)co->map.n_shards);
}

/* Every server published the step's version (or its replica will: a failover): its line, its
 * checkpoint's outcome, the end of the job after the last. */
static void step_finished(coord *co, zs_coord_step_stats st)
{
    double dt = zs_now_s() - co->step_start;
    double tps = (double)co->cfg.train_batch_size * co->cfg.model.block_size / dt;
    co->last_loss = st.loss;
    co->last_tps = tps;
    zs_prom_set(co->prom.step, (double)st.step);
    zs_prom_set(co->prom.loss, st.loss);
    zs_prom_set(co->prom.lr, st.lr);
    zs_prom_set(co->prom.grad_norm, st.grad_norm);
    zs_prom_set(co->prom.tps, tps);
    zs_prom_observe(co->prom.step_seconds, dt);
    zs_prom_add(co->prom.steps_finished, 1);
    zs_prom_add(co->prom.skipped, st.skipped ? 1 : 0);
    if (co->cfg.fp16.enabled)
        zs_prom_set(co->prom.loss_scale, zs_coord_scaler(co->cs)->scale);
    if (co->ls_hist && st.step >= co->start_step && st.step <= co->opts->steps)
        co->ls_hist[st.step] = *zs_coord_scaler(co->cs);
    char tail[96];
    fprintf(
        stderr,
        "step %5ld/%ld | loss %.4f | lr %.3e | norm %.4f | %8.0f tok/s | %d workers"
        " | eta %.0fs%s\n",
        st.step, co->opts->steps, st.loss, st.lr, st.grad_norm, tps, st.workers,
        dt * (double)(co->opts->steps - st.step),
        zs_lossscale_progress(tail, sizeof tail, co->cfg.fp16.enabled, st.loss_scale, st.skipped));
    if (st.scaler_error[0]) {
        /* DeepSpeed ends the run here (an overflow at the minimum loss scale): the step's
         * line first, so that metrics.jsonl says where. */
        write_metrics(co, &st, tps, dt, NULL, NULL);
        if (!co->done)
            abort_job(co, zs_error(ZS_ERR_INVALID, "%s", st.scaler_error));
        return;
    }
    int last = zs_coord_phase(co->cs) == ZS_PHASE_DONE;
    if (last && co->hooks.finish) {
        write_metrics(co, &st, tps, dt, NULL, NULL);
        zs_err e = co->done ? ZS_OK : co->hooks.finish(co->hooks.user);
        if (co->done)
            return;
        if (e != ZS_OK) {
            abort_job(co, e);
            return;
        }
        broadcast_shutdown(co, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE, "the job is done");
        co->done = 1;
        return;
    }
    /* An earlier checkpoint still open is settled first (as failed: every server reports a
     * version's files before it publishes the next one), so that the lines stay in order. */
    for (int k = 0; k < 2 && !co->done; k++) {
        ckpt_pend *old = &co->pend[k];
        if (old->step && old->step < st.step && old->have_stats) {
            snprintf(old->error, sizeof old->error,
                     "not every server reported its files before the next step finished");
            old->failed = 1;
            ckpt_settle(co, old);
        }
    }
    if (co->done)
        return;
    ckpt_pend *cp = ckpt_slot(co, st.step);
    if (!cp) {
        write_metrics(co, &st, tps, dt, NULL, NULL);
        return;
    }
    /* The servers write version st.step (some may have reported already); their reports
     * settle it, and its line waits until then. */
    cp->have_stats = 1;
    cp->st = st;
    cp->tps = tps;
    cp->dt = dt;
    if (cp->n_reported == co->map.n_servers)
        ckpt_settle(co, cp);
}

static void on_published(coord *co, int pi, const Zshard__VersionPublished *vp)
{
    zs_coord_step_stats st;
    if (zs_coord_published(co->cs, co->peers[pi].cs_id, (long)vp->version, &st))
        step_finished(co, st);
}

static const char *phase_name(const coord *co)
{
    if (!co->cs)
        return "waiting for servers";
    switch (zs_coord_phase(co->cs)) {
    case ZS_PHASE_WAIT_SERVERS:
        return "waiting for servers";
    case ZS_PHASE_WAIT_WORKERS:
        return "waiting for workers";
    case ZS_PHASE_COMPUTE:
        return "computing";
    case ZS_PHASE_VERDICT:
        return "gradient norm";
    case ZS_PHASE_PUBLISH:
        return "optimizer step";
    case ZS_PHASE_DONE:
        return "done";
    }
    return "unknown";
}

/* The map index of the server whose replica peer pi (a server) holds, or -1: none (no
 * replicas, no map yet, not in the map). */
static int replica_held(const coord *co, int pi)
{
    if (co->cfg.checkpoint.replicas < 1 || !co->map_made || !co->replica_current)
        return -1;
    int h = zs_shardmap_server_index(&co->map, (uint32_t)(pi + 1));
    for (int s = 0; s < co->map.n_servers && h >= 0; s++)
        if (s != h && zs_shardmap_replica(&co->map, s) == h)
            return s;
    return -1;
}

/* Answers a StatusRequest: the step, and every peer that ever registered. */
static void send_status(coord *co, const zs_ctrl_peer *to)
{
    int n = co->n_peers;
    Zshard__MemberStatus *ms = calloc((size_t)(n ? n : 1), sizeof *ms);
    Zshard__MemberStatus **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    int *chunks = co->cs ? malloc((size_t)co->cfg.chunks * sizeof *chunks) : NULL;
    if (!ms || !ptrs || (co->cs && !chunks)) {
        send_error(co, to, ZSHARD__ERROR_CODE__ERROR_REFUSED, "coord: out of memory for status");
        goto out;
    }
    uint64_t now = now_ms(co);
    double tokens_per_chunk = (double)co->cfg.micro_batch * co->cfg.model.block_size;
    for (int i = 0; i < n; i++) {
        const peer_entry *p = &co->peers[i];
        Zshard__MemberStatus *m = &ms[i];
        zshard__member_status__init(m);
        m->has_id = m->has_role = m->has_state = m->has_pid = 1;
        m->id = (uint32_t)(i + 1);
        m->role = p->role;
        m->state = p->gone         ? ZSHARD__MEMBER_STATE__MEMBER_GONE
                   : p->cs_id >= 0 ? ZSHARD__MEMBER_STATE__MEMBER_ACTIVE
                                   : ZSHARD__MEMBER_STATE__MEMBER_JOINING;
        m->reason = p->gone ? (char *)p->gone_why : (char *)"";
        m->endpoint = (char *)p->endpoint;
        m->hostname = (char *)p->hostname;
        m->pid = p->pid;
        const zs_member *cm = co->cs && p->cs_id >= 0 ? zs_coord_member(co->cs, p->cs_id) : NULL;
        if (cm) {
            m->has_heartbeat_age_ms = 1;
            m->heartbeat_age_ms = now > cm->last_heartbeat_ms ? now - cm->last_heartbeat_ms : 0;
            if (p->role == ZSHARD__ROLE__ROLE_WORKER) {
                m->has_chunks_done = m->has_chunks_assigned = m->has_tokens_per_sec = 1;
                m->chunks_done = (uint32_t)cm->chunks_done;
                m->chunks_assigned = cm->alive ? (uint32_t)zs_coord_assigned(co->cs, p->cs_id,
                                                                             chunks, co->cfg.chunks)
                                               : 0;
                m->tokens_per_sec =
                    cm->last_chunk_ms > 0 ? tokens_per_chunk / (cm->last_chunk_ms / 1e3) : 0;
            }
        }
        int held = p->role == ZSHARD__ROLE__ROLE_SERVER && !p->gone ? replica_held(co, i) : -1;
        if (held >= 0) {
            m->has_replica_of = m->has_replica_current = 1;
            m->replica_of = co->map.server_ids[held];
            m->replica_current = co->replica_current[held] != 0;
        }
        ptrs[i] = m;
    }
    Zshard__StatusReply r = ZSHARD__STATUS_REPLY__INIT;
    r.has_steps_done = r.has_steps = r.has_loss = r.has_tokens_per_sec = r.has_live_workers = 1;
    r.steps_done = co->cs ? (uint64_t)zs_coord_step(co->cs) : 0;
    r.steps = (uint64_t)co->opts->steps;
    r.phase = (char *)phase_name(co);
    r.loss = r.steps_done ? co->last_loss : NAN;
    r.tokens_per_sec = r.steps_done ? co->last_tps : 0;
    r.live_workers = co->cs ? (uint32_t)zs_coord_live_workers(co->cs) : 0;
    r.has_last_checkpoint = 1;
    r.last_checkpoint = (uint64_t)co->last_ckpt;
    r.checkpoint_dir = co->ckpt_dir;
    r.checkpoint_error = co->ckpt_error;
    r.n_members = (size_t)n;
    r.members = ptrs;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_STATUS_REPLY;
    env.status_reply = &r;
    send_env(co, to, &env);
out:
    free(ms);
    free(ptrs);
    free(chunks);
}

/*
 * Server pi of the map is gone: its shards' state is lost, so every server goes back to the
 * newest committed checkpoint (or the job's start) and the steps since are computed again --
 * the same bits, as every step is a pure function of the state before it.  Now: the step in
 * hand and any checkpoint being written are abandoned, the workers are told to register
 * again (they hold nothing; they get the new map), and the step state is dropped.  After a
 * short wait for spares to register (finish_recovery), the new map goes out over the servers
 * left and the spares.
 */
/* Tells every worker to register again (it holds nothing; it gets the new map then). */
static void rejoin_workers(coord *co, const char *text)
{
    co->rejoin_expected = 0;
    co->rejoin_until = now_ms(co) + (uint64_t)co->cfg.cluster.heartbeat_timeout_ms;
    for (int i = 0; i < co->n_peers; i++) {
        peer_entry *w = &co->peers[i];
        if (w->role != ZSHARD__ROLE__ROLE_WORKER || w->gone)
            continue;
        co->rejoin_expected++;
        send_shutdown_to(co, &w->peer, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_REJOIN, text, 1);
        w->gone = w->rejoining = 1;
        snprintf(w->gone_why, sizeof w->gone_why, "told to register again: %s", text);
    }
}

static void start_recovery(coord *co, int pi, const char *why)
{
    co->recoveries++;
    zs_prom_add(co->prom.recoveries, 1);
    char back[160];
    if (co->last_ckpt > 0)
        snprintf(back, sizeof back, "checkpoint %ld", co->last_ckpt);
    else
        snprintf(back, sizeof back, "the job's start");
    ZS_WARN("coord: server %d is gone (%s): every server goes back to %s and the %ld steps "
            "since are computed again",
            pi + 1, why, back, (co->cs ? zs_coord_step(co->cs) : co->last_ckpt) - co->last_ckpt);
    char text[320];
    snprintf(text, sizeof text, "server %d was lost; the job goes back to %s", pi + 1, back);
    rejoin_workers(co, text);
    co->failover = 0;
    for (int k = 0; k < 2; k++)
        if (co->pend[k].step) {
            ckpt_discard(co, co->pend[k].step);
            ckpt_close_slot(&co->pend[k]);
        }
    zs_coord_state_free(co->cs);
    co->cs = NULL;
    for (int i = 0; i < co->n_peers; i++) {
        co->peers[i].cs_id = -1;
        co->peers[i].ready = 0;
        co->peers[i].has_job = co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER;
    }
    co->servers_ready = 0;
    if (co->have_map)
        zs_shardmap_free(&co->map);
    co->have_map = 0;
    if (co->map_msg)
        zshard__shard_map__free_unpacked(co->map_msg, NULL);
    co->map_msg = NULL;
    ckpt_free_slots(co);
    co->recovering = 1;
    co->restoring = 0;
    /* Long enough for a replacement that was started at once (zshard launch, a supervisor)
     * to register; short against the heartbeat timeout that found the loss. */
    uint64_t wait = (uint64_t)co->cfg.cluster.heartbeat_timeout_ms / 2;
    co->recover_at = now_ms(co) + (wait < 2000 ? wait : 2000);
}

/* The end of a recovery: the map over the servers left and the spares, Restore to each, the
 * metrics back to the checkpoint, and the step state from its step on. */
static void finish_recovery(coord *co)
{
    co->recovering = 0;
    if (live_servers(co) == 0) {
        abort_job(co, zs_error(ZS_ERR_IO,
                               "every partition server is gone; the newest "
                               "checkpoint is %s",
                               co->last_ckpt > 0 ? co->last_ckpt_dir : "none"));
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", co->opts->out_dir);
    zs_err e = zs_metrics_close(co->metrics);
    co->metrics = NULL;
    if (e == ZS_OK)
        e = zs_metrics_open(path, co->last_ckpt, &co->metrics);
    if (e == ZS_OK)
        e = make_map(co, 1);
    co->restoring = 1;
    if (e != ZS_OK) {
        abort_job(co, e);
        return;
    }
    ZS_WARN("coord: recovered: %d servers from %s; step %ld runs again", co->n_servers,
            co->last_ckpt > 0 ? co->last_ckpt_dir : "the job's start", co->last_ckpt + 1);
}

/*
 * Whether lost server pi can be failed over to its replica: replicas are on, its holder is alive
 * and said the replica is current, and no recovery or other failover is under way (a second
 * loss before the first is repaired goes back to the checkpoint).
 */
static int can_failover(const coord *co, int pi)
{
    if (co->cfg.checkpoint.replicas <= 0 || co->recovering || co->restoring || co->failover ||
        !co->cs || !co->have_map)
        return 0;
    int x = zs_shardmap_server_index(&co->map, (uint32_t)(pi + 1));
    int h = zs_shardmap_replica(&co->map, x);
    return x >= 0 && h >= 0 && co->replica_current[x] && !co->peers[co->map.server_ids[h] - 1].gone;
}

/*
 * Failover, the first half: the workers register again (the map changes under them), and if
 * the step in hand has its verdict out already, the lost server counts as having published it
 * (the replica applies that verdict too); the rest waits until the step is finished
 * (finish_failover from advance).
 */
static void start_failover(coord *co, int pi, const char *why)
{
    co->failovers++;
    zs_prom_add(co->prom.failovers, 1);
    co->failover = 1;
    co->failover_pi = pi;
    int x = zs_shardmap_server_index(&co->map, (uint32_t)(pi + 1));
    uint32_t h = co->map.server_ids[zs_shardmap_replica(&co->map, x)];
    ZS_WARN("coord: server %d is gone (%s): server %u holds its replica and takes its shards; the "
            "job goes on from memory at step %ld, no step is computed again",
            pi + 1, why, h, zs_coord_step(co->cs) + 1);
    char text[320];
    snprintf(text, sizeof text, "server %d was lost; its replica on server %u takes over", pi + 1,
             h);
    rejoin_workers(co, text);
    /* Workers that register again meanwhile get the job with the new map, once its servers
     * are ready (on_ready), not the old one now. */
    co->restoring = 1;
    zs_coord_step_stats st;
    if (zs_coord_phase(co->cs) == ZS_PHASE_PUBLISH &&
        zs_coord_published(co->cs, co->peers[pi].cs_id, zs_coord_step(co->cs) + 1, &st))
        step_finished(co, st);
}

/*
 * Failover, the second half, at a step boundary (version V: the step in hand starts again from
 * its first chunk): the map over the servers left, the lost server's shards on its replica's
 * holder, every other shard where it was; a Restore from memory to each (which also has them
 * write checkpoint V again if the lost server never wrote its part); step state from V.
 */
static void finish_failover(coord *co)
{
    co->failover = 0;
    long V = zs_coord_step(co->cs);
    int done = zs_coord_phase(co->cs) == ZS_PHASE_DONE;
    int x = zs_shardmap_server_index(&co->map, (uint32_t)(co->failover_pi + 1));
    int h = zs_shardmap_replica(&co->map, x);
    int S = co->map.n_servers, n = 0;
    uint32_t *ids = malloc((size_t)S * sizeof *ids);
    const char **eps = malloc((size_t)S * sizeof *eps);
    int *newidx = malloc((size_t)S * sizeof *newidx);
    int *assign = malloc((size_t)co->map.n_shards * sizeof *assign);
    zs_err e = ZS_OK;
    if (!ids || !eps || !newidx || !assign) {
        e = zs_error(ZS_ERR_NOMEM, "coord: out of memory for the failover");
        goto out;
    }
    for (int s = 0; s < S; s++) {
        newidx[s] = -1;
        if (s == x)
            continue;
        ids[n] = co->map.server_ids[s];
        eps[n] = co->peers[ids[n] - 1].endpoint;
        newidx[s] = n++;
    }
    for (int i = 0; i < co->map.n_shards; i++) {
        int o = co->map.shards[i].server;
        assign[i] = newidx[o == x ? h : o];
    }
    size_t total = co->map.total, sf = co->map.shard_floats;
    int n_shards = co->map.n_shards;
    zs_shardmap_free(&co->map);
    e = zs_shardmap_assemble(total, sf, n_shards, n, ids, assign, &co->map);
    if (e != ZS_OK) {
        co->have_map = 0;
        goto out;
    }
    zs_shardmap_set_replicas(&co->map, co->cfg.checkpoint.replicas);
    if (co->map_msg)
        zshard__shard_map__free_unpacked(co->map_msg, NULL);
    co->map_msg = NULL;
    e = zs_shardmap_to_msg(&co->map, eps, &co->map_msg);
    if (e != ZS_OK)
        goto out;
    co->n_servers = n;
    memset(co->replica_current, 0, (size_t)S);
    /* The checkpoint of V (its step finished, its line waits): everyone writes it again.  An
     * older one still open cannot be completed any more. */
    int rewrite = 0;
    for (int k = 0; k < 2; k++) {
        ckpt_pend *cp = &co->pend[k];
        if (!cp->step)
            continue;
        if (cp->step == V && cp->have_stats) {
            rewrite = 1;
            cp->n_reported = 0;
            cp->failed = 0;
            cp->error[0] = '\0';
            memset(cp->reported, 0, (size_t)S);
            memset(cp->have, 0, (size_t)n_shards);
        } else if (cp->have_stats) {
            snprintf(cp->error, sizeof cp->error, "server %d was lost before it wrote its files",
                     co->failover_pi + 1);
            cp->failed = 1;
            ckpt_settle(co, cp);
        } else {
            ckpt_discard(co, cp->step);
            ckpt_close_slot(cp);
        }
    }
    if (!done) {
        zs_coord_state_free(co->cs);
        co->cs = NULL;
        for (int i = 0; i < co->n_peers; i++)
            co->peers[i].cs_id = -1;
        e = zs_coord_state_create(&co->cfg, n, n_shards, co->opts->steps, &co->cs);
        if (e == ZS_OK && V > 0)
            e = zs_coord_state_start_at(co->cs, V);
        if (e == ZS_OK && co->ls_hist)
            zs_coord_set_scaler(co->cs, &co->ls_hist[V]);
        if (e != ZS_OK)
            goto out;
    }
    co->servers_ready = 0;
    co->restoring = 1;
    for (int s = 0; s < n; s++) {
        peer_entry *p = &co->peers[ids[s] - 1];
        p->ready = 0;
        if (!done)
            zs_coord_join(co->cs, ZS_MEMBER_SERVER, (int)ids[s], p->endpoint, now_ms(co),
                          &p->cs_id);
        send_restore(co, &p->peer, V, NULL, rewrite);
    }
    ZS_WARN("coord: failed over: %d servers, from memory at version %ld%s", n, V,
            rewrite ? "; its checkpoint is written again" : "");
out:
    free(ids);
    free(eps);
    free(newidx);
    free(assign);
    if (e != ZS_OK)
        abort_job(co, e);
}

/* A member is gone (left, or its heartbeats stopped): a server of the map is failed over to its
 * replica (start_failover) or recovered from (start_recovery), a worker's chunks go to the
 * others. */
static void member_gone(coord *co, int pi, const char *why)
{
    peer_entry *p = &co->peers[pi];
    if (p->gone)
        return;
    p->gone = 1;
    snprintf(p->gone_why, sizeof p->gone_why, "%s", why);
    /* The servers close its data-plane connections and let it in no more. */
    Zshard__MemberGone mg = ZSHARD__MEMBER_GONE__INIT;
    mg.has_member = 1;
    mg.member = (uint32_t)(pi + 1);
    mg.reason = (char *)why;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_MEMBER_GONE;
    env.member_gone = &mg;
    for (int i = 0; i < co->n_peers; i++)
        if (i != pi && co->peers[i].role == ZSHARD__ROLE__ROLE_SERVER && !co->peers[i].gone)
            send_env_to(co, &co->peers[i].peer, &env, 1);
    if (p->cs_id >= 0 && zs_coord_member(co->cs, p->cs_id)->alive)
        zs_coord_leave(co->cs, p->cs_id, why); /* which logs it */
    else if (p->cs_id < 0 && p->role == ZSHARD__ROLE__ROLE_WORKER)
        ZS_WARN("coord: worker %d left before it joined: %s", pi + 1, why);
    if (p->role == ZSHARD__ROLE__ROLE_SERVER) {
        if (co->have_map && zs_shardmap_server_index(&co->map, (uint32_t)(pi + 1)) >= 0) {
            if (can_failover(co, pi))
                start_failover(co, pi, why);
            else
                start_recovery(co, pi, why);
        } else
            ZS_WARN("coord: spare server %d is gone (%s)", pi + 1, why);
        return;
    }
    co->assignment_dirty = 1;
}

static void on_message(coord *co, const zs_ctrl_peer *from, const Zshard__Envelope *env)
{
    if (env->body_case == ZSHARD__ENVELOPE__BODY_REGISTRATION) {
        on_register(co, from, env->registration);
        return;
    }
    if (env->body_case == ZSHARD__ENVELOPE__BODY_STATUS_REQUEST) {
        send_status(co, from);
        return;
    }
    int pi = (int)env->sender - 1;
    if (pi >= 0 && pi < co->n_peers && co->peers[pi].rejoining &&
        co->peers[pi].peer.len == from->len &&
        memcmp(co->peers[pi].peer.id, from->id, from->len) == 0)
        return; /* told to register again; what it sends before it does is moot */
    if (pi >= 0 && pi < co->n_peers && co->peers[pi].gone && co->peers[pi].peer.len == from->len &&
        memcmp(co->peers[pi].peer.id, from->id, from->len) == 0) {
        /* A member declared dead that is still running (it hung, and came back): it must
         * stop, its chunks are someone else's now.  Its data-plane pushes, if any, are
         * refused by the servers as stale or not assigned. */
        char text[512];
        int server = co->peers[pi].role == ZSHARD__ROLE__ROLE_SERVER;
        snprintf(text, sizeof text, "%s %d was dropped from the job (%s); its %s went to others",
                 server ? "server" : "worker", pi + 1, co->peers[pi].gone_why,
                 server ? "shards" : "chunks");
        send_shutdown(co, from, ZSHARD__SHUTDOWN_KIND__SHUTDOWN_ABORT, text);
        return;
    }
    if (pi < 0 || pi >= co->n_peers || co->peers[pi].peer.len != from->len ||
        memcmp(co->peers[pi].peer.id, from->id, from->len) != 0 || co->peers[pi].gone) {
        send_error(co, from, ZSHARD__ERROR_CODE__ERROR_NOT_REGISTERED,
                   "sender id is not registered from this connection");
        return;
    }
    peer_entry *p = &co->peers[pi];
    if (co->cs && p->cs_id >= 0)
        zs_coord_heartbeat(co->cs, p->cs_id, now_ms(co));
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_HEARTBEAT:
        if (p->cs_id >= 0 && p->role == ZSHARD__ROLE__ROLE_SERVER && env->heartbeat->chunks_listed)
            zs_coord_server_chunks(co->cs, p->cs_id, (long)env->heartbeat->step,
                                   env->heartbeat->chunks_in, (int)env->heartbeat->n_chunks_in);
        break;
    case ZSHARD__ENVELOPE__BODY_READY:
        if (co->cs)
            on_ready(co, pi, env->ready);
        break;
    case ZSHARD__ENVELOPE__BODY_CHUNK_DONE:
        if (p->cs_id >= 0) {
            const Zshard__ChunkDone *cd = env->chunk_done;
            zs_msg_chunk_times t = {.compute_ms = cd->compute_ms,
                                    .fetch_wait_ms = cd->fetch_wait_ms,
                                    .push_wait_ms = cd->push_wait_ms};
            zs_coord_chunk_done(co->cs, p->cs_id, (long)cd->step, (int)cd->chunk, cd->loss,
                                cd->has_compute_ms ? &t : NULL);
        }
        break;
    case ZSHARD__ENVELOPE__BODY_GRAD_NORM_PARTIAL:
        if (p->role == ZSHARD__ROLE__ROLE_SERVER && co->cs)
            on_partial(co, pi, env->grad_norm_partial);
        break;
    case ZSHARD__ENVELOPE__BODY_VERSION_PUBLISHED:
        if (p->role == ZSHARD__ROLE__ROLE_SERVER && co->cs)
            on_published(co, pi, env->version_published);
        break;
    case ZSHARD__ENVELOPE__BODY_CHECKPOINT_WRITTEN:
        if (p->role == ZSHARD__ROLE__ROLE_SERVER && co->cs)
            on_checkpoint_written(co, pi, env->checkpoint_written);
        break;
    case ZSHARD__ENVELOPE__BODY_SHUTDOWN:
        member_gone(co, pi, env->shutdown->reason ? env->shutdown->reason : "left");
        break;
    case ZSHARD__ENVELOPE__BODY_ERROR:
        ZS_WARN("coord: error from peer %d: %s", pi + 1, env->error->text);
        break;
    default:
        send_error(co, from, ZSHARD__ERROR_CODE__ERROR_OUT_OF_ORDER, "unexpected message");
        break;
    }
}

/* fp16 jobs: the scaler's history, from the fresh state or the resumed checkpoint's. */
static zs_err scaler_setup(coord *co, const zs_ckpt *ck)
{
    if (!co->cfg.fp16.enabled)
        return ZS_OK;
    co->ls_hist = calloc((size_t)co->opts->steps + 1, sizeof *co->ls_hist);
    if (!co->ls_hist)
        return zs_error(ZS_ERR_NOMEM, "coord: out of memory for the loss scaler of %ld steps",
                        co->opts->steps);
    zs_lossscale *ls = &co->ls_hist[co->start_step];
    zs_lossscale_init(ls, &co->cfg.fp16);
    if (!ck)
        return ZS_OK;
    /* The fingerprint matched, so the checkpoint is of an fp16 job: it carries the state. */
    return zs_ckpt_scaler(ck, &co->cfg.fp16, ls);
}

/*
 * The checkpoint directory (checkpoint.dir, or OUT/checkpoints; made absolute, since the
 * servers resolve it too) and, for a resume, the checkpoint to start from: resolved (its
 * newest valid one for a directory), fully verified and checked against this run's config,
 * data and model; its run id and step go into the job.  A fresh run gets a new random id.
 */
static zs_err checkpoint_setup(coord *co, zs_msg_job *job)
{
    /* The resume first: a refused one must leave nothing behind (no empty directory). */
    int resume = co->opts->resume != NULL;
    if (resume && co->opts->resume_if_any) {
        ZS_CHECK(zs_ckpt_present(co->opts->resume, &resume));
        if (!resume)
            ZS_INFO("coord: %s holds no checkpoint yet: a fresh start", co->opts->resume);
    }
    if (resume) {
        zs_ckpt ck;
        ZS_CHECK(zs_ckpt_resolve(co->opts->resume, &ck));
        zs_ckpt_info mine = {.steps_total = co->opts->steps,
                             .config_fingerprint = co->config_fp,
                             .data_fingerprint = co->data.fingerprint,
                             .data_ntokens = co->data.ntokens,
                             .model = co->cfg.model,
                             .total_floats = co->tt.total};
        zs_err res = zs_ckpt_check_compatible(&ck, &mine);
        if (res == ZS_OK && strlen(ck.step_dir) >= sizeof job->resume_dir)
            res = zs_error(ZS_ERR_INVALID, "--resume %s: too long a path", ck.step_dir);
        if (res == ZS_OK) {
            co->run_id = job->run_id = ck.info.run_id;
            co->start_step = job->resume_step = ck.info.step;
            co->last_ckpt = ck.info.step;
            snprintf(co->last_ckpt_dir, sizeof co->last_ckpt_dir, "%s", ck.step_dir);
            snprintf(job->resume_dir, sizeof job->resume_dir, "%s", ck.step_dir);
            ZS_INFO("coord: resuming run %016llx from %s (step %ld of %ld)",
                    (unsigned long long)co->run_id, ck.step_dir, ck.info.step, co->opts->steps);
            res = scaler_setup(co, &ck);
        }
        zs_ckpt_close(&ck);
        ZS_CHECK(res);
    } else if (getrandom(&co->run_id, sizeof co->run_id, 0) != sizeof co->run_id) {
        return zs_error(ZS_ERR_IO, "coord: no random run id: %s", strerror(errno));
    } else {
        job->run_id = co->run_id;
        ZS_CHECK(scaler_setup(co, NULL));
    }
    if (mkdir(co->opts->out_dir, 0777) != 0 && errno != EEXIST)
        return zs_error(ZS_ERR_IO, "--out %s: %s", co->opts->out_dir, strerror(errno));
    char dir[4096];
    if (co->cfg.checkpoint.dir[0])
        snprintf(dir, sizeof dir, "%s", co->cfg.checkpoint.dir);
    else if (snprintf(dir, sizeof dir, "%s/checkpoints", co->opts->out_dir) >= (int)sizeof dir)
        return zs_error(ZS_ERR_INVALID, "--out %s: too long a path", co->opts->out_dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return zs_error(ZS_ERR_IO, "checkpoint.dir %s: %s", dir, strerror(errno));
    char *abs = realpath(dir, NULL);
    if (!abs)
        return zs_error(ZS_ERR_IO, "checkpoint.dir %s: %s", dir, strerror(errno));
    if (strlen(abs) >= sizeof co->ckpt_dir - 32) {
        free(abs);
        return zs_error(ZS_ERR_INVALID, "checkpoint.dir %s: too long a path", dir);
    }
    snprintf(co->ckpt_dir, sizeof co->ckpt_dir, "%s", abs);
    snprintf(co->cfg.checkpoint.dir, sizeof co->cfg.checkpoint.dir, "%s", abs);
    free(abs);
    return ZS_OK;
}

static zs_err prom_setup(coord *co);

static zs_err coord_setup(coord *co)
{
    ZS_CHECK(zs_config_load(co->opts->config_path, &co->cfg));
    ZS_CHECK(zs_data_open(co->opts->data_path, &co->data));
    ZS_CHECK(zs_data_check(&co->data, co->cfg.model.vocab_size, co->cfg.model.block_size));
    ZS_CHECK(zs_tensors_gpt2(&co->cfg.model, &co->tt));
    co->config_fp = zs_config_fingerprint(&co->cfg);
    zs_msg_job job = {.data_fingerprint = co->data.fingerprint,
                      .data_ntokens = co->data.ntokens,
                      .steps = (uint32_t)co->opts->steps,
                      .config_fingerprint = co->config_fp};
    char *abs = realpath(co->opts->data_path, NULL);
    snprintf(job.data_path, sizeof job.data_path, "%s", abs ? abs : co->opts->data_path);
    free(abs);
    ZS_CHECK(checkpoint_setup(co, &job));
    ZS_CHECK(zs_msg_jobspec_from_config(&co->cfg, &co->tt, &job, &co->job));
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", co->opts->out_dir);
    ZS_CHECK(zs_metrics_open(path, co->start_step > 0 ? co->start_step : -1, &co->metrics));
    ZS_CHECK(prom_setup(co));
    co->cap_peers = 64;
    co->peers = calloc((size_t)co->cap_peers, sizeof *co->peers);
    size_t C = (size_t)co->cfg.chunks;
    co->chunk_since = calloc(C, sizeof *co->chunk_since);
    co->chunk_seen = malloc(C * sizeof *co->chunk_seen);
    co->chunk_timed = calloc(C, 1);
    if (!co->peers || !co->chunk_since || !co->chunk_seen || !co->chunk_timed)
        return zs_error(ZS_ERR_NOMEM, "coord: out of memory");
    co->deadline_step = -1; /* check_deadlines begins its bookkeeping at the first step */
    co->ctx = (zs_msg_ctx){.self = ZS_MSG_COORDINATOR,
                           .chunks = (uint32_t)co->cfg.chunks,
                           .steps = (uint32_t)co->opts->steps};
    ZS_CHECK(zs_sodium_init());
    if (co->opts->secret && !co->opts->secret->insecure)
        zs_random_bytes(co->data_key, sizeof co->data_key);
    if (co->opts->listen)
        ZS_CHECK(zs_ctrl_bind(co->opts->listen, co->opts->secret, &co->ctrl));
    ZS_INFO("coord: listening on %s for %d servers; %ld steps of %d chunks",
            co->ctrl ? zs_ctrl_endpoint(co->ctrl) : "(no socket)", co->opts->servers,
            co->opts->steps, co->cfg.chunks);
    return ZS_OK;
}

/* How often the loop recomputes the series that are counts over the members or ages. */
#define PROM_REFRESH_MS 250

/*
 * Registers the coordinator's series in opts->prom (docs/observability.md lists them).
 * Members are counted by role and state, never labelled one by one: an elastic job sees
 * workers come and go for days, and a label per member would grow without bound.
 */
static zs_err prom_setup(coord *co)
{
    zs_prom *r = co->opts->prom;
    if (!r)
        return ZS_OK;
    static const char *const roles[2] = {"server", "worker"};
    static const char *const states[3] = {"joining", "active", "gone"};
    const zs_prom_def defs[] = {
        {&co->prom.step, 1, "zshard_step", "Steps finished: the version every server published"},
        {&co->prom.steps, 1, "zshard_steps", "Optimizer steps of the whole run (--steps)"},
        {&co->prom.loss, 1, "zshard_loss", "Mean training loss of the last finished step"},
        {&co->prom.lr, 1, "zshard_learning_rate", "Learning rate of the last finished step"},
        {&co->prom.grad_norm, 1, "zshard_grad_norm",
         "Global gradient norm of the last finished step, before clipping"},
        {&co->prom.tps, 1, "zshard_tokens_per_second",
         "Tokens per second of the last finished step"},
        {&co->prom.workers_live, 1, "zshard_workers_live", "Workers taking chunks now"},
        {&co->prom.replicas_current, 1, "zshard_replicas_current",
         "Servers of the map whose replica is current (checkpoint.replicas: losing one of them "
         "costs no step)"},
        {&co->prom.steps_finished, 0, "zshard_steps_finished_total",
         "Steps finished, counting again those computed again after a server was lost"},
        {&co->prom.skipped, 0, "zshard_skipped_steps_total",
         "Steps whose update was skipped because the gradient was not finite"},
        {&co->prom.ckpt_committed, 0, "zshard_checkpoints_committed_total",
         "Checkpoints committed"},
        {&co->prom.ckpt_failed, 0, "zshard_checkpoints_failed_total", "Checkpoints that failed"},
        {&co->prom.ckpt_step, 1, "zshard_checkpoint_last_step",
         "Step of the newest committed checkpoint (0: none)"},
        {&co->prom.ckpt_age, 1, "zshard_checkpoint_age_seconds",
         "Seconds since the newest checkpoint was committed (NaN: none yet)"},
        {&co->prom.recoveries, 0, "zshard_recoveries_total",
         "Recoveries from a checkpoint after a partition server was lost"},
        {&co->prom.failovers, 0, "zshard_failovers_total",
         "Lost partition servers failed over to their replica"},
        {&co->prom.loss_scale, 1, "zshard_loss_scale",
         "fp16 jobs: the loss scale of the next step (DeepSpeed's dynamic loss scaler); 1 "
         "otherwise"},
    };
    ZS_CHECK(zs_prom_register(r, defs, (int)(sizeof defs / sizeof defs[0])));
    static const double step_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
    co->prom.step_seconds = zs_prom_histogram(
        r, "zshard_step_duration_seconds", "Wall time of a step, from its start to its publication",
        NULL, step_bounds, (int)(sizeof step_bounds / sizeof step_bounds[0]));
    if (!co->prom.step_seconds)
        return ZS_ERR_INVALID;
    for (int ro = 0; ro < 2; ro++) {
        for (int st = 0; st < 3; st++) {
            const char *l[] = {"role", roles[ro], "state", states[st], NULL};
            co->prom.members[ro][st] = zs_prom_gauge(
                r, "zshard_members",
                "Members by role and state (joining: registered, not taking part yet)", l);
            if (!co->prom.members[ro][st])
                return ZS_ERR_INVALID;
        }
        const char *l[] = {"role", roles[ro], NULL};
        co->prom.hb_age[ro] = zs_prom_gauge(
            r, "zshard_heartbeat_age_max_seconds",
            "Age of the oldest last heartbeat among the active members of a role (0: none)", l);
        if (!co->prom.hb_age[ro])
            return ZS_ERR_INVALID;
    }
    zs_prom_set(co->prom.steps, (double)co->opts->steps);
    zs_prom_set(co->prom.step, (double)co->start_step);
    zs_prom_set(co->prom.loss_scale, co->ls_hist ? co->ls_hist[co->start_step].scale : 1.0);
    zs_prom_set(co->prom.loss, NAN);
    zs_prom_set(co->prom.ckpt_age, NAN);
    return ZS_OK;
}

/* The series that are counts over the members or ages, at most every PROM_REFRESH_MS: a walk
 * over the peers, off every message's path. */
static void prom_refresh(coord *co, uint64_t now)
{
    if (!co->opts->prom || now - co->prom.refreshed_ms < PROM_REFRESH_MS)
        return;
    co->prom.refreshed_ms = now;
    int count[2][3] = {{0}}, replicas = 0;
    uint64_t oldest[2] = {0, 0};
    for (int i = 0; i < co->n_peers; i++) {
        const peer_entry *p = &co->peers[i];
        int ro = p->role == ZSHARD__ROLE__ROLE_SERVER   ? 0
                 : p->role == ZSHARD__ROLE__ROLE_WORKER ? 1
                                                        : -1;
        if (ro < 0)
            continue;
        int st = p->gone ? 2 : p->cs_id >= 0 ? 1 : 0;
        count[ro][st]++;
        int held = ro == 0 && !p->gone ? replica_held(co, i) : -1;
        replicas += held >= 0 && co->replica_current[held];
        const zs_member *m = st == 1 && co->cs ? zs_coord_member(co->cs, p->cs_id) : NULL;
        if (m && m->alive && now > m->last_heartbeat_ms && now - m->last_heartbeat_ms > oldest[ro])
            oldest[ro] = now - m->last_heartbeat_ms;
    }
    for (int ro = 0; ro < 2; ro++) {
        for (int st = 0; st < 3; st++)
            zs_prom_set(co->prom.members[ro][st], count[ro][st]);
        zs_prom_set(co->prom.hb_age[ro], (double)oldest[ro] / 1e3);
    }
    zs_prom_set(co->prom.workers_live, co->cs ? zs_coord_live_workers(co->cs) : 0);
    zs_prom_set(co->prom.replicas_current, replicas);
    /* After a recovery the steps since the checkpoint run again: the step goes back. */
    if (co->cs)
        zs_prom_set(co->prom.step, (double)zs_coord_step(co->cs));
    if (co->prom.ckpt_at > 0)
        zs_prom_set(co->prom.ckpt_age, zs_now_s() - co->prom.ckpt_at);
}

/* A message that zs_ctrl_recv or zs_msg_decode refused, the reason in zs_last_error(). */
static void on_refused(coord *co, const zs_ctrl_peer *from)
{
    zs_log_limited(&co->refused_log, ZS_LOG_WARN, "coord: refused a message: %s", zs_last_error());
    if (from->len)
        send_error(co, from,
                   strstr(zs_last_error(), "protocol version")
                       ? ZSHARD__ERROR_CODE__ERROR_PROTOCOL_VERSION
                       : ZSHARD__ERROR_CODE__ERROR_MALFORMED,
                   zs_last_error());
}

/* What follows every message (or timeout) once the shard map exists: members whose
 * heartbeats stopped, the start of a step, the verdict, changed assignments. */
static void notice_pause(coord *co, uint64_t now);

/*
 * Every chunk is reported done but the servers' partial sums do not come: some worker said
 * done for a chunk it did not push.  Once the servers had time to say what they hold (four
 * heartbeat intervals, at least a second), the chunks a server lacks go to another worker.
 */
static void check_chunks(coord *co)
{
    if (zs_coord_chunks_pending(co->cs) != 0) {
        co->all_done_ms = 0;
        return;
    }
    uint64_t now = now_ms(co), every = (uint64_t)co->cfg.cluster.heartbeat_interval_ms;
    uint64_t wait = 4 * every > 1000 ? 4 * every : 1000;
    if (!co->all_done_ms) {
        co->all_done_ms = now;
        return;
    }
    if (now - co->all_done_ms < wait)
        return;
    enum { SHOW = 8 };
    int chunks[SHOW], workers[SHOW], servers[SHOW];
    int n = zs_coord_refute(co->cs, chunks, workers, servers, SHOW);
    co->all_done_ms = 0;
    for (int i = 0; i < n && i < SHOW; i++) {
        int to = zs_coord_owner(co->cs, chunks[i]);
        zs_log_limited(&co->chunk_log, ZS_LOG_WARN,
                       "coord: step %ld chunk %d: worker %d reported it done, but server %d does "
                       "not have its gradient; it goes to worker %d",
                       zs_coord_step(co->cs) + 1, chunks[i],
                       workers[i] >= 0 ? zs_coord_member(co->cs, workers[i])->label : 0,
                       zs_coord_member(co->cs, servers[i])->label,
                       to >= 0 ? zs_coord_member(co->cs, to)->label : 0);
    }
    if (n)
        co->assignment_dirty = 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A chunk that its owner has not finished within the deadline (chunk_timeout_factor times the
 * running median chunk time, at least chunk_timeout_min_ms) goes to another worker. */
static void check_deadlines(coord *co)
{
    int C = co->cfg.chunks;
    if (co->cfg.cluster.chunk_timeout_factor <= 0 || zs_coord_chunks_pending(co->cs) <= 0)
        return;
    if (co->deadline_step != zs_coord_step(co->cs) || co->deadline_cs != co->cs) {
        co->deadline_step = zs_coord_step(co->cs);
        co->deadline_cs = co->cs;
        for (int c = 0; c < C; c++)
            co->chunk_seen[c] = -2, co->chunk_timed[c] = 0;
    }
    uint64_t now = now_ms(co);
    /* The time from a chunk's assignment to its report, as seen here (not the workers' own
     * figures, which a worker could make up): the median of the last 64. */
    int timed = 0;
    for (int c = 0; c < C; c++)
        if (zs_coord_chunk_done_yet(co->cs, c) && !co->chunk_timed[c] && co->chunk_seen[c] >= 0) {
            co->chunk_timed[c] = 1;
            co->chunk_ms[co->next_chunk_ms] = (double)(now - co->chunk_since[c]);
            co->next_chunk_ms = (co->next_chunk_ms + 1) % 64;
            if (co->n_chunk_ms < 64)
                co->n_chunk_ms++;
            timed = 1;
        }
    if (timed) { /* the median changes only with the ring */
        double ring[64];
        int n = co->n_chunk_ms;
        memcpy(ring, co->chunk_ms, (size_t)n * sizeof *ring);
        qsort(ring, (size_t)n, sizeof *ring, cmp_double);
        co->median_chunk_ms = n % 2 ? ring[n / 2] : 0.5 * (ring[n / 2 - 1] + ring[n / 2]);
    }
    double median = co->median_chunk_ms;
    double limit = co->cfg.cluster.chunk_timeout_factor * median;
    if (limit < co->cfg.cluster.chunk_timeout_min_ms)
        limit = co->cfg.cluster.chunk_timeout_min_ms;
    for (int c = 0; c < C; c++) {
        int owner = zs_coord_owner(co->cs, c);
        if (owner != co->chunk_seen[c]) {
            co->chunk_seen[c] = owner;
            co->chunk_since[c] = now;
            continue;
        }
        if (owner < 0 || median <= 0 || zs_coord_chunk_done_yet(co->cs, c) ||
            (double)(now - co->chunk_since[c]) < limit)
            continue;
        int to = zs_coord_move_chunk(co->cs, c);
        co->chunk_since[c] = now; /* a move, or the lone worker keeps it: judged again later */
        if (to < 0)
            continue;
        co->chunk_seen[c] = to;
        co->assignment_dirty = 1;
        zs_log_limited(&co->chunk_log, ZS_LOG_WARN,
                       "coord: step %ld chunk %d: worker %d has not finished it in %.0f ms (%.1f "
                       "times the median chunk, %.0f ms); it goes to worker %d",
                       zs_coord_step(co->cs) + 1, c, zs_coord_member(co->cs, owner)->label, limit,
                       co->cfg.cluster.chunk_timeout_factor, median,
                       zs_coord_member(co->cs, to)->label);
    }
}

static void advance(coord *co)
{
    /* Here, not only at the start of a turn: a stop almost always lands inside the turn's
     * wait for a message, and the expiry below must not judge by that gap. */
    notice_pause(co, now_ms(co));
    if (co->recovering && !co->done && now_ms(co) >= co->recover_at)
        finish_recovery(co);
    if (!co->cs || co->done)
        return;
    co->ctx.n_shards = (uint32_t)co->map.n_shards;
    /* Every member that expired now, however many: the list zs_coord_expire fills is only a
     * sample, so walk the peers whose member is no longer alive. */
    int dead[1];
    if (zs_coord_expire(co->cs, now_ms(co), dead, 1) > 0) {
        for (int pi = 0; pi < co->n_peers && !co->done; pi++) {
            const peer_entry *p = &co->peers[pi];
            if (!p->gone && p->cs_id >= 0 && !zs_coord_member(co->cs, p->cs_id)->alive)
                member_gone(co, pi, "no heartbeat within the timeout");
        }
    }
    /* Workers whose connection is gone (probe_workers) and who have been silent for two
     * heartbeat intervals. */
    uint64_t now = now_ms(co), every = (uint64_t)co->cfg.cluster.heartbeat_interval_ms;
    for (int pi = 0; pi < co->n_peers && !co->done; pi++) {
        const peer_entry *p = &co->peers[pi];
        if (p->gone || p->cs_id < 0 || !p->unreachable_ms)
            continue;
        const zs_member *m = zs_coord_member(co->cs, p->cs_id);
        if (m->alive && now > m->last_heartbeat_ms && now - m->last_heartbeat_ms > 2 * every) {
            char why[160];
            snprintf(why, sizeof why, "its connection closed and no heartbeat for %llu ms",
                     (unsigned long long)(now - m->last_heartbeat_ms));
            zs_coord_leave(co->cs, p->cs_id, why);
            member_gone(co, pi, why);
        }
    }
    /* Spares (servers outside the map: no step state tracks them) whose connection is gone
     * and who have been silent as long: gone too, so that a recovery does not count on them. */
    for (int pi = 0; pi < co->n_peers && !co->done; pi++) {
        peer_entry *p = &co->peers[pi];
        if (p->role == ZSHARD__ROLE__ROLE_SERVER && !p->gone && p->cs_id < 0 && p->unreachable_ms &&
            co->map_made && !co->recovering && now - p->unreachable_ms > 2 * every)
            member_gone(co, pi, "its connection closed");
    }
    if (co->done || !co->cs)
        return; /* a server was lost just now: the recovery runs from the next turns */
    if (co->failover) {
        if (zs_coord_phase(co->cs) != ZS_PHASE_PUBLISH)
            finish_failover(co);
        return;
    }
    /* After a lost server, the workers told to register again have a heartbeat timeout to be
     * back before the step begins without them. */
    if (co->rejoin_expected > 0 &&
        (zs_coord_live_workers(co->cs) >= co->rejoin_expected || now_ms(co) >= co->rejoin_until))
        co->rejoin_expected = 0;
    if (co->servers_ready == co->n_servers && co->rejoin_expected == 0 &&
        zs_coord_try_begin(co->cs)) {
        co->step_start = zs_now_s();
        co->assignment_dirty = 1;
    }
    check_chunks(co);
    check_deadlines(co);
    if (zs_coord_phase(co->cs) == ZS_PHASE_VERDICT)
        send_verdict(co);
    if (co->assignment_dirty && zs_coord_phase(co->cs) == ZS_PHASE_COMPUTE) {
        broadcast_assignment(co);
        co->assignment_dirty = 0;
    }
    if (zs_coord_phase(co->cs) == ZS_PHASE_COMPUTE)
        probe_workers(co);
}

zs_err zs_coord_open(const zs_coord_opts *opts, zs_coord **out)
{
    *out = NULL;
    coord *co = calloc(1, sizeof *co);
    if (!co)
        return zs_error(ZS_ERR_NOMEM, "coord: out of memory");
    co->opts = opts;
    zs_err res = coord_setup(co);
    if (res != ZS_OK) {
        zs_coord_close(co);
        return res;
    }
    *out = co;
    return ZS_OK;
}

void zs_coord_set_hooks(zs_coord *co, const zs_coord_hooks *hooks)
{
    co->hooks = *hooks;
}

/* Every heartbeat interval, a Heartbeat (sender 0) to every member still in the job: without
 * it a server has no way to tell a coordinator that is gone or hung from a long step. */
static void heartbeat_members(coord *co, uint64_t now)
{
    uint64_t every = (uint64_t)co->cfg.cluster.heartbeat_interval_ms;
    if (now - co->last_heartbeat_ms < every)
        return;
    co->last_heartbeat_ms = now;
    Zshard__Heartbeat h = ZSHARD__HEARTBEAT__INIT;
    h.has_sender = h.has_step = 1;
    h.sender = 0;
    h.step = co->cs ? (uint64_t)zs_coord_step(co->cs) : 0;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &h;
    for (int i = 0; i < co->n_peers; i++) {
        peer_entry *p = &co->peers[i];
        if (p->gone ||
            (p->role != ZSHARD__ROLE__ROLE_SERVER && p->role != ZSHARD__ROLE__ROLE_WORKER))
            continue;
        /* ZeroMQ cannot route to a peer whose connection closed (a killed process): like a
         * worker's probe, that marks it, and two silent intervals later it is gone (advance). */
        if (send_env_to(co, &p->peer, &env, 1) == ZS_OK)
            p->unreachable_ms = 0;
        else if (!p->unreachable_ms)
            p->unreachable_ms = now;
    }
}

/*
 * Whether this process was stopped since the last turn (SIGSTOP, a VM pause, swap): a gap of
 * more than a heartbeat interval between turns, which take milliseconds.  The members'
 * heartbeats of that time are still queued, unread: judging them by our clock would declare
 * healthy members dead, so they get a whole timeout again (zs_coord_grace).
 */
static void notice_pause(coord *co, uint64_t now)
{
    uint64_t gap = co->last_turn_ms && now > co->last_turn_ms ? now - co->last_turn_ms : 0;
    co->last_turn_ms = now;
    /* A test's clock (hooks.now_ms) jumps on purpose, to make members expire. */
    if (gap <= (uint64_t)co->cfg.cluster.heartbeat_interval_ms || !co->cs || co->hooks.now_ms)
        return;
    ZS_WARN("coord: this process did not run for %llu ms; members get a whole heartbeat "
            "timeout (%d ms) to be heard from again",
            (unsigned long long)gap, co->cfg.cluster.heartbeat_timeout_ms);
    zs_coord_grace(co->cs, now);
    for (int i = 0; i < co->n_peers; i++)
        co->peers[i].unreachable_ms = 0;
    /* The chunk deadlines and the wait for the servers' view start again too: the time this
     * process did not run is nobody's delay. */
    for (int c = 0; c < co->cfg.chunks; c++)
        co->chunk_since[c] = now;
    if (co->all_done_ms)
        co->all_done_ms = now;
}

void zs_coord_turn(zs_coord *co, int timeout_ms, volatile int *stop_flag)
{
    if (co->done)
        return;
    uint64_t now = now_ms(co);
    notice_pause(co, now);
    heartbeat_members(co, now);
    prom_refresh(co, now);
    if (stop_flag && *stop_flag) {
        abort_job(co, zs_error(ZS_ERR_IO, "coord: interrupted"));
        return;
    }
    zs_ctrl_peer from = {.len = 0};
    Zshard__Envelope *env = NULL;
    if (co->ctrl && zs_ctrl_recv(co->ctrl, timeout_ms, &co->ctx, &from, &env) != ZS_OK) {
        on_refused(co, &from);
    } else if (env) {
        on_message(co, &from, env);
        zs_msg_free(env);
    }
    advance(co);
}

void zs_coord_feed(zs_coord *co, const zs_ctrl_peer *from, const void *bytes, size_t len)
{
    /* ZeroMQ drops a message over ZS_MSG_MAX_BYTES (ZMQ_MAXMSGSIZE) before a turn sees it. */
    if (co->done || len > ZS_MSG_MAX_BYTES)
        return;
    Zshard__Envelope *env = NULL;
    if (zs_msg_decode(bytes, len, &co->ctx, &env) != ZS_OK) {
        on_refused(co, from);
    } else {
        on_message(co, from, env);
        zs_msg_free(env);
    }
    advance(co);
}

int zs_coord_done(const zs_coord *co, zs_err *result)
{
    if (result)
        *result = co->result;
    return co->done;
}

int zs_coord_recoveries(const zs_coord *co)
{
    return co->recoveries;
}

long zs_coord_steps_done(const zs_coord *co)
{
    return co->cs ? zs_coord_step(co->cs) : 0;
}

void zs_coord_close(zs_coord *co)
{
    if (!co)
        return;
    prune_reap(co, 1);
    if (co->metrics && zs_metrics_close(co->metrics) != ZS_OK)
        ZS_ERROR("coord: %s", zs_last_error());
    ckpt_free_slots(co);
    zs_ctrl_close(co->ctrl);
    zs_coord_state_free(co->cs);
    if (co->have_map)
        zs_shardmap_free(&co->map);
    if (co->map_msg)
        zshard__shard_map__free_unpacked(co->map_msg, NULL);
    zs_msg_jobspec_free(co->job);
    zs_tensors_free(&co->tt);
    zs_data_close(&co->data);
    free(co->replica_current);
    free(co->ls_hist);
    free(co->peers);
    free(co->chunk_since);
    free(co->chunk_seen);
    free(co->chunk_timed);
    free(co);
}

zs_err zs_coord_run(const zs_coord_opts *opts, volatile int *stop_flag)
{
    coord *co = NULL;
    zs_err res = zs_coord_open(opts, &co);
    if (res != ZS_OK) {
        ZS_ERROR("coord: %s", zs_last_error());
        return res;
    }
    while (!zs_coord_done(co, &res))
        zs_coord_turn(co, 20, stop_flag);
    zs_coord_close(co);
    return res;
}
