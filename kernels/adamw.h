/*
 * adamw: the AdamW update with PyTorch semantics (torch.optim.AdamW, single-tensor path),
 * run by the single-process trainer and by the partition servers on their shards.
 *
 *   g     = grad * grad_scale                    (grad_scale folds 1/C and the clip factor)
 *   p     = p * (1 - lr * weight_decay)          (decoupled decay; 0 for 1-dim tensors)
 *   m     = m + (1 - beta1) * (g - m)
 *   v     = v * beta2 + (1 - beta2) * g * g
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
 *   p     = p - (lr / (1 - beta1^t)) * m / denom
 *   half  = p rounded to nearest even (NaN stays NaN), in the job's 16-bit format: bf16, or
 *           IEEE fp16 (binary16: beyond 65504 rounds to inf) for fp16 jobs
 *
 * A NaN stored in p, m or v is always the default quiet NaN 0x7fc00000.  When two different
 * NaNs meet in an addition, x86 returns the first operand's, and for a commutative operation
 * the compiler chooses the order; so NaN payloads would differ between builds and variants.
 * Whether a result is NaN does not depend on the order, so storing one canonical NaN keeps
 * the bits equal.
 *
 * Invariant: every implementation (scalar reference, AVX2, AVX-512; any thread count) gives
 * bitwise the same p, m, v and half copy.  The scalars (bias corrections, step size) are computed
 * once in double by zs_adamw_hparams_make, and every kernel performs the same IEEE float
 * operations in the same order, without FMA contraction.
 */
#ifndef ZS_ADAMW_H
#define ZS_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "common/fp16.h"
#include "common/tensors.h"

/* The 16-bit copy AdamW writes beside the weights is in a zs_half_format (common/half_format.h):
 * what the workers of a bf16 or an fp16 job fetch (docs/precision.md). */

typedef struct {
    float grad_scale;   /* multiplies every gradient */
    float decay_factor; /* 1 - lr * weight_decay */
    float one_minus_b1; /* 1 - beta1 */
    float beta2;
    float one_minus_b2; /* 1 - beta2 */
    float bc2_sqrt;     /* sqrt(1 - beta2^t) */
    float eps;
    float step_size;     /* lr / (1 - beta1^t) */
    zs_half_format half; /* the format of the copy written to `half` */
} zs_adamw_hparams;

/* t is the 1-based step count used for bias correction; the copy's format is bf16. */
zs_adamw_hparams zs_adamw_hparams_make(double lr, double beta1, double beta2, double eps,
                                       double weight_decay, long t, float grad_scale);

/* Scalar reference.  half (the 16-bit copy, in hp->half's format) may be NULL.  Cost: ~30 bytes
 * of memory traffic per element. */
void zs_adamw_ref(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
                  const zs_adamw_hparams *hp);

/*
 * The fast path: the widest SIMD variant this CPU supports (chosen once, at first use) over
 * `threads` OpenMP threads (0: the OpenMP default).  Same bits as zs_adamw_ref.
 */
void zs_adamw(float *param, float *m, float *v, const float *grad, uint16_t *half, size_t n,
              const zs_adamw_hparams *hp, int threads);

/* The ISA the fast path uses: "avx512", "avx2" or "scalar".  ZS_ADAMW_ISA=avx2|scalar in the
 * environment caps it (for tests and benchmarks). */
const char *zs_adamw_isa(void);

/* float -> bf16, round to nearest even; NaN maps to a quiet NaN of the same sign. */
static inline uint16_t zs_f32_to_bf16(float f)
{
    union {
        float f;
        uint32_t u;
    } x = {.f = f};
    if ((x.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x.u >> 16) | 0x0040u);
    uint32_t rounding = 0x7fffu + ((x.u >> 16) & 1u);
    return (uint16_t)((x.u + rounding) >> 16);
}

static inline float zs_bf16_to_f32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } x = {.u = (uint32_t)h << 16};
    return x.f;
}

/*
 * AdamW over the part [begin, end) of the flat vector described by tt, tensor by tensor:
 * weight decay on tensors with t->decay only, padding untouched.  The arrays hold the range
 * only (element 0 is vector element begin); half (the 16-bit copy, in format fmt) may be NULL.
 * Elementwise, so any split of the vector into ranges (a shard per server, or the whole vector in
 * the trainer) gives the same bits.  t is the 1-based step count.
 */
void zs_adamw_tensors(const zs_tensor_table *tt, size_t begin, size_t end, float *param, float *m,
                      float *v, const float *grad, uint16_t *half, zs_half_format fmt, double lr,
                      double beta1, double beta2, double eps, double weight_decay, long t,
                      float grad_scale, int threads);

#endif
