/*
 * matmul: BLIS sgemm behind a row-major interface, and the linear layers built on it.
 *
 * Almost all of a training step's flops go through zs_sgemm.  BLIS takes a row and a column
 * stride for every operand, so a transposed operand is the same memory read with its strides
 * swapped and nothing is ever copied.
 *
 * Threads.  BLIS is always called on one thread.  A product on several threads is cut into
 * tiles, slices of C's rows or columns (whichever dimension is longer), and one OpenMP loop
 * hands the tiles to the threads as they come free (schedule dynamic); zs_sgemm_many puts
 * the tiles of several independent products (a linear layer's dinp and dweight) in the same
 * loop.  BLIS's own threading synchronizes its threads several times per 384-deep slice of
 * k (shared packed panels); on a machine whose cores are shared with other processes every
 * such barrier waits for a descheduled thread, and the products ran 2-5x slower than alone
 * (measured with a compile job on the 2 cores).  Tiles need one barrier per loop, and a
 * thread that lost its core only delays the tiles it holds.  The price is that each tile
 * packs the operand it shares with the other tiles again (TILES_PER_THREAD below).
 *
 * Determinism: a tile is the same BLIS algorithm on a sub-matrix: the k loop, its blocking
 * (which depends on k only) and the micro-kernel's order are those of the whole product, so
 * an element's value does not depend on the tiling, on which thread computed it, or on the
 * thread count (the tests check 1, 2 and 3 threads bitwise, and the bits are those of BLIS's
 * own threading).
 *
 * Micro-kernel choice.  BLIS 0.9 decides between its AVX-512 ("skx") and AVX2 ("haswell")
 * kernels by counting the CPU's FMA units from the Xeon SKU in the brand string.  Virtual
 * machines often report a bare "Intel(R) Xeon(R) Processor"; BLIS then falls back to haswell
 * and runs at half speed (measured: ~110 vs ~200 GFLOP/s on 2 cores for GPT-2's shapes).  So
 * when BLIS chose haswell on a CPU with the AVX-512 subset the skx kernels use, and the
 * library exposes its skx context, we pass that context to every call.  Only the static
 * libblis.a exposes it: the shared library hides bli_gks_lookup_id, which is therefore
 * declared weak here and is NULL there, leaving BLIS's own choice.  ZS_SGEMM_CONFIG=blis in
 * the environment keeps BLIS's choice regardless.  Each choice is deterministic; different
 * choices give different bits (different blockings), so every process of one job must make
 * the same one: the same binary on the same kind of CPU does.
 */
#include "kernels/kernels.h"

#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* blis.h defines hundreds of unused static functions with unused parameters.  CMake adds its
 * directory as a system one, which silences them; a plain -I (a hand-written compile line)
 * does not, so quiet them here as well. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wtype-limits"
#include <blis.h>
#pragma GCC diagnostic pop

/* Internal to BLIS: exported by libblis.a, hidden in libblis.so (weak: NULL there). */
extern cntx_t **bli_gks_lookup_id(arch_t id) __attribute__((weak));

/* Columns per block when summing over rows: a thread owns whole blocks. */
#define COL_BLOCK 64

/* Tiling of a product over threads (tiling_make): TILES_PER_THREAD tiles per thread along
 * the longer of C's two dimensions, each a multiple of TILE_ALIGN (the micro-kernel's 32
 * rows) and at least TILE_MIN wide.  Each extra tile packs the operand the tiles share once
 * more: the step's 15 product shapes, timed alone and interleaved on 2 threads (best of 8),
 * took 720 ms with 1 tile per thread, 752 ms with 2 and 736 ms with BLIS's own threads; with
 * another process on the cores, 1857, 1803, 1762 (4 per thread) and 5148 ms. */
#define TILES_PER_THREAD 1
#define TILE_ALIGN 32
#define TILE_MIN 64
#define MAX_BATCH 4
/* The largest micro-kernel our driver packs for (skx: 32 x 12). */
#define OWN_MAX_MR 32
#define OWN_MAX_NR 16

