/*
 * worker: see worker.h.  Two threads share a small table of transfers under one mutex:
 *
 *   compute thread (the caller)          communication thread
 *   ---------------------------          ---------------------
 *   submit(x): state QUEUED  ------->    starts it on the client: RUNNING
 *   await(x): sleeps until DONE  <----   drives the client; when the op finishes (and a bf16
 *                                        fetch is widened in place) sets DONE, with the error
 *
 * Only the communication thread touches the client once it runs; only the compute thread
 * touches the session (heartbeats included) and the model.  Every transfer belongs to a slot
 * (a parameter or a gradient buffer) and a slot has at most one transfer at a time, so a
 * buffer is never read by one side while the other writes it.
 */
#include "worker/worker.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fp16.h"
#include "common/log.h"
#include "common/memlimit.h"
#include "kernels/adamw.h"
#include "kernels/model.h"
#include "transport/client.h"
#include "worker/session.h"

#define SLOTS 4 /* embeddings, final norm, two blocks */
#define SLOT_EMBED 0
#define SLOT_FINAL 1
#define SLOT_BLOCK 2      /* block l (layer l, 1..L) uses SLOT_BLOCK + l % 2 */
#define COMM_WAIT_MS 100  /* the longest the communication thread sleeps between turns */
#define AWAIT_TICK_MS 100 /* the compute thread wakes this often while waiting, to heartbeat */

typedef enum { XF_IDLE = 0, XF_QUEUED, XF_RUNNING, XF_DONE } xfer_state;

/* One fetch or push of a layer's range. */
typedef struct {
    xfer_state state;
    int is_push;
    uint64_t seq; /* submission order: the communication thread drives the oldest */
    int layer;
    size_t begin, end; /* the layer's range of the flat vector */
    long version;      /* fetch: the version; push: the step */
    int chunk;         /* push */
    zs_frame_dtype dtype;
    void *buf;
    uint64_t gpu_ready; /* the model's work (0: none) that the communication thread waits for
                           before it starts x: a push's copy of the gradient into buf, or with
                           GPUDirect the layer's backward that wrote it (a push) or the last work
                           that read the slot (a fetch) */
    zs_client_op *op;   /* communication thread only */
    zs_err err;
    char msg[512]; /* err's message (messages are per thread) */
} xfer;

typedef struct {
    float *buf; /* the largest layer of its kind, 64-byte aligned */
    int layer;  /* the layer it holds, -1: none */
    long version;
    int refs; /* acquired and not yet released */
    xfer x;   /* a parameter slot's fetch, or a gradient slot's push */
    /* A model off the host (a GPU): the slot's twin in the model's memory, which the model
     * reads (parameters: uploaded from buf when the layer is acquired) or writes (gradients:
     * downloaded into buf before the push), and for a parameter slot what it holds. */
    float *dev;
    int dev_layer;
    long dev_version;
    uint64_t dev_ready; /* the upload that fills dev (model.h's tickets; 0: none) */
    uint64_t dev_free;  /* the model's work that last read dev, marked when it was released */
    int dmabuf;         /* dev came from zs_model_dmabuf_alloc (GPUDirect, or its attempt) */
} slot;

/* The worker's Prometheus series (docs/observability.md); every one NULL without a registry
 * (updates of NULL do nothing).  Byte counters are updated by the compute thread as it hands a
 * transfer over, the rest once a chunk is done or an assignment comes; each is an atomic, read
 * by the endpoint's thread. */
typedef struct {
    zs_prom_series *chunks, *fetched, *pushed, *member, *step, *buffer_bytes;
    zs_prom_series *compute, *fetch_wait, *push_wait, *step_wait; /* histograms, seconds */
} worker_prom;

typedef struct {
    zs_session *s;
    const zs_config *cfg;
    const zs_tensor_table *tt;
    zs_client *cl;
    zs_model *model;
    int on_host;   /* the model computes in host memory: it reads and writes the slots' bufs */
    int gpudirect; /* GPUDirect RDMA: each slot's buf is its dev, device memory registered with the
                      NIC as a dma-buf; fetches land in it and pushes leave from it, with no copy */
    int L;
    zs_frame_dtype dtype;
    slot param[SLOTS], grad[SLOTS];

    /* The chunk being computed. */
    long step;
    int chunk;
    int backward; /* in the backward pass: prefetch downwards */

    pthread_t comm;
    int comm_started;
    pthread_mutex_t mu;
    pthread_cond_t wake_comm, wake_compute;
    int wake_fd; /* an eventfd: the compute thread wakes the communication thread, which sleeps
                    on it and the net while transfers run (wake_comm when none do) */
    int quit;
    uint64_t seq;

    zs_worker_stats st;
    const worker_prom *prom; /* the series the figures in st also go to */
    /* fp16.enabled (docs/precision.md): the weights are fetched as the servers' fp16 copy and
     * widened on arrival, and each layer's gradient is multiplied by the step's loss scale,
     * rounded to fp16 and pushed as F16 (inf on an overflow), from the front half of its
     * buffer.  loss_scale is the factor the host applies: the step's scale, or 1 where the
     * model's fp16 backward carried it already (a GPU model, zs_model_loss_scale). */
    int fp16;
    float loss_scale;
    /* A release whose mark failed: its twin's next upload could not be ordered after the
     * kernels that read it, so every later acquire fails with this (the chunk fails). */
    char release_failed[256];
} wk;

