/*
 * tensors: the tensor table of GPT-2's flat fp32 parameter vector.
 *
 * All parameters live in one vector of `total` floats.  Each tensor has a Hugging Face name
 * ("transformer.h.3.attn.c_attn.weight"), a shape in HF layout (Conv1D weights are
 * [in, out]) and an offset aligned to ZS_TENSOR_ALIGN floats; the gaps are zero padding
 * that the optimizer leaves at zero.  The layout is layer-contiguous so that one layer is
 * one range of the vector:
 *
 *   layer 0        embeddings: wte [V, C], wpe [T, C]
 *   layer 1 .. L   block l-1:  ln_1.{weight,bias} [C], attn.c_attn.{weight [C,3C], bias [3C]},
 *                              attn.c_proj.{weight [C,C], bias [C]}, ln_2.{weight,bias} [C],
 *                              mlp.c_fc.{weight [C,4C], bias [4C]},
 *                              mlp.c_proj.{weight [4C,C], bias [C]}
 *   layer L + 1    final norm: ln_f.{weight,bias} [C]
 *
 * Every layer range starts and ends on a ZS_TENSOR_ALIGN boundary.  lm_head is tied to wte
 * and has no entry of its own.
 */
#ifndef ZS_TENSORS_H
#define ZS_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"

#define ZS_TENSOR_ALIGN 64 /* floats: 256 bytes */
#define ZS_TENSOR_NAME_MAX 80
#define ZS_TENSOR_MAX_DIMS 2

/* Which GPT-2 tensor a table entry is, within its layer. */
typedef enum {
    ZS_T_WTE,
    ZS_T_WPE,
    ZS_T_LN1_W,
    ZS_T_LN1_B,
    ZS_T_QKV_W,
    ZS_T_QKV_B,
    ZS_T_ATTPROJ_W,
    ZS_T_ATTPROJ_B,
    ZS_T_LN2_W,
    ZS_T_LN2_B,
    ZS_T_FC_W,
    ZS_T_FC_B,
    ZS_T_FCPROJ_W,
    ZS_T_FCPROJ_B,
    ZS_T_LNF_W,
    ZS_T_LNF_B,
} zs_tensor_kind;

#define ZS_BLOCK_TENSORS 12 /* tensors per transformer block */

typedef struct {
    char name[ZS_TENSOR_NAME_MAX]; /* HF name with the "transformer." prefix */
    zs_tensor_kind kind;
    int layer; /* 0 embeddings, 1..L blocks, L+1 final norm */
    int ndim;
    size_t shape[ZS_TENSOR_MAX_DIMS];
    size_t numel;
    size_t offset; /* floats from the start of the vector, aligned */
    int decay;     /* AdamW weight decay applies (ndim >= 2) */
} zs_tensor;

typedef struct {
    zs_tensor *tensors; /* count entries, in vector order */
    int count;
    int n_layers;        /* L + 2 layer ranges */
    size_t *layer_begin; /* n_layers + 1 offsets: layer i is [layer_begin[i], layer_begin[i+1]) */
    size_t total;        /* floats in the vector, padding included */
    size_t n_params;     /* floats that are parameters (padding excluded) */
} zs_tensor_table;

/* Builds the table for a GPT-2 model config. */
zs_err zs_tensors_gpt2(const zs_model_config *model, zs_tensor_table *tt);
void zs_tensors_free(zs_tensor_table *tt);

/* Finds a tensor by HF name, with or without the "transformer." prefix; NULL if none. */
const zs_tensor *zs_tensors_find(const zs_tensor_table *tt, const char *name);

/* The tensor of a kind in block b (kind ZS_T_LN1_W .. ZS_T_FCPROJ_B), or in layer 0 / L+1. */
const zs_tensor *zs_tensors_get(const zs_tensor_table *tt, int block, zs_tensor_kind kind);

/*
 * Visits the parts of [begin, end) that belong to tensors, in order, with the weight-decay
 * flag of each; padding is skipped.  For the optimizer and anything else that treats
 * tensors differently.  fn returns ZS_OK to go on.
 */
typedef zs_err (*zs_tensor_span_fn)(void *ctx, size_t begin, size_t end, const zs_tensor *t);
zs_err zs_tensors_spans(const zs_tensor_table *tt, size_t begin, size_t end, zs_tensor_span_fn fn,
                        void *ctx);

/*
 * Writes [begin, end) of the flat vector, initialized as Hugging Face initializes GPT-2:
 * weights normal(0, 0.02), attn.c_proj and mlp.c_proj weights normal(0, 0.02/sqrt(2L)),
 * LayerNorm weights 1, biases 0, padding 0.  dst holds end - begin floats.  A pure function
 * of (seed, index): any split of the vector gives the same bits.
 */
void zs_tensors_init_gpt2(const zs_tensor_table *tt, uint64_t seed, float *dst, size_t begin,
                          size_t end);

#endif
