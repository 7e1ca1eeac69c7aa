/*
 * test_model: the compute seam (kernels/model.h).
 *
 *   devices      "cpu", "cuda", "cuda:N" parse; anything else is refused, naming the text;
 *   cpu model    forward and backward through zs_model give bitwise the loss and gradient of
 *                kernels/gpt2.c called directly, twice, in any precision (the CPU ignores
 *                it), leaves an fp16 job's loss scale to the host (zs_model_loss_scale returns
 *                it), and its memory calls move bytes;
 *   precision    bf16.enabled gives ZS_PRECISION_BF16, fp16.enabled ZS_PRECISION_FP16, else
 *                fp32;
 *   layout       zs_gpt2_acts_layout_for leaves out exactly the arrays named, with NULL
 *                pointers and slices, and keeps the others' sizes and order;
 *   cuda model   where a GPU can be used, the same io gives a finite loss close to the CPU's
 *                (tests/gpu/ holds the real comparisons); where none can (these build
 *                machines), creating one fails with a message naming the device, and a binary
 *                built without CUDA says that it was;
 *   dma-buf      where a GPU can be used: zs_model_dmabuf_alloc gives zeroed memory placed and
 *                sized as model.h says, with a dma-buf fd, that copy_now fills and reads back,
 *                and nic_wrote succeeds whether or not the GPU needs the flush (or, where the
 *                GPU or driver cannot export, says why); an export that fails (too large) leaves
 *                the model able to run a step (no runtime error left behind for the next
 *                launch to report as its own).  No NIC is needed for any of it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/tensors.h"
#include "kernels/gpt2_layout.h"
#include "kernels/model.h"
#include "tests/unit/test.h"

static void test_devices(void)
{
    zs_device d;
    char name[16];
    CHECK_OK(zs_device_parse("cpu", &d));
    CHECK_EQ_INT(d.kind, ZS_DEVICE_CPU);
    CHECK_OK(zs_device_parse("cuda", &d));
    CHECK_EQ_INT(d.kind, ZS_DEVICE_CUDA);
    CHECK_EQ_INT(d.index, 0);
    CHECK_OK(zs_device_parse("cuda:3", &d));
    CHECK_EQ_INT(d.kind, ZS_DEVICE_CUDA);
    CHECK_EQ_INT(d.index, 3);
    zs_device_format(d, name, sizeof name);
    CHECK(!strcmp(name, "cuda:3"));
    const char *bad[] = {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999", "CPU", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[64];
        snprintf(want, sizeof want, "device \"%s\"", bad[i]);
        CHECK_FAILS_WITH(zs_device_parse(bad[i], &d), want);
    }
}

typedef struct {
    zs_model_config cfg;
    zs_tensor_table tt;
    float *params, *grads;
    int32_t in[2 * 8], tg[2 * 8];
} fixture;

static void fixture_init(fixture *f)
{
    f->cfg = (zs_model_config){
        .n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 37, .block_size = 8};
    CHECK_OK(zs_tensors_gpt2(&f->cfg, &f->tt));
    f->params = calloc(f->tt.total, sizeof *f->params);
    f->grads = calloc(f->tt.total, sizeof *f->grads);
    zs_tensors_init_gpt2(&f->tt, 7, f->params, 0, f->tt.total);
    for (int i = 0; i < 16; i++) {
        f->in[i] = (int32_t)(zs_rng_u64(7, 1, (uint64_t)i) % 37);
        f->tg[i] = (int32_t)(zs_rng_u64(7, 2, (uint64_t)i) % 37);
    }
}

static void fixture_free(fixture *f)
{
    zs_tensors_free(&f->tt);
    free(f->params);
    free(f->grads);
}

/* A "cpu" model gives the bits of the gpt2 model itself; its memory calls move bytes. */
static void test_cpu(fixture *f)
{
    size_t n = f->tt.total;
    zs_gpt2 *g;
    CHECK_OK(zs_gpt2_create(&f->cfg, &f->tt, 2, 8, 2, &g));
    zs_gpt2_flat flat = {f->params, f->grads};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    float want_loss;
    CHECK_OK(zs_gpt2_forward(g, &io, f->in, f->tg, 2, 8, &want_loss));
    CHECK_OK(zs_gpt2_backward(g, &io));
    float *want = malloc(n * sizeof *want);
    memcpy(want, f->grads, n * sizeof *want);
    zs_gpt2_free(g);

    zs_model *m;
    /* The CPU takes a precision and computes the same bits with any; an fp16 job's loss scale
     * is left to the host, which multiplies the gradient by it (zs_fp16_scale_grads). */
    const zs_precision reduced[2] = {ZS_PRECISION_BF16, ZS_PRECISION_FP16};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(zs_model_create((zs_device){ZS_DEVICE_CPU, 0}, &f->cfg, &f->tt, 2, 8, 2,
                                 reduced[k], &m));
        CHECK(zs_model_loss_scale(m, 1024.0f) == 1024.0f);
        float loss;
        memset(f->grads, 0xff, n * sizeof *f->grads);
        CHECK_OK(zs_model_forward(m, &io, f->in, f->tg, 2, 8, &loss));
        CHECK_OK(zs_model_backward(m, &io));
        CHECK(memcmp(&loss, &want_loss, sizeof loss) == 0);
        CHECK(memcmp(f->grads, want, n * sizeof *want) == 0);
        zs_model_free(m);
    }
    CHECK_OK(zs_model_create((zs_device){ZS_DEVICE_CPU, 0}, &f->cfg, &f->tt, 2, 8, 2,
                             ZS_PRECISION_FP32, &m));
    CHECK(zs_model_on_host(m));
    CHECK_EQ_INT(zs_model_host_bytes(zs_model_device(m), &f->cfg, 2, 8),
                 zs_gpt2_activation_bytes(&f->cfg, 2, 8));
    for (int round = 0; round < 2; round++) {
        memset(f->grads, 0xff, n * sizeof *f->grads); /* NaNs: every float must be written */
        float loss;
        CHECK_OK(zs_model_forward(m, &io, f->in, f->tg, 2, 8, &loss));
        CHECK_OK(zs_model_backward(m, &io));
        CHECK(memcmp(&loss, &want_loss, sizeof loss) == 0);
        CHECK(memcmp(f->grads, want, n * sizeof *want) == 0);
    }
    /* A forward that is not followed by backward is ended by finish; then another runs. */
    float loss;
    CHECK_OK(zs_model_forward(m, &io, f->in, f->tg, 2, 8, &loss));
    CHECK_FAILS_WITH(zs_model_forward(m, &io, f->in, f->tg, 2, 8, &loss), "still holds");
    zs_model_finish(m, &io);
    CHECK_OK(zs_model_forward(m, &io, f->in, f->tg, 2, 8, &loss));
    zs_model_finish(m, &io);

    float *buf, back[5] = {0}, src[5] = {1, 2, 3, 4, 5};
    CHECK_OK(zs_model_alloc(m, sizeof src, (void **)&buf));
    CHECK_EQ_INT(buf[0], 0);
    CHECK_OK(zs_model_upload(m, buf, src, sizeof src));
    CHECK_OK(zs_model_download(m, back, buf, sizeof back));
    CHECK(!memcmp(back, src, sizeof src));
    /* On the CPU an asynchronous copy is done when it returns, and every ticket is complete. */
    uint64_t t = 99, done = 99;
    float src2[5] = {6, 7, 8, 9, 10};
    CHECK_OK(zs_model_mark(m, &t));
    CHECK_EQ_INT(t, 0);
    CHECK_OK(zs_model_upload_async(m, buf, src2, sizeof src2, t, &done));
    CHECK_EQ_INT(done, 0);
    CHECK_OK(zs_model_after(m, done));
    CHECK_OK(zs_model_sync(m, done));
    CHECK(!memcmp(buf, src2, sizeof src2));
    zs_model_dealloc(m, buf);
    float *host;
    CHECK_OK(zs_model_host_alloc(m, sizeof src, (void **)&host));
    CHECK_EQ_INT(host[4], 0);
    CHECK_EQ_INT((uintptr_t)host % 64, 0);
    zs_model_host_free(m, host);
    zs_model_free(m);
    free(want);
}

