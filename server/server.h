/*
 * server: the partition server process (`zshard server`).  It registers with the
 * coordinator, receives the job spec and the shard map, initializes its shards (from the seed
 * as `zshard train` does, or from a checkpoint), and then serves the data plane: fetches of
 * any range of its shards at a version (held until that version is published) and gradient
 * pushes (accumulated in chunk order by the shard store).  When all chunks of a step are in it
 * reports its per-shard sums of squares, applies AdamW with the coordinator's clip factor and
 * publishes the next version.
 *
 * Bad input from peers -- malformed frames, wrong sizes, ranges outside its shards, pushes for
 * another step or for a chunk not assigned to the sender -- is answered with an error frame
 * (the connection closed when the frame itself is malformed), logged with the peer and the
 * reason, and changes no state.  The server never exits because of what a peer sent.
 */
#ifndef ZS_SERVER_H
#define ZS_SERVER_H

#include "common/err.h"

typedef struct {
    const char *coord;    /* the coordinator's control endpoint, "tcp://HOST:PORT" */
    const char *listen;   /* the data-plane address to listen on, "HOST:PORT" (port 0: any) */
    const char *init_dir; /* start from init_dir/model.safetensors; NULL: from the seed */
    int threads;          /* AdamW threads */
} zs_server_opts;

/* Runs until the coordinator says the job is over (ZS_OK), the job is aborted, or stop_flag
 * becomes non-zero (a signal handler sets it); then leaves cleanly. */
zs_err zs_server_run(const zs_server_opts *opts, volatile int *stop_flag);

#endif
