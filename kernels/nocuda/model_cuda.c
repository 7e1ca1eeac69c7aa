/*
 * nocuda/model_cuda: the compute seam's CUDA backend in a binary built without the CUDA toolkit
 * (CMake found no nvcc, or ZS_CUDA=OFF): creating a model says so; nothing else is reachable.
 */
#include "kernels/model.h"

static zs_err absent_create(const zs_model_config *cfg, const zs_tensor_table *tt, int max_b,
                            int max_t, int threads, zs_precision precision, int index, void **impl)
{
    (void)cfg, (void)tt, (void)max_b, (void)max_t, (void)threads, (void)precision;
    *impl = NULL;
    return zs_error(ZS_ERR_INVALID,
                    "device cuda:%d: this zshard was built without CUDA (no nvcc when it was "
                    "configured, or ZS_CUDA=OFF); rebuild with the CUDA toolkit installed",
                    index);
}

const zs_model_ops zs_model_cuda_ops = {.name = "cuda", .create = absent_create};
