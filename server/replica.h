/*
 * replica: the buddy replica a partition server holds (checkpoint.replicas 1): a copy of
 * another server's training state -- weights, AdamW moments, gradient accumulator -- kept at the
 * same version as the original, so that losing that server costs no step (the coordinator fails
 * over to the replica: docs/checkpoints.md).
 *
 * How it stays current: workers push every gradient piece to the shard's server and to the
 * server holding its replica (transport/client.c), which accumulates them in chunk order in a
 * store of its own exactly as the original does (server/shardstore.h).  A server reports its
 * step's partial sums only once its replica has the whole step too, so the coordinator's verdict
 * implies every replica can apply it; the replica then runs the same AdamW with the same clip
 * factor, on a thread of its own while the next step computes.  Same inputs, same arithmetic:
 * the replica's bits are the original's.
 *
 * Two threads may run on the replica store, never both and never while the server's thread
 * touches what they touch:
 *  - apply: zs_store_apply after the verdict.  Until it finishes the server defers pushes for
 *    the replica (they belong to the next version).
 *  - load: after a failover, the shards of a replica that this server did not hold before are
 *    fetched from their servers (their weights and moments at the failover's version, over the
 *    data plane); meanwhile the server may add pushes into the accumulator, which the load does
 *    not touch.  The step's partial sums wait for it, and with them every server's next AdamW,
 *    so the state it reads stays put.
 * A replica that cannot be kept (a load that failed, an apply refused) is lost: the server
 * says so (GradNormPartial.replicas_current false), drops pushes for it, and a loss of its
 * original then goes back to the last checkpoint instead.
 */
#ifndef ZS_REPLICA_H
#define ZS_REPLICA_H

#include <stdint.h>

#include "common/err.h"
#include "common/shardmap.h"
#include "server/shardstore.h"
#include "transport/transport.h"

typedef struct zs_replica zs_replica;

/* A replica over store st (owned from now on; freed with the replica). */
zs_err zs_replica_new(zs_store *st, zs_replica **out);

/* Waits for a running thread, then frees everything; NULL is fine. */
void zs_replica_free(zs_replica *r);

/* Gives the store back (the replica is freed) once an apply running finished; NULL (the store
 * freed too) for a replica lost, or one whose load had not finished (it is cancelled: a
 * half-loaded store is no replica). */
zs_store *zs_replica_release(zs_replica *r);

/* The store: the server's thread reads and pushes into it only while zs_replica_applying() is
 * 0 (and, during a load, touches only the accumulator: zs_store_push). */
zs_store *zs_replica_store(const zs_replica *r);

/* Starts AdamW on the replica with the verdict's numbers. */
zs_err zs_replica_apply(zs_replica *r, double lr, double clip, int skip);

/*
 * Starts loading local shards todo[0..n) (indices into the store, whose arrays exist) from
 * their servers in map (endpoints[s]: server index s's data-plane address; auth: who we are,
 * copied) at
 * `version`, retrying a server that is not ready yet until timeout_ms has passed.  map and
 * endpoints must stay until the load finished (zs_replica_poll, zs_replica_free).
 */
zs_err zs_replica_load(zs_replica *r, const zs_shardmap *map, const char *const *endpoints,
                       const zs_auth *auth, long version, const int *todo, int n, int timeout_ms);

/* The data-plane backend and options a load connects with (o->ops; NULL: tcp); o's pointers
 * must outlive the replica. */
void zs_replica_set_transport(zs_replica *r, const zs_conn_opts *o);

/* An eventfd the replica's threads write 1 to as their last act, so that the server's loop,
 * waiting on it, wakes to reap them (zs_replica_poll); -1: none. */
void zs_replica_set_wake(zs_replica *r, int fd);

/* Reaps a thread that finished (a failure makes the replica lost, and is logged); returns 1
 * when one did. */
int zs_replica_poll(zs_replica *r);

int zs_replica_applying(const zs_replica *r);
/* Lost: given up (see above). */
int zs_replica_lost(const zs_replica *r);
/* Marks the replica lost, logging why. */
void zs_replica_lose(zs_replica *r, const char *why);

/* Current for the step in hand: not lost, no thread running, every chunk of the step in. */
int zs_replica_complete(const zs_replica *r);

#endif
