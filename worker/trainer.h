/*
 * trainer: the single-process trainer behind `zshard train`, the reference that every
 * distributed run must match bit for bit.
 *
 * One step s: for each chunk c = 0..C-1 in order, take the chunk's b sequences from
 * (seed, s, c), run forward and backward, and add the chunk gradient into the accumulator
 * (acc = g_0, then acc += g_c).  The gradient norm is sqrt(sum over shards, in shard order,
 * of each shard's sum of squares of acc) / C; the clip factor is
 * min(1, gradient_clipping / (norm + 1e-6)) (1 when clipping is off); AdamW then runs per
 * tensor with grad_scale = clip / C, and step s's learning rate.  These are the operations a
 * partition server performs on its shards, in the same order, so the results agree.  A step
 * whose norm is not finite (an inf or NaN anywhere in the gradient) is skipped as the servers
 * skip it: no AdamW at all, and the step count (AdamW's t) still advances.
 * With bf16.enabled the model computes with the weights rounded to bf16, as a worker that
 * fetches bf16 does.
 * With fp16.enabled (docs/precision.md) the model computes with the weights rounded to fp16,
 * each chunk's gradient is multiplied by the step's loss scale and rounded to fp16 before it
 * is added (as a worker pushes it), the norm is divided by the scale, AdamW's gradient factor
 * is (clip / scale) / C, and an overflow skips the step the DeepSpeed way (common/lossscale.h:
 * the learning rate and AdamW's t follow the steps applied), as the coordinator's scaler does.
 */
#ifndef ZS_TRAINER_H
#define ZS_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "common/ckpt.h"
#include "common/config.h"
#include "common/data.h"
#include "common/err.h"
#include "common/lossscale.h"
#include "common/tensors.h"
#include "kernels/model.h"

typedef struct {
    zs_config cfg;
    zs_tensor_table tt;
    const zs_dataset *data;
    zs_model *model; /* on the trainer's device (zs_trainer_init_on) */
    int threads;
    long step;         /* steps done so far */
    float *params;     /* [tt.total] fp32 master weights */
    float *compute;    /* [tt.total] bf16/fp16-rounded weights the model reads, or == params */
    uint16_t *bf16;    /* [tt.total] bf16 copy written by AdamW, or NULL */
    float *grads;      /* [tt.total] one chunk's gradient */
    float *acc;        /* [tt.total] the step's accumulated gradient */
    float *m, *v;      /* [tt.total] AdamW moments */
    float *dev_params; /* [tt.total] compute, in the model's memory (== compute on the CPU) */
    float *dev_grads;  /* [tt.total] grads, in the model's memory (== grads on the CPU) */
    int32_t *inputs;   /* [b, T] */
    int32_t *targets;  /* [b, T] */
    zs_lossscale ls;   /* fp16.enabled: the loss scaler, as the coordinator runs it */
} zs_trainer;

typedef struct {
    long step;   /* 1-based number of the step just done */
    double loss; /* mean of the chunk losses */
    double lr;
    double grad_norm;  /* before clipping */
    double clip;       /* factor applied (1 when no clipping happened) */
    int skipped;       /* the gradient was not finite: no update (weights, moments unchanged) */
    double loss_scale; /* fp16.enabled: the scale this step's gradient was multiplied by */
    double seconds;
    double tokens_per_sec;
} zs_step_stats;

/* Sets up the trainer; weights from init_dir/model.safetensors when init_dir is not NULL,
 * otherwise initialized from cfg->seed.  data must outlive the trainer. */
zs_err zs_trainer_init(zs_trainer *tr, const zs_config *cfg, const zs_dataset *data, int threads,
                       const char *init_dir);
/* The same with the forward and backward on dev (kernels/model.h): on a GPU the weights the
 * model reads are copied to it at the start of each step and each chunk's gradient back to
 * the host; the accumulation, the norm and AdamW stay on the host, as on the servers. */
zs_err zs_trainer_init_on(zs_trainer *tr, zs_device dev, const zs_config *cfg,
                          const zs_dataset *data, int threads, const char *init_dir);
void zs_trainer_free(zs_trainer *tr);

/* Runs one step. */
zs_err zs_trainer_step(zs_trainer *tr, zs_step_stats *stats);

/*
 * Writes the state after the steps done (tr->step) as checkpoint step directory step_dir
 * (common/ckpt.h; made by the caller): the shards of cluster.shard_size, a file each, as the
 * partition servers write them, then the manifest, from run (run_id, steps_total and the
 * fingerprints; the step, the model and the loss scaler are filled in here).  So a resume on
 * any number of servers (zshard coord --resume) or in one process (zs_trainer_resume) takes
 * it.  `latest` is the caller's to move.  A failure (a full disk) names the file; what it left
 * is the caller's to remove (zs_ckpt_discard).
 */
zs_err zs_trainer_checkpoint(const zs_trainer *tr, const char *step_dir, const zs_ckpt_info *run);

/*
 * Continues from checkpoint ck (open and verified, and checked by the caller against this run:
 * zs_ckpt_check_compatible), whether `zshard train` or partition servers wrote it: the
 * weights, AdamW's moments, the steps done and, in fp16 jobs, the loss scaler; the weights the
 * model computes with are rounded from them as the steps round them.  The next step is then
 * ck's step + 1, with the bits an uninterrupted run has.
 */
zs_err zs_trainer_resume(zs_trainer *tr, const zs_ckpt *ck);

/* Writes dir/model.safetensors (fp32, HF names) and dir/config.json (HF GPT-2). */
zs_err zs_trainer_save(const zs_trainer *tr, const char *dir);

#endif
