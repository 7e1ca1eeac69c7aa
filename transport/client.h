/*
 * client: the data-plane client of workers, tests and benchmarks.  A logical fetch or push
 * names a range of the flat vector; the client splits it by shard (zs_shardmap_split), sends
 * one frame per piece to the server holding it,
 * all pieces in flight at once over the connections to every server, and reports the whole
 * operation done when every piece is.
 *
 * Buffers: destinations of fetches and sources of pushes must lie in memory registered with
 * zs_client_register (once; RDMA pins it).  Push replies land in areas registered once and
 * reused (zs_client_reply_areas).
 * Not thread-safe: one thread drives a client.
 */
#ifndef ZS_CLIENT_H
#define ZS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/shardmap.h"
#include "transport/transport.h"

typedef struct zs_client zs_client;
typedef struct zs_client_op zs_client_op;

/* Connects to every server of map; endpoints[s] is server index s's data-plane address; auth
 * says who we are (our control-plane id and its data-plane token), which every stream proves
 * in its handshake (transport.h) and which the servers take as the sender of our pushes.
 * opts (NULL: the transport's defaults): the backend (opts->ops, NULL: tcp) and its options,
 * streams per server and the connect timeout (its auth is ours). */
zs_err zs_client_open(const zs_shardmap *map, const char *const *endpoints, const zs_auth *auth,
                      const zs_conn_opts *opts, zs_client **out);
void zs_client_close(zs_client *cl);

/* Registers [base, base + bytes) as a fetch destination and push source.  Regions must not
 * overlap; they stay registered until zs_client_close. */
zs_err zs_client_register(zs_client *cl, void *base, size_t bytes);
/* The same for memory whose pages someone else holds in place (a GPU's page-locked buffer):
 * no backend moves them (ZS_MR_PINNED). */
zs_err zs_client_register_pinned(zs_client *cl, void *base, size_t bytes);
/* The same for device memory given as a dma-buf (transport.h, zs_dmabuf): fetches land in it
 * and pushes leave from it through the NIC, [buf->addr, buf->addr + buf->len) naming it; the
 * client reads an error reply's text out of it with buf->copy.  Only backends that reach device
 * memory take it (rdma, where the device and driver allow: GPUDirect RDMA); the others refuse
 * with ZS_ERR_UNSUPPORTED and the reason, and nothing is registered. */
zs_err zs_client_register_dmabuf(zs_client *cl, const zs_dmabuf *buf);
/* The backend's name ("tcp", "rdma", "shm"). */
const char *zs_client_transport(const zs_client *cl);

/* Starts fetching elements [begin, end) at `version` in dtype into dst (registered), which
 * receives (end - begin) elements.  The servers hold a fetch of a version not yet published
 * until it is.  Does not block. */
zs_err zs_client_fetch(zs_client *cl, size_t begin, size_t end, long version, zs_frame_dtype dtype,
                       void *dst, zs_client_op **op);

/* Starts fetching optimizer-state array `array` (0: fp32 master weights, 1: exp_avg, 2:
 * exp_avg_sq) of [begin, end) at `version` into dst (registered).  Servers answer it only while
 * they are at exactly that version (a replica being built after a failover). */
zs_err zs_client_fetch_state(zs_client *cl, size_t begin, size_t end, long version, int array,
                             float *dst, zs_client_op **op);

/* Starts pushing the fp32 gradient src[0 .. end - begin) of [begin, end) for (step, chunk),
 * to each piece's server and, where the map gives that server a replica, to the replica's
 * server as well (the op is done when both accepted).  Does not block.  A piece the server
 * already had counts as done (a duplicate). */
zs_err zs_client_push(zs_client *cl, size_t begin, size_t end, long step, int chunk,
                      const float *src, zs_client_op **op);

/* The same with an IEEE fp16 gradient (dtype F16 on the wire, half the bytes): an fp16 job's
 * scaled gradient, whose values fp16 holds exactly.  Servers of other jobs refuse it. */
zs_err zs_client_push_f16(zs_client *cl, size_t begin, size_t end, long step, int chunk,
                          const uint16_t *src, zs_client_op **op);

/*
 * Waits up to timeout_ms (-1: forever) for op, driving all traffic; frees op once it is done
 * (*done = 1), successful or not.  A failure names the server, the shard and the reason
 * (an error frame's text, or the connection's failure).
 */
zs_err zs_client_wait(zs_client *cl, zs_client_op *op, int timeout_ms, int *done);

/* The client's net's wait descriptor and timeout (transport.h, wait_fd): a thread that also
 * waits for other things polls it with them, then calls zs_client_wait with timeout 0.  It
 * drops the events queued in the net first (a failed connection's, an unexpected frame's,
 * whose payload it skips): the client learns outcomes from its requests, and queued events
 * would keep the timeout at 0. */
int zs_client_wait_fd(zs_client *cl, int *timeout_ms);

/* Gives up on op (not yet done) and frees it: its destination or source is no longer
 * touched once this returns, except that a push piece already partly written to a socket is
 * finished from the source first (TCP cannot recall it), driving the net up to timeout_ms. */
void zs_client_cancel(zs_client *cl, zs_client_op *op, int timeout_ms);

/* Pieces a range splits into: what one operation sends. */
int zs_client_pieces(const zs_client *cl, size_t begin, size_t end);

/* Memory areas registered for push replies so far: as many as pushes were ever in flight at
 * once (an area is reused once its push ends), never one per push. */
int zs_client_reply_areas(const zs_client *cl);

#endif
