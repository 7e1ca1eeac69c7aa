/*
 * matmul: the linear layers' GEMMs through cuBLASLt, with the bias added in its epilogue, and
 * their backward (cuda_kernels.h); kernels/kernels.h's zs_linear_forward/backward contracts.
 *
 * Our matrices are row-major and cuBLASLt's column-major, so each product is issued on the
 * transposes, which are the same bytes: out (N, OC) = inp (N, C) W (C, OC) becomes
 * out^T (OC, N) = W^T (OC, C) inp^T (C, N), where W^T and inp^T are W and inp as they lie in
 * memory, read column-major.
 *
 * fp32 mode: CUBLAS_COMPUTE_32F, so no TF32 (the checking mode must match the CPU within the
 * tolerance table).  The 16-bit modes (the *_half functions, bf16 or fp16 by their format): 16-bit
 * A and B, still CUBLAS_COMPUTE_32F with fp32 scale, and an fp32 output and bias, except the GELU
 * epilogue's GEMMs, whose output, aux matrix (the GELU input) and bias are 16-bit because
 * cuBLASLt gives the aux matrix and the bias the output's type.  The epilogue's GELU is cuBLASLt's
 * tanh approximation (docs/gpu.md has what the documentation says and does not: the formula, the
 * aux matrix's leading dimension, a multiple of 8, and why the bias gradient of DGELU_BGRAD is not
 * used).
 *
 * Determinism: the preference allows only algorithms without a split-K reduction
 * (CUBLASLT_REDUCTION_SCHEME_NONE), which would sum partial products in an order that may vary,
 * and the first algorithm of the heuristic is used; cuBLAS gives the same bits run to run on one
 * GPU model, library version and shape.  The heuristic is asked once per shape (with its
 * alignments and epilogue) and a handle keeps its answer, so every later product of that shape
 * runs the same algorithm, and its descriptors cost no heuristic query (about 100 products a
 * GPT-2 step, some 20 shapes).  The preference also states each matrix's actual
 * alignment (a layer's slice of an activation need not be on the 256 bytes the heuristic
 * assumes otherwise).  dbias is our own kernel: column sums in row chunks, then the chunks in
 * order (launch.cuh, zs_colsum_begin).
 */
#include <cublasLt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/launch.cuh"

/* cuBLASLt's workspace: what its heuristics may use for the larger tiles (llm.c uses 32 MiB). */
#define WORKSPACE_BYTES ((size_t)32 << 20)

/* One product's shape: what the heuristic is asked (all one type: no padding, so memcmp
 * compares keys). */
typedef struct {
    int64_t transa, transb, m, n, k, lda, ldb, ldd, aux_ld;
    int64_t ab, d, epi; /* the types and the epilogue */
    /* Every pointer's alignment: A, B and D's are the preference's, and the heuristic reads
     * the bias's and the aux matrix's from the descriptor (0: none), so an algorithm chosen
     * for an aligned bias is never run on a less aligned one. */
    int64_t align_a, align_b, align_d, align_bias, align_aux;
} algo_key;

/* The heuristic's answer for a shape: its status, whether it found an algorithm, and which. */
typedef struct {
    algo_key key;
    cublasStatus_t status;
    int found;
    cublasLtMatmulAlgo_t algo;
} algo_entry;

/* Shapes a handle remembers: a GPT-2 step has about 20 (5 products, forward and 2 backward,
 * some in two alignments); past this, the heuristic is asked every time. */
#define ALGO_CACHE 256

struct zs_cuda_blas {
    cublasLtHandle_t lt;
    void *workspace; /* WORKSPACE_BYTES of device memory */
    zs_cuda_stream stream;
    algo_entry algos[ALGO_CACHE]; /* the heuristic's answers, asked once per shape */
    int n_algos;
};

extern "C" int zs_cuda_blas_shapes(const zs_cuda_blas *b)
{
    return b->n_algos;
}

static zs_err lt_error(const char *what, cublasStatus_t s)
{
    return zs_error(ZS_ERR_INTERNAL, "cublasLt: %s: %s (%s)", what, cublasLtGetStatusName(s),
                    cublasLtGetStatusString(s));
}