/* ---- the communication thread ----------------------------------------------------------- */

/* Widens n bf16 or fp16 (dtype) values at the front of buf to fp32 in place, from the back, so
 * that no value is overwritten before it is read (element i's float covers 16-bit elements 2i
 * and 2i+1).  Both widenings are exact. */
static void widen_half(void *buf, size_t n, zs_frame_dtype dtype)
{
    unsigned char *b = buf;
    int f16 = dtype == ZS_DTYPE_F16;
    for (size_t i = n; i-- > 0;) {
        uint16_t h;
        memcpy(&h, b + 2 * i, sizeof h);
        float f = f16 ? zs_f16_to_f32(h) : zs_bf16_to_f32(h);
        memcpy(b + 4 * i, &f, sizeof f);
    }
}

static void xfer_fail(xfer *x, zs_err e)
{
    x->err = e;
    snprintf(x->msg, sizeof x->msg, "%s", zs_last_error());
    x->state = XF_DONE;
}

/* Starts x on the client (mutex held). */
static void xfer_start(wk *w, xfer *x)
{
    zs_err e;
    if (x->is_push && x->dtype == ZS_DTYPE_F16)
        e = zs_client_push_f16(w->cl, x->begin, x->end, x->version, x->chunk,
                               (const uint16_t *)(const void *)x->buf, &x->op);
    else if (x->is_push)
        e = zs_client_push(w->cl, x->begin, x->end, x->version, x->chunk, x->buf, &x->op);
    else
        e = zs_client_fetch(w->cl, x->begin, x->end, x->version, x->dtype, x->buf, &x->op);
    if (e != ZS_OK) {
        xfer_fail(x, e);
        pthread_cond_broadcast(&w->wake_compute);
        return;
    }
    x->state = XF_RUNNING;
}

static xfer *all_xfers(wk *w, int i)
{
    return i < SLOTS ? &w->param[i].x : &w->grad[i - SLOTS].x;
}

/* Tells the communication thread there is something new (a transfer queued, quit), whether
 * it sleeps on wake_comm or on the net; called with w->mu held. */
static void wake_comm(wk *w)
{
    pthread_cond_signal(&w->wake_comm);
    uint64_t one = 1;
    if (write(w->wake_fd, &one, sizeof one) < 0)
        ZS_DEBUG("worker: waking the communication thread: %s", strerror(errno));
}

/* The communication thread, transfers running: sleeps until the net has I/O or a timer due,
 * or the compute thread wakes it, at most COMM_WAIT_MS. */
static void comm_sleep(wk *w)
{
    int t;
    struct pollfd p[2] = {{.fd = zs_client_wait_fd(w->cl, &t), .events = POLLIN},
                          {.fd = w->wake_fd, .events = POLLIN}};
    if (t < 0 || t > COMM_WAIT_MS)
        t = COMM_WAIT_MS;
    uint64_t count;
    if (t > 0 && poll(p, 2, t) > 0 && (p[1].revents & POLLIN) &&
        read(w->wake_fd, &count, sizeof count) < 0)
        ZS_DEBUG("worker: reading a wake-up: %s", strerror(errno));
}

