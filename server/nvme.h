/*
 * nvme: the NVMe tier of a partition server's training state (ZeRO-Infinity's optimizer and
 * parameter offload): arrays that do not stay in RAM live in one state file on a local disk and
 * pass through a few RAM slots, read and written with io_uring (liburing), or with pread and
 * pwrite where io_uring is not available.
 *
 * The file holds `units` units (a server's shards) of `arrays` arrays each (exp_avg,
 * exp_avg_sq and perhaps the fp32 weights; or one bf16 copy); unit i's arrays have floats[i]
 * elements.  Each array starts on a 4096-byte boundary and is padded to one; requests are
 * block_bytes from an array's start (the last one shorter), so every one is aligned as
 * O_DIRECT needs.  The file is made with O_TMPFILE: it has no name, is
 * allocated in full when the tier opens (a disk too small says so then), and disappears
 * with the process, so nothing is left behind by a crash.  It is scratch, never durable:
 * checkpoints are what survive (docs/nvme.md).
 *
 * Invariants:
 *  - Every block written carries an XXH3-64 checksum, kept in RAM; every block read is
 *    checked against it before anything uses it.  Data that fails its check, a short read or
 *    an I/O error is an error that names the file, the offset, the unit and the array, and
 *    nothing is computed from it.
 *  - zs_nvme_run visits the units in order, each exactly once: while unit i is handed to the
 *    caller, unit i+1 is being read and unit i-1 written back (three slots).  The caller's
 *    work on a unit is the same whatever is in flight, so the results are those of the same
 *    work on arrays in RAM, bit for bit.
 * zs_nvme_store, zs_nvme_load and zs_nvme_run take the tier in turn (a mutex: the server's
 * thread and its checkpoint writer may both read); the work function must not call back into
 * the same tier, and may use OpenMP inside.
 */
#ifndef ZS_NVME_H
#define ZS_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define ZS_NVME_MAX_ARRAYS 4

typedef struct {
    const char *dir;    /* where the state file goes (offload_optimizer.nvme_path) */
    size_t block_bytes; /* bytes per read or write request (aio.block_size), 4096-multiple */
    int queue_depth;    /* requests in flight at once (aio.queue_depth) */
    const char *owner;  /* who owns the tier, for messages: "server 2" */
    int threads;        /* OpenMP threads for the checksums of a large unit (0: 1) */
    const int *labels;  /* [units]: messages call unit u "shard labels[u]"; NULL: "unit u" */
    const char *names[ZS_NVME_MAX_ARRAYS]; /* what messages call each array (NULL: exp_avg,
                                              exp_avg_sq, weights) */
    int elem_bytes[ZS_NVME_MAX_ARRAYS];    /* bytes of an element of each array, for the element
                                              numbers in messages (0: 4; 2 for a bf16 copy held
                                              in pairs) */
} zs_nvme_opts;

typedef struct zs_nvme zs_nvme;

/* Opens a tier of `units` units of `arrays` arrays (floats[i] elements each for unit i) in a
 * new state file in o->dir, allocated in full.  Errors name the directory and the size. */
zs_err zs_nvme_open(const zs_nvme_opts *o, int units, int arrays, const size_t *floats,
                    zs_nvme **out);
void zs_nvme_close(zs_nvme *nv);

/* The state file, as messages name it: "DIR/(state file of server 2)" (it has no name). */
const char *zs_nvme_path(const zs_nvme *nv);
/* Bytes the file takes on disk. */
uint64_t zs_nvme_file_bytes(const zs_nvme *nv);
/* Bytes of RAM the slots of a tier of `arrays` arrays take when its largest unit has `largest`
 * floats (the checksums add 8 bytes a block), so that a memory budget can be checked before the
 * tier opens. */
uint64_t zs_nvme_slot_bytes(int arrays, size_t largest);
/* Whether requests bypass the page cache (O_DIRECT), and whether the slots are registered
 * buffers; each falls back (with a log line) where the file system or limits refuse it. */
int zs_nvme_direct(const zs_nvme *nv);
int zs_nvme_fixed_buffers(const zs_nvme *nv);
/* Whether requests go through io_uring (else preads and pwrites one at a time, where io_uring
 * is not available: said once, when the tier opens). */
int zs_nvme_io_uring(const zs_nvme *nv);

/* Writes array a of unit u from src (floats[u] elements) and waits for it. */
zs_err zs_nvme_store(zs_nvme *nv, int u, int a, const float *src);
/* Reads elements [off, off + count) of array a of unit u into dst, checked, and waits. */
zs_err zs_nvme_load(zs_nvme *nv, int u, int a, size_t off, size_t count, float *dst);

/*
 * The pipeline: for u = 0 .. units-1 in order, reads unit u's arrays into a slot (checked),
 * calls work(ctx, u, arrays) to update them in place, and writes them back.  Unit u+1 is read
 * and unit u-1 written while work runs on unit u.  Stops at the first failure (a read that
 * failed its check, an I/O error, or work's own error) after the writes in flight are done:
 * units before it are updated, it and the units after it are not.
 */
typedef zs_err (*zs_nvme_work_fn)(void *ctx, int unit, float *const *arrays);
zs_err zs_nvme_run(zs_nvme *nv, zs_nvme_work_fn work, void *ctx);

/* Time spent in zs_nvme_run since the tier opened: waiting for the disk, and in work. */
typedef struct {
    double wait_ms, work_ms;
    uint64_t bytes_read, bytes_written;
} zs_nvme_stats;
zs_nvme_stats zs_nvme_get_stats(const zs_nvme *nv);

#endif
