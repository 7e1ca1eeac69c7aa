/*
 * config: parsing of the job's JSON configuration.
 *
 * The parser walks the document with a fixed list of allowed keys per object, so an unknown
 * key is reported by its full path ("optimizer.params.betaz") instead of being ignored; a
 * value of the wrong type or out of range is reported with the path and the value.  Values
 * not given keep the defaults of zs_config_defaults().  zs_config_fingerprint() hashes a
 * canonical text of the values that decide the training bits, field by field.
 */
#include "common/config.h"
#include "common/lossscale.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <xxhash.h>

void zs_config_defaults(zs_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->model = (zs_model_config){
        .n_layer = 6, .n_head = 6, .n_embd = 384, .vocab_size = 256, .block_size = 256};
    cfg->seed = 42;
    cfg->adamw = (zs_adamw_config){
        .lr = 3e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    cfg->sched = (zs_schedule){.type = ZS_SCHED_CONSTANT,
                               .warmup_min_lr = 0.0,
                               .warmup_max_lr = 0.001,
                               .warmup_num_steps = 1000,
                               .warmup_linear = 0,
                               .total_num_steps = 0,
                               .warmup_min_ratio = 0.0,
                               .cos_min_ratio = 0.0001};
    cfg->gradient_clipping = 1.0;
    cfg->steps_per_print = 1;
    cfg->cluster = (zs_cluster_config){.shard_bytes = 4u << 20,
                                       .heartbeat_interval_ms = 500,
                                       .heartbeat_timeout_ms = 5000,
                                       .coordinator_timeout_ms = 15000,
                                       .chunk_timeout_factor = 4.0,
                                       .chunk_timeout_min_ms = 2000,
                                       .max_members_per_address = 1024,
                                       .server_memory_bytes = 0,
                                       .transport = ZS_TRANSPORT_AUTO,
                                       .rdma_device = "",
                                       .rdma_port = 1,
                                       .rdma_gid_index = -1};
    cfg->fp16 = (zs_fp16_config){.enabled = 0,
                                 .loss_scale = 0,
                                 .initial_scale_power = 16,
                                 .loss_scale_window = 1000,
                                 .hysteresis = 2,
                                 .min_loss_scale = 1,
                                 .consecutive_hysteresis = 0};
    cfg->zero = (zs_zero_config){.stage = 3, .optimizer = ZS_OFFLOAD_NONE, .param_buffers = 5};
    cfg->aio = (zs_aio_config){.block_size = 1u << 20, .queue_depth = 8};
    cfg->elasticity = (zs_elastic_config){.enabled = 0, .min_workers = 1, .max_workers = 0};
    cfg->checkpoint =
        (zs_checkpoint_config){.dir = "", .interval_steps = 0, .keep = 2, .replicas = 0};
}

/* The parser's state: where we are (for messages) and which source we read. */
typedef struct {
    const char *source;
} parser;

static zs_err bad(const parser *p, const char *path, const char *fmt, const char *detail)
{
    char what[512];
    snprintf(what, sizeof what, fmt, detail);
    return zs_error(ZS_ERR_INVALID, "%s: key \"%s\": %s", p->source, path, what);
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

/* Every key of obj must be in the NULL-terminated list allowed. */
static zs_err check_keys(const parser *p, const char *path, json_t *obj, const char *const *allowed)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            ok |= strcmp(*a, key) == 0;
        if (!ok) {
            char full[256];
            snprintf(full, sizeof full, "%s%s%s", path, *path ? "." : "", key);
            return zs_error(ZS_ERR_INVALID, "%s: unknown key \"%s\"", p->source, full);
        }
    }
    return ZS_OK;
}

static void join(char *out, size_t n, const char *path, const char *key)
{
    snprintf(out, n, "%s%s%s", path, *path ? "." : "", key);
}

/* An integer in [lo, hi]; absent leaves *out unchanged; *present says whether it was given. */
static zs_err get_int(const parser *p, json_t *obj, const char *path, const char *key, long long lo,
                      long long hi, long long *out, int *present)
{
    char full[256];
    join(full, sizeof full, path, key);
    json_t *v = json_object_get(obj, key);
    if (present)
        *present = v != NULL;
    if (!v)
        return ZS_OK;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);
    } else {
        return bad(p, full, "expected an integer, got %s", type_name(v));
    }
    if (x < lo || x > hi) {
        char d[128];
        snprintf(d, sizeof d, "%lld is outside [%lld, %lld]", x, lo, hi);
        return bad(p, full, "%s", d);
    }
    *out = x;
    return ZS_OK;
}

static zs_err get_int32(const parser *p, json_t *obj, const char *path, const char *key, int lo,
                        int hi, int *out, int *present)
{
    long long x = *out;
    ZS_CHECK(get_int(p, obj, path, key, lo, hi, &x, present));
    *out = (int)x;
    return ZS_OK;
}

static zs_err get_num(const parser *p, json_t *obj, const char *path, const char *key, double lo,
                      double hi, double *out)
{
    char full[256];
    join(full, sizeof full, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v)
        return ZS_OK;
    if (!json_is_number(v))
        return bad(p, full, "expected a number, got %s", type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        char d[128];
        snprintf(d, sizeof d, "%g is outside [%g, %g]", x, lo, hi);
        return bad(p, full, "%s", d);
    }
    *out = x;
    return ZS_OK;
}

static zs_err get_bool(const parser *p, json_t *obj, const char *path, const char *key, int *out)
{
    char full[256];
    join(full, sizeof full, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v)
        return ZS_OK;
    if (!json_is_boolean(v))
        return bad(p, full, "expected true or false, got %s", type_name(v));
    *out = json_is_true(v);
    return ZS_OK;
}

