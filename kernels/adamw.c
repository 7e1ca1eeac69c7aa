/*
 * adamw: the scalar reference, the choice of SIMD variant, and the split over threads.
 *
 * The operation order below is the contract every variant implements (see adamw.h):
 *   g = grad * grad_scale
 *   p = p * decay_factor
 *   m = m + one_minus_b1 * (g - m)
 *   v = v * beta2 + (one_minus_b2 * g) * g
 *   denom = sqrt(v) / bc2_sqrt + eps
 *   p = p - (step_size * m) / denom
 */
#include "kernels/adamw.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/adamw_simd.h"

zs_adamw_hparams zs_adamw_hparams_make(double lr, double beta1, double beta2, double eps,
                                       double weight_decay, long t, float grad_scale)
{
    /* As torch.optim.AdamW: bias corrections in double from the step count. */
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
    };
}

void zs_adamw_ref(float *param, float *m, float *v, const float *grad, uint16_t *bf16, size_t n,
                  const zs_adamw_hparams *hp)
{
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * hp->grad_scale;
        float p = param[i] * hp->decay_factor;
        float mi = m[i] + hp->one_minus_b1 * (g - m[i]);
        float vi = v[i] * hp->beta2 + (hp->one_minus_b2 * g) * g;
        float denom = sqrtf(vi) / hp->bc2_sqrt + hp->eps;
        p = p - (hp->step_size * mi) / denom;
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (bf16)
            bf16[i] = zs_f32_to_bf16(p);
    }
}

typedef void (*adamw_fn)(float *, float *, float *, const float *, uint16_t *, size_t,
                         const zs_adamw_hparams *);

static adamw_fn chosen_fn;
static const char *chosen_name;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    const char *cap = getenv("ZS_ADAMW_ISA");
    int allow512 = !cap || strcmp(cap, "avx512") == 0;
    int allow2 = allow512 || (cap && strcmp(cap, "avx2") == 0);
    __builtin_cpu_init();
    if (allow512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
        chosen_fn = zs_adamw_avx512;
        chosen_name = "avx512";
    } else if (allow2 && __builtin_cpu_supports("avx2")) {
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

/* Below this many elements a second thread costs more than it saves. */
#define ADAMW_MIN_PER_THREAD 16384
#define ADAMW_ALIGN 64

void zs_adamw(float *param, float *m, float *v, const float *grad, uint16_t *bf16, size_t n,
              const zs_adamw_hparams *hp, int threads)
{
    pthread_once(&chosen_once, choose);
    int nt = threads > 0 ? threads : omp_get_max_threads();
    if ((size_t)nt > n / ADAMW_MIN_PER_THREAD)
        nt = (int)(n / ADAMW_MIN_PER_THREAD);
    if (nt <= 1) {
        chosen_fn(param, m, v, grad, bf16, n, hp);
        return;
    }
    /* Contiguous ranges, one per thread, cut at multiples of 64 elements.  Elementwise work:
     * any split gives the same bits. */
    size_t per = (n / (size_t)nt + ADAMW_ALIGN - 1) / ADAMW_ALIGN * ADAMW_ALIGN;
#pragma omp parallel num_threads(nt)
    {
        size_t lo = (size_t)omp_get_thread_num() * per;
        size_t hi = lo + per < n ? lo + per : n;
        if (lo < hi)
            chosen_fn(param + lo, m + lo, v + lo, grad + lo, bf16 ? bf16 + lo : NULL, hi - lo, hp);
    }
}
