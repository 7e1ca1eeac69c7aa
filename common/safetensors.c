/*
 * safetensors: the reader validates the whole header before anything is read from the data
 * section, so a corrupt file is refused up front with a message naming the file, the tensor
 * and the value, and no read can reach outside the file.  The writer validates its arguments
 * before it creates anything, writes "path.tmp", syncs it and renames it over path
 * (common/fileio.h).  Its header bytes come from the one function that zs_st_header exposes,
 * so a writer that streams the data itself writes the same file.
 *
 * Data is stored little-endian; this module copies it as is, so it needs a little-endian host.
 */
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c copies little-endian tensor data as is and needs a little-endian host"
#endif

_Static_assert(sizeof(size_t) >= sizeof(json_int_t), "a JSON integer must fit size_t");

#define ST_MAX_HEADER (100u << 20) /* bytes; larger headers are not safetensors files */
#define ST_SHAPE_STR 192           /* bytes for "[d0, d1, ...]" of ZS_ST_MAX_DIMS dims */
#define ST_MAX_ALIGN (1u << 20)    /* bytes; the largest data alignment a writer may ask for */

static const struct {
    const char *name;
    size_t size; /* bytes per element */
} dtypes[] = {
    [ZS_DT_F32] = {"F32", 4},   [ZS_DT_F16] = {"F16", 2}, [ZS_DT_BF16] = {"BF16", 2},
    [ZS_DT_F64] = {"F64", 8},   [ZS_DT_I64] = {"I64", 8}, [ZS_DT_I32] = {"I32", 4},
    [ZS_DT_I16] = {"I16", 2},   [ZS_DT_I8] = {"I8", 1},   [ZS_DT_U8] = {"U8", 1},
    [ZS_DT_BOOL] = {"BOOL", 1},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

size_t zs_dtype_size(zs_dtype dt)
{
    return (int)dt >= 0 && (int)dt < N_DTYPES ? dtypes[dt].size : 0;
}

const char *zs_dtype_name(zs_dtype dt)
{
    return (int)dt >= 0 && (int)dt < N_DTYPES ? dtypes[dt].name : "?";
}

int zs_dtype_parse(const char *name)
{
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0)
            return i;
    return -1;
}

/* "[2, 3]" (or "[]" for a scalar) into buf, truncated to fit; returns buf. */
static const char *shape_str(char *buf, size_t cap, const size_t *shape, int ndim)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%zu", i ? ", " : "", shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

const char *zs_json_desc(char *buf, size_t cap, const json_t *v)
{
    if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_string(v))
        snprintf(buf, cap, "the string \"%.32s\"", json_string_value(v));
    else
        snprintf(buf, cap, "%s",
                 !v                  ? "missing"
                 : json_is_object(v) ? "an object"
                 : json_is_array(v)  ? "an array"
                 : json_is_real(v)   ? "a real number"
                 : json_is_null(v)   ? "null"
                                     : "a boolean");
    return buf;
}

/* A JSON integer >= 0 into *out; 0 if v is anything else. */
static int json_size(const json_t *v, size_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (size_t)json_integer_value(v);
    return 1;
}

/* numel of a shape into *out; 0 if the product, or numel * elem bytes, overflows size_t. */
static int shape_numel(const size_t *shape, int ndim, size_t elem, size_t *out)
{
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] && numel > SIZE_MAX / shape[i])
            return 0;
        numel *= shape[i];
    }
    if (elem && numel > SIZE_MAX / elem)
        return 0;
    *out = numel;
    return 1;
}

/* Parses the entry "name": v into e (whose name is already set) and checks it against the
 * data section of data_len bytes; overlap and coverage are checked later, over all entries. */
