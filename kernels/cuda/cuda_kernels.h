/*
 * cuda_kernels: the CUDA counterparts of kernels/kernels.h's CPU kernels, one for one, with the
 * same shapes, the same "param grads =" / "activation grads +=" contracts and the same
 * formulas (gelu_new, LayerNorm eps ZS_LAYERNORM_EPS, biased variance), on device pointers,
 * enqueued on a stream.
 *
 * So far: bias + GELU, LayerNorm (with the residual add), the encoder and the fused
 * cross-entropy, the linear layers through cuBLASLt (with a GELU epilogue in the 16-bit modes), the
 * 16-bit conversions, and causal attention two ways: a reference kernel (correct and
 * deterministic, not fast: it stores the T x T softmax) and a fused, flash-style one (per-row
 * log-sum-exp instead, tiles in shared memory), which the model uses (ZS_CUDA_ATTENTION,
 * docs/gpu.md).  None of it has run on a GPU yet.
 *
 * Modes (kernels/model.h's zs_precision; docs/precision.md has the table of what is stored how,
 * and why):
 *   - fp32, the checking mode: everything fp32, each kernel checked against its CPU kernel
 *     element by element (tests/gpu/test_cuda_kernels.c holds the tolerance of each and why);
 *   - 16-bit storage with fp32 accumulation, bf16 or fp16: the *_half functions below, whose
 *     first argument is the format.  The GEMMs take 16-bit operands (zs_half16: the value's
 *     bits) and accumulate in fp32 (CUBLAS_COMPUTE_32F); the kernels that produce a GEMM's
 *     operand write it in 16 bits (rounded once, to nearest even, from the fp32 value they
 *     computed); every elementwise formula still runs in fp32.  The fc layer's GEMM can carry
 *     GELU in its epilogue (zs_cuda_linear_gelu_forward_half and its backward), with the
 *     separate kernels as the fallback and the reference.
 *
 * Determinism: no atomics.  A reduction over rows (a bias's or a LayerNorm weight's gradient)
 * sums each column over fixed chunks of 64 rows, rows in order, then the chunks in order (a
 * thread per column and chunk, then a thread per column: launch.cuh's zs_colsum_begin, so that
 * the whole GPU works on it); one over a row (a LayerNorm's mean) by one warp in a fixed
 * shuffle tree.  So for one GPU model and one shape the bits are the same run to run; they are
 * not the CPU's bits (another summation order), which is why the GPU path has its own
 * reference (`zshard train --device cuda`).
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
#include "common/half_format.h"

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
/* The product shapes whose algorithm the handle keeps: cuBLASLt's heuristic is asked once per
 * shape (operations, sizes, leading dimensions, types, epilogue, alignments), and every later
 * product of that shape runs the algorithm it gave. */
int zs_cuda_blas_shapes(const zs_cuda_blas *b);

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

/* logits (N, V) = inp (N, C) wte (V, C)^T, the logits' rows ldl >= V floats apart (the
 * columns from V on untouched: the model pads the rows for the GEMMs' alignment).
 * zs_lm_head_forward. */
zs_err zs_cuda_lm_head_forward(zs_cuda_blas *b, float *logits, int ldl, const float *inp,
                               const float *wte, int N, int C, int V);

/* dinp (N, C) = dlogits wte, dwte (V, C) = dlogits^T inp (activation grads =, param grads =).
 * zs_lm_head_backward. */
zs_err zs_cuda_lm_head_backward(zs_cuda_blas *b, float *dinp, float *dwte, const float *dlogits,
                                int ldl, const float *inp, const float *wte, int N, int C, int V);

/* dbias (OC) = sum over the N rows of dout (N, OC), in the fixed column-sum order (param grads =).
 */
zs_err zs_cuda_bias_backward(float *dbias, const float *dout, int N, int OC, zs_cuda_stream stream);

/* losses (N) = cross-entropy of each row; logits (N, V), rows ldl >= V floats apart (the
 * columns from V on untouched), overwritten with (softmax - onehot(targets)) * dloss.
 * targets: device int32 (N), each in [0, V).  zs_crossentropy_fused. */
zs_err zs_cuda_crossentropy_fused(float *logits, int ldl, float *losses, const int32_t *targets,
                                  int N, int V, float dloss, zs_cuda_stream stream);

/*
 * 16-bit storage (the bf16 and fp16 modes), in format h (common/half_format.h).  Rounding is to
 * nearest even everywhere (__float2bfloat16_rn, __float2half_rn), so a value already
 * representable (the weights of a bf16.enabled or fp16.enabled job) converts exactly.  Below,
 * "bf16" in a comment stands for the format h.
 */
typedef uint16_t zs_half16; /* the bits of a bfloat16 or a binary16 (__nv_bfloat16, __half) */

/* out (n) = in rounded to bf16. */
zs_err zs_cuda_to_half(zs_half_format h, zs_half16 *out, const float *in, long long n,
                       zs_cuda_stream stream);

/* zs_cuda_residual_layernorm_forward with the output rounded to bf16 (the normalization in
 * fp32, as the fp32 kernel computes it); inp2 NULL: no residual add (res is then unused). */
zs_err zs_cuda_layernorm_forward_half(zs_half_format h, float *res, zs_half16 *out, float *mean,
                                      float *rstd, const float *inp1, const float *inp2,
                                      const float *weight, const float *bias, int N, int C,
                                      zs_cuda_stream stream);

/* From a product without its bias, prod (N, C) fp32: x = prod + bias (fp32), pre = bf16(x),
 * out = bf16(gelu(x)) with gelu_new in fp32 on x.  What the GELU epilogue stores. */
