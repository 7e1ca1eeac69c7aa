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
 * The writer's header bytes are built in one place (zs_st_header), so a writer that streams
 * its own data (zshard export, checkpoint shard files) writes what zs_st_write would.
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

/*
 * The bytes zs_st_write puts before the data section for the same arguments when align is 8:
 * the 8-byte length, the compact JSON header (__metadata__, then the tensors in the given
 * order) and the spaces that start the data section at a multiple of align bytes (a multiple
 * of 8, at most 1 MiB), into *header (malloc'd; the caller frees it), *header_len of them (the
 * data section's file offset).  bytes[i] (count entries) gets tensor i's size in bytes; its
 * data follows that of the tensors before it.  Checks every argument as zs_st_write does
 * except the data pointers, which it does not read.  A writer that streams the data itself
 * (zshard export, the checkpoint's shard files) writes this header and then exactly those
 * bytes; with align 8 the file is the one zs_st_write would write.  path only names the file
 * in messages.
 */
zs_err zs_st_header(const char *path, const zs_st_tensor *tensors, int count,
                    const char *const *meta_kv, int n_meta, size_t align, size_t *bytes,
                    char **header, size_t *header_len);

/*
 * The __metadata__ pairs (key, value, ...) of a Hugging Face model file as zshard writes it:
 * zs_modelfile_save and zshard export pass these same pairs, so their headers are equal.
 * transformers refuses safetensors files without "format".
 */
#define ZS_ST_MODEL_N_META 2
extern const char *const zs_st_model_meta[2 * ZS_ST_MODEL_N_META];

/*
 * A short description of a JSON value for messages, into buf (cap bytes; ZS_JSON_DESC holds
 * any): the integer itself, a string's first 32 bytes in quotes, else its kind ("missing" for
 * NULL, "an object", "null", ...).  Returns buf.  For the readers of JSON headers and
 * manifests (this module, common/ckpt.c).
 */
#define ZS_JSON_DESC 64
struct json_t;
const char *zs_json_desc(char *buf, size_t cap, const struct json_t *v);

#endif