static zs_err parse_entry(const char *path, const char *name, const json_t *v, zs_st_entry *e,
                          size_t data_len)
{
    char desc[ZS_JSON_DESC], shp[ST_SHAPE_STR];
    if (!json_is_object(v))
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": entry is %s, not an object", path, name,
                        zs_json_desc(desc, sizeof desc, v));

    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": dtype is %s, not a string", path, name,
                        zs_json_desc(desc, sizeof desc, dt));
    int d = zs_dtype_parse(json_string_value(dt));
    if (d < 0)
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", path, name,
                        json_string_value(dt));
    e->dtype = (zs_dtype)d;

    const json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape))
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": shape is %s, not an array", path, name,
                        zs_json_desc(desc, sizeof desc, shape));
    if (json_array_size(shape) > ZS_ST_MAX_DIMS)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: tensor \"%s\": shape has %zu dimensions, at most %d "
                        "supported",
                        path, name, json_array_size(shape), ZS_ST_MAX_DIMS);
    e->ndim = (int)json_array_size(shape);
    for (int i = 0; i < e->ndim; i++) {
        const json_t *s = json_array_get(shape, (size_t)i);
        if (!json_size(s, &e->shape[i]))
            return zs_error(ZS_ERR_FORMAT,
                            "%s: tensor \"%s\": shape[%d] is %s, not a "
                            "non-negative integer",
                            path, name, i, zs_json_desc(desc, sizeof desc, s));
    }
    shape_str(shp, sizeof shp, e->shape, e->ndim);
    if (!shape_numel(e->shape, e->ndim, dtypes[e->dtype].size, &e->numel))
        return zs_error(ZS_ERR_FORMAT,
                        "%s: tensor \"%s\": shape %s of %s overflows the size "
                        "in bytes",
                        path, name, shp, dtypes[e->dtype].name);

    const json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2)
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets is %s, not [begin, end]",
                        path, name,
                        json_is_array(off) ? "an array of the wrong length"
                                           : zs_json_desc(desc, sizeof desc, off));
    for (int i = 0; i < 2; i++) {
        const json_t *o = json_array_get(off, (size_t)i);
        if (!json_size(o, i ? &e->end : &e->begin))
            return zs_error(ZS_ERR_FORMAT,
                            "%s: tensor \"%s\": data_offsets[%d] is %s, not a "
                            "non-negative integer",
                            path, name, i, zs_json_desc(desc, sizeof desc, o));
    }
    if (e->begin > e->end)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%zu, %zu] begin after "
                        "they end",
                        path, name, e->begin, e->end);
    if (e->end > data_len)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%zu, %zu] outside the "
                        "data section of %zu bytes",
                        path, name, e->begin, e->end, data_len);
    size_t want = e->numel * dtypes[e->dtype].size;
    if (e->end - e->begin != want)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%zu, %zu] hold %zu "
                        "bytes, shape %s of %s needs %zu",
                        path, name, e->begin, e->end, e->end - e->begin, shp, dtypes[e->dtype].name,
                        want);
    return ZS_OK;
}

static zs_err check_metadata(const char *path, const json_t *v)
{
    char desc[ZS_JSON_DESC];
    if (!json_is_object(v))
        return zs_error(ZS_ERR_FORMAT, "%s: __metadata__ is %s, not an object", path,
                        zs_json_desc(desc, sizeof desc, v));
    const char *k;
    const json_t *mv;
    json_object_foreach((json_t *)v, k, mv)
    {
        if (!json_is_string(mv))
            return zs_error(ZS_ERR_FORMAT, "%s: __metadata__ \"%s\" is %s, not a string", path, k,
                            zs_json_desc(desc, sizeof desc, mv));
    }
    return ZS_OK;
}

/* Orders entries by begin, then end, so that empty entries come before a neighbour at the
 * same offset. */
static int cmp_begin(const void *a, const void *b)
{
    const zs_st_entry *x = *(const zs_st_entry *const *)a, *y = *(const zs_st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Entries must tile the data section: sorted by offset, without overlap or gap. */
static zs_err check_coverage(const zs_st_file *f)
{
    zs_st_entry **order = malloc((f->count ? (size_t)f->count : 1) * sizeof *order);
    if (!order)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory for %d entries", f->path, f->count);
    for (int i = 0; i < f->count; i++)
        order[i] = &f->entries[i];
    qsort(order, (size_t)f->count, sizeof *order, cmp_begin);
    zs_err res = ZS_OK;
    size_t cursor = 0; /* end of the bytes covered so far */
    for (int i = 0; i < f->count; i++) {
        const zs_st_entry *e = order[i];
        if (e->begin < cursor) {
            /* cursor > 0, so i > 0 and order[i - 1] is the entry that ends there. */
            res = zs_error(ZS_ERR_FORMAT,
                           "%s: tensor \"%s\": data_offsets [%zu, %zu] overlap "
                           "tensor \"%s\" at [%zu, %zu]",
                           f->path, e->name, e->begin, e->end, order[i - 1]->name,
                           order[i - 1]->begin, cursor);
            goto out;
        }
        if (e->begin > cursor) {
            res = zs_error(ZS_ERR_FORMAT,
                           "%s: data bytes [%zu, %zu) belong to no tensor (gap "
                           "before tensor \"%s\")",
                           f->path, cursor, e->begin, e->name);
            goto out;
        }
        cursor = e->end;
    }
    if (cursor != f->data_len)
        res = zs_error(ZS_ERR_FORMAT, "%s: data section has %zu bytes, tensors cover %zu", f->path,
                       f->data_len, cursor);
out:
    free(order);
    return res;
}

static zs_err parse_header(zs_st_file *f, const char *text, size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zs_error(ZS_ERR_FORMAT, "%s: header is not valid JSON: %s at byte %d", f->path,
                        jerr.text, jerr.position);
    zs_err res = ZS_OK;
    if (!json_is_object(root)) {
        char desc[ZS_JSON_DESC];
        res = zs_error(ZS_ERR_FORMAT, "%s: header is %s, not a JSON object", f->path,
                       zs_json_desc(desc, sizeof desc, root));
        goto out;
    }
    size_t n = json_object_size(root);
    f->entries = calloc(n ? n : 1, sizeof *f->entries);
    if (!f->entries) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for %zu entries", f->path, n);
        goto out;
    }
    /* jansson iterates in insertion order, so entries keep the order of the file. */
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            ZS_CHECK_GOTO(check_metadata(f->path, v), res, out);
            continue;
        }
        zs_st_entry *e = &f->entries[f->count];
        if (!(e->name = strdup(key))) {
            res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for tensor name \"%s\"", f->path, key);
            goto out;
        }
        f->count++;
        ZS_CHECK_GOTO(parse_entry(f->path, key, v, e, f->data_len), res, out);
    }
    res = check_coverage(f);
