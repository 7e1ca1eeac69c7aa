/*
 * adamw: the scalar reference, the choice of SIMD variant, and the split over threads.
 *
 * The operation order below is the contract every variant implements (see adamw.h); each
 * line is one IEEE float operation per operator, rounded, left to right as written:
 *   g     = grad * grad_scale
 *   p     = p * decay_factor
 *   m     = m + one_minus_b1 * (g - m)
 *   v     = v * beta2 + (one_minus_b2 * g) * g
 *   denom = sqrtf(v) / bc2_sqrt + eps
 *   p     = p - (step_size * m) / denom
 *   half  = zs_f32_to_bf16(p), or zs_f32_to_f16(p) when hp->half is ZS_HALF_F16
 * and p, m, v are stored with any NaN replaced by ZS_ADAMW_NAN_BITS (after p is computed
 * from the uncanonicalized m and v; whether p is NaN does not depend on their payloads).
 *
 * The variant is chosen once (pthread_once) from what the CPU and the OS support, capped by
 * ZS_ADAMW_ISA.  The thread split cuts n into contiguous ranges at multiples of 64 elements
 * (a cache line of each float array), so no two threads write the same line; since the work
 * is elementwise, the split never changes the bits.
 */
#include "kernels/adamw.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp16.h"
#include "common/log.h"
#include "kernels/cpu/adamw_simd.h"

zs_adamw_hparams zs_adamw_hparams_make(double lr, double beta1, double beta2, double eps,
                                       double weight_decay, long t, float grad_scale)
{
    /* As torch.optim.AdamW: the bias corrections in double from the step count, rounded to
     * float once, so that every kernel multiplies by the same scalars. */
    double bc1 = 1.0 - pow(beta1, (double)t);
    double bc2 = 1.0 - pow(beta2, (double)t);
    return (zs_adamw_hparams){
        .grad_scale = grad_scale,
        .decay_factor = (float)(1.0 - lr * weight_decay),
        .one_minus_b1 = (float)(1.0 - beta1),
        .beta2 = (float)beta2,
        .one_minus_b2 = (float)(1.0 - beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)eps,
        .step_size = (float)(lr / bc1),
        .half = ZS_HALF_BF16,
    };
}

/* x, or the canonical NaN if x is a NaN of any sign and payload. */
static inline float canonical_nan(float x)
{
    union {
        uint32_t u;
        float f;
    } nan = {.u = ZS_ADAMW_NAN_BITS};
    return isnan(x) ? nan.f : x;
}

void zs_adamw_ref(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
                  const zs_adamw_hparams *hp)
{
    int f16 = hp->half == ZS_HALF_F16;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * hp->grad_scale;
        float p = param[i] * hp->decay_factor;
        float mi = m[i] + hp->one_minus_b1 * (g - m[i]);
        float vi = v[i] * hp->beta2 + (hp->one_minus_b2 * g) * g;
        float denom = sqrtf(vi) / hp->bc2_sqrt + hp->eps;
        p = p - (hp->step_size * mi) / denom;
        p = canonical_nan(p);
        param[i] = p;
        m[i] = canonical_nan(mi);
        v[i] = canonical_nan(vi);
        if (half)
            half[i] = f16 ? zs_f32_to_f16(p) : zs_f32_to_bf16(p);
    }
}

typedef void (*adamw_fn)(float *, float *, float *, const float *, uint16_t *, size_t,
                         const zs_adamw_hparams *);

static adamw_fn chosen_fn;
static const char *chosen_name;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

/* The variant files are compiled with these ISA flags (CMakeLists.txt), so the compiler may
 * use any of them there: the CPU must have all.  __builtin_cpu_supports also checks that the
 * OS saves the vector registers (XCR0). */
static int have_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma");
}

/* -mf16c is not checked: every AVX2 CPU has F16C (the AVX2 file converts fp16 copies with it),
 * and clang 14 knows no "f16c" feature string. */
static int have_avx2(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static void choose(void)
{
    /* 2: avx512 allowed, 1: up to avx2, 0: scalar only. */
    int cap = 2;
    const char *env = getenv("ZS_ADAMW_ISA");
    if (env && *env) {
        if (strcmp(env, "avx512") == 0)
            cap = 2;
        else if (strcmp(env, "avx2") == 0)
            cap = 1;
        else if (strcmp(env, "scalar") == 0)
            cap = 0;
        else
            ZS_WARN("ZS_ADAMW_ISA=%s: expected avx512, avx2 or scalar; ignoring it", env);
    }
    __builtin_cpu_init();
    if (cap >= 2 && have_avx512()) {
        chosen_fn = zs_adamw_avx512;
        chosen_name = "avx512";
    } else if (cap >= 1 && have_avx2()) {
        chosen_fn = zs_adamw_avx2;
        chosen_name = "avx2";
    } else {
        chosen_fn = zs_adamw_ref;
        chosen_name = "scalar";
    }
}

const char *zs_adamw_isa(void)
{
    pthread_once(&chosen_once, choose);
    return chosen_name;
}

/* Below this many elements per thread, waking another thread costs more than it saves
 * (a 16384-element range is ~0.5 MB of traffic, some tens of microseconds). */
#define ADAMW_MIN_PER_THREAD 16384
/* Range boundaries fall on multiples of this many elements: 64 floats = 4 cache lines, and a
 * whole number of AVX-512 vectors, so only the last range has a tail. */
#define ADAMW_ALIGN 64

void zs_adamw(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
              const zs_adamw_hparams *hp, int threads)
{
    pthread_once(&chosen_once, choose);
    adamw_fn fn = chosen_fn;
    int nt = threads > 0 ? threads : omp_get_max_threads();
    if ((size_t)nt > n / ADAMW_MIN_PER_THREAD)
        nt = (int)(n / ADAMW_MIN_PER_THREAD);
    if (nt <= 1) {
        fn(param, m, v, grad, half, n, hp);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        /* The team may be smaller than asked (OMP_THREAD_LIMIT, nesting), so the ranges come
         * from the team actually running: ceil(blocks / team) blocks of 64 each, which covers
         * all of n. */
        size_t team = (size_t)omp_get_num_threads();
        size_t blocks = (n + ADAMW_ALIGN - 1) / ADAMW_ALIGN;
        size_t per = (blocks + team - 1) / team * ADAMW_ALIGN;
        size_t lo = (size_t)omp_get_thread_num() * per;
        size_t hi = lo + per < n ? lo + per : n;
        if (lo < hi)
            fn(param + lo, m + lo, v + lo, grad + lo, half ? half + lo : NULL, hi - lo, hp);
    }
}

void zs_adamw_tensors(const zs_tensor_table *tt, size_t begin, size_t end, float *param, float *m,
                      float *v, const float *grad, uint16_t *half, zs_half_format fmt, double lr,
                      double beta1, double beta2, double eps, double weight_decay, long t,
                      float grad_scale, int threads)
{
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *ts = &tt->tensors[i];
        size_t b = ts->offset > begin ? ts->offset : begin;
        size_t e = ts->offset + ts->numel < end ? ts->offset + ts->numel : end;
        if (b >= e)
            continue;
        zs_adamw_hparams hp = zs_adamw_hparams_make(lr, beta1, beta2, eps,
                                                    ts->decay ? weight_decay : 0.0, t, grad_scale);
        hp.half = fmt;
        size_t o = b - begin;
        zs_adamw(param + o, m + o, v + o, grad + o, half ? half + o : NULL, e - b, &hp, threads);
    }
}
