/*
 * ckpt: checkpoint writers and readers (the format is described in common/ckpt.h and, for
 * people writing another reader, in docs/checkpoints.md).
 *
 * Writers put every file under "NAME.tmp", fsync it, rename it to NAME and fsync the
 * directory (zs_file_commit, common/fileio.h), so a name that exists holds a complete file; any
 * failure removes the temporary file and reports the path and the OS's reason.  The headers of
 * shard files and of the exported model.safetensors are zs_st_header's (common/safetensors.h),
 * the export's with zs_modelfile_save's tensors and metadata, so it writes that file exactly.  The
 * commit order (shard files, then the manifest, then `latest`) makes a crash at any point leave
 * either the previous checkpoint or the new one, never a half-written one that a reader would
 * accept.
 *
 * Readers trust nothing they have not checked: the manifest's own checksum and every field of
 * it before anything else; a shard file's size, structure (common/safetensors.h), metadata and
 * header checksum before its data; and each array's checksum over the whole array, streamed in
 * CKPT_CHUNK pieces, before the call that read it returns ZS_OK.
 *
 * Data is stored little-endian and copied as is, as in common/safetensors.c.
 */
#include "common/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/safetensors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt.c writes little-endian fp32 as is and needs a little-endian host"
#endif

#define CKPT_ALIGN ZS_CKPT_DATA_OFFSET /* bytes: a shard file's data section starts here */
#define CKPT_CHUNK (1u << 20)          /* bytes per read while streaming an array */
#define CKPT_MANIFEST_MAX (256u << 20) /* bytes; a larger manifest.json is refused */
#define CKPT_PATH 4096                 /* bytes for a path */
#define CKPT_MAX_LAYERS 65536          /* a manifest with more layers is refused */

static const char *const array_names[ZS_CKPT_ARRAYS] = {"param", "exp_avg", "exp_avg_sq"};

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* 16 lowercase hex digits of v into out[17]. */
static void hex64(uint64_t v, char out[17])
{
    snprintf(out, 17, "%016" PRIx64, v);
}

/* Parses exactly 16 lowercase hex digits; 0 if s is anything else. */
static int parse_hex64(const char *s, uint64_t *v)
{
    uint64_t x = 0;
    int i = 0;
    for (; s[i] && i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return 0;
        x = x << 4 | (uint64_t)d;
    }
    if (i != 16 || s[i])
        return 0;
    *v = x;
    return 1;
}

/* A file name inside a directory: not empty, no '/', not "." or "..", shorter than n. */
static int plain_name(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    return len > 0 && len < n && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* "dir/name" into out (n bytes); a path that does not fit is refused. */
static zs_err join(char *out, size_t n, const char *dir, const char *name)
{
    int w = snprintf(out, n, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= n)
        return zs_error(ZS_ERR_INVALID, "%s/%s: path longer than %zu bytes", dir, name, n - 1);
    return ZS_OK;
}

/* Parses "step-NNN" (1 to 18 digits) into *step; 0 for any other name. */
static int parse_step_name(const char *name, long *step)
{
    if (strncmp(name, "step-", 5) != 0)
        return 0;
    const char *p = name + 5;
    size_t n = strlen(p);
    if (n == 0 || n > 18)
        return 0;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10 + (p[i] - '0');
    }
    *step = v;
    return 1;
}

/* Writes buf (n bytes) to dir/name durably, through dir/name.tmp. */
static zs_err write_file_durably(const char *dir, const char *name, const void *buf, size_t n)
{
    char path[CKPT_PATH], tmp[CKPT_PATH + 8];
    ZS_CHECK(join(path, sizeof path, dir, name));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd;
    ZS_CHECK(zs_file_create(tmp, &fd));
    zs_err res = zs_file_write_all(fd, tmp, buf, n);
    if (res != ZS_OK) {
        close(fd);
        unlink(tmp);
        return res;
    }
    return zs_file_commit(fd, tmp, path);
}

