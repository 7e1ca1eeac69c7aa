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
 * reason, and changes no state.  The server never exits because of what a peer sent.  Only the
 * next version is held for: at most 65536 fetches in all and 4096 from one connection wait at
 * once, so a misbehaving client can neither grow the server's memory nor take every place.
 *
 * zs_server_run is the whole process; zs_server_open / _turn / _close are its loop cut into
 * pieces (run = open, turn until done, close), so that a test can drive a server one message
 * at a time.  The last section is for tests and the fuzzer only.
 */
#ifndef ZS_SERVER_H
#define ZS_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/prom.h"
#include "common/secret.h"
#include "proto/messages.h"

typedef struct {
    const char *coord;       /* the coordinator's control endpoint, "tcp://HOST:PORT"; NULL: no
                                control socket (tests: zs_server_feed) */
    const char *listen;      /* the data-plane address to listen on, "HOST:PORT" (port 0: any);
                                NULL: no listener (tests: zs_server_adopt) */
    const char *init_dir;    /* start from init_dir/model.safetensors; NULL: from the seed */
    const zs_secret *secret; /* the job's secret, or insecure (common/secret.h) */
    int threads;             /* AdamW threads */
    const char *transport;   /* the data plane's backend: "tcp", "rdma", "shm" or "auto" (NULL:
                                auto: rdma where this process can use an RDMA device, else tcp) */
    const char *rdma_device; /* rdma: the device (NULL: chosen by the listening address) */
    int rdma_port;           /* rdma: the port, 0: 1 */
    int rdma_gid_set;        /* rdma: 1 to use rdma_gid_index, 0: chosen by address */
    int rdma_gid_index;
    zs_prom *prom; /* the registry the server's zshard_server_* series go into (a scrape
                      endpoint reads it, server/metrics_http.h); NULL: none */
} zs_server_opts;

typedef struct zs_server zs_server;

/* Runs until the coordinator says the job is over (ZS_OK), the job is aborted, or stop_flag
 * becomes non-zero (a signal handler sets it); then leaves cleanly. */
zs_err zs_server_run(const zs_server_opts *opts, volatile int *stop_flag);

/* Opens the data plane and listens, connects to the coordinator and sends its Register.
 * opts must outlive the server.  Does not block.  On failure nothing needs closing. */
zs_err zs_server_open(const zs_server_opts *opts, zs_server **out);

/*
 * One turn of the loop: the data plane's events (waiting up to timeout_ms for the first),
 * then every control message waiting, then the pushes that wait for their chunk's owner are
 * judged again, then a heartbeat when one is due.  Fails only when the data plane's event
 * loop fails; the server is then unusable (close it).
 */
zs_err zs_server_turn(zs_server *sv, int timeout_ms);

/*
 * Waits until there is something for a turn -- data-plane I/O, a control message, one of the
 * server's threads (checkpoint writer, replica) finishing -- or max_ms (-1: no limit) passes,
 * without turning: zs_server_run waits, then turns with timeout 0, so its loop sleeps until
 * something happens rather than waking on a timer.  Fails only if the wait itself fails.
 */
zs_err zs_server_wait(zs_server *sv, int max_ms);

/* 1 once the coordinator ended the job or the server gave up; *result (may be NULL) is ZS_OK,
 * or why (the message is in zs_last_error() when it happened). */
int zs_server_done(const zs_server *sv, zs_err *result);

/* Closes every connection and socket and frees everything, without telling the coordinator;
 * NULL is fine. */
void zs_server_close(zs_server *sv);

/* ---- internal: for tests and the fuzzer (tests/fuzz/fuzz_handlers.c) ---- */

typedef struct {
    /* Sees every control message the server sends (stamped), before ZeroMQ gets it. */
    void (*sent)(void *user, const Zshard__Envelope *env);
    /* The clock of heartbeats and of how long a push waits for its chunk's reassignment, in
     * ms (NULL: zs_now_ms). */
    uint64_t (*now_ms)(void *user);
    void *user;
} zs_server_hooks;

void zs_server_set_hooks(zs_server *sv, const zs_server_hooks *hooks);

/* Takes len bytes as one control message from the coordinator, as a turn takes one from the
 * socket: refused (logged), or handled.  Nothing once done. */
void zs_server_feed(zs_server *sv, const void *bytes, size_t len);

/* Adds a data-plane connection on fd (a connected stream socket: one end of a socketpair), as
 * if the listener had accepted it after member's handshake; the server owns fd from then on,
 * also on failure.  peer names it in logs. */
zs_err zs_server_adopt(zs_server *sv, int fd, const char *peer, uint32_t member);

/* The version the server's shards are at (published); -1 before they exist. */
long zs_server_version(const zs_server *sv);

#endif
