/*
 * encoder: GPT-2's input embedding (wte[token] + wpe[position]) and its backward on the GPU
 * (cuda_kernels.h); kernels/cpu/encoder.c's contracts.
 *
 * The backward scatters each position's gradient into its token's row of dwte, and two
 * positions with the same token hit the same row.  Atomics would make the sum order depend on
 * timing, so a thread owns a channel and walks all positions in order, as the CPU's channel
 * blocks do: every element of dwte receives its additions in position order, the CPU's order,
 * so dwte is the CPU's to the bit.  dwpe is a sum over the batch, one thread per (t, c).
 */
#include <stdint.h>

#include "kernels/cuda/launch.cuh"

__global__ static void encoder_forward_kernel(float *out, const int32_t *inp, const float *wte,
                                              const float *wpe, long long n, int T, int C)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    long long bt = i / C;
    int c = (int)(i % C);
    out[i] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)(bt % T) * C + c];
}

__global__ static void encoder_dwte_kernel(float *dwte, const float *dout, const int32_t *inp,
                                           int BT, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int bt = 0; bt < BT; bt++)
        dwte[(size_t)inp[bt] * C + c] += dout[(size_t)bt * C + c];
}

__global__ static void encoder_dwpe_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * C)
        return;
    float s = dout[i];
    for (int b = 1; b < B; b++)
        s += dout[(size_t)b * T * C + i];
    dwpe[i] = s;
}

extern "C" zs_err zs_cuda_encoder_forward(float *out, const int32_t *inp, const float *wte,
                                          const float *wpe, int B, int T, int C,
                                          zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("encoder_forward", B * T, C));
    long long n = (long long)B * T * C;
    if (n == 0)
        return ZS_OK;
    encoder_forward_kernel<<<zs_cuda_blocks(n, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        out, inp, wte, wpe, n, T, C);
    return zs_cuda_launched("encoder_forward", B * T, C);
}

extern "C" zs_err zs_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                           const int32_t *inp, int B, int T, int C,
                                           zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("encoder_backward", B * T, C));
    if (B * T == 0 || C == 0)
        return ZS_OK;
    encoder_dwte_kernel<<<zs_cuda_blocks(C, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        dwte, dout, inp, B * T, C);
    ZS_CHECK(zs_cuda_launched("encoder_backward (dwte)", B * T, C));
    encoder_dwpe_kernel<<<zs_cuda_blocks((long long)T * C, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0,
                          stream>>>(dwpe, dout, B, T, C);
    return zs_cuda_launched("encoder_backward (dwpe)", B * T, C);
}
