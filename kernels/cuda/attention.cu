/*
 * attention: causal multi-head self-attention (Hugging Face's GPT2Attention, no dropout),
 * forward and backward on the GPU (cuda_kernels.h), two ways.  Both follow
 * kernels/cpu/attention.c's layout: qkv (B, T, 3C) with q, k, v in channel thirds and head h on
 * channels [h hs, (h+1) hs) of each; out (B, T, C) the heads merged.
 *
 * The reference kernel (zs_cuda_attention_forward/backward) is written for being right, not
 * fast: att (B, NH, T, T) the softmax, zeros above the diagonal, saved for the backward, and
 * datt the same shape, scratch; a warp per score row (dot products over hs, the row's max and
 * sum in a fixed butterfly), a thread per output element for the products with v, q and k, each
 * summing its terms in index order.  It moves O(T^2) memory per head.  It stays as the check of
 * the fused one (tests/gpu/test_cuda_kernels.c, ZS_CUDA_ATTENTION=reference in the model).
 *
 * The fused kernel (zs_cuda_attention_fused_forward/backward) is flash-attention's scheme in
 * fp32 on the CUDA cores (no tensor cores): nothing of size T x T is ever stored.  The forward
 * keeps, per query row, a running max m and sum l of the exponentials over the key tiles seen so
 * far (the online softmax), rescales its output accumulator when m grows, and saves
 * lse = m + log l per row (B, NH, T) for the backward, which recomputes each probability as
 * exp(s - lse).  Its tiles: a block of 4 warps owns 32 query rows (8 per warp) of one (b, h) and
 * walks the key tiles of 32 rows from key 0 up to its diagonal; each key tile (and the block's q)
 * is staged in shared memory, a lane owns one key of the tile for the scores and hs/32 channels
 * of each output row for the product with v, the probabilities going from lane to lane through
 * a small buffer per warp in shared memory.
 *
 * Backward, as on the CPU: dP = dy v^T, dS = P (dP - rowsum(P dP)), dq = dS k / sqrt(hs),
 * dk = dS^T q / sqrt(hs), dv = P^T dy; the fused one uses rowsum(P dP) = rowsum(dy * out) =: D
 * (B, NH, T), a pass of its own.  Then two kernels, each the sole writer of what it computes, so
 * no atomics: one owns a key tile (dk, dv) and walks the query tiles from its diagonal to T in
 * order, the other owns a query tile (dq) and walks the key tiles from 0 to its diagonal in
 * order.  Both recompute P and dS from q, k, v, dy, lse and D, with the same dot-product order as
 * the forward's, so both see the same bits of dS.
 *
 * Determinism: every sum has a fixed order (index order within a lane, a fixed butterfly across
 * a warp, tiles in index order), so for one GPU model and one shape the bits repeat run to run.
 * Neither way gives the CPU's bits (other summation orders; the fused one also divides by the
 * row sum at the end instead of normalizing P first): tests/gpu/test_cuda_kernels.c bounds each
 * against the CPU kernel and against each other.  Neither has run on a GPU yet (docs/gpu.md).
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

/* ---- The fused attention ---------------------------------------------------------------- */

/* A block is FA_WARPS warps; each owns FA_ROWS rows of the block's tile, so a tile has one row
 * per lane of a warp: the tiles streamed through shared memory are indexed by lane. */
#define FA_WARPS 4
#define FA_ROWS 8
#define FA_TILE (FA_WARPS * FA_ROWS)
#define FA_THREADS (FA_WARPS * ZS_WARP)
static_assert(FA_TILE == ZS_WARP, "a streamed tile has one row per lane");

/* Shared-memory row stride of a tile of head size HS: 4 floats of padding, so that the 8 lanes
 * of a quarter-warp reading float4s of 8 different rows hit 8 different groups of 4 banks
 * ((HS + 4) mod 32 == 4 for HS a multiple of 32). */