extern "C" zs_err zs_cuda_blas_open(zs_cuda_stream stream, zs_cuda_blas **out)
{
    *out = NULL;
    zs_cuda_blas *b = (zs_cuda_blas *)calloc(1, sizeof *b);
    if (!b)
        return zs_error(ZS_ERR_NOMEM, "cublasLt: out of memory");
    cublasStatus_t s = cublasLtCreate(&b->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return lt_error("create", s);
    }
    cudaError_t e = cudaMalloc(&b->workspace, WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        cublasLtDestroy(b->lt);
        free(b);
        return zs_error(ZS_ERR_NOMEM, "cublasLt: a workspace of %zu bytes: %s", WORKSPACE_BYTES,
                        cudaGetErrorString(e));
    }
    b->stream = stream;
    *out = b;
    return ZS_OK;
}

extern "C" void zs_cuda_blas_close(zs_cuda_blas *b)
{
    if (!b)
        return;
    cudaFree(b->workspace);
    cublasLtDestroy(b->lt);
    free(b);
}

/* What a product stores and fuses: the operands' and the output's types, the epilogue and its
 * pointers. */
typedef struct {
    cudaDataType_t ab, d;   /* A and B; D (and C, the same matrix) */
    cublasLtEpilogue_t epi; /* CUBLASLT_EPILOGUE_DEFAULT unless set */
    const void *bias;       /* of type d (cuBLASLt's default bias type) */
    void *aux;              /* the GELU input matrix, of type d, leading dimension aux_ld */
    int64_t aux_ld;
} gemm_kind;

static const gemm_kind FP32 = {CUDA_R_32F, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0};

/* cuBLASLt's type of a 16-bit format. */
static cudaDataType_t half_type(zs_half_format h)
{
    return h == ZS_HALF_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* The largest power of two up to 256 that divides p's address: what the heuristic may assume
 * (its default is 256, which a slice of an activation need not be). */
static uint32_t alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a) != 0)
        a /= 2;
    return a;
}

/* The heuristic's answer for key, or NULL: not asked for that shape yet. */
static const algo_entry *find_algo(const zs_cuda_blas *b, const algo_key *key)
{
    for (int i = 0; i < b->n_algos; i++)
        if (memcmp(&b->algos[i].key, key, sizeof *key) == 0)
            return &b->algos[i];
    return NULL;
}

/* Keeps the heuristic's answer (a failure other than "not supported" is not kept: it is
 * asked again next time). */
static void remember_algo(zs_cuda_blas *b, const algo_key *key, cublasStatus_t status, int found,
                          const cublasLtMatmulAlgo_t *algo)
{
    if (b->n_algos == ALGO_CACHE)
        return;
    algo_entry *e = &b->algos[b->n_algos++];
    e->key = *key;
    e->status = status;
    e->found = found;
    if (status == CUBLAS_STATUS_SUCCESS && found > 0)
        e->algo = *algo;
}

/*
 * D (m, n) = op(A) (m, k) op(B) (k, n) [+ the epilogue of kind], all column-major.  A is stored
 * (transa ? k x m : m x k) with leading dimension lda, B likewise, D with ldd.  With found NULL,
 * no algorithm is an error; otherwise *found says whether one was (and nothing is enqueued when
 * not).
 */
static zs_err gemm(zs_cuda_blas *b, const char *what, int transa, int transb, int m, int n, int k,
                   const void *A, int lda, const void *B, int ldb, void *D, int ldd,
                   const gemm_kind *kind, int *found_out)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s;
    zs_err res = ZS_OK;
    const char *step = "matmul desc";
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = kind->epi;
    uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE;
    uint32_t align_a = alignment(A), align_b = alignment(B), align_d = alignment(D);
    size_t ws = WORKSPACE_BYTES;
    cublasLtMatmulHeuristicResult_t heur;
    algo_key key; /* the shape, for the heuristic's answers kept (find_algo) */
    int64_t aux_ld = kind->aux ? kind->aux_ld : 0;
    int64_t align_bias = kind->bias ? alignment(kind->bias) : 0;
    int64_t align_aux = kind->aux ? alignment(kind->aux) : 0;
    const algo_entry *known;
    int found = 0;
    const float one = 1.0f, zero = 0.0f;

