/*
 * nvme: the state file, its checksums, and the three-slot pipeline over io_uring.
 *
 * Layout: unit i's arrays follow each other from base[i]; each takes span[i] bytes (its floats
 * rounded up to 4096, so every array starts aligned); units follow each other.  Requests are
 * blocks of block_bytes from the start of an array, the last one shorter; each block's
 * checksum is XXH3-64 of the bytes of that request.
 *
 * A request's user_data says which slot it belongs to, whether it is a write, its array and
 * its block, so a completion finds its unit (slot_unit) and can name its offset.
 *
 * Without io_uring (a container whose seccomp profile refuses it, a kernel without it), every
 * request is a pread or pwrite made at once, one at a time, and completes through the same
 * path; the tier says so once when it opens.
 *
 * Test hooks (docs/nvme.md): ZS_NVME_INJECT_EIO=OFFSET in the environment makes every read
 * whose range holds that file offset complete with EIO; ZS_NVME_NO_URING=1 takes the path
 * without io_uring.  Nothing else reads them.
 */
#include "server/nvme.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/memlimit.h"

#define SLOTS 3
#define ALIGN 4096
/* Checksums of a unit smaller than this run on one thread: waking a team costs more than
 * hashing a few MiB (XXH3 runs at several GB/s on one core). */
#define PARALLEL_HASH_BYTES (8u << 20)

struct zs_nvme {
    int fd;
    char path[PATH_MAX + 64];
    char owner[64];
    int units, arrays;
    size_t *floats; /* [units] elements per array */
    int *labels;    /* [units] the shard each unit is, for messages; NULL: none */
    char names[ZS_NVME_MAX_ARRAYS][32]; /* each array's name in messages */
    int elem[ZS_NVME_MAX_ARRAYS];       /* bytes of its element, in messages */
    uint64_t *base;                     /* [units] file offset of the unit's first array */
    uint64_t *span;  /* [units] bytes each array of the unit takes (4096-multiple) */
    uint64_t **sums; /* [units][arrays * blocks(unit)] XXH3 of each block as last written */
    size_t block;    /* request bytes */
    int queue_depth;
    int threads;
    uint64_t file_bytes;
    struct io_uring ring;
    int have_ring; /* 0: requests are preads and pwrites made at once */
    int fixed_bufs, fixed_file, direct;
    uint64_t slot_span;   /* bytes per array per slot: the largest span */
    uint8_t *slots;       /* SLOTS * arrays * slot_span, 4096-aligned */
    int slot_unit[SLOTS]; /* the unit a slot holds or is moving, -1: none */
    int pending[SLOTS];   /* its requests not completed */
    int unsubmitted;      /* SQEs prepared and not yet submitted */
    int inflight;         /* requests submitted or prepared, not completed */
    zs_err failed;        /* the first failed completion, kept until the run ends */
    char why[512];
    uint64_t eio_at; /* test hook: file offset + 1 whose reads fail; 0: none */
    zs_nvme_stats stats;
    pthread_mutex_t lock; /* one caller at a time: the server thread or its checkpoint writer */
};

static uint64_t round_up(uint64_t x, uint64_t m)
{
    return (x + m - 1) / m * m;
}

static size_t blocks_of(const zs_nvme *nv, int u)
{
    return (size_t)((nv->span[u] + nv->block - 1) / nv->block);
}

static uint8_t *slot_buf(const zs_nvme *nv, int s, int a)
{
    return nv->slots + ((uint64_t)s * (uint64_t)nv->arrays + (uint64_t)a) * nv->slot_span;
}

static uint64_t offset_of(const zs_nvme *nv, int u, int a, size_t b)
{
    return nv->base[u] + (uint64_t)a * nv->span[u] + (uint64_t)b * nv->block;
}

static size_t len_of(const zs_nvme *nv, int u, size_t b)
{
    uint64_t left = nv->span[u] - (uint64_t)b * nv->block;
    return (size_t)(left < nv->block ? left : nv->block);
}

const char *zs_nvme_path(const zs_nvme *nv)
{
    return nv->path;
}

uint64_t zs_nvme_file_bytes(const zs_nvme *nv)
{
    return nv->file_bytes;
}

