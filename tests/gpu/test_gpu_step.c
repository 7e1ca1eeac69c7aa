/*
 * test_gpu_step: one whole GPT-2 124M step (B=4, T=64: forward, backward) on the GPU through the
 * compute seam (kernels/model.h, "cuda:0") against the same step on the CPU ("cpu"), from the
 * same weights (the seed's initialization plus noise, so that biases and LayerNorm weights carry
 * signal) and tokens; and the GPU step twice for the same bits.  The GPU model uses the fused
 * attention (kernels/cuda/attention.cu); a third GPU step with ZS_CUDA_ATTENTION=reference (the
 * reference attention kernel, the T x T softmax stored) is held to the same bounds against the
 * CPU and against the fused step: the two GPU steps differ only in the attention's summation
 * orders, so their distance is at most about that of either from the CPU.
 *
 * Bounds, and why.  Both compute in fp32; only the summation orders differ (cuBLASLt's and the
 * CUDA kernels' reductions against BLIS's and the CPU kernels'), and the inputs are the same
 * bits.  tests/gpu/test_cuda_kernels.c bounds each kernel alone at a few 1e-6 relative to the
 * output's magnitude; a step chains about 20 of them per block over 12 blocks, and the backward
 * feeds each block's error into the next, so the errors add up to about 1e-5 of a tensor's
 * largest gradient.  The bounds below leave a factor of 10 over that estimate:
 *   loss:      |gpu - cpu| <= 1e-5 * cpu (one mean over 256 positions of log-softmax terms);
 *   gradients: for every tensor, max |gpu - cpu| <= 1e-4 * max |cpu| over the tensor.
 * (The estimate has not been checked on a GPU yet: the first run on one should print the
 * worst ratios it saw, which this test does, and the bounds be set from them.)
 *
 * The bf16 mode (bf16 storage, fp32 accumulation: docs/gpu.md) from the same weights rounded to
 * bf16 (what a bf16.enabled job hands the model), against the fp32 GPU step from those same
 * weights, and twice for the same bits.  The band: each GEMM operand carries a bf16 rounding
 * (2^-9 relative, 2e-3), about ten of them feed each block's gradients, and they add up like
 * noise, not in one direction: a few 1e-2 of a gradient's norm.  Checked per tensor as
 * ||bf16 - fp32|| <= 0.1 ||fp32|| (a factor of a few over that estimate, and far below the
 * O(1) of a wrong product or a missing term), and the loss within 1e-2 relative (its logits
 * come from bf16 operands, each a 2e-3 rounding, averaged over 256 positions).  As above, the
 * first run should print the worst ratios, and the band be set from them.
 *
 * The fp16 mode likewise, from weights rounded to fp16, with a loss scale of 2^10 in the
 * backward (zs_model_loss_scale must report that the model applies it; the gradients are divided
 * by it, exactly, before the comparison), and the same band: fp16's roundings are 8 times finer
 * than bf16's in its range, and the scale keeps the backward's 16-bit gradients in it.
 *
 * Exits 77 (skipped) where no CUDA device can be used; tests/gpu/run.sh treats 77 as a failure.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/tensors.h"
#include "kernels/adamw.h"
#include "kernels/model.h"
#include "tests/unit/test.h"

enum { B = 4, T = 64 };

/* The fp16 steps' loss scale (a power of two): the model's backward carries it, and step()
 * divides it out of the gradients it returns (exactly). */
#define FP16_SCALE 1024.0f

/* One forward + backward on dev in precision prec: *loss and grads (host) from params (host).
 * attention: the value of ZS_CUDA_ATTENTION while the model is created (read once there), or
 * NULL: unset. */
