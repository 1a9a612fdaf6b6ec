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

RNG_HASH_FN float rng_hash_uniform(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

#endif
