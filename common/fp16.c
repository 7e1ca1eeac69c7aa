/*
 * fp16: the array operations of the fp16 emulation (fp16.h).  Both are elementwise, so any
 * split over threads gives the same bits.
 */
#include "common/fp16.h"

#include <math.h>
#include <string.h>

void zs_fp16_round_array(float *dst, const float *src, size_t n, int threads)
{
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (size_t i = 0; i < n; i++)
        dst[i] = zs_fp16_round(src[i]);
}

size_t zs_fp16_scale_grads(float *g, size_t n, float scale)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x = zs_fp16_round(g[i] * scale);
        bad += !isfinite(x);
        g[i] = x;
    }
    return bad;
}

size_t zs_fp16_scale_narrow(float *g, size_t n, float scale)
{
    size_t bad = 0;
    unsigned char *out = (unsigned char *)g;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = zs_f32_to_f16(g[i] * scale);
        bad += (h & 0x7c00u) == 0x7c00u; /* inf or NaN */
        memcpy(out + 2 * i, &h, sizeof h);
    }
    return bad;
}
