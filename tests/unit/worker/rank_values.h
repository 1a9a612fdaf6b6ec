/* rank_values.h — what the collective tests (test_comm.c, test_nccl.c) share: the values
 * they all-reduce (rank-dependent, with magnitudes that differ by rank, so that a sum taken
 * in another order than rank order shows as different bits) and the hash by which ranks
 * compare their results' bits. Header-only, for the tests of worker/comm. */
#ifndef DDPD_TEST_RANK_VALUES_H
#define DDPD_TEST_RANK_VALUES_H

#include <stddef.h>
#include <stdint.h>

static inline float rank_value(int rank, int64_t i)
{
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 17u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return ((float)(x & 0xffffff) / 16777216.0f - 0.5f) * (float)(1 << (rank % 3 * 4));
}

/* FNV-1a of n bytes: two ranks' results are the same bits when their hashes agree. */
static inline uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

#endif
