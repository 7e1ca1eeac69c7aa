/*
 * session: see session.h.  Assignments may arrive more than once for a step (the coordinator
 * resends a worker's list when it grows, e.g. when another worker's chunks are reassigned);
 * a bitmap of the chunks already handed out for the current step filters the repeats.
 */
#include "worker/session.h"
#include "common/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/shardmap.h"
#include "proto/ctrl.h"
#include "proto/shardmap_msg.h"
#include "transport/rdma.h"

struct zs_session {
    zs_ctrl *ctrl;
    const zs_secret *secret; /* the job's, or insecure: the control plane authenticates with it */
    zs_auth auth;            /* our data-plane identity: the id and token the coordinator gave */
    /* Why the servers of the map could not be reached ("" if they could). */
    char connect_error[512];
    char leave_why[512]; /* what zs_session_close tells the coordinator ("": leaving) */
    uint32_t id;
    zs_config cfg;
    zs_tensor_table tt;
    zs_msg_job job;
    int have_job;
    zs_shardmap map;
    int have_map;
    zs_dataset data;
    int have_data;
    zs_client *client;
    char (*endpoints)[128];      /* [map.n_servers] data-plane HOST:PORT of each server */
    const zs_transport_ops *ops; /* the backend the map's servers serve */
    zs_rdma_conn_opts rdma;      /* its options (cluster.rdma) when rdma */
    uint64_t last_heartbeat_ms;
    long step;      /* the step `given` is about, -1 before the first */
    uint8_t *given; /* [chunks] handed out for `step` */
    long last_step; /* the latest step worked on, for heartbeats */
    int opening;    /* in zs_session_open: stop pumping once set up, so that the first
                       assignment is left for zs_session_next */
    int ended;
    zs_err end_result;
    char end_reason[512];
    int rejoin;             /* the coordinator said to register again */
    uint64_t last_coord_ms; /* when anything last came from the coordinator */
    uint64_t last_pump_ms;  /* when pump last ran: a long gap is a chunk computed, or a pause */
    const char *coord;      /* its endpoint, for messages */
};

static zs_err send_env(zs_session *s, Zshard__Envelope *env)
{
    return zs_ctrl_send_as(s->ctrl, NULL, s->id, env);
}

/* The data plane's options: the backend the map names, with cluster.rdma's options. */
static zs_conn_opts conn_opts(zs_session *s)
{
    zs_conn_opts o = {.ops = s->ops};
    if (s->ops == &zs_rdma_ops) {
        s->rdma = (zs_rdma_conn_opts){.device = s->cfg.cluster.rdma_device,
                                      .port = s->cfg.cluster.rdma_port,
                                      .gid_index = s->cfg.cluster.rdma_gid_index};
        o.backend = &s->rdma;
        o.backend_name = "rdma";
    }
    return o;
}