out:
    json_decref(root);
    return res;
}

zs_err zs_st_open(const char *path, zs_st_file *f)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!(f->path = strdup(path)))
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
    zs_err res = ZS_OK;
    char *header = NULL;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        res = zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: stat failed: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        res = zs_error(ZS_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        res = zs_error(ZS_ERR_FORMAT,
                       "%s: %zu bytes is too short for a safetensors file (8-byte "
                       "header length)",
                       path, size);
        goto fail;
    }
    uint8_t lenbuf[8];
    ZS_CHECK_GOTO(zs_file_read_at(f->fd, path, lenbuf, 8, 0), res, fail);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    if (hlen > size - 8) {
        res = zs_error(ZS_ERR_FORMAT, "%s: header length %llu does not fit the file of %zu bytes",
                       path, (unsigned long long)hlen, size);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        res = zs_error(ZS_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes", path,
                       (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    if (hlen < 2) {
        res = zs_error(ZS_ERR_FORMAT, "%s: header length %llu is too short for a JSON object", path,
                       (unsigned long long)hlen);
        goto fail;
    }
    if (!(header = malloc(hlen))) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for a %llu-byte header", path,
                       (unsigned long long)hlen);
        goto fail;
    }
    ZS_CHECK_GOTO(zs_file_read_at(f->fd, path, header, hlen, 8), res, fail);
    f->data_start = 8 + hlen;
    f->data_len = size - f->data_start;
    ZS_CHECK_GOTO(parse_header(f, header, hlen), res, fail);
    free(header);
    return ZS_OK;
fail:
    free(header);
    zs_st_close(f);
    return res;
}

void zs_st_close(zs_st_file *f)
{
    for (int i = 0; i < f->count; i++)
        free(f->entries[i].name);
    free(f->entries);
    /* A zeroed struct has fd 0 but no path: it never opened anything, so fd 0 is not ours.
     * zs_st_open sets the path before it opens the file. */
    if (f->path && f->fd >= 0)
        close(f->fd);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const zs_st_entry *zs_st_find(const zs_st_file *f, const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->entries[i].name, name) == 0)
            return &f->entries[i];
    return NULL;
}

