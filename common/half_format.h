/*
 * half_format: the two 16-bit float formats zshard stores, bfloat16 (8 exponent bits, 7
 * mantissa bits) and IEEE binary16 (5 and 10).  AdamW's 16-bit copy of the weights is in one of
 * them (kernels/adamw.h), and so is a GPU model's 16-bit storage (kernels/model.h's
 * ZS_PRECISION_BF16 and ZS_PRECISION_FP16, kernels/cuda/cuda_kernels.h).  A header of its own
 * because the CUDA sources and the C that drives them need the names and none of
 * common/fp16.h's conversions.
 */
#ifndef ZS_HALF_FORMAT_H
#define ZS_HALF_FORMAT_H

typedef enum { ZS_HALF_BF16 = 0, ZS_HALF_F16 = 1 } zs_half_format;

/* "bf16" or "fp16": the format's name in messages. */
static inline const char *zs_half_name(zs_half_format h)
{
    return h == ZS_HALF_F16 ? "fp16" : "bf16";
}

#endif
