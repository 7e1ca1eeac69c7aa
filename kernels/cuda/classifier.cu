/*
 * classifier: softmax + cross-entropy + its gradient in one pass over each row of logits on
 * the GPU (cuda_kernels.h); kernels/cpu/classifier.c's contract: the logits are overwritten
 * with dlogits = (softmax - onehot) * dloss, and losses[i] = log(sum) - (x[t] - max).
 *
 * A block owns a row (V = 50257 for GPT-2; rows ldl >= V floats apart, the columns from V on
 * neither read nor written): its threads stride over the row, and the row's max
 * and sum are reduced across the block in a fixed tree in shared memory, the sum in double as
 * the CPU's (zs_vexp_sum), so the bits are the same from run to run.
 *
 * The bf16 mode's variant computes the same fp32 values and stores dlogits rounded to bf16 over
 * the row's own bytes: bf16 element j lands on bytes [2j, 2j + 2), inside fp32 element j / 2.
 * The row is written in chunks of CE_BLOCK elements, each thread keeping the columns it owned all
 * along (j = tid + k CE_BLOCK); a chunk's values are all read before the barrier and written after
 * it, and its writes reach fp32 elements below (k + 1) CE_BLOCK / 2, which every thread has read
 * by then (in this chunk or an earlier one), while no later chunk's fp32 element is touched.
 */
#include <stdint.h>

#include "kernels/cuda/launch.cuh"

#define CE_BLOCK 512

/* OutT: float (dlogits over the logits), or a 16-bit type (dlogits rounded to it, in the first
 * half of each row's bytes). */
template <typename OutT>
__global__ static void crossentropy_kernel(float *logits, int ldl, float *losses,
                                           const int32_t *targets, int V, float dloss)
{
    __shared__ float smax[CE_BLOCK];
    __shared__ double ssum[CE_BLOCK];
    __shared__ float s_xt;
    int row = blockIdx.x, tid = threadIdx.x;
    float *x = logits + (size_t)row * ldl;
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
    if (sizeof(OutT) == 2) {
        OutT *xb = (OutT *)x;
        for (int base = 0; base < V; base += CE_BLOCK) {
            int j = base + tid;
            float v = 0.0f;
            if (j < V) {
                v = x[j] * scale; /* as the fp32 kernel: scaled, then the one-hot off */
                if (j == t)
                    v -= dloss;
            }
            __syncthreads();
            if (j < V)
                zs_put(&xb[j], v);
        }
    } else {
        for (int j = tid; j < V; j += CE_BLOCK)
            x[j] *= scale;
        __syncthreads(); /* x[t] scaled by its thread before the one-hot comes off */
        if (tid == 0)
            x[t] -= dloss;
    }
    if (tid == 0)
        losses[row] = (float)(log(total) - ((double)s_xt - (double)mx));
}

extern "C" zs_err zs_cuda_crossentropy_fused(float *logits, int ldl, float *losses,
                                             const int32_t *targets, int N, int V, float dloss,
                                             zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("crossentropy_fused", N, V));
    ZS_CHECK(zs_cuda_check_ldl("crossentropy_fused", ldl, V));
    if (N == 0 || V == 0)
        return ZS_OK;
    crossentropy_kernel<float>
        <<<(unsigned)N, CE_BLOCK, 0, stream>>>(logits, ldl, losses, targets, V, dloss);
    return zs_cuda_launched("crossentropy_fused", N, V);
}

extern "C" zs_err zs_cuda_crossentropy_fused_half(zs_half_format h, float *logits, int ldl,
                                                  float *losses, const int32_t *targets, int N,
                                                  int V, float dloss, zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("crossentropy_fused_half", N, V));
    ZS_CHECK(zs_cuda_check_ldl("crossentropy_fused_half", ldl, V));
    if (N == 0 || V == 0)
        return ZS_OK;
    ZS_WITH_HALF(h, crossentropy_kernel<T>
                 <<<(unsigned)N, CE_BLOCK, 0, stream>>>(logits, ldl, losses, targets, V, dloss));
    return zs_cuda_launched("crossentropy_fused_half", N, V);
}