static cntx_t *sgemm_cntx; /* NULL: BLIS's own choice */
static const char *sgemm_config_name = "?";
static pthread_once_t sgemm_once = PTHREAD_ONCE_INIT;

static int cpu_has_skx_isa(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

/*
 * Our own driver around BLIS's micro-kernel, where BLIS 0.9 has no pack kernel for it.
 *
 * BLIS 0.9's context holds pack kernels for micro-panels of 0 to 31 rows (BLIS_PACKM_0XK_KER
 * .. _31XK_); the skx sgemm micro-kernel is 32 x 12, so BLIS packs its 32-row panels through
 * the generic copy (bli_scal2m, one strided scal2v per column of 32), which took 5.8% of a
 * 256 x 2304 x 768 NN product and 12.3% of a 256 x 768 x 2304 NT one (perf on single
 * products).  Where the micro-kernel's MR has no pack kernel, zs_sgemm runs BLIS's own
 * algorithm itself: the same loops (NC, KC, MC blocks, then NR x MR tiles), the same k
 * partition (KC blocks, the last one taking what is left when it is at most KC's maximum:
 * bli_determine_blocksize_f), the same micro-kernel with the same alpha and beta (beta on the
 * first k block, 1 after), on the same logical transposition (a micro-kernel that prefers
 * columns computes C^T = B^T A^T of a row-stored C), with packing of our own: a copy where the
 * panel's rows are contiguous, 16 x 16 AVX-512 (or 8 x 8 AVX) transposes where they are not.
 * Each element of C is the micro-kernel's sum over each k block in order, so the bits are BLIS's
 * (test_kernels compares them with bli_sgemm's, every transpose, with edges); the
 * ZS_SGEMM_DRIVER=blis environment variable leaves BLIS to drive.
 */
typedef void (*sgemm_ukr_fn)(dim_t m, dim_t n, dim_t k, float *alpha, float *a, float *b,
                             float *beta, float *c, inc_t rs_c, inc_t cs_c, auxinfo_t *data,
                             cntx_t *cntx);
static struct {
    sgemm_ukr_fn ukr; /* NULL: BLIS drives */
    cntx_t *cntx;
    dim_t mr, nr, mc, kc, kc_max, nc;
    int col_pref; /* the micro-kernel prefers column-stored C */
} own;

static void own_choose(void)
{
    cntx_t *cx = sgemm_cntx ? sgemm_cntx : bli_gks_query_cntx();
    const char *env = getenv("ZS_SGEMM_DRIVER");
    if (!cx || (env && strcmp(env, "blis") == 0))
        return;
    dim_t mr = bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_MR, cx);
    if (mr < BLIS_NUM_PACKM_KERS || mr > OWN_MAX_MR)
        return; /* BLIS has a pack kernel for its panels */
    own.cntx = cx;
    own.mr = mr;
    own.nr = bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_NR, cx);
    own.mc = bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_MC, cx);
    own.kc = bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_KC, cx);
    own.kc_max = bli_cntx_get_blksz_max_dt(BLIS_FLOAT, BLIS_KC, cx);
    own.nc = bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_NC, cx);
    own.col_pref = bli_cntx_l3_nat_ukr_prefers_cols_dt(BLIS_FLOAT, BLIS_GEMM_UKR, cx);
    /* The MC and NC blocks' maxima equal their defaults in the configurations that reach here
     * (skx: 480, 3072); only KC's differs, and only the k partition decides bits. */
    if (own.nr < 1 || own.nr > OWN_MAX_NR || own.mc < mr || own.kc < 1 || own.kc_max < own.kc ||
        own.nc < own.nr || bli_cntx_get_blksz_max_dt(BLIS_FLOAT, BLIS_MC, cx) != own.mc ||
        bli_cntx_get_blksz_max_dt(BLIS_FLOAT, BLIS_NC, cx) != own.nc)
        return;
    own.ukr = (sgemm_ukr_fn)bli_cntx_get_l3_nat_ukr_dt(BLIS_FLOAT, BLIS_GEMM_UKR, cx);
}