static void *comm_main(void *arg)
{
    wk *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->quit) {
        xfer *oldest = NULL;
        for (int i = 0; i < 2 * SLOTS; i++) {
            xfer *x = all_xfers(w, i);
            if (x->state == XF_QUEUED && x->gpu_ready) {
                /* The gradient is still on its way from the GPU: the compute thread went on to
                 * the next layer meanwhile. */
                uint64_t t = x->gpu_ready;
                pthread_mutex_unlock(&w->mu);
                zs_err e = zs_model_sync(w->model, t);
                if (e == ZS_OK && w->fp16 && x->is_push) /* fp16: io_grads_done left it to us */
                    zs_fp16_scale_narrow(x->buf, x->end - x->begin, w->loss_scale);
                pthread_mutex_lock(&w->mu);
                x->gpu_ready = 0;
                if (e != ZS_OK) {
                    xfer_fail(x, e);
                    pthread_cond_broadcast(&w->wake_compute);
                    continue;
                }
            }
            if (x->state == XF_QUEUED)
                xfer_start(w, x);
            if (x->state == XF_RUNNING && (!oldest || x->seq < oldest->seq))
                oldest = x;
        }
        if (!oldest) {
            pthread_cond_wait(&w->wake_comm, &w->mu);
            continue;
        }
        /* Waiting on the oldest transfer drives the traffic of all of them; the others
         * complete in order behind it (the servers answer a connection's frames in order). */
        pthread_mutex_unlock(&w->mu);
        int done = 0;
        zs_err e = zs_client_wait(w->cl, oldest->op, 0, &done);
        if (!done && e == ZS_OK)
            comm_sleep(w);
        if (done && e == ZS_OK && !oldest->is_push && oldest->dtype != ZS_DTYPE_F32)
            widen_half(oldest->buf, oldest->end - oldest->begin, oldest->dtype);
        pthread_mutex_lock(&w->mu);
        if (done) {
            oldest->op = NULL;
            if (e != ZS_OK) {
                xfer_fail(oldest, e);
            } else {
                oldest->err = ZS_OK;
                oldest->state = XF_DONE;
            }
            pthread_cond_broadcast(&w->wake_compute);
        }
    }
    /* Leaving: give up what still runs, so that no buffer is touched after we return. */
    for (int i = 0; i < 2 * SLOTS; i++) {
        xfer *x = all_xfers(w, i);
        if (x->state == XF_RUNNING) {
            zs_client_cancel(w->cl, x->op, 1000);
            x->op = NULL;
            x->err = zs_error(ZS_ERR_IO, "worker: transfer abandoned at shutdown");
            x->state = XF_DONE;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- the compute thread's side ---------------------------------------------------------- */

static void submit(wk *w, xfer *x)
{
    pthread_mutex_lock(&w->mu);
    x->state = XF_QUEUED;
    x->seq = ++w->seq;
    x->err = ZS_OK;
    wake_comm(w);
    pthread_mutex_unlock(&w->mu);
    size_t n = x->end - x->begin, bytes = n * zs_frame_dtype_size(x->dtype);
    if (x->is_push) {
        w->st.pushed_bytes += bytes;
        zs_prom_add(w->prom->pushed, bytes);
    } else {
        w->st.fetched_bytes += bytes;
        zs_prom_add(w->prom->fetched, bytes);
    }
}

/* Waits for x to finish (heartbeating meanwhile), adds the time blocked to *waited, and
 * returns its outcome; x is idle afterwards.  An idle x returns ZS_OK at once. */
static zs_err await(wk *w, xfer *x, double *waited)
{
    double t0 = zs_now_s();
    pthread_mutex_lock(&w->mu);
    while (x->state == XF_QUEUED || x->state == XF_RUNNING) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += AWAIT_TICK_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        int rc = pthread_cond_timedwait(&w->wake_compute, &w->mu, &ts);
        if (rc == ETIMEDOUT) {
            pthread_mutex_unlock(&w->mu);
            zs_session_heartbeat(w->s);
            pthread_mutex_lock(&w->mu);
        }
    }
    zs_err e = x->state == XF_DONE ? x->err : ZS_OK;
    char msg[sizeof x->msg];
    if (e != ZS_OK)
        memcpy(msg, x->msg, sizeof msg);
    x->state = XF_IDLE;
    pthread_mutex_unlock(&w->mu);
    if (waited)
        *waited += zs_now_s() - t0;
    return e == ZS_OK ? ZS_OK : zs_error(e, "%s", msg);
}

static int slot_of(const wk *w, int layer)
{
    if (layer == 0)
        return SLOT_EMBED;
    if (layer == w->L + 1)
        return SLOT_FINAL;
    return SLOT_BLOCK + layer % 2;
}

/* Starts fetching layer at the chunk's version into its slot, unless the slot holds it or
 * is busy (in use, or fetching something else: then acquire() sorts it out). */
static void prefetch(wk *w, int layer)
{
    if (layer < 0 || layer > w->L + 1)
        return;
    slot *p = &w->param[slot_of(w, layer)];
    if (p->refs > 0 || p->x.state != XF_IDLE || (p->layer == layer && p->version == w->step))
        return;
    /* The host buffer's last upload to the model must be done before the fetch rewrites it. */
    if (!w->on_host && zs_model_sync(w->model, p->dev_ready) != ZS_OK)
        return;    /* the model failed: acquire() reports it */
    p->layer = -1; /* its contents are being replaced */
    p->x.is_push = 0;
    p->x.layer = layer;
    p->x.begin = w->tt->layer_begin[layer];
    p->x.end = w->tt->layer_begin[layer + 1];
    p->x.version = w->step;
    p->x.dtype = w->dtype;
    p->x.buf = p->buf;
    /* GPUDirect: the NIC writes the device slot itself, once the model's work that read it
     * last is done (the communication thread waits for that, the compute thread goes on). */
    p->x.gpu_ready = w->gpudirect ? p->dev_free : 0;
    submit(w, &p->x);
}

/* Makes layer's parameters present in its slot at the chunk's version. */
static zs_err ensure(wk *w, int layer)
{
    slot *p = &w->param[slot_of(w, layer)];
    for (;;) {
        if (p->x.state != XF_IDLE) {
            xfer *x = &p->x;
            zs_err e = await(w, x, &w->st.fetch_wait_s);
            if (e != ZS_OK)
                return zs_error_context(e, "worker: fetch of layer %d (version %ld)", x->layer,
                                        x->version);
            p->layer = x->layer;
            p->version = x->version;
        }
        if (p->layer == layer && p->version == w->step)
            return ZS_OK;
        prefetch(w, layer);
        if (p->x.state == XF_IDLE)
            return zs_error(ZS_ERR_INTERNAL,
                            "worker: layer %d's slot is still in use by "
                            "layer %d",
                            layer, p->layer);
    }
}

static zs_err io_acquire(void *ctx, int layer, const float **base)
{
    wk *w = ctx;
    zs_session_heartbeat(w->s);
    if (w->release_failed[0])
        return zs_error(ZS_ERR_IO, "worker: %s", w->release_failed);
    if (layer == 0)
        w->backward = 0;
    ZS_CHECK(ensure(w, layer));
    slot *p = &w->param[slot_of(w, layer)];
    const size_t *lb = w->tt->layer_begin;
    if (w->gpudirect) {
        /* The fetch landed in the model's memory: nothing to copy, but the NIC's writes must
         * be visible to the kernels about to read them. */
        ZS_CHECK(zs_model_nic_wrote(w->model));
    } else if (!w->on_host) {
        /* To the model on its copy stream, once the work that read the twin last is done;
         * the model's next work waits for the copy, the host does not. */
        if (p->dev_layer != layer || p->dev_version != w->step) {
            p->dev_layer = -1;
            ZS_CHECK(zs_model_upload_async(w->model, p->dev, p->buf,
                                           (lb[layer + 1] - lb[layer]) * 4, p->dev_free,
                                           &p->dev_ready));
            p->dev_layer = layer;
            p->dev_version = w->step;
        }
        ZS_CHECK(zs_model_after(w->model, p->dev_ready));
    }
    p->refs++;
    *base = (w->on_host ? p->buf : p->dev) - lb[layer];
    /* The next layer this pass will ask for. */
    if (!w->backward)
        prefetch(w, layer + 1);
    else if (layer > 1 && layer <= w->L)
        prefetch(w, layer - 1);
    if (layer == w->L + 1)
        w->backward = 1; /* the forward's last acquire; backward walks down from block L */
    return ZS_OK;
}

static void io_release(void *ctx, int layer)
{
    wk *w = ctx;
    slot *p = &w->param[slot_of(w, layer)];
    if (p->refs > 0)
        p->refs--;
    /* What the model enqueued so far is the last that reads the twin: its next upload waits.
     * Without that mark nothing could order an upload after those kernels, so the next acquire
     * fails instead of overwriting a buffer they may still read. */
    if (p->refs == 0 && !w->on_host && zs_model_mark(w->model, &p->dev_free) != ZS_OK &&
        !w->release_failed[0]) {
        snprintf(w->release_failed, sizeof w->release_failed, "releasing layer %d: %s", layer,
                 zs_last_error());
        p->dev_layer = -1;
    }
}

static zs_err io_grads(void *ctx, int layer, float **base)
{
    wk *w = ctx;
    zs_session_heartbeat(w->s);
    slot *g = &w->grad[slot_of(w, layer)];
    if (w->gpudirect) { /* the model writes the buffer the NIC sends from: its last push first */
        ZS_CHECK(await(w, &g->x, &w->st.push_wait_s));
        *base = g->dev - w->tt->layer_begin[layer];
        return ZS_OK;
    }
    if (!w->on_host) { /* the model writes the twin once its last copy out is done; the push
                          buffer is awaited when it is filled */
        ZS_CHECK(zs_model_after(w->model, g->dev_ready));
        *base = g->dev - w->tt->layer_begin[layer];
        return ZS_OK;
    }
    ZS_CHECK(await(w, &g->x, &w->st.push_wait_s)); /* its last push read the buffer */
    *base = g->buf - w->tt->layer_begin[layer];
    return ZS_OK;
}

static zs_err io_grads_done(void *ctx, int layer)
{
    wk *w = ctx;
    slot *g = &w->grad[slot_of(w, layer)];
    /* (On the host, and with GPUDirect, io_grads waited for the buffer's last push: the
     * transfer is idle.) */
    if (w->gpudirect) {
        /* Pushed from the device buffer once the layer's backward is done: the communication
         * thread waits for that point of the compute stream, the compute thread goes on. */
        ZS_CHECK(zs_model_mark(w->model, &g->x.gpu_ready));
    } else if (!w->on_host) {
        /* Copied out on the copy stream once the layer's backward is done; the communication
         * thread waits for the copy before the push, and the compute thread goes on. */
        const size_t *lb = w->tt->layer_begin;
        uint64_t computed;
        ZS_CHECK(await(w, &g->x, &w->st.push_wait_s)); /* its last push read the buffer */
        ZS_CHECK(zs_model_mark(w->model, &computed));
        ZS_CHECK(zs_model_download_async(w->model, g->buf, g->dev, (lb[layer + 1] - lb[layer]) * 4,
                                         computed, &g->dev_ready));
        g->x.gpu_ready = g->dev_ready;
    } else {
        g->x.gpu_ready = 0;
    }
    /* fp16: scaled and rounded as zshard train does (trainer.c), here when the gradient is in
     * the host slot already, else by the communication thread once its copy is done.  Every
     * push is done before the next assignment changes loss_scale (run_chunk drains). */
    if (w->fp16 && w->on_host)
        zs_fp16_scale_narrow(g->buf, w->tt->layer_begin[layer + 1] - w->tt->layer_begin[layer],
                             w->loss_scale);
    g->x.is_push = 1;
    g->x.layer = layer;
    g->x.begin = w->tt->layer_begin[layer];
    g->x.end = w->tt->layer_begin[layer + 1];
    g->x.version = w->step;
    g->x.chunk = w->chunk;
    g->x.dtype = w->fp16 ? ZS_DTYPE_F16 : ZS_DTYPE_F32;
    g->x.buf = g->buf;
    submit(w, &g->x);
    return ZS_OK;
}

/* Waits for every transfer still running; returns the first failure. */
static zs_err drain(wk *w)
{
    zs_err res = ZS_OK;
    for (int i = 0; i < SLOTS; i++) {
        zs_err e = await(w, &w->grad[i].x, &w->st.push_wait_s);
        if (e != ZS_OK && res == ZS_OK)
            res = zs_error_context(e, "worker: push of layer %d", w->grad[i].x.layer);
    }
    for (int i = 0; i < SLOTS; i++) {
        slot *p = &w->param[i];
        if (p->x.state == XF_IDLE)
            continue;
        zs_err e = await(w, &p->x, &w->st.fetch_wait_s);
        if (e == ZS_OK) {
            p->layer = p->x.layer;
            p->version = p->x.version;
        } else {
            p->layer = -1;
        }
        /* A failed prefetch nobody asked for is not this chunk's failure. */
    }
    return res;
}

/* Computes one chunk: forward, backward with its pushes, then reports it done. */
static zs_err run_chunk(wk *w, int32_t *in, int32_t *tg, long step, int chunk)
{
    const zs_config *cfg = w->cfg;
    int b = cfg->micro_batch, T = cfg->model.block_size;
    double t0 = zs_now_s(), fetch0 = w->st.fetch_wait_s, push0 = w->st.push_wait_s;
    w->step = step;
    w->chunk = chunk;
    zs_data_chunk(zs_session_data(w->s), cfg->seed, step, chunk, b, T, in, tg);
    zs_gpt2_io io = {.ctx = w,
                     .acquire = io_acquire,
                     .release = io_release,
                     .grads = io_grads,
                     .grads_done = io_grads_done};
    float loss;
    zs_err res = zs_model_forward(w->model, &io, in, tg, b, T, &loss);
    if (res == ZS_OK)
        res = zs_model_backward(w->model, &io);
    zs_err d = drain(w);
    if (res == ZS_OK)
        res = d;
    zs_msg_chunk_times times = {.fetch_wait_ms = (w->st.fetch_wait_s - fetch0) * 1e3,
                                .push_wait_ms = (w->st.push_wait_s - push0) * 1e3};
    times.compute_ms = (zs_now_s() - t0) * 1e3 - times.fetch_wait_ms - times.push_wait_ms;
    if (times.compute_ms < 0)
        times.compute_ms = 0;
    w->st.compute_s += times.compute_ms / 1e3;
    ZS_CHECK(res);
    ZS_CHECK(zs_session_chunk_done(w->s, step, chunk, loss, &times));
    w->st.chunks++;
    zs_prom_add(w->prom->chunks, 1);
    zs_prom_observe(w->prom->compute, times.compute_ms / 1e3);
    zs_prom_observe(w->prom->fetch_wait, times.fetch_wait_ms / 1e3);
    zs_prom_observe(w->prom->push_wait, times.push_wait_ms / 1e3);
    ZS_DEBUG("worker %u: step %ld chunk %d loss %.6f", zs_session_id(w->s), step + 1, chunk, loss);
    return ZS_OK;
}

/* The transport's hook for the few bytes it places by CPU in a dma-buf slot (transport.h,
 * zs_dmabuf: a short fetched piece, an error's text): the model copies them. */
static int copy_to_slot(void *ctx, void *dst, const void *src, size_t n, int to_region)
{
    return zs_model_copy_now(ctx, dst, src, n, to_region) == ZS_OK ? 0 : -EIO;
}

/* GPUDirect's slots: each slot's device memory exported as a dma-buf and registered with the
 * client.  On a failure, *why says it; the slots that got device memory keep it as their twin
 * (a region registered already stays registered, unused). */
static void gpudirect_slots(wk *w, const size_t *floats, char *why, size_t cap)
{
    for (int k = 0; k < 2; k++) {
        slot *set = k ? w->grad : w->param;
        for (int i = 0; i < SLOTS; i++) {
            slot *s = &set[i];
            if (floats[i] == 0)
                continue;
            zs_model_dmabuf d;
            zs_err e = zs_model_dmabuf_alloc(w->model, floats[i] * sizeof(float), &d);
            if (e != ZS_OK) {
                snprintf(why, cap, "%s", zs_last_error());
                return;
            }
            s->dev = d.ptr;
            s->dmabuf = 1;
            zs_dmabuf b = {.fd = d.fd,
                           .offset = d.offset,
                           .len = d.len,
                           .addr = d.ptr,
                           .copy = copy_to_slot,
                           .ctx = w->model};
            e = zs_client_register_dmabuf(w->cl, &b);
            close(d.fd); /* the registration holds the dma-buf */
            if (e != ZS_OK) {
                snprintf(why, cap, "the registration failed: %s", zs_last_error());
                return;
            }
        }
    }
}

/* Whether GPUDirect can serve this worker: "" in why when it may be tried, else the reason. */
static void gpudirect_reason(const wk *w, char *why, size_t cap)
{
    const char *transport = zs_client_transport(w->cl);
    if (strcmp(transport, "rdma") != 0)
        snprintf(why, cap, "the transport is %s, not rdma", transport);
    else if (w->dtype == ZS_DTYPE_BF16)
        snprintf(why, cap, "bf16 weights are widened to fp32 on the host as they arrive");
    else if (w->fp16)
        snprintf(why, cap,
                 "fp16.enabled widens fetched weights and rounds gradients to fp16 on the host");
    else
        why[0] = '\0';
}

/* Allocates and registers the slots: layer 0, layer L+1 and the largest block (the model must
 * exist: it provides the memory).  With a GPU model, GPUDirect as `mode` says. */
static zs_err setup_slots(wk *w, zs_gpudirect mode)
{
    const size_t *lb = w->tt->layer_begin;
    size_t block = 0;
    for (int l = 1; l <= w->L; l++)
        block = lb[l + 1] - lb[l] > block ? lb[l + 1] - lb[l] : block;
    size_t floats[SLOTS] = {lb[1] - lb[0], lb[w->L + 2] - lb[w->L + 1], block, block};
    if (w->on_host && mode == ZS_GPUDIRECT_ON)
        return zs_error(ZS_ERR_UNSUPPORTED,
                        "worker %u: --gpudirect on: the model computes on the host (cpu), not "
                        "on a device; GPUDirect needs --device cuda:N",
                        zs_session_id(w->s));
    if (!w->on_host && mode != ZS_GPUDIRECT_OFF) {
        char why[768];
        gpudirect_reason(w, why, sizeof why);
        if (!why[0])
            gpudirect_slots(w, floats, why, sizeof why);
        if (why[0] && mode == ZS_GPUDIRECT_ON)
            return zs_error(ZS_ERR_UNSUPPORTED, "worker %u: --gpudirect on: %s",
                            zs_session_id(w->s), why);
        if (why[0])
            ZS_INFO("worker %u: GPUDirect off (%s); layers go through page-locked host memory",
                    zs_session_id(w->s), why);
        w->gpudirect = !why[0];
    }
    for (int k = 0; k < 2; k++) {
        slot *set = k ? w->grad : w->param;
        for (int i = 0; i < SLOTS; i++) {
            slot *s = &set[i];
            s->layer = -1;
            s->version = -1;
            s->dev_layer = -1;
            s->dev_version = -1;
            if (floats[i] == 0)
                continue;
            size_t bytes = floats[i] * sizeof(float);
            w->st.buffer_bytes += bytes;
            if (w->gpudirect) {
                s->buf = s->dev; /* fetched into and pushed from by the NIC */
                continue;
            }
            void *p = NULL;
            /* Zeroed: a gradient buffer's padding is pushed too and must be 0 (the model
             * writes it as 0 as well).  Host memory the model copies from and to fastest
             * (page-locked for a GPU). */
            ZS_CHECK(zs_model_host_alloc(w->model, bytes, &p));
            s->buf = p;
            /* A GPU's page-locked buffer stays where the driver pinned it (shm would move the
             * pages of a large send buffer into shared memory otherwise). */
            ZS_CHECK(w->on_host ? zs_client_register(w->cl, p, bytes)
                                : zs_client_register_pinned(w->cl, p, bytes));
            /* A model off the host gets a twin of the slot in its own memory (GPUDirect's
             * attempt may have left it one). */
            if (!w->on_host && !s->dev)
                ZS_CHECK(zs_model_alloc(w->model, bytes, (void **)&s->dev));
        }
    }
    return ZS_OK;
}

/*
 * A transfer failed with res.  If this worker hung long enough to be declared dead, the
 * servers refuse its pushes (the step moved on, or its chunks have other owners) and the
 * coordinator answers its next heartbeat with the reason it was dropped: that is the message
 * worth reporting.  Listens up to two heartbeat timeouts for it; otherwise returns res.
 */
static zs_err why_refused(wk *w, zs_err res)
{
    char first[1024];
    snprintf(first, sizeof first, "%s", zs_last_error());
    uint64_t until = zs_now_ms() + 2 * (uint64_t)w->cfg->cluster.heartbeat_timeout_ms;
    while (zs_now_ms() < until) {
        zs_assignment a;
        int got = 0, ended = 0;
        zs_err e = zs_session_next(w->s, 100, &a, &got, &ended);
        if (ended)
            return e != ZS_OK ? e : zs_error(res, "%s", first);
        if (e != ZS_OK || got)
            break; /* still a member: the failure is the transfer's own */
    }
    return zs_error(res, "%s", first);
}

static void log_stats(const wk *w)
{
    const zs_worker_stats *s = &w->st;
    ZS_INFO("worker %u: %ld chunks over %ld steps; compute %.2f s, waiting on fetches %.2f s, "
            "on pushes %.2f s, on the step %.2f s; fetched %.1f MB, pushed %.1f MB; buffers "
            "%.1f MB",
            w->s ? zs_session_id(w->s) : 0, s->chunks, s->steps, s->compute_s, s->fetch_wait_s,
            s->push_wait_s, s->step_wait_s, s->fetched_bytes / 1e6, s->pushed_bytes / 1e6,
            s->buffer_bytes / 1e6);
}

/*
 * One membership of the job: registers, computes the chunks it is given until the job ends,
 * and frees everything.  *rejoin is set when the coordinator ended the membership because the
 * servers changed (a server was lost): the caller joins again, with the new shard map.
 */
static zs_err run_session(const zs_worker_opts *opts, const worker_prom *prom,
                          volatile int *stop_flag, zs_worker_stats *stats, int *rejoin)
{
    wk w = {0};
    w.wake_fd = -1;
    w.prom = prom;
    int32_t *in = NULL, *tg = NULL;
    zs_err res;
    int mu_ready = 0;
    *rejoin = 0;
    ZS_CHECK_GOTO(zs_session_open(opts->coord, opts->secret, opts->data,
                                  opts->join_timeout_ms > 0 ? opts->join_timeout_ms : 60000,
                                  stop_flag, &w.s),
                  res, out);
    w.cfg = zs_session_config(w.s);
    w.tt = zs_session_tensors(w.s);
    w.cl = zs_session_client(w.s);
    w.L = w.cfg->model.n_layer;
    w.dtype = w.cfg->bf16 ? ZS_DTYPE_BF16 : w.cfg->fp16.enabled ? ZS_DTYPE_F16 : ZS_DTYPE_F32;
    w.fp16 = w.cfg->fp16.enabled;
    int b = w.cfg->micro_batch, T = w.cfg->model.block_size;
    in = malloc((size_t)b * T * sizeof *in);
    tg = malloc((size_t)b * T * sizeof *tg);
    if (!in || !tg) {
        res = zs_error(ZS_ERR_NOMEM, "worker: out of memory for a chunk's tokens");
        goto out;
    }
    {
        /* The activations are the worker's largest allocation: say so first if they cannot
         * fit, with both numbers, instead of failing in the middle (or meeting the OOM
         * killer). */
        char who[32], what[96];
        snprintf(who, sizeof who, "worker %u", zs_session_id(w.s));
        snprintf(what, sizeof what, "activations for %d x %d tokens", b, T);
        ZS_CHECK_GOTO(
            zs_mem_check(who, what, zs_model_host_bytes(opts->device, &w.cfg->model, b, T)), res,
            out);
    }
    ZS_CHECK_GOTO(zs_model_create(opts->device, &w.cfg->model, w.tt, b, T, opts->threads,
                                  zs_model_precision(w.cfg), &w.model),
                  res, out);
    w.on_host = zs_model_on_host(w.model);
    ZS_CHECK_GOTO(setup_slots(&w, opts->gpudirect), res, out);
    w.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w.wake_fd < 0) {
        res = zs_error(ZS_ERR_IO, "worker: eventfd: %s", strerror(errno));
        goto out;
    }
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.wake_comm, NULL);
    pthread_cond_init(&w.wake_compute, NULL);
    mu_ready = 1;
    if (pthread_create(&w.comm, NULL, comm_main, &w) != 0) {
        res = zs_error(ZS_ERR_IO, "worker: cannot start the communication thread");
        goto out;
    }
    w.comm_started = 1;
    char dev_name[16];
    zs_device_format(opts->device, dev_name, sizeof dev_name);
    ZS_INFO("worker %u: %s weights, compute on %s, %d threads, %.1f MB of layer buffers%s",
            zs_session_id(w.s),
            w.dtype == ZS_DTYPE_BF16  ? "bf16"
            : w.dtype == ZS_DTYPE_F16 ? "fp16"
                                      : "fp32",
            dev_name, opts->threads, w.st.buffer_bytes / 1e6,
            w.gpudirect ? " in device memory (GPUDirect RDMA)" : "");
    zs_prom_set(w.prom->member, zs_session_id(w.s));
    zs_prom_set(w.prom->buffer_bytes, (double)w.st.buffer_bytes);

    long last_step = -1;
    double idle_since = -1; /* when it last finished a chunk: waiting from then is step wait */
    res = ZS_OK;
    while (!(stop_flag && *stop_flag)) {
        zs_assignment a;
        int got = 0, ended = 0;
        res = zs_session_next(w.s, 100, &a, &got, &ended);
        if (res != ZS_OK || ended)
            break;
        if (!got)
            continue;
        if (idle_since >= 0) {
            double waited = zs_now_s() - idle_since;
            w.st.step_wait_s += waited;
            zs_prom_observe(w.prom->step_wait, waited);
        }
        if (a.step != last_step) {
            w.st.steps++;
            last_step = a.step;
        }
        zs_prom_set(w.prom->step, (double)(a.step + 1));
        w.loss_scale =
            w.fp16 ? zs_model_loss_scale(w.model, (float)a.loss_scale) : (float)a.loss_scale;
        /* A stop request ends the loop after the chunk in hand; the coordinator gives the
         * rest of the assignment to others once this worker leaves. */
        for (int i = 0; i < a.n && res == ZS_OK && !(stop_flag && *stop_flag); i++) {
            res = run_chunk(&w, in, tg, a.step, a.chunks[i]);
            /* Past its deadline, the chunk went to another worker and the servers refuse
             * our pushes of it: drop it and go on (the other copy counts). */
            if (res != ZS_OK && strstr(zs_last_error(), ZS_NOT_ASSIGNED_TEXT) &&
                !zs_session_rejoin(w.s)) {
                ZS_WARN("worker %u: step %ld chunk %d went to another worker; this one lets it "
                        "go (%s)",
                        zs_session_id(w.s), a.step + 1, a.chunks[i], zs_last_error());
                res = ZS_OK;
            }
        }
        if (res != ZS_OK) {
            res = why_refused(&w, res);
            break;
        }
        idle_since = zs_now_s();
    }
    if (zs_session_rejoin(w.s)) {
        /* Whatever failed in the chunk in hand was the old servers going away. */
        *rejoin = 1;
        res = ZS_OK;
    }
    if (res == ZS_OK && stop_flag && *stop_flag)
        ZS_INFO("worker %u: stopping on request", zs_session_id(w.s));