static zs_err get_str(const parser *p, json_t *obj, const char *path, const char *key,
                      const char **out)
{
    char full[256];
    join(full, sizeof full, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v)
        return ZS_OK;
    if (!json_is_string(v))
        return bad(p, full, "expected a string, got %s", type_name(v));
    *out = json_string_value(v);
    return ZS_OK;
}

/* A sub-object, or NULL when absent; an error when present with another type. */
static zs_err get_obj(const parser *p, json_t *obj, const char *path, const char *key, json_t **out)
{
    char full[256];
    join(full, sizeof full, path, key);
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v)
        return ZS_OK;
    if (!json_is_object(v))
        return bad(p, full, "expected an object, got %s", type_name(v));
    *out = v;
    return ZS_OK;
}

static zs_err parse_model(const parser *p, json_t *m, zs_model_config *mc)
{
    static const char *const keys[] = {"n_layer",    "n_head",     "n_embd",
                                       "vocab_size", "block_size", NULL};
    ZS_CHECK(check_keys(p, "model", m, keys));
    ZS_CHECK(get_int32(p, m, "model", "n_layer", 1, 1024, &mc->n_layer, NULL));
    ZS_CHECK(get_int32(p, m, "model", "n_head", 1, 1024, &mc->n_head, NULL));
    ZS_CHECK(get_int32(p, m, "model", "n_embd", 1, 65536, &mc->n_embd, NULL));
    ZS_CHECK(get_int32(p, m, "model", "vocab_size", 1, 1 << 24, &mc->vocab_size, NULL));
    ZS_CHECK(get_int32(p, m, "model", "block_size", 1, 1 << 20, &mc->block_size, NULL));
    if (mc->n_embd % mc->n_head != 0)
        return zs_error(ZS_ERR_INVALID,
                        "%s: key \"model.n_embd\": %d is not a multiple of "
                        "model.n_head %d",
                        p->source, mc->n_embd, mc->n_head);
    return ZS_OK;
}

static zs_err parse_optimizer(const parser *p, json_t *o, zs_adamw_config *a)
{
    static const char *const keys[] = {"type", "params", NULL};
    static const char *const pkeys[] = {"lr", "betas", "eps", "weight_decay", NULL};
    ZS_CHECK(check_keys(p, "optimizer", o, keys));
    const char *type = NULL;
    ZS_CHECK(get_str(p, o, "optimizer", "type", &type));
    if (type && strcasecmp(type, "AdamW") != 0)
        return zs_error(ZS_ERR_INVALID,
                        "%s: key \"optimizer.type\": \"%s\" is not supported "
                        "(supported: \"AdamW\")",
                        p->source, type);
    json_t *prm;
    ZS_CHECK(get_obj(p, o, "optimizer", "params", &prm));
    if (!prm)
        return ZS_OK;
    ZS_CHECK(check_keys(p, "optimizer.params", prm, pkeys));
    ZS_CHECK(get_num(p, prm, "optimizer.params", "lr", 0.0, 10.0, &a->lr));
    ZS_CHECK(get_num(p, prm, "optimizer.params", "eps", 0.0, 1.0, &a->eps));
    ZS_CHECK(get_num(p, prm, "optimizer.params", "weight_decay", 0.0, 10.0, &a->weight_decay));
    json_t *betas = json_object_get(prm, "betas");
    if (betas) {
        if (!json_is_array(betas) || json_array_size(betas) != 2 ||
            !json_is_number(json_array_get(betas, 0)) || !json_is_number(json_array_get(betas, 1)))
            return bad(p, "optimizer.params.betas", "expected an array of 2 numbers, got %s",
                       json_is_array(betas) ? "an array of another length or type"
                                            : type_name(betas));
        double b1 = json_number_value(json_array_get(betas, 0));
        double b2 = json_number_value(json_array_get(betas, 1));
        if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"optimizer.params.betas\": [%g, %g] must "
                            "be in [0, 1)",
                            p->source, b1, b2);
        a->beta1 = b1;
        a->beta2 = b2;
    }
    return ZS_OK;
}