static void sgemm_choose_cntx(void)
{
    bli_init();
    arch_t id = bli_arch_query_id();
    sgemm_config_name = bli_arch_string(id);
    const char *env = getenv("ZS_SGEMM_CONFIG");
    if (env && strcmp(env, "blis") == 0)
        return;
    if (id == BLIS_ARCH_HASWELL && bli_gks_lookup_id && cpu_has_skx_isa()) {
        cntx_t **skx = bli_gks_lookup_id(BLIS_ARCH_SKX);
        if (skx && skx[BLIS_NAT]) {
            sgemm_cntx = skx[BLIS_NAT];
            sgemm_config_name = bli_arch_string(BLIS_ARCH_SKX);
        }
    }
}

static void sgemm_choose(void)
{
    sgemm_choose_cntx();
    own_choose();
}

const char *zs_sgemm_config(void)
{
    pthread_once(&sgemm_once, sgemm_choose);
    return sgemm_config_name;
}

const char *zs_sgemm_driver(void)
{
    pthread_once(&sgemm_once, sgemm_choose);
    return own.ukr ? "zshard" : "blis";
}

int zs_kernel_threads(int threads)
{
    return threads > 0 ? threads : omp_get_max_threads();
}

/* One BLIS call on one thread: zs_sgemm's arguments, BLIS's strides. */
static void sgemm_blis(const zs_gemm *g, int threads)
{
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(threads, &rntm);
    /* Row-major A [m, lda]: row stride lda, column stride 1; A^T of A stored [k, lda]: the
     * other way round.  The same for B. */
    inc_t rs_a = g->trans_a ? 1 : g->lda, cs_a = g->trans_a ? g->lda : 1;
    inc_t rs_b = g->trans_b ? 1 : g->ldb, cs_b = g->trans_b ? g->ldb : 1;
    float alpha = g->alpha, beta = g->beta;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g->m, g->n, g->k, &alpha, (float *)g->a,
                 rs_a, cs_a, (float *)g->b, rs_b, cs_b, &beta, g->c, g->ldc, 1, sgemm_cntx, &rntm);
}

/* dst[j * 8 + i] = src[i * ld + j] for i, j < 8: an 8 x 8 block transposed, with AVX. */
__attribute__((target("avx"))) static inline void transpose8(float *dst, size_t dst_ld,
                                                             const float *src, size_t ld)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(src + (size_t)i * ld);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + (size_t)i * dst_ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (size_t)(i + 4) * dst_ld,
                         _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

/* dst[j * dst_ld + i] = src[i * ld + j] for i, j < 4 (SSE). */
static inline void transpose4(float *dst, size_t dst_ld, const float *src, size_t ld)
{
    __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + ld);
    __m128 r2 = _mm_loadu_ps(src + 2 * ld), r3 = _mm_loadu_ps(src + 3 * ld);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst, r0);
    _mm_storeu_ps(dst + dst_ld, r1);
    _mm_storeu_ps(dst + 2 * dst_ld, r2);
    _mm_storeu_ps(dst + 3 * dst_ld, r3);
}

/*
 * Rows [r0, r0 + 16) of a panel for columns [q, q + 16), transposed 16 x 16 with AVX-512:
 * t[c] = (x(r0, q + c), ..., x(r0 + 15, q + c)), rows at or past `rows` read as zeros.  Four
 * stages: unpack pairs of rows, gather four rows' column per 128-bit lane, then two rounds of
 * 128-bit lane shuffles put each column's four lanes together.
 */