/* Loads the data, reports its fingerprint and opens the data plane. */
static zs_err setup(zs_session *s, const char *data, const Zshard__ShardMap *m)
{
    const char *path = data ? data : s->job.data_path;
    ZS_CHECK(zs_data_open(path, &s->data));
    s->have_data = 1;
    const char *eps[ZS_MSG_MAX_SERVERS];
    if (!(s->endpoints = calloc(m->n_servers ? m->n_servers : 1, sizeof *s->endpoints)))
        return zs_error(ZS_ERR_NOMEM, "worker: out of memory");
    for (size_t i = 0; i < m->n_servers && i < ZS_MSG_MAX_SERVERS; i++) {
        snprintf(s->endpoints[i], sizeof s->endpoints[i], "%s", m->servers[i]->endpoint);
        eps[i] = s->endpoints[i];
    }
    s->ops = !m->has_transport                                        ? &zs_tcp_ops
             : m->transport == ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA ? &zs_rdma_ops
             : m->transport == ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM  ? &zs_shm_ops
                                                                      : &zs_tcp_ops;
    zs_conn_opts o = conn_opts(s);
    if (zs_client_open(&s->map, eps, &s->auth, &o, &s->client) != ZS_OK) {
        /* A server of the map may have just died (the coordinator then tells us to register
         * again) or be unreachable: wait for the coordinator's word rather than fail, and say
         * why if it never comes. */
        snprintf(s->connect_error, sizeof s->connect_error, "%s", zs_last_error());
        ZS_WARN("worker %u: %s; waiting for the coordinator", s->id, s->connect_error);
        s->client = NULL;
        return ZS_OK;
    }
    if (!(s->given = calloc((size_t)s->cfg.chunks, 1)))
        return zs_error(ZS_ERR_NOMEM, "worker: out of memory");
    Zshard__DataCheck dc = ZSHARD__DATA_CHECK__INIT;
    dc.has_fingerprint = dc.has_ntokens = 1;
    dc.fingerprint = s->data.fingerprint;
    dc.ntokens = s->data.ntokens;
    Zshard__Ready rd = ZSHARD__READY__INIT;
    rd.what_case = ZSHARD__READY__WHAT_DATA;
    rd.data = &dc;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_READY;
    env.ready = &rd;
    ZS_INFO("worker %u: data %s (%zu tokens), %d servers", s->id, path, s->data.ntokens,
            s->map.n_servers);
    return send_env(s, &env);
}

/* Handles one control message; fills *a when it carries new chunks for us. */
static zs_err handle(zs_session *s, const Zshard__Envelope *env, const char *data, zs_assignment *a,
                     int *got)
{
    *got = 0;
    switch (env->body_case) {
    case ZSHARD__ENVELOPE__BODY_REGISTRATION_REPLY:
        if (env->registration_reply->outcome_case != ZSHARD__REGISTER_REPLY__OUTCOME_ASSIGNED_ID)
            return zs_error(ZS_ERR_INVALID, "worker: the coordinator refused registration: %s",
                            env->registration_reply->refusal);
        s->id = env->registration_reply->assigned_id;
        s->auth.member = s->id;
        memcpy(s->auth.token, env->registration_reply->data_token.data, ZS_TOKEN_BYTES);
        return ZS_OK;
    case ZSHARD__ENVELOPE__BODY_JOB_SPEC:
        if (!s->have_job) {
            ZS_CHECK(zs_msg_jobspec_to_config(env->job_spec, &s->cfg, &s->tt, &s->job));
            s->have_job = 1;
        }
        return ZS_OK;
    case ZSHARD__ENVELOPE__BODY_SHARD_MAP:
        if (!s->have_map && s->have_job) {
            ZS_CHECK(zs_shardmap_from_msg(env->shard_map, &s->map));
            s->have_map = 1;
            return setup(s, data, env->shard_map);
        }
        return ZS_OK;
    case ZSHARD__ENVELOPE__BODY_STEP_ASSIGN: {
        const Zshard__StepAssign *sa = env->step_assign;
        if (sa->worker != s->id || !s->given)
            return ZS_OK;
        if ((long)sa->step != s->step) {
            s->step = (long)sa->step;
            memset(s->given, 0, (size_t)s->cfg.chunks);
        }
        a->step = (long)sa->step;
        a->lr = sa->lr;
        a->loss_scale = sa->has_loss_scale ? sa->loss_scale : 1.0;
        a->n = 0;
        for (size_t i = 0; i < sa->n_chunks && a->n < ZS_SESSION_MAX_CHUNKS; i++) {
            uint32_t c = sa->chunks[i];
            if (c < (uint32_t)s->cfg.chunks && !s->given[c]) {
                s->given[c] = 1;
                a->chunks[a->n++] = (int)c;
            }
        }
        *got = a->n > 0;
        s->last_step = a->step;
        return ZS_OK;
    }
    case ZSHARD__ENVELOPE__BODY_ERROR:
        snprintf(s->end_reason, sizeof s->end_reason, "%s", env->error->text);
        ZS_WARN("worker %u: coordinator: %s", s->id, env->error->text);
        if (s->id && env->error->code == ZSHARD__ERROR_CODE__ERROR_NOT_REGISTERED) {
            /* Not the coordinator we joined: it was restarted.  A worker holds nothing, so it
             * leaves; start it again to join the new job. */
            s->ended = 1;
            s->end_result = zs_error(ZS_ERR_INVALID,
                                     "worker %u: the coordinator does not know this worker (it "
                                     "was restarted?): %s",
                                     s->id, env->error->text);
        }
        return ZS_OK;
    case ZSHARD__ENVELOPE__BODY_SHUTDOWN:
        s->ended = 1;
        if (env->shutdown->kind == ZSHARD__SHUTDOWN_KIND__SHUTDOWN_REJOIN) {
            ZS_INFO("worker %u: %s; registering again", s->id,
                    env->shutdown->reason ? env->shutdown->reason : "the servers changed");
            s->rejoin = 1;
            return ZS_OK;
        }
        if (env->shutdown->kind != ZSHARD__SHUTDOWN_KIND__SHUTDOWN_DONE)
            s->end_result = zs_error(ZS_ERR_INVALID, "worker %u: the job was aborted: %s", s->id,
                                     *s->end_reason          ? s->end_reason
                                     : env->shutdown->reason ? env->shutdown->reason
                                                             : "");
        return ZS_OK;
    default:
        return ZS_OK;
    }
}