static zs_err parse_scheduler(const parser *p, json_t *s, zs_schedule *sc)
{
    static const char *const keys[] = {"type", "params", NULL};
    static const char *const pkeys[] = {"warmup_min_lr", "warmup_max_lr",        "warmup_num_steps",
                                        "warmup_type",   "total_num_steps",      "warmup_min_ratio",
                                        "cos_min_ratio", "last_batch_iteration", NULL};
    ZS_CHECK(check_keys(p, "scheduler", s, keys));
    const char *type = NULL;
    ZS_CHECK(get_str(p, s, "scheduler", "type", &type));
    if (!type)
        return zs_error(ZS_ERR_INVALID, "%s: key \"scheduler.type\" is missing", p->source);
    if (strcmp(type, "WarmupLR") == 0)
        sc->type = ZS_SCHED_WARMUP;
    else if (strcmp(type, "WarmupDecayLR") == 0)
        sc->type = ZS_SCHED_WARMUP_DECAY;
    else if (strcmp(type, "WarmupCosineLR") == 0)
        sc->type = ZS_SCHED_WARMUP_COSINE;
    else
        return zs_error(ZS_ERR_INVALID,
                        "%s: key \"scheduler.type\": \"%s\" is not supported "
                        "(supported: WarmupLR, WarmupDecayLR, WarmupCosineLR)",
                        p->source, type);
    json_t *prm;
    ZS_CHECK(get_obj(p, s, "scheduler", "params", &prm));
    if (!prm)
        prm = json_object(); /* all defaults */
    else
        json_incref(prm);
    zs_err res;
    const char *P = "scheduler.params";
    int have_total = 0;
    long long last = -1;
    ZS_CHECK_GOTO(check_keys(p, P, prm, pkeys), res, out);
    ZS_CHECK_GOTO(get_num(p, prm, P, "warmup_min_lr", 0, 10, &sc->warmup_min_lr), res, out);
    ZS_CHECK_GOTO(get_num(p, prm, P, "warmup_max_lr", 0, 10, &sc->warmup_max_lr), res, out);
    ZS_CHECK_GOTO(get_int32(p, prm, P, "warmup_num_steps", 0, 1 << 30, &sc->warmup_num_steps, NULL),
                  res, out);
    ZS_CHECK_GOTO(
        get_int32(p, prm, P, "total_num_steps", 1, 1 << 30, &sc->total_num_steps, &have_total), res,
        out);
    ZS_CHECK_GOTO(get_num(p, prm, P, "warmup_min_ratio", 0, 1, &sc->warmup_min_ratio), res, out);
    ZS_CHECK_GOTO(get_num(p, prm, P, "cos_min_ratio", 0, 1, &sc->cos_min_ratio), res, out);
    /* DeepSpeed's resume cursor: only the fresh-start value -1 means the same thing here. */
    ZS_CHECK_GOTO(get_int(p, prm, P, "last_batch_iteration", -1, -1, &last, NULL), res, out);
    const char *wt = NULL;
    ZS_CHECK_GOTO(get_str(p, prm, P, "warmup_type", &wt), res, out);
    if (wt && strcmp(wt, "log") != 0 && strcmp(wt, "linear") != 0) {
        res = zs_error(ZS_ERR_INVALID,
                       "%s: key \"scheduler.params.warmup_type\": \"%s\" is not "
                       "\"log\" or \"linear\"",
                       p->source, wt);
        goto out;
    }
    sc->warmup_linear = wt && strcmp(wt, "linear") == 0;
    if (sc->warmup_num_steps < 2)
        sc->warmup_num_steps = 2; /* as DeepSpeed: log warmup needs log(n) > 0 */
    if (sc->type != ZS_SCHED_WARMUP && !have_total) {
        res = zs_error(ZS_ERR_INVALID,
                       "%s: key \"scheduler.params.total_num_steps\" is "
                       "required by %s",
                       p->source, type);
        goto out;
    }
    if (sc->type != ZS_SCHED_WARMUP && sc->total_num_steps <= sc->warmup_num_steps &&
        sc->type == ZS_SCHED_WARMUP_COSINE) {
        res = zs_error(ZS_ERR_INVALID,
                       "%s: key \"scheduler.params.total_num_steps\": %d must "
                       "exceed warmup_num_steps %d",
                       p->source, sc->total_num_steps, sc->warmup_num_steps);
        goto out;
    }
    res = ZS_OK;
out:
    json_decref(prm);
    return res;
}

/* A loss scale (zs_lossscale_valid), or 0 where allow_zero. */
static zs_err get_pow2(const parser *p, json_t *f, const char *key, int allow_zero, double *out)
{
    double x = *out;
    char full[64];
    snprintf(full, sizeof full, "fp16.%s", key);
    ZS_CHECK(get_num(p, f, "fp16", key, 0, ldexp(1.0, 64), &x));
    if (!(x == 0 ? allow_zero : zs_lossscale_valid(x))) {
        char d[128];
        snprintf(d, sizeof d, "%g is not %sa power of two in [2^-24, 2^64]", x,
                 allow_zero ? "0 or " : "");
        return bad(p, full, "%s", d);
    }
    *out = x;
    return ZS_OK;
}

/* DeepSpeed's fp16 block (deepspeed/runtime/precision_config.py: its keys and defaults).
 * DeepSpeed accepts any positive static scale and min_loss_scale; zshard wants powers of two,
 * so that the gradient's scaling and unscaling are exact (docs/precision.md). */
static zs_err parse_fp16(const parser *p, json_t *f, zs_fp16_config *c)
{
    static const char *const keys[] = {
        "enabled",    "loss_scale",     "initial_scale_power",    "loss_scale_window",
        "hysteresis", "min_loss_scale", "consecutive_hysteresis", NULL};
    ZS_CHECK(check_keys(p, "fp16", f, keys));
    ZS_CHECK(get_bool(p, f, "fp16", "enabled", &c->enabled));
    ZS_CHECK(get_pow2(p, f, "loss_scale", 1, &c->loss_scale));
    ZS_CHECK(get_int32(p, f, "fp16", "initial_scale_power", 0, 64, &c->initial_scale_power, NULL));
    ZS_CHECK(get_int32(p, f, "fp16", "loss_scale_window", 1, 1 << 30, &c->loss_scale_window, NULL));
    ZS_CHECK(get_int32(p, f, "fp16", "hysteresis", 1, 1 << 30, &c->hysteresis, NULL));
    ZS_CHECK(get_pow2(p, f, "min_loss_scale", 0, &c->min_loss_scale));
    ZS_CHECK(get_bool(p, f, "fp16", "consecutive_hysteresis", &c->consecutive_hysteresis));
    return ZS_OK;
}

static zs_err parse_checkpoint(const parser *p, json_t *o, zs_checkpoint_config *ck)
{
    static const char *const keys[] = {"dir", "interval_steps", "keep", "replicas", NULL};
    ZS_CHECK(check_keys(p, "checkpoint", o, keys));
    const char *dir = NULL;
    ZS_CHECK(get_str(p, o, "checkpoint", "dir", &dir));
    if (dir) {
        size_t len = strlen(dir);
        if (len >= sizeof ck->dir)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"checkpoint.dir\": a path of %zu bytes is longer than "
                            "the %zu bytes allowed",
                            p->source, len, sizeof ck->dir - 1);
        memcpy(ck->dir, dir, len + 1);
    }
    ZS_CHECK(
        get_int32(p, o, "checkpoint", "interval_steps", 0, 1 << 30, &ck->interval_steps, NULL));
    ZS_CHECK(get_int32(p, o, "checkpoint", "keep", 1, 1 << 20, &ck->keep, NULL));
    ZS_CHECK(get_int32(p, o, "checkpoint", "replicas", 0, 1, &ck->replicas, NULL));
    return ZS_OK;
}