template <int HS> struct fa_shape {
    static constexpr int stride = HS + 4;
    static constexpr int per_lane = HS / ZS_WARP; /* channels of an output row a lane owns */
    static constexpr size_t tile_floats = (size_t)FA_TILE * stride;
};

/* A warp's values of its FA_ROWS rows for each of the tile's 32 rows (one per lane), [32][FA_ROWS]:
 * how a probability or a dS goes from the lane that computed it to all lanes (two broadcast
 * float4 reads for the warp's 8 rows, where shuffles would take 8 instructions), a buffer per
 * warp, FA_WARPS in all. */
#define FA_ROWBUF (FA_TILE * FA_ROWS)
static_assert(FA_ROWS % 4 == 0, "rows are moved as float4s");

/* Row `lane` of buf (a warp's [32][FA_ROWS]) = v[0 .. FA_ROWS).  The caller __syncwarp()s before
 * the warp reads it. */
__device__ static inline void fa_put_rows(float *buf, int lane, const float *v)
{
    float4 *d = (float4 *)(buf + lane * FA_ROWS);
#pragma unroll
    for (int r4 = 0; r4 < FA_ROWS / 4; r4++)
        d[r4] = make_float4(v[4 * r4], v[4 * r4 + 1], v[4 * r4 + 2], v[4 * r4 + 3]);
}

/* v[0 .. FA_ROWS) = row j of buf (every lane the same: a broadcast). */
__device__ static inline void fa_get_rows(float *v, const float *buf, int j)
{
    const float4 *src = (const float4 *)(buf + j * FA_ROWS);
#pragma unroll
    for (int r4 = 0; r4 < FA_ROWS / 4; r4++) {
        float4 x = src[r4];
        v[4 * r4] = x.x, v[4 * r4 + 1] = x.y, v[4 * r4 + 2] = x.z, v[4 * r4 + 3] = x.w;
    }
}

/* acc[r][e] += w[r] * x[e] for row j of a tile: x this lane's channels of the tile's row j (rows
 * S::stride apart), w the warp's FA_ROWS values of row j of rowbuf (fa_put_rows).  Each of acc's
 * elements gets one product added, so the sums run in the callers' order of j. */
template <class S>
__device__ static inline void fa_tile_row_acc(float (&acc)[FA_ROWS][S::per_lane],
                                              const float *rowbuf, const float *tile, int j,
                                              int lane)
{
    float x[S::per_lane], w[FA_ROWS];
#pragma unroll
    for (int e = 0; e < S::per_lane; e++)
        x[e] = tile[j * S::stride + e * ZS_WARP + lane];
    fa_get_rows(w, rowbuf, j);
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++)
#pragma unroll
        for (int e = 0; e < S::per_lane; e++)
            acc[r][e] += w[r] * x[e];
}

/* dst row r (stride HS + 4) = src row row0 + r, channels [0, HS) (src rows `stride` apart); rows
 * at or past T are zeros.  The whole block takes part; consecutive threads read consecutive
 * channels. */
template <int HS>
__device__ static void fa_load_tile(float *dst, const float *src, size_t stride, int row0, int T)
{
    for (int e = threadIdx.x; e < FA_TILE * HS; e += blockDim.x) {
        int r = e / HS, c = e % HS, t = row0 + r;
        dst[r * fa_shape<HS>::stride + c] = t < T ? src[(size_t)t * stride + c] : 0.0f;
    }
}

/* acc + a . b over 4 channels, in index order: every kernel below forms its dot products over hs
 * with this, in channel order, so a score recomputed in the backward has the forward's bits. */
__device__ static inline float fa_dot4(float acc, float4 a, float4 b)
{
    acc += a.x * b.x;
    acc += a.y * b.y;
    acc += a.z * b.z;
    acc += a.w * b.w;
    return acc;
}

__device__ static inline float fa_warp_max(float v)
{
    for (int o = ZS_WARP / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The block's tile and head from blockIdx.x: tile-major, so that one launch's blocks of a tile
 * index run together; with reverse set the last (longest, for a query tile: it has the most keys
 * before it) tiles come first. */
__device__ static inline void fa_block(int BH, int T, int reverse, int *tile, int *bh)
{
    int tiles = (T + FA_TILE - 1) / FA_TILE, t = (int)(blockIdx.x / (unsigned)BH);
    *tile = reverse ? tiles - 1 - t : t;
    *bh = (int)(blockIdx.x % (unsigned)BH);
}

/*
 * Forward: the block of (query tile, bh).  Shared: q (its own rows), k and v (the key tile), the
 * warps' row buffers.  Lane j of a warp scores key k0 + j against the warp's FA_ROWS rows; the
 * row's max goes through a fixed butterfly; each lane keeps its own part of the row's sum of
 * exponentials (rescaled with the row), summed by a butterfly at the end; then each lane adds
 * p_ij v_j into the channels it owns, j in order, p_ij from the row buffer.
 */
template <int HS>
__global__ static void __launch_bounds__(FA_THREADS)
    fused_forward_kernel(float *out, float *lse, const float *qkv, int BH, int T, int C, int NH,
                         float scale)
{
    typedef fa_shape<HS> S;
    extern __shared__ float4 fa_smem[];
    float *qs = (float *)fa_smem, *ks = qs + S::tile_floats, *vs = ks + S::tile_floats;
    int tile, bh;
    fa_block(BH, T, 1, &tile, &bh);
    float *pbuf = vs + S::tile_floats + (threadIdx.x / ZS_WARP) * FA_ROWBUF;
    const int b = bh / NH, h = bh % NH, warp = threadIdx.x / ZS_WARP, lane = threadIdx.x % ZS_WARP;
    const int q0 = tile * FA_TILE, row0 = warp * FA_ROWS;
    const size_t C3 = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    fa_load_tile<HS>(qs, base, C3, q0, T);

    float o[FA_ROWS][S::per_lane], m[FA_ROWS], l[FA_ROWS];
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < S::per_lane; e++)
            o[r][e] = 0.0f;
    }
    /* Key 0 is in the first tile and visible to every row (rows past T included: they compute
     * and are not written), so m is finite from the first tile on and exp(m_old - m_new) never
     * sees -inf - -inf. */
    const int kend = min(T, q0 + FA_TILE);
    for (int k0 = 0; k0 < kend; k0 += FA_TILE) {
        __syncthreads(); /* the previous tile's readers are done */
        fa_load_tile<HS>(ks, base + C, C3, k0, T);
        fa_load_tile<HS>(vs, base + 2 * C, C3, k0, T);
        __syncthreads();
        float s[FA_ROWS];
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++)
            s[r] = 0.0f;
        const float4 *kr = (const float4 *)(ks + lane * S::stride);
#pragma unroll 4
        for (int d4 = 0; d4 < HS / 4; d4++) {
            float4 kv = kr[d4];
#pragma unroll
            for (int r = 0; r < FA_ROWS; r++)
                s[r] = fa_dot4(s[r], ((const float4 *)(qs + (row0 + r) * S::stride))[d4], kv);
        }
        const int j = k0 + lane;
        float p[FA_ROWS];
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++) {
            const int i = q0 + row0 + r;
            float sc = j <= i && j < T ? s[r] * scale : -INFINITY;
            float mnew = fmaxf(m[r], fa_warp_max(sc));
            float corr = expf(m[r] - mnew);
            p[r] = expf(sc - mnew);
            l[r] = l[r] * corr + p[r];
            m[r] = mnew;
#pragma unroll
            for (int e = 0; e < S::per_lane; e++)
                o[r][e] *= corr;
        }
        fa_put_rows(pbuf, lane, p);
        __syncwarp();
#pragma unroll 4
        for (int jj = 0; jj < FA_TILE; jj++)
            fa_tile_row_acc<S>(o, pbuf, vs, jj, lane);
    }
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++) {
        const int i = q0 + row0 + r;
        l[r] = zs_warp_sum(l[r]); /* every lane, before any leaves */
        if (i >= T)
            continue;
        float *y = out + ((size_t)b * T + i) * C + (size_t)h * HS;
#pragma unroll
        for (int e = 0; e < S::per_lane; e++)
            y[e * ZS_WARP + lane] = o[r][e] / l[r];
        if (lane == 0)
            lse[(size_t)bh * T + i] = m[r] + logf(l[r]);
    }
}

/* delta[bh, i] = sum_d dout[b, i, h hs + d] out[b, i, h hs + d]: rowsum(P dP) of the backward.
 * A warp per row: lanes over channels in order, then the fixed butterfly. */
__global__ static void fused_delta_kernel(float *delta, const float *dout, const float *out, int B,
                                          int T, int C, int NH)
{
    long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / ZS_WARP;
    int lane = threadIdx.x % ZS_WARP;
    if (row >= (long long)B * NH * T)
        return;
    int i = (int)(row % T), bh = (int)(row / T), b = bh / NH, h = bh % NH, hs = C / NH;
    size_t at = ((size_t)b * T + i) * C + (size_t)h * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += ZS_WARP)
        s += dout[at + d] * out[at + d];
    s = zs_warp_sum(s);
    if (lane == 0)
        delta[row] = s;
}

/*
 * dq: the block of (query tile, bh) walks the key tiles 0 .. its diagonal in order.  Shared: q
 * and dy (its own rows), k and v (the key tile), the warps' row buffers.  Lane j recomputes P
 * and dS of key k0 + j against the warp's rows; then each lane adds dS_ij k_j into the channels
 * of dq it owns, j in order, dS_ij from the row buffer.
 */
template <int HS>
__global__ static void __launch_bounds__(FA_THREADS)
    fused_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                    const float *delta, int BH, int T, int C, int NH, float scale)
{
    typedef fa_shape<HS> S;
    extern __shared__ float4 fa_smem[];
    float *qs = (float *)fa_smem, *dys = qs + S::tile_floats, *ks = dys + S::tile_floats;
    float *vs = ks + S::tile_floats;
    float *dsbuf = vs + S::tile_floats + (threadIdx.x / ZS_WARP) * FA_ROWBUF;
    int tile, bh;
    fa_block(BH, T, 1, &tile, &bh);
    const int b = bh / NH, h = bh % NH, warp = threadIdx.x / ZS_WARP, lane = threadIdx.x % ZS_WARP;
    const int q0 = tile * FA_TILE, row0 = warp * FA_ROWS;
    const size_t C3 = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    fa_load_tile<HS>(qs, base, C3, q0, T);
    fa_load_tile<HS>(dys, dout + (size_t)b * T * C + (size_t)h * HS, (size_t)C, q0, T);

    float dq[FA_ROWS][S::per_lane], li[FA_ROWS], di[FA_ROWS];
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++) {
        const int i = q0 + row0 + r;
        li[r] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
        di[r] = i < T ? delta[(size_t)bh * T + i] : 0.0f;
#pragma unroll
        for (int e = 0; e < S::per_lane; e++)
            dq[r][e] = 0.0f;
    }
    const int kend = min(T, q0 + FA_TILE);
    for (int k0 = 0; k0 < kend; k0 += FA_TILE) {
        __syncthreads();
        fa_load_tile<HS>(ks, base + C, C3, k0, T);
        fa_load_tile<HS>(vs, base + 2 * C, C3, k0, T);
        __syncthreads();
        float s[FA_ROWS], dp[FA_ROWS];
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++)
            s[r] = dp[r] = 0.0f;
        const float4 *kr = (const float4 *)(ks + lane * S::stride);
        const float4 *vr = (const float4 *)(vs + lane * S::stride);
#pragma unroll 2
        for (int d4 = 0; d4 < HS / 4; d4++) {
            float4 kv = kr[d4], vv = vr[d4];
#pragma unroll
            for (int r = 0; r < FA_ROWS; r++) {
                s[r] = fa_dot4(s[r], ((const float4 *)(qs + (row0 + r) * S::stride))[d4], kv);
                dp[r] = fa_dot4(dp[r], ((const float4 *)(dys + (row0 + r) * S::stride))[d4], vv);
            }
        }
        const int j = k0 + lane;
        float ds[FA_ROWS];
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++) {
            const int i = q0 + row0 + r;
            int live = j <= i && i < T;
            float p = live ? expf(s[r] * scale - li[r]) : 0.0f;
            ds[r] = live ? p * (dp[r] - di[r]) : 0.0f;
        }
        fa_put_rows(dsbuf, lane, ds);
        __syncwarp();
#pragma unroll 2
        for (int jj = 0; jj < FA_TILE; jj++)
            fa_tile_row_acc<S>(dq, dsbuf, ks, jj, lane);
    }
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++) {
        const int i = q0 + row0 + r;
        if (i >= T)
            continue;
        float *g = dqkv + ((size_t)b * T + i) * C3 + (size_t)h * HS;
#pragma unroll
        for (int e = 0; e < S::per_lane; e++)
            g[e * ZS_WARP + lane] = dq[r][e] * scale;
    }
}

/*
 * dk, dv: the block of (key tile, bh) walks the query tiles from its own (the first that sees
 * its keys) to T in order.  Shared: k and v (its own rows), q, dy (the query tile), the warps'
 * row buffers for P and dS, lse and D (the query tile).  Lane i recomputes P and dS of query
 * i0 + i against the warp's keys; then each lane adds P_ij dy_i into dv and dS_ij q_i into dk in
 * the channels it owns, i in order.
 */
template <int HS>
__global__ static void __launch_bounds__(FA_THREADS)
    fused_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                     const float *delta, int BH, int T, int C, int NH, float scale)
{
    typedef fa_shape<HS> S;
    extern __shared__ float4 fa_smem[];
    float *ks = (float *)fa_smem, *vs = ks + S::tile_floats, *qs = vs + S::tile_floats;
    float *dys = qs + S::tile_floats, *bufs = dys + S::tile_floats;
    float *pbuf = bufs + (threadIdx.x / ZS_WARP) * FA_ROWBUF;
    float *dsbuf = bufs + (FA_WARPS + threadIdx.x / ZS_WARP) * FA_ROWBUF;
    float *ls = bufs + 2 * FA_WARPS * FA_ROWBUF, *dls = ls + FA_TILE;
    int tile, bh;
    fa_block(BH, T, 0, &tile, &bh);
    const int b = bh / NH, h = bh % NH, warp = threadIdx.x / ZS_WARP, lane = threadIdx.x % ZS_WARP;
    const int k0 = tile * FA_TILE, row0 = warp * FA_ROWS;
    const size_t C3 = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const float *dy = dout + (size_t)b * T * C + (size_t)h * HS;
    fa_load_tile<HS>(ks, base + C, C3, k0, T);
    fa_load_tile<HS>(vs, base + 2 * C, C3, k0, T);

    float dk[FA_ROWS][S::per_lane], dv[FA_ROWS][S::per_lane];
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++)
#pragma unroll
        for (int e = 0; e < S::per_lane; e++)
            dk[r][e] = dv[r][e] = 0.0f;
    /* k0 is a multiple of FA_TILE, so the query tiles that see these keys start at k0. */
    for (int i0 = k0; i0 < T; i0 += FA_TILE) {
        __syncthreads();
        fa_load_tile<HS>(qs, base, C3, i0, T);
        fa_load_tile<HS>(dys, dy, (size_t)C, i0, T);
        if (threadIdx.x < FA_TILE) {
            int i = i0 + threadIdx.x;
            ls[threadIdx.x] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
            dls[threadIdx.x] = i < T ? delta[(size_t)bh * T + i] : 0.0f;
        }
        __syncthreads();
        float s[FA_ROWS], dp[FA_ROWS];
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++)
            s[r] = dp[r] = 0.0f;
        const float4 *qr = (const float4 *)(qs + lane * S::stride);
        const float4 *dyr = (const float4 *)(dys + lane * S::stride);
#pragma unroll 2
        for (int d4 = 0; d4 < HS / 4; d4++) {
            float4 qv = qr[d4], dyv = dyr[d4];
            /* The forward's operand order (q . k, dy . v): the same products, the same sums. */
#pragma unroll
            for (int r = 0; r < FA_ROWS; r++) {
                s[r] = fa_dot4(s[r], qv, ((const float4 *)(ks + (row0 + r) * S::stride))[d4]);
                dp[r] = fa_dot4(dp[r], dyv, ((const float4 *)(vs + (row0 + r) * S::stride))[d4]);
            }
        }
        const int i = i0 + lane;
        const float li = ls[lane], di = dls[lane];
        float p[FA_ROWS], ds[FA_ROWS];
#pragma unroll
        for (int r = 0; r < FA_ROWS; r++) {
            const int j = k0 + row0 + r;
            int live = j <= i && i < T;
            p[r] = live ? expf(s[r] * scale - li) : 0.0f;
            ds[r] = live ? p[r] * (dp[r] - di) : 0.0f;
        }
        fa_put_rows(pbuf, lane, p);
        fa_put_rows(dsbuf, lane, ds);
        __syncwarp();
#pragma unroll 2
        for (int ii = 0; ii < FA_TILE; ii++) {
            fa_tile_row_acc<S>(dv, pbuf, dys, ii, lane);
            fa_tile_row_acc<S>(dk, dsbuf, qs, ii, lane);
        }
    }
#pragma unroll
    for (int r = 0; r < FA_ROWS; r++) {
        const int j = k0 + row0 + r;
        if (j >= T)
            continue;
        float *g = dqkv + ((size_t)b * T + j) * C3 + (size_t)h * HS;
#pragma unroll
        for (int e = 0; e < S::per_lane; e++) {
            g[C + e * ZS_WARP + lane] = dk[r][e] * scale;
            g[2 * C + e * ZS_WARP + lane] = dv[r][e];
        }
    }
}

/* Shared memory above 48 KiB must be asked for, per kernel (hs 96 and 128 need it: the
 * backward's four tiles of 32 x 132 floats are 66 KiB).  sm_80 and sm_90 give up to 163 and 227
 * KiB. */
template <typename K> static zs_err fa_allow_smem(K kernel, const char *name, size_t bytes)
{
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not the next kernel's failure (zs_cuda_launched) */
        return zs_error(ZS_ERR_INTERNAL, "cuda: %s: %zu bytes of shared memory: %s", name, bytes,
                        cudaGetErrorString(e));
    }
    return ZS_OK;
}

extern "C" int zs_cuda_attention_fused_supports(int hs)
{
    return hs == 32 || hs == 64 || hs == 96 || hs == 128;
}

/* The launch's shape: the tiles of T times the (b, h) pairs, in one grid dimension. */
static zs_err fa_grid(const char *name, int B, int T, int C, int NH, unsigned *blocks)
{
    ZS_CHECK(check_heads(name, B, T, C, NH));
    *blocks = 0;
    /* The head size first: a shape with no work (T 0) still gets the refusal the contract
     * promises for an unsupported one. */
    if (C > 0 && !zs_cuda_attention_fused_supports(C / NH))
        return zs_error(ZS_ERR_INVALID,
                        "cuda: %s: head size %d (C %d / NH %d) is not 32, 64, 96 or 128; "
                        "the reference attention takes any",
                        name, C / NH, C, NH);
    if ((long long)B * T * C == 0)
        return ZS_OK;
    long long n = (long long)(T + FA_TILE - 1) / FA_TILE * B * NH;
    if (n > 0x7fffffffLL)
        return zs_error(ZS_ERR_INVALID, "cuda: %s: %lld blocks (B %d, T %d, NH %d)", name, n, B, T,
                        NH);
    *blocks = (unsigned)n;
    return ZS_OK;
}

template <int HS>
static zs_err fa_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH,
                         unsigned blocks, cudaStream_t stream)
{
    size_t smem = (3 * fa_shape<HS>::tile_floats + FA_WARPS * FA_ROWBUF) * sizeof(float);
    ZS_CHECK(fa_allow_smem(fused_forward_kernel<HS>, "attention_fused_forward", smem));
    fused_forward_kernel<HS><<<blocks, FA_THREADS, smem, stream>>>(out, lse, qkv, B * NH, T, C, NH,
                                                                   1.0f / sqrtf((float)HS));
    return zs_cuda_launched("attention_fused_forward", B * T, C);
}

template <int HS>
static zs_err fa_backward(float *dqkv, const float *delta, const float *dout, const float *qkv,
                          const float *lse, int B, int T, int C, int NH, unsigned blocks,
                          cudaStream_t stream)
{
    size_t smem = (4 * fa_shape<HS>::tile_floats + FA_WARPS * FA_ROWBUF) * sizeof(float);
    float scale = 1.0f / sqrtf((float)HS);
    ZS_CHECK(fa_allow_smem(fused_dq_kernel<HS>, "attention_fused_backward (dq)", smem));
    fused_dq_kernel<HS><<<blocks, FA_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, delta, B * NH,
                                                              T, C, NH, scale);
    ZS_CHECK(zs_cuda_launched("attention_fused_backward (dq)", B * T, C));
    smem += (FA_WARPS * FA_ROWBUF + 2 * FA_TILE) * sizeof(float);
    ZS_CHECK(fa_allow_smem(fused_dkv_kernel<HS>, "attention_fused_backward (dk, dv)", smem));
    fused_dkv_kernel<HS><<<blocks, FA_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, delta, B * NH,
                                                               T, C, NH, scale);
    return zs_cuda_launched("attention_fused_backward (dk, dv)", B * T, C);
}

extern "C" zs_err zs_cuda_attention_fused_forward(float *out, float *lse, const float *qkv, int B,
                                                  int T, int C, int NH, zs_cuda_stream stream)
{
    unsigned blocks;
    ZS_CHECK(fa_grid("attention_fused_forward", B, T, C, NH, &blocks));
    if (blocks == 0)
        return ZS_OK;
    switch (C / NH) {
    case 32:
        return fa_forward<32>(out, lse, qkv, B, T, C, NH, blocks, stream);
    case 64:
        return fa_forward<64>(out, lse, qkv, B, T, C, NH, blocks, stream);
    case 96:
        return fa_forward<96>(out, lse, qkv, B, T, C, NH, blocks, stream);
    default:
        return fa_forward<128>(out, lse, qkv, B, T, C, NH, blocks, stream);
    }
}

extern "C" zs_err zs_cuda_attention_fused_backward(float *dqkv, float *delta, const float *dout,
                                                   const float *qkv, const float *out,
                                                   const float *lse, int B, int T, int C, int NH,
                                                   zs_cuda_stream stream)
{
    unsigned blocks;
    ZS_CHECK(fa_grid("attention_fused_backward", B, T, C, NH, &blocks));
    if (blocks == 0)
        return ZS_OK;
    long long rows = (long long)B * NH * T;
    fused_delta_kernel<<<zs_cuda_blocks(rows, ROWS_PER_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
        delta, dout, out, B, T, C, NH);
    ZS_CHECK(zs_cuda_launched("attention_fused_backward (delta)", B * T, C));
    switch (C / NH) {
    case 32:
        return fa_backward<32>(dqkv, delta, dout, qkv, lse, B, T, C, NH, blocks, stream);
    case 64:
        return fa_backward<64>(dqkv, delta, dout, qkv, lse, B, T, C, NH, blocks, stream);
    case 96:
        return fa_backward<96>(dqkv, delta, dout, qkv, lse, B, T, C, NH, blocks, stream);
    default:
        return fa_backward<128>(dqkv, delta, dout, qkv, lse, B, T, C, NH, blocks, stream);
    }
}
