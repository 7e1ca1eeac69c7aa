/*
 * nvme: the state file, the units' own files, their checksums, and the three-slot pipeline over
 * io_uring.
 *
 * Layout: a unit's arrays are one extent, array a at pos[a] * 4n bytes into it (n: the unit's
 * floats).  In a unit's own file the extent starts at own = header + lead * 4n, which need not
 * be aligned: the unit's span is the extent with the delta = own % 4096 bytes before it, rounded
 * up to 4096, so that every request is aligned.  In the state file units' spans follow each
 * other from base[u], each with the same delta, so a slot holds a unit the same way wherever
 * it came from.  Requests are blocks of block_bytes from the start of a span, the last one
 * shorter; each block's checksum is XXH3-64 of the bytes of the extent it holds (not of the
 * bytes before or after the extent, which are not the tier's: in a unit's own file the head of
 * the first block may be the end of the weights a checkpoint writes there later, and the tail
 * of the last one lies past the end of a file that was cut to its size, so a read may come
 * back short by them).
 *
 * A request's user_data says which slot it belongs to, whether it is a write, and its block, so
 * a completion finds its unit (slot_unit) and can name its file and offset.
 *
 * Without io_uring (a container whose seccomp profile refuses it, a kernel without it), every
 * request is a pread or pwrite made at once, one at a time, and completes through the same
 * path; the tier says so once when it opens.
 *
 * Test hooks (docs/nvme.md): ZS_NVME_INJECT_EIO=OFFSET in the environment makes every read
 * whose range holds that file offset (in any of the tier's files) complete with EIO;
 * ZS_NVME_NO_URING=1 takes the path without io_uring.  Nothing else reads them.
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
#include <sys/resource.h>
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
    int fd; /* the state file */
    char dir[PATH_MAX];
    char path[PATH_MAX + 64];
    char owner[64];
    int units, arrays;
    size_t *floats; /* [units] elements per array */
    int *labels;    /* [units] the shard each unit is, for messages; NULL: none */
    char names[ZS_NVME_MAX_ARRAYS][32]; /* each array's name in messages */
    int elem[ZS_NVME_MAX_ARRAYS];       /* bytes of its element, in messages */
    int pos[ZS_NVME_MAX_ARRAYS];        /* each array's place in the extent */
    uint64_t header;                    /* a unit's own file: bytes before position 0 ... */
    int lead;                           /* ... and arrays of the unit's length not in the tier */
    uint64_t *base;                     /* [units] state-file offset of the unit's span */
    uint64_t *span;                     /* [units] bytes of the span (4096-multiple) */
    uint64_t *delta;                    /* [units] where the extent starts in the span */
    char **loc;      /* [units] the unit's own file that holds it now; NULL: the state file */
    int *loc_fd;     /* [units] that file, open from its write until the unit moves: its name may
                        go meanwhile (a checkpoint discarded or removed) without the data */
    int own_open;    /* files held open so */
    int own_max;     /* at most a quarter of RLIMIT_NOFILE's soft limit: the rest is the
                        server's (connections); more units go to the state file */
    uint64_t **sums; /* [units][blocks(unit)] XXH3 of each block's extent bytes as last written */
    size_t block;    /* request bytes */
    int queue_depth;
    int threads;
    uint64_t file_bytes;
    struct io_uring ring;
    int have_ring; /* 0: requests are preads and pwrites made at once */
    int fixed_bufs, fixed_file, direct;
    uint64_t slot_span;           /* bytes per slot: the largest span */
    uint8_t *slots;               /* SLOTS * slot_span, 4096-aligned */
    int slot_unit[SLOTS];         /* the unit a slot holds or is moving, -1: none */
    int slot_fd[SLOTS];           /* the file its requests go to */
    uint64_t slot_off[SLOTS];     /* that file's offset of the span */
    const char *slot_path[SLOTS]; /* that file's name, for messages */
    int pending[SLOTS];           /* its requests not completed */
    int unsubmitted;              /* SQEs prepared and not yet submitted */
    int inflight;                 /* requests submitted or prepared, not completed */
    zs_err failed;                /* the first failed completion, kept until the run ends */
    char why[PATH_MAX + 512];
    uint64_t eio_at; /* test hook: file offset + 1 whose reads fail; 0: none */
    zs_nvme_stats stats;
    zs_log_limit own_failed; /* "cannot write shard N's own file": at a bounded rate */
    pthread_mutex_t lock;    /* one caller at a time: the server thread or its checkpoint writer */
};

