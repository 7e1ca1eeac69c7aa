/*
 * coordstate: the coordinator's bookkeeping, without any networking: membership with
 * heartbeats, the step state machine (chunk assignment, chunk completion, gradient-norm
 * partials, the clip verdict, version publication) and the metrics of each finished step.
 * The coordinator's ZeroMQ loop turns messages into these calls and their results into
 * messages; tests drive it directly.
 *
 * Invariants:
 *  - Step s's chunks are assigned to the workers alive when the step begins; a worker that
 *    dies or leaves has its unfinished chunks reassigned to the live worker with the fewest
 *    unfinished chunks (lowest id on ties).  A worker that registers during a step gets chunks
 *    from the next step on.
 *  - A chunk counts as done once, from the worker it is currently assigned to; a report from
 *    anyone else, for another step, or a repeat, changes nothing.
 *  - The global sum of squares is the sum of the per-shard partials in shard order, so the
 *    norm and clip factor are bitwise those of `zshard train` (zs_grad_norm, zs_clip_factor).
 *  - The step ends when every server has published version s + 1.
 * Times are milliseconds of a monotonic clock, passed in by the caller.
 */
#ifndef ZS_COORDSTATE_H
#define ZS_COORDSTATE_H

#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "common/lossscale.h"
#include "proto/messages.h"

typedef enum { ZS_MEMBER_SERVER = 1, ZS_MEMBER_WORKER = 2 } zs_member_role;

typedef enum {
    ZS_PHASE_WAIT_SERVERS = 0, /* fewer than S servers registered */
    ZS_PHASE_WAIT_WORKERS,     /* servers ready, no live worker to start or continue a step */
    ZS_PHASE_COMPUTE,          /* chunks of the current step are being computed */
    ZS_PHASE_VERDICT,          /* all chunks done and all partials in: the clip factor is known */
    ZS_PHASE_PUBLISH,          /* verdict sent, waiting for every server's new version */
    ZS_PHASE_DONE,             /* all steps done */
} zs_phase;

typedef struct {
    int id;
    int label; /* how logs name it: the caller's id for the member (its proto id) */
    zs_member_role role;
    int alive;
    uint64_t last_heartbeat_ms;
    char endpoint[128];   /* data-plane address of a server */
    int chunks_done;      /* over the whole run (workers) */
    double last_chunk_ms; /* workers: compute + waits of its last chunk (0: not reported) */
} zs_member;

typedef struct {
    long step;   /* 1-based number of the step just finished */
    double loss; /* mean of the chunk losses, summed in chunk order */
    double lr;
    double grad_norm;
    double clip;
    int skipped; /* the norm was not finite: the verdict told the servers to skip the update */
    double loss_scale;      /* fp16 jobs: the step's loss scale (1 otherwise) */
    char scaler_error[256]; /* fp16 jobs: "" or why the run must end (DeepSpeed's overflow at
                               the minimum scale, lossscale.h) */
    int workers;            /* live workers when the step began */
    /* Where the workers' time went, summed over the step's chunks (ms; 0 when the workers
     * did not report it). */
    double compute_ms, fetch_wait_ms, push_wait_ms;
} zs_coord_step_stats;

typedef struct zs_coord_state zs_coord_state;

/* n_servers: S; shards: the number of shards (partials expected per step); steps: N. */
zs_err zs_coord_state_create(const zs_config *cfg, int n_servers, int n_shards, long steps,
                             zs_coord_state **out);
void zs_coord_state_free(zs_coord_state *cs);

/* A job resumed from a checkpoint of version `step`: the first step to run is step + 1
 * (0-based: `step`).  Before the first zs_coord_try_begin; ZS_ERR_INVALID if step is not
 * below the job's steps. */
zs_err zs_coord_state_start_at(zs_coord_state *cs, long step);

/* Registers a member; *id is its new id, label how logs name it.  Refused (ZS_ERR_INVALID,
 * with the reason) for a server beyond S or a worker beyond elasticity.max_workers. */
zs_err zs_coord_join(zs_coord_state *cs, zs_member_role role, int label, const char *endpoint,
                     uint64_t now_ms, int *id);
/* A heartbeat from id (ignored for unknown or dead members). */
void zs_coord_heartbeat(zs_coord_state *cs, int id, uint64_t now_ms);
/* A member leaves (reason: "SIGTERM", "connection closed", ...); its unfinished chunks are
 * reassigned. */
void zs_coord_leave(zs_coord_state *cs, int id, const char *reason);
/* The coordinator itself was stopped (a pause of its process, a VM hang): what did not arrive
 * meanwhile says nothing about its members, so every live member counts as heard from at
 * now_ms and gets a whole timeout again. */