static void test_precision(void)
{
    zs_config cfg;
    memset(&cfg, 0, sizeof cfg);
    CHECK_EQ_INT(zs_model_precision(&cfg), ZS_PRECISION_FP32);
    cfg.fp16.enabled = 1; /* the CPU emulates it on the host; a GPU stores fp16 */
    CHECK_EQ_INT(zs_model_precision(&cfg), ZS_PRECISION_FP16);
    cfg.fp16.enabled = 0;
    cfg.bf16 = 1;
    CHECK_EQ_INT(zs_model_precision(&cfg), ZS_PRECISION_BF16);
}

/* The layout without some arrays: those are NULL (and their block slices), the rest keep their
 * sizes and order, and the bytes shrink by exactly the arrays left out. */
static void test_layout_without(const fixture *f)
{
    const size_t align = 256;
    const int B = 2, T = 8;
    zs_gpt2_acts all, less;
    size_t full = zs_gpt2_acts_layout(&all, NULL, align, &f->cfg, B, T);
    char *base = aligned_alloc(align, full);
    CHECK(base != NULL);
    if (!base)
        return;
    CHECK_EQ_INT(zs_gpt2_acts_layout(&all, base, align, &f->cfg, B, T), full);
    unsigned without = ZS_ACTS_LN1 | ZS_ACTS_FCH_GELU | ZS_ACTS_LNF;
    size_t bytes =
        zs_gpt2_acts_layout_for(&less, base, align, &f->cfg, B, T, ZS_GPT2_ATT_PROBS, without);
    const size_t L = 2, C = 16, N = (size_t)B * T;
    size_t gone = 0;
    const size_t dropped[] = {L * N * C, L * N * 4 * C, N * C};
    for (size_t i = 0; i < 3; i++)
        gone += (dropped[i] * sizeof(float) + align - 1) & ~(align - 1);
    CHECK_EQ_INT(bytes, full - gone);
    CHECK(less.ln1 == NULL && less.fch_gelu == NULL && less.lnf == NULL);
    CHECK(less.resid == all.resid && less.ln1_mean != NULL && less.ln2 != NULL);
    CHECK(less.fch != NULL && less.datt != NULL);
    CHECK(less.ln1_mean < less.ln2 && less.ln2 < less.fch && less.fch < less.proj);
    zs_gpt2_block_acts v = zs_gpt2_block_slices(&less, &f->cfg, B, T, 1);
    CHECK(v.ln1 == NULL && v.gelu == NULL && v.ln2 == less.ln2 + N * C);
    CHECK(v.fch == less.fch + N * 4 * C);
    free(base);
}

