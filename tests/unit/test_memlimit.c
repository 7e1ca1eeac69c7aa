/*
 * memlimit: the limit found is one of the known ones and not larger than the machine's memory;
 * a need below it passes, one above it is refused with both numbers and the limit's name; an
 * RLIMIT_AS set here is the one named once it is the tightest.
 */
#include <stdint.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/memlimit.h"
#include "test.h"

int main(void)
{
    uint64_t left;
    char what[64];
    zs_mem_available(&left, what, sizeof what);
    uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    /* Linux always has MemAvailable, so some limit is known and at most the machine's. */
    CHECK(left <= phys);
    CHECK(strcmp(what, "MemAvailable") == 0 || strcmp(what, "cgroup memory.max") == 0 ||
          strcmp(what, "RLIMIT_AS") == 0);
    CHECK_OK(zs_mem_check("test", "1 byte", 1));
    CHECK_FAILS_WITH(zs_mem_check("test", "a petabyte", (uint64_t)1 << 50),
                     "test: a petabyte need 1048576.00 GiB, but ");
    CHECK(zs_last_error()[0] && strstr(zs_last_error(), what) != NULL);

    /* An address-space limit 1 GiB above what is in use now: RLIMIT_AS is the tightest (unless
     * a cgroup or the machine leaves less), and 2 GiB more is refused naming it. */
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_AS, &rl) == 0);
    uint64_t before = left;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long vm_kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &vm_kib) == 1)
            break;
    if (f)
        fclose(f);
    CHECK(vm_kib > 0);
    struct rlimit lim = {.rlim_cur = (rlim_t)(vm_kib * 1024 + (1ull << 30)),
                         .rlim_max = rl.rlim_max};
    CHECK(setrlimit(RLIMIT_AS, &lim) == 0);
    zs_mem_available(&left, what, sizeof what);
    if (before > ((uint64_t)1 << 30) + ((uint64_t)64 << 20)) {
        CHECK(strcmp(what, "RLIMIT_AS") == 0);
        CHECK(left <= ((uint64_t)1 << 30) && left > ((uint64_t)1 << 30) - ((uint64_t)64 << 20));
        CHECK_FAILS_WITH(zs_mem_check("server 2", "7 shards", (uint64_t)2 << 30),
                         "server 2: 7 shards need 2.00 GiB, but RLIMIT_AS leaves");
    }
    setrlimit(RLIMIT_AS, &rl);
    return zs_test_result("test_memlimit");
}