/* IEEE binary16 to binary32, exact: subnormals, infinities and NaN (payload kept) included. */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0 && man == 0) {
        u = sign;
    } else if (exp == 0) {
        /* man * 2^-24: shift the leading 1 up to bit 10, where the implicit bit of a normal
         * number sits, lowering the exponent by one per shift from that of 2^-14. */
        uint32_t e = 127 - 14;
        while (!(man & 0x400)) {
            man <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((man & 0x3ff) << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &u, 4);
    return out;
}

zs_err zs_st_read_f32(const zs_st_file *f, const zs_st_entry *e, float *dst, size_t numel)
{
    if (numel != e->numel)
        return zs_error(ZS_ERR_INVALID,
                        "%s: tensor \"%s\": caller expects %zu elements, the "
                        "file has %zu",
                        f->path, e->name, numel, e->numel);
    if (e->dtype != ZS_DT_F32 && e->dtype != ZS_DT_BF16 && e->dtype != ZS_DT_F16)
        return zs_error(ZS_ERR_INVALID,
                        "%s: tensor \"%s\": dtype %s cannot be read as F32 "
                        "(only F32, BF16 and F16)",
                        f->path, e->name, zs_dtype_name(e->dtype));
    if (numel == 0)
        return ZS_OK; /* dst may be NULL */
    size_t off = f->data_start + e->begin;
    if (e->dtype == ZS_DT_F32)
        return zs_file_read_at(f->fd, f->path, dst, numel * 4, off);
    /* 16-bit data: read into the upper half of dst, then widen front to back.  Writing element
     * i overwrites only halves at indices <= i, which are already consumed.  Byte copies keep
     * the two views of the buffer free of aliasing questions. */
    unsigned char *bytes = (unsigned char *)dst, *half = bytes + 2 * numel;
    ZS_CHECK(zs_file_read_at(f->fd, f->path, half, numel * 2, off));
    for (size_t i = 0; i < numel; i++) {
        uint16_t h;
        memcpy(&h, half + 2 * i, 2);
        float x;
        if (e->dtype == ZS_DT_BF16) {
            uint32_t u = (uint32_t)h << 16;
            memcpy(&x, &u, 4);
        } else {
            x = f16_to_f32(h);
        }
        memcpy(bytes + 4 * i, &x, 4);
    }
    return ZS_OK;
}

const char *const zs_st_model_meta[2 * ZS_ST_MODEL_N_META] = {"format", "pt", "producer",
                                                              ("zshard " ZS_VERSION)};

/* A string jansson accepts as a key or value, i.e. valid UTF-8. */
static int utf8_ok(const char *s)
{
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

/* The JSON header of a write; *bytes gets each tensor's size.  Checks every argument but the
 * data pointers, which are checked only when need_data is set (zs_st_write). */
static zs_err build_header(const char *path, const zs_st_tensor *tensors, int count,
                           const char *const *meta_kv, int n_meta, int need_data, size_t *bytes,
                           json_t **out)
{
    json_t *root = json_object();
    if (!root)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
    zs_err res = ZS_OK;
    char shp[ST_SHAPE_STR];
    if (n_meta > 0) {
        json_t *meta = json_object();
        if (!meta || json_object_set_new(root, "__metadata__", meta) != 0) {
            res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        for (int i = 0; i < n_meta; i++) {
            const char *k = meta_kv[2 * i], *val = meta_kv[2 * i + 1];
            if (!k || !val || !utf8_ok(k) || !utf8_ok(val)) {
                res = zs_error(ZS_ERR_INVALID,
                               "%s: metadata pair %d (\"%s\") is NULL or not "
                               "valid UTF-8",
                               path, i, k ? k : "(null)");
                goto fail;
            }
            if (json_object_get(meta, k)) {
                res = zs_error(ZS_ERR_INVALID, "%s: metadata key \"%s\" given twice", path, k);
                goto fail;
            }
            if (json_object_set_new(meta, k, json_string(val)) != 0) {
                res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
                goto fail;
            }
        }
    }
    size_t offset = 0; /* bytes of data before tensor i */
    for (int i = 0; i < count; i++) {
        const zs_st_tensor *t = &tensors[i];
        if (!t->name || !utf8_ok(t->name) || strcmp(t->name, "__metadata__") == 0) {
            res = zs_error(ZS_ERR_INVALID,
                           "%s: tensor %d: name \"%s\" is NULL, not valid UTF-8 "
                           "or reserved",
                           path, i, t->name ? t->name : "(null)");
            goto fail;
        }
        if (json_object_get(root, t->name)) {
            res = zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\" given twice", path, t->name);
            goto fail;
        }
        if (zs_dtype_size(t->dtype) == 0) {
            res = zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\": unknown dtype %d", path, t->name,
                           (int)t->dtype);
            goto fail;
        }
        if (t->ndim < 0 || t->ndim > ZS_ST_MAX_DIMS) {
            res = zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\": %d dimensions, 0 to %d supported",
                           path, t->name, t->ndim, ZS_ST_MAX_DIMS);
            goto fail;
        }
        size_t numel;
        shape_str(shp, sizeof shp, t->shape, t->ndim);
        if (!shape_numel(t->shape, t->ndim, zs_dtype_size(t->dtype), &numel)) {
            res = zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\": shape %s overflows", path, t->name,
                           shp);
            goto fail;
        }
        bytes[i] = numel * zs_dtype_size(t->dtype);
        if (need_data && bytes[i] && !t->data) {
            res = zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\": shape %s but no data", path, t->name,
                           shp);
            goto fail;
        }
        if (bytes[i] > (size_t)INT64_MAX - offset) {
            res = zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\": data ends past 2^63 bytes", path,
                           t->name);
            goto fail;
        }
        json_t *shape = json_array();
        for (int d = 0; shape && d < t->ndim; d++)
            if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *entry = shape ? json_pack("{s:s, s:o, s:[I, I]}", "dtype", zs_dtype_name(t->dtype),
                                          "shape", shape, "data_offsets", (json_int_t)offset,
                                          (json_int_t)(offset + bytes[i]))
                              : NULL;
        if (!entry || json_object_set_new(root, t->name, entry) != 0) {
            res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for tensor \"%s\"", path, t->name);
            goto fail;
        }
        offset += bytes[i];
    }
    *out = root;
    return ZS_OK;