/* One step of f's batch on m with the parameters and gradients in m's memory: the parameters
 * uploaded, the gradients downloaded into f->grads.  Returns the loss. */
static float device_step(fixture *f, zs_model *m)
{
    size_t bytes = f->tt.total * sizeof(float);
    float *dp, *dg, loss = NAN;
    CHECK_OK(zs_model_alloc(m, bytes, (void **)&dp));
    CHECK_OK(zs_model_alloc(m, bytes, (void **)&dg));
    CHECK_OK(zs_model_upload(m, dp, f->params, bytes));
    zs_gpt2_flat flat = {dp, dg};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    CHECK_OK(zs_model_forward(m, &io, f->in, f->tg, 2, 8, &loss));
    CHECK_OK(zs_model_backward(m, &io));
    CHECK_OK(zs_model_download(m, f->grads, dg, bytes));
    zs_model_dealloc(m, dp);
    zs_model_dealloc(m, dg);
    return loss;
}

/* Where a GPU can be used, a cuda model runs the same step (through device copies of the
 * parameters) in either precision; where none can, creating one is refused with the device
 * named. */
static void test_cuda(fixture *f, zs_precision prec)
{
    zs_model *m = NULL;
    zs_err e = zs_model_create((zs_device){ZS_DEVICE_CUDA, 0}, &f->cfg, &f->tt, 2, 8, 1, prec, &m);
    if (e != ZS_OK) {
        const char *why = zs_last_error();
        printf("test_model: no cuda model here: %s\n", why);
        CHECK(strstr(why, "cuda:0") != NULL);
        CHECK(m == NULL);
        return;
    }
    CHECK(!zs_model_on_host(m));
    CHECK_EQ_INT(zs_model_host_bytes(zs_model_device(m), &f->cfg, 2, 8), 0);
    float loss = device_step(f, m);
    CHECK(isfinite(loss) && fabsf(loss - logf(37.0f)) < 1.0f); /* a fresh model: about ln V */
    zs_model_free(m);
}

