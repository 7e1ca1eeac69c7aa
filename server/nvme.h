/*
 * nvme: the NVMe tier of a partition server's training state (ZeRO-Infinity's optimizer and
 * parameter offload): arrays that do not stay in RAM live in one state file on a local disk and
 * pass through a few RAM slots, read and written with io_uring (liburing), or with pread and
 * pwrite where io_uring is not available.
 *
 * The tier holds `units` units (a server's shards) of `arrays` arrays each (exp_avg,
 * exp_avg_sq and perhaps the fp32 weights; or one bf16 copy); unit i's arrays have floats[i]
 * elements and lie one after the other, in the order the options' file_pos gives, as they do in
 * a checkpoint's shard file.  A unit is in the state file or in a file of its own: zs_nvme_run_to
 * writes the units it is given paths for to those files, laid out as the options say (a header,
 * the arrays before the tier's, then the tier's), which is how a step's output becomes a
 * checkpoint's shard files without being written twice; the next run reads them from there and
 * writes them back to the state file (or to other files of their own).  Requests are
 * block_bytes long and aligned as O_DIRECT needs in either file.  The state file is made with
 * O_TMPFILE: it has no name, is allocated in full when the tier opens (a disk too small says so
 * then), and disappears with the process, so nothing is left behind by a crash.  It is scratch,
 * never durable: checkpoints are what survive (docs/nvme.md).
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
 *  - A unit's own file is never written again once its run has written it: a later run or
 *    store writes the unit elsewhere.  Whoever asked for it (the checkpoint writer) owns its
 *    name; the tier holds the file open until the unit is written elsewhere, so the name may
 *    go meanwhile (a failed checkpoint discarded) without the data.  At most a quarter of
 *    RLIMIT_NOFILE's soft limit of units are held so; the others go to the state file.
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
    /* The layout of a unit's own file (zs_nvme_run_to): file_header bytes, then file_lead
     * arrays of the unit's length that are not the tier's, then the tier's, array a at place
     * file_pos[a] (all 0: in their order).  A checkpoint's shard file is 4096, 1, {1, 2} for
     * the moments, or 4096, 0, {1, 2, 0} for the moments and weights. */
    uint64_t file_header;
    int file_lead;
    int file_pos[ZS_NVME_MAX_ARRAYS];
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
/* Bytes of RAM the slots of a tier of `arrays` arrays laid out as o says (its file_header and
 * file_lead) take for units of floats[0..units) elements (the checksums add 8 bytes a block),
 * so that a memory budget can be checked before the tier opens. */
uint64_t zs_nvme_slot_bytes(const zs_nvme_opts *o, int arrays, const size_t *floats, int units);
/* Whether requests bypass the page cache (O_DIRECT), and whether the slots are registered
 * buffers; each falls back (with a log line) where the file system or limits refuse it. */
int zs_nvme_direct(const zs_nvme *nv);
int zs_nvme_fixed_buffers(const zs_nvme *nv);
/* Whether requests go through io_uring (else preads and pwrites one at a time, where io_uring
 * is not available: said once, when the tier opens). */
int zs_nvme_io_uring(const zs_nvme *nv);

/* Writes array a of unit u from src (floats[u] elements) and waits for it: the unit is read
 * (its other arrays share blocks with this one) and written to the state file. */
zs_err zs_nvme_store(zs_nvme *nv, int u, int a, const float *src);
/* The same for the arrays src[a] that are not NULL (the others kept); with every array given,
 * nothing is read. */
zs_err zs_nvme_store_arrays(zs_nvme *nv, int u, const float *const *src);
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

/*
 * The same, with each unit u that to[u] names (to may be NULL) written to that file (created,
 * or emptied, and allocated; in the layout of the options) instead of the state file, and the
 * XXH3-64 of each of its arrays' bytes in sums[u][a].  written[u] (units of them) says where
 * unit u went: 1 its file, 0 the state file (no path, or one that could not be made: said in
 * the log at a bounded rate; the run goes on).  The caller makes such a file durable and owns
 * it; the tier reads the unit from there until the unit is written again.
 */
zs_err zs_nvme_run_to(zs_nvme *nv, zs_nvme_work_fn work, void *ctx, char *const *to,
                      uint64_t (*sums)[ZS_NVME_MAX_ARRAYS], int *written);

/* Time spent in zs_nvme_run since the tier opened: waiting for the disk, and in work. */
typedef struct {
    double wait_ms, work_ms;
    uint64_t bytes_read, bytes_written;
} zs_nvme_stats;
zs_nvme_stats zs_nvme_get_stats(const zs_nvme *nv);

#endif
