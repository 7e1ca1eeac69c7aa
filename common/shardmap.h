/*
 * shardmap: the cut of the flat parameter vector [0, total) into shards, and which partition
 * server holds each one.
 *
 * Shard i is [i * shard_floats, min((i + 1) * shard_floats, total)): the boundaries depend on
 * the shard size alone, never on the number of servers.  That is what lets the coordinator
 * add the servers' per-shard sums of squares in shard order and get the bits `zshard train`
 * gets (kernels/reduce.h, zs_sumsq_sharded), for any S, and what lets a checkpoint be
 * restored onto another number of servers.
 *
 * Assignment (zs_shardmap_build): shards in vector order, each to the server holding the
 * fewest floats so far, ties to the lowest server index.  With equal shards this is round
 * robin (shard i on server i mod S); the shorter last shard goes to the least loaded.  Every
 * server holds at most one shard's worth of floats more than any other.  Interleaving, rather
 * than giving each server one contiguous run, is deliberate: in synchronous data parallel all
 * workers fetch layer l at about the same moment, so a layer must be spread over all servers,
 * not sit on one that then serves every worker while the others idle.  The fan-out costs
 * nothing extra: a range is split into one piece per shard whatever the assignment (a push is
 * accepted per (step, chunk, shard)), and a client holds a connection to every server anyway.
 *
 * Servers: 1 <= S <= number of shards.  An idle server (no shard) is refused rather than
 * allowed: it would take part in every step (heartbeats, grad-norm partials, publishes) with
 * nothing to do, and every per-server loop would need a zero-shard case; the message says to
 * lower cluster.shard_size or the server count instead.
 *
 * Server index s (0..S-1) is the position in ShardMap.servers; server_ids[s] is its
 * control-plane id.
 */
#ifndef ZS_SHARDMAP_H
#define ZS_SHARDMAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Limits of a map; the control plane's (proto/messages.h) are these. */
#define ZS_SHARDMAP_MAX_SHARDS (1 << 20)
#define ZS_SHARDMAP_MAX_SERVERS 4096
#define ZS_SHARDMAP_MAX_FLOATS                                                                     \
    ((uint64_t)1 << 40) /* elements of the flat vector: 4 TiB of fp32                              \
                         */

typedef struct {
    size_t begin, end; /* floats: [begin, end) of the flat vector, end > begin */
    int server;        /* index of the server that holds it */
} zs_shard;

typedef struct {
    size_t total;        /* floats in the vector */
    size_t shard_floats; /* floats per shard; only the last may be shorter */
    int n_shards;        /* ceil(total / shard_floats) */
    zs_shard *shards;    /* n_shards, in vector order */
    int n_servers;
    uint32_t *server_ids;  /* n_servers control-plane ids */
    size_t *server_floats; /* n_servers: floats each server holds */
    int *server_first;     /* n_servers + 1: server s holds by_server[server_first[s] ..
                              server_first[s + 1]) */
    int *by_server;        /* n_shards shard indices, grouped by server, ascending within */
    int *replica;          /* n_servers: index of the server that holds a replica of server s's
                              shards (checkpoint.replicas), -1: none */
} zs_shardmap;

/* One piece of a range split by shard: [begin, end) inside shard `shard`. */
typedef struct {
    int shard;
    int server;
    size_t begin, end; /* floats of the flat vector */
} zs_shard_piece;

/*
 * Cuts [0, total) into shards of shard_bytes / 4 floats and assigns them to n_servers servers
 * (see above).  server_ids gives their ids (NULL: 1..n_servers).  shard_bytes must be a
 * multiple of 256 (64 floats, ZS_TENSOR_ALIGN), total >= 1, 1 <= n_servers <= shards.
 * Cost: O(shards * servers).
 */
zs_err zs_shardmap_build(size_t total, size_t shard_bytes, int n_servers,
                         const uint32_t *server_ids, zs_shardmap *map);
void zs_shardmap_free(zs_shardmap *map);

/* The shard holding element x, or -1 if x >= total.  O(1). */
int zs_shardmap_shard_of(const zs_shardmap *map, size_t x);

/* The number of pieces zs_shardmap_split gives for [begin, end) (0 if empty or outside). */
int zs_shardmap_count_pieces(const zs_shardmap *map, size_t begin, size_t end);

/*
 * Splits [begin, end) into per-shard pieces, in vector order, into pieces[0 .. *n) (at most
 * max).  An empty range gives no piece; a range past total or more pieces than max is
 * ZS_ERR_INVALID.  O(pieces).
 */
zs_err zs_shardmap_split(const zs_shardmap *map, size_t begin, size_t end, zs_shard_piece *pieces,
                         int max, int *n);

/* The shards of server s, ascending: *count of them at the returned pointer (NULL, 0 if s is
 * out of range). */
const int *zs_shardmap_server_shards(const zs_shardmap *map, int s, int *count);

/* The index of the server with control-plane id, or -1. */
int zs_shardmap_server_index(const zs_shardmap *map, uint32_t id);

/*
 * Buddy replicas: with replicas 1 and at least two servers, server s's replica lives on server
 * (s + 1) mod S (a ring: every server holds exactly one other's state besides its own, so the
 * memory and the replica's AdamW are spread evenly); otherwise none.
 */
void zs_shardmap_set_replicas(zs_shardmap *map, int replicas);

/* The index of the server holding server s's replica, or -1. */
int zs_shardmap_replica(const zs_shardmap *map, int s);

/*
 * Fills map from explicit boundaries and an assignment: shards of shard_floats floats cut from
 * [0, total) (the last may be shorter), shard i on server index assign[i] (0..n_servers-1),
 * server ids ids[0..n_servers) (NULL: 1..n_servers).  Checks that every index is in range;
 * the caller decides whether an idle server is acceptable (zs_shardmap_build never makes one).
 * No replicas (zs_shardmap_set_replicas adds them).
 */
zs_err zs_shardmap_assemble(size_t total, size_t shard_floats, int n_shards, int n_servers,
                            const uint32_t *ids, const int *assign, zs_shardmap *map);

#endif
