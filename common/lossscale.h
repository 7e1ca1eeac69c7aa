/*
 * lossscale: DeepSpeed's loss scaler for fp16.enabled, and the step counters an overflow
 * leaves behind.
 *
 * Followed exactly (DeepSpeed deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler and
 * LossScaler, and deepspeed/runtime/engine.py, _take_model_step):
 *  - dynamic (fp16.loss_scale 0): cur_scale starts at 2^initial_scale_power, cur_iter 0,
 *    last_overflow_iter -1, cur_hysteresis = hysteresis (delayed_shift), scale_factor 2.
 *    update_scale(overflow):
 *      overflow: if delayed_shift == 1 or cur_hysteresis == 1: if cur_scale == min_scale the
 *                run fails (raise_error_at_min_scale, DeepSpeed's default), else
 *                cur_scale = max(cur_scale / 2, min_scale); otherwise cur_hysteresis -= 1;
 *                in both cases last_overflow_iter = cur_iter.
 *      no overflow: with consecutive_hysteresis, cur_hysteresis = delayed_shift; then if
 *                (cur_iter - last_overflow_iter) % scale_window == 0: (without
 *                consecutive_hysteresis, cur_hysteresis = delayed_shift) and cur_scale *= 2.
 *      then cur_iter += 1.
 *  - static (fp16.loss_scale > 0): the scale never changes; an overflow still skips the step.
 *  - the engine on an overflow: the optimizer step is skipped (AdamW's step count t does not
 *    move), skipped_steps += 1, the LR scheduler is not stepped, and global_steps (the data
 *    position) still moves on.  So an fp16 step's learning rate is the schedule's at
 *    zs_lossscale_opt_step() = steps done - skipped, and its AdamW t is that + 1.
 *
 * Invariant: the whole state is the struct below (integers and a power of two), so a
 * checkpoint of it resumes bit for bit, and the coordinator and `zshard train` that run the
 * same sequence of update() calls hold equal states.
 */
#ifndef ZS_LOSSSCALE_H
#define ZS_LOSSSCALE_H

#include <stddef.h>

#include "common/config.h"
#include "common/err.h"

typedef struct {
    double scale;       /* cur_scale: the loss scale of the next step, a power of two */
    int hysteresis;     /* cur_hysteresis */
    long last_overflow; /* last_overflow_iter (-1: none yet) */
    long iter;          /* cur_iter: update() calls so far (== steps done) */
    long skipped;       /* the engine's skipped_steps: steps whose update was skipped */
} zs_lossscale;

/* Whether x is a loss scale zshard takes: a power of two in [2^-24, 2^64], so that scaling by
 * it and unscaling are exact in fp32 (docs/precision.md).  DeepSpeed takes any positive
 * number; fp16.loss_scale, fp16.min_loss_scale and every scale on the wire must pass this. */
int zs_lossscale_valid(double x);

/* The state of a fresh run under cfg (fp16.loss_scale, initial_scale_power, hysteresis). */
void zs_lossscale_init(zs_lossscale *ls, const zs_fp16_config *cfg);

/* The optimizer step the next update is: its learning rate's index and AdamW's t - 1. */
long zs_lossscale_opt_step(const zs_lossscale *ls);

/*
 * After a step's verdict: overflow says whether its gradient had an inf or NaN (the update
 * was skipped).  Updates ls as DeepSpeed's update_scale and engine do (see above).  Fails
 * (ZS_ERR_INVALID, ls unchanged) on an overflow at min_loss_scale with no hysteresis left:
 * DeepSpeed raises "Current loss scale already at minimum" there and the run ends.
 */
zs_err zs_lossscale_update(zs_lossscale *ls, const zs_fp16_config *cfg, int overflow);

/* Checks a state read from a checkpoint against cfg (positive power-of-two scale, counters in
 * range); what names the source in the message. */
zs_err zs_lossscale_check(const zs_lossscale *ls, const zs_fp16_config *cfg, const char *what);

/* The end of a step's progress line, in buf (n bytes): "" or " | skipped", and in an fp16 job
 * " | loss scale 65536" or " | loss scale 65536, overflow: skipped" (zshard train and the
 * coordinator print the same). */
const char *zs_lossscale_progress(char *buf, size_t n, int fp16, double scale, int skipped);

#endif