/* "none", "cpu" or "nvme" at path.key into *out (absent: unchanged). */
static zs_err get_device(const parser *p, json_t *o, const char *path, zs_offload_device *out)
{
    const char *dev = NULL;
    ZS_CHECK(get_str(p, o, path, "device", &dev));
    if (!dev)
        return ZS_OK;
    if (strcmp(dev, "none") == 0)
        *out = ZS_OFFLOAD_NONE;
    else if (strcmp(dev, "cpu") == 0)
        *out = ZS_OFFLOAD_CPU;
    else if (strcmp(dev, "nvme") == 0)
        *out = ZS_OFFLOAD_NVME;
    else
        return zs_error(ZS_ERR_INVALID,
                        "%s: key \"%s.device\": \"%s\"; expected \"none\", \"cpu\" "
                        "or \"nvme\"",
                        p->source, path, dev);
    return ZS_OK;
}

/* DeepSpeed's zero_optimization block.  Keys of DeepSpeed's offload blocks that do not carry
 * over (pin_memory: io_uring's registered buffers are always pinned; buffer_count: the
 * pipeline has three slots; ...) are accepted and have no effect (docs/configuration.md). */
static zs_err parse_zero(const parser *p, json_t *z, zs_zero_config *zc)
{
    /* DeepSpeed's ZeRO tuning keys beside the offload blocks are accepted so that its users'
     * configs load; they tune GPU collectives that zshard does not have (docs/configuration.md). */
    static const char *const keys[] = {"stage",
                                       "offload_optimizer",
                                       "offload_param",
                                       "overlap_comm",
                                       "contiguous_gradients",
                                       "reduce_scatter",
                                       "reduce_bucket_size",
                                       "allgather_partitions",
                                       "allgather_bucket_size",
                                       "sub_group_size",
                                       "round_robin_gradients",
                                       "stage3_prefetch_bucket_size",
                                       "stage3_param_persistence_threshold",
                                       "stage3_max_live_parameters",
                                       "stage3_max_reuse_distance",
                                       "stage3_gather_16bit_weights_on_model_save",
                                       NULL};
    static const char *const opt_keys[] = {"device",    "nvme_path", "pin_memory", "buffer_count",
                                           "fast_init", "ratio",     NULL};
    static const char *const param_keys[] = {
        "device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", NULL};
    ZS_CHECK(check_keys(p, "zero_optimization", z, keys));
    ZS_CHECK(get_int32(p, z, "zero_optimization", "stage", 0, 3, &zc->stage, NULL));
    json_t *o = NULL;
    ZS_CHECK(get_obj(p, z, "zero_optimization", "offload_optimizer", &o));
    if (o) {
        const char *path = NULL;
        ZS_CHECK(check_keys(p, "zero_optimization.offload_optimizer", o, opt_keys));
        ZS_CHECK(get_device(p, o, "zero_optimization.offload_optimizer", &zc->optimizer));
        ZS_CHECK(get_str(p, o, "zero_optimization.offload_optimizer", "nvme_path", &path));
        if (path) {
            if (path[0] != '/' || strlen(path) >= sizeof zc->nvme_path)
                return zs_error(ZS_ERR_INVALID,
                                "%s: key \"zero_optimization.offload_optimizer.nvme_path\": "
                                "\"%.80s\" is not an absolute path (each server resolves it on "
                                "its own host) of at most %zu bytes",
                                p->source, path, sizeof zc->nvme_path - 1);
            snprintf(zc->nvme_path, sizeof zc->nvme_path, "%s", path);
        }
        if (zc->optimizer == ZS_OFFLOAD_NVME && !zc->nvme_path[0])
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"zero_optimization.offload_optimizer\": device \"nvme\" "
                            "needs nvme_path, a directory on a local disk",
                            p->source);
    }
    ZS_CHECK(get_obj(p, z, "zero_optimization", "offload_param", &o));
    if (o) {
        ZS_CHECK(check_keys(p, "zero_optimization.offload_param", o, param_keys));
        ZS_CHECK(get_device(p, o, "zero_optimization.offload_param", &zc->param));
        ZS_CHECK(get_int32(p, o, "zero_optimization.offload_param", "buffer_count", 2, 1024,
                           &zc->param_buffers, NULL));
        if (zc->param == ZS_OFFLOAD_NVME && zc->optimizer != ZS_OFFLOAD_NVME)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"zero_optimization.offload_param.device\": \"nvme\" needs "
                            "offload_optimizer.device \"nvme\" too (the weights are written where "
                            "the optimizer's state is)",
                            p->source);
    }
    return ZS_OK;
}

static zs_err parse_aio(const parser *p, json_t *o, zs_aio_config *ac)
{
    static const char *const keys[] = {
        "block_size", "queue_depth", "thread_count", "single_submit", "overlap_events",
        "use_gds",    NULL};
    ZS_CHECK(check_keys(p, "aio", o, keys));
    long long bs = (long long)ac->block_size;
    ZS_CHECK(get_int(p, o, "aio", "block_size", 4096, 1ll << 30, &bs, NULL));
    if (bs % 4096)
        return zs_error(ZS_ERR_INVALID,
                        "%s: key \"aio.block_size\": %lld is not a multiple of 4096 (O_DIRECT "
                        "requests are aligned to it)",
                        p->source, bs);
    ac->block_size = (size_t)bs;
    ZS_CHECK(get_int32(p, o, "aio", "queue_depth", 1, 4096, &ac->queue_depth, NULL));
    return ZS_OK;
}

