/*
 * shardstore: the training state of the shards one partition server holds, and the step
 * protocol on it, without any networking (the server's event loop drives it).
 *
 * Per shard: fp32 master weights, AdamW m and v, the gradient accumulator, and the 16-bit copy
 * of the weights.  The store is at version s while step s runs: fetches read version s,
 * pushes carry step s gradients.
 *
 * Invariants, which make the result bitwise equal to `zshard train`:
 *  - Each element of a shard's accumulator receives chunk c's gradient exactly once, and only
 *    after chunks 0..c-1 (chunk 0 is copied, later chunks added): pieces of the current chunk
 *    are applied as they arrive, pieces of later chunks are held in a staging buffer until
 *    their turn.
 *  - A piece already received for (step, chunk, shard) is dropped as a duplicate (a retried
 *    chunk sends identical values); pieces for another step are stale.  Neither changes the
 *    accumulator.
 *  - zs_store_apply runs AdamW tensor by tensor over each shard with grad_scale = clip / C,
 *    the same arithmetic as the trainer on the same elements, and moves to version s + 1.
 * With an NVMe tier (zs_store_create_tiered), the AdamW moments of the shards after the first
 * `resident` ones live in a state file (server/nvme.h) instead of RAM; zs_store_apply streams
 * them through a pipeline, with the same arithmetic on the same elements, so the bits are
 * those of the RAM tier.
 * Not thread-safe: one thread drives a store (AdamW itself uses `threads` OpenMP threads).
 */
#ifndef ZS_SHARDSTORE_H
#define ZS_SHARDSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "common/tensors.h"
#include "server/nvme.h"

/* What a push or a lookup came to.  The server turns these into wire statuses; the store
 * knows nothing of the wire. */
typedef enum {
    ZS_STORE_OK = 0,
    ZS_STORE_DUPLICATE, /* every element of the piece was already received: dropped */
    ZS_STORE_STALE,     /* a push for another step */
    ZS_STORE_BAD_RANGE, /* not inside one of this store's shards */
    ZS_STORE_BAD_CHUNK, /* chunk index out of range */
    ZS_STORE_NOMEM,     /* out of memory for a held chunk or its bookkeeping */
    ZS_STORE_ON_NVME,   /* zs_store_locate: the fp32 weights of that shard are on NVMe */
} zs_store_result;

/* Which copy of the weights zs_store_locate finds. */
typedef enum { ZS_STORE_F32 = 0, ZS_STORE_HALF = 1 } zs_store_copy;

/* The copy a job's workers fetch: the 16-bit one in bf16 jobs (bf16) and fp16 jobs (IEEE fp16,
 * docs/precision.md), the fp32 weights otherwise. */
zs_store_copy zs_store_fetched_copy(const zs_config *cfg);

typedef struct {
    int index;    /* position in the global shard list: the order partials are summed in */
    size_t begin; /* first float of the shard in the flat vector */
    size_t end;   /* one past the last */
} zs_shard_range;

typedef struct zs_store zs_store;

/* A store for `n` shards (sorted by begin, non-overlapping, inside tt->total); weights zero
 * until zs_store_init_seed or zs_store_load. */
zs_err zs_store_create(const zs_tensor_table *tt, const zs_config *cfg,
                       const zs_shard_range *shards, int n, int threads, zs_store **out);
void zs_store_free(zs_store *st);

/* What an NVMe tier holds beside the moments (zs_store_create_tiered's `what`). */
enum {
    ZS_STORE_TIER_MASTER = 1,    /* the fp32 master weights */
    ZS_STORE_TIER_PUBLISHED = 2, /* and the copy workers fetch (the weights, or the 16-bit copy in
                                    a file of its own); implies MASTER */
};

/* The same, with the moments of shards [resident, n) in an NVMe tier opened with `tier` (its
 * errors, such as a disk too small, are this call's), and what `what` adds.  resident >= n:
 * zs_store_create. */
zs_err zs_store_create_tiered(const zs_tensor_table *tt, const zs_config *cfg,
                              const zs_shard_range *shards, int n, int threads, int resident,
                              int what, const zs_nvme_opts *tier, zs_store **out);

