/*
 * nvme: the NVMe tier's state file through io_uring, in a directory under /tmp.
 *  - stored arrays load back bitwise, whole and in ranges that cut blocks;
 *  - zs_nvme_run visits every unit once, in order, and after several runs each array is
 *    bitwise what the same updates give on arrays in RAM;
 *  - a byte flipped on disk (through the unnamed file's /proc/self/fd entry) stops a run at
 *    that unit with the offset named, units before it updated and the rest not; a file cut
 *    short gives "short read"; ZS_NVME_INJECT_EIO gives EIO at the offset;
 *  - a directory that does not exist, or is a file, is named; a file system too small (a tmpfs
 *    in a private mount namespace, when the test runs as root) fails at open with ENOSPC;
 *  - without io_uring (ZS_NVME_NO_URING=1: preads and pwrites), the same runs give the same
 *    bits and a flipped byte is caught the same way;
 *  - zs_nvme_run_to puts units in files of their own in a checkpoint's layout, with their
 *    arrays' checksums; the next run reads them from there (a file cut to its size included,
 *    a flipped byte named with the file, one whose name is gone) and leaves those files as
 *    they were; at most a quarter of RLIMIT_NOFILE's units get such files.
 */
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/rng.h"
#include "server/nvme.h"
#include "tests/unit/fdutil.h"
#include "tests/unit/test.h"

enum { UNITS = 3, ARRAYS = 2 };
static const size_t FLOATS[UNITS] = {1000, 70000, 5};

/* The work of a run: an update that depends on the unit, the array, the element and the run
 * (so a unit handed over twice, or another unit's data, would show). */
typedef struct {
    int run;
    int visited[UNITS + 1];
    int order[16];
    int n;
} work_ctx;

static float updated(float x, int run, int u, int a, size_t i)
{
    return x * 0.75f + (float)(run + 1) * 0.5f - (float)u + (float)a * 0.25f + (float)(i % 7);
}

static zs_err work(void *ctx, int u, float *const *arrays)
{
    work_ctx *w = ctx;
    w->visited[u]++;
    if (w->n < 16)
        w->order[w->n++] = u;
    for (int a = 0; a < ARRAYS; a++)
        for (size_t i = 0; i < FLOATS[u]; i++)
            arrays[a][i] = updated(arrays[a][i], w->run, u, a, i);
    return ZS_OK;
}

