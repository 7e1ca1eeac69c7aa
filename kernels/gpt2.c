/*
 * gpt2: GPT-2's forward and backward composed from the CPU kernels in kernels/kernels.h.
 *
 * One forward, for N = b*t positions and L blocks (l = 0..L-1 here, io layer l+1):
 *
 *   resid[0] = wte[inputs] + wpe                                  encoder
 *   block l:  ln1    = LN(resid[l])              (for l > 0 fused with the residual add
 *                                                 resid[l] = res2[l-1] + proj that ends
 *                                                 block l-1)
 *             qkv    = ln1 Wqkv + b;  atty = attention(qkv)
 *             proj   = atty Wap + b
 *             res2   = resid[l] + proj;  ln2 = LN(res2)           fused
 *             fch    = ln2 Wfc + b;  gelu = GELU(fch)             bias fused into GELU
 *             proj   = gelu Wfp + b                                (added by the next LN)
 *   final:    resid[L] = res2[L-1] + proj;  lnf = LN(resid[L])    fused
 *             logits = lnf wte^T;  loss, dlogits = softmax + cross-entropy  fused
 *
 * Each c_proj output carries its bias (sgemm adds into a bias-initialized output) and waits
 * in `proj` for the LayerNorm that adds it to the residual stream.  That is what lets the
 * residual add of one block be fused with the first LayerNorm of the next although the io
 * releases block l before acquiring block l+1: the add needs only activations, never
 * block l's parameters.
 *
 * The backward walks the same path in reverse with one residual-gradient buffer `dres` that
 * each LayerNorm backward adds into, and three scratch buffers reused by every layer.  Every
 * parameter gradient is written exactly once ("="), except wte, which lm_head writes and the
 * encoder then adds to.  Every float of a layer's gradient range is written, the padding
 * between tensors as 0 and the wpe rows at and beyond t as 0, so a gradient buffer never
 * carries garbage to an optimizer or over the network.
 *
 * Memory: the activations for max_b x max_t positions take about
 * L (16 N C + B NH T^2) + N V floats (GPT-2 124M at 4 x 64: ~220 MB), allocated once.
 *
 * The io calls follow the order documented in gpt2.h.  When an io call fails, the model
 * releases every layer it still holds (a block it was working on, then L+1, then 0) and
 * returns the failure; the step must then start again from the forward.
 */
#include "kernels/gpt2.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* Activations of one forward, sized for max_b x max_t positions; a forward over b x t uses
 * the first N = b*t rows of each (L, ...) slice.  T below is the forward's t. */
typedef struct {
    float *resid;    /* (L+1, N, C) residual stream: [0] embeddings, [l+1] output of block l */
    float *ln1;      /* (L, N, C) */
    float *ln1_mean; /* (L, N) */
    float *ln1_rstd; /* (L, N) */
    float *qkv;      /* (L, N, 3C) c_attn output: q, k, v */
    float *att;      /* (L, B, NH, T, T) attention probabilities, 0 above the diagonal */
    float *atty;     /* (L, N, C) attention output, heads merged */
    float *res2;     /* (L, N, C) residual stream after the attention branch */
    float *ln2;      /* (L, N, C) */
    float *ln2_mean; /* (L, N) */
    float *ln2_rstd; /* (L, N) */
    float *fch;      /* (L, N, 4C) c_fc output plus bias: the GELU input */
    float *fch_gelu; /* (L, N, 4C) */
    float *lnf;      /* (N, C) */
    float *lnf_mean; /* (N) */
    float *lnf_rstd; /* (N) */
    float *proj;     /* (N, C) a c_proj output (bias included) before its residual add */
    float *logits;   /* (N, V) logits; dlogits once the forward has run */
    float *losses;   /* (N) cross-entropy per position */
    /* Backward scratch, shared by all layers. */
    float *dres; /* (N, C) gradient of the residual stream */
    float *dln;  /* (N, C) gradient of a LayerNorm output, or of atty */
    float *dbig; /* (N, 4C) gradient of fch_gelu / fch, or (N, 3C) of qkv */
    float *datt; /* (B, NH, T, T) gradient of the attention scores */
} gpt2_acts;

typedef struct {
    size_t offset, numel;
    int layer;
} tensor_span;

