/*
 * classifier: GPT-2's output layer, lm_head tied to wte (logits = x wte^T), and the
 * softmax + cross-entropy that turns logits into the loss and, in the same pass, into their
 * gradient.
 *
 * The logits are the largest activation of a step (N x V: 51 MB for GPT-2 at N = 256), so
 * zs_crossentropy_fused reads each row once from memory and then works on it in cache: the
 * max, then exp(x - max) written back in place while summing, then the scale to
 * (softmax - onehot) * dloss.  The logits are not needed afterwards, which is why the
 * gradient can replace them.  One exp per logit (zs_vexp_sum, vectorized); rows are
 * independent and parallel.
 */
#include "kernels/kernels.h"

#include <math.h>
#include <stddef.h>

/* At -O1 (the sanitizer build) clang does not vectorize and warns about every omp simd. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wunknown-warning-option"
#pragma GCC diagnostic ignored "-Wpass-failed"

void zs_lm_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V,
                        int threads)
{
    /* (N, C) x (C, V): wte (V, C) read transposed. */
    zs_sgemm(0, 1, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V, threads);
}

void zs_lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                         const float *wte, int N, int C, int V, int threads)
{
    zs_gemm g[2] = {
        {0, 0, N, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dinp, C, NULL},
        {1, 0, V, C, N, 1.0f, dlogits, V, inp, C, 0.0f, dwte, C, NULL},
    };
    zs_sgemm_many(g, 2, threads);
}

void zs_crossentropy_fused(float *logits, float *losses, const int32_t *targets, int N, int V,
                           float dloss, int threads)
{
    int nt = zs_kernel_threads(threads);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * V;
        int t = targets[i];
        float mx = zs_vmax(x, V);
        float xt = x[t];
        double sum = zs_vexp_sum(x, V, mx);
        losses[i] = (float)(log(sum) - ((double)xt - (double)mx));
        float scale = (float)(dloss / sum);
#pragma omp simd
        for (int j = 0; j < V; j++)
            x[j] *= scale;
        x[t] -= dloss;
    }
}
