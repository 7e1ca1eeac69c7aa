/*
 * model_cuda: the compute seam's CUDA backend (kernels/model.h): GPT-2's forward and backward
 * composed from the CUDA kernels (cuda_kernels.h) on one stream of one GPU, in the same order
 * and with the same buffers as kernels/gpt2.c composes the CPU kernels (its header comment has
 * the dataflow; block l's residual add is fused into the next LayerNorm, one residual-gradient
 * buffer walks the backward, every gradient float of a layer is written).
 *
 * Three precisions (model.h's zs_precision; docs/gpu.md has the table and the bytes per token):
 *   - fp32: every activation and product in fp32 (gpt2_layout.h's zs_gpt2_acts as they are);
 *   - bf16, and fp16 the same way in the other 16-bit format (m->half; "bf16" below stands for
 *     either): the GEMMs' operands in bf16 with fp32 accumulation.  fp16 also carries the job's
 *     loss scale in dlogits (zs_model_loss_scale), so that its 16-bit gradients hold the scaled
 *     values, as a DeepSpeed fp16 backward does, and overflow where that one would.  A layer's
 *     parameters are converted to bf16 on the GPU as it is used (exact for a bf16.enabled job's
 *     weights, which the io hands over bf16-representable), into one buffer for the block being
 *     computed and one for wte (held from the forward to the lm_head's backward).  The
 *     activations that only feed GEMMs are stored in bf16 only (ln1, ln2, lnf, the GELU input
 *     and output: the fp32 layout leaves them out), atty in both (the attention's output, which
 *     its backward may read, and its bf16 copy), the rest in fp32; the backward's GEMM operands
 *     are cast from the fp32 gradients in the pass that sums their bias gradient, and dlogits
 *     is written in bf16 over the logits.  The fc layer's GEMM carries bias + GELU in
 *     cuBLASLt's epilogue (GELU_AUX_BIAS forward, DGELU backward) where cuBLASLt has an
 *     algorithm for it, the separate kernels where not (decided per call, from the shape and
 *     the buffers' alignments, which the layout fixes, and logged once).
 *
 * Everything the model touches is device memory: the io's layer pointers, the activations,
 * the tokens (copied in at each forward).  Work is enqueued on the model's stream.  The io
 * moves bytes two ways (model.h):
 *   - zs_model_upload/zs_model_download, enqueued on the compute stream and waited for: an io
 *     using only these may overwrite a layer's device buffer as soon as release() is called
 *     (the upload runs after the kernels that read it), and a gradient it downloads in
 *     grads_done() is complete (zshard train);
 *   - the copy streams, one a direction (upload_async/download_async, ordered by tickets:
 *     marks on the compute stream and copy events), which overlap copies with compute and with
 *     each other (the GPU worker): an upload
 *     into a released buffer must then wait for the release's mark (`after`), and the compute
 *     stream waits for an upload's ticket (zs_model_after) before it reads the layer.
 *
 * The loss is the mean of the per-position losses, summed on the host in double in position
 * order, as the CPU model does.  Tokens are checked on the host before anything is enqueued.
 *
 * Attention: the fused kernel (zs_cuda_attention_fused_*), which saves a log-sum-exp per score
 * row instead of the T x T softmax, so the activations hold lse/delta (B, NH, T) a layer where
 * the CPU model holds att/datt (gpt2_layout.h, ZS_GPT2_ATT_LSE).  ZS_CUDA_ATTENTION=reference,
 * read once at creation, selects the reference kernel and the CPU's layout instead: the check of
 * the fused one on whole steps (tests/gpu/test_gpu_step.c).  Head sizes the fused kernel does
 * not take (zs_cuda_attention_fused_supports) get the reference one.
 *
 * Determinism: the kernels use no atomics and fixed reduction orders, cuBLASLt is asked for
 * no split-K reduction: one GPU model gives the same bits run to run.
 */
#include "kernels/model.h"

#include <cudaTypedefs.h> /* the driver API's types only: its calls come through the runtime */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/gpt2_layout.h"

/* A runtime call that must succeed: its failure is returned, and the runtime's last error
 * cleared, so that the next kernel launch does not report it as its own (zs_cuda_launched). */
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (cu_e_ != cudaSuccess) {                                                                \
            (void)cudaGetLastError();                                                              \
            return zs_error(ZS_ERR_IO, "cuda: %s: %s", #call, cudaGetErrorString(cu_e_));          \
        }                                                                                          \
    } while (0)

/* A runtime call of the model's that failed (ce): the error naming it, with the runtime's last
 * error cleared, which the next kernel launch would otherwise read (zs_cuda_launched) and
 * report as its own failure. */
static zs_err runtime_failed(int device, const char *what, cudaError_t ce)
{
    (void)cudaGetLastError();
    return zs_error(ZS_ERR_IO, "model cuda:%d: %s: %s", device, what, cudaGetErrorString(ce));
}

typedef struct {
    int device;
    zs_model_config cfg;
    int L, C, NH, V, maxT, max_b, max_t;
    int Vp; /* the logits' row stride: V rounded up to LOGITS_ROUND (the GEMMs' alignment) */
    zs_gpt2_offsets o; /* the tensors in the flat vector */
    cudaStream_t stream;
    cudaStream_t copies;    /* upload_async's (and copy_now's): a copy engine, beside the compute */
    cudaStream_t downloads; /* download_async's: the other direction's copy engine, so that a
                               gradient going out never holds back the next layer coming in */
    /* Tickets (model.h): ticket t > 0 is event (t - 1) % n_events, recorded on the stream that
     * the mark or the copy went to; next_ticket is the next one handed out.  Marks and copies
     * come from the compute thread; the communication thread waits on tickets too (sync), so
     * next_ticket is atomic.  An event is recorded again only once the ticket it held is done
     * (record synchronizes on it first: n_events tickets back, it almost always is), so a
     * ticket whose event was taken by a later one is known done, and nothing waits on the
     * later one instead (which may be on another stream, and done earlier). */
    cudaEvent_t events[64];
    int n_events;
    _Atomic uint64_t next_ticket;
    zs_cuda_blas *blas;
    int fused_attention; /* 1: zs_cuda_attention_fused_* (lse saved); 0: the reference (att) */
    void *mem;           /* device: the activations (gpt2_layout.h) and the tokens */
    size_t mem_bytes;
    zs_gpt2_acts a;
    zs_precision precision;
    zs_half_format half; /* the 16-bit modes' format: bf16, or fp16 (ZS_PRECISION_FP16) */
    /* fp16: the loss scale dlogits carry (zs_model_loss_scale); 1 in the other modes. */
    float loss_scale;
    /* The 16-bit modes' buffers (NULL in fp32 mode), in mem after the activations: the GEMM
     * operands stored in 16 bits only, (L, N, ...) like their fp32 twins; the backward's operands
     * (N, ...), shared by the layers; and the weights of the block being computed (blk16, the
     * largest layer's floats) and wte. */
    zs_half16 *ln1_16, *atty_16, *ln2_16, *fch_16, *gelu_16, *lnf_16;
    zs_half16 *dres_16, *dbig_16;
    zs_half16 *wte_16, *blk16;
    size_t blk_floats;
    int said_unfused_fwd, said_unfused_bwd; /* the fallback's log line, once each */
    int32_t *inputs, *targets;              /* device (max_b, max_t) */
    float *losses_host;                     /* (max_b * max_t) */
    int pending, b, t;
    const float *p0, *pf;
    /* A dma-buf was exported from a GPU that does not order a NIC's writes itself
     * (cudaDevAttrGPUDirectRDMAWritesOrdering below Owner): nic_wrote must flush them. */
    int nic_flush;
} cuda_model;