/* Receives and handles messages for up to timeout_ms, or until one gives chunks. */
/*
 * Ends the session when the coordinator has said nothing for cluster.coordinator_timeout_ms
 * (it sends a heartbeat every interval): it is gone or hung.  Only time spent here, listening,
 * counts: a gap since the last pump (a chunk being computed, this process stopped) restarts
 * the count, as the coordinator's messages of that time are still unread.
 */
static void coord_alive_check(zs_session *s)
{
    uint64_t now = zs_now_ms();
    uint64_t limit = s->have_job ? (uint64_t)s->cfg.cluster.coordinator_timeout_ms : 15000;
    if (!s->last_coord_ms || (s->last_pump_ms && now - s->last_pump_ms > limit / 4))
        s->last_coord_ms = now;
    s->last_pump_ms = now;
    if (s->ended || now - s->last_coord_ms <= limit)
        return;
    s->ended = 1;
    if (s->have_job)
        s->end_result =
            zs_error(ZS_ERR_IO,
                     "worker %u: nothing from the coordinator at %s for %llu ms "
                     "(cluster.coordinator_timeout_ms %llu): it is gone or hung",
                     s->id, s->coord ? s->coord : "?", (unsigned long long)(now - s->last_coord_ms),
                     (unsigned long long)limit);
    else /* no job yet: the timeout is the built-in one, not the config's */
        s->end_result =
            zs_error(ZS_ERR_IO,
                     "worker: nothing from the coordinator at %s for %llu ms: "
                     "nothing answers there, or it is hung",
                     s->coord ? s->coord : "?", (unsigned long long)(now - s->last_coord_ms));
}

static zs_err pump(zs_session *s, int timeout_ms, const char *data, zs_assignment *a, int *got)
{
    uint64_t until = zs_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    *got = 0;
    do {
        coord_alive_check(s);
        if (s->ended)
            return ZS_OK;
        zs_session_heartbeat(s);
        Zshard__Envelope *env = NULL;
        zs_msg_ctx ctx = {.self = ZS_MSG_WORKER};
        if (s->have_job)
            ctx.chunks = (uint32_t)s->cfg.chunks;
        zs_err e = zs_ctrl_recv(s->ctrl, timeout_ms > 0 ? 20 : 0, &ctx, NULL, &env);
        if (e != ZS_OK) {
            ZS_WARN("worker %u: refused a control message: %s", s->id, zs_last_error());
            continue;
        }
        if (!env)
            continue;
        s->last_coord_ms = zs_now_ms();
        e = handle(s, env, data, a, got);
        zs_msg_free(env);
        if (e != ZS_OK || *got || s->ended || (s->opening && s->client))
            return e;
    } while (zs_now_ms() < until);
    return ZS_OK;
}

