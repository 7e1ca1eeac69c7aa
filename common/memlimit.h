/*
 * memlimit: how much memory this process may still take, and a check that says so before a
 * large allocation instead of failing in the middle of it (or being killed by the kernel).
 *
 * The limit is the tightest of: the cgroup's memory.max less its memory.current (cgroup v2,
 * the process's own cgroup from /proc/self/cgroup), RLIMIT_AS less the address space in use
 * (/proc/self/status VmSize), and the machine's MemAvailable (/proc/meminfo).  Any of them
 * that cannot be read (another OS, cgroup v1, "max") is left out; with none, there is no
 * limit to check against.
 */
#ifndef ZS_MEMLIMIT_H
#define ZS_MEMLIMIT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* The bytes this process may still allocate (UINT64_MAX: no limit known) into *bytes, and
 * which limit that is into what ("cgroup memory.max", "RLIMIT_AS", "MemAvailable"). */
void zs_mem_available(uint64_t *bytes, char *what, size_t what_len);

/* bytes as text for messages, in buf: "327.00 GiB", "12.50 MiB", "352.0 KiB", "512 bytes". */
const char *zs_mem_text(uint64_t bytes, char *buf, size_t n);

/* ZS_ERR_NOMEM if need bytes exceed what this process may still allocate, with a message
 * that names both and what needs them: "server 2: 7 shards need 1.20 GiB, but RLIMIT_AS
 * leaves 0.50 GiB"; ZS_OK otherwise. */
zs_err zs_mem_check(const char *who, const char *what_needs, uint64_t need);

#endif
