/*
 * test_model: the compute seam (kernels/model.h).
 *
 *   devices      "cpu", "cuda", "cuda:N" parse; anything else is refused, naming the text;
 *   cpu model    forward and backward through zs_model give bitwise the loss and gradient of
 *                kernels/gpt2.c called directly, twice, and its memory calls move bytes;
 *   cuda model   where a GPU can be used, the same io gives a finite loss close to the CPU's
 *                (tests/gpu/ holds the real comparisons); where none can (these build
 *                machines), creating one fails with a message naming the device, and a binary
 *                built without CUDA says that it was.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/tensors.h"
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

/* Where a GPU can be used, a cuda model runs the same step (through device copies of the
 * parameters); where none can, creating one is refused with the device named. */
static void test_cuda(fixture *f)
{
    zs_model *m = NULL;
    zs_err e = zs_model_create((zs_device){ZS_DEVICE_CUDA, 0}, &f->cfg, &f->tt, 2, 8, 1,
                               ZS_PRECISION_FP32, &m);
    if (e != ZS_OK) {
        const char *why = zs_last_error();
        printf("test_model: no cuda model here: %s\n", why);
        CHECK(strstr(why, "cuda:0") != NULL);
        CHECK(m == NULL);
        return;
    }
    CHECK(!zs_model_on_host(m));
    CHECK_EQ_INT(zs_model_host_bytes(zs_model_device(m), &f->cfg, 2, 8), 0);
    size_t bytes = f->tt.total * sizeof(float);
    float *dp, *dg;
    CHECK_OK(zs_model_alloc(m, bytes, (void **)&dp));
    CHECK_OK(zs_model_alloc(m, bytes, (void **)&dg));
    CHECK_OK(zs_model_upload(m, dp, f->params, bytes));
    zs_gpt2_flat flat = {dp, dg};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    float loss;
    CHECK_OK(zs_model_forward(m, &io, f->in, f->tg, 2, 8, &loss));
    CHECK_OK(zs_model_backward(m, &io));
    CHECK_OK(zs_model_download(m, f->grads, dg, bytes));
    CHECK(isfinite(loss) && fabsf(loss - logf(37.0f)) < 1.0f); /* a fresh model: about ln V */
    zs_model_dealloc(m, dp);
    zs_model_dealloc(m, dg);
    zs_model_free(m);
}

int main(void)
{
    test_devices();
    fixture f;
    fixture_init(&f);
    test_cpu(&f);
    test_cuda(&f);
    fixture_free(&f);
    return zs_test_result("test_model");
}