static void step(zs_device dev, const char *attention, zs_precision prec,
                 const zs_model_config *cfg, const zs_tensor_table *tt, const float *params,
                 const int32_t *in, const int32_t *tg, float *loss, float *grads)
{
    zs_model *m = NULL;
    if (attention)
        setenv("ZS_CUDA_ATTENTION", attention, 1);
    else
        unsetenv("ZS_CUDA_ATTENTION");
    CHECK_OK(zs_model_create(dev, cfg, tt, B, T, 2, prec, &m));
    unsetenv("ZS_CUDA_ATTENTION");
    /* A model that could not be created (a failure counted above) leaves m NULL, which the calls
     * below would dereference: its step gives NaNs instead, which fail every comparison, and the
     * steps after it still run. */
    if (!m) {
        *loss = NAN;
        for (size_t i = 0; i < tt->total; i++)
            grads[i] = NAN;
        return;
    }
    size_t bytes = tt->total * sizeof(float);
    float *dp = (float *)params, *dg = grads;
    if (!zs_model_on_host(m)) {
        CHECK_OK(zs_model_alloc(m, bytes, (void **)&dp));
        CHECK_OK(zs_model_alloc(m, bytes, (void **)&dg));
        CHECK_OK(zs_model_upload(m, dp, params, bytes));
    }
    zs_gpt2_flat flat = {dp, dg};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    /* fp16 on a GPU: the model applies the scale itself, leaving the host nothing to do. */
    if (prec == ZS_PRECISION_FP16 && !zs_model_on_host(m))
        CHECK(zs_model_loss_scale(m, FP16_SCALE) == 1.0f);
    CHECK_OK(zs_model_forward(m, &io, in, tg, B, T, loss));
    CHECK_OK(zs_model_backward(m, &io));
    if (!zs_model_on_host(m)) {
        CHECK_OK(zs_model_download(m, grads, dg, bytes));
        zs_model_dealloc(m, dp);
        zs_model_dealloc(m, dg);
    }
    if (prec == ZS_PRECISION_FP16 && !zs_model_on_host(m))
        for (size_t i = 0; i < tt->total; i++)
            grads[i] /= FP16_SCALE;
    zs_model_free(m);
}

/* Checks, for every tensor, max |got - want| <= 1e-4 * max |want| over the tensor; prints the
 * worst ratio and every tensor beyond the bound. */
static void worst_gradient(const char *got_name, const float *got, const char *want_name,
                           const float *want, const zs_tensor_table *tt)
{
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        double big = 0, diff = 0;
        for (size_t j = 0; j < t->numel; j++) {
            double c = want[t->offset + j], g = got[t->offset + j];
            big = fabs(c) > big ? fabs(c) : big;
            diff = fabs(g - c) > diff || isnan(g) ? (isnan(g) ? INFINITY : fabs(g - c)) : diff;
        }
        double ratio = big > 0 ? diff / big : diff;
        if (ratio > worst)
            worst = ratio, worst_name = t->name;
        if (!(ratio <= 1e-4))
            fprintf(stderr, "test_gpu_step: %s: max |%s - %s| %.3e, max |%s| %.3e (%.2e)\n",
                    t->name, got_name, want_name, diff, want_name, big, ratio);
        CHECK(ratio <= 1e-4);
    }
    printf("test_gpu_step: %s against %s: worst gradient ratio %.2e (%s)\n", got_name, want_name,
           worst, worst_name);
}

/* Checks, for every tensor, ||got - want|| / ||want|| <= bound (a 16-bit step's gradients,
 * got, against the fp32 step's from the same rounded weights); prints the worst. */
static void reduced_gradients(const char *mode, const float *got, const float *want,
                              const zs_tensor_table *tt, double bound)
{
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        double d2 = 0, r2 = 0;
        for (size_t j = 0; j < t->numel; j++) {
            double r = want[t->offset + j], g = got[t->offset + j];
            d2 += (g - r) * (g - r);
            r2 += r * r;
        }
        double ratio = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
        if (isnan(ratio))
            ratio = INFINITY;
        if (ratio > worst)
            worst = ratio, worst_name = t->name;
        if (!(ratio <= bound))
            fprintf(stderr, "test_gpu_step: %s %s: ||%s - fp32|| / ||fp32|| = %.2e\n", mode,
                    t->name, mode, ratio);
        CHECK(ratio <= bound);
    }
    printf("test_gpu_step: %s worst ||%s - fp32|| / ||fp32|| %.2e (%s)\n", mode, mode, worst,
           worst_name);
}

static float round_bf16(float v)
{
    return zs_bf16_to_f32(zs_f32_to_bf16(v));
}

static float round_fp16(float v)
{
    return zs_f16_to_f32(zs_f32_to_f16(v));
}

/* A 16-bit mode's step (precision prec, named mode): params rounded in place by round16; the
 * fp32 GPU step from them into g32, the 16-bit one into g16 and again into g16b (the same bits),
 * the loss within 1e-2 of the fp32 one, the gradients within reduced_gradients' band. */