/* Device arrays start on 256 bytes, as cudaMalloc's do. */
#define ACTS_ALIGN 256
/* The logits' rows are V rounded up to this many floats apart (50257 -> 50304 for GPT-2, as
 * llm.c pads its vocabulary): each row then starts on 256 bytes (the array does: ACTS_ALIGN),
 * as do the 16-bit dlogits written over them, so the lm_head's GEMMs get aligned columns instead of
 * the 4 (fp32) or 2 (16-bit) bytes an odd V gives, which rule out cuBLASLt's tensor-core kernels.
 * The parameters are not padded: only the logits' stride. */
#define LOGITS_ROUND 128

/* The fp32 activations that the 16-bit modes keep in 16 bits only. */
#define HALF_ONLY (ZS_ACTS_LN1 | ZS_ACTS_LN2 | ZS_ACTS_FCH | ZS_ACTS_FCH_GELU | ZS_ACTS_LNF)

/* Carves the activations (and in bf16 mode their bf16 arrays, then the bf16 weights) and the
 * token buffers out of base (NULL: only counts); the bytes. */
static size_t layout(cuda_model *m, char *base)
{
    const int h16 = m->precision != ZS_PRECISION_FP32;
    /* The activations of m's shape with the logits' rows Vp apart: the only array the
     * vocabulary sizes. */
    zs_model_config padded = m->cfg;
    padded.vocab_size = m->Vp;
    size_t at = zs_gpt2_acts_layout_for(&m->a, base, ACTS_ALIGN, &padded, m->max_b, m->max_t,
                                        m->fused_attention ? ZS_GPT2_ATT_LSE : ZS_GPT2_ATT_PROBS,
                                        h16 ? HALF_ONLY : 0);
    if (h16) {
        const size_t L = (size_t)m->L, C = (size_t)m->C, V = (size_t)m->V;
        const size_t N = (size_t)m->max_b * (size_t)m->max_t;
        struct {
            zs_half16 **p;
            size_t n;
        } parts[] = {
            {&m->ln1_16, L * N * C},     {&m->atty_16, L * N * C},     {&m->ln2_16, L * N * C},
            {&m->fch_16, L * N * 4 * C}, {&m->gelu_16, L * N * 4 * C}, {&m->lnf_16, N * C},
            {&m->dres_16, N * C},        {&m->dbig_16, N * 4 * C},     {&m->wte_16, V * C},
            {&m->blk16, m->blk_floats},
        };
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            if (base)
                *parts[i].p = (zs_half16 *)(void *)(base + at);
            at += (parts[i].n * sizeof(zs_half16) + ACTS_ALIGN - 1) & ~(size_t)(ACTS_ALIGN - 1);
        }
    }
    size_t tokens = ((size_t)m->max_b * m->max_t * sizeof(int32_t) + ACTS_ALIGN - 1) &
                    ~(size_t)(ACTS_ALIGN - 1);
    if (base) {
        m->inputs = (int32_t *)(void *)(base + at);
        m->targets = (int32_t *)(void *)(base + at + tokens);
    }
    return at + 2 * tokens;
}

/* Before memory of the model's is freed: no kernel and no copy may still use it.  cudaFree
 * happens to wait for the device, but that is not documented; the copy stream's layer copies
 * run beside the kernels. */
static void quiesce(cuda_model *m)
{
    cudaSetDevice(m->device);
    cudaStream_t all[] = {m->stream, m->copies, m->downloads};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i])
            cudaStreamSynchronize(all[i]);
}

static void cuda_free(void *impl)
{
    cuda_model *m = impl;
    if (!m)
        return;
    quiesce(m); /* a failed step may have left work queued on the memory freed below */
    if (m->blas)
        zs_cuda_blas_close(m->blas);
    if (m->mem)
        cudaFree(m->mem);
    if (m->stream)
        cudaStreamDestroy(m->stream);
    if (m->copies)
        cudaStreamDestroy(m->copies);
    if (m->downloads)
        cudaStreamDestroy(m->downloads);
    for (int i = 0; i < m->n_events; i++)
        cudaEventDestroy(m->events[i]);
    free(m->losses_host);
    zs_gpt2_offsets_free(&m->o);
    free(m);
}

static zs_err setup(cuda_model *m, const zs_model_config *cfg, const zs_tensor_table *tt)
{
    m->losses_host = calloc((size_t)m->max_b * m->max_t, sizeof *m->losses_host);
    if (!m->losses_host)
        return zs_error(ZS_ERR_NOMEM, "model cuda: out of memory for the losses");
    ZS_CHECK(zs_gpt2_offsets_init(&m->o, cfg, tt));
    for (int il = 1; il <= m->L; il++) {
        size_t n = m->o.layer_begin[il + 1] - m->o.layer_begin[il];
        m->blk_floats = n > m->blk_floats ? n : m->blk_floats;
    }
    CU(cudaSetDevice(m->device));
    size_t bytes = layout(m, NULL), free_b = 0, total_b = 0;
    CU(cudaMemGetInfo(&free_b, &total_b));
    if (bytes > free_b)
        return zs_error(ZS_ERR_NOMEM,
                        "model cuda:%d: the activations for %d x %d tokens take %zu MiB, the GPU "
                        "has %zu MiB free of %zu",
                        m->device, m->max_b, m->max_t, bytes >> 20, free_b >> 20, total_b >> 20);
    CU(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&m->copies, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&m->downloads, cudaStreamNonBlocking));
    for (; m->n_events < (int)(sizeof m->events / sizeof *m->events); m->n_events++)
        CU(cudaEventCreateWithFlags(&m->events[m->n_events], cudaEventDisableTiming));
    m->next_ticket = 1;
    CU(cudaMalloc(&m->mem, bytes));
    m->mem_bytes = bytes;
    CU(cudaMemsetAsync(m->mem, 0, bytes, m->stream));
    layout(m, m->mem);
    ZS_CHECK(zs_cuda_blas_open(m->stream, &m->blas));
    CU(cudaStreamSynchronize(m->stream));
    return ZS_OK;
}

/*
 * ZS_CUDA_ATTENTION: which attention kernel the model uses, read once here.  Unset, empty or
 * "fused": the fused one where the head size allows, else the reference; "reference": the
 * reference one.  "fused" with a head size the fused kernel does not take, or any other value,
 * is an error (a check that asked for one kernel must not silently get the other).
 */