static uint64_t round_up(uint64_t x, uint64_t m)
{
    return (x + m - 1) / m * m;
}

static uint64_t array_bytes(const zs_nvme *nv, int u)
{
    return (uint64_t)nv->floats[u] * sizeof(float);
}

static uint64_t extent_bytes(const zs_nvme *nv, int u)
{
    return (uint64_t)nv->arrays * array_bytes(nv, u);
}

/* Where the extent starts in the unit's own file, and where its span does. */
static uint64_t own_extent(const zs_nvme *nv, int u)
{
    return nv->header + (uint64_t)nv->lead * array_bytes(nv, u);
}

static uint64_t own_span(const zs_nvme *nv, int u)
{
    return own_extent(nv, u) - nv->delta[u];
}

static size_t blocks_of(const zs_nvme *nv, int u)
{
    return (size_t)((nv->span[u] + nv->block - 1) / nv->block);
}

static uint8_t *slot_buf(const zs_nvme *nv, int s)
{
    return nv->slots + (uint64_t)s * nv->slot_span;
}

/* Block b of unit u: bytes [b * block, + len) of the span; of them [lo, hi) are the extent's. */
static size_t len_of(const zs_nvme *nv, int u, size_t b)
{
    uint64_t left = nv->span[u] - (uint64_t)b * nv->block;
    return (size_t)(left < nv->block ? left : nv->block);
}

static void extent_part(const zs_nvme *nv, int u, size_t b, uint64_t *lo, uint64_t *hi)
{
    uint64_t s = (uint64_t)b * nv->block, e = s + len_of(nv, u, b);
    uint64_t xs = nv->delta[u], xe = xs + extent_bytes(nv, u);
    *lo = s > xs ? s : xs;
    *hi = e < xe ? e : xe;
}

const char *zs_nvme_path(const zs_nvme *nv)
{
    return nv->path;
}

uint64_t zs_nvme_file_bytes(const zs_nvme *nv)
{
    return nv->file_bytes;
}

/* Where a unit of n floats starts in its span, and the span's bytes, for a layout of `arrays`
 * arrays after `header` bytes and `lead` arrays in its own file. */
static uint64_t delta_of(uint64_t header, int lead, size_t n)
{
    return (header + (uint64_t)lead * n * sizeof(float)) % ALIGN;
}

static uint64_t span_of(uint64_t header, int lead, int arrays, size_t n)
{
    uint64_t s = round_up(delta_of(header, lead, n) + (uint64_t)arrays * n * sizeof(float), ALIGN);
    return s ? s : ALIGN;
}

uint64_t zs_nvme_slot_bytes(const zs_nvme_opts *o, int arrays, const size_t *floats, int units)
{
    uint64_t most = ALIGN;
    for (int u = 0; u < units; u++) {
        uint64_t s = span_of(o->file_header, o->file_lead, arrays, floats[u]);
        most = s > most ? s : most;
    }
    return SLOTS * most;
}

/* Threads for the checksums of unit u: one unless the unit is large. */
static int hash_threads(const zs_nvme *nv, int u)
{
    return nv->span[u] >= PARALLEL_HASH_BYTES ? nv->threads : 1;
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

/* Allocates bytes [off, off + len) of fd now, so that a disk too small is an error before any
 * request, not in the middle of a run: 0 or an errno. */
static int allocate(int fd, uint64_t off, uint64_t len)
{
    if (len == 0)
        return 0;
    int rc = fallocate(fd, 0, (off_t)off, (off_t)len) == 0 ? 0 : errno;
    if (rc == EOPNOTSUPP)
        rc = posix_fallocate(fd, (off_t)off, (off_t)len);
    return rc;
}

static zs_err allocate_file(zs_nvme *nv, const char *dir)
{
    int rc = allocate(nv->fd, 0, nv->file_bytes);
    char size[32];
    if (rc)
        return zs_error(ZS_ERR_IO, "%s: nvme_path %s: cannot allocate %s for the state file: %s",
                        nv->owner, dir, zs_mem_text(nv->file_bytes, size, sizeof size),
                        strerror(rc));
    return ZS_OK;
}

/* The ring, with the state file and the slots registered where the kernel and limits allow. */
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
    struct iovec iov[SLOTS];
    for (int s = 0; s < SLOTS; s++)
        iov[s] = (struct iovec){.iov_base = slot_buf(nv, s), .iov_len = (size_t)nv->slot_span};
    rc = io_uring_register_buffers(&nv->ring, iov, SLOTS);
    nv->fixed_bufs = rc == 0;
    if (rc < 0) /* pinned memory counts against RLIMIT_MEMLOCK for unprivileged users */
        ZS_INFO("%s: io_uring cannot register the %.1f MiB of state slots (%s); using unregistered "
                "buffers",
                nv->owner, (double)SLOTS * (double)nv->slot_span / (1 << 20), strerror(-rc));
    return ZS_OK;
}