/* Bytes of RAM the NVMe tier of a store of shards[0..n) with `what` takes when any of them is
 * on NVMe (its slots; with the published 16-bit copy of a bf16 or fp16 job (half), that copy's
 * slots and scratch), so
 * that a budget can be checked before the store is made. */
uint64_t zs_store_tier_ram(const zs_shard_range *shards, int n, int what, int half);

/* Initializes the weights from the seed exactly as zs_tensors_init_gpt2 does the whole vector.
 * Fails only when weights go to the NVMe tier (out of memory, a write that failed). */
zs_err zs_store_init_seed(zs_store *st, uint64_t seed);
/* The same for local shard i only (0..n-1), so that a caller can do other work (heartbeats)
 * between shards of a large store. */
zs_err zs_store_init_seed_shard(zs_store *st, int i, uint64_t seed);
/* Local shards of the store. */
int zs_store_local_count(const zs_store *st);
/* Copies the shards' ranges out of a whole flat vector (an --init checkpoint). */
zs_err zs_store_load(zs_store *st, const float *full);

/* The version that fetches read now (= the step whose gradients are being accepted). */
long zs_store_version(const zs_store *st);
/* fp16 jobs: the steps whose update was skipped on an overflow before the next apply; that
 * apply's AdamW t is version + 1 - skipped (DeepSpeed does not advance the optimizer's step on
 * an overflow).  0 (the default) in every other job. */
void zs_store_set_skipped(zs_store *st, long skipped);

/*
 * A gradient piece: elements [offset, offset + count) of chunk `chunk` of step `step`, which
 * must lie inside one of this store's shards.  Returns ZS_STORE_OK (applied or held),
 * ZS_STORE_DUPLICATE, ZS_STORE_STALE, ZS_STORE_BAD_RANGE, ZS_STORE_BAD_CHUNK or
 * ZS_STORE_NOMEM; on anything but OK and a partially new piece, nothing changes.  *why names
 * the reason for a refusal.
 */
zs_store_result zs_store_push(zs_store *st, long step, int chunk, size_t offset, size_t count,
                              const float *grad, const char **why);

/* The same for an IEEE fp16 piece (an fp16 job's F16 push), widened exactly: the accumulator
 * gets the bits zs_store_push gives the widened values. */
zs_store_result zs_store_push_f16(zs_store *st, long step, int chunk, size_t offset, size_t count,
                                  const uint16_t *grad, const char **why);

/* All C chunks are in for every shard. */
int zs_store_complete(const zs_store *st);
/* Chunk `chunk` of the current step is in full on every shard. */
int zs_store_chunk_complete(const zs_store *st, int chunk);

/* Per-shard sum of squares of the accumulator (what the coordinator sums in shard order):
 * index[i] and sumsq[i] for the store's n shards; valid once complete. */
int zs_store_shard_count(const zs_store *st);
void zs_store_partials(const zs_store *st, int *index, double *sumsq);

/* AdamW on every shard with step s's lr and the coordinator's clip factor; version s + 1.
 * With skip (a non-finite gradient) the weights stay and only the version moves on.  Fails
 * only with an NVMe tier (a read that fails its checksum, an I/O error: the error names the
 * file and offset); the version then stays, and shards the pipeline had not reached are as
 * they were. */
zs_err zs_store_apply(zs_store *st, double lr, double clip, int skip);

/*
 * The same, where version s + 1 is to be checkpointed in step_dir (a step directory, made; on
 * the NVMe tier's file system): the shards whose state is on NVMe are written straight into
 * their shard files there (common/ckpt.h's layout) instead of the tier's state file, so that
 * the checkpoint completes them (zs_store_in_ckpt, zs_ckpt_finish_shard) instead of writing
 * their bytes again.  The tier reads them from there at the next apply.  step_dir NULL:
 * zs_store_apply.
 */
zs_err zs_store_apply_into(zs_store *st, double lr, double clip, int skip, const char *step_dir);

/*
 * Whether shard i's arrays that are on NVMe are, at the current version, in its shard file in
 * step_dir (zs_store_apply_into put them there and nothing wrote them since): then xxh3 gets
 * their checksums (zs_ckpt_array order) and *param_in_file whether the weights are among them
 * (else they are in RAM, and the checkpoint writes them).  The tier holds the file open and
 * reads the shard from it until the next apply.
 */