/* One registration, until `until`; *rejoin when the coordinator said to register again before
 * the job reached us (a server was lost meanwhile): nothing is open then. */
static zs_err open_once(const char *coord, const zs_secret *secret, const char *data,
                        uint64_t until, int timeout_ms, volatile int *stop, zs_session **out,
                        int *rejoin)
{
    *out = NULL;
    *rejoin = 0;
    zs_session *s = calloc(1, sizeof *s);
    if (!s)
        return zs_error(ZS_ERR_NOMEM, "worker: out of memory");
    s->step = -1;
    s->opening = 1;
    s->coord = coord;
    s->secret = secret;
    char msg[512];
    zs_err res;
    ZS_CHECK_GOTO(zs_ctrl_connect(coord, secret, &s->ctrl), res, fail);
    /* Every backend this host can use: the coordinator holds it against the servers'. */
    uint32_t transports =
        ZSHARD__CAPABILITY__CAP_TRANSPORT_TCP | ZSHARD__CAPABILITY__CAP_TRANSPORT_SHM;
    char why[256];
    if (zs_rdma_available(why, sizeof why))
        transports |= ZSHARD__CAPABILITY__CAP_TRANSPORT_RDMA;
    else
        ZS_DEBUG("worker: offers no RDMA data plane: %s", why);
    ZS_CHECK_GOTO(zs_ctrl_register(s->ctrl, ZSHARD__ROLE__ROLE_WORKER, NULL, transports), res,
                  fail);
    zs_assignment a;
    int got;
    while (!s->client && !s->ended && zs_now_ms() < until && !(stop && *stop))
        ZS_CHECK_GOTO(pump(s, 50, data, &a, &got), res, fail);
    if (!s->client && stop && *stop) {
        res = zs_error(ZS_ERR_IO, "worker: stopped while registering with %s", coord);
        goto fail;
    }
    if (s->ended && s->rejoin) {
        *rejoin = 1;
        res = ZS_OK;
        goto fail;
    }
    if (s->ended) {
        res = s->end_result != ZS_OK ? s->end_result
                                     : zs_error(ZS_ERR_INVALID, "worker: the job ended");
        goto fail;
    }
    if (!s->client && s->connect_error[0]) {
        res = zs_error(ZS_ERR_IO, "worker: %s (and no new map from the coordinator within %d ms)",
                       s->connect_error, timeout_ms);
        goto fail;
    }
    if (!s->client) {
        res = zs_error(ZS_ERR_IO, "worker: no job from the coordinator at %s within %d ms", coord,
                       timeout_ms);
        goto fail;
    }
    s->opening = 0;
    *out = s;
    return ZS_OK;
fail:
    /* A failure of our own after we registered (our copy of the data, the servers out of
     * reach) goes to the coordinator with the leaving notice; the end of the job or a
     * refusal needs none. */
    snprintf(msg, sizeof msg, "%s", zs_last_error());
    if (res != ZS_OK && !s->ended && s->id)
        zs_session_fail(s, msg);
    else
        s->ended = 1;
    zs_session_close(s);
    if (res != ZS_OK)
        zs_error(res, "%s", msg);
    return res;
}

zs_err zs_session_open(const char *coord, const zs_secret *secret, const char *data, int timeout_ms,
                       volatile int *stop, zs_session **out)
{
    uint64_t until = zs_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int rejoin = 0;
        zs_err e = open_once(coord, secret, data, until, timeout_ms, stop, out, &rejoin);
        if (!rejoin)
            return e;
    }
}

void zs_session_fail(zs_session *s, const char *why)
{
    if (s)
        snprintf(s->leave_why, sizeof s->leave_why, "%s", why);
}

