/*
 * fileio: whole-buffer I/O and the commit of a durable file (see fileio.h for the invariant).
 *
 * write(2) and pwrite(2) go through one loop (write_loop), so a positioned and a plain write
 * retry and fail alike.  Every message names the path the caller gave, so the caller adds no
 * context of its own.
 */
#include "common/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes n bytes of buf, at file offset off or, when positioned is 0, at the file position;
 * *done gets the bytes written.  Returns 0, or -1 with errno set. */
static int write_loop(int fd, const void *buf, size_t n, int positioned, uint64_t off, size_t *done)
{
    const char *p = buf;
    *done = 0;
    while (*done < n) {
        size_t want = n - *done < ZS_FILE_WRITE_MAX ? n - *done : ZS_FILE_WRITE_MAX;
        ssize_t w = positioned ? pwrite(fd, p + *done, want, (off_t)(off + *done))
                               : write(fd, p + *done, want);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = EIO; /* a write of n > 0 bytes to a file does not return 0 */
            return -1;
        }
        *done += (size_t)w;
    }
    return 0;
}

int zs_file_write(int fd, const void *buf, size_t n, size_t *done)
{
    size_t d;
    int rc = write_loop(fd, buf, n, 0, 0, &d);
    if (done)
        *done = d;
    return rc;
}

zs_err zs_file_write_all(int fd, const char *path, const void *buf, size_t n)
{
    size_t done;
    if (write_loop(fd, buf, n, 0, 0, &done) != 0)
        return zs_error(ZS_ERR_IO, "%s: write of %zu bytes failed: %s", path, n - done,
                        strerror(errno));
    return ZS_OK;
}

zs_err zs_file_pwrite_all(int fd, const char *path, const void *buf, size_t n, uint64_t off)
{
    size_t done;
    if (write_loop(fd, buf, n, 1, off, &done) != 0)
        return zs_error(ZS_ERR_IO, "%s: write of %zu bytes at offset %" PRIu64 " failed: %s", path,
                        n - done, off + done, strerror(errno));
    return ZS_OK;
}

zs_err zs_file_read_at(int fd, const char *path, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return zs_error(ZS_ERR_IO, "%s: read of %zu bytes at offset %" PRIu64 " failed: %s",
                            path, n - done, off + done, strerror(errno));
        if (r == 0)
            return zs_error(ZS_ERR_FORMAT,
                            "%s: file truncated: %zu bytes missing at offset %" PRIu64, path,
                            n - done, off + done);
        done += (size_t)r;
    }
    return ZS_OK;
}

zs_err zs_file_create(const char *tmp, int *fd)
{
    *fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0)
        return zs_error(ZS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return ZS_OK;
}

zs_err zs_file_replace(int fd, const char *tmp, const char *path)
{
    zs_err res = ZS_OK;
    if (fsync(fd) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        close(fd);
        goto fail;
    }
    if (close(fd) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        res = zs_error(ZS_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
        goto fail;
    }
    return ZS_OK;
fail:
    unlink(tmp);
    return res;
}

zs_err zs_file_commit(int fd, const char *tmp, const char *path)
{
    ZS_CHECK(zs_file_replace(fd, tmp, path));
    return zs_file_sync_parent(path);
}

zs_err zs_file_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return zs_error(ZS_ERR_IO, "%s: cannot open the directory to sync it: %s", dir,
                        strerror(errno));
    zs_err res = ZS_OK;
    if (fsync(fd) != 0)
        res = zs_error(ZS_ERR_IO, "%s: fsync of the directory failed: %s", dir, strerror(errno));
    close(fd);
    return res;
}

zs_err zs_file_sync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir)
        return zs_error(ZS_ERR_NOMEM, "%s: out of memory", path);
    zs_err res = zs_file_sync_dir(dir);
    free(dir);
    return res;
}
