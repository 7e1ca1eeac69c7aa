/*
 * trainer: `zshard train`'s step, top to bottom.  See trainer.h for the operation order that
 * the partition servers reproduce.
 */
#include "worker/trainer.h"
#include "common/clock.h"
#include "common/fp16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/memlimit.h"
#include "common/modelfile.h"
#include "common/shardmap.h"
#include "kernels/adamw.h"
#include "kernels/reduce.h"

static float *alloc_floats(size_t n)
{
    /* 64-byte aligned and zeroed: padding between tensors must stay 0. */
    void *p = NULL;
    if (posix_memalign(&p, 64, n * sizeof(float) + 64) != 0)
        return NULL;
    memset(p, 0, n * sizeof(float));
    return p;
}

/* Rounds the master weights to bf16 for the model to compute with (bf16.enabled). */
static void round_compute(zs_trainer *tr)
{
    size_t n = tr->tt.total;
#pragma omp parallel for schedule(static) num_threads(tr->threads)
    for (size_t i = 0; i < n; i++)
        tr->compute[i] = zs_bf16_to_f32(zs_f32_to_bf16(tr->params[i]));
}

zs_err zs_trainer_init(zs_trainer *tr, const zs_config *cfg, const zs_dataset *data, int threads,
                       const char *init_dir)
{
    return zs_trainer_init_on(tr, (zs_device){ZS_DEVICE_CPU, 0}, cfg, data, threads, init_dir);
}

zs_err zs_trainer_init_on(zs_trainer *tr, zs_device dev, const zs_config *cfg,
                          const zs_dataset *data, int threads, const char *init_dir)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = *cfg;
    tr->data = data;
    tr->threads = threads > 0 ? threads : 1;
    zs_err res;
    int T = cfg->model.block_size, b = cfg->micro_batch;
    ZS_CHECK_GOTO(zs_data_check(data, cfg->model.vocab_size, T), res, fail);
    ZS_CHECK_GOTO(zs_tensors_gpt2(&cfg->model, &tr->tt), res, fail);
    size_t n = tr->tt.total;
    {
        /* Weights, gradients, accumulator and both moments (and the bf16 copies), then the
         * activations: checked against this process's limits before any of it is taken. */
        char what[128];
        int rounded = cfg->bf16 ? 4 + 2 : cfg->fp16.enabled ? 4 : 0; /* bytes a parameter */
        uint64_t need =
            (uint64_t)n * (5 * 4 + rounded) + zs_model_host_bytes(dev, &cfg->model, b, T);
        snprintf(what, sizeof what, "%zu parameters (weights, gradients, moments) and activations",
                 n);
        ZS_CHECK_GOTO(zs_mem_check("train", what, need), res, fail);
    }
    tr->params = alloc_floats(n);
    tr->grads = alloc_floats(n);
    tr->acc = alloc_floats(n);
    tr->m = alloc_floats(n);
    tr->v = alloc_floats(n);
    tr->inputs = malloc((size_t)b * T * sizeof *tr->inputs);
    tr->targets = malloc((size_t)b * T * sizeof *tr->targets);
    if (cfg->bf16) {
        tr->compute = alloc_floats(n);
        tr->bf16 = calloc(n, sizeof *tr->bf16);
    }
    if (cfg->fp16.enabled) /* fp16: the weights rounded to fp16 (docs/precision.md) */
        tr->compute = alloc_floats(n);
    if (!tr->params || !tr->grads || !tr->acc || !tr->m || !tr->v || !tr->inputs || !tr->targets ||
        (cfg->bf16 && (!tr->compute || !tr->bf16)) || (cfg->fp16.enabled && !tr->compute)) {
        res = zs_error(ZS_ERR_NOMEM, "trainer: out of memory for %zu parameters", n);
        goto fail;
    }
    if (init_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", init_dir);
        ZS_CHECK_GOTO(zs_modelfile_load_weights(&tr->tt, path, tr->params), res, fail);
    } else {
        zs_tensors_init_gpt2(&tr->tt, cfg->seed, tr->params, 0, n);
    }
    if (cfg->bf16)
        round_compute(tr);
    else if (cfg->fp16.enabled)
        zs_fp16_round_array(tr->compute, tr->params, n, tr->threads);
    else
        tr->compute = tr->params;
    zs_lossscale_init(&tr->ls, &cfg->fp16);
    ZS_CHECK_GOTO(zs_model_create(dev, &cfg->model, &tr->tt, b, T, tr->threads,
                                  zs_model_precision(cfg), &tr->model),
                  res, fail);
    if (zs_model_on_host(tr->model)) {
        tr->dev_params = tr->compute;
        tr->dev_grads = tr->grads;
    } else {
        ZS_CHECK_GOTO(zs_model_alloc(tr->model, n * sizeof(float), (void **)&tr->dev_params), res,
                      fail);
        ZS_CHECK_GOTO(zs_model_alloc(tr->model, n * sizeof(float), (void **)&tr->dev_grads), res,
                      fail);
    }
    return ZS_OK;