__attribute__((target("avx512f"))) static inline void transpose16(__m512 t[16], const float *x,
                                                                  inc_t rs, dim_t r0, dim_t rows)
{
    __m512 r[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = r0 + i < rows ? _mm512_loadu_ps(x + (r0 + i) * rs) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    /* r[4g + j]: column 4L + j of rows 4g..4g+3 in lane L. */
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        r[4 * g + 0] = _mm512_shuffle_ps(u[4 * g], u[4 * g + 2], 0x44);
        r[4 * g + 1] = _mm512_shuffle_ps(u[4 * g], u[4 * g + 2], 0xEE);
        r[4 * g + 2] = _mm512_shuffle_ps(u[4 * g + 1], u[4 * g + 3], 0x44);
        r[4 * g + 3] = _mm512_shuffle_ps(u[4 * g + 1], u[4 * g + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512 v0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);      /* lanes 0, 2: rows 0-7 */
        __m512 w0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);      /* lanes 1, 3 */
        __m512 v1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88); /* rows 8-15 */
        __m512 w1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
        t[j] = _mm512_shuffle_f32x4(v0, v1, 0x88);
        t[8 + j] = _mm512_shuffle_f32x4(v0, v1, 0xDD);
        t[4 + j] = _mm512_shuffle_f32x4(w0, w1, 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(w0, w1, 0xDD);
    }
}

/* pack_panel's transposing case (cs == 1) for panels of 12 to 32 rows with AVX-512, columns
 * [0, q16): 16 columns of the panel at a time are 16 x w contiguous floats of p, written as
 * whole vectors (masked to w), where the 8 x 8 AVX transposes wrote 32-byte pieces across
 * lines.  Returns q16, where pack_panel's own loops take over. */
__attribute__((target("avx512f"))) static dim_t
pack_rows_avx512(float *restrict p, dim_t w, const float *x, inc_t rs, dim_t rows, dim_t k)
{
    dim_t q16 = k / 16 * 16;
    /* The lanes of the second vector of a column (w > 16 only). */
    __mmask16 hi = (__mmask16)(w >= 32 ? 0xffff : w > 16 ? (1u << (w - 16)) - 1 : 0);
    for (dim_t q = 0; q < q16; q += 16) {
        __m512 t[16], t2[16];
        transpose16(t, x + q, rs, 0, rows);
        if (w <= 16) {
            __mmask16 m = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++)
                _mm512_mask_storeu_ps(p + (q + c) * w, m, t[c]);
            continue;
        }
        transpose16(t2, x + q, rs, 16, rows);
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) {
            _mm512_storeu_ps(p + (q + c) * w, t[c]);
            _mm512_mask_storeu_ps(p + (q + c) * w + 16, hi, t2[c]);
        }
    }
    return q16;
}

/*
 * One packed micro-panel: p[q * w + i] = x(i, q) for i < rows, q < k, zeros for rows <= i < w,
 * where x(i, q) = x[i * rs + q * cs] (w = MR for a panel of A, NR for one of B, each element of
 * the panel's k columns contiguous, as the micro-kernel reads them).  rs == 1: a copy of each
 * column; cs == 1: 16 x 16 AVX-512 transposes of the rows (panels 12 to 32 wide), then 8 x 8
 * AVX ones, what is left element by element.
 */