/* An array's bytes in the file and in a slot: its floats, rounded up to a whole page. */
static uint64_t span_of(size_t floats)
{
    uint64_t s = round_up((uint64_t)floats * sizeof(float), ALIGN);
    return s ? s : ALIGN;
}

uint64_t zs_nvme_slot_bytes(int arrays, size_t largest)
{
    return SLOTS * (uint64_t)arrays * span_of(largest);
}

/* Threads for the checksums of unit u: one unless the unit is large. */
static int hash_threads(const zs_nvme *nv, int u)
{
    return (uint64_t)nv->arrays * nv->span[u] >= PARALLEL_HASH_BYTES ? nv->threads : 1;
}

int zs_nvme_direct(const zs_nvme *nv)
{
    return nv->direct;
}

int zs_nvme_fixed_buffers(const zs_nvme *nv)
{
    return nv->fixed_bufs;
}

int zs_nvme_io_uring(const zs_nvme *nv)
{
    return nv->have_ring;
}

zs_nvme_stats zs_nvme_get_stats(const zs_nvme *nv)
{
    return nv->stats;
}

/* The state file in dir: unnamed (O_TMPFILE) where the file system can, else a named one
 * unlinked at once; O_DIRECT where the file system takes it.  Sets nv->fd and nv->direct. */
static zs_err open_file(zs_nvme *nv, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return zs_error(ZS_ERR_IO, "%s: nvme_path %s: %s", nv->owner, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return zs_error(ZS_ERR_INVALID, "%s: nvme_path %s: not a directory", nv->owner, dir);
    nv->direct = 1;
    nv->fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | O_DIRECT, 0600);
    if (nv->fd < 0 && errno == EINVAL) { /* O_DIRECT, or O_TMPFILE, refused */
        nv->direct = 0;
        nv->fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    }
    if (nv->fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        char name[PATH_MAX];
        snprintf(name, sizeof name, "%s/zshard-state-XXXXXX", dir);
        nv->fd = mkostemp(name, O_CLOEXEC);
        if (nv->fd >= 0) {
            unlink(name);
            int fl = fcntl(nv->fd, F_GETFL);
            nv->direct = fl >= 0 && fcntl(nv->fd, F_SETFL, fl | O_DIRECT) == 0;
        }
    }
    if (nv->fd < 0)
        return zs_error(ZS_ERR_IO, "%s: nvme_path %s: cannot create the state file: %s", nv->owner,
                        dir, strerror(errno));
    if (!nv->direct)
        ZS_INFO("%s: nvme_path %s does not take O_DIRECT; its state file goes through the page "
                "cache",
                nv->owner, dir);
    return ZS_OK;
}

/* Allocates the whole file now, so that a disk too small is an error at start, not mid-step. */
static zs_err allocate_file(zs_nvme *nv, const char *dir)
{
    if (nv->file_bytes == 0)
        return ZS_OK;
    int rc = fallocate(nv->fd, 0, 0, (off_t)nv->file_bytes) == 0 ? 0 : errno;
    if (rc == EOPNOTSUPP)
        rc = posix_fallocate(nv->fd, 0, (off_t)nv->file_bytes);
    char size[32];
    if (rc)
        return zs_error(ZS_ERR_IO, "%s: nvme_path %s: cannot allocate %s for the state file: %s",
                        nv->owner, dir, zs_mem_text(nv->file_bytes, size, sizeof size),
                        strerror(rc));
    return ZS_OK;
}