fail:
    zs_trainer_free(tr);
    return res;
}

void zs_trainer_free(zs_trainer *tr)
{
    if (tr->model && !zs_model_on_host(tr->model)) {
        zs_model_dealloc(tr->model, tr->dev_params);
        zs_model_dealloc(tr->model, tr->dev_grads);
    }
    zs_model_free(tr->model);
    if (tr->compute != tr->params)
        free(tr->compute);
    free(tr->params);
    free(tr->bf16);
    free(tr->grads);
    free(tr->acc);
    free(tr->m);
    free(tr->v);
    free(tr->inputs);
    free(tr->targets);
    zs_tensors_free(&tr->tt);
    memset(tr, 0, sizeof *tr);
}

zs_err zs_trainer_step(zs_trainer *tr, zs_step_stats *st)
{
    const zs_config *cfg = &tr->cfg;
    int C = cfg->chunks, b = cfg->micro_batch, T = cfg->model.block_size;
    size_t n = tr->tt.total;
    double t0 = zs_now_s();
    zs_gpt2_flat flat = {.params = tr->dev_params, .grads = tr->dev_grads};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    int on_host = zs_model_on_host(tr->model);
    if (!on_host) /* the weights of this step, as a GPU worker fetches them */
        ZS_CHECK(zs_model_upload(tr->model, tr->dev_params, tr->compute, n * sizeof(float)));
    double loss_sum = 0;
    /* fp16: this step's loss scale (1 otherwise, which changes no bit below). */
    int fp16 = cfg->fp16.enabled;
    double scale = fp16 ? tr->ls.scale : 1.0;
    /* What the host still multiplies the gradient by: the scale, or 1 where the model's fp16
     * backward already carried it (a GPU model, zs_model_loss_scale). */
    float host_scale = fp16 ? zs_model_loss_scale(tr->model, (float)scale) : 1.0f;
    for (int c = 0; c < C; c++) {
        zs_data_chunk(tr->data, cfg->seed, tr->step, c, b, T, tr->inputs, tr->targets);
        /* acc = g_0, then acc += g_c: chunk order, as the servers add them.  Chunk 0's
         * gradient is written straight into acc (the model writes every float of it). */
        float *g = c == 0 ? tr->acc : tr->grads;
        if (on_host)
            flat.grads = g;
        float loss;
        ZS_CHECK(zs_model_forward(tr->model, &io, tr->inputs, tr->targets, b, T, &loss));
        ZS_CHECK(zs_model_backward(tr->model, &io));
        if (!on_host)
            ZS_CHECK(zs_model_download(tr->model, g, tr->dev_grads, n * sizeof(float)));
        loss_sum += loss;
        if (fp16) /* as a worker pushes it: scaled, rounded to fp16 (inf on overflow) */
            zs_fp16_scale_grads(g, n, host_scale);
        if (c > 0) /* the servers' addition (kernels/reduce.h): the same bits */
            zs_accumulate(tr->acc, tr->grads, n, tr->threads);
    }
    size_t shard_floats = cfg->cluster.shard_bytes / sizeof(float);
    /* fp16: the norm of the unscaled gradient, as the coordinator divides it (exact: the scale
     * is a power of two), and the schedule and AdamW's t at the steps applied so far. */
    double norm = zs_grad_norm(zs_sumsq_sharded(tr->acc, n, shard_floats, tr->threads), C) / scale;
    double clip = zs_clip_factor(norm, cfg->gradient_clipping);
    long opt_step = fp16 ? zs_lossscale_opt_step(&tr->ls) : tr->step;
    double lr = zs_config_lr(cfg, (int)opt_step);
    /* A non-finite gradient (an overflow, a NaN) skips the update, as the coordinator's
     * verdict makes the servers do (zs_store_apply): weights, moments and the bf16 copy stay
     * as they are, and the step count still moves on, so the next update's bias correction
     * uses t = its own step number in both. */
    int skip = !isfinite(norm);
    if (skip && fp16) {
        ZS_WARN("train: step %ld: the gradient overflowed at loss scale %.17g; the update is "
                "skipped",
                tr->step + 1, scale);
    } else if (skip) {
        ZS_WARN("train: step %ld: the gradient is not finite; the update is skipped", tr->step + 1);
    } else {
        const zs_adamw_config *ac = &cfg->adamw;
        /* (clip / scale) / C: the servers' factor (zs_store_apply with clip / scale). */
        zs_adamw_tensors(&tr->tt, 0, n, tr->params, tr->m, tr->v, tr->acc, tr->bf16, ZS_HALF_BF16,
                         lr, ac->beta1, ac->beta2, ac->eps, ac->weight_decay, opt_step + 1,
                         (float)(clip / scale / C), tr->threads);
        if (cfg->bf16) {
#pragma omp parallel for schedule(static) num_threads(tr->threads)
            for (size_t i = 0; i < n; i++)
                tr->compute[i] = zs_bf16_to_f32(tr->bf16[i]);
        }
        if (fp16)
            zs_fp16_round_array(tr->compute, tr->params, n, tr->threads);
    }
    if (fp16)
        ZS_CHECK(zs_lossscale_update(&tr->ls, &cfg->fp16, skip));
    tr->step++;
    double dt = zs_now_s() - t0;
    *st = (zs_step_stats){.step = tr->step,
                          .loss = loss_sum / C,
                          .lr = lr,
                          .grad_norm = norm,
                          .clip = clip,
                          .skipped = skip,
                          .loss_scale = scale,
                          .seconds = dt,
                          .tokens_per_sec = (double)C * b * T / dt};
    return ZS_OK;
}