/* ------------------------------------------------------------------------------------------ */
/* Step directories                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* mkdir that accepts an existing directory; *made tells whether it created one. */
static zs_err make_dir(const char *path, int *made)
{
    *made = 0;
    if (mkdir(path, 0777) == 0) {
        *made = 1;
        return ZS_OK;
    }
    if (errno != EEXIST)
        return zs_error(ZS_ERR_IO, "%s: cannot create the directory: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return zs_error(ZS_ERR_IO, "%s: exists and is not a directory", path);
    return ZS_OK;
}

zs_err zs_ckpt_step_dir(const char *dir, long step, int create, char *out, size_t n)
{
    if (!dir || !*dir || !out)
        return zs_error(ZS_ERR_INVALID, "checkpoint directory: no path given");
    if (step < 0)
        return zs_error(ZS_ERR_INVALID, "%s: step %ld is negative", dir, step);
    int w = snprintf(out, n, "%s/step-%08ld", dir, step);
    if (w < 0 || (size_t)w >= n)
        return zs_error(ZS_ERR_INVALID, "%s/step-%08ld: path longer than %zu bytes", dir, step,
                        n ? n - 1 : 0);
    if (!create)
        return ZS_OK;
    /* The checkpoint directory itself (one level) and the step directory; each new entry is
     * made durable in its parent so that a committed checkpoint's path survives a crash. */
    int made_dir, made_step;
    ZS_CHECK(make_dir(dir, &made_dir));
    ZS_CHECK(make_dir(out, &made_step));
    if (made_step)
        ZS_CHECK(zs_file_sync_dir(dir));
    return ZS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Shard files                                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * The header of a shard file (zs_st_header's bytes, data aligned to CKPT_ALIGN) into *header
 * and *header_len: the metadata that ties the file to its run, step and shard, then the three
 * arrays of len = end - begin floats, F32, in file order.
 */
static zs_err shard_header(const char *path, const zs_ckpt_info *info, int index, size_t begin,
                           size_t end, char **header, size_t *header_len)
{
    char run[17], step[24], shard[16], b[24], e[24], ver[16];
    hex64(info->run_id, run);
    snprintf(step, sizeof step, "%ld", info->step);
    snprintf(shard, sizeof shard, "%d", index);
    snprintf(b, sizeof b, "%zu", begin);
    snprintf(e, sizeof e, "%zu", end);
    snprintf(ver, sizeof ver, "%d", ZS_CKPT_FORMAT_VERSION);
    const char *const meta[] = {
        "format", "zshard-shard", "format_version", ver, "run", run, "step", step,
        "shard",  shard,          "begin",          b,   "end", e};
    zs_st_tensor ts[ZS_CKPT_ARRAYS];
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++)
        ts[a] = (zs_st_tensor){
            .name = array_names[a], .dtype = ZS_DT_F32, .ndim = 1, .shape = {end - begin}};
    size_t bytes[ZS_CKPT_ARRAYS];
    return zs_st_header(path, ts, ZS_CKPT_ARRAYS, meta, (int)(sizeof meta / sizeof meta[0] / 2),
                        CKPT_ALIGN, bytes, header, header_len);
}

/* The checksums of a shard's three arrays, computed apart from their writing. */
typedef struct {
    size_t len; /* bytes per array */
    const float *arrays[ZS_CKPT_ARRAYS];
    uint64_t xxh3[ZS_CKPT_ARRAYS];
} hash_job;

/* pthread start routine (also called directly): fills job->xxh3. */
static void *hash_arrays(void *arg)
{
    hash_job *job = arg;
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++)
        job->xxh3[a] = XXH3_64bits(job->arrays[a], job->len);
    return NULL;
}

/* The name of shard index's file in a step directory. */
static void shard_name(int index, char *out, size_t n)
{
    snprintf(out, n, "shard-%06d.safetensors", index);
}

/* The checks both shard writers make, the shard's record so far, and its file's path. */
static zs_err shard_start(const char *step_dir, const zs_ckpt_info *info, int index, size_t begin,
                          size_t end, zs_ckpt_shard *sh, char *path, size_t n)
{
    if (!step_dir || !info || !sh)
        return zs_error(ZS_ERR_INVALID, "checkpoint shard %d: NULL argument", index);
    if (index < 0 || begin >= end || end > info->total_floats)
        return zs_error(ZS_ERR_INVALID,
                        "%s: shard %d: range [%zu, %zu) is empty or outside the vector of %zu "
                        "floats",
                        step_dir, index, begin, end, info->total_floats);
    if (info->step < 0)
        return zs_error(ZS_ERR_INVALID, "%s: shard %d: step %ld is negative", step_dir, index,
                        info->step);
    if (end - begin > (size_t)INT64_MAX / 16)
        return zs_error(ZS_ERR_INVALID, "%s: shard %d: %zu floats is too many", step_dir, index,
                        end - begin);
    *sh = (zs_ckpt_shard){.index = index, .begin = begin, .end = end};
    shard_name(index, sh->file, sizeof sh->file);
    return join(path, n, step_dir, sh->file);
}

zs_err zs_ckpt_shard_path(const char *step_dir, int index, char *out, size_t n)
{
    char name[64];
    shard_name(index, name, sizeof name);
    return join(out, n, step_dir, name);
}

zs_err zs_ckpt_write_shard(const char *step_dir, const zs_ckpt_info *info, int index, size_t begin,
                           size_t end, const float *param, const float *exp_avg,
                           const float *exp_avg_sq, zs_ckpt_shard *out)
{
    if (!param || !exp_avg || !exp_avg_sq)
        return zs_error(ZS_ERR_INVALID, "%s: shard %d: an array is NULL", step_dir, index);
    zs_ckpt_shard sh;
    char path[CKPT_PATH], tmp[CKPT_PATH + 8];
    ZS_CHECK(shard_start(step_dir, info, index, begin, end, &sh, path, sizeof path));
    size_t len = end - begin;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    zs_err res = ZS_OK;
    char *header = NULL;
    size_t data_start = 0; /* 8 + H: the header's bytes, padding included */
    ZS_CHECK_GOTO(shard_header(path, info, index, begin, end, &header, &data_start), res, out_mem);
    sh.header_xxh3 = XXH3_64bits(header, data_start);

    /* O_DIRECT when every write can be page-aligned (the header is padded to 4 KiB; an array
     * of a 4 MiB shard is a whole number of pages, and the store allocates them on pages):
     * the bytes go to the disk once, not through the page cache and then to the disk, which
     * is what dd oflag=direct does.  Otherwise, or where the filesystem refuses it (tmpfs),
     * buffered writes: the same bytes. */
    int direct = data_start % CKPT_ALIGN == 0 && (len * 4) % CKPT_ALIGN == 0 &&
                 (uintptr_t)param % CKPT_ALIGN == 0 && (uintptr_t)exp_avg % CKPT_ALIGN == 0 &&
                 (uintptr_t)exp_avg_sq % CKPT_ALIGN == 0;
    int fd = -1;
    if (direct) {
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
        void *aligned = NULL;
        if (fd >= 0 && posix_memalign(&aligned, CKPT_ALIGN, data_start) == 0) {
            memcpy(aligned, header, data_start);
            free(header);
            header = aligned;
        } else if (fd >= 0) {
            close(fd);
            unlink(tmp);
            fd = -1;
        }
    }
    if (fd < 0)
        ZS_CHECK_GOTO(zs_file_create(tmp, &fd), res, out_mem);

    /* The checksums go to the manifest, not into the file, and the arrays do not change while
     * a checkpoint is written, so a thread hashes them while this one writes: the write then
     * costs what the disk takes, not that plus the hashing (about a quarter more on one
     * core).  Where no thread can be started, the hashing happens here first. */
    hash_job job = {.len = len * 4, .arrays = {param, exp_avg, exp_avg_sq}};
    pthread_t hasher;
    int threaded = pthread_create(&hasher, NULL, hash_arrays, &job) == 0;
    if (!threaded)
        hash_arrays(&job);
    res = zs_file_write_all(fd, tmp, header, data_start);
    for (int a = 0; a < ZS_CKPT_ARRAYS && res == ZS_OK; a++)
        res = zs_file_write_all(fd, tmp, job.arrays[a], len * 4);
    if (threaded)
        pthread_join(hasher, NULL);
    if (res != ZS_OK)
        goto fail_fd;
    memcpy(sh.xxh3, job.xxh3, sizeof sh.xxh3);
    ZS_CHECK_GOTO(zs_file_commit(fd, tmp, path), res, out_mem);
    sh.bytes = (uint64_t)data_start + (uint64_t)len * 12;
    *out = sh;
    goto out_mem;
fail_fd:
    close(fd);
    unlink(tmp);
out_mem:
    free(header);
    return res;
}

zs_err zs_ckpt_finish_shard(const char *step_dir, const zs_ckpt_info *info, int index, size_t begin,
                            size_t end, const float *param, const uint64_t xxh3[ZS_CKPT_ARRAYS],
                            zs_ckpt_shard *out)
{
    zs_ckpt_shard sh;
    char path[CKPT_PATH];
    ZS_CHECK(shard_start(step_dir, info, index, begin, end, &sh, path, sizeof path));
    if (!xxh3 || !out)
        return zs_error(ZS_ERR_INVALID, "%s: NULL argument", path);
    size_t len = end - begin;
    char *header = NULL;
    size_t data_start = 0;
    ZS_CHECK(shard_header(path, info, index, begin, end, &header, &data_start));
    zs_err res = ZS_OK;
    if (data_start != ZS_CKPT_DATA_OFFSET) {
        res = zs_error(ZS_ERR_INTERNAL,
                       "%s: a header of %zu bytes does not fit before the "
                       "arrays written at %d",
                       path, data_start, ZS_CKPT_DATA_OFFSET);
        goto out_mem;
    }
    sh.header_xxh3 = XXH3_64bits(header, data_start);
    memcpy(sh.xxh3, xxh3, sizeof sh.xxh3);
    sh.bytes = (uint64_t)data_start + (uint64_t)len * 12;
    /* Buffered writes: the header and the weights need not be aligned, and the fsync below
     * takes them to the disk with the arrays the tier wrote around them. */
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        res = zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%s: %s", path,
                       strerror(errno));
        goto out_mem;
    }
    res = zs_file_pwrite_all(fd, path, header, data_start, 0);
    if (res == ZS_OK && param) {
        sh.xxh3[ZS_CKPT_PARAM] = XXH3_64bits(param, len * 4);
        res = zs_file_pwrite_all(fd, path, param, len * 4, data_start);
    }
    if (res == ZS_OK && ftruncate(fd, (off_t)sh.bytes) != 0)
        res = zs_error(ZS_ERR_IO, "%s: cannot cut it to %llu bytes: %s", path,
                       (unsigned long long)sh.bytes, strerror(errno));
    if (res == ZS_OK && fsync(fd) != 0)
        res = zs_error(ZS_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
    if (res == ZS_OK)
        res = zs_file_sync_parent(path);
    if (res == ZS_OK)
        *out = sh;
out_mem:
    free(header);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* Manifest writer                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Checks what a manifest states before it is written (and, for the parts a reader cannot
 * check otherwise, after it is read): the shard list tiles [0, total) in index order. */
static zs_err check_shard_list(const char *path, const zs_ckpt_shard *shards, int n, size_t total)
{
    if (n < 1 || !shards)
        return zs_error(ZS_ERR_INVALID, "%s: %d shards, at least 1 needed", path, n);
    size_t cursor = 0;
    for (int i = 0; i < n; i++) {
        const zs_ckpt_shard *s = &shards[i];
        if (s->index != i)
            return zs_error(ZS_ERR_INVALID, "%s: shards[%d] has index %d, expected %d", path, i,
                            s->index, i);
        if (s->begin != cursor)
            return zs_error(ZS_ERR_INVALID,
                            "%s: shard %d begins at %zu, the previous one ends at %zu (%s)", path,
                            i, s->begin, cursor, s->begin > cursor ? "a gap" : "an overlap");
        if (s->end <= s->begin || s->end > total)
            return zs_error(ZS_ERR_INVALID,
                            "%s: shard %d: range [%zu, %zu) is empty or past the vector's %zu "
                            "floats",
                            path, i, s->begin, s->end, total);
        if (!plain_name(s->file, sizeof s->file))
            return zs_error(ZS_ERR_INVALID, "%s: shard %d: file \"%.64s\" is not a plain file name",
                            path, i, s->file);
        size_t len = s->end - s->begin;
        if (s->bytes < CKPT_ALIGN + (uint64_t)len * 12 ||
            (s->bytes - (uint64_t)len * 12) % CKPT_ALIGN != 0 || s->bytes > (uint64_t)INT64_MAX)
            return zs_error(ZS_ERR_INVALID,
                            "%s: shard %d: %" PRIu64 " bytes cannot hold %zu floats per array "
                            "after a %d-aligned header",
                            path, i, s->bytes, len, CKPT_ALIGN);
        cursor = s->end;
    }
    if (cursor != total)
        return zs_error(ZS_ERR_INVALID, "%s: shards end at %zu, the vector has %zu floats", path,
                        cursor, total);
    return ZS_OK;
}

/* The manifest's body: everything but the format line and the checksum. */
static json_t *manifest_body(const zs_ckpt_info *info, const zs_tensor_table *tt,
                             const zs_ckpt_shard *shards, int n)
{
    char run[17], cfp[17], dfp[17];
    hex64(info->run_id, run);
    hex64(info->config_fingerprint, cfp);
    hex64(info->data_fingerprint, dfp);
    json_t *tensors = json_array(), *list = json_array();
    for (int i = 0; tensors && i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; shape && d < t->ndim; d++)
            if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *e = shape ? json_pack("{s:s, s:I, s:o, s:i}", "name", t->name, "offset",
                                      (json_int_t)t->offset, "shape", shape, "decay", t->decay)
                          : NULL;
        if (!e || json_array_append_new(tensors, e) != 0) {
            json_decref(tensors);
            tensors = NULL;
        }
    }
    for (int i = 0; list && i < n; i++) {
        const zs_ckpt_shard *s = &shards[i];
        char h[17], x[ZS_CKPT_ARRAYS][17];
        hex64(s->header_xxh3, h);
        for (int a = 0; a < ZS_CKPT_ARRAYS; a++)
            hex64(s->xxh3[a], x[a]);
        json_t *e =
            json_pack("{s:i, s:I, s:I, s:s, s:I, s:s, s:[s, s, s]}", "index", s->index, "begin",
                      (json_int_t)s->begin, "end", (json_int_t)s->end, "file", s->file, "bytes",
                      (json_int_t)s->bytes, "header_xxh3", h, "xxh3", x[0], x[1], x[2]);
        if (!e || json_array_append_new(list, e) != 0) {
            json_decref(list);
            list = NULL;
        }
    }
    if (!tensors || !list) {
        json_decref(tensors);
        json_decref(list);
        return NULL;
    }
    const zs_model_config *m = &info->model;
    /* json_pack takes the references of "o" values, also when it fails. */
    json_t *body =
        json_pack("{s:I, s:I, s:s, s:s, s:s, s:I, s:{s:i, s:i, s:i, s:i, s:i}, s:I, s:I, s:o,"
                  " s:o}",
                  "step", (json_int_t)info->step, "steps_total", (json_int_t)info->steps_total,
                  "run_id", run, "config_fingerprint", cfp, "data_fingerprint", dfp, "data_ntokens",
                  (json_int_t)info->data_ntokens, "model", "n_layer", m->n_layer, "n_head",
                  m->n_head, "n_embd", m->n_embd, "vocab_size", m->vocab_size, "block_size",
                  m->block_size, "total_floats", (json_int_t)info->total_floats, "shard_floats",
                  (json_int_t)info->shard_floats, "tensors", tensors, "shards", list);
    if (body && info->has_scaler) {
        /* Integers and strings only (the checksum's canonical text): the scale as C's exact
         * hexadecimal ("0x1p+16"). */
        const zs_lossscale *ls = &info->scaler;
        char scale[64];
        snprintf(scale, sizeof scale, "%a", ls->scale);
        json_t *o =
            json_pack("{s:s, s:I, s:I, s:I, s:I}", "scale", scale, "hysteresis",
                      (json_int_t)ls->hysteresis, "last_overflow", (json_int_t)ls->last_overflow,
                      "iter", (json_int_t)ls->iter, "skipped", (json_int_t)ls->skipped);
        if (!o || json_object_set_new(body, "loss_scaler", o) != 0) {
            json_decref(body);
            body = NULL;
        }
    }
    return body;
}