/* Checks o's layout of a unit's own file: the positions are a permutation of 0..arrays-1. */
static zs_err check_layout(const zs_nvme_opts *o, int arrays)
{
    int seen[ZS_NVME_MAX_ARRAYS] = {0};
    for (int a = 0; a < arrays; a++) {
        int p = o->file_pos[a];
        if (p < 0 || p >= arrays || seen[p]++)
            return zs_error(ZS_ERR_INVALID,
                            "nvme: file positions of the %d arrays are not a "
                            "permutation",
                            arrays);
    }
    if (o->file_lead < 0 || o->file_lead > 16)
        return zs_error(ZS_ERR_INVALID, "nvme: %d arrays before the tier's", o->file_lead);
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
    zs_nvme_opts lay = *o;
    int given = 0;
    for (int a = 0; a < arrays; a++)
        given |= o->file_pos[a] != 0;
    if (!given) /* none given: the arrays in their order */
        for (int a = 0; a < arrays; a++)
            lay.file_pos[a] = a;
    ZS_CHECK(check_layout(&lay, arrays));
    zs_nvme *nv = calloc(1, sizeof *nv);
    if (!nv)
        return zs_error(ZS_ERR_NOMEM, "nvme: out of memory");
    pthread_mutex_init(&nv->lock, NULL);
    nv->fd = -1;
    snprintf(nv->owner, sizeof nv->owner, "%s", o->owner ? o->owner : "nvme");
    snprintf(nv->dir, sizeof nv->dir, "%s", o->dir);
    snprintf(nv->path, sizeof nv->path, "%s/(state file of %s)", o->dir, nv->owner);
    nv->units = units;
    nv->arrays = arrays;
    nv->block = o->block_bytes;
    nv->queue_depth = o->queue_depth;
    nv->threads = o->threads > 0 ? o->threads : 1;
    nv->header = o->file_header;
    nv->lead = o->file_lead;
    static const char *const dflt[ZS_NVME_MAX_ARRAYS] = {"exp_avg", "exp_avg_sq", "weights",
                                                         "array 3"};
    for (int a = 0; a < ZS_NVME_MAX_ARRAYS; a++) {
        snprintf(nv->names[a], sizeof nv->names[a], "%s", o->names[a] ? o->names[a] : dflt[a]);
        nv->elem[a] = o->elem_bytes[a] > 0 ? o->elem_bytes[a] : 4;
        nv->pos[a] = a < arrays ? lay.file_pos[a] : 0;
    }
    for (int s = 0; s < SLOTS; s++) {
        nv->slot_unit[s] = -1;
        nv->slot_fd[s] = -1;
    }
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
    nv->delta = calloc((size_t)units + 1, sizeof *nv->delta);
    nv->loc = calloc((size_t)units + 1, sizeof *nv->loc);
    nv->loc_fd = malloc(((size_t)units + 1) * sizeof *nv->loc_fd);
    for (int u = 0; nv->loc_fd && u < units; u++)
        nv->loc_fd[u] = -1;
    nv->sums = calloc((size_t)units + 1, sizeof *nv->sums);
    if (!nv->floats || !nv->base || !nv->span || !nv->delta || !nv->loc || !nv->loc_fd ||
        !nv->sums) {
        res = zs_error(ZS_ERR_NOMEM, "nvme: out of memory for %d units", units);
        goto fail;
    }
    uint64_t at = 0;
    struct rlimit nofile;
    nv->own_max = getrlimit(RLIMIT_NOFILE, &nofile) != 0  ? 0
                  : nofile.rlim_cur == RLIM_INFINITY      ? INT_MAX
                  : nofile.rlim_cur / 4 > (rlim_t)INT_MAX ? INT_MAX
                                                          : (int)(nofile.rlim_cur / 4);
    for (int u = 0; u < units; u++) {
        nv->floats[u] = floats[u];
        nv->delta[u] = delta_of(nv->header, nv->lead, floats[u]);
        nv->base[u] = at;
        nv->span[u] = span_of(nv->header, nv->lead, arrays, floats[u]);
        at += nv->span[u];
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
        nv->sums[u] = malloc(nb * sizeof(uint64_t));
        if (!nv->sums[u]) {
            res = zs_error(ZS_ERR_NOMEM, "nvme: out of memory for checksums");
            break;
        }
        for (size_t b = 0; b < nb; b++) {
            uint64_t lo, hi;
            extent_part(nv, u, b, &lo, &hi);
            nv->sums[u][b] = hi - lo == nv->block ? zero_block : XXH3_64bits(zeros, hi - lo);
        }
    }
    free(zeros);
    if (res != ZS_OK)
        goto fail;
    if (nv->slot_span == 0)
        nv->slot_span = ALIGN;
    size_t slot_bytes = (size_t)(SLOTS * nv->slot_span);
    if (posix_memalign((void **)&nv->slots, ALIGN, slot_bytes) != 0) {
        nv->slots = NULL;
        res = zs_error(ZS_ERR_NOMEM, "%s: out of memory for %.1f MiB of NVMe slots", nv->owner,
                       (double)slot_bytes / (1 << 20));
        goto fail;
    }
    memset(nv->slots, 0, slot_bytes);
    ZS_CHECK_GOTO(open_file(nv, o->dir), res, fail);
    ZS_CHECK_GOTO(allocate_file(nv, o->dir), res, fail);
    ZS_CHECK_GOTO(open_ring(nv), res, fail);
    *out = nv;
    return ZS_OK;
fail: /* zs_nvme_close closes the state file if it was opened */
    zs_nvme_close(nv);
    return res;
}

