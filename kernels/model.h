/*
 * model: the compute seam.  A GPT-2 model on a compute backend -- the CPU, or one CUDA GPU --
 * behind which `zshard train`, the worker and `zshard eval` run forward and backward without
 * knowing where.
 *
 * Invariants:
 *   - The pointers an io hands the model (zs_gpt2_io: a layer's parameters, a layer's
 *     gradient buffer) are in the backend's memory: host memory for "cpu", device memory of
 *     the model's GPU for "cuda:N".  The activations are the model's, in the same memory.
 *     Tokens, targets and the loss are on the host.  The io call order is gpt2.h's.
 *   - "cpu" is kernels/gpt2.c itself: the same bits and the same speed as calling it directly.
 *   - "cuda:N" computes with its own summation orders (kernels/cuda/cuda_kernels.h), in the
 *     precision it was created with (zs_precision): the same bits run to run on one GPU model,
 *     not the CPU's bits.  `zshard train --device cuda` is the reference for jobs whose workers
 *     compute on that GPU model with the same precision.
 *   - The precision changes nothing on "cpu": its kernels compute in fp32 on whatever weights
 *     the io hands it (bf16-rounded ones with bf16.enabled, docs/precision.md).
 *
 * An io gets memory of the backend from the model (zs_model_alloc) and moves bytes in and out
 * of it (zs_model_upload, zs_model_download): ordered with the model's work, and complete when
 * they return.  For "cpu" these are malloc and memcpy.
 */
#ifndef ZS_MODEL_H
#define ZS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "common/tensors.h"
#include "kernels/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ZS_DEVICE_CPU = 0, ZS_DEVICE_CUDA = 1 } zs_device_kind;

/* Where a model computes: the CPU, or CUDA device `index`. */
typedef struct {
    zs_device_kind kind;
    int index;
} zs_device;

/* "cpu", "cuda" (device 0) or "cuda:N"; anything else is an error naming the text. */
zs_err zs_device_parse(const char *text, zs_device *out);
/* "cpu" or "cuda:N" into out (cap >= 16). */
void zs_device_format(zs_device d, char *out, size_t cap);

/*
 * How a GPU model stores what it computes with (docs/precision.md, docs/gpu.md):
 *   ZS_PRECISION_FP32: everything fp32 (the default, and the checking mode: its kernels are
 *     compared with the CPU's element by element);
 *   ZS_PRECISION_BF16: the matrix products' operands (weights and the activations and gradients
 *     that feed them) stored in bf16, accumulated in fp32; everything else fp32.  The job's
 *     bf16.enabled selects it (zs_model_precision);
 *   ZS_PRECISION_FP16: the same in fp16, with the job's loss scale in the backward
 *     (zs_model_loss_scale).  The job's fp16.enabled selects it.
 * "cpu" takes any and computes the same bits with all: its reduced precisions are the host's
 * rounding (docs/precision.md).
 */
typedef enum { ZS_PRECISION_FP32 = 0, ZS_PRECISION_BF16 = 1, ZS_PRECISION_FP16 = 2 } zs_precision;

/* The precision a job's config asks for: ZS_PRECISION_BF16 with bf16.enabled,
 * ZS_PRECISION_FP16 with fp16.enabled, else fp32. */
zs_precision zs_model_precision(const zs_config *cfg);