static zs_err parse_root(const parser *p, json_t *root, zs_config *cfg)
{
    static const char *const keys[] = {"seed",
                                       "train_batch_size",
                                       "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps",
                                       "optimizer",
                                       "scheduler",
                                       "gradient_clipping",
                                       "bf16",
                                       "fp16",
                                       "steps_per_print",
                                       "model",
                                       "cluster",
                                       "elasticity",
                                       "zero_optimization",
                                       "aio",
                                       "checkpoint",
                                       "wall_clock_breakdown",
                                       NULL};
    static const char *const bf16_keys[] = {"enabled", NULL};
    static const char *const cluster_keys[] = {"shard_size",
                                               "heartbeat_interval_ms",
                                               "heartbeat_timeout_ms",
                                               "coordinator_timeout_ms",
                                               "chunk_timeout_factor",
                                               "chunk_timeout_min_ms",
                                               "max_members_per_address",
                                               "server_memory_bytes",
                                               "transport",
                                               "rdma",
                                               NULL};
    static const char *const rdma_keys[] = {"device", "port", "gid_index", NULL};
    static const char *const elastic_keys[] = {"enabled", "min_workers", "max_workers", NULL};
    if (!json_is_object(root))
        return zs_error(ZS_ERR_INVALID, "%s: the configuration must be a JSON object, got %s",
                        p->source, type_name(root));
    ZS_CHECK(check_keys(p, "", root, keys));
    long long seed = (long long)cfg->seed;
    ZS_CHECK(get_int(p, root, "", "seed", 0, INT64_MAX, &seed, NULL));
    cfg->seed = (uint64_t)seed;
    int have_B = 0, have_b = 0, have_gas = 0, gas = 1;
    ZS_CHECK(
        get_int32(p, root, "", "train_batch_size", 1, 1 << 24, &cfg->train_batch_size, &have_B));
    ZS_CHECK(get_int32(p, root, "", "train_micro_batch_size_per_gpu", 1, 1 << 20, &cfg->micro_batch,
                       &have_b));
    ZS_CHECK(get_int32(p, root, "", "gradient_accumulation_steps", 1, 1 << 20, &gas, &have_gas));
    ZS_CHECK(get_num(p, root, "", "gradient_clipping", 0, 1e30, &cfg->gradient_clipping));
    ZS_CHECK(get_int32(p, root, "", "steps_per_print", 1, 1 << 30, &cfg->steps_per_print, NULL));
    int wcb = 0;
    ZS_CHECK(get_bool(p, root, "", "wall_clock_breakdown", &wcb));

    json_t *o;
    ZS_CHECK(get_obj(p, root, "", "model", &o));
    if (o)
        ZS_CHECK(parse_model(p, o, &cfg->model));
    ZS_CHECK(get_obj(p, root, "", "optimizer", &o));
    if (o)
        ZS_CHECK(parse_optimizer(p, o, &cfg->adamw));
    ZS_CHECK(get_obj(p, root, "", "scheduler", &o));
    if (o)
        ZS_CHECK(parse_scheduler(p, o, &cfg->sched));
    ZS_CHECK(get_obj(p, root, "", "bf16", &o));
    if (o) {
        ZS_CHECK(check_keys(p, "bf16", o, bf16_keys));
        ZS_CHECK(get_bool(p, o, "bf16", "enabled", &cfg->bf16));
    }
    ZS_CHECK(get_obj(p, root, "", "fp16", &o));
    if (o)
        ZS_CHECK(parse_fp16(p, o, &cfg->fp16));
    if (cfg->fp16.enabled && cfg->bf16)
        return zs_error(ZS_ERR_INVALID,
                        "%s: keys \"fp16.enabled\" and \"bf16.enabled\" are both true: choose one "
                        "precision",
                        p->source);
    ZS_CHECK(get_obj(p, root, "", "cluster", &o));
    if (o) {
        ZS_CHECK(check_keys(p, "cluster", o, cluster_keys));
        long long sb = (long long)cfg->cluster.shard_bytes;
        ZS_CHECK(get_int(p, o, "cluster", "shard_size", 256, 1ll << 40, &sb, NULL));
        if (sb % 256 != 0)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"cluster.shard_size\": %lld bytes is not a "
                            "multiple of 256",
                            p->source, sb);
        cfg->cluster.shard_bytes = (size_t)sb;
        ZS_CHECK(get_int32(p, o, "cluster", "heartbeat_interval_ms", 1, 3600000,
                           &cfg->cluster.heartbeat_interval_ms, NULL));
        ZS_CHECK(get_int32(p, o, "cluster", "heartbeat_timeout_ms", 1, 3600000,
                           &cfg->cluster.heartbeat_timeout_ms, NULL));
        if (cfg->cluster.heartbeat_timeout_ms <= cfg->cluster.heartbeat_interval_ms)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"cluster.heartbeat_timeout_ms\": %d must "
                            "exceed heartbeat_interval_ms %d",
                            p->source, cfg->cluster.heartbeat_timeout_ms,
                            cfg->cluster.heartbeat_interval_ms);
        ZS_CHECK(get_int32(p, o, "cluster", "coordinator_timeout_ms", 1, 3600000,
                           &cfg->cluster.coordinator_timeout_ms, NULL));
        ZS_CHECK(get_num(p, o, "cluster", "chunk_timeout_factor", 0.0, 1000.0,
                         &cfg->cluster.chunk_timeout_factor));
        if (cfg->cluster.chunk_timeout_factor != 0 && cfg->cluster.chunk_timeout_factor < 1.5)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"cluster.chunk_timeout_factor\": %g; 0 (no deadline) or at "
                            "least 1.5 (a deadline shorter than 1.5 median chunks moves sound "
                            "chunks)",
                            p->source, cfg->cluster.chunk_timeout_factor);
        ZS_CHECK(get_int32(p, o, "cluster", "chunk_timeout_min_ms", 1, 3600000,
                           &cfg->cluster.chunk_timeout_min_ms, NULL));
        ZS_CHECK(get_int32(p, o, "cluster", "max_members_per_address", 1, 4096,
                           &cfg->cluster.max_members_per_address, NULL));
        long long budget = (long long)cfg->cluster.server_memory_bytes;
        ZS_CHECK(get_int(p, o, "cluster", "server_memory_bytes", 0, 1ll << 50, &budget, NULL));
        cfg->cluster.server_memory_bytes = (uint64_t)budget;
        const char *tr = NULL;
        ZS_CHECK(get_str(p, o, "cluster", "transport", &tr));
        if (tr && strcmp(tr, "auto") == 0)
            cfg->cluster.transport = ZS_TRANSPORT_AUTO;
        else if (tr && strcmp(tr, "tcp") == 0)
            cfg->cluster.transport = ZS_TRANSPORT_TCP;
        else if (tr && strcmp(tr, "rdma") == 0)
            cfg->cluster.transport = ZS_TRANSPORT_RDMA;
        else if (tr && strcmp(tr, "shm") == 0)
            cfg->cluster.transport = ZS_TRANSPORT_SHM;
        else if (tr)
            return bad(p, "cluster.transport",
                       "\"%s\" is not \"tcp\", \"rdma\", \"shm\" or \"auto\"", tr);
        json_t *r;
        ZS_CHECK(get_obj(p, o, "cluster", "rdma", &r));
        if (r) {
            ZS_CHECK(check_keys(p, "cluster.rdma", r, rdma_keys));
            const char *dev = NULL;
            ZS_CHECK(get_str(p, r, "cluster.rdma", "device", &dev));
            if (dev && (strlen(dev) >= sizeof cfg->cluster.rdma_device || strchr(dev, ' ')))
                return bad(p, "cluster.rdma.device", "\"%s\" is not a device name", dev);
            if (dev)
                snprintf(cfg->cluster.rdma_device, sizeof cfg->cluster.rdma_device, "%s", dev);
            ZS_CHECK(
                get_int32(p, r, "cluster.rdma", "port", 1, 255, &cfg->cluster.rdma_port, NULL));
            ZS_CHECK(get_int32(p, r, "cluster.rdma", "gid_index", -1, 1 << 16,
                               &cfg->cluster.rdma_gid_index, NULL));
        }
        if (cfg->cluster.coordinator_timeout_ms <= 2 * cfg->cluster.heartbeat_interval_ms)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"cluster.coordinator_timeout_ms\": %d must exceed twice "
                            "heartbeat_interval_ms %d",
                            p->source, cfg->cluster.coordinator_timeout_ms,
                            cfg->cluster.heartbeat_interval_ms);
    }
    ZS_CHECK(get_obj(p, root, "", "elasticity", &o));
    if (o) {
        ZS_CHECK(check_keys(p, "elasticity", o, elastic_keys));
        ZS_CHECK(get_bool(p, o, "elasticity", "enabled", &cfg->elasticity.enabled));
        ZS_CHECK(get_int32(p, o, "elasticity", "min_workers", 0, 1 << 20,
                           &cfg->elasticity.min_workers, NULL));
        ZS_CHECK(get_int32(p, o, "elasticity", "max_workers", 0, 1 << 20,
                           &cfg->elasticity.max_workers, NULL));
        if (cfg->elasticity.max_workers &&
            cfg->elasticity.max_workers < cfg->elasticity.min_workers)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"elasticity.max_workers\": %d is below "
                            "min_workers %d",
                            p->source, cfg->elasticity.max_workers, cfg->elasticity.min_workers);
    }
    ZS_CHECK(get_obj(p, root, "", "checkpoint", &o));
    if (o)
        ZS_CHECK(parse_checkpoint(p, o, &cfg->checkpoint));
    ZS_CHECK(get_obj(p, root, "", "zero_optimization", &o));
    if (o)
        ZS_CHECK(parse_zero(p, o, &cfg->zero));
    ZS_CHECK(get_obj(p, root, "", "aio", &o));
    if (o)
        ZS_CHECK(parse_aio(p, o, &cfg->aio));
    if (cfg->zero.optimizer == ZS_OFFLOAD_NVME && cfg->checkpoint.replicas > 0)
        return zs_error(ZS_ERR_INVALID,
                        "%s: key \"checkpoint.replicas\": 1 with "
                        "zero_optimization.offload_optimizer.device \"nvme\" is not supported "
                        "yet: a replica is built from the moments in its buddy's RAM",
                        p->source);

    /* Batch geometry, as DeepSpeed relates the three keys (with one "GPU" per chunk). */
    if (!have_b && !have_B)
        cfg->micro_batch = 1;
    if (have_B && have_b) {
        if (cfg->train_batch_size % cfg->micro_batch != 0)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"train_batch_size\": %d is not a multiple of "
                            "train_micro_batch_size_per_gpu %d",
                            p->source, cfg->train_batch_size, cfg->micro_batch);
        cfg->chunks = cfg->train_batch_size / cfg->micro_batch;
        if (have_gas && gas != cfg->chunks)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"gradient_accumulation_steps\": %d, but "
                            "train_batch_size / train_micro_batch_size_per_gpu = %d / %d = %d",
                            p->source, gas, cfg->train_batch_size, cfg->micro_batch, cfg->chunks);
    } else if (have_B) {
        if (cfg->train_batch_size % gas != 0)
            return zs_error(ZS_ERR_INVALID,
                            "%s: key \"train_batch_size\": %d is not a multiple of "
                            "gradient_accumulation_steps %d",
                            p->source, cfg->train_batch_size, gas);
        cfg->chunks = gas;
        cfg->micro_batch = cfg->train_batch_size / gas;
    } else {
        cfg->chunks = gas;
        cfg->train_batch_size = cfg->micro_batch * gas;
    }
    return ZS_OK;
}

