/*
 * modelfile: model directories round trip; HF checkpoints load with or without the
 * "transformer." prefix, with attn.bias / attn.masked_bias buffers and a tied lm_head.weight;
 * missing tensors, wrong shapes and foreign tensors are refused by name, and so is a NaN or an
 * infinity in any tensor (with the element).
 */
#include <stdlib.h>
#include <unistd.h>

#include "common/modelfile.h"
#include "common/safetensors.h"
#include "tests/unit/test.h"

static char dir[] = "/tmp/zs_test_modelfile_XXXXXX";
static const zs_model_config model = {
    .n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 13, .block_size = 6};

/* Writes the table's tensors from params under their names minus the prefix (strip), plus
 * the extra tensors HF checkpoints carry; `skip` names one tensor to leave out, `bad_shape`
 * one to write with a wrong shape, `foreign` adds an unknown tensor. */
/* What write_hf stores in the attn.bias / attn.masked_bias buffers (and the foreign tensor). */
static float buffer[6 * 6];

static void write_hf(const char *path, const zs_tensor_table *tt, const float *params, int strip,
                     const char *skip, const char *bad_shape, int foreign)
{
    zs_st_tensor ts[64];
    char names[64][96];
    int n = 0;
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        const char *name = strip ? t->name + strlen("transformer.") : t->name;
        if (skip && strcmp(name, skip) == 0)
            continue;
        snprintf(names[n], sizeof names[n], "%s", name);
        ts[n] = (zs_st_tensor){
            .name = names[n], .dtype = ZS_DT_F32, .ndim = t->ndim, .data = params + t->offset};
        for (int d = 0; d < t->ndim; d++)
            ts[n].shape[d] = t->shape[d];
        if (bad_shape && strcmp(name, bad_shape) == 0)
            ts[n].shape[0] = 1, ts[n].ndim = 1;
        n++;
    }
    for (int l = 0; l < 2; l++) {
        snprintf(names[n], sizeof names[n], "%sh.%d.attn.bias", strip ? "" : "transformer.", l);
        ts[n] = (zs_st_tensor){
            .name = names[n], .dtype = ZS_DT_F32, .ndim = 2, .shape = {6, 6}, .data = buffer};
        n++;
        snprintf(names[n], sizeof names[n], "%sh.%d.attn.masked_bias", strip ? "" : "transformer.",
                 l);
        ts[n] = (zs_st_tensor){.name = names[n], .dtype = ZS_DT_F32, .ndim = 0, .data = buffer};
        n++;
    }
    const zs_tensor *wte = zs_tensors_get(tt, 0, ZS_T_WTE);
    ts[n++] = (zs_st_tensor){.name = "lm_head.weight",
                             .dtype = ZS_DT_F32,
                             .ndim = 2,
                             .shape = {wte->shape[0], wte->shape[1]},
                             .data = params + wte->offset};
    if (foreign)
        ts[n++] = (zs_st_tensor){
            .name = "h.0.mlp.extra", .dtype = ZS_DT_F32, .ndim = 1, .shape = {3}, .data = buffer};
    CHECK_OK(zs_st_write(path, ts, n, NULL, 0));
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);
    zs_tensor_table tt;
    CHECK_OK(zs_tensors_gpt2(&model, &tt));
    float *params = malloc(tt.total * sizeof *params), *back = malloc(tt.total * sizeof *back);
    zs_tensors_init_gpt2(&tt, 77, params, 0, tt.total);

    /* zshard's own directory format round trips bit for bit. */
    CHECK_OK(zs_modelfile_save(&tt, &model, params, dir));
    zs_model_config m2;
    zs_tensor_table tt2;
    float *loaded = NULL;
    CHECK_OK(zs_modelfile_load(dir, &m2, &tt2, &loaded));
    CHECK(m2.n_layer == 2 && m2.vocab_size == 13 && m2.block_size == 6);
    CHECK(loaded && memcmp(loaded, params, tt.total * sizeof *params) == 0);
    free(loaded);
    zs_tensors_free(&tt2);

    char path[256];
    snprintf(path, sizeof path, "%s/hf.safetensors", dir);
    for (int strip = 0; strip <= 1; strip++) {
        write_hf(path, &tt, params, strip, NULL, NULL, 0);
        memset(back, 0x7f, tt.total * sizeof *back);
        CHECK_OK(zs_modelfile_load_weights(&tt, path, back));
        CHECK(memcmp(back, params, tt.total * sizeof *params) == 0);
    }
    write_hf(path, &tt, params, 1, "h.1.ln_2.bias", NULL, 0);
    CHECK_FAILS_WITH(zs_modelfile_load_weights(&tt, path, back),
                     "tensor \"transformer.h.1.ln_2.bias\" is missing");
    write_hf(path, &tt, params, 1, NULL, "h.0.mlp.c_fc.weight", 0);
    CHECK_FAILS_WITH(zs_modelfile_load_weights(&tt, path, back),
                     "\"h.0.mlp.c_fc.weight\" has shape [1], the config needs [8,32]");
    write_hf(path, &tt, params, 1, NULL, NULL, 1);
    CHECK_FAILS_WITH(zs_modelfile_load_weights(&tt, path, back),
                     "\"h.0.mlp.extra\" is not part of this model");

    /* Non-finite values: the tensor as the file names it, what the value is, and where. */
    const zs_tensor *qkv = zs_tensors_get(&tt, 1, ZS_T_QKV_W);
    float saved = params[qkv->offset + 37];
    params[qkv->offset + 37] = NAN;
    write_hf(path, &tt, params, 0, NULL, NULL, 0);
    CHECK_FAILS_WITH(zs_modelfile_load_weights(&tt, path, back),
                     "tensor \"transformer.h.1.attn.c_attn.weight\" has a non-finite value (nan) "
                     "at element 37");
    CHECK_FAILS_WITH(zs_modelfile_load_weights(&tt, path, back), path);
    params[qkv->offset + 37] = saved;
    const zs_tensor *lnf = zs_tensors_get(&tt, model.n_layer + 1, ZS_T_LNF_B);
    params[lnf->offset + lnf->numel - 1] = -INFINITY;
    write_hf(path, &tt, params, 1, NULL, NULL, 0);
    CHECK_FAILS_WITH(zs_modelfile_load_weights(&tt, path, back),
                     "tensor \"ln_f.bias\" has a non-finite value (-inf) at element 7");
    params[lnf->offset + lnf->numel - 1] = 0.0f;
    /* A model directory (zs_modelfile_load, as `zshard eval` reads one) is checked alike; an
     * infinity in the first element of wte. */
    const zs_tensor *wte = zs_tensors_get(&tt, 0, ZS_T_WTE);
    saved = params[wte->offset];
    params[wte->offset] = INFINITY;
    CHECK_OK(zs_modelfile_save(&tt, &model, params, dir));
    loaded = NULL;
    CHECK_FAILS_WITH(zs_modelfile_load(dir, &m2, &tt2, &loaded),
                     "tensor \"transformer.wte.weight\" has a non-finite value (inf) at element 0");
    CHECK(loaded == NULL);
    params[wte->offset] = saved;
    /* The HF buffers that are not parameters may hold anything (a mask, -inf): not read. */
    for (int i = 0; i < 6 * 6; i++)
        buffer[i] = i % 2 ? -INFINITY : NAN;
    write_hf(path, &tt, params, 1, NULL, NULL, 0);
    CHECK_OK(zs_modelfile_load_weights(&tt, path, back));
    CHECK(memcmp(back, params, tt.total * sizeof *params) == 0);

    free(params);
    free(back);
    zs_tensors_free(&tt);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return zs_test_result("test_modelfile");
}