#define LT(call, name)                                                                             \
    do {                                                                                           \
        step = (name);                                                                             \
        if ((s = (call)) != CUBLAS_STATUS_SUCCESS)                                                 \
            goto fail;                                                                             \
    } while (0)
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
       "transa");
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
       "transb");
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
       "epilogue");
    if (kind->bias)
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &kind->bias,
                                          sizeof kind->bias),
           "bias pointer");
    if (kind->aux) {
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                          &kind->aux, sizeof kind->aux),
           "aux pointer");
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &kind->aux_ld,
                                          sizeof kind->aux_ld),
           "aux leading dimension");
    }
    LT(cublasLtMatrixLayoutCreate(&la, kind->ab, transa ? k : m, transa ? m : k, lda), "layout A");
    LT(cublasLtMatrixLayoutCreate(&lb, kind->ab, transb ? n : k, transb ? k : n, ldb), "layout B");
    LT(cublasLtMatrixLayoutCreate(&ld, kind->d, m, n, ldd), "layout D");
    LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws),
       "workspace preference");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                            &schemes, sizeof schemes),
       "reduction scheme preference");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                            &align_a, sizeof align_a),
       "alignment of A");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                            &align_b, sizeof align_b),
       "alignment of B");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                            &align_d, sizeof align_d),
       "alignment of C");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                            &align_d, sizeof align_d),
       "alignment of D");
    key = {transa,   transb,  m,   n,       k,       lda,     ldb,        ldd,      aux_ld,
           kind->ab, kind->d, epi, align_a, align_b, align_d, align_bias, align_aux};
    known = find_algo(b, &key);
    if (known) {
        s = known->status;
        found = known->found;
        heur.algo = known->algo;
    } else {
        s = cublasLtMatmulAlgoGetHeuristic(b->lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
        if (s == CUBLAS_STATUS_SUCCESS || s == CUBLAS_STATUS_NOT_SUPPORTED)
            remember_algo(b, &key, s, found, &heur.algo);
    }
    if (found_out &&
        (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found < 1))) {
        *found_out = 0; /* the caller has another way */
        goto out;
    }
    step = "heuristic";
    if (s != CUBLAS_STATUS_SUCCESS)
        goto fail;
    if (found < 1) {
        res = zs_error(ZS_ERR_INTERNAL,
                       "cublasLt: %s: no algorithm without a split-K reduction for m %d, n %d, "
                       "k %d",
                       what, m, n, k);
        goto out;
    }
    LT(cublasLtMatmul(b->lt, desc, &one, A, la, B, lb, &zero, D, ld, D, ld, &heur.algo,
                      b->workspace, ws, b->stream),
       "matmul");
    if (found_out)
        *found_out = 1;
#undef LT
    goto out;
fail:
    res = lt_error(step, s);
    zs_error_context(res, "%s (m %d, n %d, k %d)", what, m, n, k);
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
    return res;
}

/* kind, with CUBLASLT_EPILOGUE_BIAS adding bias when there is one. */
static gemm_kind with_bias(gemm_kind kind, const float *bias)
{
    if (bias) {
        kind.epi = CUBLASLT_EPILOGUE_BIAS;
        kind.bias = bias;
    }
    return kind;
}

/* gemm of kind FP32 (bias: CUBLASLT_EPILOGUE_BIAS with it), no algorithm an error. */
static zs_err gemm32(zs_cuda_blas *b, const char *what, int transa, int transb, int m, int n, int k,
                     const float *A, int lda, const float *B, int ldb, float *D, int ldd,
                     const float *bias)
{
    gemm_kind kind = with_bias(FP32, bias);
    return gemm(b, what, transa, transb, m, n, k, A, lda, B, ldb, D, ldd, &kind, NULL);
}

/* gemm of 16-bit operands in format h (fp32 output and bias), no algorithm an error. */
static zs_err gemm16(zs_cuda_blas *b, zs_half_format h, const char *what, int transa, int transb,
                     int m, int n, int k, const zs_half16 *A, int lda, const zs_half16 *B, int ldb,
                     float *D, int ldd, const float *bias)
{
    gemm_kind kind = {half_type(h), CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0};
    kind = with_bias(kind, bias);
    return gemm(b, what, transa, transb, m, n, k, A, lda, B, ldb, D, ldd, &kind, NULL);
}

/* sums[chunk * OC + c] = sum over the chunk's rows of dout (N, OC), in row order: a thread a
 * column of a chunk (zs_colsum_begin). */
__global__ static void bias_backward_kernel(float *sums, const float *dout, int N, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, lo, hi;
    if (c >= OC)
        return;
    zs_colsum_rows(N, &lo, &hi);
    float acc = 0.0f;
    for (int i = lo; i < hi; i++)
        acc += dout[(size_t)i * OC + c];
    sums[(size_t)blockIdx.y * OC + c] = acc;
}

extern "C" zs_err zs_cuda_bias_backward(float *dbias, const float *dout, int N, int OC,
                                        zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_backward", N, OC));
    if (OC == 0)
        return ZS_OK;
    float *sums;
    ZS_CHECK(zs_colsum_begin(dbias, N, OC, stream, &sums));
    bias_backward_kernel<<<zs_colsum_grid(N, OC), ZS_CUDA_BLOCK, 0, stream>>>(sums, dout, N, OC);
    return zs_colsum_end(dbias, sums, N, OC, stream, zs_cuda_launched("bias_backward", N, OC));
}