out:
    zs_prom_set(w.prom->member, 0); /* not registered any more (it may join again) */
    if (w.comm_started) {
        pthread_mutex_lock(&w.mu);
        w.quit = 1;
        wake_comm(&w);
        pthread_mutex_unlock(&w.mu);
        pthread_join(w.comm, NULL);
    }
    if (mu_ready) {
        pthread_cond_destroy(&w.wake_compute);
        pthread_cond_destroy(&w.wake_comm);
        pthread_mutex_destroy(&w.mu);
    }
    if (w.wake_fd >= 0)
        close(w.wake_fd);
    if (w.s)
        log_stats(&w);
    if (stats) {
        stats->chunks += w.st.chunks;
        stats->steps += w.st.steps;
        stats->compute_s += w.st.compute_s;
        stats->fetch_wait_s += w.st.fetch_wait_s;
        stats->push_wait_s += w.st.push_wait_s;
        stats->step_wait_s += w.st.step_wait_s;
        stats->fetched_bytes += w.st.fetched_bytes;
        stats->pushed_bytes += w.st.pushed_bytes;
        if (w.st.buffer_bytes > stats->buffer_bytes)
            stats->buffer_bytes = w.st.buffer_bytes;
    }
    for (int i = 0; w.model && i < 2 * SLOTS; i++) {
        slot *s = i < SLOTS ? &w.param[i] : &w.grad[i - SLOTS];
        if (!s->dmabuf)
            zs_model_dealloc(w.model, s->dev);
    }
    free(in);
    free(tg);
    /* The session closes the client (its registrations) before the buffers go; a failure of
     * our own goes to the coordinator with the leaving notice. */
    if (res != ZS_OK)
        zs_session_fail(w.s, zs_last_error());
    zs_session_close(w.s);
    for (int i = 0; w.model && i < 2 * SLOTS; i++) {
        slot *s = i < SLOTS ? &w.param[i] : &w.grad[i - SLOTS];
        if (s->buf != s->dev) /* with GPUDirect the slot has no host buffer */
            zs_model_host_free(w.model, s->buf);
        /* Registered with the NIC as dma-bufs: freed once the client's regions are gone. */
        if (s->dmabuf)
            zs_model_dmabuf_free(w.model, s->dev);
    }
    zs_model_free(w.model);
    return res;
}

