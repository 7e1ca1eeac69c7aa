/*
 * memlimit: the memory this process may still take (common/memlimit.h).
 */
#include "common/memlimit.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The first unsigned number in the file at path (after the label, when label is not NULL:
 * "MemAvailable:" in /proc/meminfo), times scale; 0 if it is not there. */
static int read_number(const char *path, const char *label, uint64_t scale, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        const char *p = line;
        if (label) {
            if (strncmp(line, label, strlen(label)) != 0)
                continue;
            p += strlen(label);
        }
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end != p) {
            *out = (uint64_t)v * scale;
            found = 1;
        }
        if (!label)
            break; /* "max" and the like: no number */
    }
    fclose(f);
    return found;
}

/* memory.max less memory.current of this process's cgroup (v2); 0 if unknown. */
static int cgroup_left(uint64_t *out)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return 0;
    char line[4096], dir[4200] = "";
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", line + 3);
            break;
        }
    fclose(f);
    if (!dir[0])
        return 0;
    char path[4300];
    uint64_t max, current = 0;
    snprintf(path, sizeof path, "%s/memory.max", dir);
    if (!read_number(path, NULL, 1, &max))
        return 0;
    snprintf(path, sizeof path, "%s/memory.current", dir);
    read_number(path, NULL, 1, &current);
    *out = max > current ? max - current : 0;
    return 1;
}

void zs_mem_available(uint64_t *bytes, char *what, size_t what_len)
{
    uint64_t best = UINT64_MAX, v;
    const char *name = "no limit";
    if (cgroup_left(&v) && v < best)
        best = v, name = "cgroup memory.max";
    struct rlimit rl;
    uint64_t used = 0;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        read_number("/proc/self/status", "VmSize:", 1024, &used);
        v = (uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 0;
        if (v < best)
            best = v, name = "RLIMIT_AS";
    }
    if (read_number("/proc/meminfo", "MemAvailable:", 1024, &v) && v < best)
        best = v, name = "MemAvailable";
    *bytes = best;
    if (what && what_len)
        snprintf(what, what_len, "%s", name);
}

zs_err zs_mem_check(const char *who, const char *what_needs, uint64_t need)
{
    uint64_t left;
    char what[64];
    zs_mem_available(&left, what, sizeof what);
    if (need <= left)
        return ZS_OK;
    char a[32], b[32];
    return zs_error(ZS_ERR_NOMEM, "%s: %s need %s, but %s leaves %s", who, what_needs,
                    zs_mem_text(need, a, sizeof a), what, zs_mem_text(left, b, sizeof b));
}

const char *zs_mem_text(uint64_t bytes, char *buf, size_t n)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)bytes / (double)(1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, n, "%.2f MiB", (double)bytes / (double)(1ull << 20));
    else if (bytes >= (1ull << 10))
        snprintf(buf, n, "%.1f KiB", (double)bytes / (double)(1ull << 10));
    else
        snprintf(buf, n, "%llu bytes", (unsigned long long)bytes);
    return buf;
}