/* The ring, with the file and the slots registered where the kernel and limits allow. */
static zs_err open_ring(zs_nvme *nv)
{
    const char *no = getenv("ZS_NVME_NO_URING");
    int rc = no && strcmp(no, "1") == 0
                 ? -ENOSYS
                 : io_uring_queue_init((unsigned)nv->queue_depth, &nv->ring, 0);
    if (rc < 0) {
        ZS_WARN("%s: io_uring is not available (%s: a container's seccomp profile, or "
                "kernel.io_uring_disabled?); the NVMe tier makes its requests with pread and "
                "pwrite, one at a time",
                nv->owner, strerror(-rc));
        return ZS_OK;
    }
    nv->have_ring = 1;
    nv->fixed_file = io_uring_register_files(&nv->ring, &nv->fd, 1) == 0;
    int n = SLOTS * nv->arrays;
    struct iovec iov[SLOTS * ZS_NVME_MAX_ARRAYS];
    for (int s = 0; s < SLOTS; s++)
        for (int a = 0; a < nv->arrays; a++)
            iov[s * nv->arrays + a] =
                (struct iovec){.iov_base = slot_buf(nv, s, a), .iov_len = (size_t)nv->slot_span};
    rc = io_uring_register_buffers(&nv->ring, iov, (unsigned)n);
    nv->fixed_bufs = rc == 0;
    if (rc < 0) /* pinned memory counts against RLIMIT_MEMLOCK for unprivileged users */
        ZS_INFO("%s: io_uring cannot register the %.1f MiB of state slots (%s); using unregistered "
                "buffers",
                nv->owner, (double)n * (double)nv->slot_span / (1 << 20), strerror(-rc));
    return ZS_OK;
}

zs_err zs_nvme_open(const zs_nvme_opts *o, int units, int arrays, const size_t *floats,
                    zs_nvme **out)
{
    *out = NULL;
    if (arrays < 1 || arrays > ZS_NVME_MAX_ARRAYS || units < 0)
        return zs_error(ZS_ERR_INVALID, "nvme: %d units of %d arrays", units, arrays);
    if (o->block_bytes < ALIGN || o->block_bytes % ALIGN)
        return zs_error(ZS_ERR_INVALID, "nvme: block size %zu is not a positive multiple of 4096",
                        o->block_bytes);
    if (o->queue_depth < 1 || o->queue_depth > 4096)
        return zs_error(ZS_ERR_INVALID, "nvme: queue depth %d is not in 1..4096", o->queue_depth);
    zs_nvme *nv = calloc(1, sizeof *nv);
    if (!nv)
        return zs_error(ZS_ERR_NOMEM, "nvme: out of memory");
    pthread_mutex_init(&nv->lock, NULL);
    nv->fd = -1;
    snprintf(nv->owner, sizeof nv->owner, "%s", o->owner ? o->owner : "nvme");
    snprintf(nv->path, sizeof nv->path, "%s/(state file of %s)", o->dir, nv->owner);
    nv->units = units;
    nv->arrays = arrays;
    nv->block = o->block_bytes;
    nv->queue_depth = o->queue_depth;
    nv->threads = o->threads > 0 ? o->threads : 1;
    static const char *const dflt[ZS_NVME_MAX_ARRAYS] = {"exp_avg", "exp_avg_sq", "weights",
                                                         "array 3"};
    for (int a = 0; a < ZS_NVME_MAX_ARRAYS; a++) {
        snprintf(nv->names[a], sizeof nv->names[a], "%s", o->names[a] ? o->names[a] : dflt[a]);
        nv->elem[a] = o->elem_bytes[a] > 0 ? o->elem_bytes[a] : 4;
    }
    for (int s = 0; s < SLOTS; s++)
        nv->slot_unit[s] = -1;
    const char *hook = getenv("ZS_NVME_INJECT_EIO");
    if (hook && *hook)
        nv->eio_at = strtoull(hook, NULL, 0) + 1;
    zs_err res = ZS_OK;
    if (o->labels) {
        nv->labels = malloc(((size_t)units + 1) * sizeof *nv->labels);
        if (!nv->labels) {
            res = zs_error(ZS_ERR_NOMEM, "nvme: out of memory for %d units", units);
            goto fail;
        }
        memcpy(nv->labels, o->labels, (size_t)units * sizeof *nv->labels);
    }
    nv->floats = calloc((size_t)units + 1, sizeof *nv->floats);
    nv->base = calloc((size_t)units + 1, sizeof *nv->base);
    nv->span = calloc((size_t)units + 1, sizeof *nv->span);
    nv->sums = calloc((size_t)units + 1, sizeof *nv->sums);
    if (!nv->floats || !nv->base || !nv->span || !nv->sums) {
        res = zs_error(ZS_ERR_NOMEM, "nvme: out of memory for %d units", units);
        goto fail;
    }
    uint64_t at = 0;
    for (int u = 0; u < units; u++) {
        nv->floats[u] = floats[u];
        nv->base[u] = at;
        nv->span[u] = span_of(floats[u]);
        at += (uint64_t)arrays * nv->span[u];
        nv->slot_span = nv->span[u] > nv->slot_span ? nv->span[u] : nv->slot_span;
    }
    nv->file_bytes = at;
    /* A fresh file reads as zeros (fallocate), which is what the moments start as: every
     * block's checksum starts as that of zeros. */
    void *zeros = calloc(1, nv->block);
    if (!zeros) {
        res = zs_error(ZS_ERR_NOMEM, "nvme: out of memory");
        goto fail;
    }
    uint64_t zero_block = XXH3_64bits(zeros, nv->block);
    for (int u = 0; u < units && res == ZS_OK; u++) {
        size_t nb = blocks_of(nv, u);
        nv->sums[u] = malloc((size_t)arrays * nb * sizeof(uint64_t));
        if (!nv->sums[u]) {
            res = zs_error(ZS_ERR_NOMEM, "nvme: out of memory for checksums");
            break;
        }
        for (size_t b = 0; b < nb; b++) {
            size_t len = len_of(nv, u, b);
            uint64_t h = len == nv->block ? zero_block : XXH3_64bits(zeros, len);
            for (int a = 0; a < arrays; a++)
                nv->sums[u][(size_t)a * nb + b] = h;
        }
    }
    free(zeros);
    if (res != ZS_OK)
        goto fail;
    if (nv->slot_span == 0)
        nv->slot_span = ALIGN;
    size_t slot_bytes = (size_t)(SLOTS * (uint64_t)arrays * nv->slot_span);
    if (posix_memalign((void **)&nv->slots, ALIGN, slot_bytes) != 0) {
        nv->slots = NULL;
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for %.1f MiB of NVMe slots", nv->owner,
                       (double)slot_bytes / (1 << 20));
        goto fail;
    }
    memset(nv->slots, 0, slot_bytes);
    ZS_CHECK_GOTO(open_file(nv, o->dir), res, fail);
    ZS_CHECK_GOTO(allocate_file(nv, o->dir), res, fail_fd);
    ZS_CHECK_GOTO(open_ring(nv), res, fail_fd);
    *out = nv;
    return ZS_OK;