zs_err zs_config_parse(const char *text, const char *source, zs_config *cfg)
{
    zs_config_defaults(cfg);
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zs_error(ZS_ERR_INVALID, "%s:%d:%d: invalid JSON: %s", source, jerr.line,
                        jerr.column, jerr.text);
    parser p = {.source = source};
    zs_err res = parse_root(&p, root, cfg);
    json_decref(root);
    return res;
}

zs_err zs_config_load(const char *path, zs_config *cfg)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "config %s: %s", path,
                        strerror(errno));
    zs_err res = ZS_OK;
    char *text = NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        res = zs_error(ZS_ERR_IO, "config %s: cannot seek: %s", path, strerror(errno));
        goto out;
    }
    long len = ftell(f);
    if (len < 0 || len > (64l << 20)) {
        res =
            zs_error(ZS_ERR_INVALID, "config %s: size %ld is not that of a config file", path, len);
        goto out;
    }
    rewind(f);
    text = malloc((size_t)len + 1);
    if (!text) {
        res = zs_error(ZS_ERR_NOMEM, "config %s: out of memory", path);
        goto out;
    }
    if (fread(text, 1, (size_t)len, f) != (size_t)len) {
        res = zs_error(ZS_ERR_IO, "config %s: short read", path);
        goto out;
    }
    text[len] = '\0';
    res = zs_config_parse(text, path, cfg);
