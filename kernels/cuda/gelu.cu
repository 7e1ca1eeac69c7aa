/*
 * gelu: bias + gelu_new and its backward on the GPU (cuda_kernels.h).  The formulas are
 * kernels/cpu/gelu.c's: gelu(x) = x / (1 + exp(-2 k0 (x + k1 x^3))), which is
 * 0.5 x (1 + tanh(k0 (x + k1 x^3))) written with one exponential, and its derivative from the
 * same exponential.  expf here is CUDA's (2 ulp), not zs_expf: the tolerance table in
 * tests/gpu/test_cuda_kernels.c says what that costs.  The backward's column walk gives each
 * thread a whole column (C threads): simple and deterministic, and enough for C = 4 n_embd.
 *
 * The bf16 mode's pair stores what the GELU epilogue of cuBLASLt stores (matmul.cu): the GELU
 * input and output rounded to bf16 from fp32 values, and the gradient rounded to bf16, with the
 * bias gradient summed from the rounded values; so the two paths differ only in the GELU's code
 * and the product's summation order, and either can stand in for the other.
 */
#include "kernels/cuda/launch.cuh"

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* exp(-2 u(v)), its argument clamped at 88 as zs_vexp clamps it on the CPU: below v = -10.1 the
 * argument passes 88.7 and expf gives inf, and then gelu_grad's e * s is inf * 0, a NaN that
 * would reach every gradient; e^88 keeps both formulas finite (and ~0 there).  Arguments up to 88
 * are unchanged. */
__device__ static inline float gelu_e(float v)
{
    return expf(fminf(-2.0f * (GELU_K0 * (v + GELU_K1 * v * v * v)), 88.0f));
}

__global__ static void bias_gelu_forward_kernel(float *pre, float *out, const float *bias,
                                                long long n, int C)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float x = pre[i];
    if (bias) {
        x += bias[i % C];
        pre[i] = x;
    }
    out[i] = x / (1.0f + gelu_e(x));
}

/* gelu'(v), from the same exponential as the forward. */
__device__ static inline float gelu_grad(float v)
{
    float e = gelu_e(v);
    float s = 1.0f / (1.0f + e);
    float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * v * v);
    return s + v * 2.0f * s * (e * s) * du;
}

/* A thread per column of a chunk of rows (zs_colsum_begin) walks them in order:
 * d = d * gelu'(pre), sums = their sum (when sums). */
__global__ static void bias_gelu_backward_kernel(float *d, float *sums, const float *pre, int N,
                                                 int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, lo, hi;
    if (c >= C)
        return;
    zs_colsum_rows(N, &lo, &hi);
    float acc = 0.0f;
    for (int i = lo; i < hi; i++) {
        size_t k = (size_t)i * C + c;
        float r = d[k] * gelu_grad(pre[k]);
        d[k] = r;
        acc += r;
    }
    if (sums)
        sums[(size_t)blockIdx.y * C + c] = acc;
}

extern "C" zs_err zs_cuda_bias_gelu_forward(float *pre, float *out, const float *bias, int N, int C,
                                            zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_gelu_forward", N, C));
    long long n = (long long)N * C;
    if (n == 0)
        return ZS_OK;
    bias_gelu_forward_kernel<<<zs_cuda_blocks(n, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        pre, out, bias, n, C);
    return zs_cuda_launched("bias_gelu_forward", N, C);
}

extern "C" zs_err zs_cuda_bias_gelu_backward(float *d, float *dbias, const float *pre, int N, int C,
                                             zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_gelu_backward", N, C));
    if (C == 0)
        return ZS_OK;
    float *sums;
    ZS_CHECK(zs_colsum_begin(dbias, N, C, stream, &sums));
    bias_gelu_backward_kernel<<<zs_colsum_grid(N, C), ZS_CUDA_BLOCK, 0, stream>>>(d, sums, pre, N,
                                                                                  C);
    return zs_colsum_end(dbias, sums, N, C, stream, zs_cuda_launched("bias_gelu_backward", N, C));
}

template <typename T>
__global__ static void bias_gelu_forward_half_kernel(T *pre, T *out, const float *prod,
                                                     const float *bias, long long n, int C)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float x = prod[i];
    if (bias)
        x += bias[i % C];
    zs_put(&pre[i], x);
    zs_put(&out[i], x / (1.0f + gelu_e(x)));
}

/* A thread per column of a chunk of rows, rows in order: dpre = 16-bit(d * gelu'(pre)),
 * sums = sum of the rounded (when sums). */
template <typename T>
__global__ static void bias_gelu_backward_half_kernel(T *dpre, float *sums, const float *d,
                                                      const T *pre, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, lo, hi;
    if (c >= C)
        return;
    zs_colsum_rows(N, &lo, &hi);
    float acc = 0.0f;
    for (int i = lo; i < hi; i++) {
        size_t k = (size_t)i * C + c;
        zs_put(&dpre[k], d[k] * gelu_grad(zs_get(&pre[k])));
        acc += zs_get(&dpre[k]);
    }
    if (sums)
        sums[(size_t)blockIdx.y * C + c] = acc;
}

extern "C" zs_err zs_cuda_bias_gelu_forward_half(zs_half_format h, zs_half16 *pre, zs_half16 *out,
                                                 const float *prod, const float *bias, int N, int C,
                                                 zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_gelu_forward_half", N, C));
    long long n = (long long)N * C;
    if (n == 0)
        return ZS_OK;
    ZS_WITH_HALF(h, bias_gelu_forward_half_kernel<T>
                 <<<zs_cuda_blocks(n, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
                     (T *)pre, (T *)out, prod, bias, n, C));
    return zs_cuda_launched("bias_gelu_forward_half", N, C);
}

extern "C" zs_err zs_cuda_bias_gelu_backward_half(zs_half_format h, zs_half16 *dpre, float *dbias,
                                                  const float *d, const zs_half16 *pre, int N,
                                                  int C, zs_cuda_stream stream)
{
    ZS_CHECK(zs_cuda_check_shape("bias_gelu_backward_half", N, C));
    if (C == 0)
        return ZS_OK;
    float *sums;
    ZS_CHECK(zs_colsum_begin(dbias, N, C, stream, &sums));
    ZS_WITH_HALF(h, bias_gelu_backward_half_kernel<T>
                 <<<zs_colsum_grid(N, C), ZS_CUDA_BLOCK, 0, stream>>>((T *)dpre, sums, d,
                                                                      (const T *)pre, N, C));
    return zs_colsum_end(dbias, sums, N, C, stream,
                         zs_cuda_launched("bias_gelu_backward_half", N, C));
}
