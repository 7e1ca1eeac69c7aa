/*
 * layernorm: LayerNorm (eps ZS_LAYERNORM_EPS, biased variance), the residual add fused into it,
 * and its backward, on the GPU (cuda_kernels.h); kernels/cpu/layernorm.c's formulas.
 *
 * A warp owns a row: lane j sums columns j, j + 32, ... in order, and the warp adds the 32
 * partial sums in a fixed butterfly (zs_warp_sum).  Mean and variance are two passes (x - mean,
 * then its square), as on the CPU.  The backward's dweight and dbias are sums down columns:
 * a thread per column of a chunk of rows walks its rows in order, then the chunks are added in
 * order (launch.cuh, zs_colsum_begin), with no atomics, so the bits do not change from run to
 * run.  The forward's output may be 16-bit (the 16-bit modes' GEMM operand): the same fp32
 * arithmetic, rounded once when stored.
 */
#include "kernels/cuda/launch.cuh"
#include "kernels/kernels.h"

#define ROWS_PER_BLOCK (ZS_CUDA_BLOCK / ZS_WARP)

/* Mean and rstd of row x (C floats), the same in every lane. */
__device__ static void row_stats(const float *x, int C, int lane, float *mean, float *rstd)
{
    float s = 0.0f;
    for (int c = lane; c < C; c += ZS_WARP)
        s += x[c];
    float m = zs_warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += ZS_WARP) {
        float d = x[c] - m;
        v += d * d;
    }
    v = zs_warp_sum(v) / (float)C;
    *mean = m;
    *rstd = 1.0f / sqrtf(v + ZS_LAYERNORM_EPS);
}

/* With inp2: res = inp1 + inp2 first (res may alias inp1); else res is inp1.  OutT: float, or
 * __nv_bfloat16 in the bf16 mode. */
template <typename OutT>
__global__ static void
layernorm_forward_kernel(float *res, OutT *out, float *mean, float *rstd, const float *inp1,
                         const float *inp2, const float *weight, const float *bias, int N, int C)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / ZS_WARP;
    int lane = threadIdx.x % ZS_WARP;
    if (row >= N)
        return;
    size_t off = (size_t)row * C;
    const float *x = inp1 + off;
    if (inp2) {
        for (int c = lane; c < C; c += ZS_WARP)
            res[off + c] = inp1[off + c] + inp2[off + c];
        __syncwarp();
        x = res + off;
    }
    float m, s;
    row_stats(x, C, lane, &m, &s);
    for (int c = lane; c < C; c += ZS_WARP)
        zs_put(&out[off + c], (x[c] - m) * s * weight[c] + bias[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

/* dinp += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = weight dout; a warp a row. */
__global__ static void layernorm_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                             const float *weight, const float *mean,
                                             const float *rstd, int N, int C)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / ZS_WARP;
    int lane = threadIdx.x % ZS_WARP;
    if (row >= N)
        return;
    size_t off = (size_t)row * C;
    const float *x = inp + off, *d = dout + off;
    float m = mean[row], s = rstd[row];
    float sd = 0.0f, sdx = 0.0f;
    for (int c = lane; c < C; c += ZS_WARP) {
        float dn = weight[c] * d[c];
        sd += dn;
        sdx += dn * ((x[c] - m) * s);
    }
    float mean_d = zs_warp_sum(sd) / (float)C, mean_dx = zs_warp_sum(sdx) / (float)C;
    for (int c = lane; c < C; c += ZS_WARP) {
        float xhat = (x[c] - m) * s;
        float dn = weight[c] * d[c];
        dinp[off + c] += (dn - mean_d - xhat * mean_dx) * s;
    }
}

/* Per chunk of rows (zs_colsum_begin): sw = sum of dout xhat, sb = sum of dout, a thread a
 * column of a chunk, rows in order. */
__global__ static void layernorm_dparams_kernel(float *sw, float *sb, const float *dout,
                                                const float *inp, const float *mean,
                                                const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, lo, hi;
    if (c >= C)
        return;
    zs_colsum_rows(N, &lo, &hi);
    float aw = 0.0f, ab = 0.0f;
    for (int i = lo; i < hi; i++) {
        size_t k = (size_t)i * C + c;
        aw += dout[k] * ((inp[k] - mean[i]) * rstd[i]);
        ab += dout[k];
    }
    sw[(size_t)blockIdx.y * C + c] = aw;
    sb[(size_t)blockIdx.y * C + c] = ab;
}

template <typename OutT>
static zs_err forward(const char *name, float *res, OutT *out, float *mean, float *rstd,
                      const float *inp1, const float *inp2, const float *weight, const float *bias,
                      int N, int C, zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape(name, N, C));
    if (N == 0 || C == 0)
        return ZS_OK;
    layernorm_forward_kernel<<<zs_cuda_blocks(N, ROWS_PER_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        res, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    return zs_cuda_launched(name, N, C);
}

extern "C" zs_err zs_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                            const float *weight, const float *bias, int N, int C,
                                            zs_cuda_stream stream)
{
    return forward("layernorm_forward", NULL, out, mean, rstd, inp, NULL, weight, bias, N, C,
                   stream);
}

extern "C" zs_err zs_cuda_residual_layernorm_forward(float *res, float *out, float *mean,
                                                     float *rstd, const float *inp1,
                                                     const float *inp2, const float *weight,
                                                     const float *bias, int N, int C,
                                                     zs_cuda_stream stream)
{
    return forward("residual_layernorm_forward", res, out, mean, rstd, inp1, inp2, weight, bias, N,
                   C, stream);
}

extern "C" zs_err zs_cuda_layernorm_forward_half(zs_half_format h, float *res, zs_half16 *out,
                                                 float *mean, float *rstd, const float *inp1,
                                                 const float *inp2, const float *weight,
                                                 const float *bias, int N, int C,
                                                 zs_cuda_stream stream)
{
    if (h == ZS_HALF_F16)
        return forward("layernorm_forward_fp16", inp2 ? res : NULL, (__half *)out, mean, rstd, inp1,
                       inp2, weight, bias, N, C, stream);
    return forward("layernorm_forward_bf16", inp2 ? res : NULL, (__nv_bfloat16 *)out, mean, rstd,
                   inp1, inp2, weight, bias, N, C, stream);
}

extern "C" zs_err zs_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                             const float *dout, const float *inp,
                                             const float *weight, const float *mean,
                                             const float *rstd, int N, int C, zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("layernorm_backward", N, C));
    if (C == 0)
        return ZS_OK;
    if (N > 0) {
        layernorm_dinp_kernel<<<zs_cuda_blocks(N, ROWS_PER_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
            dinp, dout, inp, weight, mean, rstd, N, C);
        ZS_CHECK(zs_cuda_launched("layernorm_backward (dinp)", N, C));
    }
    float *sw, *sb;
    ZS_CHECK(zs_colsum_begin(dweight, N, C, stream, &sw));
    zs_err e = zs_colsum_begin(dbias, N, C, stream, &sb);
    if (e != ZS_OK)
        return zs_colsum_end(dweight, sw, N, C, stream, e); /* frees sw */
    layernorm_dparams_kernel<<<zs_colsum_grid(N, C), ZS_CUDA_BLOCK, 0, stream>>>(sw, sb, dout, inp,
                                                                                 mean, rstd, N, C);
    e = zs_cuda_launched("layernorm_backward (dweight, dbias)", N, C);
    zs_err eb = zs_colsum_end(dbias, sb, N, C, stream, e);
    return zs_colsum_end(dweight, sw, N, C, stream, eb);
}
