/* cuda_bufs.h — what the CUDA backend's tests (test_cuda.c, test_cuda_reduce.c) share: the
 * CPU reference and the device under test, host arrays and their copies on the device, and
 * the comparison that prints the worst entry. Header-only; each test is one program. */
#ifndef DDPD_TEST_CUDA_BUFS_H
#define DDPD_TEST_CUDA_BUFS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "worker/dev.h"
#include "worker/rng.h"

#define SKIP 77

static struct dev C, G; /* CPU reference, CUDA under test */
static struct rng R;

/* ---- buffers: a host array and its copy on the GPU ---- */

static inline float *host_randn(int64_t n, double scale)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * rng_normal(&R));
    return x;
}

static inline float *up(const float *h, int64_t n)
{
    float *d = G.ops->alloc(G.ctx, (size_t)(n > 0 ? n : 1) * sizeof(float));
    G.ops->to_device(G.ctx, d, h, (size_t)n * sizeof(float));
    return d;
}

/* The GPU's result in a new host array; frees the device buffer. */
static inline float *down(float *d, int64_t n)
{
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    G.ops->to_host(G.ctx, h, d, (size_t)n * sizeof(float));
    G.ops->free(G.ctx, d);
    return h;
}

static inline float *dup_host(const float *x, int64_t n)
{
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* Checks |gpu - cpu| <= atol + rtol*|cpu| everywhere (NaN only where the CPU has NaN);
 * prints the worst entry of a failure. */
static inline void close_to(const char *what, const float *gpu, const float *cpu, int64_t n, double atol,
                            double rtol)
{
    int64_t bad = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(cpu[i]) || isnan(gpu[i])) {
            if (!(isnan(cpu[i]) && isnan(gpu[i])) && bad < 0)
                bad = i, worst = INFINITY;
            continue;
        }
        double e = fabs((double)gpu[i] - cpu[i]) / (atol + rtol * fabs((double)cpu[i]));
        if (e > 1 && e > worst)
            bad = i, worst = e;
    }
    check__count++;
    if (bad >= 0)
        CHECK__FAIL("%s: entry %lld of %lld: gpu %.9g vs cpu %.9g (%.3g x the tolerance)", what,
                    (long long)bad, (long long)n, gpu[bad], cpu[bad], worst);
}

#endif
