/*
 * gpt2: GPT-2 forward and backward, exactly as Hugging Face GPT2LMHeadModel (learned
 * positions, pre-LN blocks, gelu_new, LayerNorm eps 1e-5, lm_head tied to wte, no dropout,
 * mean cross-entropy over all B*T positions), composed from the CPU kernels.
 *
 * Parameters are not owned by the model: it asks a zs_gpt2_io for each layer's range of the
 * flat vector (see common/tensors.h for layers) just before it needs it, and hands back each
 * layer's gradient as soon as backward has produced it.  The single-process trainer answers
 * with pointers into its own vectors; a worker fetches and pushes over the network.
 *
 * Call order, which an io may rely on (L = n_layer):
 *   forward:  acquire(0); for l = 1..L { acquire(l); release(l) }; acquire(L+1)
 *   backward: grads(L+1); grads(0); grads_done(L+1); release(L+1);
 *             for l = L..1 { acquire(l); grads(l); grads_done(l); release(l) };
 *             grads_done(0); release(0)
 *   zs_gpt2_finish() instead of backward: release(L+1); release(0)
 * grads(l) returns a buffer the model overwrites for layer l (kernels: "param grads =" for
 * the first write of a chunk, += after, e.g. wte from lm_head and then the encoder).
 *
 * Determinism: for given parameters and tokens the loss and every gradient bit are the same
 * for any number of threads (fixed-size blocks reduced in block order, BLIS sgemm).
 */
#ifndef ZS_GPT2_H
#define ZS_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "common/tensors.h"

typedef struct {
    void *ctx;
    /* Sets *base so that base + t->offset is tensor t, for every tensor t of layer. May block
     * (a network fetch).  The pointer stays valid until release(layer). */
    zs_err (*acquire)(void *ctx, int layer, const float **base);
    void (*release)(void *ctx, int layer);
    /* Sets *base the same way for layer's gradient buffer (contents undefined). */
    zs_err (*grads)(void *ctx, int layer, float **base);
    /* Layer's gradient is complete (a worker pushes it now). */
    zs_err (*grads_done)(void *ctx, int layer);
} zs_gpt2_io;

typedef struct zs_gpt2 zs_gpt2;

/* Allocates activations for up to max_b sequences of up to max_t tokens (max_t <= block_size).
 * threads: OpenMP threads for the kernels (0: the OpenMP default). */
zs_err zs_gpt2_create(const zs_model_config *cfg, const zs_tensor_table *tt, int max_b, int max_t,
                      int threads, zs_gpt2 **out);
void zs_gpt2_free(zs_gpt2 *m);

/* The bytes of activations zs_gpt2_create allocates for max_b x max_t (what a role checks
 * against its memory limits before it starts). */
size_t zs_gpt2_activation_bytes(const zs_model_config *cfg, int max_b, int max_t);

/* Forward over b sequences of t tokens: inputs and targets are [b, t] token ids (checked
 * against vocab_size).  Sets *loss to the mean cross-entropy. Leaves layers 0 and L+1 acquired. */
zs_err zs_gpt2_forward(zs_gpt2 *m, const zs_gpt2_io *io, const int32_t *inputs,
                       const int32_t *targets, int b, int t, float *loss);

/* Backward of the last forward (d loss / d params), layer by layer through io. */
zs_err zs_gpt2_backward(zs_gpt2 *m, const zs_gpt2_io *io);

/* Ends a forward that is not followed by backward (evaluation). */
void zs_gpt2_finish(zs_gpt2 *m, const zs_gpt2_io *io);

/* An io over two whole flat vectors (params read, grads written): the trainer's, and tests'. */
typedef struct {
    const float *params;
    float *grads;
} zs_gpt2_flat;
zs_gpt2_io zs_gpt2_flat_io(zs_gpt2_flat *flat);

/* Floating-point operations of one forward+backward over b*t tokens (for GFLOP/s figures). */
double zs_gpt2_flops(const zs_model_config *cfg, int b, int t);

#endif
