/*
 * gpt2_layout: tensor offsets, gradient gaps and the activations' layout (gpt2_layout.h).
 */
#include "kernels/gpt2_layout.h"

#include <stdlib.h>
#include <string.h>

static zs_err check_tensor(const zs_tensor_table *tt, int block, zs_tensor_kind kind, size_t numel,
                           size_t *offset)
{
    const zs_tensor *t = zs_tensors_get(tt, block, kind);
    if (!t)
        return zs_error(ZS_ERR_INVALID, "gpt2: tensor table has no tensor of kind %d in block %d",
                        (int)kind, block);
    if (t->numel != numel || t->offset + t->numel > tt->total)
        return zs_error(ZS_ERR_INVALID,
                        "gpt2: tensor %s has %zu floats at offset %zu, expected "
                        "%zu within %zu",
                        t->name, t->numel, t->offset, numel, tt->total);
    *offset = t->offset;
    return ZS_OK;
}

zs_err zs_gpt2_offsets_init(zs_gpt2_offsets *o, const zs_model_config *cfg,
                            const zs_tensor_table *tt)
{
    memset(o, 0, sizeof *o);
    size_t L = (size_t)cfg->n_layer, C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size;
    o->blk = calloc(L * ZS_BLOCK_TENSORS, sizeof *o->blk);
    o->spans = calloc((size_t)tt->count, sizeof *o->spans);
    o->layer_begin = calloc(L + 3, sizeof *o->layer_begin);
    if (!o->blk || !o->spans || !o->layer_begin) {
        zs_gpt2_offsets_free(o);
        return zs_error(ZS_ERR_NOMEM, "gpt2: out of memory for the tensor offsets");
    }
    zs_err err;
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_WTE, V * C, &o->wte), err, fail);
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_WPE, (size_t)cfg->block_size * C, &o->wpe), err, fail);
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_LNF_W, C, &o->lnf_w), err, fail);
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_LNF_B, C, &o->lnf_b), err, fail);
    const size_t block_numel[ZS_BLOCK_TENSORS] = {
        C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C,
    };
    for (int l = 0; l < cfg->n_layer; l++)
        for (int k = 0; k < ZS_BLOCK_TENSORS; k++)
            ZS_CHECK_GOTO(check_tensor(tt, l, (zs_tensor_kind)(ZS_T_LN1_W + k), block_numel[k],
                                       &o->blk[(size_t)l * ZS_BLOCK_TENSORS + k]),
                          err, fail);
    for (int i = 0; i < tt->count; i++)
        o->spans[i] =
            (zs_gpt2_span){tt->tensors[i].offset, tt->tensors[i].numel, tt->tensors[i].layer};
    o->n_spans = tt->count;
    memcpy(o->layer_begin, tt->layer_begin, (L + 3) * sizeof *o->layer_begin);
    return ZS_OK;
fail:
    zs_gpt2_offsets_free(o);
    return err;
}

void zs_gpt2_offsets_free(zs_gpt2_offsets *o)
{
    free(o->blk);
    free(o->spans);
    free(o->layer_begin);
    memset(o, 0, sizeof *o);
}

zs_err zs_gpt2_gaps(const zs_gpt2_offsets *o, int layer,
                    zs_err (*gap)(void *ctx, size_t begin, size_t floats), void *ctx)
{
    size_t at = o->layer_begin[layer];
    for (int i = 0; i < o->n_spans; i++) {
        const zs_gpt2_span *s = &o->spans[i];
        if (s->layer != layer)
            continue;
        if (s->offset > at)
            ZS_CHECK(gap(ctx, at, s->offset - at));
        at = s->offset + s->numel;
    }
    if (o->layer_begin[layer + 1] > at)
        ZS_CHECK(gap(ctx, at, o->layer_begin[layer + 1] - at));
    return ZS_OK;
}

