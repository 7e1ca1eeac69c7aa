/*
 * modelfile: a model directory as Hugging Face reads and writes it: config.json (GPT-2 keys)
 * and model.safetensors (fp32, HF names, Conv1D layout, lm_head tied to wte and not stored).
 * `zshard train` writes it, `zshard eval` and `--init` read it, and so does
 * GPT2LMHeadModel.from_pretrained.
 */
#ifndef ZS_MODELFILE_H
#define ZS_MODELFILE_H

#include "common/config.h"
#include "common/err.h"
#include "common/tensors.h"

/* Writes dir/model.safetensors and dir/config.json from the flat vector params. */
zs_err zs_modelfile_save(const zs_tensor_table *tt, const zs_model_config *model,
                         const float *params, const char *dir);

/*
 * Loads HF GPT-2 safetensors at path into params ([tt->total], padding zeroed): names with or
 * without the "transformer." prefix; attn.bias and attn.masked_bias buffers ignored;
 * lm_head.weight ignored (tied to wte); F32, BF16 or F16 data; every tensor of the table must
 * be present with its shape, and any other tensor is an error that names it.  A NaN or an
 * infinity in a tensor is an error too (ZS_ERR_FORMAT) that names the tensor, the kind of value
 * and its element: "PATH: tensor \"h.3.attn.c_attn.weight\" has a non-finite value (nan) at
 * element 1234".  The trainer and the partition servers both load --init weights here.
 */
zs_err zs_modelfile_load_weights(const zs_tensor_table *tt, const char *path, float *params);

/* Reads dir/config.json into *model and dir/model.safetensors into a new params vector
 * (malloc'd, [tt->total]) with its tensor table. */
zs_err zs_modelfile_load(const char *dir, zs_model_config *model, zs_tensor_table *tt,
                         float **params);

#endif
