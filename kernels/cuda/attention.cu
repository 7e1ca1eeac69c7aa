/*
 * attention: causal multi-head self-attention (Hugging Face's GPT2Attention, no dropout),
 * forward and backward on the GPU (cuda_kernels.h); kernels/cpu/attention.c's layout and
 * contracts: qkv (B, T, 3C) with q, k, v in channel thirds and head h on channels
 * [h hs, (h+1) hs) of each; att (B, NH, T, T) the softmax, zeros above the diagonal, saved for
 * the backward; datt the same shape, scratch.
 *
 * This is the reference kernel of the GPU path, written for being right and deterministic,
 * not fast: a warp per score row (dot products over hs, the row's max and sum in a fixed
 * butterfly), and a thread per output element for the products with v, q and k, each summing
 * its terms in index order.  No atomics, so the bits repeat run to run.  It moves O(T^2)
 * memory per head; the fast path (cuDNN's fused attention or a flash-style kernel) will be
 * checked against this one.
 *
 * Backward, as on the CPU: dP = dy v^T, dS = P (dP - rowsum(P dP)), dq = dS k / sqrt(hs),
 * dk = dS^T q / sqrt(hs), dv = P^T dy.
 */
#include "kernels/cuda/launch.cuh"

#define ROWS_PER_BLOCK (ZS_CUDA_BLOCK / ZS_WARP)

/* The warp of (bh, i): one causal row of scores, softmaxed in place into att. */
__global__ static void scores_softmax_kernel(float *att, const float *qkv, int B, int T, int C,
                                             int NH, float scale)
{
    long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / ZS_WARP;
    int lane = threadIdx.x % ZS_WARP;
    if (row >= (long long)B * NH * T)
        return;
    int i = (int)(row % T), bh = (int)(row / T), b = bh / NH, h = bh % NH, hs = C / NH;
    const float *base = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    const float *q = base + (size_t)i * 3 * C;
    float *a = att + (size_t)row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= i; j += ZS_WARP) {
        const float *k = base + C + (size_t)j * 3 * C;
        float s = 0.0f;
        for (int d = 0; d < hs; d++)
            s += q[d] * k[d];
        s *= scale;
        a[j] = s;
        mx = fmaxf(mx, s);
    }
    for (int o = ZS_WARP / 2; o > 0; o /= 2)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int j = lane; j <= i; j += ZS_WARP) {
        float e = expf(a[j] - mx);
        a[j] = e;
        sum += e;
    }
    float inv = 1.0f / zs_warp_sum(sum);
    for (int j = lane; j < T; j += ZS_WARP)
        a[j] = j <= i ? a[j] * inv : 0.0f;
}

/* out[b, i, h hs + d] = sum_{j <= i} att[bh, i, j] v[b, j, h hs + d]: a thread an element. */
__global__ static void att_v_kernel(float *out, const float *att, const float *qkv, int B, int T,
                                    int C, int NH)
{
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)B * T * C)
        return;
    int c = (int)(e % C), i = (int)((e / C) % T), b = (int)(e / ((long long)T * C));
    int hs = C / NH, h = c / hs;
    const float *a = att + ((size_t)(b * NH + h) * T + i) * T;
    const float *v = qkv + (size_t)b * T * 3 * C + 2 * C + c;
    float s = 0.0f;
    for (int j = 0; j <= i; j++)
        s += a[j] * v[(size_t)j * 3 * C];
    out[e] = s;
}

/* The warp of (bh, i): dP row = dy_i v_j^T, then the softmax backward, into datt. */
__global__ static void dscores_kernel(float *datt, const float *att, const float *dout,
                                      const float *qkv, int B, int T, int C, int NH)
{
    long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / ZS_WARP;
    int lane = threadIdx.x % ZS_WARP;
    if (row >= (long long)B * NH * T)
        return;
    int i = (int)(row % T), bh = (int)(row / T), b = bh / NH, h = bh % NH, hs = C / NH;
    const float *dy = dout + ((size_t)b * T + i) * C + (size_t)h * hs;
    const float *vbase = qkv + (size_t)b * T * 3 * C + 2 * C + (size_t)h * hs;
    const float *p = att + (size_t)row * T;
    float *dp = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= i; j += ZS_WARP) {
        const float *v = vbase + (size_t)j * 3 * C;
        float s = 0.0f;
        for (int d = 0; d < hs; d++)
            s += dy[d] * v[d];
        dp[j] = s;
        dot += p[j] * s;
    }
    dot = zs_warp_sum(dot);
    for (int j = lane; j < T; j += ZS_WARP)
        dp[j] = j <= i ? p[j] * (dp[j] - dot) : 0.0f;
}

