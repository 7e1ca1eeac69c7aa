/*
 * coord: the coordinator process (`zshard coord`).  It binds the control endpoint, waits for
 * S partition servers, cuts the flat vector into shards and hands out the job spec and the
 * shard map, admits workers whose copy of the data matches (fingerprint), and runs the steps:
 * chunk assignment, completion, the clip verdict from the servers' per-shard partials, and
 * version publication (coordstate.h holds the rules).  It writes OUT/metrics.jsonl as the
 * steps finish and, at the end, gathers the weights from the servers into
 * OUT/model.safetensors and OUT/config.json, as `zshard train` writes them.
 *
 * Malformed or out-of-place messages are answered with an Error and logged with the peer;
 * the coordinator keeps running.  A server that dies aborts the job (its shards are gone);
 * a worker that dies has its chunks reassigned.
 */
#ifndef ZS_COORD_H
#define ZS_COORD_H

#include "common/err.h"

typedef struct {
    const char *listen;      /* "tcp://HOST:PORT" */
    const char *config_path; /* the job's JSON config */
    const char *data_path;   /* training data; workers must have the same (fingerprint) */
    const char *out_dir;
    int servers;             /* S */
    long steps;              /* N */
} zs_coord_opts;

zs_err zs_coord_run(const zs_coord_opts *opts, volatile int *stop_flag);

#endif
