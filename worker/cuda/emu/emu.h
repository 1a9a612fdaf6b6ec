/* emu/emu.h — the CUDA C++ language as the emulated device runs it: the qualifiers, dim3
 * and the index variables, the intrinsics worker/cuda's kernels use, warp shuffles, block
 * barriers, atomics, and the launch that LAUNCH() expands to when nvcc is not the compiler.
 * Included first by the emulated module's wrappers of the .cu files (emu/dev.cc,
 * emu/sort.cc), which g++ compiles: the kernels are the .cu files' own, never a copy. Every
 * CUDA thread of a block runs as a fiber (emu/kernel.cc); the barriers and shuffles below
 * are where fibers hand over, so a missing barrier shows as a wrong value. */
#ifndef DDPD_EMU_H
#define DDPD_EMU_H

#ifndef __cplusplus
#error "emu.h is the CUDA language for g++: include it from C++ only"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "include/cuda_runtime.h"

/* ---- qualifiers: host and device code are one program here ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__    __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
/* Blocks of a launch run one after another on their stream's thread, and two streams are
 * two threads: a per-thread static is exactly one block's shared memory. */
#define __shared__ static __thread

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu
{

/* What a running CUDA thread sees (kernel.cc sets both before it resumes a fiber). */
struct thread_view {
    uint3 thread_idx;
};
struct block_view {
    uint3 block_idx;
    dim3 block_dim, grid_dim;
};
/* __thread, not thread_local: nothing to construct, so no TLS wrapper call per access (and
 * none for GCC's -fsanitize=null to mis-compile). */
extern __thread thread_view *cur_thread;
extern __thread block_view *cur_block;

/* kernel.cc: the barriers a fiber waits at. */
void syncthreads();
void syncwarp(unsigned mask);
/* The value of `v` (8 bytes) at lane `src` of the calling warp, after every lane of `mask`
 * has offered its own; src < 0 or past `width` means "keep my own". `what` names the call. */
uint64_t shuffle(unsigned mask, uint64_t v, int src, const char *what);
int lane_id();

/* A launch: its configuration is checked (cudaGetLastError tells), then `body` (one CUDA
 * thread's code) runs for every thread of every block in stream order. */
void submit(const char *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::function<void()> body);

/* A pointer argument of a kernel must be device memory or pinned host memory (or NULL);
 * anything else is an error naming the kernel and the argument (runtime.cc). */
bool check_pointer_arg(const char *kernel, int index, const void *p);

template <typename T> inline bool check_arg(const char *, int, const T &)
{
    return true;
}
template <typename T> inline bool check_arg(const char *kernel, int index, T *const &p)
{
    return check_pointer_arg(kernel, index, (const void *)p);
}

template <typename T> inline uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "a shuffled value fits 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T> inline T from_bits(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}

} // namespace emu

#define threadIdx (emu::cur_thread->thread_idx)
#define blockIdx  (emu::cur_block->block_idx)
#define blockDim  (emu::cur_block->block_dim)
#define gridDim   (emu::cur_block->grid_dim)
constexpr int warpSize = 32;

/* The launch LAUNCH(k, grid, block, smem, stream, args...) becomes: the arguments are
 * converted to the kernel's parameter types and copied now, as a launch copies them, and
 * every pointer among them is checked against the device arena. */
template <typename... P, typename... A>
inline void emu_launch(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launch passes one argument per parameter");
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    bool ok = true;
    int index = 0;
    std::apply([&](const auto &...p) { ((ok = emu::check_arg(name, ++index, p) && ok), ...); }, params);
    if (!ok)
        return;
    emu::submit(name, grid, block, smem, stream, [k, params]() { std::apply(k, params); });
}

