/*
 * test_lossscale: DeepSpeed's DynamicLossScaler.update_scale and the engine's skip counters
 * (common/lossscale.h), against sequences computed by hand from DeepSpeed's code.
 */
#include <math.h>
#include <stdio.h>

#include "common/lossscale.h"
#include "test.h"

static zs_fp16_config dyn(int power, int window, int hysteresis, double min, int consecutive)
{
    return (zs_fp16_config){.enabled = 1,
                            .loss_scale = 0,
                            .initial_scale_power = power,
                            .loss_scale_window = window,
                            .hysteresis = hysteresis,
                            .min_loss_scale = min,
                            .consecutive_hysteresis = consecutive};
}

/* Runs overflows[0..n) and checks the scale and hysteresis after each update. */
static void run(const zs_fp16_config *c, const int *overflow, const double *scale, const int *hyst,
                int n, const char *name)
{
    zs_lossscale ls;
    zs_lossscale_init(&ls, c);
    long skipped = 0;
    for (int i = 0; i < n; i++) {
        CHECK_OK(zs_lossscale_update(&ls, c, overflow[i]));
        skipped += overflow[i];
        if (ls.scale != scale[i] || ls.hysteresis != hyst[i])
            fprintf(stderr, "%s: after update %d: scale %g hysteresis %d, expected %g %d\n", name,
                    i, ls.scale, ls.hysteresis, scale[i], hyst[i]);
        CHECK(ls.scale == scale[i]);
        CHECK_EQ_INT(ls.hysteresis, hyst[i]);
        CHECK_EQ_INT(ls.iter, i + 1);
        CHECK_EQ_INT(ls.skipped, skipped);
        CHECK_EQ_INT(zs_lossscale_opt_step(&ls), i + 1 - skipped);
        CHECK_OK(zs_lossscale_check(&ls, c, name));
    }
}

int main(void)
{
    /* hysteresis 2, window 3, 2^4: the first overflow only spends hysteresis, the second
     * halves; growth when (iter - last_overflow) % 3 == 0, which refills the hysteresis. */
    {
        zs_fp16_config c = dyn(4, 3, 2, 1, 0);
        int o[] = {1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0};
        double s[] = {16, 8, 8, 8, 16, 16, 16, 8, 8, 8, 16};
        int h[] = {1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 2};
        run(&c, o, s, h, 11, "hysteresis 2");
        zs_lossscale ls;
        zs_lossscale_init(&ls, &c);
        CHECK(ls.scale == 16 && ls.hysteresis == 2 && ls.last_overflow == -1 && ls.iter == 0);
    }
    /* No overflow at all, window 2: last_overflow_iter starts at -1, so the scale doubles
     * after updates at iter 1, 3, 5 (DeepSpeed's arithmetic, not after 2, 4). */
    {
        zs_fp16_config c = dyn(2, 2, 2, 1, 0);
        int o[] = {0, 0, 0, 0, 0};
        double s[] = {4, 8, 8, 16, 16};
        int h[] = {2, 2, 2, 2, 2};
        run(&c, o, s, h, 5, "growth");
    }
    /* consecutive_hysteresis refills on every good step: overflow, good, overflow never
     * halves; without it the second overflow halves. */
    {
        zs_fp16_config c = dyn(10, 1000, 2, 1, 1);
        int o[] = {1, 0, 1, 0, 1};
        double s[] = {1024, 1024, 1024, 1024, 1024};
        int h[] = {1, 2, 1, 2, 1};
        run(&c, o, s, h, 5, "consecutive");
        zs_fp16_config d = dyn(10, 1000, 2, 1, 0);
        double s2[] = {1024, 1024, 512, 512, 256};
        int h2[] = {1, 1, 1, 1, 1};
        run(&d, o, s2, h2, 5, "not consecutive");
    }
    /* The floor: max(scale / 2, min); an overflow at the floor with no hysteresis left ends
     * the run (DeepSpeed raises), leaving the state as it was. */
    {
        zs_fp16_config c = dyn(3, 1000, 1, 4, 0);
        zs_lossscale ls;
        zs_lossscale_init(&ls, &c);
        CHECK_OK(zs_lossscale_update(&ls, &c, 1));
        CHECK(ls.scale == 4);
        zs_lossscale before = ls;
        CHECK_FAILS_WITH(zs_lossscale_update(&ls, &c, 1), "minimum loss scale 4");
        CHECK(ls.scale == before.scale && ls.iter == before.iter && ls.skipped == before.skipped);
        /* Below the floor at the start (2^0 < 4): the first overflow jumps to the floor. */
        zs_fp16_config d = dyn(0, 1000, 1, 4, 0);
        zs_lossscale_init(&ls, &d);
        CHECK_OK(zs_lossscale_update(&ls, &d, 1));
        CHECK(ls.scale == 4);
        /* With hysteresis left at the floor, an overflow spends it instead. */
        zs_fp16_config e = dyn(2, 1000, 2, 4, 0);
        zs_lossscale_init(&ls, &e);
        CHECK_OK(zs_lossscale_update(&ls, &e, 1));
        CHECK(ls.scale == 4 && ls.hysteresis == 1);
        CHECK_FAILS_WITH(zs_lossscale_update(&ls, &e, 1), "fp16.min_loss_scale");
    }
    /* Static scale: never changes, overflows still count as skipped steps. */
    {
        zs_fp16_config c = dyn(16, 2, 2, 1, 0);
        c.loss_scale = 8;
        int o[] = {1, 1, 1, 0, 0, 0, 1};
        double s[] = {8, 8, 8, 8, 8, 8, 8};
        int h[] = {2, 2, 2, 2, 2, 2, 2};
        run(&c, o, s, h, 7, "static");
    }
    /* A checkpointed state that no run can reach is refused. */
    {
        zs_fp16_config c = dyn(4, 3, 2, 1, 0);
        zs_lossscale ls;
        zs_lossscale_init(&ls, &c);
        CHECK_OK(zs_lossscale_check(&ls, &c, "x"));
        ls.scale = 3;
        CHECK_FAILS_WITH(zs_lossscale_check(&ls, &c, "manifest.json"), "manifest.json");
        zs_lossscale_init(&ls, &c);
        ls.skipped = 1;
        CHECK_FAILS_WITH(zs_lossscale_check(&ls, &c, "m"), "skipped 1");
    }
    return zs_test_result("test_lossscale");
}
