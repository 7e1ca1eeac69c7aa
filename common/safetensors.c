/*
 * safetensors: the reader validates the whole header before anything is read from the data
 * section, so a corrupt file is refused up front with a message naming the tensor and the
 * value, and no read can reach outside the file.
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

#define ST_MAX_HEADER (100u << 20) /* bytes; larger headers are not safetensors files */

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [ZS_DT_F32] = {"F32", 4}, [ZS_DT_F16] = {"F16", 2}, [ZS_DT_BF16] = {"BF16", 2},
    [ZS_DT_F64] = {"F64", 8}, [ZS_DT_I64] = {"I64", 8}, [ZS_DT_I32] = {"I32", 4},
    [ZS_DT_I16] = {"I16", 2}, [ZS_DT_I8] = {"I8", 1},   [ZS_DT_U8] = {"U8", 1},
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

/* Reads exactly n bytes at off; a short file is a format error. */
static zs_err read_full(int fd, const char *path, void *buf, size_t n, off_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return zs_error(ZS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return zs_error(ZS_ERR_FORMAT, "%s: file truncated: %zu bytes missing at offset %zu",
                            path, n - done, (size_t)off + done);
        done += (size_t)r;
    }
    return ZS_OK;
}

/* A JSON integer >= 0 that fits size_t. */
static int json_size(const json_t *v, size_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (size_t)json_integer_value(v);
    return 1;
}

static int cmp_begin(const void *a, const void *b)
{
    const zs_st_entry *x = *(const zs_st_entry *const *)a, *y = *(const zs_st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Parses one entry "name": {...} into e (its name already set). */
static zs_err parse_entry(const char *path, const char *name, json_t *v, zs_st_entry *e,
                          size_t data_len)
{
    if (!json_is_object(v))
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": entry is not an object", path, name);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": unknown field \"%s\"", path, name,
                            key);
    }
    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": dtype missing or not a string", path,
                        name);
    int d = zs_dtype_parse(json_string_value(dt));
    if (d < 0)
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", path, name,
                        json_string_value(dt));
    e->dtype = (zs_dtype)d;
    json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape))
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": shape missing or not an array", path,
                        name);
    if (json_array_size(shape) > ZS_ST_MAX_DIMS)
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": %zu dimensions, at most %d supported",
                        path, name, json_array_size(shape), ZS_ST_MAX_DIMS);
    e->ndim = (int)json_array_size(shape);
    e->numel = 1;
    for (int i = 0; i < e->ndim; i++) {
        if (!json_size(json_array_get(shape, (size_t)i), &e->shape[i]))
            return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative "
                            "integer", path, name, i);
        if (e->shape[i] && e->numel > SIZE_MAX / 16 / e->shape[i])
            return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": shape overflows", path, name);
        e->numel *= e->shape[i];
    }
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !json_size(json_array_get(off, 0), &e->begin) ||
        !json_size(json_array_get(off, 1), &e->end))
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets is not [begin, end] of "
                        "non-negative integers", path, name);
    if (e->begin > e->end || e->end > data_len)
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%zu, %zu] outside the "
                        "data section of %zu bytes", path, name, e->begin, e->end, data_len);
    size_t want = e->numel * dtypes[e->dtype].size;
    if (e->end - e->begin != want)
        return zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": %zu bytes of data, shape and dtype %s "
                        "need %zu", path, name, e->end - e->begin, dtypes[e->dtype].name, want);
    return ZS_OK;
}

static zs_err parse_header(zs_st_file *f, const char *text, size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zs_error(ZS_ERR_FORMAT, "%s: header is not valid JSON (%s at byte %d)", f->path,
                        jerr.text, jerr.position);
    zs_err res = ZS_OK;
    zs_st_entry **order = NULL;
    if (!json_is_object(root)) {
        res = zs_error(ZS_ERR_FORMAT, "%s: header is not a JSON object", f->path);
        goto out;
    }
    size_t n = json_object_size(root);
    f->entries = calloc(n ? n : 1, sizeof *f->entries);
    if (!f->entries) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for %zu entries", f->path, n);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                res = zs_error(ZS_ERR_FORMAT, "%s: __metadata__ is not an object", f->path);
                goto out;
            }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    res = zs_error(ZS_ERR_FORMAT, "%s: __metadata__ \"%s\" is not a string",
                                   f->path, mk);
                    goto out;
                }
            }
            continue;
        }
        zs_st_entry *e = &f->entries[f->count];
        if (!(e->name = strdup(key))) {
            res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", f->path);
            goto out;
        }
        f->count++;
        ZS_CHECK_GOTO(parse_entry(f->path, key, v, e, f->data_len), res, out);
    }
    /* Entries must tile the data section: sorted by offset, no overlap, no gap. */
    order = malloc((f->count ? (size_t)f->count : 1) * sizeof *order);
    if (!order) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", f->path);
        goto out;
    }
    for (int i = 0; i < f->count; i++)
        order[i] = &f->entries[i];
    qsort(order, (size_t)f->count, sizeof *order, cmp_begin);
    size_t cursor = 0;
    for (int i = 0; i < f->count; i++) {
        zs_st_entry *e = order[i];
        if (e->begin < cursor) {
            res = zs_error(ZS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%zu, %zu] overlap "
                           "tensor \"%s\" ending at %zu", f->path, e->name, e->begin, e->end,
                           order[i - 1]->name, cursor);
            goto out;
        }
        if (e->begin > cursor) {
            res = zs_error(ZS_ERR_FORMAT, "%s: data bytes [%zu, %zu) belong to no tensor",
                           f->path, cursor, e->begin);
            goto out;
        }
        cursor = e->end;
    }
    if (cursor != f->data_len)
        res = zs_error(ZS_ERR_FORMAT, "%s: data section has %zu bytes, tensors cover %zu",
                       f->path, f->data_len, cursor);