static zs_err choose_attention(int hs, int *fused)
{
    const char *v = getenv("ZS_CUDA_ATTENTION");
    int asked = v && *v;
    if (asked && strcmp(v, "reference") == 0) {
        *fused = 0;
        return ZS_OK;
    }
    if (asked && strcmp(v, "fused") != 0)
        return zs_error(ZS_ERR_INVALID,
                        "model cuda: ZS_CUDA_ATTENTION is '%s', expected 'fused' or 'reference'",
                        v);
    *fused = zs_cuda_attention_fused_supports(hs);
    if (asked && !*fused)
        return zs_error(ZS_ERR_INVALID,
                        "model cuda: ZS_CUDA_ATTENTION=fused, but the fused attention does not "
                        "take head size %d (32, 64, 96 or 128)",
                        hs);
    return ZS_OK;
}

static zs_err cuda_create(const zs_model_config *cfg, const zs_tensor_table *tt, int max_b,
                          int max_t, int threads, zs_precision precision, int index, void **impl)
{
    (void)threads;
    *impl = NULL;
    if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 || cfg->vocab_size <= 0 ||
        cfg->n_embd % cfg->n_head != 0 || max_b < 1 || max_t < 1 || max_t > cfg->block_size ||
        tt->n_layers != cfg->n_layer + 2 ||
        (precision != ZS_PRECISION_FP32 && precision != ZS_PRECISION_BF16 &&
         precision != ZS_PRECISION_FP16))
        return zs_error(ZS_ERR_INVALID,
                        "model cuda: bad shape or precision (n_layer %d, n_head %d, n_embd %d, "
                        "vocab_size %d, block_size %d, %d x %d tokens, precision %d)",
                        cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->block_size,
                        max_b, max_t, (int)precision);
    int fused;
    ZS_CHECK(choose_attention(cfg->n_embd / cfg->n_head, &fused));
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || index >= count)
        return zs_error(ZS_ERR_INVALID, "device cuda:%d: %s%s", index,
                        ce != cudaSuccess ? "no GPU can be used here: "
                                          : "no such GPU: fewer are visible to this process",
                        ce != cudaSuccess ? cudaGetErrorString(ce) : "");
    cuda_model *m = calloc(1, sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "model cuda: out of memory");
    m->device = index;
    m->fused_attention = fused;
    m->cfg = *cfg;
    m->L = cfg->n_layer;
    m->C = cfg->n_embd;
    m->NH = cfg->n_head;
    m->V = cfg->vocab_size;
    m->Vp = (int)(((long long)m->V + LOGITS_ROUND - 1) / LOGITS_ROUND * LOGITS_ROUND);
    m->maxT = cfg->block_size;
    m->max_b = max_b;
    m->max_t = max_t;
    m->precision = precision;
    m->half = precision == ZS_PRECISION_FP16 ? ZS_HALF_F16 : ZS_HALF_BF16;
    m->loss_scale = 1.0f;
    zs_err e = setup(m, cfg, tt);
    if (e != ZS_OK) {
        cuda_free(m);
        return e;
    }
    zs_log(ZS_LOG_INFO, "model cuda:%d: %s, %zu MiB of activations for %d x %d tokens", m->device,
           precision == ZS_PRECISION_BF16   ? "bf16 storage with fp32 accumulation"
           : precision == ZS_PRECISION_FP16 ? "fp16 storage with fp32 accumulation"
                                            : "fp32",
           m->mem_bytes >> 20, max_b, max_t);
    *impl = m;
    return ZS_OK;
}

static zs_err check_tokens(const cuda_model *m, const int32_t *tok, const char *what, int n, int t)
{
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= m->V)
            return zs_error(ZS_ERR_INVALID,
                            "model cuda: %s token %d at sequence %d, position %d is out of "
                            "range [0, %d)",
                            what, (int)tok[i], i / t, i % t, m->V);
    return ZS_OK;
}

typedef struct {
    cuda_model *m;
    float *base;
} gap_ctx;

static zs_err zero_gap(void *ctx, size_t begin, size_t floats)
{
    gap_ctx *g = ctx;
    CU(cudaMemsetAsync(g->base + begin, 0, floats * sizeof(float), g->m->stream));
    return ZS_OK;
}

/* Zeroes the floats of layer's gradient range that no tensor covers. */
static zs_err zero_padding(cuda_model *m, int layer, float *base)
{
    gap_ctx g = {m, base};
    return zs_gpt2_gaps(&m->o, layer, zero_gap, &g);
}

/* Block l's (0-based) 16-bit slices of the 16-bit mode's (L, N, ...) arrays. */
typedef struct {
    zs_half16 *ln1, *atty, *ln2, *fch, *gelu;
} block16;

static block16 block16_slices(const cuda_model *m, int l)
{
    const size_t NC = (size_t)m->max_b * m->max_t * m->C;
    return (block16){m->ln1_16 + l * NC, m->atty_16 + l * NC, m->ln2_16 + l * NC,
                     m->fch_16 + l * 4 * NC, m->gelu_16 + l * 4 * NC};
}

/* bf16 mode: block l's (0-based) parameters, p the io's base pointer, into m->blk16; a tensor
 * at offset o of the flat vector is then at m->blk16 + (o - the layer's first offset). */
static zs_err block_weights_half(cuda_model *m, int l, const float *p)
{
    size_t begin = m->o.layer_begin[l + 1], n = m->o.layer_begin[l + 2] - begin;
    return zs_cuda_to_half(m->half, m->blk16, p + begin, (long long)n, m->stream);
}

/* bf16 mode: the fc layer forward, pre-activation and GELU output into x.fch and x.gelu, by
 * the GELU epilogue, or by a GEMM into the fp32 scratch dbig and the bias + GELU kernel. */
static zs_err fc_gelu_forward_half(cuda_model *m, block16 x, const zs_half16 *w,
                                   const zs_half16 *b16, const float *b32, int N)
{
    const int C = m->C;
    int fused = 0;
    ZS_CHECK(zs_cuda_linear_gelu_forward_half(m->half, m->blas, x.fch, x.gelu, x.ln2, w, b16, N, C,
                                              4 * C, &fused));
    if (fused)
        return ZS_OK;
    if (!m->said_unfused_fwd) {
        m->said_unfused_fwd = 1;
        zs_log(ZS_LOG_WARN,
               "model cuda:%d: cuBLASLt has no algorithm for the GELU epilogue (GELU_AUX_BIAS, "
               "%s, %d x %d x %d): the fc layer's forward runs as a GEMM and the GELU kernel",
               m->device, zs_half_name(m->half), N, C, 4 * C);
    }
    ZS_CHECK(zs_cuda_linear_forward_half(m->half, m->blas, m->a.dbig, x.ln2, w, NULL, N, C, 4 * C));
    return zs_cuda_bias_gelu_forward_half(m->half, x.fch, x.gelu, m->a.dbig, b32, N, 4 * C,
                                          m->stream);
}

