/*
 * coordstate: see coordstate.h.  Members live in one array indexed by id (ids are never
 * reused); the current step's chunk table says, per chunk, who owns it and whether it is done.
 */
#include "server/coordstate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/reduce.h"

struct zs_coord_state {
    zs_config cfg;
    int S;        /* servers expected */
    int n_shards; /* partials expected per step */
    long steps;
    zs_phase phase;
    long step;

    zs_member *members;
    int n_members, cap_members;
    int n_servers; /* registered */

    /* The current step. */
    int *owner;                /* [C] worker id, -1 while unassigned */
    char *done;                /* [C] */
    double *loss;              /* [C] */
    zs_msg_chunk_times *times; /* [C] */
    int workers_at_begin;
    char *have_partial; /* [n_shards] */
    double *partial;    /* [n_shards] */
    char *published;    /* [members] by id, servers only */
    double norm, clip, lr;
    /* The servers' view of the step: chunks_in[id * C + c] != 0 once server id's last
     * heartbeat for this step listed chunk c as received in full; refuted[c] is the worker
     * whose report of chunk c the servers contradicted (-1: none), who is not given it again
     * while another worker is alive. */
    char *chunks_in;
    int *refuted;
    long *reported;  /* [members] the step of each server's last chunks_in (-1: none yet) */
    zs_lossscale ls; /* fp16 jobs: the loss scaler, updated as each step finishes */
};

zs_err zs_coord_state_create(const zs_config *cfg, int n_servers, int n_shards, long steps,
                             zs_coord_state **out)
{
    *out = NULL;
    if (n_servers < 1 || n_shards < n_servers || steps < 0)
        return zs_error(ZS_ERR_INVALID,
                        "coordinator: %d servers for %d shards and %ld steps: need "
                        "1 <= servers <= shards",
                        n_servers, n_shards, steps);
    zs_coord_state *cs = calloc(1, sizeof *cs);
    if (!cs)
        return zs_error(ZS_ERR_NOMEM, "coordinator: out of memory");
    cs->cfg = *cfg;
    zs_lossscale_init(&cs->ls, &cfg->fp16);
    cs->S = n_servers;
    cs->n_shards = n_shards;
    cs->steps = steps;
    cs->phase = steps == 0 ? ZS_PHASE_DONE : ZS_PHASE_WAIT_SERVERS;
    int C = cfg->chunks;
    cs->owner = malloc((size_t)C * sizeof *cs->owner);
    cs->done = calloc((size_t)C, 1);
    cs->loss = calloc((size_t)C, sizeof *cs->loss);
    cs->times = calloc((size_t)C, sizeof *cs->times);
    cs->have_partial = calloc((size_t)n_shards, 1);
    cs->partial = calloc((size_t)n_shards, sizeof *cs->partial);
    cs->refuted = malloc((size_t)C * sizeof *cs->refuted);
    if (!cs->owner || !cs->done || !cs->loss || !cs->times || !cs->have_partial || !cs->partial ||
        !cs->refuted) {
        zs_coord_state_free(cs);
        return zs_error(ZS_ERR_NOMEM, "coordinator: out of memory for %d chunks", C);
    }
    for (int c = 0; c < C; c++)
        cs->owner[c] = cs->refuted[c] = -1;
    *out = cs;
    return ZS_OK;
}

void zs_coord_state_free(zs_coord_state *cs)
{
    if (!cs)
        return;
    free(cs->members);
    free(cs->owner);
    free(cs->refuted);
    free(cs->chunks_in);
    free(cs->reported);
    free(cs->done);
    free(cs->loss);
    free(cs->times);
    free(cs->have_partial);
    free(cs->partial);
    free(cs->published);
    free(cs);
}

static zs_member *member(zs_coord_state *cs, int id)
{
    return id >= 0 && id < cs->n_members ? &cs->members[id] : NULL;
}

const zs_member *zs_coord_member(const zs_coord_state *cs, int id)
{
    return id >= 0 && id < cs->n_members ? &cs->members[id] : NULL;
}

int zs_coord_live_workers(const zs_coord_state *cs)
{
    int n = 0;
    for (int i = 0; i < cs->n_members; i++)
        n += cs->members[i].role == ZS_MEMBER_WORKER && cs->members[i].alive;
    return n;
}

zs_phase zs_coord_phase(const zs_coord_state *cs)
{
    return cs->phase;
}

