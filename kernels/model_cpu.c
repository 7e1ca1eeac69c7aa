/*
 * model_cpu: the compute seam's CPU backend (model.h): kernels/gpt2.c as it is, host memory.
 */
#include "kernels/model.h"

#include <stdlib.h>
#include <string.h>

/* The precision changes nothing here: the CPU kernels compute in fp32 on the weights the io
 * hands them (model.h). */
static zs_err cpu_create(const zs_model_config *cfg, const zs_tensor_table *tt, int max_b,
                         int max_t, int threads, zs_precision precision, int index, void **impl)
{
    (void)index, (void)precision;
    zs_gpt2 *g = NULL;
    ZS_CHECK(zs_gpt2_create(cfg, tt, max_b, max_t, threads, &g));
    *impl = g;
    return ZS_OK;
}

static void cpu_free(void *impl)
{
    zs_gpt2_free(impl);
}

static zs_err cpu_forward(void *impl, const zs_gpt2_io *io, const int32_t *inputs,
                          const int32_t *targets, int b, int t, float *loss)
{
    return zs_gpt2_forward(impl, io, inputs, targets, b, t, loss);
}

static zs_err cpu_backward(void *impl, const zs_gpt2_io *io)
{
    return zs_gpt2_backward(impl, io);
}

static void cpu_finish(void *impl, const zs_gpt2_io *io)
{
    zs_gpt2_finish(impl, io);
}

static zs_err cpu_alloc(void *impl, size_t bytes, void **out)
{
    (void)impl;
    *out = NULL;
    if (posix_memalign(out, 64, bytes ? bytes : 64) != 0) {
        *out = NULL;
        return zs_error(ZS_ERR_NOMEM, "model cpu: out of memory for %zu bytes", bytes);
    }
    memset(*out, 0, bytes);
    return ZS_OK;
}

static void cpu_dealloc(void *impl, void *p)
{
    (void)impl;
    free(p);
}

static zs_err cpu_copy(void *impl, void *dst, const void *src, size_t bytes)
{
    (void)impl;
    if (dst != src)
        memcpy(dst, src, bytes);
    return ZS_OK;
}

/* The CPU's copies are done when they return: every ticket is complete (0). */
static zs_err cpu_mark(void *impl, uint64_t *ticket)
{
    (void)impl;
    *ticket = 0;
    return ZS_OK;
}

static zs_err cpu_copy_async(void *impl, void *dst, const void *src, size_t bytes, uint64_t after,
                             uint64_t *done)
{
    (void)after;
    *done = 0;
    return cpu_copy(impl, dst, src, bytes);
}

static zs_err cpu_ticket(void *impl, uint64_t ticket)
{
    (void)impl;
    (void)ticket;
    return ZS_OK;
}

const zs_model_ops zs_model_cpu_ops = {
    .name = "cpu",
    .create = cpu_create,
    .free = cpu_free,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .finish = cpu_finish,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .host_alloc = cpu_alloc,
    .host_free = cpu_dealloc,
    .upload = cpu_copy,
    .download = cpu_copy,
    .mark = cpu_mark,
    .upload_async = cpu_copy_async,
    .download_async = cpu_copy_async,
    .after = cpu_ticket,
    .sync = cpu_ticket,
};
