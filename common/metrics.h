/*
 * metrics: the writer of a run's OUT/metrics.jsonl, one JSON object per line, for
 * `zshard train` and the coordinator.
 *
 * A line is built key by key (zs_metrics_begin, zs_metrics_int/num/str/bool, in the order the keys
 * appear) and goes out with zs_metrics_end() in one write(2) loop: no stdio buffer, so a line
 * is in the file (the page cache; zs_metrics_sync for the disk) when its step is reported.
 * Lines look like {"step": 1, "loss": 5.54, "workers": 2}.
 *
 * Invariants:
 *  - Every line is valid JSON: strings and keys are escaped (invalid UTF-8 becomes U+FFFD),
 *    a NaN or an infinity is written as null, numbers use only formats whose output is a JSON
 *    number.
 *  - The file holds only complete lines.  A write that fails (ENOSPC, EIO, a file size limit)
 *    returns ZS_ERR_IO naming the path and the OS's reason, and the file is cut back
 *    (ftruncate) to the end of the last complete line; a later line may still succeed (when
 *    space was freed).  Should the cut itself fail, every later line is refused until a retry
 *    of the cut succeeds: nothing is ever appended after a partial line.
 *  - A resume continues the file: zs_metrics_open(path, s, ...) keeps the complete lines whose
 *    "step" is <= s (the steps a checkpoint of version s contains) and drops the others, which
 *    those steps will write again, and a cut last line.  Lines without an integer "step" are
 *    dropped too, so a caller that wants lines to survive a resume gives each one a step.
 *
 * A zs_metrics is used by one thread at a time.
 */
#ifndef ZS_METRICS_H
#define ZS_METRICS_H

#include "common/err.h"

typedef struct zs_metrics zs_metrics;

/*
 * Opens the metrics file at path for writing, into *out.
 *  keep_through_step < 0: creates the file, or truncates an existing one (a new run).
 *  keep_through_step >= 0: a resume from the checkpoint of that version; keeps the existing
 *    file's complete lines whose "step" is <= keep_through_step, in their order (a missing
 *    file is created empty).  The kept lines are rewritten to path.tmp, fsynced and renamed
 *    over path, and the directory fsynced, so a crash leaves either the old file or the new.
 * Costs one read of the old file on a resume.  Errors name the path and the OS's reason.
 */
zs_err zs_metrics_open(const char *path, long keep_through_step, zs_metrics **out);

/* Starts a line, dropping any line begun and not ended. */
void zs_metrics_begin(zs_metrics *m);

/*
 * Add "key": value to the line begun.  The key and a string value are JSON-escaped.  fmt is
 * the printf conversion of one double, "%" with an optional precision and one of e E f F g G
 * ("%.9g", "%.1f"); any other fmt (flags, widths, "%a", which are not JSON numbers) fails the
 * line.  A non-finite value is written as null whatever fmt.  These calls do not fail: a
 * problem (no memory, a bad fmt, no line begun) is kept and returned by zs_metrics_end().
 */
void zs_metrics_int(zs_metrics *m, const char *key, long value);
void zs_metrics_num(zs_metrics *m, const char *key, double value, const char *fmt);
void zs_metrics_str(zs_metrics *m, const char *key, const char *value);
/* "key": true or false (value non-zero or zero). */
void zs_metrics_bool(zs_metrics *m, const char *key, int value);

/*
 * Ends the line and writes it, followed by "\n", with write(2) until every byte is out.
 * Returns ZS_OK when the whole line is in the file; otherwise ZS_ERR_IO ("metrics PATH:
 * writing a line of N bytes: No space left on device") with the file cut back to its last
 * complete line, or the problem a builder call kept (ZS_ERR_INVALID, ZS_ERR_NOMEM), in which
 * case nothing was written.  Either way the line is gone and the next begins afresh.
 */
zs_err zs_metrics_end(zs_metrics *m);

/* Makes the lines written so far durable (fsync), e.g. when a checkpoint commits. */
zs_err zs_metrics_sync(zs_metrics *m);

/* fsyncs, closes and frees m (NULL is a no-op); reports a failure of either, or a cut that
 * could not be undone, naming the path.  m is freed even then. */
zs_err zs_metrics_close(zs_metrics *m);

#endif