void zs_coord_grace(zs_coord_state *cs, uint64_t now_ms);
/* Marks dead every member whose last heartbeat is older than the configured timeout; returns
 * how many, their ids in dead[0..max). */
int zs_coord_expire(zs_coord_state *cs, uint64_t now_ms, int *dead, int max);

const zs_member *zs_coord_member(const zs_coord_state *cs, int id);
int zs_coord_live_workers(const zs_coord_state *cs);
zs_phase zs_coord_phase(const zs_coord_state *cs);
long zs_coord_step(const zs_coord_state *cs); /* the 0-based current step */

/*
 * Starts the current step when it can (servers registered, a live worker, not started yet):
 * returns 1 when it started now.  Then zs_coord_assigned() lists each worker's chunks.
 */
int zs_coord_try_begin(zs_coord_state *cs);
/* The chunks currently assigned to worker id and not done, in increasing order. */
int zs_coord_assigned(const zs_coord_state *cs, int id, int *chunks, int max);
/* The worker a chunk of the current step is assigned to (-1 if none). */
int zs_coord_owner(const zs_coord_state *cs, int chunk);

/* Worker id finished chunk of step with that loss (and those timings; may be NULL): 1 if it
 * counted, 0 if ignored. */
int zs_coord_chunk_done(zs_coord_state *cs, int id, long step, int chunk, double loss,
                        const zs_msg_chunk_times *times);
/* Server id's per-shard partials for step: ZS_ERR_INVALID for an unknown shard, a repeat, a
 * non-server or another step (nothing recorded then). */
zs_err zs_coord_partials(zs_coord_state *cs, int id, long step, const int *shard,
                         const double *sumsq, int n);
/* In ZS_PHASE_VERDICT: the clip factor (and norm); moves to ZS_PHASE_PUBLISH.  A norm that is
 * not finite (an inf or NaN in some shard's partial) means the step's update is skipped, as
 * `zshard train` skips it; the step's stats then say skipped. */
double zs_coord_verdict(zs_coord_state *cs, double *norm, double *lr);

/*
 * fp16 jobs (fp16.enabled): the coordinator owns DeepSpeed's loss scaler (common/lossscale.h).
 * During a step, zs_coord_loss_scale() is the step's scale (StepAssign and ClipVerdict carry
 * it) and zs_coord_opt_step() the optimizer step its update is (its learning rate's index and
 * AdamW's t - 1, which skipped steps do not advance); the verdict's norm is that of the
 * unscaled gradient.  The scaler is updated when the step finishes (zs_coord_published):
 * zs_coord_scaler() then is the state after it, which checkpoints of that version carry, and
 * zs_coord_set_scaler() restores it with zs_coord_state_start_at.  Other jobs: scale 1 and the
 * optimizer step is the step.
 */
double zs_coord_loss_scale(const zs_coord_state *cs);
long zs_coord_opt_step(const zs_coord_state *cs);
const zs_lossscale *zs_coord_scaler(const zs_coord_state *cs);
void zs_coord_set_scaler(zs_coord_state *cs, const zs_lossscale *ls);
/*
 * The servers' view of the step, from their heartbeats: server id has chunks[0..n) of step
 * `step` in full (anything else it has not).  zs_coord_refute then contradicts the workers:
 * every chunk reported done that a live server does not have is not done after all, and goes
 * to another live worker (the one that reported it only if no other is alive).  Returns the
 * number refuted, with chunks[i], the worker that reported it and a server missing it for the
 * first max.  The caller calls it only once the servers had time to report (every chunk done,
 * no verdict yet, for a while): a push acknowledged before its ChunkDone is in the server's
 * next heartbeat.
 */
void zs_coord_server_chunks(zs_coord_state *cs, int id, long step, const uint32_t *chunks, int n);
int zs_coord_refute(zs_coord_state *cs, int *chunks, int *workers, int *servers, int max);
/* Whether chunk is done in the current step. */
int zs_coord_chunk_done_yet(const zs_coord_state *cs, int chunk);
/* Gives an unfinished chunk of the current step to another live worker (the least loaded;
 * its owner keeps it only if it is the only one alive): its new owner, or -1 if it stays.
 * A chunk past its deadline moves so; whichever copy's pushes reach a server first count, the
 * others are duplicates (chunks are deterministic) or refused as not assigned. */
int zs_coord_move_chunk(zs_coord_state *cs, int chunk);
/* Chunks of the current step not done yet; -1 outside ZS_PHASE_COMPUTE. */
int zs_coord_chunks_pending(const zs_coord_state *cs);

/* Server id published version; returns 1 when this finished the step (stats filled in). */
int zs_coord_published(zs_coord_state *cs, int id, long version, zs_coord_step_stats *stats);

#endif