struct zs_gpt2 {
    int L, C, NH, V, maxT; /* maxT: block_size, the rows of wpe */
    int max_b, max_t;
    int threads;
    /* Offsets (floats) of the tensors in the flat vector. */
    size_t wte, wpe, lnf_w, lnf_b;
    size_t *blk;        /* (L, ZS_BLOCK_TENSORS): kind ZS_T_LN1_W + k of block l */
    tensor_span *spans; /* every tensor, in vector order, to zero the gaps of gradients */
    int n_spans;
    size_t *layer_begin; /* (L + 3) */
    float *mem;          /* one allocation for all activations */
    gpt2_acts a;
    int32_t *inputs; /* (max_b, max_t) the last forward's inputs, for the encoder backward */
    /* Between a forward and its backward/finish: */
    int pending; /* layers 0 and L+1 are held */
    int b, t;
    const float *p0, *pf; /* bases of layers 0 and L+1 */
};

/* ---- setup ------------------------------------------------------------------------------ */

/* Rounds a float count up to a 64-byte boundary so that every array starts on a cache line. */
static size_t round16(size_t n)
{
    return (n + 15) / 16 * 16;
}

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

/* The activations' layout, in the order of gpt2_acts, each part rounded to 16 floats: with
 * base, points a's arrays into base; returns the floats it takes (or would take). */
static size_t acts_layout(gpt2_acts *a, float *base, size_t L, size_t C, size_t V, size_t NH,
                          size_t max_b, size_t max_t)
{
    size_t N = max_b * max_t, T = max_t;
    size_t att = max_b * NH * T * T;
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
    };
    size_t at = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (base)
            *parts[i].p = base + at;
        at += round16(parts[i].n);
    }
    return at;
}

size_t zs_gpt2_activation_bytes(const zs_model_config *cfg, int max_b, int max_t)
{
    gpt2_acts a;
    return sizeof(float) * acts_layout(&a, NULL, (size_t)cfg->n_layer, (size_t)cfg->n_embd,
                                       (size_t)cfg->vocab_size, (size_t)cfg->n_head, (size_t)max_b,
                                       (size_t)max_t);
}

zs_err zs_gpt2_create(const zs_model_config *cfg, const zs_tensor_table *tt, int max_b, int max_t,
                      int threads, zs_gpt2 **out)
{
    *out = NULL;
    if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 || cfg->vocab_size <= 0 ||
        cfg->block_size <= 0 || cfg->n_embd % cfg->n_head != 0)
        return zs_error(ZS_ERR_INVALID,
                        "gpt2: bad model shape (n_layer %d, n_head %d, n_embd "
                        "%d, vocab_size %d, block_size %d)",
                        cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->block_size);
    if (max_b < 1)
        return zs_error(ZS_ERR_INVALID, "gpt2: max_b %d, expected >= 1", max_b);
    if (max_t < 1 || max_t > cfg->block_size)
        return zs_error(ZS_ERR_INVALID, "gpt2: max_t %d, expected 1..%d (block_size)", max_t,
                        cfg->block_size);
    if (threads < 0)
        return zs_error(ZS_ERR_INVALID, "gpt2: threads %d, expected >= 0", threads);
    if (tt->n_layers != cfg->n_layer + 2)
        return zs_error(ZS_ERR_INVALID, "gpt2: tensor table has %d layers, expected %d",
                        tt->n_layers, cfg->n_layer + 2);

    zs_gpt2 *m = calloc(1, sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "gpt2: out of memory for the model");
    zs_err err = ZS_OK;
    m->L = cfg->n_layer;
    m->C = cfg->n_embd;
    m->NH = cfg->n_head;
    m->V = cfg->vocab_size;
    m->maxT = cfg->block_size;
    m->max_b = max_b;
    m->max_t = max_t;
    m->threads = zs_kernel_threads(threads);
    size_t L = (size_t)m->L, C = (size_t)m->C, V = (size_t)m->V;

    /* Tensor offsets, checked against the shapes the config implies. */
    m->blk = calloc(L * ZS_BLOCK_TENSORS, sizeof *m->blk);
    m->spans = calloc((size_t)tt->count, sizeof *m->spans);
    m->layer_begin = calloc(L + 3, sizeof *m->layer_begin);
    m->inputs = calloc((size_t)max_b * max_t, sizeof *m->inputs);
    if (!m->blk || !m->spans || !m->layer_begin || !m->inputs) {
        err = zs_error(ZS_ERR_NOMEM, "gpt2: out of memory for the tensor offsets");
        goto fail;
    }
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_WTE, V * C, &m->wte), err, fail);
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_WPE, (size_t)m->maxT * C, &m->wpe), err, fail);
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_LNF_W, C, &m->lnf_w), err, fail);
    ZS_CHECK_GOTO(check_tensor(tt, 0, ZS_T_LNF_B, C, &m->lnf_b), err, fail);
    const size_t block_numel[ZS_BLOCK_TENSORS] = {
        C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C,
    };
    for (int l = 0; l < m->L; l++)
        for (int k = 0; k < ZS_BLOCK_TENSORS; k++)
            ZS_CHECK_GOTO(check_tensor(tt, l, (zs_tensor_kind)(ZS_T_LN1_W + k), block_numel[k],
                                       &m->blk[(size_t)l * ZS_BLOCK_TENSORS + k]),
                          err, fail);
    for (int i = 0; i < tt->count; i++) {
        m->spans[i].offset = tt->tensors[i].offset;
        m->spans[i].numel = tt->tensors[i].numel;
        m->spans[i].layer = tt->tensors[i].layer;
    }
    m->n_spans = tt->count;
    memcpy(m->layer_begin, tt->layer_begin, (L + 3) * sizeof *m->layer_begin);

    /* Activations: one allocation, carved in the order of gpt2_acts. */
    size_t total = acts_layout(&m->a, NULL, L, C, V, (size_t)m->NH, (size_t)max_b, (size_t)max_t);
    void *mem = NULL;
    if (posix_memalign(&mem, 64, total * sizeof(float)) != 0) {
        err = zs_error(ZS_ERR_NOMEM, "gpt2: out of memory for %zu MiB of activations",
                       total * sizeof(float) >> 20);
        goto fail;
    }
    m->mem = mem;
    acts_layout(&m->a, m->mem, L, C, V, (size_t)m->NH, (size_t)max_b, (size_t)max_t);
    *out = m;
    return ZS_OK;