/* One backend's implementation of the calls below (impl: its model). */
typedef struct {
    const char *name;
    zs_err (*create)(const zs_model_config *cfg, const zs_tensor_table *tt, int max_b, int max_t,
                     int threads, zs_precision precision, int index, void **impl);
    void (*free)(void *impl);
    zs_err (*forward)(void *impl, const zs_gpt2_io *io, const int32_t *inputs,
                      const int32_t *targets, int b, int t, float *loss);
    zs_err (*backward)(void *impl, const zs_gpt2_io *io);
    /* Optional (NULL: the host scales, the model returns scale); see zs_model_loss_scale. */
    float (*loss_scale)(void *impl, float scale);
    void (*finish)(void *impl, const zs_gpt2_io *io);
    zs_err (*alloc)(void *impl, size_t bytes, void **out);
    void (*dealloc)(void *impl, void *p);
    zs_err (*host_alloc)(void *impl, size_t bytes, void **out);
    void (*host_free)(void *impl, void *p);
    zs_err (*upload)(void *impl, void *dst, const void *src, size_t bytes);
    zs_err (*download)(void *impl, void *dst, const void *src, size_t bytes);
    zs_err (*mark)(void *impl, uint64_t *ticket);
    zs_err (*upload_async)(void *impl, void *dst, const void *src, size_t bytes, uint64_t after,
                           uint64_t *done);
    zs_err (*download_async)(void *impl, void *dst, const void *src, size_t bytes, uint64_t after,
                             uint64_t *done);
    zs_err (*after)(void *impl, uint64_t ticket);
    zs_err (*sync)(void *impl, uint64_t ticket);
    /* Optional (NULL: the backend's memory is the host's, nothing to export); see
     * zs_model_dmabuf_alloc and zs_model_copy_now. */
    zs_err (*dmabuf_alloc)(void *impl, size_t bytes, void **out, size_t *len, int *fd,
                           uint64_t *offset);
    void (*dmabuf_free)(void *impl, void *p);
    zs_err (*copy_now)(void *impl, void *dst, const void *src, size_t bytes, int to_model);
    zs_err (*nic_wrote)(void *impl);
} zs_model_ops;

/* The backends: kernels/model_cpu.c; kernels/cuda/model_cuda.c where the CUDA toolkit was
 * found at configure time, else kernels/nocuda/model_cuda.c, whose create says so. */
extern const zs_model_ops zs_model_cpu_ops;
extern const zs_model_ops zs_model_cuda_ops;

typedef struct zs_model zs_model;

/* A model for up to max_b sequences of up to max_t tokens on dev (see zs_gpt2_create for the
 * shapes and threads, which only "cpu" uses), computing in precision on a GPU. */
zs_err zs_model_create(zs_device dev, const zs_model_config *cfg, const zs_tensor_table *tt,
                       int max_b, int max_t, int threads, zs_precision precision, zs_model **out);
void zs_model_free(zs_model *m);
zs_device zs_model_device(const zs_model *m);
/* 1 when the model's memory is this process's host memory ("cpu"). */
int zs_model_on_host(const zs_model *m);

/* Host memory the model takes for its activations: zs_gpt2_activation_bytes on "cpu", 0 on a
 * GPU (whose model checks its device's free memory when it is created). */
size_t zs_model_host_bytes(zs_device dev, const zs_model_config *cfg, int max_b, int max_t);

/* As zs_gpt2_forward, zs_gpt2_backward, zs_gpt2_finish, with io pointers in the model's memory. */
zs_err zs_model_forward(zs_model *m, const zs_gpt2_io *io, const int32_t *inputs,
                        const int32_t *targets, int b, int t, float *loss);
zs_err zs_model_backward(zs_model *m, const zs_gpt2_io *io);

/*
 * fp16 jobs: the loss scale (a power of two) of the backwards from now on.  Returns the factor
 * the caller still multiplies each gradient by before rounding it to fp16
 * (zs_fp16_scale_grads): 1 when the model applies the scale itself, `scale` when it does not.
 * A ZS_PRECISION_FP16 GPU model applies it (dlogits carry it, so its fp16 backward holds the
 * scaled gradients, and overflows, as DeepSpeed's fp16 backward of the scaled loss does, and
 * every gradient it hands over is scaled); the CPU, and GPU models in other precisions, do
 * not (the host scales after the backward: docs/precision.md).
 */
float zs_model_loss_scale(zs_model *m, float scale);
void zs_model_finish(zs_model *m, const zs_gpt2_io *io);

/* bytes of the model's memory (zeroed, 64-byte aligned at least); freed by zs_model_dealloc. */
zs_err zs_model_alloc(zs_model *m, size_t bytes, void **out);
void zs_model_dealloc(zs_model *m, void *p);
/* bytes of host memory (zeroed, 64-byte aligned at least) that copies to and from the model's
 * memory are fastest with: page-locked for a GPU (DMA, no staging copy), plain for the CPU.
 * Freed by zs_model_host_free, before the model. */