/* XXH3-64 of the body's canonical text: compact, keys sorted.  Every value is an integer or
 * a string, so parsing and dumping again gives the same text. */
static int body_checksum(const json_t *body, uint64_t *out)
{
    char *canon = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS);
    if (!canon)
        return 0;
    *out = XXH3_64bits(canon, strlen(canon));
    free(canon);
    return 1;
}

/* Whether tt is the table zs_tensors_gpt2 builds for the same model: names, offsets, shapes,
 * decay flags and the total.  Describes the first difference in why (n bytes). */
static int same_table(const zs_tensor_table *a, const zs_tensor_table *b, char *why, size_t n)
{
    if (a->count != b->count || a->total != b->total) {
        snprintf(why, n, "%d tensors in %zu floats, the model needs %d in %zu", a->count, a->total,
                 b->count, b->total);
        return 0;
    }
    for (int i = 0; i < a->count; i++) {
        const zs_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        int same = strcmp(x->name, y->name) == 0 && x->offset == y->offset && x->ndim == y->ndim &&
                   x->decay == y->decay;
        for (int d = 0; same && d < x->ndim; d++)
            same = x->shape[d] == y->shape[d];
        if (!same) {
            snprintf(why, n, "tensor %d (\"%s\" at %zu) differs from the model's \"%s\" at %zu", i,
                     x->name, x->offset, y->name, y->offset);
            return 0;
        }
    }
    return 1;
}

zs_err zs_ckpt_write_manifest(const char *step_dir, const zs_ckpt_info *info,
                              const zs_tensor_table *tt, const zs_ckpt_shard *shards, int n)
{
    if (!step_dir || !info || !tt)
        return zs_error(ZS_ERR_INVALID, "checkpoint manifest: NULL argument");
    char path[CKPT_PATH];
    ZS_CHECK(join(path, sizeof path, step_dir, "manifest.json"));
    if (info->step < 0 || info->steps_total < 0 || info->shard_floats == 0 ||
        info->data_ntokens > (uint64_t)INT64_MAX)
        return zs_error(ZS_ERR_INVALID,
                        "%s: step %ld, steps_total %ld, shard_floats %zu, data_ntokens %" PRIu64
                        ": out of range",
                        path, info->step, info->steps_total, info->shard_floats,
                        info->data_ntokens);
    zs_tensor_table want;
    ZS_CHECK(zs_tensors_gpt2(&info->model, &want));
    char why[256];
    int same = same_table(tt, &want, why, sizeof why);
    zs_tensors_free(&want);
    if (!same)
        return zs_error(ZS_ERR_INVALID, "%s: the tensor table is not the model's: %s", path, why);
    if (info->total_floats != tt->total)
        return zs_error(ZS_ERR_INVALID, "%s: total_floats %zu, the tensor table has %zu", path,
                        info->total_floats, tt->total);
    ZS_CHECK(check_shard_list(path, shards, n, info->total_floats));

    zs_err res = ZS_OK;
    char *text = NULL;
    json_t *root = NULL, *body = manifest_body(info, tt, shards, n);
    uint64_t sum;
    if (!body || !body_checksum(body, &sum)) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory building the manifest", path);
        goto out;
    }
    char hex[17];
    hex64(sum, hex);
    root = json_pack("{s:s, s:i, s:O, s:s}", "format", "zshard-checkpoint", "format_version",
                     ZS_CKPT_FORMAT_VERSION, "body", body, "checksum", hex);
    if (!root || !(text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER))) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory encoding the manifest", path);
        goto out;
    }
    size_t len = strlen(text);
    char *full = realloc(text, len + 2);
    if (!full) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    text = full;
    text[len] = '\n';
    text[len + 1] = '\0';
    res = write_file_durably(step_dir, "manifest.json", text, len + 1);
out:
    free(text);
    json_decref(root);
    json_decref(body);
    return res;
}

zs_err zs_ckpt_set_latest(const char *dir, const char *name)
{
    if (!dir || !name)
        return zs_error(ZS_ERR_INVALID, "checkpoint latest: NULL argument");
    long step;
    if (!plain_name(name, 64) || !parse_step_name(name, &step))
        return zs_error(ZS_ERR_INVALID, "%s/latest: \"%.64s\" is not a step directory name", dir,
                        name);
    char text[80];
    int n = snprintf(text, sizeof text, "%s\n", name);
    return write_file_durably(dir, "latest", text, (size_t)n);
}

/* ------------------------------------------------------------------------------------------ */
/* Manifest reader                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Reads a whole small file (at most max bytes) into a malloc'd buffer. */
static zs_err read_file(const char *path, size_t max, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%s: cannot open: %s", path,
                        strerror(errno));
    zs_err res = ZS_OK;
    char *buf = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: stat failed: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        res = zs_error(ZS_ERR_FORMAT, "%s: not a regular file of at most %zu bytes", path, max);
        goto out;
    }
    size_t n = (size_t)st.st_size;
    if (!(buf = malloc(n + 1))) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for %zu bytes", path, n);
        goto out;
    }
    ZS_CHECK_GOTO(zs_file_read_at(fd, path, buf, n, 0), res, out);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return res;
}

/* The keys obj must have, exactly: an unknown one is refused by name (missing ones are
 * refused by the getters below). */
static zs_err check_keys(const char *path, const char *where, const json_t *obj,
                         const char *const *keys, int n)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)obj, k, v)
    {
        int known = 0;
        for (int i = 0; i < n && !known; i++)
            known = strcmp(k, keys[i]) == 0;
        if (!known)
            return zs_error(ZS_ERR_FORMAT, "%s: %sunknown key \"%.64s\"", path, where, k);
    }
    return ZS_OK;
}

