/*
 * data: loading token files and sampling chunks.
 *
 * Files are read whole into memory as uint16 ids: the corpora this trainer is for fit in RAM,
 * and one copy per process keeps sampling a pointer into an array.
 */
#include "common/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/rng.h"

#define DATA_SALT 0x646174612d736571ull /* "data-seq" */

/* Reads exactly n bytes at offset off. */
static zs_err read_at(int fd, const char *path, void *buf, size_t n, off_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return zs_error(ZS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return zs_error(ZS_ERR_FORMAT, "%s: file ended after %zu of %zu bytes", path,
                            (size_t)off + done, (size_t)off + n);
        done += (size_t)r;
    }
    return ZS_OK;
}

/* Appends n ids to ds->tokens (grown by doubling). */
static zs_err reserve(zs_dataset *ds, size_t *cap, size_t more, const char *path)
{
    if (ds->ntokens + more <= *cap)
        return ZS_OK;
    size_t want = *cap ? *cap : 1 << 16;
    while (want < ds->ntokens + more)
        want *= 2;
    uint16_t *p = realloc(ds->tokens, want * sizeof *p);
    if (!p)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory for %zu tokens", path, want);
    ds->tokens = p;
    *cap = want;
    return ZS_OK;
}

/* What a file that is not a regular file or a directory is, for the message that refuses it. */
static const char *file_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISDIR(mode))
        return "a directory";
    return "not a regular file";
}

static zs_err not_regular(const char *path, mode_t mode)
{
    return zs_error(ZS_ERR_INVALID,
                    "data %s: is %s; --data must be a regular file or a directory of regular "
                    "files",
                    path, file_kind(mode));
}

/* Loads one file, appending its tokens; *kind is set from the first file and checked after. */
static zs_err load_file(const char *path, zs_dataset *ds, size_t *cap, int first)
{
    /* O_NONBLOCK: the caller checked that path is a regular file, but it may have been
     * replaced since, and opening a FIFO without it waits for a writer, forever.  On a regular
     * file the flag changes nothing. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "data %s: %s", path,
                        strerror(errno));
    zs_err res = ZS_OK;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        res = zs_error(ZS_ERR_IO, "data %s: stat failed: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        res = not_regular(path, st.st_mode);
        goto out;
    }
    size_t size = (size_t)st.st_size;
    int32_t header[ZS_LLMC_HEADER_INTS];
    zs_data_kind kind = ZS_DATA_TEXT;
    if (size >= sizeof header) {
        ZS_CHECK_GOTO(read_at(fd, path, header, sizeof header, 0), res, out);
        if (header[0] == ZS_LLMC_MAGIC)
            kind = ZS_DATA_LLMC;
    }
    if (first)
        ds->kind = kind;
    else if (kind != ds->kind) {
        res = zs_error(ZS_ERR_FORMAT, "data %s: is %s, but earlier files are %s", path,
                       kind == ZS_DATA_LLMC ? "an llm.c token shard" : "text",
                       ds->kind == ZS_DATA_LLMC ? "llm.c token shards" : "text");
        goto out;
    }
    if (kind == ZS_DATA_LLMC) {
        if (header[1] != ZS_LLMC_VERSION) {
            res = zs_error(ZS_ERR_FORMAT, "data %s: llm.c shard version %d, expected %d", path,
                           header[1], ZS_LLMC_VERSION);
            goto out;
        }
        if (header[2] < 0) {
            res = zs_error(ZS_ERR_FORMAT, "data %s: negative token count %d", path, header[2]);
            goto out;
        }
        size_t n = (size_t)header[2];
        size_t expect = sizeof header + 2 * n;
        if (size != expect) {
            res = zs_error(ZS_ERR_FORMAT,
                           "data %s: header says %zu tokens (%zu bytes), file has "
                           "%zu bytes",
                           path, n, expect, size);
            goto out;
        }
        ZS_CHECK_GOTO(reserve(ds, cap, n, path), res, out);
        ZS_CHECK_GOTO(read_at(fd, path, ds->tokens + ds->ntokens, 2 * n, sizeof header), res, out);
        ds->ntokens += n;
    } else {
        ZS_CHECK_GOTO(reserve(ds, cap, size, path), res, out);
        uint8_t *bytes = malloc(size ? size : 1);
        if (!bytes) {
            res = zs_error(ZS_ERR_NOMEM, "data %s: out of memory for %zu bytes", path, size);
            goto out;
        }
        res = read_at(fd, path, bytes, size, 0);
        if (res == ZS_OK)
            for (size_t i = 0; i < size; i++)
                ds->tokens[ds->ntokens + i] = bytes[i];
        free(bytes);
        if (res != ZS_OK)
            goto out;
        ds->ntokens += size;
    }
    ds->n_files++;
out:
    close(fd);
    return res;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static zs_err load_dir(const char *path, zs_dataset *ds, size_t *cap)
{
    DIR *d = opendir(path);
    if (!d)
        return zs_error(ZS_ERR_IO, "data %s: cannot open directory: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, ncap = 0;
    zs_err res = ZS_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        /* Every non-hidden entry must be a regular file (a symbolic link to one counts): a
         * FIFO, a device, a socket or a subdirectory is refused by name rather than skipped,
         * so that what is trained on is what the directory shows. */
        struct stat st;
        if (stat(full, &st) != 0) {
            res = zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "data %s: %s", full,
                           strerror(errno));
            goto out;
        }
        if (!S_ISREG(st.st_mode)) {
            res = not_regular(full, st.st_mode);
            goto out;
        }
        if (n == ncap) {
            ncap = ncap ? 2 * ncap : 64;
            char **p = realloc(names, ncap * sizeof *p);
            if (!p) {
                res = zs_error(ZS_ERR_NOMEM, "data %s: out of memory", path);
                goto out;
            }
            names = p;
        }
        if (!(names[n] = strdup(full))) {
            res = zs_error(ZS_ERR_NOMEM, "data %s: out of memory", path);
            goto out;
        }
        n++;
    }
    if (n == 0) {
        res = zs_error(ZS_ERR_NOTFOUND, "data %s: the directory holds no files", path);
        goto out;
    }
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && res == ZS_OK; i++)
        res = load_file(names[i], ds, cap, i == 0);
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    closedir(d);
    return res;
}

