/*
 * kernels: the CPU kernels that GPT-2's forward and backward are composed of (kernels/gpt2.c
 * strings them together; the AdamW kernels live in kernels/adamw.h).
 *
 * Everything is fp32, row-major and contiguous.  N is the number of positions B*T, C the
 * channels, OC a layer's output channels, V the vocabulary, NH the heads and hs = C / NH the
 * head size.  Linear weights are in Hugging Face Conv1D layout [in, out], so y = x W + b.
 * The matrix products are BLIS sgemm calls (matmul.c); the rest are plain loops that do their
 * elementwise work while the data is in cache (bias + GELU, residual add + LayerNorm,
 * softmax + cross-entropy + dlogits).
 *
 * Gradient conventions (each kernel's comment says which applies):
 *   activation grads =   the kernel overwrites dinp, except zs_layernorm_backward, whose dinp
 *                        is the residual stream's gradient and which adds into it (+=);
 *   param grads =        the model writes each parameter gradient exactly once per chunk, so
 *                        kernels overwrite; the one exception is zs_encoder_backward's dwte
 *                        (+=), which adds the embedding's share to what zs_lm_head_backward
 *                        wrote into the tied wte gradient.
 * Output buffers may hold garbage (even NaN) before an "=" kernel runs.
 *
 * Threads: every kernel takes `threads`, the OpenMP threads it may use (<= 0: the OpenMP
 * default).  Results are bitwise the same for any thread count: work is split only along
 * independent outputs (rows; or columns, when the kernel sums over rows: whoever takes a
 * block of columns adds their rows in row order), never by splitting one sum, and the
 * matrix products are tiles of C, each a single-threaded BLIS sgemm that never splits k.
 * No atomics, no OpenMP reduction clauses.  A piece's result does not depend on which
 * thread computed it, so the products' tiles (and GELU's column blocks) are handed out as
 * threads come free (schedule(dynamic)); the other loops split statically, which measured
 * faster on a quiet machine (neighbouring pieces on different cores share cache lines'
 * neighbours: attention's backward 1.14 against 1.34 ms, LayerNorm's 240 against 285 us).
 */
#ifndef ZS_KERNELS_H
#define ZS_KERNELS_H

#include <stdint.h>

/* Block of positions along T that the attention kernels work on: the causal mask lets them
 * skip whole blocks above the diagonal. */
#define ZS_ATTN_BLOCK 64

/* ---- matmul.c: BLIS sgemm, linear layers, bias gradient --------------------------------- */

/* threads, resolved: threads itself if > 0, else omp_get_max_threads(). */
int zs_kernel_threads(int threads);

/*
 * Row-major sgemm: C[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C, through BLIS on
 * `threads` threads (1 inside the callers' own OpenMP loops; more: cut into tiles of C that
 * the threads take as they come free, see matmul.c).  op(A) is A stored [m, lda]
 * when trans_a is 0, A^T of A stored [k, lda] when it is 1; op(B) is B stored [k, ldb] when
 * trans_b is 0, B^T of B stored [n, ldb] when it is 1 (transposes are strides, never copies).
 * C is [m, ldc].  beta = 0 never reads C.  Same bits for any thread count.
 */
void zs_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc, int threads);

/* One product for zs_sgemm_many: zs_sgemm's arguments, and an optional bias (n floats):
 * when not NULL, every row of C is first set to it and the product is added (beta is then
 * ignored and taken as 1). */
typedef struct {
    int trans_a, trans_b, m, n, k;
    float alpha;
    const float *a;
    int lda;
    const float *b;
    int ldb;
    float beta;
    float *c;
    int ldc;
    const float *bias;
} zs_gemm;

/* Independent products (no C overlaps another's inputs or C) in one parallel loop over all
 * their tiles: the same bits as one zs_sgemm per product, with one barrier in all. */
void zs_sgemm_many(const zs_gemm *g, int count, int threads);

/* The BLIS sub-configuration (micro-kernel set) zs_sgemm uses: "skx", "haswell", ...  See
 * matmul.c for why it may differ from what BLIS picks by itself. */
const char *zs_sgemm_config(void);

/* Who drives zs_sgemm's products: "zshard" (our loops and packing around BLIS's micro-kernel,
 * where BLIS has no pack kernel for it: matmul.c) or "blis".  zs_sgemm_blis is zs_sgemm on one
 * thread with BLIS driving, for tests that hold the two to the same bits. */
const char *zs_sgemm_driver(void);
void zs_sgemm_blis(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc);

/*
 * out   (N, OC) = inp (N, C) weight (C, OC) + bias (OC)      bias may be NULL
 * Cost: 2*N*C*OC flops.
 */
void zs_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC, int threads);

/*
 * Backward of zs_linear_forward.  activation grads =, param grads =.
 * dinp    (N, C)  = dout (N, OC) weight^T      skipped when dinp is NULL
 * dweight (C, OC) = inp^T dout
 * dbias   (OC)    = sum over rows of dout      skipped when dbias is NULL
 * Cost: 4*N*C*OC flops.
 */
void zs_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC, int threads);

/* dbias (OC) = sum over the N rows of dout (N, OC), in row order.  param grads =. */
void zs_bias_backward(float *dbias, const float *dout, int N, int OC, int threads);

/* ---- vmath.c: vectorized exp, max and dot for the softmax and GELU kernels -------------- */

/* Interleaved partial sums in zs_vexp_sum and zs_vdot: their results do not depend on the
 * vector width the CPU offers, because the summation order is fixed by this number. */
#define ZS_VLANES 16