/* ---- barriers and warp intrinsics ---- */
inline void __syncthreads()
{
    emu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    emu::syncwarp(mask);
}
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    const int lane = emu::lane_id(), base = lane & ~(width - 1);
    return emu::from_bits<T>(emu::shuffle(mask, emu::to_bits(v), base + (src & (width - 1)), "__shfl_sync"));
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    const int lane = emu::lane_id(), base = lane & ~(width - 1), src = lane ^ lane_mask;
    /* A partner outside the caller's segment of `width` lanes reads the caller's own value. */
    return emu::from_bits<T>(
        emu::shuffle(mask, emu::to_bits(v), (src & ~(width - 1)) == base ? src : -1, "__shfl_xor_sync"));
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int lane = emu::lane_id(), base = lane & ~(width - 1), src = lane + (int)delta;
    return emu::from_bits<T>(
        emu::shuffle(mask, emu::to_bits(v), src < base + width ? src : -1, "__shfl_down_sync"));
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int lane = emu::lane_id(), base = lane & ~(width - 1), src = lane - (int)delta;
    return emu::from_bits<T>(emu::shuffle(mask, emu::to_bits(v), src >= base ? src : -1, "__shfl_up_sync"));
}

/* ---- rounding intrinsics: the module is built with -ffp-contract=off, so each operation
 * rounds once, as these intrinsics promise ---- */
inline float __fadd_rn(float a, float b)
{
    return a + b;
}
inline float __fsub_rn(float a, float b)
{
    return a - b;
}
inline float __fmul_rn(float a, float b)
{
    return a * b;
}
inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}
inline float __frcp_rn(float a)
{
    return 1.0f / a;
}
inline float __fmaf_rn(float a, float b, float c)
{
    return fmaf(a, b, c);
}
inline double __dadd_rn(double a, double b)
{
    return a + b;
}
inline double __dsub_rn(double a, double b)
{
    return a - b;
}
inline double __dmul_rn(double a, double b)
{
    return a * b;
}
inline double __ddiv_rn(double a, double b)
{
    return a / b;
}
inline double __fma_rn(double a, double b, double c)
{
    return fma(a, b, c);
}
inline float __expf(float a)
{
    return expf(a);
}
inline float __logf(float a)
{
    return logf(a);
}
inline float rsqrtf(float a)
{
    return 1.0f / sqrtf(a);
}
template <typename T> inline T __ldg(const T *p)
{
    return *p;
}

/* ---- atomics: fibers of one block never interleave inside one, but two streams' threads
 * may touch one buffer, so every one is a real atomic (and visible to ThreadSanitizer) ---- */
template <typename T> inline T emu_atomic_update(T *p, T (*op)(T, T), T v)
{
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4 or 8 bytes");
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    U *u = (U *)(void *)p;
    U seen = __atomic_load_n(u, __ATOMIC_RELAXED);
    for (;;) {
        T old;
        memcpy(&old, &seen, sizeof old);
        const T nv = op(old, v);
        U want;
        memcpy(&want, &nv, sizeof want);
        if (__atomic_compare_exchange_n(u, &seen, want, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            return old;
    }
}
#define EMU_ATOMIC(name, T, expr)                                                                            \
    inline T name(T *p, T v)                                                                                 \
    {                                                                                                        \
        return emu_atomic_update<T>(                                                                         \
            p, [](T a, T b) -> T { return expr; }, v);                                                       \
    }
EMU_ATOMIC(atomicAdd, float, a + b)
EMU_ATOMIC(atomicAdd, double, a + b)
EMU_ATOMIC(atomicAdd, int, a + b)
EMU_ATOMIC(atomicAdd, unsigned, a + b)
EMU_ATOMIC(atomicAdd, unsigned long long, a + b)
EMU_ATOMIC(atomicMax, int, a > b ? a : b)
EMU_ATOMIC(atomicMax, unsigned, a > b ? a : b)
EMU_ATOMIC(atomicMin, int, a < b ? a : b)
EMU_ATOMIC(atomicMin, unsigned, a < b ? a : b)
EMU_ATOMIC(atomicExch, int, ((void)a, b))
EMU_ATOMIC(atomicExch, unsigned, ((void)a, b))
EMU_ATOMIC(atomicExch, float, ((void)a, b))
#undef EMU_ATOMIC
inline int atomicCAS(int *p, int compare, int v)
{
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;
}
inline unsigned atomicCAS(unsigned *p, unsigned compare, unsigned v)
{
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;
}
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long compare, unsigned long long v)
{
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;
}
inline void __threadfence()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

#endif