/* Block l (0-based) forward with its parameters at p (gpt2.c's block_forward). */
static zs_err block_forward(cuda_model *m, int l, const float *p)
{
    zs_gpt2_acts *a = &m->a;
    const int B = m->b, T = m->t, C = m->C, N = B * T;
    const size_t NC = (size_t)m->max_b * m->max_t * C;
    const size_t *o = m->o.blk + (size_t)l * ZS_BLOCK_TENSORS;
    cudaStream_t s = m->stream;
    zs_gpt2_block_acts v = zs_gpt2_block_slices(a, &m->cfg, m->max_b, m->max_t, l);
    const int h16 = m->precision != ZS_PRECISION_FP32;
    block16 x = {0};
#define PARAM(kind) (p + o[(kind)-ZS_T_LN1_W])
#define W16(kind) (m->blk16 + (o[(kind)-ZS_T_LN1_W] - m->o.layer_begin[l + 1]))
    if (h16) {
        x = block16_slices(m, l);
        ZS_CHECK(block_weights_half(m, l, p));
        ZS_CHECK(zs_cuda_layernorm_forward_half(m->half, l ? v.resid : NULL, x.ln1, v.ln1_mean,
                                                v.ln1_rstd, l ? a->res2 + (l - 1) * NC : v.resid,
                                                l ? a->proj : NULL, PARAM(ZS_T_LN1_W),
                                                PARAM(ZS_T_LN1_B), N, C, s));
        ZS_CHECK(zs_cuda_linear_forward_half(m->half, m->blas, v.qkv, x.ln1, W16(ZS_T_QKV_W),
                                             PARAM(ZS_T_QKV_B), N, C, 3 * C));
    } else {
        if (l == 0)
            ZS_CHECK(zs_cuda_layernorm_forward(v.ln1, v.ln1_mean, v.ln1_rstd, v.resid,
                                               PARAM(ZS_T_LN1_W), PARAM(ZS_T_LN1_B), N, C, s));
        else
            ZS_CHECK(zs_cuda_residual_layernorm_forward(
                v.resid, v.ln1, v.ln1_mean, v.ln1_rstd, a->res2 + (l - 1) * NC, a->proj,
                PARAM(ZS_T_LN1_W), PARAM(ZS_T_LN1_B), N, C, s));
        ZS_CHECK(zs_cuda_linear_forward(m->blas, v.qkv, v.ln1, PARAM(ZS_T_QKV_W), PARAM(ZS_T_QKV_B),
                                        N, C, 3 * C));
    }
    if (m->fused_attention)
        ZS_CHECK(zs_cuda_attention_fused_forward(v.atty, v.lse, v.qkv, B, T, C, m->NH, s));
    else
        ZS_CHECK(zs_cuda_attention_forward(v.atty, v.att, v.qkv, B, T, C, m->NH, s));
    if (h16) {
        ZS_CHECK(zs_cuda_to_half(m->half, x.atty, v.atty, (long long)N * C, s));
        ZS_CHECK(zs_cuda_linear_forward_half(m->half, m->blas, a->proj, x.atty, W16(ZS_T_ATTPROJ_W),
                                             PARAM(ZS_T_ATTPROJ_B), N, C, C));
        ZS_CHECK(zs_cuda_layernorm_forward_half(m->half, v.res2, x.ln2, v.ln2_mean, v.ln2_rstd,
                                                v.resid, a->proj, PARAM(ZS_T_LN2_W),
                                                PARAM(ZS_T_LN2_B), N, C, s));
        ZS_CHECK(fc_gelu_forward_half(m, x, W16(ZS_T_FC_W), W16(ZS_T_FC_B), PARAM(ZS_T_FC_B), N));
        return zs_cuda_linear_forward_half(m->half, m->blas, a->proj, x.gelu, W16(ZS_T_FCPROJ_W),
                                           PARAM(ZS_T_FCPROJ_B), N, 4 * C, C);
    }
    ZS_CHECK(zs_cuda_linear_forward(m->blas, a->proj, v.atty, PARAM(ZS_T_ATTPROJ_W),
                                    PARAM(ZS_T_ATTPROJ_B), N, C, C));
    ZS_CHECK(zs_cuda_residual_layernorm_forward(v.res2, v.ln2, v.ln2_mean, v.ln2_rstd, v.resid,
                                                a->proj, PARAM(ZS_T_LN2_W), PARAM(ZS_T_LN2_B), N, C,
                                                s));
    ZS_CHECK(zs_cuda_linear_forward(m->blas, v.fch, v.ln2, PARAM(ZS_T_FC_W), NULL, N, C, 4 * C));
    ZS_CHECK(zs_cuda_bias_gelu_forward(v.fch, v.gelu, PARAM(ZS_T_FC_B), N, 4 * C, s));
    ZS_CHECK(zs_cuda_linear_forward(m->blas, a->proj, v.gelu, PARAM(ZS_T_FCPROJ_W),
                                    PARAM(ZS_T_FCPROJ_B), N, 4 * C, C));
#undef W16
#undef PARAM
    return ZS_OK;
}

