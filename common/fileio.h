/*
 * fileio: the few file operations that every writer of a durable file needs, in one place:
 * whole-buffer writes and reads that survive short transfers and EINTR, the creation of a
 * temporary file, and the commit that puts it in place under its final name.
 *
 * A durable file is written as "NAME.tmp" (zs_file_create), filled (zs_file_write_all,
 * zs_file_pwrite_all) and committed (zs_file_commit: fsync, close, rename to NAME, fsync of
 * the directory).  Invariant: a name that exists after zs_file_commit returns holds a complete
 * file; a failure before the rename removes the temporary file and leaves NAME as it was.
 *
 * Errors are ZS_ERR_IO (a file cut short under a reader: ZS_ERR_FORMAT) with a message that
 * names the file or directory, the size or offset involved and the OS's reason:
 * "out/x.tmp: write of 4096 bytes failed: No space left on device".  The functions hold no
 * state and may be called from any thread.
 */
#ifndef ZS_FILEIO_H
#define ZS_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Bytes per write(2) or pwrite(2) call: large writes go out in pieces of at most this. */
#define ZS_FILE_WRITE_MAX (64u << 20)

/*
 * Writes all n bytes of buf to fd, looping over short writes and EINTR.  Returns 0, or -1 with
 * errno set (a write(2) that returns 0 counts as EIO); *done (may be NULL) gets the bytes
 * written, also on failure.  For callers that word their own message; the others use
 * zs_file_write_all.
 */
int zs_file_write(int fd, const void *buf, size_t n, size_t *done);

/* Writes all n bytes of buf to fd (the file path, named in the message on failure). */
zs_err zs_file_write_all(int fd, const char *path, const void *buf, size_t n);

/* Writes all n bytes of buf to fd at file offset off; the file position does not move. */
zs_err zs_file_pwrite_all(int fd, const char *path, const void *buf, size_t n, uint64_t off);

/* Reads exactly n bytes at file offset off.  Reaching the end of the file first is
 * ZS_ERR_FORMAT ("file truncated: N bytes missing at offset O"), an OS failure ZS_ERR_IO. */
zs_err zs_file_read_at(int fd, const char *path, void *buf, size_t n, uint64_t off);

/* Creates (or truncates) tmp for writing, mode 0644 before the umask, close-on-exec, into
 * *fd. */
zs_err zs_file_create(const char *tmp, int *fd);

/*
 * Puts the file written through fd under the name tmp in place as path: fsyncs and closes fd
 * and renames tmp to path.  fd is closed in every case; on failure tmp is removed and path is
 * untouched.  The new name is durable only once path's directory is synced
 * (zs_file_sync_parent), which zs_file_commit does too.
 */
zs_err zs_file_replace(int fd, const char *tmp, const char *path);

/* zs_file_replace, then zs_file_sync_parent(path).  If only the directory sync fails, path is
 * in place and complete, perhaps not durable, and the failure is returned. */
zs_err zs_file_commit(int fd, const char *tmp, const char *path);

/* fsyncs the directory dir, making the names created, renamed or removed in it durable. */
zs_err zs_file_sync_dir(const char *dir);

/* zs_file_sync_dir of the directory that holds path ("." for a bare name, "/" for "/x"). */
zs_err zs_file_sync_parent(const char *path);

#endif