static void flip_byte(int fd, off_t at)
{
    unsigned char c = 0;
    CHECK(pread(fd, &c, 1, at) == 1);
    c ^= 0x10;
    CHECK(pwrite(fd, &c, 1, at) == 1);
    fsync(fd);
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

int main(void)
{
    char dir[] = "/tmp/zs_test_nvme_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    zs_nvme_opts o = {.dir = dir, .block_bytes = 65536, .queue_depth = 4, .owner = "server 9"};
    zs_nvme *nv = NULL;
    CHECK_OK(zs_nvme_open(&o, UNITS, ARRAYS, FLOATS, &nv));
    if (!nv)
        return zs_test_result("test_nvme");
    printf("test_nvme: %s, O_DIRECT %d, registered buffers %d, %llu bytes on disk\n",
           zs_nvme_path(nv), zs_nvme_direct(nv), zs_nvme_fixed_buffers(nv),
           (unsigned long long)zs_nvme_file_bytes(nv));
    /* A fresh tier reads as zeros. */
    float *ram[UNITS][ARRAYS], *back = malloc(70000 * sizeof(float));
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            ram[u][a] = calloc(FLOATS[u], sizeof(float));
            CHECK_OK(zs_nvme_load(nv, u, a, 0, FLOATS[u], back));
            CHECK(same(back, ram[u][a], FLOATS[u]));
        }
    /* Store and load back, whole and in ranges across block boundaries. */
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            for (size_t i = 0; i < FLOATS[u]; i++)
                ram[u][a][i] = (float)(zs_rng_u64(11, (uint64_t)(u * 2 + a), i) % 100000) / 7.0f;
            CHECK_OK(zs_nvme_store(nv, u, a, ram[u][a]));
        }
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            CHECK_OK(zs_nvme_load(nv, u, a, 0, FLOATS[u], back));
            CHECK(same(back, ram[u][a], FLOATS[u]));
        }
    CHECK_OK(zs_nvme_load(nv, 1, 1, 16000, 20000, back)); /* blocks 0..2 of 65536 bytes */
    CHECK(same(back, ram[1][1] + 16000, 20000));
    CHECK_OK(zs_nvme_load(nv, 1, 0, 69999, 1, back));
    CHECK(same(back, ram[1][0] + 69999, 1));
    CHECK_FAILS_WITH(zs_nvme_load(nv, 2, 0, 3, 3, back), "elements 3..6 of unit 2");
    CHECK_FAILS_WITH(zs_nvme_store(nv, 3, 0, back), "no unit 3");
    /* Runs: each unit once, in order, with RAM's bits. */
    for (int run = 0; run < 3; run++) {
        work_ctx w = {.run = run};
        CHECK_OK(zs_nvme_run(nv, work, &w));
        CHECK_EQ_INT(w.n, UNITS);
        for (int u = 0; u < UNITS; u++) {
            CHECK_EQ_INT(w.visited[u], 1);
            CHECK_EQ_INT(w.order[u], u);
            for (int a = 0; a < ARRAYS; a++)
                for (size_t i = 0; i < FLOATS[u]; i++)
                    ram[u][a][i] = updated(ram[u][a][i], run, u, a, i);
        }
    }
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            CHECK_OK(zs_nvme_load(nv, u, a, 0, FLOATS[u], back));
            CHECK(same(back, ram[u][a], FLOATS[u]));
        }
    zs_nvme_stats st = zs_nvme_get_stats(nv);
    CHECK(st.bytes_read > 0 && st.bytes_written > 0);
    /* A flipped byte in unit 1's exp_avg_sq, 100000 bytes in (the file: unit 0's two arrays of
     * 4000 bytes, padded to 8192, then unit 1's exp_avg of 280000 bytes and its exp_avg_sq):
     * the run stops at the block that holds it (the sixth of unit 1), having updated unit 0
     * only. */
    int fd = zs_test_open_unnamed(dir, 0);
    CHECK(fd >= 0);
    off_t at = 8192 + 280000 + 100000;
    flip_byte(fd, at);
    work_ctx w = {.run = 7};
    CHECK_FAILS_WITH(zs_nvme_run(nv, work, &w), "block of 65536 bytes at offset 335872 (unit 1 "
                                                "exp_avg_sq, elements 11920..28304) fails its "
                                                "checksum");
    CHECK_EQ_INT(w.visited[0], 1);
    CHECK_EQ_INT(w.visited[1], 0);
    CHECK_EQ_INT(w.visited[2], 0);
    for (int a = 0; a < ARRAYS; a++)
        for (size_t i = 0; i < FLOATS[0]; i++)
            ram[0][a][i] = updated(ram[0][a][i], 7, 0, a, i);
    flip_byte(fd, at); /* back as it was: the next run goes through */
    w = (work_ctx){.run = 8};
    CHECK_OK(zs_nvme_run(nv, work, &w));
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            for (size_t i = 0; i < FLOATS[u]; i++)
                ram[u][a][i] = updated(ram[u][a][i], 8, u, a, i);
            CHECK_OK(zs_nvme_load(nv, u, a, 0, FLOATS[u], back));
            CHECK(same(back, ram[u][a], FLOATS[u]));
        }
    /* The file cut short inside unit 2: a short read, named. */
    CHECK(fd >= 0 && ftruncate(fd, (off_t)zs_nvme_file_bytes(nv) - 4096) == 0);
    w = (work_ctx){.run = 9};
    CHECK_FAILS_WITH(zs_nvme_run(nv, work, &w),
                     "short read: 0 of 4096 bytes at offset 569344 (unit 2 exp_avg)");
    CHECK_EQ_INT(w.visited[2], 0);
    if (fd >= 0)
        close(fd);
    zs_nvme_close(nv);

    /* EIO at an offset (the test hook): named, with the unit. */
    setenv("ZS_NVME_INJECT_EIO", "8200", 1);
    CHECK_OK(zs_nvme_open(&o, UNITS, ARRAYS, FLOATS, &nv));
    unsetenv("ZS_NVME_INJECT_EIO");
    w = (work_ctx){.run = 0};
    CHECK_FAILS_WITH(zs_nvme_run(nv, work, &w),
                     "read of 65536 bytes at offset 8192 (unit 1 exp_avg): Input/output error");
    CHECK_EQ_INT(w.visited[1], 0);
    zs_nvme_close(nv);

    /* Without io_uring: the same updates, the same bits, the same check. */
    setenv("ZS_NVME_NO_URING", "1", 1);
    CHECK_OK(zs_nvme_open(&o, UNITS, ARRAYS, FLOATS, &nv));
    unsetenv("ZS_NVME_NO_URING");
    CHECK(nv && !zs_nvme_io_uring(nv));
    for (int u = 0; nv && u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++)
            CHECK_OK(zs_nvme_store(nv, u, a, ram[u][a]));
    for (int run = 20; nv && run < 22; run++) {
        w = (work_ctx){.run = run};
        CHECK_OK(zs_nvme_run(nv, work, &w));
        CHECK_EQ_INT(w.n, UNITS);
        for (int u = 0; u < UNITS; u++)
            for (int a = 0; a < ARRAYS; a++)
                for (size_t i = 0; i < FLOATS[u]; i++)
                    ram[u][a][i] = updated(ram[u][a][i], run, u, a, i);
    }
    for (int u = 0; nv && u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            CHECK_OK(zs_nvme_load(nv, u, a, 0, FLOATS[u], back));
            CHECK(same(back, ram[u][a], FLOATS[u]));
        }
    fd = zs_test_open_unnamed(dir, 0);
    CHECK(fd >= 0);
    if (fd >= 0) {
        flip_byte(fd, 2 * 4096 + 10);
        close(fd);
    }
    w = (work_ctx){.run = 22};
    CHECK_FAILS_WITH(zs_nvme_run(nv, work, &w), "at offset 8192 (unit 1 exp_avg, elements 0..");
    zs_nvme_close(nv);

    /* Units written to files of their own, laid out as a shard file of a checkpoint (4096
     * bytes of header, one array that is not the tier's, then the tier's two, swapped): each
     * array lies at its offset there, with the checksum given; a path that cannot be made sends
     * its unit to the state file.  The next run reads the units from their files (one cut to
     * its size, the tail of its last block gone; a byte flipped in the other is named with its
     * path) and writes them back to the state file, leaving the files as they were. */
    zs_nvme_opts lay = o;
    lay.file_header = 4096;
    lay.file_lead = 1;
    lay.file_pos[0] = 1;
    lay.file_pos[1] = 0;
    CHECK_OK(zs_nvme_open(&lay, UNITS, ARRAYS, FLOATS, &nv));
    char own[UNITS][320];
    char *to[UNITS];
    for (int u = 0; u < UNITS; u++) {
        snprintf(own[u], sizeof own[u], u < 2 ? "%s/own-%d" : "%s/missing/own-%d", dir, u);
        to[u] = own[u];
    }
    for (int u = 0; nv && u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++)
            CHECK_OK(zs_nvme_store(nv, u, a, ram[u][a]));
    uint64_t sums[UNITS][ZS_NVME_MAX_ARRAYS];
    int written[UNITS] = {-1, -1, -1};
    w = (work_ctx){.run = 30};
    CHECK_OK(nv ? zs_nvme_run_to(nv, work, &w, to, sums, written) : ZS_ERR_INVALID);
    CHECK(written[0] == 1 && written[1] == 1 && written[2] == 0);
    char *kept[2] = {NULL, NULL};
    size_t kept_len[2] = {0, 0};
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            for (size_t i = 0; i < FLOATS[u]; i++)
                ram[u][a][i] = updated(ram[u][a][i], 30, u, a, i);
            if (u == 2)
                continue;
            CHECK(sums[u][a] == XXH3_64bits(ram[u][a], FLOATS[u] * sizeof(float)));
            int f = open(own[u], O_RDONLY);
            off_t at_a = 4096 + (off_t)(FLOATS[u] * 4) * (1 + lay.file_pos[a]);
            CHECK(f >= 0 && pread(f, back, FLOATS[u] * 4, at_a) == (ssize_t)(FLOATS[u] * 4));
            CHECK(same(back, ram[u][a], FLOATS[u]));
            if (f >= 0)
                close(f);
        }
    CHECK(truncate(own[1], 4096 + 3 * 4 * 70000) == 0);
    for (int u = 0; u < 2; u++) {
        FILE *kf = fopen(own[u], "rb");
        kept[u] = malloc(4096 + 3 * 4 * 70000 + 65536);
        if (kf && kept[u])
            kept_len[u] = fread(kept[u], 1, 4096 + 3 * 4 * 70000 + 65536, kf);
        if (kf)
            fclose(kf);
    }
    CHECK_OK(zs_nvme_load(nv, 1, 1, 69990, 10, back));
    CHECK(same(back, ram[1][1] + 69990, 10));
    fd = open(own[0], O_RDWR);
    CHECK(fd >= 0);
    if (fd >= 0) {
        flip_byte(fd, 4096 + 4000 + 10); /* the first place: exp_avg_sq */
        w = (work_ctx){.run = 31};
        char want[700];
        snprintf(want, sizeof want,
                 "%s: block of 12288 bytes at offset 4096 (unit 0 exp_avg_sq, "
                 "elements 0..1000) fails its checksum",
                 own[0]);
        CHECK_FAILS_WITH(zs_nvme_run(nv, work, &w), want);
        CHECK_EQ_INT(w.n, 0);
        flip_byte(fd, 4096 + 4000 + 10);
        close(fd);
    }
    /* Unit 0's file loses its name (a failed checkpoint discarded): the tier holds it open, so
     * the next run still reads the unit (its bytes are checked below through another name). */
    char keep0[340];
    snprintf(keep0, sizeof keep0, "%s/keep-0", dir);
    CHECK(link(own[0], keep0) == 0 && unlink(own[0]) == 0);
    w = (work_ctx){.run = 32};
    CHECK_OK(nv ? zs_nvme_run(nv, work, &w) : ZS_ERR_INVALID);
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++) {
            for (size_t i = 0; i < FLOATS[u]; i++)
                ram[u][a][i] = updated(ram[u][a][i], 32, u, a, i);
            CHECK_OK(zs_nvme_load(nv, u, a, 0, FLOATS[u], back));
            CHECK(same(back, ram[u][a], FLOATS[u]));
        }
    for (int u = 0; u < 2; u++) {
        FILE *kf = fopen(u ? own[u] : keep0, "rb");
        char *now = malloc(kept_len[u] + 1);
        CHECK(kf && now && kept_len[u] > 0 && fread(now, 1, kept_len[u] + 1, kf) == kept_len[u] &&
              memcmp(now, kept[u], kept_len[u]) == 0);
        if (kf)
            fclose(kf);
        free(now);
        free(kept[u]);
        unlink(u ? own[u] : keep0);
    }
    /* One array of a damaged unit needs the unit read, and fails; all its arrays at once read
     * nothing, and replace it (a restore). */
    fd = zs_test_open_unnamed(dir, 0);
    CHECK(fd >= 0);
    if (fd >= 0) {
        flip_byte(fd, 4000 + 10); /* unit 0's first place starts at 4000 (4096 + 4000 mod 4096) */
        close(fd);
    }
    CHECK_FAILS_WITH(nv ? zs_nvme_store(nv, 0, 0, ram[0][0]) : ZS_ERR_INVALID,
                     "fails its checksum");
    const float *both[ZS_NVME_MAX_ARRAYS] = {ram[0][0], ram[0][1]};
    CHECK_OK(nv ? zs_nvme_store_arrays(nv, 0, both) : ZS_ERR_INVALID);
    for (int a = 0; nv && a < ARRAYS; a++) {
        CHECK_OK(zs_nvme_load(nv, 0, a, 0, FLOATS[0], back));
        CHECK(same(back, ram[0][a], FLOATS[0]));
    }
    zs_nvme_close(nv);

    /* The files held open are at most a quarter of RLIMIT_NOFILE's soft limit (as the tier
     * found it when it opened): with 8, two units get files of their own and the third goes to
     * the state file. */
    struct rlimit nofile, low;
    CHECK(getrlimit(RLIMIT_NOFILE, &nofile) == 0);
    low = nofile;
    low.rlim_cur = 8;
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    zs_err opened = zs_nvme_open(&lay, UNITS, ARRAYS, FLOATS, &nv);
    CHECK(setrlimit(RLIMIT_NOFILE, &nofile) == 0);
    CHECK_OK(opened);
    for (int u = 0; u < UNITS; u++)
        snprintf(own[u], sizeof own[u], "%s/capped-%d", dir, u);
    w = (work_ctx){.run = 40};
    CHECK_OK(opened == ZS_OK ? zs_nvme_run_to(nv, work, &w, to, sums, written) : ZS_ERR_INVALID);
    CHECK(written[0] == 1 && written[1] == 1 && written[2] == 0);
    CHECK(access(own[2], F_OK) != 0); /* not made */
    if (opened == ZS_OK)
        zs_nvme_close(nv);
    for (int u = 0; u < UNITS; u++)
        unlink(own[u]);

    /* Bad places. */
    zs_nvme_opts bad = o;
    bad.dir = "/nonexistent/zs";
    CHECK_FAILS_WITH(zs_nvme_open(&bad, UNITS, ARRAYS, FLOATS, &nv),
                     "server 9: nvme_path /nonexistent/zs: No such file or directory");
    char file[300];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    if (f)
        fclose(f);
    bad.dir = file;
    CHECK_FAILS_WITH(zs_nvme_open(&bad, UNITS, ARRAYS, FLOATS, &nv), "not a directory");
    bad = o;
    bad.block_bytes = 1000;
    CHECK_FAILS_WITH(zs_nvme_open(&bad, UNITS, ARRAYS, FLOATS, &nv), "block size 1000");
    /* A disk too small: a tmpfs of 64 KiB in a mount namespace of this process alone. */
    char small[300];
    snprintf(small, sizeof small, "%s/small", dir);
    mkdir(small, 0700);
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
        mount("tmpfs", small, "tmpfs", 0, "size=64k") == 0) {
        bad = o;
        bad.dir = small;
        CHECK_FAILS_WITH(zs_nvme_open(&bad, UNITS, ARRAYS, FLOATS, &nv),
                         "cannot allocate 560.0 KiB for the state file: No space left on device");
        umount(small);
    } else {
        printf("test_nvme: no private tmpfs (not root?): the full-disk case is not run\n");
    }
    rmdir(small);
    unlink(file);
    for (int u = 0; u < UNITS; u++)
        for (int a = 0; a < ARRAYS; a++)
            free(ram[u][a]);
    free(back);
    rmdir(dir);
    return zs_test_result("test_nvme");
}
