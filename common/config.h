/*
 * config: the job's JSON configuration, with DeepSpeed's key names where the meaning is the
 * same, plus "model", "cluster" and "checkpoint" blocks.
 *
 * Invariant: a zs_config that zs_config_parse() returned ZS_OK for is complete and
 * consistent (batch sizes divide, the model's shapes are positive and n_embd divides by
 * n_head).  An unknown key, a wrong type or an out-of-range value is an error whose message
 * names the key by its full path ("optimizer.params.lr").
 */
#ifndef ZS_CONFIG_H
#define ZS_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct {
    int n_layer;    /* transformer blocks */
    int n_head;     /* attention heads; n_embd % n_head == 0 */
    int n_embd;     /* channels C */
    int vocab_size; /* V */
    int block_size; /* maximum sequence length (HF n_positions) and the training length T */
} zs_model_config;

typedef enum {
    ZS_SCHED_CONSTANT = 0,  /* no "scheduler" block: optimizer.params.lr at every step */
    ZS_SCHED_WARMUP,        /* DeepSpeed WarmupLR */
    ZS_SCHED_WARMUP_DECAY,  /* DeepSpeed WarmupDecayLR */
    ZS_SCHED_WARMUP_COSINE, /* DeepSpeed WarmupCosineLR */
} zs_sched_type;

typedef struct {
    zs_sched_type type;
    double warmup_min_lr;    /* WarmupLR, WarmupDecayLR */
    double warmup_max_lr;    /* WarmupLR, WarmupDecayLR */
    int warmup_num_steps;    /* all; DeepSpeed clamps it to at least 2 */
    int warmup_linear;       /* warmup_type "linear" (1) or "log" (0, DeepSpeed's default) */
    int total_num_steps;     /* WarmupDecayLR, WarmupCosineLR */
    double warmup_min_ratio; /* WarmupCosineLR */
    double cos_min_ratio;    /* WarmupCosineLR */
} zs_schedule;

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
} zs_adamw_config;

/* cluster.transport.  auto: each server serves RDMA when its host has an RDMA device with an
 * active port, else TCP (docs/transport.md); the job's servers must agree. */
typedef enum {
    ZS_TRANSPORT_AUTO = 0,
    ZS_TRANSPORT_TCP = 1,
    ZS_TRANSPORT_RDMA = 2,
    ZS_TRANSPORT_SHM = 3, /* every worker on the servers' host (ZeRO-Offload on one box) */
} zs_transport_kind;

/* "auto", "tcp", "rdma", "shm" */
const char *zs_transport_kind_name(zs_transport_kind k);

typedef struct {
    size_t shard_bytes; /* cluster.shard_size: bytes of fp32 per shard, multiple of 256 */
    int heartbeat_interval_ms;
    int heartbeat_timeout_ms;
    int coordinator_timeout_ms;   /* servers and workers give up on a silent coordinator after
                                     this long (it sends every heartbeat interval) */
    double chunk_timeout_factor;  /* a chunk not done within this many times the running median
                                     chunk time goes to another worker (0: never) */
    int chunk_timeout_min_ms;     /* ... but never sooner than this */
    int max_members_per_address;  /* registered and not gone at once from one network address */
    uint64_t server_memory_bytes; /* a partition server's RAM budget; 0: its limits (cgroup
                                     memory.max, RLIMIT_AS, MemAvailable) at start */
    zs_transport_kind transport;  /* cluster.transport: the data plane's backend */
    char rdma_device[64];         /* cluster.rdma.device: "" = chosen by address (rdma.h) */
    int rdma_port;                /* cluster.rdma.port: 1.. (default 1) */
    int rdma_gid_index;           /* cluster.rdma.gid_index: -1 = chosen by address */
} zs_cluster_config;

/* Where a partition server keeps state (DeepSpeed's zero_optimization.offload_*). */
typedef enum { ZS_OFFLOAD_NONE = 0, ZS_OFFLOAD_CPU = 1, ZS_OFFLOAD_NVME = 2 } zs_offload_device;

typedef struct {
    int stage;                   /* zero_optimization.stage, 0..3: accepted; zshard always
                                    partitions weights, gradients and optimizer state */
    zs_offload_device optimizer; /* offload_optimizer.device: "nvme" keeps the AdamW moments
                                    that do not fit cluster.server_memory_bytes on NVMe */
    char nvme_path[4096];        /* offload_optimizer.nvme_path: a directory on a local disk */
    zs_offload_device param;     /* offload_param.device: "nvme" also keeps the copy of the
                                    weights that workers fetch on NVMe (needs the optimizer's) */
    int param_buffers;           /* offload_param.buffer_count: shards of that copy a server
                                    holds in RAM at once (its window) */
} zs_zero_config;