fail_fd:
    close(nv->fd);
    nv->fd = -1;
fail:
    zs_nvme_close(nv);
    return res;
}

void zs_nvme_close(zs_nvme *nv)
{
    if (!nv)
        return;
    if (nv->have_ring)
        io_uring_queue_exit(&nv->ring);
    if (nv->fd >= 0)
        close(nv->fd);
    for (int u = 0; nv->sums && u < nv->units; u++)
        free(nv->sums[u]);
    free(nv->sums);
    free(nv->span);
    free(nv->base);
    free(nv->floats);
    free(nv->labels);
    free(nv->slots);
    pthread_mutex_destroy(&nv->lock);
    free(nv);
}

/* ---- requests ---------------------------------------------------------------------------- */

static uint64_t tag_of(int s, int write, int a, size_t b)
{
    return (uint64_t)s << 48 | (uint64_t)write << 47 | (uint64_t)a << 40 | (uint64_t)b;
}

static void record_failure(zs_nvme *nv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void record_failure(zs_nvme *nv, const char *fmt, ...)
{
    if (nv->failed != ZS_OK)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nv->why, sizeof nv->why, fmt, ap);
    va_end(ap);
    nv->failed = ZS_ERR_IO;
}

/* "shard 12" (the caller's label) or "unit 3", in buf. */
static const char *unit_name(const zs_nvme *nv, int u, char *buf, size_t n)
{
    if (nv->labels && u >= 0 && u < nv->units)
        snprintf(buf, n, "shard %d", nv->labels[u]);
    else
        snprintf(buf, n, "unit %d", u);
    return buf;
}

static const char *array_name(const zs_nvme *nv, int a)
{
    return nv->names[a];
}

/* A request that completed with res (bytes, or -errno): its slot has one request fewer, and a
 * failure is recorded with the file, offset, unit and array. */
