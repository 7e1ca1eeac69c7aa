#include "common/modelfile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/safetensors.h"

zs_err zs_modelfile_save(const zs_tensor_table *tt, const zs_model_config *model,
                         const float *params, const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return zs_error(ZS_ERR_IO, "model directory %s: %s", dir, strerror(errno));
    zs_st_tensor *ts = calloc((size_t)tt->count, sizeof *ts);
    if (!ts)
        return zs_error(ZS_ERR_NOMEM, "model %s: out of memory", dir);
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        ts[i].name = t->name;
        ts[i].dtype = ZS_DT_F32;
        ts[i].ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++)
            ts[i].shape[d] = t->shape[d];
        ts[i].data = params + t->offset;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    zs_err res = zs_st_write(path, ts, tt->count, zs_st_model_meta, ZS_ST_MODEL_N_META);
    free(ts);
    ZS_CHECK(res);
    snprintf(path, sizeof path, "%s/config.json", dir);
    return zs_config_write_hf(model, path);
}

/* Buffers that HF checkpoints carry but that are not parameters. */
static int ignored_name(const char *name)
{
    size_t n = strlen(name);
    static const char *const suffixes[] = {".attn.bias", ".attn.masked_bias"};
    for (int i = 0; i < 2; i++) {
        size_t s = strlen(suffixes[i]);
        if (n >= s && strcmp(name + n - s, suffixes[i]) == 0)
            return 1;
    }
    return strcmp(name, "lm_head.weight") == 0;
}

/* A NaN or an infinity in the starting weights would make every step's gradient non-finite
 * (each one skipped, so the run would train nothing) or poison the weights: refuse it at load,
 * naming the tensor as the file names it and the first bad element (row-major index). */
static zs_err check_finite(const char *path, const char *name, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return zs_error(ZS_ERR_FORMAT,
                            "%s: tensor \"%s\" has a non-finite value (%s) at element %zu", path,
                            name,
                            isnan(x[i]) ? "nan"
                            : x[i] > 0  ? "inf"
                                        : "-inf",
                            i);
    return ZS_OK;
}

zs_err zs_modelfile_load_weights(const zs_tensor_table *tt, const char *path, float *params)
{
    zs_st_file f;
    ZS_CHECK(zs_st_open(path, &f));
    zs_err res = ZS_OK;
    char *seen = calloc((size_t)tt->count, 1);
    if (!seen) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    memset(params, 0, tt->total * sizeof *params);
    for (int i = 0; i < f.count; i++) {
        const zs_st_entry *e = &f.entries[i];
        if (ignored_name(e->name))
            continue;
        const zs_tensor *t = zs_tensors_find(tt, e->name);
        if (!t) {
            res = zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\" is not part of this model", path,
                           e->name);
            goto out;
        }
        int idx = (int)(t - tt->tensors);
        if (seen[idx]) {
            res = zs_error(ZS_ERR_FORMAT,
                           "%s: tensor \"%s\" appears twice (with and without "
                           "the transformer. prefix)",
                           path, t->name);
            goto out;
        }
        int same = e->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = e->shape[d] == t->shape[d];
        if (!same) {
            char got[128] = "", want[128] = "";
            for (int d = 0; d < e->ndim; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%zu", d ? "," : "",
                         e->shape[d]);
            for (int d = 0; d < t->ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%zu", d ? "," : "",
                         t->shape[d]);
            res = zs_error(ZS_ERR_FORMAT,
                           "%s: tensor \"%s\" has shape [%s], the config needs "
                           "[%s]",
                           path, e->name, got, want);
            goto out;
        }
        ZS_CHECK_GOTO(zs_st_read_f32(&f, e, params + t->offset, t->numel), res, out);
        ZS_CHECK_GOTO(check_finite(path, e->name, params + t->offset, t->numel), res, out);
        seen[idx] = 1;
    }
    for (int i = 0; i < tt->count; i++)
        if (!seen[i]) {
            res =
                zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\" is missing", path, tt->tensors[i].name);
            goto out;
        }
out:
    free(seen);
    zs_st_close(&f);
    return res;
}

zs_err zs_modelfile_load(const char *dir, zs_model_config *model, zs_tensor_table *tt,
                         float **params)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ZS_CHECK(zs_config_read_hf(path, model));
    ZS_CHECK(zs_tensors_gpt2(model, tt));
    *params = malloc(tt->total * sizeof **params);
    if (!*params) {
        zs_tensors_free(tt);
        return zs_error(ZS_ERR_NOMEM, "model %s: out of memory for %zu parameters", dir, tt->total);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    zs_err res = zs_modelfile_load_weights(tt, path, *params);
    if (res != ZS_OK) {
        free(*params);
        *params = NULL;
        zs_tensors_free(tt);
    }
    return res;
}
