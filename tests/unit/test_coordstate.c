/*
 * coordstate: membership, heartbeat expiry, chunk assignment and reassignment, the verdict
 * from per-shard partials, and the end of a step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reduce.h"
#include "server/coordstate.h"
#include "tests/unit/test.h"

static zs_config config(void)
{
    zs_config c;
    zs_config_defaults(&c);
    c.chunks = 5;
    c.micro_batch = 1;
    c.train_batch_size = 5;
    c.gradient_clipping = 1.0;
    c.cluster.heartbeat_timeout_ms = 1000;
    return c;
}

/* Feeds partials for every shard from the two servers and publishes; returns the stats. */
static void finish_step(zs_coord_state *cs, int s0, int s1, long step, const double *sumsq,
                        int n_shards, zs_coord_step_stats *st)
{
    int even[8], odd[8], ne = 0, no = 0;
    double ve[8], vo[8];
    for (int k = 0; k < n_shards; k++) {
        if (k % 2 == 0)
            even[ne] = k, ve[ne++] = sumsq[k];
        else
            odd[no] = k, vo[no++] = sumsq[k];
    }
    CHECK_OK(zs_coord_partials(cs, s1, step, odd, vo, no));
    CHECK_EQ_INT(zs_coord_phase(cs), ZS_PHASE_COMPUTE); /* still missing shards */
    CHECK_OK(zs_coord_partials(cs, s0, step, even, ve, ne));
    CHECK_EQ_INT(zs_coord_phase(cs), ZS_PHASE_VERDICT);
    double norm, lr;
    double clip = zs_coord_verdict(cs, &norm, &lr);
    double sum = 0;
    for (int k = 0; k < n_shards; k++)
        sum += sumsq[k];
    CHECK(norm == zs_grad_norm(sum, 5));
    CHECK(clip == zs_clip_factor(norm, 1.0));
    CHECK_EQ_INT(zs_coord_phase(cs), ZS_PHASE_PUBLISH);
    CHECK_EQ_INT(zs_coord_published(cs, s0, step + 1, st), 0);
    CHECK_EQ_INT(zs_coord_published(cs, s0, step + 1, st), 0); /* repeat: no effect */
    CHECK_EQ_INT(zs_coord_published(cs, s1, step + 2, st), 0); /* wrong version */
    CHECK_EQ_INT(zs_coord_published(cs, s1, step + 1, st), 1);
}

/* Runs one step of an fp16 job with one server (one shard) and one worker of 5 chunks: the
 * shard's partial is sumsq. */
static void fp16_step(zs_coord_state *cs, int srv, int wk, long step, double sumsq,
                      zs_coord_step_stats *st)
{
    CHECK_EQ_INT(zs_coord_try_begin(cs), 1);
    for (int c = 0; c < 5; c++)
        CHECK_EQ_INT(zs_coord_chunk_done(cs, wk, step, c, 2.0, NULL), 1);
    int shard = 0;
    CHECK_OK(zs_coord_partials(cs, srv, step, &shard, &sumsq, 1));
    zs_coord_verdict(cs, NULL, NULL);
    CHECK_EQ_INT(zs_coord_published(cs, srv, step + 1, st), 1);
}

/* fp16: the coordinator's scaler gives each step its scale, divides the norm by it, takes the
 * learning rate at the optimizer step (skipped steps do not count), updates as each step
 * finishes, and reports an overflow at the minimum scale as the run's end. */
static void test_fp16(void)
{
    zs_config cfg = config();
    cfg.fp16 = (zs_fp16_config){.enabled = 1,
                                .initial_scale_power = 4,
                                .loss_scale_window = 1000,
                                .hysteresis = 1,
                                .min_loss_scale = 1};
    cfg.sched = (zs_schedule){.type = ZS_SCHED_WARMUP,
                              .warmup_min_lr = 0.001,
                              .warmup_max_lr = 0.002,
                              .warmup_num_steps = 10,
                              .warmup_linear = 1};
    zs_coord_state *cs;
    CHECK_OK(zs_coord_state_create(&cfg, 1, 1, 4, &cs));
    int srv, wk;
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_SERVER, 0, "127.0.0.1:7001", 0, &srv));
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_WORKER, 0, "", 0, &wk));
    CHECK(zs_coord_loss_scale(cs) == 16);
    CHECK_EQ_INT(zs_coord_opt_step(cs), 0);
    zs_coord_step_stats st;
    fp16_step(cs, srv, wk, 0, INFINITY, &st); /* an overflow: halves (hysteresis 1) */
    CHECK(st.loss_scale == 16);
    CHECK_EQ_INT(st.skipped, 1);
    CHECK(st.scaler_error[0] == '\0');
    CHECK(zs_coord_loss_scale(cs) == 8);
    CHECK_EQ_INT(zs_coord_opt_step(cs), 0); /* still the first update to come */
    double norm, lr;
    CHECK_EQ_INT(zs_coord_try_begin(cs), 1);
    for (int c = 0; c < 5; c++)
        CHECK_EQ_INT(zs_coord_chunk_done(cs, wk, 1, c, 2.0, NULL), 1);
    int shard = 0;
    double sumsq = 256.0;
    CHECK_OK(zs_coord_partials(cs, srv, 1, &shard, &sumsq, 1));
    double clip = zs_coord_verdict(cs, &norm, &lr);
    CHECK(norm == zs_grad_norm(256.0, 5) / 8);
    CHECK(clip == zs_clip_factor(norm, 1.0));
    CHECK(lr == zs_config_lr(&cfg, 0)); /* step 2, but the first update */
    CHECK(lr != zs_config_lr(&cfg, 1));
    CHECK(zs_coord_loss_scale(cs) == 8); /* the step's scale until it finishes */
    CHECK_EQ_INT(zs_coord_published(cs, srv, 2, &st), 1);
    CHECK(st.loss_scale == 8 && !st.skipped);
    CHECK_EQ_INT(zs_coord_opt_step(cs), 1);
    CHECK_EQ_INT(zs_coord_scaler(cs)->iter, 2);
    CHECK_EQ_INT(zs_coord_scaler(cs)->skipped, 1);
    /* A restored state at the floor: the next overflow ends the run. */
    zs_lossscale floor = {.scale = 1, .hysteresis = 1, .last_overflow = 0, .iter = 2, .skipped = 1};
    zs_coord_set_scaler(cs, &floor);
    fp16_step(cs, srv, wk, 2, NAN, &st);
    CHECK(strstr(st.scaler_error, "minimum loss scale 1") != NULL);
    zs_coord_state_free(cs);
}