extern "C" zs_err zs_cuda_linear_forward(zs_cuda_blas *b, float *out, const float *inp,
                                         const float *weight, const float *bias, int N, int C,
                                         int OC)
{
    ZS_CHECK(zs_cuda_check_shape("linear_forward", N, C));
    if (N == 0 || OC == 0)
        return ZS_OK;
    /* out^T (OC, N) = W^T (OC, C) inp^T (C, N) [+ bias along OC]. */
    return gemm32(b, "linear_forward", 0, 0, OC, N, C, weight, OC, inp, C, out, OC, bias);
}

extern "C" zs_err zs_cuda_lm_head_forward(zs_cuda_blas *b, float *logits, int ldl, const float *inp,
                                          const float *wte, int N, int C, int V)
{
    ZS_CHECK(zs_cuda_check_shape("lm_head_forward", N, C));
    ZS_CHECK(zs_cuda_check_ldl("lm_head_forward", ldl, V));
    if (N == 0 || V == 0)
        return ZS_OK;
    /* logits^T (V, N) = wte (V, C) inp^T (C, N): wte^T as stored, transposed back. */
    return gemm32(b, "lm_head_forward", 1, 0, V, N, C, wte, C, inp, C, logits, ldl, NULL);
}

extern "C" zs_err zs_cuda_lm_head_backward(zs_cuda_blas *b, float *dinp, float *dwte,
                                           const float *dlogits, int ldl, const float *inp,
                                           const float *wte, int N, int C, int V)
{
    ZS_CHECK(zs_cuda_check_shape("lm_head_backward", N, C));
    ZS_CHECK(zs_cuda_check_ldl("lm_head_backward", ldl, V));
    if (N == 0 || C == 0 || V == 0)
        return ZS_OK;
    /* dinp^T (C, N) = wte^T (C, V) dlogits^T (V, N): both as stored. */
    ZS_CHECK(
        gemm32(b, "lm_head_backward dinp", 0, 0, C, N, V, wte, C, dlogits, ldl, dinp, C, NULL));
    /* dwte^T (C, V) = inp^T (C, N) dlogits (N, V): dlogits^T as stored, transposed back. */
    return gemm32(b, "lm_head_backward dwte", 0, 1, C, V, N, inp, C, dlogits, ldl, dwte, C, NULL);
}

extern "C" zs_err zs_cuda_linear_backward(zs_cuda_blas *b, float *dinp, float *dweight,
                                          float *dbias, const float *dout, const float *inp,
                                          const float *weight, int N, int C, int OC)
{
    ZS_CHECK(zs_cuda_check_shape("linear_backward", N, C));
    if (N == 0 || C == 0 || OC == 0)
        return ZS_OK;
    /* dinp^T (C, N) = W (C, OC) dout^T (OC, N): W^T as stored, transposed back. */
    if (dinp)
        ZS_CHECK(
            gemm32(b, "linear_backward dinp", 1, 0, C, N, OC, weight, OC, dout, OC, dinp, C, NULL));
    /* dweight^T (OC, C) = dout^T (OC, N) inp (N, C): inp^T as stored, transposed back. */
    ZS_CHECK(
        gemm32(b, "linear_backward dweight", 0, 1, OC, C, N, dout, OC, inp, C, dweight, OC, NULL));
    if (dbias)
        ZS_CHECK(zs_cuda_bias_backward(dbias, dout, N, OC, b->stream));
    return ZS_OK;
}

/* The 16-bit modes' products: the same transposes as the fp32 ones above, bf16 or fp16
 * operands (h). */

extern "C" zs_err zs_cuda_linear_forward_half(zs_half_format h, zs_cuda_blas *b, float *out,
                                              const zs_half16 *inp, const zs_half16 *weight,
                                              const float *bias, int N, int C, int OC)
{
    ZS_CHECK(zs_cuda_check_shape("linear_forward_half", N, C));
    if (N == 0 || OC == 0)
        return ZS_OK;
    return gemm16(b, h, "linear_forward_half", 0, 0, OC, N, C, weight, OC, inp, C, out, OC, bias);
}