zs_err zs_cuda_bias_gelu_forward_half(zs_half_format h, zs_half16 *pre, zs_half16 *out,
                                      const float *prod, const float *bias, int N, int C,
                                      zs_cuda_stream stream);

/* dpre (N, C) = bf16(d * gelu'(pre)) (d fp32, pre bf16); dbias (C) = column sums of the rounded
 * values, in fp32 in the fixed column-sum order (param grads =; skipped when NULL).  The GELU
 * epilogue's backward and the fallback of zs_cuda_linear_backward_dgelu_half. */
zs_err zs_cuda_bias_gelu_backward_half(zs_half_format h, zs_half16 *dpre, float *dbias,
                                       const float *d, const zs_half16 *pre, int N, int C,
                                       zs_cuda_stream stream);

/* dout16 (N, OC) = bf16(dout); dbias (OC) = column sums of the fp32 dout, in the fixed column-sum
 * order (param grads =; skipped when NULL).  One pass: the gradient feeding a linear backward. */
zs_err zs_cuda_bias_backward_half(zs_half_format h, float *dbias, zs_half16 *dout16,
                                  const float *dout, int N, int OC, zs_cuda_stream stream);

/* dbias (OC) = column sums of a bf16 (N, OC), in fp32 in the fixed column-sum order (param grads
 * =). */
zs_err zs_cuda_bias_backward_of_half(zs_half_format h, float *dbias, const zs_half16 *dout, int N,
                                     int OC, zs_cuda_stream stream);

/* zs_cuda_crossentropy_fused with dlogits rounded to bf16 and written over the logits in place:
 * row i's V bf16 values fill the first 2V bytes of row i, so dlogits is an (N, V) bf16
 * matrix with leading dimension 2 ldl (no second (N, V) buffer).  losses as the fp32 one's. */
zs_err zs_cuda_crossentropy_fused_half(zs_half_format h, float *logits, int ldl, float *losses,
                                       const int32_t *targets, int N, int V, float dloss,
                                       zs_cuda_stream stream);

/* zs_cuda_linear_forward with bf16 inp and weight, fp32 accumulation, out and bias. */
zs_err zs_cuda_linear_forward_half(zs_half_format h, zs_cuda_blas *b, float *out,
                                   const zs_half16 *inp, const zs_half16 *weight, const float *bias,
                                   int N, int C, int OC);

/* zs_cuda_linear_backward with bf16 dout, inp and weight, fp32 dinp and dweight (each skipped
 * when NULL); no dbias (the caller takes it from the fp32 gradient: zs_cuda_bias_backward_half). */
zs_err zs_cuda_linear_backward_half(zs_half_format h, zs_cuda_blas *b, float *dinp, float *dweight,
                                    const zs_half16 *dout, const zs_half16 *inp,
                                    const zs_half16 *weight, int N, int C, int OC);

/* zs_cuda_lm_head_forward with bf16 inp and wte. */
zs_err zs_cuda_lm_head_forward_half(zs_half_format h, zs_cuda_blas *b, float *logits, int ldl,
                                    const zs_half16 *inp, const zs_half16 *wte, int N, int C,
                                    int V);

/* zs_cuda_lm_head_backward with bf16 dlogits (row stride ldl 16-bit elements: twice the
 * logits' from zs_cuda_crossentropy_fused_half), inp and wte; fp32 dinp and dwte. */
zs_err zs_cuda_lm_head_backward_half(zs_half_format h, zs_cuda_blas *b, float *dinp, float *dwte,
                                     const zs_half16 *dlogits, int ldl, const zs_half16 *inp,
                                     const zs_half16 *wte, int N, int C, int V);

/*
 * The GELU epilogue (bf16 mode).  cuBLASLt's GELU is the tanh approximation, gelu_new's formula,
 * computed by its own code (other bits than gelu.cu's): docs/gpu.md.
 *
 * zs_cuda_linear_gelu_forward_half: one GEMM with CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
 *   pre (N, OC) = bf16(inp weight + bias), out (N, OC) = bf16(gelu(inp weight + bias)); bias is
 *   bf16 (cuBLASLt's bias takes the output's type).
 * zs_cuda_linear_backward_dgelu_half: the GEMM of the next layer's dinp with
 *   CUBLASLT_EPILOGUE_DGELU: dpre (N, C) = bf16((dout weight^T) * gelu'(pre)), weight (C, OC),
 *   pre (N, C) what the forward stored.  The bias gradient is not taken from cuBLASLt
 *   (DGELU_BGRAD): zs_cuda_bias_backward_of_half sums dpre in a fixed order.
 * Both set *fused = 1 when they enqueued the fused GEMM, and *fused = 0 (returning ZS_OK, with
 * nothing enqueued) when cuBLASLt offers no algorithm for it: OC or C odd (the aux matrix's
 * leading dimension must be a multiple of 8), or none for this GPU and shape.  The caller then
 * runs the separate path: a GEMM, zs_cuda_bias_gelu_forward_half / _backward_half.
 */
zs_err zs_cuda_linear_gelu_forward_half(zs_half_format h, zs_cuda_blas *b, zs_half16 *pre,
                                        zs_half16 *out, const zs_half16 *inp,
                                        const zs_half16 *weight, const zs_half16 *bias, int N,
                                        int C, int OC, int *fused);
zs_err zs_cuda_linear_backward_dgelu_half(zs_half_format h, zs_cuda_blas *b, zs_half16 *dpre,
                                          const zs_half16 *dout, const zs_half16 *weight,
                                          const zs_half16 *pre, int N, int C, int OC, int *fused);

#ifdef __cplusplus
}
#endif

#endif