void zs_nvme_close(zs_nvme *nv)
{
    if (!nv)
        return;
    if (nv->have_ring)
        io_uring_queue_exit(&nv->ring);
    for (int u = 0; nv->loc_fd && u < nv->units; u++)
        if (nv->loc_fd[u] >= 0)
            close(nv->loc_fd[u]);
    if (nv->fd >= 0)
        close(nv->fd);
    for (int u = 0; nv->sums && u < nv->units; u++)
        free(nv->sums[u]);
    for (int u = 0; nv->loc && u < nv->units; u++)
        free(nv->loc[u]);
    free(nv->sums);
    free(nv->loc);
    free(nv->loc_fd);
    free(nv->delta);
    free(nv->span);
    free(nv->base);
    free(nv->floats);
    free(nv->labels);
    free(nv->slots);
    pthread_mutex_destroy(&nv->lock);
    free(nv);
}

/* ---- requests ---------------------------------------------------------------------------- */

static uint64_t tag_of(int s, int write, size_t b)
{
    return (uint64_t)s << 48 | (uint64_t)write << 47 | (uint64_t)b;
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

/* The array whose bytes start block b of unit u, and the elements of it the block holds. */
static int block_array(const zs_nvme *nv, int u, size_t b, size_t *e0, size_t *e1)
{
    uint64_t lo, hi, ab = array_bytes(nv, u);
    extent_part(nv, u, b, &lo, &hi);
    uint64_t x = lo - nv->delta[u];
    int p = ab ? (int)(x / ab) : 0, a = 0;
    for (int k = 0; k < nv->arrays; k++)
        if (nv->pos[k] == p)
            a = k;
    uint64_t in = x - (uint64_t)p * ab, end = hi - nv->delta[u] - (uint64_t)p * ab;
    *e0 = (size_t)(in / (uint64_t)nv->elem[a]);
    *e1 = (size_t)((end < ab ? end : ab) / (uint64_t)nv->elem[a]);
    return a;
}

/* "unit 1 exp_avg" or "shard 4 weights": what block b of unit u holds first. */
static const char *block_name(const zs_nvme *nv, int u, size_t b, char *buf, size_t n)
{
    char name[32];
    size_t e0, e1;
    int a = block_array(nv, u, b, &e0, &e1);
    snprintf(buf, n, "%s %s", unit_name(nv, u, name, sizeof name), nv->names[a]);
    return buf;
}

/* A request that completed with res (bytes, or -errno): its slot has one request fewer, and a
 * failure is recorded with the file, offset, unit and array.  A read may come back short by
 * the bytes past the unit's extent (a file cut to its size), never by the extent's own. */
static void complete(zs_nvme *nv, uint64_t tag, int res)
{
    int s = (int)(tag >> 48), write = (int)(tag >> 47 & 1);
    size_t b = (size_t)(tag & 0xffffffffffull);
    nv->inflight--;
    nv->pending[s]--;
    int u = nv->slot_unit[s];
    uint64_t off = nv->slot_off[s] + (uint64_t)b * nv->block;
    size_t len = len_of(nv, u, b);
    uint64_t lo, hi;
    extent_part(nv, u, b, &lo, &hi);
    size_t need = write ? len : (size_t)(hi - (uint64_t)b * nv->block);
    if (!write && nv->eio_at && nv->eio_at - 1 >= off && nv->eio_at - 1 < off + len)
        res = -EIO;
    char name[64];
    if (res < 0)
        record_failure(nv, "%s: %s of %zu bytes at offset %llu (%s): %s", nv->slot_path[s],
                       write ? "write" : "read", len, (unsigned long long)off,
                       block_name(nv, u, b, name, sizeof name), strerror(-res));
    else if ((size_t)res < need)
        record_failure(nv, "%s: short %s: %d of %zu bytes at offset %llu (%s)", nv->slot_path[s],
                       write ? "write" : "read", res, len, (unsigned long long)off,
                       block_name(nv, u, b, name, sizeof name));
    else if (write)
        nv->stats.bytes_written += len;
    else
        nv->stats.bytes_read += (uint64_t)res;
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
static void queue_one(zs_nvme *nv, int s, int write, size_t b)
{
    int u = nv->slot_unit[s];
    uint8_t *buf = slot_buf(nv, s) + b * nv->block;
    size_t len = len_of(nv, u, b);
    uint64_t off = nv->slot_off[s] + (uint64_t)b * nv->block;
    if (!nv->have_ring) {
        ssize_t r;
        do
            r = write ? pwrite(nv->slot_fd[s], buf, len, (off_t)off)
                      : pread(nv->slot_fd[s], buf, len, (off_t)off);
        while (r < 0 && errno == EINTR);
        nv->inflight++;
        nv->pending[s]++;
        complete(nv, tag_of(s, write, b), r < 0 ? -errno : (int)r);
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
    int fixed = nv->fixed_file && nv->slot_fd[s] == nv->fd;
    int fd = fixed ? 0 : nv->slot_fd[s];
    if (nv->fixed_bufs) {
        if (write)
            io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)len, off, s);
        else
            io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, off, s);
    } else if (write) {
        io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
    } else {
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
    }
    if (fixed)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, tag_of(s, write, b));
    nv->inflight++;
    nv->pending[s]++;
    nv->unsubmitted++;
}