zs_err zs_coord_state_start_at(zs_coord_state *cs, long step)
{
    if (step < 0 || step >= cs->steps || cs->step != 0 || cs->phase != ZS_PHASE_WAIT_SERVERS)
        return zs_error(ZS_ERR_INVALID,
                        "coordinator: cannot start at step %ld of %ld (at %ld already)", step,
                        cs->steps, cs->step);
    cs->step = step;
    return ZS_OK;
}

void zs_coord_grace(zs_coord_state *cs, uint64_t now_ms)
{
    for (int i = 0; i < cs->n_members; i++)
        if (cs->members[i].alive)
            cs->members[i].last_heartbeat_ms = now_ms;
}

long zs_coord_step(const zs_coord_state *cs)
{
    return cs->step;
}

/* Unfinished chunks owned by worker id. */
static int unfinished(const zs_coord_state *cs, int id)
{
    int n = 0;
    for (int c = 0; c < cs->cfg.chunks; c++)
        n += cs->owner[c] == id && !cs->done[c];
    return n;
}

/* Gives every unowned, unfinished chunk of the current step to the least-loaded live worker. */
static void assign_orphans(zs_coord_state *cs)
{
    if (cs->phase != ZS_PHASE_COMPUTE)
        return;
    for (int c = 0; c < cs->cfg.chunks; c++) {
        if (cs->done[c] || cs->owner[c] >= 0)
            continue;
        int best = -1, best_load = 0;
        for (int pass = 0; pass < 2 && best < 0; pass++) /* the refuted worker only if alone */
            for (int i = 0; i < cs->n_members; i++) {
                const zs_member *m = &cs->members[i];
                if (m->role != ZS_MEMBER_WORKER || !m->alive ||
                    (pass == 0 && m->id == cs->refuted[c]))
                    continue;
                int load = unfinished(cs, m->id);
                if (best < 0 || load < best_load)
                    best = m->id, best_load = load;
            }
        if (best < 0)
            return; /* nobody alive: the chunks wait for a worker */
        cs->owner[c] = best;
        ZS_INFO("coord: step %ld chunk %d reassigned to worker %d", cs->step + 1, c,
                cs->members[best].label);
    }
}

zs_err zs_coord_join(zs_coord_state *cs, zs_member_role role, int label, const char *endpoint,
                     uint64_t now_ms, int *id)
{
    if (role == ZS_MEMBER_SERVER && cs->n_servers >= cs->S)
        return zs_error(ZS_ERR_INVALID,
                        "coordinator: all %d servers are registered; another "
                        "server is refused",
                        cs->S);
    if (role == ZS_MEMBER_WORKER && cs->cfg.elasticity.max_workers > 0 &&
        zs_coord_live_workers(cs) >= cs->cfg.elasticity.max_workers)
        return zs_error(ZS_ERR_INVALID,
                        "coordinator: %d workers attached, "
                        "elasticity.max_workers is %d",
                        zs_coord_live_workers(cs), cs->cfg.elasticity.max_workers);
    if (role != ZS_MEMBER_SERVER && role != ZS_MEMBER_WORKER)
        return zs_error(ZS_ERR_INVALID, "coordinator: unknown role %d", (int)role);
    if (cs->n_members == cs->cap_members) {
        int cap = cs->cap_members ? 2 * cs->cap_members : 16;
        zs_member *m = realloc(cs->members, (size_t)cap * sizeof *m);
        if (!m)
            return zs_error(ZS_ERR_NOMEM, "coordinator: out of memory for members");
        cs->members = m;
        char *p = realloc(cs->published, (size_t)cap);
        if (!p)
            return zs_error(ZS_ERR_NOMEM, "coordinator: out of memory for members");
        cs->published = p;
        char *in = realloc(cs->chunks_in, (size_t)cap * (size_t)cs->cfg.chunks);
        if (!in)
            return zs_error(ZS_ERR_NOMEM, "coordinator: out of memory for members");
        cs->chunks_in = in;
        long *rep = realloc(cs->reported, (size_t)cap * sizeof *rep);
        if (!rep)
            return zs_error(ZS_ERR_NOMEM, "coordinator: out of memory for members");
        cs->reported = rep;
        cs->cap_members = cap;
    }
    int i = cs->n_members++;
    zs_member *m = &cs->members[i];
    memset(m, 0, sizeof *m);
    memset(cs->chunks_in + (size_t)i * (size_t)cs->cfg.chunks, 0, (size_t)cs->cfg.chunks);
    cs->reported[i] = -1;
    m->id = i;
    m->label = label;
    m->role = role;
    m->alive = 1;
    m->last_heartbeat_ms = now_ms;
    snprintf(m->endpoint, sizeof m->endpoint, "%s", endpoint ? endpoint : "");
    cs->published[i] = 0;
    *id = i;
    if (role == ZS_MEMBER_SERVER) {
        cs->n_servers++;
        if (cs->n_servers == cs->S && cs->phase == ZS_PHASE_WAIT_SERVERS)
            cs->phase = ZS_PHASE_WAIT_WORKERS;
    } else {
        assign_orphans(cs);
    }
    ZS_INFO("coord: %s %d joined%s%s", role == ZS_MEMBER_SERVER ? "server" : "worker", label,
            endpoint && *endpoint ? " at " : "", endpoint ? endpoint : "");
    return ZS_OK;
}