zs_err zs_data_open(const char *path, zs_dataset *ds)
{
    memset(ds, 0, sizeof *ds);
    struct stat st;
    if (stat(path, &st) != 0)
        return zs_error(errno == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO, "data %s: %s", path,
                        strerror(errno));
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return not_regular(path, st.st_mode);
    size_t cap = 0;
    zs_err res = S_ISDIR(st.st_mode) ? load_dir(path, ds, &cap) : load_file(path, ds, &cap, 1);
    if (res != ZS_OK) {
        zs_data_close(ds);
        return res;
    }
    if (ds->ntokens == 0) {
        zs_data_close(ds);
        return zs_error(ZS_ERR_FORMAT, "data %s: holds no tokens", path);
    }
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)ds->kind;
    int mx = 0;
    for (size_t i = 0; i < ds->ntokens; i++) {
        uint16_t t = ds->tokens[i];
        mx = t > mx ? t : mx;
        h = (h ^ (t & 0xff)) * 0x100000001b3ull;
        h = (h ^ (t >> 8)) * 0x100000001b3ull;
    }
    ds->max_token = mx;
    ds->fingerprint = h;
    return ZS_OK;
}

void zs_data_close(zs_dataset *ds)
{
    free(ds->tokens);
    memset(ds, 0, sizeof *ds);
}

zs_err zs_data_check(const zs_dataset *ds, int vocab_size, int t)
{
    if (ds->max_token >= vocab_size) {
        size_t at = 0;
        while (ds->tokens[at] != ds->max_token)
            at++;
        return zs_error(ZS_ERR_INVALID,
                        "data: token id %d at position %zu is outside the "
                        "model's vocab_size %d",
                        ds->max_token, at, vocab_size);
    }
    if (ds->ntokens < (size_t)t + 1)
        return zs_error(ZS_ERR_INVALID, "data: %zu tokens, a sequence of %d needs at least %d",
                        ds->ntokens, t, t + 1);
    return ZS_OK;
}

void zs_data_chunk(const zs_dataset *ds, uint64_t seed, long step, int chunk, int b, int t,
                   int32_t *inputs, int32_t *targets)
{
    size_t starts = ds->ntokens - (size_t)t; /* valid starts: [0, ntokens - t - 1] */
    for (int j = 0; j < b; j++) {
        uint64_t r = zs_rng_u64(seed ^ DATA_SALT, (uint64_t)step,
                                ((uint64_t)(uint32_t)chunk << 32) | (uint32_t)j);
        size_t s = (size_t)(r % starts);
        for (int k = 0; k < t; k++) {
            inputs[(size_t)j * t + k] = ds->tokens[s + k];
            targets[(size_t)j * t + k] = ds->tokens[s + k + 1];
        }
    }
}

size_t zs_data_eval_count(const zs_dataset *ds, int t)
{
    return ds->ntokens ? (ds->ntokens - 1) / (size_t)t : 0;
}

void zs_data_eval_seq(const zs_dataset *ds, size_t i, int t, int32_t *inputs, int32_t *targets)
{
    const uint16_t *p = ds->tokens + i * (size_t)t;
    for (int k = 0; k < t; k++) {
        inputs[k] = p[k];
        targets[k] = p[k + 1];
    }
}

zs_err zs_data_write_llmc(const char *path, const uint16_t *tokens, size_t ntokens)
{
    int32_t header[ZS_LLMC_HEADER_INTS] = {ZS_LLMC_MAGIC, ZS_LLMC_VERSION, (int32_t)ntokens};
    FILE *f = fopen(path, "wb");
    if (!f)
        return zs_error(ZS_ERR_IO, "%s: %s", path, strerror(errno));
    int ok = fwrite(header, sizeof header, 1, f) == 1 && fwrite(tokens, 2, ntokens, f) == ntokens;
    ok &= fclose(f) == 0;
    return ok ? ZS_OK : zs_error(ZS_ERR_IO, "%s: write failed", path);
}