void zs_session_close(zs_session *s)
{
    if (!s)
        return;
    if (!s->ended && s->id) {
        Zshard__Shutdown sd = ZSHARD__SHUTDOWN__INIT;
        sd.has_kind = 1;
        sd.kind = ZSHARD__SHUTDOWN_KIND__SHUTDOWN_LEAVING;
        char why[600];
        snprintf(why, sizeof why, "worker %u: %s", s->id,
                 s->leave_why[0] ? s->leave_why : "leaving");
        sd.reason = why;
        Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
        env.body_case = ZSHARD__ENVELOPE__BODY_SHUTDOWN;
        env.shutdown = &sd;
        send_env(s, &env); /* zs_ctrl_close lets it go out before the socket closes */
    }
    zs_client_close(s->client);
    zs_ctrl_close(s->ctrl);
    if (s->have_map)
        zs_shardmap_free(&s->map);
    if (s->have_job)
        zs_tensors_free(&s->tt);
    if (s->have_data)
        zs_data_close(&s->data);
    free(s->given);
    free(s->endpoints);
    zs_wipe(s->auth.token, sizeof s->auth.token);
    free(s);
}

int zs_session_rejoin(const zs_session *s)
{
    return s->rejoin;
}

uint32_t zs_session_id(const zs_session *s)
{
    return s->id;
}

const zs_config *zs_session_config(const zs_session *s)
{
    return &s->cfg;
}

const zs_tensor_table *zs_session_tensors(const zs_session *s)
{
    return &s->tt;
}

const zs_dataset *zs_session_data(const zs_session *s)
{
    return &s->data;
}

zs_client *zs_session_client(zs_session *s)
{
    return s->client;
}

zs_err zs_session_open_client(zs_session *s, int conns, zs_client **out)
{
    const char *eps[ZS_MSG_MAX_SERVERS];
    for (int i = 0; i < s->map.n_servers && i < ZS_MSG_MAX_SERVERS; i++)
        eps[i] = s->endpoints[i];
    zs_conn_opts o = conn_opts(s);
    o.conns = conns;
    return zs_client_open(&s->map, eps, &s->auth, &o, out);
}

zs_err zs_session_next(zs_session *s, int timeout_ms, zs_assignment *a, int *got, int *ended)
{
    *got = 0;
    zs_err e = s->ended ? ZS_OK : pump(s, timeout_ms, NULL, a, got);
    *ended = s->ended;
    if (e != ZS_OK)
        return e;
    return s->ended ? s->end_result : ZS_OK;
}

zs_err zs_session_chunk_done(zs_session *s, long step, int chunk, double loss,
                             const zs_msg_chunk_times *times)
{
    Zshard__ChunkDone cd = ZSHARD__CHUNK_DONE__INIT;
    cd.has_step = cd.has_chunk = cd.has_worker = cd.has_loss = 1;
    cd.step = (uint64_t)step;
    cd.chunk = (uint32_t)chunk;
    cd.worker = s->id;
    cd.loss = loss;
    if (times) {
        cd.has_compute_ms = cd.has_fetch_wait_ms = cd.has_push_wait_ms = 1;
        cd.compute_ms = times->compute_ms;
        cd.fetch_wait_ms = times->fetch_wait_ms;
        cd.push_wait_ms = times->push_wait_ms;
    }
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_CHUNK_DONE;
    env.chunk_done = &cd;
    return send_env(s, &env);
}

void zs_session_heartbeat(zs_session *s)
{
    uint64_t t = zs_now_ms();
    uint64_t every = s->have_job ? (uint64_t)s->cfg.cluster.heartbeat_interval_ms : 500;
    if (!s->id || t - s->last_heartbeat_ms < every)
        return;
    Zshard__Heartbeat h = ZSHARD__HEARTBEAT__INIT;
    h.has_sender = h.has_step = 1;
    h.sender = s->id;
    h.step = s->last_step > 0 ? (uint64_t)s->last_step : 0;
    Zshard__Envelope env = ZSHARD__ENVELOPE__INIT;
    env.body_case = ZSHARD__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &h;
    if (send_env(s, &env) != ZS_OK)
        ZS_WARN("worker %u: heartbeat: %s", s->id, zs_last_error());
    s->last_heartbeat_ms = t;
}
