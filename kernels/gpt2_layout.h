/*
 * gpt2_layout: what the CPU model (gpt2.c) and the CUDA model (cuda/model_cuda.c) share, since
 * they compute the same dataflow over the same buffers: where each tensor lies in the flat
 * vector (checked against the shapes the config implies), the gaps of a layer's gradient range
 * that no tensor covers (written as 0 by both), and how the activations for max_b x max_t
 * positions are carved out of one allocation.
 */
#ifndef ZS_GPT2_LAYOUT_H
#define ZS_GPT2_LAYOUT_H

#include <stddef.h>

#include "common/config.h"
#include "common/err.h"
#include "common/tensors.h"

typedef struct {
    size_t offset, numel;
    int layer;
} zs_gpt2_span;

/* Tensor offsets (floats into the flat vector). */
typedef struct {
    size_t wte, wpe, lnf_w, lnf_b;
    size_t *blk;         /* (L, ZS_BLOCK_TENSORS): kind ZS_T_LN1_W + k of block l */
    zs_gpt2_span *spans; /* every tensor, in vector order */
    int n_spans;
    size_t *layer_begin; /* (L + 3) */
} zs_gpt2_offsets;

/* Fills o from tt, checking every tensor's size against cfg (an error names the tensor). */
zs_err zs_gpt2_offsets_init(zs_gpt2_offsets *o, const zs_model_config *cfg,
                            const zs_tensor_table *tt);
void zs_gpt2_offsets_free(zs_gpt2_offsets *o);

/* The gaps of layer's gradient range that no tensor covers: calls gap(ctx, begin, floats) for
 * each, in order; stops at and returns the first failure. */
zs_err zs_gpt2_gaps(const zs_gpt2_offsets *o, int layer,
                    zs_err (*gap)(void *ctx, size_t begin, size_t floats), void *ctx);

/* What the attention keeps for its backward.  The CPU kernel and the CUDA reference kernel keep
 * the softmax, (B, NH, T, T) a layer, and need a scratch of that size; the CUDA fused kernel
 * keeps one log-sum-exp per row, (B, NH, T) a layer, and a scratch of that size.  The layout
 * holds the arrays of one kind only: the other's pointers are NULL. */
typedef enum {
    ZS_GPT2_ATT_PROBS, /* att, datt */
    ZS_GPT2_ATT_LSE,   /* lse, delta */
} zs_gpt2_att_saved;

/* Activations of one forward, sized for max_b x max_t positions; a forward over b x t uses the
 * first N = b*t rows of each (L, ...) slice.  T below is the forward's t. */
typedef struct {
    zs_gpt2_att_saved saved; /* which of att/datt or lse/delta are laid out */
    float *resid;    /* (L+1, N, C) residual stream: [0] embeddings, [l+1] output of block l */
    float *ln1;      /* (L, N, C) */
    float *ln1_mean; /* (L, N) */
    float *ln1_rstd; /* (L, N) */
    float *qkv;      /* (L, N, 3C) c_attn output: q, k, v */
    float *att;      /* (L, B, NH, T, T) attention probabilities, 0 above the diagonal (PROBS) */
    float *lse;      /* (L, B, NH, T) each score row's log-sum-exp (LSE) */
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
    float *dres;  /* (N, C) gradient of the residual stream */
    float *dln;   /* (N, C) gradient of a LayerNorm output, or of atty */
    float *dbig;  /* (N, 4C) gradient of fch_gelu / fch, or (N, 3C) of qkv */
    float *datt;  /* (B, NH, T, T) gradient of the attention scores (PROBS) */
    float *delta; /* (B, NH, T) rowsum(d atty * atty) of a head (LSE) */
} zs_gpt2_acts;

/* Block l's slices of the (L, ...) activations. */
typedef struct {
    float *resid, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *gelu;
    float *lse; /* NULL with PROBS, as att is with LSE */
} zs_gpt2_block_acts;

/* Arrays a caller keeps elsewhere, in another form (the CUDA model's bf16 mode stores these
 * in bf16 only: kernels/cuda/model_cuda.c); zs_gpt2_acts_layout_for's `without` gives them no
 * bytes and a NULL pointer, and zs_gpt2_block_slices NULL slices. */
enum {
    ZS_ACTS_LN1 = 1u << 0,
    ZS_ACTS_LN2 = 1u << 1,
    ZS_ACTS_FCH = 1u << 2,
    ZS_ACTS_FCH_GELU = 1u << 3,
    ZS_ACTS_LNF = 1u << 4,
};

/* Points a's arrays into base, each starting on a multiple of align bytes (a power of two, at
 * least 4), in the order of zs_gpt2_acts, with what the attention saves given by `saved` (the
 * arrays of the other kind take no bytes and are NULL) and without the arrays of the ZS_ACTS_*
 * bits in `without` (no bytes, NULL); with base NULL only counts.  Returns the bytes. */
size_t zs_gpt2_acts_layout_for(zs_gpt2_acts *a, char *base, size_t align,
                               const zs_model_config *cfg, int max_b, int max_t,
                               zs_gpt2_att_saved saved, unsigned without);

/* zs_gpt2_acts_layout_for with ZS_GPT2_ATT_PROBS and every array: the CPU model's layout. */
size_t zs_gpt2_acts_layout(zs_gpt2_acts *a, char *base, size_t align, const zs_model_config *cfg,
                           int max_b, int max_t);

/* Block l's slices of a (the model's max_b x max_t shape). */
zs_gpt2_block_acts zs_gpt2_block_slices(const zs_gpt2_acts *a, const zs_model_config *cfg,
                                        int max_b, int max_t, int l);

#endif
