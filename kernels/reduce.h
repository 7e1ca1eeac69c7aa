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
#include <stdint.h>

#define ZS_REDUCE_BLOCK 4096

/* Sum of x[i]^2 (in double) over n elements, using up to threads OpenMP threads (0: default). */
double zs_sumsq(const float *x, size_t n, int threads);

/* Sum of squares of x[0, n) taken shard by shard (shard_floats each, the last one shorter), in
 * shard order: what the coordinator adds up from the servers' partials. */
double zs_sumsq_sharded(const float *x, size_t n, size_t shard_floats, int threads);

/* acc[i] += g[i] for i < n: how a chunk's gradient joins the step's sum on a server.  Element
 * by element, so the bits do not depend on the threads; ranges of ZS_ACCUMULATE_SPLIT floats or
 * more are cut into contiguous pieces (whole cache lines) over up to `threads` OpenMP threads
 * (0: the default), since one thread adds at well under the memory's speed. */
#define ZS_ACCUMULATE_SPLIT ((size_t)1 << 18)
void zs_accumulate(float *restrict acc, const float *restrict g, size_t n, int threads);

/* The same for an fp16 gradient (an fp16 job's F16 push), widened exactly: acc[i] += g[i], or
 * acc[i] = g[i] with copy (the step's first chunk).  The result is zs_accumulate's on the
 * widened values, bit for bit. */
void zs_accumulate_f16(float *restrict acc, const uint16_t *restrict g, size_t n, int copy,
                       int threads);

/*
 * The step's clip factor from the global sum of squares of the accumulated gradient (the sum
 * over C chunks): the norm is sqrt(sumsq) / C, and the factor is
 * min(1, max_norm / (norm + 1e-6)) when norm exceeds max_norm (torch.nn.utils.clip_grad_norm_),
 * 1 otherwise or when max_norm is 0.  The trainer and the coordinator both call this.
 */
double zs_grad_norm(double sumsq, int chunks);
double zs_clip_factor(double norm, double max_norm);

#endif