zs_err zs_gpudirect_parse(const char *text, zs_gpudirect *out)
{
    static const char *const names[] = {"auto", "on", "off"};
    for (int i = 0; text && i < 3; i++)
        if (!strcmp(text, names[i])) {
            *out = (zs_gpudirect)i;
            return ZS_OK;
        }
    return zs_error(ZS_ERR_INVALID, "gpudirect \"%s\": expected auto, on or off",
                    text ? text : "(none)");
}

/* Registers the series of prom (docs/observability.md lists them); *wp all NULL without one. */
static zs_err prom_setup(zs_prom *r, worker_prom *wp)
{
    *wp = (worker_prom){0};
    if (!r)
        return ZS_OK;
    const zs_prom_def defs[] = {
        {&wp->chunks, 0, "zshard_worker_chunks_total", "Chunks computed, pushed and reported"},
        {&wp->fetched, 0, "zshard_worker_fetched_bytes_total",
         "Parameter bytes fetched from the partition servers"},
        {&wp->pushed, 0, "zshard_worker_pushed_bytes_total",
         "Gradient bytes pushed to the partition servers"},
        {&wp->member, 1, "zshard_worker_member",
         "This worker's member id in the job (0: not registered)"},
        {&wp->step, 1, "zshard_worker_step", "The step of the last assignment (0: none yet)"},
        {&wp->buffer_bytes, 1, "zshard_worker_buffer_bytes",
         "Parameter and gradient buffers held for the job"},
    };
    ZS_CHECK(zs_prom_register(r, defs, (int)(sizeof defs / sizeof defs[0])));
    static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                    0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
    const int nb = (int)(sizeof bounds / sizeof bounds[0]);
    struct {
        zs_prom_series **out;
        const char *name, *help;
    } hists[] = {
        {&wp->compute, "zshard_worker_compute_seconds",
         "A chunk's forward and backward, less its waits below"},
        {&wp->fetch_wait, "zshard_worker_fetch_wait_seconds",
         "A chunk's time blocked on parameter fetches that had not landed"},
        {&wp->push_wait, "zshard_worker_push_wait_seconds",
         "A chunk's time blocked on gradient pushes"},
        {&wp->step_wait, "zshard_worker_step_wait_seconds",
         "Waiting for the next assignment after finishing one (other workers, the optimizer)"},
    };
    for (size_t i = 0; i < sizeof hists / sizeof hists[0]; i++)
        if (!(*hists[i].out = zs_prom_histogram(r, hists[i].name, hists[i].help, NULL, bounds, nb)))
            return ZS_ERR_INVALID; /* the message is recorded */
    return ZS_OK;
}

zs_err zs_worker_run(const zs_worker_opts *opts, volatile int *stop_flag, zs_worker_stats *stats)
{
    zs_worker_stats st = {0};
    int rejoin = 0;
    worker_prom prom;
    zs_err res = prom_setup(opts->prom, &prom);
    if (res != ZS_OK) {
        if (stats)
            *stats = st;
        return res;
    }
    do
        res = run_session(opts, &prom, stop_flag, &st, &rejoin);
    while (res == ZS_OK && rejoin && !(stop_flag && *stop_flag));
    if (stats)
        *stats = st;
    return res;
}