/* DeepSpeed's "aio" block, for the NVMe tier's io_uring requests. */
typedef struct {
    size_t block_size; /* bytes per request, a multiple of 4096 */
    int queue_depth;   /* requests in flight per server */
} zs_aio_config;

typedef struct {
    int enabled;
    int min_workers;
    int max_workers;
} zs_elastic_config;

/* Where and how often the coordinator commits checkpoints (common/ckpt.h for the format). */
typedef struct {
    char dir[4096];     /* "" = OUT/checkpoints; must be the same path on every partition
                           server and the coordinator (a shared filesystem across hosts) */
    int interval_steps; /* a checkpoint every this many steps; 0 = only the final one */
    int keep;           /* committed checkpoints kept, >= 1; the newest valid one is never
                           deleted */
    int replicas;       /* 0, or 1: each server's state also copied to one buddy server */
} zs_checkpoint_config;

/* DeepSpeed's "fp16" block (common/lossscale.h has the scaler's rules, docs/precision.md what
 * the CPU emulates). */
typedef struct {
    int enabled;                /* fp16.enabled: compute with fp16 weights, push fp16 gradients */
    double loss_scale;          /* fp16.loss_scale: 0 = dynamic, else a static power of two */
    int initial_scale_power;    /* dynamic: the first scale is 2^this */
    int loss_scale_window;      /* dynamic: steps without overflow before the scale doubles */
    int hysteresis;             /* dynamic: overflows tolerated before the scale halves */
    double min_loss_scale;      /* dynamic: the scale's floor, a power of two */
    int consecutive_hysteresis; /* dynamic: refill the hysteresis on every step without overflow */
} zs_fp16_config;

typedef struct {
    zs_model_config model;
    uint64_t seed;
    int train_batch_size; /* B: sequences per step */
    int micro_batch;      /* b: sequences per chunk (train_micro_batch_size_per_gpu) */
    int chunks;           /* C = B / b (gradient_accumulation_steps when given) */
    zs_adamw_config adamw;
    zs_schedule sched;
    double gradient_clipping; /* max global L2 norm; 0 disables clipping */
    int bf16;                 /* bf16.enabled: workers fetch bf16 weights */
    zs_fp16_config fp16;      /* fp16.*: never enabled together with bf16 */
    int steps_per_print;
    zs_cluster_config cluster;
    zs_elastic_config elasticity;
    zs_checkpoint_config checkpoint;
    zs_zero_config zero;
    zs_aio_config aio;
} zs_config;

/* Fills cfg with the defaults that apply when a key is absent. */
void zs_config_defaults(zs_config *cfg);

/* Parses JSON text; source names it in messages (a path, or "<string>"). */
zs_err zs_config_parse(const char *text, const char *source, zs_config *cfg);

/* Reads and parses the file at path. */
zs_err zs_config_load(const char *path, zs_config *cfg);

/*
 * A 64-bit fingerprint (XXH3-64) of everything in cfg that decides the trained bits, so that a
 * resume refuses a checkpoint written under another configuration: a run resumed from it
 * would no longer be bitwise identical to an uninterrupted run.
 *
 * In: model.* (n_layer, n_head, n_embd, vocab_size, block_size), seed, train_batch_size,
 * the micro-batch and the chunk count, optimizer.params (lr, betas, eps, weight_decay), every
 * field of the schedule (type and all parameters, as parsed: warmup_num_steps after DeepSpeed's
 * clamp to 2), gradient_clipping, bf16.enabled, fp16.* (only when fp16.enabled: the text of
 * every other job is unchanged, so their older checkpoints still resume), and
 * cluster.shard_size: the gradient norm is
 * summed shard by shard, so the shard size decides the norm's rounding and with it the clip
 * factor.
 * Out, because a resume may change them without changing a bit of the training: the rest of
 * cluster.* (heartbeats), elasticity.*, checkpoint.*, steps_per_print, wall_clock_breakdown.
 *
 * The hash is over a canonical text ("key=value\n" lines in a fixed order, integers in
 * decimal, doubles with "%a", so exact) that does not depend on the build, the compiler or
 * the struct layout; the text starts with a version line, changed whenever the text changes.
 */
uint64_t zs_config_fingerprint(const zs_config *cfg);

/* The learning rate of 0-based step, from optimizer.params.lr and the schedule. */
double zs_config_lr(const zs_config *cfg, int step);

/* Writes a Hugging Face GPT-2 config.json for the model (loadable by from_pretrained). */
zs_err zs_config_write_hf(const zs_model_config *model, const char *path);

/* Reads the model shapes back from a Hugging Face GPT-2 config.json. */
zs_err zs_config_read_hf(const char *path, zs_model_config *model);

#endif
