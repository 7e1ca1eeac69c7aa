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

#include "kernels/gpt2_layout.h"
#include "kernels/kernels.h"

struct zs_gpt2 {
    zs_model_config cfg;
    int L, C, NH, V, maxT; /* maxT: block_size, the rows of wpe */
    int max_b, max_t;
    int threads;
    zs_gpt2_offsets o; /* the tensors in the flat vector */
    float *mem;        /* one allocation for all activations */
    zs_gpt2_acts a;
    int32_t *inputs; /* (max_b, max_t) the last forward's inputs, for the encoder backward */
    /* Between a forward and its backward/finish: */
    int pending; /* layers 0 and L+1 are held */
    int b, t;
    const float *p0, *pf; /* bases of layers 0 and L+1 */
};

/* ---- setup ------------------------------------------------------------------------------ */

/* Every activation array starts on a cache line. */
#define ACTS_ALIGN 64

size_t zs_gpt2_activation_bytes(const zs_model_config *cfg, int max_b, int max_t)
{
    zs_gpt2_acts a;
    return zs_gpt2_acts_layout(&a, NULL, ACTS_ALIGN, cfg, max_b, max_t);
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
    m->cfg = *cfg;
    m->inputs = calloc((size_t)max_b * max_t, sizeof *m->inputs);
    if (!m->inputs) {
        err = zs_error(ZS_ERR_NOMEM, "gpt2: out of memory for the inputs");
        goto fail;
    }
    /* Tensor offsets, checked against the shapes the config implies. */
    ZS_CHECK_GOTO(zs_gpt2_offsets_init(&m->o, cfg, tt), err, fail);

    /* Activations: one allocation, carved in the order of zs_gpt2_acts. */
    size_t bytes = zs_gpt2_acts_layout(&m->a, NULL, ACTS_ALIGN, cfg, max_b, max_t);
    void *mem = NULL;
    if (posix_memalign(&mem, ACTS_ALIGN, bytes) != 0) {
        err = zs_error(ZS_ERR_NOMEM, "gpt2: out of memory for %zu MiB of activations", bytes >> 20);
        goto fail;
    }
    m->mem = mem;
    zs_gpt2_acts_layout(&m->a, (char *)m->mem, ACTS_ALIGN, cfg, max_b, max_t);
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
    zs_gpt2_offsets_free(&m->o);
    free(m);
}

static zs_err zero_gap(void *base, size_t begin, size_t floats)
{
    memset((float *)base + begin, 0, floats * sizeof(float));
    return ZS_OK;
}

/* Zeroes the parts of layer's gradient range [layer_begin, layer_end) that no tensor covers. */
static void zero_padding(const zs_gpt2 *m, int layer, float *base)
{
    zs_gpt2_gaps(&m->o, layer, zero_gap, base);
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
    zs_gpt2_acts *a = &m->a;
    const int B = m->b, T = m->t, C = m->C, N = B * T, nt = m->threads;
    const size_t NC = (size_t)m->max_b * m->max_t * C; /* one layer's slice of an (L, N, C) */
    const size_t *o = m->o.blk + (size_t)l * ZS_BLOCK_TENSORS;
#define PARAM(kind) (p + o[(kind)-ZS_T_LN1_W])
    const zs_gpt2_block_acts v = zs_gpt2_block_slices(a, &m->cfg, m->max_b, m->max_t, l);
    float *resid = v.resid, *ln1 = v.ln1, *ln1_mean = v.ln1_mean, *ln1_rstd = v.ln1_rstd;
    float *qkv = v.qkv, *attp = v.att, *atty = v.atty, *res2 = v.res2;
    float *ln2 = v.ln2, *ln2_mean = v.ln2_mean, *ln2_rstd = v.ln2_rstd;
    float *fch = v.fch, *gelu = v.gelu;

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

    zs_gpt2_acts *a = &m->a;
    const int L = m->L, C = m->C, N = b * t, nt = m->threads;
    const size_t NC = (size_t)m->max_b * m->max_t * C;
    m->b = b;
    m->t = t;
    memcpy(m->inputs, inputs, (size_t)N * sizeof *inputs);

    const float *p0, *pf, *p;
    zs_err err = io->acquire(io->ctx, 0, &p0);
    if (err != ZS_OK)
        return err;
    zs_encoder_forward(a->resid, inputs, p0 + m->o.wte, p0 + m->o.wpe, b, t, C, nt);
    for (int l = 1; l <= L; l++) {
        ZS_CHECK_GOTO(io->acquire(io->ctx, l, &p), err, fail);
        block_forward(m, l - 1, p);
        io->release(io->ctx, l);
    }
    ZS_CHECK_GOTO(io->acquire(io->ctx, L + 1, &pf), err, fail);
    zs_residual_layernorm_forward(a->resid + L * NC, a->lnf, a->lnf_mean, a->lnf_rstd,
                                  a->res2 + (L - 1) * NC, a->proj, pf + m->o.lnf_w, pf + m->o.lnf_b,
                                  N, C, nt);
    zs_lm_head_forward(a->logits, a->lnf, p0 + m->o.wte, N, C, m->V, nt);
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
    zs_gpt2_acts *a = &m->a;
    const int B = m->b, T = m->t, C = m->C, N = B * T, nt = m->threads;
    const size_t *o = m->o.blk + (size_t)l * ZS_BLOCK_TENSORS;
#define PARAM(kind) (p + o[(kind)-ZS_T_LN1_W])
#define GRAD(kind) (g + o[(kind)-ZS_T_LN1_W])
    const zs_gpt2_block_acts v = zs_gpt2_block_slices(a, &m->cfg, m->max_b, m->max_t, l);
    const float *resid = v.resid, *ln1 = v.ln1, *ln1_mean = v.ln1_mean, *ln1_rstd = v.ln1_rstd;
    const float *qkv = v.qkv, *attp = v.att, *atty = v.atty, *res2 = v.res2;
    const float *ln2 = v.ln2, *ln2_mean = v.ln2_mean, *ln2_rstd = v.ln2_rstd;
    const float *fch = v.fch, *gelu = v.gelu;

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
    zs_gpt2_acts *a = &m->a;
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
    zs_lm_head_backward(a->dln, g0 + m->o.wte, a->logits, a->lnf, p0 + m->o.wte, N, C, m->V, nt);
    memset(a->dres, 0, (size_t)N * C * sizeof *a->dres);
    zs_layernorm_backward(a->dres, gf + m->o.lnf_w, gf + m->o.lnf_b, a->dln, a->resid + L * NC,
                          pf + m->o.lnf_w, a->lnf_mean, a->lnf_rstd, N, C, nt);
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
    float *dwpe = g0 + m->o.wpe;
    zs_encoder_backward(g0 + m->o.wte, dwpe, a->dres, m->inputs, m->b, T, C, nt);
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
