/*
 * classifier: softmax + cross-entropy + its gradient in one pass over each row of logits on
 * the GPU (cuda_kernels.h); kernels/cpu/classifier.c's contract: the logits are overwritten
 * with dlogits = (softmax - onehot) * dloss, and losses[i] = log(sum) - (x[t] - max).
 *
 * A block owns a row (V = 50257 for GPT-2): its threads stride over the row, and the row's max
 * and sum are reduced across the block in a fixed tree in shared memory, the sum in double as
 * the CPU's (zs_vexp_sum), so the bits are the same from run to run.
 */
#include <stdint.h>

#include "kernels/cuda/launch.cuh"

#define CE_BLOCK 512

__global__ static void crossentropy_kernel(float *logits, float *losses, const int32_t *targets,
                                           int V, float dloss)
{
    __shared__ float smax[CE_BLOCK];
    __shared__ double ssum[CE_BLOCK];
    __shared__ float s_xt;
    int row = blockIdx.x, tid = threadIdx.x;
    float *x = logits + (size_t)row * V;
    int t = targets[row];
    if (tid == 0)
        s_xt = x[t];
    float m = -INFINITY;
    for (int j = tid; j < V; j += CE_BLOCK)
        m = fmaxf(m, x[j]);
    smax[tid] = m;
    __syncthreads();
    for (int s = CE_BLOCK / 2; s > 0; s /= 2) {
        if (tid < s)
            smax[tid] = fmaxf(smax[tid], smax[tid + s]);
        __syncthreads();
    }
    float mx = smax[0];
    double sum = 0.0;
    for (int j = tid; j < V; j += CE_BLOCK) {
        float e = expf(x[j] - mx);
        x[j] = e;
        sum += e;
    }
    ssum[tid] = sum;
    __syncthreads();
    for (int s = CE_BLOCK / 2; s > 0; s /= 2) {
        if (tid < s)
            ssum[tid] += ssum[tid + s];
        __syncthreads();
    }
    double total = ssum[0];
    float scale = (float)(dloss / total);
    for (int j = tid; j < V; j += CE_BLOCK)
        x[j] *= scale;
    __syncthreads(); /* x[t] scaled by its thread before the one-hot comes off */
    if (tid == 0) {
        losses[row] = (float)(log(total) - ((double)s_xt - (double)mx));
        x[t] -= dloss;
    }
}

extern "C" zs_err zs_cuda_crossentropy_fused(float *logits, float *losses, const int32_t *targets,
                                             int N, int V, float dloss, zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("crossentropy_fused", N, V));
    if (N == 0 || V == 0)
        return ZS_OK;
    crossentropy_kernel<<<(unsigned)N, CE_BLOCK, 0, stream>>>(logits, losses, targets, V, dloss);
    return zs_cuda_launched("crossentropy_fused", N, V);
}
