/*
 * lossscale: DeepSpeed's DynamicLossScaler.update_scale, step by step (lossscale.h cites the
 * rules).  Scales are doubles holding powers of two, so halving and doubling are exact.
 */
#include "common/lossscale.h"

#include <math.h>
#include <stdio.h>

int zs_lossscale_valid(double x)
{
    int e2 = 0;
    return x > 0 && isfinite(x) && frexp(x, &e2) == 0.5 && e2 - 1 >= -24 && e2 - 1 <= 64;
}

void zs_lossscale_init(zs_lossscale *ls, const zs_fp16_config *cfg)
{
    *ls = (zs_lossscale){.scale = cfg->loss_scale > 0 ? cfg->loss_scale
                                                      : ldexp(1.0, cfg->initial_scale_power),
                         .hysteresis = cfg->hysteresis,
                         .last_overflow = -1,
                         .iter = 0,
                         .skipped = 0};
}

long zs_lossscale_opt_step(const zs_lossscale *ls)
{
    return ls->iter - ls->skipped;
}

zs_err zs_lossscale_update(zs_lossscale *ls, const zs_fp16_config *cfg, int overflow)
{
    zs_lossscale n = *ls;
    if (cfg->loss_scale > 0) {
        /* LossScaler (static): update_scale does nothing; the engine still skips. */
    } else if (overflow) {
        if (cfg->hysteresis == 1 || n.hysteresis == 1) {
            if (n.scale == cfg->min_loss_scale)
                return zs_error(ZS_ERR_INVALID,
                                "fp16: step %ld: the gradient overflowed at the minimum loss "
                                "scale %g (fp16.min_loss_scale) with no hysteresis left: "
                                "cannot decrease the scale any more (as DeepSpeed, the run "
                                "ends)",
                                ls->iter + 1, n.scale);
            n.scale = fmax(n.scale / 2, cfg->min_loss_scale);
        } else {
            n.hysteresis--;
        }
        n.last_overflow = n.iter;
    } else {
        if (cfg->consecutive_hysteresis)
            n.hysteresis = cfg->hysteresis;
        if ((n.iter - n.last_overflow) % cfg->loss_scale_window == 0) {
            if (!cfg->consecutive_hysteresis)
                n.hysteresis = cfg->hysteresis;
            n.scale *= 2;
        }
    }
    n.iter++;
    n.skipped += overflow != 0;
    *ls = n;
    return ZS_OK;
}

zs_err zs_lossscale_check(const zs_lossscale *ls, const zs_fp16_config *cfg, const char *what)
{
    if (!zs_lossscale_valid(ls->scale) || ls->hysteresis < 1 || ls->hysteresis > cfg->hysteresis ||
        ls->iter < 0 || ls->last_overflow < -1 || ls->last_overflow >= ls->iter ||
        ls->skipped < 0 || ls->skipped > ls->iter)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: loss scaler state (scale %g, hysteresis %d, last_overflow %ld, "
                        "iter %ld, skipped %ld) is not one fp16 (hysteresis %d) can reach",
                        what, ls->scale, ls->hysteresis, ls->last_overflow, ls->iter, ls->skipped,
                        cfg->hysteresis);
    return ZS_OK;
}

const char *zs_lossscale_progress(char *buf, size_t n, int fp16, double scale, int skipped)
{
    if (!fp16)
        snprintf(buf, n, "%s", skipped ? " | skipped" : "");
    else
        snprintf(buf, n, " | loss scale %.17g%s", scale, skipped ? ", overflow: skipped" : "");
    return buf;
}