/* Queues the reads (or writes) of blocks [b0, b1) of slot s's unit. */
static void queue_blocks(zs_nvme *nv, int s, int write, size_t b0, size_t b1)
{
    for (size_t b = b0; b < b1; b++)
        queue_one(nv, s, write, b);
    if (nv->unsubmitted) {
        io_uring_submit(&nv->ring);
        nv->unsubmitted = 0;
    }
}

/* Slot s has no requests any more. */
static void slot_release(zs_nvme *nv, int s)
{
    nv->slot_fd[s] = -1;
}

/* Waits until slot s has nothing in flight. */
static void drain_slot(zs_nvme *nv, int s)
{
    double t0 = zs_now_s();
    while (nv->pending[s] > 0)
        reap_one(nv);
    nv->stats.wait_ms += (zs_now_s() - t0) * 1000.0;
    slot_release(nv, s);
}

static void drain_all(zs_nvme *nv)
{
    for (int s = 0; s < SLOTS; s++)
        drain_slot(nv, s);
}

/* Opens path for the tier's requests, with O_DIRECT where its file system takes it. */
static int open_own(const zs_nvme *nv, const char *path, int flags)
{
    int fd = nv->direct ? open(path, flags | O_CLOEXEC | O_DIRECT, 0644) : -1;
    if (fd < 0 && (!nv->direct || errno == EINVAL))
        fd = open(path, flags | O_CLOEXEC, 0644);
    return fd;
}