int main(void)
{
    test_fp16();
    zs_config cfg = config();
    zs_coord_state *cs;
    CHECK_FAILS_WITH(zs_coord_state_create(&cfg, 3, 2, 4, &cs), "1 <= servers <= shards");
    CHECK_OK(zs_coord_state_create(&cfg, 2, 4, 3, &cs));
    int s0, s1, w0, w1, w2, x;
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_WORKER, 0, "", 0, &w0));
    CHECK_EQ_INT(zs_coord_try_begin(cs), 0); /* servers missing */
    CHECK_EQ_INT(zs_coord_phase(cs), ZS_PHASE_WAIT_SERVERS);
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_SERVER, 0, "127.0.0.1:7001", 0, &s0));
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_SERVER, 0, "127.0.0.1:7002", 0, &s1));
    CHECK_FAILS_WITH(zs_coord_join(cs, ZS_MEMBER_SERVER, 0, "127.0.0.1:7003", 0, &x),
                     "all 2 servers are registered");
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_WORKER, 0, "", 0, &w1));
    CHECK_EQ_INT(zs_coord_phase(cs), ZS_PHASE_WAIT_WORKERS);
    CHECK_EQ_INT(zs_coord_try_begin(cs), 1);
    CHECK_EQ_INT(zs_coord_try_begin(cs), 0); /* already running */
    /* Round robin over the two workers in id order. */
    int ch[8];
    CHECK_EQ_INT(zs_coord_assigned(cs, w0, ch, 8), 3);
    CHECK(ch[0] == 0 && ch[1] == 2 && ch[2] == 4);
    CHECK_EQ_INT(zs_coord_assigned(cs, w1, ch, 8), 2);
    CHECK(ch[0] == 1 && ch[1] == 3);
    /* A worker joining mid-step gets nothing this step. */
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_WORKER, 0, "", 0, &w2));
    CHECK_EQ_INT(zs_coord_assigned(cs, w2, ch, 8), 0);
    /* Reports that must not count. */
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w1, 0, 0, 1.0, NULL), 0); /* not its chunk */
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w0, 1, 0, 1.0, NULL), 0); /* another step */
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w0, 0, 7, 1.0, NULL), 0); /* no such chunk */
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w0, 0, 0, 2.0, NULL), 1);
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w0, 0, 0, 9.0, NULL), 0); /* repeat */
    /* w0 dies (heartbeat timeout): its unfinished chunks 2 and 4 go to the least loaded. */
    zs_coord_heartbeat(cs, w1, 900);
    zs_coord_heartbeat(cs, w2, 900);
    zs_coord_heartbeat(cs, s0, 900);
    zs_coord_heartbeat(cs, s1, 900);
    int dead[4];
    CHECK_EQ_INT(zs_coord_expire(cs, 1000, dead, 4), 0); /* exactly at the timeout: alive */
    CHECK_EQ_INT(zs_coord_expire(cs, 1001, dead, 4), 1);
    CHECK_EQ_INT(dead[0], w0);
    CHECK(!zs_coord_member(cs, w0)->alive);
    CHECK_EQ_INT(zs_coord_owner(cs, 2), w2); /* w2 had 0, w1 had 2 */
    CHECK_EQ_INT(zs_coord_owner(cs, 4), w2);
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w0, 0, 2, 1.0, NULL),
                 0); /* the dead worker's late report */
    double losses[5] = {2.0, 1.5, 1.25, 1.0, 0.5};
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w1, 0, 1, losses[1], NULL), 1);
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w1, 0, 3, losses[3], NULL), 1);
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w2, 0, 2, losses[2], NULL), 1);
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w2, 0, 4, losses[4], NULL), 1);
    /* Partial errors. */
    int k1 = 1, k9 = 9;
    double v = 1.0;
    CHECK_FAILS_WITH(zs_coord_partials(cs, w1, 0, &k1, &v, 1), "not a server");
    CHECK_FAILS_WITH(zs_coord_partials(cs, s0, 1, &k1, &v, 1), "current step is 0");
    CHECK_FAILS_WITH(zs_coord_partials(cs, s0, 0, &k9, &v, 1), "shard 9");
    double sumsq[4] = {4.0, 9.0, 0.25, 16.0};
    zs_coord_step_stats st;
    finish_step(cs, s0, s1, 0, sumsq, 4, &st);
    CHECK_EQ_INT(st.step, 1);
    CHECK_EQ_INT(st.workers, 2);
    CHECK(st.loss == (((((2.0 + 1.5) + 1.25) + 1.0) + 0.5)) / 5);
    CHECK(st.clip < 1.0); /* norm sqrt(29.25)/5 = 1.08 > 1 */
    CHECK_EQ_INT(zs_coord_step(cs), 1);
    CHECK_EQ_INT(zs_coord_phase(cs), ZS_PHASE_WAIT_WORKERS);

    /* Step 2: w1 and w2 alive; both leave mid-step: the job waits, a new worker takes over. */
    CHECK_EQ_INT(zs_coord_try_begin(cs), 1);
    CHECK_EQ_INT(zs_coord_assigned(cs, w1, ch, 8) + zs_coord_assigned(cs, w2, ch, 8), 5);
    CHECK_EQ_INT(zs_coord_chunk_done(cs, w1, 1, 0, 1.0, NULL), 1);
    zs_coord_leave(cs, w1, "SIGTERM");
    zs_coord_leave(cs, w2, "connection closed");
    CHECK_EQ_INT(zs_coord_live_workers(cs), 0);
    CHECK_EQ_INT(zs_coord_owner(cs, 1), -1);
    int w3;
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_WORKER, 0, "", 2000, &w3));
    CHECK_EQ_INT(zs_coord_assigned(cs, w3, ch, 8), 4); /* all unfinished chunks */
    for (int c = 1; c < 5; c++)
        CHECK_EQ_INT(zs_coord_chunk_done(cs, w3, 1, c, 1.0, NULL), 1);
    double small[4] = {0.01, 0.01, 0.01, 0.01};
    finish_step(cs, s0, s1, 1, small, 4, &st);
    CHECK(st.clip == 1.0);
    CHECK_EQ_INT(st.workers, 2);
    CHECK_EQ_INT(st.skipped, 0);
    /* Step 3, the last. */
    CHECK_EQ_INT(zs_coord_try_begin(cs), 1);
    /* with timings: the step's stats sum them over the chunks that counted */
    for (int c = 0; c < 5; c++) {
        zs_msg_chunk_times t = {
            .compute_ms = 100.0 + c, .fetch_wait_ms = 2.0, .push_wait_ms = 0.5 * c};
        CHECK_EQ_INT(zs_coord_chunk_done(cs, w3, 2, c, 1.0, c == 3 ? NULL : &t), 1);
        CHECK_EQ_INT(zs_coord_chunk_done(cs, w3, 2, c, 1.0, &t), 0); /* a repeat adds nothing */
    }
    /* One shard's partial overflowed: the norm is not finite and the step is skipped (the
     * verdict says so to the servers; the stats say so to the metrics line). */
    double overflow[4] = {0.01, INFINITY, 0.01, 0.01};
    finish_step(cs, s0, s1, 2, overflow, 4, &st);
    CHECK(isinf(st.grad_norm));
    CHECK_EQ_INT(st.skipped, 1);
    CHECK_EQ_INT(st.workers, 1);
    CHECK(st.compute_ms == 100.0 + 101.0 + 102.0 + 104.0);
    CHECK(st.fetch_wait_ms == 8.0);
    CHECK(st.push_wait_ms == 0.5 + 1.0 + 2.0);
    CHECK_EQ_INT(zs_coord_phase(cs), ZS_PHASE_DONE);
    CHECK_EQ_INT(zs_coord_try_begin(cs), 0);
    zs_coord_state_free(cs);

    /* elasticity.max_workers refuses the worker over the limit. */
    cfg.elasticity.max_workers = 1;
    CHECK_OK(zs_coord_state_create(&cfg, 1, 1, 1, &cs));
    CHECK_OK(zs_coord_join(cs, ZS_MEMBER_WORKER, 0, "", 0, &x));
    CHECK_FAILS_WITH(zs_coord_join(cs, ZS_MEMBER_WORKER, 0, "", 0, &x),
                     "elasticity.max_workers is 1");
    zs_coord_state_free(cs);
    return zs_test_result("test_coordstate");
}