int zs_store_in_ckpt(const zs_store *st, int i, const char *step_dir, uint64_t xxh3[3],
                     int *param_in_file);

/*
 * Where elements [offset, offset + count) of the current version live, in the fp32 or the 16-bit
 * copy, inside one shard: *data points into the store (valid until the next apply).
 * ZS_STORE_BAD_RANGE if the range is not inside one of this store's shards; ZS_STORE_ON_NVME
 * for a copy that is on NVMe (zs_store_read_published).
 */
zs_store_result zs_store_locate(const zs_store *st, size_t offset, size_t count, zs_store_copy copy,
                                const void **data);

/* The fp32 weights of shard i (tests compare them with the trainer's); NULL when they are on
 * NVMe (zs_store_read_params). */
const float *zs_store_params(const zs_store *st, int i, zs_shard_range *range);
/* Whether [offset, offset + count) lies inside one of the store's shards. */
int zs_store_holds(const zs_store *st, size_t offset, size_t count);

/*
 * The training state of local shard i: its range, master weights, AdamW m and v (each
 * range->end - range->begin floats; m and v NULL when they are on NVMe, param too when the
 * master weights are: see zs_store_read_moments and zs_store_read_params).  A checkpoint writer may
 * read them from another thread between a publish and the next zs_store_apply, which is the only
 * call that changes them; a restore writes them and then calls zs_store_restored.
 */
void zs_store_state(zs_store *st, int i, zs_shard_range *range, float **param, float **m,
                    float **v);

/*
 * Moving state between stores without copying (a failover rebuilds the stores from the shards
 * and replicas a server holds): zs_store_create_empty makes a store whose shards have no arrays
 * yet; zs_store_move gives shard i of dst the arrays (weights, moments, accumulator, 16-bit copy)
 * of shard j of src, which must have the same range, and leaves src's shard without any (src is
 * then only fit for zs_store_free); zs_store_alloc gives a shard without arrays zeroed ones.
 * The gradient bookkeeping does not move: the new store starts its step from chunk 0, which is
 * how a failover drops the gradients of the step in hand.
 * zs_store_find is the local index of global shard `index`, or -1.
 */
zs_err zs_store_create_empty(const zs_tensor_table *tt, const zs_config *cfg,
                             const zs_shard_range *shards, int n, int threads, zs_store **out);
int zs_store_find(const zs_store *st, int index);
zs_err zs_store_move(zs_store *dst, int i, zs_store *src, int j);
zs_err zs_store_alloc(zs_store *st, int i);

/* Whether shard i's moments are in RAM (else in the NVMe tier). */
int zs_store_moments_in_ram(const zs_store *st, int i);
/* Copies shard i's moments out (from RAM, or read from NVMe and checked), and in: the
 * checkpoint writer and a restore, which must not run beside zs_store_apply. */
zs_err zs_store_read_moments(zs_store *st, int i, float *m, float *v);
zs_err zs_store_write_moments(zs_store *st, int i, const float *m, const float *v);
/* The same for the fp32 master weights; writing them also makes the 16-bit copy. */
zs_err zs_store_read_params(zs_store *st, int i, float *p);
zs_err zs_store_write_params(zs_store *st, int i, const float *p);
/* Shard i's weights and moments at once (a restore): on NVMe, one write of the shard and no
 * read; the 16-bit copy follows the weights. */
zs_err zs_store_write_state(zs_store *st, int i, const float *p, const float *m, const float *v);
/* Shard i's copy of the current version in that dtype, read into dst (from NVMe, checked, or
 * RAM); a 16-bit dst holds the length rounded up to even.  Fetches of copies on NVMe are served
 * from there. */
zs_err zs_store_read_published(zs_store *st, int i, zs_store_copy copy, void *dst);
/* The NVMe tier, or NULL (benchmarks read its stats). */
zs_nvme *zs_store_nvme(const zs_store *st);

/* Sets the version without touching the state (a store assembled from ones at that version). */
void zs_store_set_version(zs_store *st, long version);

/* After the state was written through zs_store_state: refreshes the 16-bit copies and sets the
 * version (the step count AdamW's bias correction continues from). */
void zs_store_restored(zs_store *st, long version);

#endif