/* An integer field in [lo, hi]. */
static zs_err get_int(const char *path, const char *where, const json_t *obj, const char *key,
                      long long lo, long long hi, long long *out)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        char desc[ZS_JSON_DESC];
        return zs_error(ZS_ERR_FORMAT, "%s: %s%s is %s, not an integer in [%lld, %lld]", path,
                        where, key, zs_json_desc(desc, sizeof desc, v), lo, hi);
    }
    *out = (long long)json_integer_value(v);
    return ZS_OK;
}

/* A string field. */
static zs_err get_str(const char *path, const char *where, const json_t *obj, const char *key,
                      const char **out)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) {
        char desc[ZS_JSON_DESC];
        return zs_error(ZS_ERR_FORMAT, "%s: %s%s is %s, not a string", path, where, key,
                        zs_json_desc(desc, sizeof desc, v));
    }
    *out = json_string_value(v);
    return ZS_OK;
}

/* A 16-hex-digit field. */
static zs_err get_hex(const char *path, const char *where, const json_t *v, const char *key,
                      uint64_t *out)
{
    if (!json_is_string(v) || !parse_hex64(json_string_value(v), out)) {
        char desc[ZS_JSON_DESC];
        return zs_error(ZS_ERR_FORMAT, "%s: %s%s is %s, not 16 lowercase hex digits", path, where,
                        key, zs_json_desc(desc, sizeof desc, v));
    }
    return ZS_OK;
}

/* Parses and checks the tensor list against the table built from the model. */
static zs_err parse_tensors(const char *path, const json_t *list, const zs_tensor_table *tt)
{
    if (!json_is_array(list) || json_array_size(list) != (size_t)tt->count)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: body.tensors is not an array of %d tensors (the model's)", path,
                        tt->count);
    static const char *const keys[] = {"name", "offset", "shape", "decay"};
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        const json_t *e = json_array_get(list, (size_t)i);
        char where[48];
        snprintf(where, sizeof where, "tensors[%d].", i);
        if (!json_is_object(e))
            return zs_error(ZS_ERR_FORMAT, "%s: body.tensors[%d] is not an object", path, i);
        ZS_CHECK(check_keys(path, where, e, keys, 4));
        const char *name;
        long long off, decay;
        ZS_CHECK(get_str(path, where, e, "name", &name));
        ZS_CHECK(get_int(path, where, e, "offset", 0, INT64_MAX, &off));
        ZS_CHECK(get_int(path, where, e, "decay", 0, 1, &decay));
        const json_t *shape = json_object_get(e, "shape");
        int same = strcmp(name, t->name) == 0 && (size_t)off == t->offset && decay == t->decay &&
                   json_is_array(shape) && json_array_size(shape) == (size_t)t->ndim;
        for (int d = 0; same && d < t->ndim; d++) {
            const json_t *s = json_array_get(shape, (size_t)d);
            same = json_is_integer(s) && json_integer_value(s) >= 0 &&
                   (size_t)json_integer_value(s) == t->shape[d];
        }
        if (!same)
            return zs_error(ZS_ERR_FORMAT,
                            "%s: tensors[%d] (\"%.80s\" at offset %lld) is not the model's "
                            "tensor %d (\"%s\" at offset %zu, as zs_tensors_gpt2 lays it out)",
                            path, i, name, off, i, t->name, t->offset);
    }
    return ZS_OK;
}

/* Parses and checks the shard list into ck->shards. */
static zs_err parse_shards(const char *path, const json_t *list, zs_ckpt *ck)
{
    if (!json_is_array(list) || json_array_size(list) == 0 ||
        json_array_size(list) > (size_t)ck->info.total_floats || json_array_size(list) > INT_MAX)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: body.shards is not an array of 1 to %zu shards (one per range)", path,
                        ck->info.total_floats);
    int n = (int)json_array_size(list);
    if (!(ck->shards = calloc((size_t)n, sizeof *ck->shards)))
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory for %d shards", path, n);
    ck->n_shards = n;
    static const char *const keys[] = {"index", "begin", "end",        "file",
                                       "bytes", "xxh3",  "header_xxh3"};
    for (int i = 0; i < n; i++) {
        zs_ckpt_shard *s = &ck->shards[i];
        const json_t *e = json_array_get(list, (size_t)i);
        char where[48];
        snprintf(where, sizeof where, "shards[%d].", i);
        if (!json_is_object(e))
            return zs_error(ZS_ERR_FORMAT, "%s: body.shards[%d] is not an object", path, i);
        ZS_CHECK(check_keys(path, where, e, keys, 7));
        long long index, begin, end, bytes;
        const char *file;
        ZS_CHECK(get_int(path, where, e, "index", 0, INT_MAX, &index));
        ZS_CHECK(get_int(path, where, e, "begin", 0, INT64_MAX, &begin));
        ZS_CHECK(get_int(path, where, e, "end", 0, INT64_MAX, &end));
        ZS_CHECK(get_int(path, where, e, "bytes", 0, INT64_MAX, &bytes));
        ZS_CHECK(get_str(path, where, e, "file", &file));
        if (!plain_name(file, sizeof s->file))
            return zs_error(ZS_ERR_FORMAT,
                            "%s: shards[%d].file \"%.64s\" is not a plain file name (no '/', "
                            "not \"..\", under %zu bytes)",
                            path, i, file, sizeof s->file);
        ZS_CHECK(get_hex(path, where, json_object_get(e, "header_xxh3"), "header_xxh3",
                         &s->header_xxh3));
        const json_t *x = json_object_get(e, "xxh3");
        if (!json_is_array(x) || json_array_size(x) != ZS_CKPT_ARRAYS)
            return zs_error(ZS_ERR_FORMAT, "%s: shards[%d].xxh3 is not an array of %d checksums",
                            path, i, ZS_CKPT_ARRAYS);
        for (int a = 0; a < ZS_CKPT_ARRAYS; a++) {
            char key[32];
            snprintf(key, sizeof key, "xxh3[%d]", a);
            ZS_CHECK(get_hex(path, where, json_array_get(x, (size_t)a), key, &s->xxh3[a]));
        }
        s->index = (int)index;
        s->begin = (size_t)begin;
        s->end = (size_t)end;
        s->bytes = (uint64_t)bytes;
        snprintf(s->file, sizeof s->file, "%s", file);
    }
    /* Order, tiling and sizes: the writer's own rules, refused as a corrupt file here. */
    return check_shard_list(path, ck->shards, n, ck->info.total_floats) == ZS_OK ? ZS_OK
                                                                                 : ZS_ERR_FORMAT;
}

/* The optional "loss_scaler" of an fp16 job (absent: in->has_scaler stays 0); its values are
 * checked against the job's fp16 block by the coordinator (zs_lossscale_check). */
static zs_err parse_scaler(const char *path, const json_t *o, zs_ckpt_info *in)
{
    in->has_scaler = 0;
    if (!o)
        return ZS_OK;
    if (!json_is_object(o))
        return zs_error(ZS_ERR_FORMAT, "%s: body.loss_scaler is not an object", path);
    static const char *const keys[] = {"scale", "hysteresis", "last_overflow", "iter", "skipped"};
    ZS_CHECK(check_keys(path, "loss_scaler.", o, keys, 5));
    const char *scale = json_string_value(json_object_get(o, "scale"));
    char *end = NULL;
    double x = scale ? strtod(scale, &end) : 0;
    if (!scale || end == scale || *end || !(x > 0) || !isfinite(x))
        return zs_error(ZS_ERR_FORMAT, "%s: loss_scaler.scale is \"%.40s\", not a positive number",
                        path, scale ? scale : "(not a string)");
    long long h, last, iter, skipped;
    ZS_CHECK(get_int(path, "loss_scaler.", o, "hysteresis", 1, INT_MAX, &h));
    ZS_CHECK(get_int(path, "loss_scaler.", o, "last_overflow", -1, LONG_MAX, &last));
    ZS_CHECK(get_int(path, "loss_scaler.", o, "iter", 0, LONG_MAX, &iter));
    ZS_CHECK(get_int(path, "loss_scaler.", o, "skipped", 0, LONG_MAX, &skipped));
    in->scaler = (zs_lossscale){.scale = x,
                                .hysteresis = (int)h,
                                .last_overflow = (long)last,
                                .iter = (long)iter,
                                .skipped = (long)skipped};
    in->has_scaler = 1;
    return ZS_OK;
}

/* Parses and checks the body into ck (shards and table allocated on success or failure: the
 * caller closes ck on failure). */