void zs_coord_heartbeat(zs_coord_state *cs, int id, uint64_t now_ms)
{
    zs_member *m = member(cs, id);
    if (m && m->alive)
        m->last_heartbeat_ms = now_ms;
}

static void mark_dead(zs_coord_state *cs, zs_member *m, const char *why)
{
    m->alive = 0;
    ZS_WARN("coord: %s %d left: %s", m->role == ZS_MEMBER_SERVER ? "server" : "worker", m->label,
            why);
    if (m->role != ZS_MEMBER_WORKER)
        return;
    for (int c = 0; c < cs->cfg.chunks; c++)
        if (cs->owner[c] == m->id && !cs->done[c])
            cs->owner[c] = -1;
    assign_orphans(cs);
}

void zs_coord_leave(zs_coord_state *cs, int id, const char *reason)
{
    zs_member *m = member(cs, id);
    if (m && m->alive)
        mark_dead(cs, m, reason);
}

int zs_coord_expire(zs_coord_state *cs, uint64_t now_ms, int *dead, int max)
{
    int n = 0;
    uint64_t timeout = (uint64_t)cs->cfg.cluster.heartbeat_timeout_ms;
    for (int i = 0; i < cs->n_members; i++) {
        zs_member *m = &cs->members[i];
        if (!m->alive || now_ms < m->last_heartbeat_ms || now_ms - m->last_heartbeat_ms <= timeout)
            continue;
        char why[96];
        snprintf(why, sizeof why, "no heartbeat for %llu ms (timeout %llu ms)",
                 (unsigned long long)(now_ms - m->last_heartbeat_ms), (unsigned long long)timeout);
        mark_dead(cs, m, why);
        if (n < max)
            dead[n] = m->id;
        n++;
    }
    return n;
}

int zs_coord_try_begin(zs_coord_state *cs)
{
    int need = cs->cfg.elasticity.min_workers > 1 ? cs->cfg.elasticity.min_workers : 1;
    if (cs->phase != ZS_PHASE_WAIT_WORKERS || zs_coord_live_workers(cs) < need)
        return 0;
    int C = cs->cfg.chunks, w = 0;
    int live = zs_coord_live_workers(cs);
    /* Round robin over live workers in id order: chunk c to the (c mod W)-th. */
    int *ids = malloc((size_t)live * sizeof *ids);
    if (!ids)
        return 0;
    for (int i = 0; i < cs->n_members; i++)
        if (cs->members[i].role == ZS_MEMBER_WORKER && cs->members[i].alive)
            ids[w++] = i;
    memset(cs->chunks_in, 0, (size_t)cs->n_members * (size_t)C);
    for (int c = 0; c < C; c++) {
        cs->owner[c] = ids[c % live];
        cs->refuted[c] = -1;
        cs->done[c] = 0;
        cs->loss[c] = 0;
        cs->times[c] = (zs_msg_chunk_times){0};
    }
    free(ids);
    memset(cs->have_partial, 0, (size_t)cs->n_shards);
    memset(cs->published, 0, (size_t)cs->n_members);
    cs->workers_at_begin = live;
    cs->phase = ZS_PHASE_COMPUTE;
    return 1;
}

int zs_coord_assigned(const zs_coord_state *cs, int id, int *chunks, int max)
{
    int n = 0;
    if (cs->phase != ZS_PHASE_COMPUTE)
        return 0;
    for (int c = 0; c < cs->cfg.chunks; c++)
        if (cs->owner[c] == id && !cs->done[c]) {
            if (n < max)
                chunks[n] = c;
            n++;
        }
    return n;
}

int zs_coord_owner(const zs_coord_state *cs, int chunk)
{
    return chunk >= 0 && chunk < cs->cfg.chunks ? cs->owner[chunk] : -1;
}