static void reduced_mode(const char *mode, zs_precision prec, float (*round16)(float),
                         const zs_model_config *cfg, const zs_tensor_table *tt, float *params,
                         const int32_t *in, const int32_t *tg, float *g32, float *g16, float *g16b)
{
    const zs_device gpu = {ZS_DEVICE_CUDA, 0};
    size_t n = tt->total;
    for (size_t i = 0; i < n; i++)
        params[i] = round16(params[i]);
    float l32, l16, l16b;
    step(gpu, NULL, ZS_PRECISION_FP32, cfg, tt, params, in, tg, &l32, g32);
    step(gpu, NULL, prec, cfg, tt, params, in, tg, &l16, g16);
    step(gpu, NULL, prec, cfg, tt, params, in, tg, &l16b, g16b);
    printf("test_gpu_step: %s loss %.7f, fp32 %.7f (relative %.2e)\n", mode, l16, l32,
           fabs((double)l16 - l32) / l32);
    CHECK(fabs((double)l16 - l32) <= 1e-2 * l32);
    CHECK(memcmp(&l16, &l16b, sizeof l16) == 0);
    CHECK(memcmp(g16, g16b, n * sizeof *g16) == 0); /* run to run: the same bits */
    reduced_gradients(mode, g16, g32, tt, 0.1);
}

int main(void)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("test_gpu_step: skipped: no CUDA device\n");
        return 77;
    }
    zs_model_config cfg = {
        .n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .block_size = 1024};
    zs_tensor_table tt;
    CHECK_OK(zs_tensors_gpt2(&cfg, &tt));
    size_t n = tt.total;
    float *params = calloc(n, sizeof *params), *gcpu = calloc(n, sizeof *gcpu);
    float *ggpu = calloc(n, sizeof *ggpu), *ggpu2 = calloc(n, sizeof *ggpu2);
    float *gref = calloc(n, sizeof *gref);
    zs_tensors_init_gpt2(&tt, 11, params, 0, n);
    for (int i = 0; i < tt.count; i++)
        for (size_t j = 0; j < tt.tensors[i].numel; j++)
            params[tt.tensors[i].offset + j] += (float)(0.02 * zs_rng_normal(12, (uint64_t)i, j));
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(zs_rng_u64(11, 1, (uint64_t)i) % 50257);
        tg[i] = (int32_t)(zs_rng_u64(11, 2, (uint64_t)i) % 50257);
    }
    float lcpu, lgpu, lgpu2, lref;
    const zs_device cpu = {ZS_DEVICE_CPU, 0}, gpu = {ZS_DEVICE_CUDA, 0};
    const zs_precision fp32 = ZS_PRECISION_FP32, bf16 = ZS_PRECISION_BF16;
    const zs_precision fp16 = ZS_PRECISION_FP16;
    step(cpu, NULL, fp32, &cfg, &tt, params, in, tg, &lcpu, gcpu);
    step(gpu, NULL, fp32, &cfg, &tt, params, in, tg, &lgpu, ggpu);
    step(gpu, NULL, fp32, &cfg, &tt, params, in, tg, &lgpu2, ggpu2);
    step(gpu, "reference", fp32, &cfg, &tt, params, in, tg, &lref, gref);
    printf("test_gpu_step: loss cpu %.7f gpu %.7f (relative %.2e), gpu with the reference "
           "attention %.7f (relative %.2e)\n",
           lcpu, lgpu, fabs((double)lgpu - lcpu) / lcpu, lref, fabs((double)lref - lcpu) / lcpu);
    CHECK(fabs((double)lgpu - lcpu) <= 1e-5 * lcpu);
    CHECK(fabs((double)lref - lcpu) <= 1e-5 * lcpu);
    CHECK(fabs((double)lgpu - lref) <= 1e-5 * lcpu);
    CHECK(memcmp(&lgpu, &lgpu2, sizeof lgpu) == 0);
    CHECK(memcmp(ggpu, ggpu2, n * sizeof *ggpu) == 0); /* run to run: the same bits */
    worst_gradient("gpu", ggpu, "cpu", gcpu, &tt);
    worst_gradient("gpu-reference-attention", gref, "cpu", gcpu, &tt);
    worst_gradient("gpu", ggpu, "gpu-reference-attention", gref, &tt);

    /* bf16, then fp16: the weights rounded as a bf16.enabled or fp16.enabled job's; fp32 and
     * 16-bit GPU steps from them (fp16's with the loss scale in its backward). */
    reduced_mode("bf16", bf16, round_bf16, &cfg, &tt, params, in, tg, ggpu, gcpu, ggpu2);
    reduced_mode("fp16", fp16, round_fp16, &cfg, &tt, params, in, tg, ggpu, gcpu, ggpu2);
    free(params), free(gcpu), free(ggpu), free(ggpu2), free(gref);
    zs_tensors_free(&tt);
    return zs_test_result("test_gpu_step");
}