static zs_err cuda_forward(void *impl, const zs_gpt2_io *io, const int32_t *inputs,
                           const int32_t *targets, int b, int t, float *loss)
{
    cuda_model *m = impl;
    if (m->pending)
        return zs_error(ZS_ERR_INVALID, "model cuda: forward while the previous forward still "
                                        "holds its layers");
    if (b < 1 || b > m->max_b || t < 1 || t > m->max_t)
        return zs_error(ZS_ERR_INVALID, "model cuda: %d x %d tokens, expected up to %d x %d", b, t,
                        m->max_b, m->max_t);
    const int N = b * t, L = m->L, C = m->C;
    const int h16 = m->precision != ZS_PRECISION_FP32;
    ZS_CHECK(check_tokens(m, inputs, "input", N, t));
    ZS_CHECK(check_tokens(m, targets, "target", N, t));
    CU(cudaSetDevice(m->device));
    zs_gpt2_acts *a = &m->a;
    const size_t NC = (size_t)m->max_b * m->max_t * C;
    m->b = b;
    m->t = t;
    CU(cudaMemcpyAsync(m->inputs, inputs, (size_t)N * sizeof *inputs, cudaMemcpyHostToDevice,
                       m->stream));
    CU(cudaMemcpyAsync(m->targets, targets, (size_t)N * sizeof *targets, cudaMemcpyHostToDevice,
                       m->stream));
    const float *p0, *pf, *p;
    zs_err err = io->acquire(io->ctx, 0, &p0);
    if (err != ZS_OK)
        return err;
    ZS_CHECK_GOTO(zs_cuda_encoder_forward(a->resid, m->inputs, p0 + m->o.wte, p0 + m->o.wpe, b, t,
                                          C, m->stream),
                  err, fail);
    if (h16) /* wte for the lm_head, kept until its backward (layer 0 stays acquired) */
        ZS_CHECK_GOTO(
            zs_cuda_to_half(m->half, m->wte_16, p0 + m->o.wte, (long long)m->V * C, m->stream), err,
            fail);
    for (int l = 1; l <= L; l++) {
        ZS_CHECK_GOTO(io->acquire(io->ctx, l, &p), err, fail);
        err = block_forward(m, l - 1, p);
        io->release(io->ctx, l);
        if (err != ZS_OK)
            goto fail;
    }
    ZS_CHECK_GOTO(io->acquire(io->ctx, L + 1, &pf), err, fail);
    if (h16) {
        ZS_CHECK_GOTO(
            zs_cuda_layernorm_forward_half(m->half, a->resid + L * NC, m->lnf_16, a->lnf_mean,
                                           a->lnf_rstd, a->res2 + (L - 1) * NC, a->proj,
                                           pf + m->o.lnf_w, pf + m->o.lnf_b, N, C, m->stream),
            err, fail_final);
        ZS_CHECK_GOTO(zs_cuda_lm_head_forward_half(m->half, m->blas, a->logits, m->Vp, m->lnf_16,
                                                   m->wte_16, N, C, m->V),
                      err, fail_final);
        ZS_CHECK_GOTO(zs_cuda_crossentropy_fused_half(m->half, a->logits, m->Vp, a->losses,
                                                      m->targets, N, m->V,
                                                      1.0f / (float)N * m->loss_scale, m->stream),
                      err, fail_final);
    } else {
        ZS_CHECK_GOTO(zs_cuda_residual_layernorm_forward(a->resid + L * NC, a->lnf, a->lnf_mean,
                                                         a->lnf_rstd, a->res2 + (L - 1) * NC,
                                                         a->proj, pf + m->o.lnf_w, pf + m->o.lnf_b,
                                                         N, C, m->stream),
                      err, fail_final);
        ZS_CHECK_GOTO(
            zs_cuda_lm_head_forward(m->blas, a->logits, m->Vp, a->lnf, p0 + m->o.wte, N, C, m->V),
            err, fail_final);
        ZS_CHECK_GOTO(zs_cuda_crossentropy_fused(a->logits, m->Vp, a->losses, m->targets, N, m->V,
                                                 1.0f / (float)N, m->stream),
                      err, fail_final);
    }
    cudaError_t ce = cudaMemcpyAsync(m->losses_host, a->losses, (size_t)N * sizeof(float),
                                     cudaMemcpyDeviceToHost, m->stream);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(m->stream);
    if (ce != cudaSuccess) {
        err = zs_error(ZS_ERR_IO, "model cuda:%d: forward: %s", m->device, cudaGetErrorString(ce));
        goto fail_final;
    }
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        sum += m->losses_host[i];
    *loss = (float)(sum / N);
    m->p0 = p0;
    m->pf = pf;
    m->pending = 1;
    return ZS_OK;

fail_final:
    io->release(io->ctx, L + 1);
fail:
    io->release(io->ctx, 0);
    return err;
}

/* fp16: dlogits carry the scale from the next forward on (the cross-entropy's dloss is
 * scale / N, exact for a power of two), so the whole backward is of the scaled loss. */
static float cuda_loss_scale(void *impl, float scale)
{
    cuda_model *m = impl;
    if (m->precision != ZS_PRECISION_FP16)
        return scale;
    m->loss_scale = scale;
    return 1.0f;
}

static void cuda_finish(void *impl, const zs_gpt2_io *io)
{
    cuda_model *m = impl;
    if (!m->pending)
        return;
    io->release(io->ctx, m->L + 1);
    io->release(io->ctx, 0);
    m->pending = 0;
}

/* bf16 mode: the gradient of the fc layer's pre-activation into m->dbig_16 and its bias
 * gradient, from d loss / d gelu output = m->dres_16 fcproj_w^T: by the GEMM with the DGELU
 * epilogue and the bias kernel, or by the GEMM into the fp32 scratch dbig and the GELU backward
 * kernel. */
static zs_err fc_gelu_backward_half(cuda_model *m, block16 x, const zs_half16 *fcproj_w,
                                    float *dbias, int N)
{
    const int C = m->C;
    int fused = 0;
    ZS_CHECK(zs_cuda_linear_backward_dgelu_half(m->half, m->blas, m->dbig_16, m->dres_16, fcproj_w,
                                                x.fch, N, 4 * C, C, &fused));
    if (fused)
        return zs_cuda_bias_backward_of_half(m->half, dbias, m->dbig_16, N, 4 * C, m->stream);
    if (!m->said_unfused_bwd) {
        m->said_unfused_bwd = 1;
        zs_log(ZS_LOG_WARN,
               "model cuda:%d: cuBLASLt has no algorithm for the DGELU epilogue (%s, %d x %d x "
               "%d): the fc layer's backward runs as a GEMM and the GELU backward kernel",
               m->device, zs_half_name(m->half), N, 4 * C, C);
    }
    ZS_CHECK(zs_cuda_linear_backward_half(m->half, m->blas, m->a.dbig, NULL, m->dres_16, NULL,
                                          fcproj_w, N, 4 * C, C));
    return zs_cuda_bias_gelu_backward_half(m->half, m->dbig_16, dbias, m->a.dbig, x.fch, N, 4 * C,
                                           m->stream);
}

/* Block l (0-based) backward (gpt2.c's block_backward): dres holds d loss / d resid[l+1] on
 * entry and d loss / d resid[l] on return. */
