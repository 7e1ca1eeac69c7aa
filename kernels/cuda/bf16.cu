/*
 * bf16: the 16-bit modes' conversions (cuda_kernels.h; the file keeps the first mode's name):
 * fp32 to bf16 or fp16, and the gradient of a linear layer's output made into its 16-bit GEMM
 * operand in the same pass that sums its bias gradient.  Each kernel is a template over the
 * 16-bit type, launched for the format the caller names (ZS_WITH_HALF).
 *
 * Invariant: every rounding is to nearest even (__float2bfloat16_rn, __float2half_rn), so a
 * representable float converts exactly; every bias gradient is fp32 column sums over fixed row
 * chunks, the chunks then added in order (launch.cuh, zs_colsum_begin), as zs_cuda_bias_backward
 * sums, so its bits do not change from run to run.
 */
#include "kernels/cuda/launch.cuh"

template <typename T> __global__ static void to_half_kernel(T *out, const float *in, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        zs_put(&out[i], in[i]);
}

/* dout16 = 16-bit(dout) by a thread per column of a chunk of rows (zs_colsum_begin), rows in
 * order; sums = the fp32 sums of dout. */
template <typename T>
__global__ static void bias_backward_half_kernel(float *sums, T *dout16, const float *dout, int N,
                                                 int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, lo, hi;
    if (c >= OC)
        return;
    zs_colsum_rows(N, &lo, &hi);
    float acc = 0.0f;
    for (int i = lo; i < hi; i++) {
        size_t k = (size_t)i * OC + c;
        float v = dout[k];
        zs_put(&dout16[k], v);
        acc += v;
    }
    sums[(size_t)blockIdx.y * OC + c] = acc;
}

/* sums = the sums of a 16-bit dout, widened: a thread per column of a chunk of rows. */
template <typename T>
__global__ static void bias_backward_of_half_kernel(float *sums, const T *dout, int N, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, lo, hi;
    if (c >= OC)
        return;
    zs_colsum_rows(N, &lo, &hi);
    float acc = 0.0f;
    for (int i = lo; i < hi; i++)
        acc += zs_get(&dout[(size_t)i * OC + c]);
    sums[(size_t)blockIdx.y * OC + c] = acc;
}

extern "C" zs_err zs_cuda_to_half(zs_half_format h, zs_half16 *out, const float *in, long long n,
                                  zs_cuda_stream stream)
{
    if (n < 0)
        return zs_error(ZS_ERR_INVALID, "cuda: to_%s: %lld elements", zs_half_name(h), n);
    if (n == 0)
        return ZS_OK;
    ZS_WITH_HALF(h, to_half_kernel<T>
                 <<<zs_cuda_blocks(n, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>((T *)out, in, n));
    return zs_cuda_launched(h == ZS_HALF_F16 ? "to_fp16" : "to_bf16",
                            (int)(n < 0x7fffffff ? n : 0x7fffffff), 1);
}

extern "C" zs_err zs_cuda_bias_backward_half(zs_half_format h, float *dbias, zs_half16 *dout16,
                                             const float *dout, int N, int OC,
                                             zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_backward_half", N, OC));
    if (OC == 0)
        return ZS_OK;
    /* Without a bias the cast alone, a thread an element: the column walk is for the sum. */
    if (!dbias)
        return zs_cuda_to_half(h, dout16, dout, (long long)N * OC, stream);
    float *sums;
    ZS_CHECK(zs_colsum_begin(dbias, N, OC, stream, &sums));
    ZS_WITH_HALF(
        h, bias_backward_half_kernel<T>
        <<<zs_colsum_grid(N, OC), ZS_CUDA_BLOCK, 0, stream>>>(sums, (T *)dout16, dout, N, OC));
    return zs_colsum_end(dbias, sums, N, OC, stream, zs_cuda_launched("bias_backward_half", N, OC));
}

extern "C" zs_err zs_cuda_bias_backward_of_half(zs_half_format h, float *dbias,
                                                const zs_half16 *dout, int N, int OC,
                                                zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_backward_of_half", N, OC));
    if (OC == 0)
        return ZS_OK;
    float *sums;
    ZS_CHECK(zs_colsum_begin(dbias, N, OC, stream, &sums));
    ZS_WITH_HALF(
        h, bias_backward_of_half_kernel<T>
        <<<zs_colsum_grid(N, OC), ZS_CUDA_BLOCK, 0, stream>>>(sums, (const T *)dout, N, OC));
    return zs_colsum_end(dbias, sums, N, OC, stream,
                         zs_cuda_launched("bias_backward_of_half", N, OC));
}