fail:
    zs_gpt2_free(m);
    return err;
}

void zs_gpt2_free(zs_gpt2 *m)
{
    if (!m)
        return;
    free(m->mem);
    free(m->inputs);
    free(m->layer_begin);
    free(m->spans);
    free(m->blk);
    free(m);
}

/* Zeroes the parts of layer's gradient range [layer_begin, layer_end) that no tensor covers. */
static void zero_padding(const zs_gpt2 *m, int layer, float *base)
{
    size_t at = m->layer_begin[layer];
    for (int i = 0; i < m->n_spans; i++) {
        const tensor_span *s = &m->spans[i];
        if (s->layer != layer)
            continue;
        if (s->offset > at)
            memset(base + at, 0, (s->offset - at) * sizeof *base);
        at = s->offset + s->numel;
    }
    if (m->layer_begin[layer + 1] > at)
        memset(base + at, 0, (m->layer_begin[layer + 1] - at) * sizeof *base);
}

/* ---- forward ---------------------------------------------------------------------------- */

static zs_err check_tokens(const zs_gpt2 *m, const int32_t *tok, const char *what, int b, int t)
{
    for (int i = 0; i < b * t; i++)
        if (tok[i] < 0 || tok[i] >= m->V)
            return zs_error(ZS_ERR_INVALID,
                            "gpt2: %s token %d at sequence %d, position %d is out "
                            "of range [0, %d)",
                            what, (int)tok[i], i / t, i % t, m->V);
    return ZS_OK;
}