static zs_err block_backward(cuda_model *m, int l, const float *p, float *g)
{
    zs_gpt2_acts *a = &m->a;
    const int B = m->b, T = m->t, C = m->C, N = B * T;
    const size_t *o = m->o.blk + (size_t)l * ZS_BLOCK_TENSORS;
    cudaStream_t s = m->stream;
    const zs_gpt2_block_acts v = zs_gpt2_block_slices(a, &m->cfg, m->max_b, m->max_t, l);
#define PARAM(kind) (p + o[(kind)-ZS_T_LN1_W])
#define GRAD(kind) (g + o[(kind)-ZS_T_LN1_W])
#define W16(kind) (m->blk16 + (o[(kind)-ZS_T_LN1_W] - m->o.layer_begin[l + 1]))
    const int h16 = m->precision != ZS_PRECISION_FP32;
    block16 x = {0};
    if (h16) {
        x = block16_slices(m, l);
        ZS_CHECK(block_weights_half(m, l, p));
        ZS_CHECK(
            zs_cuda_bias_backward_half(m->half, GRAD(ZS_T_FCPROJ_B), m->dres_16, a->dres, N, C, s));
        ZS_CHECK(zs_cuda_linear_backward_half(m->half, m->blas, NULL, GRAD(ZS_T_FCPROJ_W),
                                              m->dres_16, x.gelu, W16(ZS_T_FCPROJ_W), N, 4 * C, C));
        ZS_CHECK(fc_gelu_backward_half(m, x, W16(ZS_T_FCPROJ_W), GRAD(ZS_T_FC_B), N));
        ZS_CHECK(zs_cuda_linear_backward_half(m->half, m->blas, a->dln, GRAD(ZS_T_FC_W), m->dbig_16,
                                              x.ln2, W16(ZS_T_FC_W), N, C, 4 * C));
    } else {
        ZS_CHECK(zs_cuda_linear_backward(m->blas, a->dbig, GRAD(ZS_T_FCPROJ_W), GRAD(ZS_T_FCPROJ_B),
                                         a->dres, v.gelu, PARAM(ZS_T_FCPROJ_W), N, 4 * C, C));
        ZS_CHECK(zs_cuda_bias_gelu_backward(a->dbig, GRAD(ZS_T_FC_B), v.fch, N, 4 * C, s));
        ZS_CHECK(zs_cuda_linear_backward(m->blas, a->dln, GRAD(ZS_T_FC_W), NULL, a->dbig, v.ln2,
                                         PARAM(ZS_T_FC_W), N, C, 4 * C));
    }
    ZS_CHECK(zs_cuda_layernorm_backward(a->dres, GRAD(ZS_T_LN2_W), GRAD(ZS_T_LN2_B), a->dln, v.res2,
                                        PARAM(ZS_T_LN2_W), v.ln2_mean, v.ln2_rstd, N, C, s));
    if (h16) {
        ZS_CHECK(zs_cuda_bias_backward_half(m->half, GRAD(ZS_T_ATTPROJ_B), m->dres_16, a->dres, N,
                                            C, s));
        ZS_CHECK(zs_cuda_linear_backward_half(m->half, m->blas, a->dln, GRAD(ZS_T_ATTPROJ_W),
                                              m->dres_16, x.atty, W16(ZS_T_ATTPROJ_W), N, C, C));
    } else {
        ZS_CHECK(zs_cuda_linear_backward(m->blas, a->dln, GRAD(ZS_T_ATTPROJ_W),
                                         GRAD(ZS_T_ATTPROJ_B), a->dres, v.atty,
                                         PARAM(ZS_T_ATTPROJ_W), N, C, C));
    }
    if (m->fused_attention)
        ZS_CHECK(zs_cuda_attention_fused_backward(a->dbig, a->delta, a->dln, v.qkv, v.atty, v.lse,
                                                  B, T, C, m->NH, s));
    else
        ZS_CHECK(
            zs_cuda_attention_backward(a->dbig, a->datt, a->dln, v.qkv, v.att, B, T, C, m->NH, s));
    if (h16) {
        ZS_CHECK(zs_cuda_bias_backward_half(m->half, GRAD(ZS_T_QKV_B), m->dbig_16, a->dbig, N,
                                            3 * C, s));
        ZS_CHECK(zs_cuda_linear_backward_half(m->half, m->blas, a->dln, GRAD(ZS_T_QKV_W),
                                              m->dbig_16, x.ln1, W16(ZS_T_QKV_W), N, C, 3 * C));
    } else {
        ZS_CHECK(zs_cuda_linear_backward(m->blas, a->dln, GRAD(ZS_T_QKV_W), GRAD(ZS_T_QKV_B),
                                         a->dbig, v.ln1, PARAM(ZS_T_QKV_W), N, C, 3 * C));
    }
    ZS_CHECK(zs_cuda_layernorm_backward(a->dres, GRAD(ZS_T_LN1_W), GRAD(ZS_T_LN1_B), a->dln,
                                        v.resid, PARAM(ZS_T_LN1_W), v.ln1_mean, v.ln1_rstd, N, C,
                                        s));
#undef W16
#undef PARAM
#undef GRAD
    return ZS_OK;
}

static zs_err cuda_backward(void *impl, const zs_gpt2_io *io)
{
    cuda_model *m = impl;
    if (!m->pending)
        return zs_error(ZS_ERR_INVALID, "model cuda: backward without a forward");
    zs_gpt2_acts *a = &m->a;
    const int L = m->L, C = m->C, T = m->t, N = m->b * m->t;
    const size_t NC = (size_t)m->max_b * m->max_t * C;
    const float *p0 = m->p0, *pf = m->pf, *p;
    float *g0, *gf, *g;
    zs_err err;
    int l = 0;
    m->pending = 0;
    /* From here on the layers the forward left acquired (0 and L + 1) are released on every
     * failure, as gpt2.c does: finish() no longer can. */
    cudaError_t ce = cudaSetDevice(m->device);
    if (ce != cudaSuccess) {
        err = runtime_failed(m->device, "backward: cudaSetDevice", ce);
        goto fail_final;
    }

    ZS_CHECK_GOTO(io->grads(io->ctx, L + 1, &gf), err, fail_final);
    ZS_CHECK_GOTO(io->grads(io->ctx, 0, &g0), err, fail_final);
    ZS_CHECK_GOTO(zero_padding(m, L + 1, gf), err, fail_final);
    ZS_CHECK_GOTO(zero_padding(m, 0, g0), err, fail_final);
    if (m->precision != ZS_PRECISION_FP32) /* dlogits: 16-bit over the logits, rows 2Vp apart */
        ZS_CHECK_GOTO(zs_cuda_lm_head_backward_half(m->half, m->blas, a->dln, g0 + m->o.wte,
                                                    (const zs_half16 *)(const void *)a->logits,
                                                    2 * m->Vp, m->lnf_16, m->wte_16, N, C, m->V),
                      err, fail_final);
    else
        ZS_CHECK_GOTO(zs_cuda_lm_head_backward(m->blas, a->dln, g0 + m->o.wte, a->logits, m->Vp,
                                               a->lnf, p0 + m->o.wte, N, C, m->V),
                      err, fail_final);
    if ((ce = cudaMemsetAsync(a->dres, 0, (size_t)N * C * sizeof(float), m->stream)) !=
        cudaSuccess) {
        err = runtime_failed(m->device, "clearing the residual gradient", ce);
        goto fail_final;
    }
    ZS_CHECK_GOTO(zs_cuda_layernorm_backward(a->dres, gf + m->o.lnf_w, gf + m->o.lnf_b, a->dln,
                                             a->resid + L * NC, pf + m->o.lnf_w, a->lnf_mean,
                                             a->lnf_rstd, N, C, m->stream),
                  err, fail_final);
    ZS_CHECK_GOTO(io->grads_done(io->ctx, L + 1), err, fail_final);
    io->release(io->ctx, L + 1);

    for (l = L; l >= 1; l--) {
        ZS_CHECK_GOTO(io->acquire(io->ctx, l, &p), err, fail_embed);
        ZS_CHECK_GOTO(io->grads(io->ctx, l, &g), err, fail_block);
        ZS_CHECK_GOTO(zero_padding(m, l, g), err, fail_block);
        ZS_CHECK_GOTO(block_backward(m, l - 1, p, g), err, fail_block);
        ZS_CHECK_GOTO(io->grads_done(io->ctx, l), err, fail_block);
        io->release(io->ctx, l);
    }

    float *dwpe = g0 + m->o.wpe;
    ZS_CHECK_GOTO(
        zs_cuda_encoder_backward(g0 + m->o.wte, dwpe, a->dres, m->inputs, m->b, T, C, m->stream),
        err, fail_embed);
    if (m->maxT > T &&
        (ce = cudaMemsetAsync(dwpe + (size_t)T * C, 0, (size_t)(m->maxT - T) * C * sizeof(float),
                              m->stream)) != cudaSuccess) {
        err = runtime_failed(m->device, "clearing wpe's unused rows", ce);
        goto fail_embed;
    }
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

static zs_err cuda_alloc(void *impl, size_t bytes, void **out)
{
    cuda_model *m = impl;
    *out = NULL;
    CU(cudaSetDevice(m->device));
    void *p = NULL;
    cudaError_t ce = cudaMalloc(&p, bytes ? bytes : 256);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* not the next kernel's failure (runtime_failed) */
        return zs_error(ZS_ERR_NOMEM, "model cuda:%d: %zu bytes of device memory: %s", m->device,
                        bytes, cudaGetErrorString(ce));
    }
    ce = cudaMemsetAsync(p, 0, bytes, m->stream);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(m->stream);
    if (ce != cudaSuccess) {
        cudaFree(p);
        return runtime_failed(m->device, "clearing new device memory", ce);
    }
    *out = p;
    return ZS_OK;
}