static void check_verdict(zs_coord_state *cs)
{
    if (cs->phase != ZS_PHASE_COMPUTE)
        return;
    for (int c = 0; c < cs->cfg.chunks; c++)
        if (!cs->done[c])
            return;
    for (int k = 0; k < cs->n_shards; k++)
        if (!cs->have_partial[k])
            return;
    cs->phase = ZS_PHASE_VERDICT;
}

int zs_coord_chunk_done(zs_coord_state *cs, int id, long step, int chunk, double loss,
                        const zs_msg_chunk_times *times)
{
    if (cs->phase != ZS_PHASE_COMPUTE || step != cs->step || chunk < 0 || chunk >= cs->cfg.chunks ||
        cs->done[chunk] || cs->owner[chunk] != id)
        return 0;
    cs->done[chunk] = 1;
    cs->loss[chunk] = loss;
    if (times) {
        cs->times[chunk] = *times;
        cs->members[id].last_chunk_ms =
            times->compute_ms + times->fetch_wait_ms + times->push_wait_ms;
    }
    cs->members[id].chunks_done++;
    check_verdict(cs);
    return 1;
}

void zs_coord_server_chunks(zs_coord_state *cs, int id, long step, const uint32_t *chunks, int n)
{
    const zs_member *m = zs_coord_member(cs, id);
    if (!m || m->role != ZS_MEMBER_SERVER || step != cs->step)
        return;
    char *row = cs->chunks_in + (size_t)id * (size_t)cs->cfg.chunks;
    memset(row, 0, (size_t)cs->cfg.chunks);
    cs->reported[id] = step;
    for (int i = 0; i < n; i++)
        if (chunks[i] < (uint32_t)cs->cfg.chunks)
            row[chunks[i]] = 1;
}

int zs_coord_chunk_done_yet(const zs_coord_state *cs, int chunk)
{
    return chunk >= 0 && chunk < cs->cfg.chunks && cs->done[chunk];
}

int zs_coord_move_chunk(zs_coord_state *cs, int chunk)
{
    if (cs->phase != ZS_PHASE_COMPUTE || chunk < 0 || chunk >= cs->cfg.chunks || cs->done[chunk] ||
        cs->owner[chunk] < 0)
        return -1;
    int from = cs->owner[chunk];
    cs->refuted[chunk] = from;
    cs->owner[chunk] = -1;
    assign_orphans(cs);
    if (cs->owner[chunk] == from) /* nobody else alive: it stays */
        return -1;
    return cs->owner[chunk];
}

int zs_coord_chunks_pending(const zs_coord_state *cs)
{
    if (cs->phase != ZS_PHASE_COMPUTE)
        return -1;
    int n = 0;
    for (int c = 0; c < cs->cfg.chunks; c++)
        n += !cs->done[c];
    return n;
}

int zs_coord_refute(zs_coord_state *cs, int *chunks, int *workers, int *servers, int max)
{
    if (cs->phase != ZS_PHASE_COMPUTE)
        return 0;
    /* Only against a view every live server gave for this step. */
    for (int i = 0; i < cs->n_members; i++)
        if (cs->members[i].role == ZS_MEMBER_SERVER && cs->members[i].alive &&
            cs->reported[i] != cs->step)
            return 0;
    int n = 0;
    for (int c = 0; c < cs->cfg.chunks; c++) {
        if (!cs->done[c])
            continue;
        int missing = -1;
        for (int i = 0; i < cs->n_members && missing < 0; i++)
            if (cs->members[i].role == ZS_MEMBER_SERVER && cs->members[i].alive &&
                !cs->chunks_in[(size_t)i * (size_t)cs->cfg.chunks + (size_t)c])
                missing = i;
        if (missing < 0)
            continue;
        if (n < max) {
            chunks[n] = c;
            workers[n] = cs->owner[c];
            servers[n] = missing;
        }
        n++;
        cs->refuted[c] = cs->owner[c];
        if (cs->owner[c] >= 0 && cs->members[cs->owner[c]].chunks_done > 0)
            cs->members[cs->owner[c]].chunks_done--;
        cs->done[c] = 0;
        cs->loss[c] = 0;
        cs->times[c] = (zs_msg_chunk_times){0};
        cs->owner[c] = -1;
    }
    if (n)
        assign_orphans(cs);
    return n;
}

