/*
 * cuda_kernels: the CUDA counterparts of kernels/kernels.h's CPU kernels, one for one, with the
 * same shapes, the same "param grads =" / "activation grads +=" contracts and the same
 * formulas (gelu_new, LayerNorm eps ZS_LAYERNORM_EPS, biased variance), on device pointers,
 * enqueued on a stream.
 *
 * So far: bias + GELU, LayerNorm (with the residual add), the encoder and the fused
 * cross-entropy, the linear layers through cuBLASLt, and causal attention two ways: a reference
 * kernel (correct and deterministic, not fast: it stores the T x T softmax) and a fused,
 * flash-style one (per-row log-sum-exp instead, tiles in shared memory), which the model uses
 * (ZS_CUDA_ATTENTION, docs/gpu.md).  None of it has run on a GPU yet.
 *
 * This is the fp32 mode, the one checked against the CPU kernels element by element
 * (tests/gpu/test_cuda_kernels.c holds the tolerance of each and why).  bf16 storage with fp32
 * accumulation comes with the GPU worker (issue 14).
 *
 * Determinism: no atomics.  A reduction over rows (a bias's or a LayerNorm weight's gradient)
 * is done by one thread per column walking the rows in order; one over a row (a LayerNorm's
 * mean) by one warp in a fixed shuffle tree.  So for one GPU model and one shape the bits are
 * the same run to run; they are not the CPU's bits (another summation order), which is why the
 * GPU path has its own reference (`zshard train --device cuda`, to come).
 *
 * Every function returns ZS_OK once the kernel is enqueued, or the launch's error with the
 * kernel's name; errors of the kernel's execution surface at the next synchronization.
 * Pointers are device pointers.  This header needs no CUDA header: a stream is the runtime's
 * cudaStream_t (NULL: the legacy default stream).
 */
#ifndef ZS_CUDA_KERNELS_H
#define ZS_CUDA_KERNELS_H

#include <stdint.h>

#include "common/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *zs_cuda_stream; /* cudaStream_t */

/* pre (N, C) += bias (C) (bias may be NULL); out (N, C) = gelu(pre).  zs_bias_gelu_forward. */
zs_err zs_cuda_bias_gelu_forward(float *pre, float *out, const float *bias, int N, int C,
                                 zs_cuda_stream stream);

/* d (N, C) = d * gelu'(pre) in place (activation grads =); dbias (C) = column sums of the new
 * d (param grads =; skipped when NULL).  zs_bias_gelu_backward. */
zs_err zs_cuda_bias_gelu_backward(float *d, float *dbias, const float *pre, int N, int C,
                                  zs_cuda_stream stream);

/* out (N, C) = LayerNorm(inp) * weight + bias; mean (N), rstd (N) saved.  zs_layernorm_forward. */
zs_err zs_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int N, int C,
                                 zs_cuda_stream stream);

/* res = inp1 + inp2 (res may alias inp1), then zs_cuda_layernorm_forward of res.
 * zs_residual_layernorm_forward. */
zs_err zs_cuda_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                          const float *inp1, const float *inp2, const float *weight,
                                          const float *bias, int N, int C, zs_cuda_stream stream);

/* dinp (N, C) += d loss / d inp (activation grads +=); dweight, dbias (C) = column sums
 * (param grads =).  zs_layernorm_backward. */
zs_err zs_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int N, int C, zs_cuda_stream stream);

/* out (B, T, C) = wte[inp] + wpe[t].  inp: device int32 (B, T), each in [0, V) (the caller
 * checks, as on the CPU).  zs_encoder_forward. */
zs_err zs_cuda_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                               int B, int T, int C, zs_cuda_stream stream);

/* dwte (V, C) += dout rows into the tokens' rows, in position order (param grads +=); dwpe rows
 * 0..T-1 = sums over b (param grads =).  zs_encoder_backward: dwte to the bit. */
zs_err zs_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                int B, int T, int C, zs_cuda_stream stream);

/* Causal self-attention, the reference kernel (correct and deterministic, O(T^2) memory): qkv
 * (B, T, 3C) -> out (B, T, C), att (B, NH, T, T) the softmax (zeros above the diagonal) saved for
 * the backward.  zs_attention_forward; C % NH == 0. */