static zs_err parse_body(const char *path, const json_t *body, zs_ckpt *ck)
{
    static const char *const keys[] = {
        "step",         "steps_total", "run_id",       "config_fingerprint", "data_fingerprint",
        "data_ntokens", "model",       "total_floats", "shard_floats",       "tensors",
        "shards",       "loss_scaler"};
    ZS_CHECK(check_keys(path, "body.", body, keys, 12));
    zs_ckpt_info *in = &ck->info;
    long long v;
    ZS_CHECK(get_int(path, "body.", body, "step", 0, LONG_MAX, &v));
    in->step = (long)v;
    ZS_CHECK(get_int(path, "body.", body, "steps_total", 0, LONG_MAX, &v));
    in->steps_total = (long)v;
    ZS_CHECK(get_hex(path, "body.", json_object_get(body, "run_id"), "run_id", &in->run_id));
    ZS_CHECK(get_hex(path, "body.", json_object_get(body, "config_fingerprint"),
                     "config_fingerprint", &in->config_fingerprint));
    ZS_CHECK(get_hex(path, "body.", json_object_get(body, "data_fingerprint"), "data_fingerprint",
                     &in->data_fingerprint));
    ZS_CHECK(get_int(path, "body.", body, "data_ntokens", 0, INT64_MAX, &v));
    in->data_ntokens = (uint64_t)v;
    ZS_CHECK(get_int(path, "body.", body, "total_floats", 1, INT64_MAX, &v));
    in->total_floats = (size_t)v;
    ZS_CHECK(get_int(path, "body.", body, "shard_floats", 1, INT64_MAX, &v));
    in->shard_floats = (size_t)v;

    ZS_CHECK(parse_scaler(path, json_object_get(body, "loss_scaler"), in));

    const json_t *m = json_object_get(body, "model");
    if (!json_is_object(m))
        return zs_error(ZS_ERR_FORMAT, "%s: body.model is not an object", path);
    static const char *const mkeys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"};
    ZS_CHECK(check_keys(path, "model.", m, mkeys, 5));
    int *fields[] = {&in->model.n_layer, &in->model.n_head, &in->model.n_embd,
                     &in->model.vocab_size, &in->model.block_size};
    for (int i = 0; i < 5; i++) {
        ZS_CHECK(get_int(path, "model.", m, mkeys[i], 1, i == 0 ? CKPT_MAX_LAYERS : INT_MAX, &v));
        *fields[i] = (int)v;
    }
    /* The table's size is bounded by the manifest's own tensor list before it is built. */
    const json_t *tensors = json_object_get(body, "tensors");
    if (!json_is_array(tensors) ||
        json_array_size(tensors) != (size_t)(4 + ZS_BLOCK_TENSORS * in->model.n_layer))
        return zs_error(ZS_ERR_FORMAT,
                        "%s: body.tensors is not an array of %d tensors (n_layer %d)", path,
                        4 + ZS_BLOCK_TENSORS * in->model.n_layer, in->model.n_layer);
    if (zs_tensors_gpt2(&in->model, &ck->tt) != ZS_OK)
        return zs_error_context(ZS_ERR_FORMAT, "%s: body.model", path);
    ZS_CHECK(parse_tensors(path, tensors, &ck->tt));
    if (in->total_floats != ck->tt.total)
        return zs_error(ZS_ERR_FORMAT, "%s: total_floats %zu, the model's vector has %zu", path,
                        in->total_floats, ck->tt.total);
    return parse_shards(path, json_object_get(body, "shards"), ck);
}

zs_err zs_ckpt_open(const char *step_dir, zs_ckpt *ck)
{
    memset(ck, 0, sizeof *ck);
    char path[CKPT_PATH];
    if (!step_dir || strlen(step_dir) >= sizeof ck->step_dir)
        return zs_error(ZS_ERR_INVALID, "checkpoint: step directory path missing or too long");
    ZS_CHECK(join(path, sizeof path, step_dir, "manifest.json"));
    snprintf(ck->step_dir, sizeof ck->step_dir, "%s", step_dir);

    char *text = NULL;
    size_t len = 0;
    zs_err res = read_file(path, CKPT_MANIFEST_MAX, &text, &len);
    if (res != ZS_OK)
        goto fail;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        res = zs_error(ZS_ERR_FORMAT, "%s: not valid JSON: %s at line %d column %d", path,
                       jerr.text, jerr.line, jerr.column);
        goto fail;
    }
    static const char *const keys[] = {"format", "format_version", "body", "checksum"};
    const char *format;
    long long version;
    uint64_t want, got;
    if (!json_is_object(root)) {
        res = zs_error(ZS_ERR_FORMAT, "%s: not a JSON object", path);
        goto fail_root;
    }
    ZS_CHECK_GOTO(get_str(path, "", root, "format", &format), res, fail_root);
    if (strcmp(format, "zshard-checkpoint") != 0) {
        res = zs_error(ZS_ERR_FORMAT, "%s: format is \"%.64s\", not \"zshard-checkpoint\"", path,
                       format);
        goto fail_root;
    }
    ZS_CHECK_GOTO(get_int(path, "", root, "format_version", 0, INT_MAX, &version), res, fail_root);
    if (version != ZS_CKPT_FORMAT_VERSION) {
        res = zs_error(ZS_ERR_FORMAT, "%s: format_version %lld, this zshard reads version %d", path,
                       version, ZS_CKPT_FORMAT_VERSION);
        goto fail_root;
    }
    ZS_CHECK_GOTO(check_keys(path, "", root, keys, 4), res, fail_root);
    ZS_CHECK_GOTO(get_hex(path, "", json_object_get(root, "checksum"), "checksum", &want), res,
                  fail_root);
    const json_t *body = json_object_get(root, "body");
    if (!json_is_object(body)) {
        res = zs_error(ZS_ERR_FORMAT, "%s: body is not an object", path);
        goto fail_root;
    }
    if (!body_checksum(body, &got)) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
        goto fail_root;
    }
    if (got != want) {
        res = zs_error(ZS_ERR_FORMAT,
                       "%s: checksum mismatch: the body hashes to %016" PRIx64
                       ", the manifest says %016" PRIx64 " (corrupt)",
                       path, got, want);
        goto fail_root;
    }
    ZS_CHECK_GOTO(parse_body(path, body, ck), res, fail_root);
    json_decref(root);
    return ZS_OK;
fail_root:
    json_decref(root);
fail:
    zs_ckpt_close(ck);
    return res;
}

void zs_ckpt_close(zs_ckpt *ck)
{
    free(ck->shards);
    zs_tensors_free(&ck->tt);
    memset(ck, 0, sizeof *ck);
}

/* ------------------------------------------------------------------------------------------ */
/* Shard file reader                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* One shard file, opened and checked against its manifest entry. */
typedef struct {
    const zs_ckpt_shard *sh;
    char path[CKPT_PATH];
    zs_st_file st;
    size_t len; /* floats per array */
} shard_file;

/* Checks the shard file's __metadata__ against what the manifest says it must be. */
static zs_err check_shard_meta(const shard_file *sf, const zs_ckpt *ck, const char *header,
                               size_t hlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(header, hlen, 0, &jerr);
    if (!root)
        return zs_error(ZS_ERR_FORMAT, "%s: header is not valid JSON: %s", sf->path, jerr.text);
    zs_err res = ZS_OK;
    const json_t *meta = json_object_get(root, "__metadata__");
    const zs_ckpt_shard *sh = sf->sh;
    char want[6][24];
    snprintf(want[0], sizeof want[0], "%d", ZS_CKPT_FORMAT_VERSION);
    hex64(ck->info.run_id, want[1]);
    snprintf(want[2], sizeof want[2], "%ld", ck->info.step);
    snprintf(want[3], sizeof want[3], "%d", sh->index);
    snprintf(want[4], sizeof want[4], "%zu", sh->begin);
    snprintf(want[5], sizeof want[5], "%zu", sh->end);
    static const char *const keys[] = {"format_version", "run", "step", "shard", "begin", "end"};
    static const char *const what[] = {"",
                                       " (a file of another run)",
                                       " (a file of another checkpoint)",
                                       " (a file of another shard)",
                                       "",
                                       ""};
    const json_t *f = json_object_get(meta, "format");
    if (!json_is_string(f) || strcmp(json_string_value(f), "zshard-shard") != 0) {
        res = zs_error(ZS_ERR_FORMAT, "%s: __metadata__.format is not \"zshard-shard\"", sf->path);
        goto out;
    }
    for (int i = 0; i < 6; i++) {
        const json_t *v = json_object_get(meta, keys[i]);
        if (!json_is_string(v) || strcmp(json_string_value(v), want[i]) != 0) {
            char desc[ZS_JSON_DESC];
            res = zs_error(ZS_ERR_FORMAT, "%s: __metadata__.%s is %s, the manifest needs \"%s\"%s",
                           sf->path, keys[i], zs_json_desc(desc, sizeof desc, v), want[i], what[i]);
            goto out;
        }
    }
out:
    json_decref(root);
    return res;
}