/* The GPU's side of GPUDirect RDMA without a NIC (see the header); nothing where no GPU is. */
static void test_cuda_dmabuf(fixture *f)
{
    zs_model *m = NULL;
    if (zs_model_create((zs_device){ZS_DEVICE_CUDA, 0}, &f->cfg, &f->tt, 2, 8, 1, ZS_PRECISION_FP32,
                        &m) != ZS_OK)
        return;
    const size_t align = (size_t)2 << 20, bytes = 1000;
    zs_model_dmabuf d;
    zs_err e = zs_model_dmabuf_alloc(m, bytes, &d);
    if (e == ZS_OK) {
        CHECK(d.fd >= 0);
        CHECK(d.offset == 0);
        CHECK((uintptr_t)d.ptr % align == 0);
        CHECK(d.len >= bytes && d.len % align == 0);
        unsigned char back[1000], pattern[1000];
        CHECK_OK(zs_model_download(m, back, d.ptr, bytes));
        size_t nonzero = 0;
        for (size_t i = 0; i < bytes; i++)
            nonzero += back[i] != 0;
        CHECK_EQ_INT(nonzero, 0);
        for (size_t i = 0; i < bytes; i++)
            pattern[i] = (unsigned char)(i * 7 + 1);
        CHECK_OK(zs_model_copy_now(m, d.ptr, pattern, bytes, 1));
        memset(back, 0, sizeof back);
        CHECK_OK(zs_model_copy_now(m, back, d.ptr, bytes, 0));
        CHECK(memcmp(back, pattern, bytes) == 0);
        CHECK_OK(zs_model_nic_wrote(m));
        close(d.fd);
        zs_model_dmabuf_free(m, d.ptr);
    } else {
        printf("test_model: no dma-buf export on cuda:0: %s\n", zs_last_error());
        CHECK_EQ_INT(e, ZS_ERR_UNSUPPORTED);
        CHECK(d.fd < 0 && d.ptr == NULL);
        CHECK_OK(zs_model_nic_wrote(m)); /* nothing exported: nothing to flush */
    }
    /* 1 PiB: refused (out of device memory, or no export at all), and the step still runs. */
    CHECK(zs_model_dmabuf_alloc(m, (size_t)1 << 50, &d) != ZS_OK);
    CHECK(d.fd < 0 && d.ptr == NULL);
    float loss = device_step(f, m);
    CHECK(isfinite(loss));
    zs_model_free(m);
}

int main(void)
{
    test_devices();
    fixture f;
    fixture_init(&f);
    test_cpu(&f);
    test_precision();
    test_layout_without(&f);
    test_cuda(&f, ZS_PRECISION_FP32);
    test_cuda(&f, ZS_PRECISION_BF16);
    test_cuda(&f, ZS_PRECISION_FP16);
    test_cuda_dmabuf(&f);
    fixture_free(&f);
    return zs_test_result("test_model");
}