static void complete(zs_nvme *nv, uint64_t tag, int res)
{
    int s = (int)(tag >> 48), write = (int)(tag >> 47 & 1), a = (int)(tag >> 40 & 0x7f);
    size_t b = (size_t)(tag & 0xffffffffffull);
    nv->inflight--;
    nv->pending[s]--;
    int u = nv->slot_unit[s];
    uint64_t off = offset_of(nv, u, a, b);
    size_t len = len_of(nv, u, b);
    if (!write && nv->eio_at && nv->eio_at - 1 >= off && nv->eio_at - 1 < off + len)
        res = -EIO;
    char name[32];
    if (res < 0)
        record_failure(nv, "%s: %s of %zu bytes at offset %llu (%s %s): %s", nv->path,
                       write ? "write" : "read", len, (unsigned long long)off,
                       unit_name(nv, u, name, sizeof name), array_name(nv, a), strerror(-res));
    else if ((size_t)res != len)
        record_failure(nv, "%s: short %s: %d of %zu bytes at offset %llu (%s %s)", nv->path,
                       write ? "write" : "read", res, len, (unsigned long long)off,
                       unit_name(nv, u, name, sizeof name), array_name(nv, a));
    else if (write)
        nv->stats.bytes_written += len;
    else
        nv->stats.bytes_read += len;
}

/* Takes one completion from the ring, waiting for it. */
static void reap_one(zs_nvme *nv)
{
    if (nv->unsubmitted) {
        io_uring_submit(&nv->ring);
        nv->unsubmitted = 0;
    }
    struct io_uring_cqe *cqe;
    int rc;
    while ((rc = io_uring_wait_cqe(&nv->ring, &cqe)) == -EINTR)
        ;
    if (rc < 0) {
        record_failure(nv, "%s: io_uring_wait_cqe: %s", nv->path, strerror(-rc));
        nv->inflight = 0;
        for (int s = 0; s < SLOTS; s++)
            nv->pending[s] = 0;
        return;
    }
    uint64_t tag = io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&nv->ring, cqe);
    complete(nv, tag, res);
}

/* Queues one request, first making room (the ring's depth bounds what is in flight). */
static void queue_one(zs_nvme *nv, int s, int write, int a, size_t b)
{
    if (!nv->have_ring) {
        int u = nv->slot_unit[s];
        uint8_t *buf = slot_buf(nv, s, a) + b * nv->block;
        size_t len = len_of(nv, u, b);
        off_t off = (off_t)offset_of(nv, u, a, b);
        ssize_t r;
        do
            r = write ? pwrite(nv->fd, buf, len, off) : pread(nv->fd, buf, len, off);
        while (r < 0 && errno == EINTR);
        nv->inflight++;
        nv->pending[s]++;
        complete(nv, tag_of(s, write, a, b), r < 0 ? -errno : (int)r);
        return;
    }
    if (nv->inflight >= nv->queue_depth) {
        double t0 = zs_now_s();
        while (nv->inflight >= nv->queue_depth)
            reap_one(nv);
        nv->stats.wait_ms += (zs_now_s() - t0) * 1000.0;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&nv->ring);
    if (!sqe) {
        io_uring_submit(&nv->ring);
        nv->unsubmitted = 0;
        sqe = io_uring_get_sqe(&nv->ring);
    }
    int u = nv->slot_unit[s];
    uint8_t *buf = slot_buf(nv, s, a) + b * nv->block;
    size_t len = len_of(nv, u, b);
    uint64_t off = offset_of(nv, u, a, b);
    int fd = nv->fixed_file ? 0 : nv->fd;
    if (nv->fixed_bufs) {
        int idx = s * nv->arrays + a;
        if (write)
            io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)len, off, idx);
        else
            io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, off, idx);
    } else if (write) {
        io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
    } else {
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
    }
    if (nv->fixed_file)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, tag_of(s, write, a, b));
    nv->inflight++;
    nv->pending[s]++;
    nv->unsubmitted++;
}

