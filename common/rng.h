/*
 * rng: counter-based random numbers.  Every value is a pure function of (seed, stream,
 * index), so any range of a vector can be generated on its own (a partition server
 * initializes just its shards) and gets the same bits as the whole vector generated at once.
 */
#ifndef ZS_RNG_H
#define ZS_RNG_H

#include <math.h>
#include <stdint.h>

/* splitmix64's finalizer: a bijective 64-bit mix. */
static inline uint64_t zs_rng_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* 64 random bits for (seed, stream, index). */
static inline uint64_t zs_rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    return zs_rng_mix(zs_rng_mix(zs_rng_mix(seed) ^ stream) ^ index);
}

/* A standard normal for (seed, stream, index), by Box-Muller on two 53-bit uniforms. */
static inline double zs_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t a = zs_rng_u64(seed, stream, 2 * index);
    uint64_t b = zs_rng_u64(seed, stream, 2 * index + 1);
    double u1 = ((double)(a >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
    double u2 = (double)(b >> 11) * 0x1.0p-53;         /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