static void pack_panel(float *restrict p, dim_t w, const float *x, inc_t rs, inc_t cs, dim_t rows,
                       dim_t k)
{
    if (rs == 1) {
        for (dim_t q = 0; q < k; q++) {
            memcpy(p + q * w, x + q * cs, (size_t)rows * sizeof *p);
            if (rows < w)
                memset(p + q * w + rows, 0, (size_t)(w - rows) * sizeof *p);
        }
        return;
    }
    /* With AVX-512, columns [0, q0) of panels 12 to 32 wide are done 16 x 16 first. */
    dim_t q0 = 0;
    if (cs == 1 && w >= 12 && w <= 32 && __builtin_cpu_supports("avx512f")) {
        q0 = pack_rows_avx512(p, w, x, rs, rows, k);
        if (q0 == k)
            return;
        p += q0 * w;
        x += q0;
        k -= q0;
    }
    /* Rows [0, i8) are transposed 8 x 8 for columns [0, q8), rows [i8, i4) 4 x 4 for columns
     * [0, q4); the rest element by element. */
    dim_t i8 = 0, i4 = 0, q8 = k / 8 * 8, q4 = k / 4 * 4;
    if (cs == 1 && __builtin_cpu_supports("avx")) {
        for (; i8 + 8 <= rows; i8 += 8)
            for (dim_t q = 0; q < q8; q += 8)
                transpose8(p + q * w + i8, (size_t)w, x + i8 * rs + q, (size_t)rs);
        for (i4 = i8; i4 + 4 <= rows; i4 += 4) /* a 12-wide panel's last 4 rows */
            for (dim_t q = 0; q < q4; q += 4)
                transpose4(p + q * w + i4, (size_t)w, x + i4 * rs + q, (size_t)rs);
    }
    for (dim_t q = 0; q < k; q++)
        for (dim_t i = q < q8 ? i8 : 0; i < w; i++) {
            if (i == i8 && i < i4 && q < q4) { /* rows [i8, i4) are done */
                i = i4 - 1;
                continue;
            }
            p[q * w + i] = i < rows ? x[i * rs + q * cs] : 0.0f;
        }
}

/* A block of `len` rows of x cut into panels of w (the last one padded), each panel k columns
 * wide, panel after panel in p. */
static void pack_block(float *restrict p, dim_t w, const float *x, inc_t rs, inc_t cs, dim_t len,
                       dim_t k)
{
    for (dim_t i = 0; i < len; i += w)
        pack_panel(p + i * k, w, x + i * rs, rs, cs, len - i < w ? len - i : w, k);
}

/* The packed blocks of one thread: MC x KC_max of A, KC_max x NC of B, 64-byte aligned (the
 * micro-kernel's loads are), made at the thread's first product and freed when it exits (a
 * thread-specific value's destructor: OpenMP's threads come and go with the team sizes). */
typedef struct {
    float *a, *b;
} pack_bufs;
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static int pack_key_ok;

static void pack_bufs_free(void *p)
{
    pack_bufs *q = p;
    free(q->a);
    free(q->b);
    free(q);
}

static void pack_key_make(void)
{
    pack_key_ok = pthread_key_create(&pack_key, pack_bufs_free) == 0;
}

/* The calling thread's blocks, or NULL without memory. */
static pack_bufs *pack_bufs_get(void)
{
    pthread_once(&pack_once, pack_key_make);
    if (!pack_key_ok)
        return NULL;
    pack_bufs *q = pthread_getspecific(pack_key);
    if (q)
        return q;
    q = calloc(1, sizeof *q);
    if (q) {
        q->a = aligned_alloc(64, (size_t)own.mc * own.kc_max * sizeof(float));
        q->b = aligned_alloc(64, (size_t)own.kc_max * own.nc * sizeof(float));
    }
    if (!q || !q->a || !q->b || pthread_setspecific(pack_key, q) != 0) {
        if (q)
            pack_bufs_free(q);
        return NULL;
    }
    return q;
}

/*
 * g on the calling thread by our own driver (above): BLIS's algorithm around BLIS's
 * micro-kernel.  Returns 0, or -1 when it could not (no memory for the packed blocks, or a
 * product BLIS is left to handle: k 0 or alpha 0, where BLIS only scales C).
 */