/* Queues the reads (or writes) of blocks [b0, b1) of every array of unit u through slot s. */
static void queue_unit(zs_nvme *nv, int s, int u, int write, size_t b0, size_t b1, int only_a)
{
    nv->slot_unit[s] = u;
    for (int a = 0; a < nv->arrays; a++)
        if (only_a < 0 || a == only_a)
            for (size_t b = b0; b < b1; b++)
                queue_one(nv, s, write, a, b);
    if (nv->unsubmitted) {
        io_uring_submit(&nv->ring);
        nv->unsubmitted = 0;
    }
}

/* Waits until slot s has nothing in flight. */
static void drain_slot(zs_nvme *nv, int s)
{
    double t0 = zs_now_s();
    while (nv->pending[s] > 0)
        reap_one(nv);
    nv->stats.wait_ms += (zs_now_s() - t0) * 1000.0;
}

static void drain_all(zs_nvme *nv)
{
    for (int s = 0; s < SLOTS; s++)
        drain_slot(nv, s);
}

/* Checks blocks [b0, b1) of the arrays of slot s (unit slot_unit[s]) against their checksums:
 * ZS_OK, or an error naming the first block that differs. */
static zs_err verify(zs_nvme *nv, int s, size_t b0, size_t b1, int only_a)
{
    int u = nv->slot_unit[s];
    size_t nb = blocks_of(nv, u);
    long long bad = LLONG_MAX; /* a * nb + b of the first bad block; LLONG_MAX: none */
    long long total = (long long)nv->arrays * (long long)nb;
    int nt = hash_threads(nv, u);
#pragma omp parallel for schedule(static) reduction(min : bad) num_threads(nt)
    for (long long k = 0; k < total; k++) {
        int a = (int)(k / (long long)nb);
        size_t b = (size_t)(k % (long long)nb);
        if (b < b0 || b >= b1 || (only_a >= 0 && a != only_a))
            continue;
        if (XXH3_64bits(slot_buf(nv, s, a) + b * nv->block, len_of(nv, u, b)) != nv->sums[u][k])
            bad = k < bad ? k : bad;
    }
    if (bad == LLONG_MAX)
        return ZS_OK;
    int a = (int)(bad / (long long)nb);
    size_t b = (size_t)(bad % (long long)nb);
    char name[32];
    return zs_error(ZS_ERR_FORMAT,
                    "%s: block of %zu bytes at offset %llu (%s %s, elements %zu..%zu) "
                    "fails its checksum: the data on disk is not what was written",
                    nv->path, len_of(nv, u, b), (unsigned long long)offset_of(nv, u, a, b),
                    unit_name(nv, u, name, sizeof name), array_name(nv, a),
                    b * nv->block / (size_t)nv->elem[a],
                    (b * nv->block + len_of(nv, u, b)) / (size_t)nv->elem[a]);
}

/* New checksums for what slot s is about to write for unit u. */
static void checksum(zs_nvme *nv, int s, int u, size_t b0, size_t b1, int only_a)
{
    size_t nb = blocks_of(nv, u);
    long long total = (long long)nv->arrays * (long long)nb;
    int nt = hash_threads(nv, u);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long long k = 0; k < total; k++) {
        int a = (int)(k / (long long)nb);
        size_t b = (size_t)(k % (long long)nb);
        if (b < b0 || b >= b1 || (only_a >= 0 && a != only_a))
            continue;
        nv->sums[u][k] = XXH3_64bits(slot_buf(nv, s, a) + b * nv->block, len_of(nv, u, b));
    }
}

/* The failure recorded by a completion, as this call's error, and cleared for the next. */
static zs_err take_failure(zs_nvme *nv)
{
    if (nv->failed == ZS_OK)
        return ZS_OK;
    zs_err e = zs_error(nv->failed, "%s", nv->why);
    nv->failed = ZS_OK;
    return e;
}

static zs_err check_unit(const zs_nvme *nv, int u, int a)
{
    if (u < 0 || u >= nv->units || a < 0 || a >= nv->arrays)
        return zs_error(ZS_ERR_INVALID, "%s: no unit %d array %d (%d units of %d)", nv->path, u, a,
                        nv->units, nv->arrays);
    return ZS_OK;
}

