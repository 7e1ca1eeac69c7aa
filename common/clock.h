/*
 * clock: the monotonic clock, in seconds (double) and milliseconds (integer), for timeouts,
 * heartbeats and step timings.  Never the wall clock: it does not jump.
 */
#ifndef ZS_CLOCK_H
#define ZS_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline double zs_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline uint64_t zs_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