size_t zs_gpt2_acts_layout_for(zs_gpt2_acts *a, char *base, size_t align,
                               const zs_model_config *cfg, int max_b, int max_t,
                               zs_gpt2_att_saved saved, unsigned without)
{
    size_t L = (size_t)cfg->n_layer, C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size;
    size_t NH = (size_t)cfg->n_head, N = (size_t)max_b * (size_t)max_t, T = (size_t)max_t;
    /* Exactly one of the two is non-zero.  An array of 0 floats takes 0 bytes, so the PROBS
     * layout is the one the CPU model has always had. */
    size_t att = saved == ZS_GPT2_ATT_PROBS ? (size_t)max_b * NH * T * T : 0;
    size_t rows = saved == ZS_GPT2_ATT_LSE ? (size_t)max_b * NH * T : 0;
    struct {
        float **p;
        size_t n;
    } parts[] = {
        {&a->resid, (L + 1) * N * C},
        {&a->ln1, L * N * C},
        {&a->ln1_mean, L * N},
        {&a->ln1_rstd, L * N},
        {&a->qkv, L * N * 3 * C},
        {&a->att, L * att},
        {&a->lse, L * rows},
        {&a->atty, L * N * C},
        {&a->res2, L * N * C},
        {&a->ln2, L * N * C},
        {&a->ln2_mean, L * N},
        {&a->ln2_rstd, L * N},
        {&a->fch, L * N * 4 * C},
        {&a->fch_gelu, L * N * 4 * C},
        {&a->lnf, N * C},
        {&a->lnf_mean, N},
        {&a->lnf_rstd, N},
        {&a->proj, N * C},
        {&a->logits, N * V},
        {&a->losses, N},
        {&a->dres, N * C},
        {&a->dln, N * C},
        {&a->dbig, N * 4 * C},
        {&a->datt, att},
        {&a->delta, rows},
    };
    float **dropped[] = {
        without & ZS_ACTS_LN1 ? &a->ln1 : NULL, without & ZS_ACTS_LN2 ? &a->ln2 : NULL,
        without & ZS_ACTS_FCH ? &a->fch : NULL, without & ZS_ACTS_FCH_GELU ? &a->fch_gelu : NULL,
        without & ZS_ACTS_LNF ? &a->lnf : NULL};
    size_t at = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        int drop = 0;
        for (size_t k = 0; k < sizeof dropped / sizeof dropped[0]; k++)
            drop |= dropped[k] == parts[i].p;
        if (drop) {
            *parts[i].p = NULL;
            continue;
        }
        if (base)
            *parts[i].p = parts[i].n ? (float *)(void *)(base + at) : NULL;
        at += (parts[i].n * sizeof(float) + align - 1) & ~(align - 1);
    }
    if (base)
        a->saved = saved;
    return at;
}

size_t zs_gpt2_acts_layout(zs_gpt2_acts *a, char *base, size_t align, const zs_model_config *cfg,
                           int max_b, int max_t)
{
    return zs_gpt2_acts_layout_for(a, base, align, cfg, max_b, max_t, ZS_GPT2_ATT_PROBS, 0);
}

/* p + off, or NULL for an array the layout left out (zs_gpt2_acts_layout_for's without). */
static float *slice(float *p, size_t off)
{
    return p ? p + off : NULL;
}

zs_gpt2_block_acts zs_gpt2_block_slices(const zs_gpt2_acts *a, const zs_model_config *cfg,
                                        int max_b, int max_t, int l)
{
    const size_t Nn = (size_t)max_b * (size_t)max_t, NC = Nn * (size_t)cfg->n_embd;
    const size_t rows = (size_t)max_b * (size_t)cfg->n_head * (size_t)max_t;
    const size_t att = rows * (size_t)max_t;
    const int probs = a->saved == ZS_GPT2_ATT_PROBS;
    return (zs_gpt2_block_acts){.resid = a->resid + l * NC,
                                .ln1 = slice(a->ln1, l * NC),
                                .ln1_mean = a->ln1_mean + l * Nn,
                                .ln1_rstd = a->ln1_rstd + l * Nn,
                                .qkv = a->qkv + l * 3 * NC,
                                .att = probs ? a->att + l * att : NULL,
                                .lse = probs ? NULL : a->lse + l * rows,
                                .atty = a->atty + l * NC,
                                .res2 = a->res2 + l * NC,
                                .ln2 = slice(a->ln2, l * NC),
                                .ln2_mean = a->ln2_mean + l * Nn,
                                .ln2_rstd = a->ln2_rstd + l * Nn,
                                .fch = slice(a->fch, l * 4 * NC),
                                .gelu = slice(a->fch_gelu, l * 4 * NC)};
}
