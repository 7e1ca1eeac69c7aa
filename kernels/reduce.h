/*
 * reduce: deterministic reductions over the flat vector (the gradient norm).
 *
 * Invariant: the result depends only on the values, never on the number of threads: the input
 * is cut into fixed blocks of ZS_REDUCE_BLOCK elements, each block is summed in double in
 * index order, and the block sums are added in block order.  The global gradient norm is the
 * sum of per-shard results in shard order, and shards are fixed by the config, so a single
 * process and any number of partition servers get the same bits.
 */
#ifndef ZS_REDUCE_H
#define ZS_REDUCE_H

#include <stddef.h>

#define ZS_REDUCE_BLOCK 4096

/* Sum of x[i]^2 (in double) over n elements, using up to threads OpenMP threads (0: default). */
double zs_sumsq(const float *x, size_t n, int threads);

/* Sum of squares of x[0, n) taken shard by shard (shard_floats each, the last one shorter), in
 * shard order: what the coordinator adds up from the servers' partials. */
double zs_sumsq_sharded(const float *x, size_t n, size_t shard_floats, int threads);

#endif