/* y[i] = exp(x[i]) (y may be x): within ~1.4 ulp on [-87, 88], 0 below, e^88 above, NaN for
 * NaN.  The same bits on every ISA. */
void zs_vexp(float *y, const float *x, int n);

/* The exp of zs_vexp for one value (the same bits). */
float zs_expf(float x);

/* x[i] = exp(x[i] - shift) in place; returns the sum of the new x[i], added in ZS_VLANES
 * interleaved float partial sums that are then added in lane order in double. */
double zs_vexp_sum(float *x, int n, float shift);

/* max of x[0, n) (-inf for n = 0; NaNs are skipped). */
float zs_vmax(const float *x, int n);

/* sum of a[i] * b[i] in ZS_VLANES interleaved partial sums, added in lane order. */
float zs_vdot(const float *a, const float *b, int n);

/* ---- encoder.c: token + position embedding ---------------------------------------------- */

/*
 * out (B, T, C)[b,t,:] = wte (V, C)[inp[b,t],:] + wpe (maxT, C)[t,:]
 * inp (B, T) token ids, each in [0, V) (the caller checks).
 */
void zs_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C, int threads);

/*
 * Backward of zs_encoder_forward.
 * dwte (V, C): += dout[b,t,:] into row inp[b,t] for every position, in position order (param
 *              grads +=: lm_head_backward wrote the tied gradient first);
 * dwpe (maxT, C): rows 0..T-1 = sum over b of dout[b,t,:] (param grads =; rows T.. untouched).
 */
void zs_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                         int T, int C, int threads);

/* ---- layernorm.c: LayerNorm over the last dimension, eps 1e-5, biased variance ----------- */

#define ZS_LAYERNORM_EPS 1e-5f

/*
 * out (N, C) = (inp - mean) * rstd * weight (C) + bias (C), per row
 * mean (N), rstd (N) = 1 / sqrt(var + eps): saved for the backward.
 */
void zs_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C, int threads);

/*
 * The residual add fused with the LayerNorm that reads it, in one pass over each row:
 * res (N, C) = inp1 (N, C) + inp2 (N, C); out, mean, rstd = zs_layernorm_forward of res.
 * res may alias inp1.
 */
void zs_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                   const float *inp1, const float *inp2, const float *weight,
                                   const float *bias, int N, int C, int threads);

/*
 * Backward of zs_layernorm_forward (inp is the forward's input, mean/rstd what it saved).
 * dinp (N, C) += d loss / d inp   (activation grads +=: dinp is the residual gradient)
 * dweight (C) = sum over rows of dout * xhat, dbias (C) = sum over rows of dout (param grads =)
 * The residual add of zs_residual_layernorm_forward needs no kernel of its own: both its
 * inputs receive the gradient of res, so the caller reuses that buffer.
 */
void zs_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C, int threads);

/* ---- gelu.c: bias + GELU, gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ------ */

/*
 * pre (N, C) += bias (C) in place (bias may be NULL): pre is then the GELU input the backward
 * needs; out (N, C) = gelu(pre).
 */
void zs_bias_gelu_forward(float *pre, float *out, const float *bias, int N, int C, int threads);

/*
 * Backward of zs_bias_gelu_forward, in place.
 * d (N, C): in, d loss / d out; out, d loss / d pre = d * gelu'(pre)  (activation grads =)
 * dbias (C) = sum over rows of the new d (param grads =; skipped when NULL)
 */
void zs_bias_gelu_backward(float *d, float *dbias, const float *pre, int N, int C, int threads);

/* ---- attention.c: causal multi-head self-attention (HF GPT2Attention, no dropout) -------- */

/*
 * qkv (B, T, 3C): the c_attn output; channels [0, C) are q, [C, 2C) k, [2C, 3C) v, and head h
 * owns channels [h*hs, (h+1)*hs) of each.  Per (b, h):
 *   att (B, NH, T, T) = softmax(q k^T / sqrt(hs)) with the causal mask, in fp32; entries above
 *                       the diagonal are 0.  Saved for the backward.
 *   out (B, T, C)     = att v, heads merged back into channels.
 * Cost: about 2*B*T*T*C flops (the blocks above the diagonal are skipped).
 */
void zs_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                          int threads);

/*
 * Backward of zs_attention_forward.  activation grads =.
 * dqkv (B, T, 3C) = d loss / d qkv, given dout (B, T, C) and the forward's qkv and att.
 * datt (B, NH, T, T): scratch (d loss / d scores), overwritten.
 */
void zs_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH, int threads);

/* ---- classifier.c: lm_head tied to wte, softmax + cross-entropy ------------------------- */

/* logits (N, V) = inp (N, C) wte (V, C)^T.  Cost: 2*N*C*V flops. */
void zs_lm_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V,
                        int threads);

/*
 * Backward of zs_lm_head_forward.  activation grads =, param grads =.
 * dinp (N, C) = dlogits (N, V) wte;  dwte (V, C) = dlogits^T inp
 */
void zs_lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                         const float *wte, int N, int C, int V, int threads);

/*
 * Softmax, cross-entropy and its gradient in one pass over each row of logits:
 * losses (N)      = -log softmax(logits[i])[targets[i]]
 * logits (N, V)   is overwritten with dlogits = (softmax(logits[i]) - onehot(targets[i])) * dloss
 * targets (N) each in [0, V) (the caller checks).  For the mean loss over N positions,
 * dloss = 1/N.
 */
void zs_crossentropy_fused(float *logits, float *losses, const int32_t *targets, int N, int V,
                           float dloss, int threads);

#endif
