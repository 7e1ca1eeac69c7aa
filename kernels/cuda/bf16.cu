/*
 * bf16: the bf16 mode's conversions (cuda_kernels.h): fp32 to bf16, and the gradient of a
 * linear layer's output made into its bf16 GEMM operand in the same pass that sums its bias
 * gradient.
 *
 * Invariant: every rounding is __float2bfloat16_rn (to nearest even), so a bf16-representable
 * float converts exactly; every bias gradient is a thread a column walking the rows in order in
 * fp32, as zs_cuda_bias_backward, so its bits do not change from run to run.
 */
#include "kernels/cuda/launch.cuh"

__global__ static void to_bf16_kernel(__nv_bfloat16 *out, const float *in, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = __float2bfloat16_rn(in[i]);
}

/* dout16 = bf16(dout) column by column; dbias[c] = the fp32 column sum (when dbias). */
__global__ static void bias_backward_bf16_kernel(float *dbias, __nv_bfloat16 *dout16,
                                                 const float *dout, int N, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    float acc = 0.0f;
    for (int i = 0; i < N; i++) {
        size_t k = (size_t)i * OC + c;
        float v = dout[k];
        dout16[k] = __float2bfloat16_rn(v);
        acc += v;
    }
    if (dbias)
        dbias[c] = acc;
}

__global__ static void bias_backward_of_bf16_kernel(float *dbias, const __nv_bfloat16 *dout, int N,
                                                    int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    float acc = 0.0f;
    for (int i = 0; i < N; i++)
        acc += __bfloat162float(dout[(size_t)i * OC + c]);
    dbias[c] = acc;
}

extern "C" zs_err zs_cuda_to_bf16(zs_bf16 *out, const float *in, long long n, zs_cuda_stream stream)
{
    if (n < 0)
        return zs_error(ZS_ERR_INVALID, "cuda: to_bf16: %lld elements", n);
    if (n == 0)
        return ZS_OK;
    to_bf16_kernel<<<zs_cuda_blocks(n, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        (__nv_bfloat16 *)out, in, n);
    return zs_cuda_launched("to_bf16", (int)(n < 0x7fffffff ? n : 0x7fffffff), 1);
}

extern "C" zs_err zs_cuda_bias_backward_bf16(float *dbias, zs_bf16 *dout16, const float *dout,
                                             int N, int OC, zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_backward_bf16", N, OC));
    if (OC == 0)
        return ZS_OK;
    /* Without a bias the cast alone, a thread an element: the column walk is for the sum. */
    if (!dbias)
        return zs_cuda_to_bf16(dout16, dout, (long long)N * OC, stream);
    bias_backward_bf16_kernel<<<zs_cuda_blocks(OC, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        dbias, (__nv_bfloat16 *)dout16, dout, N, OC);
    return zs_cuda_launched("bias_backward_bf16", N, OC);
}

extern "C" zs_err zs_cuda_bias_backward_of_bf16(float *dbias, const zs_bf16 *dout, int N, int OC,
                                                zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_backward_of_bf16", N, OC));
    if (OC == 0)
        return ZS_OK;
    bias_backward_of_bf16_kernel<<<zs_cuda_blocks(OC, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        dbias, (const __nv_bfloat16 *)dout, N, OC);
    return zs_cuda_launched("bias_backward_of_bf16", N, OC);
}
