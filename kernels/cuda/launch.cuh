/*
 * launch: what every .cu file of kernels/cuda shares: the result of a kernel launch as a
 * zs_err naming the kernel, and the launch shapes.
 */
#ifndef ZS_CUDA_LAUNCH_CUH
#define ZS_CUDA_LAUNCH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_kernels.h"

#define ZS_WARP 32
/* Threads per block of the row kernels (a warp per row) and of the column kernels. */
#define ZS_CUDA_BLOCK 256

/* ZS_OK, or the launch error of the kernel just enqueued, named. */
static inline zs_err zs_cuda_launched(const char *kernel, int N, int C)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return ZS_OK;
    return zs_error(ZS_ERR_INTERNAL, "cuda: %s (N %d, C %d): %s", kernel, N, C,
                    cudaGetErrorString(e));
}

/* Checks the shape every kernel takes: N rows of C columns, neither negative (0: nothing to
 * do). */
static inline zs_err zs_cuda_check_shape(const char *kernel, int N, int C)
{
    if (N < 0 || C < 0)
        return zs_error(ZS_ERR_INVALID, "cuda: %s: shape N %d, C %d", kernel, N, C);
    return ZS_OK;
}

/* Refuses logits' rows closer than V apart (ldl: the row stride, >= V). */
static inline zs_err zs_cuda_check_ldl(const char *kernel, int ldl, int V)
{
    if (ldl < V)
        return zs_error(ZS_ERR_INVALID, "cuda: %s: the logits' row stride %d < V %d", kernel, ldl,
                        V);
    return ZS_OK;
}

static inline unsigned zs_cuda_blocks(long long work, int per_block)
{
    return (unsigned)((work + per_block - 1) / per_block);
}

/* Stores v as T: itself, or rounded to bf16 or fp16 (to nearest even) for the 16-bit modes'
 * operands. */
__device__ static inline void zs_put(float *p, float v)
{
    *p = v;
}
__device__ static inline void zs_put(__nv_bfloat16 *p, float v)
{
    *p = __float2bfloat16_rn(v);
}
__device__ static inline void zs_put(__half *p, float v)
{
    *p = __float2half_rn(v);
}

/* A 16-bit operand widened (exact). */
__device__ static inline float zs_get(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}
__device__ static inline float zs_get(const __half *p)
{
    return __half2float(*p);
}

/* The device type of a 16-bit format: its value's bits are a zs_half16's. */
template <zs_half_format H> struct zs_half_type;
template <> struct zs_half_type<ZS_HALF_BF16> {
    typedef __nv_bfloat16 T;
};
template <> struct zs_half_type<ZS_HALF_F16> {
    typedef __half T;
};

/* The statement(s) after h with T the device type of h (__nv_bfloat16 or __half): how a host
 * function launches the instance of a kernel template for the model's 16-bit format. */
#define ZS_WITH_HALF(h, ...)                                                                       \
    do {                                                                                           \
        if ((h) == ZS_HALF_F16) {                                                                  \
            typedef zs_half_type<ZS_HALF_F16>::T T;                                                \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            typedef zs_half_type<ZS_HALF_BF16>::T T;                                               \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

/*
 * Column sums of an (N, C) matrix that use the whole GPU in a fixed order (colsum.cu): the rows
 * are cut into chunks of ZS_COL_CHUNK, a kernel launched on the grid zs_colsum_grid gives each
 * thread one column of one chunk (zs_colsum_rows), whose rows it adds in order into
 * sums[blockIdx.y * C + c], and zs_colsum_end adds the chunks' sums into out in chunk order.
 *   zs_colsum_begin: *sums = out when one chunk covers N (the kernel writes the result itself)
 *     or out is NULL (nothing to sum), else scratch of zs_colsum_chunks(N) x C floats,
 *     stream-ordered (cudaMallocAsync);
 *   zs_colsum_end: the chunks' sums into out, and the scratch freed (nothing with one chunk);
 *     `launched` is the stage-1 kernel's launch result: when it failed, the scratch is only
 *     freed and that failure returned.
 */
#define ZS_COL_CHUNK 64
int zs_colsum_chunks(int N);
zs_err zs_colsum_begin(float *out, int N, int C, zs_cuda_stream stream, float **sums);
zs_err zs_colsum_end(float *out, float *sums, int N, int C, zs_cuda_stream stream, zs_err launched);

static inline dim3 zs_colsum_grid(int N, int C)
{
    return dim3(zs_cuda_blocks(C, ZS_CUDA_BLOCK), (unsigned)zs_colsum_chunks(N));
}

/* The rows [*lo, *hi) of this block's chunk (blockIdx.y) of N rows. */
__device__ static inline void zs_colsum_rows(int N, int *lo, int *hi)
{
    *lo = (int)blockIdx.y * ZS_COL_CHUNK;
    *hi = *lo + ZS_COL_CHUNK < N ? *lo + ZS_COL_CHUNK : N;
}

/* The sum of v over a warp, in a fixed butterfly order: every lane gets the same bits. */
__device__ static inline float zs_warp_sum(float v)
{
    for (int o = ZS_WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
