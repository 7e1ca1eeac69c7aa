/*
 * bench_gpu_step: the GPT-2 training step's forward + backward on one GPU through the compute
 * seam (kernels/model.h, "cuda:N"), for GPT-2 124M (12 x 768) and 350M (24 x 1024), B=4,
 * T=1024, with the weights and gradients already in device memory (what a worker's step costs
 * the GPU, without the copies and the network: bench_launch_step with DEVICE cuda gives that
 * split).
 *
 * The figure is the step's achieved TFLOP/s (zs_gpt2_flops / time; the usual count: 6 flops per
 * weight per token plus attention's products, elementwise work not counted), in both of the
 * model's precisions (kernels/model.h).  The limit measured in the same run is the GEMM peak of
 * the path each precision's matmuls take, on a 8192 x 8192 x 8192 product, best of 5: cuBLASLt
 * with fp32 operands (zs_cuda_linear_forward) for fp32, with bf16 operands and fp32
 * accumulation (zs_cuda_linear_forward_half, the tensor cores) for bf16.  Each step's ratio to
 * its own peak is its model-flops utilization.  llm.c's published figure, about 60% MFU for
 * 124M on an A100, is bf16 against the bf16 tensor-core peak: the bf16 line is the one to set
 * beside it (llm.c also keeps its attention, fused, in bf16; ours is fp32).
 *
 * usage: bench_gpu_step [DEVICE=0] [steps=10]
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/gpubench.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/tensors.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/model.h"

/* Best step time in ms of steps forward+backward passes of cfg at B x T on dev, or -1. */
static double step_ms(int dev, const zs_model_config *cfg, int B, int T, int steps,
                      zs_precision prec)
{
    zs_tensor_table tt;
    if (zs_tensors_gpt2(cfg, &tt) != ZS_OK)
        return -1;
    size_t bytes = tt.total * sizeof(float);
    float *host = malloc(bytes);
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    zs_model *m = NULL;
    float *dp = NULL, *dg = NULL;
    double best = -1;
    if (!host || !in || !tg)
        goto out;
    zs_tensors_init_gpt2(&tt, 1, host, 0, tt.total);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(zs_rng_u64(1, 1, (uint64_t)i) % (uint64_t)cfg->vocab_size);
        tg[i] = (int32_t)(zs_rng_u64(1, 2, (uint64_t)i) % (uint64_t)cfg->vocab_size);
    }
    if (zs_model_create((zs_device){ZS_DEVICE_CUDA, dev}, cfg, &tt, B, T, 1, prec, &m) != ZS_OK ||
        zs_model_alloc(m, bytes, (void **)&dp) != ZS_OK ||
        zs_model_alloc(m, bytes, (void **)&dg) != ZS_OK ||
        zs_model_upload(m, dp, host, bytes) != ZS_OK) {
        fprintf(stderr, "bench_gpu_step: %s\n", zs_last_error());
        goto out;
    }
    zs_gpt2_flat flat = {dp, dg};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    for (int s = 0; s <= steps; s++) {
        float loss;
        double t0 = zs_now_s();
        /* The forward synchronizes for its loss; the download of one float after the
         * backward waits for the backward to finish. */
        if (zs_model_forward(m, &io, in, tg, B, T, &loss) != ZS_OK ||
            zs_model_backward(m, &io) != ZS_OK ||
            zs_model_download(m, &loss, dg, sizeof loss) != ZS_OK) {
            fprintf(stderr, "bench_gpu_step: %s\n", zs_last_error());
            best = -1;
            goto out;
        }
        double ms = (zs_now_s() - t0) * 1e3;
        if (s > 0 && (best < 0 || ms < best))
            best = ms;
    }
out:
    if (m) {
        zs_model_dealloc(m, dp);
        zs_model_dealloc(m, dg);
        zs_model_free(m);
    }
    free(host);
    free(in);
    free(tg);
    zs_tensors_free(&tt);
    return best;
}

int main(int argc, char **argv)
{
    int dev = zs_bench_device("bench_gpu_step", argc, argv), steps = argc > 2 ? atoi(argv[2]) : 10;
    if (dev < 0)
        return 1;
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    double peak32 = zs_bench_gemm_peak(dev, 8192, 0), peak16 = zs_bench_gemm_peak(dev, 8192, 1);
    printf("GPU %d: %s (sm_%d%d); GEMM peak through cuBLASLt (8192^3): fp32 %.1f TFLOP/s, bf16 "
           "operands with fp32 accumulation %.1f TFLOP/s\n",
           dev, prop.name, prop.major, prop.minor, peak32, peak16);
    struct {
        const char *name;
        zs_model_config cfg;
    } cases[] = {
        {"124M",
         {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .block_size = 1024}},
        {"350M",
         {.n_layer = 24, .n_head = 16, .n_embd = 1024, .vocab_size = 50257, .block_size = 1024}},
    };
    const int B = 4, T = 1024;
    double tf124[2] = {0, 0}; /* the figures: GPT-2 124M's, fp32 and bf16 */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            double peak = bf16 ? peak16 : peak32;
            double ms = step_ms(dev, &cases[i].cfg, B, T, steps,
                                bf16 ? ZS_PRECISION_BF16 : ZS_PRECISION_FP32);
            if (ms <= 0)
                return 1;
            double tf = zs_gpt2_flops(&cases[i].cfg, B, T) / (ms / 1e3) / 1e12;
            printf("GPT-2 %s, B=%d T=%d, %s: forward+backward %.1f ms, %.1f TFLOP/s, %.2f of the "
                   "%s GEMM peak%s\n",
                   cases[i].name, B, T, bf16 ? "bf16" : "fp32", ms, tf, tf / peak,
                   bf16 ? "bf16" : "fp32",
                   bf16 ? " (llm.c, bf16 on an A100: about 0.60 of the bf16 peak for 124M)" : "");
            if (i == 0)
                tf124[bf16] = tf;
        }
    printf("bench_gpu_step: GPT-2 124M: fp32 %.1f TFLOP/s (%.2f of the fp32 GEMM peak %.1f), "
           "bf16 %.1f TFLOP/s (%.2f of the bf16 GEMM peak %.1f)\n",
           tf124[0], tf124[0] / peak32, peak32, tf124[1], tf124[1] / peak16, peak16);
    return 0;
}