/* Points slot s (drained) at unit u's place: for a read, where the unit is now (its file's
 * descriptor, held); for a write, the file `to` (created, or emptied, and allocated: its
 * descriptor goes to set_location, which holds it) or, with to NULL, the state file. */
static zs_err slot_target(zs_nvme *nv, int s, int u, int write, const char *to)
{
    slot_release(nv, s);
    nv->slot_unit[s] = u;
    const char *own = write ? to : nv->loc[u];
    if (!own) {
        nv->slot_fd[s] = nv->fd;
        nv->slot_off[s] = nv->base[u];
        nv->slot_path[s] = nv->path;
        return ZS_OK;
    }
    if (!write) {
        nv->slot_fd[s] = nv->loc_fd[u];
        nv->slot_off[s] = own_span(nv, u);
        nv->slot_path[s] = own;
        return ZS_OK;
    }
    char name[32];
    if (nv->own_open >= nv->own_max)
        return zs_error(ZS_ERR_IO,
                        "%s: %s: the tier holds %d files open already (a quarter of "
                        "RLIMIT_NOFILE)",
                        own, unit_name(nv, u, name, sizeof name), nv->own_open);
    int fd = open_own(nv, own, O_RDWR | O_CREAT | O_TRUNC);
    if (fd < 0)
        return zs_error(ZS_ERR_IO, "%s: cannot open %s's file: %s", own,
                        unit_name(nv, u, name, sizeof name), strerror(errno));
    int rc = allocate(fd, own_span(nv, u), nv->span[u]);
    if (rc) {
        close(fd);
        unlink(own);
        char size[32];
        return zs_error(ZS_ERR_IO, "%s: cannot allocate %s for %s: %s", own,
                        zs_mem_text(nv->span[u], size, sizeof size),
                        unit_name(nv, u, name, sizeof name), strerror(rc));
    }
    nv->slot_fd[s] = fd;
    nv->slot_off[s] = own_span(nv, u);
    nv->slot_path[s] = own;
    return ZS_OK;
}

/* Unit u is where its write now goes (slot s): its own file `to`, whose descriptor slot_target
 * opened and the tier now holds, or the state file.  The file it was in before is let go (its
 * reads are done). */
static zs_err set_location(zs_nvme *nv, int s, int u, const char *to)
{
    char *p = NULL;
    if (to && !(p = strdup(to))) {
        close(nv->slot_fd[s]);
        nv->slot_fd[s] = -1;
        return zs_error(ZS_ERR_NOMEM, "nvme: out of memory");
    }
    if (nv->loc_fd[u] >= 0) {
        close(nv->loc_fd[u]);
        nv->own_open--;
    }
    nv->loc_fd[u] = to ? nv->slot_fd[s] : -1;
    nv->own_open += to != NULL;
    free(nv->loc[u]);
    nv->loc[u] = p;
    return ZS_OK;
}

/* Checks blocks [b0, b1) of slot s (unit slot_unit[s]) against their checksums: ZS_OK, or an
 * error naming the first block that differs. */
static zs_err verify(zs_nvme *nv, int s, size_t b0, size_t b1)
{
    int u = nv->slot_unit[s];
    long long bad = LLONG_MAX; /* the first bad block; LLONG_MAX: none */
    int nt = hash_threads(nv, u);
    const uint8_t *buf = slot_buf(nv, s);
#pragma omp parallel for schedule(static) reduction(min : bad) num_threads(nt)
    for (long long k = (long long)b0; k < (long long)b1; k++) {
        uint64_t lo, hi;
        extent_part(nv, u, (size_t)k, &lo, &hi);
        if (XXH3_64bits(buf + lo, hi - lo) != nv->sums[u][k])
            bad = k < bad ? k : bad;
    }
    if (bad == LLONG_MAX)
        return ZS_OK;
    size_t b = (size_t)bad, e0, e1;
    char name[64];
    block_array(nv, u, b, &e0, &e1);
    return zs_error(ZS_ERR_FORMAT,
                    "%s: block of %zu bytes at offset %llu (%s, elements %zu..%zu) "
                    "fails its checksum: the data on disk is not what was written",
                    nv->slot_path[s], len_of(nv, u, b),
                    (unsigned long long)(nv->slot_off[s] + (uint64_t)b * nv->block),
                    block_name(nv, u, b, name, sizeof name), e0, e1);
}