static void shard_close(shard_file *sf)
{
    zs_st_close(&sf->st);
}

/* Opens shard i and checks everything but the data: size, structure, metadata, header
 * checksum and the three arrays' places.  On failure nothing stays open. */
static zs_err shard_open(const zs_ckpt *ck, int i, shard_file *sf)
{
    memset(sf, 0, sizeof *sf);
    sf->st.fd = -1;
    sf->sh = &ck->shards[i];
    sf->len = sf->sh->end - sf->sh->begin;
    ZS_CHECK(join(sf->path, sizeof sf->path, ck->step_dir, sf->sh->file));
    struct stat st;
    if (stat(sf->path, &st) != 0)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO,
                        "%s: shard %d of the checkpoint at step %ld: %s", sf->path, i,
                        ck->info.step, strerror(errno));
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != sf->sh->bytes)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: %lld bytes, the manifest says %" PRIu64 " (truncated or replaced)",
                        sf->path, (long long)st.st_size, sf->sh->bytes);
    ZS_CHECK(zs_st_open(sf->path, &sf->st));
    zs_err res = ZS_OK;
    char *header = NULL;
    if (fstat(sf->st.fd, &st) != 0 || (uint64_t)st.st_size != sf->sh->bytes) {
        res = zs_error(ZS_ERR_FORMAT, "%s: changed size while being opened", sf->path);
        goto fail;
    }
    size_t hbytes = sf->st.data_start;
    if (!(header = malloc(hbytes))) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for a %zu-byte header", sf->path, hbytes);
        goto fail;
    }
    ZS_CHECK_GOTO(zs_file_read_at(sf->st.fd, sf->path, header, hbytes, 0), res, fail);
    /* The metadata first, for the clearer message (a file of another run, step or shard); the
     * checksum then covers every byte of the header, padding included. */
    ZS_CHECK_GOTO(check_shard_meta(sf, ck, header + 8, hbytes - 8), res, fail);
    uint64_t sum = XXH3_64bits(header, hbytes);
    if (sum != sf->sh->header_xxh3) {
        res = zs_error(ZS_ERR_FORMAT,
                       "%s: header checksum %016" PRIx64 ", the manifest says %016" PRIx64
                       " (corrupt)",
                       sf->path, sum, sf->sh->header_xxh3);
        goto fail;
    }
    if (sf->st.count != ZS_CKPT_ARRAYS) {
        res = zs_error(ZS_ERR_FORMAT, "%s: %d tensors, a shard file has %d", sf->path, sf->st.count,
                       ZS_CKPT_ARRAYS);
        goto fail;
    }
    for (int a = 0; a < ZS_CKPT_ARRAYS; a++) {
        const zs_st_entry *e = zs_st_find(&sf->st, array_names[a]);
        if (!e || e->dtype != ZS_DT_F32 || e->ndim != 1 || e->shape[0] != sf->len ||
            e->begin != (size_t)a * sf->len * 4) {
            res = zs_error(ZS_ERR_FORMAT,
                           "%s: tensor \"%s\" is missing or not F32 [%zu] at data offset %zu",
                           sf->path, array_names[a], sf->len, (size_t)a * sf->len * 4);
            goto fail;
        }
    }
    free(header);
    return ZS_OK;
fail:
    free(header);
    shard_close(sf);
    return res;
}

/* Receives the floats [vbegin, vbegin + n) of the flat vector, not yet verified. */
typedef zs_err (*chunk_fn)(void *ctx, size_t vbegin, const float *x, size_t n);

/*
 * Streams one array of an open shard file through fn (may be NULL) in CKPT_CHUNK pieces
 * (buf holds CKPT_CHUNK bytes), hashing it on the way; ZS_OK only if the checksum matches the
 * manifest, so what fn received is trustworthy exactly when this returns ZS_OK.
 */
static zs_err shard_stream(const shard_file *sf, zs_ckpt_array which, float *buf, chunk_fn fn,
                           void *ctx)
{
    XXH3_state_t *xs = XXH3_createState();
    if (!xs)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory", sf->path);
    XXH3_64bits_reset(xs);
    zs_err res = ZS_OK;
    size_t bytes = sf->len * 4, done = 0;
    uint64_t off = (uint64_t)sf->st.data_start + (uint64_t)which * bytes;
    while (done < bytes) {
        size_t n = bytes - done < CKPT_CHUNK ? bytes - done : CKPT_CHUNK;
        ZS_CHECK_GOTO(zs_file_read_at(sf->st.fd, sf->path, buf, n, off + done), res, out);
        XXH3_64bits_update(xs, buf, n);
        if (fn)
            ZS_CHECK_GOTO(fn(ctx, sf->sh->begin + done / 4, buf, n / 4), res, out);
        done += n;
    }
    uint64_t sum = XXH3_64bits_digest(xs);
    if (sum != sf->sh->xxh3[which])
        res = zs_error(ZS_ERR_FORMAT,
                       "%s: %s data checksum %016" PRIx64 ", the manifest says %016" PRIx64
                       " (corrupt)",
                       sf->path, array_names[which], sum, sf->sh->xxh3[which]);
out:
    XXH3_freeState(xs);
    return res;
}

zs_err zs_ckpt_verify(const zs_ckpt *ck)
{
    float *buf = malloc(CKPT_CHUNK);
    if (!buf)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory", ck->step_dir);
    zs_err res = ZS_OK;
    for (int i = 0; i < ck->n_shards && res == ZS_OK; i++) {
        shard_file sf;
        if ((res = shard_open(ck, i, &sf)) != ZS_OK)
            break;
        for (int a = 0; a < ZS_CKPT_ARRAYS && res == ZS_OK; a++)
            res = shard_stream(&sf, (zs_ckpt_array)a, buf, NULL, NULL);
        shard_close(&sf);
    }
    free(buf);
    return res;
}

zs_err zs_ckpt_check_compatible(const zs_ckpt *ck, const zs_ckpt_info *info)
{
    char path[CKPT_PATH + 16];
    snprintf(path, sizeof path, "%s/manifest.json", ck->step_dir);
    const zs_ckpt_info *c = &ck->info;
    if (c->config_fingerprint != info->config_fingerprint)
        return zs_error(ZS_ERR_INVALID,
                        "%s: config_fingerprint %016" PRIx64 ", this run's is %016" PRIx64
                        " (the configuration changed in a way that changes the trained bits)",
                        path, c->config_fingerprint, info->config_fingerprint);
    if (c->data_fingerprint != info->data_fingerprint)
        return zs_error(ZS_ERR_INVALID,
                        "%s: data_fingerprint %016" PRIx64 ", this run's is %016" PRIx64
                        " (other training data)",
                        path, c->data_fingerprint, info->data_fingerprint);
    const zs_model_config *a = &c->model, *b = &info->model;
    if (a->n_layer != b->n_layer || a->n_head != b->n_head || a->n_embd != b->n_embd ||
        a->vocab_size != b->vocab_size || a->block_size != b->block_size)
        return zs_error(ZS_ERR_INVALID,
                        "%s: model n_layer %d n_head %d n_embd %d vocab_size %d block_size %d, "
                        "this run's is %d %d %d %d %d",
                        path, a->n_layer, a->n_head, a->n_embd, a->vocab_size, a->block_size,
                        b->n_layer, b->n_head, b->n_embd, b->vocab_size, b->block_size);
    if (c->total_floats != info->total_floats)
        return zs_error(ZS_ERR_INVALID, "%s: total_floats %zu, this run's vector has %zu", path,
                        c->total_floats, info->total_floats);
    if (c->step >= info->steps_total)
        return zs_error(ZS_ERR_INVALID,
                        "%s: step %ld is not before this run's steps_total %ld: nothing left to "
                        "train",
                        path, c->step, info->steps_total);
    return ZS_OK;
}

/* zs_ckpt_read's destination: the requested range and where it goes. */
typedef struct {
    float *dst;
    size_t begin, end;
} read_ctx;

static zs_err copy_chunk(void *ctx, size_t vbegin, const float *x, size_t n)
{
    read_ctx *r = ctx;
    size_t b = vbegin > r->begin ? vbegin : r->begin;
    size_t e = vbegin + n < r->end ? vbegin + n : r->end;
    if (b < e)
        memcpy(r->dst + (b - r->begin), x + (b - vbegin), (e - b) * sizeof *x);
    return ZS_OK;
}