/* Block l (0-based) forward with its parameters at base p. */
static void block_forward(zs_gpt2 *m, int l, const float *p)
{
    gpt2_acts *a = &m->a;
    const int B = m->b, T = m->t, C = m->C, N = B * T, nt = m->threads;
    const size_t NC = (size_t)m->max_b * m->max_t * C; /* one layer's slice of an (L, N, C) */
    const size_t Nn = (size_t)m->max_b * m->max_t;
    const size_t att = (size_t)m->max_b * m->NH * m->max_t * m->max_t;
    const size_t *o = m->blk + (size_t)l * ZS_BLOCK_TENSORS;
#define PARAM(kind) (p + o[(kind)-ZS_T_LN1_W])
    float *resid = a->resid + l * NC;
    float *ln1 = a->ln1 + l * NC, *ln1_mean = a->ln1_mean + l * Nn,
          *ln1_rstd = a->ln1_rstd + l * Nn;
    float *qkv = a->qkv + l * 3 * NC, *attp = a->att + l * att, *atty = a->atty + l * NC;
    float *res2 = a->res2 + l * NC;
    float *ln2 = a->ln2 + l * NC, *ln2_mean = a->ln2_mean + l * Nn,
          *ln2_rstd = a->ln2_rstd + l * Nn;
    float *fch = a->fch + l * 4 * NC, *gelu = a->fch_gelu + l * 4 * NC;

    if (l == 0)
        zs_layernorm_forward(ln1, ln1_mean, ln1_rstd, resid, PARAM(ZS_T_LN1_W), PARAM(ZS_T_LN1_B),
                             N, C, nt);
    else /* the end of block l-1: resid[l] = res2[l-1] + its MLP's c_proj output */
        zs_residual_layernorm_forward(resid, ln1, ln1_mean, ln1_rstd, a->res2 + (l - 1) * NC,
                                      a->proj, PARAM(ZS_T_LN1_W), PARAM(ZS_T_LN1_B), N, C, nt);
    zs_linear_forward(qkv, ln1, PARAM(ZS_T_QKV_W), PARAM(ZS_T_QKV_B), N, C, 3 * C, nt);
    zs_attention_forward(atty, attp, qkv, B, T, C, m->NH, nt);
    zs_linear_forward(a->proj, atty, PARAM(ZS_T_ATTPROJ_W), PARAM(ZS_T_ATTPROJ_B), N, C, C, nt);
    zs_residual_layernorm_forward(res2, ln2, ln2_mean, ln2_rstd, resid, a->proj, PARAM(ZS_T_LN2_W),
                                  PARAM(ZS_T_LN2_B), N, C, nt);
    zs_linear_forward(fch, ln2, PARAM(ZS_T_FC_W), NULL, N, C, 4 * C, nt);
    zs_bias_gelu_forward(fch, gelu, PARAM(ZS_T_FC_B), N, 4 * C, nt);
    zs_linear_forward(a->proj, gelu, PARAM(ZS_T_FCPROJ_W), PARAM(ZS_T_FCPROJ_B), N, 4 * C, C, nt);
#undef PARAM
}

zs_err zs_gpt2_forward(zs_gpt2 *m, const zs_gpt2_io *io, const int32_t *inputs,
                       const int32_t *targets, int b, int t, float *loss)
{
    if (m->pending)
        return zs_error(ZS_ERR_INVALID,
                        "gpt2: forward while the previous forward still holds "
                        "its layers (call zs_gpt2_backward or zs_gpt2_finish first)");
    if (b < 1 || b > m->max_b)
        return zs_error(ZS_ERR_INVALID, "gpt2: batch of %d sequences, expected 1..%d", b, m->max_b);
    if (t < 1 || t > m->max_t)
        return zs_error(ZS_ERR_INVALID, "gpt2: sequence length %d, expected 1..%d", t, m->max_t);
    ZS_CHECK(check_tokens(m, inputs, "input", b, t));
    ZS_CHECK(check_tokens(m, targets, "target", b, t));

    gpt2_acts *a = &m->a;
    const int L = m->L, C = m->C, N = b * t, nt = m->threads;
    const size_t NC = (size_t)m->max_b * m->max_t * C;
    m->b = b;
    m->t = t;
    memcpy(m->inputs, inputs, (size_t)N * sizeof *inputs);

    const float *p0, *pf, *p;
    zs_err err = io->acquire(io->ctx, 0, &p0);
    if (err != ZS_OK)
        return err;
    zs_encoder_forward(a->resid, inputs, p0 + m->wte, p0 + m->wpe, b, t, C, nt);
    for (int l = 1; l <= L; l++) {
        ZS_CHECK_GOTO(io->acquire(io->ctx, l, &p), err, fail);
        block_forward(m, l - 1, p);
        io->release(io->ctx, l);
    }
    ZS_CHECK_GOTO(io->acquire(io->ctx, L + 1, &pf), err, fail);
    zs_residual_layernorm_forward(a->resid + L * NC, a->lnf, a->lnf_mean, a->lnf_rstd,
                                  a->res2 + (L - 1) * NC, a->proj, pf + m->lnf_w, pf + m->lnf_b, N,
                                  C, nt);
    zs_lm_head_forward(a->logits, a->lnf, p0 + m->wte, N, C, m->V, nt);
    zs_crossentropy_fused(a->logits, a->losses, targets, N, m->V, 1.0f / (float)N, nt);
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        sum += a->losses[i];
    *loss = (float)(sum / N);
    m->p0 = p0;
    m->pf = pf;
    m->pending = 1;
    return ZS_OK;

fail:
    io->release(io->ctx, 0);
    return err;
}

