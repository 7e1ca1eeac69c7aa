/*
 * safetensors: reader and writer of the safetensors format (Hugging Face).
 *
 * File layout: 8-byte little-endian header length H, H bytes of JSON header
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *   "__metadata__": {"k": "v"}}), then the data section; offsets are relative to it.
 *
 * Invariant: zs_st_open() accepts a file only when every check passes: the header length fits
 * the file, the header is a JSON object, every entry has a known dtype, a shape of
 * non-negative integers and offsets with begin <= end <= data length, end - begin equals
 * numel * dtype size, entries do not overlap and together cover the data section.  Any
 * failure is ZS_ERR_FORMAT with a message that names the file, the tensor and the value.
 */
#ifndef ZS_SAFETENSORS_H
#define ZS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef enum {
    ZS_DT_F32,
    ZS_DT_F16,
    ZS_DT_BF16,
    ZS_DT_F64,
    ZS_DT_I64,
    ZS_DT_I32,
    ZS_DT_I16,
    ZS_DT_I8,
    ZS_DT_U8,
    ZS_DT_BOOL
} zs_dtype;

#define ZS_ST_MAX_DIMS 8

typedef struct {
    char *name;
    zs_dtype dtype;
    int ndim;
    size_t shape[ZS_ST_MAX_DIMS];
    size_t numel;
    size_t begin, end; /* byte offsets into the data section */
} zs_st_entry;

typedef struct {
    char *path;
    int fd;
    size_t data_start; /* file offset of the data section: 8 + H */
    size_t data_len;
    zs_st_entry *entries;
    int count;
} zs_st_file;

/* Bytes per element of a dtype; its safetensors name ("F32"); parse a name (-1 if unknown). */
size_t zs_dtype_size(zs_dtype dt);
const char *zs_dtype_name(zs_dtype dt);
int zs_dtype_parse(const char *name);

/* Opens and validates a file; the data is read on demand. */
zs_err zs_st_open(const char *path, zs_st_file *f);
void zs_st_close(zs_st_file *f);

/* The entry with that exact name, or NULL. */
const zs_st_entry *zs_st_find(const zs_st_file *f, const char *name);

/* Reads an F32, BF16 or F16 entry into dst as fp32; numel must equal the entry's. */
zs_err zs_st_read_f32(const zs_st_file *f, const zs_st_entry *e, float *dst, size_t numel);

typedef struct {
    const char *name;
    zs_dtype dtype;
    int ndim;
    size_t shape[ZS_ST_MAX_DIMS];
    const void *data; /* numel * dtype size bytes */
} zs_st_tensor;

/*
 * Writes count tensors (in the given order) and optional metadata pairs (meta_kv: 2*n_meta
 * strings, key then value) to path.  Written to "path.tmp" and renamed, so a failure never
 * leaves a partial file under the final name.
 */
zs_err zs_st_write(const char *path, const zs_st_tensor *tensors, int count,
                   const char *const *meta_kv, int n_meta);

#endif
