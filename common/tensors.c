#include "common/tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

static const char *block_names[ZS_BLOCK_TENSORS] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};

static size_t align_up(size_t x)
{
    return (x + ZS_TENSOR_ALIGN - 1) / ZS_TENSOR_ALIGN * ZS_TENSOR_ALIGN;
}

/* Appends a tensor at the next aligned offset. */
static void add(zs_tensor_table *tt, size_t *cursor, const char *name, zs_tensor_kind kind,
                int layer, int ndim, size_t d0, size_t d1)
{
    zs_tensor *t = &tt->tensors[tt->count++];
    snprintf(t->name, sizeof t->name, "transformer.%s", name);
    t->kind = kind;
    t->layer = layer;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->numel = ndim > 1 ? d0 * d1 : d0;
    t->offset = *cursor;
    t->decay = ndim >= 2;
    *cursor = align_up(*cursor + t->numel);
    tt->n_params += t->numel;
}

zs_err zs_tensors_gpt2(const zs_model_config *m, zs_tensor_table *tt)
{
    memset(tt, 0, sizeof *tt);
    if (m->n_layer <= 0 || m->n_embd <= 0 || m->vocab_size <= 0 || m->block_size <= 0 ||
        m->n_head <= 0 || m->n_embd % m->n_head != 0)
        return zs_error(ZS_ERR_INVALID,
                        "tensor table: bad model shape (n_layer %d, n_head %d, "
                        "n_embd %d, vocab_size %d, block_size %d)",
                        m->n_layer, m->n_head, m->n_embd, m->vocab_size, m->block_size);
    int L = m->n_layer;
    size_t C = (size_t)m->n_embd;
    tt->n_layers = L + 2;
    tt->tensors = calloc((size_t)(2 + ZS_BLOCK_TENSORS * L + 2), sizeof *tt->tensors);
    tt->layer_begin = calloc((size_t)tt->n_layers + 1, sizeof *tt->layer_begin);
    if (!tt->tensors || !tt->layer_begin) {
        zs_tensors_free(tt);
        return zs_error(ZS_ERR_NOMEM, "tensor table: out of memory for %d layers", L);
    }
    size_t cur = 0;
    tt->layer_begin[0] = 0;
    add(tt, &cur, "wte.weight", ZS_T_WTE, 0, 2, (size_t)m->vocab_size, C);
    add(tt, &cur, "wpe.weight", ZS_T_WPE, 0, 2, (size_t)m->block_size, C);
    /* Per block: shapes in HF Conv1D layout [in, out]. */
    const size_t dims[ZS_BLOCK_TENSORS][2] = {
        {C, 0}, {C, 0}, {C, 3 * C}, {3 * C, 0}, {C, C},     {C, 0},
        {C, 0}, {C, 0}, {C, 4 * C}, {4 * C, 0}, {4 * C, C}, {C, 0},
    };
    for (int l = 0; l < L; l++) {
        tt->layer_begin[l + 1] = cur;
        for (int k = 0; k < ZS_BLOCK_TENSORS; k++) {
            char name[ZS_TENSOR_NAME_MAX];
            snprintf(name, sizeof name, "h.%d.%s", l, block_names[k]);
            add(tt, &cur, name, (zs_tensor_kind)(ZS_T_LN1_W + k), l + 1, dims[k][1] ? 2 : 1,
                dims[k][0], dims[k][1]);
        }
    }
    tt->layer_begin[L + 1] = cur;
    add(tt, &cur, "ln_f.weight", ZS_T_LNF_W, L + 1, 1, C, 0);
    add(tt, &cur, "ln_f.bias", ZS_T_LNF_B, L + 1, 1, C, 0);
    tt->layer_begin[L + 2] = cur;
    tt->total = cur;
    return ZS_OK;
}

void zs_tensors_free(zs_tensor_table *tt)
{
    free(tt->tensors);
    free(tt->layer_begin);
    memset(tt, 0, sizeof *tt);
}

const zs_tensor *zs_tensors_find(const zs_tensor_table *tt, const char *name)
{
    const char *prefix = "transformer.";
    size_t plen = strlen(prefix);
    for (int i = 0; i < tt->count; i++) {
        const char *n = tt->tensors[i].name;
        if (strcmp(n, name) == 0 || strcmp(n + plen, name) == 0)
            return &tt->tensors[i];
    }
    return NULL;
}

const zs_tensor *zs_tensors_get(const zs_tensor_table *tt, int block, zs_tensor_kind kind)
{
    int L = tt->n_layers - 2;
    switch (kind) {
    case ZS_T_WTE:
        return &tt->tensors[0];
    case ZS_T_WPE:
        return &tt->tensors[1];
    case ZS_T_LNF_W:
        return &tt->tensors[2 + ZS_BLOCK_TENSORS * L];
    case ZS_T_LNF_B:
        return &tt->tensors[2 + ZS_BLOCK_TENSORS * L + 1];
    default:
        if (block < 0 || block >= L)
            return NULL;
        return &tt->tensors[2 + ZS_BLOCK_TENSORS * block + (kind - ZS_T_LN1_W)];
    }
}

zs_err zs_tensors_spans(const zs_tensor_table *tt, size_t begin, size_t end, zs_tensor_span_fn fn,
                        void *ctx)
{
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        size_t b = t->offset > begin ? t->offset : begin;
        size_t e = t->offset + t->numel < end ? t->offset + t->numel : end;
        if (b < e)
            ZS_CHECK(fn(ctx, b, e, t));
    }
    return ZS_OK;
}

void zs_tensors_init_gpt2(const zs_tensor_table *tt, uint64_t seed, float *dst, size_t begin,
                          size_t end)
{
    memset(dst, 0, (end - begin) * sizeof *dst);
    int L = tt->n_layers - 2;
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        size_t b = t->offset > begin ? t->offset : begin;
        size_t e = t->offset + t->numel < end ? t->offset + t->numel : end;
        if (b >= e)
            continue;
        float *out = dst + (b - begin);
        switch (t->kind) {
        case ZS_T_LN1_W:
        case ZS_T_LN2_W:
        case ZS_T_LNF_W:
            for (size_t j = b; j < e; j++)
                *out++ = 1.0f;
            break;
        case ZS_T_WTE:
        case ZS_T_WPE:
        case ZS_T_QKV_W:
        case ZS_T_ATTPROJ_W:
        case ZS_T_FC_W:
        case ZS_T_FCPROJ_W: {
            double std = 0.02;
            if (t->kind == ZS_T_ATTPROJ_W || t->kind == ZS_T_FCPROJ_W)
                std = 0.02 / sqrt(2.0 * L);
/* The stream is the tensor's index so that indices restart per tensor.  Small
 * pieces stay on this thread: a parallel region per piece of a small shard costs
 * more than the piece (and much more when the cores are busy). */
#pragma omp parallel for schedule(static) if (e - b >= 65536)
            for (size_t j = b; j < e; j++)
                out[j - b] = (float)(std * zs_rng_normal(seed, (uint64_t)i, j - t->offset));
            break;
        }
        default:
            break; /* biases: 0 */
        }
    }
}
