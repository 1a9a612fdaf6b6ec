/* rng.h — ddpd's own seeded generator (xoshiro256** seeded through splitmix64), so
 * that a seed means the same numbers on every host and in every version. Used for
 * weight init, synthetic data and shuffling. Not for cryptography. */
#ifndef DDPD_RNG_H
#define DDPD_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s[4];
};

void rng_seed(struct rng *r, uint64_t seed);
/* A generator for stream `stream` of `seed`: independent sequences from one seed. */
void rng_seed2(struct rng *r, uint64_t seed, uint64_t stream);
double rng_uniform(struct rng *r);             /* [0, 1) with 53 bits */
double rng_normal(struct rng *r);              /* N(0,1), Box-Muller, no cached pair */
uint64_t rng_below(struct rng *r, uint64_t n); /* uniform in [0, n), unbiased */
/* Fisher-Yates shuffle of idx[0..n). */
void rng_shuffle(struct rng *r, int64_t *idx, int64_t n);

#endif