extern "C" zs_err zs_cuda_linear_backward_half(zs_half_format h, zs_cuda_blas *b, float *dinp,
                                               float *dweight, const zs_half16 *dout,
                                               const zs_half16 *inp, const zs_half16 *weight, int N,
                                               int C, int OC)
{
    ZS_CHECK(zs_cuda_check_shape("linear_backward_half", N, C));
    if (N == 0 || C == 0 || OC == 0)
        return ZS_OK;
    if (dinp)
        ZS_CHECK(gemm16(b, h, "linear_backward_half dinp", 1, 0, C, N, OC, weight, OC, dout, OC,
                        dinp, C, NULL));
    if (dweight)
        ZS_CHECK(gemm16(b, h, "linear_backward_half dweight", 0, 1, OC, C, N, dout, OC, inp, C,
                        dweight, OC, NULL));
    return ZS_OK;
}

extern "C" zs_err zs_cuda_lm_head_forward_half(zs_half_format h, zs_cuda_blas *b, float *logits,
                                               int ldl, const zs_half16 *inp, const zs_half16 *wte,
                                               int N, int C, int V)
{
    ZS_CHECK(zs_cuda_check_shape("lm_head_forward_half", N, C));
    ZS_CHECK(zs_cuda_check_ldl("lm_head_forward_half", ldl, V));
    if (N == 0 || V == 0)
        return ZS_OK;
    return gemm16(b, h, "lm_head_forward_half", 1, 0, V, N, C, wte, C, inp, C, logits, ldl, NULL);
}

extern "C" zs_err zs_cuda_lm_head_backward_half(zs_half_format h, zs_cuda_blas *b, float *dinp,
                                                float *dwte, const zs_half16 *dlogits, int ldl,
                                                const zs_half16 *inp, const zs_half16 *wte, int N,
                                                int C, int V)
{
    ZS_CHECK(zs_cuda_check_shape("lm_head_backward_half", N, C));
    ZS_CHECK(zs_cuda_check_ldl("lm_head_backward_half", ldl, V));
    if (N == 0 || C == 0 || V == 0)
        return ZS_OK;
    /* As the fp32 ones, with dlogits' rows ldl apart. */
    ZS_CHECK(gemm16(b, h, "lm_head_backward_half dinp", 0, 0, C, N, V, wte, C, dlogits, ldl, dinp,
                    C, NULL));
    return gemm16(b, h, "lm_head_backward_half dwte", 0, 1, C, V, N, inp, C, dlogits, ldl, dwte, C,
                  NULL);
}

/*
 * The GELU epilogue.  The aux matrix (the GELU input) has the output's type (16-bit here:
 * cuBLASLt's CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE defaults to it, and only fp8 outputs
 * may differ) and the output's shape, column-major (OC, N): leading dimension OC, which cuBLASLt
 * wants a multiple of 8 and at least the output's rows.  The bias also takes the output's type.
 */
extern "C" zs_err zs_cuda_linear_gelu_forward_half(zs_half_format h, zs_cuda_blas *b,
                                                   zs_half16 *pre, zs_half16 *out,
                                                   const zs_half16 *inp, const zs_half16 *weight,
                                                   const zs_half16 *bias, int N, int C, int OC,
                                                   int *fused)
{
    *fused = 0;
    ZS_CHECK(zs_cuda_check_shape("linear_gelu_forward_half", N, C));
    if (OC % 8 != 0 || N == 0 || C == 0 || OC == 0)
        return ZS_OK;
    gemm_kind kind = {half_type(h), half_type(h), CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre, OC};
    /* out^T (OC, N) = gelu(W^T (OC, C) inp^T (C, N) + bias), pre^T the argument. */
    return gemm(b, "linear_gelu_forward_half", 0, 0, OC, N, C, weight, OC, inp, C, out, OC, &kind,
                fused);
}

extern "C" zs_err zs_cuda_linear_backward_dgelu_half(zs_half_format h, zs_cuda_blas *b,
                                                     zs_half16 *dpre, const zs_half16 *dout,
                                                     const zs_half16 *weight, const zs_half16 *pre,
                                                     int N, int C, int OC, int *fused)
{
    *fused = 0;
    ZS_CHECK(zs_cuda_check_shape("linear_backward_dgelu_half", N, C));
    if (C % 8 != 0 || N == 0 || C == 0 || OC == 0)
        return ZS_OK;
    gemm_kind kind = {half_type(h), half_type(h), CUBLASLT_EPILOGUE_DGELU, NULL, (void *)pre, C};
    /* dpre^T (C, N) = (W (C, OC) dout^T (OC, N)) * gelu'(pre^T): linear_backward's dinp. */
    return gemm(b, "linear_backward_dgelu_half", 1, 0, C, N, OC, weight, OC, dout, OC, dpre, C,
                &kind, fused);
}
