/*
 * worker: the training loop of `zshard worker`.  A worker joins a job through a session
 * (worker/session.h), then for each chunk it is assigned runs GPT-2's forward and backward
 * (kernels/gpt2.h) with parameters it fetches layer by layer from the partition servers and
 * gradients it pushes layer by layer as backward produces them.
 *
 * Memory: a worker holds no model state between steps.  Its parameter buffers are one slot
 * for the embeddings (layer 0), one for the final norm (layer L+1) and two for transformer
 * blocks (block l in slot l % 2: while block l computes, block l+1 -- or l-1 in backward --
 * is being fetched into the other); its gradient buffers have the same four slots.  So the
 * parameter memory is about two blocks plus the embeddings, whatever the depth, plus the
 * activations of one chunk.
 *
 * Overlap: a communication thread owns the data-plane client and drives every transfer.  The
 * compute thread asks for a layer just before it needs it (waiting only if the prefetch has
 * not landed), asks for the next layer's prefetch at once, and hands each gradient to the
 * communication thread as soon as it is complete, so that pushing block l overlaps the
 * backward of block l-1.  A slot is refetched only when it does not already hold that layer
 * at the step's version, so the last blocks of the forward are reused by the backward, and
 * chunks of the same step reuse the embeddings.
 *
 * Numerics: with bf16.enabled the worker fetches bf16 and widens it to fp32 exactly
 * (zs_bf16_to_f32), so it computes with the same values as `zshard train`, which rounds its
 * weights to bf16 the same way: the results are bitwise equal either way.
 */
#ifndef ZS_WORKER_H
#define ZS_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/prom.h"
#include "common/secret.h"
#include "kernels/model.h"

/* Whether a GPU worker's slots are device memory that the NIC fills and reads (GPUDirect RDMA
 * through dma-buf, docs/gpu.md): auto where the model is on a GPU, the transport is rdma, the
 * job computes in fp32 and the GPU, its driver and the NIC allow it, else page-locked host slots
 * with one log line saying why; on: the same, but a reason against it fails the worker; off:
 * host slots. */
typedef enum { ZS_GPUDIRECT_AUTO = 0, ZS_GPUDIRECT_ON = 1, ZS_GPUDIRECT_OFF = 2 } zs_gpudirect;

/* "auto", "on" or "off"; anything else is an error naming the text. */
zs_err zs_gpudirect_parse(const char *text, zs_gpudirect *out);

typedef struct {
    const char *coord;       /* the coordinator's control endpoint, "tcp://HOST:PORT" */
    const zs_secret *secret; /* the job's secret, or insecure (common/secret.h) */
    const char *data;        /* a local copy of the job's data, or NULL for the job's path */
    int threads;             /* kernel threads (OpenMP); the communication thread is extra */
    zs_device device;        /* where forward and backward run; zeroed: the CPU.  On a GPU each
                                layer is copied in from its fetched slot when first used, and
                                each layer's gradient out to its push buffer */
    int join_timeout_ms;     /* how long to wait for the job spec after registering */
    zs_gpudirect gpudirect;  /* zeroed: auto */
    zs_prom *prom;           /* where the worker's series go (docs/observability.md; an
                                endpoint serves it), or NULL: none */
} zs_worker_opts;

/* Where a worker's time went, and what it moved.  Seconds of wall-clock time. */
typedef struct {
    long chunks;            /* chunks computed, pushed and reported */
    long steps;             /* distinct steps it computed chunks of */
    double compute_s;       /* forward and backward, less the waits below */
    double fetch_wait_s;    /* blocked on a parameter fetch that had not landed */
    double push_wait_s;     /* blocked on gradient pushes (a busy buffer, a chunk's last) */
    double step_wait_s;     /* waiting for an assignment once it had worked (others, AdamW) */
    uint64_t fetched_bytes; /* data-plane payload received */
    uint64_t pushed_bytes;  /* data-plane payload sent */
    size_t buffer_bytes;    /* parameter and gradient buffers held for the whole run */
} zs_worker_stats;

/*
 * Registers with the coordinator at opts->coord and computes assigned chunks until the job
 * ends (ZS_OK when it finished; the coordinator's reason when it aborted or refused this
 * worker), a transfer fails (the failure, naming the server), or *stop_flag becomes non-zero
 * (checked between chunks: the current chunk is finished, then the worker leaves).  stats
 * (may be NULL) receives the figures, also on failure.
 */
zs_err zs_worker_run(const zs_worker_opts *opts, volatile int *stop_flag, zs_worker_stats *stats);

#endif