/*
 * dqkv for element (b, t, c) of the q, k or v third: a thread each.
 *   q: dq[t] = scale sum_{j <= t} dS[t, j] k[j];  k: dk[t] = scale sum_{i >= t} dS[i, t] q[i];
 *   v: dv[t] = sum_{i >= t} P[i, t] dy[i].
 */
__global__ static void dqkv_kernel(float *dqkv, const float *datt, const float *att,
                                   const float *dout, const float *qkv, int B, int T, int C, int NH,
                                   float scale)
{
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)B * T * 3 * C)
        return;
    int c3 = (int)(e % (3 * C)), t = (int)((e / (3 * C)) % T);
    int b = (int)(e / ((long long)T * 3 * C));
    int part = c3 / C, c = c3 % C, hs = C / NH, h = c / hs;
    const float *qkv_b = qkv + (size_t)b * T * 3 * C;
    const float *ds = datt + (size_t)(b * NH + h) * T * T;
    const float *p = att + (size_t)(b * NH + h) * T * T;
    float s = 0.0f;
    if (part == 0) {
        for (int j = 0; j <= t; j++)
            s += ds[(size_t)t * T + j] * qkv_b[(size_t)j * 3 * C + C + c];
        s *= scale;
    } else if (part == 1) {
        for (int i = t; i < T; i++)
            s += ds[(size_t)i * T + t] * qkv_b[(size_t)i * 3 * C + c];
        s *= scale;
    } else {
        const float *dy = dout + (size_t)b * T * C + c;
        for (int i = t; i < T; i++)
            s += p[(size_t)i * T + t] * dy[(size_t)i * C];
    }
    dqkv[e] = s;
}

static zs_err check_heads(const char *name, int B, int T, int C, int NH)
{
    if (B < 0 || T < 0 || C < 0 || NH <= 0 || C % NH != 0)
        return zs_error(ZS_ERR_INVALID, "cuda: %s: B %d, T %d, C %d, NH %d", name, B, T, C, NH);
    return ZS_OK;
}

extern "C" zs_err zs_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                            int C, int NH, zs_cuda_stream stream)
{
    ZS_CHECK(check_heads("attention_forward", B, T, C, NH));
    if ((long long)B * T * C == 0)
        return ZS_OK;
    float scale = 1.0f / sqrtf((float)(C / NH));
    long long rows = (long long)B * NH * T;
    scores_softmax_kernel<<<zs_cuda_blocks(rows, ROWS_PER_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        att, qkv, B, T, C, NH, scale);
    ZS_CHECK(zs_cuda_launched("attention_forward (scores)", B * T, C));
    att_v_kernel<<<zs_cuda_blocks((long long)B * T * C, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        out, att, qkv, B, T, C, NH);
    return zs_cuda_launched("attention_forward (att v)", B * T, C);
}

extern "C" zs_err zs_cuda_attention_backward(float *dqkv, float *datt, const float *dout,
                                             const float *qkv, const float *att, int B, int T,
                                             int C, int NH, zs_cuda_stream stream)
{
    ZS_CHECK(check_heads("attention_backward", B, T, C, NH));
    if ((long long)B * T * C == 0)
        return ZS_OK;
    float scale = 1.0f / sqrtf((float)(C / NH));
    long long rows = (long long)B * NH * T;
    dscores_kernel<<<zs_cuda_blocks(rows, ROWS_PER_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        datt, att, dout, qkv, B, T, C, NH);
    ZS_CHECK(zs_cuda_launched("attention_backward (dscores)", B * T, C));
    dqkv_kernel<<<zs_cuda_blocks((long long)B * T * 3 * C, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0,
                  stream>>>(dqkv, datt, att, dout, qkv, B, T, C, NH, scale);
    return zs_cuda_launched("attention_backward (dqkv)", B * T, C);
}