zs_err zs_model_host_alloc(zs_model *m, size_t bytes, void **out);
void zs_model_host_free(zs_model *m, void *p);
/* host src -> model memory dst; model memory src -> host dst.  Complete on return. */
zs_err zs_model_upload(zs_model *m, void *dst, const void *src, size_t bytes);
zs_err zs_model_download(zs_model *m, void *dst, const void *src, size_t bytes);

/*
 * Copies that overlap with compute (a GPU's copy engine), for an io that stages a layer ahead.
 * A ticket names a point in the model's work; 0 is a ticket that is always complete.
 *   zs_model_mark: a ticket for the model's work enqueued so far (what release() leaves behind
 *     reading a buffer);
 *   zs_model_upload_async: host src -> model memory dst on the model's copy stream, once the work
 *     of ticket `after` is done; *done is the copy's ticket.  src must stay unchanged, and dst
 *     unread, until the copy's ticket completes;
 *   zs_model_download_async: the same from model memory src to host dst (page-locked memory from
 *     zs_model_host_alloc, for the copy not to wait for the host);
 *   zs_model_after: the model's work enqueued from now on waits for ticket t (the host does not);
 *   zs_model_sync: the host waits for ticket t; any thread may call it.
 * Tickets are good for the model's last 64 copies and marks.  On the CPU a copy is done when the
 * call returns and every ticket is complete.
 */
zs_err zs_model_mark(zs_model *m, uint64_t *ticket);
zs_err zs_model_upload_async(zs_model *m, void *dst, const void *src, size_t bytes, uint64_t after,
                             uint64_t *done);
zs_err zs_model_download_async(zs_model *m, void *dst, const void *src, size_t bytes,
                               uint64_t after, uint64_t *done);
zs_err zs_model_after(zs_model *m, uint64_t ticket);
zs_err zs_model_sync(zs_model *m, uint64_t ticket);

/*
 * Device memory a NIC can read and write (GPUDirect RDMA through dma-buf).
 *   zs_model_dmabuf_alloc: at least `bytes` of the model's memory (zeroed), placed and sized so
 *     that the driver exports it (CUDA: 2 MiB aligned, a whole number of 2 MiB), and exported as
 *     a dma-buf: ptr is used as zs_model_alloc's memory is, len bytes from ptr are exported, fd
 *     is the dma-buf (the caller closes it once it registered it), offset is ptr's in it.
 *     ZS_ERR_UNSUPPORTED, with the reason, where the model is not on a device ("cpu") or the
 *     GPU or its driver cannot export (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0, or the export
 *     failed); then nothing is allocated.  Freed by zs_model_dmabuf_free, before the model.
 *   zs_model_copy_now: bytes from host src to model memory dst (to_model 1) or back (0),
 *     complete on return, ordered with nothing the model enqueued (the caller knows dst is not in
 *     use): for the few bytes a transport places by CPU in device memory.  Any thread may call
 *     it.
 *   zs_model_nic_wrote: what a NIC wrote into the model's memory, and the host saw completed,
 *     becomes visible to the model's work enqueued from now on (CUDA:
 *     cudaDeviceFlushGPUDirectRDMAWrites, not called where the GPU orders such writes itself,
 *     which need not offer it); nothing to do on the CPU.
 */
typedef struct {
    void *ptr;       /* the memory, in the model's address space */
    size_t len;      /* bytes exported: bytes rounded up to the export's granularity */
    int fd;          /* the dma-buf */
    uint64_t offset; /* of ptr in the dma-buf */
} zs_model_dmabuf;

zs_err zs_model_dmabuf_alloc(zs_model *m, size_t bytes, zs_model_dmabuf *out);
void zs_model_dmabuf_free(zs_model *m, void *ptr);
zs_err zs_model_copy_now(zs_model *m, void *dst, const void *src, size_t bytes, int to_model);
zs_err zs_model_nic_wrote(zs_model *m);

#ifdef __cplusplus
}
#endif

#endif