zs_err zs_trainer_checkpoint(const zs_trainer *tr, const char *step_dir, const zs_ckpt_info *run)
{
    zs_ckpt_info info = *run;
    info.step = tr->step;
    info.model = tr->cfg.model;
    info.total_floats = tr->tt.total;
    info.shard_floats = tr->cfg.cluster.shard_bytes / sizeof(float);
    info.has_scaler = tr->cfg.fp16.enabled;
    info.scaler = tr->ls;
    zs_shardmap map;
    ZS_CHECK(zs_shardmap_build(tr->tt.total, tr->cfg.cluster.shard_bytes, 1, NULL, &map));
    zs_ckpt_shard *files = calloc((size_t)map.n_shards, sizeof *files);
    zs_err res = files ? ZS_OK : zs_error(ZS_ERR_NOMEM, "train: out of memory for a checkpoint");
    for (int i = 0; res == ZS_OK && i < map.n_shards; i++) {
        size_t b = map.shards[i].begin, e = map.shards[i].end;
        res = zs_ckpt_write_shard(step_dir, &info, i, b, e, tr->params + b, tr->m + b, tr->v + b,
                                  &files[i]);
    }
    if (res == ZS_OK)
        res = zs_ckpt_write_manifest(step_dir, &info, &tr->tt, files, map.n_shards);
    free(files);
    zs_shardmap_free(&map);
    return res;
}

zs_err zs_trainer_resume(zs_trainer *tr, const zs_ckpt *ck)
{
    const zs_config *cfg = &tr->cfg;
    size_t n = tr->tt.total; /* the checkpoint's too: zs_ckpt_check_compatible */
    /* fp16: the scaler's state after the checkpoint's step, as a resumed coordinator takes it. */
    zs_lossscale ls = tr->ls;
    if (cfg->fp16.enabled)
        ZS_CHECK(zs_ckpt_scaler(ck, &cfg->fp16, &ls));
    ZS_CHECK(zs_ckpt_read(ck, ZS_CKPT_PARAM, 0, n, tr->params));
    ZS_CHECK(zs_ckpt_read(ck, ZS_CKPT_EXP_AVG, 0, n, tr->m));
    ZS_CHECK(zs_ckpt_read(ck, ZS_CKPT_EXP_AVG_SQ, 0, n, tr->v));
    /* The 16-bit weights the model computes with: AdamW's bf16 copy is the weights rounded to
     * nearest even, and fp16's are rounded after each step, so rounding now gives their bits. */
    if (cfg->bf16) {
#pragma omp parallel for schedule(static) num_threads(tr->threads)
        for (size_t i = 0; i < n; i++)
            tr->bf16[i] = zs_f32_to_bf16(tr->params[i]);
        round_compute(tr);
    } else if (cfg->fp16.enabled) {
        zs_fp16_round_array(tr->compute, tr->params, n, tr->threads);
    }
    tr->ls = ls;
    tr->step = ck->info.step;
    return ZS_OK;
}

zs_err zs_trainer_save(const zs_trainer *tr, const char *dir)
{
    return zs_modelfile_save(&tr->tt, &tr->cfg.model, tr->params, dir);
}