void zs_gpt2_finish(zs_gpt2 *m, const zs_gpt2_io *io)
{
    if (!m->pending)
        return;
    io->release(io->ctx, m->L + 1);
    io->release(io->ctx, 0);
    m->pending = 0;
}

/* ---- backward --------------------------------------------------------------------------- */

/* Block l (0-based) backward: dres holds d loss / d resid[l+1] on entry and d loss / d resid[l]
 * on return; parameters at p, gradients written at g. */
static void block_backward(zs_gpt2 *m, int l, const float *p, float *g)
{
    gpt2_acts *a = &m->a;
    const int B = m->b, T = m->t, C = m->C, N = B * T, nt = m->threads;
    const size_t NC = (size_t)m->max_b * m->max_t * C;
    const size_t Nn = (size_t)m->max_b * m->max_t;
    const size_t att = (size_t)m->max_b * m->NH * m->max_t * m->max_t;
    const size_t *o = m->blk + (size_t)l * ZS_BLOCK_TENSORS;
#define PARAM(kind) (p + o[(kind)-ZS_T_LN1_W])
#define GRAD(kind) (g + o[(kind)-ZS_T_LN1_W])
    const float *resid = a->resid + l * NC;
    const float *ln1 = a->ln1 + l * NC, *ln1_mean = a->ln1_mean + l * Nn;
    const float *ln1_rstd = a->ln1_rstd + l * Nn;
    const float *qkv = a->qkv + l * 3 * NC, *attp = a->att + l * att, *atty = a->atty + l * NC;
    const float *res2 = a->res2 + l * NC;
    const float *ln2 = a->ln2 + l * NC, *ln2_mean = a->ln2_mean + l * Nn;
    const float *ln2_rstd = a->ln2_rstd + l * Nn;
    const float *fch = a->fch + l * 4 * NC, *gelu = a->fch_gelu + l * 4 * NC;

    /* MLP: dres is also d proj (the residual add passes it through unchanged). */
    zs_linear_backward(a->dbig, GRAD(ZS_T_FCPROJ_W), GRAD(ZS_T_FCPROJ_B), a->dres, gelu,
                       PARAM(ZS_T_FCPROJ_W), N, 4 * C, C, nt);
    zs_bias_gelu_backward(a->dbig, GRAD(ZS_T_FC_B), fch, N, 4 * C, nt);
    zs_linear_backward(a->dln, GRAD(ZS_T_FC_W), NULL, a->dbig, ln2, PARAM(ZS_T_FC_W), N, C, 4 * C,
                       nt);
    zs_layernorm_backward(a->dres, GRAD(ZS_T_LN2_W), GRAD(ZS_T_LN2_B), a->dln, res2,
                          PARAM(ZS_T_LN2_W), ln2_mean, ln2_rstd, N, C, nt);
    /* Attention: dres is now d res2, and d of the attention's c_proj output. */
    zs_linear_backward(a->dln, GRAD(ZS_T_ATTPROJ_W), GRAD(ZS_T_ATTPROJ_B), a->dres, atty,
                       PARAM(ZS_T_ATTPROJ_W), N, C, C, nt);
    zs_attention_backward(a->dbig, a->datt, a->dln, qkv, attp, B, T, C, m->NH, nt);
    zs_linear_backward(a->dln, GRAD(ZS_T_QKV_W), GRAD(ZS_T_QKV_B), a->dbig, ln1, PARAM(ZS_T_QKV_W),
                       N, C, 3 * C, nt);
    zs_layernorm_backward(a->dres, GRAD(ZS_T_LN1_W), GRAD(ZS_T_LN1_B), a->dln, resid,
                          PARAM(ZS_T_LN1_W), ln1_mean, ln1_rstd, N, C, nt);
#undef PARAM
#undef GRAD
}

