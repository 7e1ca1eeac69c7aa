/*
 * model: the compute seam's dispatch (model.h): a model is its backend's table and the
 * backend's own model behind it.
 */
#include "kernels/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zs_model {
    zs_device dev;
    const zs_model_ops *ops;
    void *impl;
};

zs_err zs_device_parse(const char *text, zs_device *out)
{
    if (!text || !strcmp(text, "cpu")) {
        *out = (zs_device){ZS_DEVICE_CPU, 0};
        return ZS_OK;
    }
    if (!strcmp(text, "cuda")) {
        *out = (zs_device){ZS_DEVICE_CUDA, 0};
        return ZS_OK;
    }
    if (!strncmp(text, "cuda:", 5) && text[5] >= '0' && text[5] <= '9') {
        char *end;
        errno = 0;
        long n = strtol(text + 5, &end, 10);
        if (*end == '\0' && errno == 0 && n >= 0 && n < 1024) {
            *out = (zs_device){ZS_DEVICE_CUDA, (int)n};
            return ZS_OK;
        }
    }
    return zs_error(ZS_ERR_INVALID, "device \"%s\": expected cpu, cuda or cuda:N", text);
}

void zs_device_format(zs_device d, char *out, size_t cap)
{
    if (d.kind == ZS_DEVICE_CUDA)
        snprintf(out, cap, "cuda:%d", d.index);
    else
        snprintf(out, cap, "cpu");
}

zs_precision zs_model_precision(const zs_config *cfg)
{
    if (cfg->bf16)
        return ZS_PRECISION_BF16;
    return cfg->fp16.enabled ? ZS_PRECISION_FP16 : ZS_PRECISION_FP32;
}

zs_err zs_model_create(zs_device dev, const zs_model_config *cfg, const zs_tensor_table *tt,
                       int max_b, int max_t, int threads, zs_precision precision, zs_model **out)
{
    *out = NULL;
    zs_model *m = calloc(1, sizeof *m);
    if (!m)
        return zs_error(ZS_ERR_NOMEM, "model: out of memory");
    m->dev = dev;
    m->ops = dev.kind == ZS_DEVICE_CUDA ? &zs_model_cuda_ops : &zs_model_cpu_ops;
    zs_err e = m->ops->create(cfg, tt, max_b, max_t, threads, precision, dev.index, &m->impl);
    if (e != ZS_OK) {
        free(m);
        return e;
    }
    *out = m;
    return ZS_OK;
}

void zs_model_free(zs_model *m)
{
    if (!m)
        return;
    m->ops->free(m->impl);
    free(m);
}

zs_device zs_model_device(const zs_model *m)
{
    return m->dev;
}

int zs_model_on_host(const zs_model *m)
{
    return m->dev.kind == ZS_DEVICE_CPU;
}

size_t zs_model_host_bytes(zs_device dev, const zs_model_config *cfg, int max_b, int max_t)
{
    return dev.kind == ZS_DEVICE_CPU ? zs_gpt2_activation_bytes(cfg, max_b, max_t) : 0;
}

zs_err zs_model_forward(zs_model *m, const zs_gpt2_io *io, const int32_t *inputs,
                        const int32_t *targets, int b, int t, float *loss)
{
    return m->ops->forward(m->impl, io, inputs, targets, b, t, loss);
}

zs_err zs_model_backward(zs_model *m, const zs_gpt2_io *io)
{
    return m->ops->backward(m->impl, io);
}

float zs_model_loss_scale(zs_model *m, float scale)
{
    return m->ops->loss_scale ? m->ops->loss_scale(m->impl, scale) : scale;
}

void zs_model_finish(zs_model *m, const zs_gpt2_io *io)
{
    m->ops->finish(m->impl, io);
}

zs_err zs_model_alloc(zs_model *m, size_t bytes, void **out)
{
    return m->ops->alloc(m->impl, bytes, out);
}

void zs_model_dealloc(zs_model *m, void *p)
{
    if (p)
        m->ops->dealloc(m->impl, p);
}

zs_err zs_model_host_alloc(zs_model *m, size_t bytes, void **out)
{
    return m->ops->host_alloc(m->impl, bytes, out);
}

void zs_model_host_free(zs_model *m, void *p)
{
    if (p)
        m->ops->host_free(m->impl, p);
}

zs_err zs_model_upload(zs_model *m, void *dst, const void *src, size_t bytes)
{
    return m->ops->upload(m->impl, dst, src, bytes);
}

zs_err zs_model_download(zs_model *m, void *dst, const void *src, size_t bytes)
{
    return m->ops->download(m->impl, dst, src, bytes);
}

zs_err zs_model_mark(zs_model *m, uint64_t *ticket)
{
    return m->ops->mark(m->impl, ticket);
}

zs_err zs_model_upload_async(zs_model *m, void *dst, const void *src, size_t bytes, uint64_t after,
                             uint64_t *done)
{
    return m->ops->upload_async(m->impl, dst, src, bytes, after, done);
}

zs_err zs_model_download_async(zs_model *m, void *dst, const void *src, size_t bytes,
                               uint64_t after, uint64_t *done)
{
    return m->ops->download_async(m->impl, dst, src, bytes, after, done);
}

zs_err zs_model_after(zs_model *m, uint64_t ticket)
{
    return m->ops->after(m->impl, ticket);
}

zs_err zs_model_sync(zs_model *m, uint64_t ticket)
{
    return m->ops->sync(m->impl, ticket);
}

zs_err zs_model_dmabuf_alloc(zs_model *m, size_t bytes, zs_model_dmabuf *out)
{
    *out = (zs_model_dmabuf){.fd = -1};
    if (!m->ops->dmabuf_alloc) {
        char name[16];
        zs_device_format(m->dev, name, sizeof name);
        return zs_error(ZS_ERR_UNSUPPORTED,
                        "model %s: not a device: its memory is this process's host memory, "
                        "there is no device memory to export as a dma-buf",
                        name);
    }
    return m->ops->dmabuf_alloc(m->impl, bytes, &out->ptr, &out->len, &out->fd, &out->offset);
}

void zs_model_dmabuf_free(zs_model *m, void *ptr)
{
    if (ptr && m->ops->dmabuf_free)
        m->ops->dmabuf_free(m->impl, ptr);
}

zs_err zs_model_copy_now(zs_model *m, void *dst, const void *src, size_t bytes, int to_model)
{
    if (m->ops->copy_now)
        return m->ops->copy_now(m->impl, dst, src, bytes, to_model);
    memcpy(dst, src, bytes); /* the host's memory */
    return ZS_OK;
}

zs_err zs_model_nic_wrote(zs_model *m)
{
    return m->ops->nic_wrote ? m->ops->nic_wrote(m->impl) : ZS_OK;
}