static zs_err store_locked(zs_nvme *nv, int u, int a, const float *src)
{
    ZS_CHECK(check_unit(nv, u, a));
    size_t bytes = nv->floats[u] * sizeof(float);
    uint8_t *buf = slot_buf(nv, 0, a);
    memcpy(buf, src, bytes);
    memset(buf + bytes, 0, (size_t)(nv->span[u] - bytes));
    nv->slot_unit[0] = u;
    checksum(nv, 0, u, 0, blocks_of(nv, u), a);
    queue_unit(nv, 0, u, 1, 0, blocks_of(nv, u), a);
    drain_slot(nv, 0);
    return take_failure(nv);
}

static zs_err load_locked(zs_nvme *nv, int u, int a, size_t off, size_t count, float *dst)
{
    ZS_CHECK(check_unit(nv, u, a));
    if (off > nv->floats[u] || count > nv->floats[u] - off)
        return zs_error(ZS_ERR_INVALID, "%s: elements %zu..%zu of unit %d (%zu elements)", nv->path,
                        off, off + count, u, nv->floats[u]);
    if (count == 0)
        return ZS_OK;
    size_t b0 = off * sizeof(float) / nv->block;
    size_t b1 = ((off + count) * sizeof(float) + nv->block - 1) / nv->block;
    queue_unit(nv, 0, u, 0, b0, b1, a);
    drain_slot(nv, 0);
    ZS_CHECK(take_failure(nv));
    ZS_CHECK(verify(nv, 0, b0, b1, a));
    memcpy(dst, slot_buf(nv, 0, a) + off * sizeof(float), count * sizeof(float));
    return ZS_OK;
}

static zs_err run_locked(zs_nvme *nv, zs_nvme_work_fn work, void *ctx)
{
    if (nv->units == 0)
        return ZS_OK;
    zs_err res = ZS_OK;
    queue_unit(nv, 0, 0, 0, 0, blocks_of(nv, 0), -1);
    for (int u = 0; u < nv->units && res == ZS_OK; u++) {
        int s = u % SLOTS;
        if (u + 1 < nv->units) {
            /* Unit u+1's slot last held unit u-2, whose write-back must be done first. */
            int s1 = (u + 1) % SLOTS;
            drain_slot(nv, s1);
            if ((res = take_failure(nv)) != ZS_OK)
                break;
            queue_unit(nv, s1, u + 1, 0, 0, blocks_of(nv, u + 1), -1);
        }
        drain_slot(nv, s);
        if ((res = take_failure(nv)) != ZS_OK || (res = verify(nv, s, 0, blocks_of(nv, u), -1)))
            break;
        float *arrays[ZS_NVME_MAX_ARRAYS];
        for (int a = 0; a < nv->arrays; a++)
            arrays[a] = (float *)slot_buf(nv, s, a);
        double t0 = zs_now_s();
        res = work(ctx, u, arrays);
        nv->stats.work_ms += (zs_now_s() - t0) * 1000.0;
        if (res != ZS_OK)
            break;
        checksum(nv, s, u, 0, blocks_of(nv, u), -1);
        queue_unit(nv, s, u, 1, 0, blocks_of(nv, u), -1);
    }
    /* Whatever is still in flight finishes before the slots can be used again. */
    drain_all(nv);
    zs_err late = take_failure(nv);
    return res != ZS_OK ? res : late;
}

zs_err zs_nvme_store(zs_nvme *nv, int u, int a, const float *src)
{
    pthread_mutex_lock(&nv->lock);
    zs_err e = store_locked(nv, u, a, src);
    pthread_mutex_unlock(&nv->lock);
    return e;
}

zs_err zs_nvme_load(zs_nvme *nv, int u, int a, size_t off, size_t count, float *dst)
{
    pthread_mutex_lock(&nv->lock);
    zs_err e = load_locked(nv, u, a, off, count, dst);
    pthread_mutex_unlock(&nv->lock);
    return e;
}

zs_err zs_nvme_run(zs_nvme *nv, zs_nvme_work_fn work, void *ctx)
{
    pthread_mutex_lock(&nv->lock);
    zs_err e = run_locked(nv, work, ctx);
    pthread_mutex_unlock(&nv->lock);
    return e;
}