zs_err zs_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                 int NH, zs_cuda_stream stream);

/* dqkv (B, T, 3C) = d loss / d qkv (activation grads =); datt (B, NH, T, T) scratch.
 * zs_attention_backward. */
zs_err zs_cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                                  const float *att, int B, int T, int C, int NH,
                                  zs_cuda_stream stream);

/* Which head sizes hs = C / NH the fused attention below takes: 32, 64, 96 and 128 (GPT-2's
 * is 64).  A lane owns hs / 32 channels of each output row and reads rows as float4s, and up to
 * 128 the backward's accumulators (2 x 8 x hs / 32 floats a thread) stay in registers; other
 * head sizes take the reference attention above. */
int zs_cuda_attention_fused_supports(int hs);

/* Causal self-attention without the T x T matrix (flash attention's scheme, fp32): qkv (B, T, 3C)
 * -> out (B, T, C), lse (B, NH, T) each row's log-sum-exp of its scaled scores, saved for the
 * backward.  zs_attention_forward's formula up to summation order; ZS_ERR_INVALID for a head size
 * zs_cuda_attention_fused_supports refuses. */
zs_err zs_cuda_attention_fused_forward(float *out, float *lse, const float *qkv, int B, int T,
                                       int C, int NH, zs_cuda_stream stream);

/* dqkv (B, T, 3C) = d loss / d qkv (activation grads =), from dout (B, T, C) and the forward's
 * qkv, out and lse; delta (B, NH, T) scratch (rowsum(dout * out)).  Deterministic without
 * atomics: dk and dv of a key tile are summed by the one block that owns it, dq of a query tile
 * by another, each over the other tiles in index order.  zs_attention_backward. */
zs_err zs_cuda_attention_fused_backward(float *dqkv, float *delta, const float *dout,
                                        const float *qkv, const float *out, const float *lse, int B,
                                        int T, int C, int NH, zs_cuda_stream stream);

/* The linear layers' GEMMs go through cuBLASLt: a handle and its workspace, for one stream. */
typedef struct zs_cuda_blas zs_cuda_blas;
zs_err zs_cuda_blas_open(zs_cuda_stream stream, zs_cuda_blas **out);
void zs_cuda_blas_close(zs_cuda_blas *b);

/* out (N, OC) = inp (N, C) weight (C, OC) + bias (OC) (bias may be NULL), on b's stream.
 * zs_linear_forward. */
zs_err zs_cuda_linear_forward(zs_cuda_blas *b, float *out, const float *inp, const float *weight,
                              const float *bias, int N, int C, int OC);

/* dinp (N, C) = dout weight^T (skipped when NULL; activation grads =), dweight (C, OC) =
 * inp^T dout, dbias (OC) = column sums of dout (skipped when NULL; param grads =).
 * zs_linear_backward. */
zs_err zs_cuda_linear_backward(zs_cuda_blas *b, float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight, int N,
                               int C, int OC);

/* logits (N, V) = inp (N, C) wte (V, C)^T.  zs_lm_head_forward. */
zs_err zs_cuda_lm_head_forward(zs_cuda_blas *b, float *logits, const float *inp, const float *wte,
                               int N, int C, int V);

/* dinp (N, C) = dlogits wte, dwte (V, C) = dlogits^T inp (activation grads =, param grads =).
 * zs_lm_head_backward. */
zs_err zs_cuda_lm_head_backward(zs_cuda_blas *b, float *dinp, float *dwte, const float *dlogits,
                                const float *inp, const float *wte, int N, int C, int V);

/* dbias (OC) = sum over the N rows of dout (N, OC), in row order (param grads =). */
zs_err zs_cuda_bias_backward(float *dbias, const float *dout, int N, int OC, zs_cuda_stream stream);

/* losses (N) = cross-entropy of each row; logits (N, V) overwritten with
 * (softmax - onehot(targets)) * dloss.  targets: device int32 (N), each in [0, V).
 * zs_crossentropy_fused. */
zs_err zs_cuda_crossentropy_fused(float *logits, float *losses, const int32_t *targets, int N,
                                  int V, float dloss, zs_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif
