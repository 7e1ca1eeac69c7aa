#include "kernels/reduce.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "common/fp16.h"

/* One block, four double accumulators combined in a fixed order (helps the pipeline while
 * staying a fixed function of the values). */
static double block_sumsq(const float *x, size_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i] * x[i];
        s1 += (double)x[i + 1] * x[i + 1];
        s2 += (double)x[i + 2] * x[i + 2];
        s3 += (double)x[i + 3] * x[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)x[i] * x[i];
    return (s0 + s1) + (s2 + s3);
}

/* block_sumsq of four whole consecutive blocks at x, into out[0..3], with AVX: lane j of block
 * b's vector is block_sumsq's s_j (the product of two floats is exact in double, the additions
 * the same, in the same order), so each result has block_sumsq's bits.  One block alone is a
 * chain of dependent additions, bound by the adder's latency (~7 GB/s a thread); four
 * independent ones keep the adder busy, and the sum runs at the memory's speed. */
__attribute__((target("avx"))) static void block_sumsq4(const float *x, double out[4])
{
    __m256d s[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
    for (size_t i = 0; i < ZS_REDUCE_BLOCK; i += 4)
        for (int b = 0; b < 4; b++) {
            __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + (size_t)b * ZS_REDUCE_BLOCK + i));
            s[b] = _mm256_add_pd(s[b], _mm256_mul_pd(v, v));
        }
    for (int b = 0; b < 4; b++) {
        double l[4];
        _mm256_storeu_pd(l, s[b]);
        out[b] = (l[0] + l[1]) + (l[2] + l[3]);
    }
}

/* Where the blocks lie: x[0, n) cut into shards of shard_floats (0: one shard), each cut into
 * blocks of ZS_REDUCE_BLOCK (its last one shorter), numbered shard by shard, per a shard. */
typedef struct {
    const float *x;
    size_t n, shard_floats, per;
} block_map;

/* Block b's first element and length. */
static void block_range(const block_map *m, size_t b, size_t *lo, size_t *len)
{
    size_t shard = m->shard_floats ? b / m->per : 0, k = m->shard_floats ? b % m->per : b;
    size_t start = shard * m->shard_floats + k * ZS_REDUCE_BLOCK;
    size_t end = m->shard_floats && shard * m->shard_floats + m->shard_floats < m->n
                     ? shard * m->shard_floats + m->shard_floats
                     : m->n;
    *lo = start;
    *len = start + ZS_REDUCE_BLOCK < end ? ZS_REDUCE_BLOCK : end - start;
}

/* partial[4g .. 4g+3] (those below total): four whole contiguous blocks through block_sumsq4,
 * anything else block by block.  The same bits either way. */
static void group_sumsq(const block_map *m, size_t g, size_t total, double *partial)
{
    size_t lo[4], len[4], b0 = 4 * g, k = 0;
    int whole = b0 + 4 <= total && __builtin_cpu_supports("avx");
    for (; k < 4 && b0 + k < total; k++) {
        block_range(m, b0 + k, &lo[k], &len[k]);
        whole &= len[k] == ZS_REDUCE_BLOCK && lo[k] == lo[0] + k * ZS_REDUCE_BLOCK;
    }
    if (whole) {
        block_sumsq4(m->x + lo[0], partial + b0);
        return;
    }
    for (size_t j = 0; j < k; j++)
        partial[b0 + j] = block_sumsq(m->x + lo[j], len[j]);
}

/* partial[b] = block_sumsq of block b, for b < total, over nt threads. */
static void all_blocks(const block_map *m, size_t total, double *partial, int nt)
{
    size_t groups = (total + 3) / 4;
#pragma omp parallel for schedule(dynamic, 16) num_threads(nt)
    for (size_t g = 0; g < groups; g++)
        group_sumsq(m, g, total, partial);
}

double zs_sumsq(const float *x, size_t n, int threads)
{
    size_t nblocks = (n + ZS_REDUCE_BLOCK - 1) / ZS_REDUCE_BLOCK;
    if (nblocks <= 1)
        return block_sumsq(x, n);
    double stack[256];
    double *partial = nblocks <= 256 ? stack : malloc(nblocks * sizeof *partial);
    if (!partial) {
        /* Without memory for the partials, the same sum serially. */
        double s = 0;
        for (size_t b = 0; b < nblocks; b++) {
            size_t lo = b * ZS_REDUCE_BLOCK,
                   hi = lo + ZS_REDUCE_BLOCK < n ? lo + ZS_REDUCE_BLOCK : n;
            s += block_sumsq(x + lo, hi - lo);
        }
        return s;
    }
    block_map m = {x, n, 0, nblocks};
    all_blocks(&m, nblocks, partial, threads > 0 ? threads : omp_get_max_threads());
    double s = 0;
    for (size_t b = 0; b < nblocks; b++)
        s += partial[b];
    if (partial != stack)
        free(partial);
    return s;
}

/* Blocks of ZS_REDUCE_BLOCK per shard of shard_floats (the last shard may be shorter). */
static size_t shard_blocks(size_t len)
{
    return (len + ZS_REDUCE_BLOCK - 1) / ZS_REDUCE_BLOCK;
}