out:
    free(order);
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
        res = zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%s: %s", path,
                       strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: stat failed: %s", path, strerror(errno));
        goto fail;
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        res = zs_error(ZS_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors file", path,
                       size);
        goto fail;
    }
    uint8_t lenbuf[8];
    ZS_CHECK_GOTO(read_full(f->fd, path, lenbuf, 8, 0), res, fail);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    if (hlen > size - 8 || hlen > ST_MAX_HEADER || hlen < 2) {
        res = zs_error(ZS_ERR_FORMAT, "%s: header length %llu does not fit the file of %zu bytes",
                       path, (unsigned long long)hlen, size);
        goto fail;
    }
    if (!(header = malloc(hlen))) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for a %llu-byte header", path,
                       (unsigned long long)hlen);
        goto fail;
    }
    ZS_CHECK_GOTO(read_full(f->fd, path, header, hlen, 8), res, fail);
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
    free(f->path);
    if (f->fd >= 0)
        close(f->fd);
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

/* IEEE half to float, subnormals, infinities and NaN included. */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &u, 4);
    return out;
}

zs_err zs_st_read_f32(const zs_st_file *f, const zs_st_entry *e, float *dst, size_t numel)
{
    if (numel != e->numel)
        return zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\": %zu elements, expected %zu", f->path,
                        e->name, e->numel, numel);
    if (e->dtype != ZS_DT_F32 && e->dtype != ZS_DT_BF16 && e->dtype != ZS_DT_F16)
        return zs_error(ZS_ERR_INVALID, "%s: tensor \"%s\": dtype %s cannot be read as F32",
                        f->path, e->name, dtypes[e->dtype].name);
    off_t off = (off_t)(f->data_start + e->begin);
    if (e->dtype == ZS_DT_F32)
        return read_full(f->fd, f->path, dst, numel * 4, off);
    /* 16-bit data: read into the upper half of dst, then widen front to back; element i
     * overwrites only halves at indices <= i, which are already consumed.  Byte copies keep
     * the two views of the buffer free of aliasing questions. */
    unsigned char *bytes = (unsigned char *)dst;
    ZS_CHECK(read_full(f->fd, f->path, bytes + 2 * numel, numel * 2, off));
    for (size_t i = 0; i < numel; i++) {
        uint16_t h;
        memcpy(&h, bytes + 2 * numel + 2 * i, 2);
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

static zs_err write_all(int fd, const char *path, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return zs_error(ZS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return ZS_OK;
}

zs_err zs_st_write(const char *path, const zs_st_tensor *tensors, int count,
                   const char *const *meta_kv, int n_meta)
{
    json_t *root = json_object();
    if (!root)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
    zs_err res = ZS_OK;
    char *text = NULL;
    int fd = -1;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n_meta > 0) {
        json_t *meta = json_object();
        for (int i = 0; i < n_meta; i++)
            json_object_set_new(meta, meta_kv[2 * i], json_string(meta_kv[2 * i + 1]));
        json_object_set_new(root, "__metadata__", meta);
    }
    size_t offset = 0;
    for (int i = 0; i < count; i++) {
        const zs_st_tensor *t = &tensors[i];
        size_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            numel *= t->shape[d];
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        }
        size_t bytes = numel * zs_dtype_size(t->dtype);
        json_object_set_new(root, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", zs_dtype_name(t->dtype),
                                      "shape", shape, "data_offsets", (json_int_t)offset,
                                      (json_int_t)(offset + bytes)));
        offset += bytes;
    }
    /* JSON_PRESERVE_ORDER keeps the tensors in vector order, as readers expect. */
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        res = zs_error(ZS_ERR_NOMEM, "%s: cannot encode the header", path);
        goto out;
    }
    size_t hlen = strlen(text);
    size_t padded = (8 + hlen + 7) / 8 * 8 - 8; /* data starts 8-byte aligned, as HF writes */
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        res = zs_error(ZS_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    ZS_CHECK_GOTO(write_all(fd, tmp, lenbuf, 8), res, out);
    ZS_CHECK_GOTO(write_all(fd, tmp, text, hlen), res, out);
    ZS_CHECK_GOTO(write_all(fd, tmp, "        ", padded - hlen), res, out);
    for (int i = 0; i < count; i++) {
        size_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++)
            numel *= tensors[i].shape[d];
        ZS_CHECK_GOTO(write_all(fd, tmp, tensors[i].data, numel * zs_dtype_size(tensors[i].dtype)),
                      res, out);
    }
    if (fsync(fd) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        goto out;
    }
    if (close(fd) != 0) {
        fd = -1;
        res = zs_error(ZS_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0)
        res = zs_error(ZS_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    if (res != ZS_OK)
        unlink(tmp);
    free(text);
    json_decref(root);
    return res;
}