static void cuda_dealloc(void *impl, void *p)
{
    quiesce(impl);
    cudaFree(p);
}

static zs_err cuda_host_alloc(void *impl, size_t bytes, void **out)
{
    cuda_model *m = impl;
    *out = NULL;
    CU(cudaSetDevice(m->device));
    void *p = NULL;
    cudaError_t ce = cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocPortable);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* not the next kernel's failure (runtime_failed) */
        return zs_error(ZS_ERR_NOMEM, "model cuda:%d: %zu bytes of page-locked host memory: %s",
                        m->device, bytes, cudaGetErrorString(ce));
    }
    memset(p, 0, bytes);
    *out = p;
    return ZS_OK;
}

static void cuda_host_free(void *impl, void *p)
{
    quiesce(impl); /* an async copy may still read or write the page-locked buffer */
    cudaFreeHost(p);
}

/* ---- GPUDirect RDMA: device memory exported as a dma-buf (model.h) ---------------------
 * The driver API's calls are taken from the runtime (cudaGetDriverEntryPointByVersion), never
 * linked: a zshard built with the toolkit must start on a host that has no driver. */

/* What an export is aligned and sized to: the driver wants host pages; 2 MiB, the GPU's large
 * page, also keeps the exported range from sharing a GPU page with another allocation. */
#define DMABUF_ALIGN ((size_t)2 << 20)

static struct {
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 get_attribute;
    PFN_cuMemGetHandleForAddressRange_v11070 get_handle;
    PFN_cuMemGetAddressRange_v3020 address_range;
    char why[192]; /* why one is missing; "" when all were found */
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void driver_entry(const char *name, unsigned version, void **fn)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t ce = cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &q);
    if (ce == cudaSuccess && *fn && q == cudaDriverEntryPointSuccess)
        return;
    *fn = NULL;
    if (!drv.why[0])
        snprintf(drv.why, sizeof drv.why, "the CUDA driver gives no %s (CUDA %u.%u): %s", name,
                 version / 1000, version % 1000 / 10,
                 ce != cudaSuccess                              ? cudaGetErrorString(ce)
                 : q == cudaDriverEntryPointVersionNotSufficent ? "the driver is older"
                                                                : "not found");
}

static void load_driver(void)
{
    driver_entry("cuDeviceGet", 2000, (void **)&drv.device_get);
    driver_entry("cuDeviceGetAttribute", 2000, (void **)&drv.get_attribute);
    driver_entry("cuMemGetHandleForAddressRange", 11070, (void **)&drv.get_handle);
    driver_entry("cuMemGetAddressRange", 3020, (void **)&drv.address_range);
}

static zs_err dmabuf_export(cuda_model *m, size_t bytes, void **out, size_t *len, int *fd,
                            uint64_t *offset)
{
    CU(cudaSetDevice(m->device));
    pthread_once(&drv_once, load_driver);
    if (drv.why[0])
        return zs_error(ZS_ERR_UNSUPPORTED, "model cuda:%d: no dma-buf export: %s", m->device,
                        drv.why);
    CUdevice dev;
    int supported = 0;
    CUresult cr = drv.device_get(&dev, m->device);
    if (cr == CUDA_SUCCESS)
        cr = drv.get_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev);
    if (cr != CUDA_SUCCESS)
        return zs_error(ZS_ERR_UNSUPPORTED,
                        "model cuda:%d: asking whether the GPU exports dma-bufs: CUresult %d",
                        m->device, (int)cr);
    if (!supported)
        return zs_error(ZS_ERR_UNSUPPORTED,
                        "model cuda:%d: the GPU or its driver cannot export device memory as a "
                        "dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; it needs Linux 5.12 "
                        "or later and the open kernel modules)",
                        m->device);
    /* The NIC's writes must become visible to the kernels that read a fetched layer: the GPU
     * orders them itself, or it offers the flush zs_model_nic_wrote calls. */
    int ordering = 0, flush = 0;
    CU(cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, m->device));
    CU(cudaDeviceGetAttribute(&flush, cudaDevAttrGPUDirectRDMAFlushWritesOptions, m->device));
    if (ordering < (int)cudaGPUDirectRDMAWritesOrderingOwner &&
        !(flush & cudaFlushGPUDirectRDMAWritesOptionHost))
        return zs_error(ZS_ERR_UNSUPPORTED,
                        "model cuda:%d: the GPU neither orders a NIC's writes to its memory "
                        "(cudaDevAttrGPUDirectRDMAWritesOrdering %d) nor offers their flush "
                        "(cudaDevAttrGPUDirectRDMAFlushWritesOptions %d)",
                        m->device, ordering, flush);
    if (ordering < (int)cudaGPUDirectRDMAWritesOrderingOwner)
        m->nic_flush = 1;
    /* cudaMalloc promises 256-byte alignment only: DMABUF_ALIGN more than the rounded size
     * leaves room for an aligned start inside the allocation. */
    size_t n = (bytes + DMABUF_ALIGN - 1) / DMABUF_ALIGN * DMABUF_ALIGN;
    if (n == 0)
        n = DMABUF_ALIGN;
    void *base = NULL;
    cudaError_t ce = cudaMalloc(&base, n + DMABUF_ALIGN);
    if (ce != cudaSuccess)
        return zs_error(ZS_ERR_NOMEM, "model cuda:%d: %zu bytes of device memory: %s", m->device,
                        n + DMABUF_ALIGN, cudaGetErrorString(ce));
    uintptr_t start = ((uintptr_t)base + DMABUF_ALIGN - 1) / DMABUF_ALIGN * DMABUF_ALIGN;
    ce = cudaMemsetAsync(base, 0, n + DMABUF_ALIGN, m->stream);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(m->stream);
    if (ce != cudaSuccess) {
        cudaFree(base);
        return zs_error(ZS_ERR_IO, "model cuda:%d: clearing %zu bytes: %s", m->device,
                        n + DMABUF_ALIGN, cudaGetErrorString(ce));
    }
    int handle = -1;
    cr = drv.get_handle(&handle, (CUdeviceptr)start, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (cr != CUDA_SUCCESS || handle < 0) {
        cudaFree(base);
        return zs_error(ZS_ERR_UNSUPPORTED,
                        "model cuda:%d: cuMemGetHandleForAddressRange of %zu bytes as a dma-buf: "
                        "CUresult %d",
                        m->device, n, (int)cr);
    }
    *out = (void *)start;
    *len = n;
    *fd = handle;
    *offset = 0; /* the dma-buf is exactly [start, start + n) */
    return ZS_OK;
}