zs_err zs_coord_partials(zs_coord_state *cs, int id, long step, const int *shard,
                         const double *sumsq, int n)
{
    const zs_member *m = zs_coord_member(cs, id);
    if (!m || m->role != ZS_MEMBER_SERVER)
        return zs_error(ZS_ERR_INVALID, "coordinator: partials from %d, which is not a server", id);
    if (step != cs->step || cs->phase != ZS_PHASE_COMPUTE)
        return zs_error(ZS_ERR_INVALID,
                        "coordinator: partials from server %d for step %ld, the "
                        "current step is %ld",
                        id, step, cs->step);
    for (int i = 0; i < n; i++)
        if (shard[i] < 0 || shard[i] >= cs->n_shards || cs->have_partial[shard[i]])
            return zs_error(ZS_ERR_INVALID,
                            "coordinator: server %d sent a partial for shard %d, "
                            "unknown or already in",
                            id, shard[i]);
    for (int i = 0; i < n; i++) {
        cs->have_partial[shard[i]] = 1;
        cs->partial[shard[i]] = sumsq[i];
    }
    check_verdict(cs);
    return ZS_OK;
}

double zs_coord_verdict(zs_coord_state *cs, double *norm, double *lr)
{
    if (cs->phase == ZS_PHASE_VERDICT) {
        double sum = 0;
        for (int k = 0; k < cs->n_shards; k++) /* shard order: the trainer's order */
            sum += cs->partial[k];
        /* fp16: the unscaled norm, divided as zshard train divides it (trainer.c). */
        cs->norm = zs_grad_norm(sum, cs->cfg.chunks) / zs_coord_loss_scale(cs);
        cs->clip = zs_clip_factor(cs->norm, cs->cfg.gradient_clipping);
        cs->lr = zs_config_lr(&cs->cfg, (int)zs_coord_opt_step(cs));
        cs->phase = ZS_PHASE_PUBLISH;
    }
    if (norm)
        *norm = cs->norm;
    if (lr)
        *lr = cs->lr;
    return cs->clip;
}

int zs_coord_published(zs_coord_state *cs, int id, long version, zs_coord_step_stats *stats)
{
    const zs_member *m = zs_coord_member(cs, id);
    if (cs->phase != ZS_PHASE_PUBLISH || !m || m->role != ZS_MEMBER_SERVER ||
        version != cs->step + 1 || cs->published[id])
        return 0;
    cs->published[id] = 1;
    for (int i = 0; i < cs->n_members; i++)
        if (cs->members[i].role == ZS_MEMBER_SERVER && !cs->published[i])
            return 0;
    double loss = 0;
    zs_msg_chunk_times t = {0};
    for (int c = 0; c < cs->cfg.chunks; c++) {
        loss += cs->loss[c];
        t.compute_ms += cs->times[c].compute_ms;
        t.fetch_wait_ms += cs->times[c].fetch_wait_ms;
        t.push_wait_ms += cs->times[c].push_wait_ms;
    }
    *stats = (zs_coord_step_stats){.step = cs->step + 1,
                                   .compute_ms = t.compute_ms,
                                   .fetch_wait_ms = t.fetch_wait_ms,
                                   .push_wait_ms = t.push_wait_ms,
                                   .loss = loss / cs->cfg.chunks,
                                   .lr = cs->lr,
                                   .grad_norm = cs->norm,
                                   .clip = cs->clip,
                                   .skipped = !isfinite(cs->norm),
                                   .loss_scale = zs_coord_loss_scale(cs),
                                   .workers = cs->workers_at_begin};
    if (cs->cfg.fp16.enabled &&
        zs_lossscale_update(&cs->ls, &cs->cfg.fp16, stats->skipped) != ZS_OK)
        snprintf(stats->scaler_error, sizeof stats->scaler_error, "%s", zs_last_error());
    cs->step++;
    for (int c = 0; c < cs->cfg.chunks; c++)
        cs->owner[c] = -1;
    cs->phase = cs->step >= cs->steps ? ZS_PHASE_DONE : ZS_PHASE_WAIT_WORKERS;
    return 1;
}

double zs_coord_loss_scale(const zs_coord_state *cs)
{
    return cs->cfg.fp16.enabled ? cs->ls.scale : 1.0;
}

long zs_coord_opt_step(const zs_coord_state *cs)
{
    return cs->cfg.fp16.enabled ? zs_lossscale_opt_step(&cs->ls) : cs->step;
}

const zs_lossscale *zs_coord_scaler(const zs_coord_state *cs)
{
    return &cs->ls;
}

void zs_coord_set_scaler(zs_coord_state *cs, const zs_lossscale *ls)
{
    cs->ls = *ls;
}