/* The shard holding element x (x < total): binary search over the tiling. */
static int shard_of(const zs_ckpt *ck, size_t x)
{
    int lo = 0, hi = ck->n_shards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (ck->shards[mid].begin <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

zs_err zs_ckpt_read(const zs_ckpt *ck, zs_ckpt_array which, size_t begin, size_t end, float *dst)
{
    if ((int)which < 0 || (int)which >= ZS_CKPT_ARRAYS)
        return zs_error(ZS_ERR_INVALID, "%s: array %d does not exist", ck->step_dir, (int)which);
    if (begin > end || end > ck->info.total_floats || (end > begin && !dst))
        return zs_error(ZS_ERR_INVALID, "%s: read of [%zu, %zu) outside the vector of %zu floats",
                        ck->step_dir, begin, end, ck->info.total_floats);
    if (begin == end)
        return ZS_OK;
    float *buf = malloc(CKPT_CHUNK);
    if (!buf)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory", ck->step_dir);
    read_ctx r = {.dst = dst, .begin = begin, .end = end};
    zs_err res = ZS_OK;
    for (int i = shard_of(ck, begin); i < ck->n_shards && ck->shards[i].begin < end; i++) {
        shard_file sf;
        ZS_CHECK_GOTO(shard_open(ck, i, &sf), res, out);
        res = shard_stream(&sf, which, buf, copy_chunk, &r);
        shard_close(&sf);
        if (res != ZS_OK)
            break;
    }
out:
    free(buf);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* Export                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * The header of model.safetensors as zs_modelfile_save writes it: zs_st_header of the same
 * tensors (the table's, F32, in table order) and the same metadata (zs_st_model_meta), so the
 * exported file equals zs_modelfile_save's by construction (the unit test compares them byte
 * for byte).  *header and *header_len as zs_st_header; out_off[i] gets tensor i's byte offset
 * in the data section.
 */
static zs_err export_header(const zs_tensor_table *tt, const char *path, uint64_t *out_off,
                            char **header, size_t *header_len)
{
    zs_err res = ZS_OK;
    zs_st_tensor *ts = calloc(tt->count > 0 ? (size_t)tt->count : 1, sizeof *ts);
    size_t *bytes = calloc(tt->count > 0 ? (size_t)tt->count : 1, sizeof *bytes);
    if (!ts || !bytes) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < tt->count; i++) {
        const zs_tensor *t = &tt->tensors[i];
        ts[i] = (zs_st_tensor){.name = t->name, .dtype = ZS_DT_F32, .ndim = t->ndim};
        memcpy(ts[i].shape, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
    }
    ZS_CHECK_GOTO(zs_st_header(path, ts, tt->count, zs_st_model_meta, ZS_ST_MODEL_N_META, 8, bytes,
                               header, header_len),
                  res, out);
    uint64_t off = 0;
    for (int i = 0; i < tt->count; i++) {
        out_off[i] = off;
        off += bytes[i];
    }
out:
    free(bytes);
    free(ts);
    return res;
}

/* Where the weights go: the output file and each tensor's place in it. */
typedef struct {
    int fd;
    const char *tmp;
    const zs_tensor_table *tt;
    const uint64_t *out_off; /* bytes from the data section's start, per tensor */
    uint64_t data_start;
    int cursor; /* first tensor that may still overlap what comes next */
} export_ctx;

/* Writes the parts of [vbegin, vbegin + n) that belong to tensors at their output places;
 * chunks arrive in vector order, so the cursor only moves forward. */
static zs_err export_chunk(void *ctx, size_t vbegin, const float *x, size_t n)
{
    export_ctx *e = ctx;
    size_t vend = vbegin + n;
    const zs_tensor *ts = e->tt->tensors;
    while (e->cursor < e->tt->count && ts[e->cursor].offset + ts[e->cursor].numel <= vbegin)
        e->cursor++;
    for (int i = e->cursor; i < e->tt->count && ts[i].offset < vend; i++) {
        size_t b = ts[i].offset > vbegin ? ts[i].offset : vbegin;
        size_t end = ts[i].offset + ts[i].numel < vend ? ts[i].offset + ts[i].numel : vend;
        if (b >= end)
            continue;
        uint64_t at = e->data_start + e->out_off[i] + (uint64_t)(b - ts[i].offset) * 4;
        ZS_CHECK(zs_file_pwrite_all(e->fd, e->tmp, x + (b - vbegin), (end - b) * 4, at));
    }
    return ZS_OK;
}

zs_err zs_ckpt_export(const zs_ckpt *ck, const char *out_dir,
                      void (*progress)(void *user, uint64_t done, uint64_t total), void *user)
{
    if (!ck || !out_dir || !*out_dir)
        return zs_error(ZS_ERR_INVALID, "export: no checkpoint or output directory");
    const zs_tensor_table *tt = &ck->tt;
    char path[CKPT_PATH], tmp[CKPT_PATH + 8];
    ZS_CHECK(join(path, sizeof path, out_dir, "model.safetensors"));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int made;
    ZS_CHECK(make_dir(out_dir, &made));

    zs_err res = ZS_OK;
    char *header = NULL;
    size_t header_len = 0;
    float *buf = malloc(CKPT_CHUNK);
    uint64_t *out_off = malloc((size_t)tt->count * sizeof *out_off);
    if (!buf || !out_off) {
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
        goto out_mem;
    }
    ZS_CHECK_GOTO(export_header(tt, path, out_off, &header, &header_len), res, out_mem);
    int fd;
    ZS_CHECK_GOTO(zs_file_create(tmp, &fd), res, out_mem);
    ZS_CHECK_GOTO(zs_file_write_all(fd, tmp, header, header_len), res, fail_fd);
    export_ctx e = {.fd = fd, .tmp = tmp, .tt = tt, .out_off = out_off, .data_start = header_len};
    uint64_t total = (uint64_t)ck->info.total_floats * 4;
    for (int i = 0; i < ck->n_shards; i++) {
        shard_file sf;
        ZS_CHECK_GOTO(shard_open(ck, i, &sf), res, fail_fd);
        res = shard_stream(&sf, ZS_CKPT_PARAM, buf, export_chunk, &e);
        shard_close(&sf);
        if (res != ZS_OK)
            goto fail_fd;
        if (progress)
            progress(user, (uint64_t)ck->shards[i].end * 4, total);
    }
    /* Every byte of the data section belongs to exactly one tensor and every tensor lies in
     * the shards' tiling, so the file now has its full size; check rather than assume. */
    struct stat st;
    uint64_t want = (uint64_t)header_len + (uint64_t)tt->n_params * 4;
    if (fstat(fd, &st) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: stat failed: %s", tmp, strerror(errno));
        goto fail_fd;
    }
    if ((uint64_t)st.st_size != want) {
        res = zs_error(ZS_ERR_INTERNAL, "%s: %lld bytes written, expected %" PRIu64, tmp,
                       (long long)st.st_size, want);
        goto fail_fd;
    }
    ZS_CHECK_GOTO(zs_file_commit(fd, tmp, path), res, out_mem);
    ZS_CHECK_GOTO(join(path, sizeof path, out_dir, "config.json"), res, out_mem);
    res = zs_config_write_hf(&ck->info.model, path);
    goto out_mem;
fail_fd:
    close(fd);
    unlink(tmp);
out_mem:
    free(header);
    free(out_off);
    free(buf);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* Resolve and prune                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    long step;
    char name[64];
} step_entry;

static int cmp_step_desc(const void *a, const void *b)
{
    const step_entry *x = a, *y = b;
    return (x->step < y->step) - (x->step > y->step);
}

/* The step directories of dir (names "step-N"), newest first, malloc'd into *out. */
static zs_err list_steps(const char *dir, step_entry **out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%s: cannot list: %s", dir,
                        strerror(errno));
    zs_err res = ZS_OK;
    step_entry *list = NULL;
    int count = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long step;
        if (!parse_step_name(de->d_name, &step) || strlen(de->d_name) >= sizeof list->name)
            continue;
        char path[CKPT_PATH];
        struct stat st;
        if (join(path, sizeof path, dir, de->d_name) != ZS_OK || stat(path, &st) != 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        if (count == cap) {
            int ncap = cap ? 2 * cap : 16;
            step_entry *grown = realloc(list, (size_t)ncap * sizeof *list);
            if (!grown) {
                res = zs_error(ZS_ERR_NOMEM, "%s: out of memory listing step directories", dir);
                free(list);
                list = NULL;
                count = 0;
                goto out;
            }
            list = grown;
            cap = ncap;
        }
        list[count].step = step;
        memcpy(list[count].name, de->d_name, strlen(de->d_name) + 1); /* fits: checked above */
        count++;
    }
    if (count)
        qsort(list, (size_t)count, sizeof *list, cmp_step_desc);
    *out = list;
    *n = count;
out:
    closedir(d);
    return res;
}

/* Opens and fully verifies step_dir; on failure ck is closed and the message says why. */
static zs_err try_checkpoint(const char *step_dir, zs_ckpt *ck)
{
    ZS_CHECK(zs_ckpt_open(step_dir, ck));
    zs_err res = zs_ckpt_verify(ck);
    if (res != ZS_OK)
        zs_ckpt_close(ck);
    return res;
}

/* Reads DIR/latest into name (n bytes): the name must be a step directory's. */
static zs_err read_latest(const char *path, char *name, size_t n)
{
    char *text = NULL;
    size_t len = 0;
    ZS_CHECK(read_file(path, 256, &text, &len));
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        text[--len] = '\0';
    long step;
    zs_err res = ZS_OK;
    if (!plain_name(text, n) || !parse_step_name(text, &step))
        res = zs_error(ZS_ERR_FORMAT, "%s: \"%.64s\" does not name a step directory", path, text);
    else
        snprintf(name, n, "%s", text);
    free(text);
    return res;
}

zs_err zs_ckpt_present(const char *path, int *any)
{
    *any = 0;
    if (!path || !*path)
        return zs_error(ZS_ERR_INVALID, "checkpoint: no path given");
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return ZS_OK;
        return zs_error(ZS_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return zs_error(ZS_ERR_INVALID,
                        "%s: not a directory (a step directory or a checkpoint directory)", path);
    char file[CKPT_PATH];
    const char *names[] = {"manifest.json", "latest"};
    for (int i = 0; i < 2; i++) {
        ZS_CHECK(join(file, sizeof file, path, names[i]));
        if (access(file, F_OK) == 0) {
            *any = 1;
            return ZS_OK;
        }
    }
    step_entry *steps;
    int n;
    ZS_CHECK(list_steps(path, &steps, &n));
    free(steps);
    *any = n > 0;
    return ZS_OK;
}

zs_err zs_ckpt_resolve(const char *path, zs_ckpt *ck)
{
    memset(ck, 0, sizeof *ck);
    if (!path || !*path)
        return zs_error(ZS_ERR_INVALID, "checkpoint: no path given");
    char file[CKPT_PATH];
    struct stat st;
    if (stat(path, &st) != 0)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "%s: %s", path,
                        strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return zs_error(ZS_ERR_INVALID,
                        "%s: not a directory (a step directory or a checkpoint "
                        "directory)",
                        path);
    ZS_CHECK(join(file, sizeof file, path, "manifest.json"));
    if (access(file, F_OK) == 0)
        return try_checkpoint(path, ck); /* a step directory: that one or nothing */

    /* A checkpoint directory: `latest` first, then the step directories newest first. */
    char newest_why[2048] = "", latest_name[64] = "", latest_path[CKPT_PATH], dir[CKPT_PATH];
    long latest_step = -1;
    ZS_CHECK(join(latest_path, sizeof latest_path, path, "latest"));
    zs_err res = read_latest(latest_path, latest_name, sizeof latest_name);
    if (res == ZS_OK) {
        parse_step_name(latest_name, &latest_step);
        ZS_CHECK(join(dir, sizeof dir, path, latest_name));
        res = try_checkpoint(dir, ck);
        if (res == ZS_OK)
            return ZS_OK;
        snprintf(newest_why, sizeof newest_why, "%.900s names %.63s: %.1000s", latest_path,
                 latest_name, zs_last_error());
        ZS_WARN("checkpoint: %s; trying older checkpoints", newest_why);
    } else if (res != ZS_ERR_NOTFOUND) {
        snprintf(newest_why, sizeof newest_why, "%s", zs_last_error());
        ZS_WARN("checkpoint: %s; trying the step directories", newest_why);
    }
    step_entry *steps;
    int n;
    ZS_CHECK(list_steps(path, &steps, &n));
    for (int i = 0; i < n; i++) {
        /* With a readable `latest`, only what it superseded: newer directories were never
         * committed, and the one it names was just tried. */
        if (latest_step >= 0 && steps[i].step >= latest_step)
            continue;
        if (join(dir, sizeof dir, path, steps[i].name) != ZS_OK)
            continue;
        if (try_checkpoint(dir, ck) == ZS_OK) {
            if (newest_why[0])
                ZS_WARN("checkpoint: resuming from %s, the newest valid checkpoint", dir);
            free(steps);
            return ZS_OK;
        }
        if (!newest_why[0])
            snprintf(newest_why, sizeof newest_why, "%s", zs_last_error());
        ZS_WARN("checkpoint: %s; trying older checkpoints", zs_last_error());
    }
    free(steps);
    if (!newest_why[0])
        return zs_error(ZS_ERR_NOTFOUND, "%s: no checkpoint (no latest and no step-* directories)",
                        path);
    return zs_error(ZS_ERR_NOTFOUND, "%s: no valid checkpoint; the newest failed: %s", path,
                    newest_why);
}

/* Removes a step directory and the files in it (it holds no subdirectories); logs failures. */
static void remove_step_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        ZS_WARN("checkpoint prune: cannot list %s: %s", path, strerror(errno));
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), de->d_name, 0) != 0)
            ZS_WARN("checkpoint prune: cannot remove %s/%s: %s", path, de->d_name, strerror(errno));
    }
    closedir(d);
    if (rmdir(path) != 0)
        ZS_WARN("checkpoint prune: cannot remove %s: %s", path, strerror(errno));
    else
        ZS_INFO("checkpoint prune: removed %s", path);
}