/* New checksums for what slot s is about to write for its unit. */
static void checksum(zs_nvme *nv, int s)
{
    int u = nv->slot_unit[s];
    long long nb = (long long)blocks_of(nv, u);
    int nt = hash_threads(nv, u);
    const uint8_t *buf = slot_buf(nv, s);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long long k = 0; k < nb; k++) {
        uint64_t lo, hi;
        extent_part(nv, u, (size_t)k, &lo, &hi);
        nv->sums[u][k] = XXH3_64bits(buf + lo, hi - lo);
    }
}

/* Each array's XXH3-64 over its bytes in slot s: what a checkpoint's manifest records. */
static void array_sums(const zs_nvme *nv, int s, uint64_t *out)
{
    int u = nv->slot_unit[s];
    uint64_t ab = array_bytes(nv, u);
    const uint8_t *x = slot_buf(nv, s) + nv->delta[u];
    int nt = hash_threads(nv, u);
    nt = nt > nv->arrays ? nv->arrays : nt; /* one array a thread */
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int a = 0; a < nv->arrays; a++)
        out[a] = XXH3_64bits(x + (uint64_t)nv->pos[a] * ab, ab);
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

/* Reads unit u whole into slot s, checked. */
static zs_err read_unit(zs_nvme *nv, int s, int u)
{
    ZS_CHECK(slot_target(nv, s, u, 0, NULL));
    queue_blocks(nv, s, 0, 0, blocks_of(nv, u));
    drain_slot(nv, s);
    ZS_CHECK(take_failure(nv));
    return verify(nv, s, 0, blocks_of(nv, u));
}

/* Writes slot s's unit (its checksums made) to `to` or the state file, and waits. */
static zs_err write_unit(zs_nvme *nv, int s, const char *to)
{
    int u = nv->slot_unit[s];
    checksum(nv, s);
    ZS_CHECK(slot_target(nv, s, u, 1, to));
    ZS_CHECK(set_location(nv, s, u, to));
    queue_blocks(nv, s, 1, 0, blocks_of(nv, u));
    drain_slot(nv, s);
    return take_failure(nv);
}

/* Arrays of a unit from src[a] (NULL: kept as they are): the others share blocks with them, so
 * the unit is read first (where it is now) unless every array is given; then it is written to
 * the state file. */
static zs_err store_locked(zs_nvme *nv, int u, const float *const *src)
{
    ZS_CHECK(check_unit(nv, u, 0));
    int all = 1;
    for (int a = 0; a < nv->arrays; a++)
        all &= src[a] != NULL;
    if (!all)
        ZS_CHECK(read_unit(nv, 0, u));
    nv->slot_unit[0] = u;
    for (int a = 0; a < nv->arrays; a++)
        if (src[a])
            memcpy(slot_buf(nv, 0) + nv->delta[u] + (uint64_t)nv->pos[a] * array_bytes(nv, u),
                   src[a], (size_t)array_bytes(nv, u));
    return write_unit(nv, 0, NULL);
}

static zs_err load_locked(zs_nvme *nv, int u, int a, size_t off, size_t count, float *dst)
{
    ZS_CHECK(check_unit(nv, u, a));
    if (off > nv->floats[u] || count > nv->floats[u] - off)
        return zs_error(ZS_ERR_INVALID, "%s: elements %zu..%zu of unit %d (%zu elements)", nv->path,
                        off, off + count, u, nv->floats[u]);
    if (count == 0)
        return ZS_OK;
    uint64_t at = nv->delta[u] + (uint64_t)nv->pos[a] * array_bytes(nv, u) + off * sizeof(float);
    size_t b0 = (size_t)(at / nv->block);
    size_t b1 = (size_t)((at + count * sizeof(float) + nv->block - 1) / nv->block);
    ZS_CHECK(slot_target(nv, 0, u, 0, NULL));
    queue_blocks(nv, 0, 0, b0, b1);
    drain_slot(nv, 0);
    ZS_CHECK(take_failure(nv));
    ZS_CHECK(verify(nv, 0, b0, b1));
    memcpy(dst, slot_buf(nv, 0) + at, count * sizeof(float));
    return ZS_OK;
}

/* Queues unit u's reads into slot s; an error (its own file cannot be opened) is recorded as
 * the run's failure, which the next take_failure returns. */