static int own_gemm(const zs_gemm *g)
{
    if (g->k == 0 || g->alpha == 0.0f || g->m == 0 || g->n == 0)
        return -1;
    pack_bufs *bufs = pack_bufs_get();
    if (!bufs)
        return -1;
    float *own_apack = bufs->a, *own_bpack = bufs->b;
    /* BLIS's operands: A (m x k), B (k x n), C (m x n) with their strides; a micro-kernel that
     * prefers columns gets the transposed product of our row-stored C. */
    dim_t m = g->m, n = g->n, k = g->k;
    const float *a = g->a, *b = g->b;
    inc_t rs_a = g->trans_a ? 1 : g->lda, cs_a = g->trans_a ? g->lda : 1;
    inc_t rs_b = g->trans_b ? 1 : g->ldb, cs_b = g->trans_b ? g->ldb : 1;
    inc_t rs_c = g->ldc, cs_c = 1;
    if (own.col_pref) {
        const float *t = a;
        a = b, b = t;
        inc_t r = rs_a, c = cs_a;
        rs_a = cs_b, cs_a = rs_b;
        rs_b = c, cs_b = r;
        rs_c = 1, cs_c = g->ldc;
        dim_t d = m;
        m = n, n = d;
    }
    float alpha = g->alpha;
    auxinfo_t aux;
    memset(&aux, 0, sizeof aux);
    const dim_t MR = own.mr, NR = own.nr;
    for (dim_t jc = 0; jc < n; jc += own.nc) {
        dim_t nc = n - jc < own.nc ? n - jc : own.nc;
        for (dim_t pc = 0; pc < k;) {
            dim_t kc = k - pc <= own.kc_max ? k - pc : own.kc;
            float beta = pc == 0 ? g->beta : 1.0f;
            /* B's panels: the rows of B^T, i.e. B's columns jc.. as panels of NR. */
            pack_block(own_bpack, NR, b + pc * rs_b + jc * cs_b, cs_b, rs_b, nc, kc);
            for (dim_t ic = 0; ic < m; ic += own.mc) {
                dim_t mc = m - ic < own.mc ? m - ic : own.mc;
                pack_block(own_apack, MR, a + ic * rs_a + pc * cs_a, rs_a, cs_a, mc, kc);
                for (dim_t jr = 0; jr < nc; jr += NR) {
                    float *bp = own_bpack + jr * kc;
                    for (dim_t ir = 0; ir < mc; ir += MR) {
                        float *ap = own_apack + ir * kc;
                        dim_t mr = mc - ir < MR ? mc - ir : MR, nr = nc - jr < NR ? nc - jr : NR;
                        bli_auxinfo_set_next_a(ir + MR < mc ? ap + MR * kc : own_apack, &aux);
                        bli_auxinfo_set_next_b(ir + MR < mc ? bp : bp + NR * kc, &aux);
                        own.ukr(mr, nr, kc, &alpha, ap, bp, &beta,
                                g->c + (ic + ir) * rs_c + (jc + jr) * cs_c, rs_c, cs_c, &aux,
                                own.cntx);
                    }
                }
            }
            pc += kc;
        }
    }
    return 0;
}

/* One product (a tile) on the calling thread: our driver where it runs, else BLIS. */
static void sgemm_one(const zs_gemm *g)
{
    if (own.ukr && own_gemm(g) == 0)
        return;
    sgemm_blis(g, 1);
}

/* How a product is cut into tiles: `tiles` slices of `width` rows (split_m) or columns of C. */
typedef struct {
    int split_m, width, tiles;
} gemm_tiling;

