/*
 * ntcopy: memcpy for large copies whose destination is not read again soon.  From
 * ZS_NTCOPY_MIN bytes on, where the CPU has SSE2, the 16-byte aligned middle is written with
 * non-temporal stores: the destination's lines are written without being read first, which
 * glibc's memcpy does only above a threshold that follows the last-level cache (far above a
 * 4 MiB shard).  On the 2-core VM one thread copied 6.6-6.9 GB/s with memcpy and 8.7-8.9 GB/s
 * so, two threads 12.0-13.4 and 15.0-15.8 (144 MiB).  The stores are fenced before it returns.
 * Used by the shared-memory transport for payloads, and by bench_data_plane as its limit.
 */
#ifndef ZS_NTCOPY_H
#define ZS_NTCOPY_H

#include <stddef.h>

#define ZS_NTCOPY_MIN ((size_t)256 << 10)

void zs_copy_nt(void *dst, const void *src, size_t len);

#endif