zs_err zs_gpt2_backward(zs_gpt2 *m, const zs_gpt2_io *io)
{
    if (!m->pending)
        return zs_error(ZS_ERR_INVALID, "gpt2: backward without a forward");
    gpt2_acts *a = &m->a;
    const int L = m->L, C = m->C, T = m->t, N = m->b * m->t, nt = m->threads;
    const size_t NC = (size_t)m->max_b * m->max_t * C;
    const float *p0 = m->p0, *pf = m->pf, *p;
    float *g0, *gf, *g;
    zs_err err;
    m->pending = 0;

    ZS_CHECK_GOTO(io->grads(io->ctx, L + 1, &gf), err, fail_final);
    ZS_CHECK_GOTO(io->grads(io->ctx, 0, &g0), err, fail_final);
    zero_padding(m, L + 1, gf);
    zero_padding(m, 0, g0);
    zs_lm_head_backward(a->dln, g0 + m->wte, a->logits, a->lnf, p0 + m->wte, N, C, m->V, nt);
    memset(a->dres, 0, (size_t)N * C * sizeof *a->dres);
    zs_layernorm_backward(a->dres, gf + m->lnf_w, gf + m->lnf_b, a->dln, a->resid + L * NC,
                          pf + m->lnf_w, a->lnf_mean, a->lnf_rstd, N, C, nt);
    ZS_CHECK_GOTO(io->grads_done(io->ctx, L + 1), err, fail_final);
    io->release(io->ctx, L + 1);

    int l;
    for (l = L; l >= 1; l--) {
        ZS_CHECK_GOTO(io->acquire(io->ctx, l, &p), err, fail_embed);
        ZS_CHECK_GOTO(io->grads(io->ctx, l, &g), err, fail_block);
        zero_padding(m, l, g);
        block_backward(m, l - 1, p, g);
        ZS_CHECK_GOTO(io->grads_done(io->ctx, l), err, fail_block);
        io->release(io->ctx, l);
    }

    /* dwte += the embedding's share; dwpe = rows 0..t-1, 0 beyond. */
    float *dwpe = g0 + m->wpe;
    zs_encoder_backward(g0 + m->wte, dwpe, a->dres, m->inputs, m->b, T, C, nt);
    memset(dwpe + (size_t)T * C, 0, (size_t)(m->maxT - T) * C * sizeof *dwpe);
    ZS_CHECK_GOTO(io->grads_done(io->ctx, 0), err, fail_embed);
    io->release(io->ctx, 0);
    return ZS_OK;

fail_block:
    io->release(io->ctx, l);
    goto fail_embed;
fail_final:
    io->release(io->ctx, L + 1);
fail_embed:
    io->release(io->ctx, 0);
    return err;
}

/* ---- flat io, flops --------------------------------------------------------------------- */

static zs_err flat_acquire(void *ctx, int layer, const float **base)
{
    (void)layer;
    *base = ((zs_gpt2_flat *)ctx)->params;
    return ZS_OK;
}

static void flat_release(void *ctx, int layer)
{
    (void)ctx;
    (void)layer;
}

static zs_err flat_grads(void *ctx, int layer, float **base)
{
    (void)layer;
    *base = ((zs_gpt2_flat *)ctx)->grads;
    return ZS_OK;
}

static zs_err flat_grads_done(void *ctx, int layer)
{
    (void)ctx;
    (void)layer;
    return ZS_OK;
}

zs_gpt2_io zs_gpt2_flat_io(zs_gpt2_flat *flat)
{
    return (zs_gpt2_io){
        .ctx = flat,
        .acquire = flat_acquire,
        .release = flat_release,
        .grads = flat_grads,
        .grads_done = flat_grads_done,
    };
}

/*
 * Counted per token, forward: 2 flops per weight of every matrix product (12 C^2 per block,
 * plus V C for lm_head), and 4 t C per block for attention's two products (q k^T and att v)
 * over all t keys, as if unmasked (the usual convention; the kernels skip about half).
 * Backward is twice the forward.  Elementwise work (LayerNorm, GELU, softmax) is not counted.
 * Total: tokens * (6 * (12 L C^2 + V C) + 12 L t C).
 */
double zs_gpt2_flops(const zs_model_config *cfg, int b, int t)
{
    double L = cfg->n_layer, C = cfg->n_embd, V = cfg->vocab_size, T = t;
    double tokens = (double)b * t;
    double matmul_weights = L * 12.0 * C * C + V * C;
    return tokens * (6.0 * matmul_weights + 12.0 * L * T * C);
}