out:
    free(text);
    fclose(f);
    return res;
}

/* Appends printf output to the text buffer; the caller sized the buffer for every line. */
typedef struct {
    char buf[2048];
    size_t len;
} fp_text;

static void fp_line(fp_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fp_line(fp_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, sizeof t->buf - t->len, fmt, ap);
    va_end(ap);
    /* The lines are a fixed list of numbers: they fit, and a cut would only make the hash of a
     * shorter text, never read out of bounds. */
    if (n > 0)
        t->len += (size_t)n < sizeof t->buf - t->len ? (size_t)n : sizeof t->buf - t->len - 1;
}

const char *zs_transport_kind_name(zs_transport_kind k)
{
    return k == ZS_TRANSPORT_TCP    ? "tcp"
           : k == ZS_TRANSPORT_RDMA ? "rdma"
           : k == ZS_TRANSPORT_SHM  ? "shm"
                                    : "auto";
}

uint64_t zs_config_fingerprint(const zs_config *cfg)
{
    /* Field by field in a fixed order: never the struct's bytes, whose padding and layout
     * belong to the build.  Changing what is hashed changes the version line. */
    fp_text t = {.len = 0};
    const zs_model_config *m = &cfg->model;
    const zs_adamw_config *a = &cfg->adamw;
    const zs_schedule *s = &cfg->sched;
    fp_line(&t, "zshard-config-fingerprint v1\n");
    fp_line(&t, "model.n_layer=%d\nmodel.n_head=%d\nmodel.n_embd=%d\n", m->n_layer, m->n_head,
            m->n_embd);
    fp_line(&t, "model.vocab_size=%d\nmodel.block_size=%d\n", m->vocab_size, m->block_size);
    fp_line(&t, "seed=%" PRIu64 "\n", cfg->seed);
    fp_line(&t, "train_batch_size=%d\nmicro_batch=%d\nchunks=%d\n", cfg->train_batch_size,
            cfg->micro_batch, cfg->chunks);
    fp_line(&t, "adamw.lr=%a\nadamw.beta1=%a\nadamw.beta2=%a\nadamw.eps=%a\n", a->lr, a->beta1,
            a->beta2, a->eps);
    fp_line(&t, "adamw.weight_decay=%a\n", a->weight_decay);
    /* The schedule by its DeepSpeed name, not by the enum's value, which is the build's. */
    const char *sched = s->type == ZS_SCHED_WARMUP          ? "WarmupLR"
                        : s->type == ZS_SCHED_WARMUP_DECAY  ? "WarmupDecayLR"
                        : s->type == ZS_SCHED_WARMUP_COSINE ? "WarmupCosineLR"
                                                            : "constant";
    fp_line(&t, "sched.type=%s\nsched.warmup_min_lr=%a\nsched.warmup_max_lr=%a\n", sched,
            s->warmup_min_lr, s->warmup_max_lr);
    fp_line(&t, "sched.warmup_num_steps=%d\nsched.warmup_linear=%d\nsched.total_num_steps=%d\n",
            s->warmup_num_steps, s->warmup_linear, s->total_num_steps);
    fp_line(&t, "sched.warmup_min_ratio=%a\nsched.cos_min_ratio=%a\n", s->warmup_min_ratio,
            s->cos_min_ratio);
    fp_line(&t, "gradient_clipping=%a\nbf16=%d\n", cfg->gradient_clipping, cfg->bf16 ? 1 : 0);
    fp_line(&t, "cluster.shard_size=%zu\n", cfg->cluster.shard_bytes);
    if (cfg->fp16.enabled) {
        /* Only fp16 jobs hash these lines: every other job keeps the v1 text and with it the
         * fingerprint its older checkpoints carry. */
        const zs_fp16_config *f = &cfg->fp16;
        fp_line(&t, "fp16.loss_scale=%a\nfp16.initial_scale_power=%d\n", f->loss_scale,
                f->initial_scale_power);
        fp_line(&t, "fp16.loss_scale_window=%d\nfp16.hysteresis=%d\n", f->loss_scale_window,
                f->hysteresis);
        fp_line(&t, "fp16.min_loss_scale=%a\nfp16.consecutive_hysteresis=%d\n", f->min_loss_scale,
                f->consecutive_hysteresis ? 1 : 0);
    }
    return XXH3_64bits(t.buf, t.len);
}