static void start_read(zs_nvme *nv, int s, int u)
{
    if (slot_target(nv, s, u, 0, NULL) != ZS_OK) {
        record_failure(nv, "%s", zs_last_error());
        return;
    }
    queue_blocks(nv, s, 0, 0, blocks_of(nv, u));
}

/* Where unit u's write goes: its own file to[u] where one is asked for and can be made (else
 * the state file, said at a bounded rate); *own tells which. */
static zs_err start_write(zs_nvme *nv, int s, int u, char *const *to, int *own)
{
    const char *path = to ? to[u] : NULL;
    if (path && nv->loc[u] && strcmp(path, nv->loc[u]) == 0)
        path = NULL; /* never emptied while it holds the unit: the state file takes it */
    *own = 0;
    checksum(nv, s);
    if (path && slot_target(nv, s, u, 1, path) == ZS_OK) {
        *own = 1;
    } else {
        if (path) {
            char name[32];
            zs_log_limited(&nv->own_failed, ZS_LOG_WARN,
                           "%s: %s goes to the state file instead of its checkpoint file: %s",
                           nv->owner, unit_name(nv, u, name, sizeof name), zs_last_error());
        }
        ZS_CHECK(slot_target(nv, s, u, 1, NULL));
        path = NULL;
    }
    ZS_CHECK(set_location(nv, s, u, path));
    queue_blocks(nv, s, 1, 0, blocks_of(nv, u));
    return ZS_OK;
}

static zs_err run_locked(zs_nvme *nv, zs_nvme_work_fn work, void *ctx, char *const *to,
                         uint64_t (*sums)[ZS_NVME_MAX_ARRAYS], int *written)
{
    if (nv->units == 0)
        return ZS_OK;
    zs_err res = ZS_OK;
    start_read(nv, 0, 0);
    for (int u = 0; u < nv->units && res == ZS_OK; u++) {
        int s = u % SLOTS;
        if (u + 1 < nv->units) {
            /* Unit u+1's slot last held unit u-2, whose write-back must be done first. */
            int s1 = (u + 1) % SLOTS;
            drain_slot(nv, s1);
            if ((res = take_failure(nv)) != ZS_OK)
                break;
            start_read(nv, s1, u + 1);
        }
        drain_slot(nv, s);
        if ((res = take_failure(nv)) != ZS_OK || (res = verify(nv, s, 0, blocks_of(nv, u))))
            break;
        float *arrays[ZS_NVME_MAX_ARRAYS];
        for (int a = 0; a < nv->arrays; a++)
            arrays[a] = (float *)(slot_buf(nv, s) + nv->delta[u] +
                                  (uint64_t)nv->pos[a] * array_bytes(nv, u));
        double t0 = zs_now_s();
        res = work(ctx, u, arrays);
        nv->stats.work_ms += (zs_now_s() - t0) * 1000.0;
        if (res != ZS_OK)
            break;
        if (to && to[u] && sums)
            array_sums(nv, s, sums[u]);
        int own = 0;
        res = start_write(nv, s, u, to, &own);
        if (written)
            written[u] = own;
    }
    /* Whatever is still in flight finishes before the slots can be used again. */
    drain_all(nv);
    zs_err late = take_failure(nv);
    return res != ZS_OK ? res : late;
}

zs_err zs_nvme_store(zs_nvme *nv, int u, int a, const float *src)
{
    ZS_CHECK(check_unit(nv, u, a));
    const float *one[ZS_NVME_MAX_ARRAYS] = {NULL};
    one[a] = src;
    return zs_nvme_store_arrays(nv, u, one);
}

zs_err zs_nvme_store_arrays(zs_nvme *nv, int u, const float *const *src)
{
    pthread_mutex_lock(&nv->lock);
    zs_err e = store_locked(nv, u, src);
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
    return zs_nvme_run_to(nv, work, ctx, NULL, NULL, NULL);
}

zs_err zs_nvme_run_to(zs_nvme *nv, zs_nvme_work_fn work, void *ctx, char *const *to,
                      uint64_t (*sums)[ZS_NVME_MAX_ARRAYS], int *written)
{
    pthread_mutex_lock(&nv->lock);
    if (written)
        memset(written, 0, (size_t)nv->units * sizeof *written);
    zs_err e = run_locked(nv, work, ctx, to, sums, written);
    pthread_mutex_unlock(&nv->lock);
    return e;
}
