/* cuda/cuda_impl.h — what the CUDA backend's .cu files share (dev.cu: the ops and the
 * device; reduce.cu: the losses and sums of squares): the context of one device, the
 * failure paths, the launch, and the block sum. Included only by those files (and by
 * their emulated wrappers in emu/, after emu.h); nothing outside worker/cuda sees it. */
#ifndef DDPD_CUDA_IMPL_H
#define DDPD_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* emit.h is C11; its _Noreturn is C++'s [[noreturn]]. */
#define _Noreturn [[noreturn]]
extern "C" {
#include "../dev.h"
#include "../dev/window.h"
#include "../emit.h"
#include "../rng_hash.h"
#include "plugin.h"
}
#undef _Noreturn

/* One kernel launch: nvcc's chevrons, or, when g++ compiles this file for the emulated
 * device (libddpd-cuda-emu.so, cuda/emu/emu.h), the emulator's launch of the same kernel. */
#ifdef __CUDACC__
#define LAUNCH(k, grid, block, smem, stream, ...) k<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#else
#define LAUNCH(k, grid, block, smem, stream, ...)                                                            \
    emu_launch(#k, k, (grid), (block), (smem), (stream), __VA_ARGS__)
#endif

#define THREADS    256
#define MAX_BLOCKS 8192 /* grid-stride loops cover the rest */
#define GROUP_MAX  64   /* tensors per optimizer or sum launch: 3 KiB of kernel arguments, < 4 KiB */

struct cuda {
    int device;
    char name[256];
    cudaStream_t stream;
    cublasHandle_t blas;
    float *pinned; /* fetch_start's destination */
    int64_t pinned_n;
    cudaEvent_t fetched; /* recorded after the copy into `pinned` */
    /* reduce.cu's scratch, allocated on first use: the blocks' partial sums, and the
     * per-tensor sums of sumsq_group (sums_n of them) before they go to the host. */
    double *partials;
    double *sums;
    int64_t sums_n;
    /* DDPD_CUDA_ONE_BLOCK_REDUCTIONS=1: the reductions run as one block of 1,024 threads,
     * their launch shape before issue 34, for bench/loss's "before" column only. */
    bool one_block;
};

/* ---- failures: every CUDA or cuBLAS error ends the worker as a device failure ---- */

static inline void die(const struct cuda *c, const char *op, const char *why)
{
    worker_die(DDPD_EDEVICE, "cuda: %s on GPU %d (%s): %s", op, c->device, c->name, why);
}

static inline void check(const struct cuda *c, cudaError_t e, const char *op)
{
    if (e != cudaSuccess)
        die(c, op, cudaGetErrorString(e));
}

static inline void check_blas(const struct cuda *c, cublasStatus_t s, const char *op)
{
    if (s != CUBLAS_STATUS_SUCCESS)
        die(c, op, cublasGetStatusString(s));
}

/* A kernel launch fails at launch time (bad configuration) or later on the stream; the
 * later failures surface at the next synchronising call, which checks them too. */
#define LAUNCHED(c, op) check((c), cudaGetLastError(), (op))

static inline unsigned blocks_for(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b);
}

#define FOR_EACH(i, n)                                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                                \
         i += (int64_t)blockDim.x * gridDim.x)

/* ---- block sums in double: a fixed order for a fixed block size ---- */

static __device__ __forceinline__ double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

/* The block's sum of v, valid in thread 0 (blockDim.x a multiple of 32, at most 1,024). */
static __device__ __forceinline__ double block_sum(double v)
{
    __shared__ double part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
    return warp < 1 ? warp_sum(v) : 0.0;
}

/* ---- cuda/reduce.cu: dev.h's ops of those names ---- */

void cuda__mse(void *ctx, const float *pred, const float *target, int64_t m, int64_t n, float *dpred,
               float *loss);
void cuda__cross_entropy(void *ctx, const float *logits, const int32_t *labels, int64_t m, int64_t n,
                         float *dlogits, float *loss);
double cuda__sumsq(void *ctx, const float *x, int64_t n);
void cuda__sumsq_group(void *ctx, int count, const float *const *x, const int64_t *n, double *out);
/* Frees the context's scratch (cuda__dev_free, after the stream is idle). */
void cuda__reduce_free(struct cuda *c);

#endif
