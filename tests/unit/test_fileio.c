/*
 * fileio: whole-buffer writes and positioned writes read back exactly; a read past the end is
 * a truncated file (ZS_ERR_FORMAT) with the bytes and offset named; a full device fails with
 * the OS's reason and the bytes that went out; a commit leaves the file under its final name
 * and no temporary one, and a failed one removes the temporary file; directory syncs name the
 * directory that could not be synced.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "tests/unit/test.h"

static char dir[] = "/tmp/zs_test_fileio_XXXXXX";

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void test_write_read(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/data", dir);
    int fd;
    CHECK_OK(zs_file_create(path, &fd));
    CHECK_OK(zs_file_write_all(fd, path, "0123456789", 10));
    /* A positioned write past the end leaves a hole and does not move the file position. */
    CHECK_OK(zs_file_pwrite_all(fd, path, "xy", 2, 14));
    CHECK_OK(zs_file_write_all(fd, path, "ab", 2));
    size_t done = 99;
    CHECK_EQ_INT(zs_file_write(fd, "", 0, &done), 0);
    CHECK_EQ_INT(done, 0);
    close(fd);

    fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    char buf[16] = {0};
    CHECK_OK(zs_file_read_at(fd, path, buf, 16, 0));
    CHECK(memcmp(buf, "0123456789ab\0\0xy", 16) == 0);
    CHECK_OK(zs_file_read_at(fd, path, buf, 3, 7));
    CHECK(memcmp(buf, "789", 3) == 0);
    CHECK_EQ_INT(zs_file_read_at(fd, path, buf, 4, 14), ZS_ERR_FORMAT);
    CHECK_FAILS_WITH(zs_file_read_at(fd, path, buf, 4, 14),
                     "file truncated: 2 bytes missing at offset 16");
    CHECK_FAILS_WITH(zs_file_read_at(fd, path, buf, 4, 14), path);
    close(fd);
    CHECK_EQ_INT(zs_file_read_at(fd, path, buf, 4, 0), ZS_ERR_IO);
    CHECK_FAILS_WITH(zs_file_read_at(fd, path, buf, 4, 0), "read of 4 bytes at offset 0 failed");
}

static void test_full_device(void)
{
    int fd = open("/dev/full", O_WRONLY);
    if (fd < 0) {
        fprintf(stderr, "test_fileio: no /dev/full, full-device checks skipped\n");
        return;
    }
    size_t done = 99;
    errno = 0;
    CHECK_EQ_INT(zs_file_write(fd, "hello", 5, &done), -1);
    CHECK_EQ_INT(errno, ENOSPC);
    CHECK_EQ_INT(done, 0);
    CHECK_EQ_INT(zs_file_write(fd, "hello", 5, NULL), -1);
    CHECK_FAILS_WITH(zs_file_write_all(fd, "/dev/full", "hello", 5),
                     "/dev/full: write of 5 bytes failed: No space left on device");
    CHECK_FAILS_WITH(zs_file_pwrite_all(fd, "/dev/full", "hello", 5, 3), "write of 5 bytes");
    close(fd);
}

static void test_commit(void)
{
    char path[256], tmp[264], missing[256], mtmp[264];
    snprintf(path, sizeof path, "%s/final", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd;
    CHECK_OK(zs_file_create(tmp, &fd));
    CHECK_OK(zs_file_write_all(fd, tmp, "done\n", 5));
    CHECK_OK(zs_file_commit(fd, tmp, path));
    CHECK(exists(path));
    CHECK(!exists(tmp));
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 5);

    /* A rename that fails (its directory is missing) removes the temporary file. */
    snprintf(missing, sizeof missing, "%s/no-such-dir/final", dir);
    CHECK_OK(zs_file_create(tmp, &fd));
    CHECK_FAILS_WITH(zs_file_replace(fd, tmp, missing), "rename from");
    CHECK(!exists(tmp));
    CHECK(exists(path));

    snprintf(mtmp, sizeof mtmp, "%s.tmp", missing);
    CHECK_EQ_INT(zs_file_create(mtmp, &fd), ZS_ERR_IO);
    CHECK_FAILS_WITH(zs_file_create(mtmp, &fd), "cannot create");
    CHECK_FAILS_WITH(zs_file_create(mtmp, &fd), mtmp);
}

static void test_sync(void)
{
    char path[256];
    CHECK_OK(zs_file_sync_dir(dir));
    snprintf(path, sizeof path, "%s/final", dir);
    CHECK_OK(zs_file_sync_parent(path));
    CHECK_OK(zs_file_sync_parent("a-bare-name")); /* the current directory */
    CHECK_OK(zs_file_sync_parent("/tmp"));        /* the root directory */
    snprintf(path, sizeof path, "%s/no-such-dir", dir);
    CHECK_FAILS_WITH(zs_file_sync_dir(path), "cannot open the directory to sync it");
    CHECK_FAILS_WITH(zs_file_sync_dir(path), path);
    snprintf(path, sizeof path, "%s/no-such-dir/file", dir);
    CHECK_FAILS_WITH(zs_file_sync_parent(path), "no-such-dir: cannot open the directory");
}

int main(void)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_write_read();
    test_full_device();
    test_commit();
    test_sync();
    char p[256];
    static const char *const names[] = {"data", "final", NULL};
    for (const char *const *n = names; *n; n++) {
        snprintf(p, sizeof p, "%s/%s", dir, *n);
        unlink(p);
    }
    rmdir(dir);
    return zs_test_result("test_fileio");
}