/*
 * The sum zs_sumsq would give shard by shard, added in shard order, but with the blocks of
 * all shards in one parallel loop (one barrier instead of one per shard, 118 for GPT-2 124M
 * in 4 MiB shards) and then the same additions in the same order: per shard, its block sums
 * in block order starting from 0 (a shard of one block is that block's sum, as in zs_sumsq).
 */
double zs_sumsq_sharded(const float *x, size_t n, size_t shard_floats, int threads)
{
    size_t nshards = shard_floats ? (n + shard_floats - 1) / shard_floats : 0;
    size_t per = shard_blocks(shard_floats), total = 0;
    if (nshards > 0)
        total = (nshards - 1) * per + shard_blocks(n - (nshards - 1) * shard_floats);
    double *partial = total > 1 ? malloc(total * sizeof *partial) : NULL;
    if (!partial) { /* one shard of one block, no memory, or shard_floats 0 */
        double s = 0;
        for (size_t lo = 0; lo < n; lo += shard_floats ? shard_floats : n) {
            size_t len = shard_floats && n - lo > shard_floats ? shard_floats : n - lo;
            s += zs_sumsq(x + lo, len, threads);
        }
        return s;
    }
    block_map m = {x, n, shard_floats, per};
    all_blocks(&m, total, partial, threads > 0 ? threads : omp_get_max_threads());
    double s = 0;
    for (size_t shard = 0; shard < nshards; shard++) {
        size_t first = shard * per;
        size_t len = shard + 1 < nshards ? shard_floats : n - shard * shard_floats;
        size_t nb = shard_blocks(len);
        double ss = nb <= 1 ? partial[first] : 0;
        for (size_t k = 0; nb > 1 && k < nb; k++)
            ss += partial[first + k];
        s += ss;
    }
    free(partial);
    return s;
}

static void add_into(float *restrict acc, const float *restrict g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        acc[i] += g[i];
}

/* acc[i] (= or +=) g[i] widened, scalar: the reference, and the tail of the F16C variant. */
static void add_f16_scalar(float *restrict acc, const uint16_t *restrict g, size_t n, int copy)
{
    for (size_t i = 0; i < n; i++)
        acc[i] = copy ? zs_f16_to_f32(g[i]) : acc[i] + zs_f16_to_f32(g[i]);
}

/* The same 8 at a time through F16C's vcvtph2ps, which widens exactly as zs_f16_to_f32 does
 * (a NaN's payload aside: it quiets a signalling one, and a NaN anywhere skips the step). */
__attribute__((target("avx,f16c"))) static void
add_f16_f16c(float *restrict acc, const uint16_t *restrict g, size_t n, int copy)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + i)));
        if (!copy)
            x = _mm256_add_ps(_mm256_loadu_ps(acc + i), x);
        _mm256_storeu_ps(acc + i, x);
    }
    add_f16_scalar(acc + i, g + i, n - i, copy);
}

/* One thread's part: acc[0, n) += g (or = g, or = / += g widened from fp16). */
static void add_part(float *restrict acc, const void *restrict g, size_t n, int f16, int copy)
{
    /* Every AVX2 CPU has F16C, and clang 14's __builtin_cpu_supports knows no "f16c". */
    if (!f16)
        add_into(acc, g, n);
    else if (__builtin_cpu_supports("avx2"))
        add_f16_f16c(acc, g, n, copy);
    else
        add_f16_scalar(acc, g, n, copy);
}

/* acc (op) g over up to `threads` threads, cut into contiguous whole-cache-line pieces. */
static void accumulate(float *restrict acc, const void *restrict g, size_t n, int f16, int copy,
                       int threads)
{
    size_t esz = f16 ? 2 : 4;
    int nt = threads > 0 ? threads : omp_get_max_threads();
    if (n < ZS_ACCUMULATE_SPLIT || nt <= 1) {
        add_part(acc, g, n, f16, copy);
        return;
    }
    size_t each = ((n + (size_t)nt - 1) / (size_t)nt + 15) & ~(size_t)15;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        size_t lo = (size_t)t * each, hi = lo + each < n ? lo + each : n;
        if (lo < hi)
            add_part(acc + lo, (const char *)g + lo * esz, hi - lo, f16, copy);
    }
}

void zs_accumulate(float *restrict acc, const float *restrict g, size_t n, int threads)
{
    accumulate(acc, g, n, 0, 0, threads);
}

void zs_accumulate_f16(float *restrict acc, const uint16_t *restrict g, size_t n, int copy,
                       int threads)
{
    accumulate(acc, g, n, 1, copy, threads);
}

double zs_grad_norm(double sumsq, int chunks)
{
    return sqrt(sumsq) / chunks;
}

double zs_clip_factor(double norm, double max_norm)
{
    if (max_norm <= 0 || !(norm > max_norm))
        return 1.0;
    double clip = max_norm / (norm + 1e-6);
    return clip < 1.0 ? clip : 1.0;
}