/* Whether step_dir holds a manifest that parses and checks (the shard files are not read). */
static int manifest_valid(const char *step_dir)
{
    zs_ckpt ck;
    if (zs_ckpt_open(step_dir, &ck) != ZS_OK)
        return 0;
    zs_ckpt_close(&ck);
    return 1;
}

zs_err zs_ckpt_scaler(const zs_ckpt *ck, const zs_fp16_config *cfg, zs_lossscale *out)
{
    if (!ck->info.has_scaler)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: the manifest has no loss_scaler, which an fp16 job's checkpoint "
                        "carries",
                        ck->step_dir);
    ZS_CHECK(zs_lossscale_check(&ck->info.scaler, cfg, ck->step_dir));
    if (ck->info.scaler.iter != ck->info.step)
        return zs_error(ZS_ERR_FORMAT,
                        "%s: loss_scaler.iter %ld, but the checkpoint is of step %ld", ck->step_dir,
                        ck->info.scaler.iter, ck->info.step);
    *out = ck->info.scaler;
    return ZS_OK;
}

void zs_ckpt_discard(const char *dir, long step)
{
    char sdir[4096];
    if (zs_ckpt_step_dir(dir, step, 0, sdir, sizeof sdir) != ZS_OK)
        return;
    /* The manifest first: written, it makes the directory a checkpoint (one a resume would
     * try and pruning would keep), which it must not stay once a shard is gone.  Then every
     * shard file and temporary file the directory holds, whoever wrote them. */
    char path[4096 + 300];
    snprintf(path, sizeof path, "%s/manifest.json", sdir);
    unlink(path);
    DIR *d = opendir(sdir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "shard-", 6) != 0 && strncmp(e->d_name, "manifest.json", 13) != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    if (rmdir(sdir) != 0 && errno != ENOENT)
        ZS_WARN("checkpoint: %s: %s (left behind; pruning removes it later)", sdir,
                strerror(errno));
}

void zs_ckpt_prune(const char *dir, long newest, int keep)
{
    if (!dir)
        return;
    if (keep < 1)
        keep = 1;
    step_entry *steps;
    int n;
    if (list_steps(dir, &steps, &n) != ZS_OK) {
        ZS_WARN("checkpoint prune: %s", zs_last_error());
        return;
    }
    char path[CKPT_PATH];
    /* Valid checkpoints kept so far, `newest` included when it is valid. */
    int kept = 0;
    if (zs_ckpt_step_dir(dir, newest, 0, path, sizeof path) == ZS_OK && manifest_valid(path))
        kept = 1;
    for (int i = 0; i < n; i++) {
        if (steps[i].step >= newest)
            continue; /* newest itself, or being written */
        if (join(path, sizeof path, dir, steps[i].name) != ZS_OK)
            continue;
        if (manifest_valid(path)) {
            /* The first valid one is kept even if `newest` is not valid: it is then the newest
             * valid checkpoint. */
            if (kept < keep || kept == 0) {
                kept++;
                continue;
            }
        }
        remove_step_dir(path);
    }
    free(steps);
}
