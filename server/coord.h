/*
 * coord: the coordinator process (`zshard coord`).  It binds the control endpoint, waits for
 * S partition servers, cuts the flat vector into shards and hands out the job spec and the
 * shard map, admits workers whose copy of the data matches (fingerprint), and runs the steps:
 * chunk assignment, completion, the clip verdict from the servers' per-shard partials, and
 * version publication (coordstate.h holds the rules).  It writes OUT/metrics.jsonl as the
 * steps finish, commits the checkpoints the servers write (their manifest, `latest`, pruning
 * to checkpoint.keep), and at the end commits the final checkpoint and exports it into
 * OUT/model.safetensors and OUT/config.json, as `zshard train` writes them; the coordinator
 * never holds the model.  With opts.resume it continues a run from a checkpoint, on any
 * number of servers.
 *
 * Malformed or out-of-place messages are answered with an Error and logged with the peer;
 * the coordinator keeps running.  A worker that dies has its chunks reassigned.  A server
 * of the map that dies is recovered from: every server goes back to the newest committed
 * checkpoint (or the job's start), the shards are spread over the servers left and any spare
 * (a server that registered beyond S), the workers register again, and the steps since run
 * again (start_recovery in coord.c).  It sends every member a heartbeat each interval, and
 * a gap in its own turns (it was stopped) gives the members a whole timeout again.
 *
 * zs_coord_run is the whole process; zs_coord_open / _turn / _close are its loop cut into
 * pieces (run = open, turn until done, close), so that a test can drive a coordinator one
 * message at a time.  The last section is for tests and the fuzzer only.
 */
#ifndef ZS_COORD_H
#define ZS_COORD_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/prom.h"
#include "proto/ctrl.h"

typedef struct {
    const char *listen;      /* "tcp://HOST:PORT"; NULL: no socket (tests: zs_coord_feed) */
    const zs_secret *secret; /* the job's secret, or insecure (common/secret.h) */
    const char *config_path; /* the job's JSON config */
    const char *data_path;   /* training data; workers must have the same (fingerprint) */
    const char *out_dir;
    int servers;        /* S */
    long steps;         /* N: the run's total, also when it resumes */
    const char *resume; /* a checkpoint, or a checkpoint directory (meaning its newest valid
                           one), to continue from; NULL: a fresh start */
    int resume_if_any;  /* with resume: a fresh start when it holds no checkpoint at all
                           (zs_ckpt_present); one it holds must be valid, as without this */
    zs_prom *prom;      /* the registry the coordinator's zshard_* series go into (a scrape
                           endpoint reads it, server/metrics_http.h); NULL: none */
} zs_coord_opts;

typedef struct zs_coord zs_coord;

/* Runs the job until it is done (ZS_OK), aborted, or stop_flag becomes non-zero (a signal
 * handler sets it; the peers are told to abort). */
zs_err zs_coord_run(const zs_coord_opts *opts, volatile int *stop_flag);

/* Loads the config and the data, builds the job spec, opens OUT/metrics.jsonl and binds the
 * control endpoint.  opts must outlive the coordinator.  Does not block.  On failure nothing
 * needs closing. */
zs_err zs_coord_open(const zs_coord_opts *opts, zs_coord **out);

/*
 * One turn of the loop: when stop_flag is set, aborts the job; else waits up to timeout_ms
 * for one control message and handles it, then moves the job on (members whose heartbeats
 * stopped, the start of a step, the clip verdict, changed assignments).  The turn that commits
 * the final checkpoint exports the model from it (reading the whole checkpoint).  Nothing
 * once done.
 */
void zs_coord_turn(zs_coord *co, int timeout_ms, volatile int *stop_flag);

/* 1 once the job is over; *result (may be NULL) is ZS_OK, or why the job was aborted (the
 * message is in zs_last_error() when the job ended). */
int zs_coord_done(const zs_coord *co, zs_err *result);

/* Closes the socket and the metrics file and frees everything; NULL is fine. */
void zs_coord_close(zs_coord *co);

/* ---- internal: for tests and the fuzzer (tests/fuzz/fuzz_handlers.c) ---- */

typedef struct {
    /* Sees every envelope the coordinator sends (stamped), before ZeroMQ gets it. */
    void (*sent)(void *user, const zs_ctrl_peer *to, const Zshard__Envelope *env);
    /* The clock of heartbeats and their timeouts, in ms (NULL: zs_now_ms). */
    uint64_t (*now_ms)(void *user);
    /* Called after the last step instead of waiting for the final checkpoint and exporting
     * it (NULL: do both); its error aborts the job as a failed export would. */
    zs_err (*finish)(void *user);
    void *user;
} zs_coord_hooks;

void zs_coord_set_hooks(zs_coord *co, const zs_coord_hooks *hooks);

/* Takes len bytes as one control message from routing id `from`, as a turn takes one from
 * the socket: refused with an Error to `from`, or handled; then moves the job on as a turn
 * does.  Nothing once done. */
void zs_coord_feed(zs_coord *co, const zs_ctrl_peer *from, const void *bytes, size_t len);

/* Steps finished (published by every server) so far; 0 while a lost server is recovered from,
 * then the version the servers went back to. */
long zs_coord_steps_done(const zs_coord *co);

/* How many times a lost server started a recovery. */
int zs_coord_recoveries(const zs_coord *co);

#endif
