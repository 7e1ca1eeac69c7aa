/*
 * encoder: GPT-2's input embedding (wte[token] + wpe[position]) and its backward on the GPU
 * (cuda_kernels.h); kernels/cpu/encoder.c's contracts.
 *
 * The backward scatters each position's gradient into its token's row of dwte, and two
 * positions with the same token hit the same row.  Atomics would make the sum order depend on
 * timing.  Instead the positions are grouped by token first: a stable radix sort (CUB's, part of
 * the CUDA toolkit) of the (token, position) pairs keeps each token's positions in position
 * order.  Then a thread owns one channel of one token and adds that token's positions into its
 * element in that order, from the element's value: every element of dwte receives its additions
 * in position order, the CPU's order, so dwte is the CPU's to the bit, and the work spreads over
 * (distinct tokens) x C threads instead of C.  dwpe is a sum over the batch, one thread per
 * (t, c).
 */
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

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

__global__ static void iota_kernel(int32_t *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = i;
}

/* tok[0..BT) sorted, pos[] their positions (ascending within a token): the thread of (i, c)
 * where i starts a token's run adds the run's rows of dout into channel c of the token's row. */
__global__ static void encoder_dwte_kernel(float *dwte, const float *dout, const int32_t *tok,
                                           const int32_t *pos, int BT, int C)
{
    int i = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C || (i > 0 && tok[i] == tok[i - 1]))
        return;
    int32_t t = tok[i];
    float *row = dwte + (size_t)t * C + c;
    float acc = *row;
    for (int j = i; j < BT && tok[j] == t; j++)
        acc += dout[(size_t)pos[j] * C + c];
    *row = acc;
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

/* The scratch of the dwte sort: tokens and positions, in and out, then CUB's temporary storage. */
typedef struct {
    int32_t *tok, *pos_in, *pos;
    void *temp;
    size_t temp_bytes;
} dwte_scratch;

static zs_err dwte_sorted(float *dwte, const float *dout, const int32_t *inp, int BT, int C,
                          zs_cuda_stream stream)
{
    dwte_scratch s = {};
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, s.temp_bytes, inp, s.tok, s.pos_in, s.pos,
                                                    BT, 0, 32, stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return zs_error(ZS_ERR_INTERNAL, "cuda: encoder_backward: sizing the token sort: %s",
                        cudaGetErrorString(e));
    }
    size_t ints = ((size_t)BT * 3 + 63) & ~(size_t)63; /* the temp storage 256-byte aligned */
    void *p = NULL;
    e = cudaMallocAsync(&p, ints * sizeof(int32_t) + s.temp_bytes, stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not the next kernel's failure */
        return zs_error(ZS_ERR_NOMEM, "cuda: encoder_backward: %zu bytes to sort %d tokens: %s",
                        ints * sizeof(int32_t) + s.temp_bytes, BT, cudaGetErrorString(e));
    }
    s.tok = (int32_t *)p;
    s.pos_in = s.tok + BT;
    s.pos = s.pos_in + BT;
    s.temp = (int32_t *)p + ints;
    iota_kernel<<<zs_cuda_blocks(BT, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(s.pos_in, BT);
    zs_err res = zs_cuda_launched("encoder_backward (positions)", BT, C);
    if (res == ZS_OK) {
        e = cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, inp, s.tok, s.pos_in, s.pos, BT,
                                            0, 32, stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            res = zs_error(ZS_ERR_INTERNAL, "cuda: encoder_backward: sorting %d tokens: %s", BT,
                           cudaGetErrorString(e));
        }
    }
    if (res == ZS_OK) {
        dim3 grid((unsigned)BT, (unsigned)zs_cuda_blocks(C, ZS_CUDA_BLOCK));
        encoder_dwte_kernel<<<grid, ZS_CUDA_BLOCK, 0, stream>>>(dwte, dout, s.tok, s.pos, BT, C);
        res = zs_cuda_launched("encoder_backward (dwte)", BT, C);
    }
    cudaFreeAsync(p, stream);
    return res;
}

extern "C" zs_err zs_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                           const int32_t *inp, int B, int T, int C,
                                           zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("encoder_backward", B * T, C));
    if (B * T == 0 || C == 0)
        return ZS_OK;
    ZS_CHECK(dwte_sorted(dwte, dout, inp, B * T, C, stream));
    encoder_dwpe_kernel<<<zs_cuda_blocks((long long)T * C, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0,
                          stream>>>(dwpe, dout, B, T, C);
    return zs_cuda_launched("encoder_backward (dwpe)", B * T, C);
}