static zs_err cuda_dmabuf_alloc(void *impl, size_t bytes, void **out, size_t *len, int *fd,
                                uint64_t *offset)
{
    cuda_model *m = impl;
    *out = NULL;
    *fd = -1;
    zs_err e = dmabuf_export(m, bytes, out, len, fd, offset);
    /* The caller may go on without GPUDirect (--gpudirect auto): a runtime call that failed
     * here (cudaMalloc out of memory) must not stay the thread's last error, which the next
     * kernel launch reads (zs_cuda_launched) and would report as its own failure. */
    if (e != ZS_OK)
        (void)cudaGetLastError();
    return e;
}

static void cuda_dmabuf_free(void *impl, void *p)
{
    cuda_model *m = impl;
    quiesce(m);
    /* p lies inside the allocation (its aligned start): free the allocation. */
    CUdeviceptr base = 0;
    size_t size = 0;
    if (drv.address_range &&
        drv.address_range(&base, &size, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS)
        cudaFree((void *)(uintptr_t)base);
}

/* A copy on `stream`, waited for: on the compute stream it comes after every kernel enqueued
 * so far (upload, download); on the copy stream it is ordered with no kernel (copy_now). */
static zs_err copy_on(cuda_model *m, cudaStream_t stream, void *dst, const void *src, size_t bytes,
                      int up)
{
    CU(cudaSetDevice(m->device));
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes,
                                     up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(stream);
    if (ce != cudaSuccess)
        return zs_error(ZS_ERR_IO, "model cuda:%d: %s of %zu bytes%s: %s", m->device,
                        up ? "upload" : "download", bytes,
                        stream == m->copies ? " (copy stream)" : "", cudaGetErrorString(ce));
    return ZS_OK;
}

/* A copy on the copy stream, waited for: ordered with no kernel (model.h, copy_now). */
static zs_err cuda_copy_now(void *impl, void *dst, const void *src, size_t bytes, int to_model)
{
    cuda_model *m = impl;
    return copy_on(m, m->copies, dst, src, bytes, to_model);
}

/* RDMA writes into device memory that completed on the NIC are not yet promised to be visible
 * to kernels on every platform: this makes them so for kernels launched after it. */
static zs_err cuda_nic_wrote(void *impl)
{
    cuda_model *m = impl;
    /* Where the GPU orders the writes itself the flush is a no-op that the runtime's
     * documentation says to omit, and such a GPU need not offer it (cuda_dmabuf_alloc takes a
     * GPU that orders them or offers the flush): calling it there could only fail
     * (cudaErrorNotSupported) and fail the worker's step. */
    if (!m->nic_flush)
        return ZS_OK;
    CU(cudaSetDevice(m->device));
    CU(cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                          cudaFlushGPUDirectRDMAWritesToOwner));
    return ZS_OK;
}

static zs_err cuda_upload(void *impl, void *dst, const void *src, size_t bytes)
{
    cuda_model *m = impl;
    return copy_on(m, m->stream, dst, src, bytes, 1);
}

static zs_err cuda_download(void *impl, void *dst, const void *src, size_t bytes)
{
    cuda_model *m = impl;
    return copy_on(m, m->stream, dst, src, bytes, 0);
}

/* The event of ticket t (> 0). */
static cudaEvent_t ticket_event(const cuda_model *m, uint64_t t)
{
    return m->events[(t - 1) % (uint64_t)m->n_events];
}

/* Whether ticket t's event now belongs to a later ticket: then t is done (record). */
static int ticket_recycled(const cuda_model *m, uint64_t t)
{
    return t + (uint64_t)m->n_events < m->next_ticket;
}

/* A new ticket recorded on stream s, once the ticket its event held is done. */
static zs_err record(cuda_model *m, cudaStream_t s, uint64_t *ticket)
{
    uint64_t t = m->next_ticket;
    if (t > (uint64_t)m->n_events)
        CU(cudaEventSynchronize(ticket_event(m, t)));
    CU(cudaEventRecord(ticket_event(m, t), s));
    m->next_ticket = t + 1;
    *ticket = t;
    return ZS_OK;
}

static zs_err cuda_mark(void *impl, uint64_t *ticket)
{
    cuda_model *m = impl;
    CU(cudaSetDevice(m->device));
    return record(m, m->stream, ticket);
}

/* A copy on its direction's copy stream (uploads: copies, downloads: downloads) once ticket
 * `after` is done; *done its own ticket.  Two streams, because in the backward a layer's
 * gradient download waits for that layer's kernels while the next layer's upload need not:
 * on one stream the upload would queue behind it, and the compute behind the upload. */
static zs_err copy_async(cuda_model *m, void *dst, const void *src, size_t bytes, uint64_t after,
                         int up, uint64_t *done)
{
    cudaStream_t s = up ? m->copies : m->downloads;
    CU(cudaSetDevice(m->device));
    if (after && !ticket_recycled(m, after))
        CU(cudaStreamWaitEvent(s, ticket_event(m, after), 0));
    CU(cudaMemcpyAsync(dst, src, bytes, up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    return record(m, s, done);
}

static zs_err cuda_upload_async(void *impl, void *dst, const void *src, size_t bytes,
                                uint64_t after, uint64_t *done)
{
    return copy_async(impl, dst, src, bytes, after, 1, done);
}

static zs_err cuda_download_async(void *impl, void *dst, const void *src, size_t bytes,
                                  uint64_t after, uint64_t *done)
{
    return copy_async(impl, dst, src, bytes, after, 0, done);
}

static zs_err cuda_after(void *impl, uint64_t ticket)
{
    cuda_model *m = impl;
    if (!ticket || ticket_recycled(m, ticket))
        return ZS_OK;
    CU(cudaSetDevice(m->device));
    CU(cudaStreamWaitEvent(m->stream, ticket_event(m, ticket), 0));
    return ZS_OK;
}

static zs_err cuda_sync(void *impl, uint64_t ticket)
{
    cuda_model *m = impl;
    if (!ticket || ticket_recycled(m, ticket))
        return ZS_OK;
    CU(cudaSetDevice(m->device));
    CU(cudaEventSynchronize(ticket_event(m, ticket)));
    return ZS_OK;
}

const zs_model_ops zs_model_cuda_ops = {
    .name = "cuda",
    .create = cuda_create,
    .free = cuda_free,
    .forward = cuda_forward,
    .backward = cuda_backward,
    .loss_scale = cuda_loss_scale,
    .finish = cuda_finish,
    .alloc = cuda_alloc,
    .dealloc = cuda_dealloc,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .mark = cuda_mark,
    .upload_async = cuda_upload_async,
    .download_async = cuda_download_async,
    .after = cuda_after,
    .sync = cuda_sync,
    .dmabuf_alloc = cuda_dmabuf_alloc,
    .dmabuf_free = cuda_dmabuf_free,
    .copy_now = cuda_copy_now,
    .nic_wrote = cuda_nic_wrote,
};
