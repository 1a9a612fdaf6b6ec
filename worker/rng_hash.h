/* rng_hash.h — a counter-based uniform draw, the same on the CPU and in a CUDA kernel:
 * element i of stream `seed` is splitmix64's finaliser of seed + (i + 1) * golden ratio,
 * its top 24 bits as a float in [0, 1). Dropout draws its masks with it, so a mask
 * depends only on (seed, i), never on the backend, the thread count or the order. */
#ifndef DDPD_RNG_HASH_H
#define DDPD_RNG_HASH_H

#include <stdint.h>

#ifdef __CUDACC__
#define RNG_HASH_FN __host__ __device__ static inline
#else
#define RNG_HASH_FN static inline
#endif

/* 2^64 / the golden ratio, splitmix64's step between counters. */
#define RNG_HASH_GOLDEN 0x9E3779B97F4A7C15ull

/* splitmix64's finaliser: a bijection of 64-bit words that spreads every input bit. */
RNG_HASH_FN uint64_t rng_hash_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

RNG_HASH_FN float rng_hash_uniform(uint64_t seed, uint64_t i)
{
    const uint64_t z = rng_hash_mix64(seed + (i + 1) * RNG_HASH_GOLDEN);
    return (float)(z >> 40) * (1.0f / 16777216.0f); /* the top 24 bits over 2^24 */
}

#endif