fail:
    json_decref(root);
    return res;
}

/* zs_st_header, with the data pointers checked too when need_data is set. */
static zs_err header_bytes(const char *path, const zs_st_tensor *tensors, int count,
                           const char *const *meta_kv, int n_meta, size_t align, int need_data,
                           size_t *bytes, char **header, size_t *header_len)
{
    if (count < 0 || n_meta < 0 || (count > 0 && !tensors) || (n_meta > 0 && !meta_kv))
        return zs_error(ZS_ERR_INVALID, "%s: %d tensors (%s) and %d metadata pairs (%s)", path,
                        count, tensors ? "given" : "NULL", n_meta, meta_kv ? "given" : "NULL");
    if (align == 0 || align % 8 != 0 || align > ST_MAX_ALIGN)
        return zs_error(ZS_ERR_INVALID, "%s: data alignment %zu is not a multiple of 8 up to %u",
                        path, align, ST_MAX_ALIGN);
    json_t *root = NULL;
    ZS_CHECK(build_header(path, tensors, count, meta_kv, n_meta, need_data, bytes, &root));
    zs_err res = ZS_OK;
    /* Insertion order is kept, so the tensors appear in the given order. */
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return zs_error(ZS_ERR_NOMEM, "%s: cannot encode the header", path);
    /* Spaces after the JSON make the data section start at a multiple of align bytes (8, as
     * HF writes it, unless the caller wants more). */
    size_t hlen = strlen(text);
    size_t padded = (8 + hlen + align - 1) / align * align - 8;
    char *out = malloc(8 + padded);
    if (!out) {
        res =
            zs_error(ZS_ERR_NOMEM, "%s: out of memory for a header of %zu bytes", path, 8 + padded);
        goto out_text;
    }
    for (int i = 0; i < 8; i++)
        ((unsigned char *)out)[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, text, hlen);
    memset(out + 8 + hlen, ' ', padded - hlen);
    *header = out;
    *header_len = 8 + padded;
out_text:
    free(text);
    return res;
}

zs_err zs_st_header(const char *path, const zs_st_tensor *tensors, int count,
                    const char *const *meta_kv, int n_meta, size_t align, size_t *bytes,
                    char **header, size_t *header_len)
{
    return header_bytes(path, tensors, count, meta_kv, n_meta, align, 0, bytes, header, header_len);
}

zs_err zs_st_write(const char *path, const zs_st_tensor *tensors, int count,
                   const char *const *meta_kv, int n_meta)
{
    zs_err res = ZS_OK;
    size_t *bytes = calloc(count > 0 ? (size_t)count : 1, sizeof *bytes);
    if (!bytes)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory for %d tensors", path, count);
    char *header = NULL;
    size_t header_len;
    ZS_CHECK_GOTO(
        header_bytes(path, tensors, count, meta_kv, n_meta, 8, 1, bytes, &header, &header_len), res,
        out_bytes);
    size_t tmp_len = strlen(path) + sizeof ".tmp";
    char *tmp = malloc(tmp_len);
    if (!tmp) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
        goto out_header;
    }
    snprintf(tmp, tmp_len, "%s.tmp", path);
    int fd;
    ZS_CHECK_GOTO(zs_file_create(tmp, &fd), res, out_tmp);
    ZS_CHECK_GOTO(zs_file_write_all(fd, tmp, header, header_len), res, fail_fd);
    for (int i = 0; i < count; i++)
        ZS_CHECK_GOTO(zs_file_write_all(fd, tmp, tensors[i].data, bytes[i]), res, fail_fd);
    ZS_CHECK_GOTO(zs_file_replace(fd, tmp, path), res, out_tmp);
    /* Best effort: the file is complete under its name, so a directory that cannot be synced
     * (the rename may not survive a crash) is logged, not returned. */
    if (zs_file_sync_parent(path) != ZS_OK)
        ZS_WARN("%s: cannot sync its directory: %s", path, zs_last_error());
    goto out_tmp;
fail_fd:
    close(fd);
    unlink(tmp);
out_tmp:
    free(tmp);
out_header:
    free(header);
out_bytes:
    free(bytes);
    return res;
}