/* DeepSpeed's warmup fraction gamma in [0, 1] for step < warmup_num_steps. */
static double warmup_gamma(const zs_schedule *s, int step)
{
    if (s->warmup_linear)
        return (double)step / (double)s->warmup_num_steps;
    return log((double)step + 1.0) / log((double)s->warmup_num_steps);
}

double zs_config_lr(const zs_config *cfg, int step)
{
    const zs_schedule *s = &cfg->sched;
    switch (s->type) {
    case ZS_SCHED_CONSTANT:
        return cfg->adamw.lr;
    case ZS_SCHED_WARMUP:
        if (step < s->warmup_num_steps)
            return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * warmup_gamma(s, step);
        return s->warmup_max_lr;
    case ZS_SCHED_WARMUP_DECAY: {
        double gamma;
        if (step < s->warmup_num_steps) {
            gamma = warmup_gamma(s, step);
        } else {
            double den = s->total_num_steps - s->warmup_num_steps;
            gamma = (double)(s->total_num_steps - step) / (den < 1.0 ? 1.0 : den);
            if (gamma < 0)
                gamma = 0;
        }
        return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
    }
    case ZS_SCHED_WARMUP_COSINE: {
        double ratio;
        if (step < s->warmup_num_steps) {
            ratio = s->warmup_min_ratio + (1.0 - s->warmup_min_ratio) * warmup_gamma(s, step);
        } else {
            double real_step = step - s->warmup_num_steps + 1;
            double real_total = s->total_num_steps - s->warmup_num_steps;
            double c = (1.0 + cos(M_PI * real_step / real_total)) / 2.0;
            ratio = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * c;
            if (ratio < 0)
                ratio = 0;
        }
        return cfg->adamw.lr * ratio;
    }
    }
    return cfg->adamw.lr;
}

zs_err zs_config_write_hf(const zs_model_config *m, const char *path)
{
    json_t *o = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:n, s:s, s:f, s:f, s:f, s:f, s:f, s:b, s:b,"
        " s:b, s:i, s:i, s:s}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", m->vocab_size,
        "n_positions", m->block_size, "n_ctx", m->block_size, "n_embd", m->n_embd, "n_layer",
        m->n_layer, "n_head", m->n_head, "n_inner", "activation_function", "gelu_new",
        "layer_norm_epsilon", 1e-5, "initializer_range", 0.02, "resid_pdrop", 0.0, "embd_pdrop",
        0.0, "attn_pdrop", 0.0, "scale_attn_weights", 1, "tie_word_embeddings", 1, "use_cache", 1,
        "bos_token_id", m->vocab_size - 1, "eos_token_id", m->vocab_size - 1, "torch_dtype",
        "float32");
    if (!o)
        return zs_error(ZS_ERR_NOMEM, "%s: cannot build the JSON object", path);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(o, tmp, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (rc != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return zs_error(ZS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    return ZS_OK;
}

zs_err zs_config_read_hf(const char *path, zs_model_config *m)
{
    json_error_t jerr;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) {
        if (access(path, R_OK) != 0)
            return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%s: %s", path,
                            strerror(errno));
        return zs_error(ZS_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, jerr.line, jerr.column,
                        jerr.text);
    }
    parser p = {.source = path};
    zs_err res = ZS_OK;
    if (!json_is_object(o)) {
        res = zs_error(ZS_ERR_FORMAT, "%s: expected a JSON object", path);
        goto out;
    }
    /* HF configs carry many keys; we read the ones that shape the model and check the ones
     * that would change its function. */
    *m = (zs_model_config){0};
    int have[5] = {0};
    ZS_CHECK_GOTO(get_int32(&p, o, "", "n_layer", 1, 1024, &m->n_layer, &have[0]), res, out);
    ZS_CHECK_GOTO(get_int32(&p, o, "", "n_head", 1, 1024, &m->n_head, &have[1]), res, out);
    ZS_CHECK_GOTO(get_int32(&p, o, "", "n_embd", 1, 65536, &m->n_embd, &have[2]), res, out);
    ZS_CHECK_GOTO(get_int32(&p, o, "", "vocab_size", 1, 1 << 24, &m->vocab_size, &have[3]), res,
                  out);
    ZS_CHECK_GOTO(get_int32(&p, o, "", "n_positions", 1, 1 << 20, &m->block_size, &have[4]), res,
                  out);
    static const char *names[5] = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions"};
    for (int i = 0; i < 5; i++)
        if (!have[i]) {
            res = zs_error(ZS_ERR_FORMAT, "%s: key \"%s\" is missing", path, names[i]);
            goto out;
        }
    if (m->n_embd % m->n_head != 0) {
        res = zs_error(ZS_ERR_FORMAT, "%s: n_embd %d is not a multiple of n_head %d", path,
                       m->n_embd, m->n_head);
        goto out;
    }
    const char *act = NULL;
    ZS_CHECK_GOTO(get_str(&p, o, "", "activation_function", &act), res, out);
    if (act && strcmp(act, "gelu_new") != 0) {
        res = zs_error(ZS_ERR_FORMAT,
                       "%s: activation_function \"%s\" is not supported "
                       "(zshard computes gelu_new)",
                       path, act);
        goto out;
    }
    json_t *inner = json_object_get(o, "n_inner");
    if (inner && !json_is_null(inner) &&
        !(json_is_integer(inner) && json_integer_value(inner) == 4 * m->n_embd)) {
        res = zs_error(ZS_ERR_FORMAT, "%s: n_inner must be null or 4 * n_embd = %d", path,
                       4 * m->n_embd);
        goto out;
    }
out:
    json_decref(o);
    return res;
}