static gemm_tiling tiling_make(const zs_gemm *g, int nt)
{
    gemm_tiling tl = {.split_m = g->m > g->n, .width = 0, .tiles = 1};
    int d = tl.split_m ? g->m : g->n;
    tl.width = d;
    if (nt <= 1 || d < 2 * TILE_MIN)
        return tl;
    int want = TILES_PER_THREAD * nt;
    int w = (d + want - 1) / want;
    w = (w + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
    tl.width = w < TILE_MIN ? TILE_MIN : w;
    tl.tiles = (d + tl.width - 1) / tl.width;
    return tl;
}

/* Tile t of g on the calling thread: the same product restricted to a slice of C's rows (A's
 * rows) or columns (B's columns), each of its elements computed exactly as in the whole. */
static void tile_run(const zs_gemm *g, const gemm_tiling *tl, int t)
{
    zs_gemm s = *g;
    int lo = t * tl->width, d = tl->split_m ? g->m : g->n;
    int len = d - lo < tl->width ? d - lo : tl->width;
    if (tl->split_m) {
        s.m = len;
        s.a = g->trans_a ? g->a + lo : g->a + (size_t)lo * g->lda;
        s.c = g->c + (size_t)lo * g->ldc;
        if (g->bias)
            for (int i = 0; i < len; i++)
                memcpy(s.c + (size_t)i * g->ldc, g->bias, (size_t)g->n * sizeof *g->bias);
    } else {
        s.n = len;
        s.b = g->trans_b ? g->b + (size_t)lo * g->ldb : g->b + lo;
        s.c = g->c + lo;
        if (g->bias)
            for (int i = 0; i < g->m; i++)
                memcpy(s.c + (size_t)i * g->ldc, g->bias + lo, (size_t)len * sizeof *g->bias);
    }
    if (g->bias)
        s.beta = 1.0f;
    sgemm_one(&s);
}

void zs_sgemm_many(const zs_gemm *g, int count, int threads)
{
    pthread_once(&sgemm_once, sgemm_choose);
    for (; count > MAX_BATCH; count -= MAX_BATCH, g += MAX_BATCH)
        zs_sgemm_many(g, MAX_BATCH, threads);
    int nt = zs_kernel_threads(threads);
    gemm_tiling tl[MAX_BATCH];
    int first[MAX_BATCH + 1];
    first[0] = 0;
    for (int i = 0; i < count; i++) {
        tl[i] = tiling_make(&g[i], nt);
        first[i + 1] = first[i] + tl[i].tiles;
    }
    int total = first[count];
    if (total == 1) { /* no OpenMP region: attention calls this ~300 times per layer */
        tile_run(&g[0], &tl[0], 0);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int t = 0; t < total; t++) {
        int i = 0;
        while (t >= first[i + 1])
            i++;
        tile_run(&g[i], &tl[i], t - first[i]);
    }
}

void zs_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc, int threads)
{
    zs_gemm g = {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL};
    zs_sgemm_many(&g, 1, threads);
}

void zs_sgemm_blis(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    pthread_once(&sgemm_once, sgemm_choose);
    zs_gemm g = {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL};
    sgemm_blis(&g, 1);
}

void zs_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC, int threads)
{
    /* With a bias, each tile starts its rows of out at the bias and lets sgemm add into it
     * (beta 1): one write of the tile, just before the product reads it back from cache. */
    zs_gemm g = {0, 0, N, OC, C, 1.0f, inp, C, weight, OC, 0.0f, out, OC, bias};
    zs_sgemm_many(&g, 1, threads);
}

void zs_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC, int threads)
{
    zs_gemm g[2];
    int n = 0;
    if (dinp) /* (N, OC) x (OC, C): weight (C, OC) read transposed */
        g[n++] = (zs_gemm){0, 1, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C, NULL};
    /* (C, N) x (N, OC): inp (N, C) read transposed */
    g[n++] = (zs_gemm){1, 0, C, OC, N, 1.0f, inp, C, dout, OC, 0.0f, dweight, OC, NULL};
    zs_sgemm_many(g, n, threads);
    if (dbias)
        zs_bias_backward(dbias, dout, N, OC, threads);
}

void zs_bias_backward(float *dbias, const float *dout, int N, int OC, int threads)
{
    int nt = zs_kernel_threads(threads);
    int nblocks = (OC + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COL_BLOCK;
        int nc = OC - c0 < COL_BLOCK ? OC - c0 : COL_BLOCK;
        float acc[COL_BLOCK] = {0};
        for (int i = 0; i < N; i++) {
            const float *row = dout + (size_t)i * OC + c0;
            for (int c = 0; c < nc; c++)
                acc[c] += row[c];
        }
        memcpy(dbias + c0, acc, (size_t)nc * sizeof *acc);
    }
}
